/* host_cache.c: the caching allocator of large host blocks (host_cache.h). */
#include "host_cache.h"

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
  size_t size;                /* mapped bytes (a multiple of HUGE) */
  bool cached;                /* on the cached list, else handed out */
  struct block *older, *newer; /* the cached list, oldest first */
  UT_hash_handle hh;          /* by ptr: every block, handed out or cached */
} block;

static struct {
  pthread_mutex_t mu;
  block *all;
  block *oldest, *newest;
  size_t cached, in_use, limit;
  bool limit_set;
  uint64_t hits, misses;
} hc = {.mu = PTHREAD_MUTEX_INITIALIZER};

static size_t default_limit(void)
{
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  size_t ram = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : (size_t)8 << 30;
  size_t lim = ram / 8;
  return lim < ((size_t)8 << 30) ? lim : (size_t)8 << 30;
}

static size_t limit_locked(void)
{
  if (!hc.limit_set) {
    hc.limit = default_limit();
    hc.limit_set = true;
  }
  return hc.limit;
}

static void *map_block(size_t size)
{
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

static void unmap_block(void *p, size_t size)
{
#ifdef HOST_CACHE_ASAN
  UNPOISON(p, size);
  free(p);
#else
  munmap(p, size);
#endif
}

static void unlink_cached(block *b)
{
  if (b->older)
    b->older->newer = b->newer;
  else
    hc.oldest = b->newer;
  if (b->newer)
    b->newer->older = b->older;
  else
    hc.newest = b->older;
  b->older = b->newer = NULL;
  b->cached = false;
  hc.cached -= b->size;
}

/* Unmaps the oldest cached blocks until at most keep bytes are cached; the
 * blocks to unmap are handed back in *out (unmapped outside the lock). */
static block *trim_locked(size_t keep)
{
  block *out = NULL;
  while (hc.cached > keep && hc.oldest) {
    block *b = hc.oldest;
    unlink_cached(b);
    HASH_DEL(hc.all, b);
    b->newer = out;
    out = b;
  }
  return out;
}

static void unmap_list(block *b)
{
  while (b) {
    block *next = b->newer;
    unmap_block(b->ptr, b->size);
    free(b);
    b = next;
  }
}

void *host_cache_alloc(size_t bytes)
{
  if (bytes < HOST_CACHE_MIN_BYTES) {
    void *p = aligned_alloc(256, (bytes + 255) & ~(size_t)255);
    return p;
  }
  if (bytes > SIZE_MAX - HUGE)
    return NULL;
  size_t size = (bytes + HUGE - 1) & ~(HUGE - 1);
  pthread_mutex_lock(&hc.mu);
  /* the smallest cached block that fits without wasting more than a quarter */
  block *best = NULL;
  for (block *b = hc.newest; b; b = b->older)
    if (b->size >= size && b->size - size <= size / 4 && (!best || b->size < best->size))
      best = b;
  if (best) {
    unlink_cached(best);
    hc.in_use += best->size;
    hc.hits++;
    pthread_mutex_unlock(&hc.mu);
    UNPOISON(best->ptr, bytes);
    POISON((char *)best->ptr + bytes, best->size - bytes);
    return best->ptr;
  }
  hc.misses++;
  pthread_mutex_unlock(&hc.mu);
  block *nb = calloc(1, sizeof *nb);
  void *p = nb ? map_block(size) : NULL;
  if (nb && !p) {
    /* out of memory: what the cache holds may be what is missing */
    host_cache_empty();
    p = map_block(size);
  }
  if (!p) {
    free(nb);
    return NULL;
  }
  nb->ptr = p;
  nb->size = size;
  POISON((char *)p + bytes, size - bytes);
  pthread_mutex_lock(&hc.mu);
  HASH_ADD_PTR(hc.all, ptr, nb);
  hc.in_use += size;
  pthread_mutex_unlock(&hc.mu);
  return p;
}

void host_cache_free(void *p)
{
  if (!p)
    return;
  pthread_mutex_lock(&hc.mu);
  block *b;
  HASH_FIND_PTR(hc.all, &p, b);
  if (!b) {
    pthread_mutex_unlock(&hc.mu);
    free(p); /* a small block, from aligned_alloc */
    return;
  }
  hc.in_use -= b->size;
  block *drop = NULL;
  if (b->size > limit_locked()) {
    HASH_DEL(hc.all, b);
    b->newer = NULL;
    drop = b;
  } else {
    drop = trim_locked(hc.limit - b->size);
    b->cached = true;
    b->older = hc.newest;
    b->newer = NULL;
    if (hc.newest)
      hc.newest->newer = b;
    else
      hc.oldest = b;
    hc.newest = b;
    hc.cached += b->size;
    POISON(b->ptr, b->size);
  }
  pthread_mutex_unlock(&hc.mu);
  unmap_list(drop);
}

void host_cache_set_limit(size_t bytes)
{
  pthread_mutex_lock(&hc.mu);
  hc.limit = bytes;
  hc.limit_set = true;
  block *drop = trim_locked(bytes);
  pthread_mutex_unlock(&hc.mu);
  unmap_list(drop);
}

void host_cache_empty(void)
{
  pthread_mutex_lock(&hc.mu);
  block *drop = trim_locked(0);
  pthread_mutex_unlock(&hc.mu);
  unmap_list(drop);
}

void host_cache_get_stats(host_cache_stats *out)
{
  pthread_mutex_lock(&hc.mu);
  *out = (host_cache_stats){.hits = hc.hits,
                            .misses = hc.misses,
                            .cached_bytes = hc.cached,
                            .in_use_bytes = hc.in_use,
                            .limit_bytes = limit_locked()};
  pthread_mutex_unlock(&hc.mu);
}
