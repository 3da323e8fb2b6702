/*
 * get_scatter.h: a GetBatch's gets written into a same-host client's own
 * memory together (get_direct.h has what such a get is) -- the gets'
 * counterpart of put_gather.h.
 *
 * An element that get_direct.h would write is checked and held as the
 * batch runs it (its entry and tensor), then one write takes every such
 * element's bytes at once -- one slot, one deadline, the same threads --
 * and each is answered.  One write a request, not one an element: the
 * eleven tensors of 0.25-1 MiB in ResNet-50's first GetBatch had each cost
 * a job with its own slot and threads, 0.3 ms apiece against 0.1 for their
 * bytes on a 2-core VM.
 *
 * Bounds: the batch's (handlers_batch_get.c: a chunk of such bytes a
 * request, none under GET_DIRECT_MIN_BYTES), and at most
 * SHM_PROCESS_READ_SPAN bytes a write: past it, or for an element naming
 * another region, the batch writes what it holds first (get_scatter_room).
 * An element whose memory cannot be written (nothing mapped, read-only) is
 * OUT_OF_RANGE alone, found by the write itself; a write given up
 * (DEADLINE_EXCEEDED: it may still land) or whose client exited fails every
 * element in it, its tensors kept, and charged to the tenant, until it
 * ends.  Where no slot is free nothing is written: the batch answers the
 * elements again as if they had not asked (inline within the reply's
 * room, else deferred or a transfer), its direct writes off.
 */
#ifndef TPORT_SERVER_GET_SCATTER_H
#define TPORT_SERVER_GET_SCATTER_H

#include "server_internal.h"

typedef struct scattered {
  size_t el;        /* the batch's element */
  reg_entry *e;     /* its entry, held until it is answered */
  tport_tensor *t;  /* e's tensor, whose bytes are written */
  shm_read_seg seg; /* addr: the client's buffer; dst: the tensor's bytes */
  bool want_crc32c;
} scattered;

typedef struct get_scatter {
  scattered *v;
  size_t n, cap;
  uint64_t region; /* the process region every element names (n > 0) */
  size_t bytes;    /* the elements' bytes */
  size_t el;       /* the element the batch is running */
} get_scatter;

/* Each element answered by the write: done(ctx, el, sub, rc) with sub the
 * call whose reply (in the batch's sink) or error (rc) is the element's;
 * or, other (no slot was free: nothing written), to be run the other way. */
typedef void (*get_scatter_done_fn)(void *ctx, size_t el, call *sub, int rc, bool other);

/* Whether an element of want bytes naming region may join what g holds
 * (else g is written first). */
bool get_scatter_room(const get_scatter *g, uint64_t region, size_t want);
/* The direct get q of t (e's), a batch's element (c->scatter): held for
 * the batch's write (c->gathered set, e kept: no reply yet), or an error
 * (e still the caller's). */
int get_scatter_add(call *c, const Tport__GetBeginRequest *q, reg_entry *e, tport_tensor *t);
/* The held elements written in one write and each answered by done;
 * whether every one was written (false: the batch writes no more directly). */
bool get_scatter_flush(call *c, get_scatter *g, get_scatter_done_fn done, void *ctx);
/* The same, and g's memory freed. */
bool get_scatter_end(call *c, get_scatter *g, get_scatter_done_fn done, void *ctx);

#endif
