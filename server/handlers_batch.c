/*
 * handlers_batch.c: PutBatch and GetBatch -- many tensors in one round trip.
 *
 * Each element is handed to the handler of the single request it stands
 * for (h_put_begin, h_get_begin) as a call of its own: the same checks, the
 * same quota and registry, nothing validated twice in two ways.  The
 * handler packs the element's reply into the batch's reply_sink (reply.c),
 * and it becomes the element's entry in the batch's reply -- its bytes
 * spliced in as packed (a repeated message field is its elements'
 * encodings one after another), never unpacked and packed again; an
 * element that fails gets its status there and leaves the others alone.  Bounds: at most
 * BATCH_MAX_ELEMENTS elements a request (past it the whole request is
 * INVALID_ARGUMENT), a put's bytes within its message (the frame's limit),
 * and a get's inline bytes within the server's chunk size (an element past
 * it is answered with a transfer, read by GetChunk as a single get's); a
 * get's element that names a slice of the client's region is written there
 * whole by h_get_begin, as a single GetBegin into a region is (no chunks
 * into a region: that is a transfer for one large tensor), up to a chunk
 * of such bytes a batch (past it deferred, or refused).
 * A get's element that a GetBegin would lend its bytes to (call_reply_lent)
 * holds them instead (a lend of the storage), and the batch's reply lends
 * the last four such payloads from there (deploy/nng 0012's segments: a
 * tail follows the body, so only a suffix); the others are copied in from
 * the storages they still hold.  Such holds are a host tensor's alone (a
 * device tensor's bytes are in a read-back block, which h_get_begin never
 * holds for a batch) and at most the reply's inline budget (a chunk) of
 * them: copying each out as soon as it could no longer be lent cost a
 * fresh buffer, page-faulted in, each time (a third of tportd's time in
 * the GetBatch of ResNet-50's 126 small tensors).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pb_fields.h"
#include "put_bulk.h"
#include "put_gather.h"
#include "batch_element.h"
#include "wire.h"

#define BATCH_MAX_ELEMENTS 4096

/* From this many bytes a PutBatch request on, its elements' bytes are
 * written with streaming stores (call.stream_writes): the client sends a
 * large batch in requests of about a MiB, so this is a request of one, and
 * what it writes is not read again while the rest of the batch goes by. */
#define BATCH_STREAM_MIN_BYTES ((size_t)512 << 10)

/* el failed with *why: its reply is a status alone, packed into own. */
static void element_failed(element *el, const tport_err *why)
{
  Tport__Status st = TPORT__STATUS__INIT;
  st.code = (Tport__Code)why->code;
  st.message = (char *)why->msg;
  /* PutBeginReply and GetBeginReply both carry it as field 1 */
  Tport__PutBeginReply r = TPORT__PUT_BEGIN_REPLY__INIT;
  r.status = &st;
  el->ok = false;
  el->packed_len = protobuf_c_message_get_packed_size(&r.base);
  el->own = malloc(el->packed_len ? el->packed_len : 1);
  if (el->own) {
    protobuf_c_message_pack(&r.base, el->own);
    el->packed = el->own;
    return;
  }
  /* out of memory: the status alone, no message (a few bytes, never an
   * empty reply, which a client would read as a success) */
  st.code = TPORT__CODE__CODE_RESOURCE_EXHAUSTED;
  st.message = (char *)"";
  el->packed_len = protobuf_c_message_get_packed_size(&r.base);
  protobuf_c_message_pack(&r.base, el->fallback); /* 4 bytes */
  el->packed = el->fallback;
}

/* Removes the element stored under handle (a batch that could not tell
 * the client so).  Until then it could be found like any other: a waiter
 * for its name may have read it, a PutChunk by name may have committed an
 * upload it began (out of memory only: the client hears of neither). */
static void unstore(const call *c, const uint8_t *handle)
{
  reg_entry *e;
  tport_err ignored;
  if (reg_find(&c->srv->reg, c->pipe, handle, REG_HANDLE_BYTES, NULL, &e, NULL, &ignored))
    return; /* gone already (freed by another of the tenant's connections),
             * or the connection is closing (its tensors go with it, but
             * for the named and kept ones, which the client never heard of) */
  reg_remove(&c->srv->reg, e);
  reg_put(&c->srv->reg, e);
}

void element_answered(call *sub, int rc, element *el)
{
  if (sub->out) /* (every reply goes to the sink) */
    nng_msg_free(sub->out);
  if (!rc && !sub->sunk && !sub->run_answered)
    rc = tport_err_set(&sub->err, TPORT_INTERNAL, "the handler gave no reply");
  if (rc) {
#ifdef TPORT_NNG_LENT_TAIL
    if (sub->lent)
      lends_end(sub->lent);
#endif
    if (sub->stored) /* told it failed: not stored */
      unstore(sub, el->handle);
    memset(el->handle, 0, sizeof el->handle);
    element_failed(el, &sub->err);
    return;
  }
  el->stored = sub->stored;
  if (sub->run_answered) { /* its handle written into el by the handler */
    el->ok = el->in_run = true;
    return;
  }
  el->ok = el->sunk = true;
  el->at = sub->sink_at;
  el->packed_len = sub->sink_packed;
  el->payload_len = sub->sink_payload;
  if (sub->lent) { /* its bytes are the storage's, held for the batch's reply */
    el->lent = sub->lent;
    el->payload = sub->lent_p;
    el->payload_len = sub->lent_n;
  }
}

/* Runs handler on element i (req, payload) as a call of its own and keeps
 * its answer in el (its reply in the sink, or its handle where it is an
 * element of run) -- unless the handler gathered it (a put from the
 * client's memory, answered by put_gather_end). */
void run_element(call *c, const batch_env *env, put_run_info *run, uint16_t method,
                        int (*handler)(call *), ProtobufCMessage *req, const uint8_t *payload,
                        size_t n, size_t i, element *el)
{
  call sub = {.srv = c->srv,
              .sink = env->sink,
              .pipe = c->pipe,
              .method = method,
              .req = req,
              .payload = payload,
              .payload_len = n,
              .arrived_ns = c->arrived_ns,
              .copy_payload = true,
              .lend_to_batch = method == TPORT__METHOD__METHOD_GET_BEGIN,
              .stream_writes = env->stream,
              .stage_ns = env->stage_ns,
              .gather = env->gather,
              .scatter = env->scatter,
              .run = run,
              .run_handle = el->handle,
              .bulk = env->bulk,
              .element = i};
  tport_err_clear(&sub.err);
  int rc = handler(&sub);
  if (!rc && sub.gathered)
    return;
  element_answered(&sub, rc, el);
}

/* An element that the bulk add refused (put_bulk_end's failed; ctx the
 * elements): answered by its status, not stored. */
static void bulk_failed(void *ctx, size_t i, const tport_err *why)
{
  element *el = &((element *)ctx)[i];
  el->in_run = el->stored = false;
  memset(el->handle, 0, sizeof el->handle);
  element_failed(el, why);
}

/* A gathered element's answer (put_gather_done_fn; ctx the elements). */
static void gathered_answered(void *ctx, size_t i, call *sub, int rc)
{
  element_answered(sub, rc, &((element *)ctx)[i]);
}

void free_elements(element *els, size_t n)
{
  for (size_t i = 0; i < n && els; i++) {
#ifdef TPORT_NNG_LENT_TAIL
    if (els[i].lent) /* copied into the reply, or the reply failed */
      lends_end(els[i].lent);
#endif
    free(els[i].own);
  }
  free(els);
}

/* How many of the last elements with a payload lend it to the batch's
 * reply (a suffix of at most LENDS_SEGMENTS, each held by a lend: the
 * payload trailer keeps the elements' order, and a tail comes after the
 * body); their first is *from. */
static int lent_suffix(const element *els, size_t n, size_t *from)
{
  int k = 0;
  *from = n;
#ifdef TPORT_NNG_LENT_TAIL
  for (size_t i = n; i-- > 0 && k < LENDS_SEGMENTS;) {
    if (!els[i].payload_len)
      continue; /* no bytes: in no one's way */
    if (!els[i].lent)
      break;
    k++;
    *from = i;
  }
#else
  (void)els;
#endif
  return k;
}

/* The bytes of PutRunReply's fields (put_runs.h) for els[0..k), the run's
 * elements. */
static size_t run_reply_size(const put_run_info *ri, const element *els, size_t k)
{
  size_t replied = 0, n = pb_field_size(1, k * REG_HANDLE_BYTES);
  for (size_t i = 0; i < k; i++)
    if (!els[i].in_run) {
      replied += pb_varint_size(i);
      n += pb_field_size(4, els[i].packed_len);
    }
  n += ri->set ? pb_field_size(2, ri->packed_len) : 0;
  return n + (replied ? pb_field_size(3, replied) : 0);
}

/* Writes them at p; returns where they end. */
static uint8_t *run_reply_write(const put_run_info *ri, const element *els, size_t k, uint8_t *p)
{
  size_t replied = 0;
  p = pb_put_field_head(p, 1, k * REG_HANDLE_BYTES);
  for (size_t i = 0; i < k; i++, p += REG_HANDLE_BYTES) {
    if (els[i].in_run)
      memcpy(p, els[i].handle, REG_HANDLE_BYTES);
    else /* answered by a reply of its own */
      memset(p, 0, REG_HANDLE_BYTES);
    replied += els[i].in_run ? 0 : pb_varint_size(i);
  }
  if (ri->set) {
    p = pb_put_field_head(p, 2, ri->packed_len);
    memcpy(p, ri->packed, ri->packed_len);
    p += ri->packed_len;
  }
  if (replied) {
    p = pb_put_field_head(p, 3, replied);
    for (size_t i = 0; i < k; i++)
      if (!els[i].in_run)
        p = pb_put_varint(p, i);
  }
  for (size_t i = 0; i < k; i++)
    if (!els[i].in_run) {
      p = pb_put_field_head(p, 4, els[i].packed_len);
      if (els[i].packed_len)
        memcpy(p, els[i].packed, els[i].packed_len);
      p += els[i].packed_len;
    }
  return p;
}

/* Run r's elements in b: els[*at ..), how many (*at moved past them). */
static size_t run_elements(const batch_puts *b, size_t r, size_t *at)
{
  size_t k = 0;
  while (*at + k < b->n && b->run[*at + k] == r + 1)
    k++;
  *at += k;
  return k;
}

/* The bytes of the runs' answers of b's elements (els[b->nputs ..)),
 * PutBatchReply's field 3 each. */
static size_t runs_reply_size(const batch_puts *b, const element *els)
{
  size_t n = 0, at = b ? b->nputs : 0;
  for (size_t r = 0; b && r < b->nruns; r++) {
    size_t from = at, k = run_elements(b, r, &at);
    n += pb_field_size(3, run_reply_size(&b->runs[r], els + from, k));
  }
  return n;
}

static uint8_t *runs_reply_write(const batch_puts *b, const element *els, uint8_t *p)
{
  size_t at = b->nputs;
  for (size_t r = 0; r < b->nruns; r++) {
    size_t from = at, k = run_elements(b, r, &at);
    p = pb_put_field_head(p, 3, run_reply_size(&b->runs[r], els + from, k));
    p = run_reply_write(&b->runs[r], els + from, k, p);
  }
  return p;
}

/* The batch's reply: head (its status and other fields, packed by
 * protobuf-c), then each element's packed reply as repeated field `field`
 * -- but a put batch's runs' elements (b, els[b->nputs ..)), each run's
 * answer in field 3; its payload trailer the elements' payloads one after
 * another. */
int batch_reply(call *c, const ProtobufCMessage *head, uint32_t field, element *els,
                       size_t n, const reply_sink *sink, const batch_puts *b)
{
  for (size_t i = 0; i < n; i++)
    if (els[i].sunk) { /* the sink has its final place now */
      els[i].packed = sink->buf + els[i].at;
      if (!els[i].lent)
        els[i].payload = sink->buf + els[i].at + els[i].packed_len;
    }
  size_t msg_len = protobuf_c_message_get_packed_size(head), payload_len = 0, from;
  size_t key = pb_varint_size((uint64_t)field << 3 | 2), singles = b ? b->nputs : n;
  int nlent = lent_suffix(els, n, &from);
  msg_len += runs_reply_size(b, els);
  for (size_t i = 0; i < n; i++) {
    if (i < singles)
      msg_len += key + pb_varint_size(els[i].packed_len) + els[i].packed_len;
    if (i < from || !els[i].lent)
      payload_len += els[i].payload_len; /* copied: within a chunk (the gets' budget) */
  }
  if (msg_len > FRAME_MAX_MESSAGE_BYTES)
    return tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED,
                         "the batch's reply would be %zu bytes: at most %u", msg_len,
                         FRAME_MAX_MESSAGE_BYTES);
  nng_msg *m;
  if ((server_test_reply_fails && server_test_reply_fails(c->method, false)) ||
      nng_msg_alloc(&m, FRAME_HEADER_BYTES + msg_len + payload_len) != 0)
    return tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory for a %zu-byte reply",
                         msg_len + payload_len);
  uint8_t *body = nng_msg_body(m);
  frame_write_header(body, c->method, FRAME_FLAG_REPLY, msg_len);
  uint8_t *p = body + FRAME_HEADER_BYTES;
  p += protobuf_c_message_pack(head, p);
  for (size_t i = 0; i < singles; i++) {
    p = pb_put_field_head(p, field, els[i].packed_len);
    if (els[i].packed_len)
      memcpy(p, els[i].packed, els[i].packed_len);
    p += els[i].packed_len;
  }
  if (b)
    p = runs_reply_write(b, els, p);
  for (size_t i = 0; i < from; i++) {
    if (els[i].payload_len)
      memcpy(p, els[i].payload, els[i].payload_len);
    p += els[i].payload_len;
  }
#ifdef TPORT_NNG_LENT_TAIL
  if (nlent) {
    /* the rest lent from their storages, in order, held till nng is done */
    void *lent[LENDS_SEGMENTS];
    const void *ps[LENDS_SEGMENTS];
    size_t ns[LENDS_SEGMENTS], bytes = 0;
    int k = 0;
    for (size_t i = from; i < n; i++) {
      if (!els[i].payload_len)
        continue;
      lent[k] = els[i].lent;
      ps[k] = els[i].payload;
      ns[k++] = els[i].payload_len;
      bytes += els[i].payload_len;
      els[i].lent = NULL; /* the reply's now */
    }
    if (!lends_attach_begun(m, lent, ps, ns, k)) {
      nng_msg_free(m);
      return tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory for a reply");
    }
    atomic_fetch_add(&c->srv->bytes_out, bytes); /* not in the message's own bytes */
    atomic_fetch_add(&c->srv->bytes_lent, bytes);
  }
#else
  (void)nlent;
#endif
  c->out = m;
  return TPORT_OK;
}

/* An element refused before its handler ran. */
void refuse_element(element *el, int code, const char *why)
{
  tport_err err;
  tport_err_set(&err, code, "%s", why);
  element_failed(el, &err);
}

int check_count(call *c, size_t n)
{
  if (n > BATCH_MAX_ELEMENTS)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "a batch of %zu elements: at most %d in one request", n,
                         BATCH_MAX_ELEMENTS);
  return TPORT_OK;
}

/* Whether q names a slice of the connection's process region: a put
 * gathered, or refused (h_put_begin's test). */
static bool names_process(call *c, const Tport__PutBeginRequest *q)
{
  return q->commit && q->shm && shm_is_process(c->srv->shm, c->pipe, q->shm->region);
}

_Static_assert(BATCH_MAX_ELEMENTS <= SHM_PROCESS_READ_SEGS,
               "a batch's puts from the client's memory are one read");

/* Whether b's elements carry BATCH_STREAM_MIN_BYTES to copy (in the
 * payload or in slices of a region; the client's lengths, capped). */
static bool streams(const call *c, const batch_puts *b)
{
  size_t bytes = c->payload_len;
  for (size_t i = 0; i < b->n && bytes < BATCH_STREAM_MIN_BYTES; i++)
    if (b->req[i]->shm)
      bytes += b->req[i]->shm->length < BATCH_STREAM_MIN_BYTES ? (size_t)b->req[i]->shm->length
                                                               : BATCH_STREAM_MIN_BYTES;
  return bytes >= BATCH_STREAM_MIN_BYTES;
}

int h_put_batch(call *c)
{
  Tport__PutBatchRequest *q = (Tport__PutBatchRequest *)c->req;
  batch_puts b;
  int rc = batch_puts_expand(c, q, BATCH_MAX_ELEMENTS, &b);
  if (rc)
    return rc;
  size_t n = b.n;
  element *els = calloc(n ? n : 1, sizeof *els);
  if (!els) {
    batch_puts_free(&b);
    return tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory for %zu elements", n);
  }
  reply_sink sink = {0};
  put_gather gather;
  put_gather_init(&gather, shm_process_read_max(c->srv->cfg.chunk_bytes), q->fence_addr,
                  q->fence_token);
  call at_end = *c; /* where the gathered puts are read and answered */
  at_end.sink = &sink;
  int64_t stage_ns[METRICS_STAGES] = {0};
  put_bulk bulk;
  batch_env env = {.sink = &sink,
                   .gather = &gather,
                   .bulk = put_bulk_init(&bulk, b.n - b.nputs) ? &bulk : NULL,
                   .stream = streams(c, &b),
                   .stage_ns = stage_ns};
  if (c->payload_len)
    metrics_stage_since(&c->srv->metrics, STAGE_RECEIVE, c->arrived_ns);
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    size_t len = (size_t)b.len[i];
    /* the puts from the client's memory before stored first: the batch's
     * elements take their names in order (no lookup while none is
     * gathered: a batch of payloads pays nothing for it) */
    if (gather.n && !names_process(c, b.req[i]))
      put_gather_flush(&at_end, &gather, gathered_answered, els);
    /* without commit an upload begins (its chunks follow by PutChunk):
     * h_put_begin refuses such an element that carries bytes */
    gather.el = i;
    run_element(c, &env, b.run[i] ? &b.runs[b.run[i] - 1] : NULL, TPORT__METHOD__METHOD_PUT_BEGIN,
                h_put_begin, (ProtobufCMessage *)&b.req[i]->base,
                c->payload ? c->payload + off : NULL, len, i, &els[i]);
    off += len;
  }
  /* the puts from the client's memory: one read for all, then answered */
  put_gather_end(&at_end, &gather, gathered_answered, els);
  if (env.bulk)
    put_bulk_end(c, env.bulk, bulk_failed, els);
  for (int st = 0; st < METRICS_STAGES; st++)
    if (stage_ns[st])
      metrics_observe(&c->srv->metrics.stage[st], stage_ns[st]);
  Tport__PutBatchReply r = TPORT__PUT_BATCH_REPLY__INIT;
  r.status = wire_ok();
  rc = batch_reply(c, &r.base, 2 /* puts */, els, n, &sink, &b);
  /* the client is told the whole batch failed: nothing of it stays (a
   * replaced name's former tensor, gone at the swap, is not brought back) */
  for (size_t i = 0; rc && i < n; i++)
    if (els[i].stored)
      unstore(c, els[i].handle);
  if (env.bulk)
    put_bulk_free(&c->srv->reg, env.bulk);
  free_elements(els, n);
  free(sink.buf);
  batch_puts_free(&b);
  return rc;
}
