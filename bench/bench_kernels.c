/*
 * bench_kernels.c: timings of the engine's CPU copies and of memcpy over the
 * same bytes, measured in the same run.  Prints one JSON object per line:
 *   {"op": NAME, "seconds": S, "bytes": B, "memcpy_seconds": M}
 * where bytes counts what the op reads plus what it writes, and memcpy moves
 * the same number of bytes (half read, half written; memcpy on one thread,
 * the ops on the pool; rows with "baseline": "memcpy_same_threads" time
 * memcpy on the pool's threads).  bench/run turns these
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
#include "storage.h"
#include "staging.h"

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

/* The host side of a staged transfer (engine/copy.c's copy_h2d and
 * copy_d2h from and to pageable memory): the same calls, block by block --
 * a pinned block from the staging pool, the copy into it (or out of it) on
 * the kernels' threads, the block handed back -- without the device's copy,
 * against one memcpy of the same bytes on the same threads (cpu_memcpy_parallel).
 * The device's copy overlaps this; on a GPU machine bench/run gpu measures
 * the whole. */
static void bench_staging_host_side(size_t n)
{
  const size_t block = (size_t)8 << 20;
  char *a = malloc(n), *b = malloc(n);
  memset(a, 1, n);
  memset(b, 2, n);
  staging_pool *pool = staging_default();
  double th[64], td[64], tm[64];
  tport_err e;
  for (int r = -1; r < reps; r++) { /* a warm-up: the pool's blocks */
    for (int j = 0; j < 3; j++) {
      int which = (r + 3 + j) % 3;
      double t0 = bench_now();
      if (which == 2) {
        cpu_memcpy_parallel(b, a, n);
      } else {
        for (size_t off = 0; off < n; off += block) {
          size_t len = n - off < block ? n - off : block;
          staging_block *blk;
          if (staging_acquire(pool, len, &blk, &e)) {
            fprintf(stderr, "staging: %s\n", e.msg);
            exit(1);
          }
          if (which == 0)
            cpu_memcpy_parallel(blk->ptr, a + off, len);
          else
            cpu_memcpy_parallel(b + off, blk->ptr, len);
          staging_release(pool, blk);
        }
      }
      if (r >= 0)
        (which == 0 ? th : which == 1 ? td : tm)[r] = bench_now() - t0;
    }
  }
  double m = bench_median(tm, reps);
  printf("{\"op\": \"staging_h2d_host_side_%zuMiB\", \"seconds\": %.9f, \"bytes\": %zu, "
         "\"memcpy_seconds\": %.9f, \"baseline\": \"memcpy_same_threads\"}\n",
         n >> 20, bench_median(th, reps), 2 * n, m);
  printf("{\"op\": \"staging_d2h_host_side_%zuMiB\", \"seconds\": %.9f, \"bytes\": %zu, "
         "\"memcpy_seconds\": %.9f, \"baseline\": \"memcpy_same_threads\"}\n",
         n >> 20, bench_median(td, reps), 2 * n, m);
  fflush(stdout);
  free(a);
  free(b);
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
  bench_staging_host_side((size_t)256 << 20);
  tensor_release(a);
  tensor_release(b);
  tensor_release(h);
  tensor_release(bf);
  tensor_release(x);
  tensor_release(y);
  tensor_release(yh);
  return 0;
}
