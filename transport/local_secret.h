/*
 * local_secret.h: the secret of the user who runs tportd, which proves a
 * local client is that user.
 *
 * Without --auth-file (and without --tls-ca), tportd listens on loopback
 * only, and every process of the machine can reach loopback and most ipc://
 * paths: a claimed tenant would let any local user be any tenant.  So tportd
 * keeps a secret in a file only its own user can read, and a client on a
 * local URL proves it can read that file by answering the Hello challenge
 * with it (hello_mac.h: the same HMAC as an auth file's secret; the secret
 * never travels).  The holder may claim any tenant: it is the server's own
 * user.
 *
 * Where (the same rule on both ends, so that the same user needs no set-up):
 *   $TPORT_LOCAL_SECRET (a path, or "off"), else
 *   $XDG_RUNTIME_DIR/tensorport/local-secret when XDG_RUNTIME_DIR is set, else
 *   /tmp/tensorport-UID/local-secret.
 * The default directory is made 0700 if missing and must be a directory (not
 * a link) owned by this user that group and others cannot enter; the file
 * must be a regular file (not a link) owned by this user, mode 600 or
 * stricter, holding 32..128 hex digits.  Anything else is refused, never
 * repaired or replaced: it may be another user's doing.
 *
 * One secret per user, shared by all of that user's tportd processes: the
 * first to start makes it (written to a temporary file, then link()ed into
 * place, which fails rather than replaces when another start won the race),
 * the others read it.
 */
#ifndef TPORT_TRANSPORT_LOCAL_SECRET_H
#define TPORT_TRANSPORT_LOCAL_SECRET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>

#include "hello_mac.h"

#define LOCAL_SECRET_ENV "TPORT_LOCAL_SECRET"
#define LOCAL_SECRET_BYTES 32 /* what tportd generates: 256 bits */
#define LOCAL_SECRET_PATH_MAX 256

/* The path the rule above gives, into buf (LOCAL_SECRET_PATH_MAX bytes);
 * *off is set when TPORT_LOCAL_SECRET is "off" (buf is then empty). */
int transport_local_secret_default(char *buf, size_t len, bool *off, tport_err *err);

/* Reads the secret at path (checked as above; for the default path, its
 * directory too).  TPORT_NOT_FOUND when the file does not exist. */
int transport_local_secret_read(const char *path, uint8_t out[HELLO_SECRET_MAX_BYTES], size_t *len,
                                tport_err *err);

/* Reads the secret at path, or makes one there when there is none (and, for
 * the default path, its directory).  Never replaces a file. */
int transport_local_secret_ensure(const char *path, uint8_t out[HELLO_SECRET_MAX_BYTES],
                                  size_t *len, tport_err *err);

/* The binding of an answer with the local secret on a tcp connection
 * without TLS: the server's address and port as both ends see them (the
 * client's remote address, the server's local one).  A process that took a
 * loopback port the client dials and passes the real server's challenge on
 * gets an answer bound to its own port, which the real server refuses.
 * *bound is false on other connections (ipc, inproc: one file or process;
 * TLS has its exporter: hello_mac.h). */
int transport_local_binding(nng_pipe p, bool server_side, uint8_t out[HELLO_BINDING_BYTES],
                            bool *bound, tport_err *err);
/* The same from the server's address itself. */
int transport_local_binding_addr(const nng_sockaddr *sa, uint8_t out[HELLO_BINDING_BYTES],
                                 bool *bound, tport_err *err);

/* True when url reaches this host by its spelling alone, so that a client
 * may answer a challenge with the local secret there: ipc://, unix://,
 * abstract://, inproc://, or a tcp, tls+tcp or ws(s) scheme whose host is a
 * numeric 127.0.0.0/8 address, [::1] or localhost -- never another name,
 * which may resolve anywhere. */
bool transport_local_secret_url_ok(const char *url);

#endif
