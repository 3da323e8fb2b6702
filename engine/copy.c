/*
 * copy.c: copy_(dst, src, non_blocking), the decision tree of SEMANTICS.md
 * §3-§4 (ATen's copy_impl and copy_kernel_cuda):
 *
 *   checks (same tensor, same data, internal overlap, partial overlap,
 *   broadcast) -> nothing to do for 0 elements ->
 *   same device:             the copy kernel on that device's stream
 *   device <-> device:       dst_ready / copy / src_ready on the source's stream;
 *                            memcpy (peer, or staged by the driver) when eligible,
 *                            else the kernel with peer access, else temporaries
 *   host <-> device:         contiguous same-dtype bytes move by async memcpy
 *                            (pinned memory directly, pageable memory staged
 *                            through the pinned pool); anything else through
 *                            contiguous temporaries.
 */
#include <stdlib.h>
#include <string.h>

#include <time.h>

#include "cpu_kernels.h"
#include "engine.h"
#include "storage.h"
#include "staging.h"

/* Bytes a staged transfer moves per pinned block: the host's copy of one
 * block (on the kernels' threads) overlaps the device's copy of the one
 * before, and a block this size keeps the threads' start-up small beside
 * the copy. */
#define COPY_STAGE_CHUNK ((size_t)8 << 20)
/* Staged device-to-host copies in flight at once. */
#define COPY_D2H_RING 4

static char *data_ptr(const tport_tensor *t)
{
  return (char *)t->storage->ptr + t->layout.offset * (int64_t)tport_dtype_size(t->dtype);
}

static bool on_host(const tport_tensor *t)
{
  return t->storage->device.type == TPORT_DEV_CPU;
}

static unsigned bit_flags(const tport_tensor *dst, const tport_tensor *src)
{
  unsigned f = 0;
  if (tport_dtype_is_complex(dst->dtype) && dst->conj != src->conj)
    f |= CPU_COPY_CONJ;
  if (dst->neg != src->neg)
    f |= CPU_COPY_NEG;
  return f;
}

/* ---------------------------------------------------------------- checks */

/* at::get_overlap_status(a, b) == PARTIAL */
static bool partial_overlap(const tport_tensor *a, const tport_tensor *b)
{
  if (a == b || a->storage != b->storage)
    return false;
  if (tensor_numel(a) == 0 || tensor_numel(b) == 0)
    return false;
  if (!meta_is_non_overlapping_and_dense(&a->layout) ||
      !meta_is_non_overlapping_and_dense(&b->layout))
    return false; /* too hard to decide: allowed */
  const char *ab = data_ptr(a), *ae = ab + tensor_nbytes(a);
  const char *bb = data_ptr(b), *be = bb + tensor_nbytes(b);
  if (ab == bb && ae == be) {
    for (int d = 0; d < a->layout.ndim; d++)
      if (a->layout.strides[d] != b->layout.strides[d])
        return true;
    return a->layout.ndim != b->layout.ndim;
  }
  return ab < be && bb < ae;
}

/* at::infer_size over (dst, src), then the "doesn't match" check of an output
 * that is not resized. */
static int check_broadcast(const tport_tensor *dst, const tport_tensor *src, tport_err *err)
{
  const meta_layout *a = &dst->layout, *b = &src->layout;
  int n = a->ndim > b->ndim ? a->ndim : b->ndim;
  int64_t shape[TPORT_MAX_DIMS];
  for (int i = n - 1; i >= 0; i--) {
    int off = n - 1 - i, da = a->ndim - 1 - off, db = b->ndim - 1 - off;
    int64_t sa = da >= 0 ? a->sizes[da] : 1, sb = db >= 0 ? b->sizes[db] : 1;
    if (sa != sb && sa != 1 && sb != 1)
      return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                           "The size of tensor a (%lld) must match the size of tensor b (%lld) at "
                           "non-singleton dimension %d",
                           (long long)sa, (long long)sb, i);
    shape[i] = sa == 1 ? sb : sa;
  }
  bool same = n == a->ndim;
  for (int i = 0; same && i < n; i++)
    same = shape[i] == a->sizes[i];
  if (!same) {
    char s1[160], s2[160];
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "output with shape %s doesn't match the broadcast shape %s",
                         meta_format_dims(s1, sizeof s1, a->ndim, a->sizes),
                         meta_format_dims(s2, sizeof s2, n, shape));
  }
  return TPORT_OK;
}

static void build_plan(const tport_tensor *dst, const tport_tensor *src, plan *p)
{
  int64_t dstr[TPORT_MAX_DIMS], sstr[TPORT_MAX_DIMS];
  size_t de = tport_dtype_size(dst->dtype);
  for (int d = 0; d < dst->layout.ndim; d++)
    dstr[d] = dst->layout.strides[d] * (int64_t)de;
  plan_broadcast_strides(dst->layout.ndim, dst->layout.sizes, src->layout.ndim, src->layout.sizes,
                         src->layout.strides, tport_dtype_size(src->dtype), sstr);
  const int64_t *strides[2] = {dstr, sstr};
  plan_build(p, dst->layout.ndim, dst->layout.sizes, 2, strides);
}

/* ---------------------------------------------------------------- deadlines */

static _Thread_local int64_t deadline_ms;

void engine_set_deadline(int64_t mono_ms)
{
  deadline_ms = mono_ms;
}

int64_t engine_deadline(void)
{
  return deadline_ms;
}

static bool past_deadline(void)
{
  if (!deadline_ms)
    return false;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 > deadline_ms;
}

/* Runs the kernel of plan p in pieces along its outermost dimension (each
 * about ENGINE_PIECE_ELEMS elements), checking the thread's deadline before
 * each: the same elements, in the same per-element way, so the bits are
 * those of one launch.  Only where the backend's kernel blocks (the cpu's):
 * an enqueueing backend would pass every check before the first piece ran. */
static int kernel_in_pieces(const backend_ops *be, int dev, be_stream *s, const plan *p, char *dst,
                            tport_dtype dt, const char *src, tport_dtype st, unsigned flags,
                            tport_err *err)
{
  int64_t numel = plan_numel(p);
  if (!deadline_ms || p->ndim == 0 || numel <= ENGINE_PIECE_ELEMS)
    return be->copy_kernel(dev, s, p, dst, dt, src, st, flags, err);
  if (!be->copy_kernel_blocks) { /* one check, one launch */
    if (past_deadline())
      return tport_err_set(err, TPORT_DEADLINE_EXCEEDED,
                           "the request ran past its deadline (before its copy was enqueued)");
    return be->copy_kernel(dev, s, p, dst, dt, src, st, flags, err);
  }
  int outer = p->ndim - 1;
  int64_t rows = p->shape[outer], per_row = numel / rows;
  int64_t step = ENGINE_PIECE_ELEMS / per_row > 0 ? ENGINE_PIECE_ELEMS / per_row : 1;
  for (int64_t r = 0; r < rows; r += step) {
    if (past_deadline())
      return tport_err_set(err, TPORT_DEADLINE_EXCEEDED,
                           "the request ran past its deadline (%lld of %lld rows done)",
                           (long long)r, (long long)rows);
    plan piece = *p;
    piece.shape[outer] = rows - r < step ? rows - r : step;
    int rc = be->copy_kernel(dev, s, &piece, dst + r * p->strides[0][outer], dt,
                             src + r * p->strides[1][outer], st, flags, err);
    if (rc)
      return rc;
  }
  return TPORT_OK;
}

/* ---------------------------------------------------------------- paths */

static int run_kernel(tport_tensor *dst, tport_tensor *src, const plan *p, unsigned flags,
                      tport_err *err)
{
  tport_device dev = dst->storage->device;
  const backend_ops *be = backend_get(dev.type);
  be_stream *s = be->stream_default(dev.index);
  int rc = storage_wait(dst->storage, be, s, err);
  if (!rc && src->storage != dst->storage)
    rc = storage_wait(src->storage, be, s, err);
  if (rc)
    return rc;
  rc = kernel_in_pieces(be, dev.index, s, p, data_ptr(dst), dst->dtype, data_ptr(src), src->dtype,
                        flags, err);
  /* whatever ran is marked, an interrupted sequence of pieces included */
  tport_storage *sts[2] = {dst->storage, src->storage};
  tport_err merr;
  int mrc = storage_mark(sts, src->storage == dst->storage ? 1 : 2, be, dev.index, s, &merr);
  if (!rc && mrc)
    *err = merr;
  return rc ? rc : mrc;
}

/* After a byte copy between devices, apply the conj/neg bits in place. */
static int fix_bits(tport_tensor *dst, unsigned flags, tport_err *err)
{
  if (!flags)
    return TPORT_OK;
  plan p;
  build_plan(dst, dst, &p);
  return run_kernel(dst, dst, &p, flags, err);
}

static int record_and_wait(const backend_ops *be, int ev_dev, be_stream *on, be_stream *waiter,
                           tport_err *err)
{
  be_event *ev;
  int rc = be->event_create(ev_dev, &ev, err);
  if (rc)
    return rc;
  rc = be->event_record(ev, on, err);
  if (!rc)
    rc = be->stream_wait_event(waiter, ev, err);
  be->event_destroy(ev);
  return rc;
}

static int copy_d2d(tport_tensor *dst, tport_tensor *src, const plan *p, bool memcpyable, bool p2p,
                    tport_err *err)
{
  tport_device dd = dst->storage->device, sd = src->storage->device;
  const backend_ops *be = backend_get(sd.type);
  be_stream *cs = be->stream_default(sd.index), *ds = be->stream_default(dd.index);
  bool skip_dst_ready = engine_test_faults() & ENGINE_SKIP_DST_READY;
  int rc = TPORT_OK;
  if (!skip_dst_ready) {
    rc = record_and_wait(be, dd.index, ds, cs, err); /* dst_ready */
    if (!rc)
      rc = storage_wait(dst->storage, be, cs, err);
  }
  if (!rc)
    rc = storage_wait(src->storage, be, cs, err);
  if (rc)
    return rc;
  if (memcpyable) {
    size_t n = tensor_nbytes(dst);
    rc = p2p ? be->memcpy_async(sd.index, cs, data_ptr(dst), data_ptr(src), n, BE_D2D, err)
             : be->memcpy_peer_async(dd.index, data_ptr(dst), sd.index, data_ptr(src), n, cs, err);
  } else {
    rc = be->copy_kernel(sd.index, cs, p, data_ptr(dst), dst->dtype, data_ptr(src), src->dtype,
                         bit_flags(dst, src), err);
  }
  if (rc)
    return rc;
  tport_storage *sts[2] = {dst->storage, src->storage};
  rc = storage_mark(sts, 2, be, sd.index, cs, err);
  if (!rc)
    rc = record_and_wait(be, sd.index, cs, ds, err); /* src_ready */
  if (!rc && memcpyable)
    rc = fix_bits(dst, bit_flags(dst, src), err);
  return rc;
}

static int copy_h2d(tport_tensor *dst, tport_tensor *src, bool non_blocking, tport_err *err)
{
  tport_device dd = dst->storage->device;
  const backend_ops *be = backend_get(dd.type);
  be_stream *s = be->stream_default(dd.index);
  unsigned faults = engine_test_faults();
  size_t n = tensor_nbytes(dst);
  char *dp = data_ptr(dst);
  const char *sp = data_ptr(src);
  int rc = storage_wait(dst->storage, be, s, err);
  if (rc)
    return rc;
  if (src->storage->flags & STORAGE_PINNED) {
    rc = storage_wait(src->storage, be, s, err);
    if (!rc)
      rc = be->memcpy_async(dd.index, s, dp, sp, n, BE_H2D, err);
    if (rc)
      return rc;
    /* The event on the pinned source keeps it from reuse until the copy ends. */
    tport_storage *sts[2] = {dst->storage, src->storage};
    bool skip = non_blocking && (faults & ENGINE_SKIP_RESULT_EVENT);
    rc = (faults & ENGINE_FAIL_MARK) ? tport_err_set(err, TPORT_INTERNAL, "test: no event")
                                     : storage_mark(skip ? sts + 1 : sts, skip ? 1 : 2, be,
                                                    dd.index, s, err);
    if (rc) {
      /* the copy is enqueued and no event says when it ends: it ends before
       * this returns, or the caller could free (or unregister) the source
       * under it */
      be->stream_synchronize(s, NULL);
      return rc;
    }
  } else {
    rc = storage_sync(src->storage, err);
    staging_pool *pool = staging_default();
    for (size_t off = 0; !rc && off < n; off += COPY_STAGE_CHUNK) {
      size_t len = n - off < COPY_STAGE_CHUNK ? n - off : COPY_STAGE_CHUNK;
      staging_block *b;
      rc = staging_acquire(pool, len, &b, err);
      if (rc)
        break;
      cpu_memcpy_parallel(b->ptr, sp + off, len);
      rc = be->memcpy_async(dd.index, s, dp + off, b->ptr, len, BE_H2D, err);
      if (!rc && !(faults & ENGINE_SKIP_STAGING_EVENT)) {
        be_event *ev;
        rc = be->event_create(dd.index, &ev, err);
        if (!rc && (rc = be->event_record(ev, s, err)) != TPORT_OK)
          be->event_destroy(ev);
        if (!rc)
          rc = staging_add_event(b, be, ev, err);
      }
      if (rc) {
        /* The block may still be read by a queued copy: wait before reuse. */
        be->stream_synchronize(s, NULL);
      }
      staging_release(pool, b);
    }
    if (!rc && !(non_blocking && (faults & ENGINE_SKIP_RESULT_EVENT)))
      rc = storage_mark(&dst->storage, 1, be, dd.index, s, err);
  }
  if (!rc && !non_blocking)
    rc = be->stream_synchronize(s, err);
  return rc;
}

typedef struct d2h_slot {
  staging_block *b;
  be_event *ev;
  size_t off, len;
} d2h_slot;

static int drain_slot(const backend_ops *be, staging_pool *pool, d2h_slot *sl, char *dp,
                      tport_err *err)
{
  int rc = be->event_synchronize(sl->ev, err);
  if (!rc)
    cpu_memcpy_parallel(dp + sl->off, sl->b->ptr, sl->len);
  be->event_destroy(sl->ev);
  staging_release(pool, sl->b);
  return rc;
}

static int copy_d2h(tport_tensor *dst, tport_tensor *src, bool non_blocking, tport_err *err)
{
  tport_device sd = src->storage->device;
  const backend_ops *be = backend_get(sd.type);
  be_stream *s = be->stream_default(sd.index);
  size_t n = tensor_nbytes(dst);
  char *dp = data_ptr(dst);
  const char *sp = data_ptr(src);
  int rc = storage_wait(src->storage, be, s, err);
  if (rc)
    return rc;
  if (dst->storage->flags & STORAGE_PINNED) {
    rc = storage_wait(dst->storage, be, s, err);
    if (!rc)
      rc = be->memcpy_async(sd.index, s, dp, sp, n, BE_D2H, err);
    if (rc)
      return rc;
    tport_storage *sts[2] = {src->storage, dst->storage};
    bool skip = non_blocking && (engine_test_faults() & ENGINE_SKIP_RESULT_EVENT);
    rc = storage_mark(sts, skip ? 1 : 2, be, sd.index, s, err);
    if (rc) {
      be->stream_synchronize(s, NULL); /* as in copy_h2d: it ends before we return */
      return rc;
    }
    if (!rc && !non_blocking)
      rc = be->stream_synchronize(s, err);
    return rc;
  }
  /* Pageable destination: staged, and synchronous like CUDA's pageable copies. */
  rc = storage_sync(dst->storage, err);
  staging_pool *pool = staging_default();
  d2h_slot ring[COPY_D2H_RING];
  int head = 0, count = 0;
  for (size_t off = 0; !rc && off < n; off += COPY_STAGE_CHUNK) {
    if (count == COPY_D2H_RING) {
      rc = drain_slot(be, pool, &ring[head], dp, err);
      head = (head + 1) % COPY_D2H_RING;
      count--;
      if (rc)
        break;
    }
    d2h_slot *sl = &ring[(head + count) % COPY_D2H_RING];
    sl->off = off;
    sl->len = n - off < COPY_STAGE_CHUNK ? n - off : COPY_STAGE_CHUNK;
    rc = staging_acquire(pool, sl->len, &sl->b, err);
    if (rc)
      break;
    rc = be->memcpy_async(sd.index, s, sl->b->ptr, sp + off, sl->len, BE_D2H, err);
    if (!rc)
      rc = be->event_create(sd.index, &sl->ev, err);
    if (!rc && (rc = be->event_record(sl->ev, s, err)) != TPORT_OK)
      be->event_destroy(sl->ev);
    if (rc) {
      be->stream_synchronize(s, NULL);
      staging_release(pool, sl->b);
      break;
    }
    count++;
  }
  while (count > 0) {
    int r2 = drain_slot(be, pool, &ring[head], dp, err);
    if (!rc)
      rc = r2;
    head = (head + 1) % COPY_D2H_RING;
    count--;
  }
  return rc;
}

static int copy_with_temporaries(tport_tensor *dst, tport_tensor *src, bool non_blocking,
                                 tport_err *err)
{
  /* ATen: conversions run on the device when non_blocking, else on the cpu
   * (no extra device memory); "runs on the source" when src is there. */
  bool conv_on_src = non_blocking ? !on_host(src) : on_host(src);
  tport_tensor *dst_c = NULL, *src_c = NULL, *tmp = NULL, *exp = NULL;
  const meta_layout *dl = &dst->layout;
  tport_dtype tmp_dtype = conv_on_src ? dst->dtype : src->dtype;
  int rc = TPORT_OK;
  if (meta_is_contiguous(dl) && tmp_dtype == dst->dtype)
    dst_c = tensor_retain(dst);
  else
    rc = tensor_empty(dst->storage->device, tmp_dtype, dl->ndim, dl->sizes, TPORT_MF_CONTIGUOUS, 0,
                      &dst_c, err);
  if (!rc && conv_on_src) {
    to_options o = {.has_dtype = true, .dtype = dst->dtype};
    bool aliased;
    rc = tensor_to(src, &o, &tmp, &aliased, err);
  } else if (!rc) {
    tmp = tensor_retain(src);
  }
  if (!rc)
    rc = tensor_expand(tmp, dl->ndim, dl->sizes, &exp, err);
  if (!rc) {
    bool aliased;
    rc = tensor_contiguous(exp, TPORT_MF_CONTIGUOUS, &src_c, &aliased, err);
  }
  if (!rc && dst_c != dst) {
    /* The temporary stands for dst: it carries dst's bits (ATen does the same). */
    dst_c->conj = tport_dtype_is_complex(dst_c->dtype) && dst->conj;
    dst_c->neg = dst->neg;
  }
  if (!rc)
    rc = tensor_copy_(dst_c, src_c, non_blocking, err);
  if (!rc && dst_c != dst)
    rc = tensor_copy_(dst, dst_c, non_blocking, err);
  tensor_release(exp);
  tensor_release(tmp);
  tensor_release(src_c);
  tensor_release(dst_c);
  return rc;
}

/* Between devices of two backends: src -> a host copy -> dst. */
static int copy_via_host(tport_tensor *dst, tport_tensor *src, bool non_blocking, tport_err *err)
{
  to_options o = {.has_device = true, .device = {TPORT_DEV_CPU, 0}};
  tport_tensor *h;
  bool aliased;
  int rc = tensor_to(src, &o, &h, &aliased, err);
  if (!rc)
    rc = tensor_copy_(dst, h, non_blocking, err);
  tensor_release(h);
  return rc;
}

int tensor_copy_(tport_tensor *dst, tport_tensor *src, bool non_blocking, tport_err *err)
{
  if (dst == src || tensor_same_data(dst, src))
    return TPORT_OK;
  if (meta_internal_overlap(&dst->layout) == META_OVERLAP_YES)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "unsupported operation: more than one element of the written-to tensor "
                         "refers to a single memory location. Please clone() the tensor before "
                         "performing the operation.");
  if (partial_overlap(dst, src))
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "unsupported operation: some elements of the input tensor and the "
                         "written-to tensor refer to a single memory location. Please clone() "
                         "the tensor before performing the operation.");
  int rc = check_broadcast(dst, src, err);
  if (rc)
    return rc;
  if (tensor_numel(dst) == 0)
    return TPORT_OK;

  plan p;
  build_plan(dst, src, &p);
  tport_device dd = dst->storage->device, sd = src->storage->device;
  if (dd.type == sd.type && dd.index == sd.index)
    return run_kernel(dst, src, &p, bit_flags(dst, src), err);

  size_t sizes[2] = {tport_dtype_size(dst->dtype), tport_dtype_size(src->dtype)};
  bool memcpyable = dst->dtype == src->dtype && plan_is_contiguous(&p, sizes);
  if (!on_host(dst) && !on_host(src)) {
    bool p2p = false;
    if (dd.type == sd.type) {
      const backend_ops *be = backend_get(sd.type);
      p2p = be->can_access_peer(sd.index, dd.index) &&
            be->enable_peer_access(sd.index, dd.index, NULL) == TPORT_OK;
    } else {
      /* Two different backends: no peer path at all; go through the host. */
      return copy_via_host(dst, src, non_blocking, err);
    }
    if (!memcpyable && !p2p)
      return copy_with_temporaries(dst, src, non_blocking, err);
    return copy_d2d(dst, src, &p, memcpyable, p2p, err);
  }
  if (!memcpyable)
    return copy_with_temporaries(dst, src, non_blocking, err);
  rc = on_host(dst) ? copy_d2h(dst, src, non_blocking, err) : copy_h2d(dst, src, non_blocking, err);
  if (!rc)
    rc = fix_bits(dst, bit_flags(dst, src), err);
  return rc;
}
