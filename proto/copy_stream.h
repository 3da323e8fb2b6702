/* copy_stream.h: memcpy with non-temporal stores (copy_stream.c), for tportd
 * and libtport alike (libtport compiles it in, as it does block_cache.c). */
#ifndef TPORT_COPY_STREAM_H
#define TPORT_COPY_STREAM_H

#include <stddef.h>

/* memcpy of n bytes (any alignment) with non-temporal stores: for bytes
 * that will not be read again soon, among many more than the caches hold
 * (a large batch's elements, a large get's destination).  Ordered (sfence)
 * before it returns. */
void memcpy_stream(void *dst, const void *src, size_t n);

#endif
