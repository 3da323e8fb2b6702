/* test_limits.c: each limit of tportd gives its code and changes nothing
 * else: the tenant quota, the time to live, chunks in flight per connection,
 * the request deadline. */
#include <criterion/criterion.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "engine.h"
#include "frame.h"
#include "service_util.h"

Test(limits, tenant_quota)
{
  char url[128];
  server_config cfg;
  svc_config(&cfg);
  cfg.tenant_quota_bytes = 1 << 20;
  server *s = svc_start_with(&cfg, url, sizeof url);
  tport_client *c = svc_connect(url, "q");
  uint8_t *v = malloc(600 << 10);
  memset(v, 5, 600 << 10);
  int64_t n = 600 << 10;
  tport_tensor_info a;
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &n, NULL, v, (size_t)n, NULL, &a, &err), 0);
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &n, NULL, v, (size_t)n, NULL, NULL, &err),
               TPORT_RESOURCE_EXHAUSTED);
  cr_assert(strstr(err.msg, "quota"), "%s", err.msg);
  /* a put whose conversion would pass the quota is refused at its beginning */
  tport_client *fresh = svc_connect(url, "q2");
  tport_put_options po;
  tport_put_options_init(&po);
  po.has_dtype = true;
  po.dtype = TPORT_FLOAT64;
  int64_t small = 200 << 10;
  cr_assert_eq(tport_put(fresh, TPORT_UINT8, 1, &small, NULL, v, (size_t)small, &po, NULL, &err),
               TPORT_RESOURCE_EXHAUSTED, "200 KiB as float64 is 1.6 MiB: %s", err.msg);
  tport_close(fresh);
  /* a conversion that would pass the quota is refused too */
  tport_to_options o = {.has_dtype = true, .dtype = TPORT_INT16};
  cr_assert_eq(tport_to(c, &a.ref, &o, NULL, NULL, &err), TPORT_RESOURCE_EXHAUSTED);
  /* nothing else changed: the first tensor is intact; another tenant is not limited by q's */
  uint8_t *back = malloc((size_t)n);
  cr_assert_eq(tport_get(c, &a.ref, back, (size_t)n, NULL, NULL, NULL, &err), 0);
  cr_assert(memcmp(v, back, (size_t)n) == 0);
  tport_client *other = svc_connect(url, "r");
  cr_assert_eq(tport_put(other, TPORT_UINT8, 1, &n, NULL, v, (size_t)n, NULL, NULL, &err), 0);
  cr_assert_eq(tport_free(c, &a.ref, &err), 0);
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &n, NULL, v, (size_t)n, NULL, NULL, &err), 0,
               "freed bytes count no more: %s", err.msg);
  tport_close(other);
  tport_close(c);
  free(v);
  free(back);
  server_stop(s, 1000);
}

Test(limits, time_to_live)
{
  char url[128];
  server *s = svc_start_inproc(url, sizeof url, NULL);
  tport_client *c = svc_connect(url, NULL);
  uint8_t v[8] = {1};
  tport_put_options po;
  tport_put_options_init(&po);
  po.name = "short";
  po.ttl_ms = 200;
  tport_tensor_info a;
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, (int64_t[]){8}, NULL, v, 8, &po, &a, &err), 0);
  po.name = "long";
  po.ttl_ms = 60000;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, (int64_t[]){8}, NULL, v, 8, &po, NULL, &err), 0);
  tport_ref r;
  tport_ref_name(&r, "short");
  tport_tensor_info i;
  cr_assert_eq(tport_info(c, &r, &i, &err), 0);
  int rc = TPORT_OK;
  for (int k = 0; k < 60 && (rc = tport_info(c, &r, &i, &err)) == TPORT_OK; k++)
    usleep(100000);
  cr_assert_eq(rc, TPORT_NOT_FOUND, "expired after its time to live");
  tport_ref_name(&r, "long");
  cr_assert_eq(tport_info(c, &r, &i, &err), 0, "the other one stays");
  tport_close(c);
  server_stop(s, 1000);
}

/* A raw REQ socket with three contexts, to have requests in flight at once. */
typedef struct {
  nng_socket sock;
  nng_ctx ctx[4];
  nng_aio *aio[4];
} rawc;

static void raw_open(rawc *r, const char *url)
{
  cr_assert_eq(nng_req0_open(&r->sock), 0);
  nng_socket_set_ms(r->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
  cr_assert_eq(nng_dial(r->sock, url, NULL, 0), 0);
  char msg[256];
  cr_assert_eq(svc_hello(r->sock, "default", msg), 0, "Hello: %s", msg);
  for (int i = 0; i < 4; i++) {
    nng_ctx_open(&r->ctx[i], r->sock);
    nng_aio_alloc(&r->aio[i], NULL, NULL);
    nng_aio_set_timeout(r->aio[i], 10000);
  }
}

static void raw_send(rawc *r, int i, uint16_t method, const ProtobufCMessage *q, const void *p,
                     size_t n)
{
  size_t head = frame_head_size(q);
  nng_msg *m;
  nng_msg_alloc(&m, head + n);
  frame_write_head(nng_msg_body(m), method, 0, q);
  if (n)
    memcpy((uint8_t *)nng_msg_body(m) + head, p, n);
  nng_aio_set_msg(r->aio[i], m);
  nng_ctx_send(r->ctx[i], r->aio[i]);
}

static int raw_finish(rawc *r, int i, char *msg)
{
  nng_aio_wait(r->aio[i]);
  cr_assert_eq(nng_aio_result(r->aio[i]), 0);
  nng_ctx_recv(r->ctx[i], r->aio[i]);
  nng_aio_wait(r->aio[i]);
  cr_assert_eq(nng_aio_result(r->aio[i]), 0);
  nng_msg *m = nng_aio_get_msg(r->aio[i]);
  int code = svc_reply_status(m, &tport__error_reply__descriptor, msg, NULL);
  nng_msg_free(m);
  return code;
}

static void raw_close(rawc *r)
{
  for (int i = 0; i < 4; i++)
    nng_aio_free(r->aio[i]);
  nng_close(r->sock);
}

/* Occupies the server's only worker for ~sim delay: a blocking commit of an
 * upload whose device copies are slow.  Returns with the commit sent. */
static void block_the_worker(rawc *r)
{
  Tport__TensorDesc d = TPORT__TENSOR_DESC__INIT;
  int64_t sz[] = {16};
  d.dtype = TPORT__DTYPE__DTYPE_UINT8;
  d.n_sizes = 1;
  d.sizes = sz;
  Tport__PutBeginRequest q = TPORT__PUT_BEGIN_REQUEST__INIT;
  q.desc = &d;
  q.device = "sim:0";
  q.commit = true; /* the whole tensor now, committed blocking: waits for the sim copy */
  q.memory_format = TPORT__MEMORY_FORMAT__MF_PRESERVE;
  uint8_t v[16] = {0};
  sim_set_delay_range(300000, 300000); /* each sim op sleeps 300 ms */
  raw_send(r, 0, TPORT__METHOD__METHOD_PUT_BEGIN, &q.base, v, 16);
  usleep(20000); /* the single worker has taken it */
}

Test(limits, chunks_in_flight_per_connection)
{
  char url[128];
  server_config cfg;
  svc_config(&cfg);
  cfg.workers = 1;
  cfg.max_inflight_chunks = 2;
  server *s = svc_start_with(&cfg, url, sizeof url);
  /* an upload to send chunks to */
  tport_client *c = svc_connect(url, NULL);
  rawc r;
  raw_open(&r, url);
  Tport__TensorDesc d = TPORT__TENSOR_DESC__INIT;
  int64_t sz[] = {3 << 16};
  d.dtype = TPORT__DTYPE__DTYPE_UINT8;
  d.n_sizes = 1;
  d.sizes = sz;
  Tport__PutBeginRequest b = TPORT__PUT_BEGIN_REQUEST__INIT;
  b.desc = &d;
  b.memory_format = TPORT__MEMORY_FORMAT__MF_PRESERVE;
  raw_send(&r, 1, TPORT__METHOD__METHOD_PUT_BEGIN, &b.base, NULL, 0);
  nng_aio_wait(r.aio[1]);
  nng_ctx_recv(r.ctx[1], r.aio[1]);
  nng_aio_wait(r.aio[1]);
  nng_msg *m = nng_aio_get_msg(r.aio[1]);
  ProtobufCMessage *pm;
  cr_assert_eq(svc_reply_status(m, &tport__put_begin_reply__descriptor, NULL, &pm), 0);
  uint8_t handle[16];
  memcpy(handle, ((Tport__PutBeginReply *)pm)->ref->handle.data, 16);
  protobuf_c_message_free_unpacked(pm, NULL);
  nng_msg_free(m);
  /* the worker is busy; three chunks arrive on this connection: the third is one too many */
  block_the_worker(&r);
  Tport__Ref ref = TPORT__REF__INIT;
  ref.handle.data = handle;
  ref.handle.len = 16;
  uint8_t *chunk = calloc(1 << 16, 1);
  for (int i = 1; i <= 3; i++) {
    Tport__PutChunkRequest q = TPORT__PUT_CHUNK_REQUEST__INIT;
    q.ref = &ref;
    q.offset = (uint64_t)(i - 1) << 16;
    raw_send(&r, i, TPORT__METHOD__METHOD_PUT_CHUNK, &q.base, chunk, 1 << 16);
    usleep(5000);
  }
  char msg[256];
  raw_finish(&r, 0, msg); /* the blocking commit */
  int codes[4] = {0};
  for (int i = 1; i <= 3; i++)
    codes[i] = raw_finish(&r, i, msg);
  cr_assert_eq(codes[1], 0);
  cr_assert_eq(codes[2], 0);
  cr_assert_eq(codes[3], TPORT_RESOURCE_EXHAUSTED, "the third chunk in flight");
  sim_set_delay(0);
  /* nothing else changed: that chunk can be sent again, and the upload completes */
  Tport__PutChunkRequest q = TPORT__PUT_CHUNK_REQUEST__INIT;
  q.ref = &ref;
  q.offset = 2 << 16;
  raw_send(&r, 1, TPORT__METHOD__METHOD_PUT_CHUNK, &q.base, chunk, 1 << 16);
  cr_assert_eq(raw_finish(&r, 1, msg), 0, "%s", msg);
  Tport__PutCommitRequest cq = TPORT__PUT_COMMIT_REQUEST__INIT;
  cq.ref = &ref;
  raw_send(&r, 1, TPORT__METHOD__METHOD_PUT_COMMIT, &cq.base, NULL, 0);
  cr_assert_eq(raw_finish(&r, 1, msg), 0, "%s", msg);
  free(chunk);
  raw_close(&r);
  tport_close(c);
  server_stop(s, 2000);
}

Test(limits, request_deadline)
{
  char url[128];
  server_config cfg;
  svc_config(&cfg);
  cfg.workers = 1;
  cfg.deadline_ms = 50;
  server *s = svc_start_with(&cfg, url, sizeof url);
  rawc r;
  raw_open(&r, url);
  block_the_worker(&r);
  Tport__StatsRequest q = TPORT__STATS_REQUEST__INIT;
  raw_send(&r, 1, TPORT__METHOD__METHOD_STATS, &q.base, NULL, 0);
  char msg[256];
  raw_finish(&r, 0, msg);
  cr_assert_eq(raw_finish(&r, 1, msg), TPORT_DEADLINE_EXCEEDED, "%s", msg);
  cr_assert(strstr(msg, "deadline 50 ms"), "%s", msg);
  sim_set_delay(0);
  raw_send(&r, 1, TPORT__METHOD__METHOD_STATS, &q.base, NULL, 0);
  cr_assert_eq(raw_finish(&r, 1, msg), 0, "served again once the queue is short");
  raw_close(&r);
  server_stop(s, 2000);
}

Test(limits, uvm_puts_are_managed_and_move)
{
  char url[128];
  server_config cfg;
  svc_config(&cfg);
  cfg.uvm = true;
  server *s = svc_start_with(&cfg, url, sizeof url);
  tport_client *c = svc_connect(url, NULL);
  int32_t v[64];
  for (int i = 0; i < 64; i++)
    v[i] = i;
  tport_put_options po;
  tport_put_options_init(&po);
  po.device = "sim:0";
  tport_tensor_info a, b;
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_INT32, 1, (int64_t[]){64}, NULL, v, sizeof v, &po, &a, &err), 0);
  cr_assert(a.managed, "--uvm: a put to a device is managed");
  /* to(device) of a managed tensor is a move: the same tensor, now on sim:1 */
  bool alias;
  tport_to_options o = {.device = "sim:1"};
  cr_assert_eq(tport_to(c, &a.ref, &o, &b, &alias, &err), 0, "%s", err.msg);
  cr_assert(alias);
  cr_assert_str_eq(b.device, "sim:1");
  int32_t back[64];
  cr_assert_eq(tport_get(c, &a.ref, back, sizeof back, NULL, NULL, NULL, &err), 0);
  cr_assert(memcmp(v, back, sizeof v) == 0);
  po.device = "cpu";
  cr_assert_eq(tport_put(c, TPORT_INT32, 1, (int64_t[]){64}, NULL, v, sizeof v, &po, &a, &err), 0);
  cr_assert_not(a.managed, "host tensors are not managed");
  tport_close(c);
  server_stop(s, 1000);
}

/* --max-outstanding drops a connection that has too many requests
 * unanswered; libtport keeps to the limit the server gave in Hello across
 * all the threads of one client, so a busy well-behaved client is never
 * dropped. */
typedef struct {
  tport_client *c;
  int id, failures;
} busy_thread;

static void *busy_puts(void *arg)
{
  busy_thread *b = arg;
  int64_t n = 300 << 10; /* 5 chunks of 64 KiB */
  uint8_t *v = malloc((size_t)n), *back = malloc((size_t)n);
  for (int round = 0; round < 4; round++) {
    memset(v, b->id * 16 + round, (size_t)n);
    tport_tensor_info t;
    tport_err err;
    if (tport_put(b->c, TPORT_UINT8, 1, &n, NULL, v, (size_t)n, NULL, &t, &err) ||
        tport_get(b->c, &t.ref, back, (size_t)n, NULL, NULL, NULL, &err) ||
        memcmp(v, back, (size_t)n) != 0 || tport_free(b->c, &t.ref, &err))
      b->failures++;
  }
  free(v);
  free(back);
  return NULL;
}

Test(limits, many_threads_on_one_client_stay_within_max_outstanding)
{
  char url[128];
  server_config cfg;
  svc_config(&cfg);
  cfg.max_outstanding = 6;
  cfg.window = 4;
  server *s = svc_start_with(&cfg, url, sizeof url);
  tport_client *c = svc_connect(url, "busy");
  enum { THREADS = 8 };
  pthread_t th[THREADS];
  busy_thread b[THREADS];
  for (int i = 0; i < THREADS; i++) {
    b[i] = (busy_thread){.c = c, .id = i};
    pthread_create(&th[i], NULL, busy_puts, &b[i]);
  }
  for (int i = 0; i < THREADS; i++) {
    pthread_join(th[i], NULL);
    cr_expect_eq(b[i].failures, 0, "thread %d failed %d rounds", i, b[i].failures);
  }
  tport_client *op = svc_connect(url, SVC_OPERATOR);
  cr_assert_eq(svc_counter(op, "connections_dropped"), 0);
  tport_close(op);
  tport_close(c);
  server_stop(s, 1000);
}

/* The other side: a raw connection that sends more requests than
 * --max-outstanding without waiting for replies is dropped, and only it. */
Test(limits, a_connection_past_max_outstanding_is_dropped)
{
  char url[128];
  server_config cfg;
  svc_config(&cfg);
  cfg.max_outstanding = 4;
  cfg.window = 4;
  cfg.workers = 1;
  server *s = svc_start_with(&cfg, url, sizeof url);
  /* the only worker is kept busy, so that the requests below pile up
   * unanswered whatever the machine's speed */
  rawc blocker;
  raw_open(&blocker, url);
  nng_socket raw;
  cr_assert_eq(nng_req0_open(&raw), 0);
  nng_socket_set_ms(raw, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
  cr_assert_eq(nng_dial(raw, url, NULL, 0), 0);
  char hmsg[256]; /* proved before the worker is kept busy */
  cr_assert_eq(svc_hello(raw, "default", hmsg), 0, "Hello: %s", hmsg);
  block_the_worker(&blocker);
  enum { N = 64 };
  nng_ctx ctx[N];
  nng_aio *aio[N];
  Tport__SyncRequest q = TPORT__SYNC_REQUEST__INIT;
  size_t head = frame_head_size(&q.base);
  for (int i = 0; i < N; i++) {
    cr_assert_eq(nng_ctx_open(&ctx[i], raw), 0);
    cr_assert_eq(nng_aio_alloc(&aio[i], NULL, NULL), 0);
    nng_msg *m;
    nng_msg_alloc(&m, head);
    frame_write_head(nng_msg_body(m), TPORT__METHOD__METHOD_SYNC, 0, &q.base);
    nng_aio_set_msg(aio[i], m);
    nng_ctx_send(ctx[i], aio[i]);
  }
  for (int i = 0; i < N; i++) {
    nng_aio_wait(aio[i]);
    if (nng_aio_result(aio[i]))
      nng_msg_free(nng_aio_get_msg(aio[i]));
  }
  char msg[256];
  raw_finish(&blocker, 0, msg);
  sim_set_delay(0);
  raw_close(&blocker);
  tport_client *op = svc_connect(url, SVC_OPERATOR);
  int64_t dropped = 0;
  for (int i = 0; i < 100 && (dropped = svc_counter(op, "connections_dropped")) < 1; i++)
    usleep(50000);
  cr_assert_geq(dropped, 1, "64 requests at once on a connection told 4 must drop it");
  /* everyone else is served */
  int64_t n = 1000;
  uint8_t v[1000] = {7}, back[1000];
  tport_tensor_info t;
  tport_err err;
  cr_assert_eq(tport_put(op, TPORT_UINT8, 1, &n, NULL, v, sizeof v, NULL, &t, &err), 0, "%s",
               err.msg);
  cr_assert_eq(tport_get(op, &t.ref, back, sizeof back, NULL, NULL, NULL, &err), 0);
  cr_assert_eq(memcmp(v, back, sizeof v), 0);
  tport_close(op);
  for (int i = 0; i < N; i++) {
    nng_aio_free(aio[i]);
    nng_ctx_close(ctx[i]);
  }
  nng_close(raw);
  server_stop(s, 1000);
}
