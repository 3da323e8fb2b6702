/* test_exposed.c: tportd exposed as it would be on a network: tls+tcp://
 * (the OpenSSL engine, TLS 1.3) with tenants proved by a secret or by a
 * client certificate.  The certificates are made at test time with the
 * openssl tool: a CA, the server's (for 127.0.0.1), alice's, and a rogue
 * CA with its own "alice". */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/tls/tls.h>
#include <unistd.h>

#include "service_util.h"
#include "hello_mac.h"
#include "tls_openssl.h"

#define ALICE "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

static char dir[64];

static void sh(const char *fmt, ...)
{
  char cmd[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  char full[2200];
  snprintf(full, sizeof full, "cd %s && (%s) >/dev/null 2>&1", dir, cmd);
  cr_assert_eq(system(full), 0, "%s", cmd);
}

static const char *at(const char *name)
{
  static char paths[8][128];
  static int k;
  char *p = paths[k++ % 8];
  snprintf(p, 128, "%s/%s", dir, name);
  return p;
}

/* A CA and a certificate it signs (CN, and an IP SAN for servers). */
static void make_pki(void)
{
  snprintf(dir, sizeof dir, "/tmp/tport-pki-XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
  const char *ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  for (int i = 0; i < 2; i++)
    sh("openssl req -x509 %s -keyout %s.key -out %s.pem -days 2 -subj /CN=%s", ec,
       i ? "rogue" : "ca", i ? "rogue" : "ca", i ? "rogue-ca" : "test-ca");
  struct {
    const char *name, *ca, *cn, *ext;
  } certs[] = {
      {"server", "ca", "tportd", "subjectAltName=IP:127.0.0.1"},
      {"alice", "ca", "alice", "extendedKeyUsage=clientAuth"},
      {"fake", "rogue", "alice", "extendedKeyUsage=clientAuth"},
  };
  for (size_t i = 0; i < sizeof certs / sizeof *certs; i++) {
    sh("openssl req %s -keyout %s.key -out %s.csr -subj /CN=%s", ec, certs[i].name,
       certs[i].name, certs[i].cn);
    sh("printf '%s\\n' > %s.ext && openssl x509 -req -in %s.csr -CA %s.pem -CAkey %s.key "
       "-CAcreateserial -days 2 -extfile %s.ext -out %s.pem",
       certs[i].ext, certs[i].name, certs[i].name, certs[i].ca, certs[i].ca, certs[i].name,
       certs[i].name);
  }
  FILE *f = fopen(at("auth"), "w");
  cr_assert_not_null(f);
  fprintf(f, "alice %s\n", ALICE);
  fclose(f);
  chmod(at("auth"), 0600);
}

/* tportd on tls+tcp://127.0.0.1 with extra flags. */
static pid_t start(char *url, size_t len, const char *const *extra)
{
  const char *args[16] = {"--tls-cert", at("server.pem"), "--tls-key", at("server.key")};
  int n = 4;
  for (int i = 0; extra[i]; i++)
    args[n++] = extra[i];
  args[n] = NULL;
  pid_t pid = -1;
  for (int i = 0; i < 10 && pid < 0; i++) {
    char tcp[128];
    svc_tcp_url(tcp, sizeof tcp);
    snprintf(url, len, "tls+%s", tcp);
    pid = svc_spawn_tls(url, args, at("ca.pem"));
  }
  cr_assert_gt(pid, 0, "tportd did not start on TLS");
  return pid;
}

static int try_connect(const char *url, tport_connect_options o, tport_client **c, tport_err *err)
{
  o.timeout_ms = 10000;
  *c = NULL;
  return tport_connect(url, &o, c, err);
}

static void served(tport_client *c)
{
  uint8_t v[3000], back[3000];
  for (size_t i = 0; i < sizeof v; i++)
    v[i] = (uint8_t)(i * 13);
  int64_t n = sizeof v;
  tport_tensor_info t;
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &n, NULL, v, sizeof v, NULL, &t, &err), 0, "%s",
               err.msg);
  cr_assert_eq(tport_get(c, &t.ref, back, sizeof back, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(memcmp(v, back, sizeof v), 0);
}

Test(exposed, tls_with_a_secret)
{
  make_pki();
  char url[160];
  const char *extra[] = {"--auth-file", at("auth"), NULL};
  pid_t pid = start(url, sizeof url, extra);
  tport_client *c;
  tport_err err;
  transport_tls_stats before, after;
  transport_tls_stats_get(&before);
  cr_assert_eq(try_connect(url, (tport_connect_options){.tenant = "alice", .secret = ALICE,
                                                        .tls_ca = at("ca.pem")},
                           &c, &err),
               0, "%s", err.msg);
  served(c);
  transport_tls_stats_get(&after);
  cr_assert_gt(after.handshakes_tls13, before.handshakes_tls13, "TLS 1.3 was negotiated");
  /* a server this client does not trust, or under another name: no connection */
  tport_client *x;
  cr_assert_eq(try_connect(url, (tport_connect_options){.tenant = "alice", .secret = ALICE,
                                                        .tls_ca = at("rogue.pem")},
                           &x, &err),
               TPORT_UNAVAILABLE, "an untrusted server certificate");
  cr_assert_eq(try_connect(url, (tport_connect_options){.tenant = "alice", .secret = ALICE,
                                                        .tls_ca = at("ca.pem"),
                                                        .tls_server_name = "tportd.example"},
                           &x, &err),
               TPORT_UNAVAILABLE, "the wrong server name");
  /* plain tcp against the TLS listener: a clean failure */
  char plain[160];
  snprintf(plain, sizeof plain, "%s", url + strlen("tls+"));
  cr_assert_neq(try_connect(plain, (tport_connect_options){.tenant = "alice", .secret = ALICE},
                            &x, &err),
                0, "plain tcp to a TLS listener");
  served(c); /* the server is unharmed */
  /* the scheme in capitals is the same scheme (nng lowers it): the client's
   * CA goes with it (it was dropped, and the handshake failed against the
   * system's CAs) */
  char upper[160];
  snprintf(upper, sizeof upper, "TLS+TCP%s", url + strlen("tls+tcp"));
  tport_client *u;
  cr_assert_eq(try_connect(upper, (tport_connect_options){.tenant = "alice", .secret = ALICE,
                                                          .tls_ca = at("ca.pem")},
                           &u, &err),
               0, "%s: %s", upper, err.msg);
  served(u);
  tport_close(u);
  tport_close(c);
  cr_assert_eq(svc_terminate(pid), 0);
}

Test(exposed, client_certificates_name_the_tenant)
{
  make_pki();
  char url[160];
  const char *extra[] = {"--tls-ca", at("ca.pem"), "--auth-file", at("auth"), NULL};
  pid_t pid = start(url, sizeof url, extra);
  tport_client *c, *x;
  tport_err err;
  tport_connect_options alice = {
      .tls_ca = at("ca.pem"), .tls_cert = at("alice.pem"), .tls_key = at("alice.key")};
  cr_assert_eq(try_connect(url, alice, &c, &err), 0, "%s", err.msg);
  served(c);
  /* the certificate made it alice: her secret-proved connection sees the same tensors */
  uint8_t v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  int64_t n = 8;
  tport_put_options po;
  tport_put_options_init(&po);
  po.name = "by-cert";
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &n, NULL, v, sizeof v, &po, NULL, &err), 0, "%s",
               err.msg);
  cr_assert_eq(try_connect(url, (tport_connect_options){.tenant = "alice", .secret = ALICE,
                                                        .tls_ca = at("ca.pem"),
                                                        .tls_cert = at("alice.pem"),
                                                        .tls_key = at("alice.key")},
                           &x, &err),
               0, "a certificate and a secret that agree: %s", err.msg);
  tport_ref r;
  tport_ref_name(&r, "by-cert");
  tport_tensor_info info;
  cr_assert_eq(tport_info(x, &r, &info, &err), 0, "%s", err.msg);
  tport_close(x);
  /* a Hello that names another tenant than the certificate */
  tport_connect_options bob = alice;
  bob.tenant = "bob";
  cr_assert_eq(try_connect(url, bob, &x, &err), TPORT_PERMISSION_DENIED, "%s", err.msg);
  /* no certificate, or one from another CA: no connection */
  cr_assert_eq(try_connect(url, (tport_connect_options){.tls_ca = at("ca.pem")}, &x, &err),
               TPORT_UNAVAILABLE, "no client certificate");
  cr_assert_eq(try_connect(url, (tport_connect_options){.tls_ca = at("ca.pem"),
                                                        .tls_cert = at("fake.pem"),
                                                        .tls_key = at("fake.key")},
                           &x, &err),
               TPORT_UNAVAILABLE, "a certificate of another CA");
  served(c);
  tport_close(c);
  cr_assert_eq(svc_terminate(pid), 0);
}

/* ---------------------------------------------------------------- bound answers */

/* A raw REQ socket over TLS that trusts the test CA. */
static nng_socket raw_tls_dial(const char *url)
{
  nng_socket s;
  nng_dialer d;
  nng_tls_config *cfg = NULL;
  tport_err e;
  transport_tls_client_opts o = {.ca_file = at("ca.pem")};
  cr_assert_eq(transport_tls_client_config(&o, url, &cfg, &e), 0, "%s", e.msg);
  cr_assert_eq(nng_req0_open(&s), 0);
  nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
  nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 10000);
  cr_assert_eq(nng_dialer_create(&d, s, url), 0);
  cr_assert_eq(nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, cfg), 0);
  nng_tls_config_free(cfg);
  cr_assert_eq(nng_dialer_start(d, 0), 0);
  return s;
}

/* A Hello for alice with an answer or none: the reply's code; the challenge
 * it carries and the pipe it came on. */
static int raw_hello(nng_socket s, const uint8_t *answer, uint8_t challenge[HELLO_CHALLENGE_BYTES],
                     nng_pipe *pipe)
{
  Tport__HelloRequest q = TPORT__HELLO_REQUEST__INIT;
  q.protocol_version = 1;
  q.tenant = "alice";
  if (answer) {
    q.auth_response.data = (uint8_t *)answer;
    q.auth_response.len = HELLO_MAC_BYTES;
  }
  nng_msg *m;
  cr_assert_eq(nng_msg_alloc(&m, frame_head_size(&q.base)), 0);
  frame_write_head(nng_msg_body(m), TPORT__METHOD__METHOD_HELLO, 0, &q.base);
  cr_assert_eq(nng_sendmsg(s, m, 0), 0);
  cr_assert_eq(nng_recvmsg(s, &m, 0), 0, "the server must answer");
  if (pipe)
    *pipe = nng_msg_get_pipe(m);
  char msg[256];
  ProtobufCMessage *r = NULL;
  int code = svc_reply_status(m, &tport__hello_reply__descriptor, msg, &r);
  Tport__HelloReply *h = (Tport__HelloReply *)r;
  if (challenge) {
    cr_assert(h && h->auth_challenge.len == HELLO_CHALLENGE_BYTES, "a challenge: %s", msg);
    memcpy(challenge, h->auth_challenge.data, HELLO_CHALLENGE_BYTES);
  }
  if (r)
    protobuf_c_message_free_unpacked(r, NULL);
  nng_msg_free(m);
  return code;
}

static void alice_answer(const uint8_t *challenge, const uint8_t *binding,
                         uint8_t out[HELLO_MAC_BYTES])
{
  uint8_t secret[HELLO_SECRET_MAX_BYTES];
  size_t len;
  tport_err err;
  cr_assert_eq(transport_hello_secret_parse(ALICE, secret, &len, &err), 0, "%s", err.msg);
  cr_assert_eq(transport_hello_mac(secret, len, challenge, "alice", binding, out, &err), 0);
}

/* A relay between alice and the server (a server alice trusts under another
 * name, say) passes the server's challenge on and alice's answer back: the
 * answer is bound to alice's TLS connection, not the relay's, and refused. */
Test(exposed, answers_are_bound_to_their_tls_connection)
{
  make_pki();
  char url[160];
  const char *extra[] = {"--auth-file", at("auth"), NULL};
  pid_t pid = start(url, sizeof url, extra);
  nng_socket relay = raw_tls_dial(url), alice = raw_tls_dial(url);
  uint8_t c_relay[HELLO_CHALLENGE_BYTES], c_alice[HELLO_CHALLENGE_BYTES];
  uint8_t b_relay[HELLO_BINDING_BYTES], b_alice[HELLO_BINDING_BYTES], mac[HELLO_MAC_BYTES];
  nng_pipe p_relay, p_alice;
  bool bound = false;
  tport_err err;
  cr_assert_eq(raw_hello(relay, NULL, c_relay, &p_relay), TPORT_UNAUTHENTICATED);
  cr_assert_eq(raw_hello(alice, NULL, c_alice, &p_alice), TPORT_UNAUTHENTICATED);
  cr_assert_eq(transport_tls_pipe_binding(p_relay, b_relay, &bound, &err), 0, "%s", err.msg);
  cr_assert(bound);
  cr_assert_eq(transport_tls_pipe_binding(p_alice, b_alice, &bound, &err), 0, "%s", err.msg);
  cr_assert(bound);
  cr_assert_neq(memcmp(b_relay, b_alice, sizeof b_relay), 0, "each connection has its own");

  /* the relay's challenge, answered by alice on her own connection */
  alice_answer(c_relay, b_alice, mac);
  cr_assert_eq(raw_hello(relay, mac, NULL, NULL), TPORT_UNAUTHENTICATED, "a relayed answer");
  /* an answer with no binding at all, as over plain tcp */
  cr_assert_eq(raw_hello(relay, NULL, c_relay, NULL), TPORT_UNAUTHENTICATED);
  alice_answer(c_relay, NULL, mac);
  cr_assert_eq(raw_hello(relay, mac, NULL, NULL), TPORT_UNAUTHENTICATED, "an unbound answer");
  /* bound to the connection it travels on: accepted, on both */
  cr_assert_eq(raw_hello(relay, NULL, c_relay, NULL), TPORT_UNAUTHENTICATED);
  alice_answer(c_relay, b_relay, mac);
  cr_assert_eq(raw_hello(relay, mac, NULL, NULL), TPORT_OK, "a bound answer");
  alice_answer(c_alice, b_alice, mac);
  cr_assert_eq(raw_hello(alice, mac, NULL, NULL), TPORT_OK, "a bound answer");
  nng_close(relay);
  nng_close(alice);
  cr_assert_eq(svc_terminate(pid), 0);
}
