/* test_bad_input.c: malformed and hostile requests sent as raw frames.  Each
 * gets its status code; the server keeps serving everyone else. */
#include <criterion/criterion.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "frame.h"
#include "service_util.h"

static server *srv;
static char url[256];
static nng_socket sock;

static void setup(void)
{
  srv = svc_start_inproc(url, sizeof url, NULL);
  cr_assert_eq(nng_req0_open(&sock), 0);
  nng_socket_set_ms(sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
  nng_socket_set_ms(sock, NNG_OPT_RECVTIMEO, 10000);
  cr_assert_eq(nng_dial(sock, url, NULL, 0), 0);
  char msg[256];
  cr_assert_eq(svc_hello(sock, "default", msg), 0, "Hello: %s", msg);
}

static void teardown(void)
{
  nng_close(sock);
  server_stop(srv, 1000);
}

TestSuite(bad_input, .init = setup, .fini = teardown);

/* Sends raw bytes; returns the reply's status code (its message into msg). */
static int raw(const void *bytes, size_t n, char *msg, size_t msglen)
{
  nng_msg *m;
  cr_assert_eq(nng_msg_alloc(&m, n), 0);
  memcpy(nng_msg_body(m), bytes, n);
  cr_assert_eq(nng_sendmsg(sock, m, 0), 0);
  cr_assert_eq(nng_recvmsg(sock, &m, 0), 0, "the server must answer");
  int code = svc_reply_status(m, &tport__error_reply__descriptor, msg, NULL);
  nng_msg_free(m);
  return code;
}

/* Packs a request with a payload and sends it. */
static int call(uint16_t method, const ProtobufCMessage *q, const void *payload, size_t n,
                char *msg, size_t msglen)
{
  size_t head = frame_head_size(q);
  uint8_t *buf = malloc(head + n + 1);
  frame_write_head(buf, method, 0, q);
  if (n)
    memcpy(buf + head, payload, n);
  int code = raw(buf, head + n, msg, msglen);
  free(buf);
  return code;
}

/* A reply with a payload: returns the code and copies the reply's fields. */
static int put_begin(int dtype, size_t ndim, const int64_t *sizes, size_t nstrides,
                     const int64_t *strides, int64_t offset, uint8_t handle[16], char *msg)
{
  Tport__TensorDesc d = TPORT__TENSOR_DESC__INIT;
  d.dtype = (Tport__DType)dtype;
  d.n_sizes = ndim;
  d.sizes = (int64_t *)sizes;
  d.n_strides = nstrides;
  d.strides = (int64_t *)strides;
  d.storage_offset = offset;
  Tport__PutBeginRequest q = TPORT__PUT_BEGIN_REQUEST__INIT;
  q.desc = &d;
  q.memory_format = TPORT__MEMORY_FORMAT__MF_PRESERVE;
  size_t head = frame_head_size(&q.base);
  uint8_t *buf = malloc(head);
  frame_write_head(buf, TPORT__METHOD__METHOD_PUT_BEGIN, 0, &q.base);
  nng_msg *m;
  nng_msg_alloc(&m, head);
  memcpy(nng_msg_body(m), buf, head);
  free(buf);
  cr_assert_eq(nng_sendmsg(sock, m, 0), 0);
  cr_assert_eq(nng_recvmsg(sock, &m, 0), 0);
  ProtobufCMessage *r;
  int code = svc_reply_status(m, &tport__put_begin_reply__descriptor, msg, &r);
  if (!code && handle)
    memcpy(handle, ((Tport__PutBeginReply *)r)->ref->handle.data, 16);
  protobuf_c_message_free_unpacked(r, NULL);
  nng_msg_free(m);
  return code;
}

static int chunk(const uint8_t handle[16], uint64_t offset, const void *p, size_t n, char *msg)
{
  Tport__Ref ref = TPORT__REF__INIT;
  ref.handle.data = (uint8_t *)handle;
  ref.handle.len = 16;
  Tport__PutChunkRequest q = TPORT__PUT_CHUNK_REQUEST__INIT;
  q.ref = &ref;
  q.offset = offset;
  return call(TPORT__METHOD__METHOD_PUT_CHUNK, &q.base, p, n, msg, 256);
}

static int commit(const uint8_t handle[16], char *msg)
{
  Tport__Ref ref = TPORT__REF__INIT;
  ref.handle.data = (uint8_t *)handle;
  ref.handle.len = 16;
  Tport__PutCommitRequest q = TPORT__PUT_COMMIT_REQUEST__INIT;
  q.ref = &ref;
  return call(TPORT__METHOD__METHOD_PUT_COMMIT, &q.base, NULL, 0, msg, 256);
}

Test(bad_input, frames)
{
  char msg[256];
  uint8_t junk[64] = {0};
  cr_assert_eq(raw(junk, 5, msg, sizeof msg), TPORT_INVALID_ARGUMENT, "truncated header");
  cr_assert(strstr(msg, "shorter than"), "%s", msg);
  Tport__InfoRequest q = TPORT__INFO_REQUEST__INIT;
  uint8_t buf[64];
  size_t n = frame_head_size(&q.base);
  frame_write_head(buf, TPORT__METHOD__METHOD_INFO, 0, &q.base);
  buf[0] = 'Z';
  cr_assert_eq(raw(buf, n, msg, sizeof msg), TPORT_INVALID_ARGUMENT, "wrong magic");
  frame_write_head(buf, TPORT__METHOD__METHOD_INFO, 0, &q.base);
  buf[4] = 9;
  cr_assert_eq(raw(buf, n, msg, sizeof msg), TPORT_FAILED_PRECONDITION, "wrong version");
  frame_write_head(buf, TPORT__METHOD__METHOD_INFO, 0, &q.base);
  buf[11] = 40; /* message length past the end */
  cr_assert_eq(raw(buf, n, msg, sizeof msg), TPORT_INVALID_ARGUMENT);
  frame_write_head(buf, 99, 0, &q.base);
  cr_assert_eq(raw(buf, n, msg, sizeof msg), TPORT_UNIMPLEMENTED, "unknown method");
  cr_assert(strstr(msg, "method 99"), "%s", msg);
  frame_write_head(buf, TPORT__METHOD__METHOD_INFO, FRAME_FLAG_REPLY, &q.base);
  cr_assert_eq(raw(buf, n, msg, sizeof msg), TPORT_INVALID_ARGUMENT, "a reply sent as request");
  frame_write_head(buf, TPORT__METHOD__METHOD_INFO, 0, &q.base);
  memset(buf + FRAME_HEADER_BYTES, 0xff, 8);
  buf[11] = 8;
  cr_assert_eq(raw(buf, FRAME_HEADER_BYTES + 8, msg, sizeof msg), TPORT_INVALID_ARGUMENT,
               "garbage protobuf");
  cr_assert_eq(call(TPORT__METHOD__METHOD_INFO, &q.base, NULL, 0, msg, sizeof msg),
               TPORT_INVALID_ARGUMENT, "Info without a ref");
}

Test(bad_input, descriptors)
{
  char msg[256];
  int64_t sz[17] = {2, 3}, st[17] = {3, 1};
  cr_assert_eq(put_begin(99, 2, sz, 0, NULL, 0, NULL, msg), TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(msg, "dtype is 99"), "%s", msg);
  cr_assert_eq(put_begin(TPORT_FLOAT32, 17, sz, 0, NULL, 0, NULL, msg), TPORT_INVALID_ARGUMENT);
  int64_t neg[] = {2, -1};
  cr_assert_eq(put_begin(TPORT_FLOAT32, 2, neg, 0, NULL, 0, NULL, msg), TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(msg, "sizes[1] is -1"), "%s", msg);
  int64_t nst[] = {3, -1};
  cr_assert_eq(put_begin(TPORT_FLOAT32, 2, sz, 2, nst, 0, NULL, msg), TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(msg, "strides[1] is -1"), "%s", msg);
  int64_t gap[] = {6, 2};
  cr_assert_eq(put_begin(TPORT_FLOAT32, 2, sz, 2, gap, 0, NULL, msg), TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(msg, "dense"), "%s", msg);
  cr_assert_eq(put_begin(TPORT_FLOAT32, 2, sz, 2, st, 4, NULL, msg), TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(msg, "storage_offset"), "%s", msg);
  int64_t huge[] = {INT64_MAX / 2, 4};
  cr_assert_eq(put_begin(TPORT_FLOAT32, 2, huge, 0, NULL, 0, NULL, msg), TPORT_INVALID_ARGUMENT);
  int64_t big[] = {1 << 20, 1 << 20};
  cr_assert_eq(put_begin(TPORT_FLOAT32, 2, big, 0, NULL, 0, NULL, msg), TPORT_RESOURCE_EXHAUSTED,
               "over the per-tensor limit: %s", msg);
  cr_assert_eq(put_begin(TPORT_FLOAT32, 2, sz, 2, st, 0, NULL, msg), 0, "%s", msg);
}

Test(bad_input, one_round_trip_put_needs_the_whole_tensor)
{
  char msg[256];
  Tport__TensorDesc d = TPORT__TENSOR_DESC__INIT;
  int64_t sz[] = {10};
  d.dtype = TPORT__DTYPE__DTYPE_INT32;
  d.n_sizes = 1;
  d.sizes = sz;
  Tport__PutBeginRequest q = TPORT__PUT_BEGIN_REQUEST__INIT;
  q.desc = &d;
  q.commit = true;
  q.device = "sim:1";
  int32_t v[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  cr_assert_eq(call(TPORT__METHOD__METHOD_PUT_BEGIN, &q.base, v, 39, msg, sizeof msg),
               TPORT_INVALID_ARGUMENT, "39 of 40 bytes");
  cr_assert(strstr(msg, "39 bytes came, 40 expected"), "%s", msg);
  q.commit = false;
  cr_assert_eq(call(TPORT__METHOD__METHOD_PUT_BEGIN, &q.base, v, 40, msg, sizeof msg),
               TPORT_INVALID_ARGUMENT, "data without commit");
  q.commit = true;
  cr_assert_eq(call(TPORT__METHOD__METHOD_PUT_BEGIN, &q.base, v, 40, msg, sizeof msg), 0, "%s",
               msg);
}

/* A PutBatch's element without commit begins an upload (its chunks follow
 * by PutChunk) and carries no bytes; one that does is refused alone, its
 * bytes still counted in the payload's order. */
Test(bad_input, a_batch_element_without_commit_begins_an_upload)
{
  char msg[256];
  Tport__TensorDesc d = TPORT__TENSOR_DESC__INIT;
  int64_t sz[] = {10};
  d.dtype = TPORT__DTYPE__DTYPE_INT32;
  d.n_sizes = 1;
  d.sizes = sz;
  Tport__PutBeginRequest e[3] = {TPORT__PUT_BEGIN_REQUEST__INIT, TPORT__PUT_BEGIN_REQUEST__INIT,
                                 TPORT__PUT_BEGIN_REQUEST__INIT};
  Tport__PutBeginRequest *ep[3] = {&e[0], &e[1], &e[2]};
  uint64_t lens[3] = {40, 0, 40}; /* bytes without commit; an upload; a whole put */
  for (int i = 0; i < 3; i++)
    e[i].desc = &d;
  e[2].commit = true;
  Tport__PutBatchRequest q = TPORT__PUT_BATCH_REQUEST__INIT;
  q.n_puts = q.n_payload_bytes = 3;
  q.puts = ep;
  q.payload_bytes = lens;
  int32_t v[20];
  for (int i = 0; i < 20; i++)
    v[i] = i;
  size_t head = frame_head_size(&q.base);
  nng_msg *m;
  cr_assert_eq(nng_msg_alloc(&m, head + sizeof v), 0);
  frame_write_head(nng_msg_body(m), TPORT__METHOD__METHOD_PUT_BATCH, 0, &q.base);
  memcpy((uint8_t *)nng_msg_body(m) + head, v, sizeof v);
  cr_assert_eq(nng_sendmsg(sock, m, 0), 0);
  cr_assert_eq(nng_recvmsg(sock, &m, 0), 0);
  ProtobufCMessage *pr;
  cr_assert_eq(svc_reply_status(m, &tport__put_batch_reply__descriptor, msg, &pr), 0, "%s", msg);
  Tport__PutBatchReply *r = (Tport__PutBatchReply *)pr;
  cr_assert_eq(r->n_puts, 3);
  cr_assert_eq(r->puts[0]->status->code, TPORT__CODE__CODE_INVALID_ARGUMENT);
  cr_assert(strstr(r->puts[0]->status->message, "data only with commit"), "%s",
            r->puts[0]->status->message);
  cr_assert(!r->puts[1]->status || r->puts[1]->status->code == TPORT__CODE__CODE_OK);
  cr_assert_null(r->puts[1]->info, "an upload begun describes no tensor yet");
  cr_assert_eq(r->puts[1]->ref->handle.len, 16);
  cr_assert_gt(r->puts[1]->chunk_bytes, 0);
  cr_assert(!r->puts[2]->status || r->puts[2]->status->code == TPORT__CODE__CODE_OK);
  cr_assert_not_null(r->puts[2]->info, "the third element's bytes were the payload's second 40");
  uint8_t h[16];
  memcpy(h, r->puts[1]->ref->handle.data, 16);
  protobuf_c_message_free_unpacked(pr, NULL);
  nng_msg_free(m);
  /* the upload the batch began: a commit before its bytes fails, after them works */
  cr_assert_eq(commit(h, msg), TPORT_FAILED_PRECONDITION, "%s", msg);
  cr_assert_eq(chunk(h, 0, v, 40, msg), 0, "%s", msg);
  cr_assert_eq(commit(h, msg), 0, "%s", msg);
}

Test(bad_input, chunks_and_commits)
{
  char msg[256];
  uint8_t h[16];
  /* 200 KiB of uint8: chunks of 64 KiB -> 4 chunks, the last of 8 KiB */
  int64_t sz[] = {200 << 10};
  cr_assert_eq(put_begin(TPORT_UINT8, 1, sz, 0, NULL, 0, h, msg), 0, "%s", msg);
  uint8_t *data = malloc(200 << 10);
  for (int i = 0; i < 200 << 10; i++)
    data[i] = (uint8_t)(i * 13);
  cr_assert_eq(chunk(h, 300 << 10, data, 1, msg), TPORT_OUT_OF_RANGE, "%s", msg);
  cr_assert_eq(chunk(h, 1000, data, 64 << 10, msg), TPORT_INVALID_ARGUMENT, "overlapping");
  cr_assert(strstr(msg, "overlap"), "%s", msg);
  cr_assert_eq(chunk(h, 0, data, 100, msg), TPORT_INVALID_ARGUMENT, "short chunk");
  cr_assert_eq(chunk(h, 0, data, 64 << 10, msg), 0, "%s", msg);
  /* a duplicate with other bytes: idempotent, the first bytes stay */
  uint8_t *other = calloc(64 << 10, 1);
  cr_assert_eq(chunk(h, 0, other, 64 << 10, msg), 0, "duplicate: %s", msg);
  free(other);
  cr_assert_eq(commit(h, msg), TPORT_FAILED_PRECONDITION, "chunks missing");
  cr_assert(strstr(msg, "3 of 4 chunks are missing"), "%s", msg);
  for (int k = 1; k < 4; k++) {
    size_t off = (size_t)k << 16, len = k == 3 ? (200 << 10) - off : 64 << 10;
    cr_assert_eq(chunk(h, off, data + off, len, msg), 0, "%s", msg);
  }
  cr_assert_eq(commit(h, msg), 0, "%s", msg);
  cr_assert_eq(commit(h, msg), TPORT_FAILED_PRECONDITION, "committed twice");
  /* PutAbort: an upload in progress goes, a committed tensor is not an upload */
  uint8_t h2[16];
  cr_assert_eq(put_begin(TPORT_UINT8, 1, sz, 0, NULL, 0, h2, msg), 0, "%s", msg);
  cr_assert_eq(chunk(h2, 0, data, 64 << 10, msg), 0, "%s", msg);
  Tport__Ref aref = TPORT__REF__INIT;
  aref.handle.data = h2;
  aref.handle.len = 16;
  Tport__PutAbortRequest aq = TPORT__PUT_ABORT_REQUEST__INIT;
  aq.ref = &aref;
  cr_assert_eq(call(TPORT__METHOD__METHOD_PUT_ABORT, &aq.base, NULL, 0, msg, sizeof msg), 0, "%s",
               msg);
  cr_assert_eq(chunk(h2, 1 << 16, data, 64 << 10, msg), TPORT_NOT_FOUND, "aborted: %s", msg);
  cr_assert_eq(call(TPORT__METHOD__METHOD_PUT_ABORT, &aq.base, NULL, 0, msg, sizeof msg),
               TPORT_NOT_FOUND);
  aref.handle.data = h;
  cr_assert_eq(call(TPORT__METHOD__METHOD_PUT_ABORT, &aq.base, NULL, 0, msg, sizeof msg),
               TPORT_FAILED_PRECONDITION, "a committed tensor: %s", msg);
  cr_assert_eq(chunk(h, 0, data, 64 << 10, msg), TPORT_FAILED_PRECONDITION, "chunk after commit");
  /* the bytes, read by another connection of the same tenant: the duplicate
   * chunk did not overwrite the first */
  tport_client *c = svc_connect(url, NULL);
  tport_ref ref;
  memset(&ref, 0, sizeof ref);
  memcpy(ref.handle, h, 16);
  uint8_t *back = malloc(200 << 10);
  tport_err err;
  cr_assert_eq(tport_get(c, &ref, back, 200 << 10, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert(memcmp(back, data, 200 << 10) == 0);
  /* connection-scoped: when the raw socket's connection goes, so does the tensor */
  nng_close(sock);
  tport_tensor_info info;
  int rc = TPORT_OK;
  for (int i = 0; i < 200 && (rc = tport_info(c, &ref, &info, &err)) == TPORT_OK; i++)
    usleep(10000);
  cr_assert_eq(rc, TPORT_NOT_FOUND);
  cr_assert_eq(nng_req0_open(&sock), 0); /* for teardown */
  tport_close(c);
  free(back);
  free(data);
}

Test(bad_input, handles_and_transfers)
{
  char msg[256];
  tport_client *alice = svc_connect(url, "alice");
  tport_err err;
  uint8_t v[16] = {1, 2, 3};
  tport_put_options po;
  tport_put_options_init(&po);
  po.name = "shared";
  tport_tensor_info a;
  cr_assert_eq(tport_put(alice, TPORT_UINT8, 1, (int64_t[]){16}, NULL, v, 16, &po, &a, &err), 0);
  /* this raw socket is tenant "default": alice's handle is not found */
  Tport__Ref ref = TPORT__REF__INIT;
  ref.handle.data = a.ref.handle;
  ref.handle.len = 16;
  Tport__InfoRequest q = TPORT__INFO_REQUEST__INIT;
  q.ref = &ref;
  cr_assert_eq(call(TPORT__METHOD__METHOD_INFO, &q.base, NULL, 0, msg, sizeof msg),
               TPORT_NOT_FOUND);
  ref.handle.len = 5;
  cr_assert_eq(call(TPORT__METHOD__METHOD_INFO, &q.base, NULL, 0, msg, sizeof msg),
               TPORT_INVALID_ARGUMENT, "a 5-byte handle");
  /* already freed */
  cr_assert_eq(tport_free(alice, &a.ref, &err), 0);
  cr_assert_eq(tport_free(alice, &a.ref, &err), TPORT_NOT_FOUND);
  /* transfers: unknown, and out of range */
  Tport__GetChunkRequest g = TPORT__GET_CHUNK_REQUEST__INIT;
  uint8_t id[16] = {9};
  g.transfer.data = id;
  g.transfer.len = 16;
  g.length = 4;
  cr_assert_eq(call(TPORT__METHOD__METHOD_GET_CHUNK, &g.base, NULL, 0, msg, sizeof msg),
               TPORT_NOT_FOUND);
  /* views out of the storage, negative strides */
  tport_tensor_info b;
  cr_assert_eq(tport_put(alice, TPORT_UINT8, 1, (int64_t[]){16}, NULL, v, 16, NULL, &b, &err), 0);
  cr_assert_eq(tport_view(alice, &b.ref, 1, (int64_t[]){17}, (int64_t[]){1}, 0, NULL, NULL, &err),
               TPORT_OUT_OF_RANGE);
  cr_assert_eq(tport_view(alice, &b.ref, 1, (int64_t[]){4}, (int64_t[]){-1}, 3, NULL, NULL, &err),
               TPORT_INVALID_ARGUMENT);
  cr_assert_eq(
      tport_view(alice, &b.ref, 2, (int64_t[]){4, 4}, (int64_t[]){4, 1}, 1, NULL, NULL, &err),
      TPORT_OUT_OF_RANGE);
  tport_tensor_info tv;
  cr_assert_eq(
      tport_view(alice, &b.ref, 2, (int64_t[]){4, 4}, (int64_t[]){1, 4}, 0, NULL, &tv, &err), 0);
  /* to an unknown device, a bad dtype */
  tport_to_options o = {.device = "cuda:0"};
  cr_assert_eq(tport_to(alice, &b.ref, &o, NULL, NULL, &err), TPORT_INVALID_ARGUMENT);
  o = (tport_to_options){.device = "gpu"};
  cr_assert_eq(tport_to(alice, &b.ref, &o, NULL, NULL, &err), TPORT_INVALID_ARGUMENT);
  o = (tport_to_options){.has_dtype = true, .dtype = (tport_dtype)77};
  cr_assert_eq(tport_to(alice, &b.ref, &o, NULL, NULL, &err), TPORT_INVALID_ARGUMENT);
  /* copy into an overlapping view: PyTorch's error */
  tport_tensor_info ex;
  cr_assert_eq(tport_view(alice, &b.ref, 1, (int64_t[]){4}, (int64_t[]){0}, 0, NULL, &ex, &err), 0);
  cr_assert_eq(tport_copy(alice, &ex.ref, &b.ref, false, &err), TPORT_INVALID_ARGUMENT);
  tport_close(alice);
}

/* Another client keeps putting and getting while the hostile one works. */
static atomic_int stop_flag, good_failures, good_rounds;
static void *good_client(void *arg)
{
  (void)arg;
  tport_client *c = svc_connect(url, "good");
  uint8_t v[3000], back[3000];
  while (!atomic_load(&stop_flag)) {
    int r = atomic_fetch_add(&good_rounds, 1);
    for (int i = 0; i < 3000; i++)
      v[i] = (uint8_t)(i + r);
    tport_tensor_info a;
    tport_put_options po;
    tport_put_options_init(&po);
    po.device = "sim:0";
    if (tport_put(c, TPORT_UINT8, 1, (int64_t[]){3000}, NULL, v, 3000, &po, &a, NULL) ||
        tport_get(c, &a.ref, back, 3000, NULL, NULL, NULL, NULL) || memcmp(v, back, 3000) ||
        tport_free(c, &a.ref, NULL))
      atomic_fetch_add(&good_failures, 1);
  }
  tport_close(c);
  return NULL;
}

Test(bad_input, server_keeps_serving_others)
{
  pthread_t t;
  pthread_create(&t, NULL, good_client, NULL);
  uint8_t junk[256];
  /* 300 pieces of junk, and more until the good client has finished a
   * round beside them (on a loaded machine its first round may take longer
   * than 300 pieces; bounded: a server that stopped serving it fails) */
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (int i = 0;; i++) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (i >= 300 && (atomic_load(&good_rounds) > 0 || now.tv_sec - t0.tv_sec > 30))
      break;
    for (size_t k = 0; k < sizeof junk; k++)
      junk[k] = (uint8_t)rand();
    if (i % 3 == 0) { /* a valid header in front of garbage */
      Tport__InfoRequest q = TPORT__INFO_REQUEST__INIT;
      frame_write_head(junk, (uint16_t)(rand() % 20), 0, &q.base);
      junk[11] = (uint8_t)(rand() % 200);
    }
    /* a reply always comes (raw asserts it); junk that happens to decode as a
     * harmless request (List, Stats) may even succeed */
    int code = raw(junk, 1 + (size_t)rand() % sizeof junk, NULL, 0);
    cr_assert_neq(code, TPORT_INTERNAL, "garbage is the client's error, never the server's");
  }
  atomic_store(&stop_flag, 1);
  pthread_join(t, NULL);
  cr_assert_eq(atomic_load(&good_failures), 0);
  cr_assert_gt(atomic_load(&good_rounds), 0);
}
