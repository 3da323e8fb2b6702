/* scheme_probe.h: after a tcp:// or tls+tcp:// dial fails, what the other
 * end speaks, for a hint in the error (a leaf of its own: client.c uses it).
 *
 * A URL with the wrong scheme fails obscurely: tcp:// to tportd's /metrics
 * port waits out nng's handshake and says "Timed out", tcp:// to a TLS
 * listener says "Connection shutdown", tls+tcp:// to a plain one fails the
 * handshake.  The probe opens a raw connection of its own and looks at what
 * comes back: an HTTP server answers a request line with "HTTP/1.x", a TLS
 * server answers a malformed record with an alert record (0x15 0x03 ...),
 * and tportd's plain listener sends its SP header (0x00 'S' 'P' 0x00) as
 * soon as it accepts.  Each step is bounded (about 1 s in all); anything
 * else is "unknown" and the error stays as it was.
 */
#ifndef TPORT_CLIENT_SCHEME_PROBE_H
#define TPORT_CLIENT_SCHEME_PROBE_H

#include <stddef.h>

/* A hint for url ("" when there is none) in hint[cap]. */
void scheme_probe_hint(const char *url, char *hint, size_t cap);

#endif
