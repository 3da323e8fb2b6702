/*
 * put_runs.h: a PutBatch's runs -- many elements alike, one PutBegin for
 * all (PutBatchRequest.runs) -- spread into its elements, and answered by a
 * handle each where their tensors' info is alike too (PutRunReply).
 *
 * Each element of a run is run by h_put_begin as any other element (the
 * same checks, quota, registry), with the run's request -- or a copy of it
 * where its slice or CRC32C is its own.  What a run saves is the protobuf
 * of each element on both sides: 10,000 puts of 4 KiB spent ~15% of the
 * CPU of a batch packing and unpacking one PutBeginRequest and one
 * PutBeginReply (its TensorInfo) an element, and the client unpacking the
 * replies was on the batch's critical path.
 */
#ifndef TPORT_SERVER_PUT_RUNS_H
#define TPORT_SERVER_PUT_RUNS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server_internal.h"
#include "wire.h"

/* What a run's elements stored alike share: the first one's info, packed
 * without its ref, and what the others' are compared with. */
typedef struct put_run_info {
  bool set;
  uint8_t *packed;
  size_t packed_len;
  Tport__DType dtype;
  size_t ndim;
  int64_t sizes[TPORT_MAX_DIMS], strides[TPORT_MAX_DIMS];
  int64_t storage_offset, nbytes, storage_nbytes, expires_unix_ms;
  char device[32];
  Tport__MemoryFormat actual, suggested;
  bool is_contiguous, managed, conj, neg;
} put_run_info;

/* Whether an element of run ri, stored as wi says, is answered by its
 * handle alone: its info (but its ref) the run's -- the first one stored
 * makes it so.  False: it is answered by a reply of its own. */
bool put_run_same(put_run_info *ri, const wire_info *wi);

/* A PutBatch's elements: its puts', then each run's, in order. */
typedef struct batch_puts {
  size_t n;
  const Tport__PutBeginRequest **req; /* each element's request */
  uint64_t *len;                      /* its bytes in the payload */
  size_t *run;                        /* its run + 1 (0: one of the puts) */
  put_run_info *runs;
  size_t nruns, nputs;
  Tport__PutBeginRequest *copies; /* the run elements' own requests (slice, crc) */
  Tport__ShmSlice *slices;
} batch_puts;

/* q's elements into b, checked against the bound of a request's elements
 * (max) and the payload's length (c->payload_len): INVALID_ARGUMENT for
 * the request as a whole otherwise. */
int batch_puts_expand(call *c, const Tport__PutBatchRequest *q, size_t max, batch_puts *b);
void batch_puts_free(batch_puts *b);

#endif
