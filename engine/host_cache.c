/* host_cache.c: the caching allocators of large host blocks and of pinned
 * host blocks (host_cache.h), instances of block_cache.c. */
#include "host_cache.h"

#include "backend.h"
#include "block_cache.h"
#include "env.h"
#include "small_cache.h"

#include <stdlib.h>

/* ---------------------------------------------------------------- large host blocks */

static block_cache hc = {BLOCK_CACHE_INIT,
                         .min_bytes = HOST_CACHE_MIN_BYTES,
                         .round = block_cache_round_huge,
                         .map = block_cache_map_huge,
                         .unmap = block_cache_unmap_huge,
                         .ram_divisor = 8,
                         .max_limit = (size_t)8 << 30};

void *host_cache_alloc(size_t bytes)
{
  return bytes < HOST_CACHE_MIN_BYTES ? small_cache_alloc(bytes) : block_cache_alloc(&hc, bytes);
}

void host_cache_free(void *p)
{
  if (p && !block_cache_free(&hc, p))
    small_cache_free(p); /* a small block */
}

void host_cache_set_limit(size_t bytes)
{
  block_cache_set_limit(&hc, bytes);
  /* the small blocks' share: an eighth, within their own default */
  size_t small = small_cache_default_limit();
  small_cache_set_limit(bytes / 8 < small ? bytes / 8 : small);
}

void host_cache_empty(void)
{
  block_cache_empty(&hc);
  small_cache_empty();
}

void host_cache_get_stats(host_cache_stats *out)
{
  block_cache_get_stats(&hc, out);
}

/* ---------------------------------------------------------------- pinned blocks */

/* Pinned sizes: 64 KiB steps below 2 MiB, 2 MiB steps above (a fresh
 * cudaHostAlloc costs about 0.4 ms per MiB: every size is worth keeping). */
static size_t round_pinned(size_t bytes)
{
  const size_t small = (size_t)64 << 10;
  if (bytes < BLOCK_CACHE_HUGE)
    return bytes ? (bytes + small - 1) & ~(small - 1) : small;
  return block_cache_round_huge(bytes);
}

static void *map_pinned(size_t size, const void **owner)
{
  const backend_ops *be = backend_pinned_host();
  void *p = NULL;
  if (be->host_alloc(size, &p, NULL) != TPORT_OK)
    return NULL;
  *owner = be;
  return p;
}

static void unmap_pinned(void *p, size_t size, const void *owner)
{
  (void)size;
  block_cache_unpoison(p, size);
  ((const backend_ops *)owner)->host_free(p);
}

/* env.c: "1GiB" as well as bytes */
static bool pinned_limit_from_env(size_t *out)
{
  return engine_env_size("TPORT_PINNED_CACHE_BYTES", out);
}

static block_cache pc = {BLOCK_CACHE_INIT,
                         .min_bytes = 0,
                         .round = round_pinned,
                         .map = map_pinned,
                         .unmap = unmap_pinned,
                         .ram_divisor = 16,
                         .max_limit = (size_t)4 << 30,
                         .limit_from_env = pinned_limit_from_env};

void *pinned_cache_alloc(size_t bytes)
{
  return block_cache_alloc(&pc, bytes);
}

void pinned_cache_free(void *p)
{
  if (p && !block_cache_free(&pc, p))
    abort(); /* not a pinned block: an engine bug */
}

void pinned_cache_set_limit(size_t bytes)
{
  block_cache_set_limit(&pc, bytes);
}

void pinned_cache_empty(void)
{
  block_cache_empty(&pc);
}

void pinned_cache_get_stats(host_cache_stats *out)
{
  block_cache_get_stats(&pc, out);
}
