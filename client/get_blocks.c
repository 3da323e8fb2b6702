/* get_blocks.c: the cache of get buffers (get_blocks.h), an instance of
 * engine/block_cache.c. */
#include "get_blocks.h"

#include <stdlib.h>

#include "block_cache.h"
#include "env.h"

static bool limit_from_env(size_t *out)
{
  uint64_t v;
  bool set;
  if (client_env_size("TPORT_GET_CACHE_BYTES", &v, &set, NULL) != TPORT_OK || !set)
    return false; /* tport_connect refused a value that does not parse */
  *out = v > SIZE_MAX ? SIZE_MAX : (size_t)v;
  return true;
}

static block_cache blocks = {BLOCK_CACHE_INIT,
                             .min_bytes = GET_BLOCKS_MIN_BYTES,
                             .round = block_cache_round_huge,
                             .map = block_cache_map_huge,
                             .unmap = block_cache_unmap_huge,
                             .ram_divisor = 16,
                             .max_limit = (size_t)1 << 30,
                             .limit_from_env = limit_from_env};

void *get_block_alloc(size_t bytes)
{
  return block_cache_alloc(&blocks, bytes ? bytes : 1);
}

void get_block_free(void *p)
{
  if (p && !block_cache_free(&blocks, p))
    free(p); /* a small one, from aligned_alloc */
}

void get_blocks_get_stats(block_cache_stats *out)
{
  block_cache_get_stats(&blocks, out);
}

void get_blocks_empty(void)
{
  block_cache_empty(&blocks);
}
