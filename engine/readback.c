/* readback.c: tensors read a chunk at a time for gets: device tensors back
 * through the read-back pool, host tensors from their memory (readback.h). */
#include "readback.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "staging.h"
#include "storage.h"

_Static_assert(READER_MAX_CHUNK == STAGING_MAX_BLOCK, "a read of a device is one pool block");

/* What a reader and the blocks it lent share: the count of blocks out.
 * Freed by whichever lets go last -- a block may come home on nng's thread
 * after its reader is closed, and must not free the reader's device tensor
 * there (a device free may wait for the device). */
typedef struct reader_gate {
  atomic_int refs;
  atomic_int out;
} reader_gate;

/* A block read ahead: bytes [off, off + n) are being copied into st. */
typedef struct ahead_slot {
  size_t off, n;
  tport_storage *st;
} ahead_slot;

struct tensor_reader {
  tport_tensor *src; /* contiguous, on its device */
  size_t nbytes;
  bool host;          /* src is on the cpu: reads lend its storage */
  atomic_bool synced; /* host: the copy that made src is done */
  int max_held;
  staging_pool *pool;
  reader_gate *gate;
  pthread_mutex_t mu; /* guards the read-ahead */
  size_t ahead_n;     /* the length of the reads ahead: the first read's */
  size_t ahead_next;  /* where the next read ahead starts */
  int nahead;
  ahead_slot ahead[READER_AHEAD];
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

/* A reader of a host tensor: its own memory, or a copy of it in logical C
 * order (lazy conj/neg applied; a managed tensor copied, never moved). */
static int open_host(tport_tensor *t, tensor_reader *r, tport_err *err)
{
  to_options o = {.has_device = true,
                  .device = {TPORT_DEV_CPU, 0},
                  .has_format = true,
                  .format = TPORT_MF_CONTIGUOUS,
                  .exact_format = true,
                  .non_blocking = true,
                  .copy = t->conj || t->neg || tensor_is_managed(t)};
  bool aliased;
  int rc = tensor_to(t, &o, &r->src, &aliased, err);
  if (rc)
    return rc;
  r->host = true;
  atomic_init(&r->synced, false);
  r->nbytes = tensor_nbytes(r->src);
  return TPORT_OK;
}

/* A reader of a device tensor: made contiguous on its device, read back
 * through the read-back pool. */
static int open_device(tport_tensor *t, int max_held, tensor_reader *r, tport_err *err)
{
  reader_gate *g = calloc(1, sizeof *g);
  if (!g)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of host memory for a reader");
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
    free(g);
    return rc;
  }
  r->nbytes = tensor_nbytes(r->src);
  r->max_held = (max_held > 0 ? max_held : 1) + READER_AHEAD;
  r->pool = staging_readback();
  r->gate = g;
  if (!r->pool)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                         "out of host memory for the read-back pool");
  return TPORT_OK;
}

int reader_open(tport_tensor *t, int max_held, tensor_reader **out, tport_err *err)
{
  tensor_reader *r = calloc(1, sizeof *r);
  if (!r)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of host memory for a reader");
  pthread_mutex_init(&r->mu, NULL);
  int rc = tensor_device(t).type == TPORT_DEV_CPU ? open_host(t, r, err)
                                                  : open_device(t, max_held, r, err);
  if (rc) {
    reader_close(r);
    return rc;
  }
  *out = r;
  return TPORT_OK;
}

size_t engine_readback_budget(void)
{
  staging_pool *p = staging_readback();
  return p ? staging_budget(p) : 0;
}

size_t reader_nbytes(const tensor_reader *r)
{
  return r->nbytes;
}

size_t reader_max_read(const tensor_reader *r)
{
  return r->host ? SIZE_MAX : READER_MAX_CHUNK;
}

int reader_blocks_out(const tensor_reader *r)
{
  return r->gate ? atomic_load(&r->gate->out) : 0;
}

/* A storage over a fresh block of n bytes from the pool, counted out
 * (without wait: UNAVAILABLE rather than waiting for the pool).  The
 * calling thread's allocation guard is asked for the block before it is
 * taken; a charge it makes goes back with the block. */
static int lend_block(tensor_reader *r, size_t n, bool wait, tport_storage **out, tport_err *err)
{
  if (atomic_fetch_add(&r->gate->out, 1) >= r->max_held) {
    atomic_fetch_sub(&r->gate->out, 1);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                         "%d chunks of this get are being read or sent already (the most at once)",
                         r->max_held);
  }
  engine_charge keep;
  int rc = storage_guard_ask(wait ? ENGINE_ALLOC_READBACK : ENGINE_ALLOC_READAHEAD,
                             staging_block_size(n), &keep, err);
  if (rc) {
    atomic_fetch_sub(&r->gate->out, 1);
    return rc;
  }
  given_block *gv = calloc(1, sizeof *gv);
  rc = !gv    ? tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of host memory")
       : wait ? staging_acquire(r->pool, n, &gv->b, err)
              : staging_try_acquire(r->pool, n, &gv->b, err);
  if (rc) {
    free(gv);
    storage_charge_release(&keep);
    atomic_fetch_sub(&r->gate->out, 1);
    return rc;
  }
  gv->pool = r->pool;
  gv->gate = r->gate;
  atomic_fetch_add(&r->gate->refs, 1);
  rc = storage_wrap_given(gv->b->ptr, n, give_back, gv, out, err);
  if (rc) {
    give_back(gv);
    storage_charge_release(&keep);
    return rc;
  }
  storage_attach_charge(*out, &keep);
  return TPORT_OK;
}

/* Starts copying bytes [off, off + n) of the values into a block: *out is
 * its storage, the copy pending on it (storage_sync waits for it). */
static int start_read(tensor_reader *r, size_t off, size_t n, bool wait, tport_storage **out,
                      tport_err *err)
{
  tport_storage *st;
  int rc = lend_block(r, n, wait, &st, err);
  if (rc)
    return rc;
  tport_storage *src = r->src->storage;
  tport_device dev = src->device;
  const backend_ops *be = backend_get(dev.type);
  be_stream *s = be->stream_default(dev.index);
  const char *sp = (const char *)src->ptr +
                   r->src->layout.offset * (int64_t)tport_dtype_size(r->src->dtype) + off;
  /* after whatever is pending on the tensor (making it contiguous, a put
   * still landing); the block's own event marks this copy's end */
  rc = storage_wait(src, be, s, err);
  bool enqueued = false;
  if (!rc)
    rc = be->memcpy_async(dev.index, s, st->ptr, sp, n, BE_D2H, err);
  if (!rc) {
    enqueued = true;
    tport_storage *sts[2] = {st, src};
    rc = storage_mark(sts, 2, be, dev.index, s, err);
  }
  if (rc) {
    /* the copy may still write the block: done before it goes back */
    if (enqueued)
      be->stream_synchronize(s, NULL);
    storage_release(st);
    return rc;
  }
  *out = st;
  return TPORT_OK;
}

/* Starts reads of n bytes (the last one shorter) from ahead_next up to
 * until, while slots are free; never waits for the pool (a read it cannot
 * start is skipped: the reader asks for it when it wants it).  mu held. */
static void read_ahead_until(tensor_reader *r, size_t n, size_t until)
{
  while (r->nahead < READER_AHEAD && r->ahead_next < until) {
    size_t len = r->nbytes - r->ahead_next < n ? r->nbytes - r->ahead_next : n;
    ahead_slot *sl = &r->ahead[r->nahead];
    if (start_read(r, r->ahead_next, len, false, &sl->st, NULL))
      break;
    sl->off = r->ahead_next;
    sl->n = len;
    r->nahead++;
    r->ahead_next += len;
  }
}

/* Takes the block read ahead for exactly [off, off + n), if there is one,
 * and reads ahead the chunks after it: a series of reads of one length
 * (a get's chunks) finds each block copying or copied before it asks.
 * Reading ahead never waits for the pool; it is skipped when the pool is
 * full.  Called with mu held. */
static tport_storage *take_and_read_ahead(tensor_reader *r, size_t off, size_t n)
{
  tport_storage *st = NULL;
  for (int i = 0; i < r->nahead; i++)
    if (r->ahead[i].off == off && r->ahead[i].n == n) {
      st = r->ahead[i].st;
      r->ahead[i] = r->ahead[--r->nahead];
      break;
    }
  if (!r->ahead_n)
    r->ahead_n = n;
  if (n != r->ahead_n)
    return st;
  if (r->ahead_next < off + n)
    r->ahead_next = off + n;
  /* off + n + READER_AHEAD * n, without overflow: off + n <= nbytes */
  size_t until = r->nbytes - (off + n) > READER_AHEAD * n ? off + n + READER_AHEAD * n : r->nbytes;
  read_ahead_until(r, n, until);
  return st;
}

void reader_read_ahead(tensor_reader *r, size_t n)
{
  if (!r || r->host || !n || !r->nbytes)
    return;
  n = n < r->nbytes ? n : r->nbytes;
  n = n < READER_MAX_CHUNK ? n : READER_MAX_CHUNK;
  pthread_mutex_lock(&r->mu);
  if (!r->ahead_n) { /* no read yet: they will be of n bytes from 0 */
    r->ahead_n = n;
    read_ahead_until(r, n, r->nbytes / n > READER_AHEAD ? READER_AHEAD * n : r->nbytes);
  }
  pthread_mutex_unlock(&r->mu);
}

/* Bytes [off, off + n) of a host reader's tensor: its storage, lent
 * whole, once the copy that made it (if any) is done. */
static int read_host(tensor_reader *r, size_t off, tport_storage **held, const uint8_t **bytes,
                     tport_err *err)
{
  if (!atomic_load(&r->synced)) {
    int rc = tensor_sync(r->src, err);
    if (rc)
      return rc;
    atomic_store(&r->synced, true);
  }
  tport_storage *st = r->src->storage;
  *bytes = (const uint8_t *)st->ptr +
           r->src->layout.offset * (int64_t)tport_dtype_size(r->src->dtype) + off;
  *held = storage_retain(st);
  return TPORT_OK;
}

/* A read of bytes [off, off + n): inside the values, at most one read. */
static int check_read(const tensor_reader *r, size_t off, size_t n, tport_err *err)
{
  if (off > r->nbytes || n > r->nbytes - off)
    return tport_err_set(err, TPORT_OUT_OF_RANGE,
                         "bytes [%zu, %zu + %zu) are outside the tensor's %zu", off, off, n,
                         r->nbytes);
  if (n > reader_max_read(r))
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "a read of %zu bytes: at most %zu at once",
                         n, reader_max_read(r));
  return TPORT_OK;
}

int reader_read(tensor_reader *r, size_t off, size_t n, tport_storage **held,
                const uint8_t **bytes, tport_err *err)
{
  int rc = check_read(r, off, n, err);
  if (rc)
    return rc;
  if (n == 0) {
    *held = NULL;
    *bytes = NULL;
    return TPORT_OK;
  }
  if (r->host)
    return read_host(r, off, held, bytes, err);
  pthread_mutex_lock(&r->mu);
  tport_storage *st = take_and_read_ahead(r, off, n);
  pthread_mutex_unlock(&r->mu);
  rc = st ? TPORT_OK : start_read(r, off, n, true, &st, err);
  if (!rc && (rc = storage_sync(st, err)) != TPORT_OK)
    storage_release(st); /* its copy failed: back once the event is done */
  if (rc)
    return rc;
  *held = st;
  *bytes = st->ptr;
  return TPORT_OK;
}

int reader_read_into(tensor_reader *r, size_t off, size_t n, uint8_t *dst, bool pinned,
                     tport_err *err)
{
  int rc = check_read(r, off, n, err);
  if (rc || n == 0)
    return rc;
  if ((engine_test_faults() & ENGINE_FAIL_READ_INTO) && off > 0)
    return tport_err_set(err, TPORT_INTERNAL, "test fault: reads past the first chunk fail");
  /* the values' bytes [off, off + n) (src is contiguous) copied as a tensor
   * is: after the work pending on src, straight into dst where the device
   * can reach it, else staged; waited for before dst is the caller's */
  tport_tensor *view = NULL, *to = NULL;
  int64_t count = (int64_t)n;
  rc = tensor_byte_view(r->src, off, n, &view, err);
  if (!rc)
    rc = pinned ? tensor_wrap_host_pinned(dst, n, TPORT_UINT8, 1, &count, NULL, 0, &to, err)
                : tensor_wrap_host(dst, n, TPORT_UINT8, 1, &count, NULL, 0, &to, err);
  if (!rc)
    rc = tensor_copy_(to, view, false, err);
  /* a copy enqueued before a failure still ends before dst goes back */
  if (to) {
    int synced = tensor_sync(to, rc ? NULL : err);
    rc = rc ? rc : synced;
  }
  tensor_release(to);
  tensor_release(view);
  return rc;
}

void reader_close(tensor_reader *r)
{
  if (!r)
    return;
  /* blocks read ahead and never asked for: back once their copies end */
  for (int i = 0; i < r->nahead; i++)
    storage_release(r->ahead[i].st);
  pthread_mutex_destroy(&r->mu);
  if (r->src)
    tensor_release(r->src);
  if (r->gate)
    gate_unref(r->gate);
  free(r);
}
