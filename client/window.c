/*
 * window.c: a transfer's chunks with up to the server's window of requests
 * in flight -- the loop under every put and get that goes by the socket,
 * stopped between chunks by a cancelled request.
 * What a chunk's request says and what its reply means are the caller's
 * (make and take); this file only keeps the window full and the replies
 * in order.
 */
#include "client_internal.h"

/* Moves nbytes in chunks with up to the server's window of requests in
 * flight, each on its own context; chunks go out in order and their replies
 * are taken oldest first. */
int client_run_window(tport_client *c, size_t nbytes, size_t chunk, window_make_fn make,
                      window_reply_fn take, void *ctx, tport_progress_fn progress, void *arg,
                      const atomic_bool *stop, tport_err *err)
{
  client_slot slots[CLIENT_MAX_WINDOW];
  int nslots = 0, rc = TPORT_OK, head = 0, inflight = 0;
  size_t next = 0, done = 0;
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
  while (!rc && (next < nbytes || inflight > 0)) {
    if (stop && atomic_load(stop))
      rc = tport_err_set(err, TPORT_CANCELLED, "cancelled after %zu of %zu bytes", done, nbytes);
    while (!rc && inflight < nslots && next < nbytes) {
      client_slot *s = &slots[(head + inflight) % nslots];
      nng_msg *m;
      s->offset = next;
      s->len = nbytes - next < chunk ? nbytes - next : chunk;
      rc = make(ctx, s->offset, s->len, &m, err);
      if (!rc) {
        client_slot_send(s, m);
        next += s->len;
        inflight++;
      }
    }
    if (rc || inflight == 0)
      break;
    client_slot *s = &slots[head];
    rc = client_slot_finish(s, err);
    if (!rc)
      rc = take(ctx, s, err);
    head = (head + 1) % nslots;
    inflight--;
    if (!rc) {
      done += s->len;
      if (progress)
        progress(arg, done, nbytes);
    }
  }
  for (int i = 0; i < nslots; i++)
    client_slot_close(&slots[i]);
  client_credits_give(c, credits);
  return rc;
}
