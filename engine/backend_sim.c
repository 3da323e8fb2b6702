/*
 * backend_sim.c: N simulated GPUs.
 *
 * It exists so that the engine's ordering logic (events, staging reuse, D2D
 * synchronization, non_blocking) is exercised on machines without a GPU, and
 * so that clients can be developed against a multi-GPU server anywhere.  It
 * behaves like CUDA where the engine relies on it:
 *  - device memory is reachable only through backend calls: a device address
 *    is the host address with a tag in its top byte, so dereferencing it
 *    faults, and every call checks that a pointer is memory of the right
 *    device (or of a peer whose access was enabled);
 *  - each stream is a worker thread running its ops in order, after an
 *    optional random delay (sim_set_delay) that makes missing events show;
 *  - events: record / wait on another stream / query / synchronize, with
 *    CUDA's rule that a never-recorded event is complete;
 *  - an event belongs to the device it was created for and a kernel runs on
 *    the stream of its own device: recording an event on another device's
 *    stream, or launching a kernel for a device on a stream of another, is
 *    refused as CUDA refuses it (cudaErrorInvalidResourceHandle, which the
 *    cuda backend reports as INTERNAL), so that an engine that mixes them up
 *    fails here and not first on a GPU.  Waiting on another device's event
 *    is allowed, as in CUDA;
 *  - peer access is possible per pair (sim_set_peer_possible) and enabled
 *    explicitly; a kernel touching a peer's memory without it fails;
 *  - device memory is bounded (sim_config.mem_bytes); managed memory counts
 *    against its device and is refused beyond what is free.
 * Where it deliberately differs from CUDA:
 *  - "pinned" host memory is ordinary memory, locked where the limit allows
 *    (allocating and freeing it cost what they cost CUDA: sim_host_alloc),
 *    and a pageable host pointer in an async copy is not synchronized the
 *    way CUDA does it (the engine never relies on that: it stages pageable
 *    memory through pinned blocks);
 *  - managed memory is host memory: prefetch only costs a delay and records
 *    the location, page faults and oversubscription are not simulated;
 *  - errors are reported at enqueue time, never asynchronously (no sticky
 *    errors); events carry no timing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_internal.h"
sim_state sim = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* ---------------------------------------------------------------- config */

int sim_configure(const sim_config *cfg, tport_err *err)
{
  if (cfg->ndevices < 0 || cfg->ndevices > SIM_MAX_DEVICES)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "sim: %d devices: the limit is %d",
                         cfg->ndevices, SIM_MAX_DEVICES);
  pthread_mutex_lock(&sim.mu);
  if (sim.nallocs > 0) {
    int n = sim.nallocs;
    pthread_mutex_unlock(&sim.mu);
    return tport_err_set(err, TPORT_FAILED_PRECONDITION,
                         "sim: cannot reconfigure while %d allocations are live", n);
  }
  int old = sim.ndevices;
  sim.ndevices = 0;
  pthread_mutex_unlock(&sim.mu);
  for (int d = 0; d < old; d++) {
    sim_stream_stop(sim.streams[d]);
    sim.streams[d] = NULL;
  }
  for (int d = 0; d < cfg->ndevices; d++) {
    int rc = sim_stream_start(d, &sim.streams[d], err);
    if (rc != TPORT_OK) {
      while (d-- > 0)
        sim_stream_stop(sim.streams[d]);
      return rc;
    }
  }
  pthread_mutex_lock(&sim.mu);
  sim.mem_bytes = cfg->mem_bytes ? cfg->mem_bytes : (size_t)1 << 30;
  sim.seed = cfg->seed;
  atomic_store(&sim.max_delay_us, cfg->max_delay_us);
  atomic_store(&sim.min_delay_us, 0);
  memset(sim.used, 0, sizeof sim.used);
  for (int a = 0; a < SIM_MAX_DEVICES; a++)
    for (int b = 0; b < SIM_MAX_DEVICES; b++) {
      sim.peer_possible[a][b] = a != b;
      sim.peer_enabled[a][b] = false;
    }
  sim.ndevices = cfg->ndevices;
  pthread_mutex_unlock(&sim.mu);
  return TPORT_OK;
}

void sim_set_peer_possible(int dev, int peer, bool possible)
{
  if (dev < 0 || peer < 0 || dev >= SIM_MAX_DEVICES || peer >= SIM_MAX_DEVICES || dev == peer)
    return;
  pthread_mutex_lock(&sim.mu);
  sim.peer_possible[dev][peer] = possible;
  if (!possible)
    sim.peer_enabled[dev][peer] = false;
  pthread_mutex_unlock(&sim.mu);
}

void sim_set_delay(unsigned max_delay_us)
{
  sim_set_delay_range(0, max_delay_us);
}

void sim_set_delay_range(unsigned min_us, unsigned max_us)
{
  atomic_store(&sim.min_delay_us, min_us);
  atomic_store(&sim.max_delay_us, max_us);
}

size_t sim_bytes_in_use(int dev)
{
  pthread_mutex_lock(&sim.mu);
  size_t n = dev >= 0 && dev < SIM_MAX_DEVICES ? sim.used[dev] : 0;
  pthread_mutex_unlock(&sim.mu);
  return n;
}

size_t sim_bytes_peak(int dev)
{
  pthread_mutex_lock(&sim.mu);
  size_t n = dev >= 0 && dev < SIM_MAX_DEVICES ? sim.peak[dev] : 0;
  pthread_mutex_unlock(&sim.mu);
  return n;
}

void sim_reset_peak(int dev)
{
  pthread_mutex_lock(&sim.mu);
  if (dev >= 0 && dev < SIM_MAX_DEVICES)
    sim.peak[dev] = sim.used[dev];
  pthread_mutex_unlock(&sim.mu);
}

/* ---------------------------------------------------------------- ops */

int sim_count(void)
{
  pthread_mutex_lock(&sim.mu);
  int n = sim.ndevices;
  pthread_mutex_unlock(&sim.mu);
  return n;
}

static const char *sim_reason(void)
{
  return "no sim devices configured (--devices sim:N)";
}

int sim_check_dev(int dev, tport_err *err)
{
  if (dev < 0 || dev >= sim_count())
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "sim:%d does not exist (%d sim devices)", dev,
                         sim_count());
  return TPORT_OK;
}

static int sim_mem_info(int dev, size_t *free_bytes, size_t *total, tport_err *err)
{
  int rc = sim_check_dev(dev, err);
  if (rc)
    return rc;
  pthread_mutex_lock(&sim.mu);
  *total = sim.mem_bytes;
  *free_bytes = sim.mem_bytes - sim.used[dev];
  pthread_mutex_unlock(&sim.mu);
  return TPORT_OK;
}

static int sim_memcpy(int dev, be_stream *s, void *dst, const void *src, size_t n,
                      be_copy_kind kind, tport_err *err)
{
  void *d = NULL, *sp = NULL;
  int rc = TPORT_OK;
  switch (kind) {
  case BE_H2D:
    rc = sim_resolve_device(dev, dst, n, "destination", &d, err);
    if (!rc)
      rc = sim_resolve_host(src, n, "source", &sp, err);
    break;
  case BE_D2H:
    rc = sim_resolve_host(dst, n, "destination", &d, err);
    if (!rc)
      rc = sim_resolve_device(dev, src, n, "source", &sp, err);
    break;
  case BE_D2D:
    rc = sim_resolve_device(dev, dst, n, "destination", &d, err);
    if (!rc)
      rc = sim_resolve_device(dev, src, n, "source", &sp, err);
    break;
  case BE_H2H:
    rc = sim_resolve_host(dst, n, "destination", &d, err);
    if (!rc)
      rc = sim_resolve_host(src, n, "source", &sp, err);
    break;
  }
  if (rc)
    return rc;
  if (s->dev != dev)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "sim: stream of sim:%d used for sim:%d",
                         s->dev, dev);
  sim_op *op = sim_new_op(OP_MEMCPY, err);
  if (!op)
    return TPORT_RESOURCE_EXHAUSTED;
  op->u.copy.dst = d;
  op->u.copy.src = sp;
  op->u.copy.n = n;
  return sim_enqueue(s, op);
}

/* Without peer access, the "driver" stages the copy: it may use either
 * device's memory, so each pointer is resolved against its own device. */
static int sim_memcpy_peer(int dst_dev, void *dst, int src_dev, const void *src, size_t n,
                           be_stream *s, tport_err *err)
{
  void *d, *sp;
  int rc = sim_resolve_device(dst_dev, dst, n, "destination", &d, err);
  if (!rc)
    rc = sim_resolve_device(src_dev, src, n, "source", &sp, err);
  if (rc)
    return rc;
  sim_op *op = sim_new_op(OP_MEMCPY, err);
  if (!op)
    return TPORT_RESOURCE_EXHAUSTED;
  op->u.copy.dst = d;
  op->u.copy.src = sp;
  op->u.copy.n = n;
  return sim_enqueue(s, op);
}

/* Byte extent of operand op of a plan: from element 0 to the last byte. */
static size_t plan_extent(const plan *p, int op, size_t esize)
{
  if (plan_numel(p) == 0)
    return 0;
  int64_t last = 0;
  for (int d = 0; d < p->ndim; d++)
    last += (p->shape[d] - 1) * p->strides[op][d];
  return (size_t)last + esize;
}

/* Kernels enqueued, all devices (Stats: sim_kernel_launches). */
static atomic_uint_least64_t kernel_launches;

static int sim_kernel(int dev, be_stream *s, const plan *p, void *dst, tport_dtype dt,
                      const void *src, tport_dtype st, unsigned flags, tport_err *err)
{
  /* a launch goes to the current device's context, where another device's
   * stream is not a handle: the launch itself fails, whatever the pointers */
  if (s->dev != dev)
    return sim_invalid_handle("cudaLaunchKernel", "a stream", s->dev, dev, err);
  void *d, *sp;
  int rc = sim_resolve_device(dev, dst, plan_extent(p, 0, tport_dtype_size(dt)), "kernel output",
                              &d, err);
  if (!rc)
    rc = sim_resolve_device(dev, src, plan_extent(p, 1, tport_dtype_size(st)), "kernel input", &sp,
                            err);
  if (rc)
    return rc;
  sim_op *op = sim_new_op(OP_KERNEL, err);
  if (!op)
    return TPORT_RESOURCE_EXHAUSTED;
  atomic_fetch_add_explicit(&kernel_launches, 1, memory_order_relaxed);
  op->u.kernel.p = *p;
  op->u.kernel.dst = d;
  op->u.kernel.src = sp;
  op->u.kernel.dt = dt;
  op->u.kernel.st = st;
  op->u.kernel.flags = flags;
  return sim_enqueue(s, op);
}

static bool sim_can_access_peer(int dev, int peer)
{
  int n = sim_count();
  if (dev < 0 || peer < 0 || dev >= n || peer >= n)
    return false;
  if (dev == peer)
    return true;
  pthread_mutex_lock(&sim.mu);
  bool ok = sim.peer_possible[dev][peer];
  pthread_mutex_unlock(&sim.mu);
  return ok;
}

static int sim_enable_peer(int dev, int peer, tport_err *err)
{
  if (!sim_can_access_peer(dev, peer))
    return tport_err_set(err, TPORT_FAILED_PRECONDITION, "sim:%d cannot access sim:%d", dev, peer);
  pthread_mutex_lock(&sim.mu);
  if (dev != peer)
    sim.peer_enabled[dev][peer] = true;
  pthread_mutex_unlock(&sim.mu);
  return TPORT_OK;
}

static int managed_index(void *ptr, size_t n, tport_err *err)
{
  int i = sim_find_alloc((uintptr_t)ptr, n ? n : 1);
  if (i < 0 || !sim.allocs[i].managed)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "sim: the pointer is not managed memory"), -1;
  return i;
}

static int sim_advise(void *ptr, size_t n, int dev, tport_err *err)
{
  if (dev >= sim_count())
    return sim_check_dev(dev, err);
  pthread_mutex_lock(&sim.mu);
  int i = managed_index(ptr, n, err);
  pthread_mutex_unlock(&sim.mu);
  return i < 0 ? TPORT_INVALID_ARGUMENT : TPORT_OK;
}

static int sim_prefetch(void *ptr, size_t n, int dev, be_stream *s, tport_err *err)
{
  if (dev >= sim_count())
    return sim_check_dev(dev, err);
  pthread_mutex_lock(&sim.mu);
  int i = managed_index(ptr, n, err);
  if (i >= 0)
    sim.allocs[i].location = dev;
  pthread_mutex_unlock(&sim.mu);
  if (i < 0)
    return TPORT_INVALID_ARGUMENT;
  sim_op *op = sim_new_op(OP_PREFETCH, err);
  return op ? sim_enqueue(s, op) : TPORT_RESOURCE_EXHAUSTED;
}

static void sim_describe(int dev, char *name, size_t nl, char *cc, size_t cl)
{
  snprintf(name, nl, "simulated GPU");
  snprintf(cc, cl, "%s", "");
}

static size_t sim_stats(be_stat *out, size_t max)
{
  size_t n = 0;
  for (int d = 0; d < sim_count() && n < max; d++, n++) {
    snprintf(out[n].name, sizeof out[n].name, "sim%d_bytes_in_use", d);
    out[n].value = (int64_t)sim_bytes_in_use(d);
  }
  for (int d = 0; d < sim_count() && n < max; d++, n++) {
    snprintf(out[n].name, sizeof out[n].name, "sim%d_bytes_peak", d);
    out[n].value = (int64_t)sim_bytes_peak(d);
  }
  if (sim_count() > 0 && n < max) {
    snprintf(out[n].name, sizeof out[n].name, "sim_kernel_launches");
    out[n++].value = (int64_t)atomic_load_explicit(&kernel_launches, memory_order_relaxed);
  }
  if (sim_count() > 0 && n + 2 <= max) {
    snprintf(out[n].name, sizeof out[n].name, "sim_host_allocs");
    uint64_t allocs, bytes;
    sim_host_counts(&allocs, &bytes);
    out[n++].value = (int64_t)allocs;
    snprintf(out[n].name, sizeof out[n].name, "sim_host_pinned_bytes");
    out[n++].value = (int64_t)bytes;
  }
  return n;
}

static int sim_set_option(const char *key, const char *value, tport_err *err)
{
  return tport_err_set(err, TPORT_UNIMPLEMENTED, "sim has no option '%s'", key);
}

const backend_ops backend_sim = {
    .name = "sim",
    .type = TPORT_DEV_SIM,
    .device_count = sim_count,
    .unavailable_reason = sim_reason,
    .mem_info = sim_mem_info,
    .alloc = sim_alloc_dev,
    .free = sim_free,
    .alloc_managed = sim_alloc_managed,
    .host_alloc = sim_host_alloc,
    .host_free = sim_host_free,
    .stream_default = sim_stream_default,
    .stream_create = sim_stream_create,
    .stream_destroy = sim_stream_destroy,
    .stream_synchronize = sim_stream_sync,
    .memcpy_async = sim_memcpy,
    .memcpy_peer_async = sim_memcpy_peer,
    .copy_kernel = sim_kernel,
    .launch_host_func = sim_host_func,
    .event_create = sim_event_create,
    .event_destroy = sim_event_destroy,
    .event_record = sim_event_record,
    .stream_wait_event = sim_stream_wait,
    .event_query = sim_event_query,
    .event_synchronize = sim_event_sync,
    .can_access_peer = sim_can_access_peer,
    .enable_peer_access = sim_enable_peer,
    .mem_advise_preferred = sim_advise,
    .mem_prefetch_async = sim_prefetch,
    .describe = sim_describe,
    .stats = sim_stats,
    .set_option = sim_set_option,
};
