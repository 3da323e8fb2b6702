/*
 * get_direct.h: a get written straight into the caller's buffer
 * (GetBeginRequest.direct_*): a same-host client's process region
 * (regions.h), written with process_vm_writev from the tensor's own memory
 * -- one copy, where the automatic region costs two (tportd's into the
 * region, the client's out of it).
 *
 * Only a tensor whose values already lie in host memory in logical C order
 * (cpu, contiguous, no lazy conj or neg) and of direct_min_bytes or more
 * (else: too large for the reply's payload) goes so; any other goes the way the rest of the request
 * asks (a device's through the region, which the GPU's copy engine writes).  The write runs as a
 * process region's reads do (regions_process_read.c: its slots, threads, deadline),
 * SHM_PROCESS_READ_SPAN at a time, the tensor held until each ends.  Where no slot is free the get
 * goes the other way instead.  A write given up after the deadline may still land: the client is
 * told (DEADLINE_EXCEEDED), and its tport.h says what a get that failed may leave behind.
 */
#ifndef TPORT_SERVER_GET_DIRECT_H
#define TPORT_SERVER_GET_DIRECT_H

#include "server_internal.h"

/* Fewer bytes are never written so: a write is a job and threads of its
 * own (a batch's elements of a byte each would be thousands). */
#define GET_DIRECT_MIN_BYTES ((size_t)64 << 10)
/* A GetBatch's direct writes start within this long of the request's
 * start (handlers_batch_get.c), or after a direct write failed not at all:
 * each may take a write's deadline (5 s a job, regions.h), so that a
 * request holds its worker ten seconds or so at most, whatever its
 * elements' memory does.  Tests may shorten it. */
#define GET_BATCH_DIRECT_MS 5000
extern _Atomic int64_t get_batch_direct_ms; /* (a test sets it while the server runs) */
/* Testing knob: called by a GetBatch once it has looked at an element's
 * tensor, before the element's get runs.  Never set outside tests. */
extern void (*get_batch_test_looked)(size_t element);
/* Whether q asks t (of want bytes) written straight into the client's
 * memory, and t can be. */
bool get_direct_fits(const call *c, const Tport__GetBeginRequest *q, const tport_tensor *t,
                     size_t want);
/* The bytes of t to write at q->direct_addr (its pending work waited
 * for), or NULL: c->err says why (an address range that wraps). */
const uint8_t *get_direct_source(call *c, const Tport__GetBeginRequest *q, tport_tensor *t);
/* The answer of a GetBegin whose bytes (t's) are written already: into the
 * region slice it named (get_into_region), or direct into the caller's
 * buffer; counted as a transfer through a region. */
int get_answer_written(call *c, reg_entry *e, const tport_tensor *t, bool crc_set, uint32_t crc,
                       bool direct);
/* Where q asks t written straight into the client's memory and t can be:
 * writes its values at q->direct_addr of the connection's process region
 * q->direct_region and answers (reply's direct), or fails (*rc), and
 * returns true.  False where the get goes another way (nothing written,
 * *rc untouched): t cannot be, or no slot was free.  (A GetBatch's
 * element is held for the batch's write instead: get_scatter.h.) */
bool get_direct_try(call *c, const Tport__GetBeginRequest *q, reg_entry *e, tport_tensor *t,
                    int *rc);

#endif
