/*
 * stress_async.c: libtport's asynchronous requests under load, as a plain
 * program for ThreadSanitizer (Criterion cannot run under it).  An
 * in-process server; six threads share one client and issue puts, gets,
 * batches and to()s as requests, wait for them one by one and with
 * wait_any, cancel some in flight and free others unwaited, with callbacks
 * that issue requests of their own, and wait for names (one answered by a
 * put, one cancelled as it starts); then the client is closed with
 * requests still in flight.  Exit status 0 when every request that
 * completed OK brought its bytes back right and every request completed.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server.h"
#include "tport.h"

#define THREADS 6
#define ROUNDS 30
#define INFLIGHT 8

static tport_client *shared;
static atomic_int failures, callbacks, chained;

static void fail(const char *what, int rc, const tport_err *e)
{
  fprintf(stderr, "stress_async: %s: %d %s\n", what, rc, e ? e->msg : "");
  atomic_fetch_add(&failures, 1);
}

static void chained_done(tport_request *req, int status, void *arg)
{
  atomic_fetch_add(&chained, 1);
  tport_request_free(req);
}

/* A callback that issues a request of its own (an Info-like to()). */
static void count_and_chain(tport_request *req, int status, void *arg)
{
  atomic_fetch_add(&callbacks, 1);
  tport_tensor_info *info = arg;
  if (status != TPORT_OK || !info)
    return;
  tport_to_options o = {.has_dtype = true, .dtype = TPORT_INT64};
  tport_request *next;
  if (tport_to_async(shared, &info->ref, &o, NULL, NULL, chained_done, NULL, &next, NULL))
    fail("to_async from a callback", -1, NULL);
}

typedef struct slot {
  int32_t *v, *back;
  size_t n;
  int64_t size;
  tport_tensor_info info;
  tport_request *put, *get;
} slot;

static void one_round(unsigned *seed)
{
  slot s[INFLIGHT];
  tport_request *puts[INFLIGHT];
  tport_err err;
  for (int i = 0; i < INFLIGHT; i++) {
    s[i].n = 1 + (size_t)(rand_r(seed) % 60000);
    s[i].size = (int64_t)s[i].n;
    s[i].v = malloc(s[i].n * 4);
    s[i].back = calloc(s[i].n, 4);
    for (size_t j = 0; j < s[i].n; j++)
      s[i].v[j] = (int32_t)(j * 13 + (size_t)i);
    int rc = tport_put_async(shared, TPORT_INT32, 1, &s[i].size, NULL, s[i].v, s[i].n * 4, NULL,
                             &s[i].info, count_and_chain, &s[i].info, &s[i].put, &err);
    if (rc)
      fail("put_async", rc, &err);
    puts[i] = rc ? NULL : s[i].put;
  }
  /* every put, in the order they complete */
  for (int k = 0; k < INFLIGHT; k++) {
    size_t at;
    int rc = tport_wait_any(puts, INFLIGHT, 60000, &at, &err);
    if (at == (size_t)-1) {
      fail("wait_any", rc, &err);
      break;
    }
    if (rc)
      fail("put", rc, &err);
    puts[at] = NULL;
  }
  for (int i = 0; i < INFLIGHT; i++) {
    s[i].get = NULL;
    if (tport_test(s[i].put) && tport_wait(s[i].put, 0, NULL) == TPORT_OK &&
        tport_get_async(shared, &s[i].info.ref, s[i].back, s[i].n * 4, NULL, NULL, NULL, &s[i].get,
                        &err))
      fail("get_async", -1, &err);
  }
  /* cancel one get, free one unwaited (then wait before its buffer goes) */
  if (s[0].get)
    tport_cancel(s[0].get);
  for (int i = 0; i < INFLIGHT; i++) {
    if (!s[i].get)
      continue;
    int rc = tport_wait(s[i].get, 60000, &err);
    if (rc == TPORT_OK && memcmp(s[i].v, s[i].back, s[i].n * 4))
      fail("get: wrong bytes", rc, NULL);
    else if (rc && !(i == 0 && rc == TPORT_CANCELLED))
      fail("get", rc, &err);
    tport_request_free(s[i].get);
  }
  for (int i = 0; i < INFLIGHT; i++) {
    tport_request_free(s[i].put);
    free(s[i].v);
    free(s[i].back);
  }
}

static void one_batch(unsigned *seed)
{
  enum { N = 40 };
  static _Thread_local float vals[N][64];
  tport_put_item items[N];
  int64_t sz = 64;
  for (int i = 0; i < N; i++) {
    for (int j = 0; j < 64; j++)
      vals[i][j] = (float)(i + j);
    items[i] = (tport_put_item){.dtype = TPORT_FLOAT32, .ndim = 1, .sizes = &sz,
                                .data = vals[i], .nbytes = sizeof vals[i]};
  }
  tport_request *r;
  tport_err err;
  int rc = tport_put_batch_async(shared, items, N, NULL, NULL, &r, &err);
  if (!rc && (rc = tport_wait(r, 60000, &err)) != TPORT_OK)
    fail("put_batch", rc, &err);
  if (!rc)
    tport_request_free(r);
  tport_get_item gets[N];
  for (int i = 0; i < N; i++)
    gets[i] = (tport_get_item){.ref = items[i].info.ref};
  if (!rc && (rc = tport_get_batch(shared, gets, N, &err)) != TPORT_OK)
    fail("get_batch", rc, &err);
  for (int i = 0; !rc && i < N; i++) {
    if (memcmp(gets[i].data, vals[i], sizeof vals[i]))
      fail("get_batch: wrong bytes", i, NULL);
    free(gets[i].data);
  }
}

/* Waits for names: one answered by a put, one cancelled as it starts (the
 * cancel races the wait's aio being known). */
static void one_wait(int thread, int round)
{
  char name[64];
  snprintf(name, sizeof name, "stress-wait-%d-%d", thread, round);
  tport_ref r = {0}, never = {0};
  snprintf(r.name, sizeof r.name, "%s", name);
  snprintf(never.name, sizeof never.name, "stress-never-%d-%d", thread, round);
  tport_tensor_info got, other, made;
  tport_request *w, *c;
  tport_err err;
  if (tport_info_async(shared, &r, 30000, &got, NULL, NULL, &w, &err)) {
    fail("info_async", -1, &err);
    return;
  }
  if (!tport_info_async(shared, &never, 30000, &other, NULL, NULL, &c, &err)) {
    tport_cancel(c);
    int rc = tport_wait(c, 30000, &err);
    if (rc != TPORT_CANCELLED)
      fail("a cancelled wait", rc, &err);
    tport_request_free(c);
  }
  int32_t v = round;
  int64_t one = 1;
  tport_put_options o;
  tport_put_options_init(&o);
  o.name = name;
  int rc = tport_put(shared, TPORT_INT32, 1, &one, NULL, &v, sizeof v, &o, &made, &err);
  if (rc)
    fail("put of a waited-for name", rc, &err);
  if ((rc = tport_wait(w, 30000, &err)) != TPORT_OK)
    fail("a wait answered by a put", rc, &err);
  else if (memcmp(got.ref.handle, made.ref.handle, TPORT_HANDLE_BYTES))
    fail("a wait woke with another tensor", -1, NULL);
  tport_request_free(w);
  tport_free(shared, &made.ref, NULL);
}

static void *worker(void *arg)
{
  unsigned seed = (unsigned)(intptr_t)arg * 2654435761u;
  for (int r = 0; r < ROUNDS; r++) {
    if (r % 5 == 4)
      one_batch(&seed);
    else if (r % 5 == 2)
      one_wait((int)(intptr_t)arg, r);
    else
      one_round(&seed);
  }
  return NULL;
}

int main(void)
{
  char url[128];
  snprintf(url, sizeof url, "inproc://stress-async-%d", (int)getpid());
  server_config cfg;
  config_defaults(&cfg);
  cfg.listen[0] = strdup(url);
  cfg.nlisten = 1;
  cfg.devices = strdup("cpu,sim:2");
  cfg.chunk_bytes = 64 << 10;
  cfg.log_level = 0;
  server *s;
  tport_err err;
  if (server_start(&cfg, &s, &err)) {
    fprintf(stderr, "server_start: %s\n", err.msg);
    return 1;
  }
  tport_connect_options o = {.timeout_ms = 60000, .no_shm = true};
  if (tport_connect(url, &o, &shared, &err)) {
    fprintf(stderr, "connect: %s\n", err.msg);
    return 1;
  }
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++)
    pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i);
  for (int i = 0; i < THREADS; i++)
    pthread_join(t[i], NULL);
  /* close with requests in flight: each completes, none is used after */
  static int32_t big[1 << 18];
  int64_t n = 1 << 18;
  tport_request *left[16];
  for (int i = 0; i < 16; i++)
    if (tport_put_async(shared, TPORT_INT32, 1, &n, NULL, big, sizeof big, NULL, NULL, NULL, NULL,
                        &left[i], &err))
      fail("put_async before close", -1, &err);
  tport_close(shared);
  for (int i = 0; i < 16; i++) {
    if (!tport_test(left[i]))
      fail("a request not complete after tport_close", -1, NULL);
    tport_request_free(left[i]);
  }
  server_stop(s, 1000);
  config_free(&cfg);
  int f = atomic_load(&failures);
  printf("stress_async: %d threads x %d rounds, %d callbacks, %d chained, %d failures\n", THREADS,
         ROUNDS, atomic_load(&callbacks), atomic_load(&chained), f);
  return f ? 1 : 0;
}
