/*
 * test_admission.c: who gets a context, a worker and a connection.  The
 * hostile-client review's second round, findings 1 (connections that never
 * read, unproved connections), 6 (fairness between tenants) and 7 (the
 * reaper of unproved connections, --max-connections).
 *
 * The fair queue and the registry's admission are tested as units; the rest
 * against an in-process server.  Where a worker must be held busy to make a
 * queue, a test holds it in server_test_before_handle (no timing decides a
 * result); every wait is bounded, and no assertion is about speed.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fairq.h"
#include "hold_util.h"
#include "hostile_util.h"
#include "registry.h"
#include "server_internal.h"

TestSuite(admission, .timeout = 120);

/* ================================================================ units */

typedef struct item {
  fq_node n;
  char tenant;
  int seq;
} item;

static item *pop(fair_queue *q, bool any)
{
  fq_node *n = fq_pop(q, any);
  return n ? (item *)((char *)n - offsetof(item, n)) : NULL;
}

Test(admission, the_fair_queue_goes_round_the_tenants_and_keeps_to_the_cap)
{
  fair_queue *q = fq_new(2);
  cr_assert_not_null(q);
  item a[5], b[2], c[1];
  for (int i = 0; i < 5; i++) {
    a[i] = (item){.tenant = 'a', .seq = i};
    fq_push(q, "a", &a[i].n);
  }
  for (int i = 0; i < 2; i++) {
    b[i] = (item){.tenant = 'b', .seq = i};
    fq_push(q, "b", &b[i].n);
  }
  c[0] = (item){.tenant = 'c', .seq = 0};
  fq_push(q, "", &c[0].n); /* the unproved connections' queue is a tenant too */
  cr_assert_eq(fq_queued(q), 8);
  cr_assert_eq(fq_tenants(q), 3);
  /* one each in turn, each tenant's in its order: a tenant that queued
   * five first does not go five times first */
  const char *want = "abcab";
  item *got[5];
  for (int i = 0; i < 5; i++) {
    got[i] = pop(q, false);
    cr_assert_not_null(got[i], "pop %d", i);
    cr_assert_eq(got[i]->tenant, want[i], "pop %d: tenant %c, wanted %c", i, got[i]->tenant,
                 want[i]);
  }
  cr_assert_eq(got[0]->seq, 0);
  cr_assert_eq(got[3]->seq, 1);
  /* a has 2 running: its cap; b and c have nothing left */
  cr_assert_null(pop(q, false), "a third of a's at once");
  fq_done(q, &got[0]->n);
  item *next = pop(q, false);
  cr_assert(next && next->tenant == 'a' && next->seq == 2);
  cr_assert_null(pop(q, false));
  /* stopping: the cap no longer holds */
  item *any = pop(q, true);
  cr_assert(any && any->tenant == 'a' && any->seq == 3);
  fq_done(q, &got[1]->n);
  fq_done(q, &got[4]->n); /* b's last: b is forgotten */
  fq_done(q, &got[2]->n); /* and c */
  cr_assert_eq(fq_tenants(q), 1);
  fq_done(q, &got[3]->n);
  fq_done(q, &next->n);
  fq_done(q, &any->n);
  item *last = pop(q, false);
  cr_assert(last && last->seq == 4);
  fq_done(q, &last->n);
  cr_assert_eq(fq_queued(q), 0);
  cr_assert_eq(fq_tenants(q), 0);
  fq_free(q);
}

Test(admission, before_its_proof_a_connection_has_one_small_request_at_a_time)
{
  registry r;
  reg_limits lim = {.max_tensor_bytes = 1 << 20,
                    .tenant_quota_bytes = 1 << 20,
                    .max_tensors = 16,
                    .max_inflight_chunks = 4,
                    .max_outstanding = 4,
                    .max_transfers = 4};
  reg_init(&r, &lim);
  cr_assert(reg_session_open(&r, 7, 0));
  char tn[REG_TENANT_MAX];
  cr_assert_eq(reg_request_enter(&r, 7, 200, true, tn, sizeof tn), REG_ADMIT_OK);
  cr_assert_str_eq(tn, "", "queued apart from every tenant before the proof");
  cr_assert_eq(reg_request_enter(&r, 7, 200, true, tn, sizeof tn), REG_ADMIT_OK,
               "the margin for a send's late completion");
  cr_assert_eq(reg_request_enter(&r, 7, 200, true, tn, sizeof tn), REG_ADMIT_UNPROVED_TOO_MANY);
  for (int i = 0; i < 3; i++)
    reg_request_leave(&r, 7);
  cr_assert_eq(reg_request_enter(&r, 7, REG_UNPROVED_REQUEST_MAX + 1, true, tn, sizeof tn),
               REG_ADMIT_UNPROVED_TOO_LARGE);
  reg_request_leave(&r, 7);
  /* without authentication, or once proved: the usual limit */
  cr_assert_eq(reg_request_enter(&r, 7, 1 << 20, false, tn, sizeof tn), REG_ADMIT_OK);
  reg_request_leave(&r, 7);
  tport_err e;
  cr_assert_eq(reg_session_authenticate(&r, 7, "alice", &e), 0, "%s", e.msg);
  for (int i = 0; i < 8; i++)
    cr_assert_eq(reg_request_enter(&r, 7, 1 << 20, true, tn, sizeof tn), REG_ADMIT_OK, "%d", i);
  cr_assert_str_eq(tn, "alice");
  cr_assert_eq(reg_request_enter(&r, 7, 100, true, tn, sizeof tn), REG_ADMIT_TOO_MANY);
  cr_assert_eq(reg_request_enter(&r, 99, 100, true, tn, sizeof tn), REG_ADMIT_GONE);
  reg_destroy(&r);
}

Test(admission, sessions_past_the_maximum_are_refused)
{
  registry r;
  reg_limits lim = {.max_outstanding = 4};
  reg_init(&r, &lim);
  cr_assert(reg_session_open(&r, 1, 2));
  cr_assert(reg_session_open(&r, 2, 2));
  cr_assert_not(reg_session_open(&r, 3, 2));
  reg_session_close(&r, 1);
  cr_assert(reg_session_open(&r, 3, 2));
  cr_assert(reg_session_open(&r, 4, 0), "0: no limit");
  reg_destroy(&r);
}

/* ================================================================ holding workers */

/* (hold_util.h holds requests of one method in their workers.) */

typedef struct lister {
  const char *url, *tenant;
  int calls;
  atomic_int done, failed;
} lister;

/* A tenant's client that asks List `calls` times, one after the other. */
static void *list_loop(void *arg)
{
  lister *l = arg;
  tport_client *c;
  tport_err err;
  tport_connect_options o = {.tenant = l->tenant, .timeout_ms = 30000};
  if (tport_connect(l->url, &o, &c, &err)) {
    atomic_store(&l->failed, 1);
    return NULL;
  }
  for (int i = 0; i < l->calls; i++) {
    tport_tensor_info *out = NULL;
    size_t n = 0;
    if (tport_list(c, &out, &n, &err))
      atomic_store(&l->failed, 1);
    free(out);
    atomic_fetch_add(&l->done, 1);
  }
  tport_close(c);
  return NULL;
}

/* Finding 6: one tenant's queue does not stand in front of another's.
 * Tenant hog has 8 Lists in flight on 8 connections and each List is held
 * in its worker; with 2 workers and the default --tenant-workers (1), hog
 * holds one worker and its other 7 wait, while tenant small's Devices is
 * served by the other worker.  With one queue for all, hog's Lists took
 * both workers and small's Devices waited behind the other six for as long
 * as they were held. */
Test(admission, another_tenants_queue_does_not_stand_in_front)
{
  server_config cfg;
  config(&cfg);
  cfg.workers = 2;
  char url[128];
  server *s = start(&cfg, url, sizeof url);
  hold(TPORT__METHOD__METHOD_LIST);
  lister l[8];
  pthread_t th[8];
  for (int i = 0; i < 8; i++) {
    l[i] = (lister){.url = url, .tenant = "hog", .calls = 1};
    pthread_create(&th[i], NULL, list_loop, &l[i]);
  }
  wait_held(1);
  /* the other 7 Lists arrive and queue (the operator's Stats is served by
   * the other worker: with one queue for all, hog's Lists held it too) */
  int64_t queued = 0;
  for (int64_t end = now_ms() + 10000; queued < 7 && now_ms() < end;)
    if ((queued = op_counter(url, "requests_queued")) < 7)
      usleep(20 * 1000);
  cr_assert_eq(queued, 7, "tenant hog's Lists queued");
  tport_client *small = connect_as(url, "small", 5000);
  tport_device_info *d = NULL;
  size_t nd = 0;
  tport_err err;
  char why[256];
  int rc = tport_devices(small, &d, &nd, why, sizeof why, &err);
  int held = held_now();
  release();
  cr_assert_eq(rc, 0, "tenant small's Devices beside tenant hog's queue: %s", err.msg);
  cr_assert_eq(held, 1, "tenant hog had %d requests in the 2 workers: its cap is 1", held);
  free(d);
  for (int i = 0; i < 8; i++) {
    pthread_join(th[i], NULL);
    cr_assert_eq(atomic_load(&l[i].failed), 0, "hog's List %d failed", i);
  }
  tport_close(small);
  server_test_before_handle = NULL;
  server_stop(s, 2000);
}

/* Finding 1: request bodies held server-wide are bounded by
 * --request-memory.  With the one worker held, PutBegins of 100 KiB pile
 * up in the queue; the one that would take the bodies held past 256 KiB is
 * answered RESOURCE_EXHAUSTED at once, while the worker is still held. */
Test(admission, request_bodies_past_request_memory_are_answered_at_once)
{
  server_config cfg;
  config(&cfg);
  cfg.workers = 1;
  cfg.chunk_bytes = 64 << 10;
  cfg.max_message_bytes = 128 << 10;
  cfg.request_memory = 256 << 10;
  char url[128];
  server *s = start(&cfg, url, sizeof url);
  rawc r;
  raw_open(&r, url);
  char msg[256];
  cr_assert_eq(raw_hello(&r, "writer", msg), 0, "%s", msg);
  hold(TPORT__METHOD__METHOD_LIST);
  lister l = {.url = url, .tenant = "hog", .calls = 1};
  pthread_t th;
  pthread_create(&th, NULL, list_loop, &l);
  wait_held(1);
  static uint8_t body[100 << 10];
  Tport__TensorDesc d = TPORT__TENSOR_DESC__INIT;
  int64_t sz[1] = {sizeof body};
  d.dtype = TPORT__DTYPE__DTYPE_UINT8;
  d.n_sizes = 1;
  d.sizes = sz;
  Tport__PutBeginRequest q = TPORT__PUT_BEGIN_REQUEST__INIT;
  q.desc = &d;
  q.memory_format = TPORT__MEMORY_FORMAT__MF_PRESERVE;
  q.device = "cpu";
  q.commit = true; /* the whole tensor in the request */
  /* the third sent a while after the first two: requests are counted as
   * nng's threads take them, and two taken at once may be counted in
   * either order (the test once waited for the third's answer while the
   * second was the one refused, on a loaded machine) */
  for (int i = 0; i < 3; i++) {
    if (i == 2)
      usleep(300 * 1000);
    raw_send(&r, i, TPORT__METHOD__METHOD_PUT_BEGIN, &q.base, body, sizeof body);
  }
  /* two are held (200 KiB); the third, past 256 KiB, is answered now */
  int code = raw_wait(&r, 2, &tport__error_reply__descriptor, msg, NULL, NULL);
  int held = held_now();
  cr_assert_eq(held, 1, "the worker was let go before the answer");
  cr_assert_eq(code, TPORT_RESOURCE_EXHAUSTED, "the third PutBegin: %d %s", code, msg);
  cr_assert(strstr(msg, "--request-memory"), "%s", msg);
  release();
  for (int i = 0; i < 2; i++) {
    int c2 = raw_wait(&r, i, &tport__put_begin_reply__descriptor, msg, NULL, NULL);
    cr_assert_eq(c2, 0, "PutBegin %d once the worker is free: %s", i, msg);
  }
  pthread_join(th, NULL);
  cr_assert_eq(op_counter(url, "requests_refused"), 1);
  int64_t held_bytes = op_counter(url, "request_bytes"); /* the Stats asking, no more */
  cr_assert_lt(held_bytes, 1024, "%lld bytes of requests still held", (long long)held_bytes);
  raw_close(&r);
  server_test_before_handle = NULL;
  server_stop(s, 2000);
}

/* ================================================================ connections */

/* Finding 1: replies a connection does not read hold no context.  Two
 * connections with 4 KiB receive buffers send 8 inline gets of a 4 MiB
 * tensor each and never read; with --contexts 16 and a long send timeout,
 * every context used to wait in its send, and a new client's Hello was
 * never received.  Now each context that takes a request is replaced. */
Test(admission, replies_not_read_hold_no_context)
{
  server_config cfg;
  config(&cfg);
  cfg.contexts = 16;
  cfg.max_outstanding = 8;
  cfg.window = 8;
  cfg.send_timeout_ms = 60000;
  cfg.chunk_bytes = 4 << 20;
  char inproc[128], tcp[128];
  server *s = start_tcp(&cfg, inproc, sizeof inproc, tcp, sizeof tcp);
  tport_client *c = connect_as(tcp, NULL, REPLY_MS);
  const size_t big = 4 << 20;
  uint8_t *v = malloc(big);
  fill(v, big, 5);
  tport_put_options po;
  tport_put_options_init(&po);
  po.name = "big";
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, (int64_t[]){(int64_t)big}, NULL, v, big, &po, NULL,
                         &err),
               0, "%s", err.msg);
  int fd[2];
  Tport__Ref ref;
  Tport__GetBeginRequest q;
  sp_get_begin(&q, &ref, "big");
  for (int k = 0; k < 2; k++) {
    fd[k] = sp_connect(tcp, 4096);
    for (int i = 0; i < 8; i++)
      cr_assert(sp_send(fd[k], (uint32_t)i + 1, TPORT__METHOD__METHOD_GET_BEGIN, &q.base));
  }
  /* all 16 received and answered into the unread connections */
  int64_t end = now_ms() + 10000;
  int64_t contexts = 0;
  while (now_ms() < end && (contexts = op_counter(inproc, "contexts")) < 16 + 14)
    usleep(50 * 1000);
  cr_assert_geq(contexts, 16 + 14,
                "%lld contexts: the 16 gets' replies wait, and 16 receives are posted beside them",
                (long long)contexts);
  tport_client *late = NULL;
  tport_connect_options o = {.timeout_ms = 3000};
  int rc = tport_connect(tcp, &o, &late, &err);
  cr_assert_eq(rc, 0, "a new client beside two that do not read: %s", err.msg);
  round_trip(late, 100 << 10, 1, "beside two connections that do not read");
  tport_close(late);
  close(fd[0]);
  close(fd[1]);
  tport_close(c);
  free(v);
  server_stop(s, 2000);
}

static const char *auth_file_path(void)
{
  static char dir[64], path[128];
  snprintf(dir, sizeof dir, "/tmp/tport-admission-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/auth", dir);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fprintf(f, "alice 00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n");
  fclose(f);
  chmod(path, 0600);
  return path;
}

/* Finding 1: before it proves its tenant, a connection's request is a
 * Hello's size at most: a larger one drops the connection (it used to be
 * answered UNAUTHENTICATED, and each such connection could keep two
 * --max-message bodies in the server). */
Test(admission, an_unproved_connection_that_sends_more_than_a_hello_is_dropped)
{
  server_config cfg;
  config(&cfg);
  cfg.auth_file = strdup(auth_file_path());
  char inproc[128], tcp[128];
  server *s = start_tcp(&cfg, inproc, sizeof inproc, tcp, sizeof tcp);
  int fd = sp_connect_raw(tcp, 1 << 16);
  char name[8192];
  memset(name, 'x', sizeof name - 1);
  name[sizeof name - 1] = 0;
  Tport__Ref ref = TPORT__REF__INIT;
  ref.name = name;
  Tport__InfoRequest q = TPORT__INFO_REQUEST__INIT;
  q.ref = &ref;
  cr_assert(sp_send(fd, 1, TPORT__METHOD__METHOD_INFO, &q.base));
  bool closed = false;
  size_t bytes = 0;
  for (int64_t end = now_ms() + 5000; !closed && now_ms() < end;) {
    closed = sp_peer_closed(fd);
    if (!closed)
      closed = sp_drain(fd, 200, &bytes);
  }
  cr_assert(closed, "an unproved connection sent %zu bytes and was answered (%zu bytes), not "
                    "dropped",
            strlen(name), bytes);
  close(fd);
  /* a small unproved request is answered as before */
  fd = sp_connect_raw(tcp, 1 << 16);
  ref.name = "t";
  cr_assert(sp_send(fd, 1, TPORT__METHOD__METHOD_INFO, &q.base));
  uint8_t buf[64];
  cr_assert_gt(recv(fd, buf, sizeof buf, 0), 0, "no answer to a small unproved request");
  close(fd);
  tport_connect_options o = {.tenant = "alice",
                             .secret = "00112233445566778899aabbccddeeff00112233445566778899aabb"
                                       "ccddeeff",
                             .timeout_ms = REPLY_MS};
  tport_client *c;
  tport_err err;
  cr_assert_eq(tport_connect(inproc, &o, &c, &err), 0, "%s", err.msg);
  round_trip(c, 1000, 2, "after the unproved connection");
  tport_close(c);
  server_stop(s, 2000);
}

/* Finding 7: connections are counted and bounded. */
Test(admission, connections_past_max_connections_are_refused)
{
  server_config cfg;
  config(&cfg);
  cfg.max_connections = 3;
  char url[128];
  server *s = start(&cfg, url, sizeof url);
  tport_client *c[3];
  for (int i = 0; i < 3; i++)
    c[i] = connect_as(url, NULL, REPLY_MS);
  tport_client *extra = NULL;
  tport_err err;
  tport_connect_options o = {.timeout_ms = 1500};
  cr_assert_neq(tport_connect(url, &o, &extra, &err), 0, "a fourth connection was served");
  tport_close(c[2]);
  /* the place is free once the server has seen the close */
  int rc = -1;
  for (int64_t end = now_ms() + 10000; rc && now_ms() < end;)
    rc = tport_connect(url, &o, &extra, &err);
  cr_assert_eq(rc, 0, "no place after a close: %s", err.msg);
  int64_t refused = svc_counter(extra, "connections_refused");
  cr_assert_eq(refused, -1, "not an operator: no server-wide counters");
  tport_close(extra);
  tport_close(c[1]);
  /* again once the server has seen the closes */
  tport_client *op = NULL;
  tport_connect_options oo = {.tenant = OPERATOR, .timeout_ms = 1500};
  rc = -1;
  for (int64_t end = now_ms() + 10000; rc && now_ms() < end;)
    rc = tport_connect(url, &oo, &op, &err);
  cr_assert_eq(rc, 0, "the operator found no place: %s", err.msg);
  cr_assert_geq(svc_counter(op, "connections_refused"), 1);
  tport_close(op);
  tport_close(c[0]);
  server_stop(s, 2000);
}

/* Finding 7: with authentication on, unproved connections are closed at
 * --auth-timeout however many there are (the reaper closed 256 a second). */
Test(admission, every_unproved_connection_is_closed_at_the_auth_timeout)
{
  struct rlimit rl;
  cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
  int n = 1200;
  if (rl.rlim_cur < (rlim_t)(2 * n + 200)) {
    rl.rlim_cur = rl.rlim_max < (rlim_t)(2 * n + 200) ? rl.rlim_max : (rlim_t)(2 * n + 200);
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (rl.rlim_cur < (rlim_t)(2 * n + 200))
    n = (int)(rl.rlim_cur - 200) / 2;
  cr_assert_geq(n, 600, "the open-file limit (%llu) is too low for this test",
                (unsigned long long)rl.rlim_cur);
  server_config cfg;
  config(&cfg);
  cfg.auth_file = strdup(auth_file_path());
  cfg.auth_timeout_ms = 1000;
  char inproc[128], tcp[128];
  server *s = start_tcp(&cfg, inproc, sizeof inproc, tcp, sizeof tcp);
  int *fd = calloc((size_t)n, sizeof *fd);
  for (int i = 0; i < n; i++)
    fd[i] = sp_connect_raw(tcp, 4096);
  int64_t last = now_ms();
  /* all of them opened by `last`: the reaper's next pass after last + 1 s
   * closes them (one pass a second), so by last + 3.5 s every one is
   * closed; 256 a second needed 5 passes */
  usleep(3500 * 1000);
  int open = 0;
  for (int i = 0; i < n; i++) {
    if (!sp_peer_closed(fd[i])) {
      size_t b;
      if (!sp_drain(fd[i], 1, &b))
        open++;
    }
    close(fd[i]);
  }
  cr_assert_eq(open, 0, "%d of %d unproved connections still open %lld ms after the last opened "
                        "(--auth-timeout 1000)",
               open, n, (long long)(now_ms() - last));
  free(fd);
  server_stop(s, 2000);
}
