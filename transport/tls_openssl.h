/*
 * tls_openssl.h: the OpenSSL 3 TLS engine that tensorport registers with nng,
 * and the helpers that build nng TLS configurations from PEM files.
 *
 * Debian's nng 1.5.2 does TLS through mbedTLS 2.28 (TLS 1.2 only, slow), and
 * the nng tensorport builds (deploy/nng) has no TLS engine at all.  nng lets
 * a program bring its own (nng/supplemental/tls/engine.h): once
 * transport_tls_register() has run, every nng_tls_config allocated afterwards
 * -- and so every tls+tcp:// dialer and listener created afterwards -- uses
 * OpenSSL: TLS 1.3 only unless a configuration allows 1.2, AES-GCM and
 * ChaCha20-Poly1305 suites, no renegotiation, no session tickets, peer
 * certificates verified with the server name (DNS name in subjectAltName, or
 * IP address) checked, and a close_notify when a connection closes (best
 * effort: nng 1.5.2 may close the TCP stream first, see tls_openssl.c).  A
 * configuration is frozen once a connection has used it (NNG_EBUSY).
 *
 * Using it (the nng calls; errors elided):
 *
 *   server:  transport_tls_server_config(&so, &cfg, &err);
 *            nng_listener_create(&l, sock, "tls+tcp://0.0.0.0:7451");
 *            nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, cfg);
 *            nng_tls_config_free(cfg);            (the listener holds its own)
 *            nng_listener_start(l, 0);
 *            ... on a request: transport_tls_pipe_peer(nng_msg_get_pipe(m), &peer, &err)
 *                gives the verified client certificate's subject CN.
 *   client:  transport_tls_client_config(&co, url, &cfg, &err);
 *            nng_dialer_create(&d, sock, url);
 *            nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, cfg);
 *            nng_tls_config_free(cfg);
 *            nng_dialer_start(d, 0);
 *
 * The transport layer uses nng and OpenSSL only (never engine, server or
 * client); errors are tport_err values naming the field at fault.
 */
#ifndef TPORT_TRANSPORT_TLS_OPENSSL_H
#define TPORT_TRANSPORT_TLS_OPENSSL_H

#include <stdbool.h>
#include <stdint.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>

#include "tport_types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The engine's name as nng_tls_engine_name() reports it once registered. */
#define TRANSPORT_TLS_ENGINE_NAME "tport-openssl"

/* Registers the engine with nng.  Idempotent and thread-safe; returns
 * TPORT_OK, or TPORT_INTERNAL when nng refuses the engine.  Call it before
 * creating tls+tcp:// dialers or listeners: nng binds a dialer or listener to
 * the engine that was registered when it was created.  After nng_fini(),
 * call it again.  The config helpers below call it themselves. */
int transport_tls_register(tport_err *err);

/* True when nng's current TLS engine is this one. */
bool transport_tls_registered(void);

/* A server's TLS: its certificate and key, and (for mutual TLS) the CAs whose
 * client certificates it accepts.  Strings are borrowed for the call. */
typedef struct transport_tls_server_opts {
  const char *cert_file;      /* PEM: the certificate, then its chain; required */
  const char *key_file;       /* PEM private key; NULL: read from cert_file */
  const char *key_password;   /* for an encrypted key; NULL: the key is not encrypted */
  const char *client_ca_file; /* PEM CAs; set: every client must present a certificate
                                 they signed (verified, or the handshake fails); NULL:
                                 clients are not asked for certificates */
  bool allow_tls12;           /* accept TLS 1.2 as well (ECDHE + AEAD suites); default 1.3 only */
} transport_tls_server_opts;

/* A client's TLS: whom it trusts, who it is (optional), whom it expects. */
typedef struct transport_tls_client_opts {
  const char *ca_file;      /* PEM CAs that sign the server's certificate; NULL: the system store */
  const char *cert_file;    /* PEM client certificate (and chain) for mutual TLS; NULL: none */
  const char *key_file;     /* PEM private key; NULL: read from cert_file */
  const char *key_password; /* for an encrypted key; NULL: not encrypted */
  const char *server_name;  /* the name the server's certificate must carry (DNS name or IP
                               address; sent as SNI when a DNS name); NULL: the URL's host */
  bool allow_tls12;         /* accept TLS 1.2 as well; default 1.3 only */
} transport_tls_client_opts;

/* Builds a server configuration.  On success *out is a new nng_tls_config
 * the caller owns (nng_tls_config_free); on failure *out is untouched and err
 * names the field (cert_file, key_file, client_ca_file) and the reason. */
int transport_tls_server_config(const transport_tls_server_opts *opts, nng_tls_config **out,
                                tport_err *err);

/* Builds a client configuration for dialing url (a tls+tcp:// URL; used only
 * for its host when opts->server_name is NULL; may be NULL when server_name
 * is set).  The server's certificate is always verified. */
int transport_tls_client_config(const transport_tls_client_opts *opts, const char *url,
                                nng_tls_config **out, tport_err *err);

/* What one connection negotiated and who its peer proved to be. */
#define TRANSPORT_TLS_CN_MAX 256
typedef struct transport_tls_peer {
  bool handshake_done;           /* false: the handshake has not finished (fields below empty) */
  bool verified;                 /* the peer presented a certificate and it verified (chain, dates,
                                    purpose; the server name too, on a client) */
  int version;                   /* 0x0304 for TLS 1.3, 0x0303 for TLS 1.2 (the wire numbers) */
  char version_name[16];         /* "TLSv1.3" */
  char cipher[64];               /* "TLS_AES_256_GCM_SHA384" */
  char cn[TRANSPORT_TLS_CN_MAX]; /* subject CN of the *verified* peer certificate (UTF-8);
                                    "" when unverified, absent, or when the subject has
                                    no CN, several, or one with a NUL in it */
  /* The connection's keying-material exporter (SSL_export_keying_material,
   * label TRANSPORT_TLS_EXPORTER_LABEL, no context): the same on both ends
   * of this connection and unknowable to anyone else; what binds a Hello's
   * answer to the connection (hello_mac.h).  Valid when handshake_done. */
  uint8_t exporter[32];
} transport_tls_peer;

#define TRANSPORT_TLS_EXPORTER_LABEL "EXPORTER-tensorport-hello-v1"

/* Fills *out for the connection behind pipe p (a pipe of a tls+tcp://
 * dialer or listener; nng_msg_get_pipe gives a request's pipe).  nng 1.5.2's
 * engine interface has no peer-certificate operation, so this asks nng for
 * the pipe's NNG_OPT_TLS_VERIFIED, which nng answers synchronously, on this
 * thread, by calling this engine's `verified` operation on that very
 * connection; the engine fills *out there.  TPORT_FAILED_PRECONDITION when
 * p is not a TLS pipe of this engine (tcp://, ipc://, or a pipe made before
 * transport_tls_register); TPORT_NOT_FOUND when p is closed or unknown. */
int transport_tls_pipe_peer(nng_pipe p, transport_tls_peer *out, tport_err *err);

/* What binds a Hello's answer to the connection behind pipe p (hello_mac.h):
 * its exporter, *bound true, on a TLS connection of this engine; *bound
 * false on a connection without TLS.  An error where p is closed, its
 * handshake is not done, or its TLS engine is not this one (so the two
 * ends could not agree). */
int transport_tls_pipe_binding(nng_pipe p, uint8_t out[32], bool *bound, tport_err *err);

/* Counters since the process started (all connections, both directions);
 * for metrics and tests. */
typedef struct transport_tls_stats {
  uint64_t connections;           /* engine connections created */
  uint64_t handshakes_tls13;      /* handshakes completed with TLS 1.3 */
  uint64_t handshakes_tls12;      /* ... with TLS 1.2 */
  uint64_t failures;              /* connections ended by a TLS error (handshake, alert, record) */
  uint64_t verify_failures;       /* of which: this side refused the peer's certificate */
  uint64_t peer_refused;          /* of which: the peer refused ours (a certificate alert) */
  uint64_t close_notify_sent;     /* handed to nng at a close (it leaves unless nng 1.5.2
                                    has already torn the TCP stream down) */
  uint64_t close_notify_received; /* the peer closed cleanly */
  /* why the latest failed server-side / client-side connection failed:
   * "server handshake: peer certificate refused: certificate has expired" */
  char last_server_failure[TPORT_ERR_MSG_MAX];
  char last_client_failure[TPORT_ERR_MSG_MAX];
} transport_tls_stats;

void transport_tls_stats_get(transport_tls_stats *out);

#ifdef __cplusplus
}
#endif

#endif
