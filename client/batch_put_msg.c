/*
 * batch_put_msg.c: a PutBatch request of a put batch (batch_put.h) and its
 * reply.  An element that commits at once has its bytes in the request's
 * payload (copied in, or lent where large), or, on the same host, copied
 * into its group's slot of the automatic region and named by a slice.
 */
#include <stdlib.h>
#include <string.h>

#include "batch_put.h"
#include "crc32c.h"

bool batch_put_is_lent(const tport_client *c, size_t nbytes)
{
  return c->lend_chunks && nbytes >= BATCH_LEND_MIN;
}

tport_put_item *batch_put_group_kth(put_plan *pp, size_t first, size_t j)
{
  return &pp->items[pp->idx[first + j]];
}

tport_put_item *batch_put_begun_kth(put_plan *pp, size_t first, size_t j)
{
  return &pp->items[pp->ch[first + j].item];
}

/* A PutBatch of the k PutBegins qp (lens: their payloads' lengths): its
 * head, then the copied elements' bytes (copied of them in all), then the
 * nlent lent ones' (the group's last), lent to the message. */
static int batch_message(put_plan *pp, Tport__PutBeginRequest **qp, uint64_t *lens, size_t k,
                         kth_fn kth, size_t first, size_t copied, size_t nlent, bool direct,
                         nng_msg **out, tport_err *err)
{
  Tport__PutBatchRequest q = TPORT__PUT_BATCH_REQUEST__INIT;
  q.n_puts = q.n_payload_bytes = k;
  q.puts = qp;
  q.payload_bytes = lens;
  if (direct) { /* read only while this window waits (put_window) */
    q.fence_addr = (uint64_t)(uintptr_t)&pp->fence;
    q.fence_token = pp->fence_token;
  }
  size_t head = frame_head_size(&q.base);
  if (nng_msg_alloc(out, head + copied) != 0)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for a %zu-byte batch",
                         head + copied);
  uint8_t *at = nng_msg_body(*out);
  frame_write_head(at, TPORT__METHOD__METHOD_PUT_BATCH, 0, &q.base);
  at += head;
  for (size_t j = 0; j < k - nlent; j++) {
    tport_put_item *it = kth(pp, first, j);
    if (lens[j])
      memcpy(at, it->data, it->nbytes);
    at += lens[j];
  }
  if (!nlent)
    return TPORT_OK;
  const void *ps[CLIENT_LEND_SEGMENTS];
  size_t ns[CLIENT_LEND_SEGMENTS];
  for (size_t j = 0; j < nlent; j++) {
    tport_put_item *it = kth(pp, first, k - nlent + j);
    ps[j] = it->data;
    ns[j] = it->nbytes;
  }
  int rc = client_msg_lend(&pp->lent, *out, ps, ns, (int)nlent, err);
  if (rc)
    nng_msg_free(*out);
  return rc;
}

int batch_put_request(put_plan *pp, size_t first, size_t k, kth_fn kth, bool commit, size_t slot,
                      nng_msg **out, tport_err *err)
{
  bool direct = commit && slot == BATCH_DIRECT;
  bool in_slot = commit && slot != BATCH_NO_SLOT && !direct;
  Tport__TensorDesc *descs = calloc(k, sizeof *descs);
  Tport__PutBeginRequest *qs = calloc(k, sizeof *qs);
  Tport__PutBeginRequest **qp = calloc(k, sizeof *qp);
  uint64_t *lens = calloc(k, sizeof *lens);
  Tport__ShmSlice *slices = in_slot || direct ? calloc(k, sizeof *slices) : NULL;
  tport_put_options defaults;
  tport_put_options_init(&defaults);
  size_t copied = 0, nlent = 0, at = 0;
  int rc = descs && qs && qp && lens && (slices || !(in_slot || direct))
               ? TPORT_OK
               : tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for a batch");
  for (size_t j = 0; !rc && j < k; j++) {
    tport_put_item *it = kth(pp, first, j);
    client_put_request(pp->c, it->dtype, it->ndim, it->sizes, it->strides,
                       it->opts ? it->opts : &defaults, &descs[j], &qs[j]);
    qs[j].commit = commit;
    if (commit && pp->c->verify) {
      qs[j].crc32c_set = true;
      qs[j].crc32c = transport_crc32c(0, it->data, it->nbytes);
    }
    qp[j] = &qs[j];
    lens[j] = commit ? it->nbytes : 0;
    if (direct) {
      /* read by the server from where they are (the plan's direct
       * elements: none empty) */
      slices[j] = (Tport__ShmSlice)TPORT__SHM_SLICE__INIT;
      slices[j].region = pp->proc;
      slices[j].offset = (uint64_t)(uintptr_t)it->data;
      slices[j].length = it->nbytes;
      qs[j].shm = &slices[j];
      lens[j] = 0;
    } else if (in_slot && it->nbytes && it->nbytes <= pp->region.slot_bytes - at) {
      /* (the slots are as large as the largest group: always within) */
      memcpy(batch_region_at(&pp->region, slot) + at, it->data, it->nbytes);
      slices[j] = client_slice(pp->region.r, slot * pp->region.slot_bytes + at, it->nbytes);
      qs[j].shm = &slices[j];
      at += it->nbytes;
      lens[j] = 0;
    } else if (commit && batch_put_is_lent(pp->c, it->nbytes)) {
      nlent++; /* the group's last (plan_groups) */
    } else {
      copied += lens[j]; /* within a chunk (the groups' bound) */
    }
  }
  if (!rc)
    rc = batch_message(pp, qp, lens, k, kth, first, copied, nlent, direct, out, err);
  free(descs), free(qs), free(qp), free(lens), free(slices);
  return rc;
}

int batch_put_reply(put_plan *pp, client_slot *s, size_t k, Tport__PutBatchReply **r,
                    tport_err *err)
{
  int rc = client_unpack_in(TPORT__METHOD__METHOD_PUT_BATCH, s->reply,
                            &tport__put_batch_reply__descriptor, &pp->replies,
                            (ProtobufCMessage **)r, NULL, err);
  if (!rc && (*r)->n_puts != k)
    rc = tport_err_set(err, TPORT_DATA_LOSS, "the server answered %zu of %zu elements",
                       (*r)->n_puts, k);
  return rc;
}
