/* block_cache.c: the caching allocator of large blocks (block_cache.h). */
#include "block_cache.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include <uthash.h>

/* Under AddressSanitizer blocks come from its allocator (so that it knows
 * them), a cached block is poisoned (a use after free is reported even
 * though the memory was not returned) and so is the tail past what an
 * allocation asked for. */
#include "asan_poison.h"

#define HUGE BLOCK_CACHE_HUGE

struct bc_block {
  void *ptr;
  size_t size;                /* mapped bytes (a multiple of the cache's granule) */
  const void *owner;          /* what mapped it (the pinned cache: a backend) */
  bool cached;                /* on the cached list, else handed out */
  struct bc_block *older, *newer; /* the cached list, oldest first */
  UT_hash_handle hh;          /* by ptr: every block, handed out or cached */
};
typedef bc_block block;

typedef block_cache cache;

static size_t default_limit(const cache *c)
{
  size_t set;
  if (c->limit_from_env && c->limit_from_env(&set))
    return set;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  size_t ram = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : (size_t)8 << 30;
  size_t lim = ram / c->ram_divisor;
  return lim < c->max_limit ? lim : c->max_limit;
}

static size_t limit_locked(cache *c)
{
  if (!c->limit_set) {
    c->limit = default_limit(c);
    c->limit_set = true;
  }
  return c->limit;
}

size_t block_cache_round_huge(size_t bytes)
{
  return bytes > SIZE_MAX - HUGE ? 0 : (bytes + HUGE - 1) & ~(HUGE - 1);
}

void *block_cache_map_huge(size_t size, const void **owner)
{
  *owner = NULL;
#ifdef TPORT_ASAN
  return aligned_alloc(HUGE, size);
#else
  /* map one huge page more and trim, for a 2 MiB aligned start */
  size_t len = size + HUGE;
  char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return NULL;
  uintptr_t start = ((uintptr_t)p + HUGE - 1) & ~(uintptr_t)(HUGE - 1);
  size_t head = start - (uintptr_t)p;
  if (head)
    munmap(p, head);
  if (len - head > size)
    munmap((char *)start + size, len - head - size);
  /* huge pages: 512x fewer faults (the machine's THP mode is madvise) */
  madvise((void *)start, size, MADV_HUGEPAGE);
  return (void *)start;
#endif
}

void block_cache_unmap_huge(void *p, size_t size, const void *owner)
{
  (void)owner;
#ifdef TPORT_ASAN
  UNPOISON(p, size);
  free(p);
#else
  munmap(p, size);
#endif
}

static void unlink_cached(cache *c, block *b)
{
  if (b->older)
    b->older->newer = b->newer;
  else
    c->oldest = b->newer;
  if (b->newer)
    b->newer->older = b->older;
  else
    c->newest = b->older;
  b->older = b->newer = NULL;
  b->cached = false;
  c->cached -= b->size;
}

/* Unmaps the oldest cached blocks until at most keep bytes are cached; the
 * blocks to unmap are handed back in *out (unmapped outside the lock). */
static block *trim_locked(cache *c, size_t keep)
{
  block *out = NULL;
  while (c->cached > keep && c->oldest) {
    block *b = c->oldest;
    unlink_cached(c, b);
    HASH_DEL(c->all, b);
    b->newer = out;
    out = b;
  }
  return out;
}

static void unmap_list(cache *c, block *b)
{
  while (b) {
    block *next = b->newer;
    c->unmap(b->ptr, b->size, b->owner);
    free(b);
    b = next;
  }
}


void *block_cache_alloc(block_cache *c, size_t bytes)
{
  if (bytes < c->min_bytes) {
    void *p = aligned_alloc(256, (bytes + 255) & ~(size_t)255);
    return p;
  }
  size_t size = c->round(bytes);
  if (!size)
    return NULL;
  pthread_mutex_lock(&c->mu);
  /* the smallest cached block that fits without wasting more than a quarter */
  block *best = NULL;
  for (block *b = c->newest; b; b = b->older)
    if (b->size >= size && b->size - size <= size / 4 && (!best || b->size < best->size))
      best = b;
  if (best) {
    unlink_cached(c, best);
    c->in_use += best->size;
    c->hits++;
    pthread_mutex_unlock(&c->mu);
    UNPOISON(best->ptr, bytes);
    POISON((char *)best->ptr + bytes, best->size - bytes);
    return best->ptr;
  }
  c->misses++;
  pthread_mutex_unlock(&c->mu);
  block *nb = calloc(1, sizeof *nb);
  void *p = nb ? c->map(size, &nb->owner) : NULL;
  if (nb && !p) {
    /* out of memory: what the cache holds may be what is missing */
    block_cache_empty(c);
    p = c->map(size, &nb->owner);
  }
  if (!p) {
    free(nb);
    return NULL;
  }
  nb->ptr = p;
  nb->size = size;
  POISON((char *)p + bytes, size - bytes);
  pthread_mutex_lock(&c->mu);
  HASH_ADD_PTR(c->all, ptr, nb);
  c->in_use += size;
  pthread_mutex_unlock(&c->mu);
  return p;
}

bool block_cache_free(block_cache *c, void *p)
{
  pthread_mutex_lock(&c->mu);
  block *b;
  HASH_FIND_PTR(c->all, &p, b);
  if (!b) {
    pthread_mutex_unlock(&c->mu);
    return false;
  }
  c->in_use -= b->size;
  block *drop = NULL;
  if (b->size > limit_locked(c)) {
    HASH_DEL(c->all, b);
    b->newer = NULL;
    drop = b;
  } else {
    drop = trim_locked(c, c->limit - b->size);
    b->cached = true;
    b->older = c->newest;
    b->newer = NULL;
    if (c->newest)
      c->newest->newer = b;
    else
      c->oldest = b;
    c->newest = b;
    c->cached += b->size;
    POISON(b->ptr, b->size);
  }
  pthread_mutex_unlock(&c->mu);
  unmap_list(c, drop);
  return true;
}

void block_cache_set_limit(block_cache *c, size_t bytes)
{
  pthread_mutex_lock(&c->mu);
  c->limit = bytes;
  c->limit_set = true;
  block *drop = trim_locked(c, bytes);
  pthread_mutex_unlock(&c->mu);
  unmap_list(c, drop);
}

void block_cache_empty(block_cache *c)
{
  pthread_mutex_lock(&c->mu);
  block *drop = trim_locked(c, 0);
  pthread_mutex_unlock(&c->mu);
  unmap_list(c, drop);
}

void block_cache_get_stats(block_cache *c, block_cache_stats *out)
{
  pthread_mutex_lock(&c->mu);
  *out = (block_cache_stats){.hits = c->hits,
                            .misses = c->misses,
                            .cached_bytes = c->cached,
                            .in_use_bytes = c->in_use,
                            .limit_bytes = limit_locked(c)};
  pthread_mutex_unlock(&c->mu);
}

void block_cache_poison(void *p, size_t n)
{
  POISON(p, n);
}

void block_cache_unpoison(void *p, size_t n)
{
  UNPOISON(p, n);
}
