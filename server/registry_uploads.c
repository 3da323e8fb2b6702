/*
 * registry_uploads.c: the upload state machine (registry.h): chunks
 * claimed and received (RECEIVING), the commit (COMMITTING), and the entry
 * made ready with its final tensor.
 */
#include <string.h>

#include "registry_internal.h"

/* ---------------------------------------------------------------- uploads */

static bool bit(const uint8_t *b, uint64_t i)
{
  return b[i / 8] >> (i % 8) & 1;
}

static void set_bit(uint8_t *b, uint64_t i, bool v)
{
  if (v)
    b[i / 8] |= (uint8_t)(1u << (i % 8));
  else
    b[i / 8] &= (uint8_t) ~(1u << (i % 8));
}

/* The upload of e, if it is still receiving.  mu held. */
static reg_upload *receiving(reg_entry *e, tport_err *err)
{
  if (e->removed)
    return tport_err_set(err, TPORT_ABORTED, "the upload was aborted"), NULL;
  if (e->state != REG_UPLOADING)
    return tport_err_set(err, TPORT_FAILED_PRECONDITION,
                         "ref is not an upload in progress (already committed)"),
           NULL;
  if (e->up->state != UP_RECEIVING)
    return tport_err_set(err, TPORT_FAILED_PRECONDITION, "the upload is being committed"), NULL;
  return e->up;
}

int reg_chunk_claim(registry *r, reg_entry *e, uint64_t offset, size_t len,
                    tport_tensor **landing, int *convert_from, tport_err *err)
{
  *landing = NULL;
  *convert_from = -1;
  pthread_mutex_lock(&r->mu);
  reg_upload *up = receiving(e, err);
  int rc = up ? TPORT_OK : err->code;
  uint64_t first = 0, end = 0;
  if (!rc && up->nbytes == 0) {
    /* an empty tensor: the only chunk is the empty one at 0, and it is
     * complete from the start */
    if (offset != 0 || len != 0)
      rc = tport_err_set(err, TPORT_OUT_OF_RANGE,
                         "the tensor has no bytes: the only chunk is offset 0 with none");
    pthread_mutex_unlock(&r->mu);
    return rc;
  }
  if (!rc && offset >= up->nbytes)
    rc = tport_err_set(err, TPORT_OUT_OF_RANGE, "offset %llu is past the tensor's %zu bytes",
                       (unsigned long long)offset, up->nbytes);
  else if (!rc && offset % up->chunk_bytes)
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT,
                       "offset %llu is not a multiple of the chunk size %zu: chunks may not "
                       "overlap",
                       (unsigned long long)offset, up->chunk_bytes);
  else if (!rc && (len > up->nbytes - offset ||
                   (offset + len != up->nbytes && len % up->chunk_bytes) || len == 0))
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT,
                       "chunk at offset %llu carries %zu bytes: it must carry %zu",
                       (unsigned long long)offset, len,
                       up->nbytes - offset < up->chunk_bytes ? up->nbytes - (size_t)offset
                                                             : up->chunk_bytes);
  if (!rc) {
    first = offset / up->chunk_bytes;
    end = first + (len + up->chunk_bytes - 1) / up->chunk_bytes;
    uint64_t done = 0;
    for (uint64_t i = first; i < end && !rc; i++) {
      if (bit(up->claimed, i) && !bit(up->received, i))
        rc = tport_err_set(err, TPORT_ABORTED,
                           "chunk %llu is being written by another request: retry",
                           (unsigned long long)i);
      done += bit(up->received, i);
    }
    if (!rc && done == end - first) {
      pthread_mutex_unlock(&r->mu);
      return TPORT_OK; /* all written already: idempotent */
    }
    if (!rc && done)
      rc = tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "bytes [%llu, %llu) were partly written already",
                         (unsigned long long)offset, (unsigned long long)(offset + len));
  }
  if (!rc) {
    for (uint64_t i = first; i < end; i++)
      set_bit(up->claimed, i, true);
    up->inflight++;
    *landing = tensor_retain(up->landing);
    if (up->convert_on_arrival)
      *convert_from = (int)up->source_dtype;
  }
  pthread_mutex_unlock(&r->mu);
  return rc;
}

void reg_chunk_done(registry *r, reg_entry *e, uint64_t offset, size_t len, bool ok)
{
  pthread_mutex_lock(&r->mu);
  reg_upload *up = e->up; /* not freed while a chunk is in flight: commit waits for none */
  uint64_t first = offset / up->chunk_bytes;
  uint64_t end = first + (len + up->chunk_bytes - 1) / up->chunk_bytes;
  up->inflight--;
  for (uint64_t i = first; i < end; i++) {
    if (ok) {
      set_bit(up->received, i, true);
      up->nreceived++;
    } else {
      set_bit(up->claimed, i, false);
    }
  }
  pthread_mutex_unlock(&r->mu);
}

int reg_commit_begin(registry *r, reg_entry *e, tport_tensor **landing, to_options *convert,
                     bool *needs_convert, tport_err *err)
{
  pthread_mutex_lock(&r->mu);
  reg_upload *up = receiving(e, err);
  int rc = up ? TPORT_OK : err->code;
  if (!rc && up->inflight)
    rc = tport_err_set(err, TPORT_FAILED_PRECONDITION, "%d chunk%s still being written",
                       up->inflight, up->inflight == 1 ? " is" : "s are");
  else if (!rc && up->nreceived != up->nchunks)
    rc = tport_err_set(err, TPORT_FAILED_PRECONDITION, "%llu of %llu chunks are missing",
                       (unsigned long long)(up->nchunks - up->nreceived),
                       (unsigned long long)up->nchunks);
  if (!rc) {
    up->state = UP_COMMITTING;
    *landing = tensor_retain(up->landing);
    *convert = up->convert;
    *needs_convert = up->needs_convert;
  }
  pthread_mutex_unlock(&r->mu);
  return rc;
}

/* A commit with replace takes its name now, from whatever ready tensor
 * holds it (onto *dead).  mu held. */
static int commit_take_name(registry *r, reg_entry *e, reg_entry **dead, tport_err *err)
{
  reg_entry *holder;
  HASH_FIND(hh_name, e->tn->names, e->name, strlen(e->name), holder);
  if (holder && holder->state != REG_READY)
    return tport_err_set(err, TPORT_ALREADY_EXISTS,
                         "a tensor named '%s' is being uploaded by a put without replace", e->name);
  return name_take(r, e, holder, dead, err);
}

int reg_commit_end(registry *r, reg_entry *e, tport_tensor *final, tport_err *err)
{
  reg_entry *dead = NULL;
  pthread_mutex_lock(&r->mu);
  if (e->removed) {
    pthread_mutex_unlock(&r->mu);
    tensor_release(final);
    return tport_err_set(err, TPORT_ABORTED, "the upload was aborted during its commit");
  }
  reg_upload *up = e->up;
  reg_tenant *tn = e->tn;
  /* the tenant now pays for the stored tensor's storage, not the landing's
   * nor the reservation (charged before uncharged: they may be one storage) */
  int rc = TPORT_OK;
  /* the landing is the stored tensor's storage (no conversion at commit):
   * the charge stays as it is */
  bool same = final->storage == e->charged;
  if (!same && !tenant_charge(r, tn, final->storage))
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for an entry");
  else if (up->replace && (rc = commit_take_name(r, e, &dead, err)) != TPORT_OK && !same)
    tenant_uncharge(r, tn, final->storage);
  if (rc) {
    up->state = UP_RECEIVING;
    pthread_mutex_unlock(&r->mu);
    entry_free_dead(r, dead);
    tensor_release(final);
    return rc;
  }
  if (!same)
    tenant_uncharge(r, tn, e->charged);
  e->charged = final->storage;
  tn->bytes -= e->reserved;
  e->reserved = 0;
  e->up = NULL;
  e->tensor = final;
  e->state = REG_READY;
  r->uploads--;
  tn->uploads--;
  if (up->keep) {
    entry_owner_unlink(e);
    entry_set_expiry(r, e, up->ttl_ms);
  }
  bool named = e->holds_name;
  if (named)
    tn->refs++; /* dropped by waiters_wake_name */
  pthread_mutex_unlock(&r->mu);
  entry_free_dead(r, dead);
  reg_upload_free(up);
  if (named)
    waiters_wake_name(r, tn, e->name); /* the caller holds e, and so its name */
  return TPORT_OK;
}

void reg_commit_fail(registry *r, reg_entry *e)
{
  pthread_mutex_lock(&r->mu);
  if (e->up)
    e->up->state = UP_RECEIVING;
  pthread_mutex_unlock(&r->mu);
}
