/*
 * server.c: sockets, listeners, the context state machines, the worker pool,
 * pipe events and the reaper.
 *
 * A context's life: RECV (an nng_ctx_recv is pending) -> its callback takes
 * the message and queues the context for a worker -> WORK (a worker parses,
 * dispatches and builds the reply) -> SEND (nng_ctx_send pending) -> its
 * callback re-arms RECV.  Callbacks only move messages and queue work; they
 * never block and never touch the engine.
 */
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <arpa/inet.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "lent_bytes.h"
#include "listen_url.h"
#include "local_secret.h"
#include "log.h"
#include "server_internal.h"
#include "tls_openssl.h"

static int64_t mono_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ---------------------------------------------------------------- replies */

static int pack_reply(nng_msg **out, uint16_t method, ProtobufCMessage *m, const void *payload,
                      size_t n)
{
  size_t head = frame_head_size(m);
  nng_msg *msg;
  if (nng_msg_alloc(&msg, head + n) != 0)
    return TPORT_RESOURCE_EXHAUSTED;
  uint8_t *body = nng_msg_body(msg);
  frame_write_head(body, method, FRAME_FLAG_REPLY, m);
  if (n)
    memcpy(body + head, payload, n);
  *out = msg;
  return TPORT_OK;
}

int call_reply(call *c, ProtobufCMessage *reply, const void *payload, size_t n)
{
  int rc = pack_reply(&c->out, c->method, reply, payload, n);
  if (rc)
    return tport_err_set(&c->err, rc, "out of memory for a %zu-byte reply", n);
  return TPORT_OK;
}

#ifdef TPORT_NNG_LENT_TAIL
/* Whether nng sends a reply's lent tail on this connection straight from
 * memory: tcp:// and ipc:// do; any other transport (tls+tcp://, ws://,
 * inproc://) would copy it into the reply under nng's socket lock and
 * tportd's queue lock, where the worker's own copy holds no lock.  Told by
 * the scheme of the listener the connection came from (a ws:// connection's
 * address looks like a tcp one's). */
static bool pipe_takes_lent_bytes(uint32_t pipe)
{
  nng_listener l = nng_pipe_listener((nng_pipe){.id = pipe});
  char *url;
  if (nng_listener_id(l) <= 0 || nng_listener_get_string(l, NNG_OPT_URL, &url) != 0)
    return false;
  bool yes = transport_url_sends_lent_bytes(url);
  nng_strfree(url);
  return yes;
}
#endif

int call_reply_lent(call *c, ProtobufCMessage *reply, tport_storage *st, const void *payload,
                    size_t n)
{
#ifndef TPORT_NNG_LENT_TAIL
  (void)st; /* the system's nng (TPORT_SYSTEM_NNG) lends nothing */
  return call_reply(c, reply, payload, n);
#else
  if (n < REPLY_LEND_MIN_BYTES || !c->srv->lends || !pipe_takes_lent_bytes(c->pipe))
    return call_reply(c, reply, payload, n);
  int rc = pack_reply(&c->out, c->method, reply, NULL, 0);
  if (rc)
    return tport_err_set(&c->err, rc, "out of memory for a reply");
  /* the message holds the storage until nng is done with the bytes */
  void *lend = lends_begin(c->srv->lends, c->pipe, st);
  if (!lend || nng_msg_set_tail(c->out, payload, n, lends_end, lend) != 0) {
    if (lend)
      lends_end(lend);
    nng_msg_free(c->out);
    c->out = NULL;
    return call_reply(c, reply, payload, n);
  }
  /* ctx_finish counts the message's own bytes: the lent ones are not in them */
  atomic_fetch_add(&c->srv->bytes_out, n);
  atomic_fetch_add(&c->srv->bytes_lent, n);
  return TPORT_OK;
#endif
}

static nng_msg *error_reply(uint16_t method, const tport_err *e)
{
  Tport__ErrorReply r = TPORT__ERROR_REPLY__INIT;
  Tport__Status st = TPORT__STATUS__INIT;
  st.code = (Tport__Code)e->code;
  st.message = (char *)e->msg;
  r.status = &st;
  nng_msg *m = NULL;
  pack_reply(&m, method, &r.base, NULL, 0);
  return m;
}

/* ---------------------------------------------------------------- dispatch */

/* A request that failed, at debug level: which connection, tenant, method. */
static void log_failure(server *s, const call *c)
{
  if (!log_enabled(LOG_DEBUG))
    return;
  char conn[16], peer[64], tenant[REG_TENANT_MAX];
  snprintf(conn, sizeof conn, "%u", c->pipe);
  server_peer_address(c->pipe, peer, sizeof peer);
  bool known = reg_session_tenant(&s->reg, c->pipe, tenant, sizeof tenant);
  const ProtobufCMethodDescriptor *md = c->method ? frame_method(c->method) : NULL;
  log_event(LOG_DEBUG, "request failed", "connection", conn, "peer", peer, "tenant",
            known ? tenant : NULL, "method", md ? md->name : "unknown", "code",
            tport_status_name(c->err.code), "error", c->err.msg, NULL);
}

static nng_msg *handle(server *s, srv_ctx *x)
{
  nng_msg *req = x->msg;
  int64_t queued_ms = x->queued_ms;
  call c = {.srv = s,
            .pipe = (uint32_t)nng_pipe_id(nng_msg_get_pipe(req)),
            .arrived_ns = x->arrived_ns};
  tport_err_clear(&c.err);
  frame_view v;
  const uint8_t *body = nng_msg_body(req);
  size_t len = nng_msg_len(req);
  atomic_fetch_add(&s->bytes_in, len);
  int rc = frame_parse(body, len, &v, &c.err);
  if (!rc) {
    c.method = v.method;
    if (v.flags & FRAME_FLAG_REPLY)
      rc = tport_err_set(&c.err, TPORT_INVALID_ARGUMENT, "a reply frame was sent as a request");
  }
  const ProtobufCMethodDescriptor *md = rc ? NULL : frame_method(v.method);
  if (!rc && (!md || !handler_for(v.method)))
    rc = tport_err_set(&c.err, TPORT_UNIMPLEMENTED, "method %u is unknown", v.method);
  if (!rc && s->authn && v.method != TPORT__METHOD__METHOD_HELLO &&
      !reg_session_authenticated(&s->reg, c.pipe))
    rc = tport_err_set(&c.err, TPORT_UNAUTHENTICATED,
                       "this connection has not proved its tenant: Hello with the answer to its "
                       "challenge first");
  if (!rc && x->chunk == CHUNK_REFUSED) {
    c.err = x->chunk_err;
    rc = c.err.code;
  }
  if (!rc && mono_ms() - queued_ms > (int64_t)s->cfg.deadline_ms)
    rc = tport_err_set(&c.err, TPORT_DEADLINE_EXCEEDED,
                       "the request waited %lld ms in the queue (deadline %lu ms)",
                       (long long)(mono_ms() - queued_ms), s->cfg.deadline_ms);
  if (!rc && v.payload_len && v.method != TPORT__METHOD__METHOD_PUT_BEGIN &&
      v.method != TPORT__METHOD__METHOD_PUT_CHUNK)
    rc = tport_err_set(&c.err, TPORT_INVALID_ARGUMENT,
                       "%s takes no payload: %zu bytes came after the request", md->name,
                       v.payload_len);
  if (!rc)
    rc = frame_unpack(&v, md->input, &c.req, &c.err);
  if (!rc) {
    atomic_fetch_add(&s->requests[v.method], 1);
    c.payload = v.payload;
    c.payload_len = v.payload_len;
    /* the deadline covers the time queued and the time running */
    engine_set_deadline(queued_ms + (int64_t)s->cfg.deadline_ms);
    rc = handler_for(v.method)(&c);
    engine_set_deadline(0);
    protobuf_c_message_free_unpacked(c.req, NULL);
  }
  int code = TPORT_OK;
  if (rc || !c.out) {
    if (!rc)
      tport_err_set(&c.err, TPORT_INTERNAL, "the handler gave no reply");
    code = c.err.code;
    atomic_fetch_add(&s->errors, 1);
    log_failure(s, &c);
    if (c.out)
      nng_msg_free(c.out);
    c.out = error_reply(c.method, &c.err);
  }
  metrics_request(&s->metrics, c.method, code, metrics_now_ns() - x->arrived_ns);
  x->method = c.method;
  return c.out;
}

/* ---------------------------------------------------------------- auth */

auth_file *server_auth(server *s)
{
  pthread_mutex_lock(&s->amu);
  auth_file *a = auth_file_retain(s->auth);
  pthread_mutex_unlock(&s->amu);
  return a;
}

int server_reload_auth(server *s, tport_err *err)
{
  if (!s->cfg.auth_file)
    return tport_err_set(err, TPORT_FAILED_PRECONDITION, "no --auth-file to reload");
  auth_file *fresh;
  int rc = auth_file_load(s->cfg.auth_file, &fresh, err);
  if (rc)
    return rc;
  pthread_mutex_lock(&s->amu);
  auth_file *old = s->auth;
  s->auth = fresh;
  pthread_mutex_unlock(&s->amu);
  auth_file_release(old);
  log_msg(LOG_INFO, "auth file reloaded: %zu tenants", auth_file_count(fresh));
  return TPORT_OK;
}

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

/* ---------------------------------------------------------------- contexts */

/* Waits for the next request (no time limit).  qmu held.  A callback that
 * sees the server stopping never re-arms: server_stop then stops every aio. */
static void ctx_recv(srv_ctx *x)
{
  x->state = CTX_RECV;
  x->srv->receiving++;
  nng_aio_set_timeout(x->aio, NNG_DURATION_INFINITE);
  nng_ctx_recv(x->ctx, x->aio);
}

static void ctx_cb(void *arg);
static uint16_t frame_method_of(nng_msg *m);

/* One more context, idle (qmu held).  NULL when nng or memory refuses. */
static srv_ctx *ctx_open(server *s)
{
  srv_ctx *x = calloc(1, sizeof *x);
  if (!x)
    return NULL;
  x->srv = s;
  x->state = CTX_IDLE;
  if (nng_aio_alloc(&x->aio, ctx_cb, x) != 0) {
    free(x);
    return NULL;
  }
  if (nng_ctx_open(&x->ctx, s->sock) != 0) {
    nng_aio_free(x->aio);
    free(x);
    return NULL;
  }
  x->all_next = s->ctxs;
  s->ctxs = x;
  s->nctx++;
  return x;
}

/* Past --contexts + this many contexts opened (each about 1 KiB with its
 * aio), no more are opened: receives then fall below --contexts until
 * replies go out or their connections are dropped at --send-timeout.  Only
 * thousands of connections that do not read, each with its
 * --max-outstanding replies, come near it. */
#define CONTEXTS_BEYOND 65536

/* Keeps --contexts receives posted (qmu held): a context that takes a
 * request is replaced at once, so requests being handled and replies that
 * wait for a connection which does not read hold no receive (30 such
 * connections once held all 1024 contexts for the send timeout, and every
 * other client waited).  What bounds the contexts then is what bounds the
 * requests: --max-connections, --max-outstanding per connection, one at a
 * time before the proof, and --request-memory. */
static void post_receives(server *s)
{
  while (!s->stopping && s->receiving < s->cfg.contexts) {
    srv_ctx *x = s->spare;
    if (x)
      s->spare = x->spare_next;
    else if (s->nctx >= s->cfg.contexts + CONTEXTS_BEYOND || !(x = ctx_open(s))) {
      if (!s->open_failed) {
        s->open_failed = true;
        log_msg(LOG_WARN,
                "cannot open another nng context (%d open): %d receives posted of %d until "
                "replies go out",
                s->nctx, s->receiving, s->cfg.contexts);
      }
      return;
    }
    x->spare_next = NULL;
    ctx_recv(x);
  }
  if (s->receiving >= s->cfg.contexts)
    s->open_failed = false; /* said again if it happens again */
}

/* x has no request any more (qmu held): it receives again, or waits among
 * the spares while --contexts receives are posted. */
static void ctx_idle(server *s, srv_ctx *x)
{
  x->pipe = (nng_pipe)NNG_PIPE_INITIALIZER;
  if (--s->busy == 0)
    pthread_cond_broadcast(&s->idle);
  if (s->stopping)
    return;
  if (s->receiving < s->cfg.contexts) {
    ctx_recv(x);
  } else {
    x->state = CTX_IDLE;
    x->spare_next = s->spare;
    s->spare = x;
  }
}

/* A connection over a limit is dropped: that costs only itself.  logged:
 * say so in the log (a flood's drops are summed up by the caller). */
static void drop_pipe_logged(server *s, nng_pipe p, const char *why, bool logged)
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

static void drop_pipe(server *s, nng_pipe p, const char *why)
{
  drop_pipe_logged(s, p, why, true);
}

/* The request of x is done: its reply (if any) goes out with a time limit,
 * else x goes idle.  Called by a worker (the request was queued) or by the
 * receive callback (a request refused before queueing). */
static void ctx_finish(server *s, srv_ctx *x, nng_msg *reply)
{
  pthread_mutex_lock(&s->qmu);
  s->request_bytes -= x->held_bytes;
  x->held_bytes = 0;
  if (x->fq.owner) {
    fq_done(s->fq, &x->fq);
    if (fq_queued(s->fq))
      pthread_cond_signal(&s->qcv); /* a request its tenant's cap held back */
  }
  if (reply && !s->stopping) {
    x->state = CTX_SEND;
    atomic_fetch_add(&s->bytes_out, nng_msg_len(reply));
    /* a get's reply: the send stage lasts until nng takes it for the wire */
    x->send_ns = x->method == TPORT__METHOD__METHOD_GET_CHUNK ||
                         x->method == TPORT__METHOD__METHOD_GET_BEGIN
                     ? metrics_now_ns()
                     : 0;
    nng_aio_set_msg(x->aio, reply);
    /* a connection that does not take its replies must not hold this
     * context for ever: past the time limit it is dropped */
    nng_aio_set_timeout(x->aio, (nng_duration)s->cfg.send_timeout_ms);
    nng_ctx_send(x->ctx, x->aio);
    pthread_mutex_unlock(&s->qmu);
    return;
  }
  if (reply)
    nng_msg_free(reply);
  reg_request_leave(&s->reg, nng_pipe_id(x->pipe));
  ctx_idle(s, x);
  pthread_mutex_unlock(&s->qmu);
}

/* The method of a request frame, read from its header (0: too short). */
static uint16_t frame_method_of(nng_msg *m)
{
  if (nng_msg_len(m) < FRAME_HEADER_BYTES)
    return 0;
  const uint8_t *h = nng_msg_body(m);
  return (uint16_t)(h[6] << 8 | h[7]);
}

/* A request arrived on x: admitted and queued for the workers under its
 * tenant, or answered at once (over --request-memory), or queued to drop
 * its connection (over a limit of its own). */
static void ctx_received(server *s, srv_ctx *x)
{
  x->msg = nng_aio_get_msg(x->aio);
  nng_aio_set_msg(x->aio, NULL);
  x->pipe = nng_msg_get_pipe(x->msg);
  x->queued_ms = mono_ms();
  x->arrived_ns = metrics_now_ns();
  x->method = 0;
  x->state = CTX_WORK;
  x->chunk = CHUNK_NONE;
  x->drop_why = NULL;
  uint32_t pipe = (uint32_t)nng_pipe_id(x->pipe);
  size_t len = nng_msg_len(x->msg);
  uint16_t method = frame_method_of(x->msg);
  char tenant[REG_TENANT_MAX];
  /* every request of a connection counts until it is answered: one that
   * sends more than its share without reading is dropped, and so is one
   * that has not proved its tenant and sends more than a Hello */
  reg_admit a = reg_request_enter(&s->reg, pipe, len, s->authn, tenant, sizeof tenant);
  if (a != REG_ADMIT_OK) {
    x->drop_why = reg_admit_reason(a);
    nng_msg_free(x->msg); /* now: it may be the largest message allowed */
    x->msg = NULL;
  }
  /* a PutChunk counts against its connection's chunks in flight from now
   * until its reply is built (before the queue: a worker may take it at once) */
  if (x->msg && method == TPORT__METHOD__METHOD_PUT_CHUNK)
    x->chunk = reg_chunk_enter(&s->reg, pipe, &x->chunk_err) ? CHUNK_REFUSED : CHUNK_COUNTED;
  pthread_mutex_lock(&s->qmu);
  s->receiving--;
  s->busy++;
  post_receives(s); /* this context's receive is replaced at once */
  bool refuse = false;
  if (x->msg) {
    /* --request-memory: the bodies of the requests held, all connections
     * together (a context per request no longer bounds them) */
    if (len > s->request_memory || s->request_bytes > s->request_memory - len) {
      refuse = true;
    } else {
      s->request_bytes += len;
      x->held_bytes = len;
    }
  }
  if (!refuse) {
    fq_push(s->fq, tenant, &x->fq);
    pthread_cond_signal(&s->qcv);
  }
  pthread_mutex_unlock(&s->qmu);
  if (refuse) {
    nng_msg_free(x->msg);
    x->msg = NULL;
    if (x->chunk == CHUNK_COUNTED)
      reg_chunk_leave(&s->reg, pipe);
    x->chunk = CHUNK_NONE;
    atomic_fetch_add(&s->refused_requests, 1);
    atomic_fetch_add(&s->errors, 1);
    tport_err e;
    tport_err_set(&e, TPORT_RESOURCE_EXHAUSTED,
                  "the server holds %zu bytes of requests already (--request-memory): try again",
                  s->request_memory);
    metrics_request(&s->metrics, method, e.code, metrics_now_ns() - x->arrived_ns);
    x->method = method;
    ctx_finish(s, x, error_reply(method, &e));
  }
}

static void ctx_cb(void *arg)
{
  srv_ctx *x = arg;
  server *s = x->srv;
  int rv = nng_aio_result(x->aio);
  switch (x->state) {
  case CTX_RECV:
    if (rv != 0) {
      pthread_mutex_lock(&s->qmu);
      s->receiving--;
      if (rv != NNG_ECLOSED && rv != NNG_ECANCELED && !s->stopping)
        ctx_recv(x);
      pthread_mutex_unlock(&s->qmu);
      return;
    }
    ctx_received(s, x);
    return;
  case CTX_SEND: {
    nng_pipe p = x->pipe;
    if (rv == 0 && x->send_ns)
      metrics_stage_since(&s->metrics, STAGE_SEND, x->send_ns);
    if (rv != 0) {
      nng_msg *m = nng_aio_get_msg(x->aio);
      nng_aio_set_msg(x->aio, NULL);
      if (m)
        nng_msg_free(m);
      if (rv == NNG_ETIMEDOUT)
        drop_pipe(s, p, "it does not read its replies");
    }
    reg_request_leave(&s->reg, nng_pipe_id(p));
    pthread_mutex_lock(&s->qmu);
    if (rv == NNG_ECLOSED || rv == NNG_ECANCELED) {
      /* stopping: this context is done */
      x->pipe = (nng_pipe)NNG_PIPE_INITIALIZER;
      x->state = CTX_IDLE;
      if (--s->busy == 0)
        pthread_cond_broadcast(&s->idle);
    } else {
      ctx_idle(s, x);
    }
    pthread_mutex_unlock(&s->qmu);
    return;
  }
  case CTX_WORK:
  case CTX_IDLE: return;
  }
}

static void *worker_main(void *arg)
{
  server *s = arg;
  for (;;) {
    pthread_mutex_lock(&s->qmu);
    fq_node *n;
    /* past the grace period the tenants' caps no longer matter: what is
     * queued is taken off and not run */
    while (!(n = fq_pop(s->fq, s->stopping)) && !s->stopping)
      pthread_cond_wait(&s->qcv, &s->qmu);
    if (!n) {
      pthread_mutex_unlock(&s->qmu);
      OPENSSL_thread_stop(); /* this thread's RAND state */
      return NULL;
    }
    srv_ctx *x = (srv_ctx *)((char *)n - offsetof(srv_ctx, fq));
    bool stopping = s->stopping;
    pthread_mutex_unlock(&s->qmu);
    nng_msg *reply = NULL;
    if (x->drop_why && !stopping)
      drop_pipe(s, x->pipe, x->drop_why);
    else if (!x->drop_why && !stopping) {
      if (server_test_before_handle)
        server_test_before_handle(s, (uint32_t)nng_pipe_id(x->pipe), frame_method_of(x->msg));
      reply = handle(s, x);
    }
    if (x->chunk == CHUNK_COUNTED)
      reg_chunk_leave(&s->reg, nng_pipe_id(x->pipe));
    if (x->msg)
      nng_msg_free(x->msg);
    x->msg = NULL;
    ctx_finish(s, x, reply);
  }
}

void server_queue_stats_get(server *s, server_queue_stats *out)
{
  pthread_mutex_lock(&s->qmu);
  out->contexts = (uint64_t)s->nctx;
  out->queued = fq_queued(s->fq);
  out->queue_tenants = fq_tenants(s->fq);
  out->request_bytes = s->request_bytes;
  pthread_mutex_unlock(&s->qmu);
}

/* ---------------------------------------------------------------- pipes, reaper */

static void pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
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
    /* the session first, then its transfers (see transfers_insert) */
    reg_session_close(&s->reg, id);
    transfers_drop(&s->xfers, id);
    shm_drop_pipe(s->shm, id);
    log_event(LOG_DEBUG, "connection closed: its tensors, uploads and gets are freed",
              "connection", conn, "peer", peer, NULL);
  }
}

static void *reaper_main(void *arg)
{
  server *s = arg;
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
        k = reg_unproved_sessions(&s->reg, reg_now_ms() - (int64_t)s->cfg.auth_timeout_ms, ids,
                                  256);
        for (size_t i = 0; i < k; i++, total++)
          drop_pipe_logged(s, (nng_pipe){.id = ids[i]}, "it did not prove its tenant in time",
                           total < 16);
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
        drop_pipe(s, (nng_pipe){.id = ids[i]}, "it does not read its replies");
    }
    storage_reap(false);
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
void (*server_test_before_handle)(server *s, uint32_t pipe, uint16_t method);

static char *http_metrics(void *arg, size_t *len)
{
  return metrics_render(arg, len);
}

static bool http_ready(void *arg)
{
  server *s = arg;
  return atomic_load(&s->ready);
}

int server_start(const server_config *cfg, server **out, tport_err *err)
{
  int crc = config_check(cfg, err);
  if (crc)
    return crc;
  server *s = calloc(1, sizeof *s);
  if (!s)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
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
  /* the key of --metrics-tenants hash: this server's alone */
  int rc = RAND_bytes(s->metrics_key, sizeof s->metrics_key) == 1
               ? TPORT_OK
               : tport_err_set(err, TPORT_INTERNAL, "RAND_bytes failed (the metrics key)");
  /* the endpoint first: /healthz answers (and /readyz says 503) while the
   * devices and listeners come up, and a port taken is said at once */
  if (!rc && cfg->http_listen) {
    http_routes routes = {.metrics = http_metrics, .ready = http_ready, .arg = s};
    rc = http_start(cfg->http_listen, &routes, &s->http, err);
    if (!rc)
      log_event(LOG_INFO, "metrics and health endpoint listening", "address", cfg->http_listen,
                NULL);
  }
  if (!rc)
    rc = configure_engine(cfg, err);
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
  nng_tls_config *tls = NULL;
  bool any_tls = false;
  listen_url lu[CONFIG_MAX_LISTEN];
  for (int i = 0; i < cfg->nlisten && !rc; i++) /* config_check has read them */
    if (!(rc = listen_url_parse(cfg->listen[i], &lu[i], err)))
      any_tls = any_tls || lu[i].encrypted;
  if (!rc && any_tls) {
    transport_tls_server_opts to = {.cert_file = cfg->tls_cert,
                                    .key_file = cfg->tls_key,
                                    .client_ca_file = cfg->tls_ca,
                                    .allow_tls12 = cfg->tls12};
    rc = transport_tls_server_config(&to, &tls, err);
  }
  if (!rc && cfg->auth_file) {
    rc = auth_file_load(cfg->auth_file, &s->auth, err);
    if (!rc && !(s->limiter = auth_limiter_new()))
      rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
    if (!rc)
      log_msg(LOG_INFO, "authentication on: %zu tenants in %s", auth_file_count(s->auth),
              cfg->auth_file);
  }
  if (!rc && !cfg->auth_file && !cfg->tls_ca && cfg->local_secret) {
    /* no auth file: the local secret proves the server's own user, and
     * nobody else is anybody (local_secret.h) */
    uint8_t secret[HELLO_SECRET_MAX_BYTES];
    size_t len = 0;
    tport_err why;
    rc = transport_local_secret_ensure(cfg->local_secret, secret, &len, &why);
    if (rc)
      tport_err_set(err, rc, "--local-secret: %s (or --local-secret off, or --auth-file)",
                    why.msg);
    else
      rc = auth_file_any_tenant(secret, len, &s->auth, err);
    OPENSSL_cleanse(secret, sizeof secret);
    if (!rc) {
      s->authn = s->local = true;
      log_event(LOG_INFO, "authentication on: clients prove the local secret of this user",
                "file", cfg->local_secret, NULL);
    }
  } else if (!rc && !s->authn) {
    log_msg(LOG_WARN, "authentication off (--local-secret off): any process that reaches the "
                      "listeners may claim any tenant but an --admin one");
  }
  int rv;
  if (!rc && (rv = nng_rep0_open(&s->sock)) != 0)
    rc = tport_err_set(err, TPORT_INTERNAL, "nng_rep0_open: %s", nng_strerror(rv));
  if (rc) {
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
    return rc;
  }
  s->max_connections = config_max_connections(cfg);
  s->request_memory = config_request_memory(cfg);
  nng_pipe_notify(s->sock, NNG_PIPE_EV_ADD_PRE, pipe_cb, s);
  nng_pipe_notify(s->sock, NNG_PIPE_EV_REM_POST, pipe_cb, s);
  if (!(s->fq = fq_new(config_tenant_workers(cfg))))
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  s->nworkers = 0;
  s->workers = calloc((size_t)cfg->workers, sizeof *s->workers);
  for (int i = 0; i < cfg->workers && !rc && s->workers; i++)
    if (pthread_create(&s->workers[i], NULL, worker_main, s) == 0)
      s->nworkers++;
  if (!rc && s->nworkers < cfg->workers)
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "cannot start %d worker threads",
                       cfg->workers);
  pthread_create(&s->reaper, NULL, reaper_main, s);
  /* the first --contexts contexts now, so that nng refusing them is said
   * at start; their receives are posted once the listeners are up */
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
  /* regions before the first connection can arrive (pipe_cb drops theirs) */
  if (!rc && cfg->shm_socket) {
    shm_config sc = {.path = cfg->shm_socket,
                     .mode = cfg->shm_mode,
                     .quota = cfg->shm_quota,
                     .total_max = cfg->shm_max,
                     .max_regions = (size_t)cfg->shm_max_regions,
                     .max_ipc = cfg->cuda_ipc_max,
                     .token_ms = cfg->shm_token_ms};
    tport_err why;
    if (shm_start(&sc, &s->shm, &why) == TPORT_OK) {
      size_t quota, max;
      shm_limits(s->shm, &quota, &max);
      char q[32], m[32];
      snprintf(q, sizeof q, "%zu", quota);
      snprintf(m, sizeof m, "%zu", max);
      log_event(LOG_INFO, "same-host shared memory", "socket", cfg->shm_socket, "quota", q, "max",
                m, NULL);
    } else if (cfg->shm_socket_set)
      rc = tport_err_set(err, why.code, "--shm-socket: %s", why.msg);
    else
      log_msg(LOG_WARN, "same-host shared memory is off: %s (set --shm-socket)", why.msg);
  }
  for (int i = 0; i < cfg->nlisten && !rc; i++) {
    nng_listener *l = &s->listeners[s->nlisteners];
    if ((rv = nng_listener_create(l, s->sock, cfg->listen[i])) != 0) {
      rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "--listen %s: %s", cfg->listen[i],
                         nng_strerror(rv));
      break;
    }
    nng_listener_set_size(*l, NNG_OPT_RECVMAXSZ, cfg->max_message_bytes);
    if (lu[i].encrypted && (rv = nng_listener_set_ptr(*l, NNG_OPT_TLS_CONFIG, tls)) != 0) {
      rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "--listen %s: TLS: %s", cfg->listen[i],
                         nng_strerror(rv));
      nng_listener_close(*l);
      break;
    }
    if (lu[i].transport == LISTEN_IPC &&
        (rv = nng_listener_set_int(*l, NNG_OPT_IPC_PERMISSIONS, (int)cfg->ipc_mode)) != 0) {
      rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "--listen %s: --ipc-mode: %s",
                         cfg->listen[i], nng_strerror(rv));
      nng_listener_close(*l);
      break;
    }
    if ((rv = nng_listener_start(*l, 0)) != 0) {
      rc = tport_err_set(err, TPORT_UNAVAILABLE, "cannot listen on %s: %s", cfg->listen[i],
                         nng_strerror(rv));
      nng_listener_close(*l);
      break;
    }
    /* what the safe defaults took for loopback is bound to loopback
     * (localhost is a name: listen_url.h); no request is served before this */
    nng_sockaddr bound;
    if (lu[i].loopback && ((rv = nng_listener_get_addr(*l, NNG_OPT_LOCADDR, &bound)) != 0 ||
                           !listen_addr_is_loopback(&bound))) {
      char where[INET6_ADDRSTRLEN + 64] = "an address that is not IP";
      if (rv)
        snprintf(where, sizeof where, "an address nng cannot tell (%s)", nng_strerror(rv));
      else if (bound.s_family == NNG_AF_INET)
        inet_ntop(AF_INET, &bound.s_in.sa_addr, where, sizeof where);
      else if (bound.s_family == NNG_AF_INET6)
        inet_ntop(AF_INET6, bound.s_in6.sa_addr, where, sizeof where);
      rc = tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "--listen %s was bound to %s, which is not a loopback address: name "
                         "127.0.0.1 or [::1] instead",
                         cfg->listen[i], where);
      nng_listener_close(*l);
      break;
    }
    s->nlisteners++;
    log_event(LOG_INFO, "listening", "url", cfg->listen[i], NULL);
  }
  if (tls)
    nng_tls_config_free(tls); /* each listener holds its own reference */
  if (rc) {
    server_stop(s, 0);
    return rc;
  }
  pthread_mutex_lock(&s->qmu);
  post_receives(s);
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
   * New connections are refused (pipe_cb); the listeners stay open until
   * the grace period ends, because closing an nng listener closes every
   * connection it accepted, and the replies of the requests in flight
   * would be lost with them. */
  atomic_store(&s->ready, false);
  atomic_store(&s->draining, true);
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
  /* no context is opened from here on (post_receives sees stopping) */
  for (srv_ctx *x = s->ctxs; x; x = x->all_next)
    nng_aio_stop(x->aio);
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
    nng_aio_free(x->aio);
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
