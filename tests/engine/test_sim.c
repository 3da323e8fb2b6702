/* test_sim.c: the device backend table's contract, run against every backend
 * with devices here (cpu, sim, and cuda where present), and the engine's
 * transfers, D2D paths and managed moves on sim devices. */
#include <complex.h>
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "conformance.h"
#include "engine.h"
#include "storage.h"
#include "staging.h"

static void setup(void)
{
  sim_config cfg = {.ndevices = 3, .mem_bytes = 64 << 20, .max_delay_us = 200, .seed = 7};
  tport_err e;
  cr_assert_eq(sim_configure(&cfg, &e), 0, "%s", e.msg);
}

static void teardown(void)
{
  engine_synchronize_all();
}

TestSuite(sim, .init = setup, .fini = teardown);

Test(sim, conformance_every_backend)
{
  conformance(&backend_cpu);
  conformance(&backend_sim);
  conformance(&backend_cuda);
}

static void deref_device_pointer(void)
{
  void *dev;
  backend_sim.alloc(0, 4096, &dev, NULL);
  volatile char c = *(volatile char *)dev; /* must fault: device memory */
  (void)c;
}

Test(sim, device_memory_faults_on_the_host, .signal = SIGSEGV)
{
  deref_device_pointer();
}

/* Device memory is never written with a memcpy from the host: a small
 * put's fast path (tensor_write_host_bytes) leaves it to tensor_copy_. */
Test(sim, host_bytes_are_not_written_into_device_memory)
{
  int64_t n = 64;
  tport_tensor *d;
  tport_err e;
  cr_assert_eq(tensor_empty((tport_device){TPORT_DEV_SIM, 0}, TPORT_UINT8, 1, &n,
                            TPORT_MF_CONTIGUOUS, 0, &d, &e),
               0, "%s", e.msg);
  uint8_t bytes[64] = {7};
  cr_assert_not(tensor_write_host_bytes(d, 0, bytes, sizeof bytes)); /* no SIGSEGV either */
  tensor_release(d);
}

Test(sim, pointers_are_checked)
{
  void *d0, *d1;
  tport_err e;
  cr_assert_eq(backend_sim.alloc(0, 4096, &d0, NULL), 0);
  cr_assert_eq(backend_sim.alloc(1, 4096, &d1, NULL), 0);
  char host[64];
  be_stream *s0 = backend_sim.stream_default(0);
  /* a host pointer given as device memory */
  cr_assert_eq(backend_sim.memcpy_async(0, s0, host, d0, 64, BE_D2D, &e), TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(e.msg, "not sim device memory"), "%s", e.msg);
  /* past the end of an allocation */
  cr_assert_eq(backend_sim.memcpy_async(0, s0, d0, host, 8192, BE_H2D, &e), TPORT_INVALID_ARGUMENT);
  /* device memory given as host */
  cr_assert_eq(backend_sim.memcpy_async(0, s0, d0, d0, 64, BE_H2D, &e), TPORT_INVALID_ARGUMENT);
  /* another device's memory without peer access */
  cr_assert_eq(backend_sim.memcpy_async(0, s0, d1, d0, 64, BE_D2D, &e), TPORT_FAILED_PRECONDITION);
  cr_assert(strstr(e.msg, "peer access 0->1 is not enabled"), "%s", e.msg);
  cr_assert_eq(backend_sim.enable_peer_access(0, 1, &e), 0);
  cr_assert_eq(backend_sim.memcpy_async(0, s0, d1, d0, 64, BE_D2D, &e), 0);
  /* without peer access the driver path still works */
  cr_assert_eq(backend_sim.memcpy_peer_async(0, d0, 1, d1, 64, s0, &e), 0);
  backend_sim.stream_synchronize(s0, NULL);
  sim_set_peer_possible(0, 2, false);
  cr_assert_not(backend_sim.can_access_peer(0, 2));
  cr_assert_eq(backend_sim.enable_peer_access(0, 2, &e), TPORT_FAILED_PRECONDITION);
  backend_sim.free(0, d0);
  backend_sim.free(1, d1);
}

Test(sim, memory_is_bounded)
{
  void *p;
  tport_err e;
  cr_assert_eq(backend_sim.alloc(0, (size_t)65 << 20, &p, &e), TPORT_RESOURCE_EXHAUSTED);
  cr_assert(strstr(e.msg, "out of memory"), "%s", e.msg);
  cr_assert_eq(backend_sim.alloc_managed(0, (size_t)65 << 20, &p, &e), TPORT_RESOURCE_EXHAUSTED,
               "managed memory never exceeds what the device has free");
  cr_assert_eq(sim_bytes_in_use(0), 0);
}

static tport_tensor *host_seq(tport_dtype dt, int n, const int64_t *sz)
{
  tport_tensor *t;
  cr_assert_eq(
      tensor_empty((tport_device){TPORT_DEV_CPU, 0}, dt, n, sz, TPORT_MF_CONTIGUOUS, 0, &t, NULL),
      0);
  int64_t numel = tensor_numel(t);
  for (int64_t i = 0; i < numel; i++) {
    if (dt == TPORT_FLOAT32)
      ((float *)t->storage->ptr)[i] = (float)i;
    else if (dt == TPORT_INT32)
      ((int32_t *)t->storage->ptr)[i] = (int32_t)i;
  }
  return t;
}

static tport_tensor *to_dev(tport_tensor *t, tport_device d, bool nb)
{
  to_options o = {.has_device = true, .device = d, .non_blocking = nb};
  tport_tensor *r;
  bool a;
  tport_err e;
  cr_assert_eq(tensor_to(t, &o, &r, &a, &e), 0, "%s", e.msg);
  return r;
}

static void check_seq(tport_tensor *t)
{
  int64_t n = tensor_numel(t);
  float *v = malloc((size_t)n * 4);
  tport_err e;
  cr_assert_eq(tensor_read(t, v, (size_t)n * 4, &e), 0, "%s", e.msg);
  for (int64_t i = 0; i < n; i++)
    cr_assert_eq(v[i], (float)i, "element %lld", (long long)i);
  free(v);
}

Test(sim, round_trips_through_every_path)
{
  tport_device s0 = {TPORT_DEV_SIM, 0}, s1 = {TPORT_DEV_SIM, 1}, s2 = {TPORT_DEV_SIM, 2};
  sim_set_peer_possible(0, 2, false);
  sim_set_peer_possible(2, 0, false);
  for (int nb = 0; nb < 2; nb++) {
    /* 12 MiB: several staging chunks */
    tport_tensor *h = host_seq(TPORT_FLOAT32, 2, (int64_t[]){3 << 10, 1 << 10});
    tport_tensor *a = to_dev(h, s0, nb); /* H2D, staged */
    tport_tensor *b = to_dev(a, s1, nb); /* D2D with peer access */
    tport_tensor *c = to_dev(b, s2, nb); /* D2D peer 1->2 */
    tport_tensor *d = to_dev(c, s0, nb); /* 2->0: no peer access, driver copy */
    tport_tensor *back = to_dev(d, (tport_device){TPORT_DEV_CPU, 0}, nb); /* D2H (pinned when nb) */
    if (nb)
      cr_assert(back->storage->flags & STORAGE_PINNED, "non_blocking D2H pins the result");
    check_seq(back);
    check_seq(d);
    tensor_release(back);
    tensor_release(d);
    tensor_release(c);
    tensor_release(b);
    tensor_release(a);
    tensor_release(h);
  }
}

/* complex -> bool is true when either part is nonzero, NaN included (PyTorch
 * 2.x; 1.13 read the real part alone), wherever the conversion runs: on the
 * device (a kernel of the sim stream), or on either side of a transfer
 * (non_blocking picks which), through a conj view too. */
Test(sim, complex_to_bool_looks_at_both_parts)
{
  static const float complex in[] = {CMPLXF(0, 1),     CMPLXF(0, 0),        CMPLXF(1, 0),
                                     CMPLXF(-0.0f, 0), CMPLXF(0, -2),       CMPLXF(NAN, 0),
                                     CMPLXF(0, NAN),   CMPLXF(-0.0f, -0.0f)};
  static const uint8_t want[] = {1, 0, 1, 0, 1, 1, 1, 0};
  enum { N = sizeof want };
  const tport_device s0 = {TPORT_DEV_SIM, 0}, cpu = {TPORT_DEV_CPU, 0};
  tport_tensor *h, *hc;
  cr_assert_eq(
      tensor_empty(cpu, TPORT_COMPLEX64, 1, (int64_t[]){N}, TPORT_MF_CONTIGUOUS, 0, &h, NULL), 0);
  memcpy(h->storage->ptr, in, sizeof in);
  cr_assert_eq(tensor_conj_view(h, &hc, NULL), 0);
  for (int nb = 0; nb < 2; nb++)
    for (int conj = 0; conj < 2; conj++) {
      tport_tensor *src = conj ? hc : h;
      const to_options to_bool = {.has_dtype = true, .dtype = TPORT_BOOL, .non_blocking = nb};
      to_options up = to_bool, down = to_bool;
      up.has_device = down.has_device = true;
      up.device = s0;
      down.device = cpu;
      tport_tensor *d = to_dev(src, s0, nb), *r[3] = {NULL, NULL, NULL};
      bool a;
      tport_err e;
      cr_assert_eq(tensor_to(src, &up, &r[0], &a, &e), 0, "%s", e.msg);    /* host -> sim:0 */
      cr_assert_eq(tensor_to(d, &to_bool, &r[1], &a, &e), 0, "%s", e.msg); /* on sim:0 */
      cr_assert_eq(tensor_to(d, &down, &r[2], &a, &e), 0, "%s", e.msg);    /* sim:0 -> host */
      static const char *const how[] = {"host -> sim:0", "on sim:0", "sim:0 -> host"};
      for (int k = 0; k < 3; k++) {
        uint8_t got[N];
        cr_assert_eq(tensor_read(r[k], got, sizeof got, &e), 0, "%s", e.msg);
        for (int i = 0; i < N; i++)
          cr_assert_eq(got[i], want[i], "%s, nb %d, conj %d: element %d (%g, %g): %u, want %u",
                       how[k], nb, conj, i, crealf(in[i]), cimagf(in[i]), got[i], want[i]);
        tensor_release(r[k]);
      }
      tensor_release(d);
    }
  tensor_release(hc);
  tensor_release(h);
}

Test(sim, non_contiguous_transfers_use_temporaries)
{
  tport_device s0 = {TPORT_DEV_SIM, 0}, s2 = {TPORT_DEV_SIM, 2};
  sim_set_peer_possible(0, 2, false);
  tport_tensor *h = host_seq(TPORT_FLOAT32, 2, (int64_t[]){40, 30}), *ht;
  cr_assert_eq(tensor_as_strided(h, 2, (int64_t[]){30, 40}, (int64_t[]){1, 30}, 0, &ht, NULL), 0);
  for (int nb = 0; nb < 2; nb++) {
    /* a transposed host view into a contiguous device tensor of another dtype */
    tport_tensor *d;
    cr_assert_eq(
        tensor_empty(s0, TPORT_FLOAT64, 2, (int64_t[]){30, 40}, TPORT_MF_CONTIGUOUS, 0, &d, NULL),
        0);
    tport_err e;
    cr_assert_eq(tensor_copy_(d, ht, nb, &e), 0, "%s", e.msg);
    /* device -> device without peer access and with a conversion */
    tport_tensor *d2;
    cr_assert_eq(
        tensor_empty(s2, TPORT_INT32, 2, (int64_t[]){30, 40}, TPORT_MF_CONTIGUOUS, 0, &d2, NULL),
        0);
    tport_tensor *d2t;
    cr_assert_eq(tensor_as_strided(d2, 2, (int64_t[]){30, 40}, (int64_t[]){1, 30}, 0, &d2t, NULL),
                 0);
    cr_assert_eq(tensor_copy_(d2t, d, nb, &e), 0, "%s", e.msg);
    int32_t v[1200];
    cr_assert_eq(tensor_read(d2t, v, sizeof v, &e), 0, "%s", e.msg);
    for (int i = 0; i < 30; i++)
      for (int j = 0; j < 40; j++)
        cr_assert_eq(v[i * 40 + j], j * 30 + i);
    tensor_release(d2t);
    tensor_release(d2);
    tensor_release(d);
  }
  tensor_release(ht);
  tensor_release(h);
}

Test(sim, managed_to_device_is_a_move)
{
  tport_device s0 = {TPORT_DEV_SIM, 0}, s1 = {TPORT_DEV_SIM, 1}, cpu = {TPORT_DEV_CPU, 0};
  tport_tensor *m;
  tport_err e;
  cr_assert_eq(tensor_empty(s0, TPORT_INT32, 1, (int64_t[]){1000}, TPORT_MF_CONTIGUOUS,
                            STORAGE_MANAGED, &m, &e),
               0, "%s", e.msg);
  int32_t in[1000];
  for (int i = 0; i < 1000; i++)
    in[i] = i * 3;
  cr_assert_eq(tensor_write(m, in, sizeof in, NULL), 0);
  void *ptr = m->storage->ptr;
  tport_tensor *r;
  bool a;
  to_options o = {.has_device = true, .device = s1};
  cr_assert_eq(tensor_to(m, &o, &r, &a, &e), 0, "%s", e.msg);
  cr_assert(a && r == m && r->storage->ptr == ptr, "a move, not a copy");
  cr_assert(tensor_device(r).type == TPORT_DEV_SIM && tensor_device(r).index == 1);
  tensor_release(r);
  o.device = cpu;
  cr_assert_eq(tensor_to(m, &o, &r, &a, &e), 0);
  cr_assert(a && tensor_device(m).type == TPORT_DEV_CPU);
  cr_assert(memcmp(m->storage->ptr, in, sizeof in) == 0, "host-readable after a blocking move");
  tensor_release(r);
  /* copy=true still copies; a dtype change copies */
  o = (to_options){.has_device = true, .device = s0, .copy = true};
  cr_assert_eq(tensor_to(m, &o, &r, &a, &e), 0);
  cr_assert_not(a);
  tensor_release(r);
  o = (to_options){.has_device = true, .device = s0, .has_dtype = true, .dtype = TPORT_INT64};
  cr_assert_eq(tensor_to(m, &o, &r, &a, &e), 0);
  cr_assert_not(a);
  int64_t out[1000];
  cr_assert_eq(tensor_read(r, out, sizeof out, NULL), 0);
  for (int i = 0; i < 1000; i++)
    cr_assert_eq(out[i], i * 3);
  tensor_release(r);
  tensor_release(m);
  engine_synchronize_all();
  cr_assert_eq(sim_bytes_in_use(0), 0);
}

/* The end of a deferred-free case: the copy's result right, and once the
 * work is done nothing deferred or left on the device. */
static void settle_deferred(tport_tensor *back, tport_tensor *h)
{
  check_seq(back);
  tensor_release(back);
  tensor_release(h);
  sim_set_delay(0);
  engine_synchronize_all();
  cr_assert_eq(storage_deferred_count(), 0);
  cr_assert_eq(sim_bytes_in_use(0), 0, "nothing leaked on the device");
}

Test(sim, freed_while_in_use_is_deferred)
{
  tport_device s0 = {TPORT_DEV_SIM, 0};
  sim_set_delay(20000); /* 20 ms per op: the copy is still queued when we release */
  tport_tensor *h = host_seq(TPORT_FLOAT32, 1, (int64_t[]){1 << 16});
  tport_tensor *d = to_dev(h, s0, true);
  tport_tensor *back = to_dev(d, (tport_device){TPORT_DEV_CPU, 0}, true);
  tensor_release(d); /* still being read by the D2H copy */
  cr_assert_geq(storage_deferred_count(), 1, "the storage waits for the copy reading it");
  settle_deferred(back, h);
}

/* storage_reap frees what waited for its device work without holding the
 * graveyard's lock: nng's threads put lent replies' storages there
 * (storage_release_deferred) and must not wait behind a reaper that is
 * synchronizing a device or freeing pinned memory (found by review: the
 * reaper held the lock through event_synchronize). */
static void *reap_waiting(void *arg)
{
  (void)arg;
  storage_reap(true);
  return NULL;
}

/* whether the device work on t's storage has finished */
static bool work_done(tport_tensor *t)
{
  tport_storage *st = t->storage;
  pthread_mutex_lock(&st->mu);
  bool done = !st->ev || st->ev_be->event_query(st->ev);
  pthread_mutex_unlock(&st->mu);
  return done;
}

Test(sim, a_release_to_the_graveyard_does_not_wait_for_a_reaper)
{
  tport_device s0 = {TPORT_DEV_SIM, 0};
  sim_set_delay_range(400000, 400000); /* 400 ms per op */
  tport_tensor *h = host_seq(TPORT_FLOAT32, 1, (int64_t[]){1 << 10});
  tport_tensor *d = to_dev(h, s0, true);
  tport_tensor *back = to_dev(d, (tport_device){TPORT_DEV_CPU, 0}, true);
  tensor_release(d); /* its storage waits in the graveyard for the D2H copy */
  cr_assert_geq(storage_deferred_count(), 1);
  tport_tensor *x = host_seq(TPORT_FLOAT32, 1, (int64_t[]){1 << 10});
  tport_storage *st = storage_retain(x->storage);
  tensor_release(x);
  pthread_t t;
  pthread_create(&t, NULL, reap_waiting, NULL);
  usleep(50000); /* the reaper waits for the copy by now */
  storage_release_deferred(st); /* the last reference: into the graveyard */
  /* the copy the reaper waits for (800 ms from its start) is still running:
   * the release did not wait for the reaper */
  bool copy_done = work_done(back);
  pthread_join(t, NULL);
  cr_expect_not(copy_done, "a release to the graveyard waited for the reaper's event_synchronize");
  settle_deferred(back, h);
}

Test(sim, fences_mark_a_point_in_a_series_of_copies)
{
  tport_device s0 = {TPORT_DEV_SIM, 0};
  tport_tensor *h = host_seq(TPORT_FLOAT32, 1, (int64_t[]){1 << 16}), *d;
  tport_err e;
  d = to_dev(h, s0, false);
  const backend_ops *be;
  be_event *none;
  cr_assert_eq(storage_fence(h->storage, &be, &none, &e), 0);
  cr_assert_null(none, "nothing pending: no fence");
  /* two async copies into one pinned tensor; a fence after the first */
  tport_tensor *p;
  cr_assert_eq(tensor_empty((tport_device){TPORT_DEV_CPU, 0}, TPORT_FLOAT32, 1, (int64_t[]){1 << 16},
                            TPORT_MF_CONTIGUOUS, STORAGE_PINNED, &p, &e), 0);
  sim_set_delay_range(20000, 20000);
  tport_tensor *pv1, *pv2, *dv1, *dv2;
  cr_assert_eq(tensor_byte_view(p, 0, 1 << 17, &pv1, &e), 0);
  cr_assert_eq(tensor_byte_view(p, 1 << 17, 1 << 17, &pv2, &e), 0);
  cr_assert_eq(tensor_byte_view(d, 0, 1 << 17, &dv1, &e), 0);
  cr_assert_eq(tensor_byte_view(d, 1 << 17, 1 << 17, &dv2, &e), 0);
  cr_assert_eq(tensor_copy_(pv1, dv1, true, &e), 0, "%s", e.msg);
  be_event *f1;
  cr_assert_eq(storage_fence(p->storage, &be, &f1, &e), 0);
  cr_assert_not_null(f1);
  cr_assert_eq(tensor_copy_(pv2, dv2, true, &e), 0, "%s", e.msg);
  cr_assert_eq(be->event_synchronize(f1, &e), 0);
  /* after the first fence, the first half is there */
  const float *v = p->storage->ptr;
  for (int i = 0; i < 1 << 15; i++)
    cr_assert_eq(v[i], (float)i);
  be->event_destroy(f1);
  sim_set_delay(0);
  check_seq(p);
  tensor_release(pv1);
  tensor_release(pv2);
  tensor_release(dv1);
  tensor_release(dv2);
  tensor_release(p);
  tensor_release(d);
  tensor_release(h);
}

static void nothing(void *arg) {}

/* CUDA refuses an event recorded on a stream of another device and a kernel
 * launched for one device on a stream of another
 * (cudaErrorInvalidResourceHandle); sim must refuse them too, or an engine
 * that mixes devices up passes here and fails first on a GPU. */
Test(sim, events_and_kernels_stay_on_their_device)
{
  be_stream *s0 = backend_sim.stream_default(0), *s1 = backend_sim.stream_default(1), *s0b;
  tport_err e;
  be_event *ev1, *none;
  cr_assert_eq(backend_sim.event_create(3, &none, &e), TPORT_INVALID_ARGUMENT, "no sim:3");
  cr_assert_eq(backend_sim.event_create(1, &ev1, &e), 0, "%s", e.msg);
  cr_assert_eq(backend_sim.event_record(ev1, s0, &e), TPORT_INTERNAL);
  cr_assert(strstr(e.msg, "cudaEventRecord") && strstr(e.msg, "cudaErrorInvalidResourceHandle") &&
                strstr(e.msg, "an event of sim:1 used on sim:0"),
            "%s", e.msg);
  cr_assert_eq(backend_sim.stream_create(0, &s0b, &e), 0);
  cr_assert_eq(backend_sim.event_record(ev1, s0b, &e), TPORT_INTERNAL, "any stream of sim:0");
  cr_assert(backend_sim.event_query(ev1), "a refused record leaves the event never recorded");
  /* on its own device's stream it records; another device may wait for it */
  sim_set_delay_range(20000, 20000);
  cr_assert_eq(backend_sim.launch_host_func(s1, nothing, NULL, &e), 0);
  cr_assert_eq(backend_sim.event_record(ev1, s1, &e), 0, "%s", e.msg);
  cr_assert_not(backend_sim.event_query(ev1), "pending behind a 20 ms op");
  cr_assert_eq(backend_sim.stream_wait_event(s0b, ev1, &e), 0, "cross-device waits are CUDA's");
  cr_assert_eq(backend_sim.stream_synchronize(s0b, &e), 0);
  cr_assert(backend_sim.event_query(ev1), "s0b waited for the event");
  sim_set_delay(0);
  backend_sim.event_destroy(ev1);

  /* a kernel for sim:0 on a stream of sim:1 (with peer access on, so that
   * only the stream is wrong), then on sim:0's own streams */
  void *a, *b;
  cr_assert_eq(backend_sim.alloc(0, 4096, &a, &e), 0);
  cr_assert_eq(backend_sim.alloc(0, 4096, &b, &e), 0);
  cr_assert_eq(backend_sim.enable_peer_access(1, 0, &e), 0);
  int64_t shape[1] = {1024}, sd[1] = {4}, ss[1] = {4};
  const int64_t *strides[2] = {sd, ss};
  plan p;
  plan_build(&p, 1, shape, 2, strides);
  cr_assert_eq(backend_sim.copy_kernel(0, s1, &p, a, TPORT_FLOAT32, b, TPORT_INT32, 0, &e),
               TPORT_INTERNAL);
  cr_assert(strstr(e.msg, "cudaLaunchKernel") && strstr(e.msg, "cudaErrorInvalidResourceHandle") &&
                strstr(e.msg, "a stream of sim:1 used on sim:0"),
            "%s", e.msg);
  cr_assert_eq(backend_sim.copy_kernel(1, s0b, &p, a, TPORT_FLOAT32, b, TPORT_INT32, 0, &e),
               TPORT_INTERNAL, "a created stream of sim:0 is not sim:1's either");
  cr_assert_eq(backend_sim.copy_kernel(0, s0, &p, a, TPORT_FLOAT32, b, TPORT_INT32, 0, &e), 0, "%s",
               e.msg);
  cr_assert_eq(backend_sim.copy_kernel(0, s0b, &p, a, TPORT_FLOAT32, b, TPORT_INT32, 0, &e), 0,
               "%s", e.msg);
  cr_assert_eq(backend_sim.copy_kernel(1, s1, &p, a, TPORT_FLOAT32, b, TPORT_INT32, 0, &e), 0,
               "sim:1 reaches sim:0's memory with peer access: %s", e.msg);
  backend_sim.stream_destroy(s0b);
  backend_sim.stream_synchronize(s0, NULL);
  backend_sim.stream_synchronize(s1, NULL);
  backend_sim.free(0, a);
  backend_sim.free(0, b);
}

/* The engine's paths between devices record each event on a stream of the
 * event's own device and launch each kernel on its device's stream; with the
 * checks above, a path that mixed them would fail here: converting copies
 * with peer access (a kernel on the source's stream writing the peer's
 * memory), conj/neg fixed up after a byte copy (a kernel on the
 * destination's device), and without peer access (temporaries), blocking and
 * not, with delays that make a missing wait show. */
Test(sim, copies_between_devices_keep_work_on_its_device)
{
  tport_device s0 = {TPORT_DEV_SIM, 0}, s1 = {TPORT_DEV_SIM, 1}, s2 = {TPORT_DEV_SIM, 2};
  sim_set_peer_possible(1, 2, false);
  sim_set_peer_possible(2, 1, false);
  enum { R = 40, C = 30 };
  for (int nb = 0; nb < 2; nb++) {
    tport_tensor *h = host_seq(TPORT_FLOAT32, 2, (int64_t[]){R, C});
    tport_tensor *a = to_dev(h, s0, nb), *b, *bt, *c, *n, *cn;
    tport_err e;
    /* sim:0 -> sim:1, float32 -> float64 into a transposed view: peer kernel */
    cr_assert_eq(
        tensor_empty(s1, TPORT_FLOAT64, 2, (int64_t[]){C, R}, TPORT_MF_CONTIGUOUS, 0, &b, &e), 0);
    cr_assert_eq(tensor_as_strided(b, 2, (int64_t[]){R, C}, (int64_t[]){1, R}, 0, &bt, &e), 0);
    cr_assert_eq(tensor_copy_(bt, a, nb, &e), 0, "%s", e.msg);
    /* sim:1 -> sim:2 without peer access, converting, from a negated view */
    cr_assert_eq(tensor_neg_view(bt, &n, &e), 0);
    cr_assert_eq(
        tensor_empty(s2, TPORT_INT32, 2, (int64_t[]){R, C}, TPORT_MF_CONTIGUOUS, 0, &c, &e), 0);
    cr_assert_eq(tensor_copy_(c, n, nb, &e), 0, "%s", e.msg);
    /* sim:2 -> sim:0, same dtype (a byte copy) from a negated view: the sign
     * is applied afterwards by a kernel on sim:0 */
    cr_assert_eq(tensor_neg_view(c, &cn, &e), 0);
    tport_tensor *back;
    cr_assert_eq(
        tensor_empty(s0, TPORT_INT32, 2, (int64_t[]){R, C}, TPORT_MF_CONTIGUOUS, 0, &back, &e), 0);
    cr_assert_eq(tensor_copy_(back, cn, nb, &e), 0, "%s", e.msg);
    int32_t v[R * C];
    cr_assert_eq(tensor_read(back, v, sizeof v, &e), 0, "%s", e.msg);
    for (int i = 0; i < R * C; i++)
      cr_assert_eq(v[i], i, "element %d: %d", i, v[i]);
    double d[R * C];
    cr_assert_eq(tensor_read(bt, d, sizeof d, &e), 0, "%s", e.msg);
    for (int i = 0; i < R * C; i++)
      cr_assert_eq(d[i], (double)i);
    tensor_release(back);
    tensor_release(cn);
    tensor_release(c);
    tensor_release(n);
    tensor_release(bt);
    tensor_release(b);
    tensor_release(a);
    tensor_release(h);
  }
  engine_synchronize_all();
  for (int dev = 0; dev < 3; dev++)
    cr_assert_eq(sim_bytes_in_use(dev), 0, "sim:%d: nothing leaked", dev);
}

/* A device's copy under a deadline is one launch: an enqueueing backend
 * passes every deadline check before the first piece runs, so pieces would
 * only add launches (64 for a 1 GiB copy on an H200: a quarter of a
 * millisecond).  Past the deadline it is refused before it is enqueued. */
Test(sim, a_device_copy_under_a_deadline_is_one_launch)
{
  const tport_device g = {TPORT_DEV_SIM, 0};
  int64_t n = ENGINE_PIECE_ELEMS + 4096; /* two pieces' worth on the cpu */
  tport_tensor *a, *b;
  tport_err e;
  cr_assert_eq(tensor_empty(g, TPORT_UINT8, 1, &n, TPORT_MF_CONTIGUOUS, 0, &a, &e), 0, "%s", e.msg);
  cr_assert_eq(tensor_empty(g, TPORT_INT8, 1, &n, TPORT_MF_CONTIGUOUS, 0, &b, &e), 0, "%s", e.msg);
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  engine_set_deadline((int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + 600000);
  int64_t before = backend_stat(&backend_sim, "sim_kernel_launches");
  cr_assert_eq(tensor_copy_(b, a, false, &e), 0, "%s", e.msg);
  cr_assert_eq(backend_stat(&backend_sim, "sim_kernel_launches") - before, 1);
  engine_set_deadline(1); /* long past */
  cr_assert_eq(tensor_copy_(b, a, false, &e), TPORT_DEADLINE_EXCEEDED);
  cr_assert(strstr(e.msg, "deadline"), "%s", e.msg);
  engine_set_deadline(0);
  cr_assert_eq(backend_stat(&backend_sim, "sim_kernel_launches") - before, 1);
  cr_assert_eq(tensor_sync(b, &e), 0, "%s", e.msg);
  tensor_release(a);
  tensor_release(b);
}
