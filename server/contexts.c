/*
 * contexts.c: the nng contexts, each a request slot with its own state
 * machine, and the workers' queue they feed.
 *
 * A context's life: RECV (an nng_ctx_recv is pending) -> its callback takes
 * the message and queues the context for a worker -> WORK (a worker parses,
 * dispatches and builds the reply) -> SEND (nng_ctx_send pending) -> its
 * callback re-arms RECV.  Callbacks only move messages and queue work; they
 * never block and never touch the engine.  A request that waits for a name
 * goes WORK -> PARKED (no worker holds it) -> WORK again, queued by its
 * timer or by the registry's wake, and is handled anew: found, timed out,
 * or parked again.  A wake that comes late only queues it once more.
 */
#include <nng/nng.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "server_internal.h"

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
static void ctx_timer_cb(void *arg);
static void ctx_wake(void *arg);

/* One more context, idle (qmu held).  NULL when nng or memory refuses. */
srv_ctx *ctx_open(server *s)
{
  srv_ctx *x = calloc(1, sizeof *x);
  if (!x)
    return NULL;
  x->srv = s;
  x->state = CTX_IDLE;
  x->waiter.wake = ctx_wake;
  x->waiter.arg = x;
  if (nng_aio_alloc(&x->aio, ctx_cb, x) != 0) {
    free(x);
    return NULL;
  }
  if (nng_aio_alloc(&x->timer, ctx_timer_cb, x) != 0) {
    nng_aio_free(x->aio);
    free(x);
    return NULL;
  }
  if (nng_ctx_open(&x->ctx, s->sock) != 0) {
    nng_aio_free(x->timer);
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
void ctx_post_receives(server *s)
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

/* The request of x is done: its reply (if any) goes out with a time limit,
 * else x goes idle.  Called by a worker (the request was queued) or by the
 * receive callback (a request refused before queueing). */
void ctx_finish(server *s, srv_ctx *x, nng_msg *reply)
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
uint16_t frame_method_of(nng_msg *m)
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
  x->first_ms = x->queued_ms;
  x->park_until_ms = 0;
  x->wake_pending = false;
  x->again = false;
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
  ctx_post_receives(s); /* this context's receive is replaced at once */
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
    memcpy(x->tenant, tenant, sizeof x->tenant);
    fq_push(s->fq, x->tenant, &x->fq);
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
        server_drop_pipe(s, p, "it does not read its replies");
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
  case CTX_PARKED: /* its timer has an aio of its own */
  case CTX_IDLE: return;
  }
}

/* ---------------------------------------------------------------- waits */

/* x back in the workers' queue, to be handled anew (qmu held). */
static void ctx_requeue(server *s, srv_ctx *x)
{
  x->state = CTX_WORK;
  x->wake_pending = false;
  x->again = true;
  x->queued_ms = mono_ms();
  fq_push(s->fq, x->tenant, &x->fq);
  pthread_cond_signal(&s->qcv);
}

void ctx_park(server *s, srv_ctx *x)
{
  pthread_mutex_lock(&s->qmu);
  if (x->fq.owner) {
    fq_done(s->fq, &x->fq); /* its tenant's running slot goes with the worker */
    if (fq_queued(s->fq))
      pthread_cond_signal(&s->qcv);
  }
  int64_t left = x->park_until_ms - mono_ms();
  x->park_until_ms = 0;
  if (x->wake_pending || atomic_load(&s->draining) || s->stopping || left <= 0) {
    /* woken between its lookup and now: the wake is not lost */
    reg_unwait(&s->reg, &x->waiter);
    ctx_requeue(s, x);
  } else {
    x->state = CTX_PARKED;
    nng_sleep_aio((nng_duration)left, x->timer);
  }
  pthread_mutex_unlock(&s->qmu);
}

/* The registry's wake (a name published, the connection closing): on the
 * publishing thread, without the registry's lock.  A parked x is queued
 * by its timer's callback (cancelled here: it never runs inline); one not
 * parked yet is queued as soon as it parks. */
static void ctx_wake(void *arg)
{
  srv_ctx *x = arg;
  server *s = x->srv;
  pthread_mutex_lock(&s->qmu);
  if (x->state == CTX_PARKED)
    nng_aio_cancel(x->timer);
  else
    x->wake_pending = true;
  pthread_mutex_unlock(&s->qmu);
}

/* A parked request's timer: its time is up, or it was cancelled by a wake
 * or by the server draining.  Either way it is handled again (a late
 * callback of an earlier wait finds x no longer parked, and does nothing). */
static void ctx_timer_cb(void *arg)
{
  srv_ctx *x = arg;
  server *s = x->srv;
  pthread_mutex_lock(&s->qmu);
  if (x->state != CTX_PARKED) {
    pthread_mutex_unlock(&s->qmu);
    return;
  }
  reg_unwait(&s->reg, &x->waiter);
  if (s->stopping) {
    /* no worker takes it any more: the context is done (its message is
     * freed with it) */
    reg_request_leave(&s->reg, nng_pipe_id(x->pipe));
    x->state = CTX_IDLE;
    if (--s->busy == 0)
      pthread_cond_broadcast(&s->idle);
  } else {
    ctx_requeue(s, x);
  }
  pthread_mutex_unlock(&s->qmu);
}

void ctx_wake_parked(server *s)
{
  pthread_mutex_lock(&s->qmu);
  for (srv_ctx *x = s->ctxs; x; x = x->all_next)
    if (x->state == CTX_PARKED)
      nng_aio_cancel(x->timer);
  pthread_mutex_unlock(&s->qmu);
}
