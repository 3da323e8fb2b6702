/* pb_fields.c: length-delimited fields in protobuf's wire encoding. */
#include "pb_fields.h"

size_t pb_varint_size(uint64_t v)
{
  size_t n = 1;
  while (v >= 0x80)
    v >>= 7, n++;
  return n;
}

uint8_t *pb_put_varint(uint8_t *p, uint64_t v)
{
  while (v >= 0x80) {
    *p++ = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  *p++ = (uint8_t)v;
  return p;
}

size_t pb_field_size(uint32_t field, size_t len)
{
  return pb_varint_size((uint64_t)field << 3 | 2) + pb_varint_size(len) + len;
}

uint8_t *pb_put_field_head(uint8_t *p, uint32_t field, size_t len)
{
  return pb_put_varint(pb_put_varint(p, (uint64_t)field << 3 | 2), len);
}
