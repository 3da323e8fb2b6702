/* test_wait.c: waiting for a name (Info and GetBegin with wait_ms), atomic
 * replace (PutBegin.replace) and batched frees (FreeRequest.refs), through
 * libtport against a server in this process. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hostile_util.h"
#include "service_util.h"

static server *srv;
static char url[256];

static void suite_start(void)
{
  srv = svc_start_inproc(url, sizeof url, NULL);
}

static void suite_stop(void)
{
  if (srv)
    server_stop(srv, 2000);
  srv = NULL;
}

/* The operator's count of requests parked for a name, awaited (each step
 * a Stats request: the test never sleeps on a guess). */
static void waiting_until(int64_t want)
{
  tport_client *op = svc_connect(url, SVC_OPERATOR);
  int64_t n = -1;
  for (int i = 0; i < 20000 && (n = svc_counter(op, "waiting_for_names")) != want; i++)
    usleep(1000);
  tport_close(op);
  cr_assert_eq(n, want, "requests waiting: %lld, expected %lld", (long long)n, (long long)want);
}

static void put_named(tport_client *c, const char *name, float value, int64_t n, bool replace)
{
  float *v = malloc((size_t)n * sizeof *v);
  for (int64_t i = 0; i < n; i++)
    v[i] = value;
  tport_put_options o;
  tport_put_options_init(&o);
  o.name = name;
  o.replace = replace;
  tport_tensor_info info;
  tport_err err;
  int rc = tport_put(c, TPORT_FLOAT32, 1, &n, NULL, v, (size_t)n * sizeof *v, &o, &info, &err);
  cr_assert_eq(rc, 0, "put %s: %s", name, err.msg);
  free(v);
}

/* A wait on its own thread and connection. */
typedef struct waiter {
  const char *tenant, *name;
  uint32_t wait_ms;
  bool get; /* tport_get_alloc_wait, else tport_info_wait */
  tport_client *c;
  int rc;
  tport_err err;
  tport_tensor_info info;
  float first; /* a get's first value */
  pthread_t th;
} waiter;

static void *wait_main(void *arg)
{
  waiter *w = arg;
  tport_ref ref;
  tport_ref_name(&ref, w->name);
  if (w->get) {
    void *buf = NULL;
    size_t n = 0;
    w->rc = tport_get_alloc_wait(w->c, &ref, w->wait_ms, &buf, &n, &w->info, &w->err);
    if (!w->rc && n >= sizeof(float))
      memcpy(&w->first, buf, sizeof(float));
    free(buf);
  } else {
    w->rc = tport_info_wait(w->c, &ref, w->wait_ms, &w->info, &w->err);
  }
  return NULL;
}

static void wait_start(waiter *w)
{
  if (!w->c)
    w->c = svc_connect(url, w->tenant);
  cr_assert_eq(pthread_create(&w->th, NULL, wait_main, w), 0);
}

static void wait_join(waiter *w)
{
  pthread_join(w->th, NULL);
}

TestSuite(wait, .init = suite_start, .fini = suite_stop, .timeout = 60);

Test(wait, a_name_that_exists_answers_at_once_and_none_times_out)
{
  tport_client *c = svc_connect(url, NULL);
  put_named(c, "here", 1.0f, 8, false);
  tport_ref ref;
  tport_tensor_info info;
  tport_err err;
  tport_ref_name(&ref, "here");
  cr_assert_eq(tport_info_wait(c, &ref, 20000, &info, &err), 0, "%s", err.msg);
  cr_assert_eq(info.sizes[0], 8);
  tport_ref_name(&ref, "never");
  cr_assert_eq(tport_info_wait(c, &ref, 200, &info, &err), TPORT_DEADLINE_EXCEEDED, "%s", err.msg);
  cr_assert(strstr(err.msg, "never"), "%s", err.msg);
  /* without a wait it is NOT_FOUND, as ever */
  cr_assert_eq(tport_info_wait(c, &ref, 0, &info, &err), TPORT_NOT_FOUND, "%s", err.msg);
  void *buf = NULL;
  size_t n;
  cr_assert_eq(tport_get_alloc_wait(c, &ref, 150, &buf, &n, NULL, &err), TPORT_DEADLINE_EXCEEDED,
               "%s", err.msg);
  /* the connection serves on */
  waiting_until(0);
  tport_ref_name(&ref, "here");
  cr_assert_eq(tport_info(c, &ref, &info, &err), 0, "%s", err.msg);
  tport_close(c);
}

Test(wait, another_clients_put_wakes_info_and_get_waits)
{
  waiter wi = {.tenant = "t", .name = "batch", .wait_ms = 30000};
  waiter wg = {.tenant = "t", .name = "batch", .wait_ms = 30000, .get = true};
  wait_start(&wi);
  wait_start(&wg);
  waiting_until(2);
  tport_client *producer = svc_connect(url, "t");
  put_named(producer, "batch", 7.0f, 100000, false); /* many chunks: an upload, then its commit */
  wait_join(&wi);
  wait_join(&wg);
  cr_assert_eq(wi.rc, 0, "%s", wi.err.msg);
  cr_assert_eq(wi.info.sizes[0], 100000);
  cr_assert_eq(wg.rc, 0, "%s", wg.err.msg);
  cr_assert_eq(wg.first, 7.0f);
  waiting_until(0);
  tport_close(wi.c);
  tport_close(wg.c);
  tport_close(producer);
}

Test(wait, a_wait_never_wakes_on_another_tenants_name)
{
  waiter w = {.tenant = "b", .name = "secret", .wait_ms = 600};
  wait_start(&w);
  waiting_until(1);
  tport_client *a = svc_connect(url, "a");
  put_named(a, "secret", 1.0f, 4, false);
  wait_join(&w);
  cr_assert_eq(w.rc, TPORT_DEADLINE_EXCEEDED, "tenant b saw tenant a's name: %d %s", w.rc,
               w.err.msg);
  /* and b's own put of that name is its own */
  put_named(w.c, "secret", 2.0f, 4, false);
  tport_close(w.c);
  tport_close(a);
}

Test(wait, a_connections_waits_are_bounded)
{
  enum { N = 16 };
  tport_client *c = svc_connect(url, "many");
  waiter w[N];
  char names[N][16];
  for (int i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "n%d", i);
    w[i] = (waiter){.name = names[i], .wait_ms = 30000, .c = c};
    wait_start(&w[i]);
  }
  waiting_until(N);
  tport_ref ref;
  tport_tensor_info info;
  tport_err err;
  tport_ref_name(&ref, "one-too-many");
  cr_assert_eq(tport_info_wait(c, &ref, 30000, &info, &err), TPORT_RESOURCE_EXHAUSTED, "%s",
               err.msg);
  /* another connection of the tenant may still wait, and everything else
   * on this one is served meanwhile */
  waiter other = {.tenant = "many", .name = "n0", .wait_ms = 30000};
  wait_start(&other);
  waiting_until(N + 1);
  put_named(c, "plain", 1.0f, 4, false);
  for (int i = 0; i < N; i++)
    put_named(c, names[i], (float)i, 4, false);
  for (int i = 0; i < N; i++) {
    wait_join(&w[i]);
    cr_assert_eq(w[i].rc, 0, "%s: %s", names[i], w[i].err.msg);
  }
  wait_join(&other);
  cr_assert_eq(other.rc, 0, "%s", other.err.msg);
  tport_close(other.c);
  tport_close(c);
}

Test(wait, a_waiter_whose_connection_closes_is_released)
{
  rawc r;
  raw_open(&r, url);
  char msg[256];
  cr_assert_eq(raw_hello(&r, "gone", msg), 0, "%s", msg);
  Tport__Ref ref = mkref(NULL, 0, "later");
  Tport__InfoRequest q = TPORT__INFO_REQUEST__INIT;
  q.ref = &ref;
  q.wait_ms = 30000;
  raw_send(&r, 0, TPORT__METHOD__METHOD_INFO, &q.base, NULL, 0);
  raw_sent(&r, 0);
  waiting_until(1);
  raw_close(&r); /* the wait goes with its connection, long before its time */
  waiting_until(0);
  /* and a name published now wakes no one (nothing left to wake) */
  tport_client *c = svc_connect(url, "gone");
  put_named(c, "later", 1.0f, 4, false);
  tport_close(c);
}

Test(wait, server_stop_answers_parked_waits_within_its_grace)
{
  waiter w[3] = {{.tenant = "s", .name = "x", .wait_ms = 30000},
                 {.tenant = "s", .name = "y", .wait_ms = 30000, .get = true},
                 {.tenant = "z", .name = "x", .wait_ms = 30000}};
  for (int i = 0; i < 3; i++)
    wait_start(&w[i]);
  waiting_until(3);
  /* a grace far longer than the test's timeout: the stop must not wait
   * for the waits' 30 s */
  server_stop(srv, 120000);
  srv = NULL;
  for (int i = 0; i < 3; i++) {
    wait_join(&w[i]);
    cr_assert_eq(w[i].rc, TPORT_UNAVAILABLE, "%d %s", w[i].rc, w[i].err.msg);
    tport_close(w[i].c);
  }
}
