/*
 * handlers_batch_get.c: GetBatch (handlers_batch.c has the rules a batch
 * keeps): each element a GetBegin of its own, inline within the reply's
 * budget, into the region slice it names within a chunk of such bytes a
 * request, into the caller's buffer it offers within one write's bytes a
 * request (get_scatter.h), a larger one deferred where asked.
 */
#include <stdlib.h>

#include "batch_element.h"
#include "get_direct.h"
#include "get_scatter.h"
#include "wire.h"

/* A deferred element's reply: the tensor's info and size, no bytes, no
 * transfer -- packed now, so that it owns what it says (the tensor may be
 * freed before the batch's reply is made). */
static int defer_element(call *c, reg_entry *e, tport_tensor *t, element *el)
{
  wire_info wi;
  wire_fill_info(&wi, e, t);
  Tport__GetBeginReply r = TPORT__GET_BEGIN_REPLY__INIT;
  r.status = wire_ok();
  r.info = &wi.info;
  r.nbytes = tensor_nbytes(t);
  r.chunk_bytes = c->srv->cfg.chunk_bytes;
  el->packed_len = protobuf_c_message_get_packed_size(&r.base);
  el->own = malloc(el->packed_len ? el->packed_len : 1);
  if (!el->own)
    return tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  protobuf_c_message_pack(&r.base, el->own);
  el->packed = el->own;
  el->ok = true;
  return TPORT_OK;
}

/* What a GetBatch's elements spend: the reply's inline bytes (budget),
 * the bytes written into region slices (region_left, a chunk a request)
 * and into the caller's memory (direct_left: as many as one write of it
 * takes, shm_process_read_max -- what one PutBatch may read of it), and
 * the time its direct writes may start in (until direct_until, and only
 * while none failed). */
typedef struct get_spend {
  size_t budget, region_left, direct_left;
  int64_t direct_until;
  bool direct_ok;
} get_spend;

_Atomic int64_t get_batch_direct_ms = GET_BATCH_DIRECT_MS;
void (*get_batch_test_looked)(size_t element);

/* An element too large for its room (the reply's: inline_max and the
 * budget; a region slice's: its length, within what is left of the
 * batch's bytes for slices; the caller's buffer's, where the tensor is one
 * to write there (*direct): its length, within what is left of the
 * batch's bytes for that -- none for a tensor to write there past those
 * bytes, which a later request writes) or, but for one written into the
 * caller's buffer, than a chunk: answered by defer_element with
 * defer_large (*deferred), refused without it where it names a slice (a
 * batch copies at most a chunk into regions, as into its reply).  *n: the
 * tensor's bytes.  Returns whether the element is answered. */
static bool answer_large(call *c, const Tport__GetBeginRequest *g, size_t room, bool defer,
                         const get_spend *sp, element *el, bool *deferred, size_t *n, bool *direct)
{
  reg_entry *e;
  tport_tensor *t;
  call look = {.srv = c->srv, .pipe = c->pipe, .method = TPORT__METHOD__METHOD_GET_BEGIN};
  tport_err_clear(&look.err);
  if (wire_find(&look, g->ref, "ref", &e, &t)) {
    refuse_element(el, look.err.code, look.err.msg);
    *deferred = true; /* answered: not found, or still uploading */
    return true;
  }
  *n = tensor_nbytes(t);
  size_t direct_room =
      g->direct_length < sp->direct_left ? (size_t)g->direct_length : sp->direct_left;
  /* (one write job: its start is the last a request may begin) */
  bool can = g->direct_region && sp->direct_ok && mono_ms() < sp->direct_until &&
             *n <= SHM_PROCESS_READ_SPAN && get_direct_fits(c, g, t, *n);
  *direct = can && *n <= direct_room;
  if (*direct)
    room = direct_room;
  else if (can && defer)
    room = 0; /* no room left for it: deferred, for a request that writes it */
  bool answered = false;
  if (*n > room || (!*direct && *n > c->srv->cfg.chunk_bytes)) {
    if (defer) {
      if (defer_element(&look, e, t, el))
        refuse_element(el, look.err.code, look.err.msg);
      *deferred = answered = true;
    } else if (g->shm) {
      char why[160];
      snprintf(why, sizeof why,
               "the tensor holds %zu bytes: its slice %llu, the batch's room for regions %zu", *n,
               (unsigned long long)g->shm->length, room);
      refuse_element(el, TPORT_OUT_OF_RANGE, why);
      answered = true;
    }
  }
  reg_put(&c->srv->reg, e);
  return answered;
}

/* A GetBatch being answered: its request, spend, elements and sink, the
 * direct gets held for one write (get_scatter.h) and the call they are
 * written and answered on. */
typedef struct get_batch {
  call *c, at_end;
  const Tport__GetBatchRequest *q;
  get_spend sp;
  element *els;
  protobuf_c_boolean *deferred; /* an element answered deferred (if it is ok) */
  reply_sink sink;
  get_scatter scatter;
} get_batch;

static void get_element(get_batch *b, size_t i);

/* Element i run as a GetBegin of its own (one), its inline bytes within
 * the reply's budget; held for the batch's write where h_get_begin writes
 * it directly (held). */
static void run_get(get_batch *b, size_t i, Tport__GetBeginRequest *one, bool *held)
{
  get_spend *sp = &b->sp;
  if (one->inline_max > sp->budget)
    one->inline_max = sp->budget;
  batch_env env = {.sink = &b->sink, .scatter = one->direct_region ? &b->scatter : NULL};
  size_t before = b->scatter.n;
  b->scatter.el = i;
  run_element(b->c, &env, NULL, TPORT__METHOD__METHOD_GET_BEGIN, h_get_begin, &one->base, NULL, 0,
              0, &b->els[i]);
  *held = b->scatter.n > before;
  sp->budget -= b->els[i].payload_len <= sp->budget ? b->els[i].payload_len : sp->budget;
}

/* A held element answered by the batch's write (get_scatter_done_fn) --
 * or, no slot free (nothing written), run again as if it had not asked,
 * with the request's direct writes off: inline within what is left of the
 * budget, deferred, refused or given a transfer as get_element says. */
static void scattered_answered(void *ctx, size_t i, call *sub, int rc, bool other)
{
  get_batch *b = ctx;
  if (!other) {
    element_answered(sub, rc, &b->els[i]);
    return;
  }
  b->sp.direct_ok = false;
  get_element(b, i);
}

/* The held elements written and answered: after a failure the request's
 * others go the other way. */
static void write_held(get_batch *b)
{
  if (!get_scatter_flush(&b->at_end, &b->scatter, scattered_answered, b))
    b->sp.direct_ok = false;
}

/* One GetBatch element (i): as a GetBegin of its own, inline only while
 * the reply's inline bytes stay within the budget, or written into the
 * region slice it names while the batch's bytes for slices stay within
 * region_left, or into the caller's buffer it offers (get_direct.h, with
 * the request's others: get_scatter.h) while those stay within
 * direct_left (spending them); a large one deferred (*deferred) where
 * the request asks.  Once a direct write failed, or past
 * get_batch_direct_ms, the request's others go the other way (and the
 * element whose write failed is looked at again so). */
static void answer_element(get_batch *b, size_t i, bool *deferred)
{
  const Tport__GetBeginRequest *g = b->q->gets[i];
  bool defer = b->q->defer_large;
  get_spend *sp = &b->sp;
  element *el = &b->els[i];
  *deferred = false;
  if (g->shm && g->shm_chunks) { /* a transfer of its own, for one large tensor */
    refuse_element(el, TPORT_INVALID_ARGUMENT,
                   "a batch's gets are not read into a region a chunk at a time (shm_chunks)");
    return;
  }
  if (g->wait_ms) { /* an element is no context of its own: it cannot park */
    refuse_element(el, TPORT_INVALID_ARGUMENT, "a batch's gets wait for no name (wait_ms)");
    return;
  }
  size_t room = g->inline_max < sp->budget ? (size_t)g->inline_max : sp->budget, n = 0;
  if (g->shm) /* (the slice is checked against the region by the get itself) */
    room = g->shm->length < sp->region_left ? (size_t)g->shm->length : sp->region_left;
  bool direct = false;
  if ((defer || g->shm || g->direct_region) &&
      answer_large(b->c, g, room, defer, sp, el, deferred, &n, &direct))
    return;
  if (direct && !get_scatter_room(&b->scatter, g->direct_region, n)) {
    write_held(b); /* a write's bytes at most, of one region */
    if (!(sp->direct_ok && mono_ms() < sp->direct_until)) {
      answer_element(b, i, deferred); /* looked at again, direct writes off */
      return;
    }
  }
  if (get_batch_test_looked)
    get_batch_test_looked(i);
  /* the tensor it looked at, not a larger one that replaced its name
   * meanwhile: that one too large for its slice or the caller's buffer */
  Tport__GetBeginRequest one = *g;
  one.direct_region = direct ? g->direct_region : 0;
  one.direct_length = n;
  Tport__ShmSlice slice;
  if (g->shm && g->shm->length > n) {
    slice = *g->shm;
    slice.length = n ? n : 1; /* (an empty tensor's: a byte, which nothing is written to) */
    one.shm = &slice;
  }
  bool held;
  run_get(b, i, &one, &held);
  if (direct && !held && !el->ok)
    sp->direct_ok = false;
  if (direct)
    sp->direct_left -= n <= sp->direct_left ? n : sp->direct_left;
  else if (g->shm)
    sp->region_left -= n <= sp->region_left ? n : sp->region_left;
}

/* answer_element, its deferred flag kept in b->deferred */
static void get_element(get_batch *b, size_t i)
{
  bool d;
  answer_element(b, i, &d);
  b->deferred[i] = d;
}

int h_get_batch(call *c)
{
  Tport__GetBatchRequest *q = (Tport__GetBatchRequest *)c->req;
  size_t n = q->n_gets;
  int rc = check_count(c, n);
  if (rc)
    return rc;
  get_batch b = {.c = c,
                 .at_end = *c,
                 .q = q,
                 .sp = {.budget = c->srv->cfg.chunk_bytes,
                        .region_left = c->srv->cfg.chunk_bytes,
                        .direct_left = shm_process_read_max(c->srv->cfg.chunk_bytes),
                        .direct_until = mono_ms() + get_batch_direct_ms,
                        .direct_ok = true},
                 .els = calloc(n ? n : 1, sizeof(element))};
  b.at_end.sink = &b.sink; /* where the held gets are written and answered */
  protobuf_c_boolean *deferred = b.deferred = calloc(n ? n : 1, sizeof *deferred);
  if (!b.els || !deferred) {
    free(b.els), free(deferred);
    return tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory for %zu elements", n);
  }
  for (size_t i = 0; i < n; i++)
    get_element(&b, i);
  get_scatter_end(&b.at_end, &b.scatter, scattered_answered, &b);
  for (size_t i = 0; i < n; i++)
    deferred[i] = deferred[i] && b.els[i].ok;
  Tport__GetBatchReply r = TPORT__GET_BATCH_REPLY__INIT;
  r.status = wire_ok();
  r.n_deferred = q->defer_large ? n : 0;
  r.deferred = deferred;
  rc = batch_reply(c, &r.base, 2 /* gets */, b.els, n, &b.sink, NULL);
  free_elements(b.els, n);
  free(deferred);
  free(b.sink.buf);
  return rc;
}
