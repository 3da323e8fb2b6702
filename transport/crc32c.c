/* crc32c.c: CRC32C through ISA-L (crc32c.h). */
#include "crc32c.h"

#include <isa-l/crc.h>
#include <limits.h>

uint32_t transport_crc32c(uint32_t crc, const void *p, size_t n)
{
  /* ISA-L's crc32_iscsi neither inverts on entry nor on exit (the iSCSI
   * convention leaves that to the caller), and takes an int length */
  const unsigned char *b = p;
  unsigned int c = ~crc;
  while (n > 0) {
    size_t piece = n < (size_t)INT_MAX ? n : (size_t)1 << 30;
    c = crc32_iscsi((unsigned char *)b, (int)piece, c);
    b += piece;
    n -= piece;
  }
  return ~c;
}
