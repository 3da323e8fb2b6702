/*
 * window.c: a transfer's chunks with up to the server's window of requests
 * in flight -- the loop under every put and get that goes by the socket,
 * stopped between chunks by a cancelled request.
 * What a chunk's request says and what its reply means are the caller's
 * (make and take); this file only keeps the window full and the replies
 * in order.  A batch's requests (client_run_units) may depend on earlier
 * ones: a chunk of an upload goes once its PutBegin was answered, its
 * PutCommit once its chunks were; the window then sends what it can and
 * waits only where the next request must.
 */
#include "client_internal.h"

static size_t needs(window_after_fn after, void *ctx, size_t unit)
{
  size_t n = after ? after(ctx, unit) : 0;
  return n < unit ? n : unit;
}

/* The loop of both: units of chunk bytes (units of 1 for a batch); unit at
 * offset u is sent only once after(ctx, u) of the replies were taken (after
 * NULL: at once); a unit make answers with no message is skipped. */
static int run(tport_client *c, size_t nbytes, size_t chunk, window_make_fn make,
               window_reply_fn take, window_after_fn after, window_into_fn into, void *ctx,
               tport_progress_fn progress, void *arg, const atomic_bool *stop, tport_err *err)
{
  client_slot slots[CLIENT_MAX_WINDOW];
  bool skipped[CLIENT_MAX_WINDOW];
  int nslots = 0, rc = TPORT_OK, head = 0, inflight = 0;
  size_t next = 0, done = 0, taken = 0;
  /* as many credits as there are requests to send, up to the window: a
   * batch of one request took the whole window (with tportd's defaults,
   * four of them held every credit; where the window is all a server
   * allows, one stopped every other request of the client) */
  size_t units = chunk ? nbytes / chunk + (nbytes % chunk != 0) : 0;
  int credits = units < (size_t)c->window ? (int)(units ? units : 1) : c->window;
  if ((rc = client_credits_take(c, credits, err)) != TPORT_OK)
    return rc;
  while (nslots < credits && (rc = client_slot_open(c, &slots[nslots], err)) == TPORT_OK)
    nslots++;
  if (nslots > 0)
    rc = TPORT_OK; /* fewer contexts than the window: still fine */
  bool draining = false;
  while (!rc && (next < nbytes || inflight > 0)) {
    if (!draining && stop && atomic_load(stop)) {
      tport_err_set(err, TPORT_CANCELLED, "cancelled after %zu of %zu bytes", done, nbytes);
      if (!after) {
        rc = TPORT_CANCELLED;
        break;
      }
      /* a batch's requests in flight are answered first: one may be a
       * commit, and an element's result must say what the server did */
      draining = true;
      next = nbytes; /* nothing more goes */
      continue;
    }
    /* a unit depends on earlier units alone (clamped so): with nothing in
     * flight every one was taken, so the next can always go */
    while (!rc && inflight < nslots && next < nbytes && needs(after, ctx, next) <= taken) {
      client_slot *s = &slots[(head + inflight) % nslots];
      nng_msg *m = NULL;
      s->offset = next;
      s->len = nbytes - next < chunk ? nbytes - next : chunk;
      rc = make(ctx, s->offset, s->len, &m, err);
      if (!rc) {
        /* a skipped unit keeps its place in the ring, answered when its
         * turn comes: taken counts the first units answered, in order */
        skipped[(head + inflight) % nslots] = m == NULL;
        uint8_t *dst[CLIENT_TAIL_SEGMENTS];
        size_t n[CLIENT_TAIL_SEGMENTS];
        unsigned k = m && into ? into(ctx, s->offset, s->len, dst, n) : 0;
        if (k)
          client_slot_recv_into(s, dst, n, k);
        if (m)
          client_slot_send(s, m);
        next += s->len;
        inflight++;
      }
    }
    if (rc || inflight == 0)
      continue; /* stopped, or all sent and taken */
    client_slot *s = &slots[head];
    if (!skipped[head]) {
      rc = client_slot_finish(s, err);
      if (!rc)
        rc = take(ctx, s, err);
    }
    head = (head + 1) % nslots;
    inflight--;
    taken += s->len;
    if (!rc) {
      done += s->len;
      if (progress)
        progress(arg, done, nbytes);
    }
  }
  if (draining && !rc)
    rc = TPORT_CANCELLED; /* err says so */
  for (int i = 0; i < nslots; i++)
    client_slot_close(&slots[i]);
  client_credits_give(c, credits);
  return rc;
}

int client_run_window(tport_client *c, size_t nbytes, size_t chunk, window_make_fn make,
                      window_reply_fn take, void *ctx, tport_progress_fn progress, void *arg,
                      const atomic_bool *stop, tport_err *err)
{
  return run(c, nbytes, chunk, make, take, NULL, NULL, ctx, progress, arg, stop, err);
}

int client_run_window_into(tport_client *c, size_t nbytes, size_t chunk, window_make_fn make,
                           window_reply_fn take, window_into_fn into, void *ctx,
                           tport_progress_fn progress, void *arg, const atomic_bool *stop,
                           tport_err *err)
{
  return run(c, nbytes, chunk, make, take, NULL, into, ctx, progress, arg, stop, err);
}

int client_run_units(tport_client *c, size_t n, window_make_fn make, window_reply_fn take,
                     window_after_fn after, window_into_fn into, void *ctx, const atomic_bool *stop,
                     tport_err *err)
{
  return run(c, n, 1, make, take, after, into, ctx, NULL, NULL, stop, err);
}
