/*
 * copy.c: the CPU copy kernel.  It chooses one of three loops from the plan
 * (memcpy, tiled transpose, strided) and splits large copies across the pool.
 * Conversion happens per element in the loops of convert.c; negation and
 * conjugation are applied to each finished row while it is still in cache, in
 * the destination dtype, as ATen's copy_kernel does.
 */
#include <string.h>

#include "cpu_kernels.h"

/* Elements per piece of parallel work (ATen's GRAIN_SIZE). */
#define COPY_GRAIN 32768

typedef struct memcpy_ctx {
  char *dst;
  const char *src;
  cpu_memcpy_fn copy;
} memcpy_ctx;

static void memcpy_range(void *vctx, int64_t b, int64_t e)
{
  memcpy_ctx *c = vctx;
  c->copy(c->dst + b, c->src + b, (size_t)(e - b));
}

static void plain_memcpy(void *dst, const void *src, size_t n)
{
  memcpy(dst, src, n);
}

void cpu_memcpy_split(void *dst, const void *src, size_t n, cpu_memcpy_fn copy)
{
  memcpy_ctx c = {dst, src, copy};
  parallel_for((int64_t)n, (int64_t)CPU_MEMCPY_GRAIN, memcpy_range, &c);
}

void cpu_memcpy_parallel(void *dst, const void *src, size_t n)
{
  /* one thread copies 8-10 GB/s; a staged transfer to a GPU wants the 50+
   * of the copy engines, so large copies are split across the pool */
  if (n < CPU_MEMCPY_PARALLEL_MIN) {
    memcpy(dst, src, n);
    return;
  }
  cpu_memcpy_split(dst, src, n, plain_memcpy);
}

typedef struct strided_ctx {
  const plan *p;
  char *dst;
  const char *src;
  cast_loop_fn cast;
  unary_loop_fn post1, post2;
  int64_t inner;   /* elements along plan dim 0 */
  int64_t block;   /* elements per task along dim 0 */
  int64_t nblocks; /* tasks per row */
} strided_ctx;

/* Byte offsets of row `row` (an index over plan dims 1..ndim-1). */
static void row_offsets(const plan *p, int64_t row, int64_t *doff, int64_t *soff)
{
  int64_t d = 0, s = 0;
  for (int k = 1; k < p->ndim && row; k++) {
    int64_t i = row % p->shape[k];
    row /= p->shape[k];
    d += i * p->strides[0][k];
    s += i * p->strides[1][k];
  }
  *doff = d;
  *soff = s;
}

static void strided_range(void *vctx, int64_t begin, int64_t end)
{
  strided_ctx *c = vctx;
  const plan *p = c->p;
  int64_t ds0 = p->ndim ? p->strides[0][0] : 0, ss0 = p->ndim ? p->strides[1][0] : 0;
  int64_t row = begin / c->nblocks, blk = begin % c->nblocks;
  int64_t doff, soff;
  row_offsets(p, row, &doff, &soff);
  /* counter over dims 1.. for cheap advancing from one row to the next */
  int64_t idx[TPORT_MAX_DIMS] = {0};
  {
    int64_t r = row;
    for (int k = 1; k < p->ndim; k++) {
      idx[k] = r % p->shape[k];
      r /= p->shape[k];
    }
  }
  for (int64_t t = begin; t < end; t++) {
    int64_t i0 = blk * c->block;
    int64_t n = c->inner - i0 < c->block ? c->inner - i0 : c->block;
    char *d = c->dst + doff + i0 * ds0;
    c->cast(d, c->src + soff + i0 * ss0, n, ds0, ss0);
    if (c->post1)
      c->post1(d, n, ds0);
    if (c->post2)
      c->post2(d, n, ds0);
    if (++blk == c->nblocks) {
      blk = 0;
      for (int k = 1; k < p->ndim; k++) {
        doff += p->strides[0][k];
        soff += p->strides[1][k];
        if (++idx[k] < p->shape[k])
          break;
        doff -= idx[k] * p->strides[0][k];
        soff -= idx[k] * p->strides[1][k];
        idx[k] = 0;
      }
    }
  }
}

bool cpu_copy_is_memcpy(const plan *p, tport_dtype dt, tport_dtype st, unsigned flags,
                        size_t *nbytes)
{
  size_t sizes[2] = {tport_dtype_size(dt), tport_dtype_size(st)};
  bool conj = (flags & CPU_COPY_CONJ) && cpu_conj_loop(dt);
  bool neg = (flags & CPU_COPY_NEG) && cpu_neg_loop(dt);
  if (dt != st || conj || neg || !plan_is_contiguous(p, sizes))
    return false;
  *nbytes = (size_t)plan_numel(p) * sizes[0];
  return true;
}

cpu_copy_path cpu_copy(const plan *p, void *dst, tport_dtype dt, const void *src, tport_dtype st,
                       unsigned flags)
{
  int64_t numel = plan_numel(p);
  if (numel == 0)
    return CPU_PATH_EMPTY;
  size_t dsize = tport_dtype_size(dt), ssize = tport_dtype_size(st);
  unary_loop_fn post1 = (flags & CPU_COPY_CONJ) ? cpu_conj_loop(dt) : NULL;
  unary_loop_fn post2 = (flags & CPU_COPY_NEG) ? cpu_neg_loop(dt) : NULL;
  size_t nbytes;
  if (cpu_copy_is_memcpy(p, dt, st, flags, &nbytes)) {
    cpu_memcpy_split(dst, src, nbytes, plain_memcpy);
    return CPU_PATH_MEMCPY;
  }
  cast_loop_fn cast = cpu_cast_loop(dt, st);
  if (cpu_transpose_eligible(p, dsize, ssize)) {
    bool raw = dt == st && !post1 && !post2;
    cpu_transpose(p, dst, src, cast, post1, post2, raw ? dsize : 0);
    return CPU_PATH_TRANSPOSE;
  }
  strided_ctx c = {.p = p, .dst = dst, .src = src, .cast = cast, .post1 = post1, .post2 = post2};
  c.inner = p->ndim ? p->shape[0] : 1;
  int64_t rows = numel / c.inner;
  int threads = parallel_num_threads();
  /* Few long rows: cut rows into blocks so every thread gets work. */
  c.block = c.inner;
  if (rows < (int64_t)threads * 4 && numel > COPY_GRAIN) {
    int64_t want = (int64_t)threads * 4 / (rows ? rows : 1);
    c.block = (c.inner + want - 1) / want;
    if (c.block < 4096)
      c.block = c.inner < 4096 ? c.inner : 4096;
  }
  c.nblocks = (c.inner + c.block - 1) / c.block;
  int64_t grain = COPY_GRAIN / c.block;
  parallel_for(rows * c.nblocks, grain < 1 ? 1 : grain, strided_range, &c);
  return CPU_PATH_STRIDED;
}
