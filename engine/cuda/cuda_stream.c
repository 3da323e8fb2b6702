/* cuda_stream.c: the CUDA backend's streams, copies, kernels and events
 * (cuda_internal.h). */
#include <stdlib.h>

#include "cuda_internal.h"
#include "cuda_jit.h"

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
cudaStream_t cu_stream_of(be_stream *s)
{
  if (atomic_load_explicit(&s->created, memory_order_acquire))
    return s->s;
  pthread_mutex_lock(&cu.mu);
  if (!atomic_load_explicit(&s->created, memory_order_relaxed)) {
    cudaStream_t h = 0;
    cu_guard g;
    if (cu_guard_enter(s->dev, &g, NULL) == TPORT_OK) {
      if (cudaStreamCreateWithFlags(&h, cudaStreamNonBlocking) != cudaSuccess) {
        /* fall back to the legacy default stream: it synchronizes with the
         * others, which is slower but still ordered */
        cudaGetLastError();
        h = 0;
      }
      cu_guard_exit(&g);
    }
    s->s = h;
    atomic_store_explicit(&s->created, true, memory_order_release);
  }
  pthread_mutex_unlock(&cu.mu);
  return s->s;
}

be_stream *cu_stream_default(int dev)
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

int cu_stream_create(int dev, be_stream **out, tport_err *err)
{
  int rc = cu_check_dev(dev, err);
  if (rc)
    return rc;
  be_stream *s = stream_alloc(dev);
  if (!s)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of host memory for a stream");
  cu_guard g;
  rc = cu_guard_enter(dev, &g, err);
  if (!rc) {
    cudaError_t e = cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking);
    cu_guard_exit(&g);
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

int cu_stream_sync(be_stream *s, tport_err *err)
{
  if (!atomic_load_explicit(&s->created, memory_order_acquire))
    return TPORT_OK; /* never used: nothing to wait for */
  GUARDED(s->dev, cudaStreamSynchronize(s->s), err);
  return TPORT_OK;
}

void cu_stream_destroy(be_stream *s)
{
  if (!s)
    return;
  cu_stream_sync(s, NULL);
  cu_guard g;
  if (atomic_load(&s->created) && s->s && cu_guard_enter(s->dev, &g, NULL) == TPORT_OK) {
    cudaStreamDestroy(s->s);
    cu_guard_exit(&g);
  }
  free(s);
}

/* ---------------------------------------------------------------- copies */

int cu_memcpy(int dev, be_stream *s, void *dst, const void *src, size_t n, be_copy_kind kind,
              tport_err *err)
{
  enum cudaMemcpyKind k = kind == BE_H2D   ? cudaMemcpyHostToDevice
                          : kind == BE_D2H ? cudaMemcpyDeviceToHost
                          : kind == BE_D2D ? cudaMemcpyDeviceToDevice
                                           : cudaMemcpyHostToHost;
  if (n == 0)
    return TPORT_OK;
  GUARDED(dev, cudaMemcpyAsync(dst, src, n, k, cu_stream_of(s)), err);
  return TPORT_OK;
}

int cu_memcpy_peer(int dst_dev, void *dst, int src_dev, const void *src, size_t n, be_stream *s,
                   tport_err *err)
{
  if (n == 0)
    return TPORT_OK;
  GUARDED(s->dev, cudaMemcpyPeerAsync(dst, dst_dev, src, src_dev, n, cu_stream_of(s)), err);
  return TPORT_OK;
}

int cu_kernel(int dev, be_stream *s, const plan *p, void *dst, tport_dtype dt, const void *src,
              tport_dtype st, unsigned flags, tport_err *err)
{
  cu_guard g;
  int rc = cu_guard_enter(dev, &g, err);
  if (rc)
    return rc;
  size_t es = tport_dtype_size(dt);
  if (dt == st && !flags && p->ndim == 1 && p->strides[0][0] == (int64_t)es &&
      p->strides[1][0] == (int64_t)es) {
    /* a dense copy of the same dtype is a byte copy: the runtime's own
     * (16-byte accesses whatever the dtype; cast_vec moves a uint8 tensor
     * 4 bytes at a time, 0.72x of this on an H200) */
    cudaError_t ce = cudaMemcpyAsync(dst, src, (size_t)p->shape[0] * es, cudaMemcpyDeviceToDevice,
                                     cu_stream_of(s));
    cu_guard_exit(&g);
    return ce == cudaSuccess ? TPORT_OK : cu_fail(ce, "cudaMemcpyAsync (device to device)", err);
  }
  rc = cuda_jit_copy(dev, cu_stream_of(s), p, dst, dt, src, st, flags, err);
  cu_guard_exit(&g);
  return rc;
}

int cu_host_fn(be_stream *s, be_host_fn fn, void *arg, tport_err *err)
{
  GUARDED(s->dev, cudaLaunchHostFunc(cu_stream_of(s), fn, arg), err);
  return TPORT_OK;
}

/* ---------------------------------------------------------------- events */

int cu_event_create(int dev, be_event **out, tport_err *err)
{
  int rc = cu_check_dev(dev, err);
  if (rc)
    return rc;
  be_event *e = calloc(1, sizeof *e);
  if (!e)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of host memory for an event");
  e->dev = dev;
  cu_guard g;
  rc = cu_guard_enter(dev, &g, err);
  if (!rc) {
    cudaError_t ce = cudaEventCreateWithFlags(&e->e, cudaEventDisableTiming);
    cu_guard_exit(&g);
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
void cu_event_destroy(be_event *e)
{
  if (!e)
    return;
  cu_guard g;
  if (cu_guard_enter(e->dev, &g, NULL) == TPORT_OK) {
    cudaEventDestroy(e->e);
    cu_guard_exit(&g);
  }
  free(e);
}

int cu_event_record(be_event *e, be_stream *s, tport_err *err)
{
  GUARDED(e->dev, cudaEventRecord(e->e, cu_stream_of(s)), err);
  return TPORT_OK;
}

int cu_stream_wait(be_stream *s, be_event *e, tport_err *err)
{
  GUARDED(s->dev, cudaStreamWaitEvent(cu_stream_of(s), e->e, 0), err);
  return TPORT_OK;
}

/* Query and synchronize work from any current device, but on a thread with
 * no context they would create one on device 0: guarded like the rest. */
bool cu_event_query(be_event *e)
{
  cu_guard g;
  if (cu_guard_enter(e->dev, &g, NULL) != TPORT_OK)
    return true; /* the device is gone: its event will never complete, do not wait on it */
  cudaError_t r = cudaEventQuery(e->e);
  cu_guard_exit(&g);
  if (r == cudaErrorNotReady)
    return false;
  if (r != cudaSuccess)
    cudaGetLastError(); /* a failed event will never complete: do not wait on it forever */
  return true;
}

int cu_event_sync(be_event *e, tport_err *err)
{
  GUARDED(e->dev, cudaEventSynchronize(e->e), err);
  return TPORT_OK;
}
