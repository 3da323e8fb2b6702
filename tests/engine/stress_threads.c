/*
 * stress_threads.c: the engine's threaded parts under load, as a plain
 * program (Criterion cannot run under ThreadSanitizer: Snaipe/Criterion#274),
 * so that `make test-tsan` can check them for data races.  Exit status 0
 * when every byte came back right.
 *
 * Eight threads each move their own tensors through every path at once:
 * host -> sim:0 (staged, small pinned budget: back-pressure), sim:0 -> sim:1
 * (peer), sim:1 -> sim:2 (no peer: driver copy), conversions on devices, a
 * transposed read back (temporaries), and large CPU copies on the shared
 * thread pool, with random delays on every stream.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#include "engine.h"
#include "storage.h"

#define THREADS 8
#define ROUNDS 12

static atomic_int failures;

static void fail(const char *what, int id, const tport_err *e)
{
  fprintf(stderr, "stress: thread %d: %s%s%s\n", id, what, e ? ": " : "", e ? e->msg : "");
  atomic_fetch_add(&failures, 1);
}

static void *worker(void *arg)
{
  int id = (int)(intptr_t)arg;
  const tport_device cpu = {TPORT_DEV_CPU, 0};
  tport_err e;
  for (int r = 0; r < ROUNDS; r++) {
    int64_t rows = 64 + id * 8 + r, cols = 1000 + r;
    size_t n = (size_t)(rows * cols);
    int32_t *in = malloc(n * 4), *out = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
      in[i] = (int32_t)(id * 100000000 + r * 1000000 + (int)i);
    tport_tensor *h = NULL, *d0 = NULL, *d1 = NULL, *d2 = NULL, *f = NULL, *t = NULL;
    int64_t sz[2] = {rows, cols};
    if (tensor_empty(cpu, TPORT_INT32, 2, sz, TPORT_MF_CONTIGUOUS, 0, &h, &e) ||
        tensor_write(h, in, n * 4, &e)) {
      fail("host tensor", id, &e);
      goto next;
    }
    bool a, nb = (r + id) & 1;
    to_options o = {.has_device = true, .device = {TPORT_DEV_SIM, 0}, .non_blocking = nb};
    if (tensor_to(h, &o, &d0, &a, &e)) {
      fail("to sim:0", id, &e);
      goto next;
    }
    o.device.index = 1;
    if (tensor_to(d0, &o, &d1, &a, &e)) {
      fail("to sim:1", id, &e);
      goto next;
    }
    o.device.index = 2;
    o.has_dtype = true;
    o.dtype = TPORT_FLOAT64; /* no peer 1->2: converts through temporaries */
    if (tensor_to(d1, &o, &d2, &a, &e)) {
      fail("to sim:2 as float64", id, &e);
      goto next;
    }
    o = (to_options){.has_dtype = true, .dtype = TPORT_INT32};
    if (tensor_to(d2, &o, &f, &a, &e)) {
      fail("back to int32", id, &e);
      goto next;
    }
    /* read through a transposed view: non-contiguous D2H */
    if (tensor_as_strided(f, 2, (int64_t[]){cols, rows}, (int64_t[]){1, cols}, 0, &t, &e) ||
        tensor_read(t, out, n * 4, &e)) {
      fail("transposed read", id, &e);
      goto next;
    }
    for (int64_t i = 0; i < rows; i++)
      for (int64_t j = 0; j < cols; j++)
        if (out[j * rows + i] != in[i * cols + j]) {
          fail("wrong value", id, NULL);
          i = rows;
          break;
        }
  next:
    tensor_release(t);
    tensor_release(f);
    tensor_release(d2);
    tensor_release(d1);
    tensor_release(d0);
    tensor_release(h);
    free(in);
    free(out);
  }
  return NULL;
}

int main(void)
{
  setenv("TPORT_STAGING_BYTES", "1", 0); /* the minimum budget: back-pressure */
  sim_config cfg = {.ndevices = 3, .mem_bytes = (size_t)1 << 30, .max_delay_us = 200, .seed = 5};
  tport_err e;
  if (sim_configure(&cfg, &e)) {
    fprintf(stderr, "%s\n", e.msg);
    return 1;
  }
  sim_set_peer_possible(1, 2, false);
  sim_set_peer_possible(2, 1, false);
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++)
    pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i);
  for (int i = 0; i < THREADS; i++)
    pthread_join(t[i], NULL);
  engine_synchronize_all();
  for (int d = 0; d < 3; d++)
    if (sim_bytes_in_use(d) != 0) {
      fprintf(stderr, "stress: sim:%d still holds %zu bytes\n", d, sim_bytes_in_use(d));
      atomic_fetch_add(&failures, 1);
    }
  sim_config none = {0};
  if (sim_configure(&none, &e)) { /* stops the stream threads: all memory is back */
    fprintf(stderr, "stress: %s\n", e.msg);
    atomic_fetch_add(&failures, 1);
  }
  int f = atomic_load(&failures);
  printf("stress: %d threads x %d rounds, %d failures\n", THREADS, ROUNDS, f);
  return f ? 1 : 0;
}
