/*
 * cpu_kernels.h: the CPU kernels.  They know the iteration plan and dtypes,
 * nothing else of ours.  Pointers are to element 0 of each operand (storage
 * base plus offset); plan strides are bytes.
 */
#ifndef TPORT_CPU_KERNELS_H
#define TPORT_CPU_KERNELS_H

#include "plan.h"

/* Converts n elements: dst[i*ds] = cast(src[i*ss]) with the rules of
 * SEMANTICS.md §3 (see convert.c for float -> integer). */
typedef void (*cast_loop_fn)(char *dst, const char *src, int64_t n, int64_t ds, int64_t ss);
cast_loop_fn cpu_cast_loop(tport_dtype dst, tport_dtype src);

/* In-place negation / conjugation of n elements of dtype dt with stride s. */
typedef void (*unary_loop_fn)(char *p, int64_t n, int64_t s);
unary_loop_fn cpu_neg_loop(tport_dtype dt);
unary_loop_fn cpu_conj_loop(tport_dtype dt); /* NULL for non-complex dtypes */

enum {
  CPU_COPY_CONJ = 1u << 0, /* conjugate while copying (complex dst only) */
  CPU_COPY_NEG = 1u << 1,  /* negate while copying */
};

/* How cpu_copy ran (for tests and stats). */
typedef enum {
  CPU_PATH_EMPTY,
  CPU_PATH_MEMCPY,
  CPU_PATH_TRANSPOSE,
  CPU_PATH_STRIDED
} cpu_copy_path;

/* dst = convert(src) over a 2-operand plan (operand 0 dst, 1 src).  The
 * memcpy path when the plan is contiguous and nothing converts; the tiled
 * transpose when dst is dense along plan dim 0 and src along dim 1; else the
 * strided loop.  Large copies are split across the thread pool. */
cpu_copy_path cpu_copy(const plan *p, void *dst, tport_dtype dst_dtype, const void *src,
                       tport_dtype src_dtype, unsigned flags);
/* Whether cpu_copy takes its memcpy path for these operands (*nbytes: the
 * bytes it copies), so that a caller may copy them another way. */
bool cpu_copy_is_memcpy(const plan *p, tport_dtype dst_dtype, tport_dtype src_dtype,
                        unsigned flags, size_t *nbytes);

/* Tiled transpose (transpose.c); called by cpu_copy when eligible.  raw_size
 * is the element size when the copy moves bits unchanged (same dtype, no
 * conj/neg), else 0 (each tile row goes through cast and the post ops). */
bool cpu_transpose_eligible(const plan *p, size_t dsize, size_t ssize);
void cpu_transpose(const plan *p, char *dst, const char *src, cast_loop_fn cast,
                   unary_loop_fn post1, unary_loop_fn post2, size_t raw_size);
/* Which block kernels cpu_transpose uses from now on: 0 the plain loop, 1
 * AVX2, 2 AVX-512, capped at what this CPU has (TPORT_NO_SIMD=1 caps it at 0);
 * a negative level asks for the best.  Returns the level set.  For tests and
 * benchmarks: results are the same bits at every level. */
int cpu_transpose_set_simd(int level);

/* memcpy of n bytes, split across the pool from CPU_MEMCPY_PARALLEL_MIN
 * bytes on in pieces of at least CPU_MEMCPY_GRAIN (the pool's rules: inline
 * when it is busy with another caller).  For staging copies between pageable
 * and pinned memory. */
#define CPU_MEMCPY_PARALLEL_MIN ((size_t)1 << 20)
#define CPU_MEMCPY_GRAIN ((size_t)256 << 10)
void cpu_memcpy_parallel(void *dst, const void *src, size_t n);
/* n bytes split across the pool as cpu_copy splits its memcpy path, each
 * piece copied by copy: memcpy, or a caller's own (the engine's streaming
 * copy of large host tensors). */
typedef void (*cpu_memcpy_fn)(void *dst, const void *src, size_t n);
void cpu_memcpy_split(void *dst, const void *src, size_t n, cpu_memcpy_fn copy);

/* A pool of worker threads shared by all CPU kernels. */
typedef void (*parallel_fn)(void *ctx, int64_t begin, int64_t end);
/* Runs fn over [0, n) in pieces of at least `grain`, on the pool and the
 * calling thread; returns when all pieces are done.  Runs inline when n is
 * small or when the pool is busy with another caller (no nesting deadlock). */
void parallel_for(int64_t n, int64_t grain, parallel_fn fn, void *ctx);
/* Threads used, the caller included (default: online CPUs, or TPORT_NUM_THREADS). */
int parallel_num_threads(void);
void parallel_set_num_threads(int n);

#endif
