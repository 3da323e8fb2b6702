/* validate.c: descriptor checks for everything that arrives from a client. */
#include "validate.h"

#include "dtype.h"

bool validate_mul(int64_t a, int64_t b, int64_t *out)
{
  return !__builtin_mul_overflow(a, b, out);
}

bool validate_add(int64_t a, int64_t b, int64_t *out)
{
  return !__builtin_add_overflow(a, b, out);
}

int validate_desc(int dtype, size_t ndim, const int64_t *sizes, size_t nstrides,
                  const int64_t *strides, int64_t offset, int64_t storage_bytes, meta_layout *out,
                  validate_result *res, tport_err *err)
{
  if (!dtype_name(dtype))
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "dtype is %d: not a known dtype", dtype);
  if (ndim > TPORT_MAX_DIMS)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "sizes has %zu dims: the limit is %d", ndim,
                         TPORT_MAX_DIMS);
  if (nstrides != 0 && nstrides != ndim)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "strides has %zu entries but sizes has %zu",
                         nstrides, ndim);
  if (offset < 0)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "storage_offset is %lld: it must be >= 0",
                         (long long)offset);
  meta_layout l = {.ndim = (int)ndim, .offset = offset};
  int64_t numel = 1, fresh = 1;
  for (size_t d = 0; d < ndim; d++) {
    if (sizes[d] < 0)
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "sizes[%zu] is %lld: sizes must be >= 0", d,
                           (long long)sizes[d]);
    l.sizes[d] = sizes[d];
    if (!validate_mul(numel, sizes[d], &numel) || numel > VALIDATE_MAX_BYTES)
      return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                           "sizes: the number of elements overflows at sizes[%zu]", d);
    /* an empty tensor has no elements, but the strides of a fresh tensor
     * of its sizes (a copy of it) multiply all the others */
    if (!validate_mul(fresh, sizes[d] > 1 ? sizes[d] : 1, &fresh) || fresh > VALIDATE_MAX_BYTES)
      return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                           "sizes: the strides of these sizes overflow at sizes[%zu]", d);
  }
  if (nstrides) {
    for (size_t d = 0; d < ndim; d++) {
      if (strides[d] < 0)
        return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                             "strides[%zu] is %lld: negative strides are not supported", d,
                             (long long)strides[d]);
      l.strides[d] = strides[d];
    }
  } else {
    meta_fresh_strides(l.ndim, l.sizes, TPORT_MF_CONTIGUOUS, l.strides, NULL);
  }
  int64_t esize = (int64_t)tport_dtype_size(dtype);
  int64_t nbytes, span = 0;
  if (!validate_mul(numel, esize, &nbytes) || nbytes > VALIDATE_MAX_BYTES)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "sizes: %lld elements of %s overflow",
                         (long long)numel, dtype_name(dtype));
  if (numel > 0) {
    for (size_t d = 0; d < ndim; d++) {
      int64_t reach;
      if (!validate_mul(l.sizes[d] - 1, l.strides[d], &reach) || !validate_add(span, reach, &span))
        return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                             "strides[%zu] is %lld: the storage extent overflows", d,
                             (long long)l.strides[d]);
    }
    if (!validate_add(span, 1, &span))
      return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                           "strides: the storage extent overflows (%lld elements)",
                           (long long)span);
  }
  int64_t need_elems, need_bytes;
  if (!validate_add(offset, span, &need_elems) || !validate_mul(need_elems, esize, &need_bytes) ||
      need_bytes > VALIDATE_MAX_BYTES)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "storage_offset %lld plus the strides' extent overflows",
                         (long long)offset);
  if (storage_bytes >= 0 && need_bytes > storage_bytes)
    return tport_err_set(err, TPORT_OUT_OF_RANGE,
                         "storage_offset %lld, sizes and strides reach byte %lld of a storage of "
                         "%lld bytes",
                         (long long)offset, (long long)need_bytes, (long long)storage_bytes);
  *out = l;
  if (res) {
    res->numel = numel;
    res->nbytes = nbytes;
    res->storage_bytes = need_bytes;
  }
  return TPORT_OK;
}
