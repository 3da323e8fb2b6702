/* tensor.c: tensor creation, views, queries, and host read/write. */
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "storage.h"
#include "staging.h"
#include "validate.h"

static atomic_uint test_faults;

void engine_set_test_faults(unsigned f)
{
  atomic_store(&test_faults, f);
}
unsigned engine_test_faults(void)
{
  return atomic_load(&test_faults);
}

/* A tensor over storage s, taking the caller's reference to s (released on failure). */
static int tensor_alloc(tport_storage *s, tport_dtype dtype, const meta_layout *l,
                        tport_tensor **out, tport_err *err)
{
  tport_tensor *t = calloc(1, sizeof *t);
  if (!t) {
    storage_release(s);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of host memory for a tensor");
  }
  atomic_init(&t->refs, 1);
  t->storage = s;
  t->dtype = dtype;
  t->layout = *l;
  *out = t;
  return TPORT_OK;
}

int tensor_empty_strided(tport_device dev, tport_dtype dtype, int ndim, const int64_t *sizes,
                         const int64_t *strides, unsigned flags, tport_tensor **out, tport_err *err)
{
  if (ndim < 0)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "ndim is %d: it must be >= 0", ndim);
  meta_layout l;
  validate_result r;
  int rc = validate_desc(dtype, (size_t)ndim, sizes, (size_t)ndim, strides, 0, -1, &l, &r, err);
  if (rc)
    return rc;
  if (dev.index < 0)
    dev.index = 0;
  tport_storage *s;
  rc = storage_new(dev, (size_t)r.storage_bytes, flags, &s, err);
  return rc ? rc : tensor_alloc(s, dtype, &l, out, err);
}

int tensor_empty(tport_device dev, tport_dtype dtype, int ndim, const int64_t *sizes,
                 tport_memory_format fmt, unsigned flags, tport_tensor **out, tport_err *err)
{
  if (ndim < 0 || ndim > TPORT_MAX_DIMS)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "ndim is %d: it must be in [0, %d]", ndim,
                         TPORT_MAX_DIMS);
  for (int d = 0; d < ndim; d++)
    if (sizes[d] < 0)
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "sizes[%d] is %lld: sizes must be >= 0", d,
                           (long long)sizes[d]);
  int64_t strides[TPORT_MAX_DIMS];
  int rc = meta_fresh_strides(ndim, sizes, fmt, strides, err);
  if (rc)
    return rc;
  return tensor_empty_strided(dev, dtype, ndim, sizes, strides, flags, out, err);
}

int tensor_wrap_host(void *data, size_t nbytes, tport_dtype dtype, int ndim, const int64_t *sizes,
                     const int64_t *strides, int64_t offset, tport_tensor **out, tport_err *err)
{
  if (ndim < 0)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "ndim is %d: it must be >= 0", ndim);
  meta_layout l;
  int rc = validate_desc(dtype, (size_t)ndim, sizes, strides ? (size_t)ndim : 0, strides, offset,
                         (int64_t)nbytes, &l, NULL, err);
  if (rc)
    return rc;
  tport_storage *s;
  rc = storage_wrap_host(data, nbytes, &s, err);
  return rc ? rc : tensor_alloc(s, dtype, &l, out, err);
}

int tensor_wrap_host_pinned(void *data, size_t nbytes, tport_dtype dtype, int ndim,
                            const int64_t *sizes, const int64_t *strides, int64_t offset,
                            tport_tensor **out, tport_err *err)
{
  int rc = tensor_wrap_host(data, nbytes, dtype, ndim, sizes, strides, offset, out, err);
  if (!rc)
    (*out)->storage->flags |= STORAGE_PINNED;
  return rc;
}

tport_tensor *tensor_retain(tport_tensor *t)
{
  atomic_fetch_add(&t->refs, 1);
  return t;
}

void tensor_release(tport_tensor *t)
{
  if (!t || atomic_fetch_sub(&t->refs, 1) != 1)
    return;
  storage_release(t->storage);
  free(t);
}

static int view_of(tport_tensor *t, const meta_layout *l, tport_tensor **out, tport_err *err)
{
  int rc = tensor_alloc(storage_retain(t->storage), t->dtype, l, out, err);
  if (rc)
    return rc;
  (*out)->conj = t->conj;
  (*out)->neg = t->neg;
  return TPORT_OK;
}

int tensor_as_strided(tport_tensor *t, int ndim, const int64_t *sizes, const int64_t *strides,
                      int64_t offset, tport_tensor **out, tport_err *err)
{
  if (ndim < 0)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "ndim is %d: it must be >= 0", ndim);
  meta_layout l;
  int rc = validate_desc(t->dtype, (size_t)ndim, sizes, (size_t)ndim, strides, offset,
                         (int64_t)t->storage->nbytes, &l, NULL, err);
  if (rc)
    return rc;
  return view_of(t, &l, out, err);
}

int tensor_expand(tport_tensor *t, int ndim, const int64_t *sizes, tport_tensor **out,
                  tport_err *err)
{
  const meta_layout *s = &t->layout;
  if (ndim < s->ndim || ndim > TPORT_MAX_DIMS)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "expand: the number of sizes provided (%d) must be greater or equal to "
                         "the number of dimensions in the tensor (%d)",
                         ndim, s->ndim);
  meta_layout l = {.ndim = ndim, .offset = s->offset};
  int lead = ndim - s->ndim;
  for (int d = 0; d < ndim; d++) {
    l.sizes[d] = sizes[d];
    if (d < lead) {
      l.strides[d] = 0;
    } else if (s->sizes[d - lead] == sizes[d]) {
      l.strides[d] = s->strides[d - lead];
    } else if (s->sizes[d - lead] == 1) {
      l.strides[d] = 0;
    } else {
      return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                           "The expanded size of the tensor (%lld) must match the existing size "
                           "(%lld) at non-singleton dimension %d",
                           (long long)sizes[d], (long long)s->sizes[d - lead], d);
    }
  }
  return view_of(t, &l, out, err);
}

int tensor_byte_view(tport_tensor *t, size_t byte_offset, size_t nbytes, tport_tensor **out,
                     tport_err *err)
{
  if (!meta_is_non_overlapping_and_dense(&t->layout))
    return tport_err_set(err, TPORT_FAILED_PRECONDITION,
                         "a byte view needs a non-overlapping and dense tensor");
  size_t total = tensor_nbytes(t);
  if (byte_offset > total || nbytes > total - byte_offset)
    return tport_err_set(err, TPORT_OUT_OF_RANGE,
                         "bytes [%zu, %zu) are outside the tensor's %zu bytes", byte_offset,
                         byte_offset + nbytes, total);
  meta_layout l = {.ndim = 1, .sizes = {(int64_t)nbytes}, .strides = {1}};
  l.offset = t->layout.offset * (int64_t)tport_dtype_size(t->dtype) + (int64_t)byte_offset;
  int rc = tensor_alloc(storage_retain(t->storage), TPORT_UINT8, &l, out, err);
  return rc;
}

int tensor_conj_view(tport_tensor *t, tport_tensor **out, tport_err *err)
{
  int rc = view_of(t, &t->layout, out, err);
  if (!rc && tport_dtype_is_complex(t->dtype))
    (*out)->conj = !t->conj;
  return rc;
}

int tensor_neg_view(tport_tensor *t, tport_tensor **out, tport_err *err)
{
  if (t->dtype == TPORT_BOOL)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "Negation, the `-` operator, on a bool tensor is not supported.");
  int rc = view_of(t, &t->layout, out, err);
  if (!rc)
    (*out)->neg = !t->neg;
  return rc;
}

tport_device tensor_device(const tport_tensor *t)
{
  return t->storage->device;
}

int64_t tensor_numel(const tport_tensor *t)
{
  return meta_numel(&t->layout);
}

size_t tensor_nbytes(const tport_tensor *t)
{
  return (size_t)tensor_numel(t) * tport_dtype_size(t->dtype);
}

bool tensor_is_managed(const tport_tensor *t)
{
  return t->storage->flags & STORAGE_MANAGED;
}

tport_memory_format tensor_actual_format(const tport_tensor *t)
{
  return meta_actual_memory_format(&t->layout);
}

bool tensor_same_data(const tport_tensor *a, const tport_tensor *b)
{
  if (a->storage != b->storage || a->dtype != b->dtype || a->conj != b->conj || a->neg != b->neg ||
      a->layout.offset != b->layout.offset || !meta_same_sizes(&a->layout, &b->layout))
    return false;
  for (int d = 0; d < a->layout.ndim; d++)
    if (a->layout.strides[d] != b->layout.strides[d])
      return false;
  return true;
}

static int wrap_logical(tport_tensor *t, void *host, size_t nbytes, tport_tensor **out,
                        tport_err *err)
{
  if (nbytes != tensor_nbytes(t))
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "host buffer is %zu bytes but the tensor holds %zu", nbytes,
                         tensor_nbytes(t));
  return tensor_wrap_host(host, nbytes, t->dtype, t->layout.ndim, t->layout.sizes, NULL, 0, out,
                          err);
}

int tensor_read(tport_tensor *t, void *host, size_t nbytes, tport_err *err)
{
  tport_tensor *h;
  int rc = wrap_logical(t, host, nbytes, &h, err);
  if (rc)
    return rc;
  rc = tensor_copy_(h, t, false, err);
  if (!rc)
    rc = storage_sync(h->storage, err);
  tensor_release(h);
  return rc;
}

int tensor_write(tport_tensor *t, const void *host, size_t nbytes, tport_err *err)
{
  tport_tensor *h;
  int rc = wrap_logical(t, (void *)host, nbytes, &h, err);
  if (rc)
    return rc;
  rc = tensor_copy_(t, h, false, err);
  if (!rc)
    rc = storage_sync(h->storage, err); /* the caller may reuse its buffer at once */
  tensor_release(h);
  return rc;
}

int tensor_sync(tport_tensor *t, tport_err *err)
{
  return storage_sync(t->storage, err);
}

uint8_t *tensor_host_bytes(tport_tensor *t, size_t off, size_t n)
{
  tport_storage *st = t->storage;
  if (st->device.type != TPORT_DEV_CPU || (st->flags & STORAGE_MANAGED) ||
      !meta_is_non_overlapping_and_dense(&t->layout))
    return NULL;
  size_t total = tensor_nbytes(t);
  if (off > total || n > total - off || !st->ptr)
    return NULL;
  if (storage_sync(st, NULL) != TPORT_OK)
    return NULL;
  /* the layout is dense: its bytes start at its offset and fit its storage */
  return (uint8_t *)st->ptr + (size_t)t->layout.offset * tport_dtype_size(t->dtype) + off;
}

bool tensor_write_host_bytes(tport_tensor *t, size_t off, const void *src, size_t n)
{
  if (n == 0) {
    size_t total = tensor_nbytes(t);
    return t->storage->device.type == TPORT_DEV_CPU && !(t->storage->flags & STORAGE_MANAGED) &&
           meta_is_non_overlapping_and_dense(&t->layout) && off <= total;
  }
  uint8_t *dst = tensor_host_bytes(t, off, n);
  if (!dst)
    return false;
  memcpy(dst, src, n);
  return true;
}

int engine_host_register(void *p, size_t n, bool *registered, tport_err *err)
{
  *registered = false;
  for (int type = 0; type < TPORT_NUM_DEVICE_TYPES; type++) {
    const backend_ops *be = backend_get((tport_device_type)type);
    if (!be->host_register || be->device_count() == 0)
      continue;
    int rc = be->host_register(p, n, err);
    if (rc)
      return rc;
    *registered = true;
  }
  return TPORT_OK;
}

void engine_host_unregister(void *p)
{
  for (int type = 0; type < TPORT_NUM_DEVICE_TYPES; type++) {
    const backend_ops *be = backend_get((tport_device_type)type);
    if (be->host_unregister && be->device_count() > 0)
      be->host_unregister(p);
  }
}

void engine_synchronize_all(void)
{
  for (int type = 0; type < TPORT_NUM_DEVICE_TYPES; type++) {
    const backend_ops *be = backend_get((tport_device_type)type);
    int n = be->device_count();
    for (int d = 0; d < n; d++)
      be->stream_synchronize(be->stream_default(d), NULL);
  }
  storage_reap(true);
  staging_empty_cache(staging_default());
}
