/*
 * reply.c: a handler's reply packed into the reply message: its head, and
 * its payload copied in or lent from a storage (lends.h); and the error
 * reply of a request that failed.  The handlers and dispatch call these;
 * these call nothing of the server's.
 */
#include <nng/nng.h>
#include <string.h>

#include "server_internal.h"

static int pack_reply(nng_msg **out, uint16_t method, ProtobufCMessage *m, const void *payload,
                      size_t n)
{
  size_t head = frame_head_size(m);
  nng_msg *msg;
  if (nng_msg_alloc(&msg, head + n) != 0)
    return TPORT_RESOURCE_EXHAUSTED;
  uint8_t *body = nng_msg_body(msg);
  frame_write_head(body, method, FRAME_FLAG_REPLY, m);
  if (n)
    memcpy(body + head, payload, n);
  *out = msg;
  return TPORT_OK;
}

/* A batch element's reply, packed into its batch's sink: what a message
 * of its own cost each element (an nng message allocated and freed, a
 * frame written and parsed back) was ~5% of a PutBatch of 4 KiB tensors. */
static int sink_reply(call *c, ProtobufCMessage *m, const void *payload, size_t n)
{
  reply_sink *s = c->sink;
  size_t packed = protobuf_c_message_get_packed_size(m), end;
  if (__builtin_add_overflow(s->len, packed, &end) || __builtin_add_overflow(end, n, &end))
    return TPORT_RESOURCE_EXHAUSTED;
  if (end > s->cap) {
    size_t cap = s->cap ? s->cap : 4096;
    while (cap < end)
      if (__builtin_mul_overflow(cap, 2, &cap))
        return TPORT_RESOURCE_EXHAUSTED;
    uint8_t *b = realloc(s->buf, cap);
    if (!b)
      return TPORT_RESOURCE_EXHAUSTED;
    s->buf = b;
    s->cap = cap;
  }
  protobuf_c_message_pack(m, s->buf + s->len);
  if (n)
    memcpy(s->buf + s->len + packed, payload, n);
  c->sink_at = s->len;
  c->sink_packed = packed;
  c->sink_payload = n;
  c->sunk = true;
  s->len = end;
  return TPORT_OK;
}

bool (*server_test_reply_fails)(uint16_t method, bool element);

/* The call's reply: its own message, or its batch's sink. */
static int reply_out(call *c, ProtobufCMessage *m, const void *payload, size_t n)
{
  if (server_test_reply_fails && server_test_reply_fails(c->method, c->sink != NULL))
    return TPORT_RESOURCE_EXHAUSTED;
  return c->sink ? sink_reply(c, m, payload, n) : pack_reply(&c->out, c->method, m, payload, n);
}

int call_reply(call *c, ProtobufCMessage *reply, const void *payload, size_t n)
{
  int rc = reply_out(c, reply, payload, n);
  if (rc)
    return tport_err_set(&c->err, rc, "out of memory for a %zu-byte reply", n);
  return TPORT_OK;
}

int call_reply_lent(call *c, ProtobufCMessage *reply, tport_storage *st, const void *payload,
                    size_t n)
{
#ifndef TPORT_NNG_LENT_TAIL
  (void)st; /* the system's nng (TPORT_SYSTEM_NNG) lends nothing */
  return call_reply(c, reply, payload, n);
#else
  if (c->lend_to_batch && n >= REPLY_LEND_MIN_BYTES && c->srv->lends &&
      lends_pipe_takes_lent_bytes(c->pipe)) {
    /* the batch's reply lends the bytes (or copies them): held till then */
    if (!(c->lent = lends_begin(c->srv->lends, c->pipe, st)))
      return call_reply(c, reply, payload, n);
    int rc = reply_out(c, reply, NULL, 0);
    if (rc) {
      lends_end(c->lent);
      c->lent = NULL;
      return tport_err_set(&c->err, rc, "out of memory for a reply");
    }
    c->lent_p = payload;
    c->lent_n = n;
    return TPORT_OK;
  }
  if (n < REPLY_LEND_MIN_BYTES || c->copy_payload || !c->srv->lends ||
      !lends_pipe_takes_lent_bytes(c->pipe))
    return call_reply(c, reply, payload, n);
  int rc = pack_reply(&c->out, c->method, reply, NULL, 0);
  if (rc)
    return tport_err_set(&c->err, rc, "out of memory for a reply");
  if (!lends_attach(c->srv->lends, c->out, c->pipe, st, payload, n)) {
    nng_msg_free(c->out);
    c->out = NULL;
    return call_reply(c, reply, payload, n);
  }
  /* ctx_finish counts the message's own bytes: the lent ones are not in them */
  atomic_fetch_add(&c->srv->bytes_out, n);
  atomic_fetch_add(&c->srv->bytes_lent, n);
  return TPORT_OK;
#endif
}

nng_msg *error_reply(uint16_t method, const tport_err *e)
{
  Tport__ErrorReply r = TPORT__ERROR_REPLY__INIT;
  Tport__Status st = TPORT__STATUS__INIT;
  st.code = (Tport__Code)e->code;
  st.message = (char *)e->msg;
  r.status = &st;
  nng_msg *m = NULL;
  pack_reply(&m, method, &r.base, NULL, 0);
  return m;
}

call call_for_element(const call *c, uint16_t method)
{
  call sub = {.srv = c->srv,
              .sink = c->sink,
              .pipe = c->pipe,
              .method = method,
              .arrived_ns = c->arrived_ns,
              .copy_payload = true};
  tport_err_clear(&sub.err);
  return sub;
}
