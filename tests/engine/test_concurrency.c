/* test_concurrency.c: ordering on sim devices with random delays.  Each
 * scenario runs many times as the engine does it and must always be right;
 * then with one ordering step switched off (engine_set_test_faults) and must
 * go wrong at least once: proof that the test sees a missing event. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "storage.h"

#define TRIALS 30

static const tport_device S0 = {TPORT_DEV_SIM, 0}, S1 = {TPORT_DEV_SIM, 1},
                          CPU = {TPORT_DEV_CPU, 0};

static void setup(void)
{
  sim_config cfg = {.ndevices = 2, .mem_bytes = 256 << 20, .max_delay_us = 3000, .seed = 11};
  cr_assert_eq(sim_configure(&cfg, NULL), 0);
}

static void teardown(void)
{
  engine_set_test_faults(0);
  engine_synchronize_all();
}

TestSuite(concurrency, .init = setup, .fini = teardown);

static tport_tensor *filled(tport_device d, int n, int32_t value)
{
  tport_tensor *t;
  cr_assert_eq(tensor_empty(d, TPORT_INT32, 1, (int64_t[]){n}, TPORT_MF_CONTIGUOUS, 0, &t, NULL),
               0);
  int32_t *v = malloc((size_t)n * 4);
  for (int i = 0; i < n; i++)
    v[i] = value + i;
  cr_assert_eq(tensor_write(t, v, (size_t)n * 4, NULL), 0);
  free(v);
  return t;
}

static bool holds(tport_tensor *t, int n, int32_t value)
{
  int32_t *v = malloc((size_t)n * 4);
  cr_assert_eq(tensor_read(t, v, (size_t)n * 4, NULL), 0);
  bool ok = true;
  for (int i = 0; i < n && ok; i++)
    ok = v[i] == value + i;
  free(v);
  return ok;
}

/* Several non_blocking H2D copies staged through the same pinned class. */
static int staging_reuse_failures(void)
{
  int failures = 0;
  enum { N = 8, LEN = 16 << 10 };
  for (int trial = 0; trial < TRIALS; trial++) {
    tport_tensor *dev[N];
    int32_t *host = malloc(LEN * 4);
    for (int k = 0; k < N; k++) {
      cr_assert_eq(
          tensor_empty(S0, TPORT_INT32, 1, (int64_t[]){LEN}, TPORT_MF_CONTIGUOUS, 0, &dev[k], NULL),
          0);
      for (int i = 0; i < LEN; i++)
        host[i] = k * 1000000 + i;
      tport_tensor *h;
      cr_assert_eq(
          tensor_wrap_host(host, LEN * 4, TPORT_INT32, 1, (int64_t[]){LEN}, NULL, 0, &h, NULL), 0);
      cr_assert_eq(tensor_copy_(dev[k], h, true, NULL), 0);
      tensor_release(h); /* the caller's buffer is free to change: it was staged */
    }
    free(host);
    for (int k = 0; k < N; k++) {
      failures += !holds(dev[k], LEN, k * 1000000);
      tensor_release(dev[k]);
    }
  }
  return failures;
}

Test(concurrency, staging_blocks_are_not_reused_early)
{
  cr_assert_eq(staging_reuse_failures(), 0);
  engine_set_test_faults(ENGINE_SKIP_STAGING_EVENT);
  cr_assert_gt(staging_reuse_failures(), 0, "without the block's event the test must see reuse");
}

/* A write to dst on sim:1's stream, then a D2D copy into dst from sim:0. */
static int dst_ready_failures(void)
{
  int failures = 0;
  enum { LEN = 4096 };
  for (int trial = 0; trial < TRIALS; trial++) {
    tport_tensor *dst = filled(S1, LEN, 0), *a = filled(S1, LEN, 100000),
                 *b = filled(S0, LEN, 200000);
    cr_assert_eq(tensor_copy_(dst, a, true, NULL), 0); /* kernel on sim:1 */
    cr_assert_eq(tensor_copy_(dst, b, true, NULL), 0); /* D2D on sim:0's stream */
    failures += !holds(dst, LEN, 200000);
    tensor_release(dst);
    tensor_release(a);
    tensor_release(b);
  }
  return failures;
}

Test(concurrency, device_to_device_waits_for_dst_ready)
{
  cr_assert_eq(dst_ready_failures(), 0);
  engine_set_test_faults(ENGINE_SKIP_DST_READY);
  cr_assert_gt(dst_ready_failures(), 0, "without dst_ready the earlier write must land last");
}

/* A non_blocking D2H into a pinned result, read through the engine at once. */
static int early_read_failures(void)
{
  int failures = 0;
  enum { LEN = 8192 };
  for (int trial = 0; trial < TRIALS; trial++) {
    /* a value of its own per trial: memory recycled from an earlier trial must
     * not look right to a read that comes too early */
    int32_t value = 300000 + trial * 10000;
    tport_tensor *d = filled(S0, LEN, value), *r;
    bool a;
    to_options o = {.has_device = true, .device = CPU, .non_blocking = true};
    cr_assert_eq(tensor_to(d, &o, &r, &a, NULL), 0);
    failures += !holds(r, LEN, value);
    /* with the fault on, r's storage has no event: drain the device before
     * freeing it, or the late copy would write into freed memory */
    engine_synchronize_all();
    tensor_release(r);
    tensor_release(d);
  }
  return failures;
}

Test(concurrency, non_blocking_results_are_safe_to_read)
{
  cr_assert_eq(early_read_failures(), 0);
  engine_set_test_faults(ENGINE_SKIP_RESULT_EVENT);
  cr_assert_gt(early_read_failures(), 0, "without the result's event a read must come too early");
}

/* Many threads, each with its own tensors, through every path at once. */
typedef struct {
  int id;
  int failures;
} worker_arg;

static void *worker(void *p)
{
  worker_arg *w = p;
  for (int i = 0; i < 20; i++) {
    int32_t base = w->id * 1000000 + i * 1000;
    tport_tensor *h = filled(CPU, 3000, base);
    bool a;
    tport_tensor *d0, *d1, *back;
    to_options o = {.has_device = true, .device = S0, .non_blocking = (i & 1) != 0};
    tensor_to(h, &o, &d0, &a, NULL);
    o.device = S1;
    tensor_to(d0, &o, &d1, &a, NULL);
    o.device = CPU;
    tensor_to(d1, &o, &back, &a, NULL);
    w->failures += !holds(back, 3000, base);
    tensor_release(back);
    tensor_release(d1);
    tensor_release(d0);
    tensor_release(h);
  }
  return NULL;
}

Test(concurrency, threads_share_devices_safely)
{
  sim_set_delay(300);
  pthread_t t[6];
  worker_arg w[6];
  for (int i = 0; i < 6; i++) {
    w[i] = (worker_arg){.id = i};
    pthread_create(&t[i], NULL, worker, &w[i]);
  }
  for (int i = 0; i < 6; i++) {
    pthread_join(t[i], NULL);
    cr_assert_eq(w[i].failures, 0, "thread %d", i);
  }
}

/* A copy from pinned caller memory (a region registered with the GPU
 * driver, read by the device directly) that fails after its copy was
 * enqueued must end that copy before it returns: the caller then releases
 * (and may unregister, unmap or reuse) the region.  Issue 20, finding 9.
 * ENGINE_FAIL_MARK fails the step after the enqueue. */
static int failed_pinned_copy_failures(void)
{
  int failures = 0;
  enum { LEN = 16 << 10 };
  for (int trial = 0; trial < TRIALS; trial++) {
    int32_t *host = malloc(LEN * 4);
    for (int i = 0; i < LEN; i++)
      host[i] = trial * 1000 + i;
    tport_tensor *dev, *h;
    cr_assert_eq(
        tensor_empty(S0, TPORT_INT32, 1, (int64_t[]){LEN}, TPORT_MF_CONTIGUOUS, 0, &dev, NULL), 0);
    cr_assert_eq(tensor_wrap_host_pinned(host, LEN * 4, TPORT_INT32, 1, (int64_t[]){LEN}, NULL, 0,
                                         &h, NULL),
                 0);
    engine_set_test_faults(ENGINE_FAIL_MARK);
    cr_assert_neq(tensor_copy_(dev, h, true, NULL), 0, "the injected failure did not happen");
    engine_set_test_faults(0);
    tensor_release(h);
    for (int i = 0; i < LEN; i++) /* the region's next use */
      host[i] = -1;
    engine_synchronize_all();
    failures += !holds(dev, LEN, trial * 1000); /* the copy read the region in time */
    tensor_release(dev);
    free(host);
  }
  return failures;
}

Test(concurrency, a_failed_copy_from_pinned_memory_ends_before_it_returns)
{
  cr_assert_eq(failed_pinned_copy_failures(), 0,
               "a failed copy read pinned memory after it returned");
}

/* Threads copying into parts of one pinned host tensor at once (a put's
 * chunks, landing on two workers), each marking its storage: once the
 * storage's event says done, every part has landed.  storage_mark recorded
 * its event before taking the storage's lock, so a mark preempted between
 * the two installed an event older than the one it replaced: the storage
 * looked done (and was freed, its block reused) under a queued copy.
 * ENGINE_SLOW_MARK opens that window wide at every mark. */
enum { MARK_THREADS = 4, MARK_PARTS = 16, MARK_PART = 2048, MARK_TRIALS = 40 };

typedef struct part_arg {
  tport_tensor *dst[MARK_PARTS], *src[MARK_PARTS];
  int rc;
} part_arg;

/* One thread's parts, one after another (a worker's chunks). */
static void *copy_parts(void *p)
{
  part_arg *a = p;
  for (int j = 0; j < MARK_PARTS && !a->rc; j++)
    a->rc = tensor_copy_(a->dst[j], a->src[j], true, NULL);
  return NULL;
}

static int concurrent_mark_failures(void)
{
  int failures = 0;
  enum { K = MARK_THREADS, P = MARK_PARTS, N = MARK_THREADS * MARK_PARTS * MARK_PART };
  for (int trial = 0; trial < MARK_TRIALS; trial++) {
    int32_t *host = calloc(N, 4);
    tport_tensor *whole;
    cr_assert_eq(tensor_wrap_host_pinned(host, N * 4, TPORT_INT32, 1, (int64_t[]){N}, NULL, 0,
                                         &whole, NULL),
                 0);
    cr_assert(whole->storage->flags & STORAGE_PINNED, "pinned: the copies are the stream's");
    part_arg a[K];
    pthread_t t[K];
    for (int k = 0; k < K; k++) {
      a[k].rc = 0;
      for (int j = 0; j < P; j++) {
        int part = k * P + j;
        a[k].src[j] = filled(S0, MARK_PART, part * 10000);
        cr_assert_eq(tensor_as_strided(whole, 1, (int64_t[]){MARK_PART}, (int64_t[]){1},
                                       (int64_t)part * MARK_PART, &a[k].dst[j], NULL),
                     0);
      }
    }
    for (int k = 0; k < K; k++)
      pthread_create(&t[k], NULL, copy_parts, &a[k]);
    for (int k = 0; k < K; k++) {
      pthread_join(t[k], NULL);
      cr_assert_eq(a[k].rc, 0);
    }
    /* what the storage's event says, read as the host reads pinned memory */
    cr_assert_eq(tensor_sync(whole, NULL), 0);
    bool ok = true;
    for (int part = 0; part < K * P && ok; part++)
      for (int i = 0; i < MARK_PART && ok; i++)
        ok = host[part * MARK_PART + i] == part * 10000 + i;
    failures += !ok;
    engine_synchronize_all(); /* before the host memory goes */
    for (int k = 0; k < K; k++)
      for (int j = 0; j < P; j++) {
        tensor_release(a[k].dst[j]);
        tensor_release(a[k].src[j]);
      }
    tensor_release(whole);
    free(host);
  }
  return failures;
}

Test(concurrency, a_storage_marked_by_threads_at_once_waits_for_every_copy)
{
  sim_set_delay(2000); /* the stream lags the marks */
  engine_set_test_faults(ENGINE_SLOW_MARK);
  cr_assert_eq(concurrent_mark_failures(), 0,
               "the storage's event said done while a copy into it was queued");
}
