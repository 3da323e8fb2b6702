/*
 * stress_service.c: tportd's threaded parts under load, as a plain program
 * for ThreadSanitizer (Criterion cannot run under it).  An in-process server;
 * eight client threads put, convert, view, get and free on cpu and sim
 * devices, two of them sharing one client, while connections come and go;
 * two more race PutCommits and PutChunks of one upload on raw contexts and
 * walk away from gets in progress (hostile clients, defects 2 and 5).
 * Exit status 0 when every byte came back right and every race had exactly
 * one winner.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "frame.h"
#include "server.h"
#include "tport.h"

static char url[128], tcp_url[64];
static atomic_int failures;
static tport_client *shared;

static void *worker(void *arg)
{
  int id = (int)(intptr_t)arg;
  unsigned seed = (unsigned)id * 2654435761u;
  const char *devices[] = {"cpu", "sim:0", "sim:1"};
  for (int r = 0; r < 25; r++) {
    bool own = id >= 2;
    tport_client *c = shared;
    /* odd threads over tcp: puts and gets lend their chunks there */
    if (own && tport_connect(id % 2 ? tcp_url : url, NULL, &c, NULL)) {
      atomic_fetch_add(&failures, 1);
      continue;
    }
    int64_t rows = 1 + rand_r(&seed) % 300, cols = 1 + rand_r(&seed) % 500;
    size_t n = (size_t)(rows * cols);
    int32_t *v = malloc(n * 4), *back = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
      v[i] = (int32_t)(i * 7 + (size_t)id * 1000 + (size_t)r);
    tport_put_options po;
    tport_put_options_init(&po);
    po.device = devices[rand_r(&seed) % 3];
    po.non_blocking = rand_r(&seed) % 2;
    tport_tensor_info a, t, f;
    tport_err err;
    tport_to_options to = {
        .device = devices[rand_r(&seed) % 3], .has_dtype = true, .dtype = TPORT_FLOAT64};
    tport_to_options back_to = {
        .has_dtype = true, .dtype = TPORT_INT32, .device = devices[rand_r(&seed) % 3]};
    bool ok =
        tport_put(c, TPORT_INT32, 2, (int64_t[]){rows, cols}, NULL, v, n * 4, &po, &a, &err) == 0 &&
        tport_view(c, &a.ref, 2, (int64_t[]){cols, rows}, (int64_t[]){1, cols}, 0, NULL, &t,
                   &err) == 0 &&
        tport_to(c, &t.ref, &to, &f, NULL, &err) == 0 &&
        tport_to(c, &f.ref, &back_to, &f, NULL, &err) == 0 &&
        tport_get(c, &f.ref, back, n * 4, NULL, NULL, NULL, &err) == 0;
    for (int64_t i = 0; ok && i < rows; i++)
      for (int64_t j = 0; ok && j < cols; j++)
        ok = back[j * rows + i] == v[i * cols + j];
    if (!ok) {
      fprintf(stderr, "stress: thread %d round %d: %s\n", id, r, err.msg);
      atomic_fetch_add(&failures, 1);
    }
    if (!own)
      tport_free(c, &a.ref, NULL);
    free(v);
    free(back);
    if (own)
      tport_close(c); /* its tensors go with the connection */
  }
  return NULL;
}

/* Sends one frame on ctx/aio (asynchronously). */
static void raw_send(nng_ctx ctx, nng_aio *aio, uint16_t method, const ProtobufCMessage *q,
                     const void *payload, size_t n)
{
  size_t head = frame_head_size(q);
  nng_msg *m;
  nng_msg_alloc(&m, head + n);
  frame_write_head(nng_msg_body(m), method, 0, q);
  if (n)
    memcpy((uint8_t *)nng_msg_body(m) + head, payload, n);
  nng_aio_set_msg(aio, m);
  nng_ctx_send(ctx, aio);
}

/* The status of the reply that arrives on ctx/aio after a send (-1: none). */
static int raw_status(nng_ctx ctx, nng_aio *aio, const ProtobufCMessageDescriptor *d,
                      ProtobufCMessage **out)
{
  nng_aio_wait(aio);
  if (nng_aio_result(aio)) {
    nng_msg_free(nng_aio_get_msg(aio));
    return -1;
  }
  nng_ctx_recv(ctx, aio);
  nng_aio_wait(aio);
  if (nng_aio_result(aio))
    return -1;
  nng_msg *m = nng_aio_get_msg(aio);
  frame_view v;
  tport_err e;
  ProtobufCMessage *r = NULL;
  int code = -1;
  if (frame_parse(nng_msg_body(m), nng_msg_len(m), &v, &e) == 0 &&
      frame_unpack(&v, d, &r, &e) == 0) {
    code = (int)((Tport__ErrorReply *)r)->status->code; /* field 1 of every reply */
    if (out)
      *out = r;
    else
      protobuf_c_message_free_unpacked(r, NULL);
  }
  nng_msg_free(m);
  return code;
}

/* Racing commits: an upload's chunks are all sent, then four PutCommits and
 * two late PutChunks go at once; exactly one commit may win.  Then gets of a
 * device tensor are begun and their connection closed without reading. */
static void *racer(void *arg)
{
  (void)arg;
  enum { K = 6, CH = 64 << 10 }; /* the server's chunk */
  uint8_t *data = malloc(3 * CH);
  memset(data, 0x5a, 3 * CH);
  for (int r = 0; r < 20; r++) {
    nng_socket sock;
    nng_ctx ctx[K];
    nng_aio *aio[K];
    if (nng_req0_open(&sock) || nng_dial(sock, url, NULL, 0)) {
      atomic_fetch_add(&failures, 1);
      break;
    }
    nng_socket_set_ms(sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    for (int i = 0; i < K; i++) {
      nng_ctx_open(&ctx[i], sock);
      nng_aio_alloc(&aio[i], NULL, NULL);
      nng_aio_set_timeout(aio[i], 20000);
    }
    Tport__TensorDesc d = TPORT__TENSOR_DESC__INIT;
    int64_t size = 3 * CH;
    d.dtype = TPORT__DTYPE__DTYPE_UINT8;
    d.n_sizes = 1;
    d.sizes = &size;
    Tport__PutBeginRequest pb = TPORT__PUT_BEGIN_REQUEST__INIT;
    pb.desc = &d;
    pb.device = r % 2 ? "sim:0" : "cpu";
    pb.memory_format = TPORT__MEMORY_FORMAT__MF_PRESERVE;
    ProtobufCMessage *out = NULL;
    raw_send(ctx[0], aio[0], TPORT__METHOD__METHOD_PUT_BEGIN, &pb.base, NULL, 0);
    if (raw_status(ctx[0], aio[0], &tport__put_begin_reply__descriptor, &out) != 0) {
      atomic_fetch_add(&failures, 1);
      break; /* (the socket stays open: the process ends soon) */
    }
    uint8_t handle[16];
    memcpy(handle, ((Tport__PutBeginReply *)out)->ref->handle.data, 16);
    protobuf_c_message_free_unpacked(out, NULL);
    Tport__Ref ref = TPORT__REF__INIT;
    ref.handle.data = handle;
    ref.handle.len = 16;
    Tport__PutChunkRequest pc = TPORT__PUT_CHUNK_REQUEST__INIT;
    pc.ref = &ref;
    for (int c = 0; c < 3; c++) {
      pc.offset = (uint64_t)c * CH;
      raw_send(ctx[c], aio[c], TPORT__METHOD__METHOD_PUT_CHUNK, &pc.base, data + c * CH, CH);
    }
    for (int c = 0; c < 3; c++)
      raw_status(ctx[c], aio[c], &tport__put_chunk_reply__descriptor, NULL);
    Tport__PutCommitRequest cm = TPORT__PUT_COMMIT_REQUEST__INIT;
    cm.ref = &ref;
    for (int i = 0; i < K; i++) {
      if (i < 4) {
        raw_send(ctx[i], aio[i], TPORT__METHOD__METHOD_PUT_COMMIT, &cm.base, NULL, 0);
      } else {
        pc.offset = (uint64_t)(i - 4) * CH;
        raw_send(ctx[i], aio[i], TPORT__METHOD__METHOD_PUT_CHUNK, &pc.base, data, CH);
      }
    }
    int wins = 0;
    for (int i = 0; i < K; i++) {
      int code = raw_status(ctx[i], aio[i],
                            i < 4 ? &tport__put_commit_reply__descriptor
                                  : &tport__put_chunk_reply__descriptor,
                            NULL);
      wins += i < 4 && code == 0;
    }
    if (wins != 1) {
      fprintf(stderr, "stress: racing commits: %d won\n", wins);
      atomic_fetch_add(&failures, 1);
    }
    /* gets begun, and the connection gone before their replies are read */
    Tport__GetBeginRequest gb = TPORT__GET_BEGIN_REQUEST__INIT;
    gb.ref = &ref;
    for (int i = 0; i < K; i++)
      raw_send(ctx[i], aio[i], TPORT__METHOD__METHOD_GET_BEGIN, &gb.base, NULL, 0);
    for (int i = 0; i < K; i++) {
      nng_aio_stop(aio[i]);
      if (nng_aio_result(aio[i]))
        nng_msg_free(nng_aio_get_msg(aio[i]));
    }
    nng_close(sock);
    for (int i = 0; i < K; i++)
      nng_aio_free(aio[i]);
  }
  free(data);
  return NULL;
}

int main(void)
{
  snprintf(url, sizeof url, "inproc://stress-%d", (int)getpid());
  server_config cfg;
  config_defaults(&cfg);
  cfg.listen[0] = strdup(url);
  cfg.nlisten = 2;
  cfg.devices = strdup("cpu,sim:2");
  /* 64 KiB: the smallest chunk a get's reply lends (REPLY_LEND_MIN_BYTES) */
  cfg.chunk_bytes = 64 << 10;
  cfg.log_level = 0;
  server *s;
  tport_err err;
  /* a port another test running beside this one may have taken: the next */
  int rc = 1;
  for (int k = 0; k < 20 && rc; k++) {
    snprintf(tcp_url, sizeof tcp_url, "tcp://127.0.0.1:%d",
             20000 + (int)(((unsigned)getpid() + 7919u * (unsigned)k) % 30000));
    free(cfg.listen[1]);
    cfg.listen[1] = strdup(tcp_url);
    rc = server_start(&cfg, &s, &err);
  }
  if (rc) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  if (tport_connect(url, NULL, &shared, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  pthread_t t[10];
  for (int i = 0; i < 8; i++)
    pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i);
  for (int i = 8; i < 10; i++)
    pthread_create(&t[i], NULL, racer, NULL);
  for (int i = 0; i < 10; i++)
    pthread_join(t[i], NULL);
  tport_close(shared);
  server_stop(s, 2000);
  config_free(&cfg);
  int f = atomic_load(&failures);
  printf("stress_service: 8 threads and 2 racers, %d failures\n", f);
  return f ? 1 : 0;
}
