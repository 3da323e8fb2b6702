/*
 * pb_fields.h: protobuf's wire encoding of length-delimited fields, for
 * messages spliced together from parts packed apart (a batch's reply from
 * its elements' packed replies): a repeated message field is its
 * elements' encodings one after another, each a key, a length and the
 * bytes.
 */
#ifndef TPORT_PB_FIELDS_H
#define TPORT_PB_FIELDS_H

#include <stddef.h>
#include <stdint.h>

/* The bytes of v as a varint (1 to 10). */
size_t pb_varint_size(uint64_t v);
/* Writes v as a varint at p; returns where it ends. */
uint8_t *pb_put_varint(uint8_t *p, uint64_t v);
/* The bytes of field `field` holding len bytes: its key, its length, the bytes. */
size_t pb_field_size(uint32_t field, size_t len);
/* Writes that field's key and length at p (the len bytes go after them);
 * returns where they end. */
uint8_t *pb_put_field_head(uint8_t *p, uint32_t field, size_t len);

#endif
