/*
 * dispatch.c: a request, from its frame to its reply: the frame parsed and
 * checked (a known method, the connection's proof, the queue's deadline, a
 * payload only where one belongs), the handler of its method run, and a
 * failure turned into an error reply.  The workers call this; the handlers
 * never call back into it.
 */
#include <nng/nng.h>
#include <stdio.h>

#include "log.h"
#include "arena.h"
#include "server_internal.h"

typedef int (*handler_fn)(call *c);

/* The handler of each method (NULL: unknown). */
static handler_fn handler_for(uint16_t method)
{
  static const handler_fn table[SERVER_METHODS] = {
      [TPORT__METHOD__METHOD_HELLO] = h_hello,
      [TPORT__METHOD__METHOD_DEVICES] = h_devices,
      [TPORT__METHOD__METHOD_PUT_BEGIN] = h_put_begin,
      [TPORT__METHOD__METHOD_PUT_CHUNK] = h_put_chunk,
      [TPORT__METHOD__METHOD_PUT_COMMIT] = h_put_commit,
      [TPORT__METHOD__METHOD_PUT_ABORT] = h_put_abort,
      [TPORT__METHOD__METHOD_GET_BEGIN] = h_get_begin,
      [TPORT__METHOD__METHOD_GET_CHUNK] = h_get_chunk,
      [TPORT__METHOD__METHOD_TO] = h_to,
      [TPORT__METHOD__METHOD_COPY] = h_copy,
      [TPORT__METHOD__METHOD_VIEW] = h_view,
      [TPORT__METHOD__METHOD_CONTIGUOUS] = h_contiguous,
      [TPORT__METHOD__METHOD_INFO] = h_info,
      [TPORT__METHOD__METHOD_LIST] = h_list,
      [TPORT__METHOD__METHOD_FREE] = h_free,
      [TPORT__METHOD__METHOD_SYNC] = h_sync,
      [TPORT__METHOD__METHOD_STATS] = h_stats,
      [TPORT__METHOD__METHOD_SHM_REGISTER] = h_shm_register,
      [TPORT__METHOD__METHOD_SHM_RELEASE] = h_shm_release,
      [TPORT__METHOD__METHOD_PUT_BATCH] = h_put_batch,
      [TPORT__METHOD__METHOD_GET_BATCH] = h_get_batch,
  };
  return method < SERVER_METHODS ? table[method] : NULL;
}

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

/* The largest request that may wait for a name (its Ref and a few fields;
 * a name is at most 256 bytes): what a parked request holds. */
#define WAIT_REQUEST_MAX 4096

nng_msg *dispatch_request(server *s, srv_ctx *x, arena *a)
{
  nng_msg *req = x->msg;
  int64_t queued_ms = x->queued_ms;
  call c = {.srv = s,
            .pipe = (uint32_t)nng_pipe_id(nng_msg_get_pipe(req)),
            .arrived_ns = x->arrived_ns,
            .waiter = &x->waiter,
            .first_ms = x->first_ms};
  tport_err_clear(&c.err);
  frame_view v;
  const uint8_t *body = nng_msg_body(req);
  size_t len = nng_msg_len(req);
  if (!x->again)
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
      v.method != TPORT__METHOD__METHOD_PUT_CHUNK && v.method != TPORT__METHOD__METHOD_PUT_BATCH)
    rc = tport_err_set(&c.err, TPORT_INVALID_ARGUMENT,
                       "%s takes no payload: %zu bytes came after the request", md->name,
                       v.payload_len);
  /* A batch is hundreds of fields, each a malloc and a free without the
   * arena; a single request is a handful.  Measured here (bench/RESULTS.md,
   * seventh session) the arena for every request made tcp's small puts
   * 1.5x slower once the server had moved large tensors, for reasons not
   * found; for batches only it keeps the gain on both transports. */
  bool batch = v.method == TPORT__METHOD__METHOD_PUT_BATCH ||
               v.method == TPORT__METHOD__METHOD_GET_BATCH;
  if (!rc)
    rc = frame_unpack_in(&v, md->input, batch ? a : NULL, &c.req, &c.err);
  if (!rc) {
    if (!x->again)
      atomic_fetch_add(&s->requests[v.method], 1);
    c.payload = v.payload;
    c.payload_len = v.payload_len;
    /* the deadline covers the time queued and the time running */
    engine_set_deadline(queued_ms + (int64_t)s->cfg.deadline_ms);
    rc = handler_for(v.method)(&c);
    engine_set_deadline(0);
    if (!batch) /* a batch's goes with the arena's reset */
      protobuf_c_message_free_unpacked(c.req, NULL);
  }
  if (!rc && c.park_until_ms && !c.out && x->held_bytes > WAIT_REQUEST_MAX) {
    /* a parked request keeps its body counted against --request-memory for
     * as long as it waits: a large one (unknown fields) would hold the
     * other tenants' requests out (found by review) */
    reg_unwait(&s->reg, &x->waiter);
    rc = tport_err_set(&c.err, TPORT_INVALID_ARGUMENT,
                       "a request that waits for a name is at most %d bytes: this one is %zu",
                       WAIT_REQUEST_MAX, x->held_bytes);
  }
  if (!rc && c.park_until_ms && !c.out) {
    /* waiting for a name: no reply yet (the worker parks x) */
    x->park_until_ms = c.park_until_ms;
    return NULL;
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
