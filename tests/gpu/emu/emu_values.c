/* emu_values.c: the values the emulation suite converts (see emu_check.h). */
#include <string.h>

#include "emu_check.h"

const char *const emu_dtype_name[TPORT_NUM_DTYPES] = {
    "bool",    "uint8",    "int8",    "int16",   "int32",     "int64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128"};

/* The tables keep one row per idea, a comment for each. */
/* clang-format off */

/* Integers: each width's bounds and one past them (truncated to the width,
 * they become the other end), and the powers of two where float16, float32
 * and float64 start to round. */
static const int64_t ints[] = {
    0, 1, -1, 2, 127, 128, -128, -129, 255, 256,
    32767, 32768, -32768, -32769, 65535, 65536,
    2049,                   /* float16 rounds it to even (2048) */
    65519, 65520,           /* float16: 65504, inf */
    16777217,               /* 2^24 + 1: float32 rounds */
    2147483647, 2147483648LL, -2147483647LL - 1, -2147483649LL, 4294967295LL, 4294967296LL,
    9007199254740993LL,     /* 2^53 + 1: float64 rounds */
    9223372036854775807LL, -9223372036854775807LL - 1, -9223372036854775807LL,
    0x7FFFFFBFFFFFFFFFLL, 0x0123456789ABCDEFLL,
};

/* float32 bit patterns */
static const uint32_t f32s[] = {
    0x00000000, 0x80000000, 0x3F800000, 0xBF800000, /* +-0, +-1 */
    0x3F000000, 0xBF000000, 0x3FC00000, 0x40200000, /* .5 -.5 1.5 2.5 */
    0xC0200000, 0x3DCCCCCD, 0xBE99999A, 0x3EFFFFFF, /* -2.5 .1 -.3, just below .5 */
    0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, /* subnormals, the least normal */
    0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, /* max, -max, +-inf */
    0x7FC00000, 0xFFC00000, 0x7FC00001, 0xFFC12345, /* NaNs, with payloads */
    0x7F800001, 0x7FA00000,                         /* signalling NaNs */
    0x42FF0000, 0x43000000, 0x437F8000, 0x43800000, /* 127.5 128 255.5 256 */
    0xC3008000, 0xC3010000, 0x46FFFE00, 0x47000000, /* -128.5 -129 32767 32768 */
    0xC7000100, 0x477FFF00, 0x47800000,             /* -32769 65535 65536 */
    0x4EFFFFFF, 0x4F000000, 0xCF000000, 0xCF000001, /* around +-2^31 */
    0x4F800000, 0x5EFFFFFF, 0x5F000000, 0xDF000000, /* 2^32, around +-2^63 */
    0xDF000001, 0x5F800000, 0x7149F2CA, 0xF149F2CA, /* past -2^63, 2^64, +-1e30 */
    0x477FE000, 0x477FEFFF, 0x477FF000,             /* float16 max, below and at its tie to inf */
    0x33800000, 0x33000000, 0x33400000,             /* float16: 2^-24, 2^-25 (tie), 1.5 * 2^-25 */
    0x38800000,                                     /* float16's least normal */
    0x3F801000, 0x3F802000, 0x3F803000,             /* 1 + 2^-11 (a float16 tie), 1 + 2^-10, ... */
    0x3F808000, 0x3F818000, 0x3F80C000,             /* bfloat16: ties from even and odd, above */
};

/* float64 bit patterns */
static const uint64_t f64s[] = {
    0x0000000000000000, 0x8000000000000000, 0x3FF0000000000000, 0xBFF0000000000000,
    0x3FE0000000000000, 0x3FF8000000000000, 0x4004000000000000, 0xC004000000000000,
    0x3FB999999999999A, 0xBFD3333333333333, 0x3FDFFFFFFFFFFFFF, /* .1 -.3, just below .5 */
    0x0000000000000001, 0x800FFFFFFFFFFFFF, 0x0010000000000000, /* subnormals, the least normal */
    0x7FEFFFFFFFFFFFFF, 0xFFEFFFFFFFFFFFFF, 0x7FF0000000000000, 0xFFF0000000000000,
    0x7FF8000000000000, 0xFFF8000000000000, 0x7FF800000000ABCD, 0xFFF8000000000123,
    0x7FF0000000000001, 0x7FF4000000000000,                     /* signalling NaNs */
    0x405FE00000000000, 0x4060000000000000, 0x406FF00000000000, 0x4070000000000000,
    0xC060100000000000, 0xC060200000000000, 0x40DFFFC000000000, 0x40E0000000000000,
    0xC0E0002000000000, 0x40EFFFE000000000, 0x40F0000000000000,
    0x41DFFFFFFFE00000,     /* 2^31 - 0.5 */
    0x41E0000000000000,     /* 2^31 */
    0xC1E0000000100000,     /* -2^31 - 0.5: still int32 (truncates to INT32_MIN) */
    0xC1E00000001FFFFF,     /* just above -2^31 - 1 */
    0xC1E0000000200000,     /* -2^31 - 1: out of int32 */
    0x41F0000000000000, 0x43DFFFFFFFFFFFFF, 0x43E0000000000000, 0xC3E0000000000000,
    0xC3E0000000000001,     /* past -2^63 */
    0x43F0000000000000,     /* 2^64 */
    0x4340000000000001,     /* 2^53 + 2 */
    0x47EFFFFFE0000000,     /* float32 max */
    0x47EFFFFFF0000000,     /* halfway past float32 max: rounds to inf */
    0x36A0000000000000,     /* float32's least subnormal */
    0x3690000000000000,     /* half of it: rounds to 0 (even) */
    0x3698000000000000,     /* three quarters of it: rounds up */
    0x37E0000000000000,     /* 2^-129: a float32 subnormal */
    0x3FF0000010000000,     /* 1 + 2^-24: a float32 tie */
    0x3FF0000030000000,     /* 1 + 3 * 2^-24: a float32 tie, from odd */
    0x3FF0010000000000,     /* 1 + 2^-12: float16 rounds it through float32 */
    0x3FF0020000000001,     /* just above float16's tie at 1 + 2^-11 */
    0x7E37E43C8800759C, 0xFE37E43C8800759C, /* +-1e300 */
};

/* clang-format on */

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* splitmix64: a different, reproducible stream for every (seed, position) */
static uint64_t mix(uint64_t x)
{
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* float32 -> float16 / bfloat16 bits by truncation: the specials above keep
 * their meaning (inf, NaN payload bits in the top of the mantissa, signs). */
static uint16_t f16_of(uint32_t f)
{
  uint32_t sign = (f >> 16) & 0x8000u, exp = (f >> 23) & 0xFF, man = f & 0x7FFFFFu;
  if (exp == 0xFF)
    return (uint16_t)(sign | 0x7C00u | (man >> 13) | (man && !(man >> 13) ? 1u : 0u));
  int e = (int)exp - 127 + 15;
  if (e >= 31)
    return (uint16_t)(sign | 0x7BFFu);
  if (e <= 0)
    return (uint16_t)(sign | (e < -10 ? 1u : (0x400u | man >> 13) >> (1 - e)));
  return (uint16_t)(sign | (uint32_t)e << 10 | man >> 13);
}

/* A value of class c (0..7) for position i. */
static void value(char *p, tport_dtype dt, uint64_t r, size_t i, int c)
{
  const int64_t iv = ints[(r >> 8) % COUNT(ints)];
  const uint32_t fv = f32s[(r >> 8) % COUNT(f32s)];
  const uint64_t dv = f64s[(r >> 8) % COUNT(f64s)];
  /* fractions: small multiples of 1/8 and thirds, for truncation toward zero */
  const double frac = (double)((int64_t)((r >> 16) % 601) - 300) / ((r >> 40) & 1 ? 8.0 : 3.0);
  const bool special = c < 3, bits = c == 3 || c == 4;
  switch (dt) {
  case TPORT_BOOL: *(uint8_t *)p = (uint8_t)(bits ? r >> 24 : (r >> 24) & 1); break;
  case TPORT_UINT8:
  case TPORT_INT8:
  case TPORT_INT16:
  case TPORT_INT32:
  case TPORT_INT64: {
    int64_t v = special ? iv : bits ? (int64_t)r : (int64_t)((r >> 16) % 601) - 300;
    memcpy(p, &v, tport_dtype_size(dt)); /* little endian: the low bytes */
    break;
  }
  case TPORT_FLOAT16: {
    float f = (float)frac;
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t h = special ? f16_of(fv) : bits ? (uint16_t)r : f16_of(u);
    if (special && (r >> 50) % 8 == 0) /* float16's own NaN payloads and boundaries */
      h = (uint16_t[]){0x7E01, 0xFD55, 0x7C01, 0x03FF, 0x8001, 0x7BFF, 0x5BF8, 0xD808}[i % 8];
    memcpy(p, &h, 2);
    break;
  }
  case TPORT_BFLOAT16: {
    float f = (float)frac;
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t b = (uint16_t)((special ? fv : bits ? (uint32_t)r : u) >> 16);
    if (special && (r >> 50) % 8 == 0)
      b = (uint16_t[]){0x7FC1, 0xFF81, 0x7F81, 0x0001, 0x807F, 0x4F00, 0xDF00, 0x4380}[i % 8];
    memcpy(p, &b, 2);
    break;
  }
  case TPORT_FLOAT32: {
    float f = (float)frac;
    uint32_t u;
    memcpy(&u, &f, 4);
    u = special ? fv : bits ? (uint32_t)r : u;
    memcpy(p, &u, 4);
    break;
  }
  case TPORT_FLOAT64: {
    uint64_t u;
    memcpy(&u, &frac, 8);
    u = special ? dv : bits ? r : u;
    memcpy(p, &u, 8);
    break;
  }
  case TPORT_COMPLEX64: /* each part of its own class */
    value(p, TPORT_FLOAT32, r, i, c);
    value(p + 4, TPORT_FLOAT32, mix(r), i + 1, (int)(mix(r) % 8));
    break;
  case TPORT_COMPLEX128:
    value(p, TPORT_FLOAT64, r, i, c);
    value(p + 8, TPORT_FLOAT64, mix(r), i + 1, (int)(mix(r) % 8));
    break;
  default: break;
  }
}

void emu_fill(void *buf, size_t n, tport_dtype dt, uint64_t seed)
{
  const size_t es = tport_dtype_size(dt);
  for (size_t i = 0; i < n; i++) {
    uint64_t r = mix(seed * 0x100000001B3ull + i);
    /* classes 0-2 special, 3-4 random bits, 5-7 fractions */
    value((char *)buf + i * es, dt, r, i, (int)(r % 8));
  }
}
