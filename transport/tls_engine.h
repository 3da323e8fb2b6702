/*
 * tls_engine.h: what the two halves of the OpenSSL engine share --
 * tls_engine_config.c's configurations, which tls_openssl.c's connections
 * are made from.  Private to the engine's files.
 */
#ifndef TPORT_TRANSPORT_TLS_ENGINE_H
#define TPORT_TRANSPORT_TLS_ENGINE_H

#include <stdatomic.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/engine.h>
#include <openssl/ssl.h>

struct nng_tls_engine_config {
  SSL_CTX *ctx;
  nng_tls_mode mode;
  nng_tls_auth_mode auth;
  char *server_name;  /* owned; NULL: no name to check */
  atomic_bool in_use; /* a connection was made from it: frozen from then on */
};

/* OpenSSL's reason for the last error of this thread, for a message. */
const char *ossl_reason(char *buf, size_t n);

/* The engine's configuration operations (nng calls them, on the caller's
 * thread). */
extern nng_tls_engine_config_ops tls_engine_config_ops;

#endif
