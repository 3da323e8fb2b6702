/*
 * client.c: libtport's connection (see include/tport.h): tport_connect
 * dials, says the Hello (session.c) and learns the server's limits;
 * tport_close closes the socket and lets go of what the paths kept
 * (regions, the staging ring, CUDA IPC registrations).
 *
 * One REQ socket per client with resend off (chunk requests are idempotent
 * on the server, and a resend of a big chunk would only add load); each call
 * opens its own nng context, so calls from many threads run side by side.
 * Puts and gets keep a window of chunk requests in flight.
 */
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "client_internal.h"
#include "cuda_ipc.h"
#include "cuda_stage.h"
#include "env.h"
#include "lent_bytes.h"
#include "scheme_probe.h"
#include "tls_openssl.h"
#include "dtype.h"

const char *tport_strerror(int code)
{
  return tport_status_name(code);
}

/* The reason a dial failed, with what TLS knows of it. */
static void tport_tls_failure(const char *url, int rv, tport_err *err)
{
  if (strncasecmp(url, "tls+", 4) == 0) {
    transport_tls_stats st;
    transport_tls_stats_get(&st);
    if (st.last_client_failure[0]) {
      tport_err_set(err, TPORT_UNAVAILABLE, "cannot connect to %s: %s (%s)", url, nng_strerror(rv),
                    st.last_client_failure);
      return;
    }
  }
  tport_err_set(err, TPORT_UNAVAILABLE, "cannot connect to %s: %s", url, nng_strerror(rv));
}

/* Something listens at url but the handshake failed: when it speaks HTTP,
 * TLS or plain tensorport where the URL says otherwise, the error says so
 * (scheme_probe.c).  Nothing listening (refused) needs no probe. */
static void add_scheme_hint(const char *url, int rv, tport_err *err)
{
  if (rv == NNG_ECONNREFUSED || rv == NNG_EADDRINVAL || rv == NNG_ENOTSUP || !err)
    return;
  char hint[200];
  scheme_probe_hint(url, hint, sizeof hint);
  if (!hint[0])
    return;
  char was[sizeof err->msg];
  snprintf(was, sizeof was, "%s", err->msg);
  tport_err_set(err, err->code, "%s: %s", hint, was);
}

/* Dials url (synchronously), over TLS for tls+tcp:// URLs. */
static int dial(tport_client *c, const char *url, const tport_connect_options *opts, tport_err *err)
{
  nng_tls_config *cfg = NULL;
  if (strncasecmp(url, "tls+", 4) == 0) {
    /* first: it registers the OpenSSL engine, which a dialer binds when made */
    transport_tls_client_opts to = {.ca_file = opts ? opts->tls_ca : NULL,
                                    .cert_file = opts ? opts->tls_cert : NULL,
                                    .key_file = opts ? opts->tls_key : NULL,
                                    .server_name = opts ? opts->tls_server_name : NULL};
    int rc = transport_tls_client_config(&to, url, &cfg, err);
    if (rc)
      return rc;
  }
  nng_dialer d;
  int rv = nng_dialer_create(&d, c->sock, url);
  if (!rv && cfg)
    rv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, cfg);
  if (cfg)
    nng_tls_config_free(cfg); /* the dialer holds its own */
  if (rv) {
    nng_dialer_close(d);
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "cannot dial %s: %s", url, nng_strerror(rv));
  }
  if ((rv = nng_dialer_start(d, 0)) != 0) {
    nng_dialer_close(d);
    tport_tls_failure(url, rv, err);
    add_scheme_hint(url, rv, err);
    return TPORT_UNAVAILABLE;
  }
  return TPORT_OK;
}

/* Closes the client's socket and returns once nng has destroyed what hung
 * from it: a tls+tcp:// dialer's configuration is freed on nng's reaper
 * thread after nng_close returns, and a program that exits right after
 * tport_close (or a failed tport_connect) had OpenSSL's exit handlers tear
 * OpenSSL down under that SSL_CTX_free (`tport` crashed in about 1 exit in
 * 80 after a refused TLS handshake). */
static void close_socket(nng_socket sock)
{
  nng_close(sock);
#ifdef TPORT_NNG_REAP_DRAIN
  nng_reap_drain();
#endif
}

/* Keeps live_pipe: the dialer's one connection, replaced when it redials. */
static void pipe_event(nng_pipe p, nng_pipe_ev ev, void *arg)
{
  tport_client *c = arg;
  unsigned id = (unsigned)nng_pipe_id(p);
  if (ev == NNG_PIPE_EV_ADD_POST) {
    atomic_store(&c->live_pipe, id);
  } else {
    unsigned was = id; /* a new connection may have come first */
    atomic_compare_exchange_strong(&c->live_pipe, &was, 0);
  }
}

int tport_connect(const char *url, const tport_connect_options *opts, tport_client **out,
                  tport_err *err)
{
  /* a variable set wrong is refused before anything else, not taken for
   * its default */
  int erc = client_env_check(err);
  if (erc)
    return erc;
  tport_client *c = calloc(1, sizeof *c);
  if (!c)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  atomic_init(&c->server_uid, (uid_t)-1); /* until a Hello on ipc:// says */
  c->timeout_ms = opts && opts->timeout_ms > 0 ? opts->timeout_ms : 60000;
  c->keep = opts && opts->keep;
  c->verify = opts && opts->verify;
#ifdef TPORT_NNG_LENT_TAIL
  /* tcp and ipc write a request's lent bytes straight from the caller's
   * memory; any other transport would copy them anyway */
  c->lend_chunks = transport_url_sends_lent_bytes(url);
#endif
  atomic_init(&c->live_pipe, 0);
  atomic_init(&c->hello_pipe, 0);
  pthread_mutex_init(&c->hello_mu, NULL);
  pthread_mutex_init(&c->slots_mu, NULL);
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  pthread_mutex_init(&c->shm_mu, NULL);
  atomic_init(&c->shm_auto, false);
  pthread_mutex_init(&c->regions_mu, NULL);
  pthread_mutex_init(&c->stage_mu, NULL);
  pthread_mutex_init(&c->ipc_mu, NULL);
  c->credits = 1; /* the Hello */
  if (client_pool_init(c, err)) {
    free(c);
    return TPORT_RESOURCE_EXHAUSTED;
  }
  int rv = nng_req0_open(&c->sock);
  if (rv) {
    client_pool_join(c);
    free(c);
    return tport_err_set(err, TPORT_INTERNAL, "nng_req0_open: %s", nng_strerror(rv));
  }
  nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
  /* nng_close returns only after every pipe's last event: c outlives them */
  nng_pipe_notify(c->sock, NNG_PIPE_EV_ADD_POST, pipe_event, c);
  nng_pipe_notify(c->sock, NNG_PIPE_EV_REM_POST, pipe_event, c);
  nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, (size_t)1 << 30);
  int trc = dial(c, url, opts, err);
  if (trc) {
    close_socket(c->sock);
    client_pool_join(c);
    free(c);
    return trc;
  }
  c->url = strdup(url);
  c->tenant = strdup(opts && opts->tenant ? opts->tenant : "default");
  c->secret = opts && opts->secret ? strdup(opts->secret) : NULL;
  c->secret_file = opts && opts->secret_file ? strdup(opts->secret_file) : NULL;
  Tport__HelloReply *r = NULL;
  int rc = !c->url || !c->tenant || (opts && opts->secret && !c->secret) ||
                   (opts && opts->secret_file && !c->secret_file)
               ? tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory")
               : client_say_hello(c, &r, err);
  if (rc) {
    close_socket(c->sock);
    client_pool_join(c);
    client_session_forget(c);
    free(c);
    return rc;
  }
  c->chunk_bytes = r->max_chunk_bytes ? r->max_chunk_bytes : (4u << 20);
  /* same host: the server offers regions (a socket named), and this URL
   * reaches it locally */
  if (r->shm_socket && r->shm_socket[0] && strlen(r->shm_socket) < sizeof c->shm_socket &&
      client_url_is_local(url)) {
    bool shm = true, ipc = true; /* tport_connect has checked them (env.c) */
    client_env_flag("TPORT_SHM", true, &shm, NULL);
    client_env_flag("TPORT_CUDA_IPC", true, &ipc, NULL);
    snprintf(c->shm_socket, sizeof c->shm_socket, "%s", r->shm_socket);
    atomic_store(&c->shm_auto, !(opts && opts->no_shm) && shm);
    c->cuda_ipc = atomic_load(&c->shm_auto) && ipc;
  }
  client_process_init(c, url, r->process_regions);
  c->window = r->max_inflight_chunks ? (int)r->max_inflight_chunks : 4;
  if (c->window > CLIENT_MAX_WINDOW)
    c->window = CLIENT_MAX_WINDOW;
  /* a server that does not say gets what this library kept to before */
  int most = r->max_outstanding ? (int)r->max_outstanding : 32;
  if (c->window > most)
    c->window = most;
  pthread_mutex_lock(&c->mu);
  c->credits = most;
  pthread_mutex_unlock(&c->mu);
  protobuf_c_message_free_unpacked(&r->base, NULL);
  *out = c;
  return TPORT_OK;
}

void tport_close(tport_client *c)
{
  if (!c)
    return;
  /* requests in flight: none new, the queued ones cancelled, the running
   * ones' waits ended (their slots aborted, no new one opened); then their
   * threads, and only then the socket: nng 1.5.2 panics on a context
   * closed while its socket closes (stress_async, 1 run in 10 on a loaded
   * machine) */
  client_pool_stop(c);
  client_slots_abort(c);
  client_pool_join(c);
  close_socket(c->sock); /* the reap drained once no thread uses nng */
  client_shm_close(c);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->shm_mu);
  pthread_mutex_destroy(&c->proc_mu);
  pthread_mutex_destroy(&c->regions_mu);
  stage_destroy(c->stage);
  pthread_mutex_destroy(&c->stage_mu);
  client_ipc_destroy(c->ipc);
  pthread_mutex_destroy(&c->ipc_mu);
  pthread_mutex_destroy(&c->hello_mu);
  pthread_mutex_destroy(&c->slots_mu);
  client_session_forget(c);
  free(c);
}
