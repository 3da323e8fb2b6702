/* cuda_jit.c: NVRTC compilation, the kernel cache and launches (see cuda_jit.h). */
#include "cuda_jit.h"

#include <nvrtc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "copy_cu_src.h" /* tport_copy_cu_src: kernels/cuda/copy.cu as a string */

#define BLOCK 256

/* Must match struct Params of kernels/cuda/copy.cu. */
typedef struct copy_params {
  long long shape[TPORT_MAX_DIMS];
  long long dst_stride[TPORT_MAX_DIMS];
  long long src_stride[TPORT_MAX_DIMS];
  long long numel;
  char *dst;
  const char *src;
  int ndim;
  unsigned flags;
} copy_params;

typedef struct jit_entry {
  int dt, st, wide, cc; /* cc: major * 10 + minor */
  cudaLibrary_t lib;
  cudaKernel_t copy, transpose, cast_vec; /* the kernels of kernels/cuda/copy.cu */
  struct jit_entry *next;
} jit_entry;

static struct {
  pthread_mutex_t mu; /* held across a compile: a first use compiles once */
  jit_entry *entries;
  char *cache_dir;
  cuda_jit_stats st;
} jit = {.mu = PTHREAD_MUTEX_INITIALIZER};

static double now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

void cuda_jit_set_cache_dir(const char *dir)
{
  pthread_mutex_lock(&jit.mu);
  free(jit.cache_dir);
  jit.cache_dir = dir ? strdup(dir) : NULL;
  pthread_mutex_unlock(&jit.mu);
}

void cuda_jit_get_stats(cuda_jit_stats *out)
{
  pthread_mutex_lock(&jit.mu);
  *out = jit.st;
  pthread_mutex_unlock(&jit.mu);
}

int cuda_jit_compile_copy(tport_dtype dt, tport_dtype st, bool wide, const char *arch, void **cubin,
                          size_t *size, tport_err *err)
{
  nvrtcProgram prog;
  nvrtcResult r = nvrtcCreateProgram(&prog, tport_copy_cu_src, "tport_copy.cu", 0, NULL, NULL);
  if (r != NVRTC_SUCCESS)
    return tport_err_set(err, TPORT_INTERNAL, "nvrtcCreateProgram: %s", nvrtcGetErrorString(r));
  char o_dst[32], o_src[32], o_arch[48];
  snprintf(o_dst, sizeof o_dst, "-DTPORT_DST=%d", (int)dt);
  snprintf(o_src, sizeof o_src, "-DTPORT_SRC=%d", (int)st);
  snprintf(o_arch, sizeof o_arch, "--gpu-architecture=%s", arch);
  const char *opts[] = {o_dst, o_src, o_arch,
                        wide ? "-DTPORT_IDX=unsigned long long" : "-DTPORT_IDX=unsigned int",
                        "--std=c++17"};
  r = nvrtcCompileProgram(prog, (int)(sizeof opts / sizeof opts[0]), opts);
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nvrtcGetProgramLogSize(prog, &n);
    char *log = calloc(1, n + 1);
    if (log)
      nvrtcGetProgramLog(prog, log);
    tport_err_set(err, TPORT_INTERNAL, "nvrtcCompileProgram(copy %d <- %d, %s): %s: %.150s",
                  (int)dt, (int)st, arch, nvrtcGetErrorString(r), log ? log : "");
    free(log);
    nvrtcDestroyProgram(&prog);
    return TPORT_INTERNAL;
  }
  size_t n = 0;
  r = nvrtcGetCUBINSize(prog, &n);
  void *bin = r == NVRTC_SUCCESS ? malloc(n) : NULL;
  if (bin)
    r = nvrtcGetCUBIN(prog, bin);
  nvrtcDestroyProgram(&prog);
  if (!bin || r != NVRTC_SUCCESS) {
    free(bin);
    return tport_err_set(err, TPORT_INTERNAL, "nvrtcGetCUBIN: %s", nvrtcGetErrorString(r));
  }
  *cubin = bin;
  *size = n;
  return TPORT_OK;
}

/* Disk cache file: one per kernel and source (a change of the source makes a
 * new name, so a stale kernel is never loaded). */
static void cache_path(char *buf, size_t len, const jit_entry *k)
{
  unsigned long h = 5381;
  for (const char *c = tport_copy_cu_src; *c; c++)
    h = h * 33 + (unsigned char)*c;
  snprintf(buf, len, "%s/tport-copy-%d-%d-%s-sm%d-%08lx.cubin", jit.cache_dir, k->dt, k->st,
           k->wide ? "i64" : "i32", k->cc, h & 0xffffffffUL);
}

static void *read_file(const char *path, size_t *n)
{
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  void *b = len > 0 ? malloc((size_t)len) : NULL;
  if (b && fread(b, 1, (size_t)len, f) != (size_t)len) {
    free(b);
    b = NULL;
  }
  fclose(f);
  *n = (size_t)len;
  return b;
}

static void write_file(const char *path, const void *b, size_t n)
{
  char tmp[1100];
  snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
  FILE *f = fopen(tmp, "wb");
  if (!f)
    return;
  bool ok = fwrite(b, 1, n, f) == n;
  ok = fclose(f) == 0 && ok;
  if (ok)
    rename(tmp, path); /* atomic: another process never reads half a file */
  else
    remove(tmp);
}

static int get_kernel(int dev, int dt, int st, int wide, jit_entry **out, tport_err *err)
{
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
    cudaGetLastError();
    return tport_err_set(err, TPORT_INTERNAL, "cudaDeviceGetAttribute(compute capability) failed");
  }
  int cc = major * 10 + minor;
  pthread_mutex_lock(&jit.mu);
  for (jit_entry *e = jit.entries; e; e = e->next)
    if (e->dt == dt && e->st == st && e->wide == wide && e->cc == cc) {
      jit.st.hits++;
      *out = e;
      pthread_mutex_unlock(&jit.mu);
      return TPORT_OK;
    }
  jit.st.misses++;
  jit_entry *k = calloc(1, sizeof *k);
  int rc = k ? TPORT_OK : tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  void *bin = NULL;
  size_t n = 0;
  char path[1024] = "";
  if (!rc) {
    *k = (jit_entry){.dt = dt, .st = st, .wide = wide, .cc = cc};
    if (jit.cache_dir) {
      cache_path(path, sizeof path, k);
      bin = read_file(path, &n);
      if (bin)
        jit.st.disk_hits++;
    }
    if (!bin) {
      char arch[16];
      snprintf(arch, sizeof arch, "sm_%d", cc);
      double t0 = now_ms();
      rc = cuda_jit_compile_copy((tport_dtype)dt, (tport_dtype)st, wide, arch, &bin, &n, err);
      jit.st.compile_ms += now_ms() - t0;
      if (!rc && path[0])
        write_file(path, bin, n);
    }
  }
  if (!rc) {
    cudaError_t e = cudaLibraryLoadData(&k->lib, bin, NULL, NULL, 0, NULL, NULL, 0);
    if (e == cudaSuccess)
      e = cudaLibraryGetKernel(&k->copy, k->lib, "tport_copy");
    if (e == cudaSuccess)
      e = cudaLibraryGetKernel(&k->transpose, k->lib, "tport_transpose");
    if (e == cudaSuccess)
      e = cudaLibraryGetKernel(&k->cast_vec, k->lib, "tport_cast_vec");
    if (e != cudaSuccess) {
      cudaGetLastError();
      rc = tport_err_set(err, TPORT_INTERNAL, "cudaLibraryLoadData/GetKernel(tport_copy): %s",
                         cudaGetErrorString(e));
    }
  }
  free(bin);
  if (rc) {
    free(k);
  } else {
    k->next = jit.entries;
    jit.entries = k;
    *out = k;
  }
  pthread_mutex_unlock(&jit.mu);
  return rc;
}

int cuda_jit_copy(int dev, cudaStream_t s, const plan *p, void *dst, tport_dtype dt,
                  const void *src, tport_dtype st, unsigned flags, tport_err *err)
{
  copy_params prm;
  memset(&prm, 0, sizeof prm);
  prm.numel = plan_numel(p);
  if (prm.numel == 0)
    return TPORT_OK;
  prm.ndim = p->ndim;
  prm.dst = dst;
  prm.src = src;
  prm.flags = flags;
  /* 32-bit index arithmetic when every index and byte offset fits */
  unsigned long long dmax = tport_dtype_size(dt), smax = tport_dtype_size(st);
  for (int d = 0; d < p->ndim; d++) {
    prm.shape[d] = p->shape[d];
    prm.dst_stride[d] = p->strides[0][d];
    prm.src_stride[d] = p->strides[1][d];
    dmax += (unsigned long long)(p->shape[d] - 1) * (unsigned long long)p->strides[0][d];
    smax += (unsigned long long)(p->shape[d] - 1) * (unsigned long long)p->strides[1][d];
  }
  int wide =
      (unsigned long long)prm.numel > 0xFFFFFFFFull || dmax > 0xFFFFFFFFull || smax > 0xFFFFFFFFull;
  jit_entry *k = NULL;
  int rc = get_kernel(dev, (int)dt, (int)st, wide, &k, err);
  if (rc)
    return rc;
  void *args[] = {&prm};
  cudaError_t e;
  /* the tiled transpose when dst is dense along dim 0 and src along dim 1 */
  long long tiles0 = p->ndim >= 2 ? (p->shape[0] + 31) / 32 : 0;
  size_t ds = tport_dtype_size(dt), ss = tport_dtype_size(st);
  if (p->ndim == 1 && p->strides[0][0] == (int64_t)ds && p->strides[1][0] == (int64_t)ss &&
      prm.numel >= 4 && (uintptr_t)dst % (4 * ds) == 0 && (uintptr_t)src % (4 * ss) == 0) {
    /* dense and aligned: VEC (4) elements per thread */
    long long blocks = (prm.numel / 4 + BLOCK - 1) / BLOCK;
    if (blocks < 1)
      blocks = 1;
    if (blocks > 65535LL * 32)
      blocks = 65535LL * 32;
    e = cudaLaunchKernel((const void *)k->cast_vec, (dim3){(unsigned)blocks, 1, 1},
                         (dim3){BLOCK, 1, 1}, args, 0, s);
  } else if (p->ndim >= 2 && p->strides[0][0] == (int64_t)tport_dtype_size(dt) &&
             p->strides[1][1] == (int64_t)tport_dtype_size(st) &&
             p->strides[1][0] != (int64_t)tport_dtype_size(st) && p->shape[0] >= 4 &&
             p->shape[1] >= 4 && tiles0 <= 65535) {
    long long outer = prm.numel / (p->shape[0] * p->shape[1]);
    dim3 grid = {(unsigned)((p->shape[1] + 31) / 32), (unsigned)tiles0,
                 (unsigned)(outer < 65535 ? outer : 65535)};
    e = cudaLaunchKernel((const void *)k->transpose, grid, (dim3){32, 8, 1}, args, 0, s);
  } else {
    long long blocks = (prm.numel + BLOCK - 1) / BLOCK;
    if (blocks > 65535LL * 32)
      blocks = 65535LL * 32; /* the grid-stride loop covers the rest */
    e = cudaLaunchKernel((const void *)k->copy, (dim3){(unsigned)blocks, 1, 1}, (dim3){BLOCK, 1, 1},
                         args, 0, s);
  }
  if (e != cudaSuccess) {
    cudaGetLastError();
    return tport_err_set(err, TPORT_INTERNAL, "cudaLaunchKernel(tport_copy %d <- %d): %s", (int)dt,
                         (int)st, cudaGetErrorString(e));
  }
  return TPORT_OK;
}
