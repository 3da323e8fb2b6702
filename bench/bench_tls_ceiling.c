/* bench_tls_ceiling: what TLS costs on this machine, without tensorport.
 *
 * Two processes stream N bytes over loopback TCP, first as plain write/read,
 * then through OpenSSL (TLS 1.3, the same certificate and cipher suites in
 * tportd's order of preference, read-ahead with a 1 MiB record buffer: the
 * fastest settings found), interleaved rep by rep.  The ratio is the ceiling
 * any OpenSSL-based transport can reach against plain TCP here: tensorport's
 * own tls rows (bench/run tls) compare against it.  Nothing of tensorport is
 * linked: this measures OpenSSL's record layer, the cipher and the kernel.
 *
 *   tport-bench-tls-ceiling --cert F --key F [--mib 16,256] [--reps R]
 *
 * prints one JSON line per size:
 *   {"op": "stream", "bytes": N, "seconds": TLS, "baseline_seconds": TCP, ...}
 */
#include "bench_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define CALL_BYTES ((size_t)4 << 20) /* one write/SSL_write: tportd's chunk */
#define MAX_REPS 64
/* transport/tls_engine_config.c's TLS 1.3 list, in its order */
#define TLS13_SUITES "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"

static char negotiated[64] = "none";

static void die(const char *what)
{
  fprintf(stderr, "tport-bench-tls-ceiling: %s\n", what);
  ERR_print_errors_fp(stderr);
  exit(1);
}

static int listen_loopback(uint16_t *port)
{
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 1) ||
      getsockname(s, (struct sockaddr *)&a, &len))
    die("cannot listen on 127.0.0.1");
  *port = ntohs(a.sin_port);
  return s;
}

static int connect_loopback(uint16_t port)
{
  int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                          .sin_port = htons(port)};
  if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a))
    die("cannot connect to 127.0.0.1");
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* as nng's tcp does */
  return s;
}

/* One transfer of n bytes on an established connection (ssl NULL: plain). */
static bool send_all(int fd, SSL *ssl, const unsigned char *buf, size_t n)
{
  for (size_t done = 0; done < n;) {
    size_t want = n - done < CALL_BYTES ? n - done : CALL_BYTES;
    long k = ssl ? SSL_write(ssl, buf, (int)want) : write(fd, buf, want);
    if (k <= 0)
      return false;
    done += (size_t)k;
  }
  return true;
}

/* Reads n bytes into buf, which holds min(n, CALL_BYTES): each call lands at
 * its start, as a server reuses its receive buffer. */
static bool recv_all(int fd, SSL *ssl, unsigned char *buf, size_t n)
{
  for (size_t done = 0; done < n;) {
    size_t want = n - done < CALL_BYTES ? n - done : CALL_BYTES;
    long k = ssl ? SSL_read(ssl, buf, (int)want) : read(fd, buf, want);
    if (k <= 0)
      return false;
    done += (size_t)k;
  }
  return true;
}

/* The receiving process: says it is ready (plain tcp; TLS has its
 * handshake), reads n bytes into a buffer of its own (not the parent's
 * pages, which would fault copy-on-write), answers one byte, exits. */
static void receiver(int ls, SSL_CTX *ctx, size_t n)
{
  int fd = accept(ls, NULL, NULL);
  SSL *ssl = NULL;
  unsigned char ready = 1, *buf = malloc(CALL_BYTES);
  if (fd < 0 || !buf)
    _exit(2);
  memset(buf, 0, CALL_BYTES);
  if (!ctx && write(fd, &ready, 1) != 1)
    _exit(2);
  if (ctx) {
    ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    SSL_set_read_ahead(ssl, 1);
    SSL_set_default_read_buffer_len(ssl, 1 << 20);
    if (SSL_accept(ssl) != 1)
      _exit(3);
  }
  unsigned char ack = 1;
  if (!recv_all(fd, ssl, buf, n) || !send_all(fd, ssl, &ack, 1))
    _exit(4);
  _exit(0);
}

/* Seconds to move n bytes from this process to a child (handshake excluded). */
static double one_rep(SSL_CTX *sctx, SSL_CTX *cctx, size_t n, unsigned char *buf)
{
  uint16_t port;
  int ls = listen_loopback(&port);
  pid_t pid = fork();
  if (pid < 0)
    die("fork");
  if (pid == 0)
    receiver(ls, sctx, n);
  close(ls);
  int fd = connect_loopback(port);
  SSL *ssl = NULL;
  if (cctx) {
    ssl = SSL_new(cctx);
    SSL_set_fd(ssl, fd);
    SSL_set_read_ahead(ssl, 1);
    if (SSL_connect(ssl) != 1)
      die("handshake");
    snprintf(negotiated, sizeof negotiated, "%s", SSL_get_cipher_name(ssl));
  }
  unsigned char ack;
  if (!cctx && !recv_all(fd, NULL, &ack, 1))
    die("the receiving process did not start");
  double t0 = bench_now();
  if (!send_all(fd, ssl, buf, n) || !recv_all(fd, ssl, &ack, 1))
    die("transfer");
  double t = bench_now() - t0;
  int status;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    die("the receiving process failed");
  SSL_free(ssl);
  close(fd);
  return t;
}

int main(int argc, char **argv)
{
  const char *cert = NULL, *key = NULL, *mibs = "16,256";
  int reps = 5;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--cert") && i + 1 < argc)
      cert = argv[++i];
    else if (!strcmp(argv[i], "--key") && i + 1 < argc)
      key = argv[++i];
    else if (!strcmp(argv[i], "--mib") && i + 1 < argc)
      mibs = argv[++i];
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
      reps = atoi(argv[++i]);
    else
      die("usage: --cert F --key F [--mib 16,256] [--reps R]");
  }
  if (!cert || !key || reps < 1 || reps > MAX_REPS)
    die("usage: --cert F --key F [--mib 16,256] [--reps R (1-64)]");
  signal(SIGPIPE, SIG_IGN);

  SSL_CTX *sctx = SSL_CTX_new(TLS_server_method()), *cctx = SSL_CTX_new(TLS_client_method());
  if (!sctx || !cctx || SSL_CTX_use_certificate_file(sctx, cert, SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_use_PrivateKey_file(sctx, key, SSL_FILETYPE_PEM) != 1 ||
      !SSL_CTX_set_min_proto_version(sctx, TLS1_3_VERSION) ||
      !SSL_CTX_set_min_proto_version(cctx, TLS1_3_VERSION) ||
      !SSL_CTX_set_ciphersuites(sctx, TLS13_SUITES) || !SSL_CTX_set_ciphersuites(cctx, TLS13_SUITES))
    die("cannot set up OpenSSL");
  SSL_CTX_set_options(sctx, SSL_OP_CIPHER_SERVER_PREFERENCE); /* as tportd */
  /* no verification: the peer is our own child; tportd's certificate
   * checks are not what this measures */

  for (const char *p = mibs; *p;) {
    char *end;
    unsigned long mib = strtoul(p, &end, 10);
    if (end == p || mib == 0 || mib > 4096)
      die("--mib: sizes in MiB, 1 to 4096, comma-separated");
    size_t n = (size_t)mib << 20;
    unsigned char *buf = malloc(n);
    if (!buf)
      die("out of memory");
    memset(buf, 0x5a, n);
    double t[2][MAX_REPS];
    one_rep(sctx, cctx, n, buf); /* warm-up: page faults, the cipher's tables */
    for (int r = 0; r < reps; r++)
      for (int j = 0; j < 2; j++) {
        int w = (r + j) % 2; /* 0: plain tcp (the baseline), 1: TLS */
        t[w][r] = one_rep(w ? sctx : NULL, w ? cctx : NULL, n, buf);
      }
    printf("{\"op\": \"stream\", \"bytes\": %zu, \"seconds\": %.6f, \"baseline_seconds\": %.6f, "
           "\"reps\": %d, \"cipher\": \"%s\"}\n",
           n, bench_median(t[1], reps), bench_median(t[0], reps), reps, negotiated);
    fflush(stdout);
    free(buf);
    p = *end == ',' ? end + 1 : end;
  }
  SSL_CTX_free(sctx);
  SSL_CTX_free(cctx);
  return 0;
}
