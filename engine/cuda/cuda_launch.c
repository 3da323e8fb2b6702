/*
 * cuda_launch.c: the launch decision of the copy kernels -- which kernel,
 * what grid, whether the narrow index will do -- and the launch, with each
 * device's limits asked once (cuda_jit.h; the kernels come from
 * cuda_jit.c's cache).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "cuda_jit.h"
#include "cuda_jit_internal.h"

#define JIT_MAX_DEVICES 64

/* A device's compute capability and grid limits, asked once. */
typedef struct dev_info {
  atomic_int ready; /* release-stored after the fields below */
  int cc;
  cuda_jit_limits lim;
} dev_info;

static struct {
  pthread_mutex_t mu; /* the fields of info */
  dev_info info[JIT_MAX_DEVICES];
} devs = {.mu = PTHREAD_MUTEX_INITIALIZER};

void cuda_jit_forget_devices(void)
{
  pthread_mutex_lock(&devs.mu);
  for (int d = 0; d < JIT_MAX_DEVICES; d++)
    atomic_store_explicit(&devs.info[d].ready, 0, memory_order_relaxed);
  pthread_mutex_unlock(&devs.mu);
}

static int query_device(int dev, int *cc, cuda_jit_limits *lim, tport_err *err)
{
  int major = 0, minor = 0, gx = 0, gy = 0, gz = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&gx, cudaDevAttrMaxGridDimX, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&gy, cudaDevAttrMaxGridDimY, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&gz, cudaDevAttrMaxGridDimZ, dev) != cudaSuccess) {
    cudaGetLastError();
    return tport_err_set(err, TPORT_INTERNAL,
                         "cudaDeviceGetAttribute(compute capability, max grid) of cuda:%d failed",
                         dev);
  }
  if (gx < 1 || gy < 1 || gz < 1)
    return tport_err_set(err, TPORT_INTERNAL, "cuda:%d reports a max grid of %d x %d x %d", dev, gx,
                         gy, gz);
  *cc = major * 10 + minor;
  lim->max_grid[0] = gx < CUDA_JIT_MAX_BLOCKS ? (unsigned)gx : CUDA_JIT_MAX_BLOCKS;
  lim->max_grid[1] = (unsigned)gy;
  lim->max_grid[2] = (unsigned)gz;
  lim->narrow_bits = 32; /* TPORT_IDX=unsigned int */
  return TPORT_OK;
}

static int device_info(int dev, int *cc, cuda_jit_limits *lim, tport_err *err)
{
  if (dev < 0 || dev >= JIT_MAX_DEVICES)
    return query_device(dev, cc, lim, err);
  dev_info *di = &devs.info[dev];
  if (!atomic_load_explicit(&di->ready, memory_order_acquire)) {
    int c;
    cuda_jit_limits l;
    int rc = query_device(dev, &c, &l, err);
    if (rc)
      return rc;
    pthread_mutex_lock(&devs.mu);
    if (!atomic_load_explicit(&di->ready, memory_order_relaxed)) {
      di->cc = c;
      di->lim = l;
      atomic_store_explicit(&di->ready, 1, memory_order_release);
    }
    pthread_mutex_unlock(&devs.mu);
  }
  *cc = di->cc;
  *lim = di->lim;
  return TPORT_OK;
}

/* The offset of the last byte an operand reaches, into *max; false when it
 * has no such bound in 64 bits (a negative stride, an overflow): then only
 * the wide index will do. */
static bool last_byte(const plan *p, int op, size_t esize, uint64_t *max)
{
  uint64_t m = esize - 1;
  for (int d = 0; d < p->ndim; d++) {
    if (p->shape[d] <= 1)
      continue; /* its stride is never multiplied by more than 0 */
    if (p->strides[op][d] < 0)
      return false;
    uint64_t t;
    if (__builtin_mul_overflow((uint64_t)(p->shape[d] - 1), (uint64_t)p->strides[op][d], &t) ||
        __builtin_add_overflow(m, t, &m))
      return false;
  }
  *max = m;
  return true;
}

static unsigned blocks_for(uint64_t work, unsigned per_block, unsigned max)
{
  uint64_t b = (work + per_block - 1) / per_block;
  return b < 1 ? 1 : b > max ? max : (unsigned)b;
}

int cuda_jit_plan_launch(const plan *p, tport_dtype dt, const void *dst, tport_dtype st,
                         const void *src, const cuda_jit_limits *lim, cuda_jit_launch *out)
{
  if (!p || !lim || !out || !cuda_jit_dtype_ok(dt) || !cuda_jit_dtype_ok(st) || p->ndim < 0 ||
      p->ndim > TPORT_MAX_DIMS || lim->narrow_bits < 8 || lim->narrow_bits > 32 ||
      !lim->max_grid[0] || !lim->max_grid[1] || !lim->max_grid[2])
    return TPORT_INVALID_ARGUMENT;
  for (int d = 0; d < p->ndim; d++)
    if (p->shape[d] < 0)
      return TPORT_INVALID_ARGUMENT;
  cuda_jit_launch L;
  memset(&L, 0, sizeof L);
  const int64_t numel = plan_numel(p);
  L.params.numel = numel;
  L.params.ndim = p->ndim;
  L.params.dst = (char *)dst;
  L.params.src = src;
  for (int d = 0; d < p->ndim; d++) {
    L.params.shape[d] = p->shape[d];
    L.params.dst_stride[d] = p->strides[0][d];
    L.params.src_stride[d] = p->strides[1][d];
  }
  if (numel == 0) {
    L.kernel = CUDA_JIT_NONE;
    *out = L;
    return TPORT_OK;
  }
  const size_t ds = tport_dtype_size(dt), ss = tport_dtype_size(st);
  /* copy.cu's TILE: sources of up to 4 bytes move runs of 4 in 64 x 64 tiles */
  const uint64_t tile = ss <= 4 ? CUDA_JIT_TILE4 : CUDA_JIT_TILE;
  const uint64_t vec = CUDA_JIT_VEC(ds, ss);
  const uint64_t tiles0 = p->ndim >= 2 ? ((uint64_t)p->shape[0] + tile - 1) / tile : 0,
                 tiles1 = p->ndim >= 2 ? ((uint64_t)p->shape[1] + tile - 1) / tile : 0;
  uint64_t extra = 0; /* what a loop index reaches past numel - 1 + threads */
  if (p->ndim == 1 && p->strides[0][0] == (int64_t)ds && p->strides[1][0] == (int64_t)ss &&
      (uint64_t)numel >= vec && (uintptr_t)dst % (vec * ds) == 0 &&
      (uintptr_t)src % (vec * ss) == 0) {
    /* dense and aligned: a vector of VEC elements per thread and step */
    const uint64_t nvec = (uint64_t)numel / vec;
    L.kernel = CUDA_JIT_CAST_VEC;
    L.grid[0] = blocks_for(nvec, CUDA_JIT_CAST_BLOCK, lim->max_grid[0]);
    /* its loop counts vectors in steps of the grid's threads: up to
     * nvec - 1 + that step, never past numel - 1 + threads; kept as a bound
     * of its own should the two part */
    const uint64_t step = (uint64_t)L.grid[0] * CUDA_JIT_CAST_BLOCK,
                   plain = (uint64_t)numel + (uint64_t)L.grid[0] * CUDA_JIT_CAST_BLOCK;
    extra = nvec + step > plain ? nvec + step - plain : 0;
    L.grid[1] = L.grid[2] = 1;
    L.block[0] = CUDA_JIT_CAST_BLOCK;
    L.block[1] = L.block[2] = 1;
  } else if (p->ndim >= 2 && p->strides[0][0] == (int64_t)ds && p->strides[1][1] == (int64_t)ss &&
             p->strides[1][0] != (int64_t)ss && p->shape[0] >= 4 && p->shape[1] >= 4 &&
             tiles1 <= lim->max_grid[0] && tiles0 <= lim->max_grid[1]) {
    /* the tiled transpose; x and y are not grid-strided, so both must fit */
    const uint64_t outer = (uint64_t)numel / ((uint64_t)p->shape[0] * (uint64_t)p->shape[1]);
    L.kernel = CUDA_JIT_TRANSPOSE;
    L.grid[0] = (unsigned)tiles1;
    L.grid[1] = (unsigned)tiles0;
    L.grid[2] = outer < lim->max_grid[2] ? (unsigned)outer : lim->max_grid[2];
    L.block[0] = ss <= 4 ? CUDA_JIT_TILE4 / 4 : CUDA_JIT_TILE; /* TILE / TP */
    L.block[1] = ss <= 4 ? CUDA_JIT_ROWS4 : CUDA_JIT_ROWS;
    L.block[2] = 1;
  } else {
    /* the grid-stride loop covers what the grid does not */
    L.kernel = CUDA_JIT_COPY;
    L.grid[0] = blocks_for((uint64_t)numel, CUDA_JIT_BLOCK, lim->max_grid[0]);
    L.grid[1] = L.grid[2] = 1;
    L.block[0] = CUDA_JIT_BLOCK;
    L.block[1] = L.block[2] = 1;
  }
  /* The narrow index holds every value a kernel computes in it: a
   * grid-stride loop's index goes up to numel - 1 + the grid's threads (so
   * does the transpose's, along each grid dimension: its dim-1 index stays
   * below n1 + TILE), cast_vec's vector index up to nvec - 1 + its step
   * (extra), and every offset up to the last byte of either operand. */
  const uint64_t narrow_max = (1ull << lim->narrow_bits) - 1;
  uint64_t threads = 1, reach, dmax, smax;
  bool fits = true;
  for (int i = 0; i < 3; i++)
    fits = fits && !__builtin_mul_overflow(threads, (uint64_t)L.grid[i] * L.block[i], &threads);
  fits = fits && !__builtin_add_overflow((uint64_t)numel - 1, threads, &reach) &&
         !__builtin_add_overflow(reach, extra, &reach) && reach <= narrow_max &&
         last_byte(p, 0, ds, &dmax) && dmax <= narrow_max && last_byte(p, 1, ss, &smax) &&
         smax <= narrow_max;
  L.wide = !fits;
  *out = L;
  return TPORT_OK;
}

int cuda_jit_copy(int dev, cudaStream_t s, const plan *p, void *dst, tport_dtype dt,
                  const void *src, tport_dtype st, unsigned flags, tport_err *err)
{
  if (plan_numel(p) == 0)
    return TPORT_OK;
  int cc;
  cuda_jit_limits lim;
  int rc = device_info(dev, &cc, &lim, err);
  if (rc)
    return rc;
  cuda_jit_launch L;
  rc = cuda_jit_plan_launch(p, dt, dst, st, src, &lim, &L);
  if (rc)
    return tport_err_set(err, rc, "copy kernel %d <- %d: a plan of %d dims the kernels cannot take",
                         (int)dt, (int)st, p->ndim);
  L.params.flags = flags;
  cudaKernel_t k = NULL;
  rc = cuda_jit_get_kernel(cc, (int)dt, (int)st, L.wide, L.kernel, &k, err);
  if (rc)
    return rc;
  void *args[] = {&L.params};
  cudaError_t e = cudaLaunchKernel((const void *)k, (dim3){L.grid[0], L.grid[1], L.grid[2]},
                                   (dim3){L.block[0], L.block[1], L.block[2]}, args, 0, s);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return tport_err_set(err, TPORT_INTERNAL, "cudaLaunchKernel(%s %d <- %d): %s",
                         cuda_jit_kernel_names[L.kernel], (int)dt, (int)st, cudaGetErrorString(e));
  }
  return TPORT_OK;
}
