/*
 * convert_simd.c: vectorized dense loops for the casts that dominate tensor
 * pipelines: float32 <-> float16 (F16C), float32 <-> bfloat16 and uint8 -> float32 (AVX2).
 * Chosen at run time when the CPU has the instructions (the build targets
 * plain x86-64).  Results are bit-identical to the scalar loops of half.h:
 * both round to nearest even, and NaN becomes the canonical NaN (0x7e00 with
 * the sign kept for float16, 0x7fc0 for bfloat16) as c10 does.
 */
#include "convert_simd.h"

#include <stdint.h>
#include <stdlib.h>

#include "half.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define TARGET __attribute__((target("avx2,f16c")))

TARGET static void f32_to_f16_f16c(uint16_t *dst, const float *src, int64_t n)
{
  int64_t i = 0;
  const __m256i qnan = _mm256_set1_epi32(0x7E00);
  const __m256i sign_mask = _mm256_set1_epi32((int)0x80000000u);
  for (; i + 8 <= n; i += 8) {
    __m256 x = _mm256_loadu_ps(src + i);
    __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 isnan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    if (_mm256_movemask_ps(isnan)) {
      /* canonical NaN, sign kept: (sign >> 16) | 0x7e00 */
      __m256i sign = _mm256_srli_epi32(_mm256_and_si256(_mm256_castps_si256(x), sign_mask), 16);
      __m256i canon = _mm256_or_si256(sign, qnan);
      __m256i wide = _mm256_cvtepu16_epi32(h);
      wide = _mm256_blendv_epi8(wide, canon, _mm256_castps_si256(isnan));
      __m256i packed = _mm256_packus_epi32(wide, wide);
      h = _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
    }
    _mm_storeu_si128((__m128i *)(dst + i), h);
  }
  for (; i < n; i++)
    dst[i] = f16_from_f32(src[i]);
}

TARGET static void f16_to_f32_f16c(float *dst, const uint16_t *src, int64_t n)
{
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
  for (; i < n; i++)
    dst[i] = f16_to_f32(src[i]);
}

TARGET static void f32_to_bf16_avx2(uint16_t *dst, const float *src, int64_t n)
{
  int64_t i = 0;
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7FFF);
  const __m256i qnan = _mm256_set1_epi32(0x7FC0);
  for (; i + 16 <= n; i += 16) {
    __m256i r[2];
    for (int k = 0; k < 2; k++) {
      __m256 x = _mm256_loadu_ps(src + i + 8 * k);
      __m256i u = _mm256_castps_si256(x);
      __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
      __m256i v = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, bias)), 16);
      __m256 isnan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
      r[k] = _mm256_blendv_epi8(v, qnan, _mm256_castps_si256(isnan));
    }
    /* packus works per 128-bit lane: fix the order with a permute */
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xD8);
    _mm256_storeu_si256((__m256i *)(dst + i), packed);
  }
  for (; i < n; i++)
    dst[i] = bf16_from_f32(src[i]);
}

TARGET static void bf16_to_f32_avx2(float *dst, const uint16_t *src, int64_t n)
{
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
    _mm256_storeu_si256((__m256i *)(dst + i), _mm256_slli_epi32(w, 16));
  }
  for (; i < n; i++)
    dst[i] = bf16_to_f32(src[i]);
}

/* From this many elements on, uint8 -> float32 writes with non-temporal
 * stores: its output is four times its input, a converting put's chunk
 * (4 MiB in, 16 MiB out) is larger than the caches, and an ordinary store
 * first reads every line it is about to overwrite.  Measured on the
 * development machine: a 64x3x224x224 batch in 4 MiB chunks, 2.2 -> 1.8 ms.
 * Below it the output is likely read again soon: cached stores. */
#define U8_F32_STREAM_MIN ((int64_t)256 * 1024)

/* uint8 -> float32 (exact): the cast of image batches put as bytes */
TARGET static void u8_to_f32_avx2(float *dst, const uint8_t *src, int64_t n)
{
  int64_t i = 0;
  if (n >= U8_F32_STREAM_MIN) {
    /* to a 32-byte boundary (dst is float-aligned: at most 7 elements) */
    for (; i < n && ((uintptr_t)(dst + i) & 31); i++)
      dst[i] = (float)src[i];
    for (; i + 8 <= n; i += 8) {
      __m256i w = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(src + i)));
      _mm256_stream_ps(dst + i, _mm256_cvtepi32_ps(w));
    }
    _mm_sfence(); /* ordered before whatever publishes the tensor */
  }
  for (; i + 8 <= n; i += 8) {
    __m256i w = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(src + i)));
    _mm256_storeu_ps(dst + i, _mm256_cvtepi32_ps(w));
  }
  for (; i < n; i++)
    dst[i] = (float)src[i];
}

static bool disabled_by_env(void)
{
  const char *e = getenv("TPORT_NO_SIMD");
  return e && *e && *e != '0';
}

static bool have_simd(void)
{
  static int cached = -1;
  if (cached < 0) {
    __builtin_cpu_init();
    cached = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && !disabled_by_env();
  }
  return cached;
}
#endif

bool simd_cast_dense(tport_dtype dt, tport_dtype st, void *dst, const void *src, int64_t n)
{
#if defined(__x86_64__) && defined(__GNUC__)
  if (!have_simd())
    return false;
  /* the tails load typed elements: an unaligned source takes the generic
   * loops (a put converts straight from a message's payload) */
  if ((uintptr_t)src % tport_dtype_size(st) || (uintptr_t)dst % tport_dtype_size(dt))
    return false;
  if (st == TPORT_UINT8 && dt == TPORT_FLOAT32)
    u8_to_f32_avx2(dst, src, n);
  else if (st == TPORT_FLOAT32 && dt == TPORT_FLOAT16)
    f32_to_f16_f16c(dst, src, n);
  else if (st == TPORT_FLOAT16 && dt == TPORT_FLOAT32)
    f16_to_f32_f16c(dst, src, n);
  else if (st == TPORT_FLOAT32 && dt == TPORT_BFLOAT16)
    f32_to_bf16_avx2(dst, src, n);
  else if (st == TPORT_BFLOAT16 && dt == TPORT_FLOAT32)
    bf16_to_f32_avx2(dst, src, n);
  else
    return false;
  return true;
#else
  (void)dt, (void)st, (void)dst, (void)src, (void)n;
  return false;
#endif
}
