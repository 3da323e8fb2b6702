/*
 * cuda_jit.h: runtime compilation of the CUDA kernels (seed 004, the
 * JITerator).  Kernel sources live in the binary as strings (from
 * kernels/cuda/, embedded by the build); a kernel is compiled with NVRTC on
 * first use per (operation, dtypes, index width, compute capability), cached
 * in memory and, with a cache directory, on disk.
 *
 * libnvrtc is not linked: it is opened with dlopen on first use (the file
 * named by $TPORT_NVRTC_LIBRARY when set, else libnvrtc.so.13, else
 * libnvrtc.so), so every binary starts where it is missing and a copy that
 * needs a kernel fails with TPORT_UNAVAILABLE, "runtime compilation
 * unavailable: ...".
 *
 * Concurrency: a first use compiles without holding the cache's lock; a
 * second user of that kernel waits for it, users of other kernels do not.  A
 * failed compile is reported to everyone who waited for it and tried again on
 * a later use.
 *
 * How a copy is launched (which kernel, grid, 32- or 64-bit index) is decided
 * by one pure function, cuda_jit_plan_launch(), so that a test can check the
 * decision without a GPU and the host emulation of tests/gpu/emu can run the
 * kernels with exactly the parameters a device would get.
 */
#ifndef TPORT_CUDA_JIT_H
#define TPORT_CUDA_JIT_H

#include <cuda_runtime_api.h>
#include <stdbool.h>
#include <stddef.h>

#include "plan.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CUDA_JIT_BLOCK 256     /* threads per block of copy */
#define CUDA_JIT_CAST_BLOCK 128 /* threads per block of cast_vec */
/* Elements per vector of cast_vec (VEC): 8 where both dtypes have at most 4
 * bytes, else 4; both pointers aligned to a whole vector. */
#define CUDA_JIT_VEC(ds, ss) ((ds) <= 4 && (ss) <= 4 ? 8 : 4)
/* The transpose (TILE, TP, ROWS): where the source has at most 4 bytes, a
 * block of (CUDA_JIT_TILE4 / 4) x CUDA_JIT_ROWS4 threads moves a tile of
 * CUDA_JIT_TILE4 x CUDA_JIT_TILE4 elements in runs of 4; else a block of
 * CUDA_JIT_TILE x CUDA_JIT_ROWS threads moves CUDA_JIT_TILE x CUDA_JIT_TILE
 * elements one by one. */
#define CUDA_JIT_TILE 32
#define CUDA_JIT_ROWS 8
#define CUDA_JIT_TILE4 64
#define CUDA_JIT_ROWS4 32
/* Cap of grid x: more blocks would only add threads that the grid-stride
 * loops do not need. */
#define CUDA_JIT_MAX_BLOCKS (65535 * 32)

/* The kernels' one argument; must match struct Params of kernels/cuda/copy.cu
 * (checked below; copy.cu checks the size).  Strides are in bytes. */
typedef struct copy_params {
  long long shape[TPORT_MAX_DIMS];
  long long dst_stride[TPORT_MAX_DIMS];
  long long src_stride[TPORT_MAX_DIMS];
  long long numel;
  char *dst;
  const char *src;
  int ndim;
  unsigned flags; /* 1 conjugate, 2 negate (CPU_COPY_CONJ/NEG; FLAG_CONJ/NEG of copy.cu) */
} copy_params;

#ifdef __cplusplus
#define CUDA_JIT_STATIC_ASSERT static_assert
#else
#define CUDA_JIT_STATIC_ASSERT _Static_assert
#endif
CUDA_JIT_STATIC_ASSERT(TPORT_MAX_DIMS == 16, "copy.cu hard-codes TPORT_MAX_DIMS 16");
CUDA_JIT_STATIC_ASSERT(sizeof(copy_params) == 416 && offsetof(copy_params, numel) == 384 &&
                           offsetof(copy_params, dst) == 392 && offsetof(copy_params, src) == 400 &&
                           offsetof(copy_params, ndim) == 408 &&
                           offsetof(copy_params, flags) == 412,
                       "copy_params must match struct Params of kernels/cuda/copy.cu");

/* The kernels of kernels/cuda/copy.cu. */
typedef enum cuda_jit_kernel {
  CUDA_JIT_COPY = 0,      /* tport_copy: any plan, grid-stride over elements */
  CUDA_JIT_TRANSPOSE = 1, /* tport_transpose: dst dense along dim 0, src along dim 1 */
  CUDA_JIT_CAST_VEC = 2,  /* tport_cast_vec: 1-D, both dense, VEC-aligned pointers */
  CUDA_JIT_NONE = 3,      /* no elements: nothing to launch */
} cuda_jit_kernel;
#define CUDA_JIT_NUM_KERNELS 3

/* What a device allows and how wide the narrow index type is. */
typedef struct cuda_jit_limits {
  unsigned max_grid[3]; /* x, y, z: cudaDevAttrMaxGridDimX/Y/Z (x capped at
                           CUDA_JIT_MAX_BLOCKS); each >= 1 */
  int narrow_bits;      /* bits of the narrow TPORT_IDX, 8..32: 32 on a device
                           (unsigned int); the host emulation uses 16 */
} cuda_jit_limits;

/* One launch, as cuda_jit_copy makes it. */
typedef struct cuda_jit_launch {
  cuda_jit_kernel kernel;
  unsigned grid[3], block[3]; /* x, y, z; zero for CUDA_JIT_NONE */
  bool wide;                  /* 64-bit index (TPORT_IDX unsigned long long) */
  copy_params params;         /* flags left 0: the caller sets them */
} cuda_jit_launch;

/* Decides how the copy of a 2-operand plan (operand 0 dst, dtype dt; operand
 * 1 src, dtype st) runs: the kernel, its grid (within lim->max_grid) and
 * block, and whether the narrow index suffices.  The narrow index is used
 * only when every value the kernel computes in it fits lim->narrow_bits:
 * numel - 1 plus the threads of the grid (the last step of a grid-stride
 * loop) and every byte offset of either operand (PyTorch's
 * can_use_32bit_indexing).  Pure: no CUDA call, no allocation; dst and src
 * are only looked at for alignment.  Returns TPORT_INVALID_ARGUMENT for a
 * plan, dtype or limits out of range; *out is set only on success. */
int cuda_jit_plan_launch(const plan *p, tport_dtype dt, const void *dst, tport_dtype st,
                         const void *src, const cuda_jit_limits *lim, cuda_jit_launch *out);

/* The copy kernel over a 2-operand plan (operand 0 dst) on the current
 * device's stream s (the caller holds the device guard), launched as
 * cuda_jit_plan_launch() says with the device's own limits. */
int cuda_jit_copy(int dev, cudaStream_t s, const plan *p, void *dst, tport_dtype dst_dtype,
                  const void *src, tport_dtype src_dtype, unsigned flags, tport_err *err);

/* Compiles the copy kernel for an architecture ("sm_90") to a CUBIN (malloc'ed;
 * free it).  Needs no GPU: the build tests every dtype pair through it.
 * TPORT_UNAVAILABLE when libnvrtc cannot be loaded. */
int cuda_jit_compile_copy(tport_dtype dst_dtype, tport_dtype src_dtype, bool wide_index,
                          const char *arch, void **cubin, size_t *size, tport_err *err);

/* The NVRTC options cuda_jit_compile_copy passes for that kernel, joined by
 * single spaces into buf (always NUL-terminated when n > 0, truncated to n).
 * Returns the length of the whole string, as snprintf does. */
size_t cuda_jit_copy_options(tport_dtype dst_dtype, tport_dtype src_dtype, bool wide_index,
                             const char *arch, char *buf, size_t n);

/* Loads libnvrtc if not yet tried (once per process).  False when runtime
 * compilation is unavailable, with "runtime compilation unavailable: <why>"
 * in why; true with "NVRTC <major>.<minor> (<library>)" in why.  why may be
 * NULL. */
bool cuda_jit_available(char *why, size_t n);

/* A directory for compiled kernels (NULL: memory only).  Call before use.
 * Files are named by dtypes, index width, compute capability, NVRTC version
 * and a hash of the source and the compile options; one the runtime refuses
 * to load is removed and compiled again. */
void cuda_jit_set_cache_dir(const char *dir);

typedef struct cuda_jit_stats {
  uint64_t hits, misses, disk_hits; /* misses: compiles started (from disk or NVRTC) */
  double compile_ms;                /* total time in NVRTC */
} cuda_jit_stats;
void cuda_jit_get_stats(cuda_jit_stats *out);

/* Unloads every loaded kernel library (cudaLibraryUnload) and forgets the
 * memory cache and the device limits, so that the next use loads again (from
 * the disk cache where there is one).  The stats and the cache directory
 * stay.  Waits for compiles in progress; call only when no copy runs or
 * starts (at shutdown, between tests). */
void cuda_jit_reset(void);

#ifdef __cplusplus
}
#endif

#endif
