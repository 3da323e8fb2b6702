/*
 * backend_cpu.c: the host as a device.  Work runs synchronously in the
 * calling thread (the copy kernel on the CPU thread pool); its stream is a
 * formality and its events are complete as soon as they are recorded.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>

#include "backend.h"
#include "cpu_kernels.h"
#include "host_copy.h"
#include "host_cache.h"

struct be_stream {
  int unused;
};
struct be_event {
  int unused;
};

static be_stream cpu_stream;

static int cpu_count(void)
{
  return 1;
}
static const char *cpu_reason(void)
{
  return "";
}

static int cpu_mem_info(int dev, size_t *free_bytes, size_t *total, tport_err *err)
{
  struct sysinfo si;
  if (sysinfo(&si) != 0)
    return tport_err_set(err, TPORT_INTERNAL, "sysinfo failed");
  *free_bytes = (size_t)si.freeram * si.mem_unit;
  *total = (size_t)si.totalram * si.mem_unit;
  return TPORT_OK;
}

/* Large blocks are cached for reuse (host_cache.h: a fresh one costs its
 * page faults), small ones come from malloc; both 256-byte aligned. */
static int cpu_alloc(int dev, size_t bytes, void **out, tport_err *err)
{
  void *p = host_cache_alloc(bytes);
  if (!p)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "cpu: cannot allocate %zu bytes", bytes);
  *out = p;
  return TPORT_OK;
}

static void cpu_free(int dev, void *p)
{
  host_cache_free(p);
}

static int cpu_alloc_managed(int dev, size_t bytes, void **out, tport_err *err)
{
  return tport_err_set(err, TPORT_FAILED_PRECONDITION,
                       "managed memory needs a device (cuda or sim), not cpu");
}

static int cpu_host_alloc(size_t bytes, void **out, tport_err *err)
{
  return cpu_alloc(0, bytes, out, err);
}

static void cpu_host_free(void *p)
{
  host_cache_free(p);
}

static be_stream *cpu_stream_default(int dev)
{
  return &cpu_stream;
}

static int cpu_stream_create(int dev, be_stream **out, tport_err *err)
{
  *out = &cpu_stream;
  return TPORT_OK;
}

static void cpu_stream_destroy(be_stream *s) {}
static int cpu_stream_sync(be_stream *s, tport_err *err)
{
  return TPORT_OK;
}

static int cpu_memcpy(int dev, be_stream *s, void *dst, const void *src, size_t n,
                      be_copy_kind kind, tport_err *err)
{
  if (kind != BE_H2H && kind != BE_D2D)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "cpu: copy kind %d is not host to host",
                         (int)kind);
  if (n)
    memmove(dst, src, n);
  return TPORT_OK;
}

static int cpu_memcpy_peer(int dd, void *dst, int sd, const void *src, size_t n, be_stream *s,
                           tport_err *err)
{
  if (n)
    memmove(dst, src, n);
  return TPORT_OK;
}

static int cpu_copy_kernel(int dev, be_stream *s, const plan *p, void *dst, tport_dtype dt,
                           const void *src, tport_dtype st, unsigned flags, tport_err *err)
{
  host_copy(p, dst, dt, src, st, flags);
  return TPORT_OK;
}

static int cpu_host_func(be_stream *s, be_host_fn fn, void *arg, tport_err *err)
{
  fn(arg);
  return TPORT_OK;
}

static be_event cpu_event;

static int cpu_event_create(int dev, be_event **out, tport_err *err)
{
  *out = &cpu_event;
  return TPORT_OK;
}

static void cpu_event_destroy(be_event *e) {}
static int cpu_event_record(be_event *e, be_stream *s, tport_err *err)
{
  return TPORT_OK;
}
static int cpu_stream_wait(be_stream *s, be_event *e, tport_err *err)
{
  return TPORT_OK;
}
static bool cpu_event_query(be_event *e)
{
  return true;
}
static int cpu_event_sync(be_event *e, tport_err *err)
{
  return TPORT_OK;
}
static bool cpu_can_access_peer(int dev, int peer)
{
  return dev == 0 && peer == 0;
}
static int cpu_enable_peer(int dev, int peer, tport_err *err)
{
  return TPORT_OK;
}

static int cpu_advise(void *ptr, size_t n, int dev, tport_err *err)
{
  return tport_err_set(err, TPORT_FAILED_PRECONDITION, "cpu: no managed memory to advise");
}

static int cpu_prefetch(void *ptr, size_t n, int dev, be_stream *s, tport_err *err)
{
  return tport_err_set(err, TPORT_FAILED_PRECONDITION, "cpu: no managed memory to prefetch");
}

static void cpu_describe(int dev, char *name, size_t nl, char *cc, size_t cl)
{
  snprintf(name, nl, "host");
  snprintf(cc, cl, "%s", "");
}

static size_t cpu_stats(be_stat *out, size_t max)
{
  return 0;
}

static int cpu_set_option(const char *key, const char *value, tport_err *err)
{
  return tport_err_set(err, TPORT_UNIMPLEMENTED, "cpu has no option '%s'", key);
}

const backend_ops backend_cpu = {
    .name = "cpu",
    .type = TPORT_DEV_CPU,
    .device_count = cpu_count,
    .unavailable_reason = cpu_reason,
    .mem_info = cpu_mem_info,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .alloc_managed = cpu_alloc_managed,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .stream_default = cpu_stream_default,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_synchronize = cpu_stream_sync,
    .memcpy_async = cpu_memcpy,
    .memcpy_peer_async = cpu_memcpy_peer,
    .copy_kernel = cpu_copy_kernel,
    .copy_kernel_blocks = true,
    .launch_host_func = cpu_host_func,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait,
    .event_query = cpu_event_query,
    .event_synchronize = cpu_event_sync,
    .can_access_peer = cpu_can_access_peer,
    .enable_peer_access = cpu_enable_peer,
    .mem_advise_preferred = cpu_advise,
    .mem_prefetch_async = cpu_prefetch,
    .describe = cpu_describe,
    .stats = cpu_stats,
    .set_option = cpu_set_option,
};
