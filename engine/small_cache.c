/* small_cache.c: freed small host blocks kept by size class (small_cache.h). */
#include "small_cache.h"

#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "asan_poison.h"
#include "host_cache.h"

/* Classes: 256-byte steps up to 2 KiB (classes 0-7: 256 .. 2048), then
 * eight a doubling (2 KiB + k * 256 .. 4 KiB, 4 KiB + k * 512 .. 8 KiB,
 * ...) up to HOST_CACHE_MIN_BYTES. */
#define ALIGN 256
#define FIRST_OCTAVE 11 /* 2 KiB */
#define STEPS 8
#define NCLASSES (STEPS + (20 - FIRST_OCTAVE) * STEPS) /* 1 MiB = 2^20 */
_Static_assert(HOST_CACHE_MIN_BYTES == (size_t)1 << 20, "the classes end at the host cache's start");

/* The default limit: a sixty-fourth of physical memory, at most this. */
#define DEFAULT_MAX ((size_t)256 << 20)

/* A kept block and its usable size, read when it was freed: read again
 * when it is handed out, malloc's header is one more cache miss on the
 * path of every small put (2.5% of tportd's samples in a PutBatch of
 * 4 KiB tensors). */
typedef struct kept_block {
  void *p;
  size_t usable;
} kept_block;

typedef struct size_class {
  pthread_mutex_t mu;
  kept_block *blocks; /* a stack: the most recently freed on top */
  size_t n, cap;
} size_class;

static size_class classes[NCLASSES];
static pthread_once_t once = PTHREAD_ONCE_INIT;
static atomic_size_t limit_bytes;
static atomic_bool limit_set;
static atomic_size_t cached, in_use;
static atomic_uint_fast64_t hits, misses;

static void init_classes(void)
{
  for (int i = 0; i < NCLASSES; i++)
    pthread_mutex_init(&classes[i].mu, NULL);
}

size_t small_cache_default_limit(void)
{
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  size_t ram = pages > 0 && page > 0 ? (size_t)pages * (size_t)page : (size_t)8 << 30;
  return ram / 64 < DEFAULT_MAX ? ram / 64 : DEFAULT_MAX;
}

static size_t limit(void)
{
  if (!atomic_load(&limit_set)) {
    size_t lim = small_cache_default_limit();
    bool no = false;
    if (atomic_compare_exchange_strong(&limit_set, &no, true))
      atomic_store(&limit_bytes, lim);
  }
  return atomic_load(&limit_bytes);
}

static size_t class_size(int k)
{
  if (k < STEPS)
    return (size_t)(k + 1) * ALIGN;
  int o = FIRST_OCTAVE + (k - STEPS) / STEPS, step = (k - STEPS) % STEPS + 1;
  return ((size_t)1 << o) + (size_t)step * ((size_t)1 << (o - 3));
}

/* The smallest class that holds bytes (< 1 MiB). */
static int class_up(size_t bytes)
{
  if (bytes <= (size_t)STEPS * ALIGN)
    return bytes <= ALIGN ? 0 : (int)((bytes - 1) / ALIGN);
  int o = 63 - __builtin_clzll((unsigned long long)(bytes - 1)); /* 2^o < bytes <= 2^(o+1) */
  size_t g = (size_t)1 << (o - 3);
  int step = (int)((bytes - ((size_t)1 << o) + g - 1) / g); /* 1 .. 8 */
  return STEPS + (o - FIRST_OCTAVE) * STEPS + step - 1;
}

/* The largest class a block of usable bytes can serve. */
static int class_down(size_t usable)
{
  if (usable >= class_size(NCLASSES - 1))
    return NCLASSES - 1;
  int k = class_up(usable);
  return class_size(k) > usable ? k - 1 : k;
}

void *small_cache_alloc(size_t bytes)
{
  pthread_once(&once, init_classes);
  int k = class_up(bytes);
  size_class *c = &classes[k];
  kept_block b = {0};
  pthread_mutex_lock(&c->mu);
  if (c->n)
    b = c->blocks[--c->n];
  pthread_mutex_unlock(&c->mu);
  void *p = b.p;
  if (p) {
    size_t usable = b.usable;
    atomic_fetch_sub(&cached, usable);
    atomic_fetch_add(&in_use, usable);
    atomic_fetch_add(&hits, 1);
    UNPOISON(p, usable);
    return p;
  }
  atomic_fetch_add(&misses, 1);
  p = aligned_alloc(ALIGN, class_size(k));
  if (!p) {
    /* out of memory: what the cache holds may be what is missing */
    small_cache_empty();
    p = aligned_alloc(ALIGN, class_size(k));
  }
  if (p)
    atomic_fetch_add(&in_use, malloc_usable_size(p));
  return p;
}

void small_cache_free(void *p)
{
  if (!p)
    return;
  pthread_once(&once, init_classes);
  size_t usable = malloc_usable_size(p);
  atomic_fetch_sub(&in_use, usable);
  /* over the limit: given back (a race may pass it by a block a thread) */
  if (usable < ALIGN || atomic_load(&cached) + usable > limit()) {
    free(p);
    return;
  }
  size_class *c = &classes[class_down(usable)];
  bool kept = false;
  pthread_mutex_lock(&c->mu);
  if (c->n == c->cap) {
    size_t cap = c->cap ? c->cap * 2 : 64;
    kept_block *grown = realloc(c->blocks, cap * sizeof *grown);
    if (grown)
      c->blocks = grown, c->cap = cap;
  }
  if (c->n < c->cap) {
    POISON(p, usable);
    c->blocks[c->n++] = (kept_block){p, usable};
    atomic_fetch_add(&cached, usable); /* before a trim can take it back */
    kept = true;
  }
  pthread_mutex_unlock(&c->mu);
  if (!kept)
    free(p);
}

/* Gives cached blocks back until at most keep bytes are cached, the
 * largest classes first (they free the most for each lock taken). */
static void trim(size_t keep)
{
  pthread_once(&once, init_classes);
  for (int k = NCLASSES - 1; k >= 0 && atomic_load(&cached) > keep; k--) {
    size_class *c = &classes[k];
    pthread_mutex_lock(&c->mu);
    while (c->n && atomic_load(&cached) > keep) {
      kept_block b = c->blocks[--c->n];
      void *p = b.p;
      size_t usable = b.usable;
      atomic_fetch_sub(&cached, usable);
      UNPOISON(p, usable);
      free(p);
    }
    if (!c->n) {
      free(c->blocks);
      c->blocks = NULL;
      c->cap = 0;
    }
    pthread_mutex_unlock(&c->mu);
  }
}

void small_cache_set_limit(size_t bytes)
{
  atomic_store(&limit_bytes, bytes);
  atomic_store(&limit_set, true);
  trim(bytes);
}

void small_cache_empty(void)
{
  trim(0);
}

void small_cache_get_stats(engine_cache_stats *out)
{
  *out = (engine_cache_stats){.hits = atomic_load(&hits),
                              .misses = atomic_load(&misses),
                              .cached_bytes = atomic_load(&cached),
                              .in_use_bytes = atomic_load(&in_use),
                              .limit_bytes = limit()};
}
