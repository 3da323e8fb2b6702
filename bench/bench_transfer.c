/*
 * bench_transfer.c: libtport + tportd against raw nng REQ/REP moving the same
 * bytes in the same chunk size with the same window, in the same run.
 * Prints JSON lines {"op", "transport", "bytes", "seconds", "baseline_seconds"}
 * (and for the small RPC p50/p99 in microseconds); bench/run turns them into
 * ratio lines.
 *
 * With --tls-cert/--tls-key (a server certificate and key for 127.0.0.1, e.g.
 * a throwaway self-signed one that bench/run makes with `openssl req`), the
 * server also listens on tls+tcp://127.0.0.1 (tensorport's OpenSSL engine for
 * nng, TLS 1.3) and put/get at 16 and 256 MiB over it are measured against
 * the same over plain tcp://, the two interleaved rep by rep (the order
 * swapped every rep); those lines carry "baseline": "tcp", and a "tls_info"
 * line names nng's TLS engine and counts the TLS 1.3 / 1.2 handshakes the
 * process made (the client's and the server's end).  --only-tls skips
 * everything else.  There is no raw-nng TLS baseline: the nng tensorport
 * links (deploy/nng) is built with no TLS engine of its own (no mbedTLS), so
 * the OpenSSL engine is the only one a process can use.
 *
 *   tport-bench-transfer [--max-mib N] [--reps R] [--device D]
 *                        [--tls-cert F --tls-key F [--tls-reps R] [--only-tls]]
 */
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "server.h"
#include "tls_openssl.h"
#include "tport.h"

#define CHUNK (4u << 20)
#define WINDOW 8
#define RAW_CTX 32

/* ---------------------------------------------------------------- raw nng server
 * A request is "P" + bytes (a put chunk: answered with a 1-byte ack), "G" +
 * u64 length (a get chunk: answered with that many bytes), or "E" + bytes
 * (an echo). */
typedef struct raw_ctx {
  nng_ctx ctx;
  nng_aio *aio;
  int sending;
} raw_ctx;

static uint8_t *raw_source;
static size_t raw_source_len;

static void raw_cb(void *arg)
{
  raw_ctx *x = arg;
  if (nng_aio_result(x->aio) != 0) {
    if (x->sending)
      nng_msg_free(nng_aio_get_msg(x->aio));
    if (nng_aio_result(x->aio) == NNG_ECLOSED)
      return;
    x->sending = 0;
    nng_ctx_recv(x->ctx, x->aio);
    return;
  }
  if (x->sending) {
    x->sending = 0;
    nng_ctx_recv(x->ctx, x->aio);
    return;
  }
  nng_msg *m = nng_aio_get_msg(x->aio), *r;
  const uint8_t *b = nng_msg_body(m);
  if (b[0] == 'G') {
    uint64_t len;
    memcpy(&len, b + 1, 8);
    nng_msg_alloc(&r, len);
    memcpy(nng_msg_body(r), raw_source, len < raw_source_len ? len : raw_source_len);
    nng_msg_free(m);
  } else if (b[0] == 'P') {
    nng_msg_alloc(&r, 1);
    nng_msg_free(m);
  } else {
    r = m; /* echo */
  }
  x->sending = 1;
  nng_aio_set_msg(x->aio, r);
  nng_ctx_send(x->ctx, x->aio);
}

static nng_socket raw_start(const char *url, raw_ctx *ctxs)
{
  nng_socket s;
  nng_rep0_open(&s);
  nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, (size_t)80 << 20);
  for (int i = 0; i < RAW_CTX; i++) {
    nng_aio_alloc(&ctxs[i].aio, raw_cb, &ctxs[i]);
    nng_ctx_open(&ctxs[i].ctx, s);
  }
  if (nng_listen(s, url, NULL, 0) != 0) {
    fprintf(stderr, "raw: cannot listen on %s\n", url);
    exit(1);
  }
  for (int i = 0; i < RAW_CTX; i++)
    nng_ctx_recv(ctxs[i].ctx, ctxs[i].aio);
  return s;
}

static void raw_stop(nng_socket s, raw_ctx *ctxs)
{
  nng_close(s);
  for (int i = 0; i < RAW_CTX; i++) {
    nng_aio_stop(ctxs[i].aio);
    nng_aio_free(ctxs[i].aio);
  }
}

/* A windowed transfer over raw REQ contexts: put sends data, get receives it. */
static void raw_transfer(nng_socket s, bool put, uint8_t *data, size_t n)
{
  nng_ctx ctx[WINDOW];
  nng_aio *aio[WINDOW];
  size_t off[WINDOW], len[WINDOW];
  for (int i = 0; i < WINDOW; i++) {
    nng_ctx_open(&ctx[i], s);
    nng_aio_alloc(&aio[i], NULL, NULL);
  }
  size_t next = 0;
  int head = 0, inflight = 0;
  while (next < n || inflight) {
    while (inflight < WINDOW && next < n) {
      int k = (head + inflight) % WINDOW;
      off[k] = next;
      len[k] = n - next < CHUNK ? n - next : CHUNK;
      nng_msg *m;
      if (put) {
        nng_msg_alloc(&m, 1 + len[k]);
        uint8_t *b = nng_msg_body(m);
        b[0] = 'P';
        memcpy(b + 1, data + next, len[k]);
      } else {
        nng_msg_alloc(&m, 9);
        uint8_t *b = nng_msg_body(m);
        b[0] = 'G';
        uint64_t l = len[k];
        memcpy(b + 1, &l, 8);
      }
      nng_aio_set_msg(aio[k], m);
      nng_ctx_send(ctx[k], aio[k]);
      next += len[k];
      inflight++;
    }
    int k = head;
    nng_aio_wait(aio[k]);
    nng_ctx_recv(ctx[k], aio[k]);
    nng_aio_wait(aio[k]);
    nng_msg *r = nng_aio_get_msg(aio[k]);
    if (!put)
      memcpy(data + off[k], nng_msg_body(r), len[k]);
    nng_msg_free(r);
    head = (head + 1) % WINDOW;
    inflight--;
  }
  for (int i = 0; i < WINDOW; i++) {
    nng_aio_free(aio[i]);
    nng_ctx_close(ctx[i]);
  }
}

/* ---------------------------------------------------------------- benches */

static int reps = 5;
static const char *put_device; /* --device: where puts land (default cpu) */

static void bench_size(const char *transport, const char *turl, const char *rurl, size_t n)
{
  uint8_t *data = malloc(n), *back = malloc(n);
  memset(data, 7, n);
  tport_client *c;
  tport_err err;
  if (tport_connect(turl, NULL, &c, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    exit(1);
  }
  nng_socket raw;
  nng_req0_open(&raw);
  nng_socket_set_ms(raw, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
  nng_socket_set_size(raw, NNG_OPT_RECVMAXSZ, (size_t)80 << 20);
  nng_dial(raw, rurl, NULL, 0);
  double tp[16], tg[16], rp[16], rg[16];
  int64_t sz = (int64_t)n;
  for (int r = 0; r < reps; r++) {
    tport_tensor_info info;
    tport_put_options po;
    tport_put_options_init(&po);
    po.device = put_device;
    double t0 = bench_now();
    if (tport_put(c, TPORT_UINT8, 1, &sz, NULL, data, n, &po, &info, &err)) {
      fprintf(stderr, "put: %s\n", err.msg);
      exit(1);
    }
    tp[r] = bench_now() - t0;
    t0 = bench_now();
    if (tport_get(c, &info.ref, back, n, NULL, NULL, NULL, &err)) {
      fprintf(stderr, "get: %s\n", err.msg);
      exit(1);
    }
    tg[r] = bench_now() - t0;
    tport_free(c, &info.ref, NULL);
    t0 = bench_now();
    raw_transfer(raw, true, data, n);
    rp[r] = bench_now() - t0;
    t0 = bench_now();
    raw_transfer(raw, false, back, n);
    rg[r] = bench_now() - t0;
  }
  printf("{\"op\": \"put\", \"transport\": \"%s\", \"bytes\": %zu, \"seconds\": %.6f, "
         "\"baseline_seconds\": %.6f}\n",
         transport, n, bench_median(tp, reps), bench_median(rp, reps));
  printf("{\"op\": \"get\", \"transport\": \"%s\", \"bytes\": %zu, \"seconds\": %.6f, "
         "\"baseline_seconds\": %.6f}\n",
         transport, n, bench_median(tg, reps), bench_median(rg, reps));
  fflush(stdout);
  nng_close(raw);
  tport_close(c);
  free(data);
  free(back);
}

static void bench_small_rpc(const char *turl, const char *rurl)
{
  enum { N = 3000 };
  static double t[N], r[N];
  tport_client *c;
  tport_connect(turl, NULL, &c, NULL);
  uint8_t v[4] = {1, 2, 3, 4};
  tport_tensor_info info;
  tport_put(c, TPORT_UINT8, 1, (int64_t[]){4}, NULL, v, 4, NULL, &info, NULL);
  nng_socket raw;
  nng_req0_open(&raw);
  nng_dial(raw, rurl, NULL, 0);
  for (int i = 0; i < N; i++) {
    tport_tensor_info out;
    double t0 = bench_now();
    tport_info(c, &info.ref, &out, NULL);
    t[i] = bench_now() - t0;
    /* the echo carries as many bytes as an Info request does */
    nng_msg *m;
    nng_msg_alloc(&m, 40);
    ((uint8_t *)nng_msg_body(m))[0] = 'E';
    t0 = bench_now();
    nng_sendmsg(raw, m, 0);
    nng_recvmsg(raw, &m, 0);
    r[i] = bench_now() - t0;
    nng_msg_free(m);
  }
  qsort(t, N, sizeof t[0], bench_cmp_double);
  qsort(r, N, sizeof r[0], bench_cmp_double);
  printf("{\"op\": \"info_rtt\", \"transport\": \"tcp\", \"p50_us\": %.2f, \"p99_us\": %.2f, "
         "\"baseline_p50_us\": %.2f, \"baseline_p99_us\": %.2f}\n",
         t[N / 2] * 1e6, t[N * 99 / 100] * 1e6, r[N / 2] * 1e6, r[N * 99 / 100] * 1e6);
  fflush(stdout);
  nng_close(raw);
  tport_close(c);
}

/* put and get over tls+tcp:// vs the same over tcp://, the two interleaved:
 * every rep does put, get, free on one client then on the other, the order
 * swapped every rep so that neither always runs on a cache or allocator the
 * other warmed.  The clients connect (TLS handshake included) and move one
 * 1 MiB tensor each before the clock starts. */
static int tls_reps = 7;

static void bench_tls_size(tport_client *ct, tport_client *cs, size_t n)
{
  uint8_t *data = malloc(n), *back = malloc(n);
  memset(data, 7, n);
  tport_err err;
  double tp[2][16], tg[2][16];
  int64_t sz = (int64_t)n;
  for (int r = 0; r < tls_reps; r++) {
    for (int j = 0; j < 2; j++) {
      int w = (r + j) % 2; /* 0: tcp (the baseline), 1: tls */
      tport_client *c = w ? cs : ct;
      tport_tensor_info info;
      double t0 = bench_now();
      if (tport_put(c, TPORT_UINT8, 1, &sz, NULL, data, n, NULL, &info, &err)) {
        fprintf(stderr, "put (%s): %s\n", w ? "tls" : "tcp", err.msg);
        exit(1);
      }
      tp[w][r] = bench_now() - t0;
      t0 = bench_now();
      if (tport_get(c, &info.ref, back, n, NULL, NULL, NULL, &err)) {
        fprintf(stderr, "get (%s): %s\n", w ? "tls" : "tcp", err.msg);
        exit(1);
      }
      tg[w][r] = bench_now() - t0;
      tport_free(c, &info.ref, NULL);
      if (back[n - 1] != 7) {
        fprintf(stderr, "get (%s): wrong bytes\n", w ? "tls" : "tcp");
        exit(1);
      }
      back[n - 1] = 0;
    }
  }
  const char *ops[2] = {"put", "get"};
  for (int o = 0; o < 2; o++) {
    double(*t)[16] = o ? tg : tp;
    double tls = bench_median(t[1], tls_reps), tcp = bench_median(t[0], tls_reps);
    printf("{\"op\": \"%s\", \"transport\": \"tls\", \"bytes\": %zu, \"seconds\": %.6f, "
           "\"baseline_seconds\": %.6f, \"baseline\": \"tcp\", \"reps\": %d, "
           "\"seconds_min\": %.6f, \"seconds_max\": %.6f, \"baseline_seconds_min\": %.6f, "
           "\"baseline_seconds_max\": %.6f}\n",
           ops[o], n, tls, tcp, tls_reps, t[1][0], t[1][tls_reps - 1], t[0][0],
           t[0][tls_reps - 1]);
  }
  fflush(stdout);
  free(data);
  free(back);
}

static void bench_tls(const char *tcp_url, const char *tls_url, const char *ca, size_t max_mib)
{
  tport_client *ct, *cs;
  tport_err err;
  tport_connect_options o = {.tls_ca = ca};
  if (tport_connect(tcp_url, NULL, &ct, &err) || tport_connect(tls_url, &o, &cs, &err)) {
    fprintf(stderr, "tls bench: %s\n", err.msg);
    exit(1);
  }
  size_t warm = (size_t)1 << 20;
  uint8_t *d = calloc(warm, 1);
  int64_t sz = (int64_t)warm;
  for (int w = 0; w < 2; w++) {
    tport_tensor_info info;
    tport_client *c = w ? cs : ct;
    if (tport_put(c, TPORT_UINT8, 1, &sz, NULL, d, warm, NULL, &info, &err) ||
        tport_get(c, &info.ref, d, warm, NULL, NULL, NULL, &err)) {
      fprintf(stderr, "tls bench warm-up (%s): %s\n", w ? "tls" : "tcp", err.msg);
      exit(1);
    }
    tport_free(c, &info.ref, NULL);
  }
  free(d);
  transport_tls_stats st;
  transport_tls_stats_get(&st);
  /* the client's and the server's end of the one TLS connection */
  printf("{\"op\": \"tls_info\", \"engine\": \"%s\", \"handshakes_tls13\": %llu, "
         "\"handshakes_tls12\": %llu, \"failures\": %llu}\n",
         nng_tls_engine_name(), (unsigned long long)st.handshakes_tls13,
         (unsigned long long)st.handshakes_tls12, (unsigned long long)st.failures);
  fflush(stdout);
  for (size_t mib = 16; mib <= max_mib; mib *= 16)
    bench_tls_size(ct, cs, mib << 20);
  tport_close(cs);
  tport_close(ct);
}

typedef struct {
  const char *url;
  size_t n;
} agg_arg;

static void *agg_client(void *p)
{
  agg_arg *a = p;
  tport_client *c;
  tport_connect(a->url, NULL, &c, NULL);
  uint8_t *d = calloc(a->n, 1);
  int64_t sz = (int64_t)a->n;
  for (int r = 0; r < 2; r++) {
    tport_tensor_info info;
    tport_put(c, TPORT_UINT8, 1, &sz, NULL, d, a->n, NULL, &info, NULL);
    tport_get(c, &info.ref, d, a->n, NULL, NULL, NULL, NULL);
    tport_free(c, &info.ref, NULL);
  }
  free(d);
  tport_close(c);
  return NULL;
}

static double run_clients(const char *url, int k, size_t n)
{
  pthread_t t[16];
  agg_arg a = {url, n};
  double t0 = bench_now();
  for (int i = 0; i < k; i++)
    pthread_create(&t[i], NULL, agg_client, &a);
  for (int i = 0; i < k; i++)
    pthread_join(t[i], NULL);
  return bench_now() - t0;
}

int main(int argc, char **argv)
{
  size_t max_mib = 256;
  const char *tls_cert = NULL, *tls_key = NULL;
  bool only_tls = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--max-mib") == 0 && i + 1 < argc)
      max_mib = (size_t)atoi(argv[++i]);
    else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
      put_device = argv[++i];
    else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc)
      reps = atoi(argv[++i]) < 1 ? 1 : atoi(argv[i]) > 16 ? 16 : atoi(argv[i]);
    else if (strcmp(argv[i], "--tls-reps") == 0 && i + 1 < argc)
      tls_reps = atoi(argv[++i]) < 1 ? 1 : atoi(argv[i]) > 16 ? 16 : atoi(argv[i]);
    else if (strcmp(argv[i], "--tls-cert") == 0 && i + 1 < argc)
      tls_cert = argv[++i];
    else if (strcmp(argv[i], "--tls-key") == 0 && i + 1 < argc)
      tls_key = argv[++i];
    else if (strcmp(argv[i], "--only-tls") == 0)
      only_tls = true;
    else {
      fprintf(stderr, "tport-bench-transfer: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (only_tls && !tls_cert) {
    fprintf(stderr, "tport-bench-transfer: --only-tls needs --tls-cert\n");
    return 2;
  }
  char tcp_t[64], tcp_r[64], tls_t[64], ipc_t[96], ipc_r[96];
  int port = 30000 + (int)(getpid() % 20000);
  snprintf(tcp_t, sizeof tcp_t, "tcp://127.0.0.1:%d", port);
  snprintf(tcp_r, sizeof tcp_r, "tcp://127.0.0.1:%d", port + 1);
  snprintf(tls_t, sizeof tls_t, "tls+tcp://127.0.0.1:%d", port + 2);
  snprintf(ipc_t, sizeof ipc_t, "ipc:///tmp/tport-bench-%d-t.sock", (int)getpid());
  snprintf(ipc_r, sizeof ipc_r, "ipc:///tmp/tport-bench-%d-r.sock", (int)getpid());
  raw_source_len = CHUNK;
  raw_source = calloc(CHUNK, 1);

  server_config cfg;
  config_defaults(&cfg);
  cfg.listen[0] = strdup(tcp_t);
  cfg.listen[1] = strdup(ipc_t);
  cfg.nlisten = 2;
  if (tls_cert) {
    cfg.listen[cfg.nlisten++] = strdup(tls_t);
    cfg.tls_cert = strdup(tls_cert);
    cfg.tls_key = tls_key ? strdup(tls_key) : NULL;
  }
  cfg.devices = strdup(put_device ? "cpu,cuda" : "cpu");
  cfg.chunk_bytes = CHUNK;
  cfg.window = WINDOW;
  cfg.log_level = 0;
  server *s;
  tport_err err;
  if (server_start(&cfg, &s, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  static raw_ctx rc1[RAW_CTX], rc2[RAW_CTX];
  nng_socket r1 = raw_start(tcp_r, rc1), r2 = raw_start(ipc_r, rc2);

  if (!only_tls) {
    for (size_t mib = 1; mib <= max_mib; mib *= 16) {
      bench_size("tcp", tcp_t, tcp_r, mib << 20);
      bench_size("ipc", ipc_t, ipc_r, mib << 20);
    }
    bench_small_rpc(tcp_t, tcp_r);
    size_t each = (size_t)16 << 20;
    double one = run_clients(tcp_t, 1, each), eight = run_clients(tcp_t, 8, each);
    printf("{\"op\": \"aggregate_8_clients\", \"transport\": \"tcp\", \"bytes\": %zu, "
           "\"seconds\": %.6f, \"baseline_bytes\": %zu, \"baseline_seconds\": %.6f}\n",
           8 * each * 4, eight, each * 4, one);
    fflush(stdout);
  }
  if (tls_cert)
    bench_tls(tcp_t, tls_t, tls_cert, max_mib);
  raw_stop(r1, rc1);
  raw_stop(r2, rc2);
  server_stop(s, 1000);
  config_free(&cfg);
  free(raw_source);
  return 0;
}
