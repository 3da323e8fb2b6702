/*
 * put_socket.c: a put by requests on the socket -- PutBegin (the whole
 * tensor with it when it fits in one chunk), its chunks with up to the
 * window in flight, PutCommit (PutAbort after a failure).  Where a chunk's
 * bytes come from is path.c's choice: the caller's memory (lent to the
 * request where nng can send from there), the automatic region (copied in
 * ahead of the chunks, each request naming its slice), or device memory
 * staged through the client's pinned ring.  A leaf: it calls the window,
 * the region's copy and the ring, never a path.
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "client_internal.h"
#include "copy_pool.h"
#include "crc32c.h"
#include "cuda_stage.h"

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
 * two timeouts is taken for gone; the dialer then connects anew).  A
 * request may borrow up to CLIENT_LEND_SEGMENTS such runs of bytes from as
 * many places (nng_msg_add_tail): a put batch's PutBatch lends several
 * tensors at once. */

/* Appends segments [i, k) to m's body (the first append copies what was
 * lent before them into it, and gives it back). */
static int append_from(nng_msg *m, const void *const *ps, const size_t *ns, int i, int k,
                       tport_err *err)
{
  for (; i < k; i++)
    if (ns[i] && nng_msg_append(m, ps[i], ns[i]) != 0)
      return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for a %zu-byte request",
                           nng_msg_len(m) + ns[i]);
  return TPORT_OK;
}

#ifdef TPORT_NNG_LENT_TAIL
_Static_assert(CLIENT_LEND_SEGMENTS <= TPORT_NNG_TAIL_SEGMENTS,
               "a request lends no more segments than nng_msg_add_tail takes (deploy/nng 0012)");

static void lent_chunk_done(void *arg)
{
  lent_chunks *l = arg;
  pthread_mutex_lock(&l->mu);
  if (--l->outstanding == 0)
    pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
}

int client_msg_lend(lent_chunks *l, nng_msg *m, const void *const *ps, const size_t *ns, int k,
                    tport_err *err)
{
  if (k < 1 || k > CLIENT_LEND_SEGMENTS)
    return tport_err_set(err, TPORT_INTERNAL, "%d segments to lend: 1 to %d", k,
                         CLIENT_LEND_SEGMENTS);
  pthread_mutex_lock(&l->mu);
  l->outstanding++;
  pthread_mutex_unlock(&l->mu);
  if (nng_msg_set_tail(m, ps[0], ns[0], lent_chunk_done, l) != 0) {
    lent_chunk_done(l);
    return append_from(m, ps, ns, 0, k, err);
  }
  for (int i = 1; i < k; i++)
    if (nng_msg_add_tail(m, ps[i], ns[i]) != 0)
      return append_from(m, ps, ns, i, k, err);
  return TPORT_OK;
}

int client_pack_lent(lent_chunks *l, uint16_t method, const ProtobufCMessage *q, const void *p,
                     size_t n, nng_msg **out, tport_err *err)
{
  int rc = client_pack(method, q, NULL, 0, out, err);
  if (rc)
    return rc;
  rc = client_msg_lend(l, *out, &p, &n, 1, err);
  if (rc)
    nng_msg_free(*out);
  return rc;
}
#else
int client_msg_lend(lent_chunks *l, nng_msg *m, const void *const *ps, const size_t *ns, int k,
                    tport_err *err)
{
  (void)l; /* the system's nng lends nothing: the bytes are copied in */
  return append_from(m, ps, ns, 0, k, err);
}

int client_pack_lent(lent_chunks *l, uint16_t method, const ProtobufCMessage *q, const void *p,
                     size_t n, nng_msg **out, tport_err *err)
{
  (void)l;
  return client_pack(method, q, p, n, out, err); /* the system's nng lends nothing */
}
#endif

void client_lent_wait(tport_client *c, lent_chunks *l)
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

/* ---------------------------------------------------------------- chunks */

/* Through the region, the caller's bytes are copied in by the pool's
 * threads in the background (a copy_stream), each chunk sent as soon as
 * its bytes are in, so that the pool's copy in and the server's copies out
 * overlap.  Where the pool is busy (another thread's copy), they are
 * copied in on this thread this far ahead of the chunk being sent. */
#define PUT_COPY_AHEAD ((size_t)16 << 20)

typedef struct put_ctx {
  const Tport__Ref *ref;
  const uint8_t *data;
  size_t nbytes;
  bool verify;
  struct tport_shm *region; /* same host: each chunk goes through it */
  copy_stream *stream;      /* ... copied in by the pool (NULL: by hand) */
  size_t copied;            /* ... bytes [0, copied) in it, by hand */
  lent_chunks *lent;        /* NULL: chunks copied into their requests */
  client_stage *stage;      /* device memory: each chunk staged through the ring */
  uint64_t process;         /* nonzero: the process region; chunks name data itself */
  bool given_up;            /* ... and the server gave up reading one */
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
  } else if (p->process) {
    /* the server reads the chunk from the caller's buffer */
    slice = (Tport__ShmSlice)TPORT__SHM_SLICE__INIT;
    slice.region = p->process;
    slice.offset = (uint64_t)(uintptr_t)bytes;
    slice.length = len;
    q.shm = &slice;
  } else if (p->region) {
    /* into the region: the stream's copy waited for up to this chunk's
     * end, or (no stream) a batch at a time here; the server copies this
     * chunk out while the next ones are copied in */
    if (p->stream) {
      copy_pool_stream_wait(p->stream, off + len);
    } else if (off + len > p->copied) {
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
  if (p->lent && !q.shm && !p->stage)
    return client_pack_lent(p->lent, TPORT__METHOD__METHOD_PUT_CHUNK, &q.base, bytes, len, out,
                            err);
#endif
  return client_pack(TPORT__METHOD__METHOD_PUT_CHUNK, &q.base, q.shm ? NULL : bytes,
                     q.shm ? 0 : len, out, err);
}

static int put_take(void *vctx, client_slot *s, tport_err *err)
{
  put_ctx *p = vctx;
  ProtobufCMessage *r;
  int rc = client_unpack(TPORT__METHOD__METHOD_PUT_CHUNK, s->reply,
                         &tport__put_chunk_reply__descriptor, &r, NULL, err);
  if (!rc)
    protobuf_c_message_free_unpacked(r, NULL);
  /* the server's answer, not this library's own timeout */
  if (rc == TPORT_DEADLINE_EXCEEDED && p->process)
    p->given_up = true;
  return rc;
}

/* PutBegin of d: with the whole tensor when it fits in one chunk (and no
 * region's slices carry it: by_slices), *committed then; else the handle its chunks name
 * (into ref, its bytes in handle) and the chunks' size. */
static int put_begin(tport_client *c, const client_put_desc *d, bool by_slices, client_stage *stage,
                     tport_tensor_info *out, bool *committed, Tport__Ref *ref,
                     uint8_t handle[TPORT_HANDLE_BYTES], size_t *chunk, tport_err *err)
{
  const void *data = d->data;
  size_t nbytes = d->nbytes;
  Tport__TensorDesc desc;
  Tport__PutBeginRequest q;
  client_put_request(c, d->dtype, d->ndim, d->sizes, d->strides, d->opts, &desc, &q);
  /* a tensor that fits in one chunk goes in one round trip */
  q.commit = nbytes <= c->chunk_bytes && !by_slices;
  int rc;
  if (q.commit && stage && nbytes) {
    const uint8_t *staged;
    if ((rc = stage_put_chunk(stage, 0, nbytes, &staged, err)) != TPORT_OK)
      return rc;
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
  if (rc)
    return rc;
  *committed = q.commit;
  if (q.commit) {
    if (d->opts->progress)
      d->opts->progress(d->opts->progress_arg, nbytes, nbytes);
    if (out)
      client_info_from_wire(b->info, out);
    protobuf_c_message_free_unpacked(&b->base, NULL);
    return TPORT_OK;
  }
  tport__ref__init(ref);
  memset(handle, 0, TPORT_HANDLE_BYTES);
  if (b->ref && b->ref->handle.len == TPORT_HANDLE_BYTES)
    memcpy(handle, b->ref->handle.data, TPORT_HANDLE_BYTES);
  ref->handle.data = handle;
  ref->handle.len = TPORT_HANDLE_BYTES;
  *chunk = b->chunk_bytes ? b->chunk_bytes : c->chunk_bytes;
  protobuf_c_message_free_unpacked(&b->base, NULL);
  return TPORT_OK;
}

/* The chunks of the put ref names: when it returns, nng holds none of the
 * caller's bytes any more. */
static int put_chunks(tport_client *c, const client_put_desc *d, const Tport__Ref *ref,
                      size_t chunk, struct tport_shm *region, client_stage *stage, uint64_t process,
                      bool *given_up, tport_err *err)
{
  int rc = TPORT_OK;
  lent_chunks lent = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
  put_ctx pc = {.ref = ref,
                .data = d->data,
                .nbytes = d->nbytes,
                .verify = c->verify,
                .region = region,
                .lent = c->lend_chunks && !region && !process ? &lent : NULL,
                .stage = stage,
                .process = process};
  /* the server reads several chunks a request from this process's memory */
  if (process)
    chunk = client_process_span(c, chunk);
  copy_stream stream;
  if (region && copy_pool_stream_begin(&stream, region->data, d->data, d->nbytes))
    pc.stream = &stream;
  /* a server's chunks may differ from its Hello's: the ring follows them */
  if (!stage || (rc = stage_set_chunk(stage, chunk, err)) == TPORT_OK)
    rc = client_run_window(c, d->nbytes, chunk, put_make, put_take, &pc, d->opts->progress,
                           d->opts->progress_arg, d->cancel, err);
  /* every chunk was sent (and so copied in) when it went well; else what
   * was not started is left: the region is not read past a failed put */
  if (pc.stream)
    copy_pool_stream_end(pc.stream, false);
  client_lent_wait(c, &lent); /* the caller's bytes are theirs again */
  pthread_cond_destroy(&lent.cv);
  pthread_mutex_destroy(&lent.mu);
  *given_up = pc.given_up;
  return rc;
}

/* PutCommit of the put ref names when its chunks went well (rc), else
 * PutAbort, so that nothing is left behind on the server (best effort:
 * the error stays rc's). */
static int put_end(tport_client *c, const Tport__Ref *ref, const tport_put_options *opts, int rc,
                   tport_tensor_info *out, tport_err *err)
{
  if (!rc) {
    Tport__PutCommitRequest cq = TPORT__PUT_COMMIT_REQUEST__INIT;
    cq.ref = (Tport__Ref *)ref;
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
    Tport__PutAbortRequest aq = TPORT__PUT_ABORT_REQUEST__INIT;
    aq.ref = (Tport__Ref *)ref;
    ProtobufCMessage *ar;
    if (client_rpc(c, TPORT__METHOD__METHOD_PUT_ABORT, &aq.base, NULL, 0,
                   &tport__put_abort_reply__descriptor, &ar, NULL, NULL) == TPORT_OK)
      protobuf_c_message_free_unpacked(ar, NULL);
  }
  return rc;
}

/* The put of d: PutBegin, its chunks (through region, stage or the
 * process region where given), PutCommit. */
static int socket_put(tport_client *c, const client_put_desc *d, struct tport_shm *region,
                      uint64_t process, tport_tensor_info *out, bool *given_up, tport_err *err)
{
  *given_up = false;
  client_stage *stage = NULL;
  int rc;
  if (d->dev && (rc = stage_begin(c, d->dev, d->nbytes, c->chunk_bytes, &stage, err)) != TPORT_OK)
    return rc;
  Tport__Ref ref;
  uint8_t handle[TPORT_HANDLE_BYTES];
  size_t chunk = 0;
  bool committed = false;
  rc = put_begin(c, d, region || process, stage, out, &committed, &ref, handle, &chunk, err);
  if (rc)
    return stage ? stage_end(stage, rc, err) : rc;
  if (committed) {
    if (stage)
      stage_end(stage, TPORT_OK, NULL); /* its one copy was waited for */
    return TPORT_OK;
  }
  rc = put_chunks(c, d, &ref, chunk, region, stage, process, given_up, err);
  if (stage)
    rc = stage_end(stage, rc, err); /* no copy reads the device any more */
  return put_end(c, &ref, d->opts, rc, out, err);
}

int client_socket_put(tport_client *c, const client_put_desc *d, struct tport_shm *region,
                      tport_tensor_info *out, tport_err *err)
{
  bool given_up;
  return socket_put(c, d, region, 0, out, &given_up, err);
}

int client_socket_put_direct(tport_client *c, const client_put_desc *d, uint64_t proc,
                             tport_tensor_info *out, bool *given_up, tport_err *err)
{
  return socket_put(c, d, NULL, proc, out, given_up, err);
}
