/*
 * hello_mac.h: the shared-secret proof of a tenant's identity, the same on
 * both ends.
 *
 * A server that authenticates answers a connection's first Hello with a
 * fresh random challenge; the client proves it knows its tenant's secret by
 * answering with
 *   HMAC-SHA256(secret, "tensorport-hello-v1" 0x00 challenge tenant 0x00
 *                       [binding])
 * and the server compares in constant time.  The secret never travels; the
 * challenge is the connection's own and used once, so an answer seen on one
 * connection is worth nothing on another.  On a TLS connection the binding
 * is that connection's keying-material exporter (RFC 5705; the idea of
 * RFC 9266's tls-exporter binding), which both ends compute and nobody else
 * can: a server the client trusts for another name, or a relay, that passes
 * the real server's challenge on to the client gets an answer bound to its
 * own TLS connection, which the real server refuses.  With the local secret
 * on plain tcp the binding is a hash of the server's address and port as both
 * ends see them (local_secret.h), for the same reason.  Secrets are written
 * as hex (at least 32 digits: 128 bits).
 */
#ifndef TPORT_TRANSPORT_HELLO_MAC_H
#define TPORT_TRANSPORT_HELLO_MAC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tport_types.h"

#define HELLO_CHALLENGE_BYTES 32
#define HELLO_MAC_BYTES 32
#define HELLO_SECRET_MIN_BYTES 16
#define HELLO_SECRET_MAX_BYTES 64
#define HELLO_BINDING_BYTES 32

/* Parses a secret written in hex (whitespace around it ignored). */
int transport_hello_secret_parse(const char *hex, uint8_t *out, size_t *len, tport_err *err);
/* Reads a secret from a file that holds it in hex (as an auth file line's
 * SECRET); the file must not be readable by group or others. */
int transport_hello_secret_file(const char *path, uint8_t *out, size_t *len, tport_err *err);
/* The answer to a challenge for a tenant; binding: the connection's TLS
 * exporter (transport_tls_peer.exporter, HELLO_BINDING_BYTES), or NULL on a
 * connection without TLS. */
int transport_hello_mac(const uint8_t *secret, size_t secret_len,
                        const uint8_t challenge[HELLO_CHALLENGE_BYTES], const char *tenant,
                        const uint8_t *binding, uint8_t out[HELLO_MAC_BYTES], tport_err *err);
/* Constant-time comparison of two answers. */
bool transport_hello_mac_equal(const uint8_t *a, const uint8_t *b);

#endif
