/*
 * bench_gpu.c: the CUDA backend against CUDA itself, in the same run.
 * Prints JSON lines {"op", "bytes", "seconds", "baseline", "baseline_seconds"}
 * (and "mode": "pipelined" for the conversions' back-to-back rows); bench/run
 * gpu turns them into ratio lines (and adds PyTorch's layout conversion when
 * torch has CUDA).  The conversions are 64x64x56x56 (51 MB of float32, about
 * the L2 of an H100/H200, so most of each rep streams from HBM); "bytes" is
 * what a conversion reads plus writes, and the D2D baseline copies half of
 * it (reads and writes the same total).  Without a GPU it prints one
 * {"skipped": REASON} line and exits 0.
 *
 *   tport-bench-gpu [--mib N] [--reps R]
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_util.h"
#include "engine.h"

static int reps = 10;

/* mode: "" (each rep timed alone: a launch and a synchronize, the latency a
 * caller sees) or "pipelined" (PIPE launches back to back, one synchronize:
 * the kernel's throughput, the host's per-call cost hidden behind it). */
static void line_mode(const char *op, size_t bytes, double s, const char *base, double bs,
                      const char *mode)
{
  printf("{\"op\": \"%s\", \"bytes\": %zu, \"seconds\": %.9f, \"baseline\": \"%s\", "
         "\"baseline_seconds\": %.9f%s%s%s}\n",
         op, bytes, s, base, bs, *mode ? ", \"mode\": \"" : "", mode, *mode ? "\"" : "");
  fflush(stdout);
}

static void line(const char *op, size_t bytes, double s, const char *base, double bs)
{
  line_mode(op, bytes, s, base, bs, "");
}

#define PIPE 20

static void die(const char *what, const tport_err *e)
{
  fprintf(stderr, "bench_gpu: %s: %s\n", what, e ? e->msg : "");
  exit(1);
}

int main(int argc, char **argv)
{
  size_t mib = 256;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc)
      mib = (size_t)atoi(argv[++i]);
    else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
      reps = atoi(argv[++i]) < 1 ? 1 : atoi(argv[i]) > 64 ? 64 : atoi(argv[i]);
  }
  if (engine_cuda_unavailable_reason()) {
    printf("{\"skipped\": \"%s\"}\n", engine_cuda_unavailable_reason());
    return 0;
  }
  size_t n = mib << 20;
  const tport_device cpu = {TPORT_DEV_CPU, 0}, g0 = {TPORT_DEV_CUDA, 0};
  double t[64], b[64], b2[64];
  tport_err e;

  /* ---- staged H2D / D2H through the engine vs cudaMemcpy (pinned, pageable) */
  uint8_t *pageable = malloc(n), *pinned;
  memset(pageable, 1, n);
  if (cudaHostAlloc((void **)&pinned, n, cudaHostAllocDefault) != cudaSuccess)
    die("cudaHostAlloc", NULL);
  void *dev;
  cudaSetDevice(0);
  if (cudaMalloc(&dev, n) != cudaSuccess)
    die("cudaMalloc", NULL);
  tport_tensor *h, *d;
  int64_t sz = (int64_t)n;
  if (tensor_wrap_host(pageable, n, TPORT_UINT8, 1, &sz, NULL, 0, &h, &e) ||
      tensor_empty(g0, TPORT_UINT8, 1, &sz, TPORT_MF_CONTIGUOUS, 0, &d, &e))
    die("tensors", &e);
  for (int r = -1; r < reps; r++) {
    double t0 = bench_now();
    if (tensor_copy_(d, h, false, &e))
      die("H2D", &e);
    double t1 = bench_now();
    cudaMemcpy(dev, pinned, n, cudaMemcpyHostToDevice);
    double t2 = bench_now();
    cudaMemcpy(dev, pageable, n, cudaMemcpyHostToDevice);
    double t3 = bench_now();
    if (r >= 0)
      t[r] = t1 - t0, b[r] = t2 - t1, b2[r] = t3 - t2;
  }
  double th = bench_median(t, reps);
  line("h2d_staged", n, th, "pinned_cudaMemcpy", bench_median(b, reps));
  line("h2d_staged", n, th, "pageable_cudaMemcpy", bench_median(b2, reps));
  for (int r = -1; r < reps; r++) {
    double t0 = bench_now();
    if (tensor_copy_(h, d, false, &e))
      die("D2H", &e);
    double t1 = bench_now();
    cudaMemcpy(pinned, dev, n, cudaMemcpyDeviceToHost);
    double t2 = bench_now();
    cudaMemcpy(pageable, dev, n, cudaMemcpyDeviceToHost);
    double t3 = bench_now();
    if (r >= 0)
      t[r] = t1 - t0, b[r] = t2 - t1, b2[r] = t3 - t2;
  }
  th = bench_median(t, reps);
  line("d2h_staged", n, th, "pinned_cudaMemcpy", bench_median(b, reps));
  line("d2h_staged", n, th, "pageable_cudaMemcpy", bench_median(b2, reps));

  /* ---- a same-device copy as tportd makes one for a CUDA IPC request,
   * without the request: into a tensor that exists (a get into the client's
   * allocation) and into a new one (a put: allocated from the caching
   * allocator, copied, synchronized, released), the other side a cudaMalloc
   * of its own wrapped as the client's allocation is; uint8 as tport-bench-ipc
   * puts, float32 beside it (the copy kernel's widest accesses) */
  {
    void *other;
    if (cudaMalloc(&other, n) != cudaSuccess)
      die("cudaMalloc", NULL);
    tport_dtype dts[2] = {TPORT_UINT8, TPORT_FLOAT32};
    const char *names[2][2] = {{"d2d_engine_copy_u8", "d2d_engine_to_new_u8"},
                               {"d2d_engine_copy_f32", "d2d_engine_to_new_f32"}};
    for (int k = 0; k < 2; k++) {
      int64_t count = (int64_t)(n / tport_dtype_size(dts[k]));
      tport_tensor *w;
      if (tensor_wrap_device(g0, other, n, dts[k], 1, &count, NULL, 0, &w, &e))
        die("tensor_wrap_device", &e);
      tport_tensor *stored;
      if (tensor_empty(g0, dts[k], 1, &count, TPORT_MF_CONTIGUOUS, 0, &stored, &e))
        die("tensor_empty", &e);
      double tn[64];
      for (int r = -1; r < reps; r++) {
        double t0 = bench_now();
        if (tensor_copy_(w, stored, false, &e) || tensor_sync(w, &e))
          die(names[k][0], &e);
        double t1 = bench_now();
        to_options o = {.has_device = true, .device = g0, .copy = true};
        tport_tensor *fresh;
        bool aliased;
        if (tensor_to(w, &o, &fresh, &aliased, &e) || tensor_sync(fresh, &e))
          die(names[k][1], &e);
        tensor_release(fresh);
        double t2 = bench_now();
        cudaMemcpy(dev, other, n, cudaMemcpyDeviceToDevice);
        cudaDeviceSynchronize();
        double t3 = bench_now();
        if (r >= 0)
          t[r] = t1 - t0, tn[r] = t2 - t1, b[r] = t3 - t2;
      }
      line(names[k][0], n, bench_median(t, reps), "d2d_cudaMemcpy", bench_median(b, reps));
      line(names[k][1], n, bench_median(tn, reps), "d2d_cudaMemcpy", bench_median(b, reps));
      tensor_release(stored);
      tensor_release(w);
    }
    cudaFree(other);
  }

  /* ---- layout conversion kernels vs a D2D cudaMemcpy of the same bytes */
  int64_t nchw[] = {64, 64, 56, 56};
  struct {
    const char *op;
    tport_dtype st, dt;
    tport_memory_format sf, df;
  } conv[] = {
      {"nchw_to_nhwc_f32", TPORT_FLOAT32, TPORT_FLOAT32, TPORT_MF_CONTIGUOUS,
       TPORT_MF_CHANNELS_LAST},
      {"nhwc_to_nchw_f32", TPORT_FLOAT32, TPORT_FLOAT32, TPORT_MF_CHANNELS_LAST,
       TPORT_MF_CONTIGUOUS},
      {"nchw_f32_to_nhwc_f16", TPORT_FLOAT32, TPORT_FLOAT16, TPORT_MF_CONTIGUOUS,
       TPORT_MF_CHANNELS_LAST},
      {"cast_f32_to_bf16", TPORT_FLOAT32, TPORT_BFLOAT16, TPORT_MF_CONTIGUOUS, TPORT_MF_CONTIGUOUS},
      {"cast_f32_to_f16", TPORT_FLOAT32, TPORT_FLOAT16, TPORT_MF_CONTIGUOUS, TPORT_MF_CONTIGUOUS},
  };
  for (size_t k = 0; k < sizeof conv / sizeof conv[0]; k++) {
    tport_tensor *x, *y;
    if (tensor_empty(g0, conv[k].st, 4, nchw, conv[k].sf, 0, &x, &e) ||
        tensor_empty(g0, conv[k].dt, 4, nchw, conv[k].df, 0, &y, &e))
      die("conversion tensors", &e);
    size_t bytes = tensor_nbytes(x) + tensor_nbytes(y);
    void *m1, *m2;
    cudaMalloc(&m1, bytes / 2);
    cudaMalloc(&m2, bytes / 2);
    for (int r = -2; r < reps; r++) {
      double t0 = bench_now();
      if (tensor_copy_(y, x, false, &e) || tensor_sync(y, &e))
        die(conv[k].op, &e);
      double t1 = bench_now();
      cudaMemcpy(m2, m1, bytes / 2, cudaMemcpyDeviceToDevice);
      cudaDeviceSynchronize();
      double t2 = bench_now();
      if (r >= 0)
        t[r] = t1 - t0, b[r] = t2 - t1;
    }
    line(conv[k].op, bytes, bench_median(t, reps), "d2d_cudaMemcpy", bench_median(b, reps));
    /* pipelined: PIPE of each back to back, then one synchronize */
    for (int r = -1; r < reps; r++) {
      double t0 = bench_now();
      for (int i = 0; i < PIPE; i++)
        if (tensor_copy_(y, x, false, &e))
          die(conv[k].op, &e);
      if (tensor_sync(y, &e))
        die(conv[k].op, &e);
      double t1 = bench_now();
      for (int i = 0; i < PIPE; i++)
        cudaMemcpyAsync(m2, m1, bytes / 2, cudaMemcpyDeviceToDevice, 0);
      cudaDeviceSynchronize();
      double t2 = bench_now();
      if (r >= 0)
        t[r] = (t1 - t0) / PIPE, b[r] = (t2 - t1) / PIPE;
    }
    line_mode(conv[k].op, bytes, bench_median(t, reps), "d2d_cudaMemcpy", bench_median(b, reps),
              "pipelined");
    cudaFree(m1);
    cudaFree(m2);
    tensor_release(x);
    tensor_release(y);
  }
  tensor_release(d);
  tensor_release(h);
  cudaFree(dev);
  cudaFreeHost(pinned);
  free(pageable);
  (void)cpu;
  return 0;
}
