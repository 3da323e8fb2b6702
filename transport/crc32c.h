/*
 * crc32c.h: CRC32C (Castagnoli, the iSCSI polynomial 0x1EDC6F41) of the
 * bytes of a chunk, the same on both ends: the optional end-to-end check of
 * puts and gets (libtport's verify option, tport --verify).
 *
 * Computed by Intel's ISA-L (Debian's libisal), which picks its fastest
 * routine for the CPU at run time (PCLMULQDQ folding, many GB/s).
 */
#ifndef TPORT_TRANSPORT_CRC32C_H
#define TPORT_TRANSPORT_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* The CRC32C of n bytes at p, continuing crc (0 to start): the standard
 * value (of "123456789": 0xE3069283), so that
 * crc32c(crc32c(0, a, n), b, m) is the CRC of a then b. */
uint32_t transport_crc32c(uint32_t crc, const void *p, size_t n);

#endif
