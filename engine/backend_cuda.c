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
#include <cudaTypedefs.h> /* PFN_cuDevicePrimaryCtxGetState: types only, libcuda is not linked */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cuda_alloc.h"
#include "cuda_jit.h"

#define CU_MAX_DEVICES 64

struct be_stream {
  int dev;
  atomic_bool created; /* s exists (default streams are created on first use) */
  cudaStream_t s;      /* 0: the legacy default stream, where creating one failed */
};

struct be_event {
  int dev;
  cudaEvent_t e;
};

/* What is known of peer access from dev to peer (cached: asking the driver
 * and enabling access on every copy costs a driver call each time). */
enum { PEER_UNKNOWN = 0, PEER_NEVER, PEER_POSSIBLE, PEER_ENABLED };

static struct {
  pthread_once_t once;
  int count;
  /* cudaDriverGetVersion (0: no driver) and cudaRuntimeGetVersion */
  int driver_version, runtime_version;
  char reason[512];
  /* cuDevicePrimaryCtxGetState of the driver; NULL when it could not be had */
  PFN_cuDevicePrimaryCtxGetState_v7000 ctx_state;
  bool managed_ok[CU_MAX_DEVICES]; /* cudaDevAttrConcurrentManagedAccess != 0 */
  pthread_mutex_t mu;              /* guards streams and stream creation */
  be_stream *streams[CU_MAX_DEVICES];
  pthread_mutex_t peer_mu; /* serializes cudaDeviceEnablePeerAccess */
  atomic_uchar peer[CU_MAX_DEVICES][CU_MAX_DEVICES];
} cu = {.once = PTHREAD_ONCE_INIT,
        .mu = PTHREAD_MUTEX_INITIALIZER,
        .peer_mu = PTHREAD_MUTEX_INITIALIZER};

/* Turns a CUDA error into a tensorport error naming the call; clears the
 * runtime's last-error state so that a failed call does not poison the next. */
static int cu_fail(cudaError_t e, const char *call, tport_err *err)
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
#define CU_CALL(expr, err)                                                                         \
  do {                                                                                             \
    cudaError_t cu_e_ = (expr);                                                                    \
    if (cu_e_ != cudaSuccess)                                                                      \
      return cu_fail(cu_e_, #expr, err);                                                           \
  } while (0)

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
static bool has_context(int dev)
{
  pthread_once(&cu.once, cu_init);
  if (!cu.ctx_state || dev < 0 || dev >= cu.count)
    return false;
  unsigned flags = 0;
  int active = 0; /* PyTorch saw garbage here for inactive contexts unless zeroed */
  /* CUdevice and the runtime's ordinal agree: both follow CUDA_VISIBLE_DEVICES */
  return cu.ctx_state((CUdevice)dev, &flags, &active) == CUDA_SUCCESS && active == 1;
}

typedef struct guard {
  int prev;
  bool changed;
} guard;

static int guard_enter(int dev, guard *g, tport_err *err)
{
  g->changed = false;
  CU_CALL(cudaGetDevice(&g->prev), err); /* creates no context */
  if (g->prev != dev) {
    CU_CALL(cudaSetDevice(dev), err);
    g->changed = true;
  }
  return TPORT_OK;
}

static void guard_exit(guard *g)
{
  if (g->changed && has_context(g->prev) && cudaSetDevice(g->prev) != cudaSuccess)
    cudaGetLastError();
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

/* The device for calls that act on no device of their own (pinned host
 * memory, advice for the host): the current one if it has a context, else
 * the first that has one, else the current one (PyTorch's
 * getDeviceIndexWithPrimaryContext, as its pinned allocator uses it). */
static int context_device(void)
{
  int cur = 0;
  if (cudaGetDevice(&cur) != cudaSuccess) {
    cudaGetLastError();
    cur = 0;
  }
  if (has_context(cur))
    return cur;
  for (int d = 0; d < cu_count(); d++)
    if (d != cur && has_context(d))
      return d;
  return cur;
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
    if (cudaFree(p) != cudaSuccess)
      cudaGetLastError();
    guard_exit(&g);
  }
}

static int managed_unsupported(int dev, const char *what, tport_err *err)
{
  return tport_err_set(err, TPORT_FAILED_PRECONDITION,
                       "cuda:%d does not support %s: the host and the device cannot use managed "
                       "memory concurrently there (cudaDevAttrConcurrentManagedAccess is 0)",
                       dev, what);
}

/* Free bytes of dev after giving the allocator's cache back to the device:
 * cached blocks are free memory as far as a new allocation is concerned. */
static int free_after_reclaim(int dev, size_t want, size_t *freeb, tport_err *err)
{
  size_t total;
  int rc = cu_mem_info(dev, freeb, &total, err);
  if (rc || *freeb >= want)
    return rc;
  guard g;
  if ((rc = guard_enter(dev, &g, err)))
    return rc;
  size_t released = cuda_alloc_empty_cache(dev);
  guard_exit(&g);
  return released ? cu_mem_info(dev, freeb, &total, err) : TPORT_OK;
}

static int cu_alloc_managed(int dev, size_t bytes, void **out, tport_err *err)
{
  int rc = check_dev(dev, err);
  if (rc)
    return rc;
  if (!cu.managed_ok[dev])
    return managed_unsupported(dev, "managed memory", err);
  size_t freeb;
  if ((rc = free_after_reclaim(dev, bytes, &freeb, err)))
    return rc;
  /* never ask for more managed memory than the device has free (SEMANTICS.md §6) */
  if (bytes > freeb)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                         "cuda:%d: %zu bytes of managed memory asked, %zu free", dev, bytes, freeb);
  GUARDED(dev, cudaMallocManaged(out, bytes ? bytes : 1, cudaMemAttachGlobal), err);
  return TPORT_OK;
}

/* Pinned memory is portable (every context may use it), but allocating and
 * freeing it needs a context: one that exists already. */
static int cu_host_alloc(size_t bytes, void **out, tport_err *err)
{
  if (cu_count() == 0)
    return tport_err_set(err, TPORT_UNAVAILABLE, "cuda: %s", cu_reason());
  GUARDED(context_device(), cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocPortable), err);
  return TPORT_OK;
}

/* Caller memory (a same-host region) page-locked for every context, so
 * host-to-device copies read it directly instead of through staging. */
static int cu_host_register(void *p, size_t bytes, tport_err *err)
{
  if (cu_count() == 0)
    return tport_err_set(err, TPORT_UNAVAILABLE, "cuda: %s", cu_reason());
  GUARDED(context_device(), cudaHostRegister(p, bytes, cudaHostRegisterPortable), err);
  return TPORT_OK;
}

static void cu_host_unregister(void *p)
{
  guard g;
  if (p && guard_enter(context_device(), &g, NULL) == TPORT_OK) {
    if (cudaHostUnregister(p) != cudaSuccess)
      cudaGetLastError();
    guard_exit(&g);
  }
}

/* Another process's allocation (a same-host client's): opened in a context
 * that exists already, peer access enabled lazily where it lives on
 * another device; *dev is the device it lives on here (what copies to and
 * from it must name). */
static int cu_ipc_open(const void *handle, size_t len, int *dev, void **out, tport_err *err)
{
  if (cu_count() == 0)
    return tport_err_set(err, TPORT_UNAVAILABLE, "cuda: %s", cu_reason());
  cudaIpcMemHandle_t h;
  if (len != sizeof h.reserved)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "a CUDA IPC handle is %zu bytes: %zu came",
                         sizeof h.reserved, len);
  memcpy(h.reserved, handle, len);
  void *p = NULL;
  guard g;
  int rc = guard_enter(context_device(), &g, err);
  if (rc)
    return rc;
  cudaError_t oe = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  guard_exit(&g);
  if (oe != cudaSuccess) {
    /* not this server's to open (another host's GPU, a freed allocation, a
     * handle that is not one): UNAVAILABLE, so the client stages instead */
    cudaGetLastError();
    return tport_err_set(err, TPORT_UNAVAILABLE, "cudaIpcOpenMemHandle: %s (%s)",
                         cudaGetErrorString(oe), cudaGetErrorName(oe));
  }
  struct cudaPointerAttributes a;
  cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess || a.type != cudaMemoryTypeDevice || a.device < 0 ||
      a.device >= cu_count()) {
    cudaGetLastError();
    if (cudaIpcCloseMemHandle(p) != cudaSuccess)
      cudaGetLastError();
    return e != cudaSuccess ? cu_fail(e, "cudaPointerGetAttributes", err)
                            : tport_err_set(err, TPORT_INVALID_ARGUMENT,
                                            "the opened IPC handle is not device memory of a "
                                            "visible device (type %d, device %d)",
                                            (int)a.type, a.device);
  }
  *dev = a.device;
  *out = p;
  return TPORT_OK;
}

static void cu_ipc_close(void *p)
{
  guard g;
  if (p && guard_enter(context_device(), &g, NULL) == TPORT_OK) {
    if (cudaIpcCloseMemHandle(p) != cudaSuccess)
      cudaGetLastError();
    guard_exit(&g);
  }
}

static void cu_host_free(void *p)
{
  guard g;
  if (p && guard_enter(context_device(), &g, NULL) == TPORT_OK) {
    if (cudaFreeHost(p) != cudaSuccess)
      cudaGetLastError();
    guard_exit(&g);
  }
}

/* ---------------------------------------------------------------- streams */

static be_stream *stream_alloc(int dev)
{
  be_stream *s = calloc(1, sizeof *s);
  if (s) {
    s->dev = dev;
    atomic_init(&s->created, false);
  }
  return s;
}

/* The CUDA stream of s, created on first use.  A default stream is only
 * created when work is put on it, so that asking for one (as
 * engine_synchronize_all does for every device) creates no context on a
 * device that was never used. */
static cudaStream_t stream_of(be_stream *s)
{
  if (atomic_load_explicit(&s->created, memory_order_acquire))
    return s->s;
  pthread_mutex_lock(&cu.mu);
  if (!atomic_load_explicit(&s->created, memory_order_relaxed)) {
    cudaStream_t h = 0;
    guard g;
    if (guard_enter(s->dev, &g, NULL) == TPORT_OK) {
      if (cudaStreamCreateWithFlags(&h, cudaStreamNonBlocking) != cudaSuccess) {
        /* fall back to the legacy default stream: it synchronizes with the
         * others, which is slower but still ordered */
        cudaGetLastError();
        h = 0;
      }
      guard_exit(&g);
    }
    s->s = h;
    atomic_store_explicit(&s->created, true, memory_order_release);
  }
  pthread_mutex_unlock(&cu.mu);
  return s->s;
}

static be_stream *cu_stream_default(int dev)
{
  if (dev < 0 || dev >= cu_count())
    return NULL;
  pthread_mutex_lock(&cu.mu);
  if (!cu.streams[dev])
    cu.streams[dev] = stream_alloc(dev); /* no CUDA call: see stream_of */
  be_stream *s = cu.streams[dev];
  pthread_mutex_unlock(&cu.mu);
  return s;
}

static int cu_stream_create(int dev, be_stream **out, tport_err *err)
{
  int rc = check_dev(dev, err);
  if (rc)
    return rc;
  be_stream *s = stream_alloc(dev);
  if (!s)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of host memory for a stream");
  guard g;
  rc = guard_enter(dev, &g, err);
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
  atomic_store(&s->created, true);
  *out = s;
  return TPORT_OK;
}

static int cu_stream_sync(be_stream *s, tport_err *err)
{
  if (!atomic_load_explicit(&s->created, memory_order_acquire))
    return TPORT_OK; /* never used: nothing to wait for */
  GUARDED(s->dev, cudaStreamSynchronize(s->s), err);
  return TPORT_OK;
}

static void cu_stream_destroy(be_stream *s)
{
  if (!s)
    return;
  cu_stream_sync(s, NULL);
  guard g;
  if (atomic_load(&s->created) && s->s && guard_enter(s->dev, &g, NULL) == TPORT_OK) {
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
  GUARDED(dev, cudaMemcpyAsync(dst, src, n, k, stream_of(s)), err);
  return TPORT_OK;
}

static int cu_memcpy_peer(int dst_dev, void *dst, int src_dev, const void *src, size_t n,
                          be_stream *s, tport_err *err)
{
  if (n == 0)
    return TPORT_OK;
  GUARDED(s->dev, cudaMemcpyPeerAsync(dst, dst_dev, src, src_dev, n, stream_of(s)), err);
  return TPORT_OK;
}

static int cu_kernel(int dev, be_stream *s, const plan *p, void *dst, tport_dtype dt,
                     const void *src, tport_dtype st, unsigned flags, tport_err *err)
{
  guard g;
  int rc = guard_enter(dev, &g, err);
  if (rc)
    return rc;
  rc = cuda_jit_copy(dev, stream_of(s), p, dst, dt, src, st, flags, err);
  guard_exit(&g);
  return rc;
}

static int cu_host_fn(be_stream *s, be_host_fn fn, void *arg, tport_err *err)
{
  GUARDED(s->dev, cudaLaunchHostFunc(stream_of(s), fn, arg), err);
  return TPORT_OK;
}

/* ---------------------------------------------------------------- events */

static int cu_event_create(int dev, be_event **out, tport_err *err)
{
  int rc = check_dev(dev, err);
  if (rc)
    return rc;
  be_event *e = calloc(1, sizeof *e);
  if (!e)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of host memory for an event");
  e->dev = dev;
  guard g;
  rc = guard_enter(dev, &g, err);
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
  GUARDED(e->dev, cudaEventRecord(e->e, stream_of(s)), err);
  return TPORT_OK;
}

static int cu_stream_wait(be_stream *s, be_event *e, tport_err *err)
{
  GUARDED(s->dev, cudaStreamWaitEvent(stream_of(s), e->e, 0), err);
  return TPORT_OK;
}

/* Query and synchronize work from any current device, but on a thread with
 * no context they would create one on device 0: guarded like the rest. */
static bool cu_event_query(be_event *e)
{
  guard g;
  if (guard_enter(e->dev, &g, NULL) != TPORT_OK)
    return true; /* the device is gone: its event will never complete, do not wait on it */
  cudaError_t r = cudaEventQuery(e->e);
  guard_exit(&g);
  if (r == cudaErrorNotReady)
    return false;
  if (r != cudaSuccess)
    cudaGetLastError(); /* a failed event will never complete: do not wait on it forever */
  return true;
}

static int cu_event_sync(be_event *e, tport_err *err)
{
  GUARDED(e->dev, cudaEventSynchronize(e->e), err);
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
    guard g;
    rc = guard_enter(dev, &g, err);
    if (!rc) {
      cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
      guard_exit(&g);
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
  int rc = check_dev(dev, err);
  return rc ? rc : cu.managed_ok[dev] ? TPORT_OK : managed_unsupported(dev, what, err);
}

static int cu_advise(void *ptr, size_t n, int dev, tport_err *err)
{
  int rc = check_managed_target(dev, "managed memory advice", err);
  if (rc)
    return rc;
  GUARDED(dev >= 0 ? dev : context_device(),
          cudaMemAdvise(ptr, n, cudaMemAdviseSetPreferredLocation, location(dev)), err);
  return TPORT_OK;
}

static int cu_prefetch(void *ptr, size_t n, int dev, be_stream *s, tport_err *err)
{
  int rc = check_managed_target(dev, "managed memory prefetch", err);
  if (!rc && !cu.managed_ok[s->dev])
    rc = managed_unsupported(s->dev, "managed memory prefetch", err);
  if (rc)
    return rc;
  GUARDED(s->dev, cudaMemPrefetchAsync(ptr, n, location(dev), 0, stream_of(s)), err);
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
