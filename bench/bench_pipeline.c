/*
 * bench_pipeline.c: what a data pipeline does with tensorport, against the
 * ways without issue 21's API, interleaved rep by rep (medians):
 *
 *   put_batch_resnet50_{tcp,ipc}_vs_single_put   tport_put_batch of a
 *       ResNet-50 state dict (161 float32 tensors, 25.6 M parameters,
 *       ~102 MB; the shapes made here from the architecture) vs one
 *       tport_put of the same bytes as one tensor;
 *   get_batch_resnet50_{tcp,ipc}_vs_single_get   the same for the gets;
 *   async_put_4k_x10000_{tcp,ipc}_vs_blocking_loop   10,000 puts of 4 KiB
 *       issued with tport_put_async, then waited for, vs a loop of tport_put;
 *   batch_put_4k_x10000_{tcp,ipc}_vs_blocking_loop   the same as one
 *       tport_put_batch.
 *
 * value and baseline are seconds; ratio is baseline / value (> 1: faster
 * than the baseline).  tportd runs in this process (cpu device) on a
 * loopback tcp port and an ipc:// path, its shm socket on as tportd's
 * defaults have it: the tcp and ipc rows' clients keep off it (no_shm: the
 * bytes cross the socket, as a remote client's would), the ipc_shm rows'
 * use it as a same-host client does by default (large tensors and a
 * batch's small ones through the automatic region).  Each rep connects
 * anew, so that the tensors of the one before (connection-scoped) are gone
 * -- and so a batch through the region makes its region in the time.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "config.h"
#include "server.h"
#include "tport.h"

#define SMALL_N 10000
#define SMALL_BYTES 4096
#define MAX_TENSORS 161

static void die(const char *what, const tport_err *e)
{
  fprintf(stderr, "bench_pipeline: %s: %s\n", what, e ? e->msg : "");
  exit(1);
}

/* ---------------------------------------------------------------- ResNet-50 */

typedef struct shape {
  int ndim;
  int64_t sizes[4];
} shape;

static int add(shape *s, int n, int ndim, int64_t a, int64_t b, int64_t c, int64_t d)
{
  s[n] = (shape){ndim, {a, b, c, d}};
  return n + 1;
}

/* A convolution's weight and its batch norm's weight and bias. */
static int conv_bn(shape *s, int n, int64_t out, int64_t in, int64_t k)
{
  n = add(s, n, 4, out, in, k, k);
  n = add(s, n, 1, out, 0, 0, 0);
  return add(s, n, 1, out, 0, 0, 0);
}

/* torchvision's resnet50 parameters: the stem, 16 bottlenecks in layers of
 * 3, 4, 6, 3 (a downsample in each layer's first), the classifier. */
static int resnet50(shape *s)
{
  static const int blocks[4] = {3, 4, 6, 3};
  int n = conv_bn(s, 0, 64, 3, 7);
  int64_t in = 64;
  for (int l = 0; l < 4; l++) {
    int64_t planes = (int64_t)64 << l;
    for (int b = 0; b < blocks[l]; b++) {
      n = conv_bn(s, n, planes, in, 1);
      n = conv_bn(s, n, planes, planes, 3);
      n = conv_bn(s, n, planes * 4, planes, 1);
      if (b == 0)
        n = conv_bn(s, n, planes * 4, in, 1);
      in = planes * 4;
    }
  }
  n = add(s, n, 2, 1000, 2048, 0, 0);
  return add(s, n, 1, 1000, 0, 0, 0);
}

static int64_t numel(const shape *s)
{
  int64_t n = 1;
  for (int d = 0; d < s->ndim; d++)
    n *= s->sizes[d];
  return n;
}

/* ---------------------------------------------------------------- timing */

/* Whether the clients of the rows now running may use shared memory. */
static bool use_shm;

static tport_client *connect_to(const char *url)
{
  tport_client *c;
  tport_err err;
  tport_connect_options o = {.no_shm = !use_shm};
  if (tport_connect(url, &o, &c, &err))
    die("connect", &err);
  return c;
}

/* A counter of the server's Stats (-1: absent). */
static int64_t counter(tport_client *c, const char *name)
{
  tport_counter *v;
  size_t n;
  tport_err err;
  if (tport_stats(c, &v, &n, &err))
    die("stats", &err);
  int64_t r = -1;
  for (size_t i = 0; i < n; i++)
    if (!strcmp(v[i].name, name))
      r = v[i].value;
  free(v);
  return r;
}

/* Waits (up to 10 s) until the server holds none of the tenant's tensors
 * (every run's client put as the same tenant, and closed): a closed
 * client's tensors are freed by the server after the close returns, and that work ran into the next timed run -- 10,000
 * frees after each 10,000 puts, ~20 ms taken from whichever run came next
 * (the blocking loop's second does not notice; an async run's 50 ms did). */
static void settle(const char *url)
{
  tport_client *c = connect_to(url);
  for (int i = 0; i < 2000; i++) {
    if (counter(c, "tensors") == 0)
      break;
    usleep(5000);
  }
  tport_close(c);
}

typedef struct dict {
  shape shapes[MAX_TENSORS];
  int n;
  size_t total;
  float *bytes; /* the tensors one after another */
  tport_put_item puts[MAX_TENSORS];
  tport_get_item gets[MAX_TENSORS];
} dict;

static double put_dict(tport_client *c, dict *d)
{
  size_t off = 0;
  for (int i = 0; i < d->n; i++) {
    size_t n = (size_t)numel(&d->shapes[i]);
    d->puts[i] = (tport_put_item){.dtype = TPORT_FLOAT32,
                                  .ndim = d->shapes[i].ndim,
                                  .sizes = d->shapes[i].sizes,
                                  .data = d->bytes + off,
                                  .nbytes = n * sizeof(float)};
    off += n;
  }
  tport_err err;
  double t0 = bench_now();
  if (tport_put_batch(c, d->puts, (size_t)d->n, &err))
    die("put_batch", &err);
  return bench_now() - t0;
}

static double get_dict(tport_client *c, dict *d, float *into)
{
  size_t off = 0;
  for (int i = 0; i < d->n; i++) {
    d->gets[i] = (tport_get_item){.ref = d->puts[i].info.ref,
                                  .buf = into + off,
                                  .cap = d->puts[i].nbytes};
    off += d->puts[i].nbytes / sizeof(float);
  }
  tport_err err;
  double t0 = bench_now();
  if (tport_get_batch(c, d->gets, (size_t)d->n, &err))
    die("get_batch", &err);
  return bench_now() - t0;
}

static double put_one(tport_client *c, const dict *d, tport_tensor_info *info)
{
  int64_t n = (int64_t)(d->total / sizeof(float));
  tport_err err;
  double t0 = bench_now();
  if (tport_put(c, TPORT_FLOAT32, 1, &n, NULL, d->bytes, d->total, NULL, info, &err))
    die("put", &err);
  return bench_now() - t0;
}

static double get_one(tport_client *c, const dict *d, const tport_tensor_info *info, float *into)
{
  tport_err err;
  double t0 = bench_now();
  if (tport_get(c, &info->ref, into, d->total, NULL, NULL, NULL, &err))
    die("get", &err);
  return bench_now() - t0;
}

static void emit(const char *name, double v, double b, const char *base, const char *extra)
{
  printf("{\"bench\": \"%s\", \"value\": %.6f, \"unit\": \"s\", \"baseline\": %.6f, "
         "\"baseline_name\": \"%s\", \"ratio\": %.3f%s}\n",
         name, v, b, base, b / v, extra);
  fflush(stdout);
}

static void state_dict_rows(const char *url, const char *tr, dict *d, int reps)
{
  double *pb = calloc((size_t)reps, sizeof(double)), *ps = calloc((size_t)reps, sizeof(double));
  double *gb = calloc((size_t)reps, sizeof(double)), *gs = calloc((size_t)reps, sizeof(double));
  float *into = malloc(d->total);
  for (int r = 0; r < reps; r++) {
    /* the order swapped every rep */
    for (int k = 0; k < 2; k++) {
      tport_client *c = connect_to(url);
      if ((k ^ r) & 1) {
        pb[r] = put_dict(c, d);
        gb[r] = get_dict(c, d, into);
        if (memcmp(into, d->bytes, d->total))
          die("the batch's values came back wrong", NULL);
      } else {
        tport_tensor_info info;
        ps[r] = put_one(c, d, &info);
        gs[r] = get_one(c, d, &info, into);
      }
      tport_close(c);
      settle(url);
    }
  }
  char name[96], extra[96];
  snprintf(extra, sizeof extra, ", \"tensors\": %d, \"bytes\": %zu, \"reps\": %d", d->n, d->total,
           reps);
  snprintf(name, sizeof name, "put_batch_resnet50_%s_vs_single_put", tr);
  emit(name, bench_median(pb, reps), bench_median(ps, reps), "put_one_tensor_same_bytes", extra);
  snprintf(name, sizeof name, "get_batch_resnet50_%s_vs_single_get", tr);
  emit(name, bench_median(gb, reps), bench_median(gs, reps), "get_one_tensor_same_bytes", extra);
  free(pb), free(ps), free(gb), free(gs), free(into);
}

/* ---------------------------------------------------------------- 10,000 x 4 KiB */

static double small_blocking(const char *url, const uint8_t *data)
{
  tport_client *c = connect_to(url);
  int64_t n = SMALL_BYTES;
  tport_err err;
  double t0 = bench_now();
  for (int i = 0; i < SMALL_N; i++)
    if (tport_put(c, TPORT_UINT8, 1, &n, NULL, data + (size_t)i * SMALL_BYTES, SMALL_BYTES, NULL,
                  NULL, &err))
      die("put", &err);
  double t = bench_now() - t0;
  tport_close(c);
  return t;
}

static double small_async(const char *url, const uint8_t *data, tport_request **reqs)
{
  tport_client *c = connect_to(url);
  int64_t n = SMALL_BYTES;
  tport_err err;
  double t0 = bench_now();
  for (int i = 0; i < SMALL_N; i++)
    if (tport_put_async(c, TPORT_UINT8, 1, &n, NULL, data + (size_t)i * SMALL_BYTES, SMALL_BYTES,
                        NULL, NULL, NULL, NULL, &reqs[i], &err))
      die("put_async", &err);
  for (int i = 0; i < SMALL_N; i++)
    if (tport_wait(reqs[i], -1, &err))
      die("wait", &err);
  double t = bench_now() - t0;
  for (int i = 0; i < SMALL_N; i++)
    tport_request_free(reqs[i]);
  tport_close(c);
  return t;
}

static double small_batch(const char *url, const uint8_t *data, tport_put_item *items)
{
  tport_client *c = connect_to(url);
  static int64_t n = SMALL_BYTES;
  for (int i = 0; i < SMALL_N; i++)
    items[i] = (tport_put_item){.dtype = TPORT_UINT8,
                                .ndim = 1,
                                .sizes = &n,
                                .data = data + (size_t)i * SMALL_BYTES,
                                .nbytes = SMALL_BYTES};
  tport_err err;
  double t0 = bench_now();
  if (tport_put_batch(c, items, SMALL_N, &err))
    die("put_batch", &err);
  double t = bench_now() - t0;
  tport_close(c);
  return t;
}

static void small_rows(const char *url, const char *tr, int reps)
{
  uint8_t *data = malloc((size_t)SMALL_N * SMALL_BYTES);
  for (size_t i = 0; i < (size_t)SMALL_N * SMALL_BYTES; i++)
    data[i] = (uint8_t)(i * 7);
  tport_request **reqs = calloc(SMALL_N, sizeof *reqs);
  tport_put_item *items = calloc(SMALL_N, sizeof *items);
  double *bl = calloc((size_t)reps, sizeof(double)), *as = calloc((size_t)reps, sizeof(double)),
         *ba = calloc((size_t)reps, sizeof(double));
  for (int r = 0; r < reps; r++) {
    /* rotated every rep */
    for (int k = 0; k < 3; k++) {
      int which = (k + r) % 3;
      if (which == 0)
        bl[r] = small_blocking(url, data);
      else if (which == 1)
        as[r] = small_async(url, data, reqs);
      else
        ba[r] = small_batch(url, data, items);
      settle(url);
    }
  }
  char name[96], extra[96];
  snprintf(extra, sizeof extra, ", \"puts\": %d, \"bytes_each\": %d, \"reps\": %d", SMALL_N,
           SMALL_BYTES, reps);
  double b = bench_median(bl, reps);
  snprintf(name, sizeof name, "async_put_4k_x10000_%s_vs_blocking_loop", tr);
  emit(name, bench_median(as, reps), b, "tport_put_loop", extra);
  snprintf(name, sizeof name, "batch_put_4k_x10000_%s_vs_blocking_loop", tr);
  emit(name, bench_median(ba, reps), b, "tport_put_loop", extra);
  free(data), free(reqs), free(items), free(bl), free(as), free(ba);
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
  int reps = 5;
  const char *rows = "all"; /* or "dict", "small": one kind of row */
  for (int i = 1; i + 1 < argc; i += 2)
    if (!strcmp(argv[i], "--reps"))
      reps = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--rows"))
      rows = argv[i + 1];
  if (reps < 1 || reps > 1000)
    reps = 5;
  char dir[] = "/tmp/tport-bench-pipeline-XXXXXX";
  if (!mkdtemp(dir))
    die("mkdtemp", NULL);
  char ipc[128], tcp[64];
  snprintf(ipc, sizeof ipc, "ipc://%s/p.ipc", dir);
  snprintf(tcp, sizeof tcp, "tcp://127.0.0.1:%d", 20000 + (int)(getpid() % 20000));
  server_config cfg;
  config_defaults(&cfg);
  cfg.listen[0] = strdup(tcp);
  cfg.listen[1] = strdup(ipc);
  cfg.nlisten = 2;
  cfg.devices = strdup("cpu");
  cfg.log_level = 0;
  char sock[160];
  snprintf(sock, sizeof sock, "%s/shm.sock", dir);
  cfg.shm_socket = strdup(sock);
  cfg.shm_socket_set = true;
  server *s;
  tport_err err;
  if (server_start(&cfg, &s, &err))
    die("server_start", &err);
  dict *d = calloc(1, sizeof *d);
  d->n = resnet50(d->shapes);
  int64_t params = 0;
  for (int i = 0; i < d->n; i++)
    params += numel(&d->shapes[i]);
  d->total = (size_t)params * sizeof(float);
  d->bytes = malloc(d->total);
  for (int64_t i = 0; i < params; i++)
    d->bytes[i] = (float)(i % 1000) * 0.001f;
  if (d->n != MAX_TENSORS || params != 25557032)
    die("the ResNet-50 shapes are not torchvision's (161 tensors, 25,557,032 parameters)", NULL);
  const char *urls[3] = {tcp, ipc, ipc}, *names[3] = {"tcp", "ipc", "ipc_shm"};
  for (int t = 0; t < 3 && strcmp(rows, "small"); t++) {
    use_shm = t == 2;
    state_dict_rows(urls[t], names[t], d, reps);
  }
  for (int t = 0; t < 3 && strcmp(rows, "dict"); t++) {
    use_shm = t == 2;
    small_rows(urls[t], names[t], reps);
  }
  server_stop(s, 1000);
  free(d->bytes);
  free(d);
  char path[160];
  snprintf(path, sizeof path, "%s/p.ipc", dir);
  unlink(path);
  unlink(sock);
  rmdir(dir);
  return 0;
}
