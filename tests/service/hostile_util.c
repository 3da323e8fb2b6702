/* hostile_util.c: see hostile_util.h. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "hostile_util.h"
#include "hello_mac.h"

int64_t now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void fill(uint8_t *p, size_t n, unsigned seed)
{
  for (size_t i = 0; i < n; i++)
    p[i] = (uint8_t)((i * 2654435761u + seed * 40503u) >> 13);
}

/* ---------------------------------------------------------------- servers */

void config(server_config *cfg)
{
  svc_config(cfg);
  free(cfg->admin);
  cfg->admin = strdup(OPERATOR);
}

server *start(server_config *cfg, char *url, size_t len)
{
  return svc_start_with(cfg, url, len);
}

server *start_default(char *url, size_t len)
{
  server_config cfg;
  config(&cfg);
  return start(&cfg, url, len);
}

server *start_tcp(server_config *cfg, char *inproc, size_t ilen, char *tcp, size_t tlen)
{
  static int seq;
  snprintf(inproc, ilen, "inproc://hostile-%d-%d", (int)getpid(), seq++);
  cfg->listen[0] = strdup(inproc);
  cfg->nlisten = 2;
  server *s = NULL;
  tport_err err = {0};
  for (int attempt = 0; attempt < 20 && !s; attempt++) { /* a port may be taken */
    svc_tcp_url(tcp, tlen);
    free(cfg->listen[1]);
    cfg->listen[1] = strdup(tcp);
    if (server_start(cfg, &s, &err) != 0)
      s = NULL;
  }
  cr_assert_not_null(s, "no loopback port after 20 tries: %s", err.msg);
  config_free(cfg);
  return s;
}

tport_client *connect_as(const char *url, const char *tenant, int timeout_ms)
{
  tport_client *c;
  tport_err err;
  tport_connect_options o = {.tenant = tenant, .timeout_ms = timeout_ms};
  cr_assert_eq(tport_connect(url, &o, &c, &err), 0, "connect %s as %s: %s", url,
               tenant ? tenant : "default", err.msg);
  return c;
}

int64_t op_counter(const char *url, const char *name)
{
  tport_client *op = connect_as(url, OPERATOR, REPLY_MS);
  int64_t v = svc_counter(op, name);
  tport_close(op);
  return v;
}

int64_t op_counter_until(const char *url, const char *name, int64_t want, int limit_ms)
{
  int64_t v = op_counter(url, name);
  for (int64_t end = now_ms() + limit_ms; v != want && now_ms() < end;) {
    usleep(100000);
    v = op_counter(url, name);
  }
  return v;
}

void round_trip(tport_client *c, size_t n, unsigned seed, const char *when)
{
  uint8_t *v = malloc(n), *back = malloc(n);
  fill(v, n, seed);
  int64_t sz = (int64_t)n;
  tport_tensor_info a;
  tport_err err;
  int rc = tport_put(c, TPORT_UINT8, 1, &sz, NULL, v, n, NULL, &a, &err);
  cr_assert_eq(rc, 0, "%s: a normal put of %zu bytes: %s (%s)", when, n, tport_strerror(rc),
               err.msg);
  rc = tport_get(c, &a.ref, back, n, NULL, NULL, NULL, &err);
  cr_assert_eq(rc, 0, "%s: a normal get of %zu bytes: %s (%s)", when, n, tport_strerror(rc),
               err.msg);
  cr_assert(memcmp(v, back, n) == 0, "%s: a normal get returned other bytes than were put", when);
  rc = tport_free(c, &a.ref, &err);
  cr_assert_eq(rc, 0, "%s: free: %s (%s)", when, tport_strerror(rc), err.msg);
  free(v);
  free(back);
}

/* ---------------------------------------------------------------- raw REQ connections */

void raw_open(rawc *r, const char *url)
{
  r->hello = false;
  cr_assert_eq(nng_req0_open(&r->sock), 0, "nng_req0_open");
  nng_socket_set_ms(r->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
  nng_socket_set_size(r->sock, NNG_OPT_RECVMAXSZ, 0); /* inline gets of several MiB */
  int rv = nng_dial(r->sock, url, NULL, 0);
  cr_assert_eq(rv, 0, "dial %s: %s", url, nng_strerror(rv));
  for (int i = 0; i < RAW_CTXS; i++) {
    cr_assert_eq(nng_ctx_open(&r->ctx[i], r->sock), 0, "nng_ctx_open %d", i);
    cr_assert_eq(nng_aio_alloc(&r->aio[i], NULL, NULL), 0, "nng_aio_alloc %d", i);
    nng_aio_set_timeout(r->aio[i], REPLY_MS);
  }
}

void raw_close(rawc *r)
{
  for (int i = 0; i < RAW_CTXS; i++)
    nng_aio_free(r->aio[i]);
  nng_close(r->sock);
}

static nng_msg *frame_msg(uint16_t method, const ProtobufCMessage *q, const void *payload, size_t n)
{
  size_t head = frame_head_size(q);
  nng_msg *m;
  cr_assert_eq(nng_msg_alloc(&m, head + n), 0, "a %zu-byte request message", head + n);
  frame_write_head(nng_msg_body(m), method, 0, q);
  if (n)
    memcpy((uint8_t *)nng_msg_body(m) + head, payload, n);
  return m;
}

const char *method_name(uint16_t method)
{
  const ProtobufCMethodDescriptor *md = frame_method(method);
  return md ? md->name : "?";
}

void raw_send(rawc *r, int i, uint16_t method, const ProtobufCMessage *q, const void *payload,
              size_t n)
{
  if (method == TPORT__METHOD__METHOD_HELLO) {
    r->hello = true;
  } else if (!r->hello) {
    /* what a connection that names no tenant is: "default", proved */
    char msg[256];
    cr_assert_eq(raw_hello(r, "default", msg), 0, "Hello: %s", msg);
  }
  r->method[i] = method;
  nng_aio_set_msg(r->aio[i], frame_msg(method, q, payload, n));
  nng_ctx_send(r->ctx[i], r->aio[i]);
}

void raw_sent(rawc *r, int i)
{
  nng_aio_wait(r->aio[i]);
  int rv = nng_aio_result(r->aio[i]);
  if (rv && nng_aio_get_msg(r->aio[i]))
    nng_msg_free(nng_aio_get_msg(r->aio[i])); /* a message not sent stays ours */
  cr_assert_eq(rv, 0, "sending %s: %s", method_name(r->method[i]), nng_strerror(rv));
}

int raw_wait(rawc *r, int i, const ProtobufCMessageDescriptor *d, char *msg, ProtobufCMessage **out,
             nng_msg **keep)
{
  raw_sent(r, i);
  nng_ctx_recv(r->ctx[i], r->aio[i]);
  nng_aio_wait(r->aio[i]);
  int rv = nng_aio_result(r->aio[i]);
  cr_assert_eq(rv, 0, "no reply to %s within %d ms: %s", method_name(r->method[i]), REPLY_MS,
               nng_strerror(rv));
  nng_msg *m = nng_aio_get_msg(r->aio[i]);
  char tmp[256];
  int code = svc_reply_status(m, d ? d : &tport__error_reply__descriptor, msg ? msg : tmp, out);
  if (keep)
    *keep = m;
  else
    nng_msg_free(m);
  return code;
}

int raw_call(rawc *r, uint16_t method, const ProtobufCMessage *q, const void *payload, size_t n,
             const ProtobufCMessageDescriptor *d, char *msg, ProtobufCMessage **out, nng_msg **keep)
{
  raw_send(r, 0, method, q, payload, n);
  return raw_wait(r, 0, d, msg, out, keep);
}

static void payload_of(nng_msg *m, const uint8_t **p, size_t *n)
{
  frame_view v;
  cr_assert_eq(frame_parse(nng_msg_body(m), nng_msg_len(m), &v, NULL), 0,
               "a reply that is not a frame");
  *p = v.payload;
  *n = v.payload_len;
}

Tport__Ref mkref(const uint8_t *handle, size_t len, const char *name)
{
  Tport__Ref ref = TPORT__REF__INIT;
  ref.handle.data = (uint8_t *)handle;
  ref.handle.len = len;
  ref.name = (char *)(name ? name : "");
  return ref;
}

int raw_hello(rawc *r, const char *tenant, char *msg)
{
  Tport__HelloRequest q = TPORT__HELLO_REQUEST__INIT;
  q.protocol_version = 1;
  q.client = "test_hostile";
  q.tenant = (char *)tenant;
  ProtobufCMessage *out = NULL;
  nng_msg *m = NULL;
  int code = raw_call(r, TPORT__METHOD__METHOD_HELLO, &q.base, NULL, 0,
                      &tport__hello_reply__descriptor, msg, &out, &m);
  nng_pipe pipe = nng_msg_get_pipe(m);
  nng_msg_free(m);
  Tport__HelloReply *h = (Tport__HelloReply *)out;
  uint8_t answer[HELLO_MAC_BYTES];
  if (code == TPORT_UNAUTHENTICATED && h->local_secret &&
      h->auth_challenge.len == HELLO_CHALLENGE_BYTES) {
    svc_local_answer(pipe, h->auth_challenge.data, tenant, answer);
    q.auth_response.data = answer;
    q.auth_response.len = HELLO_MAC_BYTES;
    code = raw_call(r, TPORT__METHOD__METHOD_HELLO, &q.base, NULL, 0,
                    &tport__hello_reply__descriptor, msg, NULL, NULL);
  }
  protobuf_c_message_free_unpacked(out, NULL);
  return code;
}

static int put_begin(rawc *r, size_t nbytes, const char *device, const char *name, int dtype,
                     bool replace, uint8_t handle[16], char *msg)
{
  Tport__TensorDesc d = TPORT__TENSOR_DESC__INIT;
  int64_t sz[1] = {(int64_t)nbytes};
  d.dtype = TPORT__DTYPE__DTYPE_UINT8;
  d.n_sizes = 1;
  d.sizes = sz;
  Tport__PutBeginRequest q = TPORT__PUT_BEGIN_REQUEST__INIT;
  q.desc = &d;
  q.memory_format = TPORT__MEMORY_FORMAT__MF_PRESERVE;
  q.device = (char *)(device ? device : "");
  q.name = (char *)(name ? name : "");
  q.dtype_set = dtype >= 0;
  q.dtype = (Tport__DType)(dtype >= 0 ? dtype : 0);
  q.replace = replace;
  ProtobufCMessage *out;
  int code = raw_call(r, TPORT__METHOD__METHOD_PUT_BEGIN, &q.base, NULL, 0,
                      &tport__put_begin_reply__descriptor, msg, &out, NULL);
  Tport__PutBeginReply *b = (Tport__PutBeginReply *)out;
  if (!code) {
    cr_assert(b->ref && b->ref->handle.len == 16, "PutBegin: the reply has no 16-byte handle");
    memcpy(handle, b->ref->handle.data, 16);
  }
  protobuf_c_message_free_unpacked(out, NULL);
  return code;
}

int raw_put_begin_as(rawc *r, size_t nbytes, const char *device, const char *name, int dtype,
                     uint8_t handle[16], char *msg)
{
  return put_begin(r, nbytes, device, name, dtype, false, handle, msg);
}

int raw_put_begin_replacing(rawc *r, size_t nbytes, const char *name, uint8_t handle[16], char *msg)
{
  return put_begin(r, nbytes, NULL, name, -1, true, handle, msg);
}

int raw_put_begin(rawc *r, size_t nbytes, const char *device, const char *name, uint8_t handle[16],
                  char *msg)
{
  return raw_put_begin_as(r, nbytes, device, name, -1, handle, msg);
}

void chunk_req(Tport__PutChunkRequest *q, Tport__Ref *ref, uint64_t offset)
{
  tport__put_chunk_request__init(q);
  q->ref = ref;
  q->offset = offset;
}

int raw_chunk(rawc *r, const uint8_t handle[16], uint64_t offset, const void *p, size_t n,
              char *msg)
{
  Tport__Ref ref = mkref(handle, 16, NULL);
  Tport__PutChunkRequest q;
  chunk_req(&q, &ref, offset);
  return raw_call(r, TPORT__METHOD__METHOD_PUT_CHUNK, &q.base, p, n,
                  &tport__put_chunk_reply__descriptor, msg, NULL, NULL);
}

int raw_commit(rawc *r, const uint8_t handle[16], char *msg, int64_t *storage_nbytes)
{
  Tport__Ref ref = mkref(handle, 16, NULL);
  Tport__PutCommitRequest q = TPORT__PUT_COMMIT_REQUEST__INIT;
  q.ref = &ref;
  ProtobufCMessage *out;
  int code = raw_call(r, TPORT__METHOD__METHOD_PUT_COMMIT, &q.base, NULL, 0,
                      &tport__put_commit_reply__descriptor, msg, &out, NULL);
  Tport__PutCommitReply *cr = (Tport__PutCommitReply *)out;
  if (!code && storage_nbytes)
    *storage_nbytes = cr->info ? cr->info->storage_nbytes : -1;
  protobuf_c_message_free_unpacked(out, NULL);
  return code;
}

void raw_chunks(rawc *r, const uint8_t handle[16], const uint8_t *data, size_t nbytes, size_t first,
                size_t end)
{
  char msg[256];
  for (size_t k = first; k < end; k++) {
    size_t off = k * CHUNK, len = nbytes - off < CHUNK ? nbytes - off : CHUNK;
    int code = raw_chunk(r, handle, off, data + off, len, msg);
    cr_assert_eq(code, 0, "PutChunk at %zu of %zu bytes: %s (%s)", off, nbytes,
                 tport_strerror(code), msg);
  }
}

size_t nchunks(size_t nbytes)
{
  return (nbytes + CHUNK - 1) / CHUNK;
}

void raw_put(rawc *r, const uint8_t *data, size_t nbytes, const char *device, const char *name,
             uint8_t handle[16])
{
  char msg[256];
  int code = raw_put_begin(r, nbytes, device, name, handle, msg);
  cr_assert_eq(code, 0, "PutBegin of %zu bytes on %s: %s (%s)", nbytes, device ? device : "cpu",
               tport_strerror(code), msg);
  raw_chunks(r, handle, data, nbytes, 0, nchunks(nbytes));
  code = raw_commit(r, handle, msg, NULL);
  cr_assert_eq(code, 0, "PutCommit of %zu bytes: %s (%s)", nbytes, tport_strerror(code), msg);
}

void get_begin_req(Tport__GetBeginRequest *q, Tport__Ref *ref, uint64_t inline_max)
{
  tport__get_begin_request__init(q);
  q->ref = ref;
  q->inline_max = inline_max;
}

int raw_get_begin(rawc *r, const Tport__Ref *ref, uint64_t inline_max, char *msg,
                  uint8_t transfer[16])
{
  Tport__GetBeginRequest q;
  get_begin_req(&q, (Tport__Ref *)ref, inline_max);
  ProtobufCMessage *out;
  int code = raw_call(r, TPORT__METHOD__METHOD_GET_BEGIN, &q.base, NULL, 0,
                      &tport__get_begin_reply__descriptor, msg, &out, NULL);
  Tport__GetBeginReply *g = (Tport__GetBeginReply *)out;
  if (!code && transfer) {
    cr_assert_eq(g->transfer.len, 16, "GetBegin of %llu bytes with inline_max %llu: no transfer id",
                 (unsigned long long)g->nbytes, (unsigned long long)inline_max);
    memcpy(transfer, g->transfer.data, 16);
  }
  protobuf_c_message_free_unpacked(out, NULL);
  return code;
}

void raw_expect_bytes(rawc *r, const uint8_t handle[16], const uint8_t *want, size_t n,
                      const char *when)
{
  Tport__Ref ref = mkref(handle, 16, NULL);
  Tport__GetBeginRequest q;
  get_begin_req(&q, &ref, (uint64_t)n);
  char msg[256];
  nng_msg *m;
  ProtobufCMessage *out;
  int code = raw_call(r, TPORT__METHOD__METHOD_GET_BEGIN, &q.base, NULL, 0,
                      &tport__get_begin_reply__descriptor, msg, &out, &m);
  cr_assert_eq(code, 0, "%s: GetBegin: %s (%s)", when, tport_strerror(code), msg);
  Tport__GetBeginReply *g = (Tport__GetBeginReply *)out;
  cr_assert_eq(g->nbytes, n, "%s: GetBegin says %llu bytes, %zu were put", when,
               (unsigned long long)g->nbytes, n);
  const uint8_t *p;
  size_t len;
  payload_of(m, &p, &len);
  if (g->transfer.len == 0) {
    cr_assert_eq(len, n, "%s: %zu bytes came back inline, %zu expected", when, len, n);
    cr_assert(memcmp(p, want, n) == 0, "%s: other bytes came back than were put", when);
  } else {
    cr_assert_eq(g->transfer.len, 16, "%s: a %zu-byte transfer id", when, g->transfer.len);
    uint8_t tid[16];
    memcpy(tid, g->transfer.data, 16);
    for (size_t off = 0; off < n; off += CHUNK) {
      size_t k = n - off < CHUNK ? n - off : CHUNK;
      Tport__GetChunkRequest cq = TPORT__GET_CHUNK_REQUEST__INIT;
      cq.transfer.data = tid;
      cq.transfer.len = 16;
      cq.offset = off;
      cq.length = k;
      nng_msg *cm;
      code = raw_call(r, TPORT__METHOD__METHOD_GET_CHUNK, &cq.base, NULL, 0,
                      &tport__get_chunk_reply__descriptor, msg, NULL, &cm);
      cr_assert_eq(code, 0, "%s: GetChunk at %zu: %s (%s)", when, off, tport_strerror(code), msg);
      payload_of(cm, &p, &len);
      cr_assert_eq(len, k, "%s: GetChunk at %zu gave %zu bytes of %zu", when, off, len, k);
      cr_assert(memcmp(p, want + off, k) == 0, "%s: other bytes came back at %zu than were put",
                when, off);
      nng_msg_free(cm);
    }
  }
  protobuf_c_message_free_unpacked(out, NULL);
  nng_msg_free(m);
}

int raw_get_chunk(rawc *r, const uint8_t *transfer, size_t tlen, uint64_t offset, uint64_t length,
                  const void *payload, size_t n, char *msg)
{
  Tport__GetChunkRequest q = TPORT__GET_CHUNK_REQUEST__INIT;
  q.transfer.data = (uint8_t *)transfer;
  q.transfer.len = tlen;
  q.offset = offset;
  q.length = length;
  return raw_call(r, TPORT__METHOD__METHOD_GET_CHUNK, &q.base, payload, n,
                  &tport__get_chunk_reply__descriptor, msg, NULL, NULL);
}

/* ---------------------------------------------------------------- SP over TCP by hand */

int sp_connect_raw(const char *tcp_url, int rcvbuf)
{
  int port;
  cr_assert_eq(sscanf(tcp_url, "tcp://127.0.0.1:%d", &port), 1, "not a loopback url: %s", tcp_url);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  cr_assert_geq(fd, 0, "socket: %s", strerror(errno));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  struct timeval tv = {.tv_sec = REPLY_MS / 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0, "connect %s: %s", tcp_url,
               strerror(errno));
  /* SP header: 0, 'S', 'P', version 0, the protocol (REQ = 0x30), reserved */
  const uint8_t hello[8] = {0, 'S', 'P', 0, 0x00, 0x30, 0, 0};
  cr_assert_eq(send(fd, hello, 8, MSG_NOSIGNAL), 8, "sending the SP header: %s", strerror(errno));
  uint8_t peer[8];
  size_t got = 0;
  while (got < 8) {
    ssize_t k = recv(fd, peer + got, 8 - got, 0);
    cr_assert_gt(k, 0, "the server sent no SP header: %s", k ? strerror(errno) : "EOF");
    got += (size_t)k;
  }
  cr_assert(peer[1] == 'S' && peer[2] == 'P' && peer[5] == 0x31, "not a REP peer's SP header");
  return fd;
}

int sp_connect(const char *tcp_url, int rcvbuf)
{
  return sp_connect_as(tcp_url, rcvbuf, "default");
}

int sp_connect_as(const char *tcp_url, int rcvbuf, const char *tenant)
{
  int fd = sp_connect_raw(tcp_url, rcvbuf);
  int port = 0;
  sscanf(tcp_url, "tcp://127.0.0.1:%d", &port);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  /* Hello as the tenant, answering a challenge for the local secret (the
   * tests' servers have it on) bound to the address reached */
  nng_sockaddr sa = {.s_in = {.sa_family = NNG_AF_INET, .sa_port = a.sin_port,
                              .sa_addr = a.sin_addr.s_addr}};
  uint8_t answer[HELLO_MAC_BYTES];
  Tport__HelloRequest hq = TPORT__HELLO_REQUEST__INIT;
  hq.protocol_version = 1;
  hq.client = "sp_connect";
  hq.tenant = (char *)tenant;
  for (uint32_t id = 0x7fff0000u;; id++) {
    cr_assert(sp_send(fd, id, TPORT__METHOD__METHOD_HELLO, &hq.base), "sending a Hello");
    nng_msg *m = sp_recv(fd);
    char msg[256];
    ProtobufCMessage *out = NULL;
    int code = svc_reply_status(m, &tport__hello_reply__descriptor, msg, &out);
    nng_msg_free(m);
    Tport__HelloReply *h = (Tport__HelloReply *)out;
    bool challenged = code == TPORT_UNAUTHENTICATED && h->local_secret &&
                      h->auth_challenge.len == HELLO_CHALLENGE_BYTES && !hq.auth_response.len;
    if (challenged)
      svc_local_answer_sa(&sa, h->auth_challenge.data, tenant, answer);
    protobuf_c_message_free_unpacked(out, NULL);
    if (!challenged) {
      cr_assert_eq(code, 0, "sp_connect's Hello: %s", msg);
      break;
    }
    hq.auth_response.data = answer;
    hq.auth_response.len = sizeof answer;
  }
  return fd;
}

nng_msg *sp_recv(int fd)
{
  uint8_t len8[8];
  size_t got = 0;
  while (got < 8) {
    ssize_t k = recv(fd, len8 + got, 8 - got, 0);
    cr_assert_gt(k, 0, "no SP reply: %s", k ? strerror(errno) : "EOF");
    got += (size_t)k;
  }
  uint64_t len = 0;
  for (int k = 0; k < 8; k++)
    len = len << 8 | len8[k];
  cr_assert(len >= 4 && len < (64u << 20), "an SP reply of %llu bytes", (unsigned long long)len);
  uint8_t *buf = malloc(len);
  for (got = 0; got < len;) {
    ssize_t k = recv(fd, buf + got, len - got, 0);
    cr_assert_gt(k, 0, "a short SP reply: %s", k ? strerror(errno) : "EOF");
    got += (size_t)k;
  }
  nng_msg *m;
  cr_assert_eq(nng_msg_alloc(&m, len - 4), 0);
  memcpy(nng_msg_body(m), buf + 4, len - 4); /* after the request id */
  free(buf);
  return m;
}

bool sp_send(int fd, uint32_t id, uint16_t method, const ProtobufCMessage *q)
{
  size_t head = frame_head_size(q), n = 12 + head;
  uint8_t *buf = malloc(n);
  uint64_t len = 4 + head;
  for (int k = 0; k < 8; k++)
    buf[k] = (uint8_t)(len >> (56 - 8 * k));
  uint32_t rid = id | 0x80000000u;
  for (int k = 0; k < 4; k++)
    buf[8 + k] = (uint8_t)(rid >> (24 - 8 * k));
  frame_write_head(buf + 12, method, 0, q);
  ssize_t w = send(fd, buf, n, MSG_NOSIGNAL);
  free(buf);
  return w == (ssize_t)n;
}

bool sp_peer_closed(int fd)
{
  struct tcp_info ti;
  socklen_t l = sizeof ti;
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &l) != 0)
    return true;
  return ti.tcpi_state == TCP_CLOSE_WAIT || ti.tcpi_state == TCP_CLOSE ||
         ti.tcpi_state == TCP_LAST_ACK;
}

bool sp_drain(int fd, int quiet_ms, size_t *bytes)
{
  struct timeval tv = {.tv_sec = quiet_ms / 1000, .tv_usec = (quiet_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  static uint8_t buf[1 << 16];
  *bytes = 0;
  for (int64_t end = now_ms() + 60000; now_ms() < end;) {
    ssize_t k = recv(fd, buf, sizeof buf, 0);
    if (k == 0)
      return true;
    if (k < 0)
      return errno == ECONNRESET || errno == EPIPE;
    *bytes += (size_t)k;
  }
  return false;
}

void sp_get_begin(Tport__GetBeginRequest *q, Tport__Ref *ref, const char *name)
{
  *ref = mkref(NULL, 0, name);
  get_begin_req(q, ref, 64 << 20);
}

/* Reads exactly n bytes (the socket's receive timeout bounds each wait). */
static void sp_read_all(int fd, void *buf, size_t n)
{
  struct timeval tv = {.tv_sec = REPLY_MS / 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  for (size_t got = 0; got < n;) {
    ssize_t k = recv(fd, (uint8_t *)buf + got, n - got, 0);
    cr_assert_gt(k, 0, "no reply within %d ms: %s", REPLY_MS, k ? strerror(errno) : "EOF");
    got += (size_t)k;
  }
}

int sp_recv_reply(int fd, uint32_t *id, const ProtobufCMessageDescriptor *d, char *msg,
                  ProtobufCMessage **out)
{
  uint8_t head[12];
  sp_read_all(fd, head, 12);
  uint64_t len = 0;
  for (int k = 0; k < 8; k++)
    len = len << 8 | head[k];
  cr_assert(len >= 4 && len <= (256u << 20), "an SP message of %llu bytes",
            (unsigned long long)len);
  uint32_t rid = 0;
  for (int k = 0; k < 4; k++)
    rid = rid << 8 | head[8 + k];
  *id = rid & 0x7fffffffu;
  nng_msg *m;
  cr_assert_eq(nng_msg_alloc(&m, (size_t)len - 4), 0, "nng_msg_alloc");
  sp_read_all(fd, nng_msg_body(m), (size_t)len - 4);
  char tmp[256];
  int code = svc_reply_status(m, d ? d : &tport__error_reply__descriptor, msg ? msg : tmp, out);
  nng_msg_free(m);
  return code;
}
