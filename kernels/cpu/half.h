/*
 * half.h: float16 and bfloat16 <-> float32, bit-exact with c10::Half and
 * c10::BFloat16 (round to nearest even; overflow gives inf; NaN stays NaN:
 * float16 NaN is 0x7e00 with the sign kept, bfloat16 NaN is 0x7fc0).
 * The float16 routines are those of the FP16 library that c10 uses; they rely
 * on IEEE single arithmetic in round-to-nearest (never build with -ffast-math).
 */
#ifndef TPORT_HALF_H
#define TPORT_HALF_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline uint32_t half_f32_bits(float f)
{
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static inline float half_bits_f32(uint32_t u)
{
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static inline uint16_t f16_from_f32(float f)
{
  const float scale_to_inf = 0x1.0p+112f;
  const float scale_to_zero = 0x1.0p-110f;
  float base = (fabsf(f) * scale_to_inf) * scale_to_zero;
  const uint32_t w = half_f32_bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u)
    bias = 0x71000000u;
  base = half_bits_f32((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = half_f32_bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

static inline float f16_to_f32(uint16_t h)
{
  const uint32_t w = (uint32_t)h << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const uint32_t exp_offset = 0xE0u << 23;
  const float exp_scale = 0x1.0p-112f;
  const float normalized = half_bits_f32((two_w >> 4) + exp_offset) * exp_scale;
  const uint32_t magic_mask = 126u << 23;
  const float denormalized = half_bits_f32((two_w >> 17) | magic_mask) - 0.5f;
  const uint32_t cutoff = 1u << 27;
  return half_bits_f32(sign |
                       (two_w < cutoff ? half_f32_bits(denormalized) : half_f32_bits(normalized)));
}

static inline uint16_t bf16_from_f32(float f)
{
  if (f != f)
    return 0x7FC0;
  uint32_t u = half_f32_bits(f);
  uint32_t rounding_bias = ((u >> 16) & 1u) + 0x7FFFu;
  return (uint16_t)((u + rounding_bias) >> 16);
}

static inline float bf16_to_f32(uint16_t b)
{
  return half_bits_f32((uint32_t)b << 16);
}

#endif
