/*
 * server.c: the server's life: started in steps (its state, the endpoint,
 * the devices, the proof it asks, the socket, the workers and the reaper,
 * the contexts, the regions, the listeners), the reaper's rounds, and the
 * stop.  What runs while it serves lives beside it: connections.c (pipe
 * events), contexts.c (each request slot's state machine), workers.c (the
 * pool that runs handlers through dispatch.c).
 */
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <openssl/rand.h>
#include <arpa/inet.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "idle_trim.h"
#include "listen_url.h"
#include "log.h"
#include "server_internal.h"
#include "tls_openssl.h"

/* ---------------------------------------------------------------- reaper */

/* What the server did, as one number that changes whenever it does
 * something (idle_trim.h): requests, tensors and bytes held, sessions. */
static uint64_t activity(server *s)
{
  uint64_t a = 0;
  for (int m = 0; m < SERVER_METHODS; m++)
    a += atomic_load(&s->requests[m]);
  reg_stats st;
  reg_counts(&s->reg, &st);
  a = a * 1000003u + st.tensors;
  a = a * 1000003u + st.bytes;
  return a * 1000003u + st.sessions;
}

static void *reaper_main(void *arg)
{
  prctl(PR_SET_NAME, "tportd:reaper"); /* what top -H, perf and gdb show */
  server *s = arg;
  idle_trim trim = {0};
  pthread_mutex_lock(&s->rmu);
  while (!s->reaper_stop) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 1;
    pthread_cond_timedwait(&s->rcv, &s->rmu, &ts);
    if (s->reaper_stop)
      break;
    pthread_mutex_unlock(&s->rmu);
    int n = reg_expire(&s->reg, reg_now_ms());
    if (n)
      log_msg(LOG_INFO, "%d tensor%s expired", n, n == 1 ? "" : "s");
    n = transfers_expire(&s->xfers, transfers_now_ms(), (int64_t)s->cfg.transfer_timeout_ms);
    if (n)
      log_msg(LOG_INFO, "%d get%s not read for %lu ms ended", n, n == 1 ? "" : "s",
              s->cfg.transfer_timeout_ms);
    if (s->authn) {
      /* a connection that does not prove its tenant in time costs only
       * that time, however many there are: an unauthenticated flood holds
       * bounded memory (batches of 256 until none is left: once, 256 a
       * second were all that went) */
      uint32_t ids[256];
      size_t k, total = 0;
      do {
        k = reg_unproved_sessions(&s->reg, (int64_t)s->cfg.auth_timeout_ms, ids,
                                  256);
        for (size_t i = 0; i < k; i++, total++)
          server_drop_pipe_logged(s, (nng_pipe){.id = ids[i]},
                                  "it did not prove its tenant in time", total < 16);
      } while (k == 256);
      if (total > 16)
        log_msg(LOG_WARN, "%zu connections dropped: they did not prove their tenant in time "
                          "(the first 16 are logged)",
                total);
    }
    if (s->lends) {
      /* a lent reply its connection has not taken within the send timeout
       * (lends.h): REP's own send timeout never sees it */
      uint32_t ids[256];
      size_t k = lends_overdue(s->lends, lends_now_ms() - (int64_t)s->cfg.send_timeout_ms, ids,
                               256);
      for (size_t i = 0; i < k; i++)
        server_drop_pipe(s, (nng_pipe){.id = ids[i]}, "it does not read its replies");
    }
    storage_reap(false);
    if (idle_trim_round(&trim, activity(s)))
      log_msg(LOG_DEBUG, "idle: the heap's free memory given back to the system");
    pthread_mutex_lock(&s->rmu);
  }
  pthread_mutex_unlock(&s->rmu);
  return NULL;
}

/* ---------------------------------------------------------------- devices */

/* The engine: its devices (--devices), its kernel cache and how many freed
 * host blocks it keeps (--host-cache). */
static int configure_engine(const server_config *cfg, tport_err *err)
{
  engine_options o = {.kernel_cache = cfg->kernel_cache,
                      .host_cache_set = cfg->host_cache_set,
                      .host_cache_bytes = cfg->host_cache_bytes};
  tport_err warning;
  int rc = engine_configure(cfg->devices, &o, &warning, err);
  if (!rc && warning.code)
    log_msg(LOG_WARN, "--kernel-cache: %s", warning.msg);
  return rc;
}

/* ---------------------------------------------------------------- lifecycle */

void (*server_test_before_ready)(server *s);

static char *http_metrics(void *arg, size_t *len)
{
  return metrics_render(arg, len);
}

static bool http_ready(void *arg)
{
  server *s = arg;
  return atomic_load(&s->ready);
}

/* The server's state, before anything starts: its copy of the
 * configuration (without what stays the caller's), locks, the registry and
 * the counters.  NULL: out of memory. */
static server *server_new(const server_config *cfg)
{
  server *s = calloc(1, sizeof *s);
  if (!s)
    return NULL;
  s->cfg = *cfg;
  s->cfg.kernel_cache = NULL; /* the caller's; the backend keeps its own copy */
  s->cfg.devices = NULL;
  s->cfg.admin = cfg->admin ? strdup(cfg->admin) : NULL;
  for (int i = 0; i < CONFIG_MAX_LISTEN; i++)
    s->cfg.listen[i] = NULL;
  s->cfg.http_listen = NULL; /* the caller's */
  s->started_ms = reg_now_ms();
  s->lends = lends_new(); /* NULL (out of memory): replies copy their bytes */
  metrics_init(&s->metrics);
  atomic_init(&s->ready, false);
  atomic_init(&s->devices_up, false);
  atomic_init(&s->draining, false);
  log_set_level(cfg->log_level);
  log_set_format((log_format)cfg->log_format);
  pthread_mutex_init(&s->qmu, NULL);
  pthread_cond_init(&s->qcv, NULL);
  pthread_cond_init(&s->idle, NULL);
  pthread_mutex_init(&s->rmu, NULL);
  pthread_cond_init(&s->rcv, NULL);
  pthread_mutex_init(&s->amu, NULL);
  s->cfg.auth_file = cfg->auth_file ? strdup(cfg->auth_file) : NULL;
  s->cfg.local_secret = NULL; /* the caller's: read once, here */
  reg_limits lim = {.max_tensor_bytes = cfg->max_tensor_bytes,
                    .tenant_quota_bytes = cfg->tenant_quota_bytes,
                    .max_tensors = cfg->max_tensors,
                    .max_inflight_chunks = cfg->max_inflight_chunks,
                    .max_outstanding = cfg->max_outstanding,
                    .max_transfers = cfg->max_transfers,
                    .default_ttl_ms = (uint64_t)cfg->ttl_s * 1000,
                    .max_ttl_ms = (uint64_t)cfg->max_ttl_s * 1000};
  reg_init(&s->reg, &lim);
  transfers_init(&s->xfers, &s->reg);
  s->mtls = cfg->tls_ca != NULL;
  s->authn = cfg->auth_file || cfg->tls_ca;
  return s;
}

/* The key of --metrics-tenants hash, then the endpoint: it comes first, so
 * that /healthz answers (and /readyz says 503) while the devices and
 * listeners come up, and a port taken is said at once. */
static int start_endpoint(server *s, const server_config *cfg, tport_err *err)
{
  /* the key of --metrics-tenants hash: this server's alone */
  int rc = RAND_bytes(s->metrics_key, sizeof s->metrics_key) == 1
               ? TPORT_OK
               : tport_err_set(err, TPORT_INTERNAL, "RAND_bytes failed (the metrics key)");
  if (!rc && cfg->http_listen) {
    http_routes routes = {.metrics = http_metrics, .ready = http_ready, .arg = s};
    rc = http_start(cfg->http_listen, &routes, &s->http, err);
    if (!rc)
      log_event(LOG_INFO, "metrics and health endpoint listening", "address", cfg->http_listen,
                NULL);
  }
  return rc;
}

/* The devices: the engine configured (its backends, the host cache's
 * limit, CUDA's kernel cache), the read-back budget of one tenant. */
static int start_devices(server *s, const server_config *cfg, tport_err *err)
{
  int rc = configure_engine(cfg, err);
  if (!rc)
    atomic_store(&s->devices_up, true);
  /* One tenant's replies not yet sent hold all of the read-back pool but
   * its largest block (and no more than its quota): a tenant that stops
   * reading cannot make another's gets from a device wait for its send
   * timeout, and one get's window of the largest chunks still fits.  Set
   * before any connection can be. */
  if (!rc) {
    size_t budget = engine_readback_budget();
    s->reg.limits.max_readback_bytes =
        budget > 2 * READER_MAX_CHUNK ? budget - READER_MAX_CHUNK : budget / 2;
  }
  return rc;
}

/* The listeners' URLs (config_check has read them) into lu and, when one
 * of them is tls+tcp://, the TLS configuration they share (*tls, else
 * NULL). */
static int read_listen_urls(const server_config *cfg, listen_url *lu, nng_tls_config **tls,
                            tport_err *err)
{
  int rc = TPORT_OK;
  bool any_tls = false;
  for (int i = 0; i < cfg->nlisten && !rc; i++) /* config_check has read them */
    if (!(rc = listen_url_parse(cfg->listen[i], &lu[i], err)))
      any_tls = any_tls || lu[i].encrypted;
  if (!rc && any_tls) {
    transport_tls_server_opts to = {.cert_file = cfg->tls_cert,
                                    .key_file = cfg->tls_key,
                                    .client_ca_file = cfg->tls_ca,
                                    .allow_tls12 = cfg->tls12};
    rc = transport_tls_server_config(&to, tls, err);
  }
  return rc;
}

/* The REP socket, with the pipe events that open and close sessions. */
static int open_socket(server *s, const server_config *cfg, tport_err *err)
{
  int rv = nng_rep0_open(&s->sock);
  if (rv != 0)
    return tport_err_set(err, TPORT_INTERNAL, "nng_rep0_open: %s", nng_strerror(rv));
  s->max_connections = config_max_connections(cfg);
  s->request_memory = config_request_memory(cfg);
  nng_pipe_notify(s->sock, NNG_PIPE_EV_ADD_PRE, server_pipe_event, s);
  nng_pipe_notify(s->sock, NNG_PIPE_EV_REM_POST, server_pipe_event, s);
  return TPORT_OK;
}

/* A start that failed before the socket opened: what was made is undone
 * (after it, server_stop undoes everything). */
static void free_unstarted(server *s, nng_tls_config *tls)
{
  if (tls)
    nng_tls_config_free(tls);
  http_stop(s->http);
  reg_destroy(&s->reg);
  auth_file_release(s->auth);
  auth_limiter_free(s->limiter);
  lends_free(s->lends, 0);
  free(s->cfg.auth_file);
  free(s->cfg.admin);
  free(s);
}

/* The first --contexts contexts now, so that nng refusing them is said at
 * start; their receives are posted once the listeners are up. */
static int open_contexts(server *s, const server_config *cfg, tport_err *err)
{
  int rc = TPORT_OK;
  pthread_mutex_lock(&s->qmu);
  for (int i = 0; i < cfg->contexts && !rc; i++) {
    srv_ctx *x = ctx_open(s);
    if (!x) {
      rc = tport_err_set(err, TPORT_INTERNAL, "cannot open nng context %d of %d", i + 1,
                         cfg->contexts);
      break;
    }
    x->spare_next = s->spare;
    s->spare = x;
  }
  pthread_mutex_unlock(&s->qmu);
  return rc;
}

/* Same-host regions, before the first connection can arrive (pipe events
 * drop theirs).  Off with a warning when they cannot be offered, unless
 * --shm-socket asked for them. */
static int start_regions(server *s, const server_config *cfg, tport_err *err)
{
  if (!cfg->shm_socket)
    return TPORT_OK;
  shm_config sc = {.path = cfg->shm_socket,
                   .mode = cfg->shm_mode,
                   .quota = cfg->shm_quota,
                   .total_max = cfg->shm_max,
                   .max_regions = (size_t)cfg->shm_max_regions,
                   .max_ipc = cfg->cuda_ipc_max,
                   .token_ms = cfg->shm_token_ms,
                   /* a read of a client's memory may never end (a page it
                    * never lets fault in): one worker is always left */
                   .max_process_reads = cfg->workers > 1 ? (size_t)cfg->workers - 1 : 1};
  tport_err why;
  if (shm_start(&sc, &s->shm, &why) == TPORT_OK) {
    size_t quota, max;
    shm_limits(s->shm, &quota, &max);
    char q[32], m[32];
    snprintf(q, sizeof q, "%zu", quota);
    snprintf(m, sizeof m, "%zu", max);
    log_event(LOG_INFO, "same-host shared memory", "socket", cfg->shm_socket, "quota", q, "max", m,
              NULL);
  } else if (cfg->shm_socket_set)
    return tport_err_set(err, why.code, "--shm-socket: %s", why.msg);
  else
    log_msg(LOG_WARN, "same-host shared memory is off: %s (set --shm-socket)", why.msg);
  return TPORT_OK;
}

/* What the safe defaults took for loopback (lu->loopback) is bound to
 * loopback (localhost is a name: listen_url.h); no request is served
 * before this. */
static int check_loopback(nng_listener l, const char *url, tport_err *err)
{
  nng_sockaddr bound;
  int rv = nng_listener_get_addr(l, NNG_OPT_LOCADDR, &bound);
  if (rv == 0 && listen_addr_is_loopback(&bound))
    return TPORT_OK;
  char where[INET6_ADDRSTRLEN + 64] = "an address that is not IP";
  if (rv)
    snprintf(where, sizeof where, "an address nng cannot tell (%s)", nng_strerror(rv));
  else if (bound.s_family == NNG_AF_INET)
    inet_ntop(AF_INET, &bound.s_in.sa_addr, where, sizeof where);
  else if (bound.s_family == NNG_AF_INET6)
    inet_ntop(AF_INET6, bound.s_in6.sa_addr, where, sizeof where);
  return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                       "--listen %s was bound to %s, which is not a loopback address: name "
                       "127.0.0.1 or [::1] instead",
                       url, where);
}

/* Listener i of --listen, started (lu: its URL read; tls: the TLS
 * configuration of an encrypted one).  On an error nothing is left open. */
static int start_listener(server *s, const server_config *cfg, int i, const listen_url *lu,
                          nng_tls_config *tls, tport_err *err)
{
  nng_listener *l = &s->listeners[s->nlisteners];
  int rc, rv;
  if ((rv = nng_listener_create(l, s->sock, cfg->listen[i])) != 0)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "--listen %s: %s", cfg->listen[i],
                         nng_strerror(rv));
  nng_listener_set_size(*l, NNG_OPT_RECVMAXSZ, cfg->max_message_bytes);
  if (lu[i].encrypted && (rv = nng_listener_set_ptr(*l, NNG_OPT_TLS_CONFIG, tls)) != 0)
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "--listen %s: TLS: %s", cfg->listen[i],
                       nng_strerror(rv));
  else if (lu[i].transport == LISTEN_IPC &&
           (rv = nng_listener_set_int(*l, NNG_OPT_IPC_PERMISSIONS, (int)cfg->ipc_mode)) != 0)
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "--listen %s: --ipc-mode: %s", cfg->listen[i],
                       nng_strerror(rv));
  else if ((rv = nng_listener_start(*l, 0)) != 0)
    rc = tport_err_set(err, TPORT_UNAVAILABLE, "cannot listen on %s: %s", cfg->listen[i],
                       nng_strerror(rv));
  else
    rc = lu[i].loopback ? check_loopback(*l, cfg->listen[i], err) : TPORT_OK;
  if (rc) {
    nng_listener_close(*l);
    return rc;
  }
  s->nlisteners++;
  log_event(LOG_INFO, "listening", "url", cfg->listen[i], NULL);
  return TPORT_OK;
}

int server_start(const server_config *cfg, server **out, tport_err *err)
{
  int rc = config_check(cfg, err);
  if (rc)
    return rc;
  server *s = server_new(cfg);
  if (!s)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  nng_tls_config *tls = NULL;
  listen_url lu[CONFIG_MAX_LISTEN];
  rc = start_endpoint(s, cfg, err);
  if (!rc)
    rc = start_devices(s, cfg, err);
  if (!rc)
    rc = read_listen_urls(cfg, lu, &tls, err);
  if (!rc)
    rc = server_auth_start(s, cfg, err);
  if (!rc)
    rc = open_socket(s, cfg, err);
  if (rc) {
    free_unstarted(s, tls);
    return rc;
  }
  /* from here on server_stop undoes what is done (it joins the reaper) */
  rc = workers_start(s, cfg, err);
  pthread_create(&s->reaper, NULL, reaper_main, s);
  if (!rc)
    rc = open_contexts(s, cfg, err);
  if (!rc)
    rc = start_regions(s, cfg, err);
  for (int i = 0; i < cfg->nlisten && !rc; i++)
    rc = start_listener(s, cfg, i, lu, tls, err);
  if (tls)
    nng_tls_config_free(tls); /* each listener holds its own reference */
  if (rc) {
    server_stop(s, 0);
    return rc;
  }
  pthread_mutex_lock(&s->qmu);
  ctx_post_receives(s);
  pthread_mutex_unlock(&s->qmu);
  if (server_test_before_ready)
    server_test_before_ready(s);
  atomic_store(&s->ready, true);
  *out = s;
  return TPORT_OK;
}

void server_stop(server *s, unsigned long grace_ms)
{
  if (!s)
    return;
  /* Not ready from now on: a load balancer drains this server while it
   * finishes its work (the endpoint answers until the grace period ends).
   * New connections are refused (server_pipe_event); the listeners stay open until
   * the grace period ends, because closing an nng listener closes every
   * connection it accepted, and the replies of the requests in flight
   * would be lost with them. */
  atomic_store(&s->ready, false);
  atomic_store(&s->draining, true);
  ctx_wake_parked(s); /* waits end now: answered UNAVAILABLE within the grace */
  pthread_mutex_lock(&s->qmu);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += (time_t)(grace_ms / 1000);
  until.tv_nsec += (long)(grace_ms % 1000) * 1000000;
  if (until.tv_nsec >= 1000000000) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000;
  }
  while (s->busy > 0 && pthread_cond_timedwait(&s->idle, &s->qmu, &until) == 0) {
  }
  if (s->busy > 0)
    log_msg(LOG_WARN, "%d request%s still in flight after %lu ms: aborted", s->busy,
            s->busy == 1 ? "" : "s", grace_ms);
  /* From here no callback re-arms and no worker sends or runs what is
   * queued; then every aio is stopped (pending receives and sends are
   * aborted, callbacks waited for) before the socket closes, so that
   * nng_close has nothing of ours left to wait for. */
  s->stopping = true;
  pthread_cond_broadcast(&s->qcv);
  pthread_mutex_unlock(&s->qmu);
  for (int i = 0; i < s->nlisteners; i++)
    nng_listener_close(s->listeners[i]); /* and the connections they accepted */
  http_stop(s->http); /* no longer serving: /healthz goes too */
  s->http = NULL;
  /* no context is opened from here on (ctx_post_receives sees stopping) */
  for (srv_ctx *x = s->ctxs; x; x = x->all_next) {
    nng_aio_stop(x->aio);
    nng_aio_stop(x->timer);
  }
  for (int i = 0; i < s->nworkers; i++)
    pthread_join(s->workers[i], NULL);
  for (srv_ctx *x = s->ctxs; x; x = x->all_next) {
    nng_msg *m = nng_aio_get_msg(x->aio);
    if (m && x->state == CTX_SEND)
      nng_msg_free(m); /* a reply whose send was aborted */
    nng_aio_set_msg(x->aio, NULL);
  }
  for (srv_ctx *x = s->ctxs; x; x = x->all_next)
    nng_ctx_close(x->ctx);
  nng_close(s->sock);
#ifdef TPORT_NNG_REAP_DRAIN
  /* and what hung from it destroyed (pipes, the listeners' TLS
   * configurations): none of it may run on while the process exits, under
   * OpenSSL's exit handlers */
  nng_reap_drain();
#endif
  while (s->ctxs) {
    srv_ctx *x = s->ctxs;
    s->ctxs = x->all_next;
    reg_unwait(&s->reg, &x->waiter);
    nng_aio_free(x->aio);
    nng_aio_free(x->timer);
    if (x->msg)
      nng_msg_free(x->msg);
    free(x);
  }
  pthread_mutex_lock(&s->rmu);
  s->reaper_stop = true;
  pthread_cond_broadcast(&s->rcv);
  pthread_mutex_unlock(&s->rmu);
  pthread_join(s->reaper, NULL);
  /* the transports free their last replies on nng's threads */
  lends_free(s->lends, 5000);
  transfers_destroy(&s->xfers);
  reg_destroy(&s->reg);
  engine_synchronize_all(); /* frees what lends deferred, too */
  shm_stop(s->shm); /* no request left to hold a region */
  fq_free(s->fq);
  free(s->workers);
  auth_file_release(s->auth);
  auth_limiter_free(s->limiter);
  free(s->cfg.auth_file);
  free(s->cfg.admin);
  free(s);
}
