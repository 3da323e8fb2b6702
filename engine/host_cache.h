/*
 * host_cache.h: the caching allocator of large host blocks (the cpu
 * device's storages, and so every put that lands on the cpu).
 *
 * A fresh block of hundreds of MiB costs more than the bytes it will hold:
 * the kernel zeroes and maps it a 4 KiB page fault at a time (a third of a
 * put's time in a profile), and free() hands it back only to fault it in
 * again on the next put.  Blocks of at least HOST_CACHE_MIN_BYTES are
 * therefore mapped 2 MiB aligned with transparent huge pages asked for, and
 * kept when freed for the next allocation that fits (PyTorch's caching
 * allocators do the same for device and pinned memory).  Smaller blocks go
 * to small_cache.h, which keeps freed ones by size class until the server
 * goes idle.
 *
 * Cached blocks hold earlier tensors' bytes: like malloc'ed memory, a new
 * storage must be written whole before anyone reads it, which the engine
 * does (every storage it makes is the result of a copy or a complete put).
 *
 * The cache holds at most its limit (host_cache_set_limit; default an
 * eighth of physical memory, at most 8 GiB; the small blocks' cache then
 * an eighth of it); the oldest blocks go first.
 * Thread-safe.
 */
#ifndef TPORT_HOST_CACHE_H
#define TPORT_HOST_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "engine_stats.h"

#define HOST_CACHE_MIN_BYTES ((size_t)1 << 20)

/* A block of at least bytes, 256-byte aligned at least; NULL when out of
 * memory (after releasing every cached block and trying again). */
void *host_cache_alloc(size_t bytes);
/* Frees p (from host_cache_alloc): kept for reuse while under the limit. */
void host_cache_free(void *p);

/* The most bytes kept cached (0: keep nothing; releases the excess now). */
void host_cache_set_limit(size_t bytes);
/* Releases every cached block, small ones too. */
void host_cache_empty(void);

typedef engine_cache_stats host_cache_stats; /* engine_stats.h */
void host_cache_get_stats(host_cache_stats *out);

/*
 * The same for pinned host memory: the cpu storages made with
 * STORAGE_PINNED (a non_blocking copy from a device pins its result, as
 * PyTorch does).  A fresh cudaHostAlloc maps, zeroes and locks every page
 * (101-117 ms for 256 MiB on an H200) and cudaFreeHost is as slow and
 * synchronizing, so freed blocks are kept for the next allocation that fits,
 * as PyTorch's CachingHostAllocator keeps them.  Every size is kept (64 KiB
 * steps below 2 MiB).  Blocks come from the first accelerator backend with a
 * device (backend_pinned_host) and go back to the one that made them.  The
 * limit defaults to a sixteenth of physical memory, at most 4 GiB, or
 * TPORT_PINNED_CACHE_BYTES.  Blocks are only ever freed by the engine, after
 * the work pending on their storage completed (storage_reap).
 */
void *pinned_cache_alloc(size_t bytes);
void pinned_cache_free(void *p);
void pinned_cache_set_limit(size_t bytes);
void pinned_cache_empty(void);
void pinned_cache_get_stats(host_cache_stats *out);

#endif
