/* test_staging.c: the caching pinned host allocator: size classes, reuse only
 * after events complete, the budget and its back-pressure, counters. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "engine.h"
#include "storage.h"
#include "staging.h"

static void setup(void)
{
  sim_config cfg = {.ndevices = 1, .mem_bytes = 256 << 20, .seed = 3};
  cr_assert_eq(sim_configure(&cfg, NULL), 0);
}

TestSuite(staging, .init = setup);

Test(staging, classes_hits_and_misses)
{
  staging_pool *p;
  cr_assert_eq(staging_create(&backend_sim, 128 << 20, &p, NULL), 0);
  staging_block *a, *b;
  cr_assert_eq(staging_acquire(p, 100 << 10, &a, NULL), 0);
  cr_assert_eq(a->size, 128 << 10, "rounded up to a power-of-two class");
  staging_release(p, a);
  cr_assert_eq(staging_acquire(p, 70 << 10, &b, NULL), 0);
  cr_assert_eq(b, a, "same class, served from the cache");
  staging_stats st;
  staging_get_stats(p, &st);
  cr_assert_eq(st.misses, 1);
  cr_assert_eq(st.hits, 1);
  cr_assert_eq(st.bytes_in_use, 128 << 10);
  cr_assert_eq(st.bytes_allocated, 128 << 10);
  staging_release(p, b);
  /* warm: a thousand acquisitions allocate nothing */
  for (int i = 0; i < 1000; i++) {
    cr_assert_eq(staging_acquire(p, 128 << 10, &a, NULL), 0);
    staging_release(p, a);
  }
  staging_get_stats(p, &st);
  cr_assert_eq(st.misses, 1);
  cr_assert_eq(st.bytes_in_use, 0);
  cr_assert_eq(st.bytes_cached, 128 << 10);
  tport_err e;
  cr_assert_eq(staging_acquire(p, 0, &a, &e), TPORT_INVALID_ARGUMENT);
  cr_assert_eq(staging_acquire(p, STAGING_MAX_BLOCK + 1, &a, &e), TPORT_INVALID_ARGUMENT);
  staging_destroy(p);
}

Test(staging, no_reuse_before_the_event_completes)
{
  staging_pool *p;
  cr_assert_eq(staging_create(&backend_sim, STAGING_MAX_BLOCK, &p, NULL), 0);
  be_stream *s = backend_sim.stream_default(0);
  staging_block *a, *b;
  cr_assert_eq(staging_acquire(p, STAGING_MAX_BLOCK, &a, NULL), 0);
  /* a slow op, then the event the block waits for */
  sim_set_delay(50000);
  void *dev;
  cr_assert_eq(backend_sim.alloc(0, 4096, &dev, NULL), 0);
  cr_assert_eq(backend_sim.memcpy_async(0, s, dev, a->ptr, 4096, BE_H2D, NULL), 0);
  /* probe right behind the copy, then the block's event: in stream order,
   * the probe completes no later than the event (recorded the other way
   * round, the probe could still be pending when the event was seen done:
   * a flake under load) */
  be_event *ev, *probe;
  cr_assert_eq(backend_sim.event_create(0, &probe, NULL), 0);
  cr_assert_eq(backend_sim.event_record(probe, s, NULL), 0);
  cr_assert_eq(backend_sim.event_create(0, &ev, NULL), 0);
  cr_assert_eq(backend_sim.event_record(ev, s, NULL), 0);
  cr_assert_eq(staging_add_event(a, &backend_sim, ev, NULL), 0);
  staging_release(p, a);
  /* the budget holds one block: the next acquisition waits for the copy */
  cr_assert_eq(staging_acquire(p, STAGING_MAX_BLOCK, &b, NULL), 0);
  cr_assert_eq(b, a);
  cr_assert(backend_sim.event_query(probe), "the block came back only after its copy ended");
  staging_stats st;
  staging_get_stats(p, &st);
  cr_assert_eq(st.waits, 1);
  cr_assert_eq(st.misses, 1, "never more pinned memory than the budget");
  staging_release(p, b);
  backend_sim.event_destroy(probe);
  sim_set_delay(0);
  backend_sim.stream_synchronize(s, NULL);
  backend_sim.free(0, dev);
  staging_destroy(p);
}

typedef struct {
  staging_pool *p;
  atomic_int got;
} waiter_ctx;

static void *waiter(void *arg)
{
  waiter_ctx *c = arg;
  staging_block *b;
  cr_assert_eq(staging_acquire(c->p, STAGING_MAX_BLOCK, &b, NULL), 0);
  atomic_store(&c->got, 1);
  staging_release(c->p, b);
  return NULL;
}

Test(staging, back_pressure_waits_for_a_release)
{
  waiter_ctx c = {0};
  cr_assert_eq(staging_create(&backend_cpu, STAGING_MAX_BLOCK, &c.p, NULL), 0);
  staging_block *held;
  cr_assert_eq(staging_acquire(c.p, STAGING_MAX_BLOCK, &held, NULL), 0);
  pthread_t t;
  pthread_create(&t, NULL, waiter, &c);
  usleep(50000);
  cr_assert_eq(atomic_load(&c.got), 0, "the budget is spent: the second caller waits");
  staging_release(c.p, held);
  pthread_join(t, NULL);
  cr_assert_eq(atomic_load(&c.got), 1);
  staging_stats st;
  staging_get_stats(c.p, &st);
  cr_assert_eq(st.bytes_allocated, STAGING_MAX_BLOCK);
  cr_assert_geq(st.waits, 1);
  staging_destroy(c.p);
}

Test(staging, other_classes_are_evicted_under_the_budget)
{
  staging_pool *p;
  cr_assert_eq(staging_create(&backend_cpu, STAGING_MAX_BLOCK, &p, NULL), 0);
  staging_block *a;
  cr_assert_eq(staging_acquire(p, STAGING_MAX_BLOCK / 2, &a, NULL), 0);
  staging_release(p, a);
  cr_assert_eq(staging_acquire(p, STAGING_MAX_BLOCK, &a, NULL), 0);
  staging_stats st;
  staging_get_stats(p, &st);
  cr_assert_eq(st.bytes_allocated, STAGING_MAX_BLOCK);
  cr_assert_eq(st.bytes_cached, 0);
  staging_release(p, a);
  staging_empty_cache(p);
  staging_get_stats(p, &st);
  cr_assert_eq(st.bytes_allocated, 0);
  staging_destroy(p);
}
