/*
 * cuda_ipc.c: same-host puts from and gets into GPU memory by CUDA IPC
 * (cuda_ipc.h has the protocol and its rules).
 */
#include "cuda_ipc.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "shm.h"

/* The driver's calls (cuda.h's types: CUdeviceptr and
 * CUmemGenericAllocationHandle are unsigned long long, CUresult an int). */
typedef int (*fn_get_range)(unsigned long long *base, size_t *size, unsigned long long ptr);
typedef int (*fn_retain)(unsigned long long *handle, void *addr);
typedef int (*fn_export)(void *shareable, unsigned long long handle, int type,
                         unsigned long long flags);
typedef int (*fn_release)(unsigned long long handle);
#define POSIX_FD_HANDLE 1 /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */
#define DRIVER_API_VERSION 12000

typedef struct ipc_entry {
  unsigned long long base;
  size_t size;
  uint8_t handle[CUDA_RT_IPC_HANDLE_BYTES];
  uint64_t region;
  unsigned pipe; /* the connection it was registered on */
  uint64_t used; /* the table's clock at its last use */
  struct ipc_entry *next;
} ipc_entry;

struct client_ipc {
  int state; /* 0: not tried, 1: usable, -1: not on this client */
  const cuda_rt *rt;
  fn_get_range get_range;
  fn_retain retain;
  fn_export export_fd;
  fn_release release;
  ipc_entry *list;
  int n;
  uint64_t clock;
};

void client_ipc_destroy(client_ipc *ipc)
{
  if (!ipc)
    return;
  while (ipc->list) {
    ipc_entry *e = ipc->list;
    ipc->list = e->next;
    free(e);
  }
  free(ipc);
}

static void *driver_call(const cuda_rt *rt, const char *name)
{
  void *fn = NULL;
  int status = 0;
  if (rt->get_driver_entry_point(name, &fn, DRIVER_API_VERSION, 0, &status) != 0 || status != 0)
    return NULL;
  return fn;
}

/* The client's table, made on first use (ipc_mu held): NULL when the
 * same-host path is not for this client. */
static client_ipc *ipc_table(tport_client *c)
{
  if (!c->ipc && !(c->ipc = calloc(1, sizeof *c->ipc)))
    return NULL;
  client_ipc *t = c->ipc;
  if (t->state == 0) {
    t->state = -1;
    tport_err ignored;
    const cuda_rt *rt;
    if (!c->cuda_ipc || !c->shm_socket[0] || cuda_rt_load(&rt, &ignored) != TPORT_OK ||
        !rt->ipc_get_mem_handle || !rt->get_driver_entry_point)
      return NULL;
    t->rt = rt;
    void *p = driver_call(rt, "cuMemGetAddressRange");
    memcpy(&t->get_range, &p, sizeof p);
    if (!t->get_range)
      return NULL;
    /* the descriptor form is optional: without it, the handle's bytes */
    void *r = driver_call(rt, "cuMemRetainAllocationHandle");
    void *x = driver_call(rt, "cuMemExportToShareableHandle");
    void *l = driver_call(rt, "cuMemRelease");
    if (r && x && l) {
      memcpy(&t->retain, &r, sizeof r);
      memcpy(&t->export_fd, &x, sizeof x);
      memcpy(&t->release, &l, sizeof l);
    }
    t->state = 1;
  }
  return t->state > 0 ? t : NULL;
}

static void release_region(tport_client *c, uint64_t region)
{
  tport_err ignored;
  Tport__ShmReleaseRequest q = TPORT__SHM_RELEASE_REQUEST__INIT;
  q.region = region;
  ProtobufCMessage *r;
  if (client_rpc(c, TPORT__METHOD__METHOD_SHM_RELEASE, &q.base, NULL, 0,
                 &tport__shm_release_reply__descriptor, &r, NULL, &ignored) == TPORT_OK)
    protobuf_c_message_free_unpacked(r, NULL);
}

/* Takes e out of the table; with release, the server lets it go too (an
 * entry of an earlier connection is gone there already). */
static void drop(tport_client *c, client_ipc *t, ipc_entry *e, bool release)
{
  for (ipc_entry **pp = &t->list; *pp; pp = &(*pp)->next)
    if (*pp == e) {
      *pp = e->next;
      t->n--;
      break;
    }
  if (release && e->pipe == atomic_load(&c->live_pipe))
    release_region(c, e->region);
  free(e);
}

/* The allocation's descriptor, where the runtime exports one (-1: none). */
static int export_fd(client_ipc *t, unsigned long long base)
{
  if (!t->retain)
    return -1;
  unsigned long long h = 0;
  if (t->retain(&h, (void *)(uintptr_t)base) != 0)
    return -1; /* not a VMM allocation: its IPC handle, then */
  int fd = -1;
  if (t->export_fd(&fd, h, POSIX_FD_HANDLE, 0) != 0)
    fd = -1;
  t->release(h);
  return fd;
}

/* Registers the allocation [base, base + size) with its handle: the
 * server opens it (or maps the descriptor that follows). */
static int register_as(tport_client *c, unsigned long long size, int device, const uint8_t *handle,
                       int fd, uint64_t *region, tport_err *err)
{
  Tport__ShmRegisterRequest q = TPORT__SHM_REGISTER_REQUEST__INIT;
  q.nbytes = size;
  q.cuda_ipc_handle.data = (uint8_t *)handle;
  q.cuda_ipc_handle.len = CUDA_RT_IPC_HANDLE_BYTES;
  q.cuda_ipc_fd = fd >= 0;
  q.cuda_device = device;
  Tport__ShmRegisterReply *a;
  int rc = client_rpc(c, TPORT__METHOD__METHOD_SHM_REGISTER, &q.base, NULL, 0,
                      &tport__shm_register_reply__descriptor, (ProtobufCMessage **)&a, NULL, err);
  if (rc) {
    if (fd >= 0)
      close(fd);
    return rc;
  }
  uint64_t id = a->region;
  if (fd >= 0) {
    if (a->token.len != TRANSPORT_SHM_TOKEN_BYTES)
      rc = tport_err_set(err, TPORT_INTERNAL, "the server sent a %zu-byte token", a->token.len);
    else
      rc = transport_shm_send_to(c->shm_socket, a->token.data, fd, c->timeout_ms,
                                 atomic_load(&c->server_uid), err);
    close(fd); /* the server maps its own */
  } else if (!a->ready) {
    rc = tport_err_set(err, TPORT_INTERNAL, "the server did not open the CUDA IPC handle");
  }
  protobuf_c_message_free_unpacked(&a->base, NULL);
  if (rc) {
    release_region(c, id);
    return rc;
  }
  *region = id;
  return TPORT_OK;
}

static int register_alloc(tport_client *c, client_ipc *t, unsigned long long base, size_t size,
                          int device, const uint8_t *handle, uint64_t *region, tport_err *err)
{
  int fd = export_fd(t, base);
  int rc = register_as(c, size, device, handle, fd, region, err);
  /* a descriptor the server cannot map (a driver's, not a memfd): the
   * handle's bytes, then */
  if (fd >= 0 && (rc == TPORT_INVALID_ARGUMENT || rc == TPORT_UNIMPLEMENTED))
    rc = register_as(c, size, device, handle, -1, region, err);
  return rc;
}

/* The region and offset of [mem->base, + nbytes): registered now unless
 * this connection has the allocation already (ipc_mu held). */
static int resolve(tport_client *c, client_ipc *t, const client_devmem *mem, size_t nbytes,
                   uint64_t *region, uint64_t *offset, tport_err *err)
{
  const cuda_rt *rt = t->rt;
  int prev = -1;
  cuda_rt_status st = rt->get_device(&prev);
  if (!st && prev != mem->device)
    st = rt->set_device(mem->device);
  if (st)
    return cuda_rt_fail(rt, st, TPORT_UNAVAILABLE, "cudaSetDevice", err);
  unsigned long long base = 0, ptr = (uintptr_t)mem->base;
  size_t size = 0;
  cuda_rt_ipc_handle h;
  int rc = TPORT_OK;
  if (t->get_range(&base, &size, ptr) != 0)
    rc = tport_err_set(err, TPORT_UNAVAILABLE,
                       "cuMemGetAddressRange(%p) failed: not memory of a cudaMalloc", mem->base);
  else if (ptr - base > size || nbytes > size - (ptr - base))
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT,
                       "%zu bytes at %p pass the end of their allocation (%zu bytes at 0x%llx)",
                       nbytes, mem->base, size, base);
  else if ((st = rt->ipc_get_mem_handle(&h, (void *)(uintptr_t)base)) != 0)
    rc = cuda_rt_fail(rt, st, TPORT_UNAVAILABLE, "cudaIpcGetMemHandle", err);
  /* the producer's work on the device's legacy default stream lands before
   * the server reads or writes the memory */
  else if ((st = rt->stream_synchronize(NULL)) != 0)
    rc = cuda_rt_fail(rt, st, TPORT_INTERNAL, "cudaStreamSynchronize (legacy stream)", err);
  if (prev != mem->device && prev >= 0)
    rt->set_device(prev);
  if (rc)
    return rc;
  unsigned pipe = atomic_load(&c->live_pipe);
  ipc_entry *hit = NULL;
  for (ipc_entry *e = t->list, *next; e; e = next) {
    next = e->next;
    bool overlaps = e->base < base + size && base < e->base + e->size;
    if (!overlaps && e->pipe == pipe)
      continue;
    if (overlaps && e->pipe == pipe && e->base == base && e->size == size &&
        memcmp(e->handle, h.reserved, sizeof e->handle) == 0) {
      hit = e;
      continue;
    }
    /* another connection's (the server restarted or the client redialed:
     * gone there), or an allocation freed since (its address reused) */
    drop(c, t, e, true);
  }
  if (!hit) {
    uint64_t id;
    if ((rc = register_alloc(c, t, base, size, mem->device, (const uint8_t *)h.reserved, &id,
                             err)) != TPORT_OK)
      return rc;
    if (t->n >= CLIENT_IPC_MAX) { /* the least recently used goes */
      ipc_entry *old = t->list;
      for (ipc_entry *e = t->list; e; e = e->next)
        if (e->used < old->used)
          old = e;
      drop(c, t, old, true);
    }
    if (!(hit = calloc(1, sizeof *hit))) {
      release_region(c, id);
      return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
    }
    hit->base = base;
    hit->size = size;
    memcpy(hit->handle, h.reserved, sizeof hit->handle);
    hit->region = id;
    hit->pipe = pipe;
    hit->next = t->list;
    t->list = hit;
    t->n++;
  }
  hit->used = ++t->clock;
  *region = hit->region;
  *offset = ptr - base;
  return TPORT_OK;
}

/* Forgets a region the server said it does not know. */
static void forget(tport_client *c, uint64_t region)
{
  pthread_mutex_lock(&c->ipc_mu);
  client_ipc *t = c->ipc;
  for (ipc_entry *e = t ? t->list : NULL; e; e = e->next)
    if (e->region == region) {
      drop(c, t, e, false);
      break;
    }
  pthread_mutex_unlock(&c->ipc_mu);
}

/* Whether a failure to register means "stage instead": the server cannot
 * or will not open it (then not asked again on this client), or the
 * runtime cannot export it. */
static bool falls_back(client_ipc *t, int rc)
{
  switch (rc) {
  case TPORT_FAILED_PRECONDITION:
  case TPORT_UNIMPLEMENTED: t->state = -1; return true;
  case TPORT_UNAVAILABLE:
  case TPORT_PERMISSION_DENIED:
  case TPORT_RESOURCE_EXHAUSTED:
  case TPORT_ALREADY_EXISTS: return true;
  default: return false;
  }
}

/* The region slice for mem: *used false when the caller must stage. */
static int slice_for(tport_client *c, const client_devmem *mem, size_t nbytes,
                     Tport__ShmSlice *slice, bool *used, tport_err *err)
{
  *used = false;
  if (!nbytes || mem->managed || !c->cuda_ipc)
    return TPORT_OK;
  pthread_mutex_lock(&c->ipc_mu);
  client_ipc *t = ipc_table(c);
  uint64_t region = 0, offset = 0;
  tport_err why;
  int rc = t ? resolve(c, t, mem, nbytes, &region, &offset, &why) : TPORT_OK;
  bool stage = !t || (rc && falls_back(t, rc));
  pthread_mutex_unlock(&c->ipc_mu);
  if (stage)
    return TPORT_OK;
  *used = true;
  if (rc) {
    if (err)
      *err = why;
    return rc;
  }
  tport__shm_slice__init(slice);
  slice->region = region;
  slice->offset = offset;
  slice->length = nbytes;
  return TPORT_OK;
}

int client_ipc_put(tport_client *c, tport_dtype dtype, int ndim, const int64_t *sizes,
                   const int64_t *strides, const client_devmem *mem, size_t nbytes,
                   const tport_put_options *opts, tport_tensor_info *out, bool *used,
                   tport_err *err)
{
  tport_err local;
  if (!err)
    err = &local;
  int rc = TPORT_OK;
  for (int attempt = 0; attempt < 2; attempt++) {
    Tport__ShmSlice slice;
    if ((rc = slice_for(c, mem, nbytes, &slice, used, err)) != TPORT_OK || !*used)
      return rc;
    Tport__TensorDesc desc;
    Tport__PutBeginRequest q;
    client_put_request(c, dtype, ndim, sizes, strides, opts, &desc, &q);
    q.shm = &slice;
    q.commit = true;
    Tport__PutBeginReply *b;
    rc = client_rpc(c, TPORT__METHOD__METHOD_PUT_BEGIN, &q.base, NULL, 0,
                    &tport__put_begin_reply__descriptor, (ProtobufCMessage **)&b, NULL, err);
    if (rc == TPORT_NOT_FOUND && attempt == 0 && strstr(err->msg, "has no region")) {
      forget(c, slice.region); /* the server restarted, or the connection changed */
      continue;
    }
    if (rc)
      return rc;
    if (opts && opts->progress)
      opts->progress(opts->progress_arg, nbytes, nbytes);
    if (out)
      client_info_from_wire(b->info, out);
    protobuf_c_message_free_unpacked(&b->base, NULL);
    return TPORT_OK;
  }
  return rc;
}

int client_ipc_get(tport_client *c, const tport_ref *ref, const client_devmem *mem, size_t cap,
                   const client_get_want *want, tport_tensor_info *info, bool *used, tport_err *err)
{
  tport_err local;
  if (!err)
    err = &local;
  int rc = TPORT_OK;
  for (int attempt = 0; attempt < 2; attempt++) {
    Tport__ShmSlice slice;
    if ((rc = slice_for(c, mem, cap, &slice, used, err)) != TPORT_OK || !*used)
      return rc;
    Tport__Ref w;
    client_ref_to_wire(ref, &w);
    Tport__GetBeginRequest q = TPORT__GET_BEGIN_REQUEST__INIT;
    /* the server writes before the reply says what it wrote: the tensor is
     * checked first, so that a wrong destination gets nothing -- by the
     * server itself where it says it checks (one round trip), else by an
     * Info before the get */
    if (want && atomic_load(&c->get_expect)) {
      q.expect_set = true;
      q.expect_dtype = (Tport__DType)want->dtype;
      q.n_expect_sizes = (size_t)want->ndim;
      q.expect_sizes = (int64_t *)want->sizes;
    } else {
      Tport__InfoRequest iq = TPORT__INFO_REQUEST__INIT;
      iq.ref = &w;
      Tport__InfoReply *ir;
      if ((rc = client_rpc(c, TPORT__METHOD__METHOD_INFO, &iq.base, NULL, 0,
                           &tport__info_reply__descriptor, (ProtobufCMessage **)&ir, NULL, err)) !=
          TPORT_OK)
        return rc;
      rc = want ? client_want_mismatch(want, ir->info, err) : TPORT_OK;
      if (!rc && ir->info && (uint64_t)ir->info->nbytes != cap)
        rc = tport_err_set(err, TPORT_DATA_LOSS,
                           "the tensor is %lld bytes: its sizes and dtype say %zu",
                           (long long)ir->info->nbytes, cap);
      protobuf_c_message_free_unpacked(&ir->base, NULL);
      if (rc)
        return rc;
    }
    q.ref = &w;
    q.shm = &slice;
    Tport__GetBeginReply *b;
    rc = client_rpc(c, TPORT__METHOD__METHOD_GET_BEGIN, &q.base, NULL, 0,
                    &tport__get_begin_reply__descriptor, (ProtobufCMessage **)&b, NULL, err);
    if (rc == TPORT_NOT_FOUND && attempt == 0 && strstr(err->msg, "has no region")) {
      forget(c, slice.region);
      continue;
    }
    if (rc)
      return rc;
    if (!b->shm || b->nbytes != cap)
      rc = tport_err_set(err, TPORT_DATA_LOSS,
                         "the server wrote %llu bytes into the %zu-byte destination%s",
                         (unsigned long long)b->nbytes, cap, b->shm ? "" : " (not through IPC)");
    if (!rc)
      rc = client_want_mismatch(want, b->info, err); /* replaced since the check */
    if (!rc && info)
      client_info_from_wire(b->info, info);
    protobuf_c_message_free_unpacked(&b->base, NULL);
    return rc;
  }
  return rc;
}
