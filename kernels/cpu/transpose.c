/*
 * transpose.c: the cache-blocked path for copies whose two innermost plan dims
 * are swapped between dst and src (contiguous <-> channels_last(3d) and any
 * other permutation that coalesces to it).  A naive loop reads src with a
 * large stride and touches a new cache line per element; here a TILE x TILE
 * block is read and written while its lines stay in L1.  The cast is fused:
 * each tile row goes through the pair's conversion loop.
 */
#include <string.h>

#include "cpu_kernels.h"

#define TILE 32

bool cpu_transpose_eligible(const plan *p, size_t dsize, size_t ssize)
{
  return p->ndim >= 2 && p->strides[0][0] == (int64_t)dsize && p->strides[1][1] == (int64_t)ssize &&
         p->strides[1][0] != (int64_t)ssize && p->shape[0] >= 4 && p->shape[1] >= 4;
}

typedef struct tr_ctx {
  const plan *p;
  char *dst;
  const char *src;
  cast_loop_fn cast;
  unary_loop_fn post1, post2;
  int64_t strips; /* strips of TILE along plan dim 1 per outer index */
  size_t raw;     /* element size when the copy moves bits unchanged, else 0 */
} tr_ctx;

/* The bit-copy tile: typed loads and stores, no call per row, so that the
 * compiler keeps the tile in registers and cache. */
#define RAW_TILE(T)                                                                                \
  for (int64_t i1 = i1b; i1 < i1e; i1++) {                                                         \
    T *d = (T *)(dst + i1 * ds1);                                                                  \
    const char *s = src + i1 * ss1;                                                                \
    for (int64_t i0 = 0; i0 < len; i0++)                                                           \
      d[i0] = *(const T *)(s + i0 * ss0);                                                          \
  }

static void raw_tile(size_t es, char *dst, const char *src, int64_t len, int64_t i1b, int64_t i1e,
                     int64_t ds1, int64_t ss0, int64_t ss1)
{
  switch (es) {
  case 1: RAW_TILE(uint8_t) break;
  case 2: RAW_TILE(uint16_t) break;
  case 4: RAW_TILE(uint32_t) break;
  case 8: RAW_TILE(uint64_t) break;
  default:
    for (int64_t i1 = i1b; i1 < i1e; i1++)
      for (int64_t i0 = 0; i0 < len; i0++)
        memcpy(dst + i1 * ds1 + i0 * (int64_t)es, src + i1 * ss1 + i0 * ss0, es);
  }
}

static void tr_range(void *vctx, int64_t begin, int64_t end)
{
  tr_ctx *c = vctx;
  const plan *p = c->p;
  int64_t n0 = p->shape[0], n1 = p->shape[1];
  int64_t ds0 = p->strides[0][0], ds1 = p->strides[0][1];
  int64_t ss0 = p->strides[1][0], ss1 = p->strides[1][1];
  for (int64_t t = begin; t < end; t++) {
    int64_t outer = t / c->strips, strip = t % c->strips;
    int64_t doff = 0, soff = 0;
    for (int k = 2; k < p->ndim; k++) {
      int64_t i = outer % p->shape[k];
      outer /= p->shape[k];
      doff += i * p->strides[0][k];
      soff += i * p->strides[1][k];
    }
    int64_t i1b = strip * TILE, i1e = i1b + TILE < n1 ? i1b + TILE : n1;
    for (int64_t i0b = 0; i0b < n0; i0b += TILE) {
      int64_t len = n0 - i0b < TILE ? n0 - i0b : TILE;
      if (c->raw) {
        raw_tile(c->raw, c->dst + doff + i0b * ds0, c->src + soff + i0b * ss0, len, i1b, i1e, ds1,
                 ss0, ss1);
        continue;
      }
      for (int64_t i1 = i1b; i1 < i1e; i1++) {
        char *d = c->dst + doff + i0b * ds0 + i1 * ds1;
        c->cast(d, c->src + soff + i0b * ss0 + i1 * ss1, len, ds0, ss0);
        if (c->post1)
          c->post1(d, len, ds0);
        if (c->post2)
          c->post2(d, len, ds0);
      }
    }
  }
}

void cpu_transpose(const plan *p, char *dst, const char *src, cast_loop_fn cast,
                   unary_loop_fn post1, unary_loop_fn post2, size_t raw_size)
{
  tr_ctx c = {.p = p,
              .dst = dst,
              .src = src,
              .cast = cast,
              .post1 = post1,
              .post2 = post2,
              .raw = raw_size};
  c.strips = (p->shape[1] + TILE - 1) / TILE;
  int64_t outer = plan_numel(p) / (p->shape[0] * p->shape[1]);
  int64_t per_strip = p->shape[0] * TILE;
  int64_t grain = 32768 / per_strip;
  parallel_for(outer * c.strips, grain < 1 ? 1 : grain, tr_range, &c);
}
