/* test_convert.c: element conversion for all 144 pairs against an
 * independent reference, float16/bfloat16 exhaustively, the values PyTorch
 * 1.13 gives on x86-64 for NaN and out-of-range float -> integer, and
 * complex -> bool as PyTorch 2.x gives it. */
#include <complex.h>
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"
#include "half.h"

/* ---- reference float16/bfloat16 rounding, written from the IEEE definition */
static uint16_t ref_f16(float f)
{
  uint32_t u;
  memcpy(&u, &f, 4);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  if (isnan(f))
    return sign | 0x7E00u;
  double a = fabs((double)f);
  if (a >= 65520.0)
    return sign | 0x7C00u;
  if (a < ldexp(1.0, -14)) {
    double q = nearbyint(a / ldexp(1.0, -24));
    return sign | (uint16_t)q;
  }
  int ex;
  frexp(a, &ex);
  int e = ex - 1;
  double q = nearbyint(a / ldexp(1.0, e - 10));
  if (q == 2048.0) {
    q = 1024.0;
    e++;
  }
  if (e + 15 >= 31)
    return sign | 0x7C00u;
  return sign | (uint16_t)((e + 15) << 10) | (uint16_t)(q - 1024.0);
}

static float ref_f16_to_f32(uint16_t h)
{
  int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 0)
    v = ldexp(m, -24);
  else if (e == 31)
    v = m ? NAN : INFINITY;
  else
    v = ldexp(1024 + m, e - 25);
  return (float)(s ? -v : v);
}

static uint16_t ref_bf16(float f)
{
  if (isnan(f))
    return 0x7FC0;
  uint32_t u;
  memcpy(&u, &f, 4);
  uint32_t hi = u >> 16, lo = u & 0xFFFFu;
  if (lo > 0x8000u || (lo == 0x8000u && (hi & 1u)))
    hi++;
  return (uint16_t)hi;
}

Test(convert, float16_exhaustive_to_f32)
{
  for (uint32_t h = 0; h < 65536; h++) {
    float a = f16_to_f32((uint16_t)h), b = ref_f16_to_f32((uint16_t)h);
    if (isnan(b))
      cr_assert(isnan(a), "0x%04x", h);
    else
      cr_assert(memcmp(&a, &b, 4) == 0, "0x%04x: %g vs %g", h, a, b);
  }
}

Test(convert, float16_rounding)
{
  /* every float16, the midpoints between neighbours (ties to even), and a
   * sweep of float32 bit patterns */
  for (uint32_t h = 0; h < 0x7C00; h++) {
    float v = f16_to_f32((uint16_t)h), next = f16_to_f32((uint16_t)(h + 1));
    float mid = (float)(((double)v + (double)next) / 2);
    cr_assert_eq(f16_from_f32(v), ref_f16(v));
    cr_assert_eq(f16_from_f32(mid), ref_f16(mid), "mid after 0x%04x", h);
    cr_assert_eq(f16_from_f32(-mid), ref_f16(-mid));
  }
  for (uint64_t u = 0; u < (1ull << 32); u += 4099) {
    float f;
    uint32_t b = (uint32_t)u;
    memcpy(&f, &b, 4);
    cr_assert_eq(f16_from_f32(f), ref_f16(f), "bits 0x%08x", b);
    cr_assert_eq(bf16_from_f32(f), ref_bf16(f), "bits 0x%08x", b);
  }
}

Test(convert, bfloat16_round_trip)
{
  for (uint32_t h = 0; h < 65536; h++) {
    float f = bf16_to_f32((uint16_t)h);
    if (!isnan(f))
      cr_assert_eq(bf16_from_f32(f), h);
  }
}

/* ---- the documented x86-64 results PyTorch 1.13 gives */
static void cast1(tport_dtype d, tport_dtype s, void *dst, const void *src)
{
  cpu_cast_loop(d, s)(dst, src, 1, 0, 0);
}

Test(convert, float_to_integer_edges_match_pytorch)
{
  const float in[] = {200.7f, -1.0f, -129.5f, 3e9f, NAN, INFINITY};
  const int8_t want_i8[] = {-56, -1, 127, 0, 0, 0};
  const uint8_t want_u8[] = {200, 255, 127, 0, 0, 0};
  const int32_t want_i32[] = {200, -1, -129, INT32_MIN, INT32_MIN, INT32_MIN};
  for (int i = 0; i < 6; i++) {
    int8_t i8;
    uint8_t u8;
    int32_t i32;
    cast1(TPORT_INT8, TPORT_FLOAT32, &i8, &in[i]);
    cast1(TPORT_UINT8, TPORT_FLOAT32, &u8, &in[i]);
    cast1(TPORT_INT32, TPORT_FLOAT32, &i32, &in[i]);
    cr_assert_eq(i8, want_i8[i], "int8(%g)", in[i]);
    cr_assert_eq(u8, want_u8[i], "uint8(%g)", in[i]);
    cr_assert_eq(i32, want_i32[i], "int32(%g)", in[i]);
  }
  const double big[] = {3e19, NAN, INFINITY, -2.5};
  const int64_t want_i64[] = {INT64_MIN, INT64_MIN, INT64_MIN, -2};
  for (int i = 0; i < 4; i++) {
    int64_t v;
    cast1(TPORT_INT64, TPORT_FLOAT64, &v, &big[i]);
    cr_assert_eq(v, want_i64[i]);
  }
}

/* complex -> bool: true when either part is nonzero, NaN included (PyTorch
 * 2.x and NumPy; PyTorch 1.13 read the real part alone, so 0+1j was false). */
Test(convert, complex_to_bool_looks_at_both_parts)
{
  const float complex c[] = {
      CMPLXF(0, 1),         CMPLXF(0, 0),   CMPLXF(1, 0),   CMPLXF(-0.0f, 0),  CMPLXF(0, -2),
      CMPLXF(-0.0f, -0.0f), CMPLXF(NAN, 0), CMPLXF(0, NAN), CMPLXF(0, 1e-45f), CMPLXF(0, INFINITY)};
  const uint8_t want[] = {1, 0, 1, 0, 1, 0, 1, 1, 1, 1};
  const size_t n = sizeof c / sizeof c[0];
  for (size_t i = 0; i < n; i++) {
    uint8_t b = 7;
    cast1(TPORT_BOOL, TPORT_COMPLEX64, &b, &c[i]);
    cr_assert_eq(b, want[i], "complex64 (%g, %g) -> bool: %u, want %u", crealf(c[i]), cimagf(c[i]),
                 b, want[i]);
    const double complex z = CMPLX(crealf(c[i]), cimagf(c[i]));
    cast1(TPORT_BOOL, TPORT_COMPLEX128, &b, &z);
    cr_assert_eq(b, want[i], "complex128 (%g, %g) -> bool: %u, want %u", creal(z), cimag(z), b,
                 want[i]);
  }
  /* the dense loop (and whatever vectorizes it) and the strided one */
  uint8_t got[10];
  memset(got, 7, sizeof got);
  cpu_cast_loop(TPORT_BOOL, TPORT_COMPLEX64)((char *)got, (const char *)c, (int64_t)n, 1,
                                             sizeof c[0]);
  cr_assert(memcmp(got, want, n) == 0, "dense complex64 -> bool");
  memset(got, 7, sizeof got);
  cpu_cast_loop(TPORT_BOOL, TPORT_COMPLEX64)((char *)got, (const char *)c, (int64_t)n / 2, 2,
                                             2 * sizeof c[0]);
  for (size_t i = 0; i < n / 2; i++)
    cr_assert_eq(got[2 * i], want[2 * i], "strided complex64 -> bool, element %zu", 2 * i);
}

Test(convert, complex_and_bool_and_half_edges_match_pytorch)
{
  const float f[] = {1e30f, 65520.0f, 65519.0f, 1.0000001f};
  const uint16_t want_h[] = {0x7C00, 0x7C00, 0x7BFF, 0x3C00};
  for (int i = 0; i < 4; i++) {
    uint16_t h;
    cast1(TPORT_FLOAT16, TPORT_FLOAT32, &h, &f[i]);
    cr_assert_eq(h, want_h[i]);
  }
  double d = 0.1;
  uint16_t bf;
  cast1(TPORT_BFLOAT16, TPORT_FLOAT64, &bf, &d);
  cr_assert_eq(bf, 15821);
  float nanv = NAN;
  uint8_t b;
  cast1(TPORT_BOOL, TPORT_FLOAT32, &b, &nanv);
  cr_assert_eq(b, 1, "NaN is true");
  double r = 7.5;
  double complex z;
  cast1(TPORT_COMPLEX128, TPORT_FLOAT64, &z, &r);
  cr_assert(creal(z) == 7.5 && cimag(z) == 0.0);
}

/* ---- all 144 pairs against a reference through long double */
typedef struct {
  long double re, im;
  bool floating;
} refval;

static refval load_ref(tport_dtype t, const void *p)
{
  refval v = {0, 0, false};
  switch (t) {
  case TPORT_BOOL: v.re = *(const uint8_t *)p != 0; break;
  case TPORT_UINT8: v.re = *(const uint8_t *)p; break;
  case TPORT_INT8: v.re = *(const int8_t *)p; break;
  case TPORT_INT16: v.re = *(const int16_t *)p; break;
  case TPORT_INT32: v.re = *(const int32_t *)p; break;
  case TPORT_INT64: v.re = *(const int64_t *)p; break;
  case TPORT_FLOAT16:
    v.re = ref_f16_to_f32(*(const uint16_t *)p);
    v.floating = true;
    break;
  case TPORT_BFLOAT16: {
    uint32_t u = (uint32_t) * (const uint16_t *)p << 16;
    float f;
    memcpy(&f, &u, 4);
    v.re = f;
    v.floating = true;
    break;
  }
  case TPORT_FLOAT32:
    v.re = *(const float *)p;
    v.floating = true;
    break;
  case TPORT_FLOAT64:
    v.re = *(const double *)p;
    v.floating = true;
    break;
  case TPORT_COMPLEX64:
    v.re = ((const float *)p)[0];
    v.im = ((const float *)p)[1];
    v.floating = true;
    break;
  case TPORT_COMPLEX128:
    v.re = ((const double *)p)[0];
    v.im = ((const double *)p)[1];
    v.floating = true;
    break;
  default: break;
  }
  return v;
}

static int64_t ref_int(refval v, bool via_int32)
{
  long double x = v.re;
  if (!v.floating)
    return (int64_t)x;
  if (isnan(x))
    return via_int32 ? INT32_MIN : INT64_MIN;
  long double t = truncl(x);
  if (via_int32)
    return (t >= -2147483648.0L && t <= 2147483647.0L) ? (int64_t)t : INT32_MIN;
  return (t >= -9223372036854775808.0L && t < 9223372036854775808.0L) ? (int64_t)t : INT64_MIN;
}

static void store_ref(tport_dtype t, void *p, refval v)
{
  /* floats: PyTorch converts int64 and double to float in one rounding */
  float f32 = (float)v.re;
  switch (t) {
  case TPORT_BOOL: *(uint8_t *)p = v.re != 0 || v.im != 0; break;
  case TPORT_UINT8: *(uint8_t *)p = (uint8_t)(uint64_t)ref_int(v, false); break;
  case TPORT_INT8: *(int8_t *)p = (int8_t)ref_int(v, true); break;
  case TPORT_INT16: *(int16_t *)p = (int16_t)ref_int(v, true); break;
  case TPORT_INT32: *(int32_t *)p = (int32_t)ref_int(v, true); break;
  case TPORT_INT64: *(int64_t *)p = ref_int(v, false); break;
  case TPORT_FLOAT16: *(uint16_t *)p = ref_f16(f32); break;
  case TPORT_BFLOAT16: *(uint16_t *)p = ref_bf16(f32); break;
  case TPORT_FLOAT32: *(float *)p = f32; break;
  case TPORT_FLOAT64: *(double *)p = (double)v.re; break;
  case TPORT_COMPLEX64:
    ((float *)p)[0] = f32;
    ((float *)p)[1] = (float)v.im;
    break;
  case TPORT_COMPLEX128:
    ((double *)p)[0] = (double)v.re;
    ((double *)p)[1] = (double)v.im;
    break;
  default: break;
  }
}

static bool same_value(tport_dtype t, const void *a, const void *b)
{
  if (memcmp(a, b, tport_dtype_size(t)) == 0)
    return true;
  /* NaN payloads may differ; NaN-ness may not, nor the sign of a zero. */
  refval x = load_ref(t, a), y = load_ref(t, b);
  bool re = (isnan(x.re) && isnan(y.re)) || (x.re == y.re && signbit(x.re) == signbit(y.re));
  bool im = (isnan(x.im) && isnan(y.im)) || (x.im == y.im && signbit(x.im) == signbit(y.im));
  return re && im;
}

Test(convert, all_144_pairs)
{
  const double seeds[] = {0.0,
                          -0.0,
                          1.0,
                          -1.0,
                          0.5,
                          2.5,
                          -2.5,
                          3.75,
                          127.9,
                          128.0,
                          255.0,
                          256.0,
                          -129.0,
                          32767.5,
                          65504.0,
                          65520.0,
                          1e10,
                          3e9,
                          -3e9,
                          1e20,
                          -1e20,
                          5e-8,
                          1e-40,
                          9.2233720368547758e18,
                          NAN,
                          INFINITY,
                          -INFINITY,
                          0.1,
                          1.0 / 3.0,
                          16777217.0,
                          4294967296.0 + 7};
  const int64_t iseeds[] = {0,
                            1,
                            -1,
                            127,
                            128,
                            255,
                            256,
                            -128,
                            -129,
                            32767,
                            32768,
                            -32769,
                            2147483647,
                            2147483648LL,
                            -2147483649LL,
                            INT64_MAX,
                            INT64_MIN,
                            16777217,
                            (1LL << 53) + 1,
                            1234567890123LL};
  for (int s = 0; s < TPORT_NUM_DTYPES; s++) {
    /* source values: each seed stored into dtype s by the reference */
    unsigned char src[64][16];
    int n = 0;
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
      refval v = {seeds[i], (i % 3 == 0) ? -seeds[i] / 2 : 0.25, true};
      store_ref((tport_dtype)s, src[n++], v);
    }
    for (size_t i = 0; i < sizeof iseeds / sizeof iseeds[0]; i++) {
      refval v = {(long double)iseeds[i], 0, false};
      store_ref((tport_dtype)s, src[n++], v);
    }
    for (int d = 0; d < TPORT_NUM_DTYPES; d++) {
      for (int i = 0; i < n; i++) {
        unsigned char got[16] = {0}, want[16] = {0};
        cast1((tport_dtype)d, (tport_dtype)s, got, src[i]);
        store_ref((tport_dtype)d, want, load_ref((tport_dtype)s, src[i]));
        cr_assert(same_value((tport_dtype)d, got, want), "pair %d <- %d, value %d", d, s, i);
      }
    }
  }
}

Test(convert, neg_and_conj)
{
  int32_t v[2] = {INT32_MIN, 5};
  cpu_neg_loop(TPORT_INT32)((char *)v, 2, 4);
  cr_assert(v[0] == INT32_MIN && v[1] == -5);
  uint16_t h = 0x3C00;
  cpu_neg_loop(TPORT_FLOAT16)((char *)&h, 1, 2);
  cr_assert_eq(h, 0xBC00);
  double complex z = CMPLX(1, 2);
  cpu_conj_loop(TPORT_COMPLEX128)((char *)&z, 1, 16);
  cr_assert(creal(z) == 1 && cimag(z) == -2);
  cr_assert_null(cpu_conj_loop(TPORT_FLOAT32));
  cr_assert_null(cpu_neg_loop(TPORT_BOOL));
}

/* The vector loops (dense runs of float32 <-> float16/bfloat16) must give the
 * scalar loops' bits, NaN payloads and ties included. */
Test(convert, vector_loops_match_scalar_bits)
{
  enum { N = 1 << 16 };
  static float f[N], back_v[N], back_s[N];
  static uint16_t h[N], hv[N], hs[N];
  for (uint32_t pass = 0; pass < 64; pass++) {
    for (int i = 0; i < N; i++) {
      uint32_t u = (uint32_t)i * 65537u * (pass * 2 + 1) + pass * 0x9E3779B9u;
      if (i % 7 == 0)
        u = 0x7F800000u | (u & 0x807FFFFFu); /* NaNs with payloads, and infinities */
      memcpy(&f[i], &u, 4);
      h[i] = (uint16_t)(i ^ (int)pass);
    }
    const tport_dtype half[2] = {TPORT_FLOAT16, TPORT_BFLOAT16};
    for (int k = 0; k < 2; k++) {
      cast_loop_fn to_h = cpu_cast_loop(half[k], TPORT_FLOAT32);
      cast_loop_fn to_f = cpu_cast_loop(TPORT_FLOAT32, half[k]);
      to_h((char *)hv, (const char *)f, N - 3, 2, 4); /* dense: the vector loop */
      for (int i = 0; i < N - 3; i++)
        to_h((char *)&hs[i], (const char *)&f[i], 1, 0, 0); /* strided: scalar */
      cr_assert(memcmp(hv, hs, (N - 3) * 2) == 0, "%s from float32, pass %u",
                k ? "bfloat16" : "float16", pass);
      to_f((char *)back_v, (const char *)h, N - 5, 4, 2);
      for (int i = 0; i < N - 5; i++)
        to_f((char *)&back_s[i], (const char *)&h[i], 1, 0, 0);
      cr_assert(memcmp(back_v, back_s, (N - 5) * 4) == 0, "float32 from %s, pass %u",
                k ? "bfloat16" : "float16", pass);
    }
  }
}

/* uint8 -> float32 has a vector loop too; and every dense loop takes an
 * unaligned source (a put converts straight from a message's payload): the
 * results must be the scalar loop's, bit for bit, at every misalignment. */
Test(convert, unaligned_and_u8_vector_loops_match_scalar_bits)
{
  enum { N = 4099 };
  static unsigned char src[N * 16 + 16], dv[N * 16], ds[N * 16];
  for (size_t i = 0; i < sizeof src; i++)
    src[i] = (unsigned char)(i * 131 + 7);
  for (int st = 0; st < 12; st++)
    for (int dt = 0; dt < 12; dt++) {
      cast_loop_fn f = cpu_cast_loop((tport_dtype)dt, (tport_dtype)st);
      size_t ss = tport_dtype_size(st), dsz = tport_dtype_size(dt);
      for (size_t mis = 0; mis < 3; mis++) {
        const unsigned char *s = src + mis;
        f((char *)dv, (const char *)s, N, (int64_t)dsz, (int64_t)ss); /* dense */
        for (int i = 0; i < N; i++)
          f((char *)ds + i * dsz, (const char *)s + i * ss, 1, 0, 0);
        cr_assert(memcmp(dv, ds, N * dsz) == 0, "%d -> %d, source off by %zu", st, dt, mis);
      }
    }
}

/* A long uint8 -> float32 run (a converting put's chunk) is written with
 * non-temporal stores from the first 32-byte boundary on: the same bits as
 * the scalar loop, whatever the destination's alignment and the length's
 * remainder, and nothing written past the end. */
Test(convert, long_u8_to_f32_runs_match_scalar_bits)
{
  enum { N = (1 << 20) + 13 };
  static unsigned char src[N + 8];
  static float dv[N + 16], ds[N + 16];
  for (size_t i = 0; i < sizeof src; i++)
    src[i] = (unsigned char)(i * 167 + 3);
  cast_loop_fn f = cpu_cast_loop(TPORT_FLOAT32, TPORT_UINT8);
  for (int off = 0; off < 8; off++) {
    int n = N - off;
    memset(dv, 0xAB, sizeof dv);
    memset(ds, 0xAB, sizeof ds);
    f((char *)(dv + off), (const char *)src + off, n, 4, 1); /* dense */
    for (int i = 0; i < n; i++)
      f((char *)(ds + off + i), (const char *)src + off + i, 1, 0, 0);
    cr_assert(memcmp(dv, ds, sizeof dv) == 0, "destination off by %d floats", off);
  }
}
