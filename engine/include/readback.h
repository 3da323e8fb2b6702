/*
 * readback.h: a tensor's values read a chunk at a time, for gets -- the
 * engine's one call for serving a get, whatever device the tensor is on.
 *
 * From a device: a get used to copy the whole tensor into a pinned host
 * tensor of its own: one cudaHostAlloc of the full size per request (100+
 * ms for 256 MiB on an H200, against 5 ms for the copy itself) and as much
 * pinned memory held as the get was large.  A reader instead copies each
 * chunk, when it is asked for, into a block of the read-back pool (pinned,
 * recycled, bounded: TPORT_READBACK_BYTES) and hands the block over as a
 * storage the caller lends to its reply; the block goes back to the pool
 * when the last reference to that storage goes (nng has sent the bytes).
 * Each chunk waits for its own copy only (a fence on the block), so chunks
 * asked for at once by several threads copy back to back on the device's
 * stream while earlier ones are on the wire; and a read of a get's chunk
 * starts the copies of the READER_AHEAD chunks after it (of the same
 * length), so that they are ready when asked for.  A reader lends at most
 * max_held blocks at once, plus those read ahead: a client asking for the
 * same chunk over and over cannot take the pool from everyone else.
 *
 * From the host: the chunks are the tensor's own memory when it is
 * contiguous (an alias), else a copy of it made contiguous, with lazy
 * conj/neg bits applied and a managed tensor's values copied rather than
 * moved (a get reads, it never changes where a tensor lives); each read
 * lends that whole storage.
 */
#ifndef TPORT_READBACK_H
#define TPORT_READBACK_H

#include "engine.h"

#define READER_AHEAD 2
/* The most one read of a device tensor copies (a read-back block) */
#define READER_MAX_CHUNK ((size_t)64 << 20)

typedef struct tensor_reader tensor_reader;

/* A reader of t's values in logical C order.  t is made contiguous on its
 * device first when it is not (non_blocking: the first read waits for it);
 * the reader holds that tensor until closed.  The calling thread's
 * allocation guard (engine.h) is asked for that copy. */
int reader_open(tport_tensor *t, int max_held, tensor_reader **out, tport_err *err);
/* The bytes the reader serves (numel * element size). */
size_t reader_nbytes(const tensor_reader *r);
/* The most one reader_read of r may ask for: READER_MAX_CHUNK from a
 * device, unlimited (SIZE_MAX) from the host. */
size_t reader_max_read(const tensor_reader *r);
/* Bytes [off, off + n) of the values (n at most reader_max_read), ready:
 * from a device, copied into a pinned block, this copy waited for.  *held
 * is a storage the bytes lie in (the caller's reference: release it once
 * the bytes are no longer read -- lending it to a reply retains it),
 * *bytes their first byte.  With n == 0, both are NULL.
 * RESOURCE_EXHAUSTED when max_held blocks are out; OUT_OF_RANGE outside the
 * values.  Thread-safe. */
int reader_read(tensor_reader *r, size_t off, size_t n, tport_storage **held,
                const uint8_t **bytes, tport_err *err);
/* Bytes [off, off + n) of the values (n at most reader_max_read) copied
 * into dst, host memory of the caller's (a slice of a same-host region;
 * pinned: registered with the device's driver, so a device copies into it
 * directly), the copy waited for: no block of the pool, nothing lent.
 * OUT_OF_RANGE outside the values.  Thread-safe. */
int reader_read_into(tensor_reader *r, size_t off, size_t n, uint8_t *dst, bool pinned,
                     tport_err *err);
/* Starts copying the first reads of n bytes (a get's chunks: 0, n, ...)
 * from a device before they are asked for, so that the round trip between
 * the reply naming the transfer and its first chunk request overlaps the
 * first copies; only before any read, never waiting for the pool, nothing
 * for a host reader.  The calling thread's allocation guard is asked for
 * the blocks (ENGINE_ALLOC_READAHEAD) as a read's are. */
void reader_read_ahead(tensor_reader *r, size_t n);
/* Blocks the reader has lent that have not come back yet (0 from the host). */
int reader_blocks_out(const tensor_reader *r);
/* Drops the reader (blocks still lent come back to the pool on their own). */
void reader_close(tensor_reader *r);

#endif
