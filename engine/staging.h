/*
 * staging.h: the caching pinned host allocator.
 *
 * Transfers between the host and a device go through page-locked blocks.
 * Blocks come in power-of-two size classes; a block handed back returns to
 * its class's free list only after every event recorded on it has completed,
 * so an async copy still reading it never sees it reused.  The pool has a
 * byte budget: when a new block would exceed it, the caller waits for a
 * pending block to complete (back-pressure) rather than growing without
 * bound.  Once warm, acquiring a block allocates nothing.
 */
#ifndef TPORT_STAGING_H
#define TPORT_STAGING_H

#include "backend.h"
#include "engine_stats.h"

#define STAGING_MIN_BLOCK ((size_t)64 << 10) /* 64 KiB */
#define STAGING_MAX_BLOCK ((size_t)64 << 20) /* 64 MiB */
#define STAGING_MAX_EVENTS 8

typedef struct staging_pool staging_pool;

typedef struct staging_block {
  void *ptr;
  size_t size; /* the class size (>= what was asked) */
  int cls;
  int nevents;
  const backend_ops *ev_be[STAGING_MAX_EVENTS];
  be_event *ev[STAGING_MAX_EVENTS];
  struct staging_block *next;
} staging_block;

typedef engine_pool_stats staging_stats; /* engine_stats.h */

/* A pool whose pinned memory comes from be->host_alloc, with a budget in bytes
 * (at least one maximum-size block). */
int staging_create(const backend_ops *be, size_t budget, staging_pool **out, tport_err *err);
/* Frees every block; waits for pending ones.  No block may be held. */
void staging_destroy(staging_pool *p);
/* A block of at least n bytes (n <= STAGING_MAX_BLOCK).  May wait. */
int staging_acquire(staging_pool *p, size_t n, staging_block **out, tport_err *err);
/* The same, but never waits: UNAVAILABLE when the budget is reached and no
 * block is free (for work that may be skipped, such as reading ahead). */
int staging_try_acquire(staging_pool *p, size_t n, staging_block **out, tport_err *err);
/* The size of the block a request of n bytes gets (its class; n <=
 * STAGING_MAX_BLOCK): what a holder of it keeps from everyone else. */
size_t staging_block_size(size_t n);
/* Records that async work using b completes at event ev (the pool takes ev
 * and destroys it once complete).  At most STAGING_MAX_EVENTS per hold. */
int staging_add_event(staging_block *b, const backend_ops *be, be_event *ev, tport_err *err);
/* Hands b back: it is reused once its events have completed. */
void staging_release(staging_pool *p, staging_block *b);
void staging_get_stats(staging_pool *p, staging_stats *out);
/* The pool's budget in bytes. */
size_t staging_budget(const staging_pool *p);
/* Frees cached (free) blocks: memory pressure. */
void staging_empty_cache(staging_pool *p);

/* The engine's pool (created on first use, pinned memory from the host
 * memory backend, budget from TPORT_STAGING_BYTES or 256 MiB). */
staging_pool *staging_default(void);
/* The pool gets read back through (readback.h): a pool of its own, so that
 * replies a slow client has not read yet never hold the blocks puts and
 * device copies stage through (budget from TPORT_READBACK_BYTES or 256 MiB). */
staging_pool *staging_readback(void);
/* The stats of those two pools, zeros for one not created yet (reading
 * them never creates them: a pool takes its backend from the configured
 * devices). */
void staging_engine_pools_stats(staging_stats *staging, staging_stats *readback);

#endif
