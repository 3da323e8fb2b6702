/* put_bulk.c: a PutBatch's plain elements added together (put_bulk.h). */
#include "put_bulk.h"

#include <stdlib.h>
#include <string.h>

#include "put_runs.h"
#include "random_ids.h"
#include "wire.h"

bool put_bulk_init(put_bulk *b, size_t cap)
{
  *b = (put_bulk){.cap = cap};
  if (!cap)
    return false;
  b->p = calloc(cap, sizeof *b->p);
  b->element = calloc(cap, sizeof *b->element);
  b->handles = malloc(cap * REG_HANDLE_BYTES);
  if (b->p && b->element && b->handles && random_ids(b->handles, cap * REG_HANDLE_BYTES))
    return true;
  free(b->p), free(b->element), free(b->handles);
  *b = (put_bulk){0};
  return false;
}

bool put_bulk_take(call *c, const Tport__PutBeginRequest *q, tport_tensor *final,
                   const reg_reservation *paid)
{
  put_bulk *b = c->bulk;
  if (!b || !c->run || b->n == b->cap || (q->name && *q->name) || q->keep || q->replace)
    return false;
  reg_entry *e = reg_pending_entry(final, b->handles + b->n * REG_HANDLE_BYTES);
  if (!e)
    return false;
  /* its info as the add will make it: unnamed, living with the connection */
  wire_info wi;
  wire_fill_info(&wi, e, final);
  if (!put_run_same(c->run, &wi)) {
    reg_pending_free(e);
    return false;
  }
  b->p[b->n] = (reg_pending){.e = e, .paid = *paid};
  b->element[b->n++] = c->element;
  memcpy(c->run_handle, e->handle, REG_HANDLE_BYTES);
  c->stored = c->run_answered = true;
  return true;
}

void put_bulk_end(call *c, put_bulk *b, void (*failed)(void *ctx, size_t i, const tport_err *why),
                  void *ctx)
{
  size_t done = 0;
  while (done < b->n) {
    tport_err why;
    done += reg_add_many(&c->srv->reg, c->pipe, b->p + done, b->n - done, &why);
    if (done < b->n)
      failed(ctx, b->element[done++], &why);
  }
  b->n = 0;
}

void put_bulk_free(registry *r, put_bulk *b)
{
  reg_pending_drop(r, b->p, b->n);
  free(b->p), free(b->element), free(b->handles);
  *b = (put_bulk){0};
}
