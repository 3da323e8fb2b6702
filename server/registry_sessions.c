/*
 * registry_sessions.c: sessions, one per connection (registry.h): opened
 * and closed with their pipe, their tenant set once, the challenge of their
 * proof, and what each may have in flight (requests, chunks, gets).
 */
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "registry_internal.h"

/* ---------------------------------------------------------------- sessions */

/* When a session opened, for the proof's deadline: a clock that a step of
 * the wall clock does not move, so that the unproved list stays in order. */
static int64_t mono_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#define UNPROVED_NEW 1
#define UNPROVED_OVERDUE 2

/* s at the end of a list (head, tail) / out of it (mu held). */
static void slist_append(reg_session **head, reg_session **tail, reg_session *s)
{
  s->uprev = *tail;
  s->unext = NULL;
  if (*tail)
    (*tail)->unext = s;
  else
    *head = s;
  *tail = s;
}

static void slist_unlink(reg_session **head, reg_session **tail, reg_session *s)
{
  if (s->uprev)
    s->uprev->unext = s->unext;
  else
    *head = s->unext;
  if (s->unext)
    s->unext->uprev = s->uprev;
  else
    *tail = s->uprev;
  s->uprev = s->unext = NULL;
}

/* s out of the unproved lists: proved, or closed (mu held). */
static void unproved_leave(registry *r, reg_session *s)
{
  if (s->ulist == UNPROVED_NEW)
    slist_unlink(&r->unproved, &r->unproved_tail, s);
  else if (s->ulist == UNPROVED_OVERDUE)
    slist_unlink(&r->overdue, &r->overdue_tail, s);
  s->ulist = 0;
}

/* s to the end of the overdue list, looked at now (mu held). */
static void overdue_requeue(registry *r, reg_session *s, int64_t now)
{
  unproved_leave(r, s);
  slist_append(&r->overdue, &r->overdue_tail, s);
  s->ulist = UNPROVED_OVERDUE;
  s->looked_ms = now;
}

bool reg_session_open(registry *r, uint32_t pipe, uint64_t max_sessions)
{
  bool ok = false;
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  if (s) {
    ok = true;
  } else if (max_sessions && r->nsessions >= max_sessions) {
    /* counted and refused under one lock: concurrent arrivals cannot both
     * take the last place */
  } else if ((s = calloc(1, sizeof *s)) != NULL) {
    s->pipe = pipe;
    s->opened_ms = mono_ms();
    s->via = REG_VIA_OTHER;
    snprintf(s->peer, sizeof s->peer, "unknown");
    s->tn = tenant_ref(r, "default");
    reg_oom = false;
    if (s->tn)
      HASH_ADD(hh, r->sessions, pipe, sizeof s->pipe, s);
    if (!s->tn || reg_oom) {
      /* no session: every request of this pipe is refused */
      tenant_unref(r, s->tn);
      free(s);
    } else {
      r->nsessions++;
      r->nsessions_via[s->via]++;
      slist_append(&r->unproved, &r->unproved_tail, s);
      s->ulist = UNPROVED_NEW;
      ok = true;
    }
  }
  pthread_mutex_unlock(&r->mu);
  return ok;
}

const char *const reg_via_names[REG_VIAS] = {"tcp", "tls", "ipc", "inproc", "other"};

void reg_session_describe(registry *r, uint32_t pipe, reg_via via, const char *peer)
{
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  if (s) {
    r->nsessions_via[s->via]--;
    s->via = via < REG_VIAS ? via : REG_VIA_OTHER;
    r->nsessions_via[s->via]++;
    snprintf(s->peer, sizeof s->peer, "%s", peer ? peer : "unknown");
  }
  pthread_mutex_unlock(&r->mu);
}

void reg_session_peer(registry *r, uint32_t pipe, char *buf, size_t len)
{
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  snprintf(buf, len, "%s", s ? s->peer : "unknown");
  pthread_mutex_unlock(&r->mu);
}

void reg_session_close(registry *r, uint32_t pipe)
{
  reg_entry *dead = NULL;
  /* its requests waiting for names are woken to find the session gone */
  void (*wake[REG_WAITERS_PER_SESSION])(void *);
  void *arg[REG_WAITERS_PER_SESSION];
  size_t nwake = 0;
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  if (s) {
    nwake = waiters_take_session(r, s, wake, arg, REG_WAITERS_PER_SESSION);
    while (s->owned)
      entry_unlink(r, s->owned, &dead);
    unproved_leave(r, s);
    HASH_DEL(r->sessions, s);
    r->nsessions--;
    r->nsessions_via[s->via]--;
    tenant_unref(r, s->tn);
    free(s);
  }
  pthread_mutex_unlock(&r->mu);
  for (size_t i = 0; i < nwake; i++)
    wake[i](arg[i]);
  entry_free_dead(r, dead);
}

int reg_session_set_tenant(registry *r, uint32_t pipe, const char *tenant, tport_err *err)
{
  if (!tenant || !*tenant)
    tenant = "default";
  if (strlen(tenant) >= REG_TENANT_MAX)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "tenant is longer than %d bytes",
                         REG_TENANT_MAX - 1);
  int rc = TPORT_OK;
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  if (!s) {
    rc = tport_err_set(err, TPORT_ABORTED, "the connection is closing");
  } else if (strcmp(s->tn->name, tenant) == 0) {
    s->tenant_fixed = true;
  } else if (s->tenant_fixed) {
    rc = tport_err_set(err, TPORT_PERMISSION_DENIED,
                       "this connection is tenant '%s': a connection's tenant is set once",
                       s->tn->name);
  } else if (s->owned || s->transfers || s->reservations || s->waiters) {
    rc = tport_err_set(err, TPORT_PERMISSION_DENIED,
                       "this connection already holds tensors of tenant '%s'", s->tn->name);
  } else {
    reg_tenant *t = tenant_ref(r, tenant);
    if (!t) {
      rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for a tenant");
    } else {
      tenant_unref(r, s->tn);
      s->tn = t;
      s->tenant_fixed = true;
    }
  }
  pthread_mutex_unlock(&r->mu);
  return rc;
}

int reg_session_authenticate(registry *r, uint32_t pipe, const char *tenant, tport_err *err)
{
  int rc = reg_session_set_tenant(r, pipe, tenant, err);
  if (!rc) {
    pthread_mutex_lock(&r->mu);
    reg_session *s = session_find(r, pipe);
    if (s) {
      s->authenticated = true;
      unproved_leave(r, s);
    }
    pthread_mutex_unlock(&r->mu);
  }
  return rc;
}

bool reg_session_authenticated(registry *r, uint32_t pipe)
{
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  bool ok = s && s->authenticated;
  pthread_mutex_unlock(&r->mu);
  return ok;
}

int reg_session_challenge(registry *r, uint32_t pipe, uint8_t out[REG_CHALLENGE_BYTES],
                          tport_err *err)
{
  if (RAND_bytes(out, REG_CHALLENGE_BYTES) != 1)
    return tport_err_set(err, TPORT_INTERNAL, "cannot make a challenge");
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  if (s) {
    memcpy(s->challenge, out, REG_CHALLENGE_BYTES);
    s->challenged = true;
  }
  pthread_mutex_unlock(&r->mu);
  return s ? TPORT_OK : tport_err_set(err, TPORT_ABORTED, "the connection is closing");
}

bool reg_session_take_challenge(registry *r, uint32_t pipe, uint8_t out[REG_CHALLENGE_BYTES])
{
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  bool had = s && s->challenged;
  if (had) {
    memcpy(out, s->challenge, REG_CHALLENGE_BYTES);
    s->challenged = false; /* used once, whatever the answer */
  }
  pthread_mutex_unlock(&r->mu);
  return had;
}

bool reg_session_tenant(registry *r, uint32_t pipe, char *buf, size_t len)
{
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  if (s)
    snprintf(buf, len, "%s", s->tn->name);
  pthread_mutex_unlock(&r->mu);
  return s != NULL;
}

size_t reg_unproved_sessions(registry *r, int64_t timeout_ms, uint32_t *out, size_t max)
{
  size_t n = 0;
  int64_t now = reg_now_ms(), mono = mono_ms(), before = mono - timeout_ms;
  reg_session *s;
  pthread_mutex_lock(&r->mu);
  /* told of a second ago or more: again (least recently first) */
  while (n < max && (s = r->overdue) != NULL) {
    r->unproved_walked++;
    if (mono - s->looked_ms < 1000)
      break;
    overdue_requeue(r, s, mono);
    out[n++] = s->pipe;
  }
  /* the newly overdue (opening order: the first not yet overdue ends it) */
  while (n < max && (s = r->unproved) != NULL) {
    r->unproved_walked++;
    if (s->opened_ms >= before)
      break;
    overdue_requeue(r, s, mono);
    /* one told to close a moment ago (for another reason): a second later */
    if (!s->dropped || now - s->dropped_ms >= 1000)
      out[n++] = s->pipe;
  }
  pthread_mutex_unlock(&r->mu);
  return n;
}

bool reg_session_mark_dropped(registry *r, uint32_t pipe)
{
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  bool first = s && !s->dropped;
  if (s) {
    s->dropped = true;
    s->dropped_ms = reg_now_ms();
  }
  pthread_mutex_unlock(&r->mu);
  return first;
}

reg_admit reg_request_enter(registry *r, uint32_t pipe, size_t bytes, bool proof_required,
                            char *tenant, size_t len)
{
  reg_admit a;
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  bool unproved = s && proof_required && !s->authenticated;
  /* Twice the limit a client is told: the count falls when a reply's send
   * completes, which nng reports a little after the reply may already have
   * reached the client and been answered by a new request.  A connection
   * that has not proved its tenant is told nothing yet and needs one Hello
   * at a time: the same margin over one. */
  if (!s || s->dropped)
    a = REG_ADMIT_GONE;
  else if (unproved && bytes > REG_UNPROVED_REQUEST_MAX)
    a = REG_ADMIT_UNPROVED_TOO_LARGE;
  else if (s->outstanding >= (unproved ? 2 : 2 * r->limits.max_outstanding))
    a = unproved ? REG_ADMIT_UNPROVED_TOO_MANY : REG_ADMIT_TOO_MANY;
  else
    a = REG_ADMIT_OK;
  if (s)
    s->outstanding++; /* left by reg_request_leave whatever happens */
  if (tenant && len)
    snprintf(tenant, len, "%s", !s || unproved ? "" : s->tn->name);
  pthread_mutex_unlock(&r->mu);
  return a;
}

const char *reg_admit_reason(reg_admit a)
{
  switch (a) {
  case REG_ADMIT_OK: return "admitted";
  case REG_ADMIT_GONE: return "the connection is closing";
  case REG_ADMIT_TOO_MANY: return "too many requests unanswered";
  case REG_ADMIT_UNPROVED_TOO_MANY:
    return "more than one request at a time before proving its tenant";
  case REG_ADMIT_UNPROVED_TOO_LARGE:
    return "a request larger than a Hello before proving its tenant";
  }
  return "refused";
}

void reg_request_leave(registry *r, uint32_t pipe)
{
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  if (s && s->outstanding > 0)
    s->outstanding--;
  pthread_mutex_unlock(&r->mu);
}

int reg_chunk_enter(registry *r, uint32_t pipe, tport_err *err)
{
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  int rc = TPORT_OK;
  if (!s)
    rc = tport_err_set(err, TPORT_ABORTED, "the connection is closing");
  else if (s->inflight_chunks >= r->limits.max_inflight_chunks)
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                       "%d chunks already in flight on this connection (limit %d)",
                       s->inflight_chunks, r->limits.max_inflight_chunks);
  else
    s->inflight_chunks++;
  pthread_mutex_unlock(&r->mu);
  return rc;
}

void reg_chunk_leave(registry *r, uint32_t pipe)
{
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  if (s && s->inflight_chunks > 0)
    s->inflight_chunks--;
  pthread_mutex_unlock(&r->mu);
}

int reg_transfer_enter(registry *r, uint32_t pipe, size_t bytes, reg_tenant **tn, tport_err *err)
{
  int rc = TPORT_OK;
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  if (!s)
    rc = tport_err_set(err, TPORT_ABORTED, "the connection is closing");
  else if (s->transfers >= r->limits.max_transfers)
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                       "%d gets already in progress on this connection (limit %d): read or "
                       "finish them first",
                       s->transfers, r->limits.max_transfers);
  else if (bytes > tenant_left(r, s->tn))
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                       "tenant '%s' would hold %zu bytes more than its %zu with this get's host "
                       "copy: its quota is %zu",
                       s->tn->name, bytes, tenant_held(s->tn), r->limits.tenant_quota_bytes);
  if (!rc) {
    s->transfers++;
    s->tn->bytes += bytes;
    s->tn->refs++;
    *tn = s->tn;
  }
  pthread_mutex_unlock(&r->mu);
  return rc;
}

void reg_transfer_leave(registry *r, uint32_t pipe, reg_tenant *tn, size_t bytes)
{
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  if (s && s->transfers > 0)
    s->transfers--;
  tn->bytes -= bytes;
  tenant_unref(r, tn);
  pthread_mutex_unlock(&r->mu);
}
