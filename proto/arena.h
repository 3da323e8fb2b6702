/*
 * arena.h: a bump allocator for protobuf-c's unpacking of one message.
 *
 * protobuf-c allocates every submessage, string and repeated array of a
 * message apart, and frees them one by one: a batch of 256 puts is some
 * 2,000 mallocs and frees, a tenth of tportd's time per small element.
 * Unpacked with an arena's allocator, the message lives in the arena's
 * blocks and goes with arena_reset, all at once; nothing may keep a
 * pointer into it past that.  Not thread-safe: one arena per thread (or
 * per request).  Under AddressSanitizer what a reset gives back is
 * poisoned, so a use after it is still reported.
 */
#ifndef TPORT_ARENA_H
#define TPORT_ARENA_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>

typedef struct arena_block arena_block;

typedef struct arena {
  arena_block *head; /* the block being filled; older ones behind it */
  ProtobufCAllocator allocator;
} arena;

/* An empty arena (its first block is made on the first allocation). */
void arena_init(arena *a);
/* Gives back everything allocated, keeping one block as large as all it
 * held (up to 4 MiB) for the next message. */
void arena_reset(arena *a);
/* Gives back everything. */
void arena_fini(arena *a);
/* How many blocks it holds now. */
size_t arena_blocks(const arena *a);

#endif
