/*
 * handlers_transfer.c: Put (Begin, Chunk, Commit, Abort) and Get (Begin, Chunk).
 *
 * Put: PutBegin validates the descriptor (dense, offset 0: the payload is
 * the tensor's storage bytes in its own layout) and creates the landing
 * tensor on the destination device.  Chunks are fixed-size pieces at
 * multiples of chunk_bytes; each is staged through the pinned pool into the
 * landing tensor by the engine (async on a device), and is idempotent by
 * (handle, offset).  PutCommit converts dtype/format if asked and publishes
 * the tensor.
 *
 * Get: GetBegin starts a copy of the tensor into pinned host memory in
 * logical C order (non_blocking: the device works while the reply goes out);
 * GetChunk waits for it once, then serves byte ranges (several at once).
 * The transfer ends once as many bytes as the tensor holds have been served,
 * or with its connection.
 */
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>

#include "validate.h"
#include "wire.h"

/* ---------------------------------------------------------------- put */

static int commit_upload(call *c, reg_entry *e, bool non_blocking, tport_tensor **final_out);

int h_put_begin(call *c)
{
  Tport__PutBeginRequest *q = (Tport__PutBeginRequest *)c->req;
  server *s = c->srv;
  if (!q->desc)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT, "desc is missing");
  Tport__TensorDesc *d = q->desc;
  meta_layout l;
  validate_result vr;
  int rc = validate_desc((int)d->dtype, d->n_sizes, d->sizes, d->n_strides, d->strides,
                         d->storage_offset, -1, &l, &vr, &c->err);
  if (rc)
    return rc;
  if (l.offset != 0)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "desc.storage_offset is %lld: a put sends a whole storage (offset 0)",
                         (long long)l.offset);
  if (!meta_is_non_overlapping_and_dense(&l))
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "desc.strides: a put sends a dense tensor (no gaps, no overlaps)");
  if ((size_t)vr.nbytes > s->cfg.max_tensor_bytes)
    return tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED,
                         "the tensor is %lld bytes: the limit per tensor is %zu",
                         (long long)vr.nbytes, s->cfg.max_tensor_bytes);
  tport_device dev;
  rc = wire_device(q->device && *q->device ? q->device : d->device, "device",
                   (tport_device){TPORT_DEV_CPU, 0}, &dev, &c->err);
  if (rc)
    return rc;
  reg_upload *up = calloc(1, sizeof *up);
  if (!up)
    return tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  up->nbytes = (size_t)vr.nbytes;
  up->chunk_bytes = s->cfg.chunk_bytes;
  up->nchunks = (up->nbytes + up->chunk_bytes - 1) / up->chunk_bytes;
  size_t bitmap = (size_t)(up->nchunks + 7) / 8 + 1;
  up->claimed = calloc(bitmap, 1);
  up->received = calloc(bitmap, 1);
  if (q->dtype_set) {
    up->convert.has_dtype = true;
    rc = wire_dtype(q->dtype, "dtype", &up->convert.dtype, &c->err);
  }
  if (!rc && q->memory_format != TPORT__MEMORY_FORMAT__MF_PRESERVE) {
    up->convert.has_format = true;
    rc = wire_format(q->memory_format, "memory_format", &up->convert.format, &c->err);
  }
  up->convert.non_blocking = true;
  up->convert.exact_format = true; /* the stored tensor really is in the format asked for */
  up->needs_convert = up->convert.has_dtype || up->convert.has_format;
  /* --uvm: every put to a device lands in managed memory */
  unsigned flags = q->managed || (s->cfg.uvm && dev.type != TPORT_DEV_CPU) ? STORAGE_MANAGED : 0;
  if (!rc && (!up->claimed || !up->received))
    rc = tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  if (!rc)
    rc = tensor_empty_strided(dev, (tport_dtype)d->dtype, l.ndim, l.sizes, l.strides, flags,
                              &up->landing, &c->err);
  if (rc) {
    reg_upload_free(up);
    return rc;
  }
  if (q->commit && c->payload_len != up->nbytes) {
    size_t want = up->nbytes;
    reg_upload_free(up);
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "a committed put carries the whole tensor: %zu bytes came, %zu expected",
                         c->payload_len, want);
  }
  if (!q->commit && c->payload_len) {
    reg_upload_free(up);
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT, "PutBegin carries data only with commit");
  }
  /* the quota holds the landing tensor and, during commit, the converted one */
  size_t reserve = up->landing->storage->nbytes;
  if (up->needs_convert)
    reserve += (size_t)tensor_numel(up->landing) *
               tport_dtype_size(up->convert.has_dtype ? up->convert.dtype : up->landing->dtype);
  reg_entry *e;
  rc = reg_add(&s->reg, c->pipe, NULL, up, q->name, q->keep, q->ttl_ms, reserve, &e, &c->err);
  if (rc)
    return rc;
  wire_info wi;
  tport_tensor *final = NULL;
  if (q->commit) {
    /* the data, then the commit: one round trip */
    if (up->nchunks) {
      tport_tensor *src = NULL;
      int64_t n = (int64_t)up->nbytes;
      rc = tensor_wrap_host((void *)c->payload, up->nbytes, TPORT_UINT8, 1, &n, NULL, 0, &src,
                            &c->err);
      if (!rc) {
        tport_tensor *view = NULL;
        rc = tensor_byte_view(up->landing, 0, up->nbytes, &view, &c->err);
        if (!rc)
          rc = tensor_copy_(view, src, true, &c->err);
        tensor_release(view);
      }
      tensor_release(src);
      pthread_mutex_lock(&s->reg.mu);
      if (!rc) {
        memset(up->received, 0xff, (size_t)(up->nchunks + 7) / 8);
        up->nreceived = up->nchunks;
      }
      pthread_mutex_unlock(&s->reg.mu);
    }
    if (!rc)
      rc = commit_upload(c, e, q->non_blocking, &final);
    if (rc) {
      reg_remove(&s->reg, e);
      reg_put(&s->reg, e);
      return rc;
    }
    wire_fill_info(&wi, e, final);
  }
  Tport__PutBeginReply r = TPORT__PUT_BEGIN_REPLY__INIT;
  if (final)
    r.info = &wi.info;
  Tport__Ref ref = TPORT__REF__INIT;
  ref.handle.data = e->handle;
  ref.handle.len = REG_HANDLE_BYTES;
  ref.name = e->name;
  r.status = wire_ok();
  r.ref = &ref;
  r.chunk_bytes = s->cfg.chunk_bytes;
  r.window = (uint32_t)s->cfg.window;
  rc = call_reply(c, &r.base, NULL, 0);
  reg_put(&s->reg, e);
  return rc;
}

static bool bit(const uint8_t *b, uint64_t i)
{
  return b[i / 8] >> (i % 8) & 1;
}
static void set_bit(uint8_t *b, uint64_t i, bool v)
{
  if (v)
    b[i / 8] |= (uint8_t)(1u << (i % 8));
  else
    b[i / 8] &= (uint8_t) ~(1u << (i % 8));
}

static int find_upload(call *c, const Tport__Ref *ref, reg_entry **e)
{
  if (!ref)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT, "ref is missing");
  int rc =
      reg_find(&c->srv->reg, c->pipe, ref->handle.data, ref->handle.len, ref->name, e, &c->err);
  if (rc)
    return rc;
  if ((*e)->state != REG_UPLOADING) {
    reg_put(&c->srv->reg, *e);
    *e = NULL;
    return tport_err_set(&c->err, TPORT_FAILED_PRECONDITION,
                         "ref is not an upload in progress (already committed)");
  }
  return TPORT_OK;
}

/* Claims chunk i: 1 = ours to write, 0 = already written (idempotent), <0 error. */
static int claim_chunk(call *c, reg_entry *e, uint64_t i)
{
  registry *r = &c->srv->reg;
  pthread_mutex_lock(&r->mu);
  reg_upload *up = e->up;
  int res;
  if (!up || e->removed) {
    res = -tport_err_set(&c->err, TPORT_ABORTED, "the upload was aborted");
  } else if (bit(up->received, i)) {
    res = 0;
  } else if (bit(up->claimed, i)) {
    res = -tport_err_set(&c->err, TPORT_ABORTED,
                         "chunk %llu is being written by another request: retry",
                         (unsigned long long)i);
  } else {
    set_bit(up->claimed, i, true);
    up->inflight++;
    res = 1;
  }
  pthread_mutex_unlock(&r->mu);
  return res;
}

static void finish_chunk(call *c, reg_entry *e, uint64_t i, bool ok)
{
  registry *r = &c->srv->reg;
  pthread_mutex_lock(&r->mu);
  reg_upload *up = e->up;
  if (up) {
    up->inflight--;
    if (ok) {
      set_bit(up->received, i, true);
      up->nreceived++;
    } else {
      set_bit(up->claimed, i, false);
    }
  }
  pthread_mutex_unlock(&r->mu);
}

int h_put_chunk(call *c)
{
  Tport__PutChunkRequest *q = (Tport__PutChunkRequest *)c->req;
  server *s = c->srv;
  reg_entry *e = NULL;
  int rc = find_upload(c, q->ref, &e); /* the in-flight limit was checked on arrival */
  uint64_t i = 0;
  int claim = 0;
  if (!rc) {
    /* up stays valid: reg_find's reference keeps the entry, and only commit
     * (which refuses while chunks are in flight) or the entry's end frees it */
    reg_upload *up = e->up;
    size_t len = c->payload_len;
    if (q->offset >= up->nbytes && !(up->nbytes == 0 && q->offset == 0 && len == 0))
      rc = tport_err_set(&c->err, TPORT_OUT_OF_RANGE, "offset %llu is past the tensor's %zu bytes",
                         (unsigned long long)q->offset, up->nbytes);
    else if (q->offset % up->chunk_bytes)
      rc = tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "offset %llu is not a multiple of the chunk size %zu: chunks may not "
                         "overlap",
                         (unsigned long long)q->offset, up->chunk_bytes);
    if (!rc) {
      i = q->offset / up->chunk_bytes;
      size_t want = up->nbytes - q->offset < up->chunk_bytes ? up->nbytes - (size_t)q->offset
                                                             : up->chunk_bytes;
      if (len != want)
        rc = tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                           "chunk at offset %llu carries %zu bytes: it must carry %zu",
                           (unsigned long long)q->offset, len, want);
    }
    if (!rc) {
      claim = claim_chunk(c, e, i);
      if (claim < 0)
        rc = -claim;
    }
    if (!rc && claim == 1) {
      tport_tensor *view = NULL, *src = NULL;
      int64_t n = (int64_t)len;
      rc = tensor_byte_view(up->landing, (size_t)q->offset, len, &view, &c->err);
      if (!rc)
        rc = tensor_wrap_host((void *)c->payload, len, TPORT_UINT8, 1, &n, NULL, 0, &src, &c->err);
      /* staged through pinned memory: the payload is free to go when this returns */
      if (!rc)
        rc = tensor_copy_(view, src, true, &c->err);
      tensor_release(src);
      tensor_release(view);
      finish_chunk(c, e, i, rc == TPORT_OK);
    }
  }
  if (!rc) {
    Tport__PutChunkReply r = TPORT__PUT_CHUNK_REPLY__INIT;
    r.status = wire_ok();
    r.received_bytes = c->payload_len;
    rc = call_reply(c, &r.base, NULL, 0);
  }
  reg_put(&s->reg, e);
  return rc;
}

/* Turns a complete upload into its stored tensor (converted if asked) and
 * publishes it.  On success *final is the entry's tensor (borrowed). */
static int commit_upload(call *c, reg_entry *e, bool non_blocking, tport_tensor **final_out)
{
  server *s = c->srv;
  pthread_mutex_lock(&s->reg.mu);
  reg_upload *up = e->up;
  uint64_t missing = up->nchunks - up->nreceived;
  int inflight = up->inflight;
  pthread_mutex_unlock(&s->reg.mu);
  if (inflight)
    return tport_err_set(&c->err, TPORT_FAILED_PRECONDITION, "%d chunk%s still being written",
                         inflight, inflight == 1 ? " is" : "s are");
  if (missing)
    return tport_err_set(&c->err, TPORT_FAILED_PRECONDITION, "%llu of %llu chunks are missing",
                         (unsigned long long)missing, (unsigned long long)up->nchunks);
  tport_tensor *final = NULL;
  int rc = TPORT_OK;
  if (up->needs_convert) {
    bool aliased;
    to_options o = up->convert;
    o.non_blocking = non_blocking;
    rc = tensor_to(up->landing, &o, &final, &aliased, &c->err);
  } else {
    final = tensor_retain(up->landing);
  }
  if (!rc && !non_blocking)
    rc = tensor_sync(final, &c->err);
  if (rc) {
    tensor_release(final);
    return rc;
  }
  reg_ready(&s->reg, e, final);
  *final_out = final;
  return TPORT_OK;
}

int h_put_commit(call *c)
{
  Tport__PutCommitRequest *q = (Tport__PutCommitRequest *)c->req;
  reg_entry *e;
  tport_tensor *final;
  int rc = find_upload(c, q->ref, &e);
  if (rc)
    return rc;
  rc = commit_upload(c, e, q->non_blocking, &final);
  if (!rc) {
    wire_info wi;
    wire_fill_info(&wi, e, final);
    Tport__PutCommitReply r = TPORT__PUT_COMMIT_REPLY__INIT;
    r.status = wire_ok();
    r.info = &wi.info;
    rc = call_reply(c, &r.base, NULL, 0);
  }
  reg_put(&c->srv->reg, e);
  return rc;
}

int h_put_abort(call *c)
{
  Tport__PutAbortRequest *q = (Tport__PutAbortRequest *)c->req;
  reg_entry *e;
  int rc = find_upload(c, q->ref, &e);
  if (rc)
    return rc;
  reg_remove(&c->srv->reg, e);
  reg_put(&c->srv->reg, e);
  Tport__PutAbortReply r = TPORT__PUT_ABORT_REPLY__INIT;
  r.status = wire_ok();
  return call_reply(c, &r.base, NULL, 0);
}

/* ---------------------------------------------------------------- get */

static void transfer_free(get_transfer *g)
{
  for (int k = 0; k < g->nfences; k++)
    if (g->fence[k])
      g->fence_be[k]->event_destroy(g->fence[k]);
  free(g->fence);
  free(g->fence_be);
  tensor_release(g->host);
  free(g);
}

static void transfer_unref(get_transfer *g)
{
  if (--g->refs == 0)
    transfer_free(g);
}

/* Starts copying t into pinned host memory in logical C order.  A device
 * tensor served in chunks is copied chunk by chunk, each copy followed by a
 * fence, so that GetChunk serves the first chunks while later ones are still
 * copying (read-ahead); anything else is one non_blocking copy. */
static int stage_for_get(call *c, tport_tensor *t, bool inline_data, get_transfer *g)
{
  size_t nbytes = tensor_nbytes(t), chunk = c->srv->cfg.chunk_bytes;
  bool aliased;
  if (tensor_device(t).type == TPORT_DEV_CPU || inline_data || nbytes <= chunk) {
    /* an alias when t already is exactly that */
    to_options o = {.has_device = true,
                    .device = {TPORT_DEV_CPU, 0},
                    .has_format = true,
                    .format = TPORT_MF_CONTIGUOUS,
                    .exact_format = true,
                    .non_blocking = true,
                    .copy = t->conj || t->neg};
    return tensor_to(t, &o, &g->host, &aliased, &c->err);
  }
  to_options o = {.has_format = true,
                  .format = TPORT_MF_CONTIGUOUS,
                  .exact_format = true,
                  .non_blocking = true,
                  .copy = t->conj || t->neg};
  tport_tensor *dev_c = NULL;
  int rc = tensor_to(t, &o, &dev_c, &aliased, &c->err); /* contiguous, on its device */
  if (!rc)
    rc = tensor_empty((tport_device){TPORT_DEV_CPU, 0}, t->dtype, t->layout.ndim, t->layout.sizes,
                      TPORT_MF_CONTIGUOUS, STORAGE_PINNED, &g->host, &c->err);
  g->chunk = chunk;
  int n = (int)((nbytes + chunk - 1) / chunk);
  if (!rc) {
    g->fence = calloc((size_t)n, sizeof *g->fence);
    g->fence_be = calloc((size_t)n, sizeof *g->fence_be);
    if (!g->fence || !g->fence_be)
      rc = tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  }
  for (int k = 0; !rc && k < n; k++) {
    size_t off = (size_t)k * chunk, len = nbytes - off < chunk ? nbytes - off : chunk;
    tport_tensor *hv = NULL, *dv = NULL;
    rc = tensor_byte_view(g->host, off, len, &hv, &c->err);
    if (!rc)
      rc = tensor_byte_view(dev_c, off, len, &dv, &c->err);
    if (!rc)
      rc = tensor_copy_(hv, dv, true, &c->err);
    if (!rc)
      rc = storage_fence(g->host->storage, &g->fence_be[k], &g->fence[k], &c->err);
    if (!rc)
      g->nfences = k + 1;
    tensor_release(hv);
    tensor_release(dv);
  }
  tensor_release(dev_c);
  return rc;
}

void transfers_drop(server *s, uint32_t pipe)
{
  pthread_mutex_lock(&s->tmu);
  get_transfer *keep = NULL, *next;
  for (get_transfer *t = s->transfers; t; t = next) {
    next = t->next;
    if (pipe == 0 || t->pipe == pipe) {
      transfer_unref(t);
    } else {
      t->next = keep;
      keep = t;
    }
  }
  s->transfers = keep;
  pthread_mutex_unlock(&s->tmu);
}

int h_get_begin(call *c)
{
  Tport__GetBeginRequest *q = (Tport__GetBeginRequest *)c->req;
  server *s = c->srv;
  reg_entry *e;
  tport_tensor *t;
  int rc = wire_find(c, q->ref, "ref", &e, &t);
  if (rc)
    return rc;
  get_transfer *g = calloc(1, sizeof *g);
  if (!g) {
    reg_put(&s->reg, e);
    return tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  }
  /* small tensors come back in this reply; an empty one has nothing to wait for */
  size_t want = tensor_nbytes(t);
  bool inline_data = want <= q->inline_max && want <= s->cfg.max_message_bytes;
  rc = stage_for_get(c, t, inline_data, g);
  if (!rc && RAND_bytes(g->id, TRANSFER_ID_BYTES) != 1)
    rc = tport_err_set(&c->err, TPORT_INTERNAL, "cannot create a transfer id");
  if (rc) {
    transfer_free(g);
    reg_put(&s->reg, e);
    return rc;
  }
  tport_tensor *host = g->host;
  g->pipe = c->pipe;
  g->nbytes = tensor_nbytes(host);
  g->refs = 1;
  bool keep = g->nbytes > 0 && !inline_data;
  const uint8_t *payload = NULL;
  if (inline_data && g->nbytes) {
    rc = tensor_sync(host, &c->err);
    payload = (const uint8_t *)host->storage->ptr +
              host->layout.offset * (int64_t)tport_dtype_size(host->dtype);
  }
  if (rc) {
    transfer_free(g);
    reg_put(&s->reg, e);
    return rc;
  }
  if (keep) {
    pthread_mutex_lock(&s->tmu);
    g->next = s->transfers;
    s->transfers = g;
    pthread_mutex_unlock(&s->tmu);
  }
  wire_info wi;
  wire_fill_info(&wi, e, t);
  Tport__GetBeginReply r = TPORT__GET_BEGIN_REPLY__INIT;
  r.status = wire_ok();
  r.info = &wi.info;
  r.nbytes = g->nbytes;
  r.chunk_bytes = s->cfg.chunk_bytes;
  r.transfer.data = g->id;
  r.transfer.len = keep ? TRANSFER_ID_BYTES : 0;
  rc = call_reply(c, &r.base, payload, payload ? g->nbytes : 0);
  if (!keep)
    transfer_free(g);
  reg_put(&s->reg, e);
  return rc;
}

int h_get_chunk(call *c)
{
  Tport__GetChunkRequest *q = (Tport__GetChunkRequest *)c->req;
  server *s = c->srv;
  if (q->transfer.len != TRANSFER_ID_BYTES)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "transfer is %zu bytes: transfer ids are %d", q->transfer.len,
                         TRANSFER_ID_BYTES);
  pthread_mutex_lock(&s->tmu);
  get_transfer *g = NULL;
  for (get_transfer *t = s->transfers; t; t = t->next)
    if (t->pipe == c->pipe && memcmp(t->id, q->transfer.data, TRANSFER_ID_BYTES) == 0) {
      g = t;
      g->refs++; /* a drop meanwhile cannot free it under us */
      break;
    }
  pthread_mutex_unlock(&s->tmu);
  if (!g)
    return tport_err_set(&c->err, TPORT_NOT_FOUND, "no transfer with that id on this connection");
  int rc = TPORT_OK;
  if (q->offset > g->nbytes || q->length > g->nbytes - q->offset)
    rc = tport_err_set(
        &c->err, TPORT_OUT_OF_RANGE, "bytes [%llu, %llu) are outside the tensor's %zu bytes",
        (unsigned long long)q->offset, (unsigned long long)(q->offset + q->length), g->nbytes);
  else if (q->length > s->cfg.max_message_bytes)
    rc = tport_err_set(&c->err, TPORT_INVALID_ARGUMENT, "length %llu is over the limit %zu",
                       (unsigned long long)q->length, s->cfg.max_message_bytes);
  if (!rc && g->nfences && q->length) {
    /* read-ahead: wait only for the copies of the chunks asked for (they
     * complete in order on one stream: the last one's fence is enough) */
    int last = (int)((q->offset + q->length - 1) / g->chunk);
    if (last >= g->nfences)
      last = g->nfences - 1;
    if (g->fence[last])
      rc = g->fence_be[last]->event_synchronize(g->fence[last], &c->err);
  }
  pthread_mutex_lock(&s->tmu);
  bool synced = g->synced || g->nfences;
  pthread_mutex_unlock(&s->tmu);
  if (!rc && !synced) {
    rc = tensor_sync(g->host, &c->err);
    pthread_mutex_lock(&s->tmu);
    g->synced = rc == TPORT_OK;
    pthread_mutex_unlock(&s->tmu);
  }
  if (!rc) {
    Tport__GetChunkReply r = TPORT__GET_CHUNK_REPLY__INIT;
    r.status = wire_ok();
    r.offset = q->offset;
    const uint8_t *base =
        g->nbytes ? (const uint8_t *)g->host->storage->ptr +
                        g->host->layout.offset * (int64_t)tport_dtype_size(g->host->dtype)
                  : NULL;
    rc = call_reply(c, &r.base, base ? base + q->offset : NULL, (size_t)q->length);
  }
  pthread_mutex_lock(&s->tmu);
  int drops = 1; /* this call's reference */
  if (!rc) {
    g->served += (size_t)q->length;
    if (g->served >= g->nbytes) {
      /* every byte has gone out once: the transfer ends (the list's reference) */
      for (get_transfer **p = &s->transfers; *p; p = &(*p)->next)
        if (*p == g) {
          *p = g->next;
          drops++;
          break;
        }
    }
  }
  g->refs -= drops;
  bool gone = g->refs == 0;
  pthread_mutex_unlock(&s->tmu);
  if (gone)
    transfer_free(g);
  return rc;
}
