/* test_emu_edge.c: the index width.  The 32-bit index must be used only
 * where the whole grid-stride loop fits it (issue 13: beyond about 3.76 G
 * elements the old rule let i += stride wrap).  Checked here at scale 1/65536:
 * cuda_jit_plan_launch with a 16-bit narrow index and a grid of 3 or 4
 * blocks, the unsigned short variants of copy.cu run at the edge, in place
 * (a visit twice negates twice).  Then the 64-bit variants: through
 * cuda_jit_copy on layouts whose byte span passes 4 GiB (stride tricks over
 * a reservation of which only the touched pages exist), and directly on
 * ordinary layouts for every pair. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "emu_check.h"

#define V CUDA_JIT_CAST_VEC
#define T CUDA_JIT_TRANSPOSE
#define C CUDA_JIT_COPY

static cuda_jit_limits narrow16(unsigned blocks)
{
  return (cuda_jit_limits){.max_grid = {blocks, 65535, 65535}, .narrow_bits = 16};
}

static emu_layout one_d(const char *name, int64_t n, int64_t offset, int expect)
{
  return (emu_layout){name, 1, {n}, {1}, {1}, offset, offset, expect};
}

/* Runs l as planned, and says whether the planner chose the narrow index. */
static bool narrow_and_right(const emu_layout *l, tport_dtype dt, tport_dtype st, bool in_place,
                             unsigned blocks)
{
  cuda_jit_limits lim = narrow16(blocks);
  char msg[512];
  bool wide = true;
  cr_assert(emu_check_direct(l, dt, st, CPU_COPY_NEG, in_place, 7, &lim, 0, &wide, msg, sizeof msg),
            "%s", msg);
  return !wide;
}

/* With 3 blocks of 256 threads the copy's index reaches numel - 1 + 768:
 * 16 bits hold it up to numel 64768 (cast_vec's 3 blocks of 128: 65152).
 * With 1-byte elements the byte offsets are the element indices, so the
 * loop is what meets the edge. */
Test(emu_edge, the_narrow_index_is_used_exactly_while_the_loop_fits, .timeout = 300)
{
  const int64_t edge = 65536 - 3 * 256;
  emu_layout l = one_d("copy, in place, at the edge", edge, 1, C);
  cr_assert(narrow_and_right(&l, TPORT_INT8, TPORT_INT8, true, 3), "%s: planned wide", l.name);
  l = one_d("copy, in place, past the edge", edge + 1, 1, C);
  cr_assert_not(narrow_and_right(&l, TPORT_INT8, TPORT_INT8, true, 3), "%s: planned narrow",
                l.name);
  const int64_t vec_edge = 65536 - 3 * 128;
  l = one_d("cast_vec, in place, at the edge", vec_edge, 0, V);
  cr_assert(narrow_and_right(&l, TPORT_INT8, TPORT_INT8, true, 3), "%s: planned wide", l.name);
  l = one_d("cast_vec, in place, past the edge", vec_edge + 1, 0, V);
  cr_assert_not(narrow_and_right(&l, TPORT_INT8, TPORT_INT8, true, 3), "%s: planned narrow",
                l.name);
  /* uint8 <- int64: the source's byte offsets (8 per element) meet the edge first */
  l = one_d("copy, uint8 <- int64, at the byte edge", 8192, 1, C);
  cr_assert(narrow_and_right(&l, TPORT_UINT8, TPORT_INT64, false, 3), "%s", l.name);
  l = one_d("copy, uint8 <- int64, past the byte edge", 8193, 1, C);
  cr_assert_not(narrow_and_right(&l, TPORT_UINT8, TPORT_INT64, false, 3), "%s", l.name);
  /* a cast, complex negation, float16 rounding, across the edge of their bytes */
  l = one_d("cast_vec, complex64 in place", 8192, 0, V);
  cr_assert(narrow_and_right(&l, TPORT_COMPLEX64, TPORT_COMPLEX64, true, 3), "%s", l.name);
  l = one_d("cast_vec, complex64 in place", 8193, 0, V);
  cr_assert_not(narrow_and_right(&l, TPORT_COMPLEX64, TPORT_COMPLEX64, true, 3), "%s", l.name);
  l = one_d("cast_vec, float16 <- float32", 16384, 0, V);
  cr_assert(narrow_and_right(&l, TPORT_FLOAT16, TPORT_FLOAT32, false, 3), "%s", l.name);
  l = one_d("copy, int8 <- float64", 8192, 1, C);
  cr_assert(narrow_and_right(&l, TPORT_INT8, TPORT_FLOAT64, false, 3), "%s", l.name);
  l = one_d("copy, float32 in place", 16384, 1, C);
  cr_assert(narrow_and_right(&l, TPORT_FLOAT32, TPORT_FLOAT32, true, 3), "%s", l.name);
  l = one_d("copy, float32 in place", 16385, 1, C);
  cr_assert_not(narrow_and_right(&l, TPORT_FLOAT32, TPORT_FLOAT32, true, 3), "%s", l.name);
}

/* The transpose, 2 x 2 tiles of 64 x 64 (blocks of 16 x 32 threads) by z
 * outer slices: 2048 threads per slice, 9216 elements; the narrow index
 * while numel - 1 + threads fits (5 slices: 46080 - 1 + 10240 = 56319;
 * 6 slices: 55296 - 1 + 12288 = 67583). */
Test(emu_edge, the_transpose_takes_the_narrow_index_by_the_same_rule, .timeout = 300)
{
  emu_layout l = {
      "batched transpose, 5 slices", 3, {5, 96, 96}, {9216, 96, 1}, {9216, 1, 96}, 0, 0, T};
  cr_assert(narrow_and_right(&l, TPORT_INT8, TPORT_INT8, false, 3), "%s: planned wide", l.name);
  l.name = "batched transpose, 6 slices";
  l.shape[0] = 6;
  cr_assert_not(narrow_and_right(&l, TPORT_INT8, TPORT_INT8, false, 3), "%s", l.name);
}

/* cast_vec at the edge of its own loop: a thread moves one vector per step of
 * the grid's threads, so its vector index reaches nvec - 1 + threads, never
 * past numel - 1 + threads, the bound the planner holds it to. */
Test(emu_edge, cast_vec_plans_the_reach_of_its_vector_loop, .timeout = 300)
{
  emu_layout l = one_d("cast_vec, 1 block, in place", 4000, 0, V);
  cr_assert(narrow_and_right(&l, TPORT_FLOAT32, TPORT_FLOAT32, true, 1), "%s: planned wide",
            l.name);
  /* at 10 bits (no variant has them; the planner's rule alone), one block
   * of 128 threads: 700 elements reach 699 + 128, which fits; 1000 reach
   * 999 + 128, which does not, and fit 11 bits */
  const cuda_jit_limits lim = {.max_grid = {1, 1, 1}, .narrow_bits = 10};
  static _Alignas(64) char buf[64];
  int64_t shape[1] = {700}, st[1] = {1};
  plan p;
  plan_build(&p, 1, shape, 2, (const int64_t *const[]){st, st});
  cuda_jit_launch L;
  cr_assert_eq(cuda_jit_plan_launch(&p, TPORT_UINT8, buf, TPORT_UINT8, buf, &lim, &L), 0);
  cr_assert_eq(L.kernel, V);
  cr_assert_eq(L.grid[0] * L.block[0], 128);
  cr_assert_not(L.wide, "699 + 128 fits 10 bits");
  shape[0] = 1000;
  plan_build(&p, 1, shape, 2, (const int64_t *const[]){st, st});
  cr_assert_eq(cuda_jit_plan_launch(&p, TPORT_UINT8, buf, TPORT_UINT8, buf, &lim, &L), 0);
  cr_assert_eq(L.kernel, V);
  cr_assert(L.wide, "999 + 128 passes 10 bits");
  const cuda_jit_limits lim11 = {.max_grid = {1, 1, 1}, .narrow_bits = 11};
  cr_assert_eq(cuda_jit_plan_launch(&p, TPORT_UINT8, buf, TPORT_UINT8, buf, &lim11, &L), 0);
  cr_assert_not(L.wide, "999 + 128 fits 11 bits");
}

/* The emulation sees the bug the rule prevents: one element past the edge,
 * the 16-bit loop of thread 256 wraps to 0 and negates 85 elements twice. */
Test(emu_edge, past_the_edge_the_narrow_index_wraps, .timeout = 300)
{
  emu_set_watchdog(5); /* should copy.cu's loop change so that this hangs instead */
  emu_layout l = one_d("copy, in place, past the edge, forced narrow", 65536 - 768 + 1, 1, C);
  cuda_jit_limits lim = narrow16(3);
  char msg[512];
  bool agrees = emu_check_direct(&l, TPORT_INT8, TPORT_INT8, CPU_COPY_NEG, true, 7, &lim, 16, NULL,
                                 msg, sizeof msg);
  cr_assert_not(agrees, "the wrapped loop gave the right values");
  cr_assert(strstr(msg, "dst element"), "failed otherwise than by its values: %s", msg);
}

/* ... and where the stride divides 2^16 (4 blocks: 1024 threads) thread 0
 * never leaves its loop: the watchdog ends the launch rather than the
 * test's timeout, and says which kernel did not finish. */
Test(emu_edge, a_loop_that_never_ends_is_stopped_by_the_watchdog, .signal = SIGABRT, .timeout = 60)
{
  emu_set_watchdog(1);
  emu_layout l = one_d("copy, in place, forced narrow, hangs", 65536 - 1024 + 1, 1, C);
  cuda_jit_limits lim = narrow16(4);
  char msg[512];
  emu_check_direct(&l, TPORT_INT8, TPORT_INT8, CPU_COPY_NEG, true, 7, &lim, 16, NULL, msg,
                   sizeof msg);
}

/* The same rule at the real width: with a device's 65535 x 32 blocks of 256
 * threads, 1-byte elements, 32 bits hold the loop up to 2^32 - 536862720
 * elements (about 3.76 G), not 2^32 - 1.  The planner reads the pointers for
 * alignment only, so no memory is needed. */
Test(emu_edge, the_real_edge_is_planned_from_the_grid_too)
{
  const cuda_jit_limits lim = {.max_grid = {65535 * 32, 65535, 65535}, .narrow_bits = 32};
  const int64_t threads = 65535LL * 32 * 256, edge = (1LL << 32) - threads;
  static _Alignas(64) char buf[64];
  for (int64_t n = edge - 1; n <= edge + 1; n++)
    for (int64_t off = 0; off < 2; off++) {
      int64_t shape[1] = {n}, st[1] = {1};
      plan p;
      plan_build(&p, 1, shape, 2, (const int64_t *const[]){st, st});
      cuda_jit_launch L;
      cr_assert_eq(
          cuda_jit_plan_launch(&p, TPORT_UINT8, buf + off, TPORT_INT8, buf + off, &lim, &L), 0);
      cr_assert_eq(L.kernel, off ? C : V);
      if (off) {
        cr_assert_eq(L.wide, n > edge, "numel %lld, offset %lld: wide %d", (long long)n,
                     (long long)off, L.wide);
      } else {
        /* cast_vec's grid: a block per 128 vectors of 8, capped at 65535 x
         * 32 blocks (a quarter of the copy's threads), so its loop fits:
         * narrow */
        const uint64_t t = (uint64_t)L.grid[0] * L.block[0];
        uint64_t blocks = ((uint64_t)n / 8 + 127) / 128;
        blocks = blocks < 65535u * 32 ? blocks : 65535u * 32;
        cr_assert_eq(t, blocks * 128, "numel %lld", (long long)n);
        cr_assert_not(L.wide, "numel %lld: %llu threads", (long long)n, (unsigned long long)t);
      }
    }
}

/* ---- the 64-bit index through cuda_jit_copy: byte spans past 4 GiB */

#define GIB2 (1LL << 31)
#define WINDOWS 5
#define PAGE 4096

/* A reservation of 8 GiB + a little, of which only WINDOWS windows of three
 * pages at k * 2 GiB exist: src at +0, the cpu's dst at +PAGE, the emulated
 * dst at +2 * PAGE.  Any other access faults. */
static char *reservation(void)
{
  static char *base;
  if (base)
    return base;
  void *m = mmap(NULL, (size_t)(4 * GIB2) + (size_t)(16 * PAGE), PROT_NONE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  cr_assert_neq(m, MAP_FAILED, "cannot reserve 8 GiB of address space");
  base = m;
  for (int k = 0; k < WINDOWS; k++)
    cr_assert_eq(mprotect(base + k * GIB2, 3 * PAGE, PROT_READ | PROT_WRITE), 0);
  return base;
}

typedef struct huge_layout {
  const char *name;
  int64_t shape[2];
  int64_t dst_stride[2], src_stride[2]; /* bytes; -1: the element size */
  int expect;
} huge_layout;

static int64_t bytes(int64_t s, size_t es)
{
  return s == -1 ? (int64_t)es : s == -5 ? 5 * (int64_t)es : s;
}

Test(emu_edge, byte_spans_past_4_gib_take_the_64_bit_index_for_every_pair, .timeout = 300)
{
  static const huge_layout layouts[] = {
      {"src rows 2 GiB apart", {3, 5}, {-5, -1}, {GIB2, -1}, C},
      {"dst rows 2 GiB apart", {3, 5}, {GIB2, -1}, {-5, -1}, C},
      {"transpose, src columns 2 GiB apart", {6, 5}, {-5, -1}, {-1, GIB2}, T},
  };
  char *base = reservation();
  int failures = 0;
  for (size_t li = 0; li < sizeof layouts / sizeof layouts[0]; li++)
    for (int dt = 0; dt < TPORT_NUM_DTYPES; dt++)
      for (int st = 0; st < TPORT_NUM_DTYPES; st++) {
        const huge_layout *h = &layouts[li];
        const size_t ds = tport_dtype_size(dt), ss = tport_dtype_size(st);
        for (int k = 0; k < WINDOWS; k++) {
          char *w = base + k * GIB2;
          emu_fill(w, PAGE / ss, (tport_dtype)st, (uint64_t)(li * 1000 + (size_t)k));
          emu_fill(w + PAGE, PAGE / ds, (tport_dtype)dt, (uint64_t)(dt * 12 + st));
          memcpy(w + 2 * PAGE, w + PAGE, PAGE);
        }
        int64_t dstr[2] = {bytes(h->dst_stride[0], ds), bytes(h->dst_stride[1], ds)};
        int64_t sstr[2] = {bytes(h->src_stride[0], ss), bytes(h->src_stride[1], ss)};
        plan p;
        plan_build(&p, 2, h->shape, 2, (const int64_t *const[]){dstr, sstr});
        cpu_copy(&p, base + PAGE, (tport_dtype)dt, base, (tport_dtype)st, CPU_COPY_NEG);
        tport_err err = {0};
        int rc = cuda_jit_copy(0, NULL, &p, base + 2 * PAGE, (tport_dtype)dt, base, (tport_dtype)st,
                               CPU_COPY_NEG, &err);
        emu_cudart_stats rs;
        emu_cudart_get_stats(&rs);
        bool same = !rc;
        for (int k = 0; k < WINDOWS && same; k++)
          same = !memcmp(base + k * GIB2 + PAGE, base + k * GIB2 + 2 * PAGE, PAGE);
        static const char *const names[] = {"tport_copy", "tport_transpose", "tport_cast_vec"};
        if ((!same || rs.idx_bits != 64 || strcmp(rs.kernel, names[h->expect])) && failures++ < 12)
          cr_log_error("%s, %s <- %s: %s; ran %s with a %d-bit index", h->name, emu_dtype_name[dt],
                       emu_dtype_name[st],
                       rc     ? err.msg
                       : same ? "values agree"
                              : "values differ",
                       rs.kernel, rs.idx_bits);
      }
  cr_assert_eq(failures, 0, "%d wide copies went wrong (the first above)", failures);
}

/* ---- the 64-bit variants of all three kernels on ordinary layouts */

Test(emu_edge, the_64_bit_variants_match_the_cpu_for_every_pair, .timeout = 300)
{
  static const emu_layout layouts[] = {
      {"wide, contiguous, vector tail", 1, {1003}, {1}, {1}, 0, 0, V},
      {"wide, transposed src, edge tiles", 2, {45, 37}, {37, 1}, {1, 45}, 0, 0, T},
      {"wide, broadcast and strided", 3, {4, 5, 6}, {30, 6, 1}, {12, 0, 2}, 0, 1, C},
  };
  const cuda_jit_limits lim = {.max_grid = {65535 * 32, 65535, 65535}, .narrow_bits = 32};
  int failures = 0;
  char msg[512];
  for (size_t li = 0; li < sizeof layouts / sizeof layouts[0]; li++)
    for (int dt = 0; dt < TPORT_NUM_DTYPES; dt++)
      for (int st = 0; st < TPORT_NUM_DTYPES; st++)
        for (unsigned flags = 0; flags <= CPU_COPY_NEG; flags += CPU_COPY_NEG)
          if (!emu_check_direct(&layouts[li], (tport_dtype)dt, (tport_dtype)st,
                                flags | CPU_COPY_CONJ * (flags != 0), false,
                                (uint64_t)(li << 8 | (size_t)dt << 4 | (size_t)st), &lim, 64, NULL,
                                msg, sizeof msg) &&
              failures++ < 12)
            cr_log_error("%s", msg);
  cr_assert_eq(failures, 0, "%d differ (the first above)", failures);
}
