/*
 * backend_cuda.c: the device backend on the CUDA runtime.
 *
 * Every entry of the backend table maps onto the runtime API under a device
 * guard (the device is made current for the call and restored after, so no
 * call leaves a context on a device it does not name: no stray context on
 * GPU 0).  Every CUDA error becomes a tensorport error naming the call.
 * Device memory comes from the caching allocator (cuda_alloc.c); copies
 * that are not plain memcpys run the runtime-compiled copy kernel
 * (cuda_jit.c).  Without a driver or a device, device_count() is 0 and
 * unavailable_reason() gives the runtime's own message.
 */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cuda_alloc.h"
#include "cuda_jit.h"

#define CU_MAX_DEVICES 64

struct be_stream {
  int dev;
  cudaStream_t s;
};

struct be_event {
  int dev;
  cudaEvent_t e;
};

static struct {
  pthread_once_t once;
  int count;
  char reason[256];
  pthread_mutex_t mu; /* guards streams */
  be_stream *streams[CU_MAX_DEVICES];
} cu = {.once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER};

/* Turns a CUDA error into a tensorport error naming the call; clears the
 * runtime's last-error state so that a failed call does not poison the next. */
static int cu_fail(cudaError_t e, const char *call, tport_err *err)
{
  cudaGetLastError();
  int code = e == cudaErrorMemoryAllocation ? TPORT_RESOURCE_EXHAUSTED
             : e == cudaErrorInvalidValue || e == cudaErrorInvalidDevice ||
                     e == cudaErrorInvalidDevicePointer
                 ? TPORT_INVALID_ARGUMENT
                 : TPORT_INTERNAL;
  return tport_err_set(err, code, "%s: %s (%s)", call, cudaGetErrorString(e), cudaGetErrorName(e));
}
#define CU_CALL(expr, err)                                                                         \
  do {                                                                                             \
    cudaError_t cu_e_ = (expr);                                                                    \
    if (cu_e_ != cudaSuccess)                                                                      \
      return cu_fail(cu_e_, #expr, err);                                                           \
  } while (0)

/* ---------------------------------------------------------------- device guard */

typedef struct guard {
  int prev;
  bool changed;
} guard;

static int guard_enter(int dev, guard *g, tport_err *err)
{
  g->changed = false;
  CU_CALL(cudaGetDevice(&g->prev), err);
  if (g->prev != dev) {
    CU_CALL(cudaSetDevice(dev), err);
    g->changed = true;
  }
  return TPORT_OK;
}

static void guard_exit(guard *g)
{
  if (g->changed)
    cudaSetDevice(g->prev);
}

/* Runs one runtime call under the device guard. */
#define GUARDED(dev, expr, err)                                                                    \
  do {                                                                                             \
    guard g_;                                                                                      \
    int rc_ = guard_enter((dev), &g_, (err));                                                      \
    if (rc_)                                                                                       \
      return rc_;                                                                                  \
    cudaError_t e_ = (expr);                                                                       \
    guard_exit(&g_);                                                                               \
    if (e_ != cudaSuccess)                                                                         \
      return cu_fail(e_, #expr, (err));                                                            \
  } while (0)

/* ---------------------------------------------------------------- devices */

static void cu_init(void)
{
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(cu.reason, sizeof cu.reason, "%s (%s)", cudaGetErrorString(e), cudaGetErrorName(e));
    cudaGetLastError();
    n = 0;
  } else if (n == 0) {
    snprintf(cu.reason, sizeof cu.reason, "the CUDA runtime found no device");
  }
  cu.count = n > CU_MAX_DEVICES ? CU_MAX_DEVICES : n;
}

static int cu_count(void)
{
  pthread_once(&cu.once, cu_init);
  return cu.count;
}

static const char *cu_reason(void)
{
  pthread_once(&cu.once, cu_init);
  return cu.reason;
}

static int check_dev(int dev, tport_err *err)
{
  if (dev < 0 || dev >= cu_count())
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "cuda:%d does not exist (%d CUDA devices)",
                         dev, cu_count());
  return TPORT_OK;
}

static int cu_mem_info(int dev, size_t *free_bytes, size_t *total, tport_err *err)
{
  int rc = check_dev(dev, err);
  if (rc)
    return rc;
  GUARDED(dev, cudaMemGetInfo(free_bytes, total), err);
  return TPORT_OK;
}

/* ---------------------------------------------------------------- memory */

static int cu_alloc(int dev, size_t bytes, void **out, tport_err *err)
{
  int rc = check_dev(dev, err);
  guard g;
  if (rc || (rc = guard_enter(dev, &g, err)))
    return rc;
  rc = cuda_alloc(dev, bytes, out, err);
  guard_exit(&g);
  return rc;
}

static void cu_free(int dev, void *p)
{
  if (!p)
    return;
  if (cuda_alloc_free(dev, p))
    return;
  /* not a cached block: managed memory */
  guard g;
  if (guard_enter(dev, &g, NULL) == TPORT_OK) {
    cudaFree(p);
    guard_exit(&g);
  }
}

static int cu_alloc_managed(int dev, size_t bytes, void **out, tport_err *err)
{
  size_t freeb, total;
  int rc = cu_mem_info(dev, &freeb, &total, err);
  if (rc)
    return rc;
  /* never ask for more managed memory than the device has free (SEMANTICS.md §6) */
  if (bytes > freeb)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                         "cuda:%d: %zu bytes of managed memory asked, %zu free", dev, bytes, freeb);
  GUARDED(dev, cudaMallocManaged(out, bytes ? bytes : 1, cudaMemAttachGlobal), err);
  return TPORT_OK;
}

static int cu_host_alloc(size_t bytes, void **out, tport_err *err)
{
  CU_CALL(cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocPortable), err);
  return TPORT_OK;
}

static void cu_host_free(void *p)
{
  if (p)
    cudaFreeHost(p);
}

/* ---------------------------------------------------------------- streams */

static int stream_new(int dev, be_stream **out, tport_err *err)
{
  be_stream *s = calloc(1, sizeof *s);
  if (!s)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of host memory for a stream");
  s->dev = dev;
  guard g;
  int rc = guard_enter(dev, &g, err);
  if (!rc) {
    cudaError_t e = cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking);
    guard_exit(&g);
    if (e != cudaSuccess)
      rc = cu_fail(e, "cudaStreamCreateWithFlags(cudaStreamNonBlocking)", err);
  }
  if (rc) {
    free(s);
    return rc;
  }
  *out = s;
  return TPORT_OK;
}

static be_stream *cu_stream_default(int dev)
{
  if (dev < 0 || dev >= cu_count())
    return NULL;
  pthread_mutex_lock(&cu.mu);
  if (!cu.streams[dev] && stream_new(dev, &cu.streams[dev], NULL) != TPORT_OK) {
    /* cannot create a stream: fall back to the legacy default stream (it
     * synchronizes with the others, which is slower but still ordered) */
    be_stream *s = calloc(1, sizeof *s);
    if (s) {
      s->dev = dev;
      s->s = 0;
    }
    cu.streams[dev] = s;
  }
  be_stream *s = cu.streams[dev];
  pthread_mutex_unlock(&cu.mu);
  return s;
}

static int cu_stream_create(int dev, be_stream **out, tport_err *err)
{
  int rc = check_dev(dev, err);
  return rc ? rc : stream_new(dev, out, err);
}

static int cu_stream_sync(be_stream *s, tport_err *err)
{
  GUARDED(s->dev, cudaStreamSynchronize(s->s), err);
  return TPORT_OK;
}

static void cu_stream_destroy(be_stream *s)
{
  if (!s)
    return;
  cu_stream_sync(s, NULL);
  guard g;
  if (s->s && guard_enter(s->dev, &g, NULL) == TPORT_OK) {
    cudaStreamDestroy(s->s);
    guard_exit(&g);
  }
  free(s);
}

/* ---------------------------------------------------------------- copies */

static int cu_memcpy(int dev, be_stream *s, void *dst, const void *src, size_t n, be_copy_kind kind,
                     tport_err *err)
{
  enum cudaMemcpyKind k = kind == BE_H2D   ? cudaMemcpyHostToDevice
                          : kind == BE_D2H ? cudaMemcpyDeviceToHost
                          : kind == BE_D2D ? cudaMemcpyDeviceToDevice
                                           : cudaMemcpyHostToHost;
  if (n == 0)
    return TPORT_OK;
  GUARDED(dev, cudaMemcpyAsync(dst, src, n, k, s->s), err);
  return TPORT_OK;
}

static int cu_memcpy_peer(int dst_dev, void *dst, int src_dev, const void *src, size_t n,
                          be_stream *s, tport_err *err)
{
  if (n == 0)
    return TPORT_OK;
  GUARDED(s->dev, cudaMemcpyPeerAsync(dst, dst_dev, src, src_dev, n, s->s), err);
  return TPORT_OK;
}

static int cu_kernel(int dev, be_stream *s, const plan *p, void *dst, tport_dtype dt,
                     const void *src, tport_dtype st, unsigned flags, tport_err *err)
{
  guard g;
  int rc = guard_enter(dev, &g, err);
  if (rc)
    return rc;
  rc = cuda_jit_copy(dev, s->s, p, dst, dt, src, st, flags, err);
  guard_exit(&g);
  return rc;
}

static int cu_host_fn(be_stream *s, be_host_fn fn, void *arg, tport_err *err)
{
  GUARDED(s->dev, cudaLaunchHostFunc(s->s, fn, arg), err);
  return TPORT_OK;
}

/* ---------------------------------------------------------------- events */

static int cu_event_create(int dev, be_event **out, tport_err *err)
{
  be_event *e = calloc(1, sizeof *e);
  if (!e)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of host memory for an event");
  e->dev = dev;
  guard g;
  int rc = guard_enter(dev, &g, err);
  if (!rc) {
    cudaError_t ce = cudaEventCreateWithFlags(&e->e, cudaEventDisableTiming);
    guard_exit(&g);
    if (ce != cudaSuccess)
      rc = cu_fail(ce, "cudaEventCreateWithFlags(cudaEventDisableTiming)", err);
  }
  if (rc) {
    free(e);
    return rc;
  }
  *out = e;
  return TPORT_OK;
}

/* CUDA releases a destroyed event's resources once its pending record completes. */
static void cu_event_destroy(be_event *e)
{
  if (!e)
    return;
  guard g;
  if (guard_enter(e->dev, &g, NULL) == TPORT_OK) {
    cudaEventDestroy(e->e);
    guard_exit(&g);
  }
  free(e);
}

static int cu_event_record(be_event *e, be_stream *s, tport_err *err)
{
  GUARDED(e->dev, cudaEventRecord(e->e, s->s), err);
  return TPORT_OK;
}

static int cu_stream_wait(be_stream *s, be_event *e, tport_err *err)
{
  GUARDED(s->dev, cudaStreamWaitEvent(s->s, e->e, 0), err);
  return TPORT_OK;
}

static bool cu_event_query(be_event *e)
{
  cudaError_t r = cudaEventQuery(e->e);
  if (r == cudaErrorNotReady)
    return false;
  if (r != cudaSuccess)
    cudaGetLastError(); /* a failed event will never complete: do not wait on it forever */
  return true;
}

static int cu_event_sync(be_event *e, tport_err *err)
{
  CU_CALL(cudaEventSynchronize(e->e), err);
  return TPORT_OK;
}

/* ---------------------------------------------------------------- peers, managed memory */

static bool cu_can_access_peer(int dev, int peer)
{
  if (dev < 0 || peer < 0 || dev >= cu_count() || peer >= cu_count())
    return false;
  if (dev == peer)
    return true;
  int can = 0;
  if (cudaDeviceCanAccessPeer(&can, dev, peer) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return can != 0;
}

static int cu_enable_peer(int dev, int peer, tport_err *err)
{
  if (dev == peer)
    return TPORT_OK;
  if (!cu_can_access_peer(dev, peer))
    return tport_err_set(err, TPORT_FAILED_PRECONDITION, "cuda:%d cannot access cuda:%d", dev,
                         peer);
  guard g;
  int rc = guard_enter(dev, &g, err);
  if (rc)
    return rc;
  cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
  guard_exit(&g);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    cudaGetLastError();
    return TPORT_OK;
  }
  return e == cudaSuccess ? TPORT_OK : cu_fail(e, "cudaDeviceEnablePeerAccess", err);
}

static struct cudaMemLocation location(int dev)
{
  struct cudaMemLocation l;
  memset(&l, 0, sizeof l);
  l.type = dev < 0 ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
  l.id = dev < 0 ? 0 : dev;
  return l;
}

static int cu_advise(void *ptr, size_t n, int dev, tport_err *err)
{
  CU_CALL(cudaMemAdvise(ptr, n, cudaMemAdviseSetPreferredLocation, location(dev)), err);
  return TPORT_OK;
}

static int cu_prefetch(void *ptr, size_t n, int dev, be_stream *s, tport_err *err)
{
  GUARDED(s->dev, cudaMemPrefetchAsync(ptr, n, location(dev), 0, s->s), err);
  return TPORT_OK;
}

static void cu_describe(int dev, char *name, size_t nl, char *cc, size_t cl)
{
  struct cudaDeviceProp p;
  if (dev < 0 || dev >= cu_count() || cudaGetDeviceProperties(&p, dev) != cudaSuccess) {
    cudaGetLastError();
    snprintf(name, nl, "%s", "");
    snprintf(cc, cl, "%s", "");
    return;
  }
  snprintf(name, nl, "%s", p.name);
  snprintf(cc, cl, "%d.%d", p.major, p.minor);
}

static size_t cu_stats(be_stat *out, size_t max)
{
  cuda_jit_stats js;
  cuda_jit_get_stats(&js);
  const struct {
    const char *name;
    int64_t v;
  } jv[] = {{"kernel_cache_hits", (int64_t)js.hits},
            {"kernel_cache_misses", (int64_t)js.misses},
            {"kernel_cache_disk_hits", (int64_t)js.disk_hits},
            {"kernel_compile_ms", (int64_t)js.compile_ms}};
  size_t n = 0;
  for (size_t i = 0; i < sizeof jv / sizeof jv[0] && n < max; i++, n++) {
    snprintf(out[n].name, sizeof out[n].name, "%s", jv[i].name);
    out[n].value = jv[i].v;
  }
  for (int d = 0; d < cu_count() && n + 3 <= max; d++) {
    cuda_alloc_stats as;
    cuda_alloc_get_stats(d, &as);
    snprintf(out[n].name, sizeof out[n].name, "cuda%d_alloc_hits", d);
    out[n++].value = (int64_t)as.hits;
    snprintf(out[n].name, sizeof out[n].name, "cuda%d_bytes_in_use", d);
    out[n++].value = (int64_t)as.bytes_in_use;
    snprintf(out[n].name, sizeof out[n].name, "cuda%d_bytes_cached", d);
    out[n++].value = (int64_t)as.bytes_cached;
  }
  return n;
}

static int cu_set_option(const char *key, const char *value, tport_err *err)
{
  if (strcmp(key, "kernel-cache") == 0) {
    cuda_jit_set_cache_dir(value && *value ? value : NULL);
    return TPORT_OK;
  }
  return tport_err_set(err, TPORT_UNIMPLEMENTED, "cuda has no option '%s'", key);
}

const backend_ops backend_cuda = {
    .name = "cuda",
    .type = TPORT_DEV_CUDA,
    .device_count = cu_count,
    .unavailable_reason = cu_reason,
    .mem_info = cu_mem_info,
    .alloc = cu_alloc,
    .free = cu_free,
    .alloc_managed = cu_alloc_managed,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .stream_default = cu_stream_default,
    .stream_create = cu_stream_create,
    .stream_destroy = cu_stream_destroy,
    .stream_synchronize = cu_stream_sync,
    .memcpy_async = cu_memcpy,
    .memcpy_peer_async = cu_memcpy_peer,
    .copy_kernel = cu_kernel,
    .launch_host_func = cu_host_fn,
    .event_create = cu_event_create,
    .event_destroy = cu_event_destroy,
    .event_record = cu_event_record,
    .stream_wait_event = cu_stream_wait,
    .event_query = cu_event_query,
    .event_synchronize = cu_event_sync,
    .can_access_peer = cu_can_access_peer,
    .enable_peer_access = cu_enable_peer,
    .mem_advise_preferred = cu_advise,
    .mem_prefetch_async = cu_prefetch,
    .describe = cu_describe,
    .stats = cu_stats,
    .set_option = cu_set_option,
};
