/*
 * to.c: to() and contiguous(), SEMANTICS.md §2 and §6 (ATen's
 * TensorConversions.cpp: to_will_alias, _to_copy; the unified memory RFC).
 */
#include "dtype.h"
#include "engine.h"
#include "storage.h"
#include "validate.h"

static int resolve_device(tport_device d, tport_device *out, tport_err *err)
{
  const backend_ops *be = backend_get(d.type);
  if (!be)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "device type %d is unknown", (int)d.type);
  if (d.index < 0)
    d.index = 0; /* the current device is always device 0 in tensorport */
  int n = be->device_count();
  if (d.index >= n)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "device %s:%d does not exist (%d present)%s%s", be->name, d.index, n,
                         n ? "" : ": ", n ? "" : be->unavailable_reason());
  *out = d;
  return TPORT_OK;
}

/* The format clause of to_will_alias, or its exact-mode replacement. */
static bool format_allows_alias(const tport_tensor *t, tport_memory_format fmt, bool exact)
{
  if (fmt == TPORT_MF_PRESERVE)
    return true;
  if (exact)
    return meta_is_contiguous_as(&t->layout, fmt);
  return meta_suggest_memory_format(&t->layout) == fmt;
}

/* §6: a managed tensor changes device without copying. */
static int managed_move(tport_tensor *t, tport_device target, bool non_blocking, tport_err *err)
{
  tport_storage *st = t->storage;
  const backend_ops *mem_be = st->mem_be;
  int dev = target.type == TPORT_DEV_CPU ? -1 : target.index;
  be_stream *s = mem_be->stream_default(dev >= 0 ? dev : st->mem_dev);
  int rc = storage_wait(st, mem_be, s, err);
  if (!rc && st->nbytes)
    rc = mem_be->mem_advise_preferred(st->ptr, st->nbytes, dev, err);
  if (!rc && st->nbytes)
    rc = mem_be->mem_prefetch_async(st->ptr, st->nbytes, dev, s, err);
  if (!rc)
    rc = storage_mark(&st, 1, mem_be, dev >= 0 ? dev : st->mem_dev, s, err);
  if (rc)
    return rc;
  pthread_mutex_lock(&st->mu);
  st->device = target;
  pthread_mutex_unlock(&st->mu);
  if (target.type == TPORT_DEV_CPU && !non_blocking)
    rc = storage_sync(st, err);
  return rc;
}

/* What to() does for these arguments: alias t, move it (managed), or make a
 * fresh tensor on target in dtype with these strides and flags. */
typedef enum { TO_ALIAS, TO_MOVE, TO_COPY } to_kind;
typedef struct to_plan {
  to_kind kind;
  tport_device target;
  tport_dtype dtype;
  int64_t strides[TPORT_MAX_DIMS];
  unsigned flags;
} to_plan;

static int plan_to(const tport_tensor *t, const to_options *o, to_plan *p, tport_err *err)
{
  tport_device target = tensor_device(t);
  int rc;
  if (o->has_device && (rc = resolve_device(o->device, &target, err)) != TPORT_OK)
    return rc;
  if (o->has_dtype && !dtype_name(o->dtype))
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "dtype is %d: not a known dtype",
                         (int)o->dtype);
  tport_dtype dtype = o->has_dtype ? o->dtype : t->dtype;
  tport_memory_format fmt = o->has_format ? o->format : TPORT_MF_PRESERVE;
  if (fmt == TPORT_MF_NONE || (unsigned)fmt > TPORT_MF_NONE)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "memory_format %d cannot be asked for: contiguous, channels_last, "
                         "channels_last_3d or preserve",
                         (int)fmt);
  bool same_device = target.type == tensor_device(t).type && target.index == tensor_device(t).index;
  bool fmt_alias = format_allows_alias(t, fmt, o->exact_format);
  p->target = target;
  p->dtype = dtype;
  p->flags = 0;

  if (dtype == t->dtype && !o->copy && fmt_alias) {
    if (same_device) {
      p->kind = TO_ALIAS;
      return TPORT_OK;
    }
    /* Managed memory moves to another device of its backend or to the host. */
    const backend_ops *mem_be = t->storage->mem_be;
    if (tensor_is_managed(t) &&
        (target.type == TPORT_DEV_CPU || backend_get(target.type) == mem_be)) {
      p->kind = TO_MOVE;
      return TPORT_OK;
    }
  }

  /* _to_copy */
  p->kind = TO_COPY;
  const meta_layout *l = &t->layout;
  if (fmt == TPORT_MF_PRESERVE) {
    if (meta_is_non_overlapping_and_dense(l)) {
      for (int d = 0; d < l->ndim; d++)
        p->strides[d] = l->strides[d];
    } else {
      meta_infer_dense_strides(l->ndim, l->sizes, l->strides, p->strides);
    }
  } else if ((rc = meta_fresh_strides(l->ndim, l->sizes, fmt, p->strides, err)) != TPORT_OK) {
    return rc;
  }
  /* ATen pins the result of a non_blocking device-to-host copy. */
  if (o->non_blocking && target.type == TPORT_DEV_CPU && tensor_device(t).type != TPORT_DEV_CPU)
    p->flags |= STORAGE_PINNED;
  return TPORT_OK;
}

/* The storage bytes of a fresh tensor of these sizes and strides, as
 * tensor_empty_strided would allocate them. */
static int fresh_nbytes(tport_dtype dtype, const meta_layout *l, const int64_t *strides,
                        size_t *nbytes, tport_err *err)
{
  meta_layout fl;
  validate_result r;
  int rc = validate_desc(dtype, (size_t)l->ndim, l->sizes, (size_t)l->ndim, strides, 0, -1, &fl, &r,
                         err);
  if (!rc)
    *nbytes = (size_t)r.storage_bytes;
  return rc;
}

int tensor_to_nbytes(const tport_tensor *t, const to_options *o, size_t *nbytes, tport_err *err)
{
  to_plan p;
  int rc = plan_to(t, o, &p, err);
  if (rc)
    return rc;
  if (p.kind != TO_COPY) {
    *nbytes = 0;
    return TPORT_OK;
  }
  return fresh_nbytes(p.dtype, &t->layout, p.strides, nbytes, err);
}

int tensor_to(tport_tensor *t, const to_options *o, tport_tensor **out, bool *aliased,
              tport_err *err)
{
  to_plan p;
  int rc = plan_to(t, o, &p, err);
  if (rc)
    return rc;
  if (p.kind == TO_MOVE && (rc = managed_move(t, p.target, o->non_blocking, err)) != TPORT_OK)
    return rc;
  if (p.kind != TO_COPY) {
    *out = tensor_retain(t);
    *aliased = true;
    return TPORT_OK;
  }
  const meta_layout *l = &t->layout;
  tport_tensor *r;
  rc = tensor_empty_strided(p.target, p.dtype, l->ndim, l->sizes, p.strides, p.flags, &r, err);
  if (rc)
    return rc;
  rc = tensor_copy_(r, t, o->non_blocking, err);
  if (rc) {
    tensor_release(r);
    return rc;
  }
  *out = r;
  *aliased = false;
  return TPORT_OK;
}

/* contiguous(fmt)'s decision: *alias when t comes back itself. */
static int plan_contiguous(const tport_tensor *t, tport_memory_format fmt, bool *alias,
                           tport_err *err)
{
  /* PyTorch checks is_contiguous(preserve) -- the plain is_contiguous() --
   * first: a contiguous input comes back itself, only another is refused */
  if (fmt == TPORT_MF_PRESERVE) {
    if (!meta_is_contiguous(&t->layout))
      return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                           "preserve memory format is unsupported by the contiguous operator");
    *alias = true;
    return TPORT_OK;
  }
  if (fmt != TPORT_MF_CONTIGUOUS && fmt != TPORT_MF_CHANNELS_LAST &&
      fmt != TPORT_MF_CHANNELS_LAST_3D)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "memory_format %d is not contiguous, channels_last or channels_last_3d",
                         (int)fmt);
  *alias = meta_is_contiguous_as(&t->layout, fmt);
  return TPORT_OK;
}

int tensor_contiguous_nbytes(const tport_tensor *t, tport_memory_format fmt, size_t *nbytes,
                             tport_err *err)
{
  bool alias = false;
  int rc = plan_contiguous(t, fmt, &alias, err);
  if (rc || alias) {
    if (!rc)
      *nbytes = 0;
    return rc;
  }
  int64_t strides[TPORT_MAX_DIMS];
  rc = meta_fresh_strides(t->layout.ndim, t->layout.sizes, fmt, strides, err);
  return rc ? rc : fresh_nbytes(t->dtype, &t->layout, strides, nbytes, err);
}

int tensor_contiguous(tport_tensor *t, tport_memory_format fmt, tport_tensor **out, bool *aliased,
                      tport_err *err)
{
  bool alias = false;
  int rc = plan_contiguous(t, fmt, &alias, err);
  if (rc)
    return rc;
  if (alias) {
    *out = tensor_retain(t);
    *aliased = true;
    return TPORT_OK;
  }
  tport_tensor *r;
  rc = tensor_empty(tensor_device(t), t->dtype, t->layout.ndim, t->layout.sizes, fmt, 0, &r, err);
  if (rc)
    return rc;
  rc = tensor_copy_(r, t, false, err);
  if (rc) {
    tensor_release(r);
    return rc;
  }
  *out = r;
  *aliased = false;
  return TPORT_OK;
}
