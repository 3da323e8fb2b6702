/* get_blocks.h: the buffers of the gets libtport allocates for its callers
 * and frees itself (tport_get_dlpack's, which Python's Client.get hands to
 * NumPy), kept when freed for the next get that fits.
 *
 * A fresh buffer of many MiB is mapped and zeroed a 4 KiB page fault at a
 * time: on a VM a get of 100 MB into fresh memory took 0.5 s where the same
 * get into a reused buffer took 0.05 s.  A data pipeline gets tensors of
 * the same few sizes over and over; the engine's host cache (host_cache.h)
 * keeps the server's blocks for the same reason.  Buffers of 1 MiB or more
 * are mapped 2 MiB aligned with huge pages asked for and kept up to
 * TPORT_GET_CACHE_BYTES (default a sixteenth of physical memory, at most
 * 1 GiB; 0 keeps none); smaller ones are malloc's.  A kept buffer holds an
 * earlier get's bytes until a get overwrites it whole.  Thread-safe. */
#ifndef TPORT_CLIENT_GET_BLOCKS_H
#define TPORT_CLIENT_GET_BLOCKS_H

#include <stddef.h>

#include "block_cache.h"

#define GET_BLOCKS_MIN_BYTES ((size_t)1 << 20)

void *get_block_alloc(size_t bytes);
void get_block_free(void *p);
void get_blocks_get_stats(block_cache_stats *out);
/* Releases every kept buffer. */
void get_blocks_empty(void);

#endif
