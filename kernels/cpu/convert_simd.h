/* convert_simd.h: vectorized dense casts (see convert_simd.c). */
#ifndef TPORT_CONVERT_SIMD_H
#define TPORT_CONVERT_SIMD_H

#include "tport_types.h"

/* Converts n dense elements when a vector loop exists for the pair and this
 * CPU; returns false (having done nothing) otherwise.  TPORT_NO_SIMD=1 turns
 * the vector loops off. */
bool simd_cast_dense(tport_dtype dst_dtype, tport_dtype src_dtype, void *dst, const void *src,
                     int64_t n);

#endif
