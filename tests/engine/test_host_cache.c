/* test_host_cache.c: the caching allocator of large host blocks
 * (engine/host_cache.c): reuse, fit, limit, alignment, and that the cpu
 * device's storages go through it. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "engine.h"
#include "storage.h"
#include "host_cache.h"
#include "small_cache.h"

#define MIB ((size_t)1 << 20)

static host_cache_stats stats(void)
{
  host_cache_stats s;
  host_cache_get_stats(&s);
  return s;
}

static void reset(void)
{
  host_cache_set_limit(256 * MIB);
  host_cache_empty();
}

TestSuite(host_cache, .init = reset);

Test(host_cache, a_freed_block_serves_the_next_allocation_that_fits)
{
  host_cache_stats s0 = stats();
  char *a = host_cache_alloc(10 * MIB + 3);
  cr_assert_not_null(a);
  cr_assert_eq((uintptr_t)a % 256, 0);
  memset(a, 0xab, 10 * MIB + 3); /* all of it is ours */
  host_cache_free(a);
  cr_assert_eq(stats().cached_bytes, 12 * MIB, "rounded up to 2 MiB");
  char *b = host_cache_alloc(9 * MIB);
  cr_assert_eq(b, a, "reused");
  host_cache_stats s1 = stats();
  cr_assert_eq(s1.hits - s0.hits, 1);
  cr_assert_eq(s1.misses - s0.misses, 1);
  cr_assert_eq(s1.cached_bytes, 0);
  cr_assert_eq(s1.in_use_bytes - s0.in_use_bytes, 12 * MIB);
  host_cache_free(b);
}

Test(host_cache, a_block_much_bigger_than_asked_is_not_wasted)
{
  char *big = host_cache_alloc(64 * MIB);
  host_cache_free(big);
  char *small = host_cache_alloc(8 * MIB); /* 64 MiB for 8: over a quarter wasted */
  cr_assert_neq(small, big);
  cr_assert_eq(stats().cached_bytes, 64 * MIB);
  host_cache_free(small);
}

Test(host_cache, the_limit_holds_and_the_oldest_go_first)
{
  host_cache_set_limit(20 * MIB);
  char *a = host_cache_alloc(8 * MIB), *b = host_cache_alloc(8 * MIB),
       *c = host_cache_alloc(8 * MIB);
  host_cache_free(a);
  host_cache_free(b);
  cr_assert_eq(stats().cached_bytes, 16 * MIB);
  host_cache_free(c); /* 24 > 20: a (the oldest) goes */
  cr_assert_eq(stats().cached_bytes, 16 * MIB);
  char *x = host_cache_alloc(8 * MIB), *y = host_cache_alloc(8 * MIB);
  cr_assert((x == b || x == c) && (y == b || y == c) && x != y, "b and c were kept");
  host_cache_free(x);
  host_cache_free(y);
  char *huge = host_cache_alloc(40 * MIB); /* over the limit: never cached */
  host_cache_free(huge);
  cr_assert_leq(stats().cached_bytes, 20 * MIB);
  host_cache_set_limit(0);
  cr_assert_eq(stats().cached_bytes, 0);
}

static host_cache_stats small_stats(void)
{
  host_cache_stats s;
  small_cache_get_stats(&s);
  return s;
}

/* Small blocks (under 1 MiB) are not the large cache's: they are kept by
 * size class (engine/small_cache.c) and reused, aligned as the large. */
Test(host_cache, small_blocks_are_kept_by_size_class_and_reused)
{
  host_cache_stats s0 = stats(), m0 = small_stats();
  char *p = host_cache_alloc(1000);
  cr_assert_not_null(p);
  cr_assert_eq((uintptr_t)p % 256, 0);
  memset(p, 0x11, 1000);
  host_cache_free(p);
  host_cache_stats s1 = stats(), m1 = small_stats();
  cr_assert_eq(s1.hits + s1.misses, s0.hits + s0.misses, "not the large cache's business");
  cr_assert_eq(m1.misses - m0.misses, 1);
  cr_assert_geq(m1.cached_bytes, 1024, "kept: 1000 bytes in the 1 KiB class");
  cr_assert_eq(host_cache_alloc(900), p, "a size of the same class reuses it");
  cr_assert_eq(small_stats().hits - m1.hits, 1);
  host_cache_free(p);
  /* a larger class does not take it: 1000 bytes cannot hold 5000 */
  char *q = host_cache_alloc(5000);
  cr_assert_neq(q, p);
  memset(q, 0x22, 5000);
  host_cache_free(q);
  /* every size up to the large cache's start is served, within an eighth */
  for (size_t n = 1; n < MIB; n = n * 3 / 2 + 1) {
    char *b = host_cache_alloc(n);
    cr_assert_not_null(b);
    cr_assert_eq((uintptr_t)b % 256, 0);
    memset(b, 0x33, n); /* all of it is ours (ASan checks) */
    host_cache_free(b);
  }
  cr_assert_null(host_cache_alloc(SIZE_MAX - 10), "an absurd size is refused, not wrapped");
}

Test(host_cache, small_blocks_keep_at_most_their_limit_and_go_back_when_emptied)
{
  host_cache_set_limit(8 * MIB); /* the small blocks: an eighth, 1 MiB */
  cr_assert_eq(small_stats().limit_bytes, MIB);
  enum { N = 64 };
  void *b[N];
  for (int i = 0; i < N; i++) {
    b[i] = host_cache_alloc(64 * 1024);
    cr_assert_not_null(b[i]);
  }
  for (int i = 0; i < N; i++)
    host_cache_free(b[i]);
  host_cache_stats m = small_stats();
  cr_assert_leq(m.cached_bytes, MIB, "%zu bytes cached over a 1 MiB limit", m.cached_bytes);
  cr_assert_geq(m.cached_bytes, MIB / 2, "what fits is kept");
  engine_release_idle(); /* what tportd does once idle */
  cr_assert_eq(small_stats().cached_bytes, 0);
  host_cache_set_limit(0);
  void *p = host_cache_alloc(300);
  host_cache_free(p);
  cr_assert_eq(small_stats().cached_bytes, 0, "a limit of 0 keeps nothing");
}

/* A cpu storage of a small tensor comes from the small blocks' cache: a
 * burst freed serves the next burst (no fresh pages from malloc). */
Test(host_cache, small_cpu_storages_are_cached)
{
  host_cache_stats m0 = small_stats();
  for (int i = 0; i < 3; i++) {
    tport_tensor *t;
    tport_err err;
    int64_t n = 4096;
    cr_assert_eq(tensor_empty((tport_device){TPORT_DEV_CPU, 0}, TPORT_UINT8, 1, &n,
                              TPORT_MF_CONTIGUOUS, 0, &t, &err),
                 0, "%s", err.msg);
    tensor_release(t);
    engine_synchronize_all();
  }
  host_cache_stats m1 = small_stats();
  cr_assert_eq(m1.misses - m0.misses, 1, "one 4 KiB block allocated");
  cr_assert_eq(m1.hits - m0.hits, 2, "and reused twice");
}

Test(host_cache, cpu_storages_are_cached)
{
  host_cache_stats s0 = stats();
  for (int i = 0; i < 3; i++) {
    tport_tensor *t;
    tport_err err;
    int64_t n = 3 * (int64_t)MIB;
    cr_assert_eq(tensor_empty((tport_device){TPORT_DEV_CPU, 0}, TPORT_FLOAT32, 1, &n,
                              TPORT_MF_CONTIGUOUS, 0, &t, &err),
                 0, "%s", err.msg);
    tensor_release(t);
    engine_synchronize_all(); /* frees deferred storages */
  }
  host_cache_stats s1 = stats();
  cr_assert_eq(s1.misses - s0.misses, 1, "one 12 MiB block mapped");
  cr_assert_eq(s1.hits - s0.hits, 2, "and reused twice");
}

/* ---- the pinned cache (the cpu storages made with STORAGE_PINNED) */

static int64_t sim_host_allocs(void)
{
  return backend_stat(&backend_sim, "sim_host_allocs");
}

static void with_sim(void)
{
  sim_config cfg = {.ndevices = 1, .mem_bytes = 256 << 20, .seed = 1};
  cr_assert_eq(sim_configure(&cfg, NULL), 0);
  pinned_cache_set_limit(64 * MIB);
  pinned_cache_empty();
}

/* A non_blocking copy from a device pins its result (as PyTorch does); a
 * fresh pinned block per copy cost 100+ ms per 256 MiB on an H200.  The
 * second and later copies of the same size reuse the first one's block. */
Test(host_cache, pinned_results_of_non_blocking_copies_reuse_their_blocks, .init = with_sim)
{
  int64_t n = 3 * MIB / 4 + 5, sizes[1] = {n};
  tport_tensor *d;
  tport_err e;
  cr_assert_eq(tensor_empty((tport_device){TPORT_DEV_SIM, 0}, TPORT_FLOAT32, 1, sizes,
                            TPORT_MF_CONTIGUOUS, 0, &d, &e),
               0);
  float *v = malloc((size_t)n * 4);
  for (int64_t i = 0; i < n; i++)
    v[i] = (float)i;
  cr_assert_eq(tensor_write(d, v, (size_t)n * 4, &e), 0);
  to_options o = {.has_device = true, .device = {TPORT_DEV_CPU, 0}, .non_blocking = true};
  int64_t allocs = 0;
  for (int k = 0; k < 5; k++) {
    if (k == 1)
      allocs = sim_host_allocs();
    tport_tensor *h;
    bool aliased;
    cr_assert_eq(tensor_to(d, &o, &h, &aliased, &e), 0, "%s", e.msg);
    cr_assert(h->storage->flags & STORAGE_PINNED);
    cr_assert_eq(tensor_sync(h, &e), 0);
    cr_assert_eq(memcmp(h->storage->ptr, v, (size_t)n * 4), 0);
    tensor_release(h);
  }
  cr_assert_eq(sim_host_allocs(), allocs, "pinned memory allocated for 4 warm copies");
  host_cache_stats st;
  pinned_cache_get_stats(&st);
  cr_assert_geq(st.hits, 4);
  cr_assert_eq(st.in_use_bytes, 0);
  cr_assert_eq(st.cached_bytes, 4 * MIB, "3 MiB + 20 bytes, rounded to 2 MiB steps");
  free(v);
  tensor_release(d);
}

Test(host_cache, the_pinned_cache_keeps_at_most_its_limit, .init = with_sim)
{
  pinned_cache_set_limit(2 * MIB);
  void *a = pinned_cache_alloc(MIB), *b = pinned_cache_alloc(MIB + 1), *c = pinned_cache_alloc(100);
  cr_assert(a && b && c);
  memset(a, 1, MIB);
  memset(b, 2, MIB + 1);
  memset(c, 3, 100);
  int64_t allocs = sim_host_allocs();
  pinned_cache_free(a);
  pinned_cache_free(b); /* 1 MiB + 64 KiB: a is dropped to keep 2 MiB */
  pinned_cache_free(c); /* 64 KiB */
  host_cache_stats st;
  pinned_cache_get_stats(&st);
  cr_assert_leq(st.cached_bytes, 2 * MIB);
  cr_assert_eq(st.cached_bytes, MIB + 128 * 1024);
  void *again = pinned_cache_alloc(MIB + 100);
  cr_assert_eq(again, b, "the block that fits is reused");
  cr_assert_eq(sim_host_allocs(), allocs);
  pinned_cache_free(again);
  pinned_cache_empty();
  pinned_cache_get_stats(&st);
  cr_assert_eq(st.cached_bytes, 0);
}
