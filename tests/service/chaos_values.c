/* chaos_values.c: see chaos_values.h. */
#include <math.h>
#include <string.h>

#include "chaos_values.h"

/* ---------------------------------------------------------------- randomness */

uint64_t rng;

uint64_t rnd(void)
{
  /* splitmix64: a seed per client makes a failing run reproducible */
  uint64_t z = (rng += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

int64_t below(int64_t n)
{
  return n > 0 ? (int64_t)(rnd() % (uint64_t)n) : 0;
}

bool chance(int percent)
{
  return below(100) < percent;
}

/* ---------------------------------------------------------------- values */

#define B(d) (1u << (d))
#define ALL_DTYPES ((1u << TPORT_NUM_DTYPES) - 1)
#define COMPLEX (B(TPORT_COMPLEX64) | B(TPORT_COMPLEX128))
/* holds[o]: the dtypes that represent every value of dtype o exactly. */
static const unsigned holds[TPORT_NUM_DTYPES] = {
    [TPORT_BOOL] = ALL_DTYPES,
    [TPORT_UINT8] = B(TPORT_UINT8) | B(TPORT_INT16) | B(TPORT_INT32) | B(TPORT_INT64) |
                    B(TPORT_FLOAT16) | B(TPORT_BFLOAT16) | B(TPORT_FLOAT32) | B(TPORT_FLOAT64) |
                    COMPLEX,
    [TPORT_INT8] = B(TPORT_INT8) | B(TPORT_INT16) | B(TPORT_INT32) | B(TPORT_INT64) |
                   B(TPORT_FLOAT16) | B(TPORT_BFLOAT16) | B(TPORT_FLOAT32) | B(TPORT_FLOAT64) |
                   COMPLEX,
    [TPORT_INT16] = B(TPORT_INT16) | B(TPORT_INT32) | B(TPORT_INT64) | B(TPORT_FLOAT32) |
                    B(TPORT_FLOAT64) | COMPLEX,
    [TPORT_INT32] = B(TPORT_INT32) | B(TPORT_INT64) | B(TPORT_FLOAT64) | B(TPORT_COMPLEX128),
    [TPORT_INT64] = B(TPORT_INT64),
    [TPORT_FLOAT16] = B(TPORT_FLOAT16) | B(TPORT_FLOAT32) | B(TPORT_FLOAT64) | COMPLEX,
    [TPORT_BFLOAT16] = B(TPORT_BFLOAT16) | B(TPORT_FLOAT32) | B(TPORT_FLOAT64) | COMPLEX,
    [TPORT_FLOAT32] = B(TPORT_FLOAT32) | B(TPORT_FLOAT64) | COMPLEX,
    [TPORT_FLOAT64] = B(TPORT_FLOAT64) | B(TPORT_COMPLEX128),
    [TPORT_COMPLEX64] = COMPLEX,
    [TPORT_COMPLEX128] = B(TPORT_COMPLEX128),
};

/* A random dtype among those in mask. */
static tport_dtype dtype_in(unsigned mask);

tport_dtype exact_target(tport_dtype o, tport_dtype now, int64_t n)
{
  unsigned mask = holds[o] | B(now);
  for (int d = 0; d < TPORT_NUM_DTYPES; d++)
    if (d != (int)now && n * (int64_t)tport_dtype_size(d) > (2 << 20))
      mask &= ~B(d);
  return dtype_in(mask);
}

static tport_dtype dtype_in(unsigned mask)
{
  tport_dtype pick[TPORT_NUM_DTYPES];
  int n = 0;
  for (int d = 0; d < TPORT_NUM_DTYPES; d++)
    if (mask & B(d))
      pick[n++] = (tport_dtype)d;
  return pick[below(n)];
}

static float half_to_float(uint16_t h)
{
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
  if (e == 0) {
    float f = ldexpf((float)m, -24); /* zero or subnormal: exact */
    return sign ? -f : f;
  }
  bits = sign | (e == 31 ? 0x7f800000u | m << 13 : (e + 112) << 23 | m << 13);
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* Only for values a float16 holds exactly (and infinities). */
static uint16_t float_to_half(float f)
{
  uint16_t sign = signbit(f) ? 0x8000 : 0;
  float a = fabsf(f);
  if (isinf(a))
    return sign | 0x7c00;
  if (a < 0x1p-14f)
    return sign | (uint16_t)(a * 0x1p24f); /* zero or subnormal */
  int e;
  frexpf(a, &e); /* a = [0.5, 1) * 2^e = 1.m * 2^(e-1) */
  uint16_t m = (uint16_t)((ldexpf(a, 1 - e) - 1.0f) * 1024.0f);
  return (uint16_t)(sign | (uint16_t)(e - 1 + 15) << 10 | m);
}

typedef struct value {
  double re, im;
} value;

/* Element p of dtype d, exactly (int64 only for values a double holds, which
 * is all that the holds table lets through). */
static value load(tport_dtype d, const uint8_t *p)
{
  value v = {0, 0};
  union {
    uint8_t u8;
    int8_t i8;
    int16_t i16;
    int32_t i32;
    int64_t i64;
    uint16_t u16;
    float f[2];
    double g[2];
  } u;
  memcpy(&u, p, tport_dtype_size(d));
  switch (d) {
  case TPORT_BOOL: v.re = u.u8 != 0; break;
  case TPORT_UINT8: v.re = u.u8; break;
  case TPORT_INT8: v.re = u.i8; break;
  case TPORT_INT16: v.re = u.i16; break;
  case TPORT_INT32: v.re = u.i32; break;
  case TPORT_INT64: v.re = (double)u.i64; break;
  case TPORT_FLOAT16: v.re = half_to_float(u.u16); break;
  case TPORT_BFLOAT16: {
    uint32_t bits = (uint32_t)u.u16 << 16;
    float f;
    memcpy(&f, &bits, 4);
    v.re = f;
    break;
  }
  case TPORT_FLOAT32: v.re = u.f[0]; break;
  case TPORT_FLOAT64: v.re = u.g[0]; break;
  case TPORT_COMPLEX64: v = (value){u.f[0], u.f[1]}; break;
  case TPORT_COMPLEX128: v = (value){u.g[0], u.g[1]}; break;
  default: break;
  }
  return v;
}

static void store(tport_dtype d, uint8_t *p, value v)
{
  int64_t i = (int64_t)v.re;
  float f[2] = {(float)v.re, (float)v.im};
  uint32_t bits;
  uint16_t h;
  switch (d) {
  case TPORT_BOOL: *p = v.re != 0 || v.im != 0; break;
  case TPORT_UINT8:
  case TPORT_INT8:
  case TPORT_INT16:
  case TPORT_INT32:
  case TPORT_INT64: memcpy(p, &i, tport_dtype_size(d)); break; /* little-endian: the low bytes */
  case TPORT_FLOAT16: h = float_to_half(f[0]), memcpy(p, &h, 2); break;
  case TPORT_BFLOAT16: memcpy(&bits, &f[0], 4), h = (uint16_t)(bits >> 16), memcpy(p, &h, 2); break;
  case TPORT_FLOAT32: memcpy(p, f, 4); break;
  case TPORT_FLOAT64: memcpy(p, &v.re, 8); break;
  case TPORT_COMPLEX64: memcpy(p, f, 8); break;
  case TPORT_COMPLEX128: memcpy(p, &v.re, 8), memcpy(p + 8, &v.im, 8); break;
  default: break;
  }
}

void convert(const uint8_t *src, tport_dtype s, uint8_t *dst, tport_dtype d, int64_t n)
{
  if (s == d) {
    memcpy(dst, src, (size_t)n * tport_dtype_size(d));
    return;
  }
  for (int64_t k = 0; k < n; k++)
    store(d, dst + k * (int64_t)tport_dtype_size(d),
          load(s, src + k * (int64_t)tport_dtype_size(s)));
}

void random_values(tport_dtype d, uint8_t *p, int64_t n, bool nan)
{
  size_t es = tport_dtype_size(d), bytes = (size_t)n * es;
  for (size_t k = 0; k < bytes; k += 8) {
    uint64_t r = rnd();
    memcpy(p + k, &r, bytes - k < 8 ? bytes - k : 8);
  }
  if (d == TPORT_BOOL)
    for (int64_t k = 0; k < n; k++)
      p[k] &= 1;
  if (nan)
    return;
  size_t parts = tport_dtype_is_complex(d) ? 2 : 1, w = es / parts;
  for (size_t k = 0; k < (size_t)n * parts; k++) {
    uint8_t *q = p + k * w;
    if (d == TPORT_FLOAT16) {
      uint16_t h;
      memcpy(&h, q, 2);
      if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
        h &= (uint16_t)~0x0400;
      memcpy(q, &h, 2);
    } else if (d == TPORT_BFLOAT16) {
      uint16_t h;
      memcpy(&h, q, 2);
      if ((h & 0x7f80) == 0x7f80 && (h & 0x7f))
        h &= (uint16_t)~0x0080;
      memcpy(q, &h, 2);
    } else if (w == 4 && d != TPORT_INT32) {
      uint32_t x;
      memcpy(&x, q, 4);
      if ((x & 0x7f800000u) == 0x7f800000u && (x & 0x7fffffu))
        x &= ~0x00800000u;
      memcpy(q, &x, 4);
    } else if (w == 8 && d != TPORT_INT64) {
      uint64_t x;
      memcpy(&x, q, 8);
      if ((x & 0x7ff0000000000000ull) == 0x7ff0000000000000ull && (x & 0xfffffffffffffull))
        x &= ~0x0010000000000000ull;
      memcpy(q, &x, 8);
    }
  }
}

uint64_t fnv1a(const uint8_t *p, size_t n)
{
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; i++)
    h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}
