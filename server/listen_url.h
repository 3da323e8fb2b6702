/*
 * listen_url.h: what a --listen URL means, read the way nng reads it.
 *
 * The safe defaults (config_check) and the listener options (server.c)
 * decide by the URL nng_url_parse makes of the flag -- its scheme in lower
 * case, its host without brackets -- never by a spelling of the flag: every
 * scheme nng 1.5.2 serves is known here, in any case, and one it does not
 * (or one tportd does not serve: zt://) is refused by name.
 *
 * Loopback is an address, never a name that looks like one: an IPv4
 * literal in 127.0.0.0/8 (dotted quad, as inet_pton reads it), the IPv6
 * literal ::1, or the name `localhost`.  `localhost` is resolved by nng
 * like any name; it counts because RFC 6761 reserves it for loopback and
 * the system's resolver answers it from /etc/hosts, and because
 * server_start checks the address each such listener is bound to
 * (listen_addr_is_loopback) and refuses to serve one that is not: a host
 * whose resolver sends `localhost` elsewhere (a container with no
 * /etc/hosts entry and a DNS search domain) gets an error, not an open
 * port.  127.example.com, 127.0.0.1.nip.io and every other DNS name are not
 * loopback, whatever they resolve to today.
 */
#ifndef TPORT_LISTEN_URL_H
#define TPORT_LISTEN_URL_H

#include <nng/nng.h>
#include <stdbool.h>

#include "tport_types.h"

typedef enum {
  LISTEN_INPROC,   /* inproc://: this process only */
  LISTEN_IPC,      /* ipc://, unix://: a socket file (--ipc-mode) */
  LISTEN_ABSTRACT, /* abstract://: a Linux abstract socket (no file, no mode: every local user
                      of this network namespace, as loopback tcp) */
  LISTEN_TCP,      /* tcp://, tcp4://, tcp6:// */
  LISTEN_TLS,      /* tls+tcp://, tls+tcp4://, tls+tcp6:// */
  LISTEN_WS,       /* ws://, ws4://, ws6:// */
  LISTEN_WSS       /* wss://, wss4://, wss6:// */
} listen_transport;

typedef struct listen_url {
  listen_transport transport;
  char scheme[16]; /* as nng reads it: lower case */
  bool network;    /* tcp, tls, ws, wss: an address other hosts may reach */
  bool encrypted;  /* tls, wss: needs --tls-cert */
  bool loopback;   /* network and its host is loopback (see above): server_start checks the
                      address such a listener was bound to */
} listen_url;

/* Reads url as nng will.  An error names the flag, the URL and what is
 * wrong with it. */
int listen_url_parse(const char *url, listen_url *out, tport_err *err);

/* The address a listener was bound to is a loopback one (127.0.0.0/8, ::1
 * or an IPv4-mapped 127.0.0.0/8). */
bool listen_addr_is_loopback(const nng_sockaddr *sa);

#endif
