/* readback.c: device tensors read back through the read-back pool (readback.h). */
#include "readback.h"

#include <stdlib.h>

/* What a reader and the blocks it lent share: the count of blocks out.
 * Freed by whichever lets go last -- a block may come home on nng's thread
 * after its reader is closed, and must not free the reader's device tensor
 * there (a device free may wait for the device). */
typedef struct reader_gate {
  atomic_int refs;
  atomic_int out;
} reader_gate;

struct tensor_reader {
  tport_tensor *src; /* contiguous, on its device */
  size_t nbytes;
  int max_held;
  staging_pool *pool;
  reader_gate *gate;
};

typedef struct given_block {
  staging_pool *pool;
  staging_block *b;
  reader_gate *gate;
} given_block;

static void gate_unref(reader_gate *g)
{
  if (atomic_fetch_sub(&g->refs, 1) == 1)
    free(g);
}

/* The block's storage is gone: the block goes back to the pool (a short
 * lock: staging_release never frees or waits). */
static void give_back(void *ctx)
{
  given_block *gv = ctx;
  staging_release(gv->pool, gv->b);
  atomic_fetch_sub(&gv->gate->out, 1);
  gate_unref(gv->gate);
  free(gv);
}

int reader_open(tport_tensor *t, int max_held, tensor_reader **out, tport_err *err)
{
  if (tensor_device(t).type == TPORT_DEV_CPU)
    return tport_err_set(err, TPORT_INTERNAL, "a reader reads a device tensor back");
  tensor_reader *r = calloc(1, sizeof *r);
  reader_gate *g = calloc(1, sizeof *g);
  if (!r || !g) {
    free(r);
    free(g);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of host memory for a reader");
  }
  atomic_init(&g->refs, 1);
  atomic_init(&g->out, 0);
  /* logical C order on the device; a lazily conjugated or negated view is
   * materialized (the bytes sent are the values) */
  to_options o = {.has_format = true,
                  .format = TPORT_MF_CONTIGUOUS,
                  .exact_format = true,
                  .non_blocking = true,
                  .copy = t->conj || t->neg};
  bool aliased;
  int rc = tensor_to(t, &o, &r->src, &aliased, err);
  if (rc) {
    free(r);
    free(g);
    return rc;
  }
  r->nbytes = tensor_nbytes(r->src);
  r->max_held = max_held > 0 ? max_held : 1;
  r->pool = staging_readback();
  r->gate = g;
  if (!r->pool) {
    reader_close(r);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of host memory for the read-back pool");
  }
  *out = r;
  return TPORT_OK;
}

size_t reader_nbytes(const tensor_reader *r)
{
  return r->nbytes;
}

int reader_blocks_out(const tensor_reader *r)
{
  return atomic_load(&r->gate->out);
}

/* A storage over a fresh block of n bytes from the pool, counted out. */
static int lend_block(tensor_reader *r, size_t n, tport_storage **out, tport_err *err)
{
  if (atomic_fetch_add(&r->gate->out, 1) >= r->max_held) {
    atomic_fetch_sub(&r->gate->out, 1);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                         "%d chunks of this get are being read or sent already (the most at once)",
                         r->max_held);
  }
  given_block *gv = calloc(1, sizeof *gv);
  int rc = gv ? staging_acquire(r->pool, n, &gv->b, err)
              : tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of host memory");
  if (rc) {
    free(gv);
    atomic_fetch_sub(&r->gate->out, 1);
    return rc;
  }
  gv->pool = r->pool;
  gv->gate = r->gate;
  atomic_fetch_add(&r->gate->refs, 1);
  rc = storage_wrap_given(gv->b->ptr, n, give_back, gv, out, err);
  if (rc)
    give_back(gv);
  return rc;
}

int reader_read(tensor_reader *r, size_t off, size_t n, tport_storage **held,
                const uint8_t **bytes, tport_err *err)
{
  if (off > r->nbytes || n > r->nbytes - off)
    return tport_err_set(err, TPORT_OUT_OF_RANGE,
                         "bytes [%zu, %zu + %zu) are outside the tensor's %zu", off, off, n,
                         r->nbytes);
  if (n > STAGING_MAX_BLOCK)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "a read of %zu bytes: at most %zu at once",
                         n, STAGING_MAX_BLOCK);
  if (n == 0) {
    *held = NULL;
    *bytes = NULL;
    return TPORT_OK;
  }
  tport_storage *st;
  int rc = lend_block(r, n, &st, err);
  if (rc)
    return rc;
  tport_storage *src = r->src->storage;
  tport_device dev = src->device;
  const backend_ops *be = backend_get(dev.type);
  be_stream *s = be->stream_default(dev.index);
  const char *sp = (const char *)src->ptr +
                   r->src->layout.offset * (int64_t)tport_dtype_size(r->src->dtype) + off;
  /* after whatever is pending on the tensor (making it contiguous, a put
   * still landing), then only this block's own copy is waited for */
  rc = storage_wait(src, be, s, err);
  bool enqueued = false;
  if (!rc)
    rc = be->memcpy_async(dev.index, s, st->ptr, sp, n, BE_D2H, err);
  if (!rc) {
    enqueued = true;
    tport_storage *sts[2] = {st, src};
    rc = storage_mark(sts, 2, be, dev.index, s, err);
  }
  if (!rc)
    rc = storage_sync(st, err);
  if (rc) {
    /* the copy may still write the block: done before it goes back */
    if (enqueued)
      be->stream_synchronize(s, NULL);
    storage_release(st);
    return rc;
  }
  *held = st;
  *bytes = st->ptr;
  return TPORT_OK;
}

void reader_close(tensor_reader *r)
{
  if (!r)
    return;
  tensor_release(r->src);
  gate_unref(r->gate);
  free(r);
}
