// copy.cu: the strided copy kernel with a fused cast, compiled at run time by
// NVRTC (engine/cuda_jit.c) once per (dst dtype, src dtype, index width,
// compute capability).  It walks an iteration plan (kernels/plan.h: dim 0
// innermost, byte strides) and converts exactly as kernels/cpu/convert.c
// does, so that a device gives the host's bits: float -> integer goes
// through int32 (int8/int16/int32) or int64 (int64/uint8) with NaN and
// out-of-range values becoming INT32_MIN / INT64_MIN, as PyTorch computes
// them on x86-64; float16/bfloat16 round to nearest even through float32.
//
// Defined by the compiler's options: TPORT_DST, TPORT_SRC (tport_dtype
// numbers), TPORT_IDX (the index type: unsigned int or unsigned long long on
// the device; any unsigned type compiles, and the host emulation of
// tests/gpu/emu uses unsigned short to reach the narrow edge quickly).
// NVRTC runs with --fmad=false: a fused multiply-add would round once where
// kernels/cpu rounds twice (float16 rounding below), so the bits could differ.

typedef unsigned char u8;
typedef signed char i8;
typedef short i16;
typedef int i32;
typedef long long i64;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
struct c64 {
  float re, im;
};
struct c128 {
  double re, im;
};

#define TPORT_MAX_DIMS 16
#define FLAG_CONJ 1u
#define FLAG_NEG 2u

struct Params {
  long long shape[TPORT_MAX_DIMS];
  long long dst_stride[TPORT_MAX_DIMS]; // bytes
  long long src_stride[TPORT_MAX_DIMS]; // bytes
  long long numel;
  char *dst;
  const char *src;
  int ndim;
  unsigned flags;
};
// engine/cuda_jit.h declares the same layout (copy_params) and checks its
// field offsets too (NVRTC has no offsetof without headers).
static_assert(sizeof(Params) == 416, "struct Params must match copy_params of engine/cuda_jit.h");

// Index arithmetic.  engine/cuda_jit.c (cuda_jit_plan_launch) picks the
// narrow TPORT_IDX only when every value the loops below compute fits it:
// numel plus the threads of the grid (a grid-stride loop steps past the end
// once), and every byte offset reached.  C++ promotes an unsigned type
// narrower than int to signed int, whose overflow is undefined, so sums and
// products go through uarith (at least unsigned int) and are stored back into
// idx: whatever does not fit wraps exactly as the index type does.
typedef TPORT_IDX idx;
typedef decltype((idx)0 + 0u) uarith;
static_assert((idx)-1 > (idx)0, "TPORT_IDX must be an unsigned type");
__device__ inline idx iadd(idx a, idx b) { return (idx)((uarith)a + b); }
__device__ inline idx imul(idx a, idx b) { return (idx)((uarith)a * b); }

// ---- float16 / bfloat16, bit-exact with kernels/cpu/half.h
__device__ inline float f16_to_f32(u16 h)
{
  const u32 w = (u32)h << 16;
  const u32 sign = w & 0x80000000u;
  const u32 two_w = w + w;
  /* a NaN as the host gives it (its multiply quiets and keeps the payload;
   * a GPU's gives its canonical NaN): built from bits */
  if ((h & 0x7C00u) == 0x7C00u && (h & 0x03FFu))
    return __uint_as_float(sign | 0x7FC00000u | ((u32)(h & 0x03FFu) << 13));
  const float normalized = __uint_as_float((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float denormalized = __uint_as_float((two_w >> 17) | (126u << 23)) - 0.5f;
  return __uint_as_float(sign | (two_w < (1u << 27) ? __float_as_uint(denormalized)
                                                    : __float_as_uint(normalized)));
}

__device__ inline u16 f16_from_f32(float f)
{
#ifdef __CUDA_ARCH__
  /* on a device, the hardware's conversion: IEEE round to nearest even, as
   * the arithmetic below (ftz is off: NVRTC's default), 0.78 -> 0.97x a D2D
   * copy for a float32 -> float16 cast on an H200; a NaN as the host gives
   * it (the hardware's is canonical).  The host emulation of tests/gpu/emu
   * runs the arithmetic; test_cuda compares the device with the host bit
   * for bit. */
  if (f != f)
    return (u16)(((__float_as_uint(f) >> 16) & 0x8000u) | 0x7E00u);
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
#else
  float base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
  const u32 w = __float_as_uint(f);
  const u32 shl1_w = w + w;
  const u32 sign = w & 0x80000000u;
  u32 bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u)
    bias = 0x71000000u;
  base = __uint_as_float((bias >> 1) + 0x07800000u) + base;
  const u32 bits = __float_as_uint(base);
  const u32 nonsign = ((bits >> 13) & 0x00007C00u) + (bits & 0x00000FFFu);
  return (u16)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
#endif
}

__device__ inline float bf16_to_f32(u16 b) { return __uint_as_float((u32)b << 16); }

__device__ inline u16 bf16_from_f32(float f)
{
  if (f != f)
    return 0x7FC0;
  u32 u = __float_as_uint(f);
  return (u16)((u + (((u >> 16) & 1u) + 0x7FFFu)) >> 16);
}

// ---- float -> integer, defined everywhere (see the top of the file)
__device__ inline i64 f_to_i32ish(double x)
{
  return (x > -2147483649.0 && x < 2147483648.0) ? (i64)x : (i64)(-2147483647 - 1);
}
__device__ inline i64 f_to_i64ish(double x)
{
  return (x >= -9223372036854775808.0 && x < 9223372036854775808.0) ? (i64)x
                                                                     : (i64)(-9223372036854775807LL - 1);
}

// ---- float32 <-> float64 as the host converts them (x86-64: a NaN is
// quieted and keeps the top of its payload and its sign); a GPU's own
// conversions give its canonical NaN, so NaNs go through integers
__device__ inline float f64_to_f32(double x)
{
  if (x != x) {
    const u64 b = (u64)__double_as_longlong(x);
    return __uint_as_float(((u32)(b >> 32) & 0x80000000u) | 0x7FC00000u |
                           ((u32)(b >> 29) & 0x003FFFFFu));
  }
  return (float)x;
}
__device__ inline double f32_to_f64(float x)
{
  if (x != x) {
    const u32 b = __float_as_uint(x);
    return __longlong_as_double((long long)(((u64)(b & 0x80000000u) << 32) | 0x7FF8000000000000ull |
                                            ((u64)(b & 0x003FFFFFu) << 29)));
  }
  return (double)x;
}

// ---- the value categories a load gives: i64, float, double, c64, c128
__device__ inline i64 i32ish(i64 v) { return v; }
__device__ inline i64 i32ish(float v) { return f_to_i32ish((double)v); }
__device__ inline i64 i32ish(double v) { return f_to_i32ish(v); }
__device__ inline i64 i32ish(c64 v) { return f_to_i32ish((double)v.re); }
__device__ inline i64 i32ish(c128 v) { return f_to_i32ish(v.re); }
__device__ inline i64 i64ish(i64 v) { return v; }
__device__ inline i64 i64ish(float v) { return f_to_i64ish((double)v); }
__device__ inline i64 i64ish(double v) { return f_to_i64ish(v); }
__device__ inline i64 i64ish(c64 v) { return f_to_i64ish((double)v.re); }
__device__ inline i64 i64ish(c128 v) { return f_to_i64ish(v.re); }
__device__ inline float to_f32(i64 v) { return (float)v; }
__device__ inline float to_f32(float v) { return v; }
__device__ inline float to_f32(double v) { return f64_to_f32(v); }
__device__ inline float to_f32(c64 v) { return v.re; }
__device__ inline float to_f32(c128 v) { return f64_to_f32(v.re); }
__device__ inline double to_f64(i64 v) { return (double)v; }
__device__ inline double to_f64(float v) { return f32_to_f64(v); }
__device__ inline double to_f64(double v) { return v; }
__device__ inline double to_f64(c64 v) { return f32_to_f64(v.re); }
__device__ inline double to_f64(c128 v) { return v.re; }
// -> bool is x != 0 (NaN is true); a complex value is true when either part
// is (PyTorch 2.x and NumPy: 0+1j is true; PyTorch 1.13 read the real part alone)
__device__ inline bool nonzero(i64 v) { return v != 0; }
__device__ inline bool nonzero(float v) { return v != 0; }
__device__ inline bool nonzero(double v) { return v != 0; }
__device__ inline bool nonzero(c64 v) { return v.re != 0 || v.im != 0; }
__device__ inline bool nonzero(c128 v) { return v.re != 0 || v.im != 0; }
__device__ inline c64 to_c64(i64 v) { return c64{(float)v, 0.0f}; }
__device__ inline c64 to_c64(float v) { return c64{v, 0.0f}; }
__device__ inline c64 to_c64(double v) { return c64{f64_to_f32(v), 0.0f}; }
__device__ inline c64 to_c64(c64 v) { return v; }
__device__ inline c64 to_c64(c128 v) { return c64{f64_to_f32(v.re), f64_to_f32(v.im)}; }
__device__ inline c128 to_c128(i64 v) { return c128{(double)v, 0.0}; }
__device__ inline c128 to_c128(float v) { return c128{f32_to_f64(v), 0.0}; }
__device__ inline c128 to_c128(double v) { return c128{v, 0.0}; }
__device__ inline c128 to_c128(c64 v) { return c128{f32_to_f64(v.re), f32_to_f64(v.im)}; }
__device__ inline c128 to_c128(c128 v) { return v; }

// ---- load (by TPORT_SRC)
#if TPORT_SRC == 0
__device__ inline i64 load(const char *p) { return *(const u8 *)p != 0; }
#elif TPORT_SRC == 1
__device__ inline i64 load(const char *p) { return *(const u8 *)p; }
#elif TPORT_SRC == 2
__device__ inline i64 load(const char *p) { return *(const i8 *)p; }
#elif TPORT_SRC == 3
__device__ inline i64 load(const char *p) { return *(const i16 *)p; }
#elif TPORT_SRC == 4
__device__ inline i64 load(const char *p) { return *(const i32 *)p; }
#elif TPORT_SRC == 5
__device__ inline i64 load(const char *p) { return *(const i64 *)p; }
#elif TPORT_SRC == 6
__device__ inline float load(const char *p) { return f16_to_f32(*(const u16 *)p); }
#elif TPORT_SRC == 7
__device__ inline float load(const char *p) { return bf16_to_f32(*(const u16 *)p); }
#elif TPORT_SRC == 8
__device__ inline float load(const char *p) { return *(const float *)p; }
#elif TPORT_SRC == 9
__device__ inline double load(const char *p) { return *(const double *)p; }
#elif TPORT_SRC == 10
__device__ inline c64 load(const char *p) { return *(const c64 *)p; }
#elif TPORT_SRC == 11
__device__ inline c128 load(const char *p) { return *(const c128 *)p; }
#else
#error "TPORT_SRC is not a dtype"
#endif

// ---- store, negate, conjugate (by TPORT_DST)
#if TPORT_DST == 0
template <class V> __device__ inline void store(char *p, V v) { *(u8 *)p = nonzero(v); }
__device__ inline void negate(char *p) {}
#elif TPORT_DST == 1
template <class V> __device__ inline void store(char *p, V v) { *(u8 *)p = (u8)(u64)i64ish(v); }
__device__ inline void negate(char *p) { *(u8 *)p = (u8)(0u - *(u8 *)p); }
#elif TPORT_DST == 2
template <class V> __device__ inline void store(char *p, V v) { *(i8 *)p = (i8)i32ish(v); }
__device__ inline void negate(char *p) { *(i8 *)p = (i8)(0u - (u32)*(i8 *)p); }
#elif TPORT_DST == 3
template <class V> __device__ inline void store(char *p, V v) { *(i16 *)p = (i16)i32ish(v); }
__device__ inline void negate(char *p) { *(i16 *)p = (i16)(0u - (u32)*(i16 *)p); }
#elif TPORT_DST == 4
template <class V> __device__ inline void store(char *p, V v) { *(i32 *)p = (i32)i32ish(v); }
__device__ inline void negate(char *p) { *(i32 *)p = (i32)(0u - (u32)*(i32 *)p); }
#elif TPORT_DST == 5
template <class V> __device__ inline void store(char *p, V v) { *(i64 *)p = i64ish(v); }
__device__ inline void negate(char *p) { *(i64 *)p = (i64)(0ull - (u64)*(i64 *)p); }
#elif TPORT_DST == 6
template <class V> __device__ inline void store(char *p, V v) { *(u16 *)p = f16_from_f32(to_f32(v)); }
__device__ inline void negate(char *p) { *(u16 *)p ^= 0x8000u; }
#elif TPORT_DST == 7
template <class V> __device__ inline void store(char *p, V v) { *(u16 *)p = bf16_from_f32(to_f32(v)); }
__device__ inline void negate(char *p) { *(u16 *)p ^= 0x8000u; }
#elif TPORT_DST == 8
template <class V> __device__ inline void store(char *p, V v) { *(float *)p = to_f32(v); }
__device__ inline void negate(char *p) { *(u32 *)p ^= 0x80000000u; } // the sign bit, NaN too
#elif TPORT_DST == 9
template <class V> __device__ inline void store(char *p, V v) { *(double *)p = to_f64(v); }
__device__ inline void negate(char *p) { *(u64 *)p ^= 0x8000000000000000ull; }
#elif TPORT_DST == 10
template <class V> __device__ inline void store(char *p, V v) { *(c64 *)p = to_c64(v); }
__device__ inline void negate(char *p) { ((u32 *)p)[0] ^= 0x80000000u; ((u32 *)p)[1] ^= 0x80000000u; }
#define HAS_CONJ 1
__device__ inline void conjugate(char *p) { ((u32 *)p)[1] ^= 0x80000000u; }
#elif TPORT_DST == 11
template <class V> __device__ inline void store(char *p, V v) { *(c128 *)p = to_c128(v); }
__device__ inline void negate(char *p) { ((u64 *)p)[0] ^= 0x8000000000000000ull; ((u64 *)p)[1] ^= 0x8000000000000000ull; }
#define HAS_CONJ 1
__device__ inline void conjugate(char *p) { ((u64 *)p)[1] ^= 0x8000000000000000ull; }
#else
#error "TPORT_DST is not a dtype"
#endif

// the same dtype moves bits unchanged (NaN payloads, bool bytes), as PyTorch
#if TPORT_DST == TPORT_SRC
#define ES (TPORT_DST == 0 || TPORT_DST == 1 || TPORT_DST == 2 ? 1 : TPORT_DST == 3 || TPORT_DST == 6 || TPORT_DST == 7 ? 2 : TPORT_DST == 4 || TPORT_DST == 8 ? 4 : TPORT_DST == 11 ? 16 : 8)
__device__ inline void convert(char *d, const char *s)
{
#if ES == 1
  *(u8 *)d = *(const u8 *)s;
#elif ES == 2
  *(u16 *)d = *(const u16 *)s;
#elif ES == 4
  *(u32 *)d = *(const u32 *)s;
#elif ES == 8
  *(u64 *)d = *(const u64 *)s;
#else
  ((u64 *)d)[0] = ((const u64 *)s)[0];
  ((u64 *)d)[1] = ((const u64 *)s)[1];
#endif
}
#else
__device__ inline void convert(char *d, const char *s) { store(d, load(s)); }
#endif

// Element sizes by dtype number (tport_types.h).
#define TPORT_SIZE(t) ((t) <= 2 ? 1 : (t) == 3 || (t) == 6 || (t) == 7 ? 2 : (t) == 4 || (t) == 8 ? 4 : (t) == 11 ? 16 : 8)
#define SS TPORT_SIZE(TPORT_SRC)
#define DS TPORT_SIZE(TPORT_DST)

// The value a load gives, as the tile of the transpose kernel holds it: the
// bits themselves for the same dtype; else what load() gives, except that an
// integer source of up to 4 bytes (bool too) is held as i32, exactly (so that
// every source of up to 4 bytes has a tile of 4-byte elements; see TP).
#if TPORT_DST == TPORT_SRC
#if ES == 1
typedef u8 tile_t;
#elif ES == 2
typedef u16 tile_t;
#elif ES == 4
typedef u32 tile_t;
#elif ES == 8
typedef u64 tile_t;
#else
struct u128 {
  u64 lo, hi;
};
typedef u128 tile_t;
#endif
__device__ inline tile_t tile_load(const char *s) { return *(const tile_t *)s; }
__device__ inline void tile_store(char *d, tile_t v) { *(tile_t *)d = v; }
#elif TPORT_SRC <= 4
typedef i32 tile_t;
__device__ inline tile_t tile_load(const char *s) { return (i32)load(s); }
__device__ inline void tile_store(char *d, tile_t v) { store(d, (i64)v); }
#else
typedef decltype(load((const char *)0)) tile_t;
__device__ inline tile_t tile_load(const char *s) { return load(s); }
__device__ inline void tile_store(char *d, tile_t v) { store(d, v); }
#endif

__device__ inline void post_ops(char *dp, unsigned flags)
{
#ifdef HAS_CONJ
  if (flags & FLAG_CONJ)
    conjugate(dp);
#endif
  if (flags & FLAG_NEG)
    negate(dp);
}

__device__ inline bool aligned(const void *p, unsigned long long a)
{
  return ((unsigned long long)p & (a - 1)) == 0;
}

// The tiled transpose for plans whose dst is dense along plan dim 0 and whose
// src is dense along plan dim 1 (contiguous <-> channels_last(3d) and their
// kin, the batched [N, C, HW] <-> [N, HW, C] among them).  A block of
// (TILE / TP) x ROWS threads moves a TILE x TILE tile: it reads it with
// src-coalesced loads into shared memory (a padded row: TILE + 1) and writes
// it with dst-coalesced stores, the cast fused in between (tile_t holds the
// loaded value; store() converts, once per element).
//
// TP: elements per thread and access along each dim.  Sources of up to 4
// bytes (tile_t of 4 bytes at most: 64 x 65 x 4 = 16.6 KB of shared memory)
// move runs of 4: each thread loads 4 adjacent src elements with one 4 x SS
// access (16 bytes for float32) and stores 4 adjacent dst elements with one
// 4 x DS access, in blocks of 16 x 32 threads (two loads and two stores each).
// On an H200 this moved NCHW <-> NHWC float32 at 0.81x a D2D copy of the same
// bytes, where pairs in blocks of 32 x 8 did 0.59x and runs of 4 in blocks of
// 16 x 16 0.78x (bench/RESULTS.md, 2026-11-27).  A run that is not aligned to
// its width (an odd storage offset or stride) or that the tile's edge cuts
// goes element by element.  Wider sources move 32 x 32 tiles element by
// element in blocks of 32 x 8 (32 x 33 x 16 = 16.9 KB for complex128).
// engine/cuda/cuda_launch.c mirrors TILE, TP and ROWS (the launch).
//
// blockIdx.x: tiles along dim 1, blockIdx.y: tiles along dim 0, blockIdx.z:
// the outer dims (2..ndim-1), grid-strided; a plan of 3 dims or fewer (the
// batched 2-D transpose) steps its one outer dim without a division.  Index
// arithmetic in idx: 32-bit where the plan allows it, which roughly halves
// the registers 64-bit arithmetic takes.
#define TP (SS <= 4 ? 4 : 1)
#define TILE (TP == 4 ? 64 : 32)
#define ROWS (TP == 4 ? 32 : 8)
static_assert(TP == 1 || sizeof(tile_t) <= 4, "a tile of runs holds 4-byte values at most");
static_assert(TILE == TP * (TP == 4 ? 16 : 32) && TILE % ROWS == 0, "the block covers the tile");
struct alignas(TP * SS) src_run {
  char b[TP * SS];
};
struct alignas(TP * DS) dst_run {
  char b[TP * DS];
};

// the block's threads bound the registers the compiler may give each (a
// block of 512 threads launches only with at most 128 each)
extern "C" __global__ void __launch_bounds__((TILE / TP) * ROWS) tport_transpose(Params p)
{
  __shared__ tile_t tile[TILE][TILE + 1];
  const idx n0 = (idx)p.shape[0], n1 = (idx)p.shape[1];
  const idx ds1 = (idx)p.dst_stride[1], ss0 = (idx)p.src_stride[0];
  idx outer_n = 1;
  for (int d = 2; d < p.ndim; d++)
    outer_n = imul(outer_n, (idx)p.shape[d]);
  const idx ds2 = p.ndim > 2 ? (idx)p.dst_stride[2] : (idx)0;
  const idx ss2 = p.ndim > 2 ? (idx)p.src_stride[2] : (idx)0;
  const idx i0b = imul((idx)blockIdx.y, (idx)TILE), i1b = imul((idx)blockIdx.x, (idx)TILE);
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (idx o = (idx)blockIdx.z; o < outer_n; o = iadd(o, (idx)gridDim.z)) {
    idx doff, soff;
    if (p.ndim <= 3) {
      doff = imul(o, ds2);
      soff = imul(o, ss2);
    } else {
      idx r = o;
      doff = soff = 0;
      for (int d = 2; d < p.ndim; d++) {
        const idx size = (idx)p.shape[d];
        const idx k = (idx)(r % size);
        r = (idx)(r / size);
        doff = iadd(doff, imul(k, (idx)p.dst_stride[d]));
        soff = iadd(soff, imul(k, (idx)p.src_stride[d]));
      }
    }
    // load: consecutive threads read consecutive runs of src (along dim 1),
    // every load of the thread issued before the first shared store.  The
    // index of the last element of a run is i1 + TP - 1, below n1 + TILE:
    // within the narrow index's reach (engine/cuda/cuda_launch.c).
    tile_t v[TILE / ROWS][TP];
    const idx i1 = iadd(i1b, (idx)(TP * tx));
#pragma unroll
    for (int r = 0; r < TILE / ROWS; r++) {
      const idx i0 = iadd(i0b, (idx)(ty + r * ROWS));
#pragma unroll
      for (int k = 0; k < TP; k++)
        v[r][k] = tile_t();
      if (i0 < n0 && i1 < n1) {
        const char *sp = p.src + iadd(soff, iadd(imul(i0, ss0), imul(i1, (idx)SS)));
#if TP > 1
        if (iadd(i1, (idx)(TP - 1)) < n1 && aligned(sp, TP * SS)) {
          const src_run s = *(const src_run *)sp;
#pragma unroll
          for (int k = 0; k < TP; k++)
            v[r][k] = tile_load(s.b + k * SS);
        } else {
#pragma unroll
          for (int k = 0; k < TP; k++)
            if (iadd(i1, (idx)k) < n1)
              v[r][k] = tile_load(sp + k * SS);
        }
#else
        v[r][0] = tile_load(sp);
#endif
      }
    }
#pragma unroll
    for (int r = 0; r < TILE / ROWS; r++)
#pragma unroll
      for (int k = 0; k < TP; k++)
        tile[ty + r * ROWS][TP * tx + k] = v[r][k];
    __syncthreads();
    // store: consecutive threads write consecutive runs of dst (along dim 0)
    const idx i0 = iadd(i0b, (idx)(TP * tx));
#pragma unroll
    for (int r = 0; r < TILE / ROWS; r++) {
      const int c = ty + r * ROWS;
      const idx j1 = iadd(i1b, (idx)c);
      if (j1 >= n1 || i0 >= n0)
        continue;
      char *dp = p.dst + iadd(doff, iadd(imul(i0, (idx)DS), imul(j1, ds1)));
#if TP > 1
      if (iadd(i0, (idx)(TP - 1)) < n0 && aligned(dp, TP * DS)) {
        dst_run d;
#pragma unroll
        for (int k = 0; k < TP; k++) {
          tile_store(d.b + k * DS, tile[TP * tx + k][c]);
          post_ops(d.b + k * DS, p.flags);
        }
        *(dst_run *)dp = d;
        continue;
      }
#endif
#pragma unroll
      for (int k = 0; k < TP; k++)
        if (iadd(i0, (idx)k) < n0) {
          tile_store(dp + k * DS, tile[TP * tx + k][c]);
          post_ops(dp + k * DS, p.flags);
        }
    }
    __syncthreads();
  }
}

// The dense 1-D case (both operands contiguous, pointers aligned to VEC
// elements): each thread moves one vector of VEC elements per step of its
// grid-stride loop, converted in registers and stored at once; the threads of
// a warp touch adjacent vectors.  VEC is 8 where both dtypes have at most 4
// bytes (32-byte loads and 16-byte stores for float32 -> bfloat16), else 4;
// in blocks of 128 threads.  On an H200 this cast float32 -> bfloat16 at
// 0.97x a D2D copy of the same bytes, where 4 vectors of 4 per thread in
// blocks of 256 did 0.89x (bench/RESULTS.md, 2026-11-27).  The last
// numel % VEC elements go one by one.  engine/cuda/cuda_launch.c mirrors VEC
// and the block (the grid, and the reach of the narrow index).
#define VEC (SS <= 4 && DS <= 4 ? 8 : 4)
struct alignas(VEC * SS) src_vec {
  char b[VEC * SS];
};
struct alignas(VEC * DS) dst_vec {
  char b[VEC * DS];
};

extern "C" __global__ void tport_cast_vec(Params p)
{
  const idx n = (idx)p.numel, nvec = (idx)(n / VEC);
  const idx bd = (idx)blockDim.x;
  const idx step = imul((idx)gridDim.x, bd);
  const idx t = iadd(imul((idx)blockIdx.x, bd), (idx)threadIdx.x);
  const src_vec *src = (const src_vec *)p.src;
  dst_vec *dst = (dst_vec *)p.dst;
  for (idx i = t; i < nvec; i = iadd(i, step)) {
    const src_vec sv = src[i];
    dst_vec dv;
#pragma unroll
    for (int k = 0; k < VEC; k++) {
      convert(dv.b + k * DS, sv.b + k * SS);
      post_ops(dv.b + k * DS, p.flags);
    }
    dst[i] = dv;
  }
  if (t < (idx)(n % VEC)) {
    const idx e = iadd(imul(nvec, (idx)VEC), t);
    char *dp = p.dst + imul(e, (idx)DS);
    convert(dp, p.src + imul(e, (idx)SS));
    post_ops(dp, p.flags);
  }
}

extern "C" __global__ void tport_copy(Params p)
{
  const idx n = (idx)p.numel;
  const idx stride = imul((idx)gridDim.x, (idx)blockDim.x);
  for (idx i = iadd(imul((idx)blockIdx.x, (idx)blockDim.x), (idx)threadIdx.x); i < n;
       i = iadd(i, stride)) {
    idx r = i, doff = 0, soff = 0;
#pragma unroll
    for (int d = 0; d < TPORT_MAX_DIMS; d++) {
      if (d >= p.ndim)
        break;
      const idx size = (idx)p.shape[d];
      const idx k = (idx)(r % size);
      r = (idx)(r / size);
      doff = iadd(doff, imul(k, (idx)p.dst_stride[d]));
      soff = iadd(soff, imul(k, (idx)p.src_stride[d]));
    }
    char *dp = p.dst + doff;
    convert(dp, p.src + soff);
    post_ops(dp, p.flags);
  }
}
