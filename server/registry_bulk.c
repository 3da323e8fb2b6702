/*
 * registry_bulk.c: tensors added together (registry.h's reg_pending).
 *
 * A PutBatch of 4 KiB tensors took the registry's lock three times an
 * element -- its reservation, its add, and the reference its add gave the
 * caller dropped again -- 256 elements a request, from up to three workers
 * at once: the lock's cache line went from core to core each time
 * (pthread_mutex_lock and unlock were ~9% of a batch's samples).  Its
 * elements are added here instead, many under one hold of the lock, and
 * none gives the caller a reference: the batch's reply is made from what
 * it knew before the add (the handle it drew, the info it made).
 */
#include <stdlib.h>
#include <string.h>

#include "registry_internal.h"

reg_entry *reg_pending_entry(tport_tensor *t, const uint8_t *handle)
{
  reg_entry *e = calloc(1, sizeof *e);
  if (!e)
    return NULL;
  memcpy(e->handle, handle, REG_HANDLE_BYTES);
  e->tensor = t;
  e->state = REG_READY;
  e->refs = 1; /* the registry's alone */
  return e;
}

void reg_pending_free(reg_entry *e)
{
  free(e);
}

/* p's entry into the registry for session s, as add_entry would make an
 * unnamed, connection-scoped one.  mu held. */
static int add_one(registry *r, reg_session *s, reg_pending *p, tport_err *err)
{
  reg_entry *e = p->e, *holder;
  const tport_storage *st = e->tensor->storage;
  /* the reservation becomes the charge in one step, as in add_entry */
  reservation_drop(r, &p->paid);
  int rc = add_check(r, s, e, st, false, false, 0, &holder, err);
  if (rc)
    return rc;
  e->tn = s->tn;
  reg_oom = false;
  HASH_ADD(hh, r->by_handle, handle, REG_HANDLE_BYTES, e);
  if (reg_oom) {
    tenant_uncharge(r, s->tn, st);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for an entry");
  }
  e->charged = st;
  add_link(r, s, e, false, 0);
  r->added_in_bulk++;
  p->e = NULL; /* the registry's now: never the caller's to free */
  return TPORT_OK;
}

size_t reg_add_many(registry *r, uint32_t pipe, reg_pending *p, size_t n, tport_err *err)
{
  size_t i = 0;
  int rc = TPORT_OK;
  while (i < n && !rc) {
    size_t end = n - i > REG_ADD_MANY_HOLD ? i + REG_ADD_MANY_HOLD : n;
    pthread_mutex_lock(&r->mu);
    reg_session *s = session_find(r, pipe);
    for (; i < end; i++)
      if ((rc = add_one(r, s, &p[i], err)) != TPORT_OK)
        break;
    pthread_mutex_unlock(&r->mu);
  }
  if (rc) {
    entry_free(r, p[i].e); /* its reservation dropped by add_one */
    p[i].e = NULL;
  }
  return i;
}

void reg_pending_drop(registry *r, reg_pending *p, size_t n)
{
  for (size_t i = 0; i < n; i++) {
    reg_reservation_release(&p[i].paid);
    if (p[i].e)
      entry_free(r, p[i].e);
    p[i].e = NULL;
  }
}
