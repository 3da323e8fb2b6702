/*
 * put_once.c: a put in one request (put_once.h).  The client's bytes, in
 * its layout, become the stored tensor in one copy -- what an upload's
 * landing and commit make of them, without the landing, its chunk maps and
 * their four steps under the registry's lock, which were most of a small
 * put's cost.  To the cpu without a conversion the copy is one memcpy into
 * a tensor with the client's strides; anything else is one tensor_to,
 * converting on the way.
 */
#include "put_once.h"

#include <string.h>

#include "put_bulk.h"
#include "put_runs.h"

#include "copy_stream.h"
#include "crc32c.h"
#include "wire.h"
#include "wrap.h"

/* A payload sent with its CRC32C must arrive with it: else DATA_LOSS, naming
 * the chunk, and nothing is written (the client may send it again). */
int check_crc32c_of(call *c, bool set, uint32_t sent, uint64_t off, const uint8_t *p, size_t n)
{
  if (!set)
    return TPORT_OK;
  uint32_t got = transport_crc32c(0, p, n);
  if (got == sent)
    return TPORT_OK;
  return tport_err_set(&c->err, TPORT_DATA_LOSS,
                       "the chunk at offset %llu (%zu bytes) arrived with CRC32C 0x%08x; it was "
                       "sent with 0x%08x",
                       (unsigned long long)off, n, got, sent);
}

/* PutBegin's reply: the entry's ref, the chunking, and the stored tensor
 * when the put committed (final); releases the caller's reference to e,
 * and removes it where the reply cannot be made (wire_reply_stored). */
int put_begin_reply(call *c, reg_entry *e, tport_tensor *final)
{
  server *s = c->srv;
  wire_info wi;
  Tport__PutBeginReply r = TPORT__PUT_BEGIN_REPLY__INIT;
  if (c->run_handle) { /* a PutBatch's element */
    memcpy(c->run_handle, e->handle, REG_HANDLE_BYTES);
    c->stored = true;
  }
  if (final) {
    wire_fill_info(&wi, e, final);
    r.info = &wi.info;
    if (c->run && put_run_same(c->run, &wi)) {
      c->run_answered = true;
      reg_put(&s->reg, e);
      return TPORT_OK;
    }
  }
  Tport__Ref ref = TPORT__REF__INIT;
  ref.handle.data = e->handle;
  ref.handle.len = REG_HANDLE_BYTES;
  ref.name = e->name;
  r.status = wire_ok();
  r.ref = &ref;
  r.chunk_bytes = s->cfg.chunk_bytes;
  r.window = (uint32_t)s->cfg.window;
  int rc = wire_reply_stored(c, &r.base, e, NULL);
  if (rc)
    c->stored = false;
  reg_put(&s->reg, e);
  return rc;
}

/* in's bytes into t (cpu, dense, in->len bytes): with streaming stores for
 * a large batch's element (call.stream_writes). */
static bool write_bytes(const call *c, tport_tensor *t, const put_source *in)
{
  if (!c->stream_writes || !in->len)
    return tensor_write_host_bytes(t, 0, in->p, in->len);
  uint8_t *dst = tensor_host_bytes(t, 0, in->len);
  if (dst)
    memcpy_stream(dst, in->p, in->len);
  return dst != NULL;
}

/* To the cpu as it is: a tensor with the client's layout, its bytes
 * copied in (no tensor over the client's bytes, no copy plan).  Charged
 * before it is made. */
static int copy_plain(call *c, const meta_layout *l, tport_dtype from, tport_device dev,
                      const put_source *in, reg_reservation *paid, tport_tensor **out)
{
  int rc = wire_charge_begin(c, paid, in->len, "the put's tensor");
  if (rc)
    return rc;
  rc = tensor_empty_strided(dev, from, l->ndim, l->sizes, l->strides, 0, out, &c->err);
  wire_charge_end(paid);
  if (!rc && !write_bytes(c, *out, in))
    rc = tport_err_set(&c->err, TPORT_INTERNAL, "the put's %zu bytes could not be written",
                       in->len);
  return rc;
}

/* Anything else: one tensor_to from a tensor over the client's bytes,
 * charged for what it makes before it makes it.  From a region the copy
 * ends before this returns (the region may go right after); from the
 * payload (freed with the request) a device copy is staged before this
 * returns, and may still be in flight where the put is non_blocking. */
static int copy_converting(call *c, const Tport__PutBeginRequest *q, const meta_layout *l,
                           tport_dtype from, tport_device dev, const to_options *convert,
                           const put_source *in, reg_reservation *paid, tport_tensor **out)
{
  tport_tensor *src = NULL;
  int rc = wrap_any(in->p, in->len, in->pinned, in->on_dev, in->mem_dev, from, l->ndim, l->sizes,
                    l->strides, &src, &c->err);
  if (rc)
    return rc;
  to_options o = *convert;
  o.has_device = true;
  o.device = dev;
  o.copy = true; /* never an alias of the client's memory nor the payload */
  o.non_blocking = !in->held && q->non_blocking;
  bool aliased = false;
  size_t need = 0;
  rc = tensor_to_nbytes(src, &o, &need, &c->err);
  if (!rc && (rc = wire_charge_begin(c, paid, need, "the put's tensor")) == TPORT_OK) {
    rc = tensor_to(src, &o, out, &aliased, &c->err);
    wire_charge_end(paid);
  }
  if (!rc && (aliased || (*out)->storage == src->storage))
    rc = tport_err_set(&c->err, TPORT_INTERNAL, "a put aliased the client's bytes");
  if (!rc && !o.non_blocking)
    rc = tensor_sync(*out, &c->err);
  rc = settle_region(src, in->pinned, rc, &c->err);
  tensor_release(src);
  return rc;
}

int put_once(call *c, const Tport__PutBeginRequest *q, const meta_layout *l, tport_dtype from,
             tport_device dev, const to_options *convert, const put_source *in)
{
  server *s = c->srv;
  tport_tensor *final = NULL;
  reg_reservation paid = REG_RESERVATION_INIT(&s->reg, c->pipe);
  bool converts = convert->has_dtype || convert->has_format;
  /* what reg_add would refuse for its arguments alone: before the copy */
  int rc = reg_add_check(&s->reg, q->name, q->ttl_ms, &c->err);
  int64_t t0 = metrics_now_ns();
  if (!rc && !in->on_dev && dev.type == TPORT_DEV_CPU && !converts)
    rc = copy_plain(c, l, from, dev, in, &paid, &final);
  else if (!rc)
    rc = copy_converting(c, q, l, from, dev, convert, in, &paid, &final);
  wire_stage_since(c,
                   dev.type != TPORT_DEV_CPU ? STAGE_HOST_TO_DEVICE
                   : converts                ? STAGE_CONVERT
                                             : STAGE_STAGE,
                   t0);
  if (rc) {
    tensor_release(final);
    reg_reservation_release(&paid);
    return rc;
  }
  if (in->held) {
    atomic_fetch_add(&s->bytes_in, in->len);
    shm_count_transfer(s->shm);
  }
  if (put_bulk_take(c, q, final, &paid))
    return TPORT_OK; /* added with the batch's others */
  reg_entry *e;
  rc = (q->replace ? reg_add_replacing : reg_add)(&s->reg, c->pipe, final, NULL, q->name, q->keep,
                                                  q->ttl_ms, 0, &paid, &e, &c->err);
  if (rc)
    return rc; /* final freed with the entry that could not be */
  return put_begin_reply(c, e, final);
}

int put_once_from_region(call *c, const Tport__PutBeginRequest *q, const meta_layout *l,
                         tport_dtype from, tport_device dev, const to_options *convert)
{
  put_source in = {0};
  int rc = hold_whole(c, q->shm, &in.held, &in.p, &in.pinned, &in.mem_dev, &in.on_dev);
  if (rc)
    return rc;
  in.len = (size_t)q->shm->length;
  if (in.on_dev && q->crc32c_set)
    rc = tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                       "crc32c: the bytes of a CUDA IPC region are not read by the host");
  else
    rc = check_crc32c_of(c, q->crc32c_set, q->crc32c, 0, in.p, in.len);
  if (!rc)
    rc = put_once(c, q, l, from, dev, convert, &in);
  shm_unhold(c->srv->shm, in.held);
  return rc;
}
