/* stats.c: the engine's figures in one struct (engine_stats.h). */
#include "engine_stats.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "devices_internal.h"
#include "host_cache.h"
#include "small_cache.h"
#include "staging.h"
#include "storage.h"

_Static_assert(sizeof(((engine_counter *)0)->name) == sizeof(((be_stat *)0)->name),
               "a backend's counter keeps its whole name");

void engine_get_stats(engine_stats *out)
{
  memset(out, 0, sizeof *out);
  staging_engine_pools_stats(&out->staging, &out->readback);
  host_cache_get_stats(&out->host_cache);
  small_cache_get_stats(&out->small_cache);
  pinned_cache_get_stats(&out->pinned_cache);
  out->deferred_frees = storage_deferred_count();
  if (!engine_configured())
    return;
  for (int type = 0; type < TPORT_NUM_DEVICE_TYPES; type++) {
    be_stat bs[ENGINE_MAX_COUNTERS];
    size_t room = ENGINE_MAX_COUNTERS - out->ncounters;
    size_t nb = backend_get((tport_device_type)type)->stats(bs, room);
    for (size_t i = 0; i < nb; i++, out->ncounters++) {
      engine_counter *c = &out->counters[out->ncounters];
      snprintf(c->name, sizeof c->name, "%.47s", bs[i].name);
      c->value = bs[i].value;
    }
  }
}
