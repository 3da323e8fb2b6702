/* batch_region.c: slots of the automatic region for a batch's groups
 * (batch_region.h). */
#include "batch_region.h"

void batch_region_open(tport_client *c, batch_region *br, size_t ngroups, size_t slot_bytes,
                       bool grow)
{
  *br = (batch_region){0};
  /* a slot for each request the window may have in flight */
  size_t nslots = ngroups < (size_t)c->window ? ngroups : (size_t)c->window;
  if (nslots == 0 || nslots > CLIENT_MAX_WINDOW || slot_bytes == 0 ||
      slot_bytes > CLIENT_SHM_MAX_BYTES / nslots)
    return;
  size_t cap = nslots * slot_bytes;
  /* fewer bytes go faster by the socket than a region is made and mapped
   * (a fresh region's pages fault in at ~1.4 ms a MiB on a VM) */
  if (grow && cap < CLIENT_SHM_MIN_BYTES)
    return;
  struct tport_shm *r = client_shm_auto_take(c, grow ? cap : 0);
  if (!r) {
    br->want = grow ? 0 : cap; /* none yet: wanted at the close */
    return;
  }
  size_t fit = tport_shm_size(r) / slot_bytes;
  size_t want = fit < nslots ? cap : 0;
  if (!grow && fit < nslots)
    nslots = fit; /* what the region holds now */
  if (nslots == 0 || fit < nslots) {
    client_shm_auto_done(c, want); /* grown at its next use */
    return;
  }
  br->want = want;
  br->r = r;
  br->slot_bytes = slot_bytes;
  for (size_t i = 0; i < nslots; i++)
    br->free[br->nfree++] = nslots - 1 - i; /* slot 0 first */
}

size_t batch_region_take(tport_client *c, batch_region *br)
{
  /* a region of an earlier connection is not the server's now */
  if (!br->r || br->nfree == 0 || br->r->pipe != atomic_load(&c->live_pipe))
    return BATCH_NO_SLOT;
  br->out++;
  return br->free[--br->nfree];
}

uint8_t *batch_region_at(const batch_region *br, size_t slot)
{
  return br->r->data + slot * br->slot_bytes;
}

void batch_region_give(batch_region *br, size_t slot)
{
  if (slot == BATCH_NO_SLOT)
    return;
  br->free[br->nfree++] = slot;
  br->out--;
}

void batch_region_close(tport_client *c, batch_region *br)
{
  if (!br->r) {
    if (br->want)
      client_shm_auto_want(c, br->want); /* none yet: made at the next use */
    br->want = 0;
    return;
  }
  /* a request sent and never answered may still be read by the server:
   * the next transfer's bytes must not be there then */
  if (br->out)
    client_shm_auto_retire(c);
  else
    client_shm_auto_done(c, br->want); /* grown at its next use */
  br->r = NULL;
}
