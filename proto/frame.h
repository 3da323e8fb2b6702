/*
 * frame.h: the frame codec.  One nng message is one frame:
 *
 *   offset 0  u32  magic "TPRT" (big-endian 0x54505254)
 *          4  u8   version (FRAME_VERSION)
 *          5  u8   flags (FRAME_FLAG_*)
 *          6  u16  method (tport.proto's Method; big-endian)
 *          8  u32  length of the protobuf message that follows (big-endian)
 *         12  ...  the protobuf-c message
 *          .  ...  raw payload trailer: everything after the message
 *
 * Tensor bytes travel in the trailer so that neither side copies them
 * through protobuf.  frame_parse() never trusts a length it was sent.
 */
#ifndef TPORT_FRAME_H
#define TPORT_FRAME_H

#include <protobuf-c/protobuf-c.h>

#include "tport.pb-c.h"
#include "tport_types.h"

#define FRAME_MAGIC 0x54505254u
#define FRAME_VERSION 1
#define FRAME_HEADER_BYTES 12
/* Largest protobuf part of a frame: descriptors and replies are small. */
#define FRAME_MAX_MESSAGE_BYTES (16u << 20)

enum {
  FRAME_FLAG_REPLY = 1u << 0, /* set on every reply */
};

typedef struct frame_view {
  uint8_t version;
  uint8_t flags;
  uint16_t method;
  const uint8_t *msg; /* borrowed from the buffer given to frame_parse */
  size_t msg_len;
  const uint8_t *payload; /* borrowed; NULL when payload_len is 0 */
  size_t payload_len;
} frame_view;

/* Splits a received buffer into header, message and payload (all borrowed).
 * INVALID_ARGUMENT for a short buffer, wrong magic or a length past the end;
 * FAILED_PRECONDITION for a version this build does not speak. */
int frame_parse(const void *buf, size_t len, frame_view *out, tport_err *err);

/* Bytes of header plus packed message (the payload goes after them). */
size_t frame_head_size(const ProtobufCMessage *msg);
/* Writes the 12-byte header of a frame whose message is msg_len bytes. */
void frame_write_header(void *buf, uint16_t method, uint8_t flags, size_t msg_len);
/* Writes header and packed message into buf (frame_head_size(msg) bytes). */
void frame_write_head(void *buf, uint16_t method, uint8_t flags, const ProtobufCMessage *msg);

/* Unpacks the message of a parsed frame with descriptor d; the caller frees
 * the result with protobuf_c_message_free_unpacked(result, NULL). */
int frame_unpack(const frame_view *v, const ProtobufCMessageDescriptor *d, ProtobufCMessage **out,
                 tport_err *err);

/* The same, unpacked into arena a (NULL: malloc, as frame_unpack): the
 * result goes with arena_reset and is never freed by itself. */
struct arena;
int frame_unpack_in(const frame_view *v, const ProtobufCMessageDescriptor *d, struct arena *a,
                    ProtobufCMessage **out, tport_err *err);

/* The service's method for a method number (1-based); NULL if unknown. */
const ProtobufCMethodDescriptor *frame_method(uint16_t method);

#endif
