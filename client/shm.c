/*
 * shm.c: libtport's same-host regions (tport.h's "Same-host shared memory";
 * transport/shm.h has the handoff and its security).
 *
 * Explicit regions are the application's: it fills one in place and puts
 * from it, or gets into it.  The automatic region is the client's own: a
 * large tport_put copies the caller's bytes into it and puts from it, a
 * large get lands in it and is copied out -- one copy on each side instead
 * of a trip through two sockets (a large one by a few threads: copy_pool.c).  It grows to the largest tensor seen (up
 * to CLIENT_SHM_MAX_BYTES) and is used by one call at a time; a call that
 * finds it busy, or a region that cannot be made, takes the socket.
 * Whether a put or get uses it is path.c's choice; this file keeps it.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "client_internal.h"
#include "crc32c.h"
#include "dtype.h"
#include "shm.h"

bool client_url_is_local(const char *url)
{
  static const char *const local[] = {
      "ipc://",           "inproc://",        "tcp://127.",         "tcp://localhost:",
      "tcp://[::1]:",     "tcp4://127.",      "tcp6://[::1]:",      "tls+tcp://127.",
      "tls+tcp://localhost:", "tls+tcp://[::1]:"};
  for (size_t i = 0; i < sizeof local / sizeof *local; i++)
    if (strncasecmp(url, local[i], strlen(local[i])) == 0)
      return true;
  return false;
}

bool tport_shm_available(tport_client *c)
{
  return c && c->shm_socket[0];
}

void *tport_shm_data(const tport_shm *r)
{
  return r ? r->data : NULL;
}

size_t tport_shm_size(const tport_shm *r)
{
  return r ? r->nbytes : 0;
}

static void link_region(tport_client *c, tport_shm *r)
{
  pthread_mutex_lock(&c->regions_mu);
  r->prev = NULL;
  r->next = c->regions;
  if (c->regions)
    c->regions->prev = r;
  c->regions = r;
  pthread_mutex_unlock(&c->regions_mu);
}

static void unlink_region(tport_client *c, tport_shm *r)
{
  pthread_mutex_lock(&c->regions_mu);
  if (r->prev)
    r->prev->next = r->next;
  else if (c->regions == r)
    c->regions = r->next;
  if (r->next)
    r->next->prev = r->prev;
  r->prev = r->next = NULL;
  pthread_mutex_unlock(&c->regions_mu);
}

static void region_unmap(tport_shm *r)
{
  if (r->data)
    munmap(r->data, r->nbytes);
  if (r->fd >= 0)
    close(r->fd);
  free(r);
}

int tport_shm_create(tport_client *c, size_t nbytes, tport_shm **out, tport_err *err)
{
  if (!tport_shm_available(c))
    return tport_err_set(err, TPORT_FAILED_PRECONDITION,
                         "the server offers no shared memory to this client (not on this host, "
                         "or started with --shm-socket off)");
  tport_shm *r = calloc(1, sizeof *r);
  if (!r)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  r->client = c;
  r->fd = -1;
  void *base = NULL;
  int rc = transport_shm_create(nbytes, &r->fd, &base, err);
  if (rc) {
    free(r);
    return rc;
  }
  r->data = base;
  r->nbytes = nbytes;
  /* the region's name and one-time token on this connection, then the
   * descriptor with the token over the server's socket */
  Tport__ShmRegisterRequest q = TPORT__SHM_REGISTER_REQUEST__INIT;
  q.nbytes = nbytes;
  Tport__ShmRegisterReply *a;
  rc = client_rpc(c, TPORT__METHOD__METHOD_SHM_REGISTER, &q.base, NULL, 0,
                  &tport__shm_register_reply__descriptor, (ProtobufCMessage **)&a, NULL, err);
  if (rc) {
    region_unmap(r);
    return rc;
  }
  r->id = a->region;
  r->pipe = atomic_load(&c->live_pipe);
  if (a->token.len != TRANSPORT_SHM_TOKEN_BYTES)
    rc = tport_err_set(err, TPORT_INTERNAL, "the server sent a %zu-byte token", a->token.len);
  else
    /* the socket Hello named, whatever this reply says */
    rc = transport_shm_send_to(c->shm_socket, a->token.data, r->fd, c->timeout_ms,
                               atomic_load(&c->server_uid), err);
  protobuf_c_message_free_unpacked(&a->base, NULL);
  /* the server holds its own mapping now: this descriptor is done */
  close(r->fd);
  r->fd = -1;
  if (rc) {
    tport_err ignored;
    Tport__ShmReleaseRequest rq = TPORT__SHM_RELEASE_REQUEST__INIT;
    rq.region = r->id;
    ProtobufCMessage *rr;
    if (client_rpc(c, TPORT__METHOD__METHOD_SHM_RELEASE, &rq.base, NULL, 0,
                   &tport__shm_release_reply__descriptor, &rr, NULL, &ignored) == TPORT_OK)
      protobuf_c_message_free_unpacked(rr, NULL);
    region_unmap(r);
    return rc;
  }
  link_region(c, r);
  *out = r;
  return TPORT_OK;
}

int tport_shm_release(tport_shm *r, tport_err *err)
{
  if (!r)
    return TPORT_OK;
  Tport__ShmReleaseRequest q = TPORT__SHM_RELEASE_REQUEST__INIT;
  q.region = r->id;
  ProtobufCMessage *a;
  int rc = client_rpc(r->client, TPORT__METHOD__METHOD_SHM_RELEASE, &q.base, NULL, 0,
                      &tport__shm_release_reply__descriptor, &a, NULL, err);
  if (!rc)
    protobuf_c_message_free_unpacked(a, NULL);
  unlink_region(r->client, r);
  region_unmap(r); /* here, whatever the server said */
  return rc;
}

/* The bytes of a dense tensor of that shape, overflow-checked. */
static int tensor_bytes(tport_dtype dtype, int ndim, const int64_t *sizes, size_t *out,
                        tport_err *err)
{
  if (ndim < 0 || ndim > TPORT_MAX_DIMS)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "ndim is %d: it must be in [0, %d]", ndim,
                         TPORT_MAX_DIMS);
  size_t es = tport_dtype_size(dtype);
  if (!es)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "dtype %d is unknown", (int)dtype);
  uint64_t n = es;
  for (int d = 0; d < ndim; d++) {
    if (sizes[d] < 0)
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "sizes[%d] is %lld", d,
                           (long long)sizes[d]);
    if (__builtin_mul_overflow(n, (uint64_t)sizes[d], &n))
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "the tensor's size overflows");
  }
  if (n > SIZE_MAX)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "the tensor's size overflows");
  *out = (size_t)n;
  return TPORT_OK;
}

/* Bytes [offset, offset + n) lie within the region. */
static int check_slice(const tport_shm *r, size_t offset, size_t n, tport_err *err)
{
  if (offset > r->nbytes || n > r->nbytes - offset)
    return tport_err_set(err, TPORT_OUT_OF_RANGE,
                         "%zu bytes at offset %zu are past the region's %zu bytes", n, offset,
                         r->nbytes);
  return TPORT_OK;
}

int client_shm_tensor_at(const tport_shm *r, size_t offset, tport_dtype dtype, int ndim,
                         const int64_t *sizes, size_t *nbytes, tport_err *err)
{
  int rc = tensor_bytes(dtype, ndim, sizes, nbytes, err);
  return rc ? rc : check_slice(r, offset, *nbytes, err);
}

int client_shm_put(tport_client *c, tport_shm *r, size_t offset, size_t nbytes, tport_dtype dtype,
                   int ndim, const int64_t *sizes, const int64_t *strides,
                   const tport_put_options *opts, tport_tensor_info *out, bool *unanswered,
                   tport_err *err)
{
  tport_put_options defaults;
  if (!opts) {
    tport_put_options_init(&defaults);
    opts = &defaults;
  }
  Tport__TensorDesc desc;
  Tport__PutBeginRequest q;
  client_put_request(c, dtype, ndim, sizes, strides, opts, &desc, &q);
  Tport__ShmSlice slice = client_slice(r, offset, nbytes);
  q.shm = &slice;
  q.commit = true;
  if (c->verify) {
    q.crc32c_set = true;
    q.crc32c = transport_crc32c(0, r->data + offset, nbytes);
  }
  Tport__PutBeginReply *b;
  int rc = client_rpc_waiting(c, 0, TPORT__METHOD__METHOD_PUT_BEGIN, &q.base,
                              &tport__put_begin_reply__descriptor, (ProtobufCMessage **)&b, NULL,
                              unanswered, err);
  if (rc)
    return rc;
  if (opts->progress)
    opts->progress(opts->progress_arg, nbytes, nbytes);
  if (out)
    client_info_from_wire(b->info, out);
  protobuf_c_message_free_unpacked(&b->base, NULL);
  return TPORT_OK;
}

int tport_put_shm(tport_client *c, tport_shm *r, size_t offset, tport_dtype dtype, int ndim,
                  const int64_t *sizes, const int64_t *strides, const tport_put_options *opts,
                  tport_tensor_info *out, tport_err *err)
{
  if (!r || r->client != c)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "the region is not this client's");
  size_t nbytes;
  int rc = client_shm_tensor_at(r, offset, dtype, ndim, sizes, &nbytes, err);
  if (rc)
    return rc;
  return client_shm_put(c, r, offset, nbytes, dtype, ndim, sizes, strides, opts, out, NULL, err);
}

/* GetBegin into a slice of r; with fallback, a tensor that does not fit
 * (or fits inline) comes back the ordinary way instead: *in_region says.
 * *unanswered (when not NULL) as client_rpc_waiting's: the server may
 * still write the slice. */
static int get_begin_shm(tport_client *c, const tport_ref *ref, uint32_t wait_ms, tport_shm *r,
                         size_t offset, size_t cap, bool fallback, bool chunks, int fmt,
                         const client_get_desc *direct, Tport__GetBeginReply **out,
                         client_payload *payload, bool *unanswered, tport_err *err)
{
  Tport__Ref w;
  client_ref_to_wire(ref, &w);
  Tport__GetBeginRequest q = TPORT__GET_BEGIN_REQUEST__INIT;
  q.ref = &w;
  q.inline_max = fallback ? CLIENT_SHM_MIN_BYTES - 1 : 0; /* small ones: inline */
  q.want_crc32c = c->verify;
  Tport__ShmSlice slice = client_slice(r, offset, cap);
  q.shm = &slice;
  q.shm_fallback = fallback;
  q.shm_chunks = chunks; /* a large one a chunk at a time (get_socket.c) */
  q.memory_format_set = fmt >= 0;
  q.memory_format = (Tport__MemoryFormat)(fmt >= 0 ? fmt : 0);
  q.wait_ms = wait_ms;
  if (direct)
    client_get_direct_fill(direct, &q);
  return client_rpc_waiting(c, wait_ms, TPORT__METHOD__METHOD_GET_BEGIN, &q.base,
                            &tport__get_begin_reply__descriptor, (ProtobufCMessage **)out, payload,
                            unanswered, err);
}

/* The bytes a get wrote into the region: as many as it said, with the
 * CRC32C it sent when verifying. */
int client_shm_check_get(tport_client *c, const Tport__GetBeginReply *b, const tport_shm *r,
                         size_t offset, size_t cap, tport_err *err)
{
  if (b->nbytes > cap)
    return tport_err_set(err, TPORT_DATA_LOSS, "the server wrote %llu bytes into %zu",
                         (unsigned long long)b->nbytes, cap);
  if (!c->verify)
    return TPORT_OK;
  if (!b->crc32c_set)
    return tport_err_set(err, TPORT_DATA_LOSS, "the get came without a CRC32C");
  uint32_t got = transport_crc32c(0, r->data + offset, (size_t)b->nbytes);
  if (got != b->crc32c)
    return tport_err_set(err, TPORT_DATA_LOSS,
                         "the region holds bytes with CRC32C 0x%08x; the server wrote 0x%08x", got,
                         b->crc32c);
  return TPORT_OK;
}

static int get_shm(tport_client *c, const tport_ref *ref, tport_shm *r, size_t offset, size_t cap,
                   int fmt, tport_tensor_info *info, size_t *nbytes, tport_err *err)
{
  if (!r || r->client != c)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "the region is not this client's");
  int rc = check_slice(r, offset, cap, err);
  if (rc)
    return rc;
  Tport__GetBeginReply *b;
  rc = get_begin_shm(c, ref, 0, r, offset, cap, false, false, fmt, NULL, &b, NULL, NULL, err);
  if (rc)
    return rc;
  if (!b->shm)
    rc = tport_err_set(err, TPORT_INTERNAL, "the server did not write into the region");
  if (!rc)
    rc = client_shm_check_get(c, b, r, offset, cap, err);
  if (!rc && info)
    client_info_from_wire(b->info, info);
  if (!rc && nbytes)
    *nbytes = (size_t)b->nbytes;
  protobuf_c_message_free_unpacked(&b->base, NULL);
  return rc;
}

int tport_get_shm(tport_client *c, const tport_ref *ref, tport_shm *r, size_t offset, size_t cap,
                  tport_tensor_info *info, size_t *nbytes, tport_err *err)
{
  return get_shm(c, ref, r, offset, cap, -1, info, nbytes, err);
}

int tport_get_shm_format(tport_client *c, const tport_ref *ref, tport_shm *r, size_t offset,
                         size_t cap, tport_memory_format fmt, tport_tensor_info *info,
                         size_t *nbytes, tport_err *err)
{
  return get_shm(c, ref, r, offset, cap, (int)fmt, info, nbytes, err);
}

/* ---------------------------------------------------------------- the automatic region */

/* Releases on the server the automatic regions retired since the last
 * use (shm_mu held): a server that did not answer in time may answer now;
 * one of an earlier connection has them no more. */
static void release_retired(tport_client *c)
{
  while (c->shm_retired) {
    tport_shm *r = c->shm_retired;
    c->shm_retired = r->retired;
    if (r->pipe == atomic_load(&c->live_pipe)) {
      tport_shm_release(r, NULL);
      continue;
    }
    unlink_region(c, r);
    region_unmap(r);
  }
}

/* Makes the cached region hold at least need bytes (shm_mu held). */
static bool cache_fit(tport_client *c, size_t need)
{
  /* registered on an earlier connection (the server restarted, or the
   * client redialed): gone there, and its id may name another's */
  if (c->shm_cache && c->shm_cache->pipe != atomic_load(&c->live_pipe)) {
    unlink_region(c, c->shm_cache);
    region_unmap(c->shm_cache);
    c->shm_cache = NULL;
  }
  if (c->shm_cache && c->shm_cache->nbytes >= need)
    return true;
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  int64_t now_ms = (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
  if (now_ms < c->shm_retry_ms)
    return c->shm_cache != NULL && c->shm_cache->nbytes >= need;
  size_t old = c->shm_cache ? c->shm_cache->nbytes : 0;
  size_t want = need > 2 * old ? need : 2 * old;
  if (want > CLIENT_SHM_MAX_BYTES)
    want = need;
  want = (want + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1); /* whole huge pages */
  if (c->shm_cache) {
    tport_shm_release(c->shm_cache, NULL);
    c->shm_cache = NULL;
  }
  tport_err why;
  int rc = tport_shm_create(c, want, &c->shm_cache, &why);
  /* the socket cannot be reached from here, or its server is not one to
   * trust with memory: do not try again (a busy server, RESOURCE_EXHAUSTED,
   * may be tried later) */
  if (rc == TPORT_UNAVAILABLE || rc == TPORT_PERMISSION_DENIED ||
      rc == TPORT_FAILED_PRECONDITION)
    atomic_store(&c->shm_auto, false);
  else if (rc != TPORT_OK)
    c->shm_retry_ms = now_ms + 1000; /* over a quota, busy: the socket for a second */
  return rc == TPORT_OK;
}

tport_shm *client_shm_auto_take(tport_client *c, size_t cap)
{
  if (!atomic_load(&c->shm_auto) || pthread_mutex_trylock(&c->shm_mu) != 0)
    return NULL;
  release_retired(c); /* a get of any size comes here: retired ones do not linger */
  /* grown to what a transfer before found it short of, now that it is
   * used again (not when that one ended: a client that never comes back
   * would have made a region for nothing) */
  size_t need = cap >= CLIENT_SHM_MIN_BYTES && cap <= CLIENT_SHM_MAX_BYTES ? cap : 0;
  if (c->shm_grow_to > need)
    need = c->shm_grow_to;
  c->shm_grow_to = 0;
  if (atomic_load(&c->shm_auto) &&
      (need || (c->shm_cache && c->shm_cache->pipe != atomic_load(&c->live_pipe))))
    cache_fit(c, need > cap ? need : cap);
  if (!c->shm_cache) {
    pthread_mutex_unlock(&c->shm_mu);
    return NULL;
  }
  return c->shm_cache;
}

static void want_size(tport_client *c, size_t want)
{
  if (want >= CLIENT_SHM_MIN_BYTES && want <= CLIENT_SHM_MAX_BYTES && want > c->shm_grow_to)
    c->shm_grow_to = want;
}

void client_shm_auto_done(tport_client *c, size_t want)
{
  /* a tensor too large for the region came by socket: next time it fits */
  want_size(c, want);
  pthread_mutex_unlock(&c->shm_mu);
}

void client_shm_auto_want(tport_client *c, size_t want)
{
  if (!atomic_load(&c->shm_auto) || pthread_mutex_trylock(&c->shm_mu) != 0)
    return; /* busy: its user may say so as well */
  want_size(c, want);
  pthread_mutex_unlock(&c->shm_mu);
}

void client_shm_auto_retire(tport_client *c)
{
  /* unmapped here now: a late write lands in memory nobody reads here.
   * Released on the server (which unmaps it after its last write) by the
   * automatic region's next use: not now, right after the server did not
   * answer in time, which would make the caller wait that long again. */
  tport_shm *r = c->shm_cache;
  if (r) {
    munmap(r->data, r->nbytes);
    r->data = NULL;
    r->retired = c->shm_retired;
    c->shm_retired = r;
    c->shm_cache = NULL;
  }
  pthread_mutex_unlock(&c->shm_mu);
}

void client_shm_close(tport_client *c)
{
  /* the server's side goes with the connection */
  while (c->regions) {
    tport_shm *r = c->regions;
    unlink_region(c, r);
    region_unmap(r);
  }
  c->shm_cache = NULL; /* it was one of them, and so were the retired */
  c->shm_retired = NULL;
}

int client_shm_get_begin(tport_client *c, const client_get_desc *g, tport_shm *r,
                         Tport__GetBeginReply **out, client_payload *payload, bool *unanswered,
                         tport_err *err)
{
  return get_begin_shm(c, g->ref, g->wait_ms, r, 0, r->nbytes, true, true, -1, g, out, payload,
                       unanswered, err);
}
