/*
 * host_copy.c: the copy kernel of host memory (host_copy.h).
 *
 * A copy larger than the last-level cache cannot leave its destination
 * there, and with ordinary stores every destination line is first read
 * for ownership: the bytes cross the memory bus three times instead of
 * two.  glibc's memcpy streams only from a size near the cache's, which
 * the pool's pieces (a few MiB each) never reach.  Measured on the
 * development machine (2-core VM, AMD EPYC): a get of 256 MiB into an
 * explicit region (tportd's copy into it) went from 6.8-7.7 to 11.9-12.8
 * GB/s in alternating runs; a put from one stayed at 8.6-9.7.
 */
#include "host_copy.h"

#include "copy_stream.h"

void host_copy(const plan *p, void *dst, tport_dtype dt, const void *src, tport_dtype st,
               unsigned flags)
{
  size_t n;
  if (!cpu_copy_is_memcpy(p, dt, st, flags, &n) || n < HOST_COPY_STREAM_MIN) {
    cpu_copy(p, dst, dt, src, st, flags);
    return;
  }
  cpu_memcpy_split(dst, src, n, memcpy_stream);
}
