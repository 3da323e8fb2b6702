/* listen_url.c: a --listen URL read as nng reads it (listen_url.h). */
#include "listen_url.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

/* Every scheme nng 1.5.2 listens on (src/core/stream.c and
 * src/sp/transport/): what each is to tportd. */
static const struct {
  const char *scheme;
  listen_transport transport;
} schemes[] = {
    {"inproc", LISTEN_INPROC}, {"ipc", LISTEN_IPC},
    {"unix", LISTEN_IPC},      {"abstract", LISTEN_ABSTRACT},
    {"tcp", LISTEN_TCP},       {"tcp4", LISTEN_TCP},
    {"tcp6", LISTEN_TCP},      {"tls+tcp", LISTEN_TLS},
    {"tls+tcp4", LISTEN_TLS},  {"tls+tcp6", LISTEN_TLS},
    {"ws", LISTEN_WS},         {"ws4", LISTEN_WS},
    {"ws6", LISTEN_WS},        {"wss", LISTEN_WSS},
    {"wss4", LISTEN_WSS},      {"wss6", LISTEN_WSS},
};
#define NSCHEMES (sizeof schemes / sizeof schemes[0])

static bool ipv4_loopback(const struct in_addr *a)
{
  return (ntohl(a->s_addr) >> 24) == 127;
}

/* A literal loopback address (inet_pton's strict forms: no "127.1", no
 * "0x7f.0.0.1", no scope), or localhost. */
static bool loopback_host(const char *h)
{
  struct in_addr a4;
  struct in6_addr a6;
  if (inet_pton(AF_INET, h, &a4) == 1)
    return ipv4_loopback(&a4);
  if (inet_pton(AF_INET6, h, &a6) == 1)
    return IN6_IS_ADDR_LOOPBACK(&a6);
  /* nng has lowered the host's case; "localhost." is a DNS query */
  return strcmp(h, "localhost") == 0;
}

int listen_url_parse(const char *url, listen_url *out, tport_err *err)
{
  memset(out, 0, sizeof *out);
  nng_url *u = NULL;
  int rv = nng_url_parse(&u, url);
  if (rv != 0)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "--listen %s: not a URL nng can listen on (%s): SCHEME://ADDRESS, such as "
                         "tcp://127.0.0.1:7450",
                         url, nng_strerror(rv));
  size_t i = 0;
  while (i < NSCHEMES && strcmp(u->u_scheme, schemes[i].scheme) != 0)
    i++;
  if (i == NSCHEMES) {
    rv = tport_err_set(err, TPORT_INVALID_ARGUMENT,
                       "--listen %s: scheme '%s' is not one tportd listens on (tcp, tcp4, tcp6, "
                       "tls+tcp, tls+tcp4, tls+tcp6, ipc, unix, abstract, inproc, ws, ws4, ws6, "
                       "wss, wss4, wss6)",
                       url, u->u_scheme);
    nng_url_free(u);
    return rv;
  }
  out->transport = schemes[i].transport;
  snprintf(out->scheme, sizeof out->scheme, "%s", schemes[i].scheme);
  out->network = out->transport >= LISTEN_TCP;
  out->encrypted = out->transport == LISTEN_TLS || out->transport == LISTEN_WSS;
  /* u_hostname: the host without its brackets or port; "" for "*", "[*]"
   * stays "*" (nng binds every interface for both) */
  if (out->network)
    out->loopback = loopback_host(u->u_hostname);
  nng_url_free(u);
  return TPORT_OK;
}

bool listen_addr_is_loopback(const nng_sockaddr *sa)
{
  switch (sa->s_family) {
  case NNG_AF_INET: {
    struct in_addr a = {.s_addr = sa->s_in.sa_addr};
    return ipv4_loopback(&a);
  }
  case NNG_AF_INET6: {
    struct in6_addr a;
    memcpy(&a, sa->s_in6.sa_addr, sizeof a);
    if (IN6_IS_ADDR_V4MAPPED(&a))
      return a.s6_addr[12] == 127;
    return IN6_IS_ADDR_LOOPBACK(&a);
  }
  default: return false;
  }
}
