/*
 * rpc.c: libtport's requests on the wire -- a request's frame and its
 * reply's, a request in flight on its own nng context (a slot), one
 * request and its reply (client_exchange), and the credits that keep a
 * client's requests within the server's max_outstanding.
 *
 * The bottom of the library: it knows nng and the frame, and calls nothing
 * else of libtport's.  The Hello that every request must follow after a
 * redial is session.c's, above it.
 */
#include <nng/nng.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "arena.h"
#include "client_internal.h"

/* Takes k request credits, all at once (so that threads that each need
 * several never deadlock), waiting up to the client's timeout. */
int client_credits_wait(tport_client *c, int k, tport_err *err)
{
  int rc = TPORT_OK;
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
  return client_unpack_in(method, m, d, NULL, out, payload, err);
}

int client_unpack_in(uint16_t method, nng_msg *m, const ProtobufCMessageDescriptor *d, arena *a,
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
  rc = frame_unpack_in(&v, d, a, &r, err);
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
    if (!a)
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
  case NNG_ECANCELED: return TPORT_CANCELLED; /* tport_cancel of a request that waits */
  default: return TPORT_UNAVAILABLE;
  }
}

static int closing_error(tport_err *err)
{
  return tport_err_set(err, TPORT_UNAVAILABLE, "the client is closing");
}

int client_slot_open(tport_client *c, client_slot *s, tport_err *err)
{
  memset(s, 0, sizeof *s);
  s->owner = c;
  pthread_mutex_lock(&c->slots_mu);
  int rv = c->closing ? NNG_ECLOSED : nng_ctx_open(&s->ctx, c->sock);
  if (!rv)
    rv = nng_aio_alloc(&s->aio, NULL, NULL);
  if (!rv) {
    nng_aio_set_timeout(s->aio, c->timeout_ms);
    s->next = c->slots;
    if (c->slots)
      c->slots->prev = s;
    c->slots = s;
  }
  pthread_mutex_unlock(&c->slots_mu);
  if (rv) {
    if (s->ctx.id)
      nng_ctx_close(s->ctx);
    memset(s, 0, sizeof *s);
    /* closed: the client is being closed (tport_close with requests in flight) */
    return rv == NNG_ECLOSED ? closing_error(err)
                             : tport_err_set(err, TPORT_INTERNAL, "nng context: %s", nng_strerror(rv));
  }
  return TPORT_OK;
}

void client_slots_abort(tport_client *c)
{
  pthread_mutex_lock(&c->slots_mu);
  c->closing = true;
  for (client_slot *s = c->slots; s; s = s->next)
    nng_aio_abort(s->aio, NNG_ECLOSED);
  pthread_mutex_unlock(&c->slots_mu);
}

/* ---------------------------------------------------------------- replies read in place */

void client_slot_recv_into(client_slot *s, uint8_t *const *dst, const size_t *n, unsigned k)
{
#ifdef TPORT_NNG_RECV_TAIL
  _Static_assert(CLIENT_TAIL_SEGMENTS <= NNG_RECV_TAIL_SEGMENTS, "nng takes as many places");
  s->ntail = 0;
  s->tail_len = 0;
  size_t len = 0;
  for (unsigned i = 0; i < k; i++)
    len += n[i];
  if (k == 0 || k > CLIENT_TAIL_SEGMENTS || len < NNG_RECV_TAIL_MIN ||
      nng_ctx_recv_tail(s->ctx, dst[0], n[0]) != 0)
    return;
  s->tail_armed = true; /* (disarmed whatever comes next) */
  for (unsigned i = 1; i < k; i++)
    if (nng_ctx_recv_tail_add(s->ctx, dst[i], n[i]) != 0) {
      nng_ctx_recv_tail(s->ctx, NULL, 0); /* not all of them: none */
      return;
    }
  s->ntail = k;
  for (unsigned i = 0; i < k; i++) {
    s->tail[i] = dst[i];
    s->tail_n[i] = n[i];
  }
  s->tail_len = len;
#else
  (void)s, (void)dst, (void)n, (void)k;
#endif
}

int client_slot_unplace(client_slot *s, tport_err *err)
{
  size_t placed = s->placed;
  for (unsigned i = 0; i < s->ntail && placed; i++) {
    size_t n = s->tail_n[i] < placed ? s->tail_n[i] : placed;
    if (n && nng_msg_append(s->reply, s->tail[i], n) != 0)
      return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for a %zu-byte reply",
                           nng_msg_len(s->reply) + placed);
    placed -= n;
  }
  s->placed = 0;
  return TPORT_OK;
}

/* Disarms s's reply tail and waits until nng writes the caller's memory no
 * more: a reply stuck half way (a server that stopped in the middle of it)
 * is ended by closing the connection, as a stuck lent request is
 * (put_socket.c).  The connection closed is the live one: a reply being
 * read is on it (a lost one's reads have ended).  Up to the client's
 * timeout first (a reply still arriving on a slow link is let finish, as
 * a stuck lent put is waited for: a request that timed out may so take
 * two timeouts), but a short while once the client is closing: tport_close
 * must not wait a timeout for a server that stopped mid-reply. */
static void tail_disarm(client_slot *s, bool failed)
{
#ifdef TPORT_NNG_RECV_TAIL
  if (!s->tail_armed)
    return;
  tport_client *c = s->owner;
  pthread_mutex_lock(&c->slots_mu);
  bool closing = c->closing;
  pthread_mutex_unlock(&c->slots_mu);
  nng_duration wait =
      failed && closing && c->timeout_ms > 200 ? 200 : (nng_duration)c->timeout_ms;
  while (nng_ctx_recv_tail_clear(s->ctx, wait) == NNG_ETIMEDOUT) {
    unsigned id = atomic_load(&c->live_pipe);
    if (id)
      nng_pipe_close((nng_pipe){.id = id});
    wait = 1000;
  }
  s->tail_armed = false;
#else
  (void)s, (void)failed;
#endif
}

/* After s's reply came: how much of its payload's end is in the caller's
 * memory (s->placed).  A reply whose end went there but whose frame does
 * not end where the placed bytes begin (an error longer than
 * NNG_RECV_TAIL_MIN, a server's odd frame: its message, not its payload,
 * went there) gets those bytes back at its end and is taken as if nothing
 * was placed; one that does is the take's to check against its plan. */
static int tail_settle(client_slot *s, tport_err *err)
{
  s->placed = 0;
#ifdef TPORT_NNG_RECV_TAIL
  size_t placed = s->reply ? nng_msg_recv_tail(s->reply) : 0;
  if (!placed)
    return TPORT_OK;
  if (placed != s->tail_len)
    return tport_err_set(err, TPORT_DATA_LOSS, "%zu bytes of a reply were read into %zu", placed,
                         s->tail_len);
  s->placed = placed;
  frame_view v;
  if (frame_parse(nng_msg_body(s->reply), nng_msg_len(s->reply), &v, NULL) != TPORT_OK)
    return client_slot_unplace(s, err);
#else
  (void)err;
#endif
  return TPORT_OK;
}

void client_slot_close(client_slot *s)
{
  if (s->owner && s->aio) {
    tport_client *c = s->owner;
    pthread_mutex_lock(&c->slots_mu);
    if (s->prev)
      s->prev->next = s->next;
    else
      c->slots = s->next;
    if (s->next)
      s->next->prev = s->prev;
    pthread_mutex_unlock(&c->slots_mu);
  }
  if (s->aio) {
    /* a request abandoned midway: stop it, and free the message it still holds
     * (a send that did not complete, or a reply that arrived unread) */
    nng_aio_stop(s->aio);
    tail_disarm(s, true); /* before the caller's memory is the caller's again */
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

/* Starts s's next operation unless the client is closing (the check and the
 * start under slots_mu: client_slots_abort sees every wait it must end). */
static bool slot_start(client_slot *s, bool send)
{
  tport_client *c = s->owner;
  pthread_mutex_lock(&c->slots_mu);
  bool go = !c->closing;
  if (go && send)
    nng_ctx_send(s->ctx, s->aio);
  else if (go)
    nng_ctx_recv(s->ctx, s->aio);
  pthread_mutex_unlock(&c->slots_mu);
  return go;
}

void client_slot_send(client_slot *s, nng_msg *m)
{
  s->phase = SLOT_SENDING;
  s->placed = 0;
  if (!s->tail_armed)
    s->ntail = 0;
  nng_aio_set_msg(s->aio, m);
  if (!slot_start(s, true)) {
    nng_aio_set_msg(s->aio, NULL);
    nng_msg_free(m);
    s->phase = SLOT_IDLE;
    s->refused = true;
    return;
  }
  client_request_started(s->aio);
}

int client_slot_finish(client_slot *s, tport_err *err)
{
  if (s->refused) {
    tail_disarm(s, true);
    return closing_error(err);
  }
  nng_aio_wait(s->aio);
  int rv = nng_aio_result(s->aio);
  if (rv) {
    nng_msg_free(nng_aio_get_msg(s->aio));
    s->phase = SLOT_IDLE;
    tail_disarm(s, true);
    return tport_err_set(err, nng_to_status(rv), "sending the request: %s", nng_strerror(rv));
  }
  s->phase = SLOT_RECEIVING;
  if (!slot_start(s, false)) {
    s->phase = SLOT_IDLE;
    tail_disarm(s, true);
    return closing_error(err);
  }
  client_request_started(s->aio);
  nng_aio_wait(s->aio);
  rv = nng_aio_result(s->aio);
  s->phase = SLOT_IDLE;
  tail_disarm(s, rv != 0); /* (a reply that came: done already) */
  if (rv)
    return tport_err_set(err, nng_to_status(rv), "waiting for the reply: %s", nng_strerror(rv));
  if (s->reply)
    nng_msg_free(s->reply);
  s->reply = nng_aio_get_msg(s->aio);
  return tail_settle(s, err);
}

/* client_exchange, whose reply may come wait_ms later than the client's
 * timeout (the server holds a request that waits for a name). */
static int exchange(tport_client *c, uint32_t wait_ms, uint16_t method, const ProtobufCMessage *q,
                    const void *payload, size_t n, const ProtobufCMessageDescriptor *d,
                    ProtobufCMessage **out, client_payload *reply_payload, nng_pipe *reply_pipe,
                    bool *unanswered, tport_err *err)
{
  client_slot s;
  nng_msg *m;
  int rc = client_slot_open(c, &s, err);
  if (rc)
    return rc;
  if (wait_ms)
    nng_aio_set_timeout(s.aio, (nng_duration)((int64_t)c->timeout_ms + wait_ms > INT32_MAX
                                                  ? INT32_MAX
                                                  : c->timeout_ms + (int64_t)wait_ms));
  rc = client_pack(method, q, payload, n, &m, err);
  /* a wait for a name may last long: a tport_cancel of the request it runs
   * for aborts it (the server's answer, when it comes, is dropped) */
  bool abortable = wait_ms && client_request_abortable(s.aio);
  if (!rc) {
    client_slot_send(&s, m);
    rc = client_slot_finish(&s, err);
    if (rc && unanswered)
      *unanswered = !s.refused; /* it went out (or may have): no answer read */
  }
  if (abortable)
    client_request_abortable(NULL);
  if (!rc && reply_pipe)
    *reply_pipe = nng_msg_get_pipe(s.reply);
  if (!rc)
    rc = client_unpack(method, s.reply, d, out, reply_payload, err);
  if (!rc && reply_payload) {
    /* the payload points into the reply message: hand the message over */
    reply_payload->msg = s.reply;
    s.reply = NULL;
  }
  client_slot_close(&s);
  return rc;
}

int client_exchange(tport_client *c, uint16_t method, const ProtobufCMessage *q,
                    const void *payload, size_t n, const ProtobufCMessageDescriptor *d,
                    ProtobufCMessage **out, client_payload *reply_payload, nng_pipe *reply_pipe,
                    tport_err *err)
{
  return exchange(c, 0, method, q, payload, n, d, out, reply_payload, reply_pipe, NULL, err);
}

int client_exchange_waiting(tport_client *c, uint32_t wait_ms, uint16_t method,
                            const ProtobufCMessage *q, const ProtobufCMessageDescriptor *d,
                            ProtobufCMessage **out, client_payload *reply_payload,
                            bool *unanswered, tport_err *err)
{
  return exchange(c, wait_ms, method, q, NULL, 0, d, out, reply_payload, NULL, unanswered, err);
}
