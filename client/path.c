/*
 * path.c: the one place that decides how a put's or a get's bytes travel.
 * The ways are leaves that never call back up here:
 *   - the socket (put_socket.c, get_socket.c): requests with the bytes in
 *     them, a window of chunks in flight;
 *   - the caller's own buffer (process_region.c), over ipc:// and
 *     inproc://: a tensor of more than a chunk, stored on the cpu as it
 *     is, is read by the server straight from it, chunk by chunk (smaller
 *     puts, converted ones and those to a device take the region); a large
 *     get offers it to the server, which writes there a tensor whose
 *     values lie in its memory as they are (cpu, contiguous);
 *   - the automatic region (shm.c), on the same host: a large tensor is
 *     copied into the client's own memfd region and put from there in one
 *     request, or, when it is several chunks long, copied in ahead of
 *     chunk requests that name slices of it (the client's copies and the
 *     server's overlap); a large get is offered the region;
 *   - CUDA IPC (cuda_ipc.c), on the same host: device memory is handed to
 *     the server, which copies device to device;
 *   - the pinned ring (cuda_stage.c): device memory staged chunk by chunk
 *     through the socket, where IPC cannot be used.
 * A way that cannot be used now (a region busy with another thread's
 * transfer or refused by the server, an allocation IPC cannot export)
 * says so without sending anything, and the next is tried.  Explicit
 * regions (tport_put_shm, tport_get_shm) are the application's choice
 * and go straight to shm.c.
 *
 * A transfer is described once (client_put_desc, client_get_desc), so that
 * the same choice can start a request that completes later (issue 21): such
 * a request holds its description and the way chosen, the leaves' steps
 * (put_begin, put_chunks, put_end; get_destination, get_bytes) become the
 * states it moves through, and its chunks take credits from the client's
 * window one by one instead of a whole window per transfer (window.c).
 */
#include <stdlib.h>

#include "client_internal.h"
#include "copy_pool.h"
#include "cuda_ipc.h"

static void fill_copy(void *dst, size_t n, void *src)
{
  copy_pool_copy(dst, src, n);
}

/* The automatic region locked for a put of nbytes, when it holds them:
 * NULL when it is busy, cannot be made that large or is off (unlock with
 * client_shm_auto_done). */
static struct tport_shm *region_for(tport_client *c, size_t nbytes)
{
  struct tport_shm *r = client_shm_auto_take(c, nbytes);
  if (r && tport_shm_size(r) < nbytes) {
    client_shm_auto_done(c, 0);
    r = NULL;
  }
  return r;
}

/* A put of host bytes through the automatic region (*used), or nothing
 * done (*used false). */
static int put_by_region(tport_client *c, const client_put_desc *d, tport_tensor_info *out,
                         bool *used, tport_err *err)
{
  *used = false;
  const tport_put_options *o = d->opts;
  bool converts = o->has_dtype || o->memory_format != TPORT_MF_PRESERVE;
  /* read by the server from the caller's buffer where it can (its one
   * copy, none here) */
  uint64_t proc;
  /* (more than a chunk: a smaller one goes in one request through the
   * region, where direct reads would take a PutBegin and a PutChunk) */
  if (d->nbytes > c->chunk_bytes && !d->not_direct &&
      client_put_reads_direct(c, o, d->data, d->nbytes) &&
      client_process_region(c, &proc) == TPORT_OK) {
    bool given_up;
    int rc = client_socket_put_direct(c, d, proc, out, &given_up, err);
    /* RESOURCE_EXHAUSTED: tportd had no reader of clients' memory free (or
     * the tenant's quota is full: the region will say so again); given up:
     * a read of the buffer outlasted tportd's deadline (pages that come in
     * slowly) -- the region's copy here has none */
    bool cancelled = d->cancel && atomic_load(d->cancel);
    if ((rc != TPORT_RESOURCE_EXHAUSTED && !given_up) || cancelled) {
      *used = true;
      return rc;
    }
  }
  /* several chunks long, not converted: chunk by chunk through it, the
   * client's copies and the server's overlapping */
  if (d->data && !converts && d->nbytes > 2 * c->chunk_bytes && d->nbytes <= CLIENT_SHM_MAX_BYTES) {
    struct tport_shm *r = region_for(c, d->nbytes);
    if (r) {
      *used = true;
      int rc = client_socket_put(c, d, r, out, err);
      client_shm_auto_done(c, 0);
      return rc;
    }
  }
  /* else at once (a tensor the server converts then converts in its one
   * copy), where the tensor is not small */
  if (!atomic_load(&c->shm_auto) || d->nbytes < CLIENT_SHM_MIN_BYTES ||
      d->nbytes > CLIENT_SHM_MAX_BYTES)
    return TPORT_OK;
  struct tport_shm *r = region_for(c, d->nbytes);
  if (!r)
    return TPORT_OK;
  *used = true;
  if (d->fill)
    d->fill(tport_shm_data(r), d->nbytes, d->fill_arg);
  else
    fill_copy(tport_shm_data(r), d->nbytes, (void *)d->data);
  bool unanswered = false;
  int rc = client_shm_put(c, r, 0, d->nbytes, d->dtype, d->ndim, d->sizes, d->strides, o, out,
                          &unanswered, err);
  /* a put the server may still carry out reads the region then: the next
   * transfer's bytes must not be there (a named put with replace would
   * publish them) */
  if (unanswered)
    client_shm_auto_retire(c);
  else
    client_shm_auto_done(c, 0);
  return rc;
}

int client_put(tport_client *c, const client_put_desc *d, tport_tensor_info *out, tport_err *err)
{
  if (d->ndim < 0 || d->ndim > TPORT_MAX_DIMS)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "ndim is %d: it must be in [0, %d]", d->ndim,
                         TPORT_MAX_DIMS);
  client_put_desc with = *d;
  tport_put_options defaults;
  if (!with.opts) {
    tport_put_options_init(&defaults);
    with.opts = &defaults;
  }
  bool used = false;
  int rc;
  /* device memory: on the same host, the allocation itself by CUDA IPC;
   * else through the client's pinned ring */
  if (with.dev) {
    rc = client_ipc_put(c, with.dtype, with.ndim, with.sizes, with.strides, with.dev, with.nbytes,
                        with.opts, out, &used, err);
    return used ? rc : client_socket_put(c, &with, NULL, out, err);
  }
  /* same host: through the client's region, one copy on each side */
  rc = put_by_region(c, &with, out, &used, err);
  if (used || !with.fill)
    return used ? rc : client_socket_put(c, &with, NULL, out, err);
  /* values written on demand and no region: into a buffer, put as host
   * bytes in logical C order */
  uint8_t *buf = malloc(with.nbytes + 1);
  if (!buf)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  with.fill(buf, with.nbytes, with.fill_arg);
  with.data = buf;
  with.fill = NULL;
  rc = client_put(c, &with, out, err);
  free(buf);
  return rc;
}

int client_get(tport_client *c, const client_get_desc *g, void **alloced, size_t *nbytes,
               tport_tensor_info *info, tport_err *err)
{
  /* device memory: on the same host, by CUDA IPC; else through the ring
   * (no wait: only the host gets of tport_get_wait take one) */
  if (g->dev) {
    bool used = false;
    int rc = client_ipc_get(c, g->ref, g->dev, g->cap, g->want, info, &used, err);
    if (used)
      return rc;
  }
  /* host memory on the same host: the caller's buffer (process_region.c)
   * and the region offered -- the server writes the tensor into one of
   * them when it is large and fits; device memory is staged */
  client_get_desc with = *g;
  if (!g->dev && !g->alloc && (!g->want || atomic_load(&c->get_expect)))
    with.direct_region = client_get_direct_region(c, g->buf, g->cap);
  struct tport_shm *region = g->dev ? NULL : client_shm_auto_take(c, g->alloc ? 0 : g->cap);
  size_t want = 0;
  bool spoiled = false;
  int rc = client_socket_get(c, &with, region, alloced, nbytes, info, &want, &spoiled, err);
  if (region && spoiled)
    client_shm_auto_retire(c);
  else if (region)
    client_shm_auto_done(c, want);
  return rc;
}

/* ---------------------------------------------------------------- the API */

int tport_put(tport_client *c, tport_dtype dtype, int ndim, const int64_t *sizes,
              const int64_t *strides, const void *data, size_t nbytes,
              const tport_put_options *opts, tport_tensor_info *out, tport_err *err)
{
  client_put_desc d = {.dtype = dtype,
                       .ndim = ndim,
                       .sizes = sizes,
                       .strides = strides,
                       .nbytes = nbytes,
                       .data = data,
                       .opts = opts};
  return client_put(c, &d, out, err);
}

int tport_get(tport_client *c, const tport_ref *ref, void *buf, size_t cap, tport_tensor_info *info,
              tport_progress_fn progress, void *progress_arg, tport_err *err)
{
  client_get_desc g = {
      .ref = ref, .buf = buf, .cap = cap, .progress = progress, .progress_arg = progress_arg};
  return client_get(c, &g, NULL, NULL, info, err);
}

int tport_get_alloc(tport_client *c, const tport_ref *ref, void **buf, size_t *nbytes,
                    tport_tensor_info *info, tport_err *err)
{
  client_get_desc g = {.ref = ref, .alloc = true};
  return client_get(c, &g, buf, nbytes, info, err);
}

int tport_get_wait(tport_client *c, const tport_ref *ref, uint32_t wait_ms, void *buf, size_t cap,
                   tport_tensor_info *info, tport_err *err)
{
  client_get_desc g = {.ref = ref, .buf = buf, .cap = cap, .wait_ms = wait_ms};
  return client_get(c, &g, NULL, NULL, info, err);
}

int tport_get_alloc_wait(tport_client *c, const tport_ref *ref, uint32_t wait_ms, void **buf,
                         size_t *nbytes, tport_tensor_info *info, tport_err *err)
{
  client_get_desc g = {.ref = ref, .alloc = true, .wait_ms = wait_ms};
  return client_get(c, &g, buf, nbytes, info, err);
}
