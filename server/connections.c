/*
 * connections.c: the connections (nng pipes) of the server: who is at the
 * other end, a connection opened (refused past --max-connections or while
 * stopping) or closed (its session, transfers and regions freed), and one
 * dropped for going over a limit.
 */
#include <nng/nng.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "log.h"
#include "server_internal.h"

void server_peer_address(uint32_t pipe, char *buf, size_t len)
{
  nng_sockaddr sa;
  snprintf(buf, len, "unknown");
  if (nng_pipe_get_addr((nng_pipe){.id = pipe}, NNG_OPT_REMADDR, &sa) != 0)
    return;
  char ip[INET6_ADDRSTRLEN] = "";
  switch (sa.s_family) {
  case NNG_AF_INET: inet_ntop(AF_INET, &sa.s_in.sa_addr, ip, sizeof ip); break;
  case NNG_AF_INET6: inet_ntop(AF_INET6, sa.s_in6.sa_addr, ip, sizeof ip); break;
  case NNG_AF_IPC: snprintf(ip, sizeof ip, "ipc"); break;
  case NNG_AF_INPROC: snprintf(ip, sizeof ip, "inproc"); break;
  default: return;
  }
  snprintf(buf, len, "%s", ip);
}

/* How the pipe came: its listener's scheme (every scheme nng serves;
 * listen_url.c reads them the same way). */
static reg_via pipe_via(nng_pipe p)
{
  nng_listener l = nng_pipe_listener(p);
  char *url = NULL;
  if (nng_listener_id(l) < 0 || nng_listener_get_string(l, NNG_OPT_URL, &url) != 0 || !url)
    return REG_VIA_OTHER;
  static const struct {
    const char *prefix;
    reg_via via;
  } schemes[] = {{"tls+tcp", REG_VIA_TLS}, {"wss", REG_VIA_TLS},   {"tcp", REG_VIA_TCP},
                 {"ws", REG_VIA_TCP},       {"ipc", REG_VIA_IPC},   {"unix", REG_VIA_IPC},
                 {"abstract", REG_VIA_IPC}, {"inproc", REG_VIA_INPROC}};
  reg_via via = REG_VIA_OTHER;
  for (size_t i = 0; i < sizeof schemes / sizeof *schemes; i++)
    if (strncasecmp(url, schemes[i].prefix, strlen(schemes[i].prefix)) == 0) {
      via = schemes[i].via;
      break;
    }
  nng_strfree(url);
  return via;
}

bool server_peer_is_local(uint32_t pipe)
{
  nng_sockaddr sa;
  if (nng_pipe_get_addr((nng_pipe){.id = pipe}, NNG_OPT_REMADDR, &sa) != 0)
    return false;
  switch (sa.s_family) {
  case NNG_AF_IPC:
  case NNG_AF_INPROC: return true;
  case NNG_AF_INET: return (ntohl(sa.s_in.sa_addr) >> 24) == 127;
  case NNG_AF_INET6: {
    static const uint8_t loop6[16] = {[15] = 1};
    static const uint8_t mapped[12] = {[10] = 0xff, [11] = 0xff};
    const uint8_t *a = sa.s_in6.sa_addr;
    return memcmp(a, loop6, 16) == 0 || (memcmp(a, mapped, 12) == 0 && a[12] == 127);
  }
  default: return false;
  }
}

/* A connection over a limit is dropped: that costs only itself.  logged:
 * say so in the log (a flood's drops are summed up by the caller). */
void server_drop_pipe_logged(server *s, nng_pipe p, const char *why, bool logged)
{
  uint32_t id = (uint32_t)nng_pipe_id(p);
  if (reg_session_mark_dropped(&s->reg, id)) {
    atomic_fetch_add(&s->dropped, 1);
    if (logged && log_enabled(LOG_WARN)) {
      char conn[16], peer[64], tenant[REG_TENANT_MAX];
      snprintf(conn, sizeof conn, "%u", id);
      server_peer_address(id, peer, sizeof peer);
      bool known = reg_session_tenant(&s->reg, id, tenant, sizeof tenant);
      log_event(LOG_WARN, "connection dropped", "connection", conn, "peer", peer, "tenant",
                known ? tenant : NULL, "reason", why, NULL);
    }
  }
  nng_pipe_close(p);
}

void server_drop_pipe(server *s, nng_pipe p, const char *why)
{
  server_drop_pipe_logged(s, p, why, true);
}

void server_pipe_event(nng_pipe p, nng_pipe_ev ev, void *arg)
{
  server *s = arg;
  uint32_t id = (uint32_t)nng_pipe_id(p);
  char conn[16] = "", peer[64] = "";
  if (log_enabled(LOG_DEBUG)) {
    snprintf(conn, sizeof conn, "%u", id);
    server_peer_address(id, peer, sizeof peer);
  }
  if (ev == NNG_PIPE_EV_ADD_PRE && atomic_load(&s->draining)) {
    /* stopping: no new connection (nng then reports nothing more of it) */
    nng_pipe_close(p);
    log_event(LOG_DEBUG, "connection refused: the server is stopping", "connection", conn, "peer",
              peer, NULL);
  } else if (ev == NNG_PIPE_EV_ADD_PRE) {
    /* before the pipe's first request can arrive; past --max-connections
     * it is closed here, before it costs more than its descriptor */
    if (reg_session_open(&s->reg, id, s->max_connections)) {
      server_peer_address(id, peer, sizeof peer);
      reg_session_describe(&s->reg, id, pipe_via(p), peer);
      log_event(LOG_DEBUG, "connection opened", "connection", conn, "peer", peer, NULL);
      return;
    }
    nng_pipe_close(p);
    atomic_fetch_add(&s->refused_connections, 1);
    /* a flood must not flood the log too: once a second at most */
    int64_t now = mono_ms(), last = atomic_load(&s->refused_log_ms);
    if (now - last >= 1000 && atomic_compare_exchange_strong(&s->refused_log_ms, &last, now)) {
      char max[24], total[24];
      snprintf(max, sizeof max, "%llu", (unsigned long long)s->max_connections);
      snprintf(total, sizeof total, "%llu",
               (unsigned long long)atomic_load(&s->refused_connections));
      server_peer_address(id, peer, sizeof peer);
      log_event(LOG_WARN, "connection refused: --max-connections are open", "peer", peer,
                "max_connections", max, "refused_so_far", total, NULL);
    }
  } else if (ev == NNG_PIPE_EV_REM_POST) {
    /* the session first, then its transfers (see transfers_insert); its
     * peer from the session: nng no longer knows the address of a pipe
     * that has gone */
    reg_session_peer(&s->reg, id, peer, sizeof peer);
    reg_session_close(&s->reg, id);
    transfers_drop(&s->xfers, id);
    shm_drop_pipe(s->shm, id);
    log_event(LOG_DEBUG, "connection closed: its tensors, uploads and gets are freed",
              "connection", conn, "peer", peer, NULL);
  }
}
