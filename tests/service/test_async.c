/* test_async.c: libtport's asynchronous requests against a server in this
 * process: polling, waits, wait_any, cancel in the middle of a transfer
 * (and the server left clean), a callback that calls back into the
 * library, small puts queued together, and tport_close with requests in
 * flight.  Every wait is bounded; nothing is timed. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"
#include "service_util.h"

#define WAIT_MS 30000

static server *srv;
static char url[256];

static void start(void)
{
  srv = svc_start_inproc(url, sizeof url, NULL);
}

static void stop(void)
{
  server_stop(srv, 1000);
}

static tport_client *connect_plain(void)
{
  tport_connect_options o = {.timeout_ms = WAIT_MS, .no_shm = true};
  tport_client *c;
  tport_err err;
  cr_assert_eq(tport_connect(url, &o, &c, &err), TPORT_OK, "%s", err.msg);
  return c;
}

static uint8_t *pattern(size_t n, unsigned seed)
{
  uint8_t *p = malloc(n);
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t)(i * 131 + seed);
  return p;
}

static size_t listed(tport_client *c)
{
  tport_tensor_info *l;
  size_t n;
  tport_err err;
  cr_assert_eq(tport_list(c, &l, &n, &err), TPORT_OK, "%s", err.msg);
  free(l);
  return n;
}

TestSuite(async, .init = start, .fini = stop, .timeout = 120);

Test(async, put_then_get_by_polling)
{
  tport_client *c = connect_plain();
  size_t n = 1 << 20; /* 16 chunks of the tests' server */
  uint8_t *src = pattern(n, 7), *dst = calloc(1, n);
  int64_t sizes[1] = {(int64_t)n};
  tport_tensor_info info;
  tport_request *put;
  tport_err err;
  cr_assert_eq(tport_put_async(c, TPORT_UINT8, 1, sizes, NULL, src, n, NULL, &info, NULL, NULL,
                               &put, &err),
               TPORT_OK, "%s", err.msg);
  /* a wait that times out says DEADLINE_EXCEEDED (the request may complete
   * right after: then the next test says so) */
  while (!tport_test(put)) {
    int rc = tport_wait(put, 10, &err);
    cr_assert(rc == TPORT_DEADLINE_EXCEEDED || (rc == TPORT_OK && tport_test(put)), "%d", rc);
  }
  cr_assert_eq(tport_wait(put, 0, &err), TPORT_OK, "%s", err.msg);
  tport_request *get;
  cr_assert_eq(tport_get_async(c, &info.ref, dst, n, NULL, NULL, NULL, &get, &err), TPORT_OK);
  cr_assert_eq(tport_wait(get, -1, &err), TPORT_OK, "%s", err.msg);
  cr_assert_eq(memcmp(src, dst, n), 0);
  tport_request_free(put);
  tport_request_free(get);
  tport_close(c);
  free(src), free(dst);
}

/* The progress of a transfer holds it after its first chunks until the
 * test has cancelled it. */
typedef struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool reached, released;
} gate;

static void hold_at_first_progress(void *arg, uint64_t done, uint64_t total)
{
  gate *g = arg;
  pthread_mutex_lock(&g->mu);
  g->reached = true;
  pthread_cond_broadcast(&g->cv);
  while (!g->released)
    pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
}

static void cancel_at_gate(gate *g, tport_request *r)
{
  pthread_mutex_lock(&g->mu);
  while (!g->reached)
    pthread_cond_wait(&g->cv, &g->mu);
  tport_cancel(r);
  g->released = true;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

Test(async, cancel_in_the_middle_of_a_put_leaves_nothing)
{
  tport_client *c = connect_plain();
  size_t n = 16 << 20; /* 256 chunks */
  uint8_t *src = pattern(n, 3);
  int64_t sizes[1] = {(int64_t)n};
  gate g = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false};
  tport_put_options o;
  tport_put_options_init(&o);
  o.progress = hold_at_first_progress;
  o.progress_arg = &g;
  tport_request *r;
  tport_err err;
  cr_assert_eq(tport_put_async(c, TPORT_UINT8, 1, sizes, NULL, src, n, &o, NULL, NULL, NULL, &r,
                               &err),
               TPORT_OK);
  cancel_at_gate(&g, r);
  cr_assert_eq(tport_wait(r, WAIT_MS, &err), TPORT_CANCELLED, "%s", err.msg);
  tport_request_free(r);
  /* the upload was aborted: nothing listed, and the client still works */
  cr_assert_eq(listed(c), 0);
  tport_tensor_info info;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, sizes, NULL, src, n, NULL, &info, &err), TPORT_OK,
               "%s", err.msg);
  cr_assert_eq(listed(c), 1);
  tport_close(c);
  free(src);
}

/* The server holds its third GetChunk until the test has cancelled the
 * get: the request is then in the middle of its transfer. */
static gate chunk_gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false};
static atomic_int chunks_seen;

static void hold_third_chunk(server *s, uint32_t pipe, uint16_t method)
{
  if (method == TPORT__METHOD__METHOD_GET_CHUNK && atomic_fetch_add(&chunks_seen, 1) == 2)
    hold_at_first_progress(&chunk_gate, 0, 0);
}

Test(async, cancel_in_the_middle_of_a_get)
{
  tport_client *c = connect_plain();
  size_t n = 16 << 20;
  uint8_t *src = pattern(n, 5), *dst = calloc(1, n);
  int64_t sizes[1] = {(int64_t)n};
  tport_tensor_info info;
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, sizes, NULL, src, n, NULL, &info, &err), TPORT_OK);
  server_test_before_handle = hold_third_chunk;
  tport_request *r;
  cr_assert_eq(tport_get_async(c, &info.ref, dst, n, NULL, NULL, NULL, &r, &err), TPORT_OK);
  cancel_at_gate(&chunk_gate, r);
  cr_assert_eq(tport_wait(r, WAIT_MS, &err), TPORT_CANCELLED, "%s", err.msg);
  server_test_before_handle = NULL;
  tport_request_free(r);
  cr_assert_lt(atomic_load(&chunks_seen), 256, "it stopped asking for chunks");
  /* the tensor is still there and whole, and the client goes on */
  memset(dst, 0, n);
  cr_assert_eq(tport_get(c, &info.ref, dst, n, NULL, NULL, NULL, &err), TPORT_OK, "%s", err.msg);
  cr_assert_eq(memcmp(src, dst, n), 0);
  cr_assert_eq(listed(c), 1);
  tport_close(c);
  free(src), free(dst);
}

Test(async, wait_any_returns_each_once)
{
  tport_client *c = connect_plain();
  enum { N = 6 };
  size_t n = 256 << 10;
  uint8_t *src = pattern(n, 9);
  int64_t sizes[1] = {(int64_t)n};
  tport_request *r[N];
  tport_err err;
  for (int i = 0; i < N; i++)
    cr_assert_eq(tport_put_async(c, TPORT_UINT8, 1, sizes, NULL, src, n, NULL, NULL, NULL, NULL,
                                 &r[i], &err),
                 TPORT_OK);
  bool seen[N] = {false};
  tport_request *left[N];
  memcpy(left, r, sizeof left);
  for (int k = 0; k < N; k++) {
    size_t at;
    cr_assert_eq(tport_wait_any(left, N, WAIT_MS, &at, &err), TPORT_OK, "%s", err.msg);
    cr_assert_lt(at, N);
    cr_assert(!seen[at]);
    seen[at] = true;
    left[at] = NULL; /* skipped from now on */
  }
  size_t at = 0;
  cr_assert_eq(tport_wait_any(left, N, 0, &at, &err), TPORT_DEADLINE_EXCEEDED);
  cr_assert_eq(at, (size_t)-1);
  for (int i = 0; i < N; i++)
    tport_request_free(r[i]);
  cr_assert_eq(listed(c), N);
  tport_close(c);
  free(src);
}

/* A put's callback issues the get of what it put, and frees its own
 * request; the get's callback says so. */
typedef struct chain {
  tport_client *c;
  tport_tensor_info info;
  uint8_t *dst;
  size_t n;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int got; /* 0: not yet; else the get's status + 1 */
} chain;

static void got(tport_request *req, int status, void *arg)
{
  chain *ch = arg;
  tport_request_free(req);
  pthread_mutex_lock(&ch->mu);
  ch->got = status + 1;
  pthread_cond_broadcast(&ch->cv);
  pthread_mutex_unlock(&ch->mu);
}

static void put_done(tport_request *req, int status, void *arg)
{
  chain *ch = arg;
  tport_request *get;
  cr_assert_eq(status, TPORT_OK);
  cr_assert_not(tport_test(req), "complete only once its callback has returned");
  tport_request_free(req);
  cr_assert_eq(tport_get_async(ch->c, &ch->info.ref, ch->dst, ch->n, NULL, got, ch, &get, NULL),
               TPORT_OK);
}

Test(async, callback_issues_the_next_request)
{
  chain ch = {.c = connect_plain(), .n = 3 << 20};
  pthread_mutex_init(&ch.mu, NULL);
  pthread_cond_init(&ch.cv, NULL);
  uint8_t *src = pattern(ch.n, 11);
  ch.dst = calloc(1, ch.n);
  int64_t sizes[1] = {(int64_t)ch.n};
  tport_request *put;
  tport_err err;
  cr_assert_eq(tport_put_async(ch.c, TPORT_UINT8, 1, sizes, NULL, src, ch.n, NULL, &ch.info,
                               put_done, &ch, &put, &err),
               TPORT_OK);
  pthread_mutex_lock(&ch.mu);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += WAIT_MS / 1000;
  while (!ch.got)
    cr_assert_eq(pthread_cond_timedwait(&ch.cv, &ch.mu, &until), 0, "the chain never ended");
  pthread_mutex_unlock(&ch.mu);
  cr_assert_eq(ch.got, TPORT_OK + 1);
  cr_assert_eq(memcmp(src, ch.dst, ch.n), 0);
  tport_close(ch.c);
  free(src), free(ch.dst);
}

Test(async, small_puts_queued_together_all_land)
{
  tport_client *c = connect_plain();
  enum { N = 2000 };
  static uint32_t vals[N][64];
  static tport_tensor_info infos[N];
  tport_request **r = calloc(N, sizeof *r);
  int64_t sizes[1] = {64};
  tport_err err;
  for (int i = 0; i < N; i++) {
    for (int j = 0; j < 64; j++)
      vals[i][j] = (uint32_t)(i * 64 + j);
    cr_assert_eq(tport_put_async(c, TPORT_INT32, 1, sizes, NULL, vals[i], sizeof vals[i], NULL,
                                 &infos[i], NULL, NULL, &r[i], &err),
                 TPORT_OK);
  }
  for (int i = 0; i < N; i++) {
    cr_assert_eq(tport_wait(r[i], WAIT_MS, &err), TPORT_OK, "%d: %s", i, err.msg);
    tport_request_free(r[i]);
  }
  int32_t back[64];
  for (int i = 0; i < N; i += 97) {
    cr_assert_eq(tport_get(c, &infos[i].ref, back, sizeof back, NULL, NULL, NULL, &err), TPORT_OK);
    cr_assert_eq(memcmp(back, vals[i], sizeof back), 0, "tensor %d", i);
  }
  cr_assert_eq(listed(c), N);
  tport_close(c);
  free(r);
}

Test(async, to_and_copy)
{
  tport_client *c = connect_plain();
  float v[6] = {1, 2, 3, 4, 5, 6};
  int64_t sizes[2] = {2, 3};
  tport_tensor_info a, b;
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_FLOAT32, 2, sizes, NULL, v, sizeof v, NULL, &a, &err), TPORT_OK);
  tport_to_options to = {.device = "sim:0", .has_dtype = true, .dtype = TPORT_FLOAT64};
  bool alias = true;
  tport_request *r;
  cr_assert_eq(tport_to_async(c, &a.ref, &to, &b, &alias, NULL, NULL, &r, &err), TPORT_OK);
  cr_assert_eq(tport_wait(r, WAIT_MS, &err), TPORT_OK, "%s", err.msg);
  tport_request_free(r);
  cr_assert_eq(b.dtype, TPORT_FLOAT64);
  cr_assert_not(alias);
  float zero[6] = {0};
  tport_tensor_info z;
  cr_assert_eq(tport_put(c, TPORT_FLOAT32, 2, sizes, NULL, zero, sizeof zero, NULL, &z, &err),
               TPORT_OK);
  cr_assert_eq(tport_copy_async(c, &z.ref, &b.ref, false, NULL, NULL, &r, &err), TPORT_OK);
  cr_assert_eq(tport_wait(r, WAIT_MS, &err), TPORT_OK, "%s", err.msg);
  tport_request_free(r);
  float back[6];
  cr_assert_eq(tport_get(c, &z.ref, back, sizeof back, NULL, NULL, NULL, &err), TPORT_OK);
  cr_assert_eq(memcmp(back, v, sizeof v), 0);
  tport_close(c);
}

static atomic_int callbacks;

static void count(tport_request *req, int status, void *arg)
{
  atomic_fetch_add(&callbacks, 1);
}

Test(async, close_with_requests_in_flight)
{
  tport_client *c = connect_plain();
  enum { N = 40 };
  size_t n = 2 << 20;
  uint8_t *src = pattern(n, 1);
  int64_t sizes[1] = {(int64_t)n};
  tport_request *r[N];
  tport_err err;
  atomic_store(&callbacks, 0);
  for (int i = 0; i < N; i++)
    cr_assert_eq(tport_put_async(c, TPORT_UINT8, 1, sizes, NULL, src, n, NULL, NULL, count, NULL,
                                 &r[i], &err),
                 TPORT_OK);
  tport_close(c); /* every request completes before it returns */
  cr_assert_eq(atomic_load(&callbacks), N);
  int failed = 0;
  for (int i = 0; i < N; i++) {
    cr_assert(tport_test(r[i]));
    int rc = tport_wait(r[i], 0, &err);
    cr_assert(rc == TPORT_OK || rc == TPORT_CANCELLED || rc == TPORT_UNAVAILABLE, "%d: %d %s", i,
              rc, err.msg);
    failed += rc != TPORT_OK;
    tport_request_free(r[i]);
  }
  cr_assert_gt(failed, 0, "close cancels what has not run");
  free(src);
}

/* The callback reads the request's own error: the message the blocking
 * call gives, not only the status. */
static void note_error(tport_request *req, int status, void *arg)
{
  tport_err *seen = arg;
  const tport_err *e = tport_request_error(req);
  cr_assert_not_null(e, "the error is readable inside the callback");
  cr_assert_eq(e->code, status);
  *seen = *e;
}

Test(async, a_failed_request_tells_its_error_to_its_callback)
{
  tport_client *c = connect_plain();
  tport_ref r = {0};
  snprintf(r.name, sizeof r.name, "no-such-tensor-here");
  tport_tensor_info info;
  tport_err seen = {0}, err;
  tport_request *req;
  cr_assert_eq(tport_info_async(c, &r, 0, &info, note_error, &seen, &req, &err), TPORT_OK, "%s",
               err.msg);
  cr_assert_eq(tport_wait(req, WAIT_MS, &err), TPORT_NOT_FOUND, "%s", err.msg);
  cr_assert_eq(seen.code, TPORT_NOT_FOUND);
  cr_assert(strstr(seen.msg, "no-such-tensor-here"), "the message names the tensor: %s",
            seen.msg);
  cr_assert_str_eq(tport_request_error(req)->msg, err.msg, "the same after the wait");
  tport_request_free(req);
  /* one that succeeded: TPORT_OK */
  uint8_t v = 1;
  int64_t sizes[1] = {1};
  cr_assert_eq(tport_put_async(c, TPORT_UINT8, 1, sizes, NULL, &v, 1, NULL, &info, NULL, NULL,
                               &req, &err),
               TPORT_OK);
  cr_assert_eq(tport_wait(req, WAIT_MS, &err), TPORT_OK, "%s", err.msg);
  cr_assert_eq(tport_request_error(req)->code, TPORT_OK);
  tport_request_free(req);
  tport_close(c);
}

Test(async, an_info_that_waits_for_its_name_wakes_when_it_is_put)
{
  tport_client *c = connect_plain(), *producer = connect_plain();
  tport_ref r = {0};
  snprintf(r.name, sizeof r.name, "published-later");
  tport_tensor_info info, made;
  tport_err err;
  tport_request *req;
  cr_assert_eq(tport_info_async(c, &r, WAIT_MS, &info, NULL, NULL, &req, &err), TPORT_OK);
  /* nothing holds the name: the request waits on the server */
  cr_assert_eq(tport_wait(req, 50, &err), TPORT_DEADLINE_EXCEEDED);
  cr_assert_not(tport_test(req));
  cr_assert_null(tport_request_error(req), "no error before it has finished");
  int32_t v[6] = {1, 2, 3, 4, 5, 6};
  int64_t sizes[2] = {2, 3};
  tport_put_options o;
  tport_put_options_init(&o);
  o.name = "published-later";
  cr_assert_eq(tport_put(producer, TPORT_INT32, 2, sizes, NULL, v, sizeof v, &o, &made, &err),
               TPORT_OK, "%s", err.msg);
  cr_assert_eq(tport_wait(req, WAIT_MS, &err), TPORT_OK, "%s", err.msg);
  cr_assert_eq(memcmp(info.ref.handle, made.ref.handle, TPORT_HANDLE_BYTES), 0);
  cr_assert_eq(info.dtype, TPORT_INT32);
  cr_assert_eq(info.ndim, 2);
  cr_assert_eq(info.sizes[1], 3);
  tport_request_free(req);
  /* and one that is never put times out on the server */
  snprintf(r.name, sizeof r.name, "never-published");
  cr_assert_eq(tport_info_async(c, &r, 100, &info, NULL, NULL, &req, &err), TPORT_OK);
  cr_assert_eq(tport_wait(req, WAIT_MS, &err), TPORT_DEADLINE_EXCEEDED, "%s", err.msg);
  cr_assert(tport_test(req), "it completed: the server's wait ran out");
  tport_request_free(req);
  cr_assert_eq(tport_info_async(c, &r, 0, NULL, NULL, NULL, &req, &err), TPORT_INVALID_ARGUMENT);
  tport_close(producer);
  tport_close(c);
}

/* Waits for names are more than the pool's threads (4) and the window's
 * credits (8): the puts that publish the names, on the same client, must
 * still run (before, they queued behind the waits until those timed out). */
Test(async, waits_for_names_never_hold_up_the_puts_that_answer_them)
{
  tport_client *c = connect_plain();
  enum { N = 12 };
  tport_request *waits[N], *puts[N];
  tport_tensor_info got[N], made[N];
  tport_put_options o[N];
  char names[N][32];
  int32_t v[N];
  int64_t one = 1;
  tport_err err;
  for (int i = 0; i < N; i++) {
    tport_ref r = {0};
    snprintf(names[i], sizeof names[i], "wait-%d", i);
    snprintf(r.name, sizeof r.name, "wait-%d", i);
    cr_assert_eq(tport_info_async(c, &r, 20000, &got[i], NULL, NULL, &waits[i], &err), TPORT_OK,
                 "%s", err.msg);
  }
  for (int i = 0; i < N; i++) {
    tport_put_options_init(&o[i]);
    o[i].name = names[i];
    v[i] = i;
    cr_assert_eq(tport_put_async(c, TPORT_INT32, 1, &one, NULL, &v[i], sizeof v[i], &o[i],
                                 &made[i], NULL, NULL, &puts[i], &err),
                 TPORT_OK, "%s", err.msg);
  }
  for (int i = 0; i < N; i++) {
    cr_assert_eq(tport_wait(puts[i], 15000, &err), TPORT_OK, "put %d: %s", i, err.msg);
    cr_assert_eq(tport_wait(waits[i], 15000, &err), TPORT_OK, "wait %d: %s", i, err.msg);
    cr_assert_eq(memcmp(got[i].ref.handle, made[i].ref.handle, TPORT_HANDLE_BYTES), 0);
    tport_request_free(puts[i]);
    tport_request_free(waits[i]);
  }
  tport_close(c);
}

Test(async, a_cancelled_wait_for_a_name_ends_at_once)
{
  tport_client *c = connect_plain();
  tport_ref r = {0};
  snprintf(r.name, sizeof r.name, "nobody-puts-this");
  tport_tensor_info info;
  tport_err err;
  tport_request *req;
  cr_assert_eq(tport_info_async(c, &r, 25000, &info, NULL, NULL, &req, &err), TPORT_OK);
  cr_assert_eq(tport_wait(req, 100, &err), TPORT_DEADLINE_EXCEEDED, "it waits on the server");
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  tport_cancel(req);
  cr_assert_eq(tport_wait(req, 10000, &err), TPORT_CANCELLED, "%s", err.msg);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  cr_assert_lt(t1.tv_sec - t0.tv_sec, 10, "the cancel did not wait for the server's answer");
  tport_request_free(req);
  /* the client goes on */
  uint8_t b = 7;
  int64_t one = 1;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &one, NULL, &b, 1, NULL, &info, &err), TPORT_OK, "%s",
               err.msg);
  tport_close(c);
}
