/*
 * metrics_engine.c: the engine's figures as metric families of /metrics --
 * device memory, the backends' counters (kernel cache, allocators), the
 * pinned pools and the caches of host blocks -- read from the one
 * collector Stats reads too (engine_stats.h).
 */
#include <stdio.h>
#include <string.h>

#include "device.h"
#include "engine.h"
#include "engine_stats.h"
#include "log.h"
#include "metrics.h"

/* "cuda0_bytes_in_use" -> device "cuda:0", rest "bytes_in_use"; false when
 * the name is not "<letters><digits>_<rest>". */
static bool device_stat(const char *name, char *dev, size_t len, const char **rest)
{
  size_t a = 0;
  while (name[a] >= 'a' && name[a] <= 'z')
    a++;
  size_t b = a;
  while (name[b] >= '0' && name[b] <= '9')
    b++;
  if (a == 0 || b == a || name[b] != '_' || !name[b + 1])
    return false;
  snprintf(dev, len, "%.*s:%.*s", (int)a, name, (int)(b - a), name + a);
  *rest = name + b + 1;
  return true;
}

/* Each device's memory: used and free, and its total apart. */
static void device_memory(metrics_text *t, bool devices_up)
{
  /* still being configured: nothing to ask the devices yet */
  enum { MAXDEV = ENGINE_MAX_DEVICES };
  engine_device_info devs[MAXDEV];
  size_t ndev = devices_up ? engine_devices(devs, MAXDEV) : 0;
  /* used + free is the total: the total is a family of its own, so that
   * summing tport_device_memory_bytes over state counts each byte once */
  for (int pass = 0; pass < 2; pass++) {
    const char *fam = pass ? "tport_device_memory_total_bytes" : "tport_device_memory_bytes";
    bool any = false;
    for (size_t i = 0; i < ndev; i++) {
      if (!devs[i].has_memory)
        continue;
      if (!any)
        metrics_family(t, fam, "gauge",
                       pass ? "Memory of each device served, in all."
                            : "Memory of each device served: used and free bytes (they sum to "
                              "tport_device_memory_total_bytes).");
      any = true;
      size_t freeb = devs[i].free_bytes, total = devs[i].total_bytes;
      char name[32];
      device_format(devs[i].device, name, sizeof name);
      if (pass) {
        metrics_sample_u64(t, fam, total, "device", name, NULL);
        continue;
      }
      metrics_sample_u64(t, fam, total >= freeb ? total - freeb : 0, "device", name, "state",
                         "used", NULL);
      metrics_sample_u64(t, fam, freeb, "device", name, "state", "free", NULL);
    }
  }
}

static void device_gauges(metrics_text *t, bool devices_up, const engine_stats *es)
{
  device_memory(t, devices_up);
  /* The backends' own counters (the CUDA backend's kernel cache and caching
   * allocator, sim's memory in use), as Stats reads them (none before the
   * devices are configured).  The kernel cache's are always written, 0
   * where no backend compiles kernels. */
  uint64_t kc_hits = 0, kc_misses = 0, kc_disk = 0, kc_ms = 0;
  int64_t compiler = -1;
  enum { MAXS = ENGINE_MAX_COUNTERS };
  struct {
    char dev[32];
    const char *what;
    int64_t v;
  } alloc[MAXS];
  size_t na = 0;
  for (size_t i = 0; i < es->ncounters; i++) {
    const char *n = es->counters[i].name, *rest;
    int64_t value = es->counters[i].value;
    uint64_t v = value > 0 ? (uint64_t)value : 0;
    if (!strcmp(n, "kernel_cache_hits"))
      kc_hits += v;
    else if (!strcmp(n, "kernel_cache_misses"))
      kc_misses += v;
    else if (!strcmp(n, "kernel_cache_disk_hits"))
      kc_disk += v;
    else if (!strcmp(n, "kernel_compile_ms"))
      kc_ms += v;
    else if (!strcmp(n, "kernel_compiler_available"))
      compiler = value;
    else if (na < MAXS && device_stat(n, alloc[na].dev, sizeof alloc[na].dev, &rest) &&
             (!strcmp(rest, "bytes_in_use") || !strcmp(rest, "bytes_cached") ||
              !strcmp(rest, "alloc_hits"))) {
      alloc[na].what = rest;
      alloc[na].v = value;
      na++;
    } else {
      log_msg(LOG_DEBUG, "metrics: backend counter '%s' has no metric", n);
    }
  }
  metrics_counter_u64(t, "tport_kernel_cache_hits_total", "CUDA kernels found compiled in memory.",
                      kc_hits);
  metrics_counter_u64(t, "tport_kernel_cache_misses_total", "CUDA kernels that were not in memory.",
                      kc_misses);
  metrics_counter_u64(t, "tport_kernel_cache_disk_hits_total",
                      "CUDA kernels loaded from the --kernel-cache directory.", kc_disk);
  metrics_family(t, "tport_kernel_compile_seconds_total", "counter",
                 "Time spent compiling CUDA kernels at run time (NVRTC).");
  metrics_sample(t, "tport_kernel_compile_seconds_total", (double)kc_ms / 1000.0, NULL);
  if (compiler >= 0)
    metrics_gauge_u64(t, "tport_kernel_compiler_available",
                      "1 when the runtime compiler (NVRTC) could be loaded.", (uint64_t)compiler);
  /* written only where a backend reports them (a family without samples is
   * noise to a scraper): in_use where the backend counts what tensors hold
   * (sim, CUDA), cached where it keeps freed blocks (CUDA's caching
   * allocator), hits where it serves allocations from them */
  bool bytes_family = false, hits_family = false;
  for (size_t i = 0; i < na; i++) {
    uint64_t v = alloc[i].v > 0 ? (uint64_t)alloc[i].v : 0;
    if (strcmp(alloc[i].what, "alloc_hits")) {
      if (!bytes_family)
        metrics_family(t, "tport_device_allocator_bytes", "gauge",
                       "Device memory of the backends' allocators: in_use by tensors, and cached "
                       "for reuse where the backend keeps freed blocks (CUDA).");
      bytes_family = true;
      metrics_sample_u64(t, "tport_device_allocator_bytes", v, "device", alloc[i].dev, "state",
                         !strcmp(alloc[i].what, "bytes_in_use") ? "in_use" : "cached", NULL);
    }
  }
  for (size_t i = 0; i < na; i++) {
    if (!strcmp(alloc[i].what, "alloc_hits")) {
      if (!hits_family)
        metrics_family(t, "tport_device_allocator_hits_total", "counter",
                       "Device allocations served from the allocator's cache.");
      hits_family = true;
      metrics_sample_u64(t, "tport_device_allocator_hits_total",
                         alloc[i].v > 0 ? (uint64_t)alloc[i].v : 0, "device", alloc[i].dev, NULL);
    }
  }
}

/* The families of one pinned pool (staging.h) or one cache of blocks
 * (host_cache.h): tport_<prefix>_<suffix>, each with what it counts. */
typedef struct family_row {
  const char *suffix, *help;
  uint64_t v;
  bool counter;
} family_row;

static void families(metrics_text *t, const char *prefix, const family_row *f, size_t n)
{
  char name[96];
  for (size_t i = 0; i < n; i++) {
    snprintf(name, sizeof name, "tport_%s_%s", prefix, f[i].suffix);
    (f[i].counter ? metrics_counter_u64 : metrics_gauge_u64)(t, name, f[i].help, f[i].v);
  }
}

typedef struct pool_help {
  const char *hits, *misses, *waits, *in_use, *cached, *allocated;
} pool_help;

static void pool_families(metrics_text *t, const char *prefix, const pool_help *h,
                          const engine_pool_stats *st)
{
  const family_row f[] = {{"hits_total", h->hits, st->hits, true},
                          {"misses_total", h->misses, st->misses, true},
                          {"waits_total", h->waits, st->waits, true},
                          {"in_use_bytes", h->in_use, st->bytes_in_use, false},
                          {"cached_bytes", h->cached, st->bytes_cached, false},
                          {"allocated_bytes", h->allocated, st->bytes_allocated, false}};
  families(t, prefix, f, sizeof f / sizeof f[0]);
}

typedef struct cache_help {
  const char *hits, *misses, *cached, *in_use, *limit;
} cache_help;

static void cache_families(metrics_text *t, const char *prefix, const cache_help *h,
                           const engine_cache_stats *st)
{
  const family_row f[] = {{"hits_total", h->hits, st->hits, true},
                          {"misses_total", h->misses, st->misses, true},
                          {"cached_bytes", h->cached, st->cached_bytes, false},
                          {"in_use_bytes", h->in_use, st->in_use_bytes, false},
                          {"limit_bytes", h->limit, st->limit_bytes, false}};
  families(t, prefix, f, sizeof f / sizeof f[0]);
}

static void host_gauges(metrics_text *t, const engine_stats *es)
{
  pool_families(t, "staging",
                &(pool_help){"Pinned staging blocks served from the pool.",
                             "Pinned staging blocks that were allocated.",
                             "Staging acquisitions that waited for a block (the pool's budget was "
                             "reached).",
                             "Pinned staging bytes held or pending on copies.",
                             "Pinned staging bytes free in the pool.",
                             "Pinned staging bytes the pool owns."},
                &es->staging);
  pool_families(t, "readback",
                &(pool_help){"Pinned blocks a get from a device read back into, served from the "
                             "read-back pool.",
                             "Pinned read-back blocks that were allocated.",
                             "Read-backs that waited for a block (the pool's budget, "
                             "TPORT_READBACK_BYTES, was reached).",
                             "Pinned read-back bytes being copied into or lent to replies not yet "
                             "sent.",
                             "Pinned read-back bytes free in the pool.",
                             "Pinned read-back bytes the pool owns."},
                &es->readback);
  metrics_gauge_u64(t, "tport_deferred_frees", "Storages freed while copies were pending on them.",
                    (uint64_t)es->deferred_frees);
  cache_families(t, "host_cache",
                 &(cache_help){"Large host blocks reused from the cache.",
                               "Large host blocks mapped fresh.", "Host bytes kept for reuse.",
                               "Large host blocks handed out.",
                               "The most host bytes kept cached (--host-cache)."},
                 &es->host_cache);
  cache_families(t, "small_cache",
                 &(cache_help){"Small host blocks (under 1 MiB) reused from the cache.",
                               "Small host blocks allocated fresh.",
                               "Small host bytes kept for reuse until the server is idle.",
                               "Small host blocks' bytes handed out.",
                               "The most small host bytes kept cached (an eighth of "
                               "--host-cache, at most 256 MiB)."},
                 &es->small_cache);
  cache_families(t, "pinned_cache",
                 &(cache_help){"Pinned host storages (non_blocking copies to the cpu) served "
                               "from the cache.",
                               "Pinned host storages allocated fresh.",
                               "Pinned host bytes kept for reuse.",
                               "Pinned host storages' bytes handed out.",
                               "The most pinned host bytes kept cached "
                               "(TPORT_PINNED_CACHE_BYTES)."},
                 &es->pinned_cache);
}

void metrics_engine(metrics_text *t, bool devices_up)
{
  /* gathered once per scrape; a pool not yet made reads as zeros, never
   * made here */
  engine_stats es;
  engine_get_stats(&es);
  device_gauges(t, devices_up, &es);
  host_gauges(t, &es);
}
