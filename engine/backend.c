/* backend.c: the table of backends, indexed by device type. */
#include "backend.h"

#include <assert.h>
#include <string.h>

bool backend_complete(const backend_ops *o)
{
  return o->name && o->device_count && o->unavailable_reason && o->mem_info && o->alloc &&
         o->free && o->alloc_managed && o->host_alloc && o->host_free && o->stream_default &&
         o->stream_create && o->stream_destroy && o->stream_synchronize && o->memcpy_async &&
         o->memcpy_peer_async && o->copy_kernel && o->launch_host_func && o->event_create &&
         o->event_destroy && o->event_record && o->stream_wait_event && o->event_query &&
         o->event_synchronize && o->can_access_peer && o->enable_peer_access &&
         o->mem_advise_preferred && o->mem_prefetch_async && o->describe && o->stats &&
         o->set_option;
}

const backend_ops *backend_get(tport_device_type t)
{
  static const backend_ops *const table[TPORT_NUM_DEVICE_TYPES] = {
      [TPORT_DEV_CPU] = &backend_cpu,
      [TPORT_DEV_CUDA] = &backend_cuda,
      [TPORT_DEV_SIM] = &backend_sim,
  };
  if ((unsigned)t >= TPORT_NUM_DEVICE_TYPES)
    return NULL;
  assert(backend_complete(table[t]));
  return table[t];
}

const backend_ops *backend_pinned_host(void)
{
  if (backend_cuda.device_count() > 0)
    return &backend_cuda;
  if (backend_sim.device_count() > 0)
    return &backend_sim;
  return &backend_cpu;
}

int64_t backend_stat(const backend_ops *be, const char *name)
{
  be_stat st[64];
  size_t n = be->stats(st, 64);
  for (size_t i = 0; i < n; i++)
    if (strcmp(st[i].name, name) == 0)
      return st[i].value;
  return -1;
}
