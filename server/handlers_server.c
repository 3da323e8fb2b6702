/* handlers_server.c: Hello, Devices and Stats. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "device.h"
#include "engine_stats.h"
#include "tls_openssl.h"
#include "local_secret.h"
#include "log.h"
#include "wire.h"

#define PROTOCOL_VERSION 1

static bool is_operator(const server *s, const char *tenant);

/* The Hello reply, with status code (and a challenge, when one is out). */
static int hello_reply(call *c, int code, const char *msg, const uint8_t *challenge)
{
  Tport__HelloReply r = TPORT__HELLO_REPLY__INIT;
  Tport__Status st = TPORT__STATUS__INIT;
  st.code = (Tport__Code)code;
  st.message = (char *)msg;
  r.status = code ? &st : wire_ok();
  r.protocol_version = PROTOCOL_VERSION;
  r.get_expect = true; /* h_get_begin checks expect_* first */
  r.batch_get_slices = true; /* handlers_batch.c get_element */
  r.put_batch_runs = true;   /* put_runs.c */
  r.process_regions = c->srv->shm != NULL; /* regions_process.c */
  if (r.process_regions) {
    r.process_read_max_bytes = shm_process_read_max(c->srv->cfg.chunk_bytes);
    r.process_put_once = true; /* put_gather.c */
    r.process_gets = true;     /* get_direct.c */
  }
  r.server = "tportd "
             "0.1.0";
  if (challenge) {
    r.auth_challenge.data = (uint8_t *)challenge;
    r.auth_challenge.len = REG_CHALLENGE_BYTES;
    r.local_secret = c->srv->local;
  }
  r.max_message_bytes = c->srv->cfg.max_message_bytes;
  r.max_chunk_bytes = c->srv->cfg.chunk_bytes;
  r.max_inflight_chunks = (uint32_t)c->srv->cfg.window;
  r.max_outstanding = (uint32_t)c->srv->cfg.max_outstanding;
  /* offered to clients on this host only (no other could hand a descriptor) */
  r.shm_socket =
      (char *)(c->srv->shm && server_peer_is_local(c->pipe) ? shm_socket_path(c->srv->shm) : "");
  return call_reply(c, &r.base, NULL, 0);
}

/* Checks an answer to the connection's challenge (taken: used once). */
static int check_answer(call *c, auth_file *a, const char *tenant, const uint8_t *answer,
                        size_t len)
{
  uint8_t challenge[REG_CHALLENGE_BYTES], secret[HELLO_SECRET_MAX_BYTES], want[HELLO_MAC_BYTES];
  size_t slen = 0;
  if (!reg_session_take_challenge(&c->srv->reg, c->pipe, challenge))
    return tport_err_set(&c->err, TPORT_UNAUTHENTICATED,
                         "no challenge is out on this connection: Hello without an answer first");
  /* an unknown tenant is refused exactly as a wrong answer, after the same work */
  bool known = auth_file_secret(a, tenant, secret, &slen);
  if (!known) {
    memset(secret, 0, sizeof secret);
    slen = HELLO_SECRET_MIN_BYTES;
  }
  /* on TLS, the answer must be bound to this very connection (hello_mac.h) */
  uint8_t binding[HELLO_BINDING_BYTES];
  bool bound = false;
  tport_err e;
  int rc = transport_tls_pipe_binding((nng_pipe){.id = c->pipe}, binding, &bound, &e);
  /* the local secret on plain tcp: bound to the address the client reached */
  if (!rc && !bound && c->srv->local)
    rc = transport_local_binding((nng_pipe){.id = c->pipe}, true, binding, &bound, &e);
  if (!rc)
    rc = transport_hello_mac(secret, slen, challenge, tenant, bound ? binding : NULL, want, &e);
  OPENSSL_cleanse(secret, sizeof secret);
  OPENSSL_cleanse(binding, sizeof binding);
  if (rc)
    return tport_err_set(&c->err, rc, "%s", e.msg);
  bool ok = len == HELLO_MAC_BYTES && transport_hello_mac_equal(answer, want) && known;
  if (ok)
    return TPORT_OK;
  if (c->srv->local)
    return tport_err_set(&c->err, TPORT_UNAUTHENTICATED,
                         "tenant '%.64s' was not authenticated: wrong local secret (only the "
                         "user who runs tportd holds it; %s names the file a client reads)",
                         tenant, LOCAL_SECRET_ENV);
  return tport_err_set(&c->err, TPORT_UNAUTHENTICATED,
                       "tenant '%.64s' was not authenticated: unknown tenant or wrong secret",
                       tenant);
}

/* The tenant a Hello is for: the one it names ("default" when none) or,
 * over mutual TLS, the one its verified client certificate names
 * (*by_cert; *tenant then points into *tp). */
static int hello_tenant(call *c, const Tport__HelloRequest *q, transport_tls_peer *tp,
                        const char **out, bool *out_by_cert)
{
  server *s = c->srv;
  const char *tenant = q->tenant && *q->tenant ? q->tenant : "default";
  if (strlen(tenant) >= REG_TENANT_MAX)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT, "tenant is longer than %d bytes",
                         REG_TENANT_MAX - 1);
  /* names go into logs and metrics: no control characters */
  for (const unsigned char *p = (const unsigned char *)tenant; *p; p++)
    if (*p < 0x20 || *p == 0x7f)
      return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                           "tenant has a control character (0x%02x)", *p);
  /* mutual TLS: a verified client certificate names the tenant */
  tport_err terr;
  bool by_cert = s->mtls && transport_tls_pipe_peer((nng_pipe){.id = c->pipe}, tp, &terr) == 0 &&
                 tp->verified && tp->cn[0];
  if (by_cert) {
    bool named = q->tenant && *q->tenant && strcmp(q->tenant, "default") != 0;
    if (named && strcmp(q->tenant, tp->cn) != 0)
      return tport_err_set(&c->err, TPORT_PERMISSION_DENIED,
                           "the client certificate names tenant '%.64s', the Hello '%.64s'",
                           tp->cn, q->tenant);
    if (strlen(tp->cn) >= REG_TENANT_MAX)
      return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                           "the certificate's CN is longer than %d bytes", REG_TENANT_MAX - 1);
    for (const unsigned char *p = (const unsigned char *)tp->cn; *p; p++)
      if (*p < 0x20 || *p == 0x7f)
        return tport_err_set(&c->err, TPORT_PERMISSION_DENIED,
                             "the certificate's CN has a control character (0x%02x)", *p);
    tenant = tp->cn;
  }
  *out = tenant;
  *out_by_cert = by_cert;
  return TPORT_OK;
}

/* A Hello's answer to its connection's challenge, checked: a failure
 * counts against the peer's address and is logged; a success makes the
 * connection the tenant's, logged with the tenant's /metrics label. */
static int hello_answer(call *c, const Tport__HelloRequest *q, auth_file *a, const char *tenant,
                        const char *peer, int64_t now)
{
  server *s = c->srv;
  int rc = check_answer(c, a, tenant, q->auth_response.data, q->auth_response.len);
  char conn[16];
  snprintf(conn, sizeof conn, "%u", c->pipe);
  if (rc) {
    if (s->limiter)
      auth_limiter_fail(s->limiter, peer, now);

    log_event(LOG_WARN, "authentication failed", "tenant", tenant, "peer", peer, "connection",
              conn, "code", tport_status_name(rc), NULL);
  } else {
    rc = reg_session_authenticate(&s->reg, c->pipe, tenant, &c->err);
    /* the operator's key from a /metrics series to its tenant */
    char label[METRICS_TENANT_LABEL_HEX + 1] = "";
    if (!rc && s->cfg.metrics_tenants == METRICS_TENANTS_HASH)
      metrics_tenant_label(s->metrics_key, tenant, label);
    if (!rc)
      log_event(LOG_INFO, "connection authenticated", "tenant", tenant, "peer", peer,
                "connection", conn, label[0] ? "metrics_tenant" : NULL, label, NULL);
  }
  return rc;
}

int h_hello(call *c)
{
  Tport__HelloRequest *q = (Tport__HelloRequest *)c->req;
  server *s = c->srv;
  if (q->protocol_version != PROTOCOL_VERSION)
    return tport_err_set(&c->err, TPORT_FAILED_PRECONDITION,
                         "protocol_version %u: this server speaks %d", q->protocol_version,
                         PROTOCOL_VERSION);
  const char *tenant;
  bool by_cert;
  transport_tls_peer tp;
  int rc = hello_tenant(c, q, &tp, &tenant, &by_cert);
  if (rc)
    return rc;
  auth_file *a = server_auth(s);
  if (!a || (by_cert && q->auth_response.len == 0)) {
    /* no secrets (or the certificate speaks alone): a claimed tenant is
     * taken only where no proof is required at all */
    auth_file_release(a);
    if (s->authn && !by_cert)
      return tport_err_set(&c->err, TPORT_UNAUTHENTICATED,
                           "this server requires a client certificate (tls+tcp://) to prove "
                           "the tenant");
    /* an operator sees every tenant's figures: never on a claim */
    if (!by_cert && is_operator(s, tenant))
      return tport_err_set(&c->err, TPORT_PERMISSION_DENIED,
                           "tenant '%.64s' is an operator (--admin): it must prove itself, and "
                           "this server takes claims (--local-secret off, no --auth-file)",
                           tenant);
    rc = reg_session_authenticate(&s->reg, c->pipe, tenant, &c->err);
    return rc ? rc : hello_reply(c, TPORT_OK, NULL, NULL);
  }
  char peer[64];
  server_peer_address(c->pipe, peer, sizeof peer);
  int64_t now = reg_now_ms();
  if (reg_session_authenticated(&s->reg, c->pipe)) {
    /* proved already: the same tenant again is fine, another is not */
    rc = reg_session_authenticate(&s->reg, c->pipe, tenant, &c->err);
  } else if (s->limiter && !auth_limiter_allows(s->limiter, peer, now)) {
    /* (no limiter for the local secret: its 256 random bits are not
     * guessed, and every local client shares one address, which a limiter
     * would let any local user lock the server's own user out of) */
    rc = tport_err_set(&c->err, TPORT_UNAUTHENTICATED,
                       "too many failed attempts from %s: try again in a minute", peer);
  } else if (q->auth_response.len == 0) {
    /* the first Hello: a fresh challenge for this connection */
    uint8_t challenge[REG_CHALLENGE_BYTES];
    rc = reg_session_challenge(&s->reg, c->pipe, challenge, &c->err);
    auth_file_release(a);
    return rc ? rc
              : hello_reply(c, TPORT_UNAUTHENTICATED,
                            s->local ? "authentication required: answer the challenge with "
                                       "HMAC-SHA256 of the local secret of the user who runs "
                                       "tportd (libtport reads it by itself for a local URL)"
                                     : "authentication required: answer the challenge with "
                                       "HMAC-SHA256 of the tenant's secret",
                            challenge);
  } else {
    rc = hello_answer(c, q, a, tenant, peer, now);
  }
  auth_file_release(a);
  return rc ? rc : hello_reply(c, TPORT_OK, NULL, NULL);
}

/* True when the tenant is one of --admin's. */
static bool is_operator(const server *s, const char *tenant)
{
  const char *list = s->cfg.admin;
  size_t n = strlen(tenant);
  while (list && *list) {
    const char *end = strchr(list, ',');
    size_t len = end ? (size_t)(end - list) : strlen(list);
    if (len == n && strncmp(list, tenant, n) == 0)
      return true;
    list = end ? end + 1 : NULL;
  }
  return false;
}

int h_devices(call *c)
{
  char tenant[REG_TENANT_MAX];
  bool op = reg_session_tenant(&c->srv->reg, c->pipe, tenant, sizeof tenant) &&
            is_operator(c->srv, tenant);
  enum { MAXDEV = 64 };
  Tport__DeviceInfo infos[MAXDEV], *ptrs[MAXDEV];
  char names[MAXDEV][32];
  char peers[MAXDEV][MAXDEV][32];
  char *peer_ptrs[MAXDEV][MAXDEV];
  engine_device_info devs[MAXDEV];
  size_t n = engine_devices(devs, MAXDEV);
  for (size_t i = 0; i < n; i++) {
    const engine_device_info *d = &devs[i];
    tport__device_info__init(&infos[i]);
    infos[i].device = (char *)device_format(d->device, names[i], sizeof names[i]);
    infos[i].name = (char *)d->name;
    infos[i].compute_capability = (char *)d->compute_capability;
    /* what is free tells of other tenants' use: the operator's to see */
    infos[i].free_bytes = op ? d->free_bytes : 0;
    infos[i].free_hidden = !op;
    infos[i].total_bytes = d->total_bytes;
    infos[i].managed_memory = d->managed_memory;
    for (int p = 0; p < d->npeers; p++) {
      device_format((tport_device){d->device.type, d->peers[p]}, peers[i][p], sizeof peers[i][p]);
      peer_ptrs[i][p] = peers[i][p];
    }
    infos[i].n_peer_access = (size_t)d->npeers;
    infos[i].peer_access = peer_ptrs[i];
    ptrs[i] = &infos[i];
  }
  Tport__DevicesReply r = TPORT__DEVICES_REPLY__INIT;
  r.status = wire_ok();
  r.n_devices = n;
  r.devices = ptrs;
  r.cuda_unavailable_reason = (char *)engine_cuda_unavailable_reason();
  return call_reply(c, &r.base, NULL, 0);
}

/* The counters of a Stats reply, as they are added. */
enum { STATS_MAX_COUNTERS = 128 };
typedef struct stats_counters {
  Tport__Counter counters[STATS_MAX_COUNTERS], *ptrs[STATS_MAX_COUNTERS];
  char names[STATS_MAX_COUNTERS][48];
  size_t n;
} stats_counters;

static void counter_add(stats_counters *sc, const char *label, int64_t v)
{
  if (sc->n >= STATS_MAX_COUNTERS)
    return;
  size_t n = sc->n++;
  tport__counter__init(&sc->counters[n]);
  snprintf(sc->names[n], sizeof sc->names[n], "%.47s", label);
  sc->counters[n].name = sc->names[n];
  sc->counters[n].value = v;
  sc->ptrs[n] = &sc->counters[n];
}

/* The engine's pinned pools and caches, each under its own prefix, and its
 * backends' counters: what /metrics shows too, from the same collector. */
static void engine_counters(stats_counters *sc)
{
  engine_stats es;
  engine_get_stats(&es);
  const struct {
    const char *prefix, *what;
    uint64_t v;
  } f[] = {{"staging", "hits", es.staging.hits},
           {"staging", "misses", es.staging.misses},
           {"staging", "waits", es.staging.waits},
           {"staging", "bytes_in_use", es.staging.bytes_in_use},
           {"staging", "bytes_cached", es.staging.bytes_cached},
           {"staging", "bytes_allocated", es.staging.bytes_allocated},
           {"readback", "hits", es.readback.hits},
           {"readback", "misses", es.readback.misses},
           {"readback", "waits", es.readback.waits},
           {"readback", "bytes_in_use", es.readback.bytes_in_use},
           {"readback", "bytes_cached", es.readback.bytes_cached},
           {"readback", "bytes_allocated", es.readback.bytes_allocated},
           {"host_cache", "hits", es.host_cache.hits},
           {"host_cache", "misses", es.host_cache.misses},
           {"host_cache", "bytes_cached", es.host_cache.cached_bytes},
           {"host_cache", "bytes_in_use", es.host_cache.in_use_bytes},
           {"host_cache", "bytes_limit", es.host_cache.limit_bytes},
           {"small_cache", "hits", es.small_cache.hits},
           {"small_cache", "misses", es.small_cache.misses},
           {"small_cache", "bytes_cached", es.small_cache.cached_bytes},
           {"small_cache", "bytes_in_use", es.small_cache.in_use_bytes},
           {"small_cache", "bytes_limit", es.small_cache.limit_bytes},
           {"pinned_cache", "hits", es.pinned_cache.hits},
           {"pinned_cache", "misses", es.pinned_cache.misses},
           {"pinned_cache", "bytes_cached", es.pinned_cache.cached_bytes},
           {"pinned_cache", "bytes_in_use", es.pinned_cache.in_use_bytes},
           {"pinned_cache", "bytes_limit", es.pinned_cache.limit_bytes}};
  for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
    char label[48];
    snprintf(label, sizeof label, "%s_%s", f[i].prefix, f[i].what);
    counter_add(sc, label, (int64_t)f[i].v);
  }
  counter_add(sc, "deferred_frees", es.deferred_frees);
  for (size_t i = 0; i < es.ncounters; i++)
    counter_add(sc, es.counters[i].name, es.counters[i].value);
}

int h_stats(call *c)
{
  server *s = c->srv;
  char tenant[REG_TENANT_MAX];
  if (!reg_session_tenant(&s->reg, c->pipe, tenant, sizeof tenant))
    return tport_err_set(&c->err, TPORT_ABORTED, "the connection is closing");
  bool op = is_operator(s, tenant);
  stats_counters sc = {.n = 0};
#define COUNTER(label, v) counter_add(&sc, (label), (int64_t)(v))
  /* a tenant sees its own; the operator sees the server's */
  reg_stats rs;
  if (op)
    reg_counts(&s->reg, &rs);
  else
    reg_tenant_counts(&s->reg, c->pipe, &rs);
  COUNTER("tensors", rs.tensors);
  COUNTER("uploads_in_progress", rs.uploads);
  COUNTER("tensor_bytes", rs.bytes);
  COUNTER("waiting_for_names", rs.waiters);
  COUNTER("quota_bytes", s->cfg.tenant_quota_bytes);
  COUNTER("max_tensors", s->cfg.max_tensors);
  COUNTER("max_tensor_bytes", s->cfg.max_tensor_bytes);
  if (!op)
    goto done;
  COUNTER("sessions", rs.sessions);
  COUNTER("tenants", rs.tenants);
  COUNTER("transfers_in_progress", transfers_count(&s->xfers));
  COUNTER("connections_dropped", atomic_load(&s->dropped));
  COUNTER("connections_refused", atomic_load(&s->refused_connections));
  COUNTER("requests_refused", atomic_load(&s->refused_requests));
  server_queue_stats qs;
  server_queue_stats_get(s, &qs);
  COUNTER("contexts", qs.contexts);
  COUNTER("requests_queued", qs.queued);
  COUNTER("request_bytes", qs.request_bytes);
  shm_stats ss;
  shm_get_stats(s->shm, &ss);
  COUNTER("shm_regions", ss.regions);
  COUNTER("shm_region_bytes", ss.bytes);
  COUNTER("shm_handoffs", ss.handoffs_ok);
  COUNTER("shm_handoffs_refused", ss.handoffs_refused);
  COUNTER("cuda_ipc_regions", ss.ipc_regions);
  COUNTER("cuda_ipc_opens", ss.ipc_opens);
  COUNTER("cuda_ipc_refused", ss.ipc_refused);
  COUNTER("shm_transfers", ss.transfers);
  COUNTER("shm_process_regions", ss.process_regions);
  COUNTER("shm_process_reads", ss.process_reads);
  COUNTER("shm_process_bytes", ss.process_bytes);
  COUNTER("shm_process_writes", ss.process_writes);
  COUNTER("shm_process_written", ss.process_written);
  COUNTER("shm_process_reading", ss.process_reading);
  COUNTER("shm_process_stuck", ss.process_stuck);
  COUNTER("bytes_in", atomic_load(&s->bytes_in));
  COUNTER("bytes_out", atomic_load(&s->bytes_out));
  COUNTER("bytes_lent", atomic_load(&s->bytes_lent));
  COUNTER("errors", atomic_load(&s->errors));
  COUNTER("uptime_ms", reg_now_ms() - s->started_ms);
  engine_counters(&sc);
  for (uint16_t m = 1; m < SERVER_METHODS; m++) {
    char label[48];
    snprintf(label, sizeof label, "requests_%s", frame_method(m)->name);
    COUNTER(label, atomic_load(&s->requests[m]));
  }
done:;
#undef COUNTER
  Tport__StatsReply r = TPORT__STATS_REPLY__INIT;
  r.status = wire_ok();
  r.n_counters = sc.n;
  r.counters = sc.ptrs;
  return call_reply(c, &r.base, NULL, 0);
}
