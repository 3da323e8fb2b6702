/*
 * test_lent_put.c: a put over tcp:// or ipc:// lends the caller's bytes to
 * its chunk requests instead of copying them (client/ops.c, nng_msg_set_tail
 * of deploy/nng/msg-lent-tail.patch), and a get's replies lend theirs from
 * the tensor (server/server.c, call_reply_lent).  What must hold: every byte
 * arrives, whatever the size, alignment and options; and a put returns only
 * once nng has let go of the caller's bytes, even when it fails with its
 * request stuck in the transport (a server that stopped reading): after
 * that the caller may free them (ASan's writev interceptor sees a read of
 * freed memory by nng).
 */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "service_util.h"

TestSuite(lent, .timeout = 120);

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

Test(lent, puts_and_gets_over_tcp_and_ipc_arrive_whole)
{
  char tcp[64], ipc[96];
  svc_tcp_url(tcp, sizeof tcp);
  svc_ipc_url(ipc, sizeof ipc);
  /* 64 KiB chunks (service_util's tportd): every chunk is lent */
  const char *extra[] = {"--listen", ipc, NULL};
  pid_t pid = svc_spawn(tcp, extra);
  cr_assert_gt(pid, 0, "tportd did not start on %s", tcp);
  const size_t big = (3 << 20) + 7;
  uint8_t *data = malloc(big + 1);
  fill(data, big + 1, 5);
  const char *urls[2] = {tcp, ipc};
  for (int u = 0; u < 2; u++) {
    for (int verify = 0; verify < 2; verify++) {
      tport_client *c;
      tport_err err;
      tport_connect_options o = {.no_shm = true, .verify = verify, .timeout_ms = 20000};
      cr_assert_eq(tport_connect(urls[u], &o, &c, &err), 0, "%s", err.msg);
      size_t sizes[] = {(64 << 10) * 5 + 123, big, 64 << 10, (64 << 10) + 1};
      for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        char what[160];
        snprintf(what, sizeof what, "%s%s, %zu bytes", urls[u], verify ? " verify" : "",
                 sizes[k]);
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
}

Test(lent, a_put_to_a_server_that_stopped_reading_returns_the_callers_bytes_first)
{
  char tcp[64];
  svc_tcp_url(tcp, sizeof tcp);
  pid_t pid = svc_spawn(tcp, NULL);
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
