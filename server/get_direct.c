/* get_direct.c: a get straight into the caller's buffer (get_direct.h). */
#include "get_direct.h"

#include "crc32c.h"
#include "wire.h"

bool get_direct_fits(const call *c, const Tport__GetBeginRequest *q, const tport_tensor *t,
                     size_t want)
{
  const server *s = c->srv;
  bool small = want < GET_DIRECT_MIN_BYTES ||
               (q->direct_min_bytes ? want < q->direct_min_bytes
                                    : want <= q->inline_max && want <= s->cfg.chunk_bytes);
  return q->direct_region && s->shm && !small && want <= q->direct_length &&
         !q->memory_format_set && tensor_device(t).type == TPORT_DEV_CPU && !tensor_is_managed(t) &&
         meta_is_contiguous(&t->layout) && !t->conj && !t->neg;
}

const uint8_t *get_direct_source(call *c, const Tport__GetBeginRequest *q, tport_tensor *t)
{
  size_t want = tensor_nbytes(t);
  if (q->direct_addr > UINT64_MAX - want) {
    tport_err_set(&c->err, TPORT_OUT_OF_RANGE,
                  "bytes [0x%llx, +%zu) wrap past the end of the address space",
                  (unsigned long long)q->direct_addr, want);
    return NULL;
  }
  const uint8_t *src = tensor_host_bytes(t, 0, want); /* (waits for its pending work) */
  if (!src)
    tport_err_set(&c->err, TPORT_INTERNAL, "the tensor's values are not in host memory");
  return src;
}

static int get_direct(call *c, const Tport__GetBeginRequest *q, reg_entry *e, tport_tensor *t,
                      bool *other)
{
  server *s = c->srv;
  size_t want = tensor_nbytes(t);
  *other = false;
  const uint8_t *src = get_direct_source(c, q, t);
  if (!src)
    return c->err.code;
  /* a write given up keeps the tensor, which a free may no longer pay
   * for: its tenant pays until the write ends */
  int rc = TPORT_OK;
  bool stuck = false;
  int64_t t0 = metrics_now_ns();
  /* a write of SHM_PROCESS_READ_SPAN at most, each with its own deadline
   * (a whole tensor under one would fail every get past a few GB) */
  for (size_t off = 0; !rc && off < want; off += SHM_PROCESS_READ_SPAN) {
    size_t n = want - off < SHM_PROCESS_READ_SPAN ? want - off : SHM_PROCESS_READ_SPAN;
    reg_later hold = {0};
    rc = reg_later_begin(&s->reg, c->pipe, &hold, &c->err);
    if (!rc)
      rc = shm_process_write(s->shm, c->pipe, q->direct_region, q->direct_addr + off, src + off, n,
                             t, &hold, n, &stuck, &c->err);
  }
  metrics_stage_since(&s->metrics, STAGE_STAGE, t0);
  if (rc == TPORT_RESOURCE_EXHAUSTED && !stuck) {
    /* no slot (or no thread): what was written is the tensor's own bytes
     * at their place, written again or refused the other way */
    *other = true;
    return rc;
  }
  if (rc)
    return rc;
  /* the CRC32C of the tensor now: a Copy into it meanwhile shows as a mismatch */
  uint32_t crc = q->want_crc32c ? transport_crc32c(0, src, want) : 0;
  return get_answer_written(c, e, t, q->want_crc32c, crc, true);
}

int get_answer_written(call *c, reg_entry *e, const tport_tensor *t, bool crc_set, uint32_t crc,
                       bool direct)
{
  server *s = c->srv;
  size_t want = tensor_nbytes(t);
  wire_info wi;
  wire_fill_info(&wi, e, t);
  Tport__GetBeginReply r = TPORT__GET_BEGIN_REPLY__INIT;
  r.status = wire_ok();
  r.info = &wi.info;
  r.nbytes = want;
  r.chunk_bytes = s->cfg.chunk_bytes;
  r.crc32c_set = crc_set;
  r.crc32c = crc;
  r.shm = !direct;
  r.direct = direct;
  atomic_fetch_add(&s->bytes_out, want);
  shm_count_transfer(s->shm);
  return call_reply(c, &r.base, NULL, 0);
}

bool get_direct_try(call *c, const Tport__GetBeginRequest *q, reg_entry *e, tport_tensor *t,
                    int *rc)
{
  if (!get_direct_fits(c, q, t, tensor_nbytes(t)))
    return false;
  bool other;
  int r = get_direct(c, q, e, t, &other);
  if (other) { /* no slot: the way the rest of the request asks */
    tport_err_clear(&c->err);
    return false;
  }
  *rc = r;
  return true;
}
