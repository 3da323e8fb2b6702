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
#include <unistd.h>

#include "service_util.h"
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
