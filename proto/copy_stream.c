/*
 * copy_stream.c: memcpy with non-temporal stores (copy_stream.h).
 *
 * A PutBatch of many small tensors writes each one's bytes into a block of
 * its own: 10,000 x 4 KiB stream 40 MB through the caches, and with
 * ordinary stores every destination line is first read for ownership and
 * then evicts what the next element needs (the registry's hash buckets,
 * the allocator's chunks).  Non-temporal stores write the lines without
 * reading them and leave the caches alone: on the development machine
 * (2-core VM, AMD EPYC) tportd's workers used 8-15% less CPU on such a
 * batch.  libtport's copies out of a large get's chunks into the caller's
 * buffer are the same case.  SSE2's 16-byte streaming store is part of
 * x86-64 itself, so there is no run-time choice to make; elsewhere this is
 * memcpy.
 */
#include <stdint.h>
#include <string.h>

#include "copy_stream.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

void memcpy_stream(void *dst, const void *src, size_t n)
{
  char *d = dst;
  const char *s = src;
  /* to a 16-byte boundary of dst: streaming stores need aligned lines */
  size_t head = (size_t)(-(uintptr_t)d & 15);
  if (head > n)
    head = n;
  memcpy(d, s, head);
  d += head, s += head, n -= head;
  for (; n >= 64; d += 64, s += 64, n -= 64) {
    __m128i a = _mm_loadu_si128((const __m128i *)s);
    __m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
    __m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
    __m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
    _mm_stream_si128((__m128i *)d, a);
    _mm_stream_si128((__m128i *)(d + 16), b);
    _mm_stream_si128((__m128i *)(d + 32), c);
    _mm_stream_si128((__m128i *)(d + 48), e);
  }
  for (; n >= 16; d += 16, s += 16, n -= 16)
    _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
  memcpy(d, s, n);
  /* the streaming stores are weakly ordered: done before whatever
   * publishes the bytes to another thread */
  _mm_sfence();
}

#else

void memcpy_stream(void *dst, const void *src, size_t n)
{
  memcpy(dst, src, n);
}

#endif
