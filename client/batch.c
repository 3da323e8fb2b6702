/*
 * batch.c: tport_get_batch -- n tensors in as few round trips as the
 * server allows (the puts are batch_put.c's).  A GetBatch asks for up to
 * BATCH_MAX_ELEMENTS tensors, and the server answers each inline while its
 * reply has room; a larger one is deferred, and all the deferred ones are
 * read in one window (batch_get_deferred.c: up to a chunk, four to a GetBatch,
 * inline; larger, a GetBegin each and the GetChunks of its transfer) -- or,
 * with the automatic region on, a larger one by path.c as a tport_get of
 * its own would.  A caller's buffer of a quarter MiB or more on the same
 * host is offered to the server, which writes a cpu tensor there itself
 * (process_region.c), in the first GetBatch or in a deferred one -- and
 * where every element has a buffer there is no first GetBatch: the
 * elements are planned by their buffers' sizes, all in that one window.
 * Every element keeps its own result and error: a reply element the
 * server got wrong fails that element.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch.h"
#include "get_blocks.h"

/* ---------------------------------------------------------------- gets */

/* The rest of element it's get, answered by b with its inline bytes at
 * *at of the reply's payload p; *at moves past them.  A deferred one goes
 * as a get of its own. */
static void get_element(tport_client *c, tport_get_item *it, const Tport__GetBeginReply *b,
                        bool deferred, const client_payload *p, size_t *at, bool blocks,
                        const atomic_bool *cancel, size_t *planned, uint64_t offered)
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
  /* (a larger one offered the server goes in that window too, as a
   * GetBegin it answers by writing it: else by path.c) */
  if (deferred && (b->nbytes <= c->chunk_bytes || !atomic_load(&c->shm_auto) || offered)) {
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
  if (b->direct) /* written into it->buf, where get_group offered it (if it did) */
    g.direct_region = offered;
  else if (b->transfer.len == 0 && !b->shm) {
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

/* Whether items[0..k) are planned by their buffers' sizes: every one into
 * a buffer of the caller's, on a connection whose server writes such
 * buffers itself, one of them large enough for that. */
static bool planned_by_buffers(tport_client *c, const tport_get_item *items, size_t k)
{
  bool direct = false;
  for (size_t j = 0; j < k; j++) {
    if (!items[j].buf)
      return false;
    if (!direct && items[j].cap >= CLIENT_SHM_MIN_BYTES)
      direct = client_get_direct_region(c, items[j].buf, items[j].cap) != 0;
  }
  return direct;
}

/* items[0..k) planned by their buffers' sizes, each as if a GetBatch had
 * deferred it: all in one window (batch_get_deferred), the first of its
 * requests no longer one of its own before the rest.  Whether they were
 * (not: out of memory). */
static bool get_by_buffers(tport_client *c, tport_get_item *items, size_t k, bool blocks,
                           const atomic_bool *cancel)
{
  size_t *planned = malloc(k * sizeof *planned);
  if (!planned)
    return false;
  for (size_t j = 0; j < k; j++) {
    planned[j] = items[j].cap;
    items[j].err.code = NOT_ANSWERED;
  }
  batch_get_deferred(c, items, k, planned, false, blocks, cancel); /* (caps) */
  free(planned);
  return true;
}

/* What a GetBatch asks to have inline, element it's bytes at most: over a
 * connection whose replies' ends nng reads straight into the destination
 * buffers (deploy/nng 0014), only what is under NNG_RECV_TAIL_MIN -- a
 * larger one deferred, its size known exactly, and read in place in the
 * window (the largest of each GetBatch there, or its chunks; into the
 * caller's buffer or one made for it first), where the first GetBatch's
 * inline answers were copied out of it (a state dict's 58 MB of
 * ResNet-50's 102, in one reply). */
static size_t first_inline_max(const tport_client *c, const tport_get_item *it)
{
#ifdef TPORT_NNG_RECV_TAIL
  (void)it; /* (a buffer of the caller's or one the library makes: both read in place) */
  if (c->lend_chunks)
    return c->chunk_bytes < NNG_RECV_TAIL_MIN - 1 ? c->chunk_bytes : NNG_RECV_TAIL_MIN - 1;
#else
  (void)it;
#endif
  return c->chunk_bytes;
}

/* One GetBatch of items[0..k) -- or, on the same host into the caller's
 * buffers, none: the window of what it would have deferred, planned by the
 * buffers (a state dict's first GetBatch, answered before anything else
 * went, was an eighth of its get). */
static void get_group(tport_client *c, tport_get_item *items, size_t k, bool blocks,
                      const atomic_bool *cancel)
{
  if (planned_by_buffers(c, items, k) && get_by_buffers(c, items, k, blocks, cancel))
    return;
  Tport__Ref *refs = calloc(k, sizeof *refs);
  Tport__GetBeginRequest *qs = calloc(k, sizeof *qs);
  Tport__GetBeginRequest **qp = calloc(k, sizeof *qp);
  size_t *planned = calloc(k, sizeof *planned); /* a deferred element's bytes */
  tport_err err;
  int rc = refs && qs && qp && planned
               ? TPORT_OK
               : tport_err_set(&err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t j = 0; !rc && j < k; j++) {
    client_ref_to_wire(&items[j].ref, &refs[j]);
    tport__get_begin_request__init(&qs[j]);
    qs[j].ref = &refs[j];
    qs[j].inline_max = first_inline_max(c, &items[j]);
    qs[j].want_crc32c = c->verify;
    /* a caller's buffer the server may write itself (process_region.c):
     * a tensor of a quarter MiB or more goes there, not inline */
    client_get_desc gd = {.ref = &items[j].ref, .buf = items[j].buf, .cap = items[j].cap};
    if (items[j].buf)
      gd.direct_region = client_get_direct_region(c, items[j].buf, items[j].cap);
    client_get_direct_fill(&gd, &qs[j]);
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
    rc = tport_err_set(&err, TPORT_DATA_LOSS, "the server answered %zu of %zu elements", r->n_gets,
                       k);
  size_t at = 0;
  for (size_t j = 0; j < k; j++) {
    if (rc)
      items[j].err = err;
    else if (!batch_cancelled(cancel, &items[j].err))
      get_element(c, &items[j], r->gets[j], r->n_deferred && r->deferred[j], &p, &at, blocks,
                  cancel, &planned[j], qs[j].direct_region);
  }
  if (planned)
    batch_get_deferred(c, items, k, planned, true, blocks, cancel);
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

int tport_get_batch_dlpack(tport_client *c, tport_get_item *items, size_t n, DLManagedTensor **out,
                           tport_err *err)
{
  if (n && !out)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "out is NULL: it has a slot per element");
  return client_get_batch(c, items, n, out, NULL, err);
}
