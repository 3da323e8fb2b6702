/*
 * tls_internal.h: what tls_config.c takes from the engine (tls_openssl.c);
 * not part of the transport layer's interface.
 */
#ifndef TPORT_TRANSPORT_TLS_INTERNAL_H
#define TPORT_TRANSPORT_TLS_INTERNAL_H

#include "tport_types.h"

/* Sets err (when not NULL) and returns code; transport/ links nothing of
 * ours, so not tport_err_set. */
int tls_err(tport_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Why the latest engine config op failed on this thread (a config op can
 * only return an nng code; nng runs it on the caller's thread), or
 * nng_strerror(rv) when it left no reason.  Clear before the call. */
const char *tls_config_why(int rv);
void tls_config_why_clear(void);

#endif
