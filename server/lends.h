/*
 * lends.h: replies whose payload is lent from a storage instead of copied
 * into them (call_reply_lent), until nng has sent them: which connections
 * take lent bytes, the lent tail of a reply, and the table of lends.
 *
 * A lend holds its storage: the bytes must stay until the transport has
 * written them.  Two things follow, both handled here:
 *  - nng may free the reply (and so end the lend) on its own threads, while
 *    it holds its own locks: the storage's reference is dropped with
 *    storage_release_deferred, never freeing memory there;
 *  - REP completes a reply's send once the connection's transport has taken
 *    it, so the send timeout never sees a reply its client does not read:
 *    with a copied reply that held a chunk; a lent one holds a whole
 *    storage, charged to nobody once its tensor is freed.  The reaper asks
 *    for the connections with a lend older than the send timeout and drops
 *    them (which frees their replies).
 */
#ifndef TPORT_LENDS_H
#define TPORT_LENDS_H

#include <nng/nng.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"

typedef struct lends lends;

lends *lends_new(void);
/* Frees the table once nng has freed every lent reply (after nng_close: the
 * transports may still free some on their threads, so it waits up to
 * wait_ms, then leaves the table to the last lend to free). */
void lends_free(lends *l, int wait_ms);

/* A lend of st's memory to a reply on pipe, with a reference to st; the
 * result is the argument of lends_end, to be called once when nng is done
 * with the reply.  NULL when out of memory (nothing held). */
void *lends_begin(lends *l, uint32_t pipe, tport_storage *st);
/* Ends a lend (nng's release callback of nng_msg_set_tail). */
void lends_end(void *lend);

/* The pipes (each once, at most max) with a lend begun before before_ms
 * (lends_now_ms's clock). */
size_t lends_overdue(lends *l, int64_t before_ms, uint32_t *pipes, size_t max);
/* Lends not yet ended. */
size_t lends_count(lends *l);
/* Lends lends_overdue has looked at, ever (tests: the overdue alone). */
uint64_t lends_walked(lends *l);
int64_t lends_now_ms(void);

#ifdef TPORT_NNG_LENT_TAIL
/* Whether nng sends a reply's lent tail on this connection straight from
 * memory: tcp:// and ipc:// do; any other transport (tls+tcp://, ws://,
 * inproc://) would copy it into the reply under nng's socket lock and
 * tportd's queue lock, where the worker's own copy holds no lock.  Told by
 * the scheme of the listener the connection came from (a ws:// connection's
 * address looks like a tcp one's). */
bool lends_pipe_takes_lent_bytes(uint32_t pipe);
/* Lends the n bytes at p, in st's memory, to msg as its tail
 * (nng_msg_set_tail): msg holds a reference to st until nng is done with
 * them.  false when out of memory (msg as it was, nothing held). */
bool lends_attach(lends *l, nng_msg *msg, uint32_t pipe, tport_storage *st, const void *p,
                  size_t n);
/* The k (1 to LENDS_SEGMENTS) lends begun (lends_begin) for the bytes
 * ps[i], ns[i] attached to a fresh msg as its tail's segments, in order
 * (deploy/nng 0012): they end together when nng is done with msg.  false
 * when they could not be: the caller frees msg, and every lend has ended
 * or ends with it. */
#define LENDS_SEGMENTS 4
bool lends_attach_begun(nng_msg *msg, void *const *lent, const void *const *ps, const size_t *ns,
                        int k);
#endif

#endif
