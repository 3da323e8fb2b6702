/*
 * get_socket.c: a get by requests on the socket -- GetBegin (with the
 * automatic region offered, when path.c took it: the server then writes a
 * large tensor that fits there), then the tensor's bytes from the region,
 * inline in the reply (a small one), or by chunk requests with up to the
 * window in flight, into the caller's memory or through the pinned ring
 * into device memory.  A leaf: it calls the window, the region's checks
 * and the ring, never a path.
 */
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"
#include "get_blocks.h"
#include "copy_pool.h"
#include "copy_stream.h"
#include "crc32c.h"
#include "cuda_stage.h"

/* A transfer's chunks: in the replies' payloads, or (region) written by
 * the server into the slices of the automatic region the requests name --
 * a large get a chunk at a time through the region, the pool copying each
 * chunk out as its reply comes (a gated copy_stream) while the server
 * writes the next. */
typedef struct get_ctx {
  ProtobufCBinaryData transfer;
  uint8_t *buf;
  bool verify;
  client_stage *stage;            /* into device memory: each chunk through the ring */
  const struct tport_shm *region; /* NULL: the bytes come in the replies */
  copy_stream *out;               /* region -> buf by the pool (NULL: copied here) */
  size_t out_total;               /* the get's bytes, or its batch's (client_get_desc) */
} get_ctx;

int client_check_crc32c(bool verify, bool set, uint32_t sent, const uint8_t *p, size_t n,
                        size_t off, tport_err *err)
{
  if (!verify)
    return TPORT_OK;
  if (!set)
    return tport_err_set(err, TPORT_DATA_LOSS,
                         "the chunk at offset %zu came without a CRC32C (a server too old to "
                         "verify?)",
                         off);
  uint32_t got = transport_crc32c(0, p, n);
  if (got == sent)
    return TPORT_OK;
  return tport_err_set(err, TPORT_DATA_LOSS,
                       "the chunk at offset %zu (%zu bytes) arrived with CRC32C 0x%08x; the "
                       "server sent 0x%08x",
                       off, n, got, sent);
}

static int get_make(void *vctx, size_t off, size_t len, nng_msg **out, tport_err *err)
{
  get_ctx *g = vctx;
  Tport__GetChunkRequest q = TPORT__GET_CHUNK_REQUEST__INIT;
  q.transfer = g->transfer;
  q.offset = off;
  q.length = len;
  q.want_crc32c = g->verify;
  Tport__ShmSlice slice;
  if (g->region) {
    slice = client_slice(g->region, off, len);
    q.shm = &slice;
  }
  return client_pack(TPORT__METHOD__METHOD_GET_CHUNK, &q.base, NULL, 0, out, err);
}

/* A chunk's reply into buf by nng itself (client_slot_recv_into): the
 * payload lands where get_take would have copied it.  Not through the
 * region or the ring (their bytes are not in the reply). */
static unsigned get_into(void *vctx, size_t off, size_t len, uint8_t **dst, size_t *n)
{
  get_ctx *g = vctx;
  if (g->region || g->stage || g->out)
    return 0;
  dst[0] = g->buf + off;
  n[0] = len;
  return 1;
}

static int get_take(void *vctx, client_slot *s, tport_err *err)
{
  get_ctx *g = vctx;
  ProtobufCMessage *r;
  client_payload p = {0};
  int rc = client_unpack(TPORT__METHOD__METHOD_GET_CHUNK, s->reply,
                         &tport__get_chunk_reply__descriptor, &r, &p, err);
  if (rc)
    return rc;
  Tport__GetChunkReply *gr = (Tport__GetChunkReply *)r;
  const uint8_t *bytes = g->region ? tport_shm_data(g->region) + s->offset : p.data;
  size_t in_reply = g->region ? 0 : s->len;
  bool placed = s->placed > 0; /* read by nng straight into buf (get_into) */
  if (placed) {
    bytes = g->buf + s->offset;
    in_reply = 0;
  }
  if (placed && (s->placed != s->len || p.len != 0))
    rc = tport_err_set(err, TPORT_DATA_LOSS,
                       "chunk at %zu: %zu bytes came in the reply, %zu expected", s->offset,
                       p.len + s->placed, s->len);
  else if (p.len != in_reply)
    rc = tport_err_set(err, TPORT_DATA_LOSS, "chunk at %zu: %zu bytes came in the reply, %zu %s",
                       s->offset, p.len, in_reply,
                       g->region ? "(the region holds them)" : "expected");
  else
    rc = client_check_crc32c(g->verify, gr->crc32c_set, gr->crc32c, bytes, s->len, s->offset, err);
  if (rc || placed)
    ; /* (in buf already) */
  else if (g->stage)
    rc = stage_get_chunk(g->stage, s->offset, bytes, s->len, err);
  else if (g->out)
    copy_pool_stream_supply(g->out, s->offset + s->len); /* replies come in order */
  else if (g->region)
    copy_pool_copy_out(g->buf + s->offset, bytes, s->len, g->out_total);
  else if (g->out_total >= COPY_POOL_OUT_STREAM_MIN)
    memcpy_stream(g->buf + s->offset, bytes, s->len); /* (one chunk: no threads) */
  else
    memcpy(g->buf + s->offset, bytes, s->len);
  protobuf_c_message_free_unpacked(r, NULL);
  return rc;
}

/* ---------------------------------------------------------------- chunks through the region */

static int get_by_region(tport_client *c, const client_get_desc *g, const Tport__GetBeginReply *b,
                         const struct tport_shm *region, uint8_t *buf, client_stage *stage,
                         size_t chunk, tport_err *err)
{
  size_t n = (size_t)b->nbytes;
  if (!region || b->transfer.len == 0 || n > tport_shm_size(region))
    /* a hostile or broken server: chunks into a region none was offered
     * for, or that cannot hold them */
    return tport_err_set(err, TPORT_DATA_LOSS,
                         "the server asks for a get's chunks into a region that %s",
                         region ? "cannot hold them" : "was not offered");
  get_ctx rg = {b->transfer, buf, c->verify, stage, region, NULL,
                g->out_total > n ? g->out_total : n};
  copy_stream out;
  if (!stage && copy_pool_stream_begin_gated(&out, buf, tport_shm_data(region), n, rg.out_total))
    rg.out = &out;
  int rc = client_run_window(c, n, chunk, get_make, get_take, &rg, g->progress, g->progress_arg,
                             g->cancel, err);
  /* every chunk is in the region when it went well: the rest copied out */
  if (rg.out)
    copy_pool_stream_end(rg.out, rc == TPORT_OK);
  return rc;
}

/* ---------------------------------------------------------------- GetBegin */

static int get_begin(tport_client *c, const client_get_desc *g, Tport__GetBeginReply **out,
                     client_payload *payload, tport_err *err)
{
  Tport__Ref w;
  client_ref_to_wire(g->ref, &w);
  Tport__GetBeginRequest q = TPORT__GET_BEGIN_REQUEST__INIT;
  q.ref = &w;
  q.inline_max = c->chunk_bytes; /* small tensors come back in the reply */
  q.want_crc32c = c->verify;
  q.wait_ms = g->wait_ms;
  client_get_direct_fill(g, &q);
  return client_rpc_waiting(c, g->wait_ms, TPORT__METHOD__METHOD_GET_BEGIN, &q.base,
                            &tport__get_begin_reply__descriptor, (ProtobufCMessage **)out, payload,
                            NULL, err);
}

int client_get_destination(tport_client *c, const client_get_desc *g, const Tport__GetBeginReply *b,
                           size_t n, size_t chunk, uint8_t **buf, client_stage **stage,
                           tport_err *err)
{
  int rc = TPORT_OK;
  if (g->alloc) {
    *buf = g->alloc_blocks ? get_block_alloc(n) : malloc(n ? n : 1);
    if (!*buf)
      rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "cannot allocate %zu bytes", n);
  } else if (g->want && (rc = client_want_mismatch(g->want, b->info, err)) != TPORT_OK) {
    /* the caller's tensor is not this one: nothing written */
  } else if (n > g->cap) {
    rc = tport_err_set(err, TPORT_OUT_OF_RANGE, "the tensor is %zu bytes: the buffer holds %zu", n,
                       g->cap);
  } else if (g->want && n != g->cap) {
    rc = tport_err_set(err, TPORT_DATA_LOSS, "the tensor is %zu bytes: its sizes and dtype say %zu",
                       n, g->cap);
  } else if (g->dev && n) {
    rc = stage_begin(c, g->dev, n, chunk < c->chunk_bytes ? c->chunk_bytes : chunk, stage, err);
  }
  return rc;
}

/* A get the server wrote straight into buf (client_get_direct_region):
 * offered, as many bytes as it said, with the CRC32C it sent when
 * verifying. */
static int get_written_direct(tport_client *c, const client_get_desc *g,
                              const Tport__GetBeginReply *b, const uint8_t *buf, tport_err *err)
{
  size_t n = (size_t)b->nbytes;
  if (!g->direct_region || buf != g->buf || b->nbytes > g->cap)
    /* a hostile or broken server: written where it was not offered */
    return tport_err_set(err, TPORT_DATA_LOSS,
                         "the server says it wrote %llu bytes into this process's buffer, which "
                         "it was not offered",
                         (unsigned long long)b->nbytes);
  int rc = TPORT_OK;
  if (c->verify && !b->crc32c_set)
    rc = tport_err_set(err, TPORT_DATA_LOSS, "the get came without a CRC32C");
  else if (c->verify)
    rc = client_check_crc32c(true, true, b->crc32c, buf, n, 0, err);
  if (!rc && g->progress)
    g->progress(g->progress_arg, n, n);
  return rc;
}

/* The bytes of b into buf (or the ring): from the region the server wrote
 * them into, inline in its reply (inl), or by chunk requests. */
static int get_bytes(tport_client *c, const client_get_desc *g, const Tport__GetBeginReply *b,
                     const client_payload *inl, const struct tport_shm *region, uint8_t *buf,
                     client_stage *stage, size_t chunk, tport_err *err)
{
  size_t n = (size_t)b->nbytes, total = g->out_total > n ? g->out_total : n;
  int rc = TPORT_OK;
  if (b->direct) {
    rc = get_written_direct(c, g, b, buf, err);
  } else if (b->shm_chunks) {
    rc = get_by_region(c, g, b, region, buf, stage, chunk, err);
  } else if (b->shm && !region) {
    /* a hostile or broken server: no region was offered to write into */
    rc = tport_err_set(err, TPORT_DATA_LOSS,
                       "the server says it wrote the tensor into a region, but none was offered");
  } else if (b->shm) {
    rc = client_shm_check_get(c, b, region, 0, tport_shm_size(region), err);
    if (!rc)
      copy_pool_copy_out(buf, tport_shm_data(region), n, total);
    if (!rc && g->progress)
      g->progress(g->progress_arg, n, n);
  } else if (n && b->transfer.len == 0) {
    /* the data came inline */
    if (inl->len != n)
      rc = tport_err_set(err, TPORT_DATA_LOSS, "%zu inline bytes came, %zu expected", inl->len, n);
    else
      rc = client_check_crc32c(c->verify, b->crc32c_set, b->crc32c, inl->data, n, 0, err);
    if (!rc && stage)
      rc = stage_get_chunk(stage, 0, inl->data, n, err);
    else if (!rc && total >= COPY_POOL_OUT_STREAM_MIN)
      memcpy_stream(buf, inl->data, n);
    else if (!rc)
      memcpy(buf, inl->data, n);
    if (!rc && g->progress)
      g->progress(g->progress_arg, n, n);
  } else if (n) {
    get_ctx gc = {b->transfer, buf, c->verify, stage, NULL, NULL, total};
    rc = client_run_window_into(c, n, chunk, get_make, get_take, get_into, &gc, g->progress,
                                g->progress_arg, g->cancel, err);
  }
  return rc;
}

int client_socket_get_rest(tport_client *c, const client_get_desc *g, const Tport__GetBeginReply *b,
                           const client_payload *inl, const struct tport_shm *region,
                           void **alloced, size_t *nbytes, tport_tensor_info *info, tport_err *err)
{
  size_t n = (size_t)b->nbytes;
  if (info)
    client_info_from_wire(b->info, info);
  uint8_t *buf = g->buf;
  client_stage *stage = NULL;
  size_t chunk = b->chunk_bytes ? b->chunk_bytes : c->chunk_bytes;
  int rc = client_get_destination(c, g, b, n, chunk, &buf, &stage, err);
  if (!rc)
    rc = get_bytes(c, g, b, inl, region, buf, stage, chunk, err);
  if (stage)
    rc = stage_end(stage, rc, err); /* the bytes are on the device */
  if (rc) {
    if (g->alloc && g->alloc_blocks)
      get_block_free(buf);
    else if (g->alloc)
      free(buf);
    return rc;
  }
  if (alloced)
    *alloced = buf;
  if (nbytes)
    *nbytes = n;
  return TPORT_OK;
}

int client_socket_get(tport_client *c, const client_get_desc *g, struct tport_shm *region,
                      void **alloced, size_t *nbytes, tport_tensor_info *info, size_t *region_want,
                      bool *region_spoiled, tport_err *err)
{
  Tport__GetBeginReply *b;
  client_payload inl = {0};
  *region_want = 0;
  *region_spoiled = false;
  bool unanswered = false;
  int rc = region ? client_shm_get_begin(c, g, region, &b, &inl, &unanswered, err)
                  : get_begin(c, g, &b, &inl, err);
  if (rc) {
    /* a GetBegin the server may still carry out (its reply did not come:
     * a timeout, a cancel) may still write the region, after its next
     * user's bytes (or the caller's buffer, offered direct: tport.h) */
    *region_spoiled = region && unanswered;
    return rc;
  }
  rc = client_socket_get_rest(c, g, b, &inl, region, alloced, nbytes, info, err);
  /* a tensor too large for the region came by socket: next time it fits */
  *region_want = b->shm || b->shm_chunks || b->direct ? 0 : (size_t)b->nbytes;
  /* chunks into the region stopped half way (an error, a cancel, a reply
   * that did not come): requests the window gave up on may still be
   * written there by the server, after this region's next user's bytes */
  *region_spoiled = rc && b->shm_chunks && region;
  if (inl.msg)
    nng_msg_free(inl.msg);
  protobuf_c_message_free_unpacked(&b->base, NULL);
  return rc;
}
