/*
 * handlers_put.c: Put (Begin, Chunk, Commit, Abort).
 *
 * PutBegin validates the descriptor (dense, offset 0: the payload is the
 * tensor's storage bytes in its own layout) and creates the landing tensor
 * on the destination device.  Chunks are fixed-size pieces at multiples of
 * chunk_bytes; each is staged through the pinned pool into the landing
 * tensor by the engine (async on a device), and is idempotent by (handle,
 * offset).  PutCommit converts dtype/format if asked and publishes the
 * tensor -- except a dtype change that keeps the client's strides, which
 * converts each chunk as it lands, straight into the final tensor.  The
 * upload's state machine (which chunks are claimed and received) is the
 * registry's (registry.h).
 *
 * A PutBegin with commit -- its bytes in the payload, or (same host) in a
 * slice of a region (regions.h) it names -- makes no upload: put_once.c
 * copies them once into the stored tensor, converted on the way.  Only one
 * into managed memory still lands and commits here.
 */
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "put_gather.h"
#include "put_once.h"
#include "validate.h"
#include "wire.h"
#include "wrap.h"

static int commit_upload(call *c, reg_entry *e, bool non_blocking, tport_tensor **final_out);

static int wrap_bytes(const uint8_t *p, size_t n, tport_dtype dt, int64_t count, bool pinned,
                      tport_tensor **out, tport_err *err)
{
  return wrap_host(p, n, pinned, dt, 1, &count, NULL, out, err);
}

/* Copies the payload into view, the landing tensor's part it fills: the
 * payload wrapped as count elements of dt (from a pinned region: read by
 * the device later, the caller syncs; else staged before this returns). */
static int land_into(call *c, tport_tensor *view, tport_dtype dt, int64_t count,
                     const uint8_t *p, size_t n, bool pinned)
{
  tport_tensor *src = NULL;
  int rc = wrap_bytes(p, n, dt, count, pinned, &src, &c->err);
  if (!rc)
    rc = tensor_copy_(view, src, true, &c->err);
  rc = settle_region(src, pinned, rc, &c->err);
  tensor_release(src);
  return rc;
}

/* Lands n payload bytes at storage byte off.  Converted (st >= 0): whole
 * elements of the client's dtype st into the landing tensor, which has the
 * client's strides in another dtype -- the same elements in the same
 * storage order, so the chunk is a 1-D run of both storages.  Else the
 * bytes as they are. */
static int land(call *c, tport_tensor *landing, int st, size_t off, const uint8_t *p, size_t n,
                bool pinned)
{
  tport_tensor *view = NULL;
  int rc;
  if (st >= 0) {
    size_t ss = tport_dtype_size((tport_dtype)st);
    int64_t count = (int64_t)(n / ss), one = 1;
    rc = tensor_as_strided(landing, 1, &count, &one, (int64_t)(off / ss), &view, &c->err);
    if (!rc)
      rc = land_into(c, view, (tport_dtype)st, count, p, n, pinned);
  } else if (!pinned && tensor_write_host_bytes(landing, off, p, n)) {
    rc = TPORT_OK; /* the cpu's: one memcpy */
  } else {
    rc = tensor_byte_view(landing, off, n, &view, &c->err);
    if (!rc)
      rc = land_into(c, view, TPORT_UINT8, (int64_t)n, p, n, pinned);
  }
  tensor_release(view);
  return rc;
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
  rc = land(c, landing, convert_from, (size_t)off, p, n, pinned);
  metrics_stage_since(&c->srv->metrics, convert_from >= 0 ? STAGE_CONVERT : STAGE_STAGE, t0);
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

/* Writes the claimed bytes [off, off + n) of e's upload from the client's
 * own memory, the slice sl of its process region (regions.h): read
 * straight into the landing tensor where that is plain host memory and
 * nothing converts on arrival (the one copy of the put), else into a
 * buffer of the tenant's and landed from there as a payload is.  The crc
 * is checked over what was read. */
static int put_bytes_from_process(call *c, reg_entry *e, const Tport__PutChunkRequest *q)
{
  server *s = c->srv;
  const Tport__ShmSlice *sl = q->shm;
  size_t n = (size_t)sl->length;
  tport_tensor *landing = NULL, *buf = NULL;
  int convert_from;
  int rc = reg_chunk_claim(&s->reg, e, q->offset, n, &landing, &convert_from, &c->err);
  if (rc || !landing)
    return rc; /* an error, or written already (idempotent) */
  int64_t t0 = metrics_now_ns();
  uint8_t *dst = convert_from < 0 && n ? tensor_host_bytes(landing, (size_t)q->offset, n) : NULL;
  /* the buffer is the tenant's for as long as it lives */
  reg_reservation res = REG_RESERVATION_INIT(&s->reg, c->pipe);
  if (!dst && n) {
    int64_t count = (int64_t)n;
    /* for its life: a read given up may keep it after this call */
    rc = wire_charge_lend_begin(c, &res, n, "a chunk");
    if (!rc) {
      rc = tensor_empty((tport_device){TPORT_DEV_CPU, 0}, TPORT_UINT8, 1, &count,
                        TPORT_MF_CONTIGUOUS, 0, &buf, &c->err);
      wire_charge_end(&res);
    }
    if (!rc && !(dst = tensor_host_bytes(buf, 0, n)))
      rc = tport_err_set(&c->err, TPORT_INTERNAL, "a chunk's buffer is not host memory");
  }
  bool stuck = false;
  /* a read given up keeps the landing tensor, which its upload no longer
   * pays for once aborted: its tenant pays until the read ends (a buffer
   * is charged for its life already) */
  reg_later hold = {0};
  if (!rc && n && !buf)
    rc = reg_later_begin(&s->reg, c->pipe, &hold, &c->err);
  if (!rc && n)
    rc = shm_process_read(s->shm, c->pipe, sl->region, sl->offset, dst, n, buf ? buf : landing,
                          buf ? NULL : &hold, buf ? 0 : storage_nbytes(landing->storage), &stuck,
                          &c->err);
  if (!rc)
    rc = check_crc32c_of(c, q->crc32c_set, q->crc32c, q->offset, dst, n);
  if (!rc && buf)
    rc = land(c, landing, convert_from, (size_t)q->offset, dst, n, false);
  metrics_stage_since(&s->metrics, convert_from >= 0 ? STAGE_CONVERT : STAGE_STAGE, t0);
  tensor_release(buf);
  reg_reservation_release(&res);
  tensor_release(landing);
  /* a read given up may still write the landing tensor (or the buffer):
   * its chunk stays claimed, so the upload never commits (the client
   * aborts it) */
  if (!stuck)
    reg_chunk_done(&s->reg, e, q->offset, n, rc == TPORT_OK);
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

/* A PutBegin's descriptor and what comes with it, checked: a dense tensor
 * at offset 0 within --max-tensor, whose bytes are in a region (a put that
 * commits at once, no payload) or in the payload (whole with commit, none
 * without). */
static int check_put_begin(call *c, const Tport__PutBeginRequest *q, meta_layout *l,
                           validate_result *vr)
{
  server *s = c->srv;
  if (!q->desc)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT, "desc is missing");
  Tport__TensorDesc *d = q->desc;
  int rc = validate_desc((int)d->dtype, d->n_sizes, d->sizes, d->n_strides, d->strides,
                         d->storage_offset, -1, l, vr, &c->err);
  if (rc)
    return rc;
  if (l->offset != 0)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "desc.storage_offset is %lld: a put sends a whole storage (offset 0)",
                         (long long)l->offset);
  if (!meta_is_non_overlapping_and_dense(l))
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "desc.strides: a put sends a dense tensor (no gaps, no overlaps)");
  if ((size_t)vr->nbytes > s->cfg.max_tensor_bytes)
    return tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED,
                         "the tensor is %lld bytes: the limit per tensor is %zu",
                         (long long)vr->nbytes, s->cfg.max_tensor_bytes);
  if (q->shm) {
    /* the bytes are in a region: checked against it when the copy holds it */
    if (!q->commit)
      return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                           "a put from a region commits at once (set commit)");
    if (c->payload_len)
      return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                           "a put from a region carries no payload (%zu bytes came)",
                           c->payload_len);
    if (q->shm->length != (uint64_t)vr->nbytes)
      return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                           "shm.length is %llu: the tensor is %lld bytes",
                           (unsigned long long)q->shm->length, (long long)vr->nbytes);
  } else {
    if (q->commit && c->payload_len != (size_t)vr->nbytes)
      return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                           "a committed put carries the whole tensor: %zu bytes came, %lld "
                           "expected",
                           c->payload_len, (long long)vr->nbytes);
    if (!q->commit && c->payload_len)
      return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                           "PutBegin carries data only with commit");
    if ((rc = check_crc32c(c, q->crc32c_set, q->crc32c, 0)) != TPORT_OK)
      return rc;
  }
  return TPORT_OK;
}

/* What a put's commit will make of its bytes (plan_put). */
typedef struct put_plan {
  to_options convert;   /* dtype and memory format asked */
  tport_dtype from, to; /* the client's dtype, the stored tensor's */
  bool needs_convert;   /* at the commit */
  bool on_arrival;      /* each chunk converted as it lands */
  size_t reserve;       /* the converted tensor a conversion at the commit makes */
} put_plan;

/* The conversion a put asks for, checked now rather than at commit, and
 * when it happens: as each chunk lands, or at the commit. */
static int plan_put(call *c, const Tport__PutBeginRequest *q, const meta_layout *l,
                    const validate_result *vr, put_plan *p)
{
  server *s = c->srv;
  int rc = TPORT_OK;
  /* the stored tensor really is in the format asked */
  p->convert = (to_options){.non_blocking = true, .exact_format = true};
  if (q->dtype_set) {
    p->convert.has_dtype = true;
    rc = wire_dtype(q->dtype, "dtype", &p->convert.dtype, &c->err);
  }
  if (!rc && q->memory_format != TPORT__MEMORY_FORMAT__MF_PRESERVE) {
    p->convert.has_format = true;
    rc = wire_format(q->memory_format, "memory_format", &p->convert.format, &c->err);
    int64_t strides[TPORT_MAX_DIMS];
    tport_err why;
    if (!rc && meta_fresh_strides(l->ndim, l->sizes, p->convert.format, strides, &why))
      rc = tport_err_set(&c->err, TPORT_INVALID_ARGUMENT, "memory_format: %s", why.msg);
  }
  p->reserve = 0;
  p->needs_convert = p->convert.has_dtype || p->convert.has_format;
  p->on_arrival = false;
  p->from = (tport_dtype)q->desc->dtype;
  p->to = p->convert.has_dtype ? p->convert.dtype : p->from;
  if (!rc && p->needs_convert) {
    rc = wire_check_bytes(c, "the converted tensor", vr->numel, tport_dtype_size(p->to));
    p->reserve = (size_t)vr->numel * tport_dtype_size(p->to);
    /* A dtype change that keeps the client's strides converts each chunk as
     * it lands (no landing copy, no second pass at commit): to(dtype) keeps
     * a dense tensor's strides, and with a memory format too when its fresh
     * strides are the client's.  Chunks then hold whole elements. */
    int64_t fresh[TPORT_MAX_DIMS];
    tport_err why;
    bool same_strides =
        !p->convert.has_format ||
        (meta_fresh_strides(l->ndim, l->sizes, p->convert.format, fresh, &why) == TPORT_OK &&
         memcmp(fresh, l->strides, sizeof *fresh * (size_t)l->ndim) == 0);
    p->on_arrival = !rc && p->to != p->from && same_strides &&
                    s->cfg.chunk_bytes % tport_dtype_size(p->from) == 0;
  }
  /* converting on arrival, the landing tensor is the final one: no second */
  if (p->on_arrival)
    p->reserve = 0;
  return rc;
}

/* The upload of a planned put: its chunk bitmaps and its landing tensor
 * on dev (converting on arrival, the final one).  *out is set either way:
 * reg_upload_free it on an error. */
static int upload_new(call *c, const put_plan *p, const meta_layout *l, size_t nbytes,
                      tport_device dev, unsigned flags, reg_upload **out)
{
  server *s = c->srv;
  int rc = TPORT_OK;
  reg_upload *up = calloc(1, sizeof *up);
  *out = up;
  if (!up)
    return tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  up->convert = p->convert;
  up->needs_convert = p->needs_convert && !p->on_arrival;
  up->convert_on_arrival = p->on_arrival;
  up->source_dtype = p->from;
  up->nbytes = nbytes;
  up->chunk_bytes = s->cfg.chunk_bytes;
  up->nchunks = (up->nbytes + up->chunk_bytes - 1) / up->chunk_bytes;
  size_t bitmap = (size_t)(up->nchunks + 7) / 8 + 1;
  up->claimed = calloc(bitmap, 1);
  up->received = calloc(bitmap, 1);
  if (!up->claimed || !up->received)
    rc = tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  if (!rc)
    rc = tensor_empty_strided(dev, p->on_arrival ? p->to : p->from, l->ndim, l->sizes, l->strides,
                              flags, &up->landing, &c->err);
  return rc;
}

/* A PutBegin with commit: the data (its payload or its region's slice),
 * then the commit -- one round trip.  *final: the stored tensor. */
static int put_commit_at_once(call *c, const Tport__PutBeginRequest *q, reg_entry *e,
                              tport_tensor **final)
{
  server *s = c->srv;
  const uint8_t *data = c->payload;
  size_t len = c->payload_len;
  shm_region *held = NULL;
  bool pinned = false;
  int rc = TPORT_OK;
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
    rc = commit_upload(c, e, q->non_blocking && !held, final);
  shm_unhold(s->shm, held);
  return rc;
}

int h_put_begin(call *c)
{
  Tport__PutBeginRequest *q = (Tport__PutBeginRequest *)c->req;
  server *s = c->srv;
  meta_layout l;
  validate_result vr;
  int rc = check_put_begin(c, q, &l, &vr);
  if (rc)
    return rc;
  if (c->payload_len && !c->stage_ns) /* (a batch's: once, for its request) */
    metrics_stage_since(&s->metrics, STAGE_RECEIVE, c->arrived_ns);
  tport_device dev;
  rc = wire_device(q->device && *q->device ? q->device : q->desc->device, "device",
                   (tport_device){TPORT_DEV_CPU, 0}, &dev, &c->err);
  if (rc)
    return rc;
  put_plan put;
  if ((rc = plan_put(c, q, &l, &vr, &put)) != TPORT_OK)
    return rc;
  /* --uvm: every put to a device lands in managed memory */
  unsigned flags = q->managed || (s->cfg.uvm && dev.type != TPORT_DEV_CPU) ? STORAGE_MANAGED : 0;
  /* the client's memory, read rather than mapped (managed memory or a
   * device refused there: a batch's flush decision is this test) */
  if (q->shm && shm_is_process(s->shm, c->pipe, q->shm->region))
    return put_from_process(c, q, &l, put.from, dev, &put.convert);
  if (q->shm && !flags)
    return put_once_from_region(c, q, &l, put.from, dev, &put.convert);
  if (q->commit && !q->shm && !flags) {
    /* the whole tensor in the payload (its crc32c checked above) */
    put_source in = {.p = (uint8_t *)c->payload, .len = c->payload_len};
    return put_once(c, q, &l, put.from, dev, &put.convert, &in);
  }
  /* The landing tensor (converting on arrival, the final one) and what a
   * conversion at the commit will make are charged before either exists:
   * a put the tenant cannot hold is refused here, having allocated nothing.
   * Both sizes are within --max-tensor (checked above). */
  size_t landing_bytes =
             put.on_arrival ? (size_t)vr.numel * tport_dtype_size(put.to) : (size_t)vr.nbytes,
         upfront;
  if (__builtin_add_overflow(landing_bytes, put.reserve, &upfront))
    return tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED,
                         "the put would hold %zu + %zu bytes: more than this server can count",
                         landing_bytes, put.reserve);
  reg_reservation paid;
  rc = wire_charge_begin(c, &paid, upfront,
                         put.reserve ? "the put's landing and converted tensors"
                                     : "the put's tensor");
  if (rc)
    return rc;
  reg_upload *up;
  rc = upload_new(c, &put, &l, (size_t)vr.nbytes, dev, flags, &up);
  wire_charge_end(&paid);
  if (rc) {
    reg_upload_free(up);
    reg_reservation_release(&paid);
    return rc;
  }
  reg_entry *e;
  rc = (q->replace ? reg_add_replacing : reg_add)(&s->reg, c->pipe, NULL, up, q->name, q->keep,
                                                  q->ttl_ms, put.reserve, &paid, &e, &c->err);
  if (rc)
    return rc;
  tport_tensor *final = NULL;
  if (q->commit && (rc = put_commit_at_once(c, q, e, &final)) != TPORT_OK) {
    reg_remove(&s->reg, e);
    reg_put(&s->reg, e);
    return rc;
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
  bool process = false;
  if (!rc && q->shm) {
    /* the chunk's bytes are in a region, or the client's own memory (a
     * process region: read here, straight into the upload) */
    process = shm_is_process(c->srv->shm, c->pipe, q->shm->region);
    /* from a process region, several chunks at once (HelloReply's
     * process_read_max_bytes; reg_chunk_claim checks their bounds) */
    size_t chunk = c->srv->cfg.chunk_bytes;
    size_t most = process ? shm_process_read_max(chunk) : chunk;
    if (c->payload_len)
      rc = tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "a chunk from a region carries no payload (%zu bytes came)",
                         c->payload_len);
    else if (q->shm->length > most)
      rc = tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "shm.length is %llu: a chunk from this region is at most %zu bytes",
                         (unsigned long long)q->shm->length, most);
    process = process && !rc;
    len = (size_t)q->shm->length; /* within the region: at most its size */
    if (process) {
      metrics_stage_since(&c->srv->metrics, STAGE_RECEIVE, c->arrived_ns);
      rc = put_bytes_from_process(c, e, q);
    } else if (!rc) {
      uint8_t *p = NULL;
      rc = hold_slice(c, q->shm, &held, &p, &pinned);
      data = p;
    }
    if (!rc) {
      atomic_fetch_add(&c->srv->bytes_in, len);
      if (q->offset == 0)
        shm_count_transfer(c->srv->shm); /* a put's first chunk */
    }
  }
  if (!rc && !process)
    rc = check_crc32c_of(c, q->crc32c_set, q->crc32c, q->offset, data, len);
  if (!rc && !process) {
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
    rc = wire_reply_stored(c, &r.base, e, NULL);
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
