/*
 * cuda_alloc.h: the caching device allocator of the CUDA backend.
 *
 * cudaFree synchronizes the whole device, so it never runs on the hot path:
 * freed blocks go to a per-device cache and are reused for later requests of
 * a similar size.  Reuse is stream-safe because the engine frees a storage
 * only after every event of work touching it has completed (storage.c), so
 * a cached block has no pending work on any stream.  When cudaMalloc fails,
 * the device's cache is emptied and the allocation retried once.  Memory
 * taken outside this allocator (managed memory) must empty the cache first
 * too: cached blocks are free memory the device does not see as free.
 */
#ifndef TPORT_CUDA_ALLOC_H
#define TPORT_CUDA_ALLOC_H

#include "tport_types.h"

typedef struct cuda_alloc_stats {
  uint64_t allocs, hits, misses, frees, cache_flushes;
  uint64_t bytes_in_use, bytes_cached;
} cuda_alloc_stats;

/* A block of at least n bytes on dev (the device must be current). */
int cuda_alloc(int dev, size_t n, void **out, tport_err *err);
/* Returns a block to dev's cache (false: not one of ours). */
bool cuda_alloc_free(int dev, void *p);
/* cudaFree of every cached block of dev (the device must be current);
 * returns the bytes given back to the device. */
size_t cuda_alloc_empty_cache(int dev);
void cuda_alloc_get_stats(int dev, cuda_alloc_stats *out);

#endif
