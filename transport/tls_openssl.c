/*
 * tls_openssl.c: nng's TLS engine on OpenSSL 3 (tls_openssl.h): its
 * connections, counters and registration; tls_engine_config.c holds its
 * configurations (the SSL_CTX each connection is made from), which
 * tls_config.c builds from PEM files.
 *
 * How nng drives an engine (nng 1.5.2, src/supplemental/tls/tls_common.c):
 * it owns the TCP stream and a 64 KiB ring buffer each way (deploy/nng/build-nng.sh sets the size); it calls the
 * conn ops below with the connection's lock held, from the user's send/recv
 * and from its TCP completion callbacks; the engine moves ciphertext with
 * nng_tls_engine_send/recv, which copy into/out of those buffers and answer
 * NNG_EAGAIN when the buffer is full/empty, having started the TCP transfer
 * whose completion calls the engine again.  So OpenSSL sits on a custom,
 * non-blocking BIO whose read and write are exactly those two calls: one
 * copy less than a pair of memory BIOs, and an op may only answer NNG_EAGAIN
 * after the BIO has seen NNG_EAGAIN (otherwise nobody would call again).
 *
 * Error codes matter beyond the connection: a failed handshake on a
 * listener's connection finishes nng's accept with our code, and nng's
 * listener stops accepting on NNG_ECLOSED and pauses 100 ms on codes it does
 * not know.  A server connection therefore fails with NNG_EPEERAUTH (a
 * certificate refused) or NNG_ECONNABORTED (anything else the peer did),
 * both "remote condition, accept again at once", and never with NNG_ECLOSED.
 *
 * What nng 1.5.2's engine interface cannot do, and what is done instead:
 * - it has no operation for the peer's certificate: transport_tls_pipe_peer
 *   asks nng for a pipe's NNG_OPT_TLS_VERIFIED, which nng answers on the
 *   caller's thread through conn_verified, and conn_verified fills the
 *   caller's request left in a thread-local (peer_capture);
 * - a close_notify is best effort: nng closes the TCP stream right after
 *   conn_close, and it may already have torn it down (closing a pipe aborts
 *   the pending TCP read first, whose callback closes the stream) or still
 *   hold an earlier send; the record then never leaves;
 * - nng never marks a configuration busy: the engine freezes one itself at
 *   its first connection (cfg_frozen).
 *
 * OpenSSL's error queue is per thread and nng's threads are shared: every
 * call into OpenSSL starts with an empty queue and leaves one.
 */
#include "tls_openssl.h"
#include "tls_engine.h"
#include "tls_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/supplemental/tls/engine.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

/* ---------------------------------------------------------------- errors */

int tls_err(tport_err *err, int code, const char *fmt, ...)
{
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    err->code = code;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
  }
  return code;
}

/* OpenSSL's reason for the last error of this thread, for a message. */
const char *ossl_reason(char *buf, size_t n)
{
  unsigned long e = ERR_peek_last_error();
  const char *r = e ? ERR_reason_error_string(e) : NULL;
  snprintf(buf, n, "%s", r ? r : (e ? "unknown OpenSSL error" : "no OpenSSL error recorded"));
  return buf;
}

/* ---------------------------------------------------------------- counters */

static struct {
  atomic_uint_fast64_t connections, tls13, tls12, failures, verify_failures, peer_refused,
      notify_sent, notify_received;
} counters;
static pthread_mutex_t failure_lock = PTHREAD_MUTEX_INITIALIZER;
static char last_server_failure[TPORT_ERR_MSG_MAX], last_client_failure[TPORT_ERR_MSG_MAX];

void transport_tls_stats_get(transport_tls_stats *out)
{
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&failure_lock);
  out->connections = atomic_load(&counters.connections);
  out->handshakes_tls13 = atomic_load(&counters.tls13);
  out->handshakes_tls12 = atomic_load(&counters.tls12);
  out->failures = atomic_load(&counters.failures);
  out->verify_failures = atomic_load(&counters.verify_failures);
  out->peer_refused = atomic_load(&counters.peer_refused);
  out->close_notify_sent = atomic_load(&counters.notify_sent);
  out->close_notify_received = atomic_load(&counters.notify_received);
  memcpy(out->last_server_failure, last_server_failure, sizeof last_server_failure);
  memcpy(out->last_client_failure, last_client_failure, sizeof last_client_failure);
  pthread_mutex_unlock(&failure_lock);
}

/* ---------------------------------------------------------------- BIO */

struct nng_tls_engine_conn {
  void *nng; /* the framework's handle for nng_tls_engine_send/recv */
  SSL *ssl;
  nng_tls_auth_mode auth;
  bool server;
  bool hs_done;
  bool peer_closed; /* the peer's close_notify arrived */
  bool closed;
  int io_error; /* the last failure of nng_tls_engine_send/recv (not EAGAIN) */
  int fatal;    /* sticky: once set, every op answers it */
};

static BIO_METHOD *bio_method;

static int bio_write(BIO *b, const char *buf, size_t len, size_t *written)
{
  struct nng_tls_engine_conn *c = BIO_get_data(b);
  size_t n = len;
  int rv;
  BIO_clear_retry_flags(b);
  if ((rv = nng_tls_engine_send(c->nng, (const uint8_t *)buf, &n)) == 0) {
    *written = n;
    return 1;
  }
  if (rv == NNG_EAGAIN)
    BIO_set_retry_write(b);
  else
    c->io_error = rv;
  return 0;
}

static int bio_read(BIO *b, char *buf, size_t len, size_t *got)
{
  struct nng_tls_engine_conn *c = BIO_get_data(b);
  size_t n = len;
  int rv;
  BIO_clear_retry_flags(b);
  if ((rv = nng_tls_engine_recv(c->nng, (uint8_t *)buf, &n)) == 0) {
    *got = n;
    return 1;
  }
  if (rv == NNG_EAGAIN)
    BIO_set_retry_read(b);
  else
    c->io_error = rv;
  return 0;
}

static long bio_ctrl(BIO *b, int cmd, long num, void *ptr)
{
  (void)b, (void)num, (void)ptr;
  /* nng sends what it was given at once: nothing to flush, nothing pending */
  return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

/* ---------------------------------------------------------------- connections */

static int verify_keep_going(int ok, X509_STORE_CTX *x)
{
  (void)ok, (void)x;
  return 1; /* optional mode: the result is kept (SSL_get_verify_result), not enforced */
}

static int conn_init(nng_tls_engine_conn *c, void *nng, nng_tls_engine_config *cfg)
{
  unsigned char ip[16];
  int rv = NNG_ENOMEM;
  ERR_clear_error();
  atomic_store(&cfg->in_use, true);
  c->nng = nng;
  c->server = cfg->mode == NNG_TLS_MODE_SERVER;
  c->auth = cfg->auth;
  BIO *b = NULL;
  if ((c->ssl = SSL_new(cfg->ctx)) == NULL || (b = BIO_new(bio_method)) == NULL)
    goto fail;
  BIO_set_data(b, c);
  BIO_set_init(b, 1);
  SSL_set_bio(c->ssl, b, b);

  int verify = SSL_VERIFY_NONE;
  if (c->auth != NNG_TLS_AUTH_MODE_NONE)
    verify = SSL_VERIFY_PEER;
  if (c->auth == NNG_TLS_AUTH_MODE_REQUIRED && c->server)
    verify |= SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
  SSL_set_verify(c->ssl, verify, c->auth == NNG_TLS_AUTH_MODE_OPTIONAL ? verify_keep_going : NULL);

  if (c->server) {
    SSL_set_accept_state(c->ssl);
  } else {
    SSL_set_connect_state(c->ssl);
    const char *name = cfg->server_name;
    if (name != NULL) {
      /* an address is checked against the certificate's IP entries and is
       * never sent as SNI (RFC 6066); a name against its DNS entries */
      bool is_ip = inet_pton(AF_INET, name, ip) == 1 || inet_pton(AF_INET6, name, ip) == 1;
      rv = NNG_EINVAL; /* a name OpenSSL cannot take; no connection will prove it */
      if (is_ip) {
        if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), name) != 1)
          goto fail;
      } else {
        /* the name must be among the subjectAltNames, as browsers require:
         * a CN is not a host name */
        SSL_set_hostflags(c->ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS |
                                      X509_CHECK_FLAG_NEVER_CHECK_SUBJECT);
        if (SSL_set1_host(c->ssl, name) != 1 || SSL_set_tlsext_host_name(c->ssl, name) != 1)
          goto fail;
      }
    }
  }
  atomic_fetch_add(&counters.connections, 1);
  return 0;
fail:
  SSL_free(c->ssl); /* and b: it is attached from the moment it exists */
  c->ssl = NULL;
  ERR_clear_error();
  return rv;
}

static void conn_fini(nng_tls_engine_conn *c)
{
  SSL_free(c->ssl);
  c->ssl = NULL;
}

static void conn_handshake_done(nng_tls_engine_conn *c)
{
  if (c->hs_done || !SSL_is_init_finished(c->ssl))
    return;
  c->hs_done = true;
  if (SSL_version(c->ssl) == TLS1_3_VERSION)
    atomic_fetch_add(&counters.tls13, 1);
  else
    atomic_fetch_add(&counters.tls12, 1);
}

/* The peer's alerts that mean "I refuse your certificate". */
static bool reason_is_refusal(int reason)
{
  switch (reason) {
  case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
  case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
  case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED:
  case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
  case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
  case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
  case SSL_R_TLSV1_ALERT_ACCESS_DENIED:
  case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED: return true;
  default: return false;
  }
}

/* Turns a failed SSL_* call (its return value ret) into an nng code: EAGAIN
 * when OpenSSL waits on the BIO, else a fatal, sticky error, counted and
 * described in last_server_failure or last_client_failure. */
static int conn_fail(nng_tls_engine_conn *c, int ret, const char *op)
{
  char why[160];
  int rv;
  int e = SSL_get_error(c->ssl, ret);

  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
    ERR_clear_error();
    return NNG_EAGAIN;
  }
  if (c->io_error != 0) {
    /* the TCP stream failed beneath us: not a TLS failure.  NNG_ECLOSED
     * from below would stop a listener (see the top of the file) */
    rv = c->io_error == NNG_ECLOSED ? NNG_ECONNSHUT : c->io_error;
    c->fatal = rv;
    ERR_clear_error();
    return rv;
  }
  if (e == SSL_ERROR_ZERO_RETURN) {
    atomic_fetch_add(&counters.notify_received, 1);
    c->peer_closed = true;
    c->fatal = NNG_ECONNSHUT;
    ERR_clear_error();
    return NNG_ECONNSHUT;
  }
  unsigned long err = ERR_peek_last_error();
  int reason = ERR_GET_REASON(err);
  atomic_uint_fast64_t *kind = NULL;
  if (reason == SSL_R_CERTIFICATE_VERIFY_FAILED ||
      reason == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE) {
    long vr = SSL_get_verify_result(c->ssl);
    kind = &counters.verify_failures;
    snprintf(why, sizeof why, "peer certificate refused: %s",
             reason == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE ? "the peer sent no certificate"
                                                               : X509_verify_cert_error_string(vr));
    rv = NNG_EPEERAUTH;
  } else if (reason_is_refusal(reason)) {
    kind = &counters.peer_refused;
    snprintf(why, sizeof why, "the peer refused our certificate: %s", ERR_reason_error_string(err));
    rv = NNG_EPEERAUTH;
  } else {
    if (e == SSL_ERROR_SSL)
      ossl_reason(why, sizeof why);
    else
      snprintf(why, sizeof why, "SSL error %d", e);
    rv = c->server ? NNG_ECONNABORTED : NNG_ECRYPTO;
  }
  /* the counts and the message change together: a reader that sees a count
   * move sees its message */
  pthread_mutex_lock(&failure_lock);
  snprintf(c->server ? last_server_failure : last_client_failure, TPORT_ERR_MSG_MAX, "%s %s: %s",
           c->server ? "server" : "client", c->hs_done ? op : "handshake", why);
  atomic_fetch_add(&counters.failures, 1);
  if (kind != NULL)
    atomic_fetch_add(kind, 1);
  pthread_mutex_unlock(&failure_lock);
  c->fatal = rv;
  ERR_clear_error();
  return rv;
}

static int conn_handshake(nng_tls_engine_conn *c)
{
  if (c->fatal)
    return c->fatal;
  if (c->hs_done)
    return 0;
  ERR_clear_error();
  int r = SSL_do_handshake(c->ssl);
  if (r == 1) {
    conn_handshake_done(c);
    return 0;
  }
  return conn_fail(c, r, "handshake");
}

/* Both directions take as much as OpenSSL gives without waiting, and answer
 * with what they moved when they moved something: nng completes the user's
 * operation as soon as we return data. */
static int conn_recv(nng_tls_engine_conn *c, uint8_t *buf, size_t *szp)
{
  size_t total = 0, n;
  if (c->fatal)
    return c->fatal;
  while (total < *szp) {
    ERR_clear_error();
    if (SSL_read_ex(c->ssl, buf + total, *szp - total, &n) == 1) {
      total += n;
      continue;
    }
    int rv = conn_fail(c, 0, "read");
    if (total == 0)
      return rv;
    break; /* a fatal error is sticky: the next call reports it */
  }
  conn_handshake_done(c);
  *szp = total;
  return 0;
}

static int conn_send(nng_tls_engine_conn *c, const uint8_t *buf, size_t *szp)
{
  size_t total = 0, n;
  if (c->fatal)
    return c->fatal;
  while (total < *szp) {
    ERR_clear_error();
    if (SSL_write_ex(c->ssl, buf + total, *szp - total, &n) == 1) {
      total += n;
      continue;
    }
    /* a record OpenSSL encrypted but could not hand to nng waits in its
     * buffer; nng's next call starts at buf + total, the same bytes */
    int rv = conn_fail(c, 0, "write");
    if (total == 0)
      return rv;
    break;
  }
  conn_handshake_done(c);
  *szp = total;
  return 0;
}

static void conn_close(nng_tls_engine_conn *c)
{
  if (c->closed)
    return;
  c->closed = true;
  /* a close_notify only on a connection that worked (OpenSSL forbids it
   * after a fatal error); nng closes the TCP stream right after this, so it
   * is sent only if nng's buffer takes it now */
  if (c->hs_done && (c->fatal == 0 || c->peer_closed)) {
    ERR_clear_error();
    if (SSL_shutdown(c->ssl) >= 0)
      atomic_fetch_add(&counters.notify_sent, 1);
    ERR_clear_error();
  }
}

/* Where transport_tls_pipe_peer waits for conn_verified to describe the
 * connection: set only around its nng_pipe_get_bool call, on its thread. */
static _Thread_local transport_tls_peer *peer_capture;

/* The subject CN of x, only when there is exactly one, it converts to UTF-8
 * without a NUL and fits: a truncated or ambiguous name must never become
 * someone's identity. */
static void subject_cn(X509 *x, char *out, size_t n)
{
  X509_NAME *name = X509_get_subject_name(x);
  int i = X509_NAME_get_index_by_NID(name, NID_commonName, -1);
  if (i < 0 || X509_NAME_get_index_by_NID(name, NID_commonName, i) >= 0)
    return;
  unsigned char *u = NULL;
  int len = ASN1_STRING_to_UTF8(&u, X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, i)));
  if (len > 0 && (size_t)len < n && memchr(u, 0, (size_t)len) == NULL) {
    memcpy(out, u, (size_t)len);
    out[len] = '\0';
  }
  OPENSSL_free(u);
  ERR_clear_error();
}

static bool conn_verified(nng_tls_engine_conn *c)
{
  X509 *peer = c->hs_done ? SSL_get0_peer_certificate(c->ssl) : NULL;
  /* with SSL_VERIFY_NONE nothing is checked and the result reads "ok" */
  bool v = peer != NULL && c->auth != NNG_TLS_AUTH_MODE_NONE &&
           SSL_get_verify_result(c->ssl) == X509_V_OK;
  transport_tls_peer *out = peer_capture;
  if (out != NULL) {
    peer_capture = NULL; /* one connection answers */
    memset(out, 0, sizeof *out);
    out->handshake_done = c->hs_done;
    if (c->hs_done) {
      out->verified = v;
      out->version = SSL_version(c->ssl);
      snprintf(out->version_name, sizeof out->version_name, "%s", SSL_get_version(c->ssl));
      snprintf(out->cipher, sizeof out->cipher, "%s", SSL_get_cipher_name(c->ssl));
      if (v)
        subject_cn(peer, out->cn, sizeof out->cn);
      static const char label[] = TRANSPORT_TLS_EXPORTER_LABEL;
      if (SSL_export_keying_material(c->ssl, out->exporter, sizeof out->exporter, label,
                                     sizeof label - 1, NULL, 0, 0) != 1) {
        /* cannot happen after a handshake; an unbound answer would be
         * refused, so say the handshake is not done rather than bind to 0s */
        ERR_clear_error();
        out->handshake_done = false;
      }
    }
  }
  return v;
}

/* ---------------------------------------------------------------- registration */

static nng_tls_engine_conn_ops conn_ops = {
    .size = sizeof(struct nng_tls_engine_conn),
    .init = conn_init,
    .fini = conn_fini,
    .close = conn_close,
    .handshake = conn_handshake,
    .recv = conn_recv,
    .send = conn_send,
    .verified = conn_verified,
};

static char engine_description[128];
static nng_tls_engine engine = {
    .version = NNG_TLS_ENGINE_VERSION,
    .config_ops = &tls_engine_config_ops,
    .conn_ops = &conn_ops,
    .name = TRANSPORT_TLS_ENGINE_NAME,
    .description = engine_description,
};
static pthread_mutex_t register_lock = PTHREAD_MUTEX_INITIALIZER;

bool transport_tls_registered(void)
{
  /* nng_tls_engine_name() initializes nng first, which registers nng's own
   * engine: comparing after it is what makes registering stick */
  return strcmp(nng_tls_engine_name(), TRANSPORT_TLS_ENGINE_NAME) == 0;
}

int transport_tls_register(tport_err *err)
{
  int rc = TPORT_OK;
  pthread_mutex_lock(&register_lock);
  if (bio_method == NULL) {
    BIO_METHOD *m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "tport-nng");
    if (m == NULL || !BIO_meth_set_write_ex(m, bio_write) || !BIO_meth_set_read_ex(m, bio_read) ||
        !BIO_meth_set_ctrl(m, bio_ctrl)) {
      BIO_meth_free(m);
      ERR_clear_error();
      rc = tls_err(err, TPORT_INTERNAL, "tls engine: cannot create its OpenSSL BIO method");
      goto out;
    }
    bio_method = m; /* lives as long as the process: connections may outlive any caller */
    snprintf(engine_description, sizeof engine_description, "tensorport engine on %s",
             OpenSSL_version(OPENSSL_VERSION));
    engine.fips_mode = EVP_default_properties_is_fips_enabled(NULL) == 1;
  }
  if (!transport_tls_registered()) {
    int rv = nng_tls_engine_register(&engine);
    if (rv != 0 || !transport_tls_registered())
      rc = tls_err(err, TPORT_INTERNAL, "tls engine: nng refused it: %s (nng's engine is %s)",
                   rv ? nng_strerror(rv) : "registered, yet not current", nng_tls_engine_name());
  }
out:
  pthread_mutex_unlock(&register_lock);
  return rc;
}

/* ---------------------------------------------------------------- peers */

/* Asks nng for p's NNG_OPT_TLS_VERIFIED with *peer as the capture; the nng
 * result.  peer->version stays -1 unless this engine's conn_verified answers. */
static int query_peer(nng_pipe p, transport_tls_peer *peer)
{
  bool verified;
  memset(peer, 0, sizeof *peer);
  peer->version = -1;
  peer_capture = peer;
  int rv = nng_pipe_get_bool(p, NNG_OPT_TLS_VERIFIED, &verified);
  peer_capture = NULL;
  return rv;
}

int transport_tls_pipe_peer(nng_pipe p, transport_tls_peer *out, tport_err *err)
{
  transport_tls_peer peer;
  if (out == NULL)
    return tls_err(err, TPORT_INVALID_ARGUMENT, "tls peer: out is required");
  int rv = query_peer(p, &peer);
  unsigned id = (unsigned)nng_pipe_id(p);
  if (rv == NNG_ENOENT || rv == NNG_ECLOSED)
    return tls_err(err, TPORT_NOT_FOUND, "pipe %u: no such pipe (closed?)", id);
  if (rv == NNG_ENOTSUP)
    return tls_err(err, TPORT_FAILED_PRECONDITION, "pipe %u: not a TLS connection", id);
  if (rv != 0)
    return tls_err(err, TPORT_INTERNAL, "pipe %u: %s", id, nng_strerror(rv));
  if (peer.version == -1)
    return tls_err(err, TPORT_FAILED_PRECONDITION,
                   "pipe %u: its TLS engine is not tensorport's (made before "
                   "transport_tls_register?)",
                   id);
  *out = peer;
  OPENSSL_cleanse(&peer, sizeof peer);
  return TPORT_OK;
}

int transport_tls_pipe_binding(nng_pipe p, uint8_t out[32], bool *bound, tport_err *err)
{
  transport_tls_peer peer;
  *bound = false;
  if (query_peer(p, &peer) == NNG_ENOTSUP)
    return TPORT_OK; /* tcp://, ipc://, inproc://: nothing to bind to */
  int rc = transport_tls_pipe_peer(p, &peer, err);
  if (rc)
    return rc;
  if (!peer.handshake_done)
    return tls_err(err, TPORT_UNAVAILABLE, "pipe %u: the TLS handshake is not done",
                   (unsigned)nng_pipe_id(p));
  memcpy(out, peer.exporter, sizeof peer.exporter);
  OPENSSL_cleanse(&peer, sizeof peer);
  *bound = true;
  return TPORT_OK;
}
