/* host_cache.c: the caching allocators of large host blocks and of pinned
 * host blocks (host_cache.h). */
#include "host_cache.h"

#include "backend.h"
#include "env.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
#include <uthash.h>

#if defined(__SANITIZE_ADDRESS__)
#define HOST_CACHE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HOST_CACHE_ASAN 1
#endif
#endif
#ifdef HOST_CACHE_ASAN
#include <sanitizer/asan_interface.h>
/* Under AddressSanitizer blocks come from its allocator (so that it knows
 * them), a cached block is poisoned (a use after free is reported even
 * though the memory was not returned) and so is the tail past what an
 * allocation asked for. */
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define HUGE ((size_t)2 << 20) /* the huge page size on x86-64: sizes round up to it */

typedef struct block {
  void *ptr;
  size_t size;                /* mapped bytes (a multiple of the cache's granule) */
  const void *owner;          /* what mapped it (the pinned cache: a backend) */
  bool cached;                /* on the cached list, else handed out */
  struct block *older, *newer; /* the cached list, oldest first */
  UT_hash_handle hh;          /* by ptr: every block, handed out or cached */
} block;

/* One cache: the large host blocks (mmap, huge pages) or the pinned ones
 * (the accelerator's host_alloc).  What differs is how a block is mapped
 * and unmapped, how sizes round, and from what size on blocks are kept. */
typedef struct cache {
  pthread_mutex_t mu;
  block *all;
  block *oldest, *newest;
  size_t cached, in_use, limit;
  bool limit_set;
  uint64_t hits, misses;
  size_t min_bytes;                      /* smaller: aligned_alloc, not kept */
  size_t (*round)(size_t bytes);         /* the size mapped for bytes (0: too large) */
  void *(*map)(size_t size, const void **owner);
  void (*unmap)(void *p, size_t size, const void *owner);
  size_t ram_divisor, max_limit;         /* the default limit: RAM / divisor, at most max */
  const char *limit_env;                 /* a variable that sets the default limit */
} cache;

static size_t default_limit(const cache *c)
{
  size_t set; /* env.c: "1GiB" as well as bytes */
  if (c->limit_env && engine_env_size(c->limit_env, &set))
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

static size_t round_huge(size_t bytes)
{
  return bytes > SIZE_MAX - HUGE ? 0 : (bytes + HUGE - 1) & ~(HUGE - 1);
}

static void *map_block(size_t size, const void **owner)
{
  *owner = NULL;
#ifdef HOST_CACHE_ASAN
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

static void unmap_block(void *p, size_t size, const void *owner)
{
  (void)owner;
#ifdef HOST_CACHE_ASAN
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

static void cache_empty(cache *c);

static void *cache_alloc(cache *c, size_t bytes)
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
    cache_empty(c);
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

/* False when p is not one of c's blocks. */
static bool cache_free(cache *c, void *p)
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

static void cache_set_limit(cache *c, size_t bytes)
{
  pthread_mutex_lock(&c->mu);
  c->limit = bytes;
  c->limit_set = true;
  block *drop = trim_locked(c, bytes);
  pthread_mutex_unlock(&c->mu);
  unmap_list(c, drop);
}

static void cache_empty(cache *c)
{
  pthread_mutex_lock(&c->mu);
  block *drop = trim_locked(c, 0);
  pthread_mutex_unlock(&c->mu);
  unmap_list(c, drop);
}

static void cache_get_stats(cache *c, host_cache_stats *out)
{
  pthread_mutex_lock(&c->mu);
  *out = (host_cache_stats){.hits = c->hits,
                            .misses = c->misses,
                            .cached_bytes = c->cached,
                            .in_use_bytes = c->in_use,
                            .limit_bytes = limit_locked(c)};
  pthread_mutex_unlock(&c->mu);
}

/* ---------------------------------------------------------------- large host blocks */

static cache hc = {.mu = PTHREAD_MUTEX_INITIALIZER,
                   .min_bytes = HOST_CACHE_MIN_BYTES,
                   .round = round_huge,
                   .map = map_block,
                   .unmap = unmap_block,
                   .ram_divisor = 8,
                   .max_limit = (size_t)8 << 30};

void *host_cache_alloc(size_t bytes)
{
  return cache_alloc(&hc, bytes);
}

void host_cache_free(void *p)
{
  if (p && !cache_free(&hc, p))
    free(p); /* a small block, from aligned_alloc */
}

void host_cache_set_limit(size_t bytes)
{
  cache_set_limit(&hc, bytes);
}

void host_cache_empty(void)
{
  cache_empty(&hc);
}

void host_cache_get_stats(host_cache_stats *out)
{
  cache_get_stats(&hc, out);
}

/* ---------------------------------------------------------------- pinned blocks */

/* Pinned sizes: 64 KiB steps below 2 MiB, 2 MiB steps above (a fresh
 * cudaHostAlloc costs about 0.4 ms per MiB: every size is worth keeping). */
static size_t round_pinned(size_t bytes)
{
  const size_t small = (size_t)64 << 10;
  if (bytes < HUGE)
    return bytes ? (bytes + small - 1) & ~(small - 1) : small;
  return round_huge(bytes);
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
  UNPOISON(p, size);
  ((const backend_ops *)owner)->host_free(p);
}

static cache pc = {.mu = PTHREAD_MUTEX_INITIALIZER,
                   .min_bytes = 0,
                   .round = round_pinned,
                   .map = map_pinned,
                   .unmap = unmap_pinned,
                   .ram_divisor = 16,
                   .max_limit = (size_t)4 << 30,
                   .limit_env = "TPORT_PINNED_CACHE_BYTES"};

void *pinned_cache_alloc(size_t bytes)
{
  return cache_alloc(&pc, bytes);
}

void pinned_cache_free(void *p)
{
  if (p && !cache_free(&pc, p))
    abort(); /* not a pinned block: an engine bug */
}

void pinned_cache_set_limit(size_t bytes)
{
  cache_set_limit(&pc, bytes);
}

void pinned_cache_empty(void)
{
  cache_empty(&pc);
}

void pinned_cache_get_stats(host_cache_stats *out)
{
  cache_get_stats(&pc, out);
}
