/*
 * put_gather.h: puts read from a same-host client's own memory (its process
 * region, regions.h) in one request -- a PutBegin with commit naming a
 * slice of it, the slice's offset the address of the client's bytes.
 *
 * A PutBatch's such elements are gathered: each is checked and its tensor
 * made (and charged) as the batch runs it, then one read takes every
 * element's bytes at once -- one slot, one deadline, one process_vm_readv
 * per 256 elements on each of the read's threads -- and each is stored and
 * answered.  One read a request, not one an element: a state dict's ~50
 * weights of 0.25-9 MB had each cost a PutBegin, a PutChunk, a PutCommit
 * and a read of its own (with its threads), and its put ran at half a
 * single put's speed on a 2-core VM.  At most shm_process_read_max bytes
 * are read for one batch (a PutChunk's most); past them an element is
 * refused, OUT_OF_RANGE.  A read given up (regions.h: DEADLINE_EXCEEDED)
 * fails every element gathered and keeps their tensors, charged to the
 * tenant until it ends; a read that fails otherwise is made again element
 * by element, so that each gets its own answer.
 *
 * What is read is stored as it is, on the cpu: a put from the client's
 * memory that would convert (dtype, memory_format) or go to a device is
 * refused, INVALID_ARGUMENT (libtport sends those through a region).
 */
#ifndef TPORT_SERVER_PUT_GATHER_H
#define TPORT_SERVER_PUT_GATHER_H

#include "server_internal.h"
#include "validate.h"

typedef struct gathered {
  size_t el;                       /* the batch's element */
  const Tport__PutBeginRequest *q; /* its request (the batch's, alive till the end) */
  tport_tensor *t;                 /* its tensor, made, written by the read */
  reg_reservation paid;            /* t's charge until the registry takes it */
  shm_read_seg seg;                /* its bytes in the client's memory, into t */
} gathered;

typedef struct put_gather {
  gathered *v;
  size_t n, cap;
  uint64_t region; /* the process region every element names (n > 0) */
  size_t bytes;    /* the elements' bytes */
  size_t room;     /* the most a batch may read */
  size_t el;       /* the element the batch is running */
} put_gather;

/* Each element answered at the end: done(ctx, el, sub, rc), sub the call
 * whose reply (in the batch's sink) or error (rc) is the element's. */
typedef void (*put_gather_done_fn)(void *ctx, size_t el, call *sub, int rc);

void put_gather_init(put_gather *g, size_t room);
/* The put q of a slice of the connection's process region, its layout l in
 * dtype from onto dev, converted as convert asks: read at once, stored and
 * answered; or, within a batch (c->gather), its tensor made and gathered
 * (c->gathered set, no reply yet). */
int put_from_process(call *c, const Tport__PutBeginRequest *q, const meta_layout *l,
                     tport_dtype from, tport_device dev, const to_options *convert);
/* The batch's gathered elements read, stored and each answered by done. */
void put_gather_end(call *c, put_gather *g, put_gather_done_fn done, void *ctx);

#endif
