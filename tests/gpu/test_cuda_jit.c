/* test_cuda_jit.c: what cuda_jit decides and compiles, without a GPU.
 *
 * The runtime-compiled kernels compile with NVRTC (opened with dlopen) for
 * every dtype pair and both index widths, with the options that keep them
 * bit-exact; a missing libnvrtc is a clear TPORT_UNAVAILABLE; and
 * cuda_jit_plan_launch picks the kernel, a grid within the device's limits
 * and the narrow index only where nothing wraps, at 32 bits and at the 16
 * bits of the host emulation.  Criterion runs each test in its own process,
 * so each one loads libnvrtc afresh (the missing-library test relies on it).
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_jit.h"

/* ---------------------------------------------------------------- compiling */

Test(cuda_jit, copy_kernel_compiles_for_every_pair, .timeout = 1200)
{
  for (int d = 0; d < TPORT_NUM_DTYPES; d++)
    for (int s = 0; s < TPORT_NUM_DTYPES; s++)
      for (int wide = 0; wide < 2; wide++) {
        /* both index widths for the diagonal and float32 rows; 32-bit for the rest */
        if (wide && !(d == s || d == TPORT_FLOAT32 || s == TPORT_FLOAT32))
          continue;
        void *bin = NULL;
        size_t n = 0;
        tport_err err;
        int rc =
            cuda_jit_compile_copy((tport_dtype)d, (tport_dtype)s, wide, "sm_90", &bin, &n, &err);
        cr_assert_eq(rc, 0, "copy %d <- %d: %s", d, s, err.msg);
        cr_assert_gt(n, 0);
        free(bin);
      }
}

Test(cuda_jit, bad_architecture_is_an_error)
{
  void *bin;
  size_t n;
  tport_err err;
  cr_assert_eq(cuda_jit_compile_copy(TPORT_FLOAT32, TPORT_FLOAT16, false, "sm_1", &bin, &n, &err),
               TPORT_INTERNAL);
  cr_assert(strstr(err.msg, "nvrtcCompileProgram"), "%s", err.msg);
  /* a virtual architecture: NVRTC says success with an empty CUBIN */
  cr_assert_eq(cuda_jit_compile_copy(TPORT_FLOAT32, TPORT_FLOAT32, false, "compute_90", &bin, &n,
                                     &err),
               TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "no CUBIN"), "%s", err.msg);
}

Test(cuda_jit, bad_dtype_is_an_error)
{
  void *bin;
  size_t n;
  tport_err err;
  cr_assert_eq(cuda_jit_compile_copy((tport_dtype)TPORT_NUM_DTYPES, TPORT_FLOAT16, false, "sm_90",
                                     &bin, &n, &err),
               TPORT_INVALID_ARGUMENT);
}

Test(cuda_jit, options_keep_the_kernels_bit_exact)
{
  char o[512];
  size_t len = cuda_jit_copy_options(TPORT_FLOAT16, TPORT_FLOAT32, false, "sm_90", o, sizeof o);
  cr_assert_eq(len, strlen(o));
  cr_assert(strstr(o, "--fmad=false"), "no fused multiply-add: %s", o);
  cr_assert(strstr(o, "--gpu-architecture=sm_90"), "%s", o);
  cr_assert(strstr(o, "-DTPORT_DST=6") && strstr(o, "-DTPORT_SRC=8"), "%s", o);
  cr_assert(strstr(o, "-DTPORT_IDX=unsigned int"), "%s", o);
  cuda_jit_copy_options(TPORT_FLOAT16, TPORT_FLOAT32, true, "sm_90", o, sizeof o);
  cr_assert(strstr(o, "-DTPORT_IDX=unsigned long long"), "%s", o);
  /* truncated like snprintf, with the whole length returned */
  char small[8];
  cr_assert_eq(cuda_jit_copy_options(TPORT_FLOAT16, TPORT_FLOAT32, true, "sm_90", small, 8),
               len + 6, "\"long long\" is 6 longer than \"int\"");
  cr_assert_eq(strlen(small), 7);
}

Test(cuda_jit, nvrtc_is_found_and_named)
{
  char why[256];
  cr_assert(cuda_jit_available(why, sizeof why), "%s", why);
  cr_assert(strstr(why, "NVRTC ") == why, "%s", why);
}

Test(cuda_jit, a_missing_nvrtc_is_a_clear_error)
{
  cr_assert_eq(setenv("TPORT_NVRTC_LIBRARY", "/nonexistent/libnvrtc.so.13", 1), 0);
  char why[256];
  cr_assert_not(cuda_jit_available(why, sizeof why));
  cr_assert(strstr(why, "runtime compilation unavailable: ") == why, "%s", why);
  cr_assert(strstr(why, "/nonexistent/libnvrtc.so.13"), "names the file: %s", why);
  void *bin = NULL;
  size_t n = 0;
  tport_err err;
  cr_assert_eq(cuda_jit_compile_copy(TPORT_FLOAT32, TPORT_FLOAT16, false, "sm_90", &bin, &n, &err),
               TPORT_UNAVAILABLE);
  cr_assert_eq(err.code, TPORT_UNAVAILABLE);
  cr_assert(strstr(err.msg, "runtime compilation unavailable: ") == err.msg, "%s", err.msg);
  cr_assert(strstr(err.msg, "/nonexistent/libnvrtc.so.13"), "%s", err.msg);
  cr_assert_null(bin);
}

/* A library without the NVRTC entry points: the missing symbol is named. */
Test(cuda_jit, a_library_that_is_not_nvrtc_is_a_clear_error)
{
  cr_assert_eq(setenv("TPORT_NVRTC_LIBRARY", "libm.so.6", 1), 0);
  char why[256];
  cr_assert_not(cuda_jit_available(why, sizeof why));
  cr_assert(strstr(why, "runtime compilation unavailable: libm.so.6 has no nvrtcVersion") == why,
            "%s", why);
}

/* ---------------------------------------------------------------- launch plans */

#define U8 TPORT_UINT8
#define F32 TPORT_FLOAT32

static const cuda_jit_limits lim32 = {{65535u * 32, 65535, 65535}, 32};
static const cuda_jit_limits lim16 = {{8, 4, 4}, 16}; /* the emulation's scale */
static char *const A = (char *)(uintptr_t)0x100000;   /* aligned for every VEC */

/* A plan of ndim dims: shape, dst and src byte strides, dim 0 innermost. */
static plan mk(int ndim, const int64_t *shape, const int64_t *dst, const int64_t *src)
{
  plan p;
  memset(&p, 0, sizeof p);
  p.ndim = ndim;
  p.nops = 2;
  for (int d = 0; d < ndim; d++) {
    p.shape[d] = shape[d];
    p.strides[0][d] = dst[d];
    p.strides[1][d] = src[d];
  }
  return p;
}

static uint64_t threads_of(const cuda_jit_launch *L)
{
  uint64_t t = 1;
  for (int i = 0; i < 3; i++)
    t *= (uint64_t)L->grid[i] * L->block[i];
  return t;
}

static cuda_jit_launch launch(const plan *p, tport_dtype dt, const void *dst, tport_dtype st,
                              const void *src, const cuda_jit_limits *lim)
{
  cuda_jit_launch L;
  cr_assert_eq(cuda_jit_plan_launch(p, dt, dst, st, src, lim, &L), 0);
  for (int i = 0; i < 3; i++)
    if (L.kernel != CUDA_JIT_NONE)
      cr_assert(L.grid[i] >= 1 && L.grid[i] <= lim->max_grid[i], "grid[%d] = %u of at most %u", i,
                L.grid[i], lim->max_grid[i]);
  return L;
}

/* numel elements of uint8 from a broadcast scalar: the generic copy kernel,
 * whose byte offsets stay below numel. */
static cuda_jit_launch broadcast_copy(int64_t numel, const cuda_jit_limits *lim)
{
  plan p = mk(1, (int64_t[]){numel}, (int64_t[]){1}, (int64_t[]){0});
  return launch(&p, U8, A, U8, A, lim);
}

Test(cuda_jit_plan, the_grid_stride_loop_never_wraps_at_32_bits)
{
  /* the grid is at its cap here, so its thread count is fixed */
  cuda_jit_launch L = broadcast_copy(4000000000LL, &lim32);
  cr_assert_eq(L.kernel, CUDA_JIT_COPY);
  cr_assert_eq(L.grid[0], 65535u * 32);
  const int64_t T = (int64_t)threads_of(&L), edge = (1LL << 32) - T;
  cr_assert_eq(edge, 3758104576LL, "the ~3.76 G elements of the issue");
  L = broadcast_copy(edge, &lim32);
  cr_assert_eq((int64_t)threads_of(&L), T);
  cr_assert_not(L.wide, "numel + threads = 2^32: the last step reaches 2^32 - 1");
  L = broadcast_copy(edge + 1, &lim32);
  cr_assert(L.wide, "one more element and the last step would wrap to 0");
  cr_assert_eq(L.params.numel, edge + 1);
  /* a small copy is narrow */
  cr_assert_not(broadcast_copy(1000, &lim32).wide);
  cr_assert_not(broadcast_copy(1, &lim32).wide);
}

Test(cuda_jit_plan, byte_offsets_past_the_narrow_range_are_wide)
{
  /* two uint8 elements 2^32 - 1 bytes apart: the last byte is 2^32 - 1 */
  const int64_t far = (1LL << 32) - 1;
  plan p = mk(1, (int64_t[]){2}, (int64_t[]){far}, (int64_t[]){1});
  cr_assert_not(launch(&p, U8, A, U8, A, &lim32).wide);
  p.strides[0][0] = far + 1;
  cr_assert(launch(&p, U8, A, U8, A, &lim32).wide, "dst reaches 2^32");
  p = mk(1, (int64_t[]){2}, (int64_t[]){1}, (int64_t[]){far + 1});
  cr_assert(launch(&p, U8, A, U8, A, &lim32).wide, "src reaches 2^32");
  /* float32: the last byte of the last element counts */
  p = mk(1, (int64_t[]){2}, (int64_t[]){4}, (int64_t[]){far - 3});
  cr_assert_not(launch(&p, F32, A, F32, A, &lim32).wide);
  p.strides[1][0] = far - 2;
  cr_assert(launch(&p, F32, A, F32, A, &lim32).wide);
  /* a dim of size 1 reaches nothing, whatever its stride */
  p = mk(2, (int64_t[]){4, 1}, (int64_t[]){1, 1LL << 40}, (int64_t[]){1, -7});
  cr_assert_not(launch(&p, U8, A, U8, A + 1, &lim32).wide);
  /* a negative stride has no narrow bound */
  p = mk(1, (int64_t[]){4}, (int64_t[]){1}, (int64_t[]){-1});
  cr_assert(launch(&p, U8, A, U8, A + 3, &lim32).wide);
}

Test(cuda_jit_plan, the_same_edges_at_16_bits)
{
  cuda_jit_launch L = broadcast_copy(100000, &lim16);
  cr_assert_eq(L.kernel, CUDA_JIT_COPY);
  cr_assert_eq(L.grid[0], 8);
  const int64_t T = (int64_t)threads_of(&L), edge = 65536 - T;
  cr_assert_eq(edge, 63488);
  cr_assert_not(broadcast_copy(edge, &lim16).wide);
  cr_assert(broadcast_copy(edge + 1, &lim16).wide);
  /* a grid below the cap: numel + its own threads */
  L = broadcast_copy(1000, &lim16);
  cr_assert_eq(L.grid[0], 4);
  cr_assert_not(L.wide);
  /* byte offsets */
  plan p = mk(1, (int64_t[]){2}, (int64_t[]){65535}, (int64_t[]){0});
  cr_assert_not(launch(&p, U8, A, U8, A, &lim16).wide);
  p.strides[0][0] = 65536;
  cr_assert(launch(&p, U8, A, U8, A, &lim16).wide);
  /* cast_vec: numel / VEC elements per thread slot, the same bound on numel */
  p = mk(1, (int64_t[]){edge}, (int64_t[]){1}, (int64_t[]){1});
  L = launch(&p, U8, A, U8, A, &lim16);
  cr_assert_eq(L.kernel, CUDA_JIT_CAST_VEC);
  cr_assert_not(L.wide);
  p.shape[0] = 65536 - threads_of(&L) + 1;
  L = launch(&p, U8, A, U8, A, &lim16);
  cr_assert(L.wide);
  /* the transpose: its grid's threads count too (2 x 2 x 4 blocks of
   * 16 x 32: tiles of 64 x 64 in runs of 4 for a 1-byte source) */
  p = mk(3, (int64_t[]){65, 65, 13}, (int64_t[]){1, 65, 4225}, (int64_t[]){65, 1, 4225});
  L = launch(&p, U8, A, U8, A, &lim16);
  cr_assert_eq(L.kernel, CUDA_JIT_TRANSPOSE);
  cr_assert_eq(L.grid[2], 4, "13 outer slices in 4 z blocks");
  cr_assert_eq(threads_of(&L), 2 * 2 * 4 * 512);
  cr_assert_not(L.wide, "54925 - 1 + 8192 <= 65535");
  p.shape[2] = 14;
  L = launch(&p, U8, A, U8, A, &lim16);
  cr_assert_eq(L.kernel, CUDA_JIT_TRANSPOSE);
  cr_assert(L.wide, "59150 - 1 + 8192 > 65535, though every byte offset fits");
}

/* Every narrow decision, brute-forced: the grid-stride loop of tport_copy in
 * narrow_bits arithmetic visits every index below numel once and stops. */
Test(cuda_jit_plan, a_narrow_loop_visits_every_element_once)
{
  for (int bits = 8; bits <= 16; bits += 4)
    for (unsigned gx = 1; gx <= 8; gx *= 2) {
      const cuda_jit_limits lim = {{gx, 1, 1}, bits};
      const uint32_t mask = (uint32_t)((1u << bits) - 1);
      for (int64_t numel = 1; numel <= (1 << bits); numel += numel / 7 + 1) {
        cuda_jit_launch L = broadcast_copy(numel, &lim);
        if (L.wide)
          continue;
        const uint32_t T = (uint32_t)threads_of(&L);
        uint64_t visits = 0;
        for (uint32_t t = 0; t < T; t++)
          for (uint32_t i = t & mask, steps = 0; i < (uint32_t)numel; i = (i + T) & mask) {
            cr_assert(++steps <= (uint32_t)numel, "wrapped: %d bits, numel %lld", bits,
                      (long long)numel);
            visits++;
          }
        cr_assert_eq(visits, (uint64_t)numel, "%d bits, numel %lld", bits, (long long)numel);
      }
    }
}

Test(cuda_jit_plan, kernel_choice)
{
  /* dense and aligned: cast_vec, a vector of VEC (8: both dtypes of at most
   * 4 bytes) elements per thread, blocks of 128 */
  plan p = mk(1, (int64_t[]){16384}, (int64_t[]){2}, (int64_t[]){4});
  cuda_jit_launch L = launch(&p, TPORT_FLOAT16, A, F32, A + 32, &lim32);
  cr_assert_eq(L.kernel, CUDA_JIT_CAST_VEC);
  cr_assert_eq(L.grid[0], 16384 / 8 / 128);
  cr_assert_eq(L.block[0], 128);
  /* both pointers aligned to a whole vector: 32 bytes of float32, 16 of float16 */
  cr_assert_eq(launch(&p, TPORT_FLOAT16, A + 16, F32, A + 32, &lim32).kernel, CUDA_JIT_CAST_VEC);
  cr_assert_eq(launch(&p, TPORT_FLOAT16, A + 8, F32, A, &lim32).kernel, CUDA_JIT_COPY);
  cr_assert_eq(launch(&p, TPORT_FLOAT16, A, F32, A + 16, &lim32).kernel, CUDA_JIT_COPY);
  /* VEC 4 where a dtype is wider: 4 float64 (32 bytes) */
  p = mk(1, (int64_t[]){16384}, (int64_t[]){4}, (int64_t[]){8});
  L = launch(&p, F32, A + 16, TPORT_FLOAT64, A + 32, &lim32);
  cr_assert_eq(L.kernel, CUDA_JIT_CAST_VEC);
  cr_assert_eq(L.grid[0], 16384 / 4 / 128);
  p = mk(1, (int64_t[]){16384}, (int64_t[]){2}, (int64_t[]){4});
  /* misaligned dst (2 elements in) or src: the generic copy */
  cr_assert_eq(launch(&p, TPORT_FLOAT16, A + 4, F32, A, &lim32).kernel, CUDA_JIT_COPY);
  cr_assert_eq(launch(&p, TPORT_FLOAT16, A, F32, A + 4, &lim32).kernel, CUDA_JIT_COPY);
  /* fewer than VEC elements */
  p.shape[0] = 3;
  cr_assert_eq(launch(&p, TPORT_FLOAT16, A, F32, A, &lim32).kernel, CUDA_JIT_COPY);
  /* strided src */
  p = mk(1, (int64_t[]){4096}, (int64_t[]){4}, (int64_t[]){8});
  cr_assert_eq(launch(&p, F32, A, F32, A, &lim32).kernel, CUDA_JIT_COPY);

  /* NCHW -> NHWC (2 x 8 x 5 x 6 float32 to float16): plan_build's plan is
   * dst-dense along dim 0 (C) and src-dense along dim 1 (H*W) */
  const int64_t shape[4] = {2, 8, 5, 6};
  const int64_t dst_st[4] = {240 * 2, 1 * 2, 48 * 2, 8 * 2},
                src_st[4] = {240 * 4, 30 * 4, 6 * 4, 4};
  const int64_t *const strides[2] = {dst_st, src_st};
  plan_build(&p, 4, shape, 2, strides);
  cr_assert_eq(p.ndim, 3);
  L = launch(&p, TPORT_FLOAT16, A, F32, A, &lim32);
  cr_assert_eq(L.kernel, CUDA_JIT_TRANSPOSE);
  cr_assert_eq(L.block[0], 16, "runs of 4 across a tile of 64");
  cr_assert_eq(L.block[1], 32);
  cr_assert_eq(L.grid[0], 1, "30 along dim 1: one tile");
  cr_assert_eq(L.grid[1], 1, "8 along dim 0: one tile");
  cr_assert_eq(L.grid[2], 2, "N");
  cr_assert_eq(L.params.ndim, 3);
  cr_assert_not(L.wide);
  /* tiles of 64 for sources of up to 4 bytes, of 32 for wider ones */
  p = mk(3, (int64_t[]){100, 200, 3}, (int64_t[]){4, 400, 80000}, (int64_t[]){800, 4, 80000});
  L = launch(&p, F32, A, F32, A, &lim32);
  cr_assert_eq(L.kernel, CUDA_JIT_TRANSPOSE);
  cr_assert(L.grid[0] == 4 && L.grid[1] == 2 && L.grid[2] == 3, "grid (%u,%u,%u)", L.grid[0],
            L.grid[1], L.grid[2]);
  p = mk(3, (int64_t[]){100, 200, 3}, (int64_t[]){4, 400, 80000}, (int64_t[]){1600, 8, 160000});
  L = launch(&p, F32, A, TPORT_FLOAT64, A, &lim32);
  cr_assert_eq(L.kernel, CUDA_JIT_TRANSPOSE);
  cr_assert(L.grid[0] == 7 && L.grid[1] == 4, "grid (%u,%u,%u)", L.grid[0], L.grid[1], L.grid[2]);
  cr_assert(L.block[0] == 32 && L.block[1] == 8);
  /* the reverse (NHWC -> NCHW): dst dense along dim 0 (W, coalesced with H),
   * src dense along dim 1 (C) */
  const int64_t *const back[2] = {src_st, dst_st};
  plan_build(&p, 4, shape, 2, back);
  cr_assert_eq(launch(&p, F32, A, TPORT_FLOAT16, A, &lim32).kernel, CUDA_JIT_TRANSPOSE);
  /* a dim 0 or 1 under 4: the generic copy */
  p = mk(2, (int64_t[]){3, 100}, (int64_t[]){1, 3}, (int64_t[]){100, 1});
  cr_assert_eq(launch(&p, U8, A, U8, A, &lim32).kernel, CUDA_JIT_COPY);
  /* more tiles than grid y (or x) allows: the generic copy, not a cut grid */
  p = mk(2, (int64_t[]){300, 100}, (int64_t[]){1, 300}, (int64_t[]){100, 1});
  cr_assert_eq(launch(&p, U8, A, U8, A, &lim32).kernel, CUDA_JIT_TRANSPOSE);
  L = launch(&p, U8, A, U8, A, &lim16);
  cr_assert_eq(L.kernel, CUDA_JIT_COPY, "5 tiles along dim 0, grid y at most 4");
  p = mk(2, (int64_t[]){100, 600}, (int64_t[]){1, 100}, (int64_t[]){600, 1});
  cr_assert_eq(launch(&p, U8, A, U8, A, &lim16).kernel, CUDA_JIT_COPY, "10 tiles along x");
  /* a single element (ndim 0) and no element */
  p = mk(0, NULL, NULL, NULL);
  L = launch(&p, U8, A, F32, A, &lim32);
  cr_assert_eq(L.kernel, CUDA_JIT_COPY);
  cr_assert_eq(L.grid[0], 1);
  p = mk(2, (int64_t[]){0, 5}, (int64_t[]){1, 0}, (int64_t[]){1, 0});
  L = launch(&p, U8, A, U8, A, &lim32);
  cr_assert_eq(L.kernel, CUDA_JIT_NONE);
  cr_assert_eq(L.params.numel, 0);
}

Test(cuda_jit_plan, params_are_the_plan)
{
  plan p = mk(2, (int64_t[]){5, 7}, (int64_t[]){8, 40}, (int64_t[]){56, 8});
  cuda_jit_launch L = launch(&p, TPORT_FLOAT64, A, TPORT_INT64, A + 8, &lim32);
  cr_assert_eq(L.params.numel, 35);
  cr_assert_eq(L.params.ndim, 2);
  cr_assert_eq(L.params.dst, A);
  cr_assert_eq(L.params.src, A + 8);
  cr_assert_eq(L.params.flags, 0);
  for (int d = 0; d < 2; d++) {
    cr_assert_eq(L.params.shape[d], p.shape[d]);
    cr_assert_eq(L.params.dst_stride[d], p.strides[0][d]);
    cr_assert_eq(L.params.src_stride[d], p.strides[1][d]);
  }
}

Test(cuda_jit_plan, grids_stay_within_the_limits)
{
  const cuda_jit_limits lims[] = {
      lim32, lim16, {{1, 1, 1}, 8}, {{3, 2, 5}, 12}, {{7, 65535, 1}, 32}};
  const int64_t sizes[] = {1, 3, 4, 31, 32, 33, 100, 257, 4096, 70000, 1000003};
  for (size_t l = 0; l < sizeof lims / sizeof lims[0]; l++)
    for (size_t a = 0; a < sizeof sizes / sizeof sizes[0]; a++)
      for (size_t b = 0; b < sizeof sizes / sizeof sizes[0]; b++) {
        const int64_t n0 = sizes[a], n1 = sizes[b] % 5000 + 1;
        /* dense 1-D, transposed 2-D and 3-D, strided: launch() checks the grid */
        plan p = mk(1, (int64_t[]){n0 * n1}, (int64_t[]){4}, (int64_t[]){4});
        launch(&p, F32, A, F32, A, &lims[l]);
        p = mk(2, (int64_t[]){n0, n1}, (int64_t[]){1, n0}, (int64_t[]){n1, 1});
        launch(&p, U8, A, U8, A, &lims[l]);
        p = mk(3, (int64_t[]){n0, 8, n1}, (int64_t[]){1, n0, 8 * n0}, (int64_t[]){8, 1, 8 * n0});
        launch(&p, U8, A, U8, A, &lims[l]);
        p = mk(2, (int64_t[]){n0, n1}, (int64_t[]){3, 3 * n0}, (int64_t[]){0, 1});
        launch(&p, U8, A, U8, A, &lims[l]);
      }
}

Test(cuda_jit_plan, bad_limits_are_refused)
{
  plan p = mk(1, (int64_t[]){10}, (int64_t[]){1}, (int64_t[]){1});
  cuda_jit_launch L;
  cuda_jit_limits bad = lim32;
  bad.narrow_bits = 7;
  cr_assert_eq(cuda_jit_plan_launch(&p, U8, A, U8, A, &bad, &L), TPORT_INVALID_ARGUMENT);
  bad.narrow_bits = 33;
  cr_assert_eq(cuda_jit_plan_launch(&p, U8, A, U8, A, &bad, &L), TPORT_INVALID_ARGUMENT);
  bad = lim32;
  bad.max_grid[2] = 0;
  cr_assert_eq(cuda_jit_plan_launch(&p, U8, A, U8, A, &bad, &L), TPORT_INVALID_ARGUMENT);
  cr_assert_eq(cuda_jit_plan_launch(&p, (tport_dtype)99, A, U8, A, &lim32, &L),
               TPORT_INVALID_ARGUMENT);
}
