/* staging.c: the caching pinned host allocator (see staging.h). */
#include "staging.h"

#include "env.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define NCLASSES 11 /* 64 KiB .. 64 MiB */

struct staging_pool {
  const backend_ops *be;
  size_t budget;
  pthread_mutex_t mu;
  pthread_cond_t released;
  staging_block *free_list[NCLASSES];
  staging_block *pending_head, *pending_tail; /* oldest first */
  staging_stats st;
};

static int size_class(size_t n)
{
  int c = 0;
  size_t s = STAGING_MIN_BLOCK;
  while (s < n) {
    s <<= 1;
    c++;
  }
  return c;
}

size_t staging_budget(const staging_pool *p)
{
  return p->budget; /* fixed at creation */
}

size_t staging_block_size(size_t n)
{
  return STAGING_MIN_BLOCK << size_class(n);
}

int staging_create(const backend_ops *be, size_t budget, staging_pool **out, tport_err *err)
{
  if (budget < STAGING_MAX_BLOCK)
    budget = STAGING_MAX_BLOCK;
  staging_pool *p = calloc(1, sizeof *p);
  if (!p)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of host memory for a staging pool");
  p->be = be;
  p->budget = budget;
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->released, NULL);
  *out = p;
  return TPORT_OK;
}

static bool block_done(staging_block *b)
{
  for (int i = 0; i < b->nevents; i++)
    if (!b->ev_be[i]->event_query(b->ev[i]))
      return false;
  return true;
}

static void block_drop_events(staging_block *b)
{
  for (int i = 0; i < b->nevents; i++)
    b->ev_be[i]->event_destroy(b->ev[i]);
  b->nevents = 0;
}

static void push_free(staging_pool *p, staging_block *b)
{
  block_drop_events(b);
  b->next = p->free_list[b->cls];
  p->free_list[b->cls] = b;
  p->st.bytes_in_use -= b->size;
  p->st.bytes_cached += b->size;
}

/* Moves completed pending blocks to their free lists.  Called with mu held. */
static void collect(staging_pool *p)
{
  staging_block **link = &p->pending_head, *prev = NULL;
  while (*link) {
    staging_block *b = *link;
    if (block_done(b)) {
      *link = b->next;
      if (p->pending_tail == b)
        p->pending_tail = prev;
      push_free(p, b);
    } else {
      prev = b;
      link = &b->next;
    }
  }
}

/* Frees blocks taken off the pool's lists, outside its lock: cudaFreeHost
 * is slow and synchronizing, and a read-back block comes home on nng's
 * threads (staging_release) which must never wait behind it. */
static void free_blocks(staging_pool *p, staging_block *dead)
{
  while (dead) {
    staging_block *b = dead;
    dead = b->next;
    p->be->host_free(b->ptr);
    free(b);
  }
}

/* Takes cached blocks of other classes off their lists (onto *dead, freed
 * by the caller without the lock) until `need` more bytes fit.  Called
 * with mu held. */
static bool shrink_for(staging_pool *p, size_t need, staging_block **dead)
{
  for (int c = NCLASSES - 1; c >= 0 && p->st.bytes_allocated + need > p->budget; c--)
    while (p->free_list[c] && p->st.bytes_allocated + need > p->budget) {
      staging_block *b = p->free_list[c];
      p->free_list[c] = b->next;
      p->st.bytes_cached -= b->size;
      p->st.bytes_allocated -= b->size;
      b->next = *dead;
      *dead = b;
    }
  return p->st.bytes_allocated + need <= p->budget;
}

/* staging_acquire, or with wait false staging_try_acquire. */
static int acquire(staging_pool *p, size_t n, bool wait, staging_block **out, tport_err *err)
{
  if (n == 0 || n > STAGING_MAX_BLOCK)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "staging block of %zu bytes: blocks are 1 byte to %zu bytes", n,
                         STAGING_MAX_BLOCK);
  int cls = size_class(n);
  size_t size = STAGING_MIN_BLOCK << cls;
  bool waited = false;
  staging_block *dead = NULL;
  pthread_mutex_lock(&p->mu);
  for (;;) {
    collect(p);
    staging_block *b = p->free_list[cls];
    if (b) {
      p->free_list[cls] = b->next;
      p->st.bytes_cached -= size;
      p->st.bytes_in_use += size;
      p->st.hits++;
      pthread_mutex_unlock(&p->mu);
      free_blocks(p, dead);
      b->next = NULL;
      *out = b;
      return TPORT_OK;
    }
    if (shrink_for(p, size, &dead)) {
      p->st.bytes_allocated += size; /* reserve before dropping the lock */
      p->st.bytes_in_use += size;
      p->st.misses++;
      pthread_mutex_unlock(&p->mu);
      free_blocks(p, dead);
      b = calloc(1, sizeof *b);
      int rc = b ? p->be->host_alloc(size, &b->ptr, err)
                 : tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of host memory");
      if (rc != TPORT_OK) {
        free(b);
        pthread_mutex_lock(&p->mu);
        p->st.bytes_allocated -= size;
        p->st.bytes_in_use -= size;
        pthread_cond_broadcast(&p->released);
        pthread_mutex_unlock(&p->mu);
        return rc;
      }
      b->size = size;
      b->cls = cls;
      *out = b;
      return TPORT_OK;
    }
    if (dead) {
      /* shrinking did not make room: free what it took before waiting */
      pthread_mutex_unlock(&p->mu);
      free_blocks(p, dead);
      dead = NULL;
      pthread_mutex_lock(&p->mu);
      continue;
    }
    if (!wait) {
      pthread_mutex_unlock(&p->mu);
      return tport_err_set(err, TPORT_UNAVAILABLE, "the staging pool's %zu bytes are in use",
                           p->budget);
    }
    if (!waited) {
      p->st.waits++;
      waited = true;
    }
    staging_block *oldest = p->pending_head;
    if (oldest) {
      /* Back-pressure: wait for the oldest pending copy, outside the lock. */
      p->pending_head = oldest->next;
      if (!p->pending_head)
        p->pending_tail = NULL;
      pthread_mutex_unlock(&p->mu);
      for (int i = 0; i < oldest->nevents; i++)
        oldest->ev_be[i]->event_synchronize(oldest->ev[i], NULL);
      pthread_mutex_lock(&p->mu);
      push_free(p, oldest);
    } else {
      /* Every byte is held by callers: wait for one to release. */
      pthread_cond_wait(&p->released, &p->mu);
    }
  }
}

int staging_acquire(staging_pool *p, size_t n, staging_block **out, tport_err *err)
{
  return acquire(p, n, true, out, err);
}

int staging_try_acquire(staging_pool *p, size_t n, staging_block **out, tport_err *err)
{
  return acquire(p, n, false, out, err);
}

int staging_add_event(staging_block *b, const backend_ops *be, be_event *ev, tport_err *err)
{
  if (b->nevents == STAGING_MAX_EVENTS) {
    /* Keep the promise (never reuse before done) by waiting for the oldest. */
    int rc = b->ev_be[0]->event_synchronize(b->ev[0], err);
    if (rc != TPORT_OK)
      return rc;
    b->ev_be[0]->event_destroy(b->ev[0]);
    for (int i = 1; i < b->nevents; i++) {
      b->ev_be[i - 1] = b->ev_be[i];
      b->ev[i - 1] = b->ev[i];
    }
    b->nevents--;
  }
  b->ev_be[b->nevents] = be;
  b->ev[b->nevents++] = ev;
  return TPORT_OK;
}

void staging_release(staging_pool *p, staging_block *b)
{
  pthread_mutex_lock(&p->mu);
  if (b->nevents == 0 || block_done(b)) {
    push_free(p, b);
  } else {
    b->next = NULL;
    if (p->pending_tail)
      p->pending_tail->next = b;
    else
      p->pending_head = b;
    p->pending_tail = b;
  }
  pthread_cond_broadcast(&p->released);
  pthread_mutex_unlock(&p->mu);
}

void staging_get_stats(staging_pool *p, staging_stats *out)
{
  pthread_mutex_lock(&p->mu);
  *out = p->st;
  pthread_mutex_unlock(&p->mu);
}

void staging_empty_cache(staging_pool *p)
{
  staging_block *dead = NULL;
  pthread_mutex_lock(&p->mu);
  collect(p);
  for (int c = 0; c < NCLASSES; c++)
    while (p->free_list[c]) {
      staging_block *b = p->free_list[c];
      p->free_list[c] = b->next;
      p->st.bytes_cached -= b->size;
      p->st.bytes_allocated -= b->size;
      b->next = dead;
      dead = b;
    }
  pthread_mutex_unlock(&p->mu);
  free_blocks(p, dead);
}

void staging_destroy(staging_pool *p)
{
  if (!p)
    return;
  pthread_mutex_lock(&p->mu);
  while (p->pending_head) {
    staging_block *b = p->pending_head;
    p->pending_head = b->next;
    for (int i = 0; i < b->nevents; i++)
      b->ev_be[i]->event_synchronize(b->ev[i], NULL);
    push_free(p, b);
  }
  p->pending_tail = NULL;
  pthread_mutex_unlock(&p->mu);
  staging_empty_cache(p);
  pthread_cond_destroy(&p->released);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

/* The engine's pools: created on first use (after the devices are
 * configured), their pinned memory from the first accelerator backend
 * with a device. */
typedef struct lazy_pool {
  pthread_mutex_t mu;
  staging_pool *pool;
  const char *env;       /* the budget's variable */
  size_t default_budget;
} lazy_pool;

static staging_pool *lazy_pool_get(lazy_pool *lp)
{
  pthread_mutex_lock(&lp->mu);
  if (!lp->pool) {
    const backend_ops *be = backend_pinned_host();
    size_t budget; /* env.c: "256M" as well as bytes; 0 is the default */
    if (!engine_env_size(lp->env, &budget) || budget == 0)
      budget = lp->default_budget;
    staging_create(be, budget, &lp->pool, NULL);
  }
  staging_pool *p = lp->pool;
  pthread_mutex_unlock(&lp->mu);
  return p;
}

static lazy_pool default_pool = {PTHREAD_MUTEX_INITIALIZER, NULL, "TPORT_STAGING_BYTES",
                                 (size_t)256 << 20};
static lazy_pool readback_pool = {PTHREAD_MUTEX_INITIALIZER, NULL, "TPORT_READBACK_BYTES",
                                  (size_t)256 << 20};

staging_pool *staging_default(void)
{
  return lazy_pool_get(&default_pool);
}

staging_pool *staging_readback(void)
{
  return lazy_pool_get(&readback_pool);
}

static void lazy_pool_stats(lazy_pool *lp, staging_stats *out)
{
  pthread_mutex_lock(&lp->mu);
  if (lp->pool)
    staging_get_stats(lp->pool, out);
  else
    memset(out, 0, sizeof *out);
  pthread_mutex_unlock(&lp->mu);
}

void staging_engine_pools_stats(staging_stats *staging, staging_stats *readback)
{
  lazy_pool_stats(&default_pool, staging);
  lazy_pool_stats(&readback_pool, readback);
}
