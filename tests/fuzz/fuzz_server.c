/*
 * fuzz_server.c: the whole request path of tportd, from the socket to the
 * engine and back, in one process.
 *
 * LLVMFuzzerInitialize starts one server (server_start on an inproc:// URL,
 * devices cpu,sim:2) with small limits, so that every input stays cheap: 4
 * KiB chunks (multi-chunk puts from small inputs), 4 MiB per tensor, a short
 * deadline and time to live.  Each input is a short sequence of requests on
 * one or two connections (nng REQ sockets), each connection with two
 * contexts, so that two of its requests can be in flight at once:
 *
 *   op     := ctl:u8 (raw | structured)
 *   ctl    bit 0: the connection (0, 1)
 *          bit 1: the context on it (0, 1)
 *          bit 2: async: send and go on; the reply is read before that
 *                 context's next request, or at the end of the input
 *          bit 3: raw, else structured
 *   raw        := len:u16le bytes[len]          sent as they are
 *   structured := method:u8 msg_len:u16le payload_len:u16le msg payload
 *
 * A structured op gets a valid frame header for method (1 + method % the
 * number of methods) around the fuzzed protobuf message and payload.
 * Handles are 128 random bits the fuzzer cannot guess, so when the message
 * unpacks as the method's request, every Ref whose handle is 1 to 15 bytes
 * long gets instead the handle[0]-th handle seen in an earlier reply of
 * this input (GetChunk's transfer id likewise), and the message is packed
 * again.  The elements of a batch keep theirs: their seeds name tensors.
 *
 * What counts as a finding, besides the sanitizers: a request with no reply
 * within REPLY_TIMEOUT_MS (the server must answer every request or drop the
 * connection; a dropped connection is allowed and ends its use in this
 * input), and a reply that is not a reply frame of the method asked, does
 * not unpack, or carries an error without a message.  At the end of each
 * input, what each connection's tenant can list is freed and the connections
 * are closed, so that nothing carries over to the next input.
 */
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "frame.h"
#include "fuzz_target.h"
#include "server.h"

#define REPLY_TIMEOUT_MS 5000
#define MAX_OPS 48
#define MAX_IDS 16
#define NCONN 2
#define NCTX 2

enum {
  CTL_CONN = 1u << 0,
  CTL_CTX = 1u << 1,
  CTL_ASYNC = 1u << 2,
  CTL_RAW = 1u << 3,
};

static server *srv;
static char url[128];

typedef struct fuzz_ctx {
  nng_ctx ctx;
  nng_aio *aio;
  bool pending;    /* a request was sent; its reply is not read yet */
  uint16_t method; /* of that request (0: raw, any method may come back) */
  bool structured;
} fuzz_ctx;

typedef struct fuzz_conn {
  bool open;
  atomic_bool dead; /* the server dropped it (allowed): not used again in this input */
  nng_socket sock;
  fuzz_ctx ctx[NCTX];
} fuzz_conn;

/* Ids the replies of this input gave: Ref handles, or transfer ids. */
typedef struct id_table {
  uint8_t v[MAX_IDS][64];
  size_t len[MAX_IDS];
  size_t n;
} id_table;

typedef struct fuzz_ids {
  id_table handles, transfers;
} fuzz_ids;

static bool verbose; /* FUZZ_VERBOSE=1: every reply's status on stderr (to check seeds) */

static void stop_server(void)
{
  server_stop(srv, 1000);
  srv = NULL;
  if (verbose)
    fprintf(stderr, "fuzz_server: server stopped\n");
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
  /* a small pinned staging pool: its cached blocks would dominate the RSS */
  setenv("TPORT_STAGING_BYTES", "16777216", 0);
  server_config cfg;
  config_defaults(&cfg);
  cfg.devices = strdup("cpu,sim:2");
  cfg.workers = 2;
  cfg.contexts = 16;
  cfg.max_message_bytes = 1 << 20;
  cfg.chunk_bytes = 4096; /* the smallest config_check allows: multi-chunk puts stay small */
  cfg.window = 4;
  cfg.max_tensor_bytes = 4 << 20; /* keeps every conversion and copy cheap */
  cfg.tenant_quota_bytes = 16 << 20;
  cfg.max_inflight_chunks = 4;
  cfg.ttl_s = 1;
  cfg.max_ttl_s = 2;
  cfg.deadline_ms = 200;
  cfg.grace_ms = 1000;
  cfg.log_level = 0;
  cfg.max_outstanding = 4;
  cfg.send_timeout_ms = 1000;
  cfg.max_transfers = 4;
  cfg.transfer_timeout_ms = 1000;
  cfg.max_tensors = 64;
  verbose = getenv("FUZZ_VERBOSE") != NULL;
  snprintf(url, sizeof url, "inproc://tport-fuzz-%d", (int)getpid());
  cfg.listen[0] = strdup(url);
  cfg.nlisten = 1;
  tport_err err;
  int rc = server_start(&cfg, &srv, &err);
  config_free(&cfg);
  FUZZ_CHECK(rc == TPORT_OK, "server_start: %s", err.msg);
  /* the shutdown path runs too, and LSan then sees what the server left
   * (but OpenSSL's per-thread state of its workers: lsan.supp) */
  atexit(stop_server);
  return 0;
}

/* ---------------------------------------------------------------- ids */

static void add_id(id_table *t, const uint8_t *p, size_t len)
{
  if (len == 0 || len > sizeof t->v[0] || t->n == MAX_IDS)
    return;
  for (size_t i = 0; i < t->n; i++)
    if (t->len[i] == len && memcmp(t->v[i], p, len) == 0)
      return;
  memcpy(t->v[t->n], p, len);
  t->len[t->n++] = len;
}

/* Records every 16-byte Ref handle and every transfer id of a reply. */
static void harvest(const ProtobufCMessage *m, fuzz_ids *ids)
{
  const ProtobufCMessageDescriptor *md = m->descriptor;
  for (unsigned f = 0; f < md->n_fields; f++) {
    const ProtobufCFieldDescriptor *fd = &md->fields[f];
    const char *base = (const char *)m + fd->offset;
    if (fd->type == PROTOBUF_C_TYPE_BYTES && fd->label != PROTOBUF_C_LABEL_REPEATED) {
      const ProtobufCBinaryData *b = (const ProtobufCBinaryData *)base;
      if (md == &tport__ref__descriptor && strcmp(fd->name, "handle") == 0 && b->len == 16)
        add_id(&ids->handles, b->data, b->len);
      else if (strcmp(fd->name, "transfer") == 0)
        add_id(&ids->transfers, b->data, b->len);
    } else if (fd->type == PROTOBUF_C_TYPE_MESSAGE) {
      if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
        size_t n = *(const size_t *)((const char *)m + fd->quantifier_offset);
        ProtobufCMessage *const *v = *(ProtobufCMessage *const *const *)base;
        for (size_t k = 0; k < n; k++)
          if (v[k])
            harvest(v[k], ids);
      } else if (*(const ProtobufCMessage *const *)base) {
        harvest(*(const ProtobufCMessage *const *)base, ids);
      }
    }
  }
}

/* A substituted field, restored before protobuf-c frees the message. */
typedef struct patch {
  ProtobufCBinaryData *field;
  ProtobufCBinaryData orig;
} patch;

/* Points short handles and transfer ids at ones from earlier replies. */
static void substitute(ProtobufCMessage *m, fuzz_ids *ids, patch *patches, size_t *npatches)
{
  const ProtobufCMessageDescriptor *md = m->descriptor;
  for (unsigned f = 0; f < md->n_fields && *npatches < 8; f++) {
    const ProtobufCFieldDescriptor *fd = &md->fields[f];
    char *base = (char *)m + fd->offset;
    if (fd->type == PROTOBUF_C_TYPE_BYTES && fd->label != PROTOBUF_C_LABEL_REPEATED) {
      ProtobufCBinaryData *b = (ProtobufCBinaryData *)base;
      if (b->len == 0 || b->len >= 16)
        continue;
      bool handle = md == &tport__ref__descriptor && strcmp(fd->name, "handle") == 0;
      bool transfer = strcmp(fd->name, "transfer") == 0;
      id_table *t = handle ? &ids->handles : transfer ? &ids->transfers : NULL;
      if (!t || t->n == 0)
        continue;
      patches[*npatches] = (patch){b, *b};
      (*npatches)++;
      size_t i = b->data[0] % t->n;
      b->data = t->v[i];
      b->len = t->len[i];
    } else if (fd->type == PROTOBUF_C_TYPE_MESSAGE && fd->label != PROTOBUF_C_LABEL_REPEATED &&
               *(ProtobufCMessage **)base) {
      substitute(*(ProtobufCMessage **)base, ids, patches, npatches);
    }
  }
}

/* ---------------------------------------------------------------- connections */

/* A connection the server closed: REQ would redial and carry on over a
 * fresh pipe (a fresh session), so the input stops using it instead. */
static void pipe_removed(nng_pipe p, nng_pipe_ev ev, void *arg)
{
  fuzz_conn *c = arg;
  /* not a late event of an earlier input's socket */
  if (nng_socket_id(nng_pipe_socket(p)) == nng_socket_id(c->sock))
    atomic_store(&c->dead, true);
}

static bool conn_open(fuzz_conn *c)
{
  if (c->open)
    return !atomic_load(&c->dead);
  memset(c, 0, sizeof *c);
  int rv = nng_req0_open(&c->sock);
  FUZZ_CHECK(rv == 0, "nng_req0_open: %s", nng_strerror(rv));
  /* REQ must never resend: a resent request would run twice */
  nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
  nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, 0); /* inline gets may be large */
  nng_pipe_notify(c->sock, NNG_PIPE_EV_REM_POST, pipe_removed, c);
  rv = nng_dial(c->sock, url, NULL, 0);
  FUZZ_CHECK(rv == 0, "dial %s: %s", url, nng_strerror(rv));
  for (int i = 0; i < NCTX; i++) {
    FUZZ_CHECK(nng_ctx_open(&c->ctx[i].ctx, c->sock) == 0, "nng_ctx_open");
    FUZZ_CHECK(nng_aio_alloc(&c->ctx[i].aio, NULL, NULL) == 0, "nng_aio_alloc");
  }
  c->open = true;
  return true;
}

static void conn_close(fuzz_conn *c)
{
  if (!c->open)
    return;
  for (int i = 0; i < NCTX; i++) {
    nng_aio_stop(c->ctx[i].aio);
    nng_aio_free(c->ctx[i].aio);
    nng_ctx_close(c->ctx[i].ctx);
  }
  nng_close(c->sock);
  memset(c, 0, sizeof *c);
}

/* Checks a reply; records its handles.  Returns its status code. */
static int check_reply(fuzz_ctx *x, nng_msg *m, fuzz_ids *ids, ProtobufCMessage **out)
{
  frame_view v;
  tport_err err;
  int rc = frame_parse(nng_msg_body(m), nng_msg_len(m), &v, &err);
  FUZZ_CHECK(rc == TPORT_OK, "a reply to method %u is not a frame: %s", x->method, err.msg);
  FUZZ_CHECK(v.flags & FRAME_FLAG_REPLY, "a reply to method %u lacks the reply flag", x->method);
  if (x->structured)
    FUZZ_CHECK(v.method == x->method, "a reply to method %u says method %u", x->method, v.method);
  /* a known method's reply type; else (a raw request's reply) any reply
   * type reads as ErrorReply, whose status is field 1 like every reply's */
  const ProtobufCMethodDescriptor *md = frame_method(v.method);
  const ProtobufCMessageDescriptor *d = md ? md->output : &tport__error_reply__descriptor;
  ProtobufCMessage *r;
  rc = frame_unpack(&v, d, &r, &err);
  FUZZ_CHECK(rc == TPORT_OK, "the reply to method %u is not a %s", v.method, d->name);
  const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(d, "status");
  FUZZ_CHECK(f != NULL && f->id == 1, "%s has no status as field 1", d->name);
  const Tport__Status *st = *(Tport__Status *const *)((const char *)r + f->offset);
  int code = st ? (int)st->code : TPORT_OK;
  if (verbose)
    fprintf(stderr, "  method %2u -> %2d %s\n", v.method, code,
            st && st->message ? st->message : "");
  FUZZ_CHECK(code >= 0 && code <= 16, "status code %d", code);
  if (code != TPORT_OK)
    FUZZ_CHECK(st->message && st->message[0], "method %u: status %d without a message", v.method,
               code);
  harvest(r, ids);
  if (out)
    *out = r;
  else
    protobuf_c_message_free_unpacked(r, NULL);
  return code;
}

/* Reads the pending reply of a context.  A timeout is a finding; a dropped
 * connection is not (the server may drop a connection that breaks a limit). */
static void await_reply(fuzz_conn *c, fuzz_ctx *x, fuzz_ids *ids, ProtobufCMessage **out)
{
  if (out)
    *out = NULL;
  if (!x->pending)
    return;
  x->pending = false;
  nng_aio_set_timeout(x->aio, REPLY_TIMEOUT_MS);
  nng_ctx_recv(x->ctx, x->aio);
  nng_aio_wait(x->aio);
  int rv = nng_aio_result(x->aio);
  if (rv == NNG_ECONNRESET || rv == NNG_ECLOSED || rv == NNG_ECONNSHUT) {
    if (verbose)
      fprintf(stderr, "  method %2u -> connection dropped\n", x->method);
    atomic_store(&c->dead, true);
    return;
  }
  FUZZ_CHECK(rv != NNG_ETIMEDOUT, "no reply to method %u within %d ms", x->method,
             REPLY_TIMEOUT_MS);
  FUZZ_CHECK(rv == 0, "receiving the reply to method %u: %s", x->method, nng_strerror(rv));
  nng_msg *m = nng_aio_get_msg(x->aio);
  check_reply(x, m, ids, out);
  nng_msg_free(m);
}

static void send_frame(fuzz_conn *c, fuzz_ctx *x, const void *buf, size_t len, uint16_t method,
                       bool structured)
{
  nng_msg *m;
  FUZZ_CHECK(nng_msg_alloc(&m, len) == 0, "nng_msg_alloc");
  if (len)
    memcpy(nng_msg_body(m), buf, len);
  nng_aio_set_msg(x->aio, m);
  nng_aio_set_timeout(x->aio, REPLY_TIMEOUT_MS);
  nng_ctx_send(x->ctx, x->aio);
  nng_aio_wait(x->aio);
  int rv = nng_aio_result(x->aio);
  if (rv != 0) {
    /* no pipe to send on: the server dropped this connection */
    nng_msg_free(nng_aio_get_msg(x->aio));
    FUZZ_CHECK(rv == NNG_ECLOSED || rv == NNG_ECONNRESET || rv == NNG_ECONNSHUT ||
                   rv == NNG_ETIMEDOUT,
               "send: %s", nng_strerror(rv));
    atomic_store(&c->dead, true);
    return;
  }
  x->pending = true;
  x->method = method;
  x->structured = structured;
}

/* FUZZ_SKIP_KNOWN=1 (exploration only; `make fuzz` and the replays never
 * set it): requests that hit a defect already reported and not fixed yet
 * are not sent, so that the fuzzer can look past them.  Each test names its
 * regression; delete it once that regression passes. */
static bool skip_sizes(size_t n, const int64_t *sizes)
{
  /* regressions/frame/put-begin-empty-huge-dims-contiguous-strides-overflow
   * (and server/...): contiguous strides of an empty tensor with huge sizes
   * overflow in meta_fresh_strides; a View makes such a tensor too */
  __int128 prod = 1;
  for (size_t d = 0; d < n && d < 64; d++)
    if ((prod *= sizes[d] > 1 ? sizes[d] : 1) > INT64_MAX)
      return true;
  return false;
}

static bool skip_known(const ProtobufCMessage *q)
{
  static int on = -1;
  if (on < 0)
    on = getenv("FUZZ_SKIP_KNOWN") != NULL;
  if (!on || !q)
    return false;
  if (q->descriptor == &tport__put_begin_request__descriptor) {
    const Tport__TensorDesc *d = ((const Tport__PutBeginRequest *)q)->desc;
    return d && skip_sizes(d->n_sizes, d->sizes);
  }
  if (q->descriptor == &tport__view_request__descriptor) {
    const Tport__ViewRequest *v = (const Tport__ViewRequest *)q;
    return skip_sizes(v->n_sizes, v->sizes);
  }
  return false;
}

/* The request a raw frame carries, when it is one (for skip_known). */
static bool raw_skip_known(const uint8_t *buf, size_t len)
{
  frame_view v;
  const ProtobufCMethodDescriptor *md;
  if (frame_parse(buf, len, &v, NULL) || !(md = frame_method(v.method)))
    return false;
  ProtobufCMessage *q = protobuf_c_message_unpack(md->input, NULL, v.msg_len, v.msg);
  bool skip = skip_known(q);
  if (q)
    protobuf_c_message_free_unpacked(q, NULL);
  return skip;
}

/* Sends a structured request: a valid header around msg (with handles
 * substituted when it unpacks) and the payload. */
static void send_structured(fuzz_conn *c, fuzz_ctx *x, uint16_t method, const uint8_t *msg,
                            size_t msg_len, const uint8_t *payload, size_t payload_len,
                            fuzz_ids *ids)
{
  const ProtobufCMethodDescriptor *md = frame_method(method);
  ProtobufCMessage *q = protobuf_c_message_unpack(md->input, NULL, msg_len, msg);
  patch patches[8];
  size_t npatches = 0;
  size_t head;
  uint8_t *buf;
  if (skip_known(q)) {
    protobuf_c_message_free_unpacked(q, NULL);
    return;
  }
  if (q) {
    substitute(q, ids, patches, &npatches);
    head = frame_head_size(q);
    buf = malloc(head + payload_len + 1);
    FUZZ_CHECK(buf != NULL, "out of memory");
    frame_write_head(buf, method, 0, q);
    while (npatches > 0) {
      npatches--;
      *patches[npatches].field = patches[npatches].orig;
    }
    protobuf_c_message_free_unpacked(q, NULL);
  } else {
    /* not a valid request: sent as it is, behind a valid header */
    head = FRAME_HEADER_BYTES + msg_len;
    buf = malloc(head + payload_len + 1);
    FUZZ_CHECK(buf != NULL, "out of memory");
    uint32_t n = (uint32_t)msg_len;
    const uint8_t h[FRAME_HEADER_BYTES] = {0x54,
                                           0x50,
                                           0x52,
                                           0x54,
                                           FRAME_VERSION,
                                           0,
                                           (uint8_t)(method >> 8),
                                           (uint8_t)method,
                                           (uint8_t)(n >> 24),
                                           (uint8_t)(n >> 16),
                                           (uint8_t)(n >> 8),
                                           (uint8_t)n};
    memcpy(buf, h, sizeof h);
    memcpy(buf + FRAME_HEADER_BYTES, msg, msg_len);
  }
  if (payload_len)
    memcpy(buf + head, payload, payload_len);
  send_frame(c, x, buf, head + payload_len, method, true);
  free(buf);
}

/* Frees what a connection's tenant can list (kept and named tensors too),
 * so that the next input starts from an empty registry. */
static void free_listed(fuzz_conn *c, fuzz_ids *ids)
{
  if (!c->open || atomic_load(&c->dead))
    return;
  fuzz_ctx *x = &c->ctx[0];
  Tport__ListRequest lq = TPORT__LIST_REQUEST__INIT;
  uint8_t buf[64];
  frame_write_head(buf, TPORT__METHOD__METHOD_LIST, 0, &lq.base);
  send_frame(c, x, buf, frame_head_size(&lq.base), TPORT__METHOD__METHOD_LIST, true);
  ProtobufCMessage *r;
  await_reply(c, x, ids, &r);
  if (!r)
    return;
  Tport__ListReply *lr = (Tport__ListReply *)r;
  for (size_t i = 0; i < lr->n_tensors && !atomic_load(&c->dead); i++) {
    Tport__TensorInfo *ti = lr->tensors[i];
    if (!ti || !ti->ref)
      continue;
    Tport__FreeRequest fq = TPORT__FREE_REQUEST__INIT;
    fq.ref = ti->ref;
    size_t n = frame_head_size(&fq.base);
    uint8_t *fb = malloc(n);
    FUZZ_CHECK(fb != NULL, "out of memory");
    frame_write_head(fb, TPORT__METHOD__METHOD_FREE, 0, &fq.base);
    send_frame(c, x, fb, n, TPORT__METHOD__METHOD_FREE, true);
    free(fb);
    await_reply(c, x, ids, NULL);
  }
  protobuf_c_message_free_unpacked(r, NULL);
}

/* ---------------------------------------------------------------- input */

static bool take(const uint8_t **p, const uint8_t *end, size_t n, const uint8_t **out)
{
  if ((size_t)(end - *p) < n)
    return false;
  *out = *p;
  *p += n;
  return true;
}

static bool take_u16(const uint8_t **p, const uint8_t *end, size_t *out)
{
  const uint8_t *b;
  if (!take(p, end, 2, &b))
    return false;
  *out = (size_t)b[0] | (size_t)b[1] << 8;
  return true;
}

/* static: nng's pipe callbacks hold pointers to them */
static fuzz_conn conns[NCONN];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  fuzz_ids ids;
  memset(&ids, 0, sizeof ids);
  const uint8_t *p = data, *end = data + size;
  const ProtobufCServiceDescriptor *svc = &tport__tensor_port__descriptor;
  for (int op = 0; op < MAX_OPS && p < end; op++) {
    uint8_t ctl = *p++;
    const uint8_t *msg, *payload = NULL;
    size_t msg_len, payload_len = 0;
    uint16_t method = 0;
    if (ctl & CTL_RAW) {
      if (!take_u16(&p, end, &msg_len) || !take(&p, end, msg_len, &msg))
        break;
    } else {
      const uint8_t *mb;
      if (!take(&p, end, 1, &mb) || !take_u16(&p, end, &msg_len) ||
          !take_u16(&p, end, &payload_len) || !take(&p, end, msg_len, &msg) ||
          !take(&p, end, payload_len, &payload))
        break;
      method = (uint16_t)(1 + mb[0] % svc->n_methods);
    }
    fuzz_conn *c = &conns[ctl & CTL_CONN ? 1 : 0];
    if (!conn_open(c))
      continue; /* dropped by the server earlier in this input */
    fuzz_ctx *x = &c->ctx[ctl & CTL_CTX ? 1 : 0];
    await_reply(c, x, &ids, NULL);
    if (atomic_load(&c->dead))
      continue;
    if (ctl & CTL_RAW) {
      if (!raw_skip_known(msg, msg_len))
        send_frame(c, x, msg, msg_len, 0, false);
    } else
      send_structured(c, x, method, msg, msg_len, payload, payload_len, &ids);
    if (!(ctl & CTL_ASYNC))
      await_reply(c, x, &ids, NULL);
  }
  for (int i = 0; i < NCONN; i++)
    for (int k = 0; k < NCTX; k++)
      await_reply(&conns[i], &conns[i].ctx[k], &ids, NULL);
  for (int i = 0; i < NCONN; i++)
    free_listed(&conns[i], &ids);
  for (int i = 0; i < NCONN; i++)
    conn_close(&conns[i]);
  return 0;
}
