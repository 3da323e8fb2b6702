/*
 * put_bulk.h: a PutBatch's plain elements added to the registry together
 * (registry.h's reg_add_many), after the batch's copies, before its reply.
 *
 * An element joins when it is unnamed, neither kept nor replacing, an
 * element of a run, and answered by its handle alone (put_runs.h): its
 * reply then says nothing that the add could change.  Its handle is drawn
 * with the batch's others in one go.  One that the add refuses (the
 * tenant's quota or tensor limit reached meanwhile, the connection closing)
 * becomes a failed element, as it would have been on its own; the client
 * hears of none before all are in the registry.  They are added after the
 * batch's other elements: near the tenant's tensor limit, one of them may
 * be refused where a later element that went on its own (named, kept, or
 * unlike its run) was stored -- each element has its own result, in no
 * promised order.
 */
#ifndef TPORT_SERVER_PUT_BULK_H
#define TPORT_SERVER_PUT_BULK_H

#include "server_internal.h"

typedef struct put_bulk {
  reg_pending *p;
  size_t *element;  /* each one's index in the batch */
  uint8_t *handles; /* cap handles, drawn at once */
  size_t n, cap;
} put_bulk;

/* Room for cap elements; false when out of memory (the elements are then
 * added on their own). */
bool put_bulk_init(put_bulk *b, size_t cap);
/* Whether c's element (c->element of the batch) joins c->bulk with final,
 * the tensor made for q, and paid, what q reserved for it (both the
 * bulk's then): answered by its handle (c->run_answered, c->stored).
 * False changes nothing: the put goes on to reg_add. */
bool put_bulk_take(call *c, const Tport__PutBeginRequest *q, tport_tensor *final,
                   const reg_reservation *paid);
/* Adds b's elements for c's connection; each one refused is told to
 * failed (ctx, its index in the batch, why), its tensor freed. */
void put_bulk_end(call *c, put_bulk *b, void (*failed)(void *ctx, size_t i, const tport_err *why),
                  void *ctx);
/* Frees b and what it holds that was never added. */
void put_bulk_free(registry *r, put_bulk *b);

#endif
