/*
 * transpose_simd.c: the register transposes behind transpose.c's bit-copy
 * blocks.  A block is cut into square units that are loaded as rows of src,
 * transposed in registers and stored as rows of dst, so that every load and
 * store moves a whole vector instead of one element:
 *
 *   element  AVX2                          AVX-512 (F)
 *   1 byte   16x16 (xmm, 4 unpack stages)  -
 *   2 bytes  8x8   (xmm, 3 unpack stages)  -
 *   4 bytes  16x16 (four 8x8 ymm)          16x16 (zmm)
 *   8 bytes  8x8   (four 4x4 ymm)          8x8   (zmm)
 *
 * The 4- and 8-byte units write whole 64-byte dst lines, which is what
 * non-temporal stores need; the narrower sizes always store through the
 * cache.  Edges that do not fill a unit go through a half-size unit where
 * there is one (4 and 8 bytes), then a scalar loop.  The build targets plain
 * x86-64: each kernel carries its own target attribute and is chosen at run
 * time from __builtin_cpu_supports, as convert_simd.c does.  The plain loop of
 * transpose.c stays the reference; tests/kernels compares the two bit for bit.
 */
#include "transpose_simd.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* The scalar edge: also the whole block off x86-64.  Moves through
 * fixed-size memcpy: either side may be unaligned (transpose.c's RAW_TILE). */
#define SCALAR_RECT(T)                                                                             \
  for (int64_t i1 = i1a; i1 < i1b; i1++)                                                           \
    for (int64_t i0 = i0a; i0 < i0b; i0++) {                                                       \
      T v;                                                                                         \
      memcpy(&v, src + i0 * ss0 + i1 * (int64_t)sizeof(T), sizeof v);                              \
      memcpy(dst + i1 * ds1 + i0 * (int64_t)sizeof(T), &v, sizeof v);                              \
    }

static void scalar_rect(size_t es, char *dst, const char *src, int64_t i0a, int64_t i0b,
                        int64_t i1a, int64_t i1b, int64_t ds1, int64_t ss0)
{
  switch (es) {
  case 1: SCALAR_RECT(uint8_t) break;
  case 2: SCALAR_RECT(uint16_t) break;
  case 4: SCALAR_RECT(uint32_t) break;
  case 8: SCALAR_RECT(uint64_t) break;
  default:
    for (int64_t i1 = i1a; i1 < i1b; i1++)
      for (int64_t i0 = i0a; i0 < i0b; i0++)
        memcpy(dst + i1 * ds1 + i0 * (int64_t)es, src + i0 * ss0 + i1 * (int64_t)es, es);
  }
}

static bool disabled_by_env(void)
{
  const char *e = getenv("TPORT_NO_SIMD");
  return e && *e && *e != '0';
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2")))
#define AVX512 __attribute__((target("avx2,avx512f")))

/* ---- units: d and s point at the unit's first dst row and src row. */

/* 8x8 of 4-byte elements in ymm: r[k] (src row k) becomes dst row k. */
AVX2 static inline void tr8x8_ps(__m256 r[8])
{
  __m256 t[8], u[8];
  for (int k = 0; k < 4; k++) {
    t[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  for (int h = 0; h < 2; h++) { /* rows 4h..4h+3: u[4h+c] holds column c of each lane */
    u[4 * h + 0] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0x44);
    u[4 * h + 1] = _mm256_shuffle_ps(t[4 * h], t[4 * h + 2], 0xEE);
    u[4 * h + 2] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0x44);
    u[4 * h + 3] = _mm256_shuffle_ps(t[4 * h + 1], t[4 * h + 3], 0xEE);
  }
  for (int c = 0; c < 4; c++) {
    r[c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x20);
    r[4 + c] = _mm256_permute2f128_ps(u[c], u[4 + c], 0x31);
  }
}

AVX2 static inline void store256(char *p, __m256 v, bool nt)
{
  if (nt)
    _mm256_stream_ps((float *)p, v);
  else
    _mm256_storeu_ps((float *)p, v);
}

AVX2 static inline void unit4_8(char *d, const char *s, int64_t ds1, int64_t ss0)
{
  __m256 r[8];
  for (int k = 0; k < 8; k++)
    r[k] = _mm256_loadu_ps((const float *)(s + k * ss0));
  tr8x8_ps(r);
  for (int k = 0; k < 8; k++)
    _mm256_storeu_ps((float *)(d + k * ds1), r[k]);
}

/* 16x16 as four 8x8: each dst row gets its two halves back to back. */
AVX2 static inline void unit4_16_avx2(char *d, const char *s, int64_t ds1, int64_t ss0, bool nt)
{
  for (int h = 0; h < 2; h++) {
    __m256 a[8], b[8];
    for (int k = 0; k < 8; k++) {
      a[k] = _mm256_loadu_ps((const float *)(s + k * ss0 + 32 * h));
      b[k] = _mm256_loadu_ps((const float *)(s + (8 + k) * ss0 + 32 * h));
    }
    tr8x8_ps(a);
    tr8x8_ps(b);
    for (int k = 0; k < 8; k++) {
      char *o = d + (8 * h + k) * ds1;
      store256(o, a[k], nt);
      store256(o + 32, b[k], nt);
    }
  }
}

/* 4x4 of 8-byte elements in ymm. */
AVX2 static inline void tr4x4_pd(__m256d r[4])
{
  __m256d t0 = _mm256_unpacklo_pd(r[0], r[1]), t1 = _mm256_unpackhi_pd(r[0], r[1]);
  __m256d t2 = _mm256_unpacklo_pd(r[2], r[3]), t3 = _mm256_unpackhi_pd(r[2], r[3]);
  r[0] = _mm256_permute2f128_pd(t0, t2, 0x20);
  r[1] = _mm256_permute2f128_pd(t1, t3, 0x20);
  r[2] = _mm256_permute2f128_pd(t0, t2, 0x31);
  r[3] = _mm256_permute2f128_pd(t1, t3, 0x31);
}

AVX2 static inline void unit8_4(char *d, const char *s, int64_t ds1, int64_t ss0)
{
  __m256d r[4];
  for (int k = 0; k < 4; k++)
    r[k] = _mm256_loadu_pd((const double *)(s + k * ss0));
  tr4x4_pd(r);
  for (int k = 0; k < 4; k++)
    _mm256_storeu_pd((double *)(d + k * ds1), r[k]);
}

AVX2 static inline void unit8_8_avx2(char *d, const char *s, int64_t ds1, int64_t ss0, bool nt)
{
  for (int h = 0; h < 2; h++) {
    __m256d a[4], b[4];
    for (int k = 0; k < 4; k++) {
      a[k] = _mm256_loadu_pd((const double *)(s + k * ss0 + 32 * h));
      b[k] = _mm256_loadu_pd((const double *)(s + (4 + k) * ss0 + 32 * h));
    }
    tr4x4_pd(a);
    tr4x4_pd(b);
    for (int k = 0; k < 4; k++) {
      char *o = d + (4 * h + k) * ds1;
      store256(o, _mm256_castpd_ps(a[k]), nt);
      store256(o + 32, _mm256_castpd_ps(b[k]), nt);
    }
  }
}

/* 8x8 of 2-byte elements in xmm. */
AVX2 static inline void unit2_8(char *d, const char *s, int64_t ds1, int64_t ss0, bool nt)
{
  (void)nt;
  __m128i r[8], a[8], b[8];
  for (int k = 0; k < 8; k++)
    r[k] = _mm_loadu_si128((const __m128i *)(s + k * ss0));
  for (int k = 0; k < 4; k++) {
    a[2 * k] = _mm_unpacklo_epi16(r[2 * k], r[2 * k + 1]);
    a[2 * k + 1] = _mm_unpackhi_epi16(r[2 * k], r[2 * k + 1]);
  }
  for (int h = 0; h < 2; h++) { /* b[4h+g]: columns 2g, 2g+1 of rows 4h..4h+3 */
    b[4 * h + 0] = _mm_unpacklo_epi32(a[4 * h], a[4 * h + 2]);
    b[4 * h + 1] = _mm_unpackhi_epi32(a[4 * h], a[4 * h + 2]);
    b[4 * h + 2] = _mm_unpacklo_epi32(a[4 * h + 1], a[4 * h + 3]);
    b[4 * h + 3] = _mm_unpackhi_epi32(a[4 * h + 1], a[4 * h + 3]);
  }
  for (int g = 0; g < 4; g++) {
    _mm_storeu_si128((__m128i *)(d + (2 * g) * ds1), _mm_unpacklo_epi64(b[g], b[4 + g]));
    _mm_storeu_si128((__m128i *)(d + (2 * g + 1) * ds1), _mm_unpackhi_epi64(b[g], b[4 + g]));
  }
}

/* 16x16 of bytes in xmm. */
AVX2 static inline void unit1_16(char *d, const char *s, int64_t ds1, int64_t ss0, bool nt)
{
  (void)nt;
  __m128i r[16], a[16], b[16], c[16];
  for (int k = 0; k < 16; k++)
    r[k] = _mm_loadu_si128((const __m128i *)(s + k * ss0));
  for (int k = 0; k < 8; k++) { /* a[2k+h]: rows 2k, 2k+1, columns 8h.. */
    a[2 * k] = _mm_unpacklo_epi8(r[2 * k], r[2 * k + 1]);
    a[2 * k + 1] = _mm_unpackhi_epi8(r[2 * k], r[2 * k + 1]);
  }
  for (int m = 0; m < 4; m++) /* b[4m+g]: rows 4m..4m+3, columns 4g.. */
    for (int h = 0; h < 2; h++) {
      b[4 * m + 2 * h] = _mm_unpacklo_epi16(a[4 * m + h], a[4 * m + 2 + h]);
      b[4 * m + 2 * h + 1] = _mm_unpackhi_epi16(a[4 * m + h], a[4 * m + 2 + h]);
    }
  for (int p = 0; p < 2; p++) /* c[8p+e]: rows 8p..8p+7, columns 2e, 2e+1 */
    for (int g = 0; g < 4; g++) {
      c[8 * p + 2 * g] = _mm_unpacklo_epi32(b[8 * p + g], b[8 * p + 4 + g]);
      c[8 * p + 2 * g + 1] = _mm_unpackhi_epi32(b[8 * p + g], b[8 * p + 4 + g]);
    }
  for (int e = 0; e < 8; e++) {
    _mm_storeu_si128((__m128i *)(d + (2 * e) * ds1), _mm_unpacklo_epi64(c[e], c[8 + e]));
    _mm_storeu_si128((__m128i *)(d + (2 * e + 1) * ds1), _mm_unpackhi_epi64(c[e], c[8 + e]));
  }
}

AVX512 static inline void store512(char *p, __m512 v, bool nt)
{
  if (nt)
    _mm512_stream_ps((float *)p, v);
  else
    _mm512_storeu_ps((float *)p, v);
}

/* 16x16 of 4-byte elements in zmm. */
AVX512 static inline void unit4_16_avx512(char *d, const char *s, int64_t ds1, int64_t ss0, bool nt)
{
  __m512 r[16], t[16], u[16];
  for (int k = 0; k < 16; k++)
    r[k] = _mm512_loadu_ps((const float *)(s + k * ss0));
  for (int k = 0; k < 8; k++) {
    t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  for (int k = 0; k < 4; k++) { /* u[4k+c]: rows 4k..4k+3, column 4j+c of lane j */
    u[4 * k + 0] = _mm512_shuffle_ps(t[4 * k], t[4 * k + 2], 0x44);
    u[4 * k + 1] = _mm512_shuffle_ps(t[4 * k], t[4 * k + 2], 0xEE);
    u[4 * k + 2] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0x44);
    u[4 * k + 3] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0xEE);
  }
  for (int c = 0; c < 4; c++) {
    __m512 v = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88),
           w = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
    __m512 v2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
    __m512 w2 = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
    store512(d + c * ds1, _mm512_shuffle_f32x4(v, v2, 0x88), nt);
    store512(d + (4 + c) * ds1, _mm512_shuffle_f32x4(w, w2, 0x88), nt);
    store512(d + (8 + c) * ds1, _mm512_shuffle_f32x4(v, v2, 0xDD), nt);
    store512(d + (12 + c) * ds1, _mm512_shuffle_f32x4(w, w2, 0xDD), nt);
  }
}

/* 8x8 of 8-byte elements in zmm. */
AVX512 static inline void unit8_8_avx512(char *d, const char *s, int64_t ds1, int64_t ss0, bool nt)
{
  __m512d r[8], t[8];
  for (int k = 0; k < 8; k++)
    r[k] = _mm512_loadu_pd((const double *)(s + k * ss0));
  for (int k = 0; k < 4; k++) { /* t[2k+c]: rows 2k, 2k+1, column 2j+c of lane j */
    t[2 * k] = _mm512_unpacklo_pd(r[2 * k], r[2 * k + 1]);
    t[2 * k + 1] = _mm512_unpackhi_pd(r[2 * k], r[2 * k + 1]);
  }
  for (int c = 0; c < 2; c++) {
    __m512d v = _mm512_shuffle_f64x2(t[c], t[2 + c], 0x88),
            w = _mm512_shuffle_f64x2(t[c], t[2 + c], 0xDD);
    __m512d v2 = _mm512_shuffle_f64x2(t[4 + c], t[6 + c], 0x88);
    __m512d w2 = _mm512_shuffle_f64x2(t[4 + c], t[6 + c], 0xDD);
    store512(d + c * ds1, _mm512_castpd_ps(_mm512_shuffle_f64x2(v, v2, 0x88)), nt);
    store512(d + (2 + c) * ds1, _mm512_castpd_ps(_mm512_shuffle_f64x2(w, w2, 0x88)), nt);
    store512(d + (4 + c) * ds1, _mm512_castpd_ps(_mm512_shuffle_f64x2(v, v2, 0xDD)), nt);
    store512(d + (6 + c) * ds1, _mm512_castpd_ps(_mm512_shuffle_f64x2(w, w2, 0xDD)), nt);
  }
}

/* ---- blocks: U x U units over the block, the edges by half-size units
 * (S, when there is one) and then the scalar loop.  Units go along i1 inside
 * a band of U src rows, so that the band is read front to back, row by row.
 * Each unit that starts a src line prefetches the same line of the block the
 * caller names by pf, into L2: with prefetcht0 (L1) the copy measured no
 * faster than with no prefetch at all, with prefetcht1 two blocks ahead it
 * did (NCHW -> NHWC, whose 64 src rows are too many streams for the hardware
 * prefetcher). */

#define UNITS(UNIT, ES, U, NT)                                                                     \
  for (int64_t i0 = 0; i0 < m0; i0 += U)                                                           \
    for (int64_t i1 = 0; i1 < m1; i1 += U) {                                                       \
      const char *s = src + i0 * ss0 + i1 * ES;                                                    \
      if (pf && ((i1 * ES) & 63) == 0)                                                             \
        for (int k = 0; k < U; k++)                                                                \
          _mm_prefetch(s + k * ss0 + pf, _MM_HINT_T1);                                             \
      UNIT(dst + i1 * ds1 + i0 * ES, s, ds1, ss0, NT);                                             \
    }

/* The rectangle [i0a,i0b) x [i1a,i1b) with S x S units where they fit. */
#define EDGE(SMALL, ES, S)                                                                         \
  AVX2 static void edge_##SMALL(char *dst, const char *src, int64_t i0a, int64_t i0b, int64_t i1a, \
                                int64_t i1b, int64_t ds1, int64_t ss0)                             \
  {                                                                                                \
    int64_t e0 = i0a + (i0b - i0a) / S * S, e1 = i1a + (i1b - i1a) / S * S;                        \
    for (int64_t i1 = i1a; i1 < e1; i1 += S)                                                       \
      for (int64_t i0 = i0a; i0 < e0; i0 += S)                                                     \
        SMALL(dst + i1 * ds1 + i0 * ES, src + i0 * ss0 + i1 * ES, ds1, ss0);                       \
    scalar_rect(ES, dst, src, e0, i0b, i1a, i1b, ds1, ss0);                                        \
    scalar_rect(ES, dst, src, i0a, e0, e1, i1b, ds1, ss0);                                         \
  }

EDGE(unit4_8, 4, 8)
EDGE(unit8_4, 8, 4)

static void edge_none1(char *dst, const char *src, int64_t i0a, int64_t i0b, int64_t i1a,
                       int64_t i1b, int64_t ds1, int64_t ss0)
{
  scalar_rect(1, dst, src, i0a, i0b, i1a, i1b, ds1, ss0);
}

static void edge_none2(char *dst, const char *src, int64_t i0a, int64_t i0b, int64_t i1a,
                       int64_t i1b, int64_t ds1, int64_t ss0)
{
  scalar_rect(2, dst, src, i0a, i0b, i1a, i1b, ds1, ss0);
}

#define DEF_BLOCK(NAME, ATTR, UNIT, ES, U, EDGEFN)                                                 \
  ATTR static void NAME(char *dst, const char *src, int64_t n0, int64_t n1, int64_t ds1,           \
                        int64_t ss0, int64_t pf, bool stream)                                      \
  {                                                                                                \
    int64_t m0 = n0 - n0 % U, m1 = n1 - n1 % U;                                                    \
    if (stream && U * ES == 64 && ((uintptr_t)dst & 63) == 0 && (ds1 & 63) == 0) {                 \
      UNITS(UNIT, ES, U, true)                                                                     \
    } else {                                                                                       \
      UNITS(UNIT, ES, U, false)                                                                    \
    }                                                                                              \
    EDGEFN(dst, src, m0, n0, 0, n1, ds1, ss0);                                                     \
    EDGEFN(dst, src, 0, m0, m1, n1, ds1, ss0);                                                     \
  }

DEF_BLOCK(block1_avx2, AVX2, unit1_16, 1, 16, edge_none1)
DEF_BLOCK(block2_avx2, AVX2, unit2_8, 2, 8, edge_none2)
DEF_BLOCK(block4_avx2, AVX2, unit4_16_avx2, 4, 16, edge_unit4_8)
DEF_BLOCK(block8_avx2, AVX2, unit8_8_avx2, 8, 8, edge_unit8_4)
DEF_BLOCK(block4_avx512, AVX512, unit4_16_avx512, 4, 16, edge_unit4_8)
DEF_BLOCK(block8_avx512, AVX512, unit8_8_avx512, 8, 8, edge_unit8_4)

tr_simd_level tr_simd_detect(void)
{
  static _Atomic int cached = -1; /* threads that race here all store the same */
  int level = atomic_load_explicit(&cached, memory_order_relaxed);
  if (level < 0) {
    __builtin_cpu_init();
    level = TR_SIMD_NONE;
    if (!disabled_by_env() && __builtin_cpu_supports("avx2")) {
      level = TR_SIMD_AVX2;
      if (__builtin_cpu_supports("avx512f"))
        level = TR_SIMD_AVX512;
    }
    atomic_store_explicit(&cached, level, memory_order_relaxed);
  }
  return (tr_simd_level)level;
}

tr_block_fn tr_simd_block(size_t es, tr_simd_level level)
{
  if (level > tr_simd_detect())
    level = tr_simd_detect();
  if (level == TR_SIMD_NONE)
    return NULL;
  switch (es) {
  case 1: return block1_avx2;
  case 2: return block2_avx2;
  case 4: return level >= TR_SIMD_AVX512 ? block4_avx512 : block4_avx2;
  case 8: return level >= TR_SIMD_AVX512 ? block8_avx512 : block8_avx2;
  default: return NULL;
  }
}

void tr_simd_fence(void)
{
  _mm_sfence();
}

#else

tr_simd_level tr_simd_detect(void)
{
  (void)disabled_by_env;
  return TR_SIMD_NONE;
}

tr_block_fn tr_simd_block(size_t es, tr_simd_level level)
{
  (void)es, (void)level, (void)scalar_rect;
  return NULL;
}

void tr_simd_fence(void) {}

#endif
