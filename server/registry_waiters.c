/*
 * registry_waiters.c: requests waiting for a name to exist (registry.h's
 * "waiters").  A waiter is registered on its tenant's list under the lock
 * that publishes names, so a name published after a waiter's lookup always
 * finds it there; a publish of another tenant never looks at the list, and
 * a waiter learns nothing but "look again".  Each is bounded: per
 * connection and per tenant (every one holds a request's context), and in
 * time by the request itself (the server's timer).
 */
#include <string.h>

#include "registry_internal.h"

static void waiter_link(reg_tenant *tn, reg_session *s, reg_waiter *w)
{
  w->tn = tn;
  w->prev = NULL;
  w->next = tn->waiters;
  if (tn->waiters)
    tn->waiters->prev = w;
  tn->waiters = w;
  tn->nwaiters++;
  s->waiters++;
}

/* mu held; s is w's session (NULL: gone already, nothing to count). */
static void waiter_unlink(reg_waiter *w, reg_session *s)
{
  reg_tenant *tn = w->tn;
  if (w->prev)
    w->prev->next = w->next;
  else
    tn->waiters = w->next;
  if (w->next)
    w->next->prev = w->prev;
  tn->nwaiters--;
  if (s)
    s->waiters--;
  w->tn = NULL;
  w->prev = w->next = NULL;
}

int reg_find_or_wait(registry *r, uint32_t pipe, const char *name, reg_waiter *w, reg_entry **out,
                     tport_err *err)
{
  *out = NULL;
  size_t len = name ? strlen(name) : 0;
  if (len == 0 || len >= REG_NAME_MAX)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "a wait names a tensor of 1 to %d bytes",
                         REG_NAME_MAX - 1);
  int rc = TPORT_OK;
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  reg_entry *hit = NULL;
  if (s)
    HASH_FIND(hh_name, s->tn->names, name, len, hit);
  if (!s) {
    rc = tport_err_set(err, TPORT_ABORTED, "the connection is closing");
  } else if (hit && hit->state == REG_READY) {
    hit->refs++;
    *out = hit;
  } else if (w->tn) {
    rc = tport_err_set(err, TPORT_INTERNAL, "a request waits twice");
  } else if (s->waiters >= REG_WAITERS_PER_SESSION) {
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                       "this connection has %d requests waiting for names already: the limit",
                       s->waiters);
  } else if (s->tn->nwaiters >= REG_WAITERS_PER_TENANT) {
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                       "tenant '%s' has %llu requests waiting for names already: the limit",
                       s->tn->name, (unsigned long long)s->tn->nwaiters);
  } else {
    memcpy(w->name, name, len + 1);
    w->pipe = pipe;
    waiter_link(s->tn, s, w);
  }
  pthread_mutex_unlock(&r->mu);
  return rc;
}

bool reg_unwait(registry *r, reg_waiter *w)
{
  pthread_mutex_lock(&r->mu);
  bool was = w->tn != NULL;
  if (was)
    waiter_unlink(w, session_find(r, w->pipe));
  pthread_mutex_unlock(&r->mu);
  return was;
}

size_t waiters_take_session(registry *r, reg_session *s, void (**wake)(void *), void **arg,
                            size_t max)
{
  (void)r;
  size_t n = 0;
  for (reg_waiter *w = s->tn->waiters, *next; w && n < max && s->waiters; w = next) {
    next = w->next;
    if (w->pipe != s->pipe)
      continue;
    wake[n] = w->wake;
    arg[n++] = w->arg;
    waiter_unlink(w, s);
  }
  return n;
}

/* Wakes taken a round at a time: no allocation, and the lock is not held
 * while the server requeues the requests. */
#define WAKE_ROUND 32

void waiters_wake_name(registry *r, reg_tenant *tn, const char *name)
{
  for (;;) {
    void (*wake[WAKE_ROUND])(void *);
    void *arg[WAKE_ROUND];
    size_t n = 0;
    pthread_mutex_lock(&r->mu);
    for (reg_waiter *w = tn->waiters, *next; w && n < WAKE_ROUND; w = next) {
      next = w->next;
      if (strcmp(w->name, name) != 0)
        continue;
      wake[n] = w->wake;
      arg[n++] = w->arg;
      waiter_unlink(w, session_find(r, w->pipe));
    }
    pthread_mutex_unlock(&r->mu);
    for (size_t i = 0; i < n; i++)
      wake[i](arg[i]);
    if (n < WAKE_ROUND)
      break;
  }
  pthread_mutex_lock(&r->mu);
  tenant_unref(r, tn);
  pthread_mutex_unlock(&r->mu);
}
