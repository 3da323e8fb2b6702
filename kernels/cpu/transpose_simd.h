/* transpose_simd.h: vectorized block transposes for transpose.c (see transpose_simd.c). */
#ifndef TPORT_TRANSPOSE_SIMD_H
#define TPORT_TRANSPOSE_SIMD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Instruction sets with a block kernel, in increasing order. */
typedef enum { TR_SIMD_NONE = 0, TR_SIMD_AVX2 = 1, TR_SIMD_AVX512 = 2 } tr_simd_level;

/* The best level this CPU runs, checked once; TR_SIMD_NONE with
 * TPORT_NO_SIMD=1 (the switch of convert_simd.c) or off x86-64. */
tr_simd_level tr_simd_detect(void);

/* Moves an n0 x n1 block of es-byte elements (bits unchanged):
 *   dst[i1*ds1 + i0*es] = src[i0*ss0 + i1*es]   for i0 < n0, i1 < n1,
 * i.e. dst rows run along i0 and src rows along i1.  Any alignment, any
 * n0, n1 >= 0 (edges go through a scalar loop).  pf, when nonzero, is the
 * byte distance from this block's src to the next one's, which is prefetched
 * while this one moves.  stream asks for non-temporal stores (the caller's
 * dst is far larger than the caches); they are used only where whole aligned
 * lines are written, and the caller must _mm_sfence (tr_simd_fence) before
 * another thread reads dst. */
typedef void (*tr_block_fn)(char *dst, const char *src, int64_t n0, int64_t n1, int64_t ds1,
                            int64_t ss0, int64_t pf, bool stream);

/* The block kernel for es-byte elements at `level`, or NULL when there is
 * none (the caller runs its plain loop).  level must not exceed
 * tr_simd_detect(). */
tr_block_fn tr_simd_block(size_t es, tr_simd_level level);

/* Orders the non-temporal stores made so far before later stores. */
void tr_simd_fence(void);

#endif
