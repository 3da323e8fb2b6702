/*
 * batch_get_in_place.c: where the replies of a get batch's deferred window
 * have their ends read by nng straight into the elements' buffers (deploy/nng
 * 0014, client_slot_recv_into) -- a large element's chunks, and the last
 * CLIENT_TAIL_SEGMENTS elements of each GetBatch (batch_get_plan.c orders
 * each group's largest last) -- and what a GetBatch reply read so must be
 * to be taken as it lies.  An element the library makes the buffer of (a
 * DLPack get: no caller's buffer) has it made before its GetBatch goes, of
 * its planned size; it is the item's once the reply was taken in place,
 * else dropped with the element's other buffers.
 */
#include <stdlib.h>

#include "batch_get_deferred.h"
#include "get_blocks.h"

/* Where e's bytes go when its group's reply is read in place: the caller's
 * buffer, of room for its bytes as the server said them (d->exact: not a
 * cap, which would have the reply's end spread over buffers past the
 * tensors' bytes), or one made for it (deferred_group_buffers); not one
 * offered for a direct write or given a slice of the region. */
static uint8_t *place_of(const deferred_gets *d, const dget *e)
{
  const tport_get_item *it = &d->items[e->item];
  if (e->direct || e->sliced || !e->planned)
    return NULL;
  if (it->buf)
    return d->exact && e->planned <= it->cap ? it->buf : NULL;
  return e->buf; /* (made: of e->planned bytes) */
}

/* Whether a buffer may be made for e's bytes to be read into: the library
 * makes its buffer (no caller's), none yet. */
static bool may_make(const deferred_gets *d, const dget *e)
{
  return !d->items[e->item].buf && !e->buf && !e->direct && !e->sliced && e->planned;
}

/* How many of group g's last elements are read in place (the suffix of
 * its payload, in order) -- none where nothing would be (no nng 0014, a
 * transport that places nothing, a suffix under NNG_RECV_TAIL_MIN) -- each
 * with a buffer made for it where it may (made). */
static size_t group_placed(deferred_gets *d, size_t g, bool made)
{
#ifdef TPORT_NNG_RECV_TAIL
  size_t first = d->gstart[g], k = d->gstart[g + 1] - first, m = 0, bytes = 0;
  if (!d->c->lend_chunks)
    return 0;
  for (; m < k && m < CLIENT_TAIL_SEGMENTS; m++) {
    const dget *e = &d->el[d->small[first + k - 1 - m]];
    if (!place_of(d, e) && !(made && may_make(d, e)))
      break;
    bytes += e->planned;
  }
  if (bytes < NNG_RECV_TAIL_MIN)
    return 0;
  for (size_t i = 0; made && i < m; i++) {
    dget *e = &d->el[d->small[first + k - 1 - i]];
    if (may_make(d, e)) {
      e->buf = d->blocks ? get_block_alloc(e->planned) : malloc(e->planned);
      e->alloced = e->buf != NULL;
    }
    if (!place_of(d, e))
      return i; /* (not made: those after it only) */
  }
  return m;
#else
  (void)d, (void)g, (void)made;
  return 0;
#endif
}

void deferred_group_buffers(deferred_gets *d, size_t g)
{
  group_placed(d, g, true);
}

static unsigned group_into(deferred_gets *d, size_t g, uint8_t **dst, size_t *n)
{
  size_t first = d->gstart[g], k = d->gstart[g + 1] - first, m = group_placed(d, g, false);
  for (size_t i = 0; i < m; i++) {
    const dget *e = &d->el[d->small[first + k - m + i]];
    dst[i] = place_of(d, e);
    n[i] = e->planned;
  }
  return (unsigned)m;
}

dget *deferred_chunk_of(deferred_gets *d, size_t u, size_t *off, size_t *n)
{
  dget *e = &d->el[d->unit_el[u]];
  size_t chunk = d->c->chunk_bytes;
  *off = (u - e->first_chunk) * chunk;
  *n = e->planned - *off < chunk ? e->planned - *off : chunk;
  return e;
}

/* A chunk's reply read straight into its element's buffer. */
static unsigned chunk_into(deferred_gets *d, size_t u, uint8_t **dst, size_t *n)
{
  size_t off;
  dget *e = deferred_chunk_of(d, u, &off, n);
  dst[0] = e->buf + off;
  return e->state == DG_READING;
}

unsigned deferred_into(void *ctx, size_t u, size_t one, uint8_t **dst, size_t *n)
{
  (void)one;
  deferred_gets *d = ctx;
  if (d->unit_kind[u] == DU_CHUNK)
    return chunk_into(d, u, dst, n);
  if (d->unit_kind[u] == DU_GROUP)
    return group_into(d, d->unit_el[u], dst, n);
  return 0;
}

bool deferred_group_as_placed(const deferred_gets *d, size_t g, const Tport__GetBatchReply *r,
                              const client_payload *p, size_t m)
{
  size_t first = d->gstart[g], k = d->gstart[g + 1] - first, left = 0;
  if (r->n_gets != k || (r->n_deferred != 0 && r->n_deferred != k) || m > k)
    return false;
  for (size_t j = 0; j < k; j++) {
    const Tport__GetBeginReply *b = r->gets[j];
    tport_err scratch;
    bool inl = batch_element_status(b->status, &scratch) == TPORT_OK && !b->transfer.len &&
               !b->direct && !b->shm && !(r->n_deferred && r->deferred[j]);
    if (j >= k - m && (!inl || b->nbytes != d->el[d->small[first + j]].planned))
      return false;
    if (j < k - m && inl)
      left += (size_t)b->nbytes;
  }
  return left == p->len;
}

void deferred_take_placed(deferred_gets *d, dget *e, tport_get_item *it,
                          const Tport__GetBeginReply *b)
{
  /* (== e->planned, within the caller's cap or the buffer made: as placed) */
  size_t n = (size_t)b->nbytes;
  uint8_t *at = it->buf ? it->buf : e->buf;
  if (client_check_crc32c(d->c->verify, b->crc32c_set, b->crc32c, at, n, 0, &it->err))
    return;
  client_info_from_wire(b->info, &it->info);
  it->data = at;
  it->nbytes = n;
  if (!it->buf) { /* the buffer made for it is the item's now */
    e->buf = NULL;
    e->alloced = false;
  }
}
