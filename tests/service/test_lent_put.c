/*
 * test_lent_put.c: a put over tcp://, tls+tcp:// or ipc:// lends the
 * caller's bytes to its chunk requests instead of copying them
 * (client/put_socket.c, nng_msg_set_tail of deploy/nng/0008, the lent tail;
 * deploy/nng/0011 for tls), and a get's replies lend theirs from the tensor
 * (server/lends.c).  What must hold: every byte
 * arrives, whatever the size, alignment and options; and a put returns only
 * once nng has let go of the caller's bytes, even when it fails with its
 * request stuck in the transport (a server that stopped reading): after
 * that the caller may free them (ASan's writev interceptor sees a read of
 * freed memory by nng).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "service_util.h"

TestSuite(lent, .timeout = 120);

/* A self-signed certificate for 127.0.0.1 (the openssl tool) in a fresh
 * directory: tportd's --tls-cert, and the client's tls_ca. */
static char tls_dir[64], tls_cert[96], tls_key[96];

static void make_tls_cert(void)
{
  snprintf(tls_dir, sizeof tls_dir, "/tmp/tport-lent-XXXXXX");
  cr_assert_not_null(mkdtemp(tls_dir));
  snprintf(tls_cert, sizeof tls_cert, "%s/c.pem", tls_dir);
  snprintf(tls_key, sizeof tls_key, "%s/k.pem", tls_dir);
  char cmd[512];
  snprintf(cmd, sizeof cmd,
           "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
           "-keyout %s -out %s -days 1 -subj /CN=lent -addext subjectAltName=IP:127.0.0.1 "
           ">/dev/null 2>&1",
           tls_key, tls_cert);
  cr_assert_eq(system(cmd), 0, "openssl req failed");
}

static void drop_tls_cert(void)
{
  unlink(tls_cert);
  unlink(tls_key);
  rmdir(tls_dir);
}

/* url as a tls+tcp:// URL on another fresh port */
static void tls_url(char *url, size_t len)
{
  char tcp[64];
  svc_tcp_url(tcp, sizeof tcp);
  snprintf(url, len, "tls+%s", tcp);
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    p[i] = (uint8_t)(x >> 24);
  }
}

/* put n bytes from p (any alignment), get them back, compare */
static void round_trip(tport_client *c, const uint8_t *p, size_t n, const char *what)
{
  tport_tensor_info info;
  tport_err err;
  int64_t sz = (int64_t)n;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &sz, NULL, p, n, NULL, &info, &err), 0, "%s: put: %s",
               what, err.msg);
  uint8_t *back = malloc(n);
  memset(back, 0, n);
  cr_assert_eq(tport_get(c, &info.ref, back, n, NULL, NULL, NULL, &err), 0, "%s: get: %s", what,
               err.msg);
  size_t first = n;
  for (size_t i = 0; i < n && first == n; i++)
    if (back[i] != p[i])
      first = i;
  cr_expect_eq(first, n, "%s: byte %zu of %zu differs", what, first, n);
  free(back);
  tport_free(c, &info.ref, NULL);
}

Test(lent, puts_and_gets_over_tcp_tls_and_ipc_arrive_whole)
{
  char tcp[64], ipc[96], tls[80];
  make_tls_cert();
  pid_t pid = -1;
  for (int attempt = 0; attempt < 5 && pid < 0; attempt++) { /* random ports may be taken */
    svc_tcp_url(tcp, sizeof tcp);
    svc_ipc_url(ipc, sizeof ipc);
    tls_url(tls, sizeof tls);
    /* 64 KiB chunks (service_util's tportd): every chunk is lent */
    const char *extra[] = {"--listen",   ipc,      "--listen", tls, "--tls-cert",
                           tls_cert,     "--tls-key", tls_key, NULL};
    pid = svc_spawn(tcp, extra);
  }
  cr_assert_gt(pid, 0, "tportd did not start on %s", tcp);
  const size_t big = (3 << 20) + 7;
  uint8_t *data = malloc(big + 1);
  fill(data, big + 1, 5);
  const char *urls[3] = {tcp, ipc, tls};
  for (int u = 0; u < 3; u++) {
    for (int verify = 0; verify < 2; verify++) {
      tport_client *c;
      tport_err err;
      tport_connect_options o = {
          .no_shm = true, .verify = verify, .timeout_ms = 20000, .tls_ca = tls_cert};
      cr_assert_eq(tport_connect(urls[u], &o, &c, &err), 0, "%s", err.msg);
      size_t sizes[] = {(64 << 10) * 5 + 123, big, 64 << 10, (64 << 10) + 1};
      for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        char what[160];
        snprintf(what, sizeof what, "%s%s, %zu bytes", urls[u], verify ? " verify" : "", sizes[k]);
        round_trip(c, data, sizes[k], what);
        /* from an odd address */
        snprintf(what, sizeof what, "%s%s, %zu bytes at an odd address", urls[u],
                 verify ? " verify" : "", sizes[k]);
        round_trip(c, data + 1, sizes[k], what);
      }
      tport_close(c);
    }
  }
  free(data);
  cr_expect_eq(svc_terminate(pid), 0);
  drop_tls_cert();
}

/* A put batch lends up to four tensors a request (deploy/nng/0012's
 * segments, after the copied small ones): over tcp, ipc and tls every
 * element arrives whole, with and without CRC32C checks, whatever the
 * mix in one request (1 MiB chunks: three 300 KB tensors and small ones
 * share a request; the 2.5 MiB one goes in chunks). */
Test(lent, a_batch_lending_several_tensors_a_request_arrives_whole)
{
  char tcp[64], ipc[96], tls[80];
  make_tls_cert();
  pid_t pid = -1;
  for (int attempt = 0; attempt < 5 && pid < 0; attempt++) {
    svc_tcp_url(tcp, sizeof tcp);
    svc_ipc_url(ipc, sizeof ipc);
    tls_url(tls, sizeof tls);
    const char *extra[] = {"--listen", ipc,       "--listen", tls,     "--tls-cert",
                           tls_cert,   "--tls-key", tls_key,  "--chunk", "1MiB", NULL};
    pid = svc_spawn(tcp, extra);
  }
  cr_assert_gt(pid, 0, "tportd did not start on %s", tcp);
  enum { N = 17 };
  uint8_t *vals[N];
  size_t lens[N];
  int64_t sizes[N];
  for (int i = 0; i < N; i++) {
    lens[i] = i == 16 ? (5u << 19) : i % 2 ? 300000 + (size_t)i : 17 + (size_t)i * 3;
    vals[i] = malloc(lens[i] + 1);
    fill(vals[i], lens[i] + 1, 11 + (unsigned)i);
    sizes[i] = (int64_t)lens[i];
  }
  const char *urls[3] = {tcp, ipc, tls};
  for (int u = 0; u < 3; u++) {
    for (int verify = 0; verify < 2; verify++) {
      tport_client *c;
      tport_err err;
      tport_connect_options o = {
          .no_shm = true, .verify = verify, .timeout_ms = 20000, .tls_ca = tls_cert};
      cr_assert_eq(tport_connect(urls[u], &o, &c, &err), 0, "%s", err.msg);
      tport_put_item puts[N];
      tport_get_item gets[N];
      memset(gets, 0, sizeof gets);
      for (int i = 0; i < N; i++)
        puts[i] = (tport_put_item){.dtype = TPORT_UINT8,
                                   .ndim = 1,
                                   .sizes = &sizes[i],
                                   .data = vals[i] + (i % 3 == 0), /* odd addresses too */
                                   .nbytes = lens[i]};
      cr_assert_eq(tport_put_batch(c, puts, N, &err), 0, "%s%s: %s", urls[u],
                   verify ? " verify" : "", err.msg);
      for (int i = 0; i < N; i++)
        gets[i].ref = puts[i].info.ref;
      cr_assert_eq(tport_get_batch(c, gets, N, &err), 0, "%s: %s", urls[u], err.msg);
      for (int i = 0; i < N; i++) {
        cr_assert_eq(gets[i].nbytes, lens[i]);
        cr_expect_eq(memcmp(gets[i].data, vals[i] + (i % 3 == 0), lens[i]), 0,
                     "%s%s: element %d (%zu bytes) differs", urls[u], verify ? " verify" : "", i,
                     lens[i]);
        free(gets[i].data);
      }
      tport_close(c);
    }
  }
  for (int i = 0; i < N; i++)
    free(vals[i]);
  cr_expect_eq(svc_terminate(pid), 0);
  drop_tls_cert();
}

/* A get's reply is lent only where the transport writes it from memory
 * (tcp, ipc, and tls, which encrypts it from there: deploy/nng/0011); a
 * ws:// connection's address looks like a tcp one's, and its replies were
 * lent and then copied under nng's socket lock and tportd's queue lock
 * (found by review).  bytes_lent counts what was lent. */
Test(lent, get_replies_are_lent_over_tcp_tls_and_ipc_and_not_over_ws)
{
#ifndef TPORT_NNG_LENT_TAIL
  cr_skip_test("built with the system's nng (TPORT_SYSTEM_NNG): nothing is lent");
#endif
  char tcp[64], ipc[96], ws[80], tls[80];
  make_tls_cert();
  pid_t pid = -1;
  for (int attempt = 0; attempt < 5 && pid < 0; attempt++) { /* random ports may be taken */
    svc_tcp_url(tcp, sizeof tcp);
    svc_tcp_url(ws, sizeof ws);
    int port = atoi(strrchr(ws, ':') + 1);
    snprintf(ws, sizeof ws, "ws://127.0.0.1:%d/tport", port);
    svc_ipc_url(ipc, sizeof ipc);
    tls_url(tls, sizeof tls);
    pid = svc_spawn(tcp, (const char *[]){"--listen", ipc, "--listen", ws, "--listen", tls,
                                          "--tls-cert", tls_cert, "--tls-key", tls_key, NULL});
  }
  cr_assert_gt(pid, 0, "tportd did not start on %s, %s, %s and %s", tcp, ipc, ws, tls);
  /* no regions: the server may offer them where its default shm socket can
   * be made (outside ctest), and a get through one lends nothing */
  tport_connect_options o = {
      .no_shm = true, .tenant = SVC_OPERATOR, .timeout_ms = 20000, .tls_ca = tls_cert};
  tport_client *ops;
  tport_err err;
  cr_assert_eq(tport_connect(tcp, &o, &ops, &err), 0, "%s", err.msg);
  const size_t n = 1 << 20;
  uint8_t *data = malloc(n), *back = malloc(n);
  fill(data, n, 11);
  tport_put_options po;
  tport_put_options_init(&po);
  po.name = "lent-or-not";
  int64_t sz = (int64_t)n;
  tport_tensor_info info;
  cr_assert_eq(tport_put(ops, TPORT_UINT8, 1, &sz, NULL, data, n, &po, &info, &err), 0, "%s",
               err.msg);
  const char *urls[4] = {ws, tcp, ipc, tls};
  for (int u = 0; u < 4; u++) {
    tport_client *c;
    cr_assert_eq(tport_connect(urls[u], &o, &c, &err), 0, "%s: %s", urls[u], err.msg);
    int64_t before = svc_counter(ops, "bytes_lent");
    memset(back, 0, n);
    cr_assert_eq(tport_get(c, &info.ref, back, n, NULL, NULL, NULL, &err), 0, "%s: %s", urls[u],
                 err.msg);
    cr_expect_eq(memcmp(back, data, n), 0, "%s: the bytes differ", urls[u]);
    int64_t lent = svc_counter(ops, "bytes_lent") - before;
    if (u == 0)
      cr_expect_eq(lent, 0, "%s: %lld bytes of replies lent", urls[u], (long long)lent);
    else
      cr_expect_geq(lent, (int64_t)n - (64 << 10), "%s: only %lld bytes of a 1 MiB get lent",
                    urls[u], (long long)lent);
    tport_close(c);
  }
  tport_close(ops);
  free(data);
  free(back);
  cr_expect_eq(svc_terminate(pid), 0);
  drop_tls_cert();
}

/* A put whose server stops reading in the middle: its next chunk's request
 * is stuck in the transport with the caller's bytes lent to it.  The put
 * fails, closes the connection to take them back, and only then returns.
 * With restart, the server is replaced after the first chunk: the client
 * redials, and the stuck request is on the new connection, not the one the
 * last reply came on (the put closed that one and waited for ever: found by
 * review). */
static struct {
  const char *url;
  atomic_int pid; /* replaced by the put's thread, read by the test's */
  bool restart;
  int calls;
} mid;

/* 16 MiB chunks, one at a time: a chunk is more than the sockets hold */
static const char *const midway_args[] = {"--chunk", "16777216", "--window", "1", NULL};

static void stop_after_first_chunk(void *arg, uint64_t done, uint64_t total)
{
  (void)arg;
  (void)total;
  if (done == 0 || mid.calls++)
    return;
  if (mid.restart) {
    kill(mid.pid, SIGKILL);
    waitpid(mid.pid, NULL, 0);
    mid.pid = svc_spawn(mid.url, midway_args);
    usleep(1500000); /* the client's dialer connects to it */
  }
  if (mid.pid > 0) /* never kill(-1, ...) */
    kill(mid.pid, SIGSTOP);
}

typedef struct {
  tport_client *c;
  uint8_t *data;
  size_t n;
  int rc;
  tport_err err;
  atomic_bool done;
} put_job;

static void *put_main(void *arg)
{
  put_job *j = arg;
  int64_t sz = (int64_t)j->n;
  tport_put_options po;
  tport_put_options_init(&po);
  po.progress = stop_after_first_chunk;
  j->rc = tport_put(j->c, TPORT_UINT8, 1, &sz, NULL, j->data, j->n, &po, NULL, &j->err);
  atomic_store(&j->done, true);
  return NULL;
}

static void put_stopped_midway(bool restart)
{
  char tcp[64];
  svc_tcp_url(tcp, sizeof tcp);
  mid.url = tcp;
  mid.restart = restart;
  mid.calls = 0;
  mid.pid = svc_spawn(tcp, midway_args);
  cr_assert_gt(mid.pid, 0, "tportd did not start on %s", tcp);
  put_job j = {.n = 64 << 20};
  tport_connect_options o = {.no_shm = true, .timeout_ms = 1000};
  cr_assert_eq(tport_connect(tcp, &o, &j.c, &j.err), 0, "%s", j.err.msg);
  j.data = malloc(j.n);
  fill(j.data, j.n, 13);
  pthread_t t;
  pthread_create(&t, NULL, put_main, &j);
  bool returned = false;
  for (int i = 0; i < 300 && !returned; i++) {
    usleep(100000);
    returned = atomic_load(&j.done);
  }
  if (!returned && mid.pid > 0)
    kill(mid.pid, SIGCONT); /* unstick it, to report */
  pthread_join(t, NULL);
  cr_assert_gt(mid.pid, 0, "the second tportd did not start on %s", tcp);
  cr_expect(returned, "the put had not returned 30 s after it began (client timeout 1 s)%s",
            restart ? ", its stuck chunk on a connection made after the server was replaced" : "");
  cr_expect_neq(j.rc, 0, "a put to a stopped server succeeded");
  /* the bytes are the caller's again: nng must not read them any more
   * (under ASan, a read of freed memory by the transport's writev) */
  memset(j.data, 0xee, j.n);
  free(j.data);
  usleep(200000);
  kill(mid.pid, SIGCONT);
  tport_close(j.c);
  if (restart) {
    /* forked by the put's thread, which has ended: PR_SET_PDEATHSIG has
     * killed it already */
    kill(mid.pid, SIGKILL);
    waitpid(mid.pid, NULL, 0);
  } else {
    int st = svc_terminate(mid.pid);
    cr_expect_eq(st, 0, "tportd exited with %d", st);
  }
}

Test(lent, a_put_whose_server_stops_reading_midway_returns_the_callers_bytes_first)
{
  put_stopped_midway(false);
}

Test(lent, a_put_whose_stuck_chunk_is_on_a_new_connection_returns)
{
  put_stopped_midway(true);
}

Test(lent, a_put_to_a_server_that_stopped_reading_returns_the_callers_bytes_first)
{
  char tcp[64];
  pid_t pid = -1;
  for (int attempt = 0; attempt < 5 && pid < 0; attempt++) { /* random ports may be taken */
    svc_tcp_url(tcp, sizeof tcp);
    pid = svc_spawn(tcp, NULL);
  }
  cr_assert_gt(pid, 0, "tportd did not start on %s", tcp);
  tport_client *c;
  tport_err err;
  tport_connect_options o = {.no_shm = true, .timeout_ms = 1000};
  cr_assert_eq(tport_connect(tcp, &o, &c, &err), 0, "%s", err.msg);
  /* more than the sockets' buffers hold: chunks stay in the transport */
  const size_t n = 64 << 20;
  uint8_t *data = malloc(n);
  fill(data, n, 9);
  int64_t sz = (int64_t)n;
  cr_assert_eq(kill(pid, SIGSTOP), 0);
  int rc = tport_put(c, TPORT_UINT8, 1, &sz, NULL, data, n, NULL, NULL, &err);
  cr_expect_neq(rc, 0, "a put to a stopped server succeeded");
  /* the bytes are the caller's again: nng must not read them any more */
  memset(data, 0xee, n);
  free(data);
  usleep(200000);
  cr_assert_eq(kill(pid, SIGCONT), 0);
  tport_close(c);
  cr_expect_eq(svc_terminate(pid), 0);
}
