/*
 * small_cache.h: the caching allocator of small host blocks (under
 * HOST_CACHE_MIN_BYTES: the cpu storages that host_cache.h leaves to
 * malloc), emptied when the server goes idle.
 *
 * malloc already reuses small blocks, but it gives a freed top of its
 * heap back to the system as soon as it passes 128 KiB: a burst of small
 * puts freed at a close (10,000 tensors of 4 KiB, one arena per worker
 * thread) goes back at once, and the next burst faults every page in
 * again -- a fault per tensor, 12% of a batch of small puts in a profile.
 * Raising malloc's trim threshold instead keeps the tops for good: glibc's
 * malloc_trim never shrinks the top of a thread's arena.  So freed small
 * storages are kept here, by size class (eight a doubling: at most an
 * eighth wasted), up to a limit, and handed out again; small_cache_empty
 * gives them all back to malloc (whose arenas then trim as usual), which
 * tportd does once idle (engine_release_idle).  PyTorch's caching
 * allocators keep blocks the same way until empty_cache.
 *
 * A block's class is read back from malloc_usable_size: no header, no
 * table.  Cached blocks are poisoned under AddressSanitizer.  Thread-safe:
 * a lock per class.
 */
#ifndef TPORT_SMALL_CACHE_H
#define TPORT_SMALL_CACHE_H

#include <stddef.h>

#include "engine_stats.h"

/* A block of at least bytes (< HOST_CACHE_MIN_BYTES), 256-byte aligned;
 * NULL when out of memory (after emptying the cache and trying again). */
void *small_cache_alloc(size_t bytes);
/* Frees p (from small_cache_alloc): kept while under the limit. */
void small_cache_free(void *p);
/* The most bytes kept (0: none; the excess is given back now). */
void small_cache_set_limit(size_t bytes);
/* The limit unless set: a sixty-fourth of physical memory, at most 256 MiB
 * (host_cache_set_limit sets an eighth of its own, within this). */
size_t small_cache_default_limit(void);
/* Gives every cached block back to malloc. */
void small_cache_empty(void);
/* hits, misses, cached and handed-out bytes (as malloc_usable_size counts
 * them), the limit. */
void small_cache_get_stats(engine_cache_stats *out);

#endif
