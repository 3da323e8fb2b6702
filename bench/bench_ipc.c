/*
 * bench_ipc.c: same-host GPU memory by CUDA IPC (issue 19 item 4) against a
 * device-to-device cudaMemcpy of the same bytes, in the same run.  tportd
 * runs as a child (a process cannot open its own IPC handles) on ipc://
 * with a shm socket and cuda:0; the client puts from and gets into a
 * cudaMalloc of this process through tport_put_dlpack /
 * tport_get_into_dlpack, so the server opens the allocation once and copies
 * device to device.  Target: >= 0.8x the D2D cudaMemcpy.  Prints JSON
 * lines {"op", "bytes", "seconds", "baseline", "baseline_seconds"} as
 * tport-bench-gpu does (bench/run gpu turns them into ratios), or one
 * {"skipped": REASON} line without a GPU.
 *
 * With --phases, one more line {"phases": true, ...}: the medians of each
 * request (put, get, free), the copy alone, a 4 KiB put and an info, so
 * that a request's fixed cost shows beside its copy.
 *
 *   tport-bench-ipc [--mib N] [--reps R] [--phases]    (tportd: beside this program)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <cuda_runtime_api.h>
#include <libgen.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "tport.h"

static void line(const char *op, size_t bytes, double s, const char *base, double bs)
{
  printf("{\"op\": \"%s\", \"bytes\": %zu, \"seconds\": %.6f, \"baseline\": \"%s\", "
         "\"baseline_seconds\": %.6f}\n",
         op, bytes, s, base, bs);
  fflush(stdout);
}

static void die(const char *what, const char *msg)
{
  fprintf(stderr, "bench_ipc: %s: %s\n", what, msg);
  exit(1);
}

/* With --phases, tportd's /metrics on this loopback port: the server's
 * own time for each method and stage beside what the client measured. */
static int metrics_port;

/* Prints the sums and counts of tportd's request and stage durations as
 * one JSON line {"server_metrics": {...}} (nothing when it cannot). */
static void print_server_metrics(void)
{
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)metrics_port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
    if (fd >= 0)
      close(fd);
    return;
  }
  const char req[] = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, req, sizeof req - 1) != (ssize_t)(sizeof req - 1)) {
    close(fd);
    return;
  }
  size_t cap = 1 << 22, n = 0;
  char *buf = malloc(cap + 1);
  ssize_t k;
  while (buf && n < cap && (k = read(fd, buf + n, cap - n)) > 0)
    n += (size_t)k;
  close(fd);
  if (!buf)
    return;
  buf[n] = 0;
  printf("{\"server_metrics\": {");
  const char *sep = "";
  for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
    if (strncmp(line, "tport_request_duration_seconds_", 31) != 0 &&
        strncmp(line, "tport_stage_duration_seconds_", 29) != 0)
      continue;
    if (!strstr(line, "_sum{") && !strstr(line, "_count{"))
      continue;
    char *sp = strrchr(line, ' ');
    if (!sp)
      continue;
    *sp = 0;
    printf("%s\"", sep);
    for (const char *q = line; *q; q++)
      printf(*q == '"' ? "\\%c" : "%c", *q);
    printf("\": %s", sp + 1);
    sep = ", ";
  }
  printf("}}\n");
  fflush(stdout);
  free(buf);
}

static pid_t spawn_tportd(const char *url, const char *sock)
{
  char self[PATH_MAX], exe[PATH_MAX + 16];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0)
    die("readlink", "/proc/self/exe");
  self[n] = 0;
  snprintf(exe, sizeof exe, "%s/tportd", dirname(self));
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    char http[32] = "off";
    if (metrics_port)
      snprintf(http, sizeof http, "127.0.0.1:%d", metrics_port);
    execl(exe, exe, "--listen", url, "--devices", "cpu,cuda", "--shm-socket", sock, "--http-listen",
          http, (char *)NULL);
    _exit(127);
  }
  return pid;
}

int main(int argc, char **argv)
{
  size_t mib = 1024;
  int reps = 5;
  bool phases = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--mib") == 0 && i + 1 < argc)
      mib = (size_t)atoi(argv[++i]);
    else if (strcmp(argv[i], "--phases") == 0)
      phases = true;
    else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
      reps = atoi(argv[++i]) < 1 ? 1 : atoi(argv[i]) > 64 ? 64 : atoi(argv[i]);
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("{\"skipped\": \"no CUDA device: %s\"}\n", cudaGetErrorString(cudaGetLastError()));
    return 0;
  }
  /* libtport loads the runtime this program links (one copy in the process) */
  setenv("TPORT_CUDART_LIBRARY", "libcudart.so.13", 0);
  size_t n = mib << 20;
  void *src = NULL, *dst = NULL;
  if (cudaMalloc(&src, n) != cudaSuccess || cudaMalloc(&dst, n) != cudaSuccess)
    die("cudaMalloc", cudaGetErrorString(cudaGetLastError()));
  cudaMemset(src, 0x5a, n);
  cudaDeviceSynchronize();

  char url[128], dir[64], sock[128];
  snprintf(dir, sizeof dir, "/tmp/tport-bench-ipc-%d", (int)getpid());
  snprintf(sock, sizeof sock, "%s/shm.sock", dir);
  snprintf(url, sizeof url, "ipc:///tmp/tport-bench-ipc-%d.sock", (int)getpid());
  if (phases)
    metrics_port = 20000 + (int)(getpid() % 20000);
  pid_t pid = spawn_tportd(url, sock);
  tport_client *c = NULL;
  tport_err err;
  for (int i = 0; i < 100 && !c; i++) {
    tport_connect_options o = {.timeout_ms = 120000};
    if (tport_connect(url, &o, &c, &err) != TPORT_OK) {
      c = NULL;
      usleep(100000);
    }
  }
  if (!c)
    die("tport_connect", err.msg);

  int64_t shape[1] = {(int64_t)n};
  DLTensor t = {0};
  t.data = src;
  t.device = (DLDevice){kDLCUDA, 0};
  t.ndim = 1;
  t.dtype = (DLDataType){kDLUInt, 8, 1};
  t.shape = shape;
  DLTensor d = t;
  d.data = dst;
  tport_put_options po;
  tport_put_options_init(&po);
  po.device = "cuda:0";
  double tp[64], tg[64], tb[64], tf[64], ti[64], ts[64];
  for (int r = 0; r <= reps; r++) { /* rep 0 warms up (the open, the first allocations) */
    tport_tensor_info info;
    double t0 = bench_now();
    if (tport_put_dlpack(c, &t, &po, &info, &err))
      die("tport_put_dlpack", err.msg);
    double t1 = bench_now();
    if (tport_get_into_dlpack(c, &info.ref, &d, NULL, &err))
      die("tport_get_into_dlpack", err.msg);
    double t2 = bench_now();
    /* the baseline alone: the free below is a request of its own */
    cudaMemcpy(dst, src, n, cudaMemcpyDeviceToDevice);
    cudaDeviceSynchronize();
    double t3 = bench_now();
    tport_free(c, &info.ref, NULL);
    double t4 = bench_now();
    if (r > 0) {
      tp[r - 1] = t1 - t0;
      tg[r - 1] = t2 - t1;
      tb[r - 1] = t3 - t2;
      tf[r - 1] = t4 - t3;
    }
  }
  if (phases) {
    print_server_metrics(); /* the loop's requests alone (and the warm-up's) */
    /* what a request costs beside its copy: an info (no device work) and a
     * 4 KiB put by IPC from the same allocation */
    int64_t small_shape[1] = {4096};
    DLTensor small = t;
    small.shape = small_shape;
    for (int r = 0; r <= reps; r++) {
      tport_tensor_info info;
      double t0 = bench_now();
      if (tport_put_dlpack(c, &small, &po, &info, &err))
        die("tport_put_dlpack (4 KiB)", err.msg);
      double t1 = bench_now();
      if (tport_info(c, &info.ref, &info, &err))
        die("tport_info", err.msg);
      double t2 = bench_now();
      tport_free(c, &info.ref, NULL);
      if (r > 0) {
        ts[r - 1] = t1 - t0;
        ti[r - 1] = t2 - t1;
      }
    }
    /* the GPU switching between the two processes' contexts: the loop's
     * put follows the client's own cudaMemcpy (the baseline), its get the
     * put; here a put right after a put of tportd's and a D2D right after
     * a D2D, each with no other process's work just before it */
    double tpp[64], tdd[64];
    for (int r = 0; r <= reps; r++) {
      tport_tensor_info a, b;
      if (tport_put_dlpack(c, &t, &po, &a, &err))
        die("tport_put_dlpack", err.msg);
      double t0 = bench_now();
      if (tport_put_dlpack(c, &t, &po, &b, &err))
        die("tport_put_dlpack", err.msg);
      double t1 = bench_now();
      tport_free(c, &a.ref, NULL);
      tport_free(c, &b.ref, NULL);
      cudaMemcpy(dst, src, n, cudaMemcpyDeviceToDevice);
      cudaDeviceSynchronize();
      double t2 = bench_now();
      cudaMemcpy(dst, src, n, cudaMemcpyDeviceToDevice);
      cudaDeviceSynchronize();
      double t3 = bench_now();
      if (r > 0) {
        tpp[r - 1] = t1 - t0;
        tdd[r - 1] = t3 - t2;
      }
    }
    printf("{\"phases\": true, \"put_after_put_s\": %.6f, \"d2d_after_d2d_s\": %.6f}\n",
           bench_median(tpp, reps), bench_median(tdd, reps));
    /* the client's own calls per request (client/cuda_ipc.c resolve) */
    double th[64], tsync[64];
    for (int r = 0; r < reps; r++) {
      cudaIpcMemHandle_t hd;
      double t0 = bench_now();
      cudaIpcGetMemHandle(&hd, src);
      double t1 = bench_now();
      cudaStreamSynchronize(NULL);
      double t2 = bench_now();
      th[r] = t1 - t0;
      tsync[r] = t2 - t1;
    }
    printf("{\"phases\": true, \"ipc_handle_s\": %.6f, \"stream_sync_s\": %.6f}\n",
           bench_median(th, reps), bench_median(tsync, reps));
    printf("{\"phases\": true, \"bytes\": %zu, \"put_s\": %.6f, \"get_s\": %.6f, "
           "\"d2d_s\": %.6f, \"free_s\": %.6f, \"put_4KiB_s\": %.6f, \"info_s\": %.6f}\n",
           n, bench_median(tp, reps), bench_median(tg, reps), bench_median(tb, reps),
           bench_median(tf, reps), bench_median(ts, reps), bench_median(ti, reps));
  }
  double base = bench_median(tb, reps);
  line("put_cuda_ipc", n, bench_median(tp, reps), "d2d_cudaMemcpy", base);
  line("get_cuda_ipc", n, bench_median(tg, reps), "d2d_cudaMemcpy", base);
  tport_close(c);
  kill(pid, SIGTERM);
  waitpid(pid, NULL, 0);
  rmdir(dir);
  cudaFree(src);
  cudaFree(dst);
  return 0;
}
