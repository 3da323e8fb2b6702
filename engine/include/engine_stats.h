/*
 * engine_stats.h: the engine's figures, gathered in one place for both of
 * tportd's readers (the Stats RPC and /metrics), so that they cannot drift
 * apart: the two pinned pools, the two caches of host blocks, the storages
 * waiting to be freed and each backend's own counters.
 */
#ifndef TPORT_ENGINE_STATS_H
#define TPORT_ENGINE_STATS_H

#include <stddef.h>
#include <stdint.h>

#include "block_cache.h"

/* A pool of pinned blocks (staging.h: the staging pool and the read-back
 * pool). */
typedef struct engine_pool_stats {
  uint64_t hits;            /* acquisitions served from a free list */
  uint64_t misses;          /* acquisitions that allocated pinned memory */
  uint64_t waits;           /* acquisitions that waited for a pending block */
  uint64_t bytes_in_use;    /* held by callers or pending on events */
  uint64_t bytes_cached;    /* free in the pool */
  uint64_t bytes_allocated; /* all pinned bytes owned by the pool */
} engine_pool_stats;

/* A cache of host blocks (host_cache.h: large host blocks, pinned ones;
 * small_cache.h: small ones):
 * hits, misses, cached_bytes, in_use_bytes, limit_bytes. */
typedef block_cache_stats engine_cache_stats;

/* One counter of a backend: its kernel cache ("kernel_cache_hits"), its
 * allocator per device ("cuda0_bytes_in_use"), the sim's host allocations. */
typedef struct engine_counter {
  char name[48];
  int64_t value;
} engine_counter;

#define ENGINE_MAX_COUNTERS 64

typedef struct engine_stats {
  engine_pool_stats staging;  /* puts' and copies' blocks */
  engine_pool_stats readback; /* gets' blocks, lent to replies */
  engine_cache_stats host_cache;
  engine_cache_stats small_cache; /* small host blocks (small_cache.h) */
  engine_cache_stats pinned_cache;
  int64_t deferred_frees; /* storages freed once the work pending on them ends */
  /* every backend's counters, in device type order; none before
   * engine_configure (asking a backend may start its driver) */
  size_t ncounters;
  engine_counter counters[ENGINE_MAX_COUNTERS];
} engine_stats;

/* Fills *out.  Reading never creates what it reads: a pool not yet used
 * reads as zeros. */
void engine_get_stats(engine_stats *out);

#endif
