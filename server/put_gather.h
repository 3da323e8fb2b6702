/*
 * put_gather.h: a PutBatch's puts read from a same-host client's own memory
 * (its process region, regions.h) -- elements with commit whose slice's
 * offset is the address of their bytes.
 *
 * Such elements are gathered: each is checked and its tensor made (and
 * charged) as the batch runs it, then one read takes every element's bytes
 * at once -- one slot, one deadline, one process_vm_readv per 256 elements
 * on each of the read's threads -- and each is stored and answered.  One
 * read a request, not one an element: a state dict's ~50 weights of
 * 0.25-9 MB had each cost a PutBegin, a PutChunk, a PutCommit and a read
 * of its own (with its threads), and its put ran at half a single put's
 * speed on a 2-core VM.  The gathered elements are read and stored before
 * the batch runs an element of another kind, so that the batch's elements
 * take their names in order; such elements come together in a batch (one
 * after an element of another kind that followed them is refused,
 * INVALID_ARGUMENT), so that a batch reads the client's memory once.
 *
 * Bounds: at most shm_process_read_max bytes a batch (past them an
 * element is OUT_OF_RANGE); a worker waits a second for a reader's slot
 * and five for the read, once.  An element whose bytes cannot be read
 * (nothing mapped) is OUT_OF_RANGE alone, found by the read itself; a read
 * given up (DEADLINE_EXCEEDED) fails every gathered element and keeps
 * their tensors, charged to the tenant until it ends.  After the bytes the
 * read takes the batch's fence (PutBatchRequest): unless it still holds
 * the batch's token, the client has stopped waiting and its buffers may
 * hold other bytes by now -- nothing is stored (ABORTED).
 *
 * What is read is stored as it is, on the cpu: a put from the client's
 * memory that would convert (dtype, memory_format) or go to a device is
 * refused, INVALID_ARGUMENT, as is one outside a batch (no fence).
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
  struct put_run_info *run;        /* its run's (call.run), and where its handle goes */
  uint8_t *run_handle;
} gathered;

typedef struct put_gather {
  gathered *v;
  size_t n, cap;
  uint64_t region;                  /* the process region every element names (n > 0) */
  size_t bytes;                     /* the elements' bytes */
  size_t room;                      /* the most a batch may read */
  size_t el;                        /* the element the batch is running */
  uint64_t fence_addr, fence_token; /* the batch's (addr 0: none) */
  bool flushed;                     /* read already: no more are gathered */
} put_gather;

/* Each element answered at the end: done(ctx, el, sub, rc), sub the call
 * whose reply (in the batch's sink) or error (rc) is the element's. */
typedef void (*put_gather_done_fn)(void *ctx, size_t el, call *sub, int rc);

void put_gather_init(put_gather *g, size_t room, uint64_t fence_addr, uint64_t fence_token);
/* The put q of a slice of the connection's process region, its layout l in
 * dtype from onto dev, converted as convert asks, a batch's element
 * (c->gather): its tensor made and gathered (c->gathered set, no reply
 * yet), or an error. */
int put_from_process(call *c, const Tport__PutBeginRequest *q, const meta_layout *l,
                     tport_dtype from, tport_device dev, const to_options *convert);
/* The gathered elements (if any) read, stored and each answered by done:
 * a batch reads the client's memory once, so none is gathered after. */
void put_gather_flush(call *c, put_gather *g, put_gather_done_fn done, void *ctx);
/* The same, and g's memory freed. */
void put_gather_end(call *c, put_gather *g, put_gather_done_fn done, void *ctx);

#endif
