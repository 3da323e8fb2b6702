/*
 * clang_compat.h: force-included (-include) into every file of a TPORT_FUZZ
 * build, whose compiler is clang; the project itself is built with gcc.
 *
 * Two gaps between clang 14 and gcc that the sources rely on:
 * - glibc's <complex.h> defines CMPLX/CMPLXF only for gcc >= 4.7 (clang
 *   says it is gcc 4.2), though clang has __builtin_complex;
 * - clang 14's __builtin_cpu_supports knows no "f16c" (kernels/cpu/
 *   convert_simd.c asks for it): CPUID leaf 1, ECX bit 29 answers instead.
 * Nothing else changes: both stand-ins give what gcc's would.
 */
#ifndef TPORT_CLANG_COMPAT_H
#define TPORT_CLANG_COMPAT_H

#if defined(__clang__)
#define CMPLXF(x, y) __builtin_complex((float)(x), (float)(y))
#define CMPLX(x, y) __builtin_complex((double)(x), (double)(y))

#if defined(__x86_64__)
#include <cpuid.h>

static inline int tport_compat_cpu_supports(const char *feature)
{
  if (__builtin_strcmp(feature, "f16c") == 0) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c >> 29 & 1);
  }
  if (__builtin_strcmp(feature, "avx2") == 0)
    return __builtin_cpu_supports("avx2");
  return 0;
}
/* defined after the function, so that its own call stays the builtin */
#define __builtin_cpu_supports(feature) tport_compat_cpu_supports(feature)
#endif
#endif

#endif
