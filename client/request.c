/*
 * request.c: requests that complete later -- each client's queue of them
 * and the bounded pool of library threads that runs it, completion (the
 * waits, the callback), cancel, and the end of them all at tport_close.
 *
 * What a request does is its run function's (async.c): this file calls
 * nothing else of libtport's.  A thread runs one request at a time (or a
 * run function takes the like requests queued behind it, to send them as
 * one batch: client_requests_take).  Each request has two references, the
 * caller's (tport_request_free) and the library's (dropped once it has
 * completed and its callback returned): either may go first.  Completion
 * state lives under one lock for every request of the process, so that a
 * request outlives its client and tport_wait_any can wait on requests of
 * several clients.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/prctl.h>

#include "client_internal.h"

#define POOL_DEFAULT_THREADS 4
#define POOL_MAX_THREADS 64
/* Threads for requests that wait for a name, past the pool's bound: the
 * server parks at most 16 of a connection's (registry_waiters.c). */
#define POOL_WAITING_THREADS 16

static pthread_mutex_t done_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t done_cv = PTHREAD_COND_INITIALIZER;

struct client_pool {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  tport_request *head, *tail; /* queued, oldest first */
  tport_request *live;        /* queued or running (cancelled at close) */
  pthread_t threads[POOL_MAX_THREADS + POOL_WAITING_THREADS];
  int nthreads, idle, max;
  int waiting; /* requests queued or running that wait for a name */
  int queued;  /* requests on the queue */
  int running; /* requests running that do not wait: at most max */
  int queued_waits; /* requests on the queue that wait for a name */
  bool closing;
};

static int pool_threads(void)
{
  const char *env = getenv("TPORT_ASYNC_THREADS");
  long n = env ? strtol(env, NULL, 10) : POOL_DEFAULT_THREADS;
  return n < 1 ? 1 : n > POOL_MAX_THREADS ? POOL_MAX_THREADS : (int)n;
}

int client_pool_init(tport_client *c, tport_err *err)
{
  struct client_pool *p = calloc(1, sizeof *p);
  if (!p)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  p->max = pool_threads();
  c->pool = p;
  return TPORT_OK;
}

static void unlink_live(struct client_pool *p, tport_request *r)
{
  if (r->live_prev)
    r->live_prev->live_next = r->live_next;
  else
    p->live = r->live_next;
  if (r->live_next)
    r->live_next->live_prev = r->live_prev;
  r->live_prev = r->live_next = NULL;
}

static void release(tport_request *r)
{
  pthread_mutex_lock(&done_mu);
  bool last = --r->refs == 0;
  pthread_mutex_unlock(&done_mu);
  if (!last)
    return;
  if (r->free_work)
    r->free_work(r->work);
  free(r);
}

void client_request_finish(tport_request *r, int status, const tport_err *e)
{
  struct client_pool *p = r->client->pool;
  pthread_mutex_lock(&p->mu);
  unlink_live(p, r);
  pthread_mutex_unlock(&p->mu);
  pthread_mutex_lock(&done_mu);
  r->status = status;
  if (status && e)
    r->err = *e;
  else if (status)
    tport_err_set(&r->err, status, "%s", tport_status_name(status));
  else
    tport_err_clear(&r->err); /* no formatting: 10,000 small puts finish here */
  r->finished = true;
  pthread_mutex_unlock(&done_mu);
  /* the callback first: a wait that returns has seen it return, so that
   * what it touches may go */
  if (r->done)
    r->done(r, status, r->done_arg);
  pthread_mutex_lock(&done_mu);
  r->complete = true;
  /* only a completion someone waits for wakes the waiters: 10,000 requests
   * waited for one by one would otherwise wake each wait 10,000 times */
  if (r->waiters)
    pthread_cond_broadcast(&done_cv);
  pthread_mutex_unlock(&done_mu);
  release(r);
}

static _Thread_local tport_request *running_request; /* a library thread's, as it runs */

bool client_request_abortable(nng_aio *aio)
{
  tport_request *r = running_request;
  if (!r)
    return false;
  pthread_mutex_lock(&done_mu);
  r->abort = aio;
  pthread_mutex_unlock(&done_mu);
  return true;
}

void client_request_started(nng_aio *aio)
{
  /* nng_aio_abort only stops an operation in progress: a cancel that came
   * while aio was idle (before its send, between its send and its
   * receive) is acted on here, once the operation is under way */
  tport_request *r = running_request;
  if (r && r->abort == aio && atomic_load(&r->cancel))
    nng_aio_abort(aio, NNG_ECANCELED);
}

static void run_one(tport_request *r)
{
  tport_err e;
  tport_err_clear(&e);
  running_request = r;
  int rc = atomic_load(&r->cancel)
               ? tport_err_set(&e, TPORT_CANCELLED, "cancelled before it started")
               : r->run(r, &e);
  running_request = NULL;
  client_request_finish(r, rc, &e);
}

/* The oldest queued request this thread may run, off the queue: one that
 * waits for a name always; another while fewer than the pool's bound of
 * them run (the threads made for waits must not raise it).  p->mu held. */
static tport_request *take_next(struct client_pool *p)
{
  if (p->running >= p->max && p->queued_waits == 0)
    return NULL; /* without walking a queue of thousands of puts */
  tport_request *prev = NULL;
  for (tport_request *r = p->head; r; prev = r, r = r->next) {
    if (!r->waits && p->running >= p->max)
      continue;
    if (prev)
      prev->next = r->next;
    else
      p->head = r->next;
    if (p->tail == r)
      p->tail = prev;
    p->queued--;
    p->queued_waits -= r->waits;
    p->running += !r->waits;
    return r;
  }
  return NULL;
}

static void *worker(void *arg)
{
  prctl(PR_SET_NAME, "tport:request"); /* what top -H, perf and gdb show */
  struct client_pool *p = arg;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    tport_request *r;
    while (!(r = take_next(p)) && !(p->closing && !p->head)) {
      p->idle++;
      pthread_cond_wait(&p->cv, &p->mu);
      p->idle--;
    }
    if (!r)
      break; /* closing, and nothing left */
    bool waits = r->waits;
    pthread_mutex_unlock(&p->mu);
    run_one(r); /* r may be gone after */
    pthread_mutex_lock(&p->mu);
    if (waits)
      p->waiting--;
    else
      p->running--;
    /* a request held back by the bound may go; closing, every thread that
     * waited for one must see the queue empty at last, and end */
    if (p->closing)
      pthread_cond_broadcast(&p->cv);
    else if (!waits)
      pthread_cond_signal(&p->cv);
  }
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

static int request_start(tport_client *c, client_run_fn run, void *work,
                         void (*free_work)(void *), tport_request_fn done, void *done_arg,
                         bool waits, tport_request **out, tport_err *err);

int client_request_start(tport_client *c, client_run_fn run, void *work,
                         void (*free_work)(void *), tport_request_fn done, void *done_arg,
                         tport_request **out, tport_err *err)
{
  return request_start(c, run, work, free_work, done, done_arg, false, out, err);
}

int client_request_start_waiting(tport_client *c, client_run_fn run, void *work,
                                 void (*free_work)(void *), tport_request_fn done,
                                 void *done_arg, tport_request **out, tport_err *err)
{
  return request_start(c, run, work, free_work, done, done_arg, true, out, err);
}

static int request_start(tport_client *c, client_run_fn run, void *work,
                         void (*free_work)(void *), tport_request_fn done, void *done_arg,
                         bool waits, tport_request **out, tport_err *err)
{
  tport_request *r = calloc(1, sizeof *r);
  if (!r) {
    if (free_work)
      free_work(work);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for a request");
  }
  r->client = c;
  r->run = run;
  r->work = work;
  r->free_work = free_work;
  r->done = done;
  r->done_arg = done_arg;
  r->refs = 2;
  r->waits = waits;
  atomic_init(&r->cancel, false);
  struct client_pool *p = c->pool;
  int rc = TPORT_OK;
  pthread_mutex_lock(&p->mu);
  if (p->closing)
    rc = tport_err_set(err, TPORT_UNAVAILABLE, "the client is being closed");
  /* a thread more while none is idle, up to the bound -- which the requests
   * waiting for names (each soon holding a thread for long) do not count
   * against; one that waits may have one of the extra threads */
  p->waiting += waits;
  int bound = p->max + p->waiting;
  if (waits)
    bound = p->max + POOL_WAITING_THREADS;
  if (bound > POOL_MAX_THREADS + POOL_WAITING_THREADS)
    bound = POOL_MAX_THREADS + POOL_WAITING_THREADS;
  /* idle threads woken for requests queued before are not idle for this
   * one: a thread more while the queue outnumbers them */
  if (!rc && p->queued >= p->idle && p->nthreads < bound) {
    if (pthread_create(&p->threads[p->nthreads], NULL, worker, p) == 0)
      p->nthreads++;
    else if (p->nthreads == 0)
      rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "cannot start a library thread");
  }
  if (rc)
    p->waiting -= waits;
  if (!rc) {
    if (p->tail)
      p->tail->next = r;
    else
      p->head = r;
    p->tail = r;
    p->queued++;
    p->queued_waits += waits;
    r->live_next = p->live;
    if (p->live)
      p->live->live_prev = r;
    p->live = r;
    pthread_cond_signal(&p->cv);
  }
  pthread_mutex_unlock(&p->mu);
  if (rc) {
    if (free_work)
      free_work(work);
    free(r);
    return rc;
  }
  *out = r;
  return TPORT_OK;
}

size_t client_requests_take(tport_client *c, client_run_fn run, tport_request **out, size_t max)
{
  struct client_pool *p = c->pool;
  size_t k = 0;
  pthread_mutex_lock(&p->mu);
  tport_request **at = &p->head, *last = NULL;
  while (*at && k < max) {
    tport_request *r = *at;
    if (r->run == run && !atomic_load(&r->cancel)) {
      *at = r->next;
      out[k++] = r;
      p->queued--;
    } else {
      last = r;
      at = &r->next;
    }
  }
  /* A walk that reached the end leaves last the tail (NULL: none left);
   * one that stopped at max never reached the tail, which is still there.
   * (Walking on to find it cost O(queue) under the lock at every take:
   * 10,000 small puts queued made it ~40 walks of thousands.) */
  if (!*at)
    p->tail = last;
  pthread_mutex_unlock(&p->mu);
  return k;
}

void client_pool_stop(tport_client *c)
{
  struct client_pool *p = c->pool;
  pthread_mutex_lock(&p->mu);
  p->closing = true;
  for (tport_request *r = p->live; r; r = r->live_next)
    atomic_store(&r->cancel, true);
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

void client_pool_join(tport_client *c)
{
  struct client_pool *p = c->pool;
  for (int i = 0; i < p->nthreads; i++)
    pthread_join(p->threads[i], NULL);
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  free(p);
  c->pool = NULL;
}

/* ---------------------------------------------------------------- the API */

bool tport_test(tport_request *req)
{
  pthread_mutex_lock(&done_mu);
  bool done = req->complete;
  pthread_mutex_unlock(&done_mu);
  return done;
}

/* Waits on done_cv (held) until until, or for ever (forever). */
static bool wait_until(bool forever, const struct timespec *until)
{
  if (forever) {
    pthread_cond_wait(&done_cv, &done_mu);
    return true;
  }
  return pthread_cond_timedwait(&done_cv, &done_mu, until) != ETIMEDOUT;
}

int tport_wait_any(tport_request *const *reqs, size_t n, int timeout_ms, size_t *index,
                   tport_err *err)
{
  struct timespec until = client_deadline_after(timeout_ms > 0 ? timeout_ms : 0);
  pthread_mutex_lock(&done_mu);
  for (size_t i = 0; i < n; i++)
    if (reqs[i])
      reqs[i]->waiters++;
  int st = TPORT_DEADLINE_EXCEEDED;
  size_t at = (size_t)-1;
  for (;;) {
    for (size_t i = 0; i < n && at == (size_t)-1; i++)
      if (reqs[i] && reqs[i]->complete) {
        at = i;
        st = reqs[i]->status;
        if (err)
          *err = reqs[i]->err;
      }
    if (at != (size_t)-1 || timeout_ms == 0 || !wait_until(timeout_ms < 0, &until))
      break;
  }
  for (size_t i = 0; i < n; i++)
    if (reqs[i])
      reqs[i]->waiters--;
  pthread_mutex_unlock(&done_mu);
  if (at != (size_t)-1) {
    if (index)
      *index = at;
    return st;
  }
  if (index)
    *index = (size_t)-1;
  return tport_err_set(err, TPORT_DEADLINE_EXCEEDED, "no request completed within %d ms",
                       timeout_ms);
}

int tport_wait(tport_request *req, int timeout_ms, tport_err *err)
{
  return tport_wait_any(&req, 1, timeout_ms, NULL, err);
}

const tport_err *tport_request_error(const tport_request *req)
{
  pthread_mutex_lock(&done_mu);
  bool finished = req->finished;
  pthread_mutex_unlock(&done_mu);
  return finished ? &req->err : NULL; /* never written again */
}

void tport_cancel(tport_request *req)
{
  atomic_store(&req->cancel, true);
  pthread_mutex_lock(&done_mu);
  if (req->abort) /* blocked waiting for a name: stop waiting */
    nng_aio_abort(req->abort, NNG_ECANCELED);
  pthread_mutex_unlock(&done_mu);
}

void tport_request_free(tport_request *req)
{
  if (!req)
    return;
  tport_cancel(req); /* one in flight stops: nobody wants it */
  release(req);
}
