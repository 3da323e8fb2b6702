/*
 * handlers_transfer.c: Get (Begin, Chunk); Put is handlers_put.c.
 *
 * Get: GetBegin makes the values ready in logical C order; GetChunk serves
 * byte ranges of them (several at once), each lent to its reply rather
 * than copied into it (call_reply_lent: nng writes it to the socket from
 * there), as the engine's reader hands them out (readback.h): from a
 * device, each range is read back into a recycled pinned block of the
 * read-back pool when it is asked for; from the host, straight from the
 * tensor when it is contiguous, else from a copy made contiguous.
 * The transfer ends once as many bytes as the tensor holds have been served,
 * when it has not been read from for a while, or with its connection
 * (transfers.c).
 *
 * Same host: a PutBegin (with commit) or a GetBegin may name a slice of a
 * region (regions.h) instead of carrying bytes: the bytes are copied once,
 * between the region and the tensor, converted on the way where the put
 * asks for it; nothing rides in the messages.  A GetBegin may also name the
 * caller's buffer itself, written by tportd (get_direct.h).
 */
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "dtype.h"
#include "get_direct.h"
#include "get_scatter.h"
#include "random_ids.h"
#include "validate.h"
#include "wire.h"
#include "wrap.h"

/* ---------------------------------------------------------------- get */

/* The blocks one get may have lent at once: its window of chunk requests
 * (or fewer chunks), and a few whose replies nng has sent but not yet
 * given back.  More is a client asking for the same bytes over and over. */
static int reader_max_held(const server *s, size_t nbytes, size_t chunk)
{
  size_t chunks = nbytes / chunk + (nbytes % chunk != 0);
  size_t w = (size_t)s->cfg.window;
  return (int)((chunks < w ? chunks : w) + 2);
}

/* True when a get of t makes a copy of it (made contiguous, or its lazy
 * conj/neg bits applied: on its device, or on the host) -- else it serves
 * t's own memory: a host tensor's directly, a device tensor's read back
 * through the read-back pool's blocks (each charged while it is out). */
static bool get_copies(const tport_tensor *t)
{
  return !meta_is_contiguous(&t->layout) || t->conj || t->neg ||
         (tensor_device(t).type == TPORT_DEV_CPU && tensor_is_managed(t));
}

/* Makes t's values ready to serve in logical C order (readback.h): a
 * device tensor is read back a chunk at a time through recycled pinned
 * blocks; a host tensor is served from its own memory, or from a copy made
 * contiguous when it is not. */
static int stage_for_get(call *c, tport_tensor *t, get_transfer *g)
{
  int64_t t0 = metrics_now_ns();
  g->from_device = tensor_device(t).type != TPORT_DEV_CPU;
  int rc = reader_open(t, reader_max_held(c->srv, tensor_nbytes(t), g->chunk), &g->reader, &c->err);
  if (rc)
    return rc;
  g->nbytes = reader_nbytes(g->reader);
  /* made contiguous (enqueued on a device), if it was not */
  if (g->from_device || get_copies(t))
    metrics_stage_since(&c->srv->metrics, STAGE_CONVERT, t0);
  return TPORT_OK;
}

/* Bytes [off, off + n) of a get's values, ready to lend to a reply: *held
 * is the storage they lie in, the caller's reference to release after the
 * reply (a read-back block, or the host tensor's storage). */
static int get_bytes(call *c, get_transfer *g, size_t off, size_t n, tport_storage **held,
                     const uint8_t **p)
{
  int64_t t0 = metrics_now_ns();
  int rc = reader_read(g->reader, off, n, held, p, &c->err);
  if (g->from_device)
    metrics_stage_since(&c->srv->metrics, STAGE_DEVICE_TO_HOST, t0);
  return rc;
}

/* A get into a region: t's values in logical C order straight into the
 * client's slice, in one copy (from a device: into the pinned region
 * directly when it is registered), then a reply with no payload. */
static int get_into_region(call *c, const Tport__GetBeginRequest *q, reg_entry *e, tport_tensor *t)
{
  server *s = c->srv;
  size_t want = tensor_nbytes(t);
  if (q->shm->length < want)
    return tport_err_set(&c->err, TPORT_OUT_OF_RANGE,
                         "shm.length is %llu bytes: the tensor holds %zu",
                         (unsigned long long)q->shm->length, want);
  shm_region *held = NULL;
  uint8_t *p = NULL;
  bool pinned = false, on_dev = false;
  tport_device mem_dev;
  int rc = hold_whole(c, q->shm, &held, &p, &pinned, &mem_dev, &on_dev);
  if (rc)
    return rc;
  int64_t t0 = metrics_now_ns();
  /* logical C order, or the order of the memory format asked */
  int64_t strides[TPORT_MAX_DIMS];
  tport_memory_format fmt = TPORT_MF_CONTIGUOUS;
  if (q->memory_format_set)
    rc = wire_format(q->memory_format, "memory_format", &fmt, &c->err);
  if (!rc && fmt == TPORT_MF_PRESERVE)
    rc = tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                       "memory_format: a get writes contiguous, channels_last or "
                       "channels_last_3d order");
  tport_err why;
  if (!rc && meta_fresh_strides(t->layout.ndim, t->layout.sizes, fmt, strides, &why))
    rc = tport_err_set(&c->err, TPORT_INVALID_ARGUMENT, "memory_format: %s", why.msg);
  if (!rc && want) {
    tport_tensor *dst = NULL;
    rc = wrap_any(p, want, pinned, on_dev, mem_dev, t->dtype, t->layout.ndim, t->layout.sizes,
                  strides, &dst, &c->err);
    if (!rc)
      rc = tensor_copy_(dst, t, false, &c->err);
    if (!rc)
      rc = tensor_sync(dst, &c->err); /* done before the region may go */
    else
      rc = settle_region(dst, pinned, rc, &c->err); /* a failed copy's too */
    tensor_release(dst);
    metrics_stage_since(
        &s->metrics, tensor_device(t).type == TPORT_DEV_CPU ? STAGE_CONVERT : STAGE_DEVICE_TO_HOST,
        t0);
  }
  bool crc_set = q->want_crc32c && !on_dev; /* a GPU region's bytes are not read here */
  uint32_t crc = rc || !crc_set ? 0 : transport_crc32c(0, p, want);
  shm_unhold(s->shm, held);
  return rc ? rc : get_answer_written(c, e, t, crc_set, crc, false);
}

/* GetBeginRequest.expect_*: the tensor the client's destination is, checked
 * before a byte is written anywhere (a CUDA IPC slice is the client's own
 * memory); the messages are libtport's own check's (client/wire.c). */
static int check_expect(call *c, const Tport__GetBeginRequest *q, const tport_tensor *t)
{
  tport_dtype want;
  int rc = wire_dtype((int)q->expect_dtype, "expect_dtype", &want, &c->err);
  if (rc)
    return rc;
  bool bool_as_u8 = want == TPORT_UINT8 && t->dtype == TPORT_BOOL; /* DLPack has no bool */
  if (t->dtype != want && !bool_as_u8)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "the tensor's dtype is %d: the destination's is %d (tport_dtype)",
                         (int)t->dtype, (int)want);
  if (q->n_expect_sizes != (size_t)t->layout.ndim)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "the tensor has %d dimensions: the destination has %zu", t->layout.ndim,
                         q->n_expect_sizes);
  for (int d = 0; d < t->layout.ndim; d++)
    if (q->expect_sizes[d] != t->layout.sizes[d])
      return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                           "the tensor's sizes[%d] is %lld: the destination's is %lld", d,
                           (long long)t->layout.sizes[d], (long long)q->expect_sizes[d]);
  return TPORT_OK;
}

/* What a GetBegin of t must pass before a byte is written anywhere. */
static int check_get(call *c, const Tport__GetBeginRequest *q, const tport_tensor *t)
{
  int rc = q->expect_set ? check_expect(c, q, t) : TPORT_OK;
  if (!rc)
    rc = wire_check_bytes(c, "the get", tensor_numel(t), tport_dtype_size(t->dtype));
  if (!rc && q->memory_format_set && (!q->shm || q->shm_fallback))
    rc = tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                       "memory_format: a get in another order writes into a region (shm)");
  return rc;
}

/* The most one GetChunk of t may ask for: a device's chunks are read back
 * into pool blocks, no larger than READER_MAX_CHUNK. */
static size_t get_chunk_bytes(const server *s, const tport_tensor *t)
{
  size_t chunk = s->cfg.chunk_bytes;
  if (tensor_device(t).type != TPORT_DEV_CPU && chunk > READER_MAX_CHUNK)
    chunk = READER_MAX_CHUNK;
  return chunk;
}

/* Whether a get of want bytes goes into the offered region a chunk at a
 * time (GetChunk names each slice) instead of whole at GetBegin: where the
 * client asks so and the tensor is more than two chunks, so that it copies
 * one out while the next is written. */
static bool by_region_chunks(const Tport__GetBeginRequest *q, size_t want, size_t chunk)
{
  return q->shm && q->shm_fallback && q->shm_chunks && !q->memory_format_set &&
         want <= q->shm->length && want / 2 > chunk;
}

/* get_direct_try -- or, a GetBatch's element, held for the batch's one
 * write of such gets (get_scatter.h: c->gathered, e kept) */
static bool direct_or_held(call *c, const Tport__GetBeginRequest *q, reg_entry *e, tport_tensor *t,
                           int *rc)
{
  if (!c->scatter || !get_direct_fits(c, q, t, tensor_nbytes(t)))
    return get_direct_try(c, q, e, t, rc);
  *rc = get_scatter_add(c, q, e, t);
  return true;
}

int h_get_begin(call *c)
{
  Tport__GetBeginRequest *q = (Tport__GetBeginRequest *)c->req;
  server *s = c->srv;
  reg_entry *e;
  tport_tensor *t;
  int rc = wire_find_wait(c, q->ref, q->wait_ms, &e, &t);
  if (rc || !e)
    return rc; /* !e: waiting for the name */
  size_t want = tensor_nbytes(t);
  rc = check_get(c, q, t);
  /* into a region -- unless, with shm_fallback, the tensor is small enough
   * for the reply or too large for the slice: then the ordinary way */
  bool small = want <= q->inline_max && want <= s->cfg.chunk_bytes;
  bool direct = !rc && direct_or_held(c, q, e, t, &rc); /* into the caller's buffer */
  bool region_chunks = by_region_chunks(q, want, get_chunk_bytes(s, t));
  if (direct ||
      (!rc && q->shm && !region_chunks && !(q->shm_fallback && (small || want > q->shm->length)))) {
    if (!direct)
      rc = get_into_region(c, q, e, t);
    if (!c->gathered) /* (else the batch's write holds e: get_scatter.h) */
      reg_put(&s->reg, e);
    return rc;
  }
  get_transfer *g = rc ? NULL : calloc(1, sizeof *g);
  if (!rc && !g)
    rc = tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  if (rc) {
    reg_put(&s->reg, e);
    return rc;
  }
  g->pipe = c->pipe;
  g->chunk = get_chunk_bytes(s, t); /* the client is told to ask for no more */
  /* small tensors come back in this reply; an empty one has nothing to wait for */
  bool inline_data = want <= q->inline_max && want <= g->chunk;
  bool keep = want > 0 && !inline_data;
  /* What a get makes is charged before it is made, for as long as it
   * lives: its copy (contiguous on its device, or on the host), held by the
   * transfer and lent to the replies that carry its bytes, and the
   * read-back blocks of an inline get from a device.  A reply nng has not
   * sent holds them past this request (issue 20, finding 2): their charge
   * goes when nng frees it. */
  reg_reservation res;
  bool charging = false;
  if (keep)
    rc = transfers_reserve(&s->xfers, g, 0, &c->err); /* the connection's limit */
  if (!rc) {
    rc = wire_charge_lend_begin(c, &res, get_copies(t) ? want : 0, "the get's copy");
    charging = rc == TPORT_OK;
  }
  if (!rc)
    rc = stage_for_get(c, t, g);
  /* a device's first chunks start copying now, charged as a chunk's are:
   * the client's first GetChunk finds its block copied or copying */
  if (!rc && keep && g->from_device && !region_chunks)
    reader_read_ahead(g->reader, g->chunk);
  if (!rc && !random_ids(g->id, TRANSFER_ID_BYTES))
    rc = tport_err_set(&c->err, TPORT_INTERNAL, "cannot create a transfer id");
  const uint8_t *payload = NULL;
  tport_storage *held = NULL;
  if (!rc && inline_data && g->nbytes)
    rc = get_bytes(c, g, 0, g->nbytes, &held, &payload);
  if (charging)
    wire_charge_end(&res);
  uint8_t id[TRANSFER_ID_BYTES];
  memcpy(id, g->id, sizeof id);
  size_t nbytes = g->nbytes, chunk = g->chunk;
  if (!rc && keep) {
    rc = transfers_insert(&s->xfers, g, &c->err);
    if (!rc)
      g = NULL; /* the table's now: a disconnect may end it at any moment */
  }
  if (!rc) {
    wire_info wi;
    wire_fill_info(&wi, e, t);
    Tport__GetBeginReply r = TPORT__GET_BEGIN_REPLY__INIT;
    r.status = wire_ok();
    r.info = &wi.info;
    r.nbytes = nbytes;
    r.chunk_bytes = chunk;
    r.transfer.data = id;
    r.transfer.len = keep ? TRANSFER_ID_BYTES : 0;
    r.shm_chunks = keep && region_chunks;
    if (q->want_crc32c && !keep) {
      r.crc32c_set = true;
      r.crc32c = transport_crc32c(0, payload, payload ? nbytes : 0);
    }
    c->lend_to_batch &= tensor_device(t).type == TPORT_DEV_CPU; /* see call */
    rc = payload ? call_reply_lent(c, &r.base, held, payload, nbytes)
                 : call_reply(c, &r.base, NULL, 0);
  }
  storage_release(held);        /* a lent reply holds its own reference */
  transfers_free(&s->xfers, g); /* an inline one, or one that failed */
  if (charging)
    reg_reservation_release(&res); /* what no copy took */
  reg_put(&s->reg, e);
  return rc;
}

/* A chunk of g written into the slice of this connection's region that q
 * names (exactly the chunk's length), then a reply with no payload: from
 * a device straight into the region where the driver knows it (pinned). */
static int get_chunk_into_region(call *c, const Tport__GetChunkRequest *q, get_transfer *g)
{
  server *s = c->srv;
  if (q->shm->length != q->length)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "shm.length is %llu: it must be the chunk's length (%llu)",
                         (unsigned long long)q->shm->length, (unsigned long long)q->length);
  shm_region *region = NULL;
  uint8_t *p = NULL;
  bool pinned = false;
  int rc = shm_hold(s->shm, c->pipe, q->shm->region, q->shm->offset, q->shm->length, &region, &p,
                    &pinned, &c->err);
  if (rc)
    return rc;
  /* what the copy allocates on the way (staging) is the tenant's while it runs */
  reg_reservation res;
  rc = wire_charge_begin(c, &res, 0, "a chunk");
  if (!rc) {
    int64_t t0 = metrics_now_ns();
    rc = reader_read_into(g->reader, (size_t)q->offset, (size_t)q->length, p, pinned, &c->err);
    if (g->from_device)
      metrics_stage_since(&s->metrics, STAGE_DEVICE_TO_HOST, t0);
    wire_charge_end(&res);
    reg_reservation_release(&res);
  }
  Tport__GetChunkReply r = TPORT__GET_CHUNK_REPLY__INIT;
  if (!rc && q->want_crc32c) {
    r.crc32c_set = true;
    r.crc32c = transport_crc32c(0, p, (size_t)q->length);
  }
  shm_unhold(s->shm, region);
  if (rc)
    return rc;
  if (q->offset == 0 && q->length > 0)
    shm_count_transfer(s->shm); /* a get's first chunk */
  atomic_fetch_add(&s->bytes_out, (size_t)q->length);
  r.status = wire_ok();
  r.offset = q->offset;
  return call_reply(c, &r.base, NULL, 0);
}

int h_get_chunk(call *c)
{
  Tport__GetChunkRequest *q = (Tport__GetChunkRequest *)c->req;
  server *s = c->srv;
  if (q->transfer.len != TRANSFER_ID_BYTES)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "transfer is %zu bytes: transfer ids are %d", q->transfer.len,
                         TRANSFER_ID_BYTES);
  get_transfer *g = transfers_get(&s->xfers, c->pipe, q->transfer.data);
  if (!g)
    return tport_err_set(&c->err, TPORT_NOT_FOUND, "no transfer with that id on this connection");
  int rc = TPORT_OK;
  if (q->offset > g->nbytes || q->length > g->nbytes - q->offset)
    rc = tport_err_set(&c->err, TPORT_OUT_OF_RANGE,
                       "offset %llu + length %llu is outside the tensor's %zu bytes",
                       (unsigned long long)q->offset, (unsigned long long)q->length, g->nbytes);
  else if (q->length > g->chunk)
    rc = tport_err_set(&c->err, TPORT_INVALID_ARGUMENT, "length %llu is over the chunk size %zu",
                       (unsigned long long)q->length, g->chunk);
  if (!rc && q->shm) {
    rc = get_chunk_into_region(c, q, g);
    transfers_release(&s->xfers, g, rc ? 0 : (size_t)q->length);
    return rc;
  }
  const uint8_t *bytes = NULL;
  tport_storage *held = NULL;
  /* a read-back block (and those read ahead) is charged to the tenant
   * until it comes back to the pool, after nng has sent its reply */
  reg_reservation res = REG_RESERVATION_INIT(&s->reg, c->pipe);
  if (!rc && g->from_device && (rc = wire_charge_lend_begin(c, &res, 0, "a chunk")) == TPORT_OK) {
    rc = get_bytes(c, g, (size_t)q->offset, (size_t)q->length, &held, &bytes);
    wire_charge_end(&res);
  } else if (!rc) {
    rc = get_bytes(c, g, (size_t)q->offset, (size_t)q->length, &held, &bytes);
  }
  reg_reservation_release(&res); /* nothing: a block's charge is its own */
  if (!rc) {
    Tport__GetChunkReply r = TPORT__GET_CHUNK_REPLY__INIT;
    r.status = wire_ok();
    r.offset = q->offset;
    if (q->want_crc32c) {
      r.crc32c_set = true;
      r.crc32c = transport_crc32c(0, bytes, bytes ? (size_t)q->length : 0);
    }
    int64_t t0 = metrics_now_ns();
    /* lent, not copied: the bytes go from the host tensor or the read-back
     * block to the socket, and the reply holds its storage till then */
    rc = call_reply_lent(c, &r.base, held, bytes, (size_t)q->length);
    if (!rc)
      metrics_stage_since(&s->metrics, STAGE_STAGE, t0); /* the reply made (bytes lent) */
  }
  storage_release(held);
  transfers_release(&s->xfers, g, rc ? 0 : (size_t)q->length);
  return rc;
}
