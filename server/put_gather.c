/* put_gather.c: a batch's puts read from a same-host client's own memory,
 * together (put_gather.h). */
#include "put_gather.h"

#include <stdlib.h>

#include "put_once.h"
#include "wire.h"

void put_gather_init(put_gather *g, size_t room, uint64_t fence_addr, uint64_t fence_token)
{
  *g = (put_gather){.room = room, .fence_addr = fence_addr, .fence_token = fence_token};
}

/* q's tensor: its layout l in dtype from on the cpu, charged to gd->paid
 * before it is made; gd->seg its bytes in the client's memory. */
static int make_tensor(call *c, const Tport__PutBeginRequest *q, const meta_layout *l,
                       tport_dtype from, gathered *gd)
{
  size_t n = (size_t)q->shm->length; /* the tensor's bytes (check_put_begin) */
  gd->q = q;
  gd->run = c->run;
  gd->run_handle = c->run_handle;
  gd->paid = REG_RESERVATION_INIT(&c->srv->reg, c->pipe);
  int rc = reg_add_check(&c->srv->reg, q->name, q->ttl_ms, &c->err);
  if (!rc && (rc = wire_charge_begin(c, &gd->paid, n, "the put's tensor")) == TPORT_OK) {
    rc = tensor_empty_strided((tport_device){TPORT_DEV_CPU, 0}, from, l->ndim, l->sizes, l->strides,
                              0, &gd->t, &c->err);
    wire_charge_end(&gd->paid);
  }
  if (!rc && n && !(gd->seg.dst = tensor_host_bytes(gd->t, 0, n)))
    rc = tport_err_set(&c->err, TPORT_INTERNAL, "the put's tensor is not host memory");
  gd->seg.addr = q->shm->offset;
  gd->seg.n = n;
  if (rc) {
    tensor_release(gd->t);
    gd->t = NULL;
    reg_reservation_release(&gd->paid);
  }
  return rc;
}

/* gd, read: checked against the crc it came with, added to the registry and
 * answered (into the batch's sink). */
static int store(call *c, gathered *gd)
{
  server *s = c->srv;
  const Tport__PutBeginRequest *q = gd->q;
  tport_tensor *t = gd->t;
  gd->t = NULL;
  int rc = check_crc32c_of(c, q->crc32c_set, q->crc32c, 0, gd->seg.dst, gd->seg.n);
  if (rc) {
    tensor_release(t);
    reg_reservation_release(&gd->paid);
    return rc;
  }
  atomic_fetch_add(&s->bytes_in, gd->seg.n);
  shm_count_transfer(s->shm);
  reg_entry *e;
  rc = (q->replace ? reg_add_replacing : reg_add)(&s->reg, c->pipe, t, NULL, q->name, q->keep,
                                                  q->ttl_ms, 0, &gd->paid, &e, &c->err);
  if (rc)
    return rc; /* t freed with the entry that could not be */
  return put_begin_reply(c, e, t);
}

/* The element failed (its error in its call): its tensor and charge let
 * go -- a read given up keeps the tensor, and charges it, itself. */
static void drop(gathered *gd)
{
  tensor_release(gd->t);
  gd->t = NULL;
  reg_reservation_release(&gd->paid);
}

int put_from_process(call *c, const Tport__PutBeginRequest *q, const meta_layout *l,
                     tport_dtype from, tport_device dev, const to_options *convert)
{
  put_gather *g = c->gather;
  if (!g)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "a whole put from the client's own memory is a PutBatch's element (the "
                         "batch names its fence)");
  if (g->flushed) /* one read a batch: a worker's time bounded */
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "a batch's puts from the client's memory come together: this one "
                         "follows an element of another kind after them");
  if (!g->fence_addr || !g->fence_token)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "a batch whose puts name the client's memory names its fence "
                         "(fence_addr, a nonzero fence_token)");
  if (dev.type != TPORT_DEV_CPU || convert->has_dtype || convert->has_format || q->managed ||
      c->srv->cfg.uvm)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "a put read from the client's memory is stored as it is on the cpu: "
                         "a device, managed memory or a conversion takes a region or the "
                         "payload");
  if (g->n && q->shm->region != g->region)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "a batch's puts from the client's memory name one process region "
                         "(%llu, then %llu)",
                         (unsigned long long)g->region, (unsigned long long)q->shm->region);
  if (q->shm->offset > UINT64_MAX - q->shm->length)
    return tport_err_set(&c->err, TPORT_OUT_OF_RANGE,
                         "bytes [0x%llx, +%llu) wrap past the end of the address space",
                         (unsigned long long)q->shm->offset, (unsigned long long)q->shm->length);
  if (q->shm->length > g->room - g->bytes)
    return tport_err_set(&c->err, TPORT_OUT_OF_RANGE,
                         "the batch's puts name %zu + %llu bytes of the client's memory: at "
                         "most %zu a request",
                         g->bytes, (unsigned long long)q->shm->length, g->room);
  if (g->n == g->cap) {
    size_t cap = g->cap ? 2 * g->cap : 16;
    gathered *v = realloc(g->v, cap * sizeof *v);
    if (!v)
      return tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
    g->v = v;
    g->cap = cap;
  }
  gathered gd = {.el = g->el};
  int rc = make_tensor(c, q, l, from, &gd);
  if (rc)
    return rc;
  g->region = q->shm->region;
  g->bytes += gd.seg.n;
  g->v[g->n++] = gd;
  c->gathered = true;
  return TPORT_OK;
}

/* Reads the gathered elements' bytes (the empty ones have none) and the
 * fence in one read: bad[i] where element i's could not be read; their
 * tensors kept by the read, and charged to the tenant until it ends, if it
 * is given up.  The read's error for all, or why the fence did not hold. */
static int read_gathered(call *c, put_gather *g, bool *bad)
{
  server *s = c->srv;
  shm_read_seg *seg = malloc(g->n * sizeof *seg);
  tport_tensor **keep = malloc(g->n * sizeof *keep);
  bool *runs_bad = calloc(g->n, sizeof *runs_bad);
  reg_later hold = {0};
  int rc = seg && keep && runs_bad
               ? reg_later_begin(&s->reg, c->pipe, &hold, &c->err)
               : tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  shm_read_many m = {.seg = seg,
                     .keep = keep,
                     .bad = runs_bad,
                     .fence_addr = g->fence_addr,
                     .fence_want = g->fence_token};
  for (size_t i = 0; !rc && i < g->n; i++)
    if (g->v[i].seg.n) {
      seg[m.nseg++] = g->v[i].seg;
      keep[m.nkeep++] = g->v[i].t;
      m.keep_bytes += storage_nbytes(g->v[i].t->storage);
    }
  if (!rc && !m.nseg) { /* only empty elements: nothing to read */
    reg_later_end(&hold);
    free(seg), free(keep), free(runs_bad);
    return TPORT_OK;
  }
  bool stuck = false;
  int64_t t0 = metrics_now_ns();
  if (!rc)
    rc = shm_process_read_segs(s->shm, c->pipe, g->region, &m, &hold, &stuck, &c->err);
  metrics_stage_since(&s->metrics, STAGE_STAGE, t0);
  reg_later_end(&hold); /* (the read's, if it began) */
  if (!rc && !m.fence_held)
    rc = tport_err_set(&c->err, TPORT_ABORTED,
                       "the client stopped waiting for the batch (its fence at 0x%llx no longer "
                       "held the batch's token): nothing of it read from its memory is stored",
                       (unsigned long long)g->fence_addr);
  for (size_t i = 0, r = 0; !rc && i < g->n; i++)
    if (g->v[i].seg.n)
      bad[i] = runs_bad[r++];
  free(seg), free(keep), free(runs_bad);
  return rc;
}

void put_gather_flush(call *c, put_gather *g, put_gather_done_fn done, void *ctx)
{
  if (!g->n)
    return;
  bool *bad = calloc(g->n, sizeof *bad);
  int rc = bad ? read_gathered(c, g, bad)
               : tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t i = 0; i < g->n; i++) {
    gathered *gd = &g->v[i];
    call sub = call_for_element(c, TPORT__METHOD__METHOD_PUT_BEGIN);
    sub.run = gd->run;
    sub.run_handle = gd->run_handle;
    int erc = rc;
    if (rc)
      sub.err = c->err; /* the read's, for all */
    else if (bad[i])
      erc = tport_err_set(&sub.err, TPORT_OUT_OF_RANGE,
                          "bytes [0x%llx, +%zu) of the client's memory cannot be read",
                          (unsigned long long)gd->seg.addr, gd->seg.n);
    if (erc)
      drop(gd);
    else
      erc = store(&sub, gd);
    done(ctx, gd->el, &sub, erc);
  }
  free(bad);
  g->n = 0;
  g->flushed = true;
}

void put_gather_end(call *c, put_gather *g, put_gather_done_fn done, void *ctx)
{
  put_gather_flush(c, g, done, ctx);
  free(g->v);
  g->v = NULL;
  g->cap = 0;
}
