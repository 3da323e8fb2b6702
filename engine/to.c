/*
 * to.c: to() and contiguous(), SEMANTICS.md §2 and §6 (ATen's
 * TensorConversions.cpp: to_will_alias, _to_copy; the unified memory RFC).
 */
#include "dtype.h"
#include "engine.h"

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

int tensor_to(tport_tensor *t, const to_options *o, tport_tensor **out, bool *aliased,
              tport_err *err)
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

  if (dtype == t->dtype && !o->copy && fmt_alias) {
    if (same_device) {
      *out = tensor_retain(t);
      *aliased = true;
      return TPORT_OK;
    }
    /* Managed memory moves to another device of its backend or to the host. */
    const backend_ops *mem_be = t->storage->mem_be;
    if (tensor_is_managed(t) &&
        (target.type == TPORT_DEV_CPU || backend_get(target.type) == mem_be)) {
      rc = managed_move(t, target, o->non_blocking, err);
      if (rc)
        return rc;
      *out = tensor_retain(t);
      *aliased = true;
      return TPORT_OK;
    }
  }

  /* _to_copy */
  const meta_layout *l = &t->layout;
  int64_t strides[TPORT_MAX_DIMS];
  if (fmt == TPORT_MF_PRESERVE) {
    if (meta_is_non_overlapping_and_dense(l)) {
      for (int d = 0; d < l->ndim; d++)
        strides[d] = l->strides[d];
    } else {
      meta_infer_dense_strides(l->ndim, l->sizes, l->strides, strides);
    }
  } else if ((rc = meta_fresh_strides(l->ndim, l->sizes, fmt, strides, err)) != TPORT_OK) {
    return rc;
  }
  /* ATen pins the result of a non_blocking device-to-host copy. */
  unsigned flags = 0;
  if (o->non_blocking && target.type == TPORT_DEV_CPU && tensor_device(t).type != TPORT_DEV_CPU)
    flags |= STORAGE_PINNED;
  tport_tensor *r;
  rc = tensor_empty_strided(target, dtype, l->ndim, l->sizes, strides, flags, &r, err);
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

int tensor_contiguous(tport_tensor *t, tport_memory_format fmt, tport_tensor **out, bool *aliased,
                      tport_err *err)
{
  /* PyTorch checks is_contiguous(preserve) -- the plain is_contiguous() --
   * first: a contiguous input comes back itself, only another is refused */
  if (fmt == TPORT_MF_PRESERVE) {
    if (!meta_is_contiguous(&t->layout))
      return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                           "preserve memory format is unsupported by the contiguous operator");
    *out = tensor_retain(t);
    *aliased = true;
    return TPORT_OK;
  }
  if (fmt != TPORT_MF_CONTIGUOUS && fmt != TPORT_MF_CHANNELS_LAST &&
      fmt != TPORT_MF_CHANNELS_LAST_3D)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "memory_format %d is not contiguous, channels_last or channels_last_3d",
                         (int)fmt);
  if (meta_is_contiguous_as(&t->layout, fmt)) {
    *out = tensor_retain(t);
    *aliased = true;
    return TPORT_OK;
  }
  tport_tensor *r;
  int rc =
      tensor_empty(tensor_device(t), t->dtype, t->layout.ndim, t->layout.sizes, fmt, 0, &r, err);
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
