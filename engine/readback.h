/*
 * readback.h: a device tensor read back to the host a chunk at a time,
 * through recycled pinned blocks, for gets.
 *
 * A get from a device used to copy the whole tensor into a pinned host
 * tensor of its own: one cudaHostAlloc of the full size per request (100+ ms
 * for 256 MiB on an H200, against 5 ms for the copy itself) and as much
 * pinned memory held as the get was large.  A reader instead copies each
 * chunk, when it is asked for, into a block of the read-back pool
 * (staging_readback: pinned, recycled, bounded) and hands the block over as
 * a storage the caller lends to its reply; the block goes back to the pool
 * when the last reference to that storage goes (nng has sent the bytes).
 *
 * Each chunk waits for its own copy only (an event on the block), so chunks
 * asked for at once by several threads copy back to back on the device's
 * stream while earlier ones are on the wire; and a read of a get's chunk
 * starts the copies of the READER_AHEAD chunks after it (of the same
 * length), so that they are ready when asked for.  A reader lends at most
 * max_held blocks at once, plus those read ahead: a client asking for the
 * same chunk over and over cannot take the pool from everyone else.
 */
#ifndef TPORT_READBACK_H
#define TPORT_READBACK_H

#include "engine.h"
#include "staging.h"

#define READER_AHEAD 2

typedef struct tensor_reader tensor_reader;

/* A reader of t's values in logical C order.  t (on a device, not the cpu)
 * is made contiguous on its device first when it is not (non_blocking: the
 * first read waits for it); the reader holds that tensor until closed. */
int reader_open(tport_tensor *t, int max_held, tensor_reader **out, tport_err *err);
/* The bytes the reader serves (numel * element size). */
size_t reader_nbytes(const tensor_reader *r);
/* Copies bytes [off, off + n) of the values (n at most STAGING_MAX_BLOCK)
 * into a pinned block and waits for that copy.  *held is a storage over the
 * block (the caller's reference: release it once the bytes are no longer
 * read -- lending it to a reply retains it), *bytes its first byte.  With
 * n == 0, both are NULL.  RESOURCE_EXHAUSTED when max_held blocks are out;
 * OUT_OF_RANGE outside the values.  Thread-safe. */
int reader_read(tensor_reader *r, size_t off, size_t n, tport_storage **held,
                const uint8_t **bytes, tport_err *err);
/* Blocks the reader has lent that have not come back yet. */
int reader_blocks_out(const tensor_reader *r);
/* Drops the reader (blocks still lent come back to the pool on their own). */
void reader_close(tensor_reader *r);

#endif
