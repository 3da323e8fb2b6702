/*
 * bench_shm.c: same-host regions against memcpy and against the socket.
 *
 * tportd runs in this process (cpu device) listening on ipc:// with a shm
 * socket; the clients are libtport's, over that ipc:// URL.  Rows (JSON
 * lines in bench/run's format, medians of --reps, every row's subject and
 * baseline interleaved rep by rep):
 *  - put_shm_NMiB_vs_memcpy: tport_put_shm of a filled region (the server
 *    copies it into a new tensor) vs memcpy of the same bytes into a reused,
 *    touched buffer;
 *  - get_shm_NMiB_vs_memcpy: tport_get_shm of a tensor into a region vs the
 *    same memcpy;
 *  - put_auto_shm_NMiB_vs_ipc / get_auto_shm_NMiB_vs_ipc: tport_put /
 *    tport_get of a user buffer on a client with the automatic region (one
 *    copy on each side) vs the same on a client with no_shm (the socket);
 *  - put_auto_shm_NMiB_vs_put_shm / get_auto_shm_NMiB_vs_get_shm: the same
 *    tport_put / tport_get vs tport_put_shm / tport_get_shm of a region the
 *    application fills in place (what the client's copy costs; a cpu
 *    tensor's get written straight into the caller's buffer);
 *  - put_direct_NMiB_vs_region: that tport_put, which over ipc:// the
 *    server reads from the caller's buffer itself (process_vm_readv: one
 *    copy, client/process_region.c), vs the same on a client with
 *    TPORT_SHM_DIRECT=0 (copied into the automatic region, then out);
 *  - get_direct_NMiB_vs_region: the same for tport_get, which the server
 *    writes into the caller's buffer (process_vm_writev,
 *    server/get_direct.h) where the tensor is on the cpu;
 *  - copy_pool_NMiB_vs_memcpy / copy_pool_NMiB_vs_threads: the client's
 *    copy alone (client/copy_pool.c, "threads" in the row) vs one memcpy,
 *    and vs memcpy split evenly across as many fresh threads.
 * Each put's tensor is freed after it, as a loader's batches are.
 *
 * With --device D (cuda:0, sim:0): every tensor lives on D (the server's
 * devices are cpu and D's type) and each row's name ends in _D (cuda0):
 * the region to and from a GPU, the automatic region's copy included.
 *
 * --chunk-mib sets the server's chunk size (--chunk-bytes), which bounds
 * the slices of a put through the automatic region.
 *
 *   tport-bench-shm [--reps R] [--mib N,...] [--device D] [--chunk-mib C]
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "copy_pool.h"
#include "server.h"
#include "tport.h"

static void die(const char *what, const tport_err *err)
{
  fprintf(stderr, "bench_shm: %s: %s\n", what, err ? err->msg : "");
  exit(1);
}

static void emit(const char *name, size_t bytes, double *v, double *b, int reps, const char *base)
{
  double sv = bench_median(v, reps), sb = bench_median(b, reps);
  double gv = (double)bytes / sv / 1e9, gb = (double)bytes / sb / 1e9;
  printf("{\"bench\": \"%s\", \"value\": %.4f, \"unit\": \"GB/s\", \"baseline\": %.4f, "
         "\"ratio\": %.4f, \"baseline_name\": \"%s\", \"reps\": %d, "
         "\"value_range\": [%.3f, %.3f], \"baseline_range\": [%.3f, %.3f], \"threads\": %d}\n",
         name, gv, gb, gv / gb, base, reps, (double)bytes / v[reps - 1] / 1e9,
         (double)bytes / v[0] / 1e9, (double)bytes / b[reps - 1] / 1e9, (double)bytes / b[0] / 1e9,
         copy_pool_threads());
  fflush(stdout);
}

/* The baseline of the copy pool: memcpy split evenly across k threads
 * started for this copy (the caller's one of them). */
typedef struct slice {
  uint8_t *dst;
  const uint8_t *src;
  size_t n;
} slice;

static void *copy_slice(void *arg)
{
  slice *s = arg;
  memcpy(s->dst, s->src, s->n);
  return NULL;
}

static void split_memcpy(uint8_t *dst, const uint8_t *src, size_t n, int k)
{
  pthread_t t[COPY_POOL_MAX_THREADS];
  slice sl[COPY_POOL_MAX_THREADS];
  size_t per = n / (size_t)k;
  for (int i = 0; i < k; i++) {
    size_t off = per * (size_t)i;
    sl[i] = (slice){dst + off, src + off, i == k - 1 ? n - off : per};
    if (i > 0 && pthread_create(&t[i], NULL, copy_slice, &sl[i]) != 0)
      copy_slice(&sl[i]), t[i] = 0;
  }
  copy_slice(&sl[0]);
  for (int i = 1; i < k; i++)
    if (t[i])
      pthread_join(t[i], NULL);
}

int main(int argc, char **argv)
{
  int reps = 7;
  char mibs[64] = "16,256";
  const char *device = NULL;
  size_t chunk_mib = 0; /* the server's default */
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--reps"))
      reps = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--mib"))
      snprintf(mibs, sizeof mibs, "%s", argv[i + 1]);
    else if (!strcmp(argv[i], "--device"))
      device = argv[i + 1];
    else if (!strcmp(argv[i], "--chunk-mib"))
      chunk_mib = (size_t)atoi(argv[i + 1]);
  }
  /* the rows' suffix and the server's device list */
  char suffix[32] = "", devices[64] = "cpu";
  if (device) {
    char type[16];
    snprintf(type, sizeof type, "%.*s", (int)strcspn(device, ":"), device);
    snprintf(devices, sizeof devices, "cpu,%s", type);
    snprintf(suffix, sizeof suffix, "_");
    for (const char *q = device; *q && strlen(suffix) + 1 < sizeof suffix; q++)
      if (*q != ':')
        strncat(suffix, q, 1);
  }
  tport_put_options po;
  tport_put_options_init(&po);
  po.device = device;
  const tport_put_options *opts = device ? &po : NULL;
  if (reps < 1 || reps > 1000)
    reps = 7;
  char dir[] = "/tmp/tport-bench-shm-XXXXXX";
  if (!mkdtemp(dir))
    die("mkdtemp", NULL);
  char url[128], sock[128];
  snprintf(url, sizeof url, "ipc://%s/s.ipc", dir);
  snprintf(sock, sizeof sock, "%s/shm.sock", dir);
  server_config cfg;
  config_defaults(&cfg);
  cfg.listen[0] = strdup(url);
  cfg.nlisten = 1;
  cfg.devices = strdup(devices);
  if (chunk_mib)
    cfg.chunk_bytes = chunk_mib << 20;
  cfg.log_level = 0;
  cfg.shm_socket = strdup(sock);
  cfg.shm_socket_set = true;
  server *s;
  tport_err err;
  if (server_start(&cfg, &s, &err))
    die("server_start", &err);
  tport_client *c, *plain, *regional;
  if (tport_connect(url, NULL, &c, &err))
    die("connect", &err);
  setenv("TPORT_SHM_DIRECT", "0", 1);
  if (tport_connect(url, NULL, &regional, &err))
    die("connect", &err);
  unsetenv("TPORT_SHM_DIRECT");
  if (tport_connect(url, &(tport_connect_options){.no_shm = true}, &plain, &err))
    die("connect", &err);
  if (!tport_shm_available(c))
    die("the server offers no shared memory", NULL);
  double *v = calloc((size_t)reps, sizeof *v), *b = calloc((size_t)reps, sizeof *b),
         *v2 = calloc((size_t)reps, sizeof *v2), *b2 = calloc((size_t)reps, sizeof *b2);
  char *save = NULL;
  for (char *tok = strtok_r(mibs, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    size_t mib = (size_t)atoi(tok), n = mib << 20;
    if (!n)
      continue;
    int64_t sz = (int64_t)n;
    uint8_t *user = malloc(n), *dst = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n; i++)
      user[i] = (uint8_t)(i * 31);
    /* touched before the clock starts (a memset of zeros after malloc may
     * become calloc and touch nothing) */
    memset(dst, 1, n);
    memset(back, 1, n);
    tport_shm *in, *out;
    if (tport_shm_create(c, n, &in, &err) || tport_shm_create(c, n, &out, &err))
      die("tport_shm_create", &err);
    memcpy(tport_shm_data(in), user, n);
    memset(tport_shm_data(out), 0, n);
    tport_tensor_info info, kept;
    /* a tensor to get, and a warm-up of every path (first touches) */
    if (tport_put_shm(c, in, 0, TPORT_UINT8, 1, &sz, NULL, opts, &kept, &err))
      die("put_shm", &err);
    for (int w = 0; w < 2; w++) {
      if (tport_put_shm(c, in, 0, TPORT_UINT8, 1, &sz, NULL, opts, &info, &err) ||
          tport_free(c, &info.ref, &err) ||
          tport_get_shm(c, &kept.ref, out, 0, n, NULL, NULL, &err) ||
          tport_put(c, TPORT_UINT8, 1, &sz, NULL, user, n, opts, &info, &err) ||
          tport_free(c, &info.ref, &err) ||
          tport_put(plain, TPORT_UINT8, 1, &sz, NULL, user, n, opts, &info, &err) ||
          tport_free(plain, &info.ref, &err) ||
          tport_put(regional, TPORT_UINT8, 1, &sz, NULL, user, n, opts, &info, &err) ||
          tport_free(regional, &info.ref, &err) ||
          tport_get(c, &kept.ref, back, n, NULL, NULL, NULL, &err) ||
          tport_get(plain, &kept.ref, back, n, NULL, NULL, NULL, &err))
        die("warm-up", &err);
    }
    if (memcmp(tport_shm_data(out), user, n) || memcmp(back, user, n))
      die("the bytes came back wrong", NULL);
    /* region vs memcpy, the order swapped every rep */
    for (int r = 0; r < reps; r++) {
      for (int k = 0; k < 2; k++) {
        if ((k == 0) == (r % 2 == 0)) {
          double t0 = bench_now();
          memcpy(dst, user, n);
          b[r] = bench_now() - t0;
          t0 = bench_now();
          memcpy(back, dst, n);
          b2[r] = bench_now() - t0;
        } else {
          double t0 = bench_now();
          if (tport_put_shm(c, in, 0, TPORT_UINT8, 1, &sz, NULL, opts, &info, &err))
            die("put_shm", &err);
          v[r] = bench_now() - t0;
          tport_free(c, &info.ref, NULL);
          t0 = bench_now();
          if (tport_get_shm(c, &kept.ref, out, 0, n, NULL, NULL, &err))
            die("get_shm", &err);
          v2[r] = bench_now() - t0;
        }
      }
    }
    char name[128];
    snprintf(name, sizeof name, "put_shm_%zuMiB_vs_memcpy%s", mib, suffix);
    emit(name, n, v, b, reps, "memcpy");
    snprintf(name, sizeof name, "get_shm_%zuMiB_vs_memcpy%s", mib, suffix);
    emit(name, n, v2, b2, reps, "memcpy");
    /* automatic region vs the socket (ipc://), the order swapped every rep */
    for (int r = 0; r < reps; r++) {
      for (int k = 0; k < 2; k++) {
        bool shm = (k == 0) == (r % 2 == 0);
        tport_client *who = shm ? c : plain;
        double t0 = bench_now();
        if (tport_put(who, TPORT_UINT8, 1, &sz, NULL, user, n, opts, &info, &err))
          die("put", &err);
        (shm ? v : b)[r] = bench_now() - t0;
        tport_free(who, &info.ref, NULL);
        t0 = bench_now();
        if (tport_get(who, &kept.ref, back, n, NULL, NULL, NULL, &err))
          die("get", &err);
        (shm ? v2 : b2)[r] = bench_now() - t0;
      }
    }
    snprintf(name, sizeof name, "put_auto_shm_%zuMiB_vs_ipc%s", mib, suffix);
    emit(name, n, v, b, reps, "ipc");
    snprintf(name, sizeof name, "get_auto_shm_%zuMiB_vs_ipc%s", mib, suffix);
    emit(name, n, v2, b2, reps, "ipc");
    /* automatic region vs an explicit one filled in place, the order
     * swapped every rep */
    for (int r = 0; r < reps; r++) {
      for (int k = 0; k < 2; k++) {
        bool automatic = (k == 0) == (r % 2 == 0);
        double t0 = bench_now();
        if (automatic ? tport_put(c, TPORT_UINT8, 1, &sz, NULL, user, n, opts, &info, &err)
                      : tport_put_shm(c, in, 0, TPORT_UINT8, 1, &sz, NULL, opts, &info, &err))
          die("put", &err);
        (automatic ? v : b)[r] = bench_now() - t0;
        tport_free(c, &info.ref, NULL);
        t0 = bench_now();
        if (automatic ? tport_get(c, &kept.ref, back, n, NULL, NULL, NULL, &err)
                      : tport_get_shm(c, &kept.ref, out, 0, n, NULL, NULL, &err))
          die("get", &err);
        (automatic ? v2 : b2)[r] = bench_now() - t0;
      }
    }
    snprintf(name, sizeof name, "put_auto_shm_%zuMiB_vs_put_shm%s", mib, suffix);
    emit(name, n, v, b, reps, "put_shm");
    snprintf(name, sizeof name, "get_auto_shm_%zuMiB_vs_get_shm%s", mib, suffix);
    emit(name, n, v2, b2, reps, "get_shm");
    /* the caller's buffer read (a put) or written (a get) by the server vs
     * the automatic region (a device's tensor takes the region either way) */
    for (int r = 0; r < reps && !device; r++) {
      for (int k = 0; k < 2; k++) {
        bool direct = (k == 0) == (r % 2 == 0);
        tport_client *who = direct ? c : regional;
        double t0 = bench_now();
        if (tport_put(who, TPORT_UINT8, 1, &sz, NULL, user, n, opts, &info, &err))
          die("put", &err);
        (direct ? v2 : b2)[r] = bench_now() - t0;
        tport_free(who, &info.ref, NULL);
        t0 = bench_now();
        if (tport_get(who, &kept.ref, back, n, NULL, NULL, NULL, &err))
          die("get", &err);
        (direct ? v : b)[r] = bench_now() - t0;
      }
    }
    if (!device && memcmp(back, user, n))
      die("the bytes came back wrong", NULL);
    snprintf(name, sizeof name, "put_direct_%zuMiB_vs_region%s", mib, suffix);
    if (!device)
      emit(name, n, v2, b2, reps, "automatic_region");
    snprintf(name, sizeof name, "get_direct_%zuMiB_vs_region%s", mib, suffix);
    if (!device)
      emit(name, n, v, b, reps, "automatic_region");
    /* the copy alone: the pool vs one memcpy (v, b) and vs as many fresh
     * threads (v2 reused for the pool's second timing, b2) */
    int k = copy_pool_threads();
    for (int r = 0; r < reps; r++) {
      for (int o = 0; o < 3; o++) {
        double t0 = bench_now();
        switch ((o + r) % 3) {
        case 0: copy_pool_copy(dst, user, n), v[r] = bench_now() - t0; break;
        case 1: memcpy(dst, user, n), b[r] = bench_now() - t0; break;
        default: split_memcpy(dst, user, n, k), b2[r] = bench_now() - t0; break;
        }
      }
      v2[r] = v[r];
    }
    if (memcmp(dst, user, n))
      die("the copy came out wrong", NULL);
    snprintf(name, sizeof name, "copy_pool_%zuMiB_vs_memcpy%s", mib, suffix);
    emit(name, n, v, b, reps, "memcpy");
    snprintf(name, sizeof name, "copy_pool_%zuMiB_vs_threads%s", mib, suffix);
    emit(name, n, v2, b2, reps, "memcpy_split_fresh_threads");
    tport_free(c, &kept.ref, NULL);
    tport_shm_release(in, NULL);
    tport_shm_release(out, NULL);
    free(user);
    free(dst);
    free(back);
  }
  tport_close(c);
  tport_close(plain);
  tport_close(regional);
  server_stop(s, 1000);
  config_free(&cfg);
  rmdir(dir);
  free(v);
  free(b);
  free(v2);
  free(b2);
  return 0;
}
