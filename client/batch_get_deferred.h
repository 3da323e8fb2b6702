/*
 * batch_get_deferred.h: what batch_get_deferred.c (the deferred elements'
 * window) and batch_get_plan.c (its units, planned) share.
 */
#ifndef TPORT_CLIENT_BATCH_GET_DEFERRED_H
#define TPORT_CLIENT_BATCH_GET_DEFERRED_H

#include <stdint.h>

#include "batch.h"
#include "batch_region.h"

typedef enum dget_state {
  DG_WAITING, /* its GetBatch or GetBegin not answered */
  DG_READING, /* its chunks go */
  DG_DONE,    /* answered: its result is in the item */
  DG_FAILED,  /* a chunk failed (the item's err): its buffer goes */
  DG_REDO,    /* a get of its own after the window */
} dget_state;

typedef struct dget {
  size_t item;
  size_t planned; /* its bytes, as the GetBatch said */
  size_t begin_unit, first_chunk, nchunks;
  dget_state state;
  uint8_t *buf;                 /* where its chunks go */
  bool alloced;                 /* buf made here (freed when it fails) */
  ProtobufCBinaryData transfer; /* its chunks' transfer (a copy) */
  size_t shm_at;                /* where in the region its group's slot has it */
  bool sliced;                  /* ... where it has one */
  bool direct;                  /* its buffer offered to the server (process_region.c) */
  uint64_t direct_region;       /* the connection's process region, where direct */
  size_t again;                 /* not written directly: its bytes, for a second window */
  Tport__GetBeginReply *late;   /* not written directly: its transfer, read after the window */
} dget;

/* A unit: a GetBatch of small elements (those of up to a chunk, a chunk
 * of them), a large element's GetBegin, or one of its GetChunks. */
typedef enum dunit_kind { DU_GROUP, DU_BEGIN, DU_CHUNK } dunit_kind;

/* The small elements a GetBatch of the window carries at most whose bytes
 * come inline and are lent (lent_inline): as many as tportd lends from
 * their storages into one reply (LENDS_SEGMENTS; past them it copies). */
#define GET_GROUP 4

typedef struct deferred_gets {
  tport_client *c;
  tport_get_item *items;
  dget *el;
  size_t n;
  size_t *unit_el;        /* the element of unit u (DU_GROUP: the group) */
  uint8_t *unit_kind;     /* dunit_kind */
  size_t *small, *gstart; /* group g: elements small[gstart[g] .. gstart[g + 1]) */
  size_t ngroups, *slot;  /* group g's slot of the region (BATCH_NO_SLOT: none) */
  batch_region region;    /* same host: where the groups' tensors are written */
  bool blocks;            /* buffers made from get_blocks.h */
  bool exact;             /* the planned bytes are the server's, not buffers' caps */
  size_t total;           /* the deferred elements' bytes, all of them */
  const atomic_bool *cancel;
  uint64_t proc_region; /* where buffers are offered (0: none), fixed for the window */
  size_t *again;        /* an item's bytes for the second window (NULL: none) */
} deferred_gets;

/* The process region (region: the connection's, or 0) an element of
 * planned bytes offers the server to write its buffer (0: none). */
uint64_t deferred_direct_region(const tport_get_item *it, size_t planned, uint64_t region);
/* The units of d's elements (items[0..k) not answered yet, their planned
 * bytes): how many, in d->unit_el and d->unit_kind (large: scratch of an
 * element each). */
size_t deferred_plan(deferred_gets *d, const size_t *planned, size_t k, size_t *large);
/* Same host: slots of the automatic region for d's groups (d->region). */
void deferred_open_region(deferred_gets *d);

/* ---------------------------------------------------------------- batch_get_in_place.c */

/* Where chunk unit u's element's bytes [off, off + *n) go: its buffer,
 * known once its GetBegin was taken (a chunk unit goes after it). */
dget *deferred_chunk_of(deferred_gets *d, size_t u, size_t *off, size_t *n);
/* Before group g's GetBatch goes: buffers of their planned sizes for its
 * last elements the library makes them for (e->buf), so that the reply's
 * end may be read into them. */
void deferred_group_buffers(deferred_gets *d, size_t g);
/* The window's into (window_into_fn): a chunk's element's buffer, or the
 * last elements' of a GetBatch. */
unsigned deferred_into(void *ctx, size_t u, size_t one, uint8_t **dst, size_t *n);
/* Whether group g's reply r (the payload p left in its message) is laid
 * out as the places its last m elements' bytes were read into say: those
 * answered inline with exactly their planned bytes, the others' inline
 * bytes all that is left. */
bool deferred_group_as_placed(const deferred_gets *d, size_t g, const Tport__GetBatchReply *r,
                              const client_payload *p, size_t m);
/* Element e (its item it), answered inline by b, its bytes read into its
 * place: the item's result (a buffer made for it handed over). */
void deferred_take_placed(deferred_gets *d, dget *e, tport_get_item *it,
                          const Tport__GetBeginReply *b);

#endif
