/*
 * cuda_jit.h: runtime compilation of the CUDA kernels (seed 004, the
 * JITerator).  Kernel sources live in the binary as strings (from
 * kernels/cuda/, embedded by the build); a kernel is compiled with NVRTC on
 * first use per (operation, dtypes, index width, compute capability), cached
 * in memory and, with a cache directory, on disk.  Concurrent first uses of
 * one kernel compile it once.
 */
#ifndef TPORT_CUDA_JIT_H
#define TPORT_CUDA_JIT_H

#include <cuda_runtime_api.h>

#include "plan.h"

typedef struct cuda_jit_stats {
  uint64_t hits, misses, disk_hits;
  double compile_ms; /* total time in NVRTC */
} cuda_jit_stats;

/* The copy kernel over a 2-operand plan (operand 0 dst) on the current
 * device's stream s (the caller holds the device guard). */
int cuda_jit_copy(int dev, cudaStream_t s, const plan *p, void *dst, tport_dtype dst_dtype,
                  const void *src, tport_dtype src_dtype, unsigned flags, tport_err *err);

/* Compiles the copy kernel for an architecture ("sm_90") to a CUBIN (malloc'ed;
 * free it).  Needs no GPU: the build tests every dtype pair through it. */
int cuda_jit_compile_copy(tport_dtype dst_dtype, tport_dtype src_dtype, bool wide_index,
                          const char *arch, void **cubin, size_t *size, tport_err *err);

/* A directory for compiled kernels (NULL: memory only).  Call before use. */
void cuda_jit_set_cache_dir(const char *dir);
void cuda_jit_get_stats(cuda_jit_stats *out);

#endif
