/*
 * dlpack.c: DLPack in and out (Debian's dlpack.h, version 0.6).
 *
 * dtype mapping: kDLInt 8/16/32/64 -> int8..int64, kDLUInt 8 -> uint8 (and
 * uint8 with bits 8 stands for bool only when the caller says so: DLPack 0.6
 * has no bool code, so a put never produces bool), kDLFloat 16/32/64,
 * kDLBfloat 16, kDLComplex 64/128.  lanes must be 1.
 *
 * Devices: kDLCPU and kDLCUDAHost (pinned host memory) are read and written
 * in place; kDLCUDA and kDLCUDAManaged are staged through the client's
 * pinned ring (cuda_stage.h), the CUDA runtime loaded on first use
 * (cuda_rt.h).  Device memory must be dense: packing a strided tensor is
 * work for the device that owns it (.contiguous() there), never a copy of
 * the whole tensor to the host here.
 */
#include <dlpack/dlpack.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "get_blocks.h"
#include "cuda_stage.h"

static int dtype_from_dl(DLDataType t, tport_dtype *out, tport_err *err)
{
  if (t.lanes != 1)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "DLPack lanes is %u: only 1 is supported",
                         t.lanes);
  int d = -1;
  switch (t.code) {
  case kDLInt:
    d = t.bits == 8    ? TPORT_INT8
        : t.bits == 16 ? TPORT_INT16
        : t.bits == 32 ? TPORT_INT32
        : t.bits == 64 ? TPORT_INT64
                       : -1;
    break;
  case kDLUInt: d = t.bits == 8 ? TPORT_UINT8 : -1; break;
  case kDLFloat:
    d = t.bits == 16   ? TPORT_FLOAT16
        : t.bits == 32 ? TPORT_FLOAT32
        : t.bits == 64 ? TPORT_FLOAT64
                       : -1;
    break;
  case kDLBfloat: d = t.bits == 16 ? TPORT_BFLOAT16 : -1; break;
  case kDLComplex:
    d = t.bits == 64 ? TPORT_COMPLEX64 : t.bits == 128 ? TPORT_COMPLEX128 : -1;
    break;
  default: break;
  }
  if (d < 0)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "DLPack dtype code %u bits %u is not supported", t.code, t.bits);
  *out = (tport_dtype)d;
  return TPORT_OK;
}

static DLDataType dtype_to_dl(tport_dtype d)
{
  DLDataType t = {.lanes = 1, .bits = (uint8_t)(tport_dtype_size(d) * 8)};
  switch (d) {
  case TPORT_BOOL:
  case TPORT_UINT8: t.code = kDLUInt; break;
  case TPORT_INT8:
  case TPORT_INT16:
  case TPORT_INT32:
  case TPORT_INT64: t.code = kDLInt; break;
  case TPORT_BFLOAT16: t.code = kDLBfloat; break;
  case TPORT_COMPLEX64:
  case TPORT_COMPLEX128: t.code = kDLComplex; break;
  default: t.code = kDLFloat; break;
  }
  return t;
}

/* DLPack's dtype of ours. */
static int dl_dtype(tport_dtype d, DLDataType *out, tport_err *err)
{
  if (!tport_dtype_size(d))
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "dtype %d is unknown", (int)d);
  *out = dtype_to_dl(d);
  return TPORT_OK;
}

/* Dense: every element used once (sorting dims by stride, each stride is the
 * product of the sizes below it). */
static bool dense(int n, const int64_t *sz, const int64_t *st)
{
  int order[TPORT_MAX_DIMS];
  for (int i = 0; i < n; i++)
    order[i] = i;
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && st[order[j]] < st[order[j - 1]]; j--) {
      int t = order[j];
      order[j] = order[j - 1];
      order[j - 1] = t;
    }
  int64_t want = 1;
  for (int i = 0; i < n; i++) {
    int d = order[i];
    if (sz[d] == 1)
      continue;
    if (sz[d] == 0)
      return true;
    if (st[d] != want)
      return false;
    want *= sz[d];
  }
  return true;
}

/* Copies a strided tensor into logical C order. */
static void pack(uint8_t *dst, const uint8_t *src, int n, const int64_t *sz, const int64_t *st,
                 size_t es, int64_t numel)
{
  int64_t idx[TPORT_MAX_DIMS] = {0};
  for (int64_t i = 0; i < numel; i++) {
    int64_t off = 0;
    for (int d = 0; d < n; d++)
      off += idx[d] * st[d];
    memcpy(dst + (size_t)i * es, src + off * (int64_t)es, es);
    for (int d = n - 1; d >= 0; d--) {
      if (++idx[d] < sz[d])
        break;
      idx[d] = 0;
    }
  }
}

typedef struct pack_args {
  const uint8_t *src;
  int ndim;
  const int64_t *sizes, *strides;
  size_t es;
  int64_t numel;
} pack_args;

static void pack_into(void *dst, size_t n, void *arg)
{
  (void)n;
  pack_args *a = arg;
  pack(dst, a->src, a->ndim, a->sizes, a->strides, a->es, a->numel);
}

/* Where a DLTensor's bytes are: *dev true for memory only the device
 * reaches (then mem says which), false for host-addressable memory. */
static int dl_where(const DLTensor *t, const uint8_t *base, size_t nbytes, bool *dev,
                    client_devmem *mem, tport_err *err)
{
  switch (t->device.device_type) {
  case kDLCPU:
  case kDLCUDAHost: *dev = false; return TPORT_OK;
  case kDLCUDA:
  case kDLCUDAManaged: break;
  default:
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "DLPack device type %d: only kDLCPU, kDLCUDA, kDLCUDAHost and "
                         "kDLCUDAManaged tensors are supported",
                         (int)t->device.device_type);
  }
  bool managed = t->device.device_type == kDLCUDAManaged;
  if (t->device.device_id < 0)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "DLPack device_id is %d",
                         t->device.device_id);
  int rc = TPORT_OK;
  if (nbytes) /* an empty tensor's data may be anything */
    rc = stage_check_pointer(base, t->device.device_id, managed, err);
  else {
    const cuda_rt *rt;
    rc = cuda_rt_load(&rt, err); /* the same answer, empty or not */
  }
  if (rc)
    return rc;
  *dev = true;
  mem->base = (uint8_t *)base;
  mem->device = t->device.device_id;
  mem->managed = managed;
  return TPORT_OK;
}

/* numel and nbytes of a DLTensor's shape and dtype, overflow-checked. */
static int dl_size(const DLTensor *t, tport_dtype *dt, int64_t *numel_out, size_t *nbytes,
                   tport_err *err)
{
  if (t->ndim < 0 || t->ndim > TPORT_MAX_DIMS)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "DLPack ndim is %d: the limit is %d", t->ndim,
                         TPORT_MAX_DIMS);
  int rc = dtype_from_dl(t->dtype, dt, err);
  if (rc)
    return rc;
  size_t es = tport_dtype_size(*dt);
  int64_t numel = 1;
  for (int d = 0; d < t->ndim; d++) {
    if (t->shape[d] < 0)
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "DLPack shape[%d] is negative", d);
    if (__builtin_mul_overflow(numel, t->shape[d], &numel))
      return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                           "DLPack shape: the number of elements overflows at shape[%d]", d);
  }
  int64_t nb;
  if (__builtin_mul_overflow(numel, (int64_t)es, &nb) || (uint64_t)nb > SIZE_MAX)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "DLPack shape: the byte count overflows");
  *numel_out = numel;
  *nbytes = (size_t)nb;
  return TPORT_OK;
}

int tport_put_dlpack(tport_client *c, const DLTensor *t, const tport_put_options *opts,
                     tport_tensor_info *out, tport_err *err)
{
  tport_dtype dt = TPORT_UINT8;
  int64_t numel;
  size_t nbytes;
  int rc = dl_size(t, &dt, &numel, &nbytes, err);
  if (rc)
    return rc;
  size_t es = tport_dtype_size(dt);
  const uint8_t *base = (const uint8_t *)t->data + t->byte_offset;
  if (t->strides)
    for (int d = 0; d < t->ndim; d++)
      if (t->strides[d] < 0)
        return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                             "DLPack strides[%d] is negative: not supported", d);
  bool on_dev = false;
  client_devmem mem;
  if ((rc = dl_where(t, base, nbytes, &on_dev, &mem, err)) != TPORT_OK)
    return rc;
  client_put_desc d = {.dtype = dt,
                       .ndim = t->ndim,
                       .sizes = t->shape,
                       .strides = t->strides,
                       .nbytes = nbytes,
                       .opts = opts};
  if (on_dev) {
    if (t->strides && !dense(t->ndim, t->shape, t->strides))
      return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                           "DLPack strides: a device tensor with gaps or overlaps cannot be put "
                           "(make it contiguous on its device first)");
    d.dev = &mem;
    return client_put(c, &d, out, err);
  }
  if (!t->strides || dense(t->ndim, t->shape, t->strides)) {
    d.data = base;
    return client_put(c, &d, out, err);
  }
  /* gaps or overlaps: the values go in logical C order, packed where
   * path.c says (straight into the client's region on the same host: one
   * copy; else into a buffer for the socket) */
  pack_args pa = {base, t->ndim, t->shape, t->strides, es, numel};
  d.strides = NULL;
  d.fill = pack_into;
  d.fill_arg = &pa;
  return client_put(c, &d, out, err);
}

typedef struct dl_holder {
  DLManagedTensor m;
  int64_t shape[TPORT_MAX_DIMS];
} dl_holder;

static void dl_delete(DLManagedTensor *self)
{
  get_block_free(self->dl_tensor.data); /* kept for the next get */
  free(self);
}

/* Whether info (a server's word) describes exactly nbytes, the bytes it
 * sent: a DLTensor's readers size it from its shape and dtype alone. */
static int describes(const tport_tensor_info *info, size_t nbytes, tport_err *err)
{
  size_t total = tport_dtype_size(info->dtype);
  bool ok = total != 0 && info->ndim >= 0 && info->ndim <= TPORT_MAX_DIMS;
  for (int d = 0; ok && d < info->ndim; d++)
    ok = info->sizes[d] >= 0 && !__builtin_mul_overflow(total, (size_t)info->sizes[d], &total);
  if (ok && total == nbytes)
    return TPORT_OK;
  if (!ok)
    return tport_err_set(err, TPORT_DATA_LOSS,
                         "the server sent %zu bytes for a tensor of no valid size (dtype %d, "
                         "%d dimensions)",
                         nbytes, (int)info->dtype, info->ndim);
  return tport_err_set(err, TPORT_DATA_LOSS,
                       "the server sent %zu bytes for a tensor whose sizes and dtype make %zu",
                       nbytes, total);
}

int client_managed_block(void *buf, size_t nbytes, const tport_tensor_info *info,
                         DLManagedTensor **out, tport_err *err)
{
  int rc = describes(info, nbytes, err);
  if (rc) {
    get_block_free(buf);
    return rc;
  }
  dl_holder *h = calloc(1, sizeof *h);
  if (!h) {
    get_block_free(buf);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  }
  memcpy(h->shape, info->sizes, sizeof(int64_t) * (size_t)info->ndim);
  h->m.dl_tensor.data = buf;
  h->m.dl_tensor.device = (DLDevice){kDLCPU, 0};
  h->m.dl_tensor.ndim = info->ndim;
  h->m.dl_tensor.dtype = dtype_to_dl(info->dtype);
  h->m.dl_tensor.shape = h->shape;
  h->m.dl_tensor.strides = NULL; /* compact row-major */
  h->m.manager_ctx = NULL;
  h->m.deleter = dl_delete;
  *out = &h->m;
  return TPORT_OK;
}

int tport_get_dlpack(tport_client *c, const tport_ref *ref, DLManagedTensor **out, tport_err *err)
{
  void *buf = NULL;
  size_t n;
  tport_tensor_info info;
  /* into a buffer of get_blocks.h: a pipeline's gets of one size reuse
   * one, where fresh memory would fault in page by page */
  client_get_desc g = {.ref = ref, .alloc = true, .alloc_blocks = true};
  int rc = client_get(c, &g, &buf, &n, &info, err);
  if (rc)
    return rc;
  return client_managed_block(buf, n, &info, out, err);
}

int tport_get_into_dlpack(tport_client *c, const tport_ref *ref, const DLTensor *dst,
                          tport_tensor_info *info, tport_err *err)
{
  tport_dtype dt = TPORT_UINT8;
  int64_t numel;
  size_t nbytes;
  int rc = dl_size(dst, &dt, &numel, &nbytes, err);
  if (rc)
    return rc;
  if (dst->strides) {
    /* compact row-major only: the values come in logical C order */
    int64_t want = 1;
    for (int d = dst->ndim - 1; d >= 0; d--) {
      if (dst->shape[d] != 1 && dst->strides[d] != want)
        return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                             "DLPack strides[%d] is %lld: a get writes a contiguous (row-major) "
                             "tensor, where it would be %lld",
                             d, (long long)dst->strides[d], (long long)want);
      want *= dst->shape[d]; /* no overflow: numel did not */
    }
  }
  uint8_t *base = (uint8_t *)dst->data + dst->byte_offset;
  bool on_dev = false;
  client_devmem mem;
  if ((rc = dl_where(dst, base, nbytes, &on_dev, &mem, err)) != TPORT_OK)
    return rc;
  client_get_want want = {dt, dst->ndim, dst->shape};
  client_get_desc g = {.ref = ref,
                       .buf = on_dev ? NULL : base,
                       .dev = on_dev ? &mem : NULL,
                       .cap = nbytes,
                       .want = &want};
  return client_get(c, &g, NULL, NULL, info, err);
}

/* A region's tensor as a DLTensor (tport.h, "Same-host shared memory"). */
int tport_shm_dlpack(const tport_shm *r, size_t offset, const tport_tensor_info *info,
                     DLTensor *out, int64_t shape[TPORT_MAX_DIMS], tport_err *err)
{
  if (!r || !info || info->ndim < 0 || info->ndim > TPORT_MAX_DIMS)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "a region and a tensor's info are needed");
  size_t nbytes;
  int rc = client_shm_tensor_at(r, offset, info->dtype, info->ndim, info->sizes, &nbytes, err);
  if (rc)
    return rc;
  DLDataType dt;
  if ((rc = dl_dtype(info->dtype, &dt, err)) != TPORT_OK)
    return rc;
  memset(out, 0, sizeof *out);
  for (int d = 0; d < info->ndim; d++)
    shape[d] = info->sizes[d];
  out->data = r->data + offset;
  out->device = (DLDevice){kDLCPU, 0};
  out->ndim = info->ndim;
  out->dtype = dt;
  out->shape = shape;
  out->strides = NULL; /* contiguous: the get wrote logical C order */
  out->byte_offset = 0;
  return TPORT_OK;
}
