/*
 * backend_cuda_stub.c: the cuda entry of the backend table in a build without
 * the CUDA backend.  It reports no devices and says why; every other op
 * answers UNAVAILABLE.  The real backend (engine/cuda/backend_cuda.c with
 * kernels/cuda) replaces this file when it is built.
 */
#include "backend.h"

#define WHY "the cuda backend is not part of this build of tensorport"

struct be_stream {
  int unused;
};

static int na(tport_err *err)
{
  return tport_err_set(err, TPORT_UNAVAILABLE, WHY);
}
static int cu_count(void)
{
  return 0;
}
static const char *cu_reason(void)
{
  return WHY;
}
static int cu_mem_info(int d, size_t *f, size_t *t, tport_err *err)
{
  return na(err);
}
static int cu_alloc(int d, size_t n, void **o, tport_err *err)
{
  return na(err);
}
static void cu_free(int d, void *p) {}
static int cu_host_alloc(size_t n, void **o, tport_err *err)
{
  return na(err);
}
static void cu_host_free(void *p) {}
static be_stream no_stream;
static be_stream *cu_stream_default(int d)
{
  return &no_stream;
}
static int cu_stream_create(int d, be_stream **o, tport_err *err)
{
  return na(err);
}
static void cu_stream_destroy(be_stream *s) {}
static int cu_stream_sync(be_stream *s, tport_err *err)
{
  return na(err);
}
static int cu_memcpy(int d, be_stream *s, void *dst, const void *src, size_t n, be_copy_kind k,
                     tport_err *err)
{
  return na(err);
}
static int cu_memcpy_peer(int dd, void *dst, int sd, const void *src, size_t n, be_stream *s,
                          tport_err *err)
{
  return na(err);
}
static int cu_kernel(int d, be_stream *s, const plan *p, void *dst, tport_dtype dt, const void *src,
                     tport_dtype st, unsigned f, tport_err *err)
{
  return na(err);
}
static int cu_host_fn(be_stream *s, be_host_fn fn, void *a, tport_err *err)
{
  return na(err);
}
static int cu_event_create(int d, be_event **o, tport_err *err)
{
  return na(err);
}
static void cu_event_destroy(be_event *e) {}
static int cu_event_record(be_event *e, be_stream *s, tport_err *err)
{
  return na(err);
}
static int cu_wait(be_stream *s, be_event *e, tport_err *err)
{
  return na(err);
}
static bool cu_query(be_event *e)
{
  return true;
}
static int cu_event_sync(be_event *e, tport_err *err)
{
  return na(err);
}
static bool cu_can_peer(int d, int p)
{
  return false;
}
static int cu_enable_peer(int d, int p, tport_err *err)
{
  return na(err);
}
static int cu_advise(void *p, size_t n, int d, tport_err *err)
{
  return na(err);
}
static int cu_prefetch(void *p, size_t n, int d, be_stream *s, tport_err *err)
{
  return na(err);
}

static void cu_describe(int d, char *name, size_t nl, char *cc, size_t cl)
{
  if (nl)
    name[0] = 0;
  if (cl)
    cc[0] = 0;
}
static size_t cu_stats(be_stat *out, size_t max)
{
  return 0;
}
static int cu_set_option(const char *k, const char *v, tport_err *err)
{
  return na(err);
}

const backend_ops backend_cuda = {
    .name = "cuda",
    .type = TPORT_DEV_CUDA,
    .device_count = cu_count,
    .unavailable_reason = cu_reason,
    .mem_info = cu_mem_info,
    .alloc = cu_alloc,
    .free = cu_free,
    .alloc_managed = cu_alloc,
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
    .stream_wait_event = cu_wait,
    .event_query = cu_query,
    .event_synchronize = cu_event_sync,
    .can_access_peer = cu_can_peer,
    .enable_peer_access = cu_enable_peer,
    .mem_advise_preferred = cu_advise,
    .mem_prefetch_async = cu_prefetch,
    .describe = cu_describe,
    .stats = cu_stats,
    .set_option = cu_set_option,
};
