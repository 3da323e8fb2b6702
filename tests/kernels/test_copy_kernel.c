/* test_copy_kernel.c: cpu_copy on randomized shapes, strides, offsets,
 * broadcasting and dtype pairs against a plain element-by-element reference,
 * and the memcpy / transpose / threaded paths on sizes that select them. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"

static unsigned rng = 12345;
static int rnd(int n)
{
  return (int)(rand_r(&rng) % (unsigned)n);
}

typedef struct {
  int ndim;
  int64_t sizes[6], dst_st[6], src_sizes[6], src_st[6];
  int src_ndim;
} ccase;

/* Reference: walk every index of dst; convert one element at a time. */
static void reference(const ccase *c, char *dst, tport_dtype dt, const char *src, tport_dtype st,
                      unsigned flags)
{
  int64_t numel = 1;
  for (int d = 0; d < c->ndim; d++)
    numel *= c->sizes[d];
  size_t de = tport_dtype_size(dt), se = tport_dtype_size(st);
  cast_loop_fn cast = cpu_cast_loop(dt, st);
  for (int64_t lin = 0; lin < numel; lin++) {
    int64_t rem = lin, doff = 0, soff = 0;
    for (int d = c->ndim - 1; d >= 0; d--) {
      int64_t i = rem % c->sizes[d];
      rem /= c->sizes[d];
      doff += i * c->dst_st[d];
      int sd = d - (c->ndim - c->src_ndim);
      if (sd >= 0 && c->src_sizes[sd] != 1)
        soff += i * c->src_st[sd];
    }
    char *e = dst + doff * (int64_t)de;
    cast(e, src + soff * (int64_t)se, 1, 0, 0);
    if ((flags & CPU_COPY_CONJ) && cpu_conj_loop(dt))
      cpu_conj_loop(dt)(e, 1, 0);
    if ((flags & CPU_COPY_NEG) && cpu_neg_loop(dt))
      cpu_neg_loop(dt)(e, 1, 0);
  }
}

static int64_t span(int n, const int64_t *sz, const int64_t *st)
{
  int64_t s = 1;
  for (int d = 0; d < n; d++) {
    if (sz[d] == 0)
      return 1;
    s += (sz[d] - 1) * st[d];
  }
  return s;
}

/* Dense strides in a random dim order, with random gaps. */
static void random_dense(int n, const int64_t *sz, int64_t *st, bool gaps)
{
  int perm[6];
  for (int i = 0; i < n; i++)
    perm[i] = i;
  for (int i = n - 1; i > 0; i--) {
    int j = rnd(i + 1), t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
  int64_t s = 1;
  for (int i = 0; i < n; i++) {
    int d = perm[i];
    st[d] = s * (gaps && rnd(3) == 0 ? 2 : 1);
    s = st[d] * (sz[d] > 0 ? sz[d] : 1);
  }
}

static void fill_random(char *p, size_t n, tport_dtype t)
{
  for (size_t i = 0; i < n; i++)
    p[i] = (char)rnd(256);
  if (t == TPORT_BOOL)
    for (size_t i = 0; i < n; i++)
      p[i] &= 1;
}

static void run_case(const ccase *c, tport_dtype dt, tport_dtype st, unsigned flags)
{
  size_t de = tport_dtype_size(dt), se = tport_dtype_size(st);
  int64_t doffset = rnd(3), soffset = rnd(3);
  int64_t dspan = span(c->ndim, c->sizes, c->dst_st) + doffset;
  int64_t sspan = span(c->src_ndim, c->src_sizes, c->src_st) + soffset;
  char *src = malloc((size_t)sspan * se), *got = malloc((size_t)dspan * de),
       *want = malloc((size_t)dspan * de);
  fill_random(src, (size_t)sspan * se, st);
  fill_random(got, (size_t)dspan * de, dt);
  memcpy(want, got, (size_t)dspan * de);

  int64_t dbytes[6], sbytes[6];
  for (int d = 0; d < c->ndim; d++)
    dbytes[d] = c->dst_st[d] * (int64_t)de;
  cr_assert(
      plan_broadcast_strides(c->ndim, c->sizes, c->src_ndim, c->src_sizes, c->src_st, se, sbytes));
  const int64_t *strides[2] = {dbytes, sbytes};
  plan p;
  plan_build(&p, c->ndim, c->sizes, 2, strides);
  cpu_copy(&p, got + doffset * (int64_t)de, dt, src + soffset * (int64_t)se, st, flags);
  reference(c, want + doffset * (int64_t)de, dt, src + soffset * (int64_t)se, st, flags);
  /* compare every byte, the ones outside the view (untouched) included;
   * NaNs compare by bytes too since both sides run the same element cast */
  cr_assert(memcmp(got, want, (size_t)dspan * de) == 0, "dtype %d <- %d, ndim %d, flags %u", dt, st,
            c->ndim, flags);
  free(src);
  free(got);
  free(want);
}

Test(copy_kernel, random_views_all_pairs)
{
  for (int iter = 0; iter < 3000; iter++) {
    ccase c = {.ndim = rnd(6)};
    for (int d = 0; d < c.ndim; d++)
      c.sizes[d] = rnd(5) + (rnd(8) == 0 ? 0 : 1);
    random_dense(c.ndim, c.sizes, c.dst_st, rnd(2));
    /* src: same rank or fewer, maybe broadcast, any nonnegative strides */
    c.src_ndim = c.ndim ? c.ndim - rnd(2) : 0;
    int lead = c.ndim - c.src_ndim;
    for (int d = 0; d < c.src_ndim; d++)
      c.src_sizes[d] = rnd(4) == 0 ? 1 : c.sizes[d + lead];
    if (rnd(2))
      random_dense(c.src_ndim, c.src_sizes, c.src_st, rnd(2));
    else
      for (int d = 0; d < c.src_ndim; d++)
        c.src_st[d] = rnd(7);
    tport_dtype dt = (tport_dtype)rnd(TPORT_NUM_DTYPES), st = (tport_dtype)rnd(TPORT_NUM_DTYPES);
    if (rnd(3) == 0)
      st = dt;
    unsigned flags = 0;
    if (rnd(4) == 0)
      flags |= CPU_COPY_CONJ;
    if (rnd(4) == 0 && dt != TPORT_BOOL)
      flags |= CPU_COPY_NEG;
    run_case(&c, dt, st, flags);
  }
}

static cpu_copy_path path_of(int n, const int64_t *sz, const int64_t *d, const int64_t *s,
                             tport_dtype dt, tport_dtype st)
{
  ccase c = {.ndim = n, .src_ndim = n};
  memcpy(c.sizes, sz, sizeof(int64_t) * (size_t)n);
  memcpy(c.src_sizes, sz, sizeof(int64_t) * (size_t)n);
  memcpy(c.dst_st, d, sizeof(int64_t) * (size_t)n);
  memcpy(c.src_st, s, sizeof(int64_t) * (size_t)n);
  run_case(&c, dt, st, 0);
  int64_t db[6], sb[6];
  for (int i = 0; i < n; i++) {
    db[i] = d[i] * (int64_t)tport_dtype_size(dt);
    sb[i] = s[i] * (int64_t)tport_dtype_size(st);
  }
  const int64_t *strides[2] = {db, sb};
  plan p;
  plan_build(&p, n, sz, 2, strides);
  size_t bytes = (size_t)span(n, sz, d) * tport_dtype_size(dt);
  char *a = calloc(1, bytes), *b = calloc(1, (size_t)span(n, sz, s) * tport_dtype_size(st));
  cpu_copy_path path = cpu_copy(&p, a, dt, b, st, 0);
  free(a);
  free(b);
  return path;
}

Test(copy_kernel, paths_on_large_tensors)
{
  /* NCHW -> NHWC (and back), float32 and with a fused cast: the tiled path */
  int64_t sz[] = {4, 67, 33, 29};
  int64_t nchw[] = {67 * 33 * 29, 33 * 29, 29, 1}, nhwc[] = {33 * 29 * 67, 1, 29 * 67, 67};
  cr_assert_eq(path_of(4, sz, nhwc, nchw, TPORT_FLOAT32, TPORT_FLOAT32), CPU_PATH_TRANSPOSE);
  cr_assert_eq(path_of(4, sz, nchw, nhwc, TPORT_FLOAT32, TPORT_FLOAT32), CPU_PATH_TRANSPOSE);
  cr_assert_eq(path_of(4, sz, nhwc, nchw, TPORT_FLOAT16, TPORT_UINT8), CPU_PATH_TRANSPOSE);
  /* the bit-copy tiles of every element size */
  const tport_dtype raw[] = {TPORT_INT8, TPORT_BFLOAT16, TPORT_INT32, TPORT_FLOAT64,
                             TPORT_COMPLEX128};
  for (int i = 0; i < 5; i++)
    cr_assert_eq(path_of(4, sz, nhwc, nchw, raw[i], raw[i]), CPU_PATH_TRANSPOSE);
  /* contiguous same dtype: memcpy, split across the pool */
  int64_t big[] = {1 << 21}, one[] = {1};
  cr_assert_eq(path_of(1, big, one, one, TPORT_INT16, TPORT_INT16), CPU_PATH_MEMCPY);
  /* a long contiguous cast: strided loop cut into blocks for the pool */
  cr_assert_eq(path_of(1, big, one, one, TPORT_FLOAT16, TPORT_FLOAT32), CPU_PATH_STRIDED);
  /* many short rows */
  int64_t rows[] = {5000, 3}, rst[] = {3, 1}, sst[] = {1, 5000};
  cr_assert_eq(path_of(2, rows, rst, sst, TPORT_FLOAT64, TPORT_INT32), CPU_PATH_STRIDED);
}

Test(copy_kernel, threads_do_not_change_results)
{
  int saved = parallel_num_threads();
  for (int t = 1; t <= 4; t++) {
    parallel_set_num_threads(t);
    int64_t sz[] = {3, 40, 41, 17};
    int64_t nchw[] = {40 * 41 * 17, 41 * 17, 17, 1}, nhwc[] = {41 * 17 * 40, 1, 17 * 40, 40};
    path_of(4, sz, nhwc, nchw, TPORT_BFLOAT16, TPORT_FLOAT64);
    int64_t big[] = {300000}, one[] = {1};
    path_of(1, big, one, one, TPORT_COMPLEX64, TPORT_INT8);
  }
  parallel_set_num_threads(saved);
}
