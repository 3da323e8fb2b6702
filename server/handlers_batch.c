/*
 * handlers_batch.c: PutBatch and GetBatch -- many tensors in one round trip.
 *
 * Each element is handed to the handler of the single request it stands
 * for (h_put_begin, h_get_begin) as a call of its own: the same checks, the
 * same quota and registry, nothing validated twice in two ways.  The
 * element's reply is read back from the message that handler packed and
 * becomes the element's entry in the batch's reply; an element that fails
 * gets its status there and leaves the others alone.  Bounds: at most
 * BATCH_MAX_ELEMENTS elements a request (past it the whole request is
 * INVALID_ARGUMENT), a put's bytes within its message (the frame's limit),
 * and a get's inline bytes within the server's chunk size (an element past
 * it is answered with a transfer, read by GetChunk as a single get's).
 */
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"
#include "wire.h"

#define BATCH_MAX_ELEMENTS 4096

/* What one element's handler answered: its reply unpacked (NULL when it
 * failed: then st holds the error), and its payload in msg. */
typedef struct element {
  ProtobufCMessage *reply;
  nng_msg *msg;
  const uint8_t *payload;
  size_t payload_len;
  Tport__Status st;
  tport_err err;
} element;

/* Runs handler on one element (req, payload) as a call of its own and
 * keeps its answer in el. */
static void run_element(call *c, uint16_t method, int (*handler)(call *), ProtobufCMessage *req,
                        const uint8_t *payload, size_t n, const ProtobufCMessageDescriptor *d,
                        element *el)
{
  call sub = {.srv = c->srv,
              .pipe = c->pipe,
              .method = method,
              .req = req,
              .payload = payload,
              .payload_len = n,
              .arrived_ns = c->arrived_ns,
              .copy_payload = true};
  tport_err_clear(&sub.err);
  int rc = handler(&sub);
  frame_view v;
  if (!rc && !sub.out)
    rc = tport_err_set(&sub.err, TPORT_INTERNAL, "the handler gave no reply");
  if (!rc)
    rc = frame_parse(nng_msg_body(sub.out), nng_msg_len(sub.out), &v, &sub.err);
  if (!rc)
    rc = frame_unpack(&v, d, &el->reply, &sub.err);
  if (rc) {
    if (sub.out)
      nng_msg_free(sub.out);
    el->reply = NULL;
    el->err = sub.err;
    tport__status__init(&el->st);
    el->st.code = (Tport__Code)sub.err.code;
    el->st.message = el->err.msg;
    return;
  }
  el->msg = sub.out;
  el->payload = v.payload;
  el->payload_len = v.payload_len;
}

static void free_elements(element *els, size_t n)
{
  for (size_t i = 0; i < n && els; i++) {
    if (els[i].reply)
      protobuf_c_message_free_unpacked(els[i].reply, NULL);
    if (els[i].msg)
      nng_msg_free(els[i].msg);
  }
  free(els);
}

/* An element refused before its handler ran. */
static void refuse_element(element *el, int code, const char *why)
{
  tport_err_set(&el->err, code, "%s", why);
  tport__status__init(&el->st);
  el->st.code = (Tport__Code)code;
  el->st.message = el->err.msg;
}

static int check_count(call *c, size_t n)
{
  if (n > BATCH_MAX_ELEMENTS)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "a batch of %zu elements: at most %d in one request", n,
                         BATCH_MAX_ELEMENTS);
  return TPORT_OK;
}

int h_put_batch(call *c)
{
  Tport__PutBatchRequest *q = (Tport__PutBatchRequest *)c->req;
  size_t n = q->n_puts;
  int rc = check_count(c, n);
  if (rc)
    return rc;
  if (q->n_payload_bytes != n)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "%zu payload lengths for %zu elements: one each", q->n_payload_bytes, n);
  size_t total = 0;
  for (size_t i = 0; i < n; i++)
    if (q->payload_bytes[i] > SIZE_MAX ||
        __builtin_add_overflow(total, (size_t)q->payload_bytes[i], &total) ||
        total > c->payload_len)
      return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                           "the elements' lengths pass the %zu-byte payload at element %zu",
                           c->payload_len, i);
  if (total != c->payload_len)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "the elements' lengths add up to %zu bytes: the payload is %zu", total,
                         c->payload_len);
  element *els = calloc(n ? n : 1, sizeof *els);
  Tport__PutBeginReply *fails = calloc(n ? n : 1, sizeof *fails);
  Tport__PutBeginReply **out = calloc(n ? n : 1, sizeof *out);
  if (!els || !fails || !out) {
    free(els), free(fails), free(out);
    return tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory for %zu elements", n);
  }
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    size_t len = (size_t)q->payload_bytes[i];
    if (!q->puts[i]->commit)
      refuse_element(&els[i], TPORT_INVALID_ARGUMENT,
                     "an element of a batch commits at once: set commit (a large tensor goes by "
                     "PutBegin and its chunks)");
    else
      run_element(c, TPORT__METHOD__METHOD_PUT_BEGIN, h_put_begin, &q->puts[i]->base,
                  c->payload + off, len, &tport__put_begin_reply__descriptor, &els[i]);
    off += len;
    if (els[i].reply) {
      out[i] = (Tport__PutBeginReply *)els[i].reply;
    } else {
      tport__put_begin_reply__init(&fails[i]);
      fails[i].status = &els[i].st;
      out[i] = &fails[i];
    }
  }
  Tport__PutBatchReply r = TPORT__PUT_BATCH_REPLY__INIT;
  r.status = wire_ok();
  r.n_puts = n;
  r.puts = out;
  rc = call_reply(c, &r.base, NULL, 0);
  free_elements(els, n);
  free(fails);
  free(out);
  return rc;
}

/* A deferred element's reply: the tensor's info and size, no bytes, no
 * transfer -- packed and read back, so that it owns what it says (the
 * tensor may be freed before the batch's reply is packed). */
static int defer_element(call *c, reg_entry *e, tport_tensor *t, element *el)
{
  wire_info wi;
  wire_fill_info(&wi, e, t);
  Tport__GetBeginReply r = TPORT__GET_BEGIN_REPLY__INIT;
  r.status = wire_ok();
  r.info = &wi.info;
  r.nbytes = tensor_nbytes(t);
  r.chunk_bytes = c->srv->cfg.chunk_bytes;
  size_t len = protobuf_c_message_get_packed_size(&r.base);
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf)
    return tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  protobuf_c_message_pack(&r.base, buf);
  el->reply = protobuf_c_message_unpack(&tport__get_begin_reply__descriptor, NULL, len, buf);
  free(buf);
  if (!el->reply)
    return tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  return TPORT_OK;
}

/* With defer_large: an element too large for the reply's room (inline_max
 * and *budget) is answered by defer_element (*deferred); else not at all. */
static void maybe_defer(call *c, const Tport__GetBeginRequest *g, size_t budget, element *el,
                        bool *deferred)
{
  reg_entry *e;
  tport_tensor *t;
  call look = {.srv = c->srv, .pipe = c->pipe, .method = TPORT__METHOD__METHOD_GET_BEGIN};
  tport_err_clear(&look.err);
  if (wire_find(&look, g->ref, "ref", &e, &t)) {
    refuse_element(el, look.err.code, look.err.msg);
    *deferred = true; /* answered: not found, or still uploading */
    el->reply = NULL;
    return;
  }
  size_t n = tensor_nbytes(t), room = g->inline_max < budget ? (size_t)g->inline_max : budget;
  if (n > room || n > c->srv->cfg.chunk_bytes) {
    if (defer_element(&look, e, t, el))
      refuse_element(el, look.err.code, look.err.msg);
    *deferred = true;
  }
  reg_put(&c->srv->reg, e);
}

/* One GetBatch element: as a GetBegin of its own, inline only while the
 * reply's inline bytes stay within *budget (which it spends); a large one
 * deferred (*deferred) where the request asks. */
static void get_element(call *c, const Tport__GetBeginRequest *g, bool defer, size_t *budget,
                        element *el, bool *deferred)
{
  *deferred = false;
  if (g->shm) {
    refuse_element(el, TPORT_INVALID_ARGUMENT, "a batch's gets name no region (shm)");
    return;
  }
  if (g->wait_ms) { /* an element is no context of its own: it cannot park */
    refuse_element(el, TPORT_INVALID_ARGUMENT, "a batch's gets wait for no name (wait_ms)");
    return;
  }
  if (defer && (maybe_defer(c, g, *budget, el, deferred), *deferred))
    return;
  Tport__GetBeginRequest one = *g;
  if (one.inline_max > *budget)
    one.inline_max = *budget;
  run_element(c, TPORT__METHOD__METHOD_GET_BEGIN, h_get_begin, &one.base, NULL, 0,
              &tport__get_begin_reply__descriptor, el);
  *budget -= el->payload_len <= *budget ? el->payload_len : *budget;
}

int h_get_batch(call *c)
{
  Tport__GetBatchRequest *q = (Tport__GetBatchRequest *)c->req;
  size_t n = q->n_gets;
  int rc = check_count(c, n);
  if (rc)
    return rc;
  element *els = calloc(n ? n : 1, sizeof *els);
  Tport__GetBeginReply *fails = calloc(n ? n : 1, sizeof *fails);
  Tport__GetBeginReply **out = calloc(n ? n : 1, sizeof *out);
  protobuf_c_boolean *deferred = calloc(n ? n : 1, sizeof *deferred);
  size_t budget = c->srv->cfg.chunk_bytes, total = 0;
  uint8_t *payload = malloc(budget ? budget : 1);
  if (!els || !fails || !out || !deferred || !payload) {
    free(els), free(fails), free(out), free(deferred), free(payload);
    return tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory for %zu elements", n);
  }
  for (size_t i = 0; i < n; i++) {
    bool d;
    get_element(c, q->gets[i], q->defer_large, &budget, &els[i], &d);
    deferred[i] = d && els[i].reply;
    if (els[i].reply) {
      /* within the budget (its inline_max was cut to it) */
      if (els[i].payload_len)
        memcpy(payload + total, els[i].payload, els[i].payload_len);
      total += els[i].payload_len;
      out[i] = (Tport__GetBeginReply *)els[i].reply;
    } else {
      tport__get_begin_reply__init(&fails[i]);
      fails[i].status = &els[i].st;
      out[i] = &fails[i];
    }
  }
  Tport__GetBatchReply r = TPORT__GET_BATCH_REPLY__INIT;
  r.status = wire_ok();
  r.n_gets = n;
  r.gets = out;
  r.n_deferred = q->defer_large ? n : 0;
  r.deferred = deferred;
  rc = call_reply(c, &r.base, payload, total);
  free_elements(els, n);
  free(fails);
  free(out);
  free(deferred);
  free(payload);
  return rc;
}
