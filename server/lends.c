/* lends.c: the table of lent replies (lends.h). */
#include "lends.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "lent_bytes.h"

typedef struct lend {
  lends *owner;
  tport_storage *st;
  uint32_t pipe;
  int64_t since_ms;
  struct lend *prev, *next;
} lend;

struct lends {
  pthread_mutex_t mu;
  lend *head, *tail; /* newest first: the overdue ones are at the tail */
  size_t n;
  uint64_t walked; /* lends lends_overdue looked at, ever (tests) */
  bool orphaned; /* lends_free gave up waiting: the last lend frees it */
};

int64_t lends_now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

lends *lends_new(void)
{
  lends *l = calloc(1, sizeof *l);
  if (l)
    pthread_mutex_init(&l->mu, NULL);
  return l;
}

void lends_free(lends *l, int wait_ms)
{
  if (!l)
    return;
  for (int i = 0; i < wait_ms && lends_count(l); i++)
    usleep(1000);
  pthread_mutex_lock(&l->mu);
  if (l->n) {
    l->orphaned = true;
    pthread_mutex_unlock(&l->mu);
    return;
  }
  pthread_mutex_unlock(&l->mu);
  pthread_mutex_destroy(&l->mu);
  free(l);
}

void *lends_begin(lends *l, uint32_t pipe, tport_storage *st)
{
  lend *d = calloc(1, sizeof *d);
  if (!d)
    return NULL;
  d->owner = l;
  d->st = storage_retain(st);
  d->pipe = pipe;
  pthread_mutex_lock(&l->mu);
  d->since_ms = lends_now_ms(); /* under the lock: the list stays in order of it */
  d->next = l->head;
  if (l->head)
    l->head->prev = d;
  else
    l->tail = d;
  l->head = d;
  l->n++;
  pthread_mutex_unlock(&l->mu);
  return d;
}

void lends_end(void *arg)
{
  lend *d = arg;
  lends *l = d->owner;
  pthread_mutex_lock(&l->mu);
  if (d->prev)
    d->prev->next = d->next;
  else
    l->head = d->next;
  if (d->next)
    d->next->prev = d->prev;
  else
    l->tail = d->prev;
  bool last_of_orphan = --l->n == 0 && l->orphaned;
  pthread_mutex_unlock(&l->mu);
  /* on nng's thread, maybe under its locks: never free memory here */
  storage_release_deferred(d->st);
  free(d);
  if (last_of_orphan) {
    pthread_mutex_destroy(&l->mu);
    free(l);
  }
}

size_t lends_overdue(lends *l, int64_t before_ms, uint32_t *pipes, size_t max)
{
  size_t k = 0;
  pthread_mutex_lock(&l->mu);
  /* oldest first, while overdue: the reaper's call each second costs what
   * is overdue, not every reply in flight (under the lock each lent reply
   * takes) */
  for (lend *d = l->tail; d && k < max && d->since_ms < before_ms; d = d->prev) {
    l->walked++;
    bool seen = false;
    for (size_t i = 0; i < k && !seen; i++)
      seen = pipes[i] == d->pipe;
    if (!seen)
      pipes[k++] = d->pipe;
  }
  pthread_mutex_unlock(&l->mu);
  return k;
}

uint64_t lends_walked(lends *l)
{
  pthread_mutex_lock(&l->mu);
  uint64_t n = l->walked;
  pthread_mutex_unlock(&l->mu);
  return n;
}

size_t lends_count(lends *l)
{
  pthread_mutex_lock(&l->mu);
  size_t n = l->n;
  pthread_mutex_unlock(&l->mu);
  return n;
}

#ifdef TPORT_NNG_LENT_TAIL
bool lends_pipe_takes_lent_bytes(uint32_t pipe)
{
  nng_listener l = nng_pipe_listener((nng_pipe){.id = pipe});
  char *url;
  if (nng_listener_id(l) <= 0 || nng_listener_get_string(l, NNG_OPT_URL, &url) != 0)
    return false;
  bool yes = transport_url_sends_lent_bytes(url);
  nng_strfree(url);
  return yes;
}

bool lends_attach(lends *l, nng_msg *msg, uint32_t pipe, tport_storage *st, const void *p,
                  size_t n)
{
  /* the message holds the storage until nng is done with the bytes */
  void *d = lends_begin(l, pipe, st);
  if (!d || nng_msg_set_tail(msg, p, n, lends_end, d) != 0) {
    if (d)
      lends_end(d);
    return false;
  }
  return true;
}

_Static_assert(LENDS_SEGMENTS <= TPORT_NNG_TAIL_SEGMENTS,
               "a reply lends no more segments than nng_msg_add_tail takes (deploy/nng 0012)");

/* Several lends that end together: a batch reply's segments. */
typedef struct lend_set {
  void *lent[LENDS_SEGMENTS];
  int n;
} lend_set;

static void lend_set_end(void *arg)
{
  lend_set *set = arg;
  for (int i = 0; i < set->n; i++)
    lends_end(set->lent[i]);
  free(set);
}

bool lends_attach_begun(nng_msg *msg, void *const *lent, const void *const *ps, const size_t *ns,
                        int k)
{
  lend_set *set = k >= 1 && k <= LENDS_SEGMENTS ? calloc(1, sizeof *set) : NULL;
  if (!set) {
    for (int i = 0; i < k; i++)
      lends_end(lent[i]);
    return false;
  }
  for (int i = 0; i < k; i++)
    set->lent[set->n++] = lent[i];
  if (nng_msg_set_tail(msg, ps[0], ns[0], lend_set_end, set) != 0) {
    lend_set_end(set);
    return false;
  }
  for (int i = 1; i < k; i++)
    if (nng_msg_add_tail(msg, ps[i], ns[i]) != 0)
      return false; /* the set ends when msg is freed: the caller frees it */
  return true;
}
#endif
