/*
 * bench_kernels.c: timings of the engine's CPU copies and of memcpy over the
 * same bytes, measured in the same run.  Prints one JSON object per line:
 *   {"op": NAME, "seconds": S, "bytes": B, "memcpy_seconds": M}
 * where bytes counts what the op reads plus what it writes, and memcpy moves
 * the same number of bytes (half read, half written; memcpy on one thread,
 * the ops on the pool).  bench/run turns these
 * into ratio lines and adds the PyTorch baseline.
 *
 * usage: tport-bench-kernels [--threads N] [--reps R]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "cpu_kernels.h"
#include "engine.h"

static int reps = 15;

static double time_memcpy(size_t bytes)
{
  char *a = malloc(bytes), *b = malloc(bytes);
  memset(a, 1, bytes);
  memset(b, 2, bytes);
  double t[64];
  for (int r = 0; r < reps; r++) {
    double t0 = bench_now();
    memcpy(b, a, bytes);
    t[r] = bench_now() - t0;
    a[r] = b[bytes - 1 - (size_t)r]; /* keep the copies observable */
  }
  free(a);
  free(b);
  return bench_median(t, reps);
}

static tport_tensor *make(tport_dtype dt, int n, const int64_t *sz, tport_memory_format f)
{
  tport_tensor *t;
  tport_err e;
  if (tensor_empty((tport_device){TPORT_DEV_CPU, 0}, dt, n, sz, f, 0, &t, &e)) {
    fprintf(stderr, "%s\n", e.msg);
    exit(1);
  }
  memset(t->storage->ptr, 0, t->storage->nbytes);
  return t;
}

static void bench(const char *name, tport_tensor *dst, tport_tensor *src)
{
  double t[64];
  tport_err e;
  for (int r = -2; r < reps; r++) { /* two warm-up runs */
    double t0 = bench_now();
    if (tensor_copy_(dst, src, false, &e)) {
      fprintf(stderr, "%s: %s\n", name, e.msg);
      exit(1);
    }
    if (r >= 0)
      t[r] = bench_now() - t0;
  }
  size_t bytes = tensor_nbytes(dst) + tensor_nbytes(src);
  printf("{\"op\": \"%s\", \"seconds\": %.9f, \"bytes\": %zu, \"memcpy_seconds\": %.9f}\n", name,
         bench_median(t, reps), bytes, time_memcpy(bytes / 2));
  fflush(stdout);
}

int main(int argc, char **argv)
{
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
      parallel_set_num_threads(atoi(argv[++i]));
    else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = atoi(argv[++i]);
      reps = reps < 1 ? 1 : reps > 64 ? 64 : reps;
    }
  }
  int64_t nchw[] = {64, 64, 56, 56}, flat[] = {64 * 64 * 56 * 56};
  tport_tensor *a = make(TPORT_FLOAT32, 1, flat, TPORT_MF_CONTIGUOUS);
  tport_tensor *b = make(TPORT_FLOAT32, 1, flat, TPORT_MF_CONTIGUOUS);
  bench("copy_contiguous_f32", b, a);
  tport_tensor *h = make(TPORT_FLOAT16, 1, flat, TPORT_MF_CONTIGUOUS);
  bench("cast_f32_f16", h, a);
  tport_tensor *bf = make(TPORT_BFLOAT16, 1, flat, TPORT_MF_CONTIGUOUS);
  bench("cast_f32_bf16", bf, a);
  tport_tensor *x = make(TPORT_FLOAT32, 4, nchw, TPORT_MF_CONTIGUOUS);
  tport_tensor *y = make(TPORT_FLOAT32, 4, nchw, TPORT_MF_CHANNELS_LAST);
  bench("nchw_to_nhwc_f32", y, x);
  bench("nhwc_to_nchw_f32", x, y);
  /* the transpose with a fused cast (the converting path of transpose.c) */
  tport_tensor *yh = make(TPORT_FLOAT16, 4, nchw, TPORT_MF_CHANNELS_LAST);
  bench("nchw_f32_to_nhwc_f16", yh, x);
  tensor_release(a);
  tensor_release(b);
  tensor_release(h);
  tensor_release(bf);
  tensor_release(x);
  tensor_release(y);
  tensor_release(yh);
  return 0;
}
