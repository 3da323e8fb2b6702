/*
 * batch_get_deferred.c: the elements of a get batch that its GetBatch
 * deferred (batch.h), all in one window.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch_get_deferred.h"
#include "copy_pool.h"
#include "copy_stream.h"
#include "get_blocks.h"

/* The deferred elements, all in one window (batch_get_plan.c plans it).
 * Those of up to a chunk go in GetBatches of up to GET_GROUP, each inline
 * in the reply (tportd lends their bytes from the tensors into it); a
 * larger one (no region: else it went by path.c) is answered by a GetBegin
 * with a transfer, whose GetChunks follow in the same window once that
 * reply is in, so that the window never drains between elements (as a get
 * of its own each, the five 8-9 MB tensors of ResNet-50 cost a GetBegin
 * round trip and a drained window apiece; a GetBegin for each of its 37
 * tensors of 256 KiB to 4 MiB was a request each).  An element the server
 * defers again or answers otherwise than its GetBatch did (a name replaced
 * meanwhile), or whose chunks are smaller than the client's, goes as a get
 * of its own after the window.  On the same host the groups' tensors are
 * written by the server into slots of the automatic region instead
 * (batch_region.h), one slot a GetBatch in flight, and copied out here:
 * one copy on each side, where the socket took three (through the kernel
 * twice, out of the reply) -- the single get of the same bytes went that
 * way already.  And a caller's buffer of a quarter MiB or more is offered
 * to the server, which writes a cpu tensor there itself (process_region.c):
 * as many such bytes a GetBatch as it writes at once, and one larger than
 * that by a GetBegin of its own in the window; one the server would not
 * write so (a device's tensor) comes in a second window, into the slots. */

static client_get_desc desc_of(const deferred_gets *d, tport_get_item *it)
{
  return (client_get_desc){.ref = &it->ref,
                           .buf = it->buf,
                           .cap = it->cap,
                           .alloc = it->buf == NULL,
                           .alloc_blocks = d->blocks,
                           .out_total = d->total,
                           .cancel = d->cancel};
}

static void drop_buffer(const deferred_gets *d, dget *e)
{
  if (e->alloced && d->blocks)
    get_block_free(e->buf);
  else if (e->alloced)
    free(e->buf);
  e->buf = NULL;
  e->alloced = false;
}

/* Group g's GetBatch: its elements' GetBegins, each inline -- or, with a
 * slot of the region free, each into its slice of the slot. */
static int group_make(deferred_gets *d, size_t g, nng_msg **out, tport_err *err)
{
  size_t first = d->gstart[g], k = d->gstart[g + 1] - first;
  Tport__Ref *refs = malloc(k * sizeof *refs);
  Tport__ShmSlice *slices = malloc(k * sizeof *slices);
  Tport__GetBeginRequest *qs = malloc(k * sizeof *qs), **qp = malloc(k * sizeof *qp);
  if (!refs || !slices || !qs || !qp) {
    free(refs), free(slices), free(qs), free(qp);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  }
  bool sliced = false; /* (those written into the caller's buffers need none) */
  for (size_t j = 0; j < k; j++)
    sliced |= !d->el[d->small[first + j]].direct;
  size_t slot = d->slot[g] = sliced ? batch_region_take(d->c, &d->region) : BATCH_NO_SLOT;
  size_t at = slot == BATCH_NO_SLOT ? 0 : slot * d->region.slot_bytes;
  for (size_t j = 0; j < k; j++) {
    dget *e = &d->el[d->small[first + j]];
    tport_get_item *it = &d->items[e->item];
    client_ref_to_wire(&it->ref, &refs[j]);
    tport__get_begin_request__init(&qs[j]);
    qs[j].ref = &refs[j];
    qs[j].inline_max = d->c->chunk_bytes;
    qs[j].want_crc32c = d->c->verify;
    /* a caller's buffer of a quarter MiB or more: offered to the server,
     * which writes a cpu tensor there itself (else the slot, or inline) */
    client_get_desc gd = desc_of(d, it);
    gd.direct_region = e->direct_region;
    client_get_direct_fill(&gd, &qs[j]);
    if (slot != BATCH_NO_SLOT && !e->direct) { /* the slot: the others' planned bytes */
      e->sliced = true;
      e->shm_at = at;
      slices[j] = client_slice(d->region.r, at, e->planned);
      qs[j].shm = &slices[j];
      at += e->planned;
    }
    qp[j] = &qs[j];
  }
  deferred_group_buffers(d, g); /* (those it makes: the reply's end read into them) */
  Tport__GetBatchRequest q = TPORT__GET_BATCH_REQUEST__INIT;
  q.n_gets = k;
  q.gets = qp;
  q.defer_large = true; /* one grown since: deferred again, read on its own */
  int rc = client_pack(TPORT__METHOD__METHOD_GET_BATCH, &q.base, NULL, 0, out, err);
  if (rc) { /* never sent */
    batch_region_give(&d->region, slot);
    d->slot[g] = BATCH_NO_SLOT;
  }
  free(refs), free(slices), free(qs), free(qp);
  return rc;
}

/* Element e (its item it), answered by b with its tensor written into its
 * slice of the region (in a slot of group g): copied out into its
 * destination. */
static void take_from_region(deferred_gets *d, size_t g, dget *e, tport_get_item *it,
                             const Tport__GetBeginReply *b)
{
  if (!e->sliced) { /* a hostile or broken server */
    tport_err_set(&it->err, TPORT_DATA_LOSS,
                  "the server says it wrote the tensor into a region, but none was offered");
    return;
  }
  if (client_shm_check_get(d->c, b, d->region.r, e->shm_at, e->planned, &it->err))
    return;
  size_t n = (size_t)b->nbytes;
  client_get_desc gd = desc_of(d, it);
  uint8_t *buf = it->buf;
  if (client_get_destination(d->c, &gd, b, n, d->c->chunk_bytes, &buf, NULL, &it->err))
    return;
  copy_pool_copy_out(buf, d->region.r->data + e->shm_at, n, d->total); /* threads from 4 MiB */
  client_info_from_wire(b->info, &it->info);
  it->data = buf;
  it->nbytes = n;
}

/* Element e (its item it), answered by b with its tensor written by the
 * server into the caller's buffer it offered. */
static void take_direct(deferred_gets *d, dget *e, tport_get_item *it,
                        const Tport__GetBeginReply *b)
{
  size_t n = (size_t)b->nbytes;
  if (!e->direct || b->nbytes > it->cap) { /* a hostile or broken server */
    tport_err_set(&it->err, TPORT_DATA_LOSS,
                  "the server says it wrote %llu bytes into this process's buffer, which it "
                  "was not offered",
                  (unsigned long long)b->nbytes);
    return;
  }
  if (d->c->verify && !b->crc32c_set) {
    tport_err_set(&it->err, TPORT_DATA_LOSS, "the get came without a CRC32C");
    return;
  }
  if (client_check_crc32c(d->c->verify, true, b->crc32c, it->buf, n, 0, &it->err))
    return;
  client_info_from_wire(b->info, &it->info);
  it->data = it->buf;
  it->nbytes = n;
}

/* Group g answered: each element's bytes from the reply's payload, in
 * order (its last ones' in their buffers already, where they were read
 * into: s->placed); one the server deferred again (grown since) goes on
 * its own. */
static void group_take(deferred_gets *d, client_slot *s, size_t g)
{
  size_t first = d->gstart[g], k = d->gstart[g + 1] - first, at = 0;
  Tport__GetBatchReply *r;
  client_payload p = {0};
  tport_err ge;
  int rc = client_unpack(TPORT__METHOD__METHOD_GET_BATCH, s->reply,
                         &tport__get_batch_reply__descriptor, (ProtobufCMessage **)&r, &p, &ge);
  if (!rc && s->placed && !deferred_group_as_placed(d, g, r, &p, s->ntail)) {
    /* not the reply planned: its end back in it, taken as it came */
    protobuf_c_message_free_unpacked(&r->base, NULL);
    rc = client_slot_unplace(s, &ge);
    if (!rc)
      rc = client_unpack(TPORT__METHOD__METHOD_GET_BATCH, s->reply,
                         &tport__get_batch_reply__descriptor, (ProtobufCMessage **)&r, &p, &ge);
  }
  size_t placed_from = s->placed ? k - s->ntail : k;
  /* answered: the server has written what it writes into the slot */
  if (!rc && (r->n_gets != k || (r->n_deferred != 0 && r->n_deferred != k))) {
    rc = tport_err_set(&ge, TPORT_DATA_LOSS, "the server answered %zu of %zu elements", r->n_gets,
                       k);
    protobuf_c_message_free_unpacked(&r->base, NULL);
  }
  for (size_t j = 0; j < k; j++) {
    dget *e = &d->el[d->small[first + j]];
    tport_get_item *it = &d->items[e->item];
    e->state = DG_DONE;
    tport_err_clear(&it->err);
    if (rc) {
      it->err = ge;
      continue;
    }
    const Tport__GetBeginReply *b = r->gets[j];
    if (batch_element_status(b->status, &it->err) == TPORT_OUT_OF_RANGE && e->sliced) {
      /* its slice too small: the tensor grew (a name replaced) after the
       * server deferred it -- on its own after the window, which fails
       * again, saying why, if anything else was wrong */
      tport_err_clear(&it->err);
      e->state = DG_REDO;
      continue;
    }
    if (it->err.code != TPORT_OK)
      continue;
    size_t n = (size_t)b->nbytes;
    if ((r->n_deferred && r->deferred[j]) || b->transfer.len) {
      e->state = DG_REDO;
      /* offered a direct write that the server would not make (a
       * device's tensor, one not contiguous): in a second window, with
       * the others like it, into slices of the region or inline */
      if (e->direct && !b->transfer.len && n <= d->c->chunk_bytes)
        e->again = n;
      continue;
    }
    if (b->direct) {
      take_direct(d, e, it, b);
      continue;
    }
    if (b->shm) {
      take_from_region(d, g, e, it, b);
      continue;
    }
    if (j >= placed_from) {
      deferred_take_placed(d, e, it, b);
      continue;
    }
    if (n > p.len - at) {
      tport_err_set(&it->err, TPORT_DATA_LOSS,
                    "the batch's reply carries %zu bytes past offset %zu: this element needs %zu",
                    p.len - at, at, n);
      at = p.len;
      continue;
    }
    client_payload inl = {.data = p.data + at, .len = n};
    at += n;
    client_get_desc gd = desc_of(d, it);
    void *alloced = NULL;
    if (client_socket_get_rest(d->c, &gd, b, &inl, NULL, &alloced, &it->nbytes, &it->info,
                               &it->err) == TPORT_OK)
      it->data = it->buf ? it->buf : alloced;
  }
  if (!rc)
    protobuf_c_message_free_unpacked(&r->base, NULL);
  batch_region_give(&d->region, d->slot[g]); /* copied out: free again */
  d->slot[g] = BATCH_NO_SLOT;
}

static int deferred_make(void *ctx, size_t u, size_t one, nng_msg **out, tport_err *err)
{

  (void)one;
  deferred_gets *d = ctx;
  if (d->unit_kind[u] == DU_GROUP)
    return group_make(d, d->unit_el[u], out, err);
  dget *e = &d->el[d->unit_el[u]];
  if (d->unit_kind[u] == DU_BEGIN) {
    Tport__Ref w;
    client_ref_to_wire(&d->items[e->item].ref, &w);
    Tport__GetBeginRequest q = TPORT__GET_BEGIN_REQUEST__INIT;
    q.ref = &w;
    q.inline_max = d->c->chunk_bytes;
    q.want_crc32c = d->c->verify;
    client_get_desc gd = desc_of(d, &d->items[e->item]);
    gd.direct_region = e->direct_region; /* (0: not offered) */
    client_get_direct_fill(&gd, &q);
    return client_pack(TPORT__METHOD__METHOD_GET_BEGIN, &q.base, NULL, 0, out, err);
  }
  if (e->state != DG_READING) {
    *out = NULL; /* nothing more of it is read */
    return TPORT_OK;
  }
  size_t chunk = d->c->chunk_bytes, off = (u - e->first_chunk) * chunk;
  Tport__GetChunkRequest q = TPORT__GET_CHUNK_REQUEST__INIT;
  q.transfer = e->transfer;
  q.offset = off;
  q.length = e->planned - off < chunk ? e->planned - off : chunk;
  q.want_crc32c = d->c->verify;
  return client_pack(TPORT__METHOD__METHOD_GET_CHUNK, &q.base, NULL, 0, out, err);
}

/* A large element's GetBegin answered with b: its destination, its
 * transfer kept for its chunks. */
static void begin_reading(deferred_gets *d, dget *e, const Tport__GetBeginReply *b)
{
  tport_get_item *it = &d->items[e->item];
  bool as_planned = b->transfer.len && !b->shm && b->nbytes == e->planned &&
                    (!b->chunk_bytes || b->chunk_bytes >= d->c->chunk_bytes);
  if (!as_planned) {
    e->state = DG_REDO; /* its transfer is left to expire */
    return;
  }
  client_get_desc g = desc_of(d, it);
  e->buf = it->buf; /* the caller's, unless one is made (g.alloc) */
  if (client_get_destination(d->c, &g, b, e->planned, d->c->chunk_bytes, &e->buf, NULL, &it->err) !=
      TPORT_OK) {
    e->state = DG_DONE; /* no room for it: this element's error */
    return;
  }
  e->alloced = g.alloc;
  e->transfer.data = malloc(b->transfer.len);
  if (!e->transfer.data) {
    tport_err_set(&it->err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
    drop_buffer(d, e);
    e->state = DG_DONE;
    return;
  }
  memcpy(e->transfer.data, b->transfer.data, b->transfer.len);
  e->transfer.len = b->transfer.len;
  client_info_from_wire(b->info, &it->info);
  e->state = DG_READING;
}

/* A large element's GetBegin answered. */
static void begin_take(deferred_gets *d, client_slot *s, dget *e)
{
  tport_get_item *it = &d->items[e->item];
  Tport__GetBeginReply *b;
  e->state = DG_DONE;
  tport_err_clear(&it->err);
  int rc =
      client_unpack(TPORT__METHOD__METHOD_GET_BEGIN, s->reply, &tport__get_begin_reply__descriptor,
                    (ProtobufCMessage **)&b, NULL, &it->err);
  if (rc == TPORT_RESOURCE_EXHAUSTED) {
    /* the connection's gets in progress (a server whose --max-transfers
     * is below its window), or room for one: alone, after the window */
    e->state = DG_REDO;
    tport_err_clear(&it->err);
  }
  if (rc)
    return; /* else this element's error */
  if (b->direct) {
    take_direct(d, e, it, b);
  } else if (e->direct_region && b->transfer.len) {
    /* not written directly (no slot was free): its transfer is read after
     * the window, by this reply (no chunks were planned), not left open */
    e->state = DG_REDO;
    e->late = b;
    return;
  } else if (e->direct_region) {
    e->state = DG_REDO; /* answered some other way */
  } else {
    begin_reading(d, e, b);
  }
  protobuf_c_message_free_unpacked(&b->base, NULL);
}

static void chunk_take(deferred_gets *d, client_slot *s, dget *e)
{
  tport_get_item *it = &d->items[e->item];
  ProtobufCMessage *r;
  client_payload p = {0};
  if (client_unpack(TPORT__METHOD__METHOD_GET_CHUNK, s->reply, &tport__get_chunk_reply__descriptor,
                    &r, &p, &it->err) != TPORT_OK) {
    e->state = DG_FAILED;
    return;
  }
  Tport__GetChunkReply *gr = (Tport__GetChunkReply *)r;
  size_t off, len;
  deferred_chunk_of(d, s->offset, &off, &len);
  /* read into the buffer by nng (deferred_into): the whole chunk there */
  const uint8_t *bytes = s->placed ? e->buf + off : p.data;
  size_t got = p.len + s->placed; /* (placed: the reply carries none) */
  int rc = got == len ? client_check_crc32c(d->c->verify, gr->crc32c_set, gr->crc32c, bytes, len,
                                            off, &it->err)
                      : tport_err_set(&it->err, TPORT_DATA_LOSS,
                                      "chunk at %zu: %zu bytes came, %zu expected", off, got, len);
  if (rc)
    e->state = DG_FAILED;
  else if (s->placed)
    ; /* in place */
  else if (e->state == DG_READING && d->total >= COPY_POOL_OUT_STREAM_MIN)
    memcpy_stream(e->buf + off, p.data, p.len); /* as copy_pool_copy_out would */
  else if (e->state == DG_READING)
    memcpy(e->buf + off, p.data, p.len);
  protobuf_c_message_free_unpacked(r, NULL);
}

static int deferred_take(void *ctx, client_slot *s, tport_err *err)
{
  (void)err;
  deferred_gets *d = ctx;
  size_t u = s->offset;
  if (d->unit_kind[u] == DU_GROUP)
    group_take(d, s, d->unit_el[u]);
  else if (d->unit_kind[u] == DU_BEGIN)
    begin_take(d, s, &d->el[d->unit_el[u]]);
  else
    chunk_take(d, s, &d->el[d->unit_el[u]]);
  return TPORT_OK; /* an element's error is its own: the others go on */
}

static size_t deferred_after(void *ctx, size_t u)
{
  deferred_gets *d = ctx;
  return d->unit_kind[u] == DU_CHUNK ? d->el[d->unit_el[u]].begin_unit + 1 : 0;
}

/* Element e (its item it) to redo after the window: in the second one
 * (e->again), by the transfer it was answered with (e->late), or as a get
 * of its own (path.c). */
static void redo(deferred_gets *d, dget *e, tport_get_item *it)
{
  client_get_desc g = desc_of(d, it);
  void *alloced = NULL;
  tport_err_clear(&it->err);
  memset(&it->info, 0, sizeof it->info);
  if (e->again && d->again) {
    it->err.code = NOT_ANSWERED; /* by the second window */
    d->again[e->item] = e->again;
    return;
  }
  client_payload none = {0};
  int rc = e->late ? client_socket_get_rest(d->c, &g, e->late, &none, NULL, &alloced, &it->nbytes,
                                            &it->info, &it->err)
                   : client_get(d->c, &g, &alloced, &it->nbytes, &it->info, &it->err);
  if (rc == TPORT_OK)
    it->data = it->buf ? it->buf : alloced;
}

/* After the window: each element's result, or the window's error (a
 * cancel's where it was cancelled); the ones to redo, redo's. */
static void deferred_finish(deferred_gets *d, int rc, const tport_err *werr)
{
  /* the transfers answered late first: read (and closed) before a get of
   * its own needs one of the connection's --max-transfers */
  for (size_t i = 0; !rc && i < d->n; i++) {
    dget *e = &d->el[i];
    if (e->state == DG_REDO && e->late && !batch_cancelled(d->cancel, &d->items[e->item].err)) {
      redo(d, e, &d->items[e->item]);
      e->state = DG_DONE;
    }
  }
  for (size_t i = 0; i < d->n; i++) {
    dget *e = &d->el[i];
    tport_get_item *it = &d->items[e->item];
    if (e->state == DG_READING && !rc) {
      it->data = e->buf; /* every chunk in */
      it->nbytes = e->planned;
      tport_err_clear(&it->err);
      e->buf = NULL;
    } else if (e->state == DG_READING || e->state == DG_WAITING) {
      it->err = *werr; /* the window stopped first */
    } else if (e->state == DG_REDO && rc) {
      it->err = *werr;
    } else if (e->state == DG_REDO && !batch_cancelled(d->cancel, &it->err)) {
      redo(d, e, it);
    }
    if (it->err.code != TPORT_OK) {
      memset(&it->info, 0, sizeof it->info);
      it->nbytes = 0;
    }
    if (e->buf)
      drop_buffer(d, e);
    free(e->transfer.data);
    if (e->late)
      protobuf_c_message_free_unpacked(&e->late->base, NULL);
  }
}

/* batch_get_deferred's window; direct_off: a second one, for elements
 * the first offered for a direct write that the server would not make. */
static void deferred_window(tport_client *c, tport_get_item *items, size_t k, const size_t *planned,
                            bool exact, bool blocks, const atomic_bool *cancel, bool direct_off)
{
  size_t n = 0, nunits = 0, chunk = c->chunk_bytes, total = 0;
  uint64_t proc_region = direct_off ? 0 : client_gets_direct_region(c);
  for (size_t j = 0; j < k; j++)
    if (items[j].err.code == NOT_ANSWERED) {
      n++;
      /* (planned may be a caller's buffer's size: any size_t) -- one
       * written directly has no chunks */
      bool direct = deferred_direct_region(&items[j], planned[j], proc_region) != 0;
      size_t units = 1 + (planned[j] > chunk && !direct ? planned[j] / chunk + 1 : 0);
      nunits = nunits > SIZE_MAX - units ? SIZE_MAX : nunits + units;
      total = total > SIZE_MAX - planned[j] ? SIZE_MAX : total + planned[j];
    }
  if (!n)
    return;
  tport_err err;
  tport_err_set(&err, TPORT_INTERNAL, "the batch stopped before this element was answered");
  deferred_gets d = {.c = c,
                     .items = items,
                     .el = calloc(n, sizeof(dget)),
                     .n = n,
                     .unit_el = calloc(nunits, sizeof(size_t)), /* (NULL past SIZE_MAX) */
                     .unit_kind = malloc(nunits),
                     .small = malloc(n * sizeof(size_t)),
                     .gstart = malloc((n + 1) * sizeof(size_t)),
                     .slot = malloc((n + 1) * sizeof(size_t)),
                     .blocks = blocks,
                     .exact = exact,
                     .total = total,
                     .cancel = cancel,
                     .proc_region = proc_region,
                     .again = direct_off ? NULL : calloc(k, sizeof(size_t))};
  size_t *large = malloc(n * sizeof *large);
  bool again = false;
  if (d.el && d.unit_el && d.unit_kind && d.small && d.gstart && d.slot && large) {
    size_t u = deferred_plan(&d, planned, k, large);
    if (atomic_load(&c->shm_auto) && atomic_load(&c->batch_get_slices))
      deferred_open_region(&d);
    int rc = client_run_units(c, u, deferred_make, deferred_take, deferred_after, deferred_into, &d,
                              cancel, &err);
    batch_region_close(c, &d.region); /* before the gets of their own use it */
    deferred_finish(&d, rc, &err);
    for (size_t j = 0; d.again && j < k; j++)
      again |= d.again[j] != 0;
  } else {
    tport_err_set(&err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t j = 0; j < k; j++)
      if (items[j].err.code == NOT_ANSWERED)
        items[j].err = err;
  }
  free(d.el), free(d.unit_el), free(d.unit_kind), free(d.small), free(d.gstart), free(d.slot),
      free(large);
  if (again)
    deferred_window(c, items, k, d.again, true, blocks, cancel, true); /* (as answered) */
  free(d.again);
}

void batch_get_deferred(tport_client *c, tport_get_item *items, size_t k, const size_t *planned,
                        bool exact, bool blocks, const atomic_bool *cancel)
{
  deferred_window(c, items, k, planned, exact, blocks, cancel, false);
}
