/*
 * backend_cuda.c: the device backend on the CUDA runtime.
 *
 * Every entry of the backend table maps onto the runtime API under a device
 * guard: the device a call acts on is made current for the call, and the
 * thread's previous device is put back only where that cannot create a
 * context (see "device guard" below), so that no call leaves a context on a
 * device it does not name: no stray context on GPU 0.  Calls that name no
 * device (pinned host memory) run on a device that already has a context.
 * Every CUDA error becomes a tensorport error naming the call.  Device
 * memory comes from the caching allocator (cuda_alloc.c); copies that are
 * not plain memcpys run the runtime-compiled copy kernel (cuda_jit.c).
 * Without a driver or a device, device_count() is 0 and unavailable_reason()
 * gives the runtime's own message with the driver's and the runtime's
 * versions.
 *
 * Capabilities a device may lack are answered per call, as the cpu backend
 * answers managed memory: where cudaDevAttrConcurrentManagedAccess is 0
 * (the host and the device cannot both touch managed memory while work
 * runs), managed allocations, advice and prefetches for that device fail
 * with FAILED_PRECONDITION saying so.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_alloc.h"
#include "cuda_internal.h"
#include "cuda_jit.h"

cu_state cu = {.once = PTHREAD_ONCE_INIT,
               .mu = PTHREAD_MUTEX_INITIALIZER,
               .peer_mu = PTHREAD_MUTEX_INITIALIZER};

int cu_fail(cudaError_t e, const char *call, tport_err *err)
{
  cudaGetLastError();
  int code;
  switch (e) {
  case cudaErrorMemoryAllocation: code = TPORT_RESOURCE_EXHAUSTED; break;
  case cudaErrorInvalidValue:
  case cudaErrorInvalidDevice:
  case cudaErrorInvalidDevicePointer: code = TPORT_INVALID_ARGUMENT; break;
  /* a stream, event or kernel used on a device it does not belong to: the
   * engine broke the backend's contract (backend_sim.c refuses it the same way) */
  case cudaErrorInvalidResourceHandle: code = TPORT_INTERNAL; break;
  default: code = TPORT_INTERNAL; break;
  }
  return tport_err_set(err, code, "%s: %s (%s)", call, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* ---------------------------------------------------------------- devices */

/* "CUDA driver 12.4, runtime 13.0: ..." for messages that explain why CUDA
 * cannot be used (a version is 1000 * major + 10 * minor). */
static void versions_text(char *buf, size_t n)
{
  int d = cu.driver_version, r = cu.runtime_version;
  if (d <= 0) {
    snprintf(buf, n,
             "no NVIDIA driver is installed (cudaDriverGetVersion gives %d); CUDA runtime %d.%d", d,
             r / 1000, r % 1000 / 10);
    return;
  }
  snprintf(buf, n, "CUDA driver %d.%d, runtime %d.%d%s", d / 1000, d % 1000 / 10, r / 1000,
           r % 1000 / 10,
           d >= r           ? ""
           : r / 1000 == 13 ? ": the driver is older than the runtime (the CUDA 13 runtime needs "
                              "an R580-series driver or newer)"
                            : ": the driver is older than the runtime");
}

static void cu_init(void)
{
  if (cudaDriverGetVersion(&cu.driver_version) != cudaSuccess)
    cu.driver_version = 0;
  if (cudaRuntimeGetVersion(&cu.runtime_version) != cudaSuccess)
    cu.runtime_version = 0;
  cudaGetLastError();
  char versions[200];
  versions_text(versions, sizeof versions);
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(cu.reason, sizeof cu.reason, "%s (%s); %s", cudaGetErrorString(e), cudaGetErrorName(e),
             versions);
    cudaGetLastError();
    n = 0;
  } else if (n == 0) {
    snprintf(cu.reason, sizeof cu.reason, "the CUDA runtime found no device; %s", versions);
  }
  if (n > CU_MAX_DEVICES)
    n = CU_MAX_DEVICES;
  /* attribute queries need no context */
  for (int d = 0; d < n; d++) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrConcurrentManagedAccess, d) != cudaSuccess) {
      cudaGetLastError();
      v = 0;
    }
    cu.managed_ok[d] = v != 0;
  }
  if (n > 0) {
    /* The driver's entry point through the runtime (as PyTorch's
     * c10::cuda getDriverEntryPoint): linking libcuda would stop every
     * binary from starting where no driver is installed.  Version 12000:
     * the ABI of cuDevicePrimaryCtxGetState has not changed since 7.0. */
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &fn, 12000,
                                         cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess && fn)
      cu.ctx_state = (PFN_cuDevicePrimaryCtxGetState_v7000)fn;
    cudaGetLastError();
  }
  cu.count = n;
}

int cu_count(void)
{
  pthread_once(&cu.once, cu_init);
  return cu.count;
}

const char *cu_reason(void)
{
  pthread_once(&cu.once, cu_init);
  return cu.reason;
}

int cu_check_dev(int dev, tport_err *err)
{
  if (dev < 0 || dev >= cu_count())
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "cuda:%d does not exist (%d CUDA devices)",
                         dev, cu_count());
  return TPORT_OK;
}
/* ---------------------------------------------------------------- device guard
 *
 * Since CUDA 12, cudaSetDevice initializes the device's primary context
 * (hundreds of MiB of device memory).  A guard that put the thread's
 * previous device back with cudaSetDevice would create a context on a device
 * the call never named: a fresh thread's current device is 0, so every
 * process would hold one on GPU 0.  As PyTorch's c10::cuda::MaybeSetDevice
 * and MaybeExchangeDevice do, the previous device is restored only when its
 * primary context is already active; otherwise the thread stays on the
 * guarded device.  Every call of this backend names its device and takes a
 * guard, so nothing depends on the device a thread is left on.
 */
/* Whether dev's primary context is active.  Without the driver's entry
 * point the answer is "no": a restore is skipped rather than risk a context
 * (the cuda_jit and engine code never rely on the current device). */
bool cu_has_context(int dev)
{
  pthread_once(&cu.once, cu_init);
  if (!cu.ctx_state || dev < 0 || dev >= cu.count)
    return false;
  unsigned flags = 0;
  int active = 0; /* PyTorch saw garbage here for inactive contexts unless zeroed */
  /* CUdevice and the runtime's ordinal agree: both follow CUDA_VISIBLE_DEVICES */
  return cu.ctx_state((CUdevice)dev, &flags, &active) == CUDA_SUCCESS && active == 1;
}
int cu_guard_enter(int dev, cu_guard *g, tport_err *err)
{
  g->changed = false;
  CU_CALL(cudaGetDevice(&g->prev), err); /* creates no context */
  if (g->prev != dev) {
    CU_CALL(cudaSetDevice(dev), err);
    g->changed = true;
  }
  return TPORT_OK;
}

void cu_guard_exit(cu_guard *g)
{
  if (g->changed && cu_has_context(g->prev) && cudaSetDevice(g->prev) != cudaSuccess)
    cudaGetLastError();
}
/* The device for calls that act on no device of their own (pinned host
 * memory, advice for the host): the current one if it has a context, else
 * the first that has one, else the current one (PyTorch's
 * getDeviceIndexWithPrimaryContext, as its pinned allocator uses it). */
int cu_context_device(void)
{
  int cur = 0;
  if (cudaGetDevice(&cur) != cudaSuccess) {
    cudaGetLastError();
    cur = 0;
  }
  if (cu_has_context(cur))
    return cur;
  for (int d = 0; d < cu_count(); d++)
    if (d != cur && cu_has_context(d))
      return d;
  return cur;
}

int cu_mem_info(int dev, size_t *free_bytes, size_t *total, tport_err *err)
{
  int rc = cu_check_dev(dev, err);
  if (rc)
    return rc;
  GUARDED(dev, cudaMemGetInfo(free_bytes, total), err);
  return TPORT_OK;
}
/* ---------------------------------------------------------------- peers, managed memory */

static bool cu_can_access_peer(int dev, int peer)
{
  if (dev < 0 || peer < 0 || dev >= cu_count() || peer >= cu_count())
    return false;
  if (dev == peer)
    return true;
  unsigned char st = atomic_load(&cu.peer[dev][peer]);
  if (st == PEER_UNKNOWN) {
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, dev, peer) != cudaSuccess) { /* needs no context */
      cudaGetLastError();
      can = 0;
    }
    unsigned char expect = PEER_UNKNOWN;
    /* never overwrite what another thread found or enabled meanwhile */
    atomic_compare_exchange_strong(&cu.peer[dev][peer], &expect, can ? PEER_POSSIBLE : PEER_NEVER);
    st = atomic_load(&cu.peer[dev][peer]);
  }
  return st != PEER_NEVER;
}

/* Enabled once per (dev, peer) pair for the life of the process; a pair
 * whose enabling failed (cudaErrorTooManyPeers, say) is remembered as never
 * possible, so that later copies take the staged path without asking again. */
static int cu_enable_peer(int dev, int peer, tport_err *err)
{
  if (dev == peer && dev >= 0 && dev < cu_count())
    return TPORT_OK;
  if (!cu_can_access_peer(dev, peer))
    return tport_err_set(err, TPORT_FAILED_PRECONDITION, "cuda:%d cannot access cuda:%d", dev,
                         peer);
  if (atomic_load(&cu.peer[dev][peer]) == PEER_ENABLED)
    return TPORT_OK;
  pthread_mutex_lock(&cu.peer_mu);
  int rc = TPORT_OK;
  unsigned char st = atomic_load(&cu.peer[dev][peer]);
  if (st == PEER_NEVER) {
    rc = tport_err_set(err, TPORT_FAILED_PRECONDITION, "cuda:%d cannot access cuda:%d", dev, peer);
  } else if (st != PEER_ENABLED) {
    cu_guard g;
    rc = cu_guard_enter(dev, &g, err);
    if (!rc) {
      cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
      cu_guard_exit(&g);
      if (e == cudaErrorPeerAccessAlreadyEnabled) { /* enabled outside this backend */
        cudaGetLastError();
        e = cudaSuccess;
      }
      atomic_store(&cu.peer[dev][peer], e == cudaSuccess ? PEER_ENABLED : PEER_NEVER);
      if (e != cudaSuccess)
        rc = cu_fail(e, "cudaDeviceEnablePeerAccess", err);
    }
  }
  pthread_mutex_unlock(&cu.peer_mu);
  return rc;
}

static struct cudaMemLocation location(int dev)
{
  struct cudaMemLocation l;
  memset(&l, 0, sizeof l);
  l.type = dev < 0 ? cudaMemLocationTypeHost : cudaMemLocationTypeDevice;
  l.id = dev < 0 ? 0 : dev;
  return l;
}

/* A managed-memory operation that targets dev (-1: the host). */
static int check_managed_target(int dev, const char *what, tport_err *err)
{
  if (dev < 0)
    return cu_count() ? TPORT_OK : tport_err_set(err, TPORT_UNAVAILABLE, "cuda: %s", cu_reason());
  int rc = cu_check_dev(dev, err);
  return rc ? rc : cu.managed_ok[dev] ? TPORT_OK : cu_managed_unsupported(dev, what, err);
}

static int cu_advise(void *ptr, size_t n, int dev, tport_err *err)
{
  int rc = check_managed_target(dev, "managed memory advice", err);
  if (rc)
    return rc;
  GUARDED(dev >= 0 ? dev : cu_context_device(),
          cudaMemAdvise(ptr, n, cudaMemAdviseSetPreferredLocation, location(dev)), err);
  return TPORT_OK;
}

static int cu_prefetch(void *ptr, size_t n, int dev, be_stream *s, tport_err *err)
{
  int rc = check_managed_target(dev, "managed memory prefetch", err);
  if (!rc && !cu.managed_ok[s->dev])
    rc = cu_managed_unsupported(s->dev, "managed memory prefetch", err);
  if (rc)
    return rc;
  GUARDED(s->dev, cudaMemPrefetchAsync(ptr, n, location(dev), 0, cu_stream_of(s)), err);
  return TPORT_OK;
}

static void cu_describe(int dev, char *name, size_t nl, char *cc, size_t cl)
{
  struct cudaDeviceProp p; /* properties need no context */
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
  /* with GPUs but no libnvrtc, copies within a device fail (TPORT_UNAVAILABLE,
   * "runtime compilation unavailable: ...") while transfers still work */
  if (cu_count() > 0 && n < max) {
    snprintf(out[n].name, sizeof out[n].name, "kernel_compiler_available");
    out[n++].value = cuda_jit_available(NULL, 0);
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
    .host_register = cu_host_register,
    .host_unregister = cu_host_unregister,
    .ipc_open = cu_ipc_open,
    .ipc_close = cu_ipc_close,
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
