/*
 * block_cache.h: a cache of large memory blocks, kept when freed for the
 * next allocation that fits (host_cache.h has why: a fresh block is mapped
 * and zeroed a page fault at a time, and PyTorch's caching allocators keep
 * theirs for the same reason).  The engine's caches of host and pinned
 * blocks (host_cache.c) and libtport's of the buffers a get hands over
 * (client/get_blocks.c) are instances: what differs is how a block is
 * mapped and unmapped, how sizes round, from what size on blocks are kept
 * and the default limit.  Here, in the layer both may use (DESIGN.md's
 * layout), and stateless apart from the instances, so that libtport and
 * the engine may each carry a copy.
 *
 * An instance is a block_cache initialized with BLOCK_CACHE_INIT and the
 * fields below; the oldest cached blocks go first past its limit.  Blocks
 * hold earlier users' bytes.  Thread-safe.
 */
#ifndef TPORT_BLOCK_CACHE_H
#define TPORT_BLOCK_CACHE_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>


#define BLOCK_CACHE_HUGE ((size_t)2 << 20) /* x86-64's huge page: sizes round up to it */

typedef struct block_cache_stats {
  uint64_t hits, misses; /* large allocations served from the cache / mapped fresh */
  size_t cached_bytes;   /* held for reuse */
  size_t in_use_bytes;   /* large blocks handed out */
  size_t limit_bytes;
} block_cache_stats;

typedef struct bc_block bc_block;

typedef struct block_cache {
  pthread_mutex_t mu;
  bc_block *all;
  bc_block *oldest, *newest;
  size_t cached, in_use, limit;
  bool limit_set;
  uint64_t hits, misses;
  size_t min_bytes;              /* smaller: aligned_alloc, not kept */
  size_t (*round)(size_t bytes); /* the size mapped for bytes (0: too large) */
  void *(*map)(size_t size, const void **owner);
  void (*unmap)(void *p, size_t size, const void *owner);
  size_t ram_divisor, max_limit; /* the default limit: RAM / divisor, at most max */
  bool (*limit_from_env)(size_t *out); /* NULL, or a variable that sets the default limit */
} block_cache;

#define BLOCK_CACHE_INIT .mu = PTHREAD_MUTEX_INITIALIZER

/* A block of at least bytes, 256-byte aligned at least; NULL when out of
 * memory (after releasing every cached block and trying again). */
void *block_cache_alloc(block_cache *c, size_t bytes);
/* Frees p: false when p is not one of c's large blocks (a small block from
 * aligned_alloc, or another cache's: the caller frees it). */
bool block_cache_free(block_cache *c, void *p);
void block_cache_set_limit(block_cache *c, size_t bytes);
void block_cache_empty(block_cache *c);
void block_cache_get_stats(block_cache *c, block_cache_stats *out);

/* Sizes rounded up to BLOCK_CACHE_HUGE; blocks mapped 2 MiB aligned with
 * transparent huge pages asked for (from the sanitizer's allocator under
 * AddressSanitizer, so that it knows them). */
size_t block_cache_round_huge(size_t bytes);
void *block_cache_map_huge(size_t size, const void **owner);
void block_cache_unmap_huge(void *p, size_t size, const void *owner);
/* Under AddressSanitizer: marks bytes the caller may not touch (a cached
 * block, the tail past what was asked) or may again; else nothing. */
void block_cache_poison(void *p, size_t n);
void block_cache_unpoison(void *p, size_t n);

#endif
