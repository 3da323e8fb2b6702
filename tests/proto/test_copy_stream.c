/* test_copy_stream.c: memcpy_stream (proto/copy_stream.c), the copy with
 * non-temporal stores that tportd writes a large batch's elements with
 * and libtport a large get's bytes into the caller's buffer. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "copy_stream.h"

/* memcpy_stream: the bytes of memcpy at every length up to a few lines
 * and every alignment of both ends (its aligned head, streamed body and
 * tail), and not a byte outside the destination's range. */
Test(copy_stream, is_memcpy)
{
  enum { MAX = 300, PAD = 64 };
  static uint8_t src[MAX + PAD], dst[MAX + 2 * PAD], want[MAX + 2 * PAD];
  for (size_t i = 0; i < sizeof src; i++)
    src[i] = (uint8_t)(i * 31 + 7);
  for (size_t n = 0; n <= MAX; n++)
    for (size_t so = 0; so < 32; so += 3)
      for (size_t d0 = 0; d0 < 32; d0++) {
        memset(dst, 0xA5, sizeof dst);
        memset(want, 0xA5, sizeof want);
        memcpy(want + PAD + d0, src + so, n);
        memcpy_stream(dst + PAD + d0, src + so, n);
        cr_assert_eq(memcmp(dst, want, sizeof dst), 0, "%zu bytes, src +%zu, dst +%zu", n, so, d0);
      }
  /* and a large one, as a batch's element may be */
  size_t big = (size_t)3 << 20;
  uint8_t *a = malloc(big + 1), *b = malloc(big + 1);
  for (size_t i = 0; i < big; i++)
    a[i] = (uint8_t)(i ^ (i >> 9));
  memcpy_stream(b + 1, a, big);
  cr_assert_eq(memcmp(b + 1, a, big), 0);
  free(a);
  free(b);
}
