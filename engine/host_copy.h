/* host_copy.h: the copy kernel of the devices whose memory is the host's
 * (cpu, sim), streaming large plain copies (host_copy.c). */
#ifndef TPORT_HOST_COPY_H
#define TPORT_HOST_COPY_H

#include "cpu_kernels.h"

/* From this many bytes on, a copy that is one memcpy writes with
 * non-temporal stores, split across the pool as cpu_copy splits it.  A
 * copy under a deadline runs in pieces of ENGINE_PIECE_ELEMS elements (16
 * MiB of bytes and more), each a kernel of its own: this is one of them. */
#define HOST_COPY_STREAM_MIN ((size_t)16 << 20)

/* cpu_copy, but a memcpy of HOST_COPY_STREAM_MIN bytes or more with
 * streaming stores (memcpy_stream). */
void host_copy(const plan *p, void *dst, tport_dtype dst_dtype, const void *src,
               tport_dtype src_dtype, unsigned flags);

#endif
