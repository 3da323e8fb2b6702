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
 * Two more baselines for put and get, measured in the same reps (the order
 * of the four rotated every rep):
 *  - raw nng with a copy ("baseline": "nng_copy", puts only): the raw
 *    server copies every chunk it receives into a destination buffer at the
 *    chunk's offset, the same work a put must do.  The buffer is allocated
 *    and touched once, before the clock starts, and reused by every rep
 *    (where a tensorport put allocates its tensor each time).
 *  - a gRPC peer ("baseline": "grpc"; with --grpc-client): what a user
 *    would build with gRPC instead (bench/peers/grpc, gRPC C++ 1.51): a
 *    client-streaming put and a server-streaming get of the same bytes in
 *    the same chunk size, over loopback tcp and a unix socket (the ipc rows),
 *    its server (started by bench/run, --grpc-tcp/--grpc-unix) keeping what a
 *    put sends in a buffer allocated per put, as tportd does.  This program
 *    drives the peer's client a line at a time through a pipe; the client
 *    times its own calls.  The Info round trip is also measured against the
 *    peer's unary Info, in blocks of 100 calls alternating with tensorport's.
 *
 *   tport-bench-transfer [--max-mib N] [--reps R] [--device D] [--chunk-mib N]
 *                        [--grpc-client EXE --grpc-tcp HOST:PORT [--grpc-unix unix:PATH]]
 *                        [--tls-cert F --tls-key F [--tls-reps R] [--only-tls]] [--only-rpc]
 *                        [--only-devices]
 *
 * The device rows (--only-devices: only those) put and get 16 and 256 MiB
 * to and from sim:0 and, where the server has a GPU, cuda:0, against the
 * same to and from the cpu, interleaved ("baseline": "cpu"), and the
 * device's get against its put ("baseline": "put").
 *
 * --only-rpc measures only the small round trip (Info vs the raw echo and the
 * gRPC peer's unary call).
 *
 * With --tportd EXE, every server runs in a process of its own, as a user
 * runs tportd and as the gRPC peer's server runs: tportd (EXE, with the
 * in-process server's listeners, chunk, window and devices) and the raw nng
 * servers (this program again, --raw-serve TCP_URL IPC_URL).  Without it,
 * both run inside this process and share its nng threads with the clients.
 * The tls_info line counts the handshakes of this process: both ends of the
 * TLS connection in process, the client's end only with --tportd.
 */
#include <fcntl.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_util.h"
#include "server.h"
#include "tls_openssl.h"
#include "tport.h"

extern char **environ;

/* the chunk size of every row (tportd's, the raw baselines', the gRPC
 * peer's): tportd's default, 4 MiB, unless --chunk-mib says otherwise */
static size_t chunk = (size_t)4 << 20;
#define WINDOW 8
#define RAW_CTX 32

/* ---------------------------------------------------------------- raw nng server
 * A request is "P" + bytes (a put chunk: answered with a 1-byte ack), "C" +
 * u64 offset + bytes (a put chunk copied into raw_dest at that offset, then
 * acked), "G" + u64 length (a get chunk: answered with that many bytes), or
 * "E" + bytes (an echo). */
typedef struct raw_ctx {
  nng_ctx ctx;
  nng_aio *aio;
  int sending;
} raw_ctx;

static uint8_t *raw_source;
static size_t raw_source_len;
static uint8_t *raw_dest; /* the copying baseline's destination, reused */
static size_t raw_dest_len;

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
  } else if (b[0] == 'C') {
    uint64_t off;
    size_t len = nng_msg_len(m) - 9;
    memcpy(&off, b + 1, 8);
    if (off <= raw_dest_len && len <= raw_dest_len - off)
      memcpy(raw_dest + off, b + 9, len);
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

/* The raw servers' source (a chunk) and the copying baseline's destination
 * (as large as the largest transfer), touched here so that no rep pays its
 * first-touch page faults (with a byte other than 0: the compiler turns
 * malloc + memset 0 into calloc, which touches nothing -- and a first touch
 * can cost ~20 us a page on a VM). */
static void raw_buffers_init(size_t max_mib)
{
  raw_source_len = chunk;
  raw_source = calloc(chunk, 1);
  raw_dest_len = max_mib << 20;
  raw_dest = malloc(raw_dest_len);
  memset(raw_dest, 1, raw_dest_len);
}

static void raw_stop(nng_socket s, raw_ctx *ctxs)
{
  nng_close(s);
  for (int i = 0; i < RAW_CTX; i++) {
    nng_aio_stop(ctxs[i].aio);
    nng_aio_free(ctxs[i].aio);
  }
}

/* A windowed transfer over raw REQ contexts: put sends data, get receives
 * it; a put with copy has the server copy each chunk into raw_dest. */
enum raw_op { RAW_PUT, RAW_PUT_COPY, RAW_GET };

static void raw_transfer(nng_socket s, enum raw_op op, uint8_t *data, size_t n)
{
  bool put = op != RAW_GET;
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
      len[k] = n - next < chunk ? n - next : chunk;
      nng_msg *m;
      if (op == RAW_PUT) {
        nng_msg_alloc(&m, 1 + len[k]);
        uint8_t *b = nng_msg_body(m);
        b[0] = 'P';
        memcpy(b + 1, data + next, len[k]);
      } else if (op == RAW_PUT_COPY) {
        nng_msg_alloc(&m, 9 + len[k]);
        uint8_t *b = nng_msg_body(m);
        uint64_t o = next;
        b[0] = 'C';
        memcpy(b + 1, &o, 8);
        memcpy(b + 9, data + next, len[k]);
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

/* ---------------------------------------------------------------- servers in
 * their own processes (--tportd): tportd itself, spawned with the options
 * the in-process server would get, and the raw nng servers in a copy of
 * this program (--raw-serve), as a user runs tportd and as the gRPC peer's
 * server runs, so that no server shares this process's nng poller, task
 * threads or allocator with the clients it answers. */
static pid_t spawn_piped(char *const argv[], char *const envp[], FILE **to, FILE **from)
{
  int in[2], out[2];
  if (pipe(in) || pipe(out)) {
    perror("bench: pipe");
    exit(1);
  }
  for (int i = 0; i < 2; i++)
    fcntl(in[i], F_SETFD, FD_CLOEXEC), fcntl(out[i], F_SETFD, FD_CLOEXEC);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, envp);
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  close(out[1]);
  if (rc != 0) {
    fprintf(stderr, "bench: cannot start %s: %s\n", argv[0], strerror(rc));
    exit(1);
  }
  *to = fdopen(in[1], "w");
  *from = fdopen(out[0], "r");
  return pid;
}

static struct {
  pid_t pid;
  FILE *to, *from;
} raw_child = {.pid = -1}, tportd_child = {.pid = -1};

/* The raw servers' process: both listen, "ready", then serve until stdin
 * closes. */
static int raw_serve(const char *tcp, const char *ipc, size_t max_mib)
{
  raw_buffers_init(max_mib);
  static raw_ctx rc1[RAW_CTX], rc2[RAW_CTX];
  nng_socket r1 = raw_start(tcp, rc1), r2 = raw_start(ipc, rc2);
  printf("ready\n");
  fflush(stdout);
  while (getchar() != EOF)
    ;
  raw_stop(r1, rc1);
  raw_stop(r2, rc2);
  return 0;
}

static void raw_child_start(const char *tcp, const char *ipc, size_t max_mib)
{
  char mib[32], chunk_mib[32];
  snprintf(mib, sizeof mib, "%zu", max_mib);
  snprintf(chunk_mib, sizeof chunk_mib, "%zu", chunk >> 20);
  char *argv[] = {"/proc/self/exe", "--raw-serve", (char *)tcp,  (char *)ipc, "--max-mib",
                  mib,              "--chunk-mib", chunk_mib,    NULL};
  raw_child.pid = spawn_piped(argv, environ, &raw_child.to, &raw_child.from);
  char line[64];
  if (!fgets(line, sizeof line, raw_child.from) || strcmp(line, "ready\n") != 0) {
    fprintf(stderr, "bench: the raw nng servers did not start\n");
    exit(1);
  }
}

static void child_stop(pid_t *pid, FILE **to, FILE **from, int sig)
{
  if (*pid <= 0)
    return;
  if (sig)
    kill(*pid, sig);
  fclose(*to);
  fclose(*from);
  int st;
  waitpid(*pid, &st, 0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    fprintf(stderr, "bench: server process %d ended with status 0x%x\n", (int)*pid, st);
  *pid = -1;
}

/* tportd on the same listeners, chunk, window and devices as the in-process
 * server (no metrics listener, no shm socket: the rows measure the socket
 * path); returns once it answers on every URL. */
static void tportd_child_start(const char *exe, const server_config *cfg)
{
  char *argv[64];
  char chunk_s[32], window_s[32];
  int n = 0;
  argv[n++] = (char *)exe;
  for (int i = 0; i < cfg->nlisten; i++) {
    argv[n++] = "--listen";
    argv[n++] = cfg->listen[i];
  }
  snprintf(chunk_s, sizeof chunk_s, "%zu", cfg->chunk_bytes);
  snprintf(window_s, sizeof window_s, "%d", (int)cfg->window);
  char *rest[] = {"--chunk",     chunk_s, "--window",   window_s, "--devices", cfg->devices,
                  "--log-level", "0",     "--http-listen", "off", "--shm-socket", "off"};
  for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++)
    argv[n++] = rest[i];
  if (cfg->tls_cert) {
    argv[n++] = "--tls-cert";
    argv[n++] = cfg->tls_cert;
    if (cfg->tls_key) {
      argv[n++] = "--tls-key";
      argv[n++] = cfg->tls_key;
    }
  }
  argv[n] = NULL;
  tportd_child.pid = spawn_piped(argv, environ, &tportd_child.to, &tportd_child.from);
  for (int i = 0; i < cfg->nlisten; i++) {
    if (strncmp(cfg->listen[i], "tls+", 4) == 0)
      continue; /* a tls client needs the CA: bench_tls connects when it starts */
    tport_client *c = NULL;
    tport_err err;
    int rc = 1;
    for (int k = 0; k < 200 && rc; k++) {
      rc = tport_connect(cfg->listen[i], &(tport_connect_options){.timeout_ms = 2000}, &c, &err);
      if (rc)
        usleep(50000);
    }
    if (rc) {
      fprintf(stderr, "bench: tportd does not answer on %s: %s\n", cfg->listen[i], err.msg);
      exit(1);
    }
    tport_close(c);
  }
}

/* ---------------------------------------------------------------- gRPC peer
 * The peer's client (bench/peers/grpc/client.cc) runs as a child process:
 * one command a line on its stdin, one answer a line on its stdout. */
static struct {
  pid_t pid;
  FILE *to, *from;
} grpc_peer = {.pid = -1};

/* Sends cmd, reads the answer into line; exits on an error answer. */
static void grpc_ask(const char *cmd, char *line, size_t size)
{
  if (cmd) {
    fprintf(grpc_peer.to, "%s\n", cmd);
    fflush(grpc_peer.to);
  }
  if (!fgets(line, (int)size, grpc_peer.from)) {
    fprintf(stderr, "grpc peer: no answer to %s (did the client die?)\n", cmd ? cmd : "start");
    exit(1);
  }
  line[strcspn(line, "\n")] = 0;
  if (strncmp(line, "error", 5) == 0) {
    fprintf(stderr, "grpc peer: %s: %s\n", cmd ? cmd : "start", line);
    exit(1);
  }
}

/* Starts the peer's client (before any nng socket or server thread exists,
 * so that it inherits none) and waits until it says its channels are warm. */
static void grpc_start(const char *exe, const char *tcp, const char *unix_addr)
{
  int in[2], out[2];
  if (pipe(in) || pipe(out)) {
    perror("grpc peer: pipe");
    exit(1);
  }
  /* the child gets them as its stdin and stdout only (dup2 clears the flag) */
  for (int i = 0; i < 2; i++)
    fcntl(in[i], F_SETFD, FD_CLOEXEC), fcntl(out[i], F_SETFD, FD_CLOEXEC);
  char chunk_s[32];
  snprintf(chunk_s, sizeof chunk_s, "%zu", chunk);
  char *argv[] = {(char *)exe,       "--tcp", (char *)tcp,
                  "--chunk",         chunk_s, unix_addr ? "--unix" : NULL,
                  (char *)unix_addr, NULL};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  /* TPORT_BENCH_GRPC_GLIBC_TUNABLES (set by bench/run for
   * TPORT_BENCH_GRPC_MALLOC=tuned): the peer's client, and only it, runs with
   * those GLIBC_TUNABLES */
  const char *tun = getenv("TPORT_BENCH_GRPC_GLIBC_TUNABLES");
  size_t nenv = 0;
  while (environ[nenv])
    nenv++;
  char **env = calloc(nenv + 2, sizeof *env), *tun_var = NULL;
  size_t k = 0;
  for (size_t i = 0; i < nenv; i++)
    if (!tun || strncmp(environ[i], "GLIBC_TUNABLES=", 15) != 0)
      env[k++] = environ[i];
  if (tun && (tun_var = malloc(strlen(tun) + 16)) != NULL) {
    snprintf(tun_var, strlen(tun) + 16, "GLIBC_TUNABLES=%s", tun);
    env[k++] = tun_var;
  }
  int rc = posix_spawn(&grpc_peer.pid, exe, &fa, NULL, argv, env);
  free(env);
  free(tun_var);
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  close(out[1]);
  if (rc != 0) {
    fprintf(stderr, "grpc peer: cannot start %s: %s\n", exe, strerror(rc));
    exit(1);
  }
  grpc_peer.to = fdopen(in[1], "w");
  grpc_peer.from = fdopen(out[0], "r");
  char line[256];
  grpc_ask(NULL, line, sizeof line);
  if (strcmp(line, "ready") != 0) {
    fprintf(stderr, "grpc peer: expected ready, got %s\n", line);
    exit(1);
  }
}

static void grpc_stop(void)
{
  if (grpc_peer.pid <= 0)
    return;
  fprintf(grpc_peer.to, "quit\n");
  fclose(grpc_peer.to);
  fclose(grpc_peer.from);
  waitpid(grpc_peer.pid, NULL, 0);
  grpc_peer.pid = -1;
}

/* One gRPC rep: put then get of n bytes; the peer's own timings. */
static void grpc_xfer(const char *transport, size_t n, double *put_s, double *get_s)
{
  char cmd[64], line[256];
  snprintf(cmd, sizeof cmd, "xfer %s %zu", transport, n);
  grpc_ask(cmd, line, sizeof line);
  if (sscanf(line, "%lf %lf", put_s, get_s) != 2) {
    fprintf(stderr, "grpc peer: %s: cannot read %s\n", cmd, line);
    exit(1);
  }
}

/* k unary Info round trips over tcp into t[0..k). */
static void grpc_info(double *t, int k)
{
  char cmd[64], line[8192];
  snprintf(cmd, sizeof cmd, "info tcp %d", k);
  grpc_ask(cmd, line, sizeof line);
  char *p = line, *e;
  for (int i = 0; i < k; i++, p = e) {
    t[i] = strtod(p, &e);
    if (e == p) {
      fprintf(stderr, "grpc peer: %s: short answer\n", cmd);
      exit(1);
    }
  }
}

/* ---------------------------------------------------------------- benches */

static int reps = 5;
static const char *put_device; /* --device: where puts land (default cpu; sim:0, sim:1, cuda:K) */
static const char *row_device; /* a "device" field for the rows printed now */

/* One JSON line: medians of t (ours) and b (the baseline named by baseline,
 * or the plain raw-nng one when NULL), with their spread.  Sorts both. */
static void print_row(const char *op, const char *transport, size_t n, double *t, double *b,
                      const char *baseline)
{
  double tm = bench_median(t, reps), bm = bench_median(b, reps);
  printf("{\"op\": \"%s\", \"transport\": \"%s\", \"bytes\": %zu, \"seconds\": %.6f, "
         "\"baseline_seconds\": %.6f, ",
         op, transport, n, tm, bm);
  if (baseline)
    printf("\"baseline\": \"%s\", ", baseline);
  if (row_device)
    printf("\"device\": \"%s\", ", row_device);
  printf("\"reps\": %d, \"chunk_bytes\": %zu, \"seconds_min\": %.6f, \"seconds_max\": %.6f, "
         "\"baseline_seconds_min\": %.6f, \"baseline_seconds_max\": %.6f}\n",
         reps, chunk, t[0], t[reps - 1], b[0], b[reps - 1]);
}

/* put and get of n bytes through tportd, raw nng (plain and copying) and the
 * gRPC peer, interleaved: every rep runs the four, the one that starts
 * rotated every rep, so that none always follows the same one. */
static void bench_size(const char *transport, const char *turl, const char *rurl, size_t n)
{
  uint8_t *data = malloc(n), *back = malloc(n);
  memset(data, 7, n);
  memset(back, 1, n); /* touched: no rep pays its first-touch faults (see main) */
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
  bool grpc = grpc_peer.pid > 0;
  double tp[16], tg[16], rp[16], rg[16], cp[16], gp[16], gg[16];
  int64_t sz = (int64_t)n;
  for (int r = 0; r < reps; r++) {
    for (int j = 0; j < 4; j++) {
      double t0 = bench_now();
      switch ((r + j) % 4) {
      case 0: {
        tport_tensor_info info;
        tport_put_options po;
        tport_put_options_init(&po);
        po.device = put_device;
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
        break;
      }
      case 1:
        raw_transfer(raw, RAW_PUT, data, n);
        rp[r] = bench_now() - t0;
        t0 = bench_now();
        raw_transfer(raw, RAW_GET, back, n);
        rg[r] = bench_now() - t0;
        break;
      case 2:
        raw_transfer(raw, RAW_PUT_COPY, data, n);
        cp[r] = bench_now() - t0;
        break;
      case 3:
        if (grpc)
          grpc_xfer(transport, n, &gp[r], &gg[r]);
        break;
      }
    }
  }
  /* copies: print_row sorts what it is given, and tp/tg are used twice */
  double tp2[16], tg2[16];
  memcpy(tp2, tp, sizeof tp);
  memcpy(tg2, tg, sizeof tg);
  print_row("put", transport, n, tp, rp, NULL);
  print_row("get", transport, n, tg, rg, NULL);
  memcpy(tp, tp2, sizeof tp);
  print_row("put", transport, n, tp, cp, "nng_copy");
  if (grpc) {
    memcpy(tp, tp2, sizeof tp);
    print_row("put", transport, n, tp, gp, "grpc");
    print_row("get", transport, n, tg2, gg, "grpc");
  }
  fflush(stdout);
  nng_close(raw);
  tport_close(c);
  free(data);
  free(back);
}

/* The data path's options, each against the plain put (or get) of the same
 * bytes, interleaved: CRC32C on every chunk (verify), and a converting put
 * (uint8 -> float32, converted on arrival) of an image batch. */
static void bench_data_path(const char *transport, const char *turl, size_t n)
{
  tport_client *plain, *verify;
  tport_err err;
  if (tport_connect(turl, NULL, &plain, &err) ||
      tport_connect(turl, &(tport_connect_options){.verify = true}, &verify, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    exit(1);
  }
  uint8_t *data = malloc(n), *back = malloc(n);
  for (size_t i = 0; i < n; i++)
    data[i] = (uint8_t)(i * 31);
  memset(back, 1, n); /* touched: no rep pays its first-touch faults (see main) */
  int64_t sz = (int64_t)n, batch[4] = {64, 3, 224, 224};
  size_t nb = 64 * 3 * 224 * 224;
  double pp[16], pv[16], gp[16], gv[16], cp[16], cc[16];
  for (int r = 0; r < reps; r++) {
    for (int j = 0; j < 3; j++) {
      int which = (r + j) % 3;
      tport_client *c = which == 1 ? verify : plain;
      if (which < 2) {
        tport_tensor_info info;
        double t0 = bench_now();
        if (tport_put(c, TPORT_UINT8, 1, &sz, NULL, data, n, NULL, &info, &err)) {
          fprintf(stderr, "put: %s\n", err.msg);
          exit(1);
        }
        (which ? pv : pp)[r] = bench_now() - t0;
        t0 = bench_now();
        if (tport_get(c, &info.ref, back, n, NULL, NULL, NULL, &err)) {
          fprintf(stderr, "get: %s\n", err.msg);
          exit(1);
        }
        (which ? gv : gp)[r] = bench_now() - t0;
        tport_free(c, &info.ref, NULL);
      } else {
        /* the batch as uint8, plain, then converted to float32 */
        for (int k = 0; k < 2; k++) {
          tport_put_options po;
          tport_put_options_init(&po);
          po.has_dtype = k == 1;
          po.dtype = TPORT_FLOAT32;
          tport_tensor_info info;
          double t0 = bench_now();
          if (tport_put(plain, TPORT_UINT8, 4, batch, NULL, data, nb, &po, &info, &err)) {
            fprintf(stderr, "put: %s\n", err.msg);
            exit(1);
          }
          (k ? cc : cp)[r] = bench_now() - t0;
          tport_free(plain, &info.ref, NULL);
        }
      }
    }
  }
  print_row("put_verify", transport, n, pv, pp, "plain");
  print_row("get_verify", transport, n, gv, gp, "plain");
  print_row("put_convert_u8_f32", transport, nb, cc, cp, "plain");
  fflush(stdout);
  tport_close(plain);
  tport_close(verify);
  free(data);
  free(back);
}

/* Put and get of n bytes to and from a device (sim:0, cuda:0) against the
 * same to and from the cpu, interleaved (the order swapped every rep): what
 * the device path costs over the host path -- staging into pinned blocks
 * and the H2D copy on a put, the read-back on a get.  Rows: device vs cpu,
 * and the device's get vs its put. */
static void bench_device(const char *transport, const char *turl, size_t n, const char *dev,
                         const char *label)
{
  uint8_t *data = malloc(n), *back = malloc(n);
  memset(data, 7, n);
  memset(back, 1, n); /* touched: no rep pays its first-touch faults (see main) */
  tport_client *c;
  tport_err err;
  if (tport_connect(turl, NULL, &c, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    exit(1);
  }
  int64_t sz = (int64_t)n;
  double pc[16], gc[16], pd[16], gd[16];
  for (int r = 0; r < reps; r++) {
    for (int j = 0; j < 2; j++) {
      bool on_dev = (r + j) % 2;
      tport_put_options po;
      tport_put_options_init(&po);
      po.device = on_dev ? dev : "cpu";
      tport_tensor_info info;
      double t0 = bench_now();
      if (tport_put(c, TPORT_UINT8, 1, &sz, NULL, data, n, &po, &info, &err)) {
        fprintf(stderr, "put to %s: %s\n", po.device, err.msg);
        exit(1);
      }
      (on_dev ? pd : pc)[r] = bench_now() - t0;
      t0 = bench_now();
      if (tport_get(c, &info.ref, back, n, NULL, NULL, NULL, &err)) {
        fprintf(stderr, "get from %s: %s\n", po.device, err.msg);
        exit(1);
      }
      (on_dev ? gd : gc)[r] = bench_now() - t0;
      if (back[0] != 7 || back[n - 1] != 7) {
        fprintf(stderr, "get from %s: wrong bytes\n", po.device);
        exit(1);
      }
      tport_free(c, &info.ref, NULL);
    }
  }
  double pd2[16], gd2[16];
  memcpy(pd2, pd, sizeof pd);
  memcpy(gd2, gd, sizeof gd);
  row_device = label;
  print_row("put", transport, n, pd, pc, "cpu");
  print_row("get", transport, n, gd, gc, "cpu");
  print_row("get", transport, n, gd2, pd2, "put");
  row_device = NULL;
  fflush(stdout);
  tport_close(c);
  free(data);
  free(back);
}

/* The devices of the server at turl that the device rows run on: sim:0,
 * and cuda:0 where the server has a GPU. */
static void bench_devices(const char *tcp_t, const char *ipc_t, size_t max_mib)
{
  tport_client *c;
  tport_err err;
  tport_device_info *devs = NULL;
  size_t nd = 0;
  char why[256];
  if (tport_connect(tcp_t, NULL, &c, &err) ||
      tport_devices(c, &devs, &nd, why, sizeof why, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    exit(1);
  }
  tport_close(c);
  static const char *const want[][2] = {{"sim:0", "sim0"}, {"cuda:0", "cuda0"}};
  for (size_t w = 0; w < 2; w++) {
    bool have = false;
    for (size_t i = 0; i < nd; i++)
      have = have || strcmp(devs[i].device, want[w][0]) == 0;
    if (!have)
      continue;
    for (size_t mib = 16; mib <= max_mib; mib *= 16) {
      bench_device("tcp", tcp_t, mib << 20, want[w][0], want[w][1]);
      bench_device("ipc", ipc_t, mib << 20, want[w][0], want[w][1]);
    }
  }
  free(devs);
}

static void bench_small_rpc(const char *turl, const char *rurl)
{
  enum { N = 3000, BLOCK = 100 };
  static double t[N], r[N], g[N];
  bool grpc = grpc_peer.pid > 0;
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
    /* the gRPC peer's unary Info in blocks (it runs in another process) */
    if (grpc && (i + 1) % BLOCK == 0)
      grpc_info(&g[i + 1 - BLOCK], BLOCK);
  }
  qsort(t, N, sizeof t[0], bench_cmp_double);
  qsort(r, N, sizeof r[0], bench_cmp_double);
  printf("{\"op\": \"info_rtt\", \"transport\": \"tcp\", \"p50_us\": %.2f, \"p99_us\": %.2f, "
         "\"baseline_p50_us\": %.2f, \"baseline_p99_us\": %.2f}\n",
         t[N / 2] * 1e6, t[N * 99 / 100] * 1e6, r[N / 2] * 1e6, r[N * 99 / 100] * 1e6);
  if (grpc) {
    qsort(g, N, sizeof g[0], bench_cmp_double);
    printf("{\"op\": \"info_rtt\", \"transport\": \"tcp\", \"baseline\": \"grpc_unary\", "
           "\"p50_us\": %.2f, \"p99_us\": %.2f, \"baseline_p50_us\": %.2f, "
           "\"baseline_p99_us\": %.2f}\n",
           t[N / 2] * 1e6, t[N * 99 / 100] * 1e6, g[N / 2] * 1e6, g[N * 99 / 100] * 1e6);
  }
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
  memset(back, 1, n); /* touched: no rep pays its first-touch faults (see main) */
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
           ops[o], n, tls, tcp, tls_reps, t[1][0], t[1][tls_reps - 1], t[0][0], t[0][tls_reps - 1]);
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
  const char *grpc_exe = NULL, *grpc_tcp = NULL, *grpc_unix = NULL;
  bool only_tls = false, only_rpc = false, only_devices = false;
  const char *tportd_exe = NULL, *raw_tcp = NULL, *raw_ipc = NULL;
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
    else if (strcmp(argv[i], "--only-rpc") == 0)
      only_rpc = true;
    else if (strcmp(argv[i], "--only-devices") == 0)
      only_devices = true;
    else if (strcmp(argv[i], "--chunk-mib") == 0 && i + 1 < argc)
      chunk = (size_t)(atoi(argv[++i]) < 1 ? 1 : atoi(argv[i]) > 32 ? 32 : atoi(argv[i])) << 20;
    else if (strcmp(argv[i], "--tportd") == 0 && i + 1 < argc)
      tportd_exe = argv[++i];
    else if (strcmp(argv[i], "--raw-serve") == 0 && i + 2 < argc) {
      raw_tcp = argv[++i];
      raw_ipc = argv[++i];
    } else if (strcmp(argv[i], "--grpc-client") == 0 && i + 1 < argc)
      grpc_exe = argv[++i];
    else if (strcmp(argv[i], "--grpc-tcp") == 0 && i + 1 < argc)
      grpc_tcp = argv[++i];
    else if (strcmp(argv[i], "--grpc-unix") == 0 && i + 1 < argc)
      grpc_unix = argv[++i];
    else {
      fprintf(stderr, "tport-bench-transfer: unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  if (only_tls && !tls_cert) {
    fprintf(stderr, "tport-bench-transfer: --only-tls needs --tls-cert\n");
    return 2;
  }
  if (grpc_exe && !grpc_tcp) {
    fprintf(stderr, "tport-bench-transfer: --grpc-client needs --grpc-tcp\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN); /* a dead gRPC client is reported, not fatal by signal */
  if (raw_tcp)
    return raw_serve(raw_tcp, raw_ipc, max_mib);
  if (grpc_exe && !only_tls)
    grpc_start(grpc_exe, grpc_tcp, grpc_unix);
  char tcp_t[64], tcp_r[64], tls_t[64], ipc_t[96], ipc_r[96];
  int port = 30000 + (int)(getpid() % 20000);
  snprintf(tcp_t, sizeof tcp_t, "tcp://127.0.0.1:%d", port);
  snprintf(tcp_r, sizeof tcp_r, "tcp://127.0.0.1:%d", port + 1);
  snprintf(tls_t, sizeof tls_t, "tls+tcp://127.0.0.1:%d", port + 2);
  snprintf(ipc_t, sizeof ipc_t, "ipc:///tmp/tport-bench-%d-t.sock", (int)getpid());
  snprintf(ipc_r, sizeof ipc_r, "ipc:///tmp/tport-bench-%d-r.sock", (int)getpid());

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
  /* two sim devices (and every GPU, served unnamed: naming cuda where none
   * is would stop tportd): the device rows run on sim:0 and cuda:0,
   * --device may name sim:0, sim:1 or cuda:K (the staging pools take their
   * pinned memory from the first accelerator: the cpu rows never stage) */
  cfg.devices = strdup("cpu,sim:2");
  cfg.chunk_bytes = chunk;
  cfg.window = WINDOW;
  cfg.log_level = 0;
  server *s = NULL;
  tport_err err;
  static raw_ctx rc1[RAW_CTX], rc2[RAW_CTX];
  nng_socket r1 = NNG_SOCKET_INITIALIZER, r2 = NNG_SOCKET_INITIALIZER;
  if (tportd_exe) {
    /* raw servers first: the child gets no fd of tportd's pipes */
    raw_child_start(tcp_r, ipc_r, max_mib);
    tportd_child_start(tportd_exe, &cfg);
  } else {
    raw_buffers_init(max_mib);
    if (server_start(&cfg, &s, &err)) {
      fprintf(stderr, "%s\n", err.msg);
      return 1;
    }
    r1 = raw_start(tcp_r, rc1);
    r2 = raw_start(ipc_r, rc2);
  }
  printf("{\"op\": \"servers\", \"where\": \"%s\"}\n",
         tportd_exe ? "own processes" : "in this process");
  fflush(stdout);

  if (only_rpc) {
    bench_small_rpc(tcp_t, tcp_r);
  } else if (only_devices) {
    bench_devices(tcp_t, ipc_t, max_mib);
  } else if (!only_tls) {
    for (size_t mib = 1; mib <= max_mib; mib *= 16) {
      bench_size("tcp", tcp_t, tcp_r, mib << 20);
      bench_size("ipc", ipc_t, ipc_r, mib << 20);
    }
    bench_data_path("tcp", tcp_t, max_mib << 20);
    bench_devices(tcp_t, ipc_t, max_mib);
    bench_small_rpc(tcp_t, tcp_r);
    size_t each = (size_t)16 << 20;
    double one = run_clients(tcp_t, 1, each), eight = run_clients(tcp_t, 8, each);
    printf("{\"op\": \"aggregate_8_clients\", \"transport\": \"tcp\", \"bytes\": %zu, "
           "\"seconds\": %.6f, \"baseline_bytes\": %zu, \"baseline_seconds\": %.6f}\n",
           8 * each * 4, eight, each * 4, one);
    fflush(stdout);
  }
  if (tls_cert && !only_rpc)
    bench_tls(tcp_t, tls_t, tls_cert, max_mib);
  if (tportd_exe) {
    child_stop(&tportd_child.pid, &tportd_child.to, &tportd_child.from, SIGTERM);
    child_stop(&raw_child.pid, &raw_child.to, &raw_child.from, 0);
  } else {
    raw_stop(r1, rc1);
    raw_stop(r2, rc2);
    server_stop(s, 1000);
  }
  config_free(&cfg);
  grpc_stop();
  free(raw_source);
  free(raw_dest);
  return 0;
}
