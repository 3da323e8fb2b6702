/*
 * batch.c: n tensors in as few round trips as the server allows.  Small
 * elements (client_batch_fits) ride together: a PutBatch carries up to
 * BATCH_MAX_ELEMENTS of them and a chunk's worth of their bytes, each
 * element a PutBeginRequest that commits at once; a GetBatch asks for up
 * to as many, and the server answers each inline while its reply has room,
 * else with a transfer read by the window as a single get's.  Larger
 * elements go by path.c, as a tport_put or tport_get of their own would
 * (the window, the automatic region).  Every element keeps its own result
 * and error: a reply element the server got wrong fails that element.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "client_internal.h"
#include "crc32c.h"

/* The server's bound (server/handlers_batch.c) is larger: this keeps one
 * request's reply small. */
#define BATCH_MAX_ELEMENTS 256

bool client_batch_fits(const tport_client *c, size_t nbytes)
{
  return nbytes < CLIENT_SHM_MIN_BYTES && nbytes <= c->chunk_bytes;
}

static bool cancelled(const atomic_bool *cancel, tport_err *err)
{
  if (!cancel || !atomic_load(cancel))
    return false;
  tport_err_set(err, TPORT_CANCELLED, "cancelled before this element was sent");
  return true;
}

/* An element's error from its reply's status (a reply element without
 * one is OK). */
static int element_status(const Tport__Status *st, tport_err *err)
{
  if (!st || st->code == TPORT__CODE__CODE_OK)
    return TPORT_OK;
  return tport_err_set(err, (int)st->code, "%s", st->message ? st->message : "");
}

/* The batch's status: OK, or the first failed element's, named. */
static int batch_result(const tport_err *errs, size_t stride, size_t n, tport_err *err)
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

/* ---------------------------------------------------------------- puts */

/* An element not answered yet (never a status of the wire's). */
#define NOT_ANSWERED (-1)

/* The small elements of a put batch, in groups of one PutBatch each:
 * group g is items idx[start[g] .. start[g + 1]). */
typedef struct put_groups {
  tport_client *c;
  tport_put_item *items;
  size_t *idx, *start;
  size_t ngroups;
  lent_chunks lent; /* a large element's bytes, lent to its group's request */
  arena replies;    /* where each group's reply is unpacked (reset after it) */
} put_groups;

/* An element this large goes in a group of its own, its bytes lent to the
 * request (where the transport can send from them) rather than copied. */
#define BATCH_LEND_MIN ((size_t)256 << 10)

static bool lent_alone(const tport_client *c, size_t nbytes)
{
  return c->lend_chunks && nbytes >= BATCH_LEND_MIN;
}

/* Group g's request: the elements' PutBegins, then their bytes. */
static int group_make(void *ctx, size_t g, size_t one, nng_msg **out, tport_err *err)
{
  put_groups *pg = ctx;
  size_t first = pg->start[g], k = pg->start[g + 1] - first;
  Tport__TensorDesc *descs = calloc(k, sizeof *descs);
  Tport__PutBeginRequest *qs = calloc(k, sizeof *qs);
  Tport__PutBeginRequest **qp = calloc(k, sizeof *qp);
  uint64_t *lens = calloc(k, sizeof *lens);
  tport_put_options defaults;
  tport_put_options_init(&defaults);
  size_t total = 0;
  int rc = descs && qs && qp && lens
               ? TPORT_OK
               : tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for a batch");
  for (size_t j = 0; !rc && j < k; j++) {
    tport_put_item *it = &pg->items[pg->idx[first + j]];
    client_put_request(pg->c, it->dtype, it->ndim, it->sizes, it->strides,
                       it->opts ? it->opts : &defaults, &descs[j], &qs[j]);
    qs[j].commit = true;
    if (pg->c->verify) {
      qs[j].crc32c_set = true;
      qs[j].crc32c = transport_crc32c(0, it->data, it->nbytes);
    }
    qp[j] = &qs[j];
    lens[j] = it->nbytes;
    total += it->nbytes; /* within a chunk (put_small's groups) */
  }
  Tport__PutBatchRequest q = TPORT__PUT_BATCH_REQUEST__INIT;
  q.n_puts = q.n_payload_bytes = k;
  q.puts = qp;
  q.payload_bytes = lens;
  size_t head = rc ? 0 : frame_head_size(&q.base);
  tport_put_item *big = &pg->items[pg->idx[first]];
  if (!rc && k == 1 && lent_alone(pg->c, big->nbytes)) {
    rc = client_pack_lent(&pg->lent, TPORT__METHOD__METHOD_PUT_BATCH, &q.base, big->data,
                          big->nbytes, out, err);
    free(descs), free(qs), free(qp), free(lens);
    return rc;
  }
  /* the message at its full size at once, the elements' bytes copied in */
  if (!rc && nng_msg_alloc(out, head + total) != 0)
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for a %zu-byte batch",
                       head + total);
  if (!rc) {
    uint8_t *body = nng_msg_body(*out);
    frame_write_head(body, TPORT__METHOD__METHOD_PUT_BATCH, 0, &q.base);
    for (size_t j = 0, at = head; j < k; j++) {
      tport_put_item *it = &pg->items[pg->idx[first + j]];
      if (it->nbytes)
        memcpy(body + at, it->data, it->nbytes);
      at += it->nbytes;
    }
  }
  free(descs), free(qs), free(qp), free(lens);
  return rc;
}

/* Group g's reply: each element's result, or the group's error for all. */
static int group_take(void *ctx, client_slot *s, tport_err *err)
{
  put_groups *pg = ctx;
  size_t g = s->offset, first = pg->start[g], k = pg->start[g + 1] - first;
  Tport__PutBatchReply *r = NULL;
  tport_err ge;
  /* a reply of 256 elements is ~2,000 fields: unpacked into one arena */
  int rc = client_unpack_in(TPORT__METHOD__METHOD_PUT_BATCH, s->reply,
                            &tport__put_batch_reply__descriptor, &pg->replies,
                            (ProtobufCMessage **)&r, NULL, &ge);
  if (!rc && r->n_puts != k)
    rc = tport_err_set(&ge, TPORT_DATA_LOSS, "the server answered %zu of %zu elements",
                       r->n_puts, k);
  for (size_t j = 0; j < k; j++) {
    tport_put_item *it = &pg->items[pg->idx[first + j]];
    tport_err_clear(&it->err);
    if (rc) {
      it->err = ge;
    } else if (element_status(r->puts[j]->status, &it->err) == TPORT_OK) {
      if (!r->puts[j]->info)
        tport_err_set(&it->err, TPORT_DATA_LOSS, "the server's reply describes no tensor");
      else
        client_info_from_wire(r->puts[j]->info, &it->info);
    }
  }
  arena_reset(&pg->replies);
  return TPORT_OK; /* the group's error is its elements': the others go on */
}

/* Moves the elements lent alone to the end of idx[0..k), the others kept in
 * order: the small ones then fill groups together instead of being cut
 * into a group between each two lent ones (a state dict alternates a
 * convolution's weight with its batch norm's two vectors: half the requests).
 * The elements are independent; each keeps its own result slot. */
static void lent_last(const tport_client *c, const tport_put_item *items, size_t *idx, size_t k,
                      size_t *scratch)
{
  size_t a = 0, b = 0;
  for (size_t j = 0; j < k; j++)
    if (lent_alone(c, items[idx[j]].nbytes))
      scratch[b++] = idx[j];
    else
      idx[a++] = idx[j];
  memcpy(idx + a, scratch, b * sizeof *idx);
}

/* The small elements idx[0..k) in groups (BATCH_MAX_ELEMENTS, a chunk of
 * bytes), the server's window of them in flight. */
static void put_small(tport_client *c, tport_put_item *items, size_t *idx, size_t k,
                      const atomic_bool *cancel)
{
  size_t *start = malloc((k + 1) * sizeof *start), ngroups = 0, bytes = 0;
  tport_err err;
  tport_err_set(&err, TPORT_INTERNAL, "the batch stopped before this element was answered");
  int rc = start ? TPORT_OK : tport_err_set(&err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  if (!rc)
    lent_last(c, items, idx, k, start);
  for (size_t j = 0; !rc && j < k; j++) {
    size_t n = items[idx[j]].nbytes;
    bool alone = lent_alone(c, n);
    if (j == 0 || alone || j - start[ngroups - 1] == BATCH_MAX_ELEMENTS ||
        bytes + n > c->chunk_bytes) {
      start[ngroups++] = j;
      bytes = 0;
    }
    bytes += n;
  }
  if (!rc) {
    start[ngroups] = k;
    put_groups pg = {.c = c,
                     .items = items,
                     .idx = idx,
                     .start = start,
                     .ngroups = ngroups,
                     .lent = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0}};
    arena_init(&pg.replies);
    rc = client_run_window(c, ngroups, 1, group_make, group_take, &pg, NULL, NULL, cancel, &err);
    client_lent_wait(c, &pg.lent); /* the caller's bytes are theirs again */
    arena_fini(&pg.replies);
  }
  for (size_t j = 0; j < k; j++)
    if (items[idx[j]].err.code == NOT_ANSWERED)
      items[idx[j]].err = err; /* the window stopped before its group */
  free(start);
}

/* Whether an element rides in a batch's request: a small one always; one
 * of up to a chunk where no region would carry it faster alone. */
static bool rides_in_batch(const tport_client *c, size_t nbytes)
{
  return client_batch_fits(c, nbytes) || (nbytes <= c->chunk_bytes && !atomic_load(&c->shm_auto));
}

int client_put_batch(tport_client *c, tport_put_item *items, size_t n, const atomic_bool *cancel,
                     tport_err *err)
{
  size_t *idx = malloc((n ? n : 1) * sizeof *idx), k = 0;
  if (!idx)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for a batch of %zu", n);
  for (size_t i = 0; i < n; i++) {
    tport_put_item *it = &items[i];
    tport_err_clear(&it->err);
    memset(&it->info, 0, sizeof it->info);
    if (it->ndim < 0 || it->ndim > TPORT_MAX_DIMS)
      tport_err_set(&it->err, TPORT_INVALID_ARGUMENT, "ndim is %d: it must be in [0, %d]",
                    it->ndim, TPORT_MAX_DIMS);
    else if (rides_in_batch(c, it->nbytes))
      idx[k++] = i, it->err.code = NOT_ANSWERED;
  }
  if (k)
    put_small(c, items, idx, k, cancel);
  /* the large ones, each as a put of its own */
  for (size_t i = 0; i < n; i++) {
    tport_put_item *it = &items[i];
    if (it->err.code != TPORT_OK || rides_in_batch(c, it->nbytes) || cancelled(cancel, &it->err))
      continue;
    client_put_desc d = {.dtype = it->dtype,
                         .ndim = it->ndim,
                         .sizes = it->sizes,
                         .strides = it->strides,
                         .nbytes = it->nbytes,
                         .data = it->data,
                         .opts = it->opts,
                         .cancel = cancel};
    client_put(c, &d, &it->info, &it->err);
  }
  free(idx);
  return n ? batch_result(&items[0].err, sizeof *items, n, err) : TPORT_OK;
}

/* ---------------------------------------------------------------- gets */

/* The rest of element it's get, answered by b with its inline bytes at
 * *at of the reply's payload p; *at moves past them.  A deferred one goes
 * as a get of its own. */
static void get_element(tport_client *c, tport_get_item *it, const Tport__GetBeginReply *b,
                        bool deferred, const client_payload *p, size_t *at, bool blocks,
                        const atomic_bool *cancel)
{
  if (element_status(b->status, &it->err))
    return;
  client_get_desc g = {.ref = &it->ref,
                       .buf = it->buf,
                       .cap = it->cap,
                       .alloc = it->buf == NULL,
                       .alloc_blocks = blocks,
                       .cancel = cancel};
  void *alloced = NULL;
  if (deferred && b->nbytes <= c->chunk_bytes) {
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

/* The deferred elements of up to a chunk: a GetBegin each (the tensor
 * inline in its reply), the server's window of them in flight. */
typedef struct deferred_gets {
  tport_client *c;
  tport_get_item *items;
  size_t *idx;
  bool blocks; /* buffers made from get_blocks.h */
  const atomic_bool *cancel;
} deferred_gets;

static int deferred_make(void *ctx, size_t j, size_t one, nng_msg **out, tport_err *err)
{
  deferred_gets *d = ctx;
  Tport__Ref w;
  client_ref_to_wire(&d->items[d->idx[j]].ref, &w);
  Tport__GetBeginRequest q = TPORT__GET_BEGIN_REQUEST__INIT;
  q.ref = &w;
  q.inline_max = d->c->chunk_bytes;
  q.want_crc32c = d->c->verify;
  return client_pack(TPORT__METHOD__METHOD_GET_BEGIN, &q.base, NULL, 0, out, err);
}

static int deferred_take(void *ctx, client_slot *s, tport_err *err)
{
  deferred_gets *d = ctx;
  tport_get_item *it = &d->items[d->idx[s->offset]];
  Tport__GetBeginReply *b;
  client_payload inl = {0};
  tport_err_clear(&it->err);
  if (client_unpack(TPORT__METHOD__METHOD_GET_BEGIN, s->reply, &tport__get_begin_reply__descriptor,
                    (ProtobufCMessage **)&b, &inl, &it->err))
    return TPORT_OK; /* this element's error */
  client_get_desc g = {.ref = &it->ref,
                       .buf = it->buf,
                       .cap = it->cap,
                       .alloc = it->buf == NULL,
                       .alloc_blocks = d->blocks,
                       .cancel = d->cancel};
  void *alloced = NULL;
  if (client_socket_get_rest(d->c, &g, b, &inl, NULL, &alloced, &it->nbytes, &it->info,
                             &it->err) == TPORT_OK)
    it->data = it->buf ? it->buf : alloced;
  protobuf_c_message_free_unpacked(&b->base, NULL);
  return TPORT_OK;
}

static void get_deferred(tport_client *c, tport_get_item *items, size_t k, bool blocks,
                         const atomic_bool *cancel)
{
  size_t *idx = malloc((k ? k : 1) * sizeof *idx), n = 0;
  tport_err err;
  tport_err_set(&err, TPORT_INTERNAL, "the batch stopped before this element was answered");
  for (size_t j = 0; idx && j < k; j++)
    if (items[j].err.code == NOT_ANSWERED)
      idx[n++] = j;
  if (!idx)
    tport_err_set(&err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  deferred_gets d = {c, items, idx, blocks, cancel};
  if (n)
    client_run_window(c, n, 1, deferred_make, deferred_take, &d, NULL, NULL, cancel, &err);
  for (size_t j = 0; j < k; j++)
    if (items[j].err.code == NOT_ANSWERED)
      items[j].err = err;
  free(idx);
}

/* One GetBatch of items[0..k). */
static void get_group(tport_client *c, tport_get_item *items, size_t k, bool blocks,
                      const atomic_bool *cancel)
{
  Tport__Ref *refs = calloc(k, sizeof *refs);
  Tport__GetBeginRequest *qs = calloc(k, sizeof *qs);
  Tport__GetBeginRequest **qp = calloc(k, sizeof *qp);
  tport_err err;
  int rc = refs && qs && qp ? TPORT_OK
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
    else if (!cancelled(cancel, &items[j].err))
      get_element(c, &items[j], r->gets[j], r->n_deferred && r->deferred[j], &p, &at, blocks,
                  cancel);
  }
  get_deferred(c, items, k, blocks, cancel);
  if (r)
    protobuf_c_message_free_unpacked(&r->base, NULL);
  if (p.msg)
    nng_msg_free(p.msg);
  free(refs), free(qs), free(qp);
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
        cancelled(cancel, &items[j].err);
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

int tport_put_batch(tport_client *c, tport_put_item *items, size_t n, tport_err *err)
{
  return client_put_batch(c, items, n, NULL, err);
}

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
