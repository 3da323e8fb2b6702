/*
 * http.c: the operations endpoint on libmicrohttpd (see http.h).
 *
 * The listening socket is made here (so that a bind failure says why) and
 * handed to libmicrohttpd, which serves it from one internal polling thread
 * (epoll where it can).  Every answer is decided on the access handler's
 * first call, from the method, the path and the headers alone: no request
 * body is ever read.
 */
#include "http.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

struct http_server {
  struct MHD_Daemon *daemon;
  http_routes routes;
  int port;
};

int http_parse_address(const char *s, struct sockaddr_storage *out, socklen_t *len, tport_err *err)
{
  char host[256], port[8];
  const char *colon;
  if (s[0] == '[') {
    const char *end = strchr(s, ']');
    if (!end || end[1] != ':')
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "--http-listen '%s': expected [IPv6]:PORT",
                           s);
    if ((size_t)(end - s - 1) >= sizeof host)
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "--http-listen '%.64s...': too long", s);
    snprintf(host, sizeof host, "%.*s", (int)(end - s - 1), s + 1);
    colon = end + 1;
  } else {
    colon = strrchr(s, ':');
    if (!colon)
      return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                           "--http-listen '%s': expected HOST:PORT (or off)", s);
    if (memchr(s, ':', (size_t)(colon - s)))
      return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                           "--http-listen '%s': an IPv6 address goes in brackets: [::1]:9450", s);
    if ((size_t)(colon - s) >= sizeof host)
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "--http-listen '%.64s...': too long", s);
    snprintf(host, sizeof host, "%.*s", (int)(colon - s), s);
  }
  const char *p = colon + 1;
  size_t plen = strlen(p);
  char *end;
  unsigned long pv = strtoul(p, &end, 10);
  if (plen == 0 || plen > 5 || *end || p[0] == '-' || p[0] == '+' || pv > 65535)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "--http-listen '%s': '%s' is not a port (0-65535)", s, p);
  snprintf(port, sizeof port, "%lu", pv);
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV | AI_PASSIVE};
  struct addrinfo *res = NULL;
  int rv = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
  if (rv != 0 || !res)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "--http-listen '%s': %s", s,
                         rv ? gai_strerror(rv) : "no address");
  /* an empty host: every IPv4 interface (AI_PASSIVE's first answer) */
  struct addrinfo *pick = res;
  for (struct addrinfo *a = res; !host[0] && a; a = a->ai_next)
    if (a->ai_family == AF_INET) {
      pick = a;
      break;
    }
  memset(out, 0, sizeof *out);
  memcpy(out, pick->ai_addr, pick->ai_addrlen);
  *len = pick->ai_addrlen;
  freeaddrinfo(res);
  return TPORT_OK;
}

/* ---------------------------------------------------------------- answers */

static enum MHD_Result answer(struct MHD_Connection *conn, unsigned code, const char *type,
                              char *body, size_t len, enum MHD_ResponseMemoryMode mode)
{
  struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
  if (!r) {
    if (mode == MHD_RESPMEM_MUST_FREE)
      free(body);
    return MHD_NO; /* out of memory: MHD closes the connection */
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
  if (code == MHD_HTTP_METHOD_NOT_ALLOWED)
    MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  enum MHD_Result rv = MHD_queue_response(conn, code, r);
  MHD_destroy_response(r);
  return rv;
}

static enum MHD_Result text(struct MHD_Connection *conn, unsigned code, const char *msg)
{
  return answer(conn, code, "text/plain; charset=utf-8", (char *)msg, strlen(msg),
                MHD_RESPMEM_PERSISTENT);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **req_cls)
{
  http_server *h = cls;
  static int seen;
  if (!*req_cls) {
    /* the headers are in: refuse what is not a GET, or comes with a body,
     * before any of it is read (libmicrohttpd then closes the connection) */
    *req_cls = &seen;
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 && strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
      return text(conn, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed: GET only\n");
    const char *cl =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    const char *te =
        MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_TRANSFER_ENCODING);
    if (te || (cl && strcmp(cl, "0") != 0))
      return text(conn, MHD_HTTP_CONTENT_TOO_LARGE, "requests carry no body here\n");
    return MHD_YES; /* answered on the next call: the request is complete, kept alive */
  }
  if (*upload_data_size) {
    *upload_data_size = 0; /* never reached: a body was refused above */
    return MHD_NO;
  }
  if (strcmp(url, "/healthz") == 0)
    return text(conn, MHD_HTTP_OK, "ok\n");
  if (strcmp(url, "/readyz") == 0) {
    bool ready = h->routes.ready(h->routes.arg);
    return ready ? text(conn, MHD_HTTP_OK, "ready\n")
                 : text(conn, MHD_HTTP_SERVICE_UNAVAILABLE, "not ready\n");
  }
  if (strcmp(url, "/metrics") == 0) {
    size_t len = 0;
    char *body = h->routes.metrics(h->routes.arg, &len);
    if (!body)
      return text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n");
    return answer(conn, MHD_HTTP_OK, "text/plain; version=0.0.4; charset=utf-8", body, len,
                  MHD_RESPMEM_MUST_FREE);
  }
  return text(conn, MHD_HTTP_NOT_FOUND, "not found: /metrics, /healthz, /readyz\n");
}

/* libmicrohttpd's own messages (a client's malformed request...): debug only */
static void on_log(void *cls, const char *fmt, va_list ap)
{
  if (!log_enabled(LOG_DEBUG))
    return;
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  size_t n = strlen(msg);
  while (n && (msg[n - 1] == '\n' || msg[n - 1] == '\r'))
    msg[--n] = 0;
  log_event(LOG_DEBUG, "http endpoint", "detail", msg, NULL);
}

/* ---------------------------------------------------------------- lifecycle */

int http_start(const char *address, const http_routes *routes, http_server **out, tport_err *err)
{
  struct sockaddr_storage ss;
  socklen_t sl;
  int rc = http_parse_address(address, &ss, &sl, err);
  if (rc)
    return rc;
  int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return tport_err_set(err, TPORT_UNAVAILABLE, "--http-listen %s: socket: %s", address,
                         strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&ss, sl) != 0 || listen(fd, 64) != 0) {
    rc = tport_err_set(err, TPORT_UNAVAILABLE, "--http-listen %s: cannot listen: %s", address,
                       strerror(errno));
    close(fd);
    return rc;
  }
  struct sockaddr_storage bound;
  socklen_t bl = sizeof bound;
  getsockname(fd, (struct sockaddr *)&bound, &bl);
  http_server *h = calloc(1, sizeof *h);
  if (!h) {
    close(fd);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  }
  h->routes = *routes;
  h->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                              : ((struct sockaddr_in *)&bound)->sin_port);
  /* MHD_USE_ITC: stopping wakes the polling thread at once */
  h->daemon = MHD_start_daemon(
      MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG, 0, NULL, NULL, on_request, h,
      MHD_OPTION_EXTERNAL_LOGGER, on_log, NULL, MHD_OPTION_LISTEN_SOCKET, fd,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)HTTP_MAX_CONNECTIONS,
      MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)HTTP_MAX_CONNECTIONS_PER_ADDRESS,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)HTTP_IDLE_TIMEOUT_S,
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)HTTP_CONNECTION_MEMORY, MHD_OPTION_END);
  if (!h->daemon) {
    close(fd);
    free(h);
    return tport_err_set(err, TPORT_UNAVAILABLE,
                         "--http-listen %s: libmicrohttpd could not start (see the debug log)",
                         address);
  }
  *out = h;
  return TPORT_OK;
}

int http_port(const http_server *h)
{
  return h ? h->port : 0;
}

void http_stop(http_server *h)
{
  if (!h)
    return;
  MHD_stop_daemon(h->daemon); /* closes the listening socket too */
  free(h);
}
