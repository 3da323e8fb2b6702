/*
 * session.c: what a connection has proved -- its Hello, the answer to the
 * server's challenge, said again when nng has redialed -- and the gate
 * every request passes: client_credits_take says the Hello again where it
 * is due, then takes the request's credits; client_rpc is one request
 * through that gate.
 *
 * Above rpc.c (the requests on the wire), below everything that sends one.
 */
#include <nng/nng.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "client_internal.h"
#include "env.h"
#include "hello_mac.h"
#include "local_secret.h"
#include "tls_openssl.h"

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

/* Frees what the Hello needs (the secret cleansed first): tport_close, or
 * a tport_connect that failed. */
void client_session_forget(tport_client *c)
{
  if (c->secret)
    OPENSSL_cleanse(c->secret, strlen(c->secret));
  free(c->secret);
  free(c->secret_file);
  free(c->tenant);
  free(c->url);
  c->secret = c->secret_file = c->tenant = c->url = NULL;
}

/* One Hello and its reply: beside the gate every other request passes
 * (hello_again), its credit taken here.  reply_pipe is the connection the
 * reply came on: the challenge binds to it. */
static int hello_rpc(tport_client *c, Tport__HelloRequest *q, Tport__HelloReply **r, tport_err *err)
{
  int rc = client_credits_wait(c, 1, err);
  if (rc)
    return rc;
  rc = client_exchange(c, TPORT__METHOD__METHOD_HELLO, &q->base, NULL, 0,
                       &tport__hello_reply__descriptor, (ProtobufCMessage **)r, NULL,
                       &c->reply_pipe, err);
  client_credits_give(c, 1);
  return rc;
}

/* Hello (answering a challenge when the server asks) on the connection of
 * the moment; *out the server's reply (free it).  On success hello_pipe is
 * the connection it was said on. */
int client_say_hello(tport_client *c, Tport__HelloReply **out, tport_err *err)
{
  tport_connect_options o = {.tenant = c->tenant, .secret = c->secret,
                             .secret_file = c->secret_file};
  Tport__HelloRequest q = TPORT__HELLO_REQUEST__INIT;
  q.protocol_version = 1;
  q.client = "libtport 0.1.0";
  q.tenant = c->tenant;
  Tport__HelloReply *r = NULL;
  int rc = hello_rpc(c, &q, &r, err);
  if (rc == TPORT_UNAUTHENTICATED && r) {
    /* the server authenticates: answer its challenge with the secret */
    rc = answer_challenge(c, c->url, &o, &q, r, err);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    r = NULL;
    if (!rc)
      rc = hello_rpc(c, &q, &r, err);
    OPENSSL_cleanse(q.auth_response.data, q.auth_response.len);
    free(q.auth_response.data);
    if (rc == TPORT_UNAUTHENTICATED && r) {
      protobuf_c_message_free_unpacked(&r->base, NULL); /* a second challenge: refused */
      r = NULL;
    }
  }
  if (!rc) {
    atomic_store(&c->hello_pipe, (unsigned)nng_pipe_id(c->reply_pipe));
    /* said again on every Hello: a redial may reach an older server */
    atomic_store(&c->get_expect, r && r->get_expect);
    atomic_store(&c->batch_get_slices, r && r->batch_get_slices);
    atomic_store(&c->proc_read_max, r ? r->process_read_max_bytes : 0);
    atomic_store(&c->proc_put_once, r && r->process_put_once);
    atomic_store(&c->proc_gets, r && r->process_gets);
    bool runs = true;
    client_env_flag("TPORT_PUT_RUNS", true, &runs, NULL); /* (checked by tport_connect) */
    atomic_store(&c->put_runs, r && r->put_batch_runs && runs);
    uint64_t uid;
    atomic_store(&c->server_uid,
                 nng_pipe_get_uint64(c->reply_pipe, NNG_OPT_IPC_PEER_UID, &uid) == 0
                     ? (uid_t)uid
                     : (uid_t)-1);
  } else if (r)
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
  if (said == 0 || live == 0 || live == said)
    return TPORT_OK;
  pthread_mutex_lock(&c->hello_mu);
  int rc = TPORT_OK;
  live = atomic_load(&c->live_pipe);
  if (live && live != atomic_load(&c->hello_pipe)) {
    Tport__HelloReply *r = NULL;
    rc = client_say_hello(c, &r, err);
    if (r)
      protobuf_c_message_free_unpacked(&r->base, NULL);
  }
  pthread_mutex_unlock(&c->hello_mu);
  return rc;
}

int client_credits_take(tport_client *c, int k, tport_err *err)
{
  int rc = hello_again(c, err);
  return rc ? rc : client_credits_wait(c, k, err);
}

int client_rpc(tport_client *c, uint16_t method, const ProtobufCMessage *q, const void *payload,
               size_t n, const ProtobufCMessageDescriptor *d, ProtobufCMessage **out,
               client_payload *reply_payload, tport_err *err)
{
  int rc = client_credits_take(c, 1, err);
  if (rc)
    return rc;
  rc = client_exchange(c, method, q, payload, n, d, out, reply_payload, NULL, err);
  client_credits_give(c, 1);
  return rc;
}

int client_rpc_waiting(tport_client *c, uint32_t wait_ms, uint16_t method,
                       const ProtobufCMessage *q, const ProtobufCMessageDescriptor *d,
                       ProtobufCMessage **out, client_payload *reply_payload, bool *unanswered,
                       tport_err *err)
{
  if (unanswered)
    *unanswered = false;
  /* A request that waits for a name holds no credit: parked on the server
   * it holds no worker and counts against no window there (tportd bounds
   * such requests by their own count, 16 a connection), and holding one
   * here for seconds would stall the requests that publish the name. */
  int rc = wait_ms ? hello_again(c, err) : client_credits_take(c, 1, err);
  if (rc)
    return rc;
  rc = client_exchange_waiting(c, wait_ms, method, q, d, out, reply_payload, unanswered, err);
  if (!wait_ms)
    client_credits_give(c, 1);
  return rc;
}
