/*
 * batch_region.h: the automatic region under a batch's groups, on the
 * same host.  Each group of elements in flight has a slot of the region: a
 * put's elements' bytes are copied there and the PutBatch names them by
 * slices, instead of carrying them -- one copy on each side, where the
 * socket took four (into the request, into and out of the kernel, into the
 * tensor): ~15% of a batch of 4 KiB tensors' time on a 2-core VM; a get's
 * deferred elements are written there by the server and copied out.
 *
 * A slot goes back when its request was answered (the server has read or
 * written it then) and, for a get, its bytes copied out; a request that
 * never was answered may still be carried out by the server later, so a
 * region with a slot out at the close is retired (client_shm_auto_retire),
 * never reused.
 */
#ifndef TPORT_CLIENT_BATCH_REGION_H
#define TPORT_CLIENT_BATCH_REGION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "client_internal.h"

#define BATCH_NO_SLOT ((size_t)-1)

typedef struct batch_region {
  struct tport_shm *r; /* locked (client_shm_auto_take); NULL: none */
  size_t slot_bytes;
  size_t want;         /* the size it lacked (!grow): grown at its next use */
  size_t nfree, out;   /* slots free, slots given to requests */
  size_t free[CLIENT_MAX_WINDOW];
} batch_region;

/* Takes the automatic region for a slot of slot_bytes for each of ngroups
 * requests that may be in flight at once (the client's window of them),
 * where it is on and not busy: grown to hold them where
 * such a transfer is large enough for a region (grow), or as large as it
 * is, for as many of them as it holds (!grow: a fresh region's pages cost
 * more than the socket's copies of bulk bytes, once; small elements' cost
 * is the socket's per-element work, which a region saves at once) and
 * grown at its next use (the next batch), as a get that did not fit grows
 * it (client_shm_auto_done).  Else br->r stays NULL. */
void batch_region_open(tport_client *c, batch_region *br, size_t ngroups, size_t slot_bytes,
                       bool grow);
/* A free slot (BATCH_NO_SLOT: none free, no region, or the region belongs
 * to a connection that is gone) and its memory. */
size_t batch_region_take(tport_client *c, batch_region *br);
uint8_t *batch_region_at(const batch_region *br, size_t slot);
/* Slot back: its request was answered, or never sent. */
void batch_region_give(batch_region *br, size_t slot);
/* The region back to the client (retired where a slot is still out). */
void batch_region_close(tport_client *c, batch_region *br);

#endif
