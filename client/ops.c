/* ops.c: libtport's operations: put and get with a window of chunks in
 * flight, and the one-request RPCs. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client_internal.h"
#include "copy_pool.h"
#include "crc32c.h"
#include "cuda_ipc.h"
#include "cuda_stage.h"

/* ---------------------------------------------------------------- the window */

/* Builds the request for bytes [off, off + len) / takes its reply. */
typedef int (*window_make_fn)(void *ctx, size_t off, size_t len, nng_msg **out, tport_err *err);
typedef int (*window_reply_fn)(void *ctx, client_slot *s, tport_err *err);

/* Moves nbytes in chunks with up to the server's window of requests in
 * flight, each on its own context; chunks go out in order and their replies
 * are taken oldest first. */
static int run_window(tport_client *c, size_t nbytes, size_t chunk, window_make_fn make,
                      window_reply_fn take, void *ctx, tport_progress_fn progress, void *arg,
                      tport_err *err)
{
  client_slot slots[CLIENT_MAX_WINDOW];
  int nslots = 0, rc = TPORT_OK, head = 0, inflight = 0;
  size_t next = 0, done = 0;
  int credits = c->window;
  if ((rc = client_credits_take(c, credits, err)) != TPORT_OK)
    return rc;
  while (nslots < credits && (rc = client_slot_open(c, &slots[nslots], err)) == TPORT_OK)
    nslots++;
  if (nslots > 0)
    rc = TPORT_OK; /* fewer contexts than the window: still fine */
  while (!rc && (next < nbytes || inflight > 0)) {
    while (!rc && inflight < nslots && next < nbytes) {
      client_slot *s = &slots[(head + inflight) % nslots];
      nng_msg *m;
      s->offset = next;
      s->len = nbytes - next < chunk ? nbytes - next : chunk;
      rc = make(ctx, s->offset, s->len, &m, err);
      if (!rc) {
        client_slot_send(s, m);
        next += s->len;
        inflight++;
      }
    }
    if (rc || inflight == 0)
      break;
    client_slot *s = &slots[head];
    rc = client_slot_finish(s, err);
    if (!rc)
      rc = take(ctx, s, err);
    head = (head + 1) % nslots;
    inflight--;
    if (!rc) {
      done += s->len;
      if (progress)
        progress(arg, done, nbytes);
    }
  }
  for (int i = 0; i < nslots; i++)
    client_slot_close(&slots[i]);
  client_credits_give(c, credits);
  return rc;
}

/* ---------------------------------------------------------------- lent chunks
 * A put's chunks lend the caller's bytes to their requests (nng_msg_set_tail)
 * instead of copying them into the requests, where the transport writes them
 * straight from there (tcp://, ipc://): one copy of every byte fewer.  The
 * put must not return while nng may still read them, so it waits for nng to
 * let go of every lent request.  A chunk's reply comes only after the server
 * has read the whole request, so a put that succeeds waits for nothing; a
 * request stuck in the transport (a put that failed: its server stopped
 * reading) is let go of once its connection closes, which the wait does
 * after the client's timeout: the connection goes, and with it the tensors
 * put on it without a name (a server that has not read a whole request in
 * two timeouts is taken for gone; the dialer then connects anew). */
typedef struct lent_chunks {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int outstanding;
} lent_chunks;

#ifdef TPORT_NNG_LENT_TAIL
static void lent_chunk_done(void *arg)
{
  lent_chunks *l = arg;
  pthread_mutex_lock(&l->mu);
  if (--l->outstanding == 0)
    pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
}

/* The request of a chunk whose n bytes at p are lent, not copied; a copy
 * where nng cannot take them. */
static int pack_lent(lent_chunks *l, uint16_t method, const ProtobufCMessage *q, const void *p,
                     size_t n, nng_msg **out, tport_err *err)
{
  int rc = client_pack(method, q, NULL, 0, out, err);
  if (rc)
    return rc;
  pthread_mutex_lock(&l->mu);
  l->outstanding++;
  pthread_mutex_unlock(&l->mu);
  if (nng_msg_set_tail(*out, p, n, lent_chunk_done, l) == 0)
    return TPORT_OK;
  lent_chunk_done(l);
  nng_msg_free(*out);
  return client_pack(method, q, p, n, out, err);
}
#endif

static void lent_chunks_wait(tport_client *c, lent_chunks *l)
{
  struct timespec until = client_deadline_after(c->timeout_ms);
  pthread_mutex_lock(&l->mu);
  while (l->outstanding) {
    if (pthread_cond_timedwait(&l->cv, &l->mu, &until) != ETIMEDOUT || !l->outstanding)
      continue;
    /* Stuck in the transport: closing the connection frees the request.
     * The connection is the one live now, not the one the last reply came
     * on: after a redial the stuck request is on the new one.  Closed again
     * every second until all are let go of (a redial may race the close). */
    pthread_mutex_unlock(&l->mu);
    unsigned id = atomic_load(&c->live_pipe);
    if (id)
      nng_pipe_close((nng_pipe){.id = id});
    pthread_mutex_lock(&l->mu);
    until = client_deadline_after(1000);
  }
  pthread_mutex_unlock(&l->mu);
}

/* ---------------------------------------------------------------- put */

/* Through the region, the caller's bytes are copied in this far ahead of
 * the chunk being sent: one copy by the pool's threads (copy_pool.c) for
 * several chunks, large enough to be worth waking them, while the server
 * copies the chunks before out. */
#define PUT_COPY_AHEAD ((size_t)16 << 20)

typedef struct put_ctx {
  const Tport__Ref *ref;
  const uint8_t *data;
  size_t nbytes;
  bool verify;
  struct tport_shm *region; /* same host: each chunk goes through it */
  size_t copied;            /* ... and bytes [0, copied) are in it */
  lent_chunks *lent;        /* NULL: chunks copied into their requests */
  client_stage *stage;      /* device memory: each chunk staged through the ring */
} put_ctx;

static int put_make(void *vctx, size_t off, size_t len, nng_msg **out, tport_err *err)
{
  put_ctx *p = vctx;
  Tport__PutChunkRequest q = TPORT__PUT_CHUNK_REQUEST__INIT;
  q.ref = (Tport__Ref *)p->ref;
  q.offset = off;
  Tport__ShmSlice slice;
  const uint8_t *bytes = p->data + off;
  if (p->stage) {
    /* the slot is reused two chunks on: copied into the request, never lent */
    int rc = stage_put_chunk(p->stage, off, len, &bytes, err);
    if (rc)
      return rc;
  } else if (p->region) {
    /* into the region, a batch at a time (off + len <= nbytes); the server
     * copies this chunk out while the next batch is copied in */
    if (off + len > p->copied) {
      size_t need = off + len - p->copied, step = p->nbytes - p->copied;
      size_t ahead = need > PUT_COPY_AHEAD ? need : PUT_COPY_AHEAD;
      if (step > ahead)
        step = ahead;
      copy_pool_copy(p->region->data + p->copied, p->data + p->copied, step);
      p->copied += step;
    }
    bytes = p->region->data + off;
    slice = client_slice(p->region, off, len);
    q.shm = &slice;
  }
  if (p->verify) {
    q.crc32c_set = true;
    q.crc32c = transport_crc32c(0, bytes, len);
  }
#ifdef TPORT_NNG_LENT_TAIL
  if (p->lent && !p->region && !p->stage)
    return pack_lent(p->lent, TPORT__METHOD__METHOD_PUT_CHUNK, &q.base, bytes, len, out, err);
#endif
  return client_pack(TPORT__METHOD__METHOD_PUT_CHUNK, &q.base, p->region ? NULL : bytes,
                     p->region ? 0 : len, out, err);
}

static int put_take(void *vctx, client_slot *s, tport_err *err)
{
  ProtobufCMessage *r;
  int rc = client_unpack(TPORT__METHOD__METHOD_PUT_CHUNK, s->reply,
                         &tport__put_chunk_reply__descriptor, &r, NULL, err);
  if (!rc)
    protobuf_c_message_free_unpacked(r, NULL);
  return rc;
}

static void fill_copy(void *dst, size_t n, void *src)
{
  copy_pool_copy(dst, src, n);
}

int tport_put(tport_client *c, tport_dtype dtype, int ndim, const int64_t *sizes,
              const int64_t *strides, const void *data, size_t nbytes,
              const tport_put_options *opts, tport_tensor_info *out, tport_err *err)
{
  return client_put_mem(c, dtype, ndim, sizes, strides, data, NULL, nbytes, opts, out, err);
}

int client_put_mem(tport_client *c, tport_dtype dtype, int ndim, const int64_t *sizes,
                   const int64_t *strides, const void *data, const client_devmem *dev,
                   size_t nbytes, const tport_put_options *opts, tport_tensor_info *out,
                   tport_err *err)
{
  tport_put_options defaults;
  if (!opts) {
    tport_put_options_init(&defaults);
    opts = &defaults;
  }
  if (ndim < 0 || ndim > TPORT_MAX_DIMS)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "ndim is %d: it must be in [0, %d]", ndim,
                         TPORT_MAX_DIMS);
  /* same host: through the client's region, one copy on each side -- at
   * once for a tensor of a few chunks or one the server converts (it then
   * converts in its one copy), chunk by chunk (the client's copies and the
   * server's overlap) for a larger one */
  bool used = false;
  int rc = TPORT_OK;
  struct tport_shm *region = NULL;
  bool converts = opts->has_dtype || opts->memory_format != TPORT_MF_PRESERVE;
  if (!dev && !converts && nbytes > 2 * c->chunk_bytes && nbytes <= CLIENT_SHM_MAX_BYTES)
    region = client_shm_auto_take(c, nbytes);
  if (region && tport_shm_size(region) < nbytes) {
    client_shm_auto_done(c, 0);
    region = NULL;
  }
  if (!region && !dev)
    rc = client_shm_put_auto(c, dtype, ndim, sizes, strides, fill_copy, (void *)data, nbytes,
                             opts, out, &used, err);
  if (used)
    return rc;
  /* device memory: on the same host, the allocation itself by CUDA IPC
   * (the server copies device to device); else through the client's
   * pinned ring */
  if (dev) {
    rc = client_ipc_put(c, dtype, ndim, sizes, strides, dev, nbytes, opts, out, &used, err);
    if (used)
      return rc;
  }
  client_stage *stage = NULL;
  if (dev && (rc = stage_begin(c, dev, nbytes, c->chunk_bytes, &stage, err)) != TPORT_OK)
    return rc;
  Tport__TensorDesc desc;
  Tport__PutBeginRequest q;
  client_put_request(c, dtype, ndim, sizes, strides, opts, &desc, &q);
  /* a tensor that fits in one chunk goes in one round trip */
  q.commit = nbytes <= c->chunk_bytes && !region;
  if (q.commit && stage && nbytes) {
    const uint8_t *staged;
    if ((rc = stage_put_chunk(stage, 0, nbytes, &staged, err)) != TPORT_OK)
      return stage_end(stage, rc, err);
    data = staged;
  }
  if (q.commit && c->verify) {
    q.crc32c_set = true;
    q.crc32c = transport_crc32c(0, data, nbytes);
  }
  Tport__PutBeginReply *b;
  rc = client_rpc(c, TPORT__METHOD__METHOD_PUT_BEGIN, &q.base, q.commit ? data : NULL,
                      q.commit ? nbytes : 0, &tport__put_begin_reply__descriptor,
                      (ProtobufCMessage **)&b, NULL, err);
  if (rc) {
    if (region)
      client_shm_auto_done(c, 0);
    return stage ? stage_end(stage, rc, err) : rc;
  }
  if (q.commit) {
    if (stage)
      stage_end(stage, TPORT_OK, NULL); /* its one copy was waited for */
    if (opts->progress)
      opts->progress(opts->progress_arg, nbytes, nbytes);
    if (out)
      client_info_from_wire(b->info, out);
    protobuf_c_message_free_unpacked(&b->base, NULL);
    return TPORT_OK;
  }
  Tport__Ref ref = TPORT__REF__INIT;
  uint8_t handle[TPORT_HANDLE_BYTES] = {0};
  if (b->ref && b->ref->handle.len == TPORT_HANDLE_BYTES)
    memcpy(handle, b->ref->handle.data, TPORT_HANDLE_BYTES);
  ref.handle.data = handle;
  ref.handle.len = TPORT_HANDLE_BYTES;
  size_t chunk = b->chunk_bytes ? b->chunk_bytes : c->chunk_bytes;
  protobuf_c_message_free_unpacked(&b->base, NULL);
  lent_chunks lent = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
  put_ctx pc = {&ref, data, nbytes, c->verify, region, 0, c->lend_chunks && !region ? &lent : NULL,
                stage};
  /* a server's chunks may differ from its Hello's: the ring follows them */
  if (!stage || (rc = stage_set_chunk(stage, chunk, err)) == TPORT_OK)
    rc = run_window(c, nbytes, chunk, put_make, put_take, &pc, opts->progress, opts->progress_arg,
                    err);
  lent_chunks_wait(c, &lent); /* the caller's bytes are theirs again */
  if (stage)
    rc = stage_end(stage, rc, err); /* no copy reads the device any more */
  pthread_cond_destroy(&lent.cv);
  pthread_mutex_destroy(&lent.mu);
  if (!rc) {
    Tport__PutCommitRequest cq = TPORT__PUT_COMMIT_REQUEST__INIT;
    cq.ref = &ref;
    cq.non_blocking = opts->non_blocking;
    Tport__PutCommitReply *cr;
    rc = client_rpc(c, TPORT__METHOD__METHOD_PUT_COMMIT, &cq.base, NULL, 0,
                    &tport__put_commit_reply__descriptor, (ProtobufCMessage **)&cr, NULL, err);
    if (!rc) {
      if (out)
        client_info_from_wire(cr->info, out);
      protobuf_c_message_free_unpacked(&cr->base, NULL);
    }
  }
  if (rc && rc != TPORT_UNAVAILABLE) {
    /* leave nothing behind on the server (best effort; the error stays rc's) */
    Tport__PutAbortRequest aq = TPORT__PUT_ABORT_REQUEST__INIT;
    aq.ref = &ref;
    ProtobufCMessage *ar;
    if (client_rpc(c, TPORT__METHOD__METHOD_PUT_ABORT, &aq.base, NULL, 0,
                   &tport__put_abort_reply__descriptor, &ar, NULL, NULL) == TPORT_OK)
      protobuf_c_message_free_unpacked(ar, NULL);
  }
  if (region)
    client_shm_auto_done(c, 0);
  return rc;
}

/* ---------------------------------------------------------------- get */

typedef struct get_ctx {
  ProtobufCBinaryData transfer;
  uint8_t *buf;
  bool verify;
  client_stage *stage; /* into device memory: each chunk through the ring */
} get_ctx;

/* With verify: the bytes that came must have the CRC32C the server sent. */
static int check_crc32c(bool verify, bool set, uint32_t sent, const uint8_t *p, size_t n,
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
  return client_pack(TPORT__METHOD__METHOD_GET_CHUNK, &q.base, NULL, 0, out, err);
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
  if (p.len != s->len)
    rc = tport_err_set(err, TPORT_DATA_LOSS, "chunk at %zu: %zu bytes came, %zu expected",
                       s->offset, p.len, s->len);
  else
    rc = check_crc32c(g->verify, gr->crc32c_set, gr->crc32c, p.data, p.len, s->offset, err);
  if (!rc && g->stage)
    rc = stage_get_chunk(g->stage, s->offset, p.data, p.len, err);
  else if (!rc)
    memcpy(g->buf + s->offset, p.data, p.len);
  protobuf_c_message_free_unpacked(r, NULL);
  return rc;
}

static int get_begin(tport_client *c, const tport_ref *ref, Tport__GetBeginReply **out,
                     client_payload *payload, tport_err *err)
{
  Tport__Ref w;
  client_ref_to_wire(ref, &w);
  Tport__GetBeginRequest q = TPORT__GET_BEGIN_REQUEST__INIT;
  q.ref = &w;
  q.inline_max = c->chunk_bytes; /* small tensors come back in the reply */
  q.want_crc32c = c->verify;
  return client_rpc(c, TPORT__METHOD__METHOD_GET_BEGIN, &q.base, NULL, 0,
                    &tport__get_begin_reply__descriptor, (ProtobufCMessage **)out, payload, err);
}

static int get_into(tport_client *c, const tport_ref *ref, void **bufp, const client_devmem *dev,
                    size_t cap, bool alloc, const client_get_want *want, size_t *nbytes,
                    tport_tensor_info *info, tport_progress_fn progress, void *arg, tport_err *err)
{
  Tport__GetBeginReply *b;
  client_payload inl = {0};
  /* same host: offer the client's region (the server writes the tensor
   * there when it is large and fits); device memory is staged instead */
  struct tport_shm *region = dev ? NULL : client_shm_auto_take(c, alloc ? 0 : cap);
  int rc = region ? client_shm_get_begin(c, ref, region, &b, &inl, err)
                  : get_begin(c, ref, &b, &inl, err);
  if (rc) {
    if (region)
      client_shm_auto_done(c, 0);
    return rc;
  }
  size_t n = (size_t)b->nbytes;
  if (info)
    client_info_from_wire(b->info, info);
  uint8_t *buf = *bufp;
  client_stage *stage = NULL;
  size_t chunk = b->chunk_bytes ? b->chunk_bytes : c->chunk_bytes;
  if (alloc) {
    buf = malloc(n ? n : 1);
    if (!buf)
      rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "cannot allocate %zu bytes", n);
  } else if (want && (rc = client_want_mismatch(want, b->info, err)) != TPORT_OK) {
    /* the caller's tensor is not this one: nothing written */
  } else if (n > cap) {
    rc = tport_err_set(err, TPORT_OUT_OF_RANGE, "the tensor is %zu bytes: the buffer holds %zu", n,
                       cap);
  } else if (want && n != cap) {
    rc = tport_err_set(err, TPORT_DATA_LOSS, "the tensor is %zu bytes: its sizes and dtype say %zu",
                       n, cap);
  } else if (dev && n) {
    rc = stage_begin(c, dev, n, chunk < c->chunk_bytes ? c->chunk_bytes : chunk, &stage, err);
  }
  if (!rc && b->shm) {
    rc = client_shm_check_get(c, b, region, 0, tport_shm_size(region), err);
    if (!rc)
      copy_pool_copy(buf, tport_shm_data(region), n);
    if (!rc && progress)
      progress(arg, n, n);
  } else if (!rc && n && b->transfer.len == 0) {
    /* the data came inline */
    if (inl.len != n)
      rc = tport_err_set(err, TPORT_DATA_LOSS, "%zu inline bytes came, %zu expected", inl.len, n);
    else
      rc = check_crc32c(c->verify, b->crc32c_set, b->crc32c, inl.data, n, 0, err);
    if (!rc && stage)
      rc = stage_get_chunk(stage, 0, inl.data, n, err);
    else if (!rc)
      memcpy(buf, inl.data, n);
    if (!rc && progress)
      progress(arg, n, n);
  } else if (!rc && n) {
    get_ctx gc = {b->transfer, buf, c->verify, stage};
    rc = run_window(c, n, chunk, get_make, get_take, &gc, progress, arg, err);
  }
  if (stage)
    rc = stage_end(stage, rc, err); /* the bytes are on the device */
  if (region)
    client_shm_auto_done(c, b->shm ? 0 : n);
  if (inl.msg)
    nng_msg_free(inl.msg);
  protobuf_c_message_free_unpacked(&b->base, NULL);
  if (rc) {
    if (alloc)
      free(buf);
    return rc;
  }
  *bufp = buf;
  if (nbytes)
    *nbytes = n;
  return TPORT_OK;
}

int tport_get(tport_client *c, const tport_ref *ref, void *buf, size_t cap, tport_tensor_info *info,
              tport_progress_fn progress, void *progress_arg, tport_err *err)
{
  return get_into(c, ref, &buf, NULL, cap, false, NULL, NULL, info, progress, progress_arg, err);
}

int client_get_exact(tport_client *c, const tport_ref *ref, void *buf, const client_devmem *dev,
                     size_t cap, const client_get_want *want, tport_tensor_info *info,
                     tport_err *err)
{
  if (dev) {
    bool used = false;
    int rc = client_ipc_get(c, ref, dev, cap, want, info, &used, err);
    if (used)
      return rc;
  }
  return get_into(c, ref, &buf, dev, cap, false, want, NULL, info, NULL, NULL, err);
}

int tport_get_alloc(tport_client *c, const tport_ref *ref, void **buf, size_t *nbytes,
                    tport_tensor_info *info, tport_err *err)
{
  return get_into(c, ref, buf, NULL, 0, true, NULL, nbytes, info, NULL, NULL, err);
}

/* ---------------------------------------------------------------- one-request RPCs */

/* A request whose reply carries nothing but its status. */
static int call_status(tport_client *c, uint16_t method, const ProtobufCMessage *q,
                       const ProtobufCMessageDescriptor *d, tport_err *err)
{
  ProtobufCMessage *r;
  int rc = client_rpc(c, method, q, NULL, 0, d, &r, NULL, err);
  if (!rc)
    protobuf_c_message_free_unpacked(r, NULL);
  return rc;
}

int tport_info(tport_client *c, const tport_ref *ref, tport_tensor_info *out, tport_err *err)
{
  Tport__Ref w;
  client_ref_to_wire(ref, &w);
  Tport__InfoRequest q = TPORT__INFO_REQUEST__INIT;
  q.ref = &w;
  Tport__InfoReply *r;
  int rc = client_rpc(c, TPORT__METHOD__METHOD_INFO, &q.base, NULL, 0,
                      &tport__info_reply__descriptor, (ProtobufCMessage **)&r, NULL, err);
  if (!rc) {
    client_info_from_wire(r->info, out);
    protobuf_c_message_free_unpacked(&r->base, NULL);
  }
  return rc;
}

int tport_to(tport_client *c, const tport_ref *ref, const tport_to_options *o,
             tport_tensor_info *out, bool *alias, tport_err *err)
{
  Tport__Ref w;
  client_ref_to_wire(ref, &w);
  Tport__ToRequest q = TPORT__TO_REQUEST__INIT;
  q.ref = &w;
  q.device = (char *)(o->device ? o->device : "");
  q.dtype_set = o->has_dtype;
  q.dtype = (Tport__DType)o->dtype;
  q.memory_format_set = o->has_memory_format;
  q.memory_format = (Tport__MemoryFormat)o->memory_format;
  q.copy = o->copy;
  q.non_blocking = o->non_blocking;
  q.exact_format = o->exact_format;
  q.name = (char *)(o->name ? o->name : "");
  q.ttl_ms = o->ttl_ms;
  q.keep = c->keep;
  Tport__ToReply *r;
  int rc = client_rpc(c, TPORT__METHOD__METHOD_TO, &q.base, NULL, 0, &tport__to_reply__descriptor,
                      (ProtobufCMessage **)&r, NULL, err);
  if (!rc) {
    if (out)
      client_info_from_wire(r->info, out);
    if (alias)
      *alias = r->alias;
    protobuf_c_message_free_unpacked(&r->base, NULL);
  }
  return rc;
}

int tport_copy(tport_client *c, const tport_ref *dst, const tport_ref *src, bool non_blocking,
               tport_err *err)
{
  Tport__Ref wd, ws;
  client_ref_to_wire(dst, &wd);
  client_ref_to_wire(src, &ws);
  Tport__CopyRequest q = TPORT__COPY_REQUEST__INIT;
  q.dst = &wd;
  q.src = &ws;
  q.non_blocking = non_blocking;
  return call_status(c, TPORT__METHOD__METHOD_COPY, &q.base, &tport__copy_reply__descriptor, err);
}

int tport_view(tport_client *c, const tport_ref *ref, int ndim, const int64_t *sizes,
               const int64_t *strides, int64_t offset, const char *name, tport_tensor_info *out,
               tport_err *err)
{
  if (ndim < 0 || ndim > TPORT_MAX_DIMS)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "ndim is %d: it must be in [0, %d]", ndim,
                         TPORT_MAX_DIMS);
  Tport__Ref w;
  client_ref_to_wire(ref, &w);
  Tport__ViewRequest q = TPORT__VIEW_REQUEST__INIT;
  q.ref = &w;
  q.n_sizes = q.n_strides = (size_t)ndim;
  q.sizes = (int64_t *)sizes;
  q.strides = (int64_t *)strides;
  q.storage_offset = offset;
  q.name = (char *)(name ? name : "");
  q.keep = c->keep;
  Tport__ViewReply *r;
  int rc = client_rpc(c, TPORT__METHOD__METHOD_VIEW, &q.base, NULL, 0,
                      &tport__view_reply__descriptor, (ProtobufCMessage **)&r, NULL, err);
  if (!rc) {
    if (out)
      client_info_from_wire(r->info, out);
    protobuf_c_message_free_unpacked(&r->base, NULL);
  }
  return rc;
}

int tport_contiguous(tport_client *c, const tport_ref *ref, tport_memory_format fmt,
                     const char *name, tport_tensor_info *out, bool *alias, tport_err *err)
{
  Tport__Ref w;
  client_ref_to_wire(ref, &w);
  Tport__ContiguousRequest q = TPORT__CONTIGUOUS_REQUEST__INIT;
  q.ref = &w;
  q.memory_format = (Tport__MemoryFormat)fmt;
  q.name = (char *)(name ? name : "");
  q.keep = c->keep;
  Tport__ContiguousReply *r;
  int rc = client_rpc(c, TPORT__METHOD__METHOD_CONTIGUOUS, &q.base, NULL, 0,
                      &tport__contiguous_reply__descriptor, (ProtobufCMessage **)&r, NULL, err);
  if (!rc) {
    if (out)
      client_info_from_wire(r->info, out);
    if (alias)
      *alias = r->alias;
    protobuf_c_message_free_unpacked(&r->base, NULL);
  }
  return rc;
}

int tport_free(tport_client *c, const tport_ref *ref, tport_err *err)
{
  Tport__Ref w;
  client_ref_to_wire(ref, &w);
  Tport__FreeRequest q = TPORT__FREE_REQUEST__INIT;
  q.ref = &w;
  return call_status(c, TPORT__METHOD__METHOD_FREE, &q.base, &tport__free_reply__descriptor, err);
}

int tport_sync(tport_client *c, const tport_ref *ref, tport_err *err)
{
  Tport__Ref w;
  Tport__SyncRequest q = TPORT__SYNC_REQUEST__INIT;
  if (ref) {
    client_ref_to_wire(ref, &w);
    q.ref = &w;
  }
  return call_status(c, TPORT__METHOD__METHOD_SYNC, &q.base, &tport__sync_reply__descriptor, err);
}

int tport_list(tport_client *c, tport_tensor_info **out, size_t *n, tport_err *err)
{
  Tport__ListRequest q = TPORT__LIST_REQUEST__INIT;
  Tport__ListReply *r;
  int rc = client_rpc(c, TPORT__METHOD__METHOD_LIST, &q.base, NULL, 0,
                      &tport__list_reply__descriptor, (ProtobufCMessage **)&r, NULL, err);
  if (rc)
    return rc;
  tport_tensor_info *v = calloc(r->n_tensors ? r->n_tensors : 1, sizeof *v);
  if (!v) {
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  }
  for (size_t i = 0; i < r->n_tensors; i++)
    client_info_from_wire(r->tensors[i], &v[i]);
  *n = r->n_tensors;
  *out = v;
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return TPORT_OK;
}

int tport_devices(tport_client *c, tport_device_info **out, size_t *n, char *cuda_reason,
                  size_t reason_len, tport_err *err)
{
  Tport__DevicesRequest q = TPORT__DEVICES_REQUEST__INIT;
  Tport__DevicesReply *r;
  int rc = client_rpc(c, TPORT__METHOD__METHOD_DEVICES, &q.base, NULL, 0,
                      &tport__devices_reply__descriptor, (ProtobufCMessage **)&r, NULL, err);
  if (rc)
    return rc;
  tport_device_info *v = calloc(r->n_devices ? r->n_devices : 1, sizeof *v);
  if (!v) {
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  }
  for (size_t i = 0; i < r->n_devices; i++) {
    const Tport__DeviceInfo *d = r->devices[i];
    snprintf(v[i].device, sizeof v[i].device, "%s", d->device ? d->device : "");
    snprintf(v[i].name, sizeof v[i].name, "%s", d->name ? d->name : "");
    snprintf(v[i].compute_capability, sizeof v[i].compute_capability, "%s",
             d->compute_capability ? d->compute_capability : "");
    v[i].total_bytes = d->total_bytes;
    v[i].free_bytes = d->free_bytes;
    v[i].managed_memory = d->managed_memory;
    for (size_t p = 0; p < d->n_peer_access && p < 16; p++)
      snprintf(v[i].peers[v[i].npeers++], sizeof v[i].peers[0], "%s", d->peer_access[p]);
  }
  if (cuda_reason && reason_len)
    snprintf(cuda_reason, reason_len, "%s",
             r->cuda_unavailable_reason ? r->cuda_unavailable_reason : "");
  *n = r->n_devices;
  *out = v;
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return TPORT_OK;
}

int tport_stats(tport_client *c, tport_counter **out, size_t *n, tport_err *err)
{
  Tport__StatsRequest q = TPORT__STATS_REQUEST__INIT;
  Tport__StatsReply *r;
  int rc = client_rpc(c, TPORT__METHOD__METHOD_STATS, &q.base, NULL, 0,
                      &tport__stats_reply__descriptor, (ProtobufCMessage **)&r, NULL, err);
  if (rc)
    return rc;
  tport_counter *v = calloc(r->n_counters ? r->n_counters : 1, sizeof *v);
  if (!v) {
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  }
  for (size_t i = 0; i < r->n_counters; i++) {
    snprintf(v[i].name, sizeof v[i].name, "%s", r->counters[i]->name);
    v[i].value = r->counters[i]->value;
  }
  *n = r->n_counters;
  *out = v;
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return TPORT_OK;
}
