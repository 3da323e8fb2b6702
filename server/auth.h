/*
 * auth.h: who may connect as which tenant.
 *
 * The auth file (--auth-file) lists one tenant per line, "TENANT SECRET",
 * SECRET in hex (at least 32 digits); '#' starts a comment.  It must not be
 * readable by group or others.  A loaded file is immutable and refcounted:
 * SIGHUP loads a new one and swaps it in, and a Hello being checked keeps
 * the one it started with.  Failed proofs are counted per peer address; an
 * address with too many failures in a while is refused until it passes.
 *
 * Without an auth file, tportd's local secret (transport/local_secret.h)
 * takes its place: one secret, good for every tenant.
 */
#ifndef TPORT_AUTH_H
#define TPORT_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "hello_mac.h"

typedef struct auth_file auth_file;

/* Loads and checks an auth file (the error names the line that is wrong). */
int auth_file_load(const char *path, auth_file **out, tport_err *err);
/* The local secret's stand-in for an auth file: every tenant has that one
 * secret (its holder is the server's own user: local_secret.h). */
int auth_file_any_tenant(const uint8_t *secret, size_t len, auth_file **out, tport_err *err);
auth_file *auth_file_retain(auth_file *a);
void auth_file_release(auth_file *a);
/* The secret of a tenant; false when the file does not list it. */
bool auth_file_secret(const auth_file *a, const char *tenant, uint8_t *secret, size_t *len);
size_t auth_file_count(const auth_file *a);

/* Failed attempts per peer address: AUTH_FAILURES_MAX within AUTH_WINDOW_MS
 * and that address is refused until the window has passed. */
#define AUTH_FAILURES_MAX 10
#define AUTH_WINDOW_MS 60000
typedef struct auth_limiter auth_limiter;
auth_limiter *auth_limiter_new(void);
void auth_limiter_free(auth_limiter *l);
/* True when the address may try now. */
bool auth_limiter_allows(auth_limiter *l, const char *peer, int64_t now_ms);
void auth_limiter_fail(auth_limiter *l, const char *peer, int64_t now_ms);

#endif
