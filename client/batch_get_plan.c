/*
 * batch_get_plan.c: the units of a get batch's deferred elements' window
 * (batch_get_deferred.c): which go in GetBatches together, which as
 * GetBegins of their own (and their GetChunks), and in what order.
 */
#include <stdlib.h>

#include "batch_get_deferred.h"

uint64_t deferred_direct_region(const tport_get_item *it, size_t planned, uint64_t region)
{
  /* (smaller: inline) */
  return it->buf && planned >= CLIENT_SHM_MIN_BYTES && it->cap >= CLIENT_SHM_MIN_BYTES ? region : 0;
}

/* Whether tportd would lend e's bytes into its group's reply: a quarter
 * MiB or more (smaller ones it copies), not offered for a direct write. */
static bool lent_inline(const dget *e)
{
  return e->planned >= CLIENT_SHM_MIN_BYTES && !e->direct;
}

/* A group being packed: its elements lent (lent_inline), its bytes
 * written into the caller's buffers, and its others. */
typedef struct group_fill {
  size_t lent, direct, other;
} group_fill;

/* The small deferred elements (d->small[0 .. nsmall), their bytes in
 * d->el[].planned) into GetBatches, first fit in decreasing size: each of
 * a chunk of bytes inline or in slices, up to GET_GROUP of them lent, and
 * those the server writes into the caller's buffers as many as one write
 * of them takes (client_get_batch_direct_bytes) -- in the order of their
 * names, ResNet-50's 42 deferred tensors of 0.5 to 4 MiB took 21
 * GetBatches, packed 15 (on a VM every request costs wake-ups beyond its
 * bytes), its 156 tensors written directly 4 (a request each cost a write
 * of its own, its threads and wake-ups: the batch ran at 0.7 of one get of
 * the same bytes on a 2-core VM).  Leaves each group's elements together
 * in d->small, group g's from d->gstart[g]; returns the number of groups
 * (0: out of memory). */
static size_t pack_groups(deferred_gets *d, size_t nsmall)
{
  _Static_assert(BATCH_MAX_ELEMENTS <= UINT16_MAX, "a group's number fits group_of");
  size_t chunk = d->c->chunk_bytes, most = client_get_batch_direct_bytes(d->c), ngroups = 0;
  size_t *order = d->unit_el; /* scratch: the units are planned after */
  uint16_t *group_of = malloc((nsmall ? nsmall : 1) * sizeof *group_of);
  group_fill *fill = malloc((nsmall ? nsmall : 1) * sizeof *fill);
  if (!group_of || !fill) {
    free(group_of), free(fill);
    return 0;
  }
  /* insertion sort by bytes, largest first (at most BATCH_MAX_ELEMENTS) */
  for (size_t i = 0; i < nsmall; i++) {
    size_t j = i, e = d->small[i];
    for (; j > 0 && d->el[order[j - 1]].planned < d->el[e].planned; j--)
      order[j] = order[j - 1];
    order[j] = e;
  }
  for (size_t i = 0; i < nsmall; i++) {
    const dget *e = &d->el[order[i]];
    size_t g = 0, n = e->planned;
    bool lent = lent_inline(e);
    for (; g < ngroups; g++) {
      group_fill *f = &fill[g];
      if (!(lent && f->lent == GET_GROUP) &&
          (e->direct ? f->direct + n <= most : f->other + n <= chunk))
        break;
    }
    if (g == ngroups)
      fill[ngroups++] = (group_fill){0};
    fill[g].lent += lent;
    *(e->direct ? &fill[g].direct : &fill[g].other) += n;
    group_of[i] = (uint16_t)g;
  }
  /* each group's elements together, groups in order, the largest last:
   * tportd lends a suffix of a reply's payloads (at most GET_GROUP), and
   * libtport has a suffix read straight into its buffers (group_into) */
  size_t at = 0;
  for (size_t g = 0; g < ngroups; g++) {
    d->gstart[g] = at;
    for (size_t i = nsmall; i-- > 0;)
      if (group_of[i] == g)
        d->small[at++] = order[i];
  }
  d->gstart[ngroups] = nsmall;
  free(group_of), free(fill);
  return ngroups;
}

/* The units of d's n elements (items' planned bytes): first the GetBegin
 * of each large one the server may write into the caller's buffer (the
 * longest requests: begun first, so that the others' fill the time
 * around them -- after one another, before the window, ResNet-50's five
 * such tensors took as long as its 31 other deferred ones in it); the
 * small ones' GetBatches (pack_groups); then each other large one's
 * GetBegin one element ahead of its chunks: answered by the time they go,
 * and only the transfers of the requests in flight open on the server (a
 * connection may hold --max-transfers, 16 by default: all of them begun at
 * once, a state dict's were refused past it).  Returns the number of
 * units. */
size_t deferred_plan(deferred_gets *d, const size_t *planned, size_t k, size_t *large)
{
  size_t i = 0, u = 0, nlarge = 0, nsmall = 0, ndirect = 0, chunk = d->c->chunk_bytes;
  size_t most = client_get_batch_direct_bytes(d->c);
  for (size_t j = 0; j < k; j++) {
    if (d->items[j].err.code != NOT_ANSWERED)
      continue;
    dget *e = &d->el[i];
    e->item = j;
    e->planned = planned[j];
    const tport_get_item *it = &d->items[j];
    e->direct_region = deferred_direct_region(it, planned[j], d->proc_region);
    e->direct = e->direct_region != 0;
    if (planned[j] > chunk && !e->direct) {
      e->nchunks = planned[j] / chunk + (planned[j] % chunk != 0);
      large[nlarge++] = i;
    } else if (planned[j] > most && e->direct) {
      ndirect++;
    } else {
      d->small[nsmall++] = i;
    }
    i++;
  }
  size_t ngroups = d->ngroups = pack_groups(d, nsmall);
  for (size_t m = 0; nsmall && !ngroups && m < nsmall; m++) { /* out of memory */
    d->el[d->small[m]].state = DG_DONE;
    tport_err_set(&d->items[d->el[d->small[m]].item].err, TPORT_RESOURCE_EXHAUSTED,
                  "out of memory");
  }
  for (size_t m = 0; ndirect && m < i; m++)
    if (d->el[m].direct && d->el[m].planned > most) {
      d->el[m].begin_unit = u;
      d->unit_el[u] = m;
      d->unit_kind[u++] = DU_BEGIN;
    }
  for (size_t g = 0; g < ngroups; g++) {
    d->unit_el[u] = g;
    d->unit_kind[u++] = DU_GROUP;
  }
  for (size_t m = 0; m <= nlarge; m++) {
    if (m < nlarge) { /* the next one's GetBegin */
      d->el[large[m]].begin_unit = u;
      d->unit_el[u] = large[m];
      d->unit_kind[u++] = DU_BEGIN;
    }
    if (m == 0)
      continue;
    dget *e = &d->el[large[m - 1]]; /* the one before's chunks */
    e->first_chunk = u;
    for (size_t c2 = 0; c2 < e->nchunks; c2++) {
      d->unit_el[u] = large[m - 1];
      d->unit_kind[u++] = DU_CHUNK;
    }
  }
  return u;
}

/* Same host: a slot of the automatic region for each group that may be in
 * flight at once (as many as the region holds now), as large as the
 * largest group (at most a chunk). */
void deferred_open_region(deferred_gets *d)
{
  size_t most = 0;
  for (size_t g = 0; g < d->ngroups; g++) {
    size_t bytes = 0;
    for (size_t j = d->gstart[g]; j < d->gstart[g + 1]; j++)
      bytes += d->el[d->small[j]].direct ? 0 : d->el[d->small[j]].planned;
    most = bytes > most ? bytes : most;
  }
  if (!most) /* every one written into the caller's buffer: no slot needed */
    return;
  /* as large as it is (grown for the next batch): on a fresh client the
   * bench's ResNet-50 get batch went from 48-59 to 63-72 ms when the region
   * grew to 8 slots of 4 MiB first (its pages faulted in by the server's
   * writes, ~5 us each on a VM); once grown, 37-47 ms against 53-63 by
   * the socket */
  batch_region_open(d->c, &d->region, d->ngroups, most, false);
}
