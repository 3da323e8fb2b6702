/* test_transpose.c: the tiled transpose (kernels/cpu/transpose.c) with the
 * vector block kernels of transpose_simd.c against its plain loop, bit for
 * bit, at every level this CPU has: element sizes 1/2/4/8/16, edges that are
 * not multiples of the units or the blocks, pointers off every alignment,
 * padded rows, strided and broadcast outer dims, the non-temporal path of
 * large copies, the converting path with negation and conjugation, and the
 * TPORT_NO_SIMD switch.  The plain loop itself is checked against an
 * element-by-element reference. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"

static unsigned rng = 2024;
static int rnd(int n)
{
  return (int)(rand_r(&rng) % (unsigned)n);
}

/* Plan dims: 0 is dst's dense dim, 1 src's dense dim, 2.. outer.  Strides
 * in elements. */
typedef struct {
  int ndim;
  int64_t shape[5];
  int64_t dst_st[5], src_st[5];
  int64_t doff, soff; /* elements from the allocation's (64-byte aligned) start */
  int dmis, smis;     /* and bytes more: 0, or off the element's alignment */
} tcase;

static const tport_dtype of_size[17] = {[1] = TPORT_UINT8,
                                        [2] = TPORT_BFLOAT16,
                                        [4] = TPORT_FLOAT32,
                                        [8] = TPORT_FLOAT64,
                                        [16] = TPORT_COMPLEX128};

static int64_t span(const tcase *c, const int64_t *st)
{
  int64_t s = 1;
  for (int d = 0; d < c->ndim; d++)
    s += (c->shape[d] - 1) * st[d];
  return s;
}

static void fill(char *p, size_t n)
{
  for (size_t i = 0; i < n; i++)
    p[i] = (char)rnd(256);
}

static plan plan_of(const tcase *c, size_t de, size_t se)
{
  plan p = {.ndim = c->ndim, .nops = 2};
  for (int d = 0; d < c->ndim; d++) {
    p.shape[d] = c->shape[d];
    p.strides[0][d] = c->dst_st[d] * (int64_t)de;
    p.strides[1][d] = c->src_st[d] * (int64_t)se;
  }
  return p;
}

/* The copy at `level` into a fresh buffer (the bytes around the view random,
 * the same for every level since they come from `init`). */
static char *copy_at(const tcase *c, int level, tport_dtype dt, const char *src, tport_dtype st,
                     unsigned flags, const char *init, size_t dbytes)
{
  char *dst = aligned_alloc(64, (dbytes + 63) / 64 * 64);
  memcpy(dst, init, dbytes);
  cr_assert_eq(cpu_transpose_set_simd(level), level);
  plan p = plan_of(c, tport_dtype_size(dt), tport_dtype_size(st));
  cpu_copy_path path =
      cpu_copy(&p, dst + c->dmis + c->doff * (int64_t)tport_dtype_size(dt), dt,
               src + c->smis + c->soff * (int64_t)tport_dtype_size(st), st, flags);
  cr_assert_eq(path, CPU_PATH_TRANSPOSE, "n0 %ld n1 %ld", (long)c->shape[0], (long)c->shape[1]);
  return dst;
}

/* Element by element, with the pair's cast and the post ops. */
static void reference(const tcase *c, char *dst, tport_dtype dt, const char *src, tport_dtype st,
                      unsigned flags)
{
  size_t de = tport_dtype_size(dt), se = tport_dtype_size(st);
  cast_loop_fn cast = cpu_cast_loop(dt, st);
  int64_t numel = 1;
  for (int d = 0; d < c->ndim; d++)
    numel *= c->shape[d];
  for (int64_t lin = 0; lin < numel; lin++) {
    int64_t rem = lin, doff = c->doff, soff = c->soff;
    for (int d = 0; d < c->ndim; d++) {
      int64_t i = rem % c->shape[d];
      rem /= c->shape[d];
      doff += i * c->dst_st[d];
      soff += i * c->src_st[d];
    }
    char *e = dst + c->dmis + doff * (int64_t)de;
    cast(e, src + c->smis + soff * (int64_t)se, 1, 0, 0);
    if ((flags & CPU_COPY_CONJ) && cpu_conj_loop(dt))
      cpu_conj_loop(dt)(e, 1, 0);
    if ((flags & CPU_COPY_NEG) && cpu_neg_loop(dt))
      cpu_neg_loop(dt)(e, 1, 0);
  }
}

/* Runs c at every level from the plain loop up to the best this CPU has and
 * checks that all give the same bytes, the reference's. */
static void check(const tcase *c, tport_dtype dt, tport_dtype st, unsigned flags)
{
  size_t de = tport_dtype_size(dt), se = tport_dtype_size(st);
  size_t dbytes = (size_t)(span(c, c->dst_st) + c->doff) * de + (size_t)c->dmis;
  size_t sbytes = (size_t)(span(c, c->src_st) + c->soff) * se + (size_t)c->smis;
  char *src = aligned_alloc(64, (sbytes + 63) / 64 * 64), *init = malloc(dbytes);
  fill(src, sbytes);
  fill(init, dbytes);
  char *want = malloc(dbytes);
  memcpy(want, init, dbytes);
  reference(c, want, dt, src, st, flags);
  int best = cpu_transpose_set_simd(-1);
  for (int level = 0; level <= best; level++) {
    char *got = copy_at(c, level, dt, src, st, flags, init, dbytes);
    cr_assert(memcmp(got, want, dbytes) == 0,
              "level %d: dtype %d <- %d, flags %u, n0 %ld n1 %ld, ndim %d, offsets %ld %ld", level,
              dt, st, flags, (long)c->shape[0], (long)c->shape[1], c->ndim, (long)c->doff,
              (long)c->soff);
    free(got);
  }
  cpu_transpose_set_simd(-1);
  free(src);
  free(init);
  free(want);
}

/* Sides around the unit (8, 16) and block (32 to 256) boundaries. */
static const int64_t sides[] = {4,  5,  7,  8,  9,  15,  16,  17,  24,  31,  32,  33,
                                47, 63, 64, 65, 96, 127, 128, 129, 130, 200, 257, 300};

/* A random case: padded rows (ds1 > n0, ss0 > n1), outer dims dense in some
 * order for dst and any stride (0 too: broadcast) for src. */
static tcase random_case(int64_t max_elems)
{
  tcase c;
  for (;;) {
    c.ndim = 2 + rnd(3);
    c.shape[0] = sides[rnd((int)(sizeof sides / sizeof *sides))];
    c.shape[1] = sides[rnd((int)(sizeof sides / sizeof *sides))];
    int64_t numel = c.shape[0] * c.shape[1];
    for (int d = 2; d < c.ndim; d++)
      numel *= c.shape[d] = 1 + rnd(3);
    if (numel <= max_elems)
      break;
  }
  c.dst_st[0] = 1;
  c.dst_st[1] = c.shape[0] + (rnd(3) == 0 ? rnd(20) : 0);
  c.src_st[1] = 1;
  c.src_st[0] = c.shape[1] + (rnd(3) == 0 ? rnd(20) : 0);
  int64_t dext = c.dst_st[1] * c.shape[1];
  int64_t sext = c.src_st[0] * c.shape[0];
  for (int d = 2; d < c.ndim; d++) {
    c.dst_st[d] = dext + (rnd(3) == 0 ? rnd(9) : 0);
    dext = c.dst_st[d] * c.shape[d];
    int k = rnd(4);
    c.src_st[d] = k == 0 ? 0 : k == 1 ? sext + rnd(7) : sext;
    sext = (c.src_st[d] ? c.src_st[d] : sext) * c.shape[d];
  }
  c.doff = rnd(4) == 0 ? 0 : rnd(17);
  c.soff = rnd(4) == 0 ? 0 : rnd(17);
  c.dmis = c.smis = 0;
  return c;
}

Test(transpose, detects_this_cpu)
{
  const char *e = getenv("TPORT_NO_SIMD");
  if (e && *e && *e != '0')
    cr_skip_test("TPORT_NO_SIMD is set");
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  int want = __builtin_cpu_supports("avx512f") ? 2 : __builtin_cpu_supports("avx2") ? 1 : 0;
#else
  int want = 0;
#endif
  cr_assert_eq(cpu_transpose_set_simd(-1), want);
  cr_assert_eq(cpu_transpose_set_simd(7), want); /* capped */
  cr_assert_eq(cpu_transpose_set_simd(0), 0);
}

Test(transpose, no_simd_switch)
{
  /* Criterion runs each test in a fresh process: the level is not yet cached. */
  setenv("TPORT_NO_SIMD", "1", 1);
  cr_assert_eq(cpu_transpose_set_simd(-1), 0);
  cr_assert_eq(cpu_transpose_set_simd(2), 0);
  tcase c = {
      .ndim = 3, .shape = {64, 40, 3}, .dst_st = {1, 64, 64 * 40}, .src_st = {40, 1, 64 * 40}};
  check(&c, TPORT_FLOAT32, TPORT_FLOAT32, 0);
}

Test(transpose, bit_copies_every_size)
{
  const size_t sizes[] = {1, 2, 4, 8, 16};
  for (int s = 0; s < 5; s++) {
    tport_dtype t = of_size[sizes[s]];
    for (int iter = 0; iter < 60; iter++) {
      tcase c = random_case(sizes[s] == 16 ? 60000 : 150000);
      check(&c, t, t, 0);
    }
  }
}

/* Pointers off their element's alignment, either side: a put converts
 * straight from the received message (its payload starts wherever the
 * frame's header ends), a get writes into a region at the client's offset.
 * Under UBSan the typed moves of the plain loop and the SIMD edges were
 * undefined behaviour there. */
Test(transpose, bit_copies_at_unaligned_addresses)
{
  const size_t sizes[] = {2, 4, 8, 16};
  for (int s = 0; s < 4; s++) {
    tport_dtype t = of_size[sizes[s]];
    for (int iter = 0; iter < 20; iter++) {
      tcase c = random_case(40000);
      c.dmis = iter % 3 == 1 ? 0 : 1 + rnd((int)sizes[s] - 1);
      c.smis = iter % 3 == 2 ? 0 : 1 + rnd((int)sizes[s] - 1);
      check(&c, t, t, 0);
      check(&c, TPORT_FLOAT32, TPORT_BFLOAT16, 0); /* converting */
    }
  }
}

Test(transpose, nchw_nhwc_shapes)
{
  /* the layouts the path is for, with channel counts on and off the units */
  const int64_t chans[] = {4, 8, 12, 16, 24, 32, 64, 96};
  const size_t sizes[] = {1, 2, 4, 8};
  for (int k = 0; k < 8; k++)
    for (int s = 0; s < 4; s++) {
      int64_t C = chans[k], HW = 14 * 14, N = 2;
      tport_dtype t = of_size[sizes[s]];
      tcase to_nhwc = {
          .ndim = 3, .shape = {C, HW, N}, .dst_st = {1, C, C * HW}, .src_st = {HW, 1, C * HW}};
      tcase to_nchw = {
          .ndim = 3, .shape = {HW, C, N}, .dst_st = {1, HW, C * HW}, .src_st = {C, 1, C * HW}};
      check(&to_nhwc, t, t, 0);
      check(&to_nchw, t, t, 0);
    }
}

Test(transpose, large_copies_stream)
{
  /* 16 MiB of dst and more: the non-temporal stores, 64-byte aligned dst
   * with whole-line rows; then a dst off by one element and a row pitch that
   * is not a multiple of 64 bytes, which must fall back to ordinary stores. */
  tcase f32 = {.ndim = 3,
               .shape = {64, 4096, 16},
               .dst_st = {1, 64, 64 * 4096},
               .src_st = {4096, 1, 64 * 4096}};
  check(&f32, TPORT_FLOAT32, TPORT_FLOAT32, 0);
  tcase back = {.ndim = 3,
                .shape = {4096, 64, 16},
                .dst_st = {1, 4096, 64 * 4096},
                .src_st = {64, 1, 64 * 4096},
                .doff = 1,
                .soff = 3};
  check(&back, TPORT_FLOAT32, TPORT_FLOAT32, 0);
  tcase f64 = {.ndim = 3,
               .shape = {40, 3000, 18},
               .dst_st = {1, 41, 41 * 3000},
               .src_st = {3000, 1, 40 * 3000}};
  check(&f64, TPORT_FLOAT64, TPORT_FLOAT64, 0);
  tcase i8 = {.ndim = 3,
              .shape = {64, 20000, 16},
              .dst_st = {1, 64, 64 * 20000},
              .src_st = {20000, 1, 64 * 20000}};
  check(&i8, TPORT_INT8, TPORT_INT8, 0);
}

Test(transpose, converting_copies)
{
  /* the staged path: conversions between sizes, the vector casts of
   * convert_simd.c, negation and conjugation after the cast */
  const struct {
    tport_dtype dt, st;
    unsigned flags;
  } pairs[] = {
      {TPORT_FLOAT16, TPORT_UINT8, 0},
      {TPORT_FLOAT32, TPORT_UINT8, CPU_COPY_NEG},
      {TPORT_FLOAT16, TPORT_FLOAT32, 0},
      {TPORT_BFLOAT16, TPORT_FLOAT32, 0},
      {TPORT_FLOAT32, TPORT_FLOAT16, 0},
      {TPORT_FLOAT32, TPORT_BFLOAT16, CPU_COPY_NEG},
      {TPORT_INT32, TPORT_FLOAT64, 0},
      {TPORT_UINT8, TPORT_FLOAT32, 0},
      {TPORT_COMPLEX64, TPORT_FLOAT32, CPU_COPY_CONJ | CPU_COPY_NEG},
      {TPORT_COMPLEX128, TPORT_COMPLEX64, CPU_COPY_CONJ},
      {TPORT_FLOAT32, TPORT_COMPLEX128, 0},
      {TPORT_FLOAT32, TPORT_FLOAT32, CPU_COPY_NEG},
      {TPORT_COMPLEX64, TPORT_COMPLEX64, CPU_COPY_CONJ},
      {TPORT_BOOL, TPORT_INT16, 0},
      {TPORT_INT64, TPORT_INT8, CPU_COPY_NEG},
  };
  for (size_t k = 0; k < sizeof pairs / sizeof *pairs; k++)
    for (int iter = 0; iter < 12; iter++) {
      tcase c = random_case(60000);
      check(&c, pairs[k].dt, pairs[k].st, pairs[k].flags);
    }
}

Test(transpose, threads_do_not_change_results)
{
  int saved = parallel_num_threads();
  for (int t = 1; t <= 4; t++) {
    parallel_set_num_threads(t);
    tcase c = {.ndim = 3,
               .shape = {100, 777, 5},
               .dst_st = {1, 100, 100 * 777},
               .src_st = {777, 1, 100 * 777},
               .doff = 5,
               .soff = 2};
    check(&c, TPORT_FLOAT32, TPORT_FLOAT32, 0);
    check(&c, TPORT_FLOAT16, TPORT_FLOAT32, 0);
  }
  parallel_set_num_threads(saved);
}
