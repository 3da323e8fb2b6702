/* scheme_probe.c: what the other end of a failed dial speaks (scheme_probe.h). */
#include "scheme_probe.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define STEP_MS 300 /* each connect and each wait for an answer */

typedef enum { SPEAKS_UNKNOWN, SPEAKS_HTTP, SPEAKS_TLS, SPEAKS_SP } speaks;

/* "tcp://host:port", "tls+tcp://[::1]:port" into host and port; false for
 * anything else. */
static bool split_url(const char *url, char *host, size_t hcap, char *port, size_t pcap)
{
  const char *p = strstr(url, "://");
  if (!p)
    return false;
  p += 3;
  const char *colon = strrchr(p, ':');
  if (!colon || !colon[1] || strlen(colon + 1) >= pcap)
    return false;
  const char *h = p, *hend = colon;
  if (*h == '[' && hend > h && hend[-1] == ']')
    h++, hend--;
  if ((size_t)(hend - h) >= hcap)
    return false;
  snprintf(host, hcap, "%.*s", (int)(hend - h), h);
  snprintf(port, pcap, "%s", colon + 1);
  return true;
}

/* A connection to host:port within STEP_MS, or -1. */
static int connect_bounded(const struct addrinfo *ai)
{
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
  if (fd < 0)
    return -1;
  if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
    struct pollfd pf = {fd, POLLOUT, 0};
    int e = 0;
    socklen_t len = sizeof e;
    if (errno != EINPROGRESS || poll(&pf, 1, STEP_MS) != 1 ||
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0 || e != 0) {
      close(fd);
      return -1;
    }
  }
  return fd;
}

/* Sends what (when not NULL) and reads the first bytes that come back
 * within STEP_MS: how many (0 for none, or the connection closed). */
static size_t first_bytes(int fd, const void *what, size_t n, uint8_t *buf, size_t cap)
{
  if (what && send(fd, what, n, MSG_NOSIGNAL) != (ssize_t)n)
    return 0;
  struct pollfd pf = {fd, POLLIN, 0};
  if (poll(&pf, 1, STEP_MS) != 1)
    return 0;
  ssize_t got = recv(fd, buf, cap, 0);
  return got > 0 ? (size_t)got : 0;
}

/* One connection: what it sends first unasked, else what it answers to
 * what. */
static speaks ask(const struct addrinfo *ai, const void *what, size_t n)
{
  int fd = connect_bounded(ai);
  if (fd < 0)
    return SPEAKS_UNKNOWN;
  uint8_t b[8];
  size_t got = first_bytes(fd, what, n, b, sizeof b);
  close(fd);
  if (got >= 4 && memcmp(b, "\0SP\0", 4) == 0)
    return SPEAKS_SP;
  if (got >= 5 && memcmp(b, "HTTP/", 5) == 0)
    return SPEAKS_HTTP;
  if (got >= 2 && b[0] == 0x15 && b[1] == 0x03) /* an alert record */
    return SPEAKS_TLS;
  return SPEAKS_UNKNOWN;
}

static speaks probe(const char *host, const char *port, bool tls)
{
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
  if (getaddrinfo(host, port, &hints, &ai) != 0 || !ai)
    return SPEAKS_UNKNOWN;
  /* a request line any HTTP server answers without side effects */
  static const char http[] = "OPTIONS * HTTP/1.0\r\n\r\n";
  /* a handshake record too short to be one: a TLS server sends an alert */
  static const uint8_t record[] = {0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x00, 0x00, 0x00};
  speaks s = tls ? ask(ai, NULL, 0) : ask(ai, http, sizeof http - 1);
  if (s == SPEAKS_UNKNOWN)
    s = tls ? ask(ai, http, sizeof http - 1) : ask(ai, record, sizeof record);
  freeaddrinfo(ai);
  return s;
}

void scheme_probe_hint(const char *url, char *hint, size_t cap)
{
  char host[256], port[16];
  hint[0] = '\0';
  bool tls = strncasecmp(url, "tls+tcp://", 10) == 0;
  if ((!tls && strncasecmp(url, "tcp://", 6) != 0) ||
      !split_url(url, host, sizeof host, port, sizeof port))
    return;
  const char *rest = strstr(url, "://") + 3;
  switch (probe(host, port, tls)) {
  case SPEAKS_HTTP:
    snprintf(hint, cap, "the server at %s speaks HTTP: is this the metrics port? tensorport's "
                        "default is tcp://%s%s%s:7450", url, strchr(host, ':') ? "[" : "", host,
             strchr(host, ':') ? "]" : "");
    break;
  case SPEAKS_TLS:
    if (!tls)
      snprintf(hint, cap, "the server at %s speaks TLS: use tls+tcp://%s", url, rest);
    break;
  case SPEAKS_SP:
    if (tls)
      snprintf(hint, cap, "the server at %s speaks tensorport without TLS: use tcp://%s", url,
               rest);
    break;
  default: break;
  }
}
