/* cuda_alloc.c: the caching device allocator (see cuda_alloc.h). */
#include "cuda_alloc.h"

#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#define CA_MAX_DEVICES 64
/* Sizes round up to 512 bytes below 1 MiB and to 2 MiB above, so that
 * blocks are interchangeable between requests of similar sizes. */
#define CA_SMALL ((size_t)1 << 20)

typedef struct ca_block {
  void *ptr;
  size_t size;
  struct ca_block *next;
} ca_block;

typedef struct ca_device {
  ca_block *cached;        /* free blocks, unsorted */
  ca_block **live;         /* open-addressing table of blocks in use, by pointer */
  size_t live_cap, live_n; /* capacity is a power of two */
  cuda_alloc_stats st;
} ca_device;

static pthread_mutex_t ca_mu = PTHREAD_MUTEX_INITIALIZER;
static ca_device ca_devs[CA_MAX_DEVICES];

static size_t round_size(size_t n)
{
  if (n == 0)
    n = 1;
  if (n < CA_SMALL)
    return (n + 511) & ~(size_t)511;
  size_t big = (size_t)2 << 20;
  return (n + big - 1) / big * big;
}

static size_t slot_of(const ca_device *d, const void *p)
{
  uintptr_t h = (uintptr_t)p >> 8;
  h ^= h >> 17;
  h *= 0x9E3779B97F4A7C15ull;
  return (size_t)(h ^ (h >> 29)) & (d->live_cap - 1);
}

static bool live_grow(ca_device *d)
{
  size_t cap = d->live_cap ? d->live_cap * 2 : 1024;
  ca_block **t = calloc(cap, sizeof *t);
  if (!t)
    return false;
  ca_block **old = d->live;
  size_t oldcap = d->live_cap;
  d->live = t;
  d->live_cap = cap;
  for (size_t i = 0; i < oldcap; i++)
    if (old[i]) {
      size_t s = slot_of(d, old[i]->ptr);
      while (d->live[s])
        s = (s + 1) & (cap - 1);
      d->live[s] = old[i];
    }
  free(old);
  return true;
}

static bool live_insert(ca_device *d, ca_block *b)
{
  if ((d->live_n + 1) * 2 > d->live_cap && !live_grow(d))
    return false;
  size_t s = slot_of(d, b->ptr);
  while (d->live[s])
    s = (s + 1) & (d->live_cap - 1);
  d->live[s] = b;
  d->live_n++;
  return true;
}

static ca_block *live_remove(ca_device *d, const void *p)
{
  if (!d->live_cap)
    return NULL;
  size_t s = slot_of(d, p);
  while (d->live[s] && d->live[s]->ptr != p)
    s = (s + 1) & (d->live_cap - 1);
  ca_block *b = d->live[s];
  if (!b)
    return NULL;
  d->live[s] = NULL;
  d->live_n--;
  /* re-insert the rest of the cluster (linear probing deletion) */
  for (size_t k = (s + 1) & (d->live_cap - 1); d->live[k]; k = (k + 1) & (d->live_cap - 1)) {
    ca_block *m = d->live[k];
    d->live[k] = NULL;
    size_t t = slot_of(d, m->ptr);
    while (d->live[t])
      t = (t + 1) & (d->live_cap - 1);
    d->live[t] = m;
  }
  return b;
}

/* The smallest cached block that fits without wasting more than half of it. */
static ca_block *take_cached(ca_device *d, size_t size)
{
  ca_block **best = NULL;
  for (ca_block **p = &d->cached; *p; p = &(*p)->next)
    if ((*p)->size >= size && (*p)->size <= 2 * size && (!best || (*p)->size < (*best)->size))
      best = p;
  if (!best)
    return NULL;
  ca_block *b = *best;
  *best = b->next;
  d->st.bytes_cached -= b->size;
  return b;
}

/* Returns the bytes given back to the device. */
static size_t flush_locked(ca_device *d)
{
  size_t released = 0;
  while (d->cached) {
    ca_block *b = d->cached;
    d->cached = b->next;
    if (cudaFree(b->ptr) != cudaSuccess)
      cudaGetLastError();
    d->st.bytes_cached -= b->size;
    released += b->size;
    free(b);
  }
  if (released)
    d->st.cache_flushes++;
  return released;
}

int cuda_alloc(int dev, size_t n, void **out, tport_err *err)
{
  if (dev < 0 || dev >= CA_MAX_DEVICES)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "cuda:%d: no such device", dev);
  size_t size = round_size(n);
  pthread_mutex_lock(&ca_mu);
  ca_device *d = &ca_devs[dev];
  d->st.allocs++;
  ca_block *b = take_cached(d, size);
  if (b) {
    d->st.hits++;
  } else {
    d->st.misses++;
    b = calloc(1, sizeof *b);
    cudaError_t e = b ? cudaMalloc(&b->ptr, size) : cudaErrorMemoryAllocation;
    if (b && e == cudaErrorMemoryAllocation) {
      /* memory pressure: give the cache back to the device and try once more */
      cudaGetLastError();
      if (flush_locked(d))
        e = cudaMalloc(&b->ptr, size);
    }
    if (e != cudaSuccess) {
      cudaGetLastError();
      pthread_mutex_unlock(&ca_mu);
      free(b);
      return tport_err_set(
          err, e == cudaErrorMemoryAllocation ? TPORT_RESOURCE_EXHAUSTED : TPORT_INTERNAL,
          "cudaMalloc(%zu) on cuda:%d: %s", size, dev, cudaGetErrorString(e));
    }
    b->size = size;
  }
  if (!live_insert(d, b)) {
    b->next = d->cached; /* keep it for later rather than lose it */
    d->cached = b;
    d->st.bytes_cached += b->size;
    pthread_mutex_unlock(&ca_mu);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of host memory for the allocator");
  }
  d->st.bytes_in_use += b->size;
  pthread_mutex_unlock(&ca_mu);
  *out = b->ptr;
  return TPORT_OK;
}

bool cuda_alloc_free(int dev, void *p)
{
  if (dev < 0 || dev >= CA_MAX_DEVICES || !p)
    return false;
  pthread_mutex_lock(&ca_mu);
  ca_device *d = &ca_devs[dev];
  ca_block *b = live_remove(d, p);
  if (b) {
    d->st.frees++;
    d->st.bytes_in_use -= b->size;
    d->st.bytes_cached += b->size;
    b->next = d->cached;
    d->cached = b;
  }
  pthread_mutex_unlock(&ca_mu);
  return b != NULL;
}

size_t cuda_alloc_empty_cache(int dev)
{
  if (dev < 0 || dev >= CA_MAX_DEVICES)
    return 0;
  pthread_mutex_lock(&ca_mu);
  size_t released = flush_locked(&ca_devs[dev]);
  pthread_mutex_unlock(&ca_mu);
  return released;
}

void cuda_alloc_get_stats(int dev, cuda_alloc_stats *out)
{
  pthread_mutex_lock(&ca_mu);
  *out = dev >= 0 && dev < CA_MAX_DEVICES ? ca_devs[dev].st : (cuda_alloc_stats){0};
  pthread_mutex_unlock(&ca_mu);
}
