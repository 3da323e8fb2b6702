/*
 * http.h: the operations endpoint (--http-listen): GET /metrics, /healthz
 * and /readyz, served by libmicrohttpd on its own thread.
 *
 * It knows nothing of the server: the owner hands it the two callbacks
 * below.  Only GET (and HEAD) of those three paths are answered (another
 * method: 405, another path: 404, a request with a body: 413); connections
 * are bounded in number (in all and per client address), in memory and in
 * idle time, so that a client of this port cannot exhaust the server.
 */
#ifndef TPORT_HTTP_H
#define TPORT_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#include "tport_types.h"

#define HTTP_DEFAULT_ADDRESS "127.0.0.1:9450"
#define HTTP_MAX_CONNECTIONS 64
#define HTTP_MAX_CONNECTIONS_PER_ADDRESS 16
#define HTTP_IDLE_TIMEOUT_S 10
#define HTTP_CONNECTION_MEMORY (32 * 1024) /* the request's headers must fit */

typedef struct http_server http_server;

typedef struct http_routes {
  /* The body of /metrics, malloc'ed (the endpoint frees it), with its
   * length; NULL: 500.  Called on the endpoint's thread. */
  char *(*metrics)(void *arg, size_t *len);
  /* Whether /readyz answers 200 (else 503).  Called on the endpoint's thread. */
  bool (*ready)(void *arg);
  void *arg;
} http_routes;

/* Parses "HOST:PORT": an IPv4 address, "[IPv6]", a host name (its first
 * address), or an empty host for every IPv4 interface; PORT 0 takes any
 * free port.  The error names the flag and the value. */
int http_parse_address(const char *s, struct sockaddr_storage *out, socklen_t *len, tport_err *err);
/* Binds address (a failure is an error naming it and the reason) and
 * serves; the routes are copied. */
int http_start(const char *address, const http_routes *routes, http_server **out, tport_err *err);
/* The port bound (useful after port 0). */
int http_port(const http_server *h);
/* Stops serving: closes the socket and every connection, waits for the
 * endpoint's thread (a request being answered completes first).  NULL: nothing. */
void http_stop(http_server *h);

#endif
