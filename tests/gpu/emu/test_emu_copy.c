/* test_emu_copy.c: kernels/cuda/copy.cu, launched by engine/cuda/cuda_jit.c on the
 * emulated device, against kernels/cpu bit for bit: every dtype pair over
 * every layout (contiguous, vector tails, misaligned pointers, strided,
 * broadcast, storage offsets, NCHW <-> NHWC with extents that are not tile
 * multiples, C or HW of 1, pairs left unaligned by offsets and odd pitches,
 * 5-D channels-last with edge tiles, high rank, one element, empty), conj
 * and neg, in place, and grids
 * small enough that the grid-stride loops go round. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_check.h"

#define V CUDA_JIT_CAST_VEC
#define T CUDA_JIT_TRANSPOSE
#define C CUDA_JIT_COPY

/* Tensor order (outermost first), element strides; the kernel each reaches. */
static const emu_layout layouts[] = {
    {"contiguous", 1, {1000}, {1}, {1}, 0, 0, V},
    {"contiguous, vector tail of 3", 1, {1003}, {1}, {1}, 0, 0, V},
    {"3 elements (under one vector)", 1, {3}, {1}, {1}, 0, 0, C},
    {"dst one element off", 1, {1001}, {1}, {1}, 1, 0, C},
    {"src one element off", 1, {1001}, {1}, {1}, 0, 1, C},
    {"both 8 elements off (aligned again)", 1, {1001}, {1}, {1}, 8, 8, V},
    {"2-d contiguous", 2, {37, 45}, {45, 1}, {45, 1}, 0, 0, V},
    {"transposed src, edge tiles", 2, {45, 37}, {37, 1}, {1, 45}, 0, 0, T},
    {"transposed dst, edge tiles", 2, {45, 37}, {1, 45}, {37, 1}, 0, 0, T},
    {"batched transpose", 3, {5, 33, 34}, {1122, 34, 1}, {1122, 1, 33}, 0, 0, T},
    {"nchw -> nhwc", 4, {2, 5, 33, 35}, {5775, 1, 175, 5}, {5775, 1155, 35, 1}, 0, 0, T},
    {"nhwc -> nchw", 4, {2, 5, 33, 35}, {5775, 1155, 35, 1}, {5775, 1, 175, 5}, 0, 0, T},
    {"nchw -> nhwc, 3 channels", 4, {2, 3, 9, 11}, {297, 1, 33, 3}, {297, 99, 11, 1}, 0, 0, C},
    {"ncdhw -> ndhwc", 5, {2, 6, 5, 7, 9}, {1890, 1, 378, 54, 6}, {1890, 315, 63, 9, 1}, 0, 0, T},
    {"ndhwc -> ncdhw", 5, {2, 6, 5, 7, 9}, {1890, 315, 63, 9, 1}, {1890, 1, 378, 54, 6}, 0, 0, T},
    /* the transpose's 64 x 64 tiles of pairs (32 x 32 for sources over 4
     * bytes): extents of 1, 31, 33, 65 and exact multiples, pairs that the
     * edge cuts, storage offsets and odd row pitches that leave pairs
     * unaligned (element by element), a plan of more than 3 dims */
    {"nchw->nhwc C65 HW33", 4, {2, 65, 3, 11}, {2145, 1, 715, 65}, {2145, 33, 11, 1}, 0, 0, T},
    {"nhwc->nchw C33 HW65", 4, {2, 33, 5, 13}, {2145, 65, 13, 1}, {2145, 1, 429, 33}, 0, 0, T},
    {"nchw->nhwc N3 C31 H1 W31", 4, {3, 31, 1, 31}, {961, 1, 961, 31}, {961, 31, 31, 1}, 0, 0, T},
    {"nchw->nhwc whole tiles", 4, {1, 64, 8, 8}, {4096, 1, 512, 64}, {4096, 64, 8, 1}, 0, 0, T},
    {"nhwc->nchw C128", 4, {2, 128, 8, 12}, {12288, 96, 12, 1}, {12288, 1, 1536, 128}, 0, 0, T},
    {"nchw->nhwc C1 (same order)", 4, {2, 1, 5, 7}, {35, 1, 7, 1}, {35, 35, 7, 1}, 0, 0, V},
    {"nchw->nhwc HW1 (same order)", 4, {4, 37, 1, 1}, {37, 1, 37, 37}, {37, 1, 1, 1}, 0, 0, V},
    {"nchw->nhwc src off 1", 4, {2, 40, 6, 6}, {1440, 1, 240, 40}, {1440, 36, 6, 1}, 0, 1, T},
    {"nhwc->nchw dst off 1", 4, {2, 40, 6, 6}, {1440, 36, 6, 1}, {1440, 1, 240, 40}, 1, 0, T},
    {"padded nchw->nhwc (4-d plan)", 4, {2, 8, 5, 6}, {240, 1, 48, 8}, {280, 35, 7, 1}, 0, 0, T},
    {"contiguous, several blocks and a tail", 1, {10003}, {1}, {1}, 0, 0, V},
    {"strided src", 1, {777}, {1}, {3}, 0, 0, C},
    {"gaps in both", 2, {19, 23}, {60, 2}, {1, 25}, 0, 0, C},
    {"broadcast row (stride 0)", 2, {31, 40}, {40, 1}, {0, 1}, 0, 0, C},
    {"broadcast column (stride 0) into a transpose", 2, {31, 40}, {40, 1}, {1, 0}, 0, 0, T},
    {"broadcast scalar", 1, {1000}, {1}, {0}, 0, 0, C},
    {"expanded middle dim", 3, {4, 5, 6}, {30, 6, 1}, {6, 0, 1}, 0, 0, C},
    {"storage offsets and strides", 2, {13, 17}, {17, 1}, {40, 2}, 5, 7, C},
    {"permuted 3-d", 3, {7, 9, 11}, {99, 11, 1}, {1, 7, 63}, 0, 0, C},
    {"permuted 6-d", 6, {2, 3, 2, 3, 2, 3}, {108, 36, 18, 6, 3, 1}, {1, 2, 6, 12, 36, 72}, 0, 0, C},
    {"one element (0-d)", 0, {0}, {0}, {0}, 3, 1, C},
    {"empty", 2, {0, 5}, {5, 1}, {5, 1}, 0, 0, -1},
};
#define NUM_LAYOUTS ((int)(sizeof layouts / sizeof layouts[0]))

static uint64_t seed_of(int layout, int dt, int st, unsigned flags)
{
  return ((uint64_t)layout << 24) ^ ((uint64_t)dt << 16) ^ ((uint64_t)st << 8) ^ flags;
}

/* Every pair over one layout; every mismatch is reported, then the test fails. */
static void every_pair(int li, unsigned flags)
{
  int failures = 0;
  char msg[512];
  for (int dt = 0; dt < TPORT_NUM_DTYPES; dt++)
    for (int st = 0; st < TPORT_NUM_DTYPES; st++)
      if (!emu_check_copy(&layouts[li], (tport_dtype)dt, (tport_dtype)st, flags, false,
                          seed_of(li, dt, st, flags), msg, sizeof msg) &&
          failures++ < 12)
        cr_log_error("%s", msg);
  cr_assert_eq(failures, 0, "%s, flags %u: %d of 144 pairs differ (the first above)",
               layouts[li].name, flags, failures);
}

ParameterizedTestParameters(emu_copy, every_pair_matches_the_cpu)
{
  static int idx[NUM_LAYOUTS];
  for (int i = 0; i < NUM_LAYOUTS; i++)
    idx[i] = i;
  return cr_make_param_array(int, idx, NUM_LAYOUTS);
}

ParameterizedTest(int *li, emu_copy, every_pair_matches_the_cpu, .timeout = 300)
{
  every_pair(*li, 0);
}

/* conj, neg and both, on one layout of each kernel (and the broadcast
 * transpose); conj means something for complex dst only, neg for all but bool. */
Test(emu_copy, conj_and_neg_match_the_cpu, .timeout = 300)
{
  static const char *const names[] = {"contiguous, vector tail of 3",
                                      "transposed src, edge tiles",
                                      "nhwc->nchw dst off 1",
                                      "nchw->nhwc C65 HW33",
                                      "strided src",
                                      "broadcast column (stride 0) into a transpose",
                                      "dst one element off"};
  for (size_t n = 0; n < sizeof names / sizeof names[0]; n++)
    for (int li = 0; li < NUM_LAYOUTS; li++)
      if (!strcmp(layouts[li].name, names[n]))
        for (unsigned flags = CPU_COPY_CONJ; flags <= (CPU_COPY_CONJ | CPU_COPY_NEG); flags++)
          every_pair(li, flags);
}

/* dst == src: each element read, converted (a bit move), post-processed and
 * written by one thread, once.  Negating in place twice would give the input
 * back, so a kernel that visits an element twice fails here. */
Test(emu_copy, in_place_matches_the_cpu, .timeout = 300)
{
  static const emu_layout in_place[] = {
      {"in place, contiguous", 1, {1003}, {1}, {1}, 0, 0, V},
      {"in place, one element off", 1, {1001}, {1}, {1}, 1, 1, C},
      {"in place, strided", 2, {19, 23}, {60, 2}, {60, 2}, 3, 3, C},
  };
  int failures = 0;
  char msg[512];
  for (size_t li = 0; li < sizeof in_place / sizeof in_place[0]; li++)
    for (int dt = 0; dt < TPORT_NUM_DTYPES; dt++)
      for (unsigned flags = 0; flags <= (CPU_COPY_CONJ | CPU_COPY_NEG); flags++)
        if (!emu_check_copy(&in_place[li], (tport_dtype)dt, (tport_dtype)dt, flags, true,
                            seed_of((int)li + 100, dt, dt, flags), msg, sizeof msg) &&
            failures++ < 12)
          cr_log_error("%s", msg);
  cr_assert_eq(failures, 0, "%d in-place copies differ (the first above)", failures);
}

/* A device with a grid of at most 2 x 2 x 2 blocks: every loop of every
 * kernel strides over its grid many times (cast_vec's and copy's over x, the
 * transpose's over z). */
Test(emu_copy, grid_stride_loops_match_the_cpu, .timeout = 300)
{
  emu_device d;
  emu_device_get(&d);
  d.max_grid[0] = d.max_grid[1] = d.max_grid[2] = 2;
  emu_device_set(&d);
  cuda_jit_reset(); /* forget the limits read before */
  static const emu_layout small_grid[] = {
      {"2 blocks, contiguous", 1, {5003}, {1}, {1}, 0, 0, V},
      {"2 blocks, contiguous, 3 steps of the loop", 1, {20003}, {1}, {1}, 0, 0, V},
      {"2 blocks, misaligned", 1, {5003}, {1}, {1}, 1, 0, C},
      {"2 blocks, strided 3-d", 3, {9, 20, 30}, {600, 30, 1}, {1, 9, 180}, 0, 0, C},
      {"2 x 2 x 2 blocks, batched transpose",
       3,
       {9, 40, 50},
       {2000, 50, 1},
       {2000, 1, 40},
       0,
       0,
       T},
      /* 2 x 2 tiles of 64 x 64 where the source has at most 4 bytes (else
       * 4 x 4 of 32 x 32: more than the grid, so the generic copy) */
      {"2 x 2 x 2 blocks, batched transpose of 64 x 64 tiles",
       3,
       {5, 100, 120},
       {12000, 120, 1},
       {12000, 1, 100},
       0,
       0,
       -1},
  };
  int failures = 0;
  char msg[512];
  for (size_t li = 0; li < sizeof small_grid / sizeof small_grid[0]; li++)
    for (int dt = 0; dt < TPORT_NUM_DTYPES; dt++)
      for (int st = 0; st < TPORT_NUM_DTYPES; st++)
        if (!emu_check_copy(&small_grid[li], (tport_dtype)dt, (tport_dtype)st, CPU_COPY_NEG, false,
                            seed_of((int)li + 200, dt, st, 2), msg, sizeof msg) &&
            failures++ < 12)
          cr_log_error("%s", msg);
  emu_cudart_stats st;
  emu_cudart_get_stats(&st);
  cr_expect(st.grid[0] <= 2 && st.grid[1] <= 2 && st.grid[2] <= 2, "grid (%u,%u,%u)", st.grid[0],
            st.grid[1], st.grid[2]);
  cr_assert_eq(failures, 0, "%d copies differ (the first above)", failures);
}

static const char *kernel_name_of(int k)
{
  return k == V ? "tport_cast_vec" : k == T ? "tport_transpose" : "tport_copy";
}

/* complex -> bool against the values PyTorch 2.x gives (not against the CPU
 * kernels, which could share a mistake): true when either part is nonzero,
 * NaN included; conj and neg flags change nothing.  PyTorch 1.13 read the
 * real part alone, and so did copy.cu: 0+1j was false.  Each kernel. */
Test(emu_copy, complex_to_bool_looks_at_both_parts, .timeout = 300)
{
  static const double in[][2] = {{0, 1},  {0, 0},   {1, 0},   {-0.0, 0},
                                 {0, -2}, {NAN, 0}, {0, NAN}, {-0.0, -0.0}};
  static const uint8_t want[] = {1, 0, 1, 0, 1, 1, 1, 0};
  enum { K = sizeof want };
  static const emu_layout bool_layouts[] = {
      {"contiguous, vector tail of 3", 1, {1003}, {1}, {1}, 0, 0, V},
      {"3 elements (under one vector)", 1, {3}, {1}, {1}, 0, 0, C},
      {"strided src", 1, {777}, {1}, {3}, 0, 0, C},
      {"transposed src, edge tiles", 2, {45, 37}, {37, 1}, {1, 45}, 0, 0, T},
  };
  for (int wide = 0; wide < 2; wide++) {
    const tport_dtype st = wide ? TPORT_COMPLEX128 : TPORT_COMPLEX64;
    const size_t ss = tport_dtype_size(st);
    for (size_t li = 0; li < sizeof bool_layouts / sizeof bool_layouts[0]; li++) {
      const emu_layout *l = &bool_layouts[li];
      const int64_t n0 = l->shape[0], n1 = l->ndim > 1 ? l->shape[1] : 1;
      const int64_t sst0 = l->src_stride[0], sst1 = l->ndim > 1 ? l->src_stride[1] : 0;
      const int64_t dst0 = l->dst_stride[0], dst1 = l->ndim > 1 ? l->dst_stride[1] : 0;
      const int64_t sn = (n0 - 1) * sst0 + (n1 - 1) * sst1 + 1, dn = n0 * n1;
      char *src = NULL, *dst = NULL;
      cr_assert_eq(posix_memalign((void **)&src, 64, (size_t)sn * ss), 0);
      cr_assert_eq(posix_memalign((void **)&dst, 64, (size_t)dn), 0);
      for (int64_t j = 0; j < sn; j++) /* source element j holds in[j % K] */
        if (wide)
          memcpy(src + j * 16, in[j % K], 16);
        else {
          const float f[2] = {(float)in[j % K][0], (float)in[j % K][1]};
          memcpy(src + j * 8, f, 8);
        }
      int64_t dstr[2] = {dst0, dst1}, sstr[2] = {sst0 * (int64_t)ss, sst1 * (int64_t)ss};
      plan p;
      plan_build(&p, l->ndim, l->shape, 2, (const int64_t *const[]){dstr, sstr});
      for (unsigned flags = 0; flags <= (CPU_COPY_CONJ | CPU_COPY_NEG); flags++) {
        memset(dst, 0x55, (size_t)dn);
        tport_err err = {0};
        cr_assert_eq(cuda_jit_copy(0, NULL, &p, dst, TPORT_BOOL, src, st, flags, &err), 0,
                     "%s: %s (%s)", l->name, err.msg, emu_cudart_last_message());
        cr_assert_str_eq(emu_last_kernel(), kernel_name_of(l->expect), "%s", l->name);
        for (int64_t i = 0; i < n0; i++)
          for (int64_t k = 0; k < n1; k++) {
            const int64_t j = i * sst0 + k * sst1;
            const uint8_t got = (uint8_t)dst[i * dst0 + k * dst1];
            cr_assert_eq(got, want[j % K],
                         "%s, bool <- %s, flags %u: (%lld, %lld) from (%g, %g): "
                         "%u, want %u",
                         l->name, emu_dtype_name[st], flags, (long long)i, (long long)k,
                         in[j % K][0], in[j % K][1], got, want[j % K]);
          }
      }
      free(src);
      free(dst);
    }
  }
}
