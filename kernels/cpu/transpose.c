/*
 * transpose.c: the cache-blocked path for copies whose two innermost plan dims
 * are swapped between dst and src (contiguous <-> channels_last(3d) and any
 * other permutation that coalesces to it).  A naive loop reads src with a
 * large stride and touches a new cache line per element; here each outer
 * index's n0 x n1 matrix is cut into blocks of about 16 KiB, which are moved
 * while their lines stay in L1.
 *
 * Bit copies (same dtype, no conj/neg) move a block through the register
 * transposes of transpose_simd.c where the CPU has them, else through the
 * plain tiled loop below, which stays the reference (TPORT_NO_SIMD=1 or
 * cpu_transpose_set_simd(0) select it).  A copy that converts stages each
 * block of src, transposed but not converted, in a buffer on the stack and
 * then converts it row by row as dense runs (so the vector casts of
 * convert_simd.c apply); without vector kernels each tile row goes through the
 * pair's strided conversion loop instead.  Negation and conjugation follow on
 * each finished dst row while it is still in cache.
 *
 * Blocks are numbered along plan dim 0 first, then dim 1, then the outer
 * dims, and the pool takes them in contiguous runs: where one side of the
 * matrix is short (the channels of NCHW <-> NHWC) a run reads or writes one
 * long contiguous stretch.  While a block moves, the src of the block
 * PF_AHEAD on is prefetched into L2, and a dst much larger than the caches is
 * written with non-temporal stores (no read-for-ownership of lines that are
 * overwritten whole).  The plain loop walks the same blocks (64 x 64
 * elements, as 32 x 32 tiles) without either.
 */
#include <stdatomic.h>
#include <string.h>

#include "cpu_kernels.h"
#include "transpose_simd.h"

#define TILE 32                 /* plain-loop tile side */
#define BLOCK_BYTES (16 * 1024) /* bytes of src per vector block */
#define CAST_BUF (16 * 1024)    /* the converting path's staging buffer */
#define STREAM_MIN (16 << 20)   /* dst bytes from which stores bypass the caches */
#define PF_AHEAD 2              /* the block prefetched, counted from the one moving */

/* -1 until first asked: then the level in use (TR_SIMD_*). */
static _Atomic int simd_level = -1;

static tr_simd_level level_in_use(void)
{
  int l = atomic_load_explicit(&simd_level, memory_order_relaxed);
  if (l < 0) {
    l = (int)tr_simd_detect();
    atomic_store_explicit(&simd_level, l, memory_order_relaxed);
  }
  return (tr_simd_level)l;
}

int cpu_transpose_set_simd(int level)
{
  int best = (int)tr_simd_detect();
  int l = level < 0 || level > best ? best : level;
  atomic_store_explicit(&simd_level, l, memory_order_relaxed);
  return l;
}

bool cpu_transpose_eligible(const plan *p, size_t dsize, size_t ssize)
{
  return p->ndim >= 2 && p->strides[0][0] == (int64_t)dsize && p->strides[1][1] == (int64_t)ssize &&
         p->strides[1][0] != (int64_t)ssize && p->shape[0] >= 4 && p->shape[1] >= 4;
}

/* ---- the plain loop: dst[i1*ds1 + i0*es] = src[i0*ss0 + i1*es]. */

/* One tile with element-sized moves, no call per row, so that the compiler
 * keeps the tile in registers and cache.  Either side may be unaligned (a
 * put converts straight from the received message, a get into a region's
 * slice at the client's offset): each move goes through a fixed-size
 * memcpy, the same plain move on x86-64 without the undefined behaviour. */
#define RAW_TILE(T)                                                                                \
  for (int64_t i1 = 0; i1 < n1; i1++) {                                                            \
    char *d = dst + i1 * ds1;                                                                      \
    const char *s = src + i1 * (int64_t)sizeof(T);                                                 \
    for (int64_t i0 = 0; i0 < n0; i0++) {                                                          \
      T v;                                                                                         \
      memcpy(&v, s + i0 * ss0, sizeof v);                                                          \
      memcpy(d + i0 * (int64_t)sizeof v, &v, sizeof v);                                            \
    }                                                                                              \
  }

typedef struct {
  uint64_t w[2];
} tr_16b; /* complex128: one 16-byte move, not a memcpy call per element */

static void raw_tile(size_t es, char *dst, const char *src, int64_t n0, int64_t n1, int64_t ds1,
                     int64_t ss0)
{
  switch (es) {
  case 1: RAW_TILE(uint8_t) break;
  case 2: RAW_TILE(uint16_t) break;
  case 4: RAW_TILE(uint32_t) break;
  case 8: RAW_TILE(uint64_t) break;
  case 16: RAW_TILE(tr_16b) break;
  default:
    for (int64_t i1 = 0; i1 < n1; i1++)
      for (int64_t i0 = 0; i0 < n0; i0++)
        memcpy(dst + i1 * ds1 + i0 * (int64_t)es, src + i1 * (int64_t)es + i0 * ss0, es);
  }
}

static void raw_block(size_t es, char *dst, const char *src, int64_t n0, int64_t n1, int64_t ds1,
                      int64_t ss0)
{
  for (int64_t t1 = 0; t1 < n1; t1 += TILE)
    for (int64_t t0 = 0; t0 < n0; t0 += TILE)
      raw_tile(es, dst + t1 * ds1 + t0 * (int64_t)es, src + t0 * ss0 + t1 * (int64_t)es,
               n0 - t0 < TILE ? n0 - t0 : TILE, n1 - t1 < TILE ? n1 - t1 : TILE, ds1, ss0);
}

/* ---- the blocked walk */

typedef struct tr_ctx {
  const plan *p;
  char *dst;
  const char *src;
  cast_loop_fn cast;
  unary_loop_fn post1, post2;
  size_t raw;        /* element size when the copy moves bits unchanged, else 0 */
  size_t ssize;      /* src element size */
  tr_block_fn block; /* vector kernel for raw or for the staging; NULL: plain loop */
  bool stream;       /* non-temporal dst stores */
  int64_t b0, b1;    /* block sides along plan dims 0 and 1 */
  int64_t nb0, nb1;  /* blocks along plan dims 0 and 1 */
  int64_t nitems;    /* blocks in all */
} tr_ctx;

/* Block t's element offsets along dims 0 and 1, and byte offsets of dst and src. */
static void item_at(const tr_ctx *c, int64_t t, int64_t *i0, int64_t *i1, int64_t *doff,
                    int64_t *soff)
{
  const plan *p = c->p;
  int64_t per = c->nb0 * c->nb1, outer = t / per, r = t % per;
  *i0 = (r % c->nb0) * c->b0;
  *i1 = (r / c->nb0) * c->b1;
  int64_t d = *i0 * p->strides[0][0] + *i1 * p->strides[0][1];
  int64_t s = *i0 * p->strides[1][0] + *i1 * p->strides[1][1];
  for (int k = 2; k < p->ndim && outer; k++) {
    int64_t i = outer % p->shape[k];
    outer /= p->shape[k];
    d += i * p->strides[0][k];
    s += i * p->strides[1][k];
  }
  *doff = d;
  *soff = s;
}

/* Converts one block: stage src (transposed, same dtype) densely, then run
 * the cast over each dst row as one dense run. */
static void cast_block(const tr_ctx *c, char *d, const char *s, int64_t n0, int64_t n1, int64_t pf)
{
  _Alignas(64) char buf[CAST_BUF];
  const plan *p = c->p;
  int64_t ds0 = p->strides[0][0], ds1 = p->strides[0][1], ss0 = p->strides[1][0];
  int64_t row = n0 * (int64_t)c->ssize;
  c->block(buf, s, n0, n1, row, ss0, pf, false);
  for (int64_t i1 = 0; i1 < n1; i1++) {
    char *dr = d + i1 * ds1;
    c->cast(dr, buf + i1 * row, n0, ds0, (int64_t)c->ssize);
    if (c->post1)
      c->post1(dr, n0, ds0);
    if (c->post2)
      c->post2(dr, n0, ds0);
  }
}

/* Converts one block without vector kernels: each tile row through the
 * pair's strided loop. */
static void cast_block_plain(const tr_ctx *c, char *d, const char *s, int64_t n0, int64_t n1)
{
  const plan *p = c->p;
  int64_t ds0 = p->strides[0][0], ds1 = p->strides[0][1];
  int64_t ss0 = p->strides[1][0], ss1 = p->strides[1][1];
  for (int64_t t0 = 0; t0 < n0; t0 += TILE) {
    int64_t len = n0 - t0 < TILE ? n0 - t0 : TILE;
    for (int64_t i1 = 0; i1 < n1; i1++) {
      char *dr = d + t0 * ds0 + i1 * ds1;
      c->cast(dr, s + t0 * ss0 + i1 * ss1, len, ds0, ss0);
      if (c->post1)
        c->post1(dr, len, ds0);
      if (c->post2)
        c->post2(dr, len, ds0);
    }
  }
}

static void tr_range(void *vctx, int64_t begin, int64_t end)
{
  tr_ctx *c = vctx;
  const plan *p = c->p;
  int64_t n0 = p->shape[0], n1 = p->shape[1];
  int64_t ds1 = p->strides[0][1], ss0 = p->strides[1][0];
  for (int64_t t = begin; t < end; t++) {
    int64_t i0, i1, doff, soff;
    item_at(c, t, &i0, &i1, &doff, &soff);
    int64_t m0 = n0 - i0 < c->b0 ? n0 - i0 : c->b0, m1 = n1 - i1 < c->b1 ? n1 - i1 : c->b1;
    char *d = c->dst + doff;
    const char *s = c->src + soff;
    int64_t pf = 0; /* to the src of the block PF_AHEAD on */
    if (c->block && t + PF_AHEAD < c->nitems) {
      int64_t j0, j1, doff2, soff2;
      item_at(c, t + PF_AHEAD, &j0, &j1, &doff2, &soff2);
      pf = soff2 - soff;
    }
    if (c->raw && c->block)
      c->block(d, s, m0, m1, ds1, ss0, pf, c->stream);
    else if (c->raw)
      raw_block(c->raw, d, s, m0, m1, ds1, ss0);
    else if (c->block)
      cast_block(c, d, s, m0, m1, pf);
    else
      cast_block_plain(c, d, s, m0, m1);
  }
  if (c->stream)
    tr_simd_fence(); /* the non-temporal stores land before the pool says done */
}

/* n rounded down to a multiple of 16 (the widest vector unit), at least 16. */
static int64_t units_of_16(int64_t n)
{
  return n < 32 ? 16 : n / 16 * 16;
}

void cpu_transpose(const plan *p, char *dst, const char *src, cast_loop_fn cast,
                   unary_loop_fn post1, unary_loop_fn post2, size_t raw_size)
{
  size_t ssize = (size_t)p->strides[1][1];
  tr_simd_level level = level_in_use();
  tr_ctx c = {.p = p,
              .dst = dst,
              .src = src,
              .cast = cast,
              .post1 = post1,
              .post2 = post2,
              .raw = raw_size,
              .ssize = ssize,
              .block = tr_simd_block(ssize, level)};
  int64_t n0 = p->shape[0], n1 = p->shape[1], numel = plan_numel(p);
  /* elements per block: the plain loops keep their 32 x 32 tiles, in
   * blocks of 4 tiles for the bit copy */
  int64_t elems = !c.block ? (raw_size ? 4 * TILE * TILE : TILE * TILE)
                           : (raw_size ? BLOCK_BYTES : CAST_BUF) / (int64_t)ssize;
  /* Square blocks, unless one side is short: then the other takes the rest. */
  int64_t sq = 16;
  while ((sq * 2) * (sq * 2) <= elems)
    sq *= 2;
  if (n0 <= sq) {
    c.b0 = n0;
    c.b1 = n1 <= elems / n0 ? n1 : units_of_16(elems / n0);
  } else if (n1 <= sq) {
    c.b1 = n1;
    c.b0 = n0 <= elems / n1 ? n0 : units_of_16(elems / n1);
  } else {
    c.b0 = sq;
    c.b1 = sq;
  }
  c.nb0 = (n0 + c.b0 - 1) / c.b0;
  c.nb1 = (n1 + c.b1 - 1) / c.b1;
  c.nitems = numel / (n0 * n1) * c.nb0 * c.nb1;
  c.stream = raw_size && c.block && numel * (int64_t)raw_size >= STREAM_MIN;
  int64_t grain = 32768 / (c.b0 * c.b1);
  parallel_for(c.nitems, grain < 1 ? 1 : grain, tr_range, &c);
}
