/*
 * tls_engine_config.c: the OpenSSL engine's configurations -- one SSL_CTX
 * each, TLS 1.3 only, AEAD suites, no resumption -- with their CA chain,
 * own certificate and key, the peer's name to check and the auth mode.
 * nng can only hear an nng code from a config op, so each failure also
 * leaves its reason for tls_config.c (tls_config_why, per thread).
 */
#include "tls_engine.h"
#include "tls_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

/* AEAD suites only; AES-128-GCM first (AES-NI makes it the fastest), and
 * SSL_OP_PRIORITIZE_CHACHA picks ChaCha20 for a client that asks for it first
 * (one without AES hardware). */
#define TLS13_SUITES "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"
#define TLS12_SUITES                                                                               \
  "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"       \
  "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305"
#define TLS_GROUPS "X25519:P-256:P-384"

/* ---------------------------------------------------------------- errors */

/* Why the latest config op failed on this thread: config ops can only return
 * an nng code, and tls_config.c calls them synchronously, so it reads the
 * reason from here to put it in its message. */
static _Thread_local char cfg_why[TPORT_ERR_MSG_MAX];

const char *tls_config_why(int rv)
{
  return cfg_why[0] ? cfg_why : nng_strerror(rv);
}

void tls_config_why_clear(void)
{
  cfg_why[0] = '\0';
}

static int cfg_fail(int rv, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int cfg_fail(int rv, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cfg_why, sizeof cfg_why, fmt, ap);
  va_end(ap);
  ERR_clear_error();
  return rv;
}


/* ---------------------------------------------------------------- config */


/* nng 1.5.2 declares a configuration busy once used but never marks it so;
 * replacing a CA store or key under a running handshake would free what it
 * reads.  So the engine freezes a configuration at its first connection. */
static int cfg_frozen(nng_tls_engine_config *cfg, const char *what)
{
  if (!atomic_load(&cfg->in_use))
    return 0;
  return cfg_fail(NNG_EBUSY, "%s: the configuration is in use by a connection; make a new one",
                  what);
}

/* Never lets OpenSSL prompt on a terminal: no password means "cannot decrypt". */
static int pass_cb(char *buf, int size, int rwflag, void *u)
{
  (void)rwflag;
  if (u == NULL || size <= 0)
    return 0;
  size_t n = strlen(u);
  if (n > (size_t)size)
    return 0;
  memcpy(buf, u, n);
  return (int)n;
}

static int cfg_init(nng_tls_engine_config *cfg, nng_tls_mode mode)
{
  char why[128];
  ERR_clear_error();
  SSL_CTX *ctx =
      SSL_CTX_new(mode == NNG_TLS_MODE_SERVER ? TLS_server_method() : TLS_client_method());
  if (ctx == NULL)
    return cfg_fail(NNG_ENOMEM, "SSL_CTX_new: %s", ossl_reason(why, sizeof why));
  if (!SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) ||
      !SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION) ||
      !SSL_CTX_set_ciphersuites(ctx, TLS13_SUITES) || !SSL_CTX_set_cipher_list(ctx, TLS12_SUITES) ||
      !SSL_CTX_set1_groups_list(ctx, TLS_GROUPS)) {
    ossl_reason(why, sizeof why);
    SSL_CTX_free(ctx);
    return cfg_fail(NNG_ENOTSUP, "TLS defaults: %s", why);
  }
  /* no renegotiation (TLS 1.2), no compression, no resumption: each
   * connection is one full, verified handshake and nothing is cached */
  SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION | SSL_OP_NO_TICKET |
                               SSL_OP_CIPHER_SERVER_PREFERENCE | SSL_OP_PRIORITIZE_CHACHA);
  SSL_CTX_set_num_tickets(ctx, 0);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  /* partial writes: conn_send returns what went out instead of holding a
   * whole multi-MiB buffer; moving buffer: nng retries from the same bytes
   * but does not promise the same pointer */
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_verify_depth(ctx, 8);
  SSL_CTX_set_default_passwd_cb(ctx, pass_cb);
  if (mode == NNG_TLS_MODE_CLIENT) {
    /* the system store until ca_chain replaces it: a client trusts either the
     * CAs it was given or the system's, never both */
    SSL_CTX_set_default_verify_paths(ctx);
  }
  ERR_clear_error();
  cfg->ctx = ctx;
  cfg->mode = mode;
  /* nng's defaults: a client verifies its server, a server asks nothing */
  cfg->auth = mode == NNG_TLS_MODE_SERVER ? NNG_TLS_AUTH_MODE_NONE : NNG_TLS_AUTH_MODE_REQUIRED;
  return 0;
}

static void cfg_fini(nng_tls_engine_config *cfg)
{
  SSL_CTX_free(cfg->ctx);
  free(cfg->server_name);
}

static int cfg_server(nng_tls_engine_config *cfg, const char *name)
{
  char *copy = NULL;
  if (cfg_frozen(cfg, "server name"))
    return NNG_EBUSY;
  if (name != NULL && name[0] != '\0' && (copy = strdup(name)) == NULL)
    return cfg_fail(NNG_ENOMEM, "server name: out of memory");
  free(cfg->server_name);
  cfg->server_name = copy;
  return 0;
}

static int cfg_auth(nng_tls_engine_config *cfg, nng_tls_auth_mode mode)
{
  if (cfg_frozen(cfg, "auth mode"))
    return NNG_EBUSY;
  if (mode != NNG_TLS_AUTH_MODE_NONE && mode != NNG_TLS_AUTH_MODE_OPTIONAL &&
      mode != NNG_TLS_AUTH_MODE_REQUIRED)
    return cfg_fail(NNG_EINVAL, "auth mode %d: not none (0), optional (1) or required (2)", mode);
  cfg->auth = mode;
  return 0;
}

/* Adds every certificate (or every CRL) of a PEM text to st; returns how many. */
static int store_add_pem(X509_STORE *st, const char *pem, bool crls)
{
  BIO *b = BIO_new_mem_buf(pem, -1);
  if (b == NULL)
    return -1;
  STACK_OF(X509_INFO) *infos = PEM_X509_INFO_read_bio(b, NULL, pass_cb, NULL);
  BIO_free(b);
  if (infos == NULL)
    return -1;
  int n = 0;
  for (int i = 0; i < sk_X509_INFO_num(infos); i++) {
    X509_INFO *info = sk_X509_INFO_value(infos, i);
    if (!crls && info->x509 != NULL)
      n += X509_STORE_add_cert(st, info->x509) == 1;
    if (crls && info->crl != NULL)
      n += X509_STORE_add_crl(st, info->crl) == 1;
  }
  sk_X509_INFO_pop_free(infos, X509_INFO_free);
  return n;
}

static int cfg_ca_chain(nng_tls_engine_config *cfg, const char *certs, const char *crl)
{
  char why[128];
  if (cfg_frozen(cfg, "CA certificates"))
    return NNG_EBUSY;
  ERR_clear_error();
  X509_STORE *st = X509_STORE_new();
  if (st == NULL)
    return cfg_fail(NNG_ENOMEM, "CA store: out of memory");
  int n = certs ? store_add_pem(st, certs, false) : 0;
  if (n <= 0) {
    ossl_reason(why, sizeof why);
    X509_STORE_free(st);
    return cfg_fail(NNG_EINVAL, "CA certificates: %s",
                    n < 0 ? why : "no PEM certificate (-----BEGIN CERTIFICATE-----) found");
  }
  if (crl != NULL) {
    if ((n = store_add_pem(st, crl, true)) <= 0) {
      X509_STORE_free(st);
      return cfg_fail(NNG_EINVAL, "CRL: no PEM CRL (-----BEGIN X509 CRL-----) found");
    }
    X509_STORE_set_flags(st, X509_V_FLAG_CRL_CHECK | X509_V_FLAG_CRL_CHECK_ALL);
  }
  SSL_CTX_set_cert_store(cfg->ctx, st); /* frees the store it replaces */
  ERR_clear_error();
  return 0;
}

static int cfg_own_cert(nng_tls_engine_config *cfg, const char *cert, const char *key,
                        const char *pass)
{
  char why[128];
  int rv = 0;
  X509 *x = NULL;
  EVP_PKEY *k = NULL;
  STACK_OF(X509) *chain = NULL;
  BIO *cb = NULL, *kb = NULL;

  if (cfg_frozen(cfg, "certificate"))
    return NNG_EBUSY;
  ERR_clear_error();
  if (cert == NULL || key == NULL)
    return cfg_fail(NNG_EINVAL, "certificate and key: both are required");
  if ((cb = BIO_new_mem_buf(cert, -1)) == NULL || (kb = BIO_new_mem_buf(key, -1)) == NULL ||
      (chain = sk_X509_new_null()) == NULL) {
    rv = cfg_fail(NNG_ENOMEM, "certificate: out of memory");
    goto out;
  }
  if ((x = PEM_read_bio_X509(cb, NULL, pass_cb, NULL)) == NULL) {
    rv =
        cfg_fail(NNG_EINVAL, "certificate: no PEM certificate (-----BEGIN CERTIFICATE-----) found");
    goto out;
  }
  for (X509 *c; (c = PEM_read_bio_X509(cb, NULL, pass_cb, NULL)) != NULL;) {
    if (!sk_X509_push(chain, c)) {
      X509_free(c);
      rv = cfg_fail(NNG_ENOMEM, "certificate chain: out of memory");
      goto out;
    }
  }
  ERR_clear_error(); /* the end of the chain reads as "no start line" */
  if ((k = PEM_read_bio_PrivateKey(kb, NULL, pass_cb, (void *)pass)) == NULL) {
    rv = cfg_fail(NNG_EINVAL, "private key: %s",
                  pass ? "cannot read it (wrong password, or no PEM key)"
                       : "no PEM private key found, or it is encrypted and no password was given");
    goto out;
  }
  if (X509_check_private_key(x, k) != 1) {
    rv = cfg_fail(NNG_EINVAL, "private key: does not match the certificate");
    goto out;
  }
  if (SSL_CTX_use_certificate(cfg->ctx, x) != 1 || SSL_CTX_use_PrivateKey(cfg->ctx, k) != 1 ||
      SSL_CTX_set1_chain(cfg->ctx, chain) != 1) {
    rv = cfg_fail(NNG_EINVAL, "certificate: refused: %s", ossl_reason(why, sizeof why));
    goto out;
  }
out:
  sk_X509_pop_free(chain, X509_free);
  X509_free(x);
  EVP_PKEY_free(k);
  BIO_free(cb);
  BIO_free(kb);
  ERR_clear_error();
  return rv;
}

static int cfg_version(nng_tls_engine_config *cfg, nng_tls_version lo, nng_tls_version hi)
{
  if (cfg_frozen(cfg, "version"))
    return NNG_EBUSY;
  if (hi < lo)
    return cfg_fail(NNG_EINVAL, "version: maximum %#x is below minimum %#x", (unsigned)hi,
                    (unsigned)lo);
  /* TLS 1.0 and 1.1 are never offered: the range shrinks to what is left */
  if (lo < NNG_TLS_1_2)
    lo = NNG_TLS_1_2;
  if (hi > NNG_TLS_1_3)
    hi = NNG_TLS_1_3;
  if (hi < lo)
    return cfg_fail(NNG_ENOTSUP, "version: only TLS 1.2 and 1.3 are offered");
  /* nng's version numbers are the wire's, as are OpenSSL's */
  if (!SSL_CTX_set_min_proto_version(cfg->ctx, (int)lo) ||
      !SSL_CTX_set_max_proto_version(cfg->ctx, (int)hi))
    return cfg_fail(NNG_ENOTSUP, "version: OpenSSL refused %#x..%#x", (unsigned)lo, (unsigned)hi);
  return 0;
}

nng_tls_engine_config_ops tls_engine_config_ops = {
    .size = sizeof(struct nng_tls_engine_config),
    .init = cfg_init,
    .fini = cfg_fini,
    .server = cfg_server,
    .auth = cfg_auth,
    .ca_chain = cfg_ca_chain,
    .own_cert = cfg_own_cert,
    .version = cfg_version,
};
