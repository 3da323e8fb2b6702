/* put_gather.c: puts read from a same-host client's own memory, a batch's
 * together (put_gather.h). */
#include "put_gather.h"

#include <stdlib.h>

#include "put_once.h"
#include "wire.h"

void put_gather_init(put_gather *g, size_t room)
{
  *g = (put_gather){.room = room};
}

/* q's tensor: its layout l in dtype from on the cpu, charged to gd->paid
 * before it is made; gd->seg its bytes in the client's memory. */
static int make_tensor(call *c, const Tport__PutBeginRequest *q, const meta_layout *l,
                       tport_dtype from, gathered *gd)
{
  size_t n = (size_t)q->shm->length; /* the tensor's bytes (check_put_begin) */
  gd->q = q;
  gd->paid = REG_RESERVATION_INIT(&c->srv->reg, c->pipe);
  int rc = reg_add_check(&c->srv->reg, q->name, q->ttl_ms, &c->err);
  if (!rc && (rc = wire_charge_begin(c, &gd->paid, n, "the put's tensor")) == TPORT_OK) {
    rc = tensor_empty_strided((tport_device){TPORT_DEV_CPU, 0}, from, l->ndim, l->sizes,
                              l->strides, 0, &gd->t, &c->err);
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
 * answered (on c: its message, or the batch's sink). */
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

/* Reads the n elements' bytes from the connection's process region in one
 * read (none empty): their tensors kept by it, and charged to the tenant
 * until it ends, if it is given up (*stuck). */
static int read_all(call *c, uint64_t region, gathered *v, size_t n, bool *stuck)
{
  server *s = c->srv;
  shm_read_seg *seg = malloc(n * sizeof *seg);
  tport_tensor **keep = malloc(n * sizeof *keep);
  size_t keep_bytes = 0;
  reg_later hold = {0};
  int rc = seg && keep ? reg_later_begin(&s->reg, c->pipe, &hold, &c->err)
                       : tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  *stuck = false;
  for (size_t i = 0; !rc && i < n; i++) {
    seg[i] = v[i].seg;
    keep[i] = v[i].t;
    keep_bytes += storage_nbytes(v[i].t->storage);
  }
  int64_t t0 = metrics_now_ns();
  if (!rc)
    rc = shm_process_read_segs(s->shm, c->pipe, region, seg, n, keep, n, &hold, keep_bytes,
                               stuck, &c->err);
  metrics_stage_since(&s->metrics, STAGE_STAGE, t0);
  reg_later_end(&hold); /* (the read's, if it began) */
  free(seg);
  free(keep);
  return rc;
}

/* The element failed with rc (its error in c->err): its tensor and charge
 * let go -- a read given up keeps the tensor, and charges it, itself. */
static void drop(gathered *gd)
{
  tensor_release(gd->t);
  gd->t = NULL;
  reg_reservation_release(&gd->paid);
}

int put_from_process(call *c, const Tport__PutBeginRequest *q, const meta_layout *l,
                     tport_dtype from, tport_device dev, const to_options *convert)
{
  if (dev.type != TPORT_DEV_CPU || convert->has_dtype || convert->has_format)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "a put read from the client's memory is stored as it is on the cpu: "
                         "a device or a conversion takes a region or the payload");
  put_gather *g = c->gather;
  if (g && g->n && q->shm->region != g->region)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "a batch's puts from the client's memory name one process region "
                         "(%llu, then %llu)",
                         (unsigned long long)g->region, (unsigned long long)q->shm->region);
  if (g && q->shm->length > g->room - g->bytes)
    return tport_err_set(&c->err, TPORT_OUT_OF_RANGE,
                         "the batch's puts name %zu + %llu bytes of the client's memory: at "
                         "most %zu a request",
                         g->bytes, (unsigned long long)q->shm->length, g->room);
  gathered gd = {.el = g ? g->el : 0};
  int rc = make_tensor(c, q, l, from, &gd);
  if (rc)
    return rc;
  if (g && gd.seg.n) { /* read with the batch's others at its end */
    if (g->n == g->cap) {
      size_t cap = g->cap ? 2 * g->cap : 16;
      gathered *v = realloc(g->v, cap * sizeof *v);
      if (!v) {
        drop(&gd);
        return tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
      }
      g->v = v;
      g->cap = cap;
    }
    g->region = q->shm->region;
    g->bytes += gd.seg.n;
    g->v[g->n++] = gd;
    c->gathered = true;
    return TPORT_OK;
  }
  bool stuck = false;
  if (gd.seg.n && (rc = read_all(c, q->shm->region, &gd, 1, &stuck)) != TPORT_OK) {
    drop(&gd);
    return rc;
  }
  return store(c, &gd);
}

/* The sub-call an element is answered on: the batch's, into its sink. */
static call element_call(const call *c)
{
  call sub = {.srv = c->srv,
              .sink = c->sink,
              .pipe = c->pipe,
              .method = TPORT__METHOD__METHOD_PUT_BEGIN,
              .arrived_ns = c->arrived_ns,
              .copy_payload = true};
  tport_err_clear(&sub.err);
  return sub;
}

void put_gather_end(call *c, put_gather *g, put_gather_done_fn done, void *ctx)
{
  bool stuck = false;
  int rc = g->n ? read_all(c, g->region, g->v, g->n, &stuck) : TPORT_OK;
  /* a fault in one element's bytes (or another failure but a give-up):
   * each read again alone, for an answer of its own */
  bool each = rc && !stuck && g->n > 1;
  for (size_t i = 0; i < g->n; i++) {
    gathered *gd = &g->v[i];
    call sub = element_call(c);
    int erc = rc;
    if (each && stuck) /* one given up: the rest are not waited for too */
      erc = tport_err_set(&sub.err, TPORT_DEADLINE_EXCEEDED,
                          "not read: a read of the batch's puts from the client's memory was "
                          "given up");
    else if (each)
      erc = read_all(&sub, g->region, gd, 1, &stuck);
    else if (rc)
      sub.err = c->err;
    if (erc)
      drop(gd);
    else
      erc = store(&sub, gd);
    done(ctx, gd->el, &sub, erc);
  }
  free(g->v);
  *g = (put_gather){0};
}
