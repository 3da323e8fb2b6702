/*
 * test_tls.c: the OpenSSL TLS engine (transport/tls_openssl.c) under real nng
 * REQ/REP sockets over tls+tcp://127.0.0.1, with a CA and certificates made
 * by each test (OpenSSL API, into a temporary directory): round trips up to
 * several MiB, the negotiated version and suites (AEAD only, checked with a
 * stock OpenSSL client), server verification (CA, name), mutual TLS (the
 * client's CN read back on the server's pipe; no certificate, another CA's,
 * an expired one refused), plain tcp against TLS either way, handshakes
 * abandoned half way, close_notify, frozen configurations, and the config
 * helpers' errors.  Every wait is bounded; everything stays on loopback.
 */
#include <criterion/criterion.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>
#include <nng/supplemental/util/platform.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "tls_openssl.h"

#define MSG_MAX (64u << 20)
#define DAY (24L * 3600)

/* ---------------------------------------------------------------- certificates */

static char dir[64];

static char *path_of(const char *name)
{
  static char paths[16][320];
  static int next;
  char *p = paths[next++ % 16];
  snprintf(p, sizeof paths[0], "%s/%s", dir, name);
  return p;
}

static void add_ext(X509 *x, X509V3_CTX *ctx, int nid, const char *value)
{
  X509_EXTENSION *e = X509V3_EXT_conf_nid(NULL, ctx, nid, value);
  cr_assert_not_null(e, "extension %d=%s", nid, value);
  cr_assert_eq(X509_add_ext(x, e, -1), 1);
  X509_EXTENSION_free(e);
}

/* A certificate for key with subject CN=cn, signed by issuer (self-signed
 * when NULL), valid from now+from_s to now+to_s. */
static X509 *make_cert(const char *cn, EVP_PKEY *key, X509 *issuer, EVP_PKEY *issuer_key, bool ca,
                       const char *san, const char *eku, long from_s, long to_s)
{
  static long serial = 1000;
  X509 *x = X509_new();
  cr_assert_not_null(x);
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), serial++);
  X509_gmtime_adj(X509_getm_notBefore(x), from_s);
  X509_gmtime_adj(X509_getm_notAfter(x), to_s);
  X509_set_pubkey(x, key);
  X509_NAME *name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, (const unsigned char *)"tensorport tests", -1,
                             -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0);
  X509_set_issuer_name(x, issuer ? X509_get_subject_name(issuer) : name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer ? issuer : x, x, NULL, NULL, 0);
  add_ext(x, &ctx, NID_basic_constraints, ca ? "critical,CA:TRUE" : "critical,CA:FALSE");
  add_ext(x, &ctx, NID_key_usage,
          ca ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature");
  add_ext(x, &ctx, NID_subject_key_identifier, "hash");
  add_ext(x, &ctx, NID_authority_key_identifier, "keyid:always");
  if (san)
    add_ext(x, &ctx, NID_subject_alt_name, san);
  if (eku)
    add_ext(x, &ctx, NID_ext_key_usage, eku);
  cr_assert_gt(X509_sign(x, issuer_key ? issuer_key : key, EVP_sha256()), 0);
  return x;
}

static EVP_PKEY *new_key(void)
{
  EVP_PKEY *k = EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
  cr_assert_not_null(k);
  return k;
}

static void write_cert(const char *name, X509 *x)
{
  FILE *f = fopen(path_of(name), "w");
  cr_assert_not_null(f);
  cr_assert_eq(PEM_write_X509(f, x), 1);
  fclose(f);
}

static void write_key(const char *name, EVP_PKEY *k, const char *password)
{
  FILE *f = fopen(path_of(name), "w");
  cr_assert_not_null(f);
  if (password)
    cr_assert_eq(PEM_write_PrivateKey(f, k, EVP_aes_256_cbc(), NULL, 0, NULL, (void *)password), 1);
  else
    cr_assert_eq(PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL), 1);
  fclose(f);
}

/* One issued identity: NAME.pem (certificate) and NAME.key. */
static void issue(const char *name, const char *cn, X509 *ca, EVP_PKEY *ca_key, const char *san,
                  const char *eku, long from_s, long to_s)
{
  char file[64];
  EVP_PKEY *k = new_key();
  X509 *x = make_cert(cn, k, ca, ca_key, false, san, eku, from_s, to_s);
  snprintf(file, sizeof file, "%s.pem", name);
  write_cert(file, x);
  snprintf(file, sizeof file, "%s.key", name);
  write_key(file, k, NULL);
  if (strcmp(name, "alice") == 0)
    write_key("alice.enc.key", k, "open sesame");
  X509_free(x);
  EVP_PKEY_free(k);
}

static void append_file(FILE *out, const char *name)
{
  char buf[4096];
  size_t n;
  FILE *in = fopen(path_of(name), "r");
  cr_assert_not_null(in);
  while ((n = fread(buf, 1, sizeof buf, in)) > 0)
    fwrite(buf, 1, n, out);
  fclose(in);
}

/* CA A signs the server ("tport-server": localhost, 127.0.0.1) and the
 * clients alice and old (expired); CA B signs mallory. */
static void make_pki(void)
{
  EVP_PKEY *ka = new_key(), *kb = new_key();
  X509 *a = make_cert("Test CA A", ka, NULL, NULL, true, NULL, NULL, -DAY, 30 * DAY);
  X509 *b = make_cert("Test CA B", kb, NULL, NULL, true, NULL, NULL, -DAY, 30 * DAY);
  write_cert("ca_a.pem", a);
  write_cert("ca_b.pem", b);
  issue("server", "tport-server", a, ka, "DNS:localhost,IP:127.0.0.1", "serverAuth", -DAY,
        30 * DAY);
  issue("cn_only", "localhost", a, ka, NULL, "serverAuth", -DAY, 30 * DAY); /* no SAN */
  issue("alice", "alice", a, ka, NULL, "clientAuth", -DAY, 30 * DAY);
  issue("old", "old", a, ka, NULL, "clientAuth", -10 * DAY, -DAY);
  issue("mallory", "alice", b, kb, NULL, "clientAuth", -DAY, 30 * DAY);
  /* the server's certificate and key in one file, as nng's cert-key-file takes them */
  FILE *f = fopen(path_of("server_combined.pem"), "w");
  cr_assert_not_null(f);
  append_file(f, "server.pem");
  append_file(f, "server.key");
  fclose(f);
  f = fopen(path_of("not_pem.pem"), "w");
  cr_assert_not_null(f);
  fputs("this is not a certificate\n", f);
  fclose(f);
  X509_free(a);
  X509_free(b);
  EVP_PKEY_free(ka);
  EVP_PKEY_free(kb);
}

/* ---------------------------------------------------------------- an echo server */

typedef struct server {
  nng_socket sock;
  nng_listener listener;
  pthread_t thread;
  bool running;
  int port;
  char url[80];
} server;

static server srv;

/* Echoes every request, except "whoami", answered with what
 * transport_tls_pipe_peer says about the request's pipe. */
static void *serve(void *arg)
{
  server *s = arg;
  for (;;) {
    nng_msg *m;
    int rv = nng_recvmsg(s->sock, &m, 0);
    if (rv != 0)
      break; /* closed */
    if (nng_msg_len(m) == 6 && memcmp(nng_msg_body(m), "whoami", 6) == 0) {
      transport_tls_peer p;
      tport_err e = {0};
      int rc = transport_tls_pipe_peer(nng_msg_get_pipe(m), &p, &e);
      char reply[512];
      if (rc == 0)
        snprintf(reply, sizeof reply, "rc=0 verified=%d version=%s cipher=%s cn=[%s]", p.verified,
                 p.version_name, p.cipher, p.cn);
      else
        snprintf(reply, sizeof reply, "rc=%d %s", rc, e.msg);
      nng_msg_clear(m);
      nng_msg_append(m, reply, strlen(reply) + 1);
    }
    if (nng_sendmsg(s->sock, m, 0) != 0)
      nng_msg_free(m);
  }
  return NULL;
}

/* Listens on scheme://127.0.0.1:0 (the kernel picks a free port, so no
 * port is ever taken) with cfg (NULL: plain or nng's defaults). */
static void server_start(server *s, const char *scheme, nng_tls_config *cfg)
{
  char url[80];
  cr_assert_eq(nng_rep0_open(&s->sock), 0);
  /* no receive time-out: nng_close ends the receive (NNG_ECLOSED), and in
   * nng 1.5.2 a receive timing out on the aio expire thread while the
   * socket closes locks the freed socket's mutex (rep0_cancel_recv: a
   * panic in this suite's teardown, 2 of 6 full ctest runs on a loaded
   * machine) */
  nng_socket_set_ms(s->sock, NNG_OPT_SENDTIMEO, 30000);
  nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, MSG_MAX);
  snprintf(url, sizeof url, "%s://127.0.0.1:0", scheme);
  cr_assert_eq(nng_listener_create(&s->listener, s->sock, url), 0);
  if (cfg)
    cr_assert_eq(nng_listener_set_ptr(s->listener, NNG_OPT_TLS_CONFIG, cfg), 0);
  cr_assert_eq(nng_listener_start(s->listener, 0), 0);
  cr_assert_eq(nng_listener_get_int(s->listener, NNG_OPT_TCP_BOUND_PORT, &s->port), 0);
  snprintf(s->url, sizeof s->url, "%s://127.0.0.1:%d", scheme, s->port);
  cr_assert_eq(pthread_create(&s->thread, NULL, serve, s), 0);
  s->running = true;
}

static void server_stop(server *s)
{
  if (!s->running)
    return;
  nng_close(s->sock);
  pthread_join(s->thread, NULL);
  s->running = false;
}

static nng_tls_config *server_cfg_as(const char *who, const char *client_ca, bool tls12)
{
  char cert[32], key[32];
  snprintf(cert, sizeof cert, "%s.pem", who);
  snprintf(key, sizeof key, "%s.key", who);
  transport_tls_server_opts o = {.cert_file = path_of(cert),
                                 .key_file = path_of(key),
                                 .client_ca_file = client_ca ? path_of(client_ca) : NULL,
                                 .allow_tls12 = tls12};
  nng_tls_config *cfg = NULL;
  tport_err e = {0};
  cr_assert_eq(transport_tls_server_config(&o, &cfg, &e), 0, "%s", e.msg);
  return cfg;
}

static void tls_server_as(const char *who, const char *client_ca, bool tls12)
{
  nng_tls_config *cfg = server_cfg_as(who, client_ca, tls12);
  server_start(&srv, "tls+tcp", cfg);
  nng_tls_config_free(cfg); /* the listener holds its own */
}

static void tls_server(const char *client_ca, bool tls12)
{
  tls_server_as("server", client_ca, tls12);
}

/* ---------------------------------------------------------------- clients */

/* A client config: CA file, optional identity NAME (NAME.pem/NAME.key), name to check. */
static nng_tls_config *client_cfg(const char *ca, const char *who, const char *server_name)
{
  char cert[32], key[32];
  transport_tls_client_opts o = {.ca_file = ca ? path_of(ca) : NULL, .server_name = server_name};
  if (who) {
    snprintf(cert, sizeof cert, "%s.pem", who);
    snprintf(key, sizeof key, "%s.key", who);
    o.cert_file = path_of(cert);
    o.key_file = path_of(key);
  }
  nng_tls_config *cfg = NULL;
  tport_err e = {0};
  cr_assert_eq(transport_tls_client_config(&o, srv.url, &cfg, &e), 0, "%s", e.msg);
  return cfg;
}

/* Dials url synchronously (nng reports the first attempt's result); on
 * failure the socket is closed and the nng error returned. */
static int dial(nng_socket *s, const char *url, nng_tls_config *cfg)
{
  nng_dialer d;
  cr_assert_eq(nng_req0_open(s), 0);
  nng_socket_set_ms(*s, NNG_OPT_RECVTIMEO, 60000);
  nng_socket_set_ms(*s, NNG_OPT_SENDTIMEO, 60000);
  nng_socket_set_size(*s, NNG_OPT_RECVMAXSZ, MSG_MAX);
  cr_assert_eq(nng_dialer_create(&d, *s, url), 0);
  if (cfg) {
    cr_assert_eq(nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, cfg), 0);
    nng_tls_config_free(cfg);
  }
  int rv = nng_dialer_start(d, 0);
  if (rv != 0)
    nng_close(*s);
  return rv;
}

/* Sends n bytes and returns the reply (caller frees it with nng_msg_free). */
static nng_msg *call(nng_socket s, const void *data, size_t n)
{
  nng_msg *m, *r;
  cr_assert_eq(nng_msg_alloc(&m, n), 0);
  if (n)
    memcpy(nng_msg_body(m), data, n);
  cr_assert_eq(nng_sendmsg(s, m, 0), 0);
  int rv = nng_recvmsg(s, &r, 0);
  cr_assert_eq(rv, 0, "reply: %s", nng_strerror(rv));
  return r;
}

static void echo_ok(nng_socket s, size_t n)
{
  uint8_t *data = malloc(n ? n : 1);
  uint64_t x = 0x9E3779B97F4A7C15ull ^ n;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    data[i] = (uint8_t)x;
  }
  nng_msg *r = call(s, data, n);
  cr_assert_eq(nng_msg_len(r), n, "%zu-byte echo came back with %zu", n, nng_msg_len(r));
  cr_assert(memcmp(nng_msg_body(r), data, n) == 0, "%zu-byte echo differs", n);
  nng_msg_free(r);
  free(data);
}

/* What the server says about the pipe of this client's request. */
static void whoami(nng_socket s, char *out, size_t n)
{
  nng_msg *r = call(s, "whoami", 6);
  snprintf(out, n, "%s", (const char *)nng_msg_body(r));
  nng_msg_free(r);
}

static void good_client_works(void)
{
  nng_socket c;
  int rv = dial(&c, srv.url, client_cfg("ca_a.pem", NULL, NULL));
  cr_assert_eq(rv, 0, "a good client after the failures: %s", nng_strerror(rv));
  echo_ok(c, 100);
  nng_close(c);
}

static transport_tls_stats stats(void)
{
  transport_tls_stats st;
  transport_tls_stats_get(&st);
  return st;
}

/* Polls the counters into st until cond holds (5 s at most). */
#define WAIT_STATS(st, cond)                                                                       \
  for (int wait_ = 0; wait_ < 500 && !(cond); wait_++) {                                           \
    nng_msleep(10);                                                                                \
    st = stats();                                                                                  \
  }

static int raw_connect(int port)
{
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  cr_assert_geq(fd, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  return fd;
}

/* ---------------------------------------------------------------- fixture */

static void setup(void)
{
  snprintf(dir, sizeof dir, "/tmp/tport-tls-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  make_pki();
  tport_err e = {0};
  cr_assert_eq(transport_tls_register(&e), 0, "%s", e.msg);
  memset(&srv, 0, sizeof srv);
}

static void teardown(void)
{
  server_stop(&srv);
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d)) != NULL;)
    if (e->d_name[0] != '.')
      unlink(path_of(e->d_name));
  if (d)
    closedir(d);
  rmdir(dir);
  /* no nng_fini(): Criterion talks to its runner through nng in this process */
}

TestSuite(tls, .init = setup, .fini = teardown, .timeout = 240);

/* ---------------------------------------------------------------- tests */

Test(tls, engine_is_registered_once)
{
  tport_err e = {0};
  cr_assert(transport_tls_registered());
  cr_assert_eq(transport_tls_register(&e), 0, "%s", e.msg); /* again: nothing changes */
  cr_assert_str_eq(nng_tls_engine_name(), TRANSPORT_TLS_ENGINE_NAME);
  cr_assert_not_null(strstr(nng_tls_engine_description(), "OpenSSL 3"), "%s",
                     nng_tls_engine_description());
}

Test(tls, round_trips_are_byte_exact_over_tls13)
{
  static const size_t sizes[] = {0,     1,         100,      16383,          16384,
                                 16385, 65536 + 3, 1u << 20, (1u << 20) + 7, 5u << 20};
  transport_tls_stats before = stats();
  tls_server(NULL, false);
  nng_socket c;
  int rv = dial(&c, srv.url, client_cfg("ca_a.pem", NULL, NULL));
  cr_assert_eq(rv, 0, "dial %s: %s", srv.url, nng_strerror(rv));
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    echo_ok(c, sizes[i]);

  /* the client's view of its pipe: the server proved its name */
  nng_msg *r = call(c, "x", 1);
  transport_tls_peer p;
  tport_err e = {0};
  cr_assert_eq(transport_tls_pipe_peer(nng_msg_get_pipe(r), &p, &e), 0, "%s", e.msg);
  nng_msg_free(r);
  cr_assert(p.handshake_done);
  cr_assert(p.verified);
  cr_assert_eq(p.version, 0x0304);
  cr_assert_str_eq(p.version_name, "TLSv1.3");
  cr_assert_str_eq(p.cipher, "TLS_AES_128_GCM_SHA256");
  cr_assert_str_eq(p.cn, "tport-server");

  /* the server's view: no client certificate was asked for */
  char who[512];
  whoami(c, who, sizeof who);
  cr_assert_str_eq(who, "rc=0 verified=0 version=TLSv1.3 cipher=TLS_AES_128_GCM_SHA256 cn=[]");
  nng_close(c);

  transport_tls_stats after = stats();
  cr_assert_eq(after.handshakes_tls13 - before.handshakes_tls13, 2, "client and server");
  cr_assert_eq(after.handshakes_tls12, before.handshakes_tls12);
  cr_assert_eq(after.failures, before.failures, "%s", after.last_client_failure);
}

Test(tls, several_clients_at_once)
{
  enum { N = 4 };
  tls_server(NULL, false);
  nng_socket c[N];
  for (int i = 0; i < N; i++)
    cr_assert_eq(dial(&c[i], srv.url, client_cfg("ca_a.pem", NULL, NULL)), 0);
  for (int round = 0; round < 3; round++)
    for (int i = 0; i < N; i++)
      echo_ok(c[i], (size_t)(round * 70000 + i));
  for (int i = 0; i < N; i++)
    nng_close(c[i]);
}

/* deploy/nng/0010: a connection's buffers grow from 64 KiB to 1 MiB, each
 * when it is empty, once one operation moves twice its size; a send
 * completes when OpenSSL has taken all of it.  Small and large messages
 * interleaved, on several connections at once (each end's buffers grow at
 * a different moment of its stream, and wrap at the new size): every byte
 * as sent. */
typedef struct bulk_run {
  nng_socket sock;
  char failure[160]; /* empty: every echo came back whole */
} bulk_run;

/* echo_ok without Criterion's asserts, which belong to the test's thread */
static void *bulk_client(void *arg)
{
  static const size_t sizes[] = {100,           (8u << 20) + 5, 1,   (3u << 20) + 1, 65536 + 3,
                                 (1u << 20) - 1, 20u << 20,      777, (2u << 20) + 17};
  bulk_run *b = arg;
  uint8_t *data = malloc((20u << 20) + 2);
  for (int round = 0; round < 2 && !b->failure[0]; round++)
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && !b->failure[0]; i++) {
      size_t n = sizes[i] + (size_t)round;
      uint64_t x = 0x9E3779B97F4A7C15ull ^ n ^ (uint64_t)(uintptr_t)b;
      for (size_t k = 0; k < n; k++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        data[k] = (uint8_t)x;
      }
      nng_msg *m, *r;
      int rv = nng_msg_alloc(&m, n);
      if (rv == 0) {
        memcpy(nng_msg_body(m), data, n);
        if ((rv = nng_sendmsg(b->sock, m, 0)) != 0)
          nng_msg_free(m);
      }
      if (rv == 0 && (rv = nng_recvmsg(b->sock, &r, 0)) == 0) {
        if (nng_msg_len(r) != n || memcmp(nng_msg_body(r), data, n) != 0)
          snprintf(b->failure, sizeof b->failure, "%zu-byte echo came back as %zu bytes, or other bytes",
                   n, nng_msg_len(r));
        nng_msg_free(r);
      }
      if (rv != 0)
        snprintf(b->failure, sizeof b->failure, "%zu-byte echo: %s", n, nng_strerror(rv));
    }
  free(data);
  return NULL;
}

Test(tls, bulk_messages_between_small_ones_arrive_whole)
{
  enum { N = 3 };
  tls_server(NULL, false);
  bulk_run b[N];
  pthread_t t[N];
  memset(b, 0, sizeof b);
  for (int i = 0; i < N; i++)
    cr_assert_eq(dial(&b[i].sock, srv.url, client_cfg("ca_a.pem", NULL, NULL)), 0);
  for (int i = 0; i < N; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, bulk_client, &b[i]), 0);
  for (int i = 0; i < N; i++)
    pthread_join(t[i], NULL);
  for (int i = 0; i < N; i++) {
    cr_expect_str_empty(b[i].failure, "client %d: %s", i, b[i].failure);
    nng_close(b[i].sock);
  }
}

/* A stock OpenSSL client: blocking, on a plain socket to srv, trusting CA A
 * and checking 127.0.0.1; suites13 / ciphers12 / max_version narrow what it
 * offers (NULL / 0: OpenSSL's defaults). */
typedef struct stock_client {
  SSL_CTX *ctx;
  SSL *ssl;
  int fd;
} stock_client;

static bool stock_connect_as(stock_client *sc, const char *who, const char *suites13,
                             const char *ciphers12, int max_version)
{
  sc->ctx = SSL_CTX_new(TLS_client_method());
  cr_assert_not_null(sc->ctx);
  if (who) {
    char cert[32], key[32];
    snprintf(cert, sizeof cert, "%s.pem", who);
    snprintf(key, sizeof key, "%s.key", who);
    cr_assert_eq(SSL_CTX_use_certificate_file(sc->ctx, path_of(cert), SSL_FILETYPE_PEM), 1);
    cr_assert_eq(SSL_CTX_use_PrivateKey_file(sc->ctx, path_of(key), SSL_FILETYPE_PEM), 1);
  }
  cr_assert_eq(SSL_CTX_load_verify_locations(sc->ctx, path_of("ca_a.pem"), NULL), 1);
  SSL_CTX_set_verify(sc->ctx, SSL_VERIFY_PEER, NULL);
  if (suites13)
    cr_assert_eq(SSL_CTX_set_ciphersuites(sc->ctx, suites13), 1);
  if (ciphers12)
    cr_assert_eq(SSL_CTX_set_cipher_list(sc->ctx, ciphers12), 1);
  if (max_version)
    cr_assert_eq(SSL_CTX_set_max_proto_version(sc->ctx, max_version), 1);
  sc->fd = raw_connect(srv.port);
  struct timeval tv = {.tv_sec = 20};
  setsockopt(sc->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(sc->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sc->ssl = SSL_new(sc->ctx);
  cr_assert_not_null(sc->ssl);
  SSL_set_fd(sc->ssl, sc->fd);
  cr_assert_eq(SSL_set1_host(sc->ssl, "127.0.0.1"), 1);
  return SSL_connect(sc->ssl) == 1;
}

static bool stock_connect(stock_client *sc, const char *suites13, const char *ciphers12,
                          int max_version)
{
  return stock_connect_as(sc, NULL, suites13, ciphers12, max_version);
}

static void stock_close(stock_client *sc)
{
  SSL_free(sc->ssl);
  SSL_CTX_free(sc->ctx);
  close(sc->fd);
}

Test(tls, suites_are_aead_only)
{
  tls_server(NULL, true);
  stock_client sc;
  /* a client that prefers ChaCha20 (one without AES hardware) gets it */
  cr_assert(stock_connect(&sc, "TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256", NULL, 0));
  cr_assert_str_eq(SSL_get_cipher_name(sc.ssl), "TLS_CHACHA20_POLY1305_SHA256");
  stock_close(&sc);
  cr_assert(stock_connect(&sc, "TLS_AES_256_GCM_SHA384", NULL, 0));
  cr_assert_str_eq(SSL_get_cipher_name(sc.ssl), "TLS_AES_256_GCM_SHA384");
  stock_close(&sc);
  cr_assert(stock_connect(&sc, NULL, "ECDHE-ECDSA-CHACHA20-POLY1305", TLS1_2_VERSION));
  cr_assert_str_eq(SSL_get_cipher_name(sc.ssl), "ECDHE-ECDSA-CHACHA20-POLY1305");
  stock_close(&sc);
  /* nothing else is offered: no CBC or SHA-1 suite with TLS 1.2, no CCM with 1.3 */
  cr_assert_not(
      stock_connect(&sc, NULL, "ECDHE-ECDSA-AES128-SHA256:ECDHE-ECDSA-AES256-SHA", TLS1_2_VERSION));
  stock_close(&sc);
  cr_assert_not(stock_connect(&sc, "TLS_AES_128_CCM_SHA256", NULL, 0));
  stock_close(&sc);
  good_client_works();
}

/* A stock OpenSSL client (blocking, on a plain socket) against the nng
 * listener: the SP header exchange and one request by hand, then a
 * close_notify, which the engine must answer with its own.  (Closing an nng
 * socket cannot test this: nng 1.5.2 may tear the TCP stream down before it
 * calls the engine's close: see the top of tls_openssl.c.) */
Test(tls, close_notify_both_ways_with_a_stock_openssl_client)
{
  static const unsigned char sp_req[8] = {0, 'S', 'P', 0, 0, 0x30, 0, 0}; /* REQ v0 */
  static const unsigned char sp_rep[8] = {0, 'S', 'P', 0, 0, 0x31, 0, 0}; /* REP v0 */
  static const unsigned char request[8 + 4 + 5] = {0, 0, 0, 0,   0,   0,   0,   9,  0x80,
                                                   0, 0, 1, 'h', 'e', 'l', 'l', 'o'};
  transport_tls_stats before = stats();
  tls_server(NULL, false);

  stock_client sc;
  cr_assert(stock_connect(&sc, NULL, NULL, 0), "handshake with the engine");
  SSL *ssl = sc.ssl;
  cr_assert_str_eq(SSL_get_version(ssl), "TLSv1.3");

  unsigned char got[64];
  cr_assert_eq(SSL_write(ssl, sp_req, sizeof sp_req), (int)sizeof sp_req);
  cr_assert_eq(SSL_read(ssl, got, 8), 8);
  cr_assert(memcmp(got, sp_rep, 8) == 0, "the server's SP header");
  cr_assert_eq(SSL_write(ssl, request, sizeof request), (int)sizeof request);
  size_t have = 0;
  while (have < sizeof request) {
    int n = SSL_read(ssl, got + have, (int)(sizeof got - have));
    cr_assert_gt(n, 0, "the reply");
    have += (size_t)n;
  }
  cr_assert(memcmp(got, request, sizeof request) == 0, "the echo, framed as sent");

  /* the engine's close_notify goes out only if nng's previous TCP send has
   * completed (its callback runs on nng's task threads): let it */
  nng_msleep(300);
  cr_assert_geq(SSL_shutdown(ssl), 0, "our close_notify");
  int n = SSL_read(ssl, got, sizeof got);
  cr_assert_leq(n, 0);
  cr_assert_eq(SSL_get_error(ssl, n), SSL_ERROR_ZERO_RETURN,
               "the engine's close_notify: SSL error %d, errno %d", SSL_get_error(ssl, n), errno);
  stock_close(&sc);

  /* the engine counts after OpenSSL handed its records to nng: the peer may know first */
  transport_tls_stats after = stats();
  WAIT_STATS(after, after.close_notify_sent != before.close_notify_sent);
  cr_assert_eq(after.close_notify_received - before.close_notify_received, 1);
  cr_assert_eq(after.close_notify_sent - before.close_notify_sent, 1);
  cr_assert_eq(after.failures, before.failures, "%s", after.last_server_failure);
}

Test(tls, untrusted_server_certificate_fails_the_dial)
{
  transport_tls_stats before = stats();
  tls_server(NULL, false);
  nng_socket c;
  int rv = dial(&c, srv.url, client_cfg("ca_b.pem", NULL, NULL));
  cr_assert_eq(rv, NNG_EPEERAUTH, "dial: %s", nng_strerror(rv));
  transport_tls_stats after = stats();
  cr_assert_eq(after.verify_failures - before.verify_failures, 1);
  good_client_works();
}

Test(tls, system_store_does_not_trust_a_private_ca)
{
  tls_server(NULL, false);
  nng_socket c;
  int rv = dial(&c, srv.url, client_cfg(NULL, NULL, NULL));
  cr_assert_eq(rv, NNG_EPEERAUTH, "dial: %s", nng_strerror(rv));
  good_client_works();
}

Test(tls, server_name_is_checked)
{
  tls_server(NULL, false);
  nng_socket c;
  int rv = dial(&c, srv.url, client_cfg("ca_a.pem", NULL, "wrong.example"));
  cr_assert_eq(rv, NNG_EPEERAUTH, "wrong name: %s", nng_strerror(rv));
  cr_assert_str_eq(stats().last_client_failure,
                   "client handshake: peer certificate refused: hostname mismatch");
  rv = dial(&c, srv.url, client_cfg("ca_a.pem", NULL, "127.0.0.2"));
  cr_assert_eq(rv, NNG_EPEERAUTH, "wrong address: %s", nng_strerror(rv));
  rv = dial(&c, srv.url, client_cfg("ca_a.pem", NULL, "localhost")); /* a DNS name it carries */
  cr_assert_eq(rv, 0, "localhost: %s", nng_strerror(rv));
  echo_ok(c, 1000);
  nng_close(c);

  /* a certificate naming its host only in the subject CN does not prove it */
  server_stop(&srv);
  tls_server_as("cn_only", NULL, false);
  rv = dial(&c, srv.url, client_cfg("ca_a.pem", NULL, "localhost"));
  cr_assert_eq(rv, NNG_EPEERAUTH, "CN-only certificate: %s", nng_strerror(rv));
}

Test(tls, a_configuration_in_use_is_frozen)
{
  tls_server(NULL, false);
  nng_tls_config *cfg = client_cfg("ca_a.pem", NULL, NULL);
  nng_tls_config_hold(cfg); /* dial() gives one reference to the dialer */
  nng_socket c;
  cr_assert_eq(dial(&c, srv.url, cfg), 0);
  cr_assert_eq(nng_tls_config_server_name(cfg, "other.example"), NNG_EBUSY);
  cr_assert_eq(nng_tls_config_auth_mode(cfg, NNG_TLS_AUTH_MODE_NONE), NNG_EBUSY);
  cr_assert_eq(nng_tls_config_version(cfg, NNG_TLS_1_2, NNG_TLS_1_3), NNG_EBUSY);
  cr_assert_eq(nng_tls_config_ca_file(cfg, path_of("ca_b.pem")), NNG_EBUSY);
  echo_ok(c, 100);
  nng_close(c);
  nng_tls_config_free(cfg);
}

Test(tls, mutual_tls_gives_the_server_the_client_cn)
{
  tls_server("ca_a.pem", false);
  nng_socket c;
  int rv = dial(&c, srv.url, client_cfg("ca_a.pem", "alice", NULL));
  cr_assert_eq(rv, 0, "alice: %s", nng_strerror(rv));
  char who[512];
  whoami(c, who, sizeof who);
  cr_assert_str_eq(who, "rc=0 verified=1 version=TLSv1.3 cipher=TLS_AES_128_GCM_SHA256 cn=[alice]");
  echo_ok(c, 3u << 20);
  nng_close(c);
}

Test(tls, mutual_tls_with_an_encrypted_client_key)
{
  tls_server("ca_a.pem", false);
  transport_tls_client_opts o = {.ca_file = path_of("ca_a.pem"),
                                 .cert_file = path_of("alice.pem"),
                                 .key_file = path_of("alice.enc.key"),
                                 .key_password = "open sesame"};
  nng_tls_config *cfg;
  tport_err e = {0};
  cr_assert_eq(transport_tls_client_config(&o, srv.url, &cfg, &e), 0, "%s", e.msg);
  nng_socket c;
  cr_assert_eq(dial(&c, srv.url, cfg), 0);
  char who[512];
  whoami(c, who, sizeof who);
  cr_assert_not_null(strstr(who, "cn=[alice]"), "%s", who);
  nng_close(c);
}

/* Each refusal: the refused client learns why (the alert), the server counts
 * a refused certificate, and serves a good client right after.
 *
 * The refused client is a stock OpenSSL one.  An nng dialer would do, but
 * nng 1.5.2 itself can hang it: with TLS 1.3 the client has finished its
 * handshake when the server refuses it, and if the alert and the close
 * arrive while the tls+tcp dialer is between sending its SP header and
 * reading the server's, nng closes the TCP stream beneath the read it then
 * starts, which never completes (tls_common.c: tls_tcp_error leaves the
 * stream open to new operations), so nng_dialer_start waited for ever --
 * about 1 dial in 100 on this machine (more under load).  deploy/nng carries the fix; the test
 * after this one holds nng dialers to it. */
static void refused(const char *who, const char *why, int alert_reason, const char *expect)
{
  transport_tls_stats before = stats();
  stock_client sc;
  cr_assert(stock_connect_as(&sc, who, NULL, NULL, 0), "%s: the client's TLS 1.3 handshake", why);
  unsigned char got[16];
  int n = SSL_read(sc.ssl, got, sizeof got);
  cr_assert_leq(n, 0, "%s: the server talked to a refused client", why);
  /* the alert says why; it can also be lost, and the client then sees the
   * connection end (nng 1.5.2 closes the TCP stream right after a failed
   * handshake: an alert behind a send still completing never leaves) */
  int reason = ERR_GET_REASON(ERR_peek_last_error());
  cr_assert(SSL_get_error(sc.ssl, n) == SSL_ERROR_SSL &&
                (reason == alert_reason || reason == SSL_R_UNEXPECTED_EOF_WHILE_READING),
            "%s: SSL error %d: %s", why, SSL_get_error(sc.ssl, n), ERR_reason_error_string(reason));
  ERR_clear_error();
  stock_close(&sc);

  /* the server counts after OpenSSL sent its alert: the client may know first */
  transport_tls_stats after = stats();
  WAIT_STATS(after, after.verify_failures != before.verify_failures);
  cr_assert_eq(after.verify_failures - before.verify_failures, 1, "%s: %s", why,
               after.last_server_failure);
  cr_assert_not_null(strstr(after.last_server_failure, expect), "%s: %s", why,
                     after.last_server_failure);

  nng_socket ok;
  int rv = dial(&ok, srv.url, client_cfg("ca_a.pem", "alice", NULL));
  cr_assert_eq(rv, 0, "alice after %s: %s", why, nng_strerror(rv));
  echo_ok(ok, 10);
  nng_close(ok);
}

Test(tls, mutual_tls_refuses_missing_foreign_and_expired_certificates)
{
  tls_server("ca_a.pem", false);
  refused(NULL, "no certificate", SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED,
          "server handshake: peer certificate refused: the peer sent no");
  refused("mallory", "another CA", SSL_R_TLSV1_ALERT_UNKNOWN_CA,
          "unable to get local issuer certificate");
  refused("old", "expired", SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED, "certificate has expired");
}

static double now_s(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + t.tv_nsec / 1e9;
}

/* Refused nng dialers, many times over: each dial must end, with an error.
 * Before deploy/nng's fix for failed TLS connections, about 1 in 100 hung in
 * nng_dialer_start (see refused() above).  A worker dials; this thread
 * watches it make progress, so a hang fails with a message, not a timeout. */
#define REFUSED_DIALS 300
static atomic_int dials_done, dials_let_in;

static void *dial_refused_many(void *arg)
{
  (void)arg;
  for (int i = 0; i < REFUSED_DIALS; i++) {
    nng_socket c;
    if (dial(&c, srv.url, client_cfg("ca_a.pem", (i & 1) ? "mallory" : NULL, NULL)) == 0) {
      atomic_fetch_add(&dials_let_in, 1);
      nng_close(c);
    }
    atomic_fetch_add(&dials_done, 1);
  }
  return NULL;
}

Test(tls, refused_nng_dialers_always_return)
{
  tls_server("ca_a.pem", false);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, dial_refused_many, NULL), 0);
  int seen = -1;
  double last = now_s();
  while (atomic_load(&dials_done) < REFUSED_DIALS) {
    int d = atomic_load(&dials_done);
    if (d != seen) {
      seen = d;
      last = now_s();
    }
    cr_assert_lt(now_s() - last, 20.0, "dial %d of %d has not returned in 20 s", d + 1,
                 REFUSED_DIALS);
    usleep(10000);
  }
  pthread_join(t, NULL);
  cr_assert_eq(atomic_load(&dials_let_in), 0, "a refused client was let in");
  nng_socket ok;
  int rv = dial(&ok, srv.url, client_cfg("ca_a.pem", "alice", NULL));
  cr_assert_eq(rv, 0, "alice after the refusals: %s", nng_strerror(rv));
  echo_ok(ok, 10);
  nng_close(ok);
}

Test(tls, tls12_only_when_allowed)
{
  tls_server(NULL, false);
  nng_tls_config *cfg = client_cfg("ca_a.pem", NULL, NULL);
  cr_assert_eq(nng_tls_config_version(cfg, NNG_TLS_1_2, NNG_TLS_1_2), 0);
  nng_socket c;
  int rv = dial(&c, srv.url, cfg);
  cr_assert_neq(rv, 0, "a TLS 1.2 client was let into a TLS 1.3 server");
  server_stop(&srv);

  transport_tls_stats before = stats();
  tls_server(NULL, true);
  cfg = client_cfg("ca_a.pem", NULL, NULL);
  cr_assert_eq(nng_tls_config_version(cfg, NNG_TLS_1_2, NNG_TLS_1_2), 0);
  rv = dial(&c, srv.url, cfg);
  cr_assert_eq(rv, 0, "TLS 1.2: %s", nng_strerror(rv));
  char who[512];
  whoami(c, who, sizeof who);
  cr_assert_str_eq(who,
                   "rc=0 verified=0 version=TLSv1.2 cipher=ECDHE-ECDSA-AES128-GCM-SHA256 cn=[]");
  echo_ok(c, 2u << 20);
  nng_close(c);
  cr_assert_eq(stats().handshakes_tls12 - before.handshakes_tls12, 2);

  /* versions below 1.2 are never offered */
  cfg = client_cfg("ca_a.pem", NULL, NULL);
  cr_assert_eq(nng_tls_config_version(cfg, NNG_TLS_1_0, NNG_TLS_1_1), NNG_ENOTSUP);
  nng_tls_config_free(cfg);
}

Test(tls, plain_tcp_client_against_tls_listener_fails_cleanly)
{
  tls_server(NULL, false);
  char url[80];
  snprintf(url, sizeof url, "tcp://127.0.0.1:%d", srv.port);
  for (int i = 0; i < 3; i++) {
    nng_socket c;
    int rv = dial(&c, url, NULL);
    cr_assert_neq(rv, 0, "a plain tcp client got through a TLS listener");
  }
  good_client_works();
}

Test(tls, tls_client_against_plain_listener_fails_cleanly)
{
  server_start(&srv, "tcp", NULL);
  char url[80];
  snprintf(url, sizeof url, "tls+tcp://127.0.0.1:%d", srv.port);
  nng_socket c;
  int rv = dial(&c, url, client_cfg("ca_a.pem", NULL, NULL));
  cr_assert_neq(rv, 0, "a TLS client got through a plain listener");
  rv = dial(&c, srv.url, NULL);
  cr_assert_eq(rv, 0, "plain client after the TLS one: %s", nng_strerror(rv));
  echo_ok(c, 1000);
  nng_msg *r = call(c, "whoami", 6);
  cr_assert_not_null(strstr(nng_msg_body(r), "not a TLS connection"), "%s",
                     (char *)nng_msg_body(r));
  nng_msg_free(r);
  nng_close(c);
}

Test(tls, abandoned_handshakes_do_not_stop_the_listener)
{
  /* the start of a ClientHello: a record header announcing 512 bytes, then
   * a handshake header and a few of them */
  static const unsigned char partial_hello[] = {0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00,
                                                0x01, 0xfc, 0x03, 0x03, 0x11, 0x22, 0x33};
  static const unsigned char garbage[] = "GET / HTTP/1.0\r\n\r\n";
  transport_tls_stats before = stats();
  tls_server("ca_a.pem", false);

  int silent = raw_connect(srv.port); /* says nothing and stays: nng drops it after 10 s */
  for (int i = 0; i < 10; i++) {
    int fd = raw_connect(srv.port); /* connects and leaves */
    close(fd);
    fd = raw_connect(srv.port);
    cr_assert_eq(send(fd, partial_hello, sizeof partial_hello, MSG_NOSIGNAL),
                 (ssize_t)sizeof partial_hello);
    close(fd);
    fd = raw_connect(srv.port);
    cr_assert_eq(send(fd, garbage, sizeof garbage - 1, MSG_NOSIGNAL), (ssize_t)sizeof garbage - 1);
    char sink[256];
    (void)!recv(fd, sink, sizeof sink, 0); /* the server's alert, or its close */
    close(fd);
    fd = raw_connect(srv.port); /* a reset in the middle of a ClientHello */
    cr_assert_eq(send(fd, partial_hello, 5, MSG_NOSIGNAL), 5);
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
  }

  /* the server has failed the ten garbage handshakes (the others end in
   * nng's TCP layer, beneath the engine) */
  transport_tls_stats after = stats();
  WAIT_STATS(after, after.failures - before.failures >= 10);
  cr_assert_geq(after.failures - before.failures, 10, "%s", after.last_server_failure);

  double t0 = now_s();
  nng_socket c;
  int rv = dial(&c, srv.url, client_cfg("ca_a.pem", "alice", NULL));
  cr_assert_eq(rv, 0, "a good client after abandoned handshakes: %s", nng_strerror(rv));
  echo_ok(c, 100000);
  nng_close(c);
  /* a listener that stopped would make the dial hang or fail; one that
   * paused 100 ms per failure would take seconds (generous under valgrind) */
  cr_assert_lt(now_s() - t0, 8.0);
  close(silent);
}

Test(tls, pipe_peer_needs_a_live_tls_pipe)
{
  transport_tls_peer p;
  tport_err e = {0};
  nng_pipe none = NNG_PIPE_INITIALIZER;
  cr_assert_eq(transport_tls_pipe_peer(none, &p, &e), TPORT_NOT_FOUND, "%s", e.msg);
  cr_assert_eq(transport_tls_pipe_peer(none, NULL, &e), TPORT_INVALID_ARGUMENT);
}

Test(tls, config_errors_name_the_field)
{
  nng_tls_config *cfg = NULL;
  tport_err e = {0};
  transport_tls_server_opts so = {0};
  cr_assert_eq(transport_tls_server_config(&so, &cfg, &e), TPORT_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(e.msg, "cert_file"), "%s", e.msg);

  so.cert_file = path_of("missing.pem");
  cr_assert_eq(transport_tls_server_config(&so, &cfg, &e), TPORT_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(e.msg, "cert_file"), "%s", e.msg);
  cr_assert_not_null(strstr(e.msg, "No such file"), "%s", e.msg);

  so.cert_file = path_of("not_pem.pem");
  so.key_file = path_of("server.key");
  cr_assert_eq(transport_tls_server_config(&so, &cfg, &e), TPORT_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(e.msg, "no PEM certificate"), "%s", e.msg);

  so.cert_file = path_of("server.pem");
  so.key_file = path_of("alice.key");
  cr_assert_eq(transport_tls_server_config(&so, &cfg, &e), TPORT_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(e.msg, "does not match"), "%s", e.msg);

  so.key_file = path_of("server.key");
  so.client_ca_file = path_of("not_pem.pem");
  cr_assert_eq(transport_tls_server_config(&so, &cfg, &e), TPORT_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(e.msg, "client_ca_file"), "%s", e.msg);

  transport_tls_client_opts co = {.cert_file = path_of("alice.pem"),
                                  .key_file = path_of("alice.enc.key")};
  cr_assert_eq(transport_tls_client_config(&co, "tls+tcp://127.0.0.1:1", &cfg, &e),
               TPORT_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(e.msg, "encrypted"), "%s", e.msg);
  co.key_password = "wrong";
  cr_assert_eq(transport_tls_client_config(&co, "tls+tcp://127.0.0.1:1", &cfg, &e),
               TPORT_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(e.msg, "wrong password"), "%s", e.msg);

  transport_tls_client_opts only_key = {.key_file = path_of("alice.key")};
  cr_assert_eq(transport_tls_client_config(&only_key, "tls+tcp://127.0.0.1:1", &cfg, &e),
               TPORT_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(e.msg, "key_file"), "%s", e.msg);

  transport_tls_client_opts plain = {0};
  cr_assert_eq(transport_tls_client_config(&plain, NULL, &cfg, &e), TPORT_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(e.msg, "server_name"), "%s", e.msg);
  cr_assert_eq(transport_tls_client_config(&plain, "not a url", &cfg, &e), TPORT_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(e.msg, "url"), "%s", e.msg);
  cr_assert_null(cfg, "no config is returned on failure");

  /* the same server certificate with its key inside one file works */
  so = (transport_tls_server_opts){.cert_file = path_of("server_combined.pem")};
  cr_assert_eq(transport_tls_server_config(&so, &cfg, &e), 0, "%s", e.msg);
  nng_tls_config_free(cfg);
}
