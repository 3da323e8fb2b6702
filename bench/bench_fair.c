/*
 * bench_fair.c: one tenant's small requests beside another tenant's large
 * copies.
 *
 * tportd runs in this process (cpu device, its default 4 workers) on ipc://.
 * Tenant "hog" has 8 connections with 4 threads on each, every thread
 * copying a 64 MiB tensor of its own into another over and over (Copy: a
 * worker busy for tens of milliseconds per request, 32 in flight at all
 * times); tenant "small" asks Info of a tiny
 * tensor, one request after the other.  Rows (JSON lines in bench/run's
 * format):
 *  - fair_info_p99_beside_copies: small's Info p99 (ms) while hog copies,
 *    vs the same Info's p99 on the idle server (measured in the same run,
 *    idle and loaded rounds interleaved).  Target (issue 20): <= 250 ms.
 *  - fair_info_p99_beside_copies_no_reserved_worker: the same with
 *    --tenant-workers 4 (round-robin, but hog may hold every worker): what
 *    the reserved worker buys.
 *  - fair_info_p50_beside_copies: the median, for the shape.
 *  - fair_info_p99_one_queue_beside_copies: the Info sent as tenant hog,
 *    so that it waits in hog's own queue behind its copies: what one queue
 *    for everyone (the server before the fair queue) gave.
 *
 *   tport-bench-fair [--rounds R] [--samples N]
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "config.h"
#include "server.h"
#include "tport.h"

#define HOG_CONNECTIONS 8
#define HOG_THREADS 4 /* per connection */
#define HOG_BYTES ((size_t)64 << 20)

static void die(const char *what, const tport_err *err)
{
  fprintf(stderr, "bench_fair: %s: %s\n", what, err ? err->msg : "");
  exit(1);
}

static double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static tport_client *connect_as(const char *url, const char *tenant)
{
  tport_connect_options o = {.tenant = tenant, .timeout_ms = 60000, .no_shm = true};
  tport_client *c;
  tport_err err;
  if (tport_connect(url, &o, &c, &err))
    die("connect", &err);
  return c;
}

typedef struct hog {
  tport_client *c;
  atomic_bool *stop;
  atomic_long *copies;
} hog;

static void *hog_main(void *arg)
{
  hog *h = arg;
  int64_t n = (int64_t)HOG_BYTES;
  tport_tensor_info a, b;
  tport_err err;
  uint8_t *v = calloc(1, HOG_BYTES);
  if (tport_put(h->c, TPORT_UINT8, 1, &n, NULL, v, HOG_BYTES, NULL, &a, &err) ||
      tport_put(h->c, TPORT_UINT8, 1, &n, NULL, v, HOG_BYTES, NULL, &b, &err))
    die("hog's put", &err);
  free(v);
  while (!atomic_load(h->stop)) {
    if (tport_copy(h->c, &b.ref, &a.ref, false, &err))
      die("hog's copy", &err);
    atomic_fetch_add(h->copies, 1);
  }
  tport_free(h->c, &a.ref, NULL);
  tport_free(h->c, &b.ref, NULL);
  return NULL;
}

static int cmp(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Info round trips of small's, n of them: their p50 and p99 in ms. */
static void info_latency(tport_client *c, const tport_ref *ref, int n, double *p50, double *p99)
{
  double *t = malloc((size_t)n * sizeof *t);
  tport_err err;
  for (int i = 0; i < n; i++) {
    tport_tensor_info info;
    double t0 = now_s();
    if (tport_info(c, ref, &info, &err))
      die("small's info", &err);
    t[i] = (now_s() - t0) * 1e3;
    usleep(2000); /* a request now and then, as a control client asks */
  }
  qsort(t, (size_t)n, sizeof *t, cmp);
  *p50 = t[n / 2];
  *p99 = t[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1];
  free(t);
}

/* One server: rounds of (idle, loaded) p99s, interleaved. */
static void run(int tenant_workers, const char *prober, int rounds, int samples, double *idle99,
                double *busy99, double *busy50, long *copies_done)
{
  server_config cfg;
  config_defaults(&cfg);
  cfg.devices = strdup("cpu");
  cfg.log_level = 0;
  cfg.tenant_workers = tenant_workers;
  cfg.max_tensor_bytes = (size_t)1 << 30;
  cfg.deadline_ms = 600000; /* the one-queue run queues hog's copies for long */
  char url[128];
  snprintf(url, sizeof url, "ipc:///tmp/tport-bench-fair-%d-%d.sock", (int)getpid(),
           tenant_workers);
  cfg.listen[0] = strdup(url);
  cfg.nlisten = 1;
  server *s;
  tport_err err;
  if (server_start(&cfg, &s, &err))
    die("server_start", &err);
  config_free(&cfg);
  tport_client *c = connect_as(url, prober);
  int64_t n = 16;
  uint8_t v[16] = {0};
  tport_tensor_info t;
  if (tport_put(c, TPORT_UINT8, 1, &n, NULL, v, sizeof v, NULL, &t, &err))
    die("small's put", &err);
  double *i99 = calloc((size_t)rounds, sizeof(double)), *b99 = calloc((size_t)rounds, sizeof(double)),
         *b50 = calloc((size_t)rounds, sizeof(double));
  atomic_long copies = 0;
  for (int r = 0; r < rounds; r++) {
    double p50;
    info_latency(c, &t.ref, samples, &p50, &i99[r]);
    atomic_bool stop = false;
    tport_client *hc[HOG_CONNECTIONS];
    hog h[HOG_CONNECTIONS * HOG_THREADS];
    pthread_t th[HOG_CONNECTIONS * HOG_THREADS];
    for (int i = 0; i < HOG_CONNECTIONS; i++)
      hc[i] = connect_as(url, "hog");
    for (int i = 0; i < HOG_CONNECTIONS * HOG_THREADS; i++) {
      h[i] = (hog){.c = hc[i % HOG_CONNECTIONS], .stop = &stop, .copies = &copies};
      pthread_create(&th[i], NULL, hog_main, &h[i]);
    }
    /* the hog's copies under way before measuring */
    long before = atomic_load(&copies);
    while (atomic_load(&copies) < before + HOG_CONNECTIONS * HOG_THREADS)
      usleep(1000);
    info_latency(c, &t.ref, samples, &b50[r], &b99[r]);
    atomic_store(&stop, true);
    for (int i = 0; i < HOG_CONNECTIONS * HOG_THREADS; i++)
      pthread_join(th[i], NULL);
    for (int i = 0; i < HOG_CONNECTIONS; i++)
      tport_close(hc[i]);
  }
  *idle99 = bench_median(i99, rounds);
  *busy99 = bench_median(b99, rounds);
  *busy50 = bench_median(b50, rounds);
  *copies_done = atomic_load(&copies);
  free(i99);
  free(b99);
  free(b50);
  tport_close(c);
  server_stop(s, 2000);
}

static void emit(const char *name, double v, double b, int rounds, int samples, long copies)
{
  printf("{\"bench\": \"%s\", \"value\": %.3f, \"unit\": \"ms\", \"baseline\": %.3f, "
         "\"ratio\": %.3f, \"baseline_name\": \"idle_server_p99\", \"rounds\": %d, "
         "\"samples\": %d, \"hog_copies\": %ld, \"target_ms\": 250}\n",
         name, v, b, b > 0 ? v / b : 0.0, rounds, samples, copies);
  fflush(stdout);
}

int main(int argc, char **argv)
{
  int rounds = 3, samples = 200;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
      rounds = atoi(argv[++i]);
    else if (strcmp(argv[i], "--samples") == 0 && i + 1 < argc)
      samples = atoi(argv[++i]);
    else {
      fprintf(stderr, "usage: tport-bench-fair [--rounds R] [--samples N]\n");
      return 2;
    }
  }
  if (rounds < 1 || samples < 100)
    return 2;
  double idle, busy, busy50;
  long copies;
  run(0, "small", rounds, samples, &idle, &busy, &busy50, &copies);
  emit("fair_info_p99_beside_copies", busy, idle, rounds, samples, copies);
  emit("fair_info_p50_beside_copies", busy50, idle, rounds, samples, copies);
  run(4, "small", rounds, samples, &idle, &busy, &busy50, &copies);
  emit("fair_info_p99_beside_copies_no_reserved_worker", busy, idle, rounds, samples, copies);
  run(0, "hog", rounds, samples, &idle, &busy, &busy50, &copies);
  emit("fair_info_p99_one_queue_beside_copies", busy, idle, rounds, samples, copies);
  return 0;
}
