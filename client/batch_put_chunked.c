/*
 * batch_put_chunked.c: the units of a put batch's elements longer than a
 * chunk (batch_put.h): their PutBegins together in a PutBatch, uncommitted;
 * then each one's chunks as PutChunks, and its PutCommit (or PutAbort)
 * once they were answered.
 */
#include <string.h>

#include "batch_put.h"
#include "crc32c.h"

int batch_put_begins_make(put_plan *pp, size_t b, nng_msg **out, tport_err *err)
{
  size_t first = pp->bstart[b];
  return batch_put_request(pp, first, pp->bstart[b + 1] - first, batch_put_begun_kth, false,
                           BATCH_NO_SLOT, NULL, out, err);
}

void batch_put_begins_take(put_plan *pp, client_slot *s, size_t b)
{
  size_t first = pp->bstart[b], k = pp->bstart[b + 1] - first;
  Tport__PutBatchReply *r = NULL;
  tport_err ge;
  int rc = batch_put_reply(pp, s, k, NULL, &r, &ge);
  for (size_t j = 0; j < k; j++) {
    chunked *e = &pp->ch[first + j];
    tport_put_item *it = &pp->items[e->item];
    if (rc) { /* whether any began cannot be known: the connection's end frees them */
      it->err = ge;
      e->state = CH_LOST;
      continue;
    }
    const Tport__PutBeginReply *b1 = r->puts[j];
    tport_err why;
    if (batch_element_status(b1->status, &why) != TPORT_OK) {
      e->state = CH_REDO; /* the put of its own says what is wrong, if anything */
      continue;
    }
    if (!b1->ref || b1->ref->handle.len != TPORT_HANDLE_BYTES) {
      tport_err_set(&it->err, TPORT_DATA_LOSS, "the server's reply names no upload");
      e->state = CH_LOST;
      continue;
    }
    memcpy(e->handle, b1->ref->handle.data, TPORT_HANDLE_BYTES);
    tport__ref__init(&e->ref);
    e->ref.handle.data = e->handle;
    e->ref.handle.len = TPORT_HANDLE_BYTES;
    e->begun = true;
    /* a server whose chunks are not the ones planned here (a redial may
     * reach another): put on its own, which follows them */
    e->state = b1->chunk_bytes && b1->chunk_bytes != pp->c->chunk_bytes ? CH_REDO : CH_BEGUN;
  }
}

int batch_put_chunk_make(put_plan *pp, size_t u, chunked *e, nng_msg **out, tport_err *err)
{
  if (e->state != CH_BEGUN) {
    *out = NULL; /* nothing more of it goes */
    return TPORT_OK;
  }
  tport_put_item *it = &pp->items[e->item];
  size_t chunk = e->chunk_bytes, off = (u - e->first_chunk) * chunk;
  size_t len = it->nbytes - off < chunk ? it->nbytes - off : chunk;
  const uint8_t *bytes = (const uint8_t *)it->data + off;
  Tport__PutChunkRequest q = TPORT__PUT_CHUNK_REQUEST__INIT;
  q.ref = &e->ref;
  q.offset = off;
  if (pp->c->verify) {
    q.crc32c_set = true;
    q.crc32c = transport_crc32c(0, bytes, len);
  }
  if (e->direct) {
    /* the server reads them from the caller's buffer (process_region.c) */
    Tport__ShmSlice slice = TPORT__SHM_SLICE__INIT;
    slice.region = pp->proc;
    slice.offset = (uint64_t)(uintptr_t)bytes;
    slice.length = len;
    q.shm = &slice;
    return client_pack(TPORT__METHOD__METHOD_PUT_CHUNK, &q.base, NULL, 0, out, err);
  }
  if (pp->c->lend_chunks)
    return client_pack_lent(&pp->lent, TPORT__METHOD__METHOD_PUT_CHUNK, &q.base, bytes, len, out,
                            err);
  return client_pack(TPORT__METHOD__METHOD_PUT_CHUNK, &q.base, bytes, len, out, err);
}

void batch_put_chunk_take(put_plan *pp, client_slot *s, size_t u, chunked *e)
{
  tport_put_item *it = &pp->items[e->item];
  ProtobufCMessage *r;
  if (client_unpack(TPORT__METHOD__METHOD_PUT_CHUNK, s->reply,
                    &tport__put_chunk_reply__descriptor, &r, NULL, &it->err) != TPORT_OK) {
    /* its commit becomes an abort; where tportd had no reader of this
     * process's memory free, it is put on its own after the window
     * (through the region if need be); where it gave up a read of it (pages
     * that come in slowly), through the region */
    bool given_up = e->direct && it->err.code == TPORT_DEADLINE_EXCEEDED;
    bool busy = e->direct && it->err.code == TPORT_RESOURCE_EXHAUSTED;
    e->given_up = e->given_up || given_up;
    e->state = (busy || given_up) && e->state != CH_FAILED ? CH_REDO : CH_FAILED;
    return;
  }
  protobuf_c_message_free_unpacked(r, NULL);
  size_t chunk = e->chunk_bytes, off = (u - e->first_chunk) * chunk;
  e->landed += it->nbytes - off < chunk ? it->nbytes - off : chunk;
  if (it->opts && it->opts->progress)
    it->opts->progress(it->opts->progress_arg, e->landed, it->nbytes);
}

int batch_put_end_make(put_plan *pp, chunked *e, nng_msg **out, tport_err *err)
{
  const tport_put_item *it = &pp->items[e->item];
  if (!e->begun || e->state == CH_ENDED) {
    *out = NULL;
    return TPORT_OK;
  }
  e->aborting = e->state != CH_BEGUN;
  if (e->aborting) {
    Tport__PutAbortRequest aq = TPORT__PUT_ABORT_REQUEST__INIT;
    aq.ref = &e->ref;
    return client_pack(TPORT__METHOD__METHOD_PUT_ABORT, &aq.base, NULL, 0, out, err);
  }
  Tport__PutCommitRequest cq = TPORT__PUT_COMMIT_REQUEST__INIT;
  cq.ref = &e->ref;
  cq.non_blocking = it->opts && it->opts->non_blocking;
  return client_pack(TPORT__METHOD__METHOD_PUT_COMMIT, &cq.base, NULL, 0, out, err);
}

void batch_put_end_take(put_plan *pp, client_slot *s, chunked *e)
{
  tport_put_item *it = &pp->items[e->item];
  chunked_state was = e->state;
  e->state = CH_ENDED;
  e->begun = false;
  if (e->aborting) {
    e->state = was == CH_REDO ? CH_REDO : CH_ENDED; /* its own put still to come */
    return; /* best effort: the element's error is what failed before */
  }
  Tport__PutCommitReply *cr;
  if (client_unpack(TPORT__METHOD__METHOD_PUT_COMMIT, s->reply,
                    &tport__put_commit_reply__descriptor, (ProtobufCMessage **)&cr, NULL,
                    &it->err) != TPORT_OK)
    return;
  tport_err_clear(&it->err);
  client_info_from_wire(cr->info, &it->info);
  protobuf_c_message_free_unpacked(&cr->base, NULL);
}
