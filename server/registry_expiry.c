/*
 * registry_expiry.c: the entries that expire, soonest first.
 *
 * A binary min-heap of the entries with a time limit, by expires_ms: the
 * reaper's reg_expire takes what is due off its top, once a second, under
 * the lock every request takes.  It used to walk every entry of every
 * tenant for that, so that the tensors the server held (a million of them:
 * tens of ms) set how long each second every request waited.
 *
 * An entry knows its place (expiry_at, 1-based; 0: not in the heap), so
 * that one leaving early (freed, replaced, its connection gone) is taken
 * out in O(log n).  When the heap cannot grow (out of memory) the entry
 * stays out of it and is counted: while any such entry lives, reg_expire
 * walks every entry as it did, so nothing outlives its time limit, and
 * puts those it finds back into the heap.
 * Everything here runs with the registry's lock held.
 */
#include <stdatomic.h>
#include <stdlib.h>

#include "registry_internal.h"

static bool sooner(const reg_entry *a, const reg_entry *b)
{
  return a->expires_ms < b->expires_ms;
}

static void place(reg_expiry *h, size_t i, reg_entry *e)
{
  h->v[i] = e;
  e->expiry_at = i + 1;
}

static void sift_up(reg_expiry *h, size_t i)
{
  reg_entry *e = h->v[i];
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!sooner(e, h->v[parent]))
      break;
    place(h, i, h->v[parent]);
    i = parent;
  }
  place(h, i, e);
}

static void sift_down(reg_expiry *h, size_t i)
{
  reg_entry *e = h->v[i];
  for (;;) {
    size_t child = 2 * i + 1;
    if (child >= h->n)
      break;
    if (child + 1 < h->n && sooner(h->v[child + 1], h->v[child]))
      child++;
    if (!sooner(h->v[child], e))
      break;
    place(h, i, h->v[child]);
    i = child;
  }
  place(h, i, e);
}

/* Tests: heap growths still to fail as an allocation failure would. */
static atomic_int failing_growths;

void reg_test_fail_expiry_growth(int n)
{
  atomic_store(&failing_growths, n);
}

static bool growth_fails(void)
{
  int n = atomic_load(&failing_growths);
  while (n > 0 && !atomic_compare_exchange_weak(&failing_growths, &n, n - 1))
    ;
  return n > 0;
}

void expiry_add(registry *r, reg_entry *e)
{
  reg_expiry *h = &r->expiry;
  if (h->n == h->cap) {
    size_t cap = h->cap ? 2 * h->cap : 256;
    reg_entry **v = cap > SIZE_MAX / sizeof *v || growth_fails()
                        ? NULL
                        : realloc(h->v, cap * sizeof *v);
    if (!v) {
      r->expiry_unindexed++; /* found by reg_expire's walk instead */
      return;
    }
    h->v = v;
    h->cap = cap;
  }
  h->n++;
  place(h, h->n - 1, e);
  sift_up(h, h->n - 1);
}

void expiry_remove(registry *r, reg_entry *e)
{
  reg_expiry *h = &r->expiry;
  if (!e->expiry_at) {
    if (e->expires_ms)
      r->expiry_unindexed--;
    return;
  }
  size_t i = e->expiry_at - 1;
  e->expiry_at = 0;
  reg_entry *last = h->v[--h->n];
  if (i != h->n) {
    place(h, i, last);
    if (i > 0 && sooner(last, h->v[(i - 1) / 2]))
      sift_up(h, i);
    else
      sift_down(h, i);
  }
  /* a burst gone (a million tensors expired): its memory too */
  if (h->cap > 256 && h->n < h->cap / 4) {
    reg_entry **v = realloc(h->v, h->cap / 2 * sizeof *v);
    if (v) {
      h->v = v;
      h->cap /= 2;
    }
  }
}

reg_entry *expiry_due(const registry *r, int64_t now_ms)
{
  const reg_expiry *h = &r->expiry;
  return h->n && h->v[0]->expires_ms <= now_ms ? h->v[0] : NULL;
}

void expiry_free(registry *r)
{
  free(r->expiry.v);
  r->expiry.v = NULL;
  r->expiry.n = r->expiry.cap = 0;
}
