/*
 * batch.c: tport_get_batch -- n tensors in as few round trips as the
 * server allows (the puts are batch_put.c's).  A GetBatch asks for up to
 * BATCH_MAX_ELEMENTS tensors, and the server answers each inline while its
 * reply has room; a larger one is deferred, and all the deferred ones are
 * read in one window (get_deferred: a GetBegin each, inline in its reply up
 * to a chunk, else a transfer whose GetChunks follow) -- or, with the
 * automatic region on, a larger one by path.c as a tport_get of its own
 * would.  Every element keeps its own result and error: a reply element
 * the server got wrong fails that element.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "get_blocks.h"

bool batch_cancelled(const atomic_bool *cancel, tport_err *err)
{
  if (!cancel || !atomic_load(cancel))
    return false;
  tport_err_set(err, TPORT_CANCELLED, "cancelled before this element was sent");
  return true;
}

int batch_element_status(const Tport__Status *st, tport_err *err)
{
  if (!st || st->code == TPORT__CODE__CODE_OK)
    return TPORT_OK;
  return tport_err_set(err, (int)st->code, "%s", st->message ? st->message : "");
}

int batch_result(const tport_err *errs, size_t stride, size_t n, tport_err *err)
{
  size_t failed = 0, first = 0;
  for (size_t i = 0; i < n; i++) {
    const tport_err *e = (const tport_err *)((const char *)errs + i * stride);
    if (e->code != TPORT_OK && failed++ == 0)
      first = i;
  }
  if (!failed)
    return TPORT_OK;
  const tport_err *e = (const tport_err *)((const char *)errs + first * stride);
  return tport_err_set(err, e->code, "%zu of %zu elements failed; element %zu: %s", failed, n,
                       first, e->msg);
}

/* ---------------------------------------------------------------- gets */

/* The rest of element it's get, answered by b with its inline bytes at
 * *at of the reply's payload p; *at moves past them.  A deferred one goes
 * as a get of its own. */
static void get_element(tport_client *c, tport_get_item *it, const Tport__GetBeginReply *b,
                        bool deferred, const client_payload *p, size_t *at, bool blocks,
                        const atomic_bool *cancel, size_t *planned)
{
  if (batch_element_status(b->status, &it->err))
    return;
  client_get_desc g = {.ref = &it->ref,
                       .buf = it->buf,
                       .cap = it->cap,
                       .alloc = it->buf == NULL,
                       .alloc_blocks = blocks,
                       .cancel = cancel};
  void *alloced = NULL;
  if (deferred && (b->nbytes <= c->chunk_bytes || !atomic_load(&c->shm_auto))) {
    *planned = (size_t)b->nbytes;
    it->err.code = NOT_ANSWERED; /* by get_deferred, with the others */
    return;
  }
  if (deferred) {
    if (client_get(c, &g, &alloced, &it->nbytes, &it->info, &it->err) == TPORT_OK)
      it->data = it->buf ? it->buf : alloced;
    return;
  }
  client_payload inl = {0};
  size_t n = (size_t)b->nbytes;
  if (b->transfer.len == 0 && !b->shm) {
    /* inline: its bytes are the next n of the payload */
    if (n > p->len - *at) {
      tport_err_set(&it->err, TPORT_DATA_LOSS,
                    "the batch's reply carries %zu bytes past offset %zu: this element needs %zu",
                    p->len - *at, *at, n);
      *at = p->len; /* the rest cannot be placed either */
      return;
    }
    inl.data = p->data + *at;
    inl.len = n;
    *at += n;
  }
  if (client_socket_get_rest(c, &g, b, &inl, NULL, &alloced, &it->nbytes, &it->info, &it->err) ==
      TPORT_OK)
    it->data = it->buf ? it->buf : alloced;
}

/* The deferred elements: a GetBegin each, all in one window.  One of up to
 * a chunk comes inline in its reply; a larger one (no region: else it went
 * by path.c) is answered with a transfer, whose GetChunks follow in the
 * same window once that reply is in, so that the window never drains
 * between elements (as a get of its own each, the five 8-9 MB tensors of
 * ResNet-50 cost a GetBegin round trip and a drained window apiece).  An
 * element whose GetBegin says other than its GetBatch did (a name
 * replaced meanwhile) or whose chunks are smaller than the client's goes as
 * a get of its own after the window. */

typedef enum dget_state {
  DG_WAITING, /* its GetBegin not answered */
  DG_READING, /* its chunks go */
  DG_DONE,    /* answered: its result is in the item */
  DG_FAILED,  /* a chunk failed (the item's err): its buffer goes */
  DG_REDO,    /* a get of its own after the window */
} dget_state;

typedef struct dget {
  size_t item;
  size_t planned;               /* its bytes, as the GetBatch said */
  size_t begin_unit, first_chunk, nchunks;
  dget_state state;
  uint8_t *buf;                 /* where its chunks go */
  bool alloced;                 /* buf made here (freed when it fails) */
  ProtobufCBinaryData transfer; /* its chunks' transfer (a copy) */
} dget;

typedef struct deferred_gets {
  tport_client *c;
  tport_get_item *items;
  dget *el;
  size_t n;
  size_t *unit_el;        /* the element of unit u */
  bool *unit_begin;       /* unit u is its element's GetBegin (else a chunk) */
  bool blocks;            /* buffers made from get_blocks.h */
  const atomic_bool *cancel;
} deferred_gets;

static bool unit_is_begin(const deferred_gets *d, size_t u)
{
  return d->unit_begin[u];
}

static client_get_desc desc_of(const deferred_gets *d, tport_get_item *it)
{
  return (client_get_desc){.ref = &it->ref,
                           .buf = it->buf,
                           .cap = it->cap,
                           .alloc = it->buf == NULL,
                           .alloc_blocks = d->blocks,
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

static int deferred_make(void *ctx, size_t u, size_t one, nng_msg **out, tport_err *err)
{
  (void)one;
  deferred_gets *d = ctx;
  dget *e = &d->el[d->unit_el[u]];
  if (unit_is_begin(d, u)) {
    Tport__Ref w;
    client_ref_to_wire(&d->items[e->item].ref, &w);
    Tport__GetBeginRequest q = TPORT__GET_BEGIN_REQUEST__INIT;
    q.ref = &w;
    q.inline_max = d->c->chunk_bytes;
    q.want_crc32c = d->c->verify;
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
  if (client_get_destination(d->c, &g, b, e->planned, d->c->chunk_bytes, &e->buf, NULL,
                             &it->err) != TPORT_OK) {
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

static void begin_take(deferred_gets *d, client_slot *s, dget *e)
{
  tport_get_item *it = &d->items[e->item];
  Tport__GetBeginReply *b;
  client_payload inl = {0};
  e->state = DG_DONE;
  tport_err_clear(&it->err);
  int rc = client_unpack(TPORT__METHOD__METHOD_GET_BEGIN, s->reply,
                         &tport__get_begin_reply__descriptor, (ProtobufCMessage **)&b, &inl,
                         &it->err);
  if (rc == TPORT_RESOURCE_EXHAUSTED && e->nchunks) {
    /* the connection's gets in progress (a server whose --max-transfers
     * is below its window), or room for one: alone, after the window */
    e->state = DG_REDO;
    tport_err_clear(&it->err);
  }
  if (rc)
    return; /* else this element's error */
  if (e->nchunks) {
    begin_reading(d, e, b);
  } else if (b->transfer.len || b->shm) {
    e->state = DG_REDO; /* larger than the GetBatch said (a name replaced): on its own */
  } else {
    client_get_desc g = desc_of(d, it);
    void *alloced = NULL;
    if (client_socket_get_rest(d->c, &g, b, &inl, NULL, &alloced, &it->nbytes, &it->info,
                               &it->err) == TPORT_OK)
      it->data = it->buf ? it->buf : alloced;
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
  size_t chunk = d->c->chunk_bytes, off = (s->offset - e->first_chunk) * chunk;
  size_t len = e->planned - off < chunk ? e->planned - off : chunk;
  int rc = p.len == len ? client_check_crc32c(d->c->verify, gr->crc32c_set, gr->crc32c, p.data,
                                              p.len, off, &it->err)
                        : tport_err_set(&it->err, TPORT_DATA_LOSS,
                                        "chunk at %zu: %zu bytes came, %zu expected", off, p.len,
                                        len);
  if (rc)
    e->state = DG_FAILED;
  else if (e->state == DG_READING)
    memcpy(e->buf + off, p.data, p.len);
  protobuf_c_message_free_unpacked(r, NULL);
}

static int deferred_take(void *ctx, client_slot *s, tport_err *err)
{
  (void)err;
  deferred_gets *d = ctx;
  dget *e = &d->el[d->unit_el[s->offset]];
  if (unit_is_begin(d, s->offset))
    begin_take(d, s, e);
  else
    chunk_take(d, s, e);
  return TPORT_OK; /* an element's error is its own: the others go on */
}

static size_t deferred_after(void *ctx, size_t u)
{
  deferred_gets *d = ctx;
  return unit_is_begin(d, u) ? 0 : d->el[d->unit_el[u]].begin_unit + 1;
}

/* After the window: each element's result, or the window's error; the
 * ones to redo get by path.c. */
static void deferred_finish(deferred_gets *d, int rc, const tport_err *werr)
{
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
    } else if (e->state == DG_REDO && !rc && !batch_cancelled(d->cancel, &it->err)) {
      client_get_desc g = desc_of(d, it);
      void *alloced = NULL;
      tport_err_clear(&it->err);
      memset(&it->info, 0, sizeof it->info);
      if (client_get(d->c, &g, &alloced, &it->nbytes, &it->info, &it->err) == TPORT_OK)
        it->data = it->buf ? it->buf : alloced;
    } else if (e->state == DG_REDO) {
      it->err = *werr;
    }
    if (it->err.code != TPORT_OK) {
      memset(&it->info, 0, sizeof it->info);
      it->nbytes = 0;
    }
    if (e->buf)
      drop_buffer(d, e);
    free(e->transfer.data);
  }
}

static void get_deferred(tport_client *c, tport_get_item *items, size_t k, const size_t *planned,
                         bool blocks, const atomic_bool *cancel)
{
  size_t n = 0, nunits = 0, chunk = c->chunk_bytes;
  for (size_t j = 0; j < k; j++)
    if (items[j].err.code == NOT_ANSWERED) {
      n++;
      nunits += 1 + (planned[j] > chunk ? planned[j] / chunk + 1 : 0);
    }
  if (!n)
    return;
  tport_err err;
  tport_err_set(&err, TPORT_INTERNAL, "the batch stopped before this element was answered");
  deferred_gets d = {.c = c,
                     .items = items,
                     .el = calloc(n, sizeof(dget)),
                     .n = n,
                     .unit_el = malloc(nunits * sizeof(size_t)),
                     .unit_begin = malloc(nunits * sizeof(bool)),
                     .blocks = blocks,
                     .cancel = cancel};
  int rc = d.el && d.unit_el && d.unit_begin
               ? TPORT_OK
               : tport_err_set(&err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  if (!rc) {
    /* The small ones' GetBegins first; then each large one's GetBegin one
     * element ahead of its chunks: answered by the time they go, and only
     * the transfers of the requests in flight open on the server (a
     * connection may hold --max-transfers, 16 by default: all of them
     * begun at once, a state dict's were refused past it). */
    size_t i = 0, u = 0, nlarge = 0;
    size_t *large = malloc(n * sizeof *large);
    rc = large ? TPORT_OK : tport_err_set(&err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
    for (size_t j = 0; !rc && j < k; j++) {
      if (items[j].err.code != NOT_ANSWERED)
        continue;
      dget *e = &d.el[i];
      e->item = j;
      e->planned = planned[j];
      if (planned[j] > chunk) {
        e->nchunks = planned[j] / chunk + (planned[j] % chunk != 0);
        large[nlarge++] = i;
      } else {
        e->begin_unit = u;
        d.unit_el[u] = i;
        d.unit_begin[u++] = true;
      }
      i++;
    }
    for (size_t m = 0; !rc && m <= nlarge; m++) {
      if (m < nlarge) { /* the next one's GetBegin */
        d.el[large[m]].begin_unit = u;
        d.unit_el[u] = large[m];
        d.unit_begin[u++] = true;
      }
      if (m == 0)
        continue;
      dget *e = &d.el[large[m - 1]]; /* the one before's chunks */
      e->first_chunk = u;
      for (size_t c2 = 0; c2 < e->nchunks; c2++) {
        d.unit_el[u] = large[m - 1];
        d.unit_begin[u++] = false;
      }
    }
    free(large);
    if (rc) {
      for (size_t j = 0; j < k; j++)
        if (items[j].err.code == NOT_ANSWERED)
          items[j].err = err;
      free(d.el), free(d.unit_el), free(d.unit_begin);
      return;
    }
    rc = client_run_units(c, u, deferred_make, deferred_take, deferred_after, &d, cancel, &err);
    deferred_finish(&d, rc, &err);
  } else {
    for (size_t j = 0; j < k; j++)
      if (items[j].err.code == NOT_ANSWERED)
        items[j].err = err;
  }
  free(d.el), free(d.unit_el), free(d.unit_begin);
}

/* One GetBatch of items[0..k). */
static void get_group(tport_client *c, tport_get_item *items, size_t k, bool blocks,
                      const atomic_bool *cancel)
{
  Tport__Ref *refs = calloc(k, sizeof *refs);
  Tport__GetBeginRequest *qs = calloc(k, sizeof *qs);
  Tport__GetBeginRequest **qp = calloc(k, sizeof *qp);
  size_t *planned = calloc(k, sizeof *planned); /* a deferred element's bytes */
  tport_err err;
  int rc = refs && qs && qp && planned ? TPORT_OK
                            : tport_err_set(&err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t j = 0; !rc && j < k; j++) {
    client_ref_to_wire(&items[j].ref, &refs[j]);
    tport__get_begin_request__init(&qs[j]);
    qs[j].ref = &refs[j];
    qs[j].inline_max = c->chunk_bytes;
    qs[j].want_crc32c = c->verify;
    qp[j] = &qs[j];
  }
  Tport__GetBatchReply *r = NULL;
  client_payload p = {0};
  if (!rc) {
    Tport__GetBatchRequest q = TPORT__GET_BATCH_REQUEST__INIT;
    q.n_gets = k;
    q.gets = qp;
    q.defer_large = true;
    rc = client_rpc(c, TPORT__METHOD__METHOD_GET_BATCH, &q.base, NULL, 0,
                    &tport__get_batch_reply__descriptor, (ProtobufCMessage **)&r, &p, &err);
  }
  if (!rc && (r->n_gets != k || (r->n_deferred != 0 && r->n_deferred != k)))
    rc = tport_err_set(&err, TPORT_DATA_LOSS, "the server answered %zu of %zu elements",
                       r->n_gets, k);
  size_t at = 0;
  for (size_t j = 0; j < k; j++) {
    if (rc)
      items[j].err = err;
    else if (!batch_cancelled(cancel, &items[j].err))
      get_element(c, &items[j], r->gets[j], r->n_deferred && r->deferred[j], &p, &at, blocks,
                  cancel, &planned[j]);
  }
  if (planned)
    get_deferred(c, items, k, planned, blocks, cancel);
  if (r)
    protobuf_c_message_free_unpacked(&r->base, NULL);
  if (p.msg)
    nng_msg_free(p.msg);
  free(refs), free(qs), free(qp), free(planned);
}

int client_get_batch(tport_client *c, tport_get_item *items, size_t n, DLManagedTensor **managed,
                     const atomic_bool *cancel, tport_err *err)
{
  for (size_t i = 0; i < n; i++) {
    tport_err_clear(&items[i].err);
    items[i].data = NULL;
    items[i].nbytes = 0;
    memset(&items[i].info, 0, sizeof items[i].info);
    if (managed)
      managed[i] = NULL;
  }
  for (size_t i = 0; i < n; i += BATCH_MAX_ELEMENTS) {
    size_t k = n - i < BATCH_MAX_ELEMENTS ? n - i : BATCH_MAX_ELEMENTS;
    if (cancel && atomic_load(cancel))
      for (size_t j = i; j < i + k; j++)
        batch_cancelled(cancel, &items[j].err);
    else
      get_group(c, items + i, k, managed != NULL, cancel);
  }
  /* the buffers made for elements, each handed over with its deleter */
  for (size_t i = 0; managed && i < n; i++)
    if (!items[i].buf && items[i].data &&
        client_managed_block(items[i].data, items[i].nbytes, &items[i].info, &managed[i],
                             &items[i].err) != TPORT_OK) {
      items[i].data = NULL; /* given back: this element failed */
      items[i].nbytes = 0;
      memset(&items[i].info, 0, sizeof items[i].info);
    }
  return n ? batch_result(&items[0].err, sizeof *items, n, err) : TPORT_OK;
}

/* ---------------------------------------------------------------- the API */

int tport_get_batch(tport_client *c, tport_get_item *items, size_t n, tport_err *err)
{
  return client_get_batch(c, items, n, NULL, NULL, err);
}

int tport_get_batch_dlpack(tport_client *c, tport_get_item *items, size_t n,
                           DLManagedTensor **out, tport_err *err)
{
  if (n && !out)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "out is NULL: it has a slot per element");
  return client_get_batch(c, items, n, out, NULL, err);
}
