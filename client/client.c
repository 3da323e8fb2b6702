/*
 * client.c: libtport's connection and its RPCs (see include/tport.h).
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

#include <openssl/crypto.h>

#include "client_internal.h"
#include "cuda_ipc.h"
#include "cuda_stage.h"
#include "hello_mac.h"
#include "lent_bytes.h"
#include "local_secret.h"
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
    return TPORT_UNAVAILABLE;
  }
  return TPORT_OK;
}

/* The local secret of the user who runs the server, for a server that asks
 * for it (local_secret.h): read only for a URL of this host. */
static int local_secret(const char *url, uint8_t *secret, size_t *len, tport_err *err)
{
  if (!transport_local_secret_url_ok(url))
    return tport_err_set(err, TPORT_UNAUTHENTICATED,
                         "the server asks for the local secret of the user who runs it, and %s "
                         "is not a URL of this host (ipc://, inproc://, 127.0.0.1, [::1], "
                         "localhost): refused",
                         url);
  char path[LOCAL_SECRET_PATH_MAX];
  bool off = false;
  int rc = transport_local_secret_default(path, sizeof path, &off, err);
  if (rc)
    return rc;
  if (off)
    return tport_err_set(err, TPORT_UNAUTHENTICATED,
                         "the server asks for the local secret of the user who runs it, and %s "
                         "is off",
                         LOCAL_SECRET_ENV);
  tport_err why;
  rc = transport_local_secret_read(path, secret, len, &why);
  if (rc)
    return tport_err_set(err, TPORT_UNAUTHENTICATED,
                         "only the user who runs the server may connect: %s (tportd logs its "
                         "file: give it in %s)",
                         why.msg, LOCAL_SECRET_ENV);
  return TPORT_OK;
}

/* Fills q->auth_response with the answer to r's challenge (malloc'd). */
static int answer_challenge(tport_client *c, const char *url, const tport_connect_options *opts,
                            Tport__HelloRequest *q, const Tport__HelloReply *r, tport_err *err)
{
  if (r->auth_challenge.len == 0)
    return TPORT_UNAUTHENTICATED; /* refused outright: err holds the server's reason */
  if (r->auth_challenge.len != HELLO_CHALLENGE_BYTES)
    return tport_err_set(err, TPORT_UNAUTHENTICATED, "the server's challenge is %zu bytes, not %d",
                         r->auth_challenge.len, HELLO_CHALLENGE_BYTES);
  uint8_t secret[HELLO_SECRET_MAX_BYTES];
  size_t len = 0;
  int rc;
  /* a server without an auth file knows no tenant's secret: a secret given
   * (TPORT_SECRET_FILE left set for another server, say) means nothing to it */
  if (r->local_secret)
    rc = local_secret(url, secret, &len, err);
  else if (opts && opts->secret)
    rc = transport_hello_secret_parse(opts->secret, secret, &len, err);
  else if (opts && opts->secret_file)
    rc = transport_hello_secret_file(opts->secret_file, secret, &len, err);
  else
    return tport_err_set(err, TPORT_UNAUTHENTICATED,
                         "the server requires authentication: give tenant '%s' its secret "
                         "(--secret-file, TPORT_SECRET_FILE)",
                         q->tenant);
  /* on TLS, bound to the connection the challenge came on (hello_mac.h):
   * the answer is worth nothing on any other, a relay's included */
  uint8_t binding[HELLO_BINDING_BYTES];
  bool bound = false;
  if (!rc)
    rc = transport_tls_pipe_binding(c->reply_pipe, binding, &bound, err);
  /* the local secret on plain tcp: bound to the address this client reached,
   * so that whoever took a port it dials cannot pass the answer on */
  if (!rc && !bound && r->local_secret)
    rc = transport_local_binding(c->reply_pipe, false, binding, &bound, err);
  uint8_t *answer = rc ? NULL : malloc(HELLO_MAC_BYTES);
  if (!rc && !answer)
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  if (!rc)
    rc = transport_hello_mac(secret, len, r->auth_challenge.data, q->tenant,
                             bound ? binding : NULL, answer, err);
  OPENSSL_cleanse(secret, sizeof secret);
  OPENSSL_cleanse(binding, sizeof binding);
  if (rc) {
    free(answer);
    return rc;
  }
  q->auth_response.data = answer;
  q->auth_response.len = HELLO_MAC_BYTES;
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

/* This thread is saying a Hello: its own requests must not say another. */
static _Thread_local bool saying_hello;

static void hello_strings_free(tport_client *c)
{
  if (c->secret)
    OPENSSL_cleanse(c->secret, strlen(c->secret));
  free(c->secret);
  free(c->secret_file);
  free(c->tenant);
  free(c->url);
  c->secret = c->secret_file = c->tenant = c->url = NULL;
}

/* Hello (answering a challenge when the server asks) on the connection of
 * the moment; *out the server's reply (free it).  On success hello_pipe is
 * the connection it was said on. */
static int say_hello(tport_client *c, Tport__HelloReply **out, tport_err *err)
{
  tport_connect_options o = {.tenant = c->tenant, .secret = c->secret,
                             .secret_file = c->secret_file};
  Tport__HelloRequest q = TPORT__HELLO_REQUEST__INIT;
  q.protocol_version = 1;
  q.client = "libtport 0.1.0";
  q.tenant = c->tenant;
  Tport__HelloReply *r = NULL;
  bool was = saying_hello;
  saying_hello = true;
  int rc = client_rpc(c, TPORT__METHOD__METHOD_HELLO, &q.base, NULL, 0,
                      &tport__hello_reply__descriptor, (ProtobufCMessage **)&r, NULL, err);
  if (rc == TPORT_UNAUTHENTICATED && r) {
    /* the server authenticates: answer its challenge with the secret */
    rc = answer_challenge(c, c->url, &o, &q, r, err);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    r = NULL;
    if (!rc)
      rc = client_rpc(c, TPORT__METHOD__METHOD_HELLO, &q.base, NULL, 0,
                      &tport__hello_reply__descriptor, (ProtobufCMessage **)&r, NULL, err);
    OPENSSL_cleanse(q.auth_response.data, q.auth_response.len);
    free(q.auth_response.data);
    if (rc == TPORT_UNAUTHENTICATED && r) {
      protobuf_c_message_free_unpacked(&r->base, NULL); /* a second challenge: refused */
      r = NULL;
    }
  }
  saying_hello = was;
  if (!rc)
    atomic_store(&c->hello_pipe, (unsigned)nng_pipe_id(c->reply_pipe));
  else if (r)
    protobuf_c_message_free_unpacked(&r->base, NULL), r = NULL;
  *out = r;
  return rc;
}

/* Says the Hello again when nng has redialed since it was last said (every
 * request comes here first, through client_credits_take).  A request sent
 * while no connection is up goes on the next one before this can see it,
 * and is refused once (UNAUTHENTICATED); the next call proves the tenant. */
static int hello_again(tport_client *c, tport_err *err)
{
  unsigned said = atomic_load(&c->hello_pipe), live = atomic_load(&c->live_pipe);
  if (saying_hello || said == 0 || live == 0 || live == said)
    return TPORT_OK;
  pthread_mutex_lock(&c->hello_mu);
  int rc = TPORT_OK;
  live = atomic_load(&c->live_pipe);
  if (live && live != atomic_load(&c->hello_pipe)) {
    Tport__HelloReply *r = NULL;
    rc = say_hello(c, &r, err);
    if (r)
      protobuf_c_message_free_unpacked(&r->base, NULL);
  }
  pthread_mutex_unlock(&c->hello_mu);
  return rc;
}

int tport_connect(const char *url, const tport_connect_options *opts, tport_client **out,
                  tport_err *err)
{
  tport_client *c = calloc(1, sizeof *c);
  if (!c)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
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
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  pthread_mutex_init(&c->shm_mu, NULL);
  atomic_init(&c->shm_auto, false);
  pthread_mutex_init(&c->regions_mu, NULL);
  pthread_mutex_init(&c->stage_mu, NULL);
  pthread_mutex_init(&c->ipc_mu, NULL);
  c->credits = 1; /* the Hello */
  int rv = nng_req0_open(&c->sock);
  if (rv) {
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
               : say_hello(c, &r, err);
  if (rc) {
    close_socket(c->sock);
    hello_strings_free(c);
    free(c);
    return rc;
  }
  c->chunk_bytes = r->max_chunk_bytes ? r->max_chunk_bytes : (4u << 20);
  /* same host: the server offers regions (a socket named), and this URL
   * reaches it locally */
  if (r->shm_socket && r->shm_socket[0] && strlen(r->shm_socket) < sizeof c->shm_socket &&
      client_url_is_local(url)) {
    const char *env = getenv("TPORT_SHM");
    snprintf(c->shm_socket, sizeof c->shm_socket, "%s", r->shm_socket);
    atomic_store(&c->shm_auto, !(opts && opts->no_shm) && !(env && strcmp(env, "0") == 0));
    const char *ipc = getenv("TPORT_CUDA_IPC");
    c->cuda_ipc = atomic_load(&c->shm_auto) && !(ipc && strcmp(ipc, "0") == 0);
  }
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
  close_socket(c->sock);
  client_shm_close(c);
  pthread_mutex_destroy(&c->mu);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->shm_mu);
  pthread_mutex_destroy(&c->regions_mu);
  stage_destroy(c->stage);
  pthread_mutex_destroy(&c->stage_mu);
  client_ipc_destroy(c->ipc);
  pthread_mutex_destroy(&c->ipc_mu);
  pthread_mutex_destroy(&c->hello_mu);
  hello_strings_free(c);
  free(c);
}

struct timespec client_deadline_after(int ms)
{
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  t.tv_sec += ms / 1000;
  t.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (t.tv_nsec >= 1000000000L) {
    t.tv_sec++;
    t.tv_nsec -= 1000000000L;
  }
  return t;
}

int client_credits_take(tport_client *c, int k, tport_err *err)
{
  int rc = hello_again(c, err);
  if (rc)
    return rc;
  struct timespec until = client_deadline_after(c->timeout_ms);
  pthread_mutex_lock(&c->mu);
  while (c->credits < k && !rc)
    if (pthread_cond_timedwait(&c->cv, &c->mu, &until) != 0 && c->credits < k)
      rc = tport_err_set(err, TPORT_DEADLINE_EXCEEDED,
                         "%d requests of this client's other threads are still in flight after "
                         "%d ms",
                         k, c->timeout_ms);
  if (!rc)
    c->credits -= k;
  pthread_mutex_unlock(&c->mu);
  return rc;
}

void client_credits_give(tport_client *c, int k)
{
  pthread_mutex_lock(&c->mu);
  c->credits += k;
  pthread_cond_broadcast(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

/* ---------------------------------------------------------------- the RPC core */

int client_pack(uint16_t method, const ProtobufCMessage *q, const void *payload, size_t n,
                nng_msg **out, tport_err *err)
{
  size_t head = frame_head_size(q);
  nng_msg *m;
  if (nng_msg_alloc(&m, head + n) != 0)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for a %zu-byte request",
                         head + n);
  uint8_t *body = nng_msg_body(m);
  frame_write_head(body, method, 0, q);
  if (n)
    memcpy(body + head, payload, n);
  *out = m;
  return TPORT_OK;
}

/* Every reply carries its Status as field 1 ("status"). */
static const Tport__Status *reply_status(const ProtobufCMessage *m)
{
  const ProtobufCFieldDescriptor *f =
      protobuf_c_message_descriptor_get_field_by_name(m->descriptor, "status");
  if (!f)
    return NULL;
  return *(Tport__Status *const *)((const char *)m + f->offset);
}

int client_unpack(uint16_t method, nng_msg *m, const ProtobufCMessageDescriptor *d,
                  ProtobufCMessage **out, client_payload *payload, tport_err *err)
{
  frame_view v;
  int rc = frame_parse(nng_msg_body(m), nng_msg_len(m), &v, err);
  if (rc)
    return rc;
  if (!(v.flags & FRAME_FLAG_REPLY) || (v.method != method && v.method != 0))
    return tport_err_set(err, TPORT_INTERNAL, "reply to method %u came for method %u", v.method,
                         method);
  ProtobufCMessage *r;
  rc = frame_unpack(&v, d, &r, err);
  if (rc)
    return rc;
  const Tport__Status *st = reply_status(r);
  if (st && st->code != TPORT__CODE__CODE_OK) {
    int code = (int)st->code;
    tport_err_set(err, code, "%s", st->message ? st->message : "");
    if (code == TPORT_UNAUTHENTICATED && method == TPORT__METHOD__METHOD_HELLO && out) {
      *out = r; /* the challenge is in it: the caller answers and frees it */
      return code;
    }
    protobuf_c_message_free_unpacked(r, NULL);
    return code;
  }
  if (payload) {
    payload->data = v.payload;
    payload->len = v.payload_len;
  }
  *out = r;
  return TPORT_OK;
}

static int nng_to_status(int rv)
{
  switch (rv) {
  case NNG_ETIMEDOUT: return TPORT_DEADLINE_EXCEEDED;
  case NNG_ECLOSED:
  case NNG_ECONNREFUSED:
  case NNG_ECONNRESET:
  case NNG_ECONNSHUT: return TPORT_UNAVAILABLE;
  case NNG_ENOMEM: return TPORT_RESOURCE_EXHAUSTED;
  case NNG_EMSGSIZE: return TPORT_RESOURCE_EXHAUSTED;
  default: return TPORT_UNAVAILABLE;
  }
}

int client_slot_open(tport_client *c, client_slot *s, tport_err *err)
{
  memset(s, 0, sizeof *s);
  s->owner = c;
  int rv = nng_ctx_open(&s->ctx, c->sock);
  if (!rv)
    rv = nng_aio_alloc(&s->aio, NULL, NULL);
  if (rv) {
    nng_ctx_close(s->ctx);
    return tport_err_set(err, TPORT_INTERNAL, "nng context: %s", nng_strerror(rv));
  }
  nng_aio_set_timeout(s->aio, c->timeout_ms);
  return TPORT_OK;
}

void client_slot_close(client_slot *s)
{
  if (s->aio) {
    /* a request abandoned midway: stop it, and free the message it still holds
     * (a send that did not complete, or a reply that arrived unread) */
    nng_aio_stop(s->aio);
    int rv = nng_aio_result(s->aio);
    if ((s->phase == SLOT_SENDING && rv != 0) || (s->phase == SLOT_RECEIVING && rv == 0)) {
      nng_msg *m = nng_aio_get_msg(s->aio);
      if (m)
        nng_msg_free(m);
    }
    nng_aio_free(s->aio);
  }
  if (s->reply)
    nng_msg_free(s->reply);
  nng_ctx_close(s->ctx);
  memset(s, 0, sizeof *s);
}

void client_slot_send(client_slot *s, nng_msg *m)
{
  s->phase = SLOT_SENDING;
  nng_aio_set_msg(s->aio, m);
  nng_ctx_send(s->ctx, s->aio);
}

int client_slot_finish(client_slot *s, tport_err *err)
{
  nng_aio_wait(s->aio);
  int rv = nng_aio_result(s->aio);
  if (rv) {
    nng_msg_free(nng_aio_get_msg(s->aio));
    s->phase = SLOT_IDLE;
    return tport_err_set(err, nng_to_status(rv), "sending the request: %s", nng_strerror(rv));
  }
  s->phase = SLOT_RECEIVING;
  nng_ctx_recv(s->ctx, s->aio);
  nng_aio_wait(s->aio);
  rv = nng_aio_result(s->aio);
  s->phase = SLOT_IDLE;
  if (rv)
    return tport_err_set(err, nng_to_status(rv), "waiting for the reply: %s", nng_strerror(rv));
  if (s->reply)
    nng_msg_free(s->reply);
  s->reply = nng_aio_get_msg(s->aio);
  return TPORT_OK;
}

int client_rpc(tport_client *c, uint16_t method, const ProtobufCMessage *q, const void *payload,
               size_t n, const ProtobufCMessageDescriptor *d, ProtobufCMessage **out,
               client_payload *reply_payload, tport_err *err)
{
  client_slot s;
  nng_msg *m;
  int rc = client_credits_take(c, 1, err);
  if (rc)
    return rc;
  rc = client_slot_open(c, &s, err);
  if (rc) {
    client_credits_give(c, 1);
    return rc;
  }
  rc = client_pack(method, q, payload, n, &m, err);
  if (!rc) {
    client_slot_send(&s, m);
    rc = client_slot_finish(&s, err);
  }
  if (!rc && method == TPORT__METHOD__METHOD_HELLO)
    c->reply_pipe = nng_msg_get_pipe(s.reply); /* only Hello reads it, before any other call */
  if (!rc)
    rc = client_unpack(method, s.reply, d, out, reply_payload, err);
  if (!rc && reply_payload) {
    /* the payload points into the reply message: hand the message over */
    reply_payload->msg = s.reply;
    s.reply = NULL;
  }
  client_slot_close(&s);
  client_credits_give(c, 1);
  return rc;
}

/* ---------------------------------------------------------------- refs and info */

void tport_ref_name(tport_ref *ref, const char *name)
{
  memset(ref, 0, sizeof *ref);
  snprintf(ref->name, sizeof ref->name, "%s", name ? name : "");
}

static bool handle_is_zero(const tport_ref *r)
{
  for (int i = 0; i < TPORT_HANDLE_BYTES; i++)
    if (r->handle[i])
      return false;
  return true;
}

void tport_ref_format(const tport_ref *ref, char *buf, size_t len)
{
  if (!handle_is_zero(ref) || !ref->name[0]) {
    char hex[2 * TPORT_HANDLE_BYTES + 1];
    for (int i = 0; i < TPORT_HANDLE_BYTES; i++)
      snprintf(hex + 2 * i, 3, "%02x", ref->handle[i]);
    snprintf(buf, len, "%s", hex);
  } else {
    snprintf(buf, len, "%s", ref->name);
  }
}

int tport_ref_parse(const char *text, tport_ref *ref, tport_err *err)
{
  memset(ref, 0, sizeof *ref);
  if (!text || !*text)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "an empty REF");
  size_t n = strlen(text);
  bool hex = n == 2 * TPORT_HANDLE_BYTES;
  for (size_t i = 0; hex && i < n; i++)
    hex = (text[i] >= '0' && text[i] <= '9') || (text[i] >= 'a' && text[i] <= 'f');
  if (hex) {
    for (int i = 0; i < TPORT_HANDLE_BYTES; i++) {
      unsigned v;
      sscanf(text + 2 * i, "%2x", &v);
      ref->handle[i] = (uint8_t)v;
    }
    return TPORT_OK;
  }
  if (n >= TPORT_NAME_MAX)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "name is longer than %d bytes",
                         TPORT_NAME_MAX - 1);
  memcpy(ref->name, text, n + 1);
  return TPORT_OK;
}

void client_ref_to_wire(const tport_ref *ref, Tport__Ref *w)
{
  tport__ref__init(w);
  if (!handle_is_zero(ref)) {
    w->handle.data = (uint8_t *)ref->handle;
    w->handle.len = TPORT_HANDLE_BYTES;
  } else {
    w->name = (char *)ref->name;
  }
}

void client_info_from_wire(const Tport__TensorInfo *w, tport_tensor_info *out)
{
  memset(out, 0, sizeof *out);
  if (!w)
    return;
  if (w->ref) {
    if (w->ref->handle.len == TPORT_HANDLE_BYTES)
      memcpy(out->ref.handle, w->ref->handle.data, TPORT_HANDLE_BYTES);
    snprintf(out->ref.name, sizeof out->ref.name, "%s", w->ref->name ? w->ref->name : "");
  }
  if (w->desc) {
    out->dtype = (tport_dtype)w->desc->dtype;
    out->ndim = (int)(w->desc->n_sizes <= TPORT_MAX_DIMS ? w->desc->n_sizes : TPORT_MAX_DIMS);
    for (int d = 0; d < out->ndim; d++) {
      out->sizes[d] = w->desc->sizes[d];
      out->strides[d] = d < (int)w->desc->n_strides ? w->desc->strides[d] : 0;
    }
    out->storage_offset = w->desc->storage_offset;
    snprintf(out->device, sizeof out->device, "%s", w->desc->device ? w->desc->device : "");
  }
  out->actual_format = (tport_memory_format)w->actual_format;
  out->suggested_format = (tport_memory_format)w->suggested_format;
  out->is_contiguous = w->is_contiguous;
  out->nbytes = w->nbytes;
  out->storage_nbytes = w->storage_nbytes;
  out->managed = w->managed;
  out->conj = w->conj;
  out->neg = w->neg;
  out->expires_unix_ms = w->expires_unix_ms;
}
