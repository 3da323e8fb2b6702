/* get_scatter.c: a GetBatch's direct gets written together (get_scatter.h). */
#include "get_scatter.h"

#include <stdlib.h>

#include "crc32c.h"
#include "get_direct.h"

bool get_scatter_room(const get_scatter *g, uint64_t region, size_t want)
{
  return !g->n || (region == g->region && want <= SHM_PROCESS_READ_SPAN - g->bytes);
}

int get_scatter_add(call *c, const Tport__GetBeginRequest *q, reg_entry *e, tport_tensor *t)
{
  get_scatter *g = c->scatter;
  size_t want = tensor_nbytes(t);
  if (!get_scatter_room(g, q->direct_region, want)) /* the batch's test, made first */
    return tport_err_set(&c->err, TPORT_INTERNAL, "a batch's direct write has no room left");
  const uint8_t *src = get_direct_source(c, q, t);
  if (!src)
    return c->err.code;
  if (g->n == g->cap) {
    size_t cap = g->cap ? 2 * g->cap : 16;
    scattered *v = realloc(g->v, cap * sizeof *v);
    if (!v)
      return tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
    g->v = v;
    g->cap = cap;
  }
  /* (a run's dst is the local side: here what is written) */
  g->v[g->n++] = (scattered){.el = g->el,
                             .e = e,
                             .t = t,
                             .seg = {.addr = q->direct_addr, .dst = (uint8_t *)src, .n = want},
                             .want_crc32c = q->want_crc32c};
  g->region = q->direct_region;
  g->bytes += want;
  c->gathered = true;
  return TPORT_OK;
}

/* Writes the held elements' bytes in one write: bad[i] where element i's
 * memory could not be written; their tensors kept by the write, and
 * charged to the tenant until it ends, if it is given up (*stuck).  The
 * write's error for all. */
static int write_scattered(call *c, get_scatter *g, bool *bad, bool *stuck)
{
  server *s = c->srv;
  shm_read_seg *seg = malloc(g->n * sizeof *seg);
  tport_tensor **keep = malloc(g->n * sizeof *keep);
  reg_later hold = {0};
  int rc = seg && keep ? reg_later_begin(&s->reg, c->pipe, &hold, &c->err)
                       : tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  shm_read_many m = {.seg = seg, .nseg = g->n, .keep = keep, .nkeep = g->n, .bad = bad};
  for (size_t i = 0; !rc && i < g->n; i++) {
    seg[i] = g->v[i].seg;
    keep[i] = g->v[i].t;
    m.keep_bytes += g->v[i].seg.n;
  }
  int64_t t0 = metrics_now_ns();
  if (!rc)
    rc = shm_process_write_segs(s->shm, c->pipe, g->region, &m, &hold, stuck, &c->err);
  metrics_stage_since(&s->metrics, STAGE_STAGE, t0);
  reg_later_end(&hold); /* (the write's, if it began) */
  free(seg), free(keep);
  return rc;
}

bool get_scatter_flush(call *c, get_scatter *g, get_scatter_done_fn done, void *ctx)
{
  if (!g->n)
    return true;
  server *s = c->srv;
  bool *bad = calloc(g->n, sizeof *bad), stuck = false;
  int rc = bad ? write_scattered(c, g, bad, &stuck)
               : tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  /* no slot (or no thread): nothing written -- the other way */
  bool other = rc == TPORT_RESOURCE_EXHAUSTED && !stuck && bad, all = !rc;
  for (size_t i = 0; i < g->n; i++) {
    scattered *sd = &g->v[i];
    call sub = call_for_element(c, TPORT__METHOD__METHOD_GET_BEGIN);
    int erc = rc;
    if (rc)
      sub.err = c->err; /* the write's, for all */
    else if (bad[i])
      erc = tport_err_set(&sub.err, TPORT_OUT_OF_RANGE,
                          "bytes [0x%llx, +%zu) of the client's memory cannot be written",
                          (unsigned long long)sd->seg.addr, sd->seg.n);
    if (!erc) {
      /* the CRC32C of the tensor now: a Copy into it meanwhile shows as a mismatch */
      uint32_t crc = sd->want_crc32c ? transport_crc32c(0, sd->seg.dst, sd->seg.n) : 0;
      erc = get_answer_written(&sub, sd->e, sd->t, sd->want_crc32c, crc, true);
    }
    all = all && !erc;
    reg_put(&s->reg, sd->e);
    done(ctx, sd->el, &sub, erc, other);
  }
  free(bad);
  g->n = 0;
  g->bytes = 0;
  return all;
}

bool get_scatter_end(call *c, get_scatter *g, get_scatter_done_fn done, void *ctx)
{
  bool all = get_scatter_flush(c, g, done, ctx);
  free(g->v);
  *g = (get_scatter){0};
  return all;
}
