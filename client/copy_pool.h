/* copy_pool.h: libtport's threaded copy of large buffers (copy_pool.c). */
#ifndef TPORT_CLIENT_COPY_POOL_H
#define TPORT_CLIENT_COPY_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Copies of fewer bytes are one memcpy: below this, waking threads costs
 * more than it saves. */
#define COPY_POOL_MIN_BYTES ((size_t)4 << 20)
/* Threads by default: the CPUs this process may run on, at most this many.
 * On a 16-core GPU host (2026-11-27, bench/RESULTS.md) 8 threads copied
 * 256 MiB at 31 GB/s and 16 at 49 GB/s (one memcpy: 9 GB/s); the threads
 * run only while a copy does, so the cap is what the memory gives, not
 * what the server's cores could spare. */
#define COPY_POOL_DEFAULT_MAX 16
/* TPORT_COPY_THREADS is clamped to this. */
#define COPY_POOL_MAX_THREADS 64
/* No piece is smaller than this (except the last): a thread's piece must
 * outweigh waking it. */
#define COPY_POOL_MIN_PIECE ((size_t)1 << 20)

/* A copy out into the caller's buffer of a get of this many bytes or more
 * writes with non-temporal stores (memcpy_stream): the destination is
 * larger than the caches, and ordinary stores would first read each of its
 * lines and push out the chunks still to be copied.  The automatic
 * region's get of 256 MiB went from 0.42-0.49 to 0.52-0.61 of an explicit
 * region's on the development VM (2 cores). */
#define COPY_POOL_OUT_STREAM_MIN ((size_t)32 << 20)
/* Copies n bytes from src to dst (not overlapping), split across the copy
 * pool when n is at least COPY_POOL_MIN_BYTES and the pool is free, else
 * one memcpy in the calling thread.  Safe from any number of threads. */
void copy_pool_copy(void *dst, const void *src, size_t n);
/* The same for bytes of a get (of total bytes in all) into the caller's
 * buffer: with non-temporal stores from COPY_POOL_OUT_STREAM_MIN on. */
void copy_pool_copy_out(void *dst, const void *src, size_t n, size_t total);

/* A copy that runs in the background while its caller uses what is
 * copied: a put through the automatic region sends each chunk as soon as
 * its bytes are in the region, while the pool copies the next ones (the
 * caller's sends and the server's copies out overlap the pool's copy in).
 * Pieces are taken in order, so the copied prefix grows from the start.
 * A stream holds the pool from begin to end: end it on the thread that
 * began it, on every path (a fork waits for it as for any copy).  It uses
 * three quarters of the pool's threads unless TPORT_COPY_THREADS set them:
 * the other cores are the sender's and the server's. */
typedef struct copy_stream {
  struct copy_job *job; /* NULL: no stream (begin said false) */
  size_t ready;         /* bytes [0, ready) are known to be copied */
} copy_stream;

/* Starts copying n bytes from src to dst in the background; false when the
 * pool cannot take it (busy, off, n too small, out of memory): copy some
 * other way then (s is left empty, and end is a no-op). */
bool copy_pool_stream_begin(copy_stream *s, void *dst, const void *src, size_t n);
/* A stream whose source arrives in order (a get's chunks, written into
 * the region one after another): no byte of src is read before the caller
 * supplies it; a copy out, as copy_pool_copy_out's of n bytes of total.
 * false as for copy_pool_stream_begin. */
bool copy_pool_stream_begin_gated(copy_stream *s, void *dst, const void *src, size_t n,
                                  size_t total);
/* Bytes [0, upto) of a gated stream's source may be read now (no-op for
 * others); upto only grows. */
void copy_pool_stream_supply(copy_stream *s, size_t upto);
/* Returns once bytes [0, upto) of the stream are copied (upto at most n,
 * and for a gated stream at most what was supplied);
 * the caller copies pieces itself meanwhile rather than wait idle. */
void copy_pool_stream_wait(copy_stream *s, size_t upto);
/* Ends the stream: no piece starts after this is called, and none is
 * still being copied when it returns (with finish, every piece is copied
 * first -- a gated stream's source is all supplied then; without, what was
 * not started is left uncopied).  The pool is free again. */
void copy_pool_stream_end(copy_stream *s, bool finish);

/* The threads a large copy uses, the caller's included (1: the pool is
 * off).  Read once, on first use, from TPORT_COPY_THREADS (1 or more),
 * else the CPU count capped at COPY_POOL_DEFAULT_MAX. */
int copy_pool_threads(void);

/* How a copy of n bytes to dst is cut: pieces of piece bytes, the first
 * ending on a 4 KiB boundary of dst (threads then never write the same
 * page) and the last whatever is left.  Pure; exposed for the tests. */
typedef struct copy_split {
  size_t n;       /* bytes in all */
  size_t head;    /* bytes of dst before its first 4 KiB boundary (< 4096) */
  size_t piece;   /* a piece's bytes (a multiple of 4096) */
  size_t npieces; /* >= 1 */
} copy_split;
void copy_split_make(copy_split *s, uintptr_t dst, size_t n, size_t want_pieces);
/* Piece k (< npieces): bytes [*off, *off + *len). */
void copy_split_piece(const copy_split *s, size_t k, size_t *off, size_t *len);

#endif
