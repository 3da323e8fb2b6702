/*
 * convert.c: element conversion for all 144 dtype pairs (SEMANTICS.md §3),
 * as c10::static_cast_with_inter_type does it:
 *
 *   - complex -> real keeps the real part;
 *   - -> bool is x != 0 (NaN is true); a complex value is true when either
 *     part is (real != 0 || imag != 0, so 0+1j is true), as in NumPy and
 *     PyTorch 2.x (PyTorch 1.13 read the real part alone);
 *   - -> float16/bfloat16 rounds to nearest even through float32 (as c10's
 *     constructors take a float: double and int64 round twice, like PyTorch);
 *   - real -> complex is (x, 0); integer narrowing wraps.
 *   - float -> integer truncates toward zero.  C leaves NaN and out-of-range
 *     values undefined; tensorport defines them as PyTorch on x86-64 computes
 *     them: for int8, int16 and int32 the value goes through int32, where NaN
 *     and anything outside int32's range become INT32_MIN (then wrap to the
 *     width: NaN -> 0 as int8); for int64 and uint8 (which PyTorch routes
 *     through int64), NaN and values outside int64's range become INT64_MIN
 *     (so NaN -> 0 as uint8, -1.0 -> 255).
 */
#include <complex.h>
#include <math.h>
#include <string.h>

#include "convert_simd.h"
#include "cpu_kernels.h"
#include "half.h"

typedef float _Complex c64_t;
typedef double _Complex c128_t;

/* float -> integer, defined everywhere (see the top of the file). */
static inline int64_t f_to_i32ish(double x)
{
  if (!(x > -2147483649.0 && x < 2147483648.0))
    return INT32_MIN;
  return (int64_t)x;
}

static inline int64_t f_to_i64ish(double x)
{
  if (!(x >= -9223372036854775808.0 && x < 9223372036854775808.0))
    return INT64_MIN;
  return (int64_t)x;
}

/* Loads give a value of one of five C types: int64_t, float, double, c64_t,
 * c128_t.  A source may be unaligned (a put converts straight from the
 * received message, whose payload starts wherever the frame's header ends):
 * loads go through memcpy, which compiles to the same plain (and
 * vectorizable) moves on x86-64 without the undefined behaviour. */
#define DEF_LD(NAME, T)                                                                              static inline T ld_##NAME(const char *p)                                                           {                                                                                                    T v;                                                                                               memcpy(&v, p, sizeof v);                                                                           return v;                                                                                        }
DEF_LD(i16, int16_t)
DEF_LD(i32, int32_t)
DEF_LD(i64, int64_t)
DEF_LD(u16, uint16_t)
DEF_LD(f32, float)
DEF_LD(f64, double)
DEF_LD(c64, c64_t)
DEF_LD(c128, c128_t)
#define LD_BOOL(p) ((int64_t)(*(const uint8_t *)(p) != 0))
#define LD_UINT8(p) ((int64_t) * (const uint8_t *)(p))
#define LD_INT8(p) ((int64_t) * (const int8_t *)(p))
#define LD_INT16(p) ((int64_t)ld_i16(p))
#define LD_INT32(p) ((int64_t)ld_i32(p))
#define LD_INT64(p) ld_i64(p)
#define LD_FLOAT16(p) f16_to_f32(ld_u16(p))
#define LD_BFLOAT16(p) bf16_to_f32(ld_u16(p))
#define LD_FLOAT32(p) ld_f32(p)
#define LD_FLOAT64(p) ld_f64(p)
#define LD_COMPLEX64(p) ld_c64(p)
#define LD_COMPLEX128(p) ld_c128(p)

/* The real part of a complex value; any other value unchanged. */
#define REAL(x)                                                                                    \
  _Generic((x), c64_t : crealf((c64_t)(x)), c128_t : creal((c128_t)(x)), default : (x))

/* Integer targets.  An int64 source wraps; a floating one is defined above. */
#define TO_I32ISH(x)                                                                               \
  _Generic((x), int64_t : (x), float : f_to_i32ish((double)(x)), double : f_to_i32ish((double)(x)))
#define TO_I64ISH(x)                                                                               \
  _Generic((x), int64_t : (x), float : f_to_i64ish((double)(x)), double : f_to_i64ish((double)(x)))

/* Nonzero-ness, for -> bool: a complex value by both parts. */
#define NONZERO(x)                                                                                 \
  _Generic((x), c64_t                                                                              \
           : (crealf((c64_t)(x)) != 0 || cimagf((c64_t)(x)) != 0), c128_t                          \
           : (creal((c128_t)(x)) != 0 || cimag((c128_t)(x)) != 0), default                         \
           : ((x) != 0))

/* Stores likewise through memcpy: a destination may be unaligned too (a
 * get into a region's slice at the client's offset). */
#define ST_AS(T, p, v)                                                                             \
  do {                                                                                             \
    T st_v_ = (v);                                                                                 \
    memcpy((p), &st_v_, sizeof st_v_);                                                             \
  } while (0)
#define ST_BOOL(p, x) ST_AS(uint8_t, p, (uint8_t)NONZERO(x))
#define ST_UINT8(p, x) ST_AS(uint8_t, p, (uint8_t)(uint64_t)TO_I64ISH(REAL(x)))
#define ST_INT8(p, x) ST_AS(int8_t, p, (int8_t)TO_I32ISH(REAL(x)))
#define ST_INT16(p, x) ST_AS(int16_t, p, (int16_t)TO_I32ISH(REAL(x)))
#define ST_INT32(p, x) ST_AS(int32_t, p, (int32_t)TO_I32ISH(REAL(x)))
#define ST_INT64(p, x) ST_AS(int64_t, p, TO_I64ISH(REAL(x)))
#define ST_FLOAT16(p, x) ST_AS(uint16_t, p, f16_from_f32((float)REAL(x)))
#define ST_BFLOAT16(p, x) ST_AS(uint16_t, p, bf16_from_f32((float)REAL(x)))
#define ST_FLOAT32(p, x) ST_AS(float, p, (float)REAL(x))
#define ST_FLOAT64(p, x) ST_AS(double, p, (double)REAL(x))
#define ST_COMPLEX64(p, x)                                                                         \
  ST_AS(c64_t, p,                                                                                  \
        _Generic((x), c64_t : (x), c128_t : (c64_t)(x), default : CMPLXF((float)(x), 0.0f)))
#define ST_COMPLEX128(p, x)                                                                        \
  ST_AS(c128_t, p,                                                                                 \
        _Generic((x), c64_t : (c128_t)(x), c128_t : (x), default : CMPLX((double)(x), 0.0)))

#define SZ_BOOL 1
#define SZ_UINT8 1
#define SZ_INT8 1
#define SZ_INT16 2
#define SZ_INT32 4
#define SZ_INT64 8
#define SZ_FLOAT16 2
#define SZ_BFLOAT16 2
#define SZ_FLOAT32 4
#define SZ_FLOAT64 8
#define SZ_COMPLEX64 8
#define SZ_COMPLEX128 16

/* One loop per pair.  The dense case gets its own loop so the compiler can
 * vectorize it; the strided one serves every other plan.  dst may be src
 * exactly (in-place conj/neg fix-ups), so the pointers are not restrict. */
#define DEF_CAST(D, S)                                                                             \
  static void cast_##S##_to_##D(char *dst, const char *src, int64_t n, int64_t ds, int64_t ss)     \
  {                                                                                                \
    if (ds == SZ_##D && ss == SZ_##S) {                                                            \
      for (int64_t i = 0; i < n; i++)                                                              \
        ST_##D(dst + i * SZ_##D, LD_##S(src + i * SZ_##S));                                        \
    } else {                                                                                       \
      for (int64_t i = 0; i < n; i++)                                                              \
        ST_##D(dst + i * ds, LD_##S(src + i * ss));                                                \
    }                                                                                              \
  }

#define FOR_SRC(X, D)                                                                              \
  X(D, BOOL)                                                                                       \
  X(D, UINT8)                                                                                      \
  X(D, INT8) X(D, INT16) X(D, INT32) X(D, INT64) X(D, FLOAT16) X(D, BFLOAT16) X(D, FLOAT32)        \
      X(D, FLOAT64) X(D, COMPLEX64) X(D, COMPLEX128)
#define FOR_DST(X)                                                                                 \
  X(BOOL)                                                                                          \
  X(UINT8)                                                                                         \
  X(INT8) X(INT16) X(INT32) X(INT64) X(FLOAT16) X(BFLOAT16) X(FLOAT32) X(FLOAT64) X(COMPLEX64)     \
      X(COMPLEX128)

#define DEF_ROW(D) FOR_SRC(DEF_CAST, D)
FOR_DST(DEF_ROW)

/* Same dtype: a bit copy, as in PyTorch (NaN payloads and bool bytes kept). */
#define DEF_RAW(NAME, T)                                                                           \
  static void raw_##NAME(char *dst, const char *src, int64_t n, int64_t ds, int64_t ss)            \
  {                                                                                                \
    if (ds == (int64_t)sizeof(T) && ss == (int64_t)sizeof(T)) {                                    \
      memmove(dst, src, (size_t)n * sizeof(T));                                                    \
      return;                                                                                      \
    }                                                                                              \
    for (int64_t i = 0; i < n; i++)                                                                \
      memcpy(dst + i * ds, src + i * ss, sizeof(T));                                               \
  }
typedef struct {
  uint64_t lo, hi;
} u128_t;
DEF_RAW(1, uint8_t)
DEF_RAW(2, uint16_t)
DEF_RAW(4, uint32_t)
DEF_RAW(8, uint64_t)
DEF_RAW(16, u128_t)

static cast_loop_fn raw_loop(size_t size)
{
  switch (size) {
  case 1: return raw_1;
  case 2: return raw_2;
  case 4: return raw_4;
  case 8: return raw_8;
  default: return raw_16;
  }
}

#define ENTRY(D, S) cast_##S##_to_##D,
#define ROW(D) {FOR_SRC(ENTRY, D)},
static const cast_loop_fn cast_table[TPORT_NUM_DTYPES][TPORT_NUM_DTYPES] = {FOR_DST(ROW)};

/* The four float32 <-> float16/bfloat16 pairs and uint8 -> float32 try the
 * vector loop on dense runs. */
#define DEF_SIMD_PAIR(D, S)                                                                        \
  static void simd_##S##_to_##D(char *dst, const char *src, int64_t n, int64_t ds, int64_t ss)     \
  {                                                                                                \
    if (ds == SZ_##D && ss == SZ_##S && simd_cast_dense(TPORT_##D, TPORT_##S, dst, src, n))        \
      return;                                                                                      \
    cast_##S##_to_##D(dst, src, n, ds, ss);                                                        \
  }
DEF_SIMD_PAIR(FLOAT16, FLOAT32)
DEF_SIMD_PAIR(FLOAT32, FLOAT16)
DEF_SIMD_PAIR(BFLOAT16, FLOAT32)
DEF_SIMD_PAIR(FLOAT32, BFLOAT16)
DEF_SIMD_PAIR(FLOAT32, UINT8)

cast_loop_fn cpu_cast_loop(tport_dtype dst, tport_dtype src)
{
  if ((unsigned)dst >= TPORT_NUM_DTYPES || (unsigned)src >= TPORT_NUM_DTYPES)
    return NULL;
  if (dst == src)
    return raw_loop(tport_dtype_size(dst));
  if (dst == TPORT_FLOAT16 && src == TPORT_FLOAT32)
    return simd_FLOAT32_to_FLOAT16;
  if (dst == TPORT_FLOAT32 && src == TPORT_FLOAT16)
    return simd_FLOAT16_to_FLOAT32;
  if (dst == TPORT_BFLOAT16 && src == TPORT_FLOAT32)
    return simd_FLOAT32_to_BFLOAT16;
  if (dst == TPORT_FLOAT32 && src == TPORT_BFLOAT16)
    return simd_BFLOAT16_to_FLOAT32;
  if (dst == TPORT_FLOAT32 && src == TPORT_UINT8)
    return simd_UINT8_to_FLOAT32;
  return cast_table[dst][src];
}

/* ---- negation and conjugation, in place, in the destination dtype (an
 * element moved out and back through memcpy: it may be unaligned). */
#define DEF_INPLACE(NAME, T, OP)                                                                   \
  static void NAME(char *p, int64_t n, int64_t s)                                                  \
  {                                                                                                \
    for (int64_t i = 0; i < n; i++) {                                                              \
      T e;                                                                                         \
      memcpy(&e, p + i * s, sizeof e);                                                             \
      e = OP;                                                                                      \
      memcpy(p + i * s, &e, sizeof e);                                                             \
    }                                                                                              \
  }
DEF_INPLACE(neg_u8, uint8_t, (uint8_t)(-e))
DEF_INPLACE(neg_i8, int8_t, (int8_t)(-e))
DEF_INPLACE(neg_i16, int16_t, (int16_t)(-e))
DEF_INPLACE(neg_f32, float, -e)
DEF_INPLACE(neg_f64, double, -e)
DEF_INPLACE(neg_c64, c64_t, -e)
DEF_INPLACE(neg_c128, c128_t, -e)
/* int32/int64 negation wraps like PyTorch's (INT_MIN stays INT_MIN) without UB. */
DEF_INPLACE(neg_i32, int32_t, (int32_t)(0u - (uint32_t)e))
DEF_INPLACE(neg_i64, int64_t, (int64_t)(0u - (uint64_t)e))
/* float16/bfloat16: negation flips the sign bit (exact, NaN included). */
DEF_INPLACE(neg_half, uint16_t, (uint16_t)(e ^ 0x8000u))
DEF_INPLACE(conj_c64, c64_t, conjf(e))
DEF_INPLACE(conj_c128, c128_t, conj(e))

unary_loop_fn cpu_neg_loop(tport_dtype dt)
{
  switch (dt) {
  case TPORT_BOOL: return NULL; /* PyTorch refuses to negate bool */
  case TPORT_UINT8: return neg_u8;
  case TPORT_INT8: return neg_i8;
  case TPORT_INT16: return neg_i16;
  case TPORT_INT32: return neg_i32;
  case TPORT_INT64: return neg_i64;
  case TPORT_FLOAT16:
  case TPORT_BFLOAT16: return neg_half;
  case TPORT_FLOAT32: return neg_f32;
  case TPORT_FLOAT64: return neg_f64;
  case TPORT_COMPLEX64: return neg_c64;
  case TPORT_COMPLEX128: return neg_c128;
  case TPORT_NUM_DTYPES: break;
  }
  return NULL;
}

unary_loop_fn cpu_conj_loop(tport_dtype dt)
{
  if (dt == TPORT_COMPLEX64)
    return conj_c64;
  if (dt == TPORT_COMPLEX128)
    return conj_c128;
  return NULL;
}
