/* fairq.c: the workers' queue, fair between tenants (see fairq.h). */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local bool fq_oom;
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(e) (fq_oom = true)
#include <uthash.h>

#include "fairq.h"

typedef struct fq_tenant {
  fq_node *head, *tail; /* queued, oldest first */
  size_t queued;
  int running;                       /* popped, not yet done */
  struct fq_tenant *prev, *next;     /* the ring of tenants with work queued */
  bool in_ring, hashed;
  UT_hash_handle hh;
  char key[]; /* hashed tenants only */
} fq_tenant;

struct fair_queue {
  int cap;
  fq_tenant *by_key;
  fq_tenant *cursor; /* in the ring: the tenant whose turn is next */
  size_t queued, ntenants;
  fq_tenant overflow; /* for nodes whose tenant could not be allocated */
};

fair_queue *fq_new(int cap)
{
  fair_queue *q = calloc(1, sizeof *q);
  if (q)
    q->cap = cap > 0 ? cap : 1;
  return q;
}

void fq_free(fair_queue *q)
{
  if (!q)
    return;
  fq_tenant *t, *tmp;
  HASH_ITER(hh, q->by_key, t, tmp)
  {
    HASH_DEL(q->by_key, t);
    free(t);
  }
  free(q);
}

static void ring_insert(fair_queue *q, fq_tenant *t)
{
  if (!q->cursor) {
    t->prev = t->next = t;
    q->cursor = t;
  } else {
    /* last in the round: just before the tenant whose turn is next */
    t->next = q->cursor;
    t->prev = q->cursor->prev;
    t->prev->next = t;
    q->cursor->prev = t;
  }
  t->in_ring = true;
}

static void ring_remove(fair_queue *q, fq_tenant *t)
{
  if (t->next == t) {
    q->cursor = NULL;
  } else {
    t->prev->next = t->next;
    t->next->prev = t->prev;
    if (q->cursor == t)
      q->cursor = t->next;
  }
  t->prev = t->next = NULL;
  t->in_ring = false;
}

/* A tenant with nothing queued or running is forgotten. */
static void maybe_forget(fair_queue *q, fq_tenant *t)
{
  if (t->queued || t->running || !t->hashed)
    return;
  HASH_DEL(q->by_key, t);
  q->ntenants--;
  free(t);
}

static fq_tenant *tenant_for(fair_queue *q, const char *key)
{
  size_t len = strlen(key);
  fq_tenant *t;
  HASH_FIND(hh, q->by_key, key, len, t);
  if (t)
    return t;
  t = calloc(1, sizeof *t + len + 1);
  if (!t)
    return &q->overflow;
  memcpy(t->key, key, len + 1);
  fq_oom = false;
  HASH_ADD_KEYPTR(hh, q->by_key, t->key, len, t);
  if (fq_oom) {
    free(t);
    return &q->overflow;
  }
  t->hashed = true;
  q->ntenants++;
  return t;
}

void fq_push(fair_queue *q, const char *key, fq_node *n)
{
  fq_tenant *t = tenant_for(q, key ? key : "");
  n->next = NULL;
  n->owner = t;
  if (t->tail)
    t->tail->next = n;
  else
    t->head = n;
  t->tail = n;
  t->queued++;
  q->queued++;
  if (!t->in_ring)
    ring_insert(q, t);
}

fq_node *fq_pop(fair_queue *q, bool any)
{
  fq_tenant *t = q->cursor;
  if (!t)
    return NULL;
  /* one turn round the ring from the cursor: the first tenant under its cap */
  fq_tenant *start = t;
  while (!any && t->running >= q->cap) {
    t = t->next;
    if (t == start)
      return NULL;
  }
  fq_node *n = t->head;
  t->head = n->next;
  if (!t->head)
    t->tail = NULL;
  n->next = NULL;
  t->queued--;
  q->queued--;
  t->running++;
  /* the next turn is the next tenant's, whoever went this time */
  q->cursor = t->next;
  if (!t->queued)
    ring_remove(q, t);
  return n;
}

void fq_done(fair_queue *q, fq_node *n)
{
  fq_tenant *t = n->owner;
  if (!t)
    return;
  n->owner = NULL;
  if (t->running > 0)
    t->running--;
  maybe_forget(q, t);
}

size_t fq_queued(const fair_queue *q)
{
  return q->queued;
}

size_t fq_tenants(const fair_queue *q)
{
  return q->ntenants + (q->overflow.queued || q->overflow.running ? 1 : 0);
}
