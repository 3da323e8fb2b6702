/*
 * handlers_transfer.c: Put (Begin, Chunk, Commit, Abort) and Get (Begin, Chunk).
 *
 * Put: PutBegin validates the descriptor (dense, offset 0: the payload is
 * the tensor's storage bytes in its own layout) and creates the landing
 * tensor on the destination device.  Chunks are fixed-size pieces at
 * multiples of chunk_bytes; each is staged through the pinned pool into the
 * landing tensor by the engine (async on a device), and is idempotent by
 * (handle, offset).  PutCommit converts dtype/format if asked and publishes
 * the tensor -- except a dtype change that keeps the client's strides, which
 * converts each chunk as it lands, straight into the final tensor.
 *
 * Get: GetBegin makes the values ready in logical C order; GetChunk serves
 * byte ranges of them (several at once), each lent to its reply rather
 * than copied into it (call_reply_lent: nng writes it to the socket from
 * there), as the engine's reader hands them out (readback.h): from a
 * device, each range is read back into a recycled pinned block of the
 * read-back pool when it is asked for; from the host, straight from the
 * tensor when it is contiguous, else from a copy made contiguous.
 * The transfer ends once as many bytes as the tensor holds have been served,
 * when it has not been read from for a while, or with its connection
 * (transfers.c).
 *
 * Same host: a PutBegin (with commit) or a GetBegin may name a slice of a
 * region (regions.h) instead of carrying bytes: the bytes are copied once,
 * between the region and the tensor, converted on the way where the put
 * asks for it; nothing rides in the messages.
 */
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "dtype.h"
#include "validate.h"
#include "wire.h"

/* ---------------------------------------------------------------- put */

static int commit_upload(call *c, reg_entry *e, bool non_blocking, tport_tensor **final_out);

/* A cpu tensor over n bytes at p (a payload, or a slice of a region:
 * pinned when the region is registered with the GPU driver). */
static int wrap_host(const uint8_t *p, size_t n, bool pinned, tport_dtype dt, int ndim,
                     const int64_t *sizes, const int64_t *strides, tport_tensor **out,
                     tport_err *err)
{
  return pinned ? tensor_wrap_host_pinned((void *)p, n, dt, ndim, sizes, strides, 0, out, err)
                : tensor_wrap_host((void *)p, n, dt, ndim, sizes, strides, 0, out, err);
}

/* A whole put's or get's slice: host memory, or GPU memory of *dev (a
 * CUDA IPC region, *on_dev): wrapped on its device, never read here. */
static int hold_whole(call *c, const Tport__ShmSlice *sl, shm_region **held, uint8_t **p,
                      bool *pinned, tport_device *dev, bool *on_dev)
{
  return shm_hold_any(c->srv->shm, c->pipe, sl->region, sl->offset, sl->length, held, p, pinned,
                      dev, on_dev, &c->err);
}

static int wrap_any(uint8_t *p, size_t n, bool pinned, bool on_dev, tport_device dev,
                    tport_dtype dt, int ndim, const int64_t *sizes, const int64_t *strides,
                    tport_tensor **out, tport_err *err)
{
  return on_dev ? tensor_wrap_device(dev, p, n, dt, ndim, sizes, strides, 0, out, err)
                : wrap_host(p, n, pinned, dt, ndim, sizes, strides, out, err);
}

static int wrap_bytes(const uint8_t *p, size_t n, tport_dtype dt, int64_t count, bool pinned,
                      tport_tensor **out, tport_err *err)
{
  return wrap_host(p, n, pinned, dt, 1, &count, NULL, out, err);
}

/* A copy from or into a region the GPU driver reads directly (pinned) may
 * have been enqueued before the call failed: whatever happened, it ends
 * before the region may go (issue 20, finding 9).  wrap is the tensor over
 * the region: its pending event is the last copy that touched it. */
static int settle_region(tport_tensor *wrap, bool pinned, int rc, tport_err *err)
{
  if (!pinned || !wrap)
    return rc;
  int src = tensor_sync(wrap, rc ? NULL : err);
  return rc ? rc : src;
}

/* Converts n payload bytes -- whole elements of the client's dtype st,
 * storage bytes [off, off + n) -- into the landing tensor, which has the
 * client's strides in another dtype: the same elements in the same storage
 * order, so the chunk is a 1-D run of both storages. */
static int land_converted(call *c, tport_tensor *landing, tport_dtype st, size_t off,
                          const uint8_t *p, size_t n, bool pinned)
{
  size_t ss = tport_dtype_size(st);
  int64_t count = (int64_t)(n / ss), one = 1;
  tport_tensor *view = NULL, *src = NULL;
  int rc = tensor_as_strided(landing, 1, &count, &one, (int64_t)(off / ss), &view, &c->err);
  if (!rc)
    rc = wrap_bytes(p, n, st, count, pinned, &src, &c->err);
  /* non_blocking: the payload is staged (pinned) before this returns -- or,
   * from a pinned region, read by the device later (the caller syncs) */
  if (!rc)
    rc = tensor_copy_(view, src, true, &c->err);
  rc = settle_region(src, pinned, rc, &c->err);
  tensor_release(src);
  tensor_release(view);
  return rc;
}

/* Copies n payload bytes into the landing tensor at byte offset off. */
static int land_bytes(call *c, tport_tensor *landing, size_t off, const uint8_t *p, size_t n,
                      bool pinned)
{
  tport_tensor *view = NULL, *src = NULL;
  int64_t len = (int64_t)n;
  int rc = tensor_byte_view(landing, off, n, &view, &c->err);
  if (!rc)
    rc = wrap_bytes(p, n, TPORT_UINT8, len, pinned, &src, &c->err);
  /* staged through pinned memory: the payload is free to go when this
   * returns (a pinned region's bytes: once the caller synced) */
  if (!rc)
    rc = tensor_copy_(view, src, true, &c->err);
  rc = settle_region(src, pinned, rc, &c->err);
  tensor_release(src);
  tensor_release(view);
  return rc;
}

/* A payload sent with its CRC32C must arrive with it: else DATA_LOSS, naming
 * the chunk, and nothing is written (the client may send it again). */
static int check_crc32c_of(call *c, bool set, uint32_t sent, uint64_t off, const uint8_t *p,
                           size_t n)
{
  if (!set)
    return TPORT_OK;
  uint32_t got = transport_crc32c(0, p, n);
  if (got == sent)
    return TPORT_OK;
  return tport_err_set(&c->err, TPORT_DATA_LOSS,
                       "the chunk at offset %llu (%zu bytes) arrived with CRC32C 0x%08x; it was "
                       "sent with 0x%08x",
                       (unsigned long long)off, n, got, sent);
}

static int check_crc32c(call *c, bool set, uint32_t sent, uint64_t off)
{
  return check_crc32c_of(c, set, sent, off, c->payload, c->payload_len);
}

/* Writes the claimed bytes [off, off + n) of e's upload from the payload. */
static int put_bytes(call *c, reg_entry *e, uint64_t off, const uint8_t *p, size_t n, bool pinned)
{
  tport_tensor *landing = NULL;
  int convert_from;
  int rc = reg_chunk_claim(&c->srv->reg, e, off, n, &landing, &convert_from, &c->err);
  if (rc || !landing)
    return rc; /* an error, or written already (idempotent) */
  int64_t t0 = metrics_now_ns();
  if (convert_from >= 0) {
    rc = land_converted(c, landing, (tport_dtype)convert_from, (size_t)off, p, n, pinned);
    metrics_stage_since(&c->srv->metrics, STAGE_CONVERT, t0);
  } else {
    rc = land_bytes(c, landing, (size_t)off, p, n, pinned);
    metrics_stage_since(&c->srv->metrics, STAGE_STAGE, t0);
  }
  /* a device reads a pinned region directly: done before the region may go,
   * a failed copy's too (its work may have been enqueued) */
  if (pinned) {
    int synced = tensor_sync(landing, rc ? NULL : &c->err);
    rc = rc ? rc : synced;
  }
  tensor_release(landing);
  reg_chunk_done(&c->srv->reg, e, off, n, rc == TPORT_OK);
  return rc;
}

/* PutBegin's reply: the entry's ref, the chunking, and the stored tensor
 * when the put committed (final); releases the caller's reference to e. */
static int put_begin_reply(call *c, reg_entry *e, tport_tensor *final)
{
  server *s = c->srv;
  wire_info wi;
  Tport__PutBeginReply r = TPORT__PUT_BEGIN_REPLY__INIT;
  if (final) {
    wire_fill_info(&wi, e, final);
    r.info = &wi.info;
  }
  Tport__Ref ref = TPORT__REF__INIT;
  ref.handle.data = e->handle;
  ref.handle.len = REG_HANDLE_BYTES;
  ref.name = e->name;
  r.status = wire_ok();
  r.ref = &ref;
  r.chunk_bytes = s->cfg.chunk_bytes;
  r.window = (uint32_t)s->cfg.window;
  int rc = call_reply(c, &r.base, NULL, 0);
  reg_put(&s->reg, e);
  return rc;
}

/* The connection's region slice a request names, held for the copy
 * (shm_unhold it): *p its bytes, *pinned whether the GPU driver knows them. */
static int hold_slice(call *c, const Tport__ShmSlice *sl, shm_region **held, uint8_t **p,
                      bool *pinned)
{
  return shm_hold(c->srv->shm, c->pipe, sl->region, sl->offset, sl->length, held, p, pinned,
                  &c->err);
}

/* A put from a region: the client's bytes, in its layout, converted (to
 * the device, dtype and memory format asked) by one copy straight into the
 * tensor that is stored -- what an upload's landing and commit make of
 * them, without the landing.  The copy ends before the region may go. */
static int put_from_region(call *c, const Tport__PutBeginRequest *q, const meta_layout *l,
                           tport_dtype from, tport_device dev, const to_options *convert)
{
  server *s = c->srv;
  shm_region *held = NULL;
  uint8_t *p = NULL;
  bool pinned = false, on_dev = false;
  tport_device mem_dev;
  int rc = hold_whole(c, q->shm, &held, &p, &pinned, &mem_dev, &on_dev);
  if (rc)
    return rc;
  size_t len = (size_t)q->shm->length;
  if (on_dev && q->crc32c_set)
    rc = tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                       "crc32c: the bytes of a CUDA IPC region are not read by the host");
  else
    rc = check_crc32c_of(c, q->crc32c_set, q->crc32c, 0, p, len);
  tport_tensor *src = NULL, *final = NULL;
  reg_reservation paid = REG_RESERVATION_INIT(&s->reg, c->pipe);
  if (!rc)
    rc = wrap_any(p, len, pinned, on_dev, mem_dev, from, l->ndim, l->sizes, l->strides, &src,
                  &c->err);
  int64_t t0 = metrics_now_ns();
  if (!rc) {
    to_options o = *convert;
    o.has_device = true;
    o.device = dev;
    o.copy = true; /* never an alias of the client's memory */
    o.non_blocking = false;
    bool aliased = false;
    /* the stored tensor is charged before it is made */
    size_t need = 0;
    rc = tensor_to_nbytes(src, &o, &need, &c->err);
    if (!rc && (rc = wire_charge_begin(c, &paid, need, "the put's tensor")) == TPORT_OK) {
      rc = tensor_to(src, &o, &final, &aliased, &c->err);
      wire_charge_end(&paid);
    }
    if (!rc && (aliased || final->storage == src->storage))
      rc = tport_err_set(&c->err, TPORT_INTERNAL, "a put from a region aliased the region");
    if (!rc)
      rc = tensor_sync(final, &c->err);
    rc = settle_region(src, pinned, rc, &c->err);
  }
  metrics_stage_since(&s->metrics,
                      dev.type != TPORT_DEV_CPU ? STAGE_HOST_TO_DEVICE
                      : (convert->has_dtype || convert->has_format) ? STAGE_CONVERT
                                                                    : STAGE_STAGE,
                      t0);
  tensor_release(src);
  shm_unhold(s->shm, held);
  if (rc) {
    tensor_release(final);
    reg_reservation_release(&paid);
    return rc;
  }
  atomic_fetch_add(&s->bytes_in, len);
  shm_count_transfer(s->shm);
  reg_entry *e;
  rc = reg_add(&s->reg, c->pipe, final, NULL, q->name, q->keep, q->ttl_ms, 0, &paid, &e, &c->err);
  if (rc)
    return rc; /* final freed with the entry that could not be */
  return put_begin_reply(c, e, final);
}

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
  if (q->shm) {
    /* the bytes are in a region: checked against it when the copy holds it */
    if (!q->commit)
      return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                           "a put from a region commits at once (set commit)");
    if (c->payload_len)
      return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                           "a put from a region carries no payload (%zu bytes came)",
                           c->payload_len);
    if (q->shm->length != (uint64_t)vr.nbytes)
      return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                           "shm.length is %llu: the tensor is %lld bytes",
                           (unsigned long long)q->shm->length, (long long)vr.nbytes);
  } else {
    if (q->commit && c->payload_len != (size_t)vr.nbytes)
      return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                           "a committed put carries the whole tensor: %zu bytes came, %lld "
                           "expected",
                           c->payload_len, (long long)vr.nbytes);
    if (!q->commit && c->payload_len)
      return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                           "PutBegin carries data only with commit");
    if ((rc = check_crc32c(c, q->crc32c_set, q->crc32c, 0)) != TPORT_OK)
      return rc;
  }
  if (c->payload_len)
    metrics_stage_since(&s->metrics, STAGE_RECEIVE, c->arrived_ns);
  tport_device dev;
  rc = wire_device(q->device && *q->device ? q->device : d->device, "device",
                   (tport_device){TPORT_DEV_CPU, 0}, &dev, &c->err);
  if (rc)
    return rc;
  /* what commit will make of it, checked now rather than at commit */
  to_options convert = {.non_blocking = true,
                        .exact_format = true}; /* the stored tensor really is in the format asked */
  if (q->dtype_set) {
    convert.has_dtype = true;
    rc = wire_dtype(q->dtype, "dtype", &convert.dtype, &c->err);
  }
  if (!rc && q->memory_format != TPORT__MEMORY_FORMAT__MF_PRESERVE) {
    convert.has_format = true;
    rc = wire_format(q->memory_format, "memory_format", &convert.format, &c->err);
    int64_t strides[TPORT_MAX_DIMS];
    tport_err why;
    if (!rc && meta_fresh_strides(l.ndim, l.sizes, convert.format, strides, &why))
      rc = tport_err_set(&c->err, TPORT_INVALID_ARGUMENT, "memory_format: %s", why.msg);
  }
  size_t reserve = 0; /* the converted tensor a conversion at the commit makes */
  bool needs_convert = convert.has_dtype || convert.has_format, on_arrival = false;
  tport_dtype from = (tport_dtype)d->dtype, to = convert.has_dtype ? convert.dtype : from;
  if (!rc && needs_convert) {
    rc = wire_check_bytes(c, "the converted tensor", vr.numel, tport_dtype_size(to));
    reserve = (size_t)vr.numel * tport_dtype_size(to);
    /* A dtype change that keeps the client's strides converts each chunk as
     * it lands (no landing copy, no second pass at commit): to(dtype) keeps
     * a dense tensor's strides, and with a memory format too when its fresh
     * strides are the client's.  Chunks then hold whole elements. */
    int64_t fresh[TPORT_MAX_DIMS];
    tport_err why;
    bool same_strides =
        !convert.has_format ||
        (meta_fresh_strides(l.ndim, l.sizes, convert.format, fresh, &why) == TPORT_OK &&
         memcmp(fresh, l.strides, sizeof *fresh * (size_t)l.ndim) == 0);
    on_arrival = !rc && to != from && same_strides &&
                 s->cfg.chunk_bytes % tport_dtype_size(from) == 0;
  }
  if (rc)
    return rc;
  /* --uvm: every put to a device lands in managed memory */
  unsigned flags = q->managed || (s->cfg.uvm && dev.type != TPORT_DEV_CPU) ? STORAGE_MANAGED : 0;
  if (q->shm && !flags)
    return put_from_region(c, q, &l, from, dev, &convert);
  /* The landing tensor (converting on arrival, the final one) and what a
   * conversion at the commit will make are charged before either exists:
   * a put the tenant cannot hold is refused here, having allocated nothing.
   * Both sizes are within --max-tensor (checked above). */
  if (on_arrival)
    reserve = 0;
  size_t landing_bytes = on_arrival ? (size_t)vr.numel * tport_dtype_size(to) : (size_t)vr.nbytes,
         upfront;
  if (__builtin_add_overflow(landing_bytes, reserve, &upfront))
    return tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED,
                         "the put would hold %zu + %zu bytes: more than this server can count",
                         landing_bytes, reserve);
  reg_reservation paid;
  rc = wire_charge_begin(c, &paid, upfront,
                         reserve ? "the put's landing and converted tensors" : "the put's tensor");
  if (rc)
    return rc;
  reg_upload *up = calloc(1, sizeof *up);
  if (!up) {
    rc = tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  } else {
    up->convert = convert;
    up->needs_convert = needs_convert && !on_arrival;
    up->convert_on_arrival = on_arrival;
    up->source_dtype = from;
    up->nbytes = (size_t)vr.nbytes;
    up->chunk_bytes = s->cfg.chunk_bytes;
    up->nchunks = (up->nbytes + up->chunk_bytes - 1) / up->chunk_bytes;
    size_t bitmap = (size_t)(up->nchunks + 7) / 8 + 1;
    up->claimed = calloc(bitmap, 1);
    up->received = calloc(bitmap, 1);
    if (!up->claimed || !up->received)
      rc = tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  }
  /* converting on arrival, the landing tensor is the final one */
  if (!rc)
    rc = tensor_empty_strided(dev, on_arrival ? to : from, l.ndim, l.sizes, l.strides, flags,
                              &up->landing, &c->err);
  wire_charge_end(&paid);
  if (rc) {
    reg_upload_free(up);
    reg_reservation_release(&paid);
    return rc;
  }
  reg_entry *e;
  rc =
      reg_add(&s->reg, c->pipe, NULL, up, q->name, q->keep, q->ttl_ms, reserve, &paid, &e, &c->err);
  if (rc)
    return rc;
  tport_tensor *final = NULL;
  if (q->commit) {
    /* the data, then the commit: one round trip */
    const uint8_t *data = c->payload;
    size_t len = c->payload_len;
    shm_region *held = NULL;
    bool pinned = false;
    if (q->shm) {
      uint8_t *p = NULL;
      rc = hold_slice(c, q->shm, &held, &p, &pinned);
      data = p;
      len = (size_t)q->shm->length;
      if (!rc)
        rc = check_crc32c_of(c, q->crc32c_set, q->crc32c, 0, data, len);
      if (!rc)
        atomic_fetch_add(&s->bytes_in, len);
      if (!rc)
        shm_count_transfer(s->shm);
    }
    if (!rc)
      rc = put_bytes(c, e, 0, data, len, pinned);
    /* from a region, the copy ends before the region may go (it is the
     * client's memory, and may be released or unmapped right after) */
    if (!rc)
      rc = commit_upload(c, e, q->non_blocking && !held, &final);
    shm_unhold(s->shm, held);
    if (rc) {
      reg_remove(&s->reg, e);
      reg_put(&s->reg, e);
      return rc;
    }
  }
  return put_begin_reply(c, e, final);
}

static int find_upload(call *c, const Tport__Ref *ref, reg_entry **e)
{
  if (!ref)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT, "ref is missing");
  reg_state state;
  int rc = reg_find(&c->srv->reg, c->pipe, ref->handle.data, ref->handle.len, ref->name, e, &state,
                    &c->err);
  if (rc)
    return rc;
  if (state != REG_UPLOADING) {
    reg_put(&c->srv->reg, *e);
    *e = NULL;
    return tport_err_set(&c->err, TPORT_FAILED_PRECONDITION,
                         "ref is not an upload in progress (already committed)");
  }
  return TPORT_OK;
}

int h_put_chunk(call *c)
{
  Tport__PutChunkRequest *q = (Tport__PutChunkRequest *)c->req;
  reg_entry *e = NULL;
  int rc = find_upload(c, q->ref, &e); /* the in-flight limit was checked on arrival */
  const uint8_t *data = c->payload;
  size_t len = c->payload_len;
  shm_region *held = NULL;
  bool pinned = false;
  if (!rc && q->shm) {
    /* the chunk's bytes are in a region */
    uint8_t *p = NULL;
    if (c->payload_len)
      rc = tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "a chunk from a region carries no payload (%zu bytes came)",
                         c->payload_len);
    else if (q->shm->length > c->srv->cfg.chunk_bytes)
      rc = tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "shm.length is %llu: a chunk is at most %zu bytes (a put of the whole "
                         "tensor from a region is PutBegin with commit)",
                         (unsigned long long)q->shm->length, c->srv->cfg.chunk_bytes);
    if (!rc)
      rc = hold_slice(c, q->shm, &held, &p, &pinned);
    data = p;
    len = (size_t)q->shm->length; /* within the region: at most its size */
    if (!rc)
      atomic_fetch_add(&c->srv->bytes_in, len);
    if (!rc && q->offset == 0)
      shm_count_transfer(c->srv->shm); /* a put's first chunk */
  }
  if (!rc)
    rc = check_crc32c_of(c, q->crc32c_set, q->crc32c, q->offset, data, len);
  if (!rc) {
    metrics_stage_since(&c->srv->metrics, STAGE_RECEIVE, c->arrived_ns);
    rc = put_bytes(c, e, q->offset, data, len, pinned);
  }
  shm_unhold(c->srv->shm, held);
  if (!rc) {
    Tport__PutChunkReply r = TPORT__PUT_CHUNK_REPLY__INIT;
    r.status = wire_ok();
    r.received_bytes = len;
    rc = call_reply(c, &r.base, NULL, 0);
  }
  reg_put(&c->srv->reg, e);
  return rc;
}

/* Turns a complete upload into its stored tensor (converted if asked) and
 * publishes it; the registry's upload state machine makes this call its
 * only owner.  On success *final is the entry's tensor (borrowed). */
static int commit_upload(call *c, reg_entry *e, bool non_blocking, tport_tensor **final_out)
{
  registry *r = &c->srv->reg;
  tport_tensor *landing = NULL, *final = NULL;
  to_options o;
  bool needs_convert;
  int rc = reg_commit_begin(r, e, &landing, &o, &needs_convert, &c->err);
  if (rc)
    return rc;
  metrics *m = &c->srv->metrics;
  if (!non_blocking && tensor_device(landing).type != TPORT_DEV_CPU) {
    /* what is left of the chunks' copies to the device (they overlap the
     * receiving of later chunks) */
    int64_t t0 = metrics_now_ns();
    rc = tensor_sync(landing, &c->err);
    metrics_stage_since(m, STAGE_HOST_TO_DEVICE, t0);
  }
  if (!rc && needs_convert) {
    bool aliased;
    o.non_blocking = non_blocking;
    int64_t t0 = metrics_now_ns();
    rc = tensor_to(landing, &o, &final, &aliased, &c->err);
    if (!rc && !non_blocking)
      rc = tensor_sync(final, &c->err);
    metrics_stage_since(m, STAGE_CONVERT, t0);
  } else if (!rc) {
    final = tensor_retain(landing);
  }
  if (!rc && !non_blocking)
    rc = tensor_sync(final, &c->err);
  tensor_release(landing);
  if (rc) {
    tensor_release(final);
    reg_commit_fail(r, e);
    return rc;
  }
  rc = reg_commit_end(r, e, final, &c->err);
  if (!rc)
    *final_out = final;
  return rc;
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

/* The blocks one get may have lent at once: its window of chunk requests
 * (or fewer chunks), and a few whose replies nng has sent but not yet
 * given back.  More is a client asking for the same bytes over and over. */
static int reader_max_held(const server *s, size_t nbytes, size_t chunk)
{
  size_t chunks = nbytes / chunk + (nbytes % chunk != 0);
  size_t w = (size_t)s->cfg.window;
  return (int)((chunks < w ? chunks : w) + 2);
}

/* True when a get of t makes a copy of it (made contiguous, or its lazy
 * conj/neg bits applied: on its device, or on the host) -- else it serves
 * t's own memory: a host tensor's directly, a device tensor's read back
 * through the read-back pool's blocks (each charged while it is out). */
static bool get_copies(const tport_tensor *t)
{
  return !meta_is_contiguous(&t->layout) || t->conj || t->neg ||
         (tensor_device(t).type == TPORT_DEV_CPU && tensor_is_managed(t));
}

/* Makes t's values ready to serve in logical C order (readback.h): a
 * device tensor is read back a chunk at a time through recycled pinned
 * blocks; a host tensor is served from its own memory, or from a copy made
 * contiguous when it is not. */
static int stage_for_get(call *c, tport_tensor *t, get_transfer *g)
{
  int64_t t0 = metrics_now_ns();
  g->from_device = tensor_device(t).type != TPORT_DEV_CPU;
  int rc = reader_open(t, reader_max_held(c->srv, tensor_nbytes(t), g->chunk), &g->reader, &c->err);
  if (rc)
    return rc;
  g->nbytes = reader_nbytes(g->reader);
  /* made contiguous (enqueued on a device), if it was not */
  if (g->from_device || get_copies(t))
    metrics_stage_since(&c->srv->metrics, STAGE_CONVERT, t0);
  return TPORT_OK;
}

/* Bytes [off, off + n) of a get's values, ready to lend to a reply: *held
 * is the storage they lie in, the caller's reference to release after the
 * reply (a read-back block, or the host tensor's storage). */
static int get_bytes(call *c, get_transfer *g, size_t off, size_t n, tport_storage **held,
                     const uint8_t **p)
{
  int64_t t0 = metrics_now_ns();
  int rc = reader_read(g->reader, off, n, held, p, &c->err);
  if (g->from_device)
    metrics_stage_since(&c->srv->metrics, STAGE_DEVICE_TO_HOST, t0);
  return rc;
}


/* A get into a region: t's values in logical C order straight into the
 * client's slice, in one copy (from a device: into the pinned region
 * directly when it is registered), then a reply with no payload. */
static int get_into_region(call *c, const Tport__GetBeginRequest *q, reg_entry *e, tport_tensor *t)
{
  server *s = c->srv;
  size_t want = tensor_nbytes(t);
  if (q->shm->length < want)
    return tport_err_set(&c->err, TPORT_OUT_OF_RANGE,
                         "shm.length is %llu bytes: the tensor holds %zu",
                         (unsigned long long)q->shm->length, want);
  shm_region *held = NULL;
  uint8_t *p = NULL;
  bool pinned = false, on_dev = false;
  tport_device mem_dev;
  int rc = hold_whole(c, q->shm, &held, &p, &pinned, &mem_dev, &on_dev);
  if (rc)
    return rc;
  int64_t t0 = metrics_now_ns();
  /* logical C order, or the order of the memory format asked */
  int64_t strides[TPORT_MAX_DIMS];
  tport_memory_format fmt = TPORT_MF_CONTIGUOUS;
  if (q->memory_format_set)
    rc = wire_format(q->memory_format, "memory_format", &fmt, &c->err);
  if (!rc && fmt == TPORT_MF_PRESERVE)
    rc = tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                       "memory_format: a get writes contiguous, channels_last or "
                       "channels_last_3d order");
  tport_err why;
  if (!rc && meta_fresh_strides(t->layout.ndim, t->layout.sizes, fmt, strides, &why))
    rc = tport_err_set(&c->err, TPORT_INVALID_ARGUMENT, "memory_format: %s", why.msg);
  if (!rc && want) {
    tport_tensor *dst = NULL;
    rc = wrap_any(p, want, pinned, on_dev, mem_dev, t->dtype, t->layout.ndim, t->layout.sizes,
                  strides, &dst, &c->err);
    if (!rc)
      rc = tensor_copy_(dst, t, false, &c->err);
    if (!rc)
      rc = tensor_sync(dst, &c->err); /* done before the region may go */
    else
      rc = settle_region(dst, pinned, rc, &c->err); /* a failed copy's too */
    tensor_release(dst);
    metrics_stage_since(&s->metrics,
                        tensor_device(t).type == TPORT_DEV_CPU ? STAGE_CONVERT
                                                               : STAGE_DEVICE_TO_HOST,
                        t0);
  }
  bool crc_set = q->want_crc32c && !on_dev; /* a GPU region's bytes are not read here */
  uint32_t crc = rc || !crc_set ? 0 : transport_crc32c(0, p, want);
  shm_unhold(s->shm, held);
  if (rc)
    return rc;
  wire_info wi;
  wire_fill_info(&wi, e, t);
  Tport__GetBeginReply r = TPORT__GET_BEGIN_REPLY__INIT;
  r.status = wire_ok();
  r.info = &wi.info;
  r.nbytes = want;
  r.chunk_bytes = s->cfg.chunk_bytes;
  r.crc32c_set = crc_set;
  r.crc32c = crc;
  r.shm = true;
  atomic_fetch_add(&s->bytes_out, want);
  shm_count_transfer(s->shm);
  return call_reply(c, &r.base, NULL, 0);
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
  size_t want = tensor_nbytes(t);
  rc = wire_check_bytes(c, "the get", tensor_numel(t), tport_dtype_size(t->dtype));
  /* into a region -- unless, with shm_fallback, the tensor is small enough
   * for the reply or too large for the slice: then the ordinary way */
  bool small = want <= q->inline_max && want <= s->cfg.chunk_bytes;
  if (!rc && q->memory_format_set && (!q->shm || q->shm_fallback))
    rc = tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                       "memory_format: a get in another order writes into a region (shm)");
  if (!rc && q->shm && !(q->shm_fallback && (small || want > q->shm->length))) {
    rc = get_into_region(c, q, e, t);
    reg_put(&s->reg, e);
    return rc;
  }
  get_transfer *g = rc ? NULL : calloc(1, sizeof *g);
  if (!rc && !g)
    rc = tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  if (rc) {
    reg_put(&s->reg, e);
    return rc;
  }
  g->pipe = c->pipe;
  /* a device's chunks are read back into pool blocks, which are no larger
   * than READER_MAX_CHUNK: the client is told to ask for no more */
  g->chunk = s->cfg.chunk_bytes;
  if (tensor_device(t).type != TPORT_DEV_CPU && g->chunk > READER_MAX_CHUNK)
    g->chunk = READER_MAX_CHUNK;
  /* small tensors come back in this reply; an empty one has nothing to wait for */
  bool inline_data = want <= q->inline_max && want <= g->chunk;
  bool keep = want > 0 && !inline_data;
  /* What a get makes is charged before it is made, for as long as it
   * lives: its copy (contiguous on its device, or on the host), held by the
   * transfer and lent to the replies that carry its bytes, and the
   * read-back blocks of an inline get from a device.  A reply nng has not
   * sent holds them past this request (issue 20, finding 2): their charge
   * goes when nng frees it. */
  reg_reservation res;
  bool charging = false;
  if (keep)
    rc = transfers_reserve(&s->xfers, g, 0, &c->err); /* the connection's limit */
  if (!rc) {
    rc = wire_charge_lend_begin(c, &res, get_copies(t) ? want : 0, "the get's copy");
    charging = rc == TPORT_OK;
  }
  if (!rc)
    rc = stage_for_get(c, t, g);
  if (!rc && RAND_bytes(g->id, TRANSFER_ID_BYTES) != 1)
    rc = tport_err_set(&c->err, TPORT_INTERNAL, "cannot create a transfer id");
  const uint8_t *payload = NULL;
  tport_storage *held = NULL;
  if (!rc && inline_data && g->nbytes)
    rc = get_bytes(c, g, 0, g->nbytes, &held, &payload);
  if (charging)
    wire_charge_end(&res);
  uint8_t id[TRANSFER_ID_BYTES];
  memcpy(id, g->id, sizeof id);
  size_t nbytes = g->nbytes, chunk = g->chunk;
  if (!rc && keep) {
    rc = transfers_insert(&s->xfers, g, &c->err);
    if (!rc)
      g = NULL; /* the table's now: a disconnect may end it at any moment */
  }
  if (!rc) {
    wire_info wi;
    wire_fill_info(&wi, e, t);
    Tport__GetBeginReply r = TPORT__GET_BEGIN_REPLY__INIT;
    r.status = wire_ok();
    r.info = &wi.info;
    r.nbytes = nbytes;
    r.chunk_bytes = chunk;
    r.transfer.data = id;
    r.transfer.len = keep ? TRANSFER_ID_BYTES : 0;
    if (q->want_crc32c && !keep) {
      r.crc32c_set = true;
      r.crc32c = transport_crc32c(0, payload, payload ? nbytes : 0);
    }
    rc = payload ? call_reply_lent(c, &r.base, held, payload, nbytes)
                 : call_reply(c, &r.base, NULL, 0);
  }
  storage_release(held); /* a lent reply holds its own reference */
  transfers_free(&s->xfers, g); /* an inline one, or one that failed */
  if (charging)
    reg_reservation_release(&res); /* what no copy took */
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
  get_transfer *g = transfers_get(&s->xfers, c->pipe, q->transfer.data);
  if (!g)
    return tport_err_set(&c->err, TPORT_NOT_FOUND, "no transfer with that id on this connection");
  int rc = TPORT_OK;
  if (q->offset > g->nbytes || q->length > g->nbytes - q->offset)
    rc = tport_err_set(&c->err, TPORT_OUT_OF_RANGE,
                       "offset %llu + length %llu is outside the tensor's %zu bytes",
                       (unsigned long long)q->offset, (unsigned long long)q->length, g->nbytes);
  else if (q->length > g->chunk)
    rc = tport_err_set(&c->err, TPORT_INVALID_ARGUMENT, "length %llu is over the chunk size %zu",
                       (unsigned long long)q->length, g->chunk);
  const uint8_t *bytes = NULL;
  tport_storage *held = NULL;
  /* a read-back block (and those read ahead) is charged to the tenant
   * until it comes back to the pool, after nng has sent its reply */
  reg_reservation res = REG_RESERVATION_INIT(&s->reg, c->pipe);
  if (!rc && g->from_device &&
      (rc = wire_charge_lend_begin(c, &res, 0, "a chunk")) == TPORT_OK) {
    rc = get_bytes(c, g, (size_t)q->offset, (size_t)q->length, &held, &bytes);
    wire_charge_end(&res);
  } else if (!rc) {
    rc = get_bytes(c, g, (size_t)q->offset, (size_t)q->length, &held, &bytes);
  }
  reg_reservation_release(&res); /* nothing: a block's charge is its own */
  if (!rc) {
    Tport__GetChunkReply r = TPORT__GET_CHUNK_REPLY__INIT;
    r.status = wire_ok();
    r.offset = q->offset;
    if (q->want_crc32c) {
      r.crc32c_set = true;
      r.crc32c = transport_crc32c(0, bytes, bytes ? (size_t)q->length : 0);
    }
    int64_t t0 = metrics_now_ns();
    /* lent, not copied: the bytes go from the host tensor or the read-back
     * block to the socket, and the reply holds its storage till then */
    rc = call_reply_lent(c, &r.base, held, bytes, (size_t)q->length);
    if (!rc)
      metrics_stage_since(&s->metrics, STAGE_STAGE, t0); /* the reply made (bytes lent) */
  }
  storage_release(held);
  transfers_release(&s->xfers, g, rc ? 0 : (size_t)q->length);
  return rc;
}
