/* frame.c: the frame codec (see frame.h for the layout). */
#include "frame.h"

#include "arena.h"

#include <string.h>

static uint32_t get_be32(const uint8_t *p)
{
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void put_be32(uint8_t *p, uint32_t v)
{
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

int frame_parse(const void *buf, size_t len, frame_view *out, tport_err *err)
{
  const uint8_t *p = buf;
  if (len < FRAME_HEADER_BYTES)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "frame is %zu bytes: shorter than the %d-byte header", len,
                         FRAME_HEADER_BYTES);
  uint32_t magic = get_be32(p);
  if (magic != FRAME_MAGIC)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "frame magic is 0x%08x: not a tensorport frame (expected 0x%08x)", magic,
                         FRAME_MAGIC);
  if (p[4] != FRAME_VERSION)
    return tport_err_set(err, TPORT_FAILED_PRECONDITION,
                         "frame version is %u: this build speaks version %d", p[4], FRAME_VERSION);
  uint32_t msg_len = get_be32(p + 8);
  if (msg_len > FRAME_MAX_MESSAGE_BYTES)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "frame message length is %u: the limit is %u",
                         msg_len, FRAME_MAX_MESSAGE_BYTES);
  if ((size_t)msg_len > len - FRAME_HEADER_BYTES)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "frame message length is %u but only %zu bytes follow the header", msg_len,
                         len - FRAME_HEADER_BYTES);
  out->version = p[4];
  out->flags = p[5];
  out->method = (uint16_t)(p[6] << 8 | p[7]);
  out->msg = p + FRAME_HEADER_BYTES;
  out->msg_len = msg_len;
  out->payload_len = len - FRAME_HEADER_BYTES - msg_len;
  out->payload = out->payload_len ? out->msg + msg_len : NULL;
  return TPORT_OK;
}

size_t frame_head_size(const ProtobufCMessage *msg)
{
  return FRAME_HEADER_BYTES + protobuf_c_message_get_packed_size(msg);
}

void frame_write_header(void *buf, uint16_t method, uint8_t flags, size_t msg_len)
{
  uint8_t *p = buf;
  put_be32(p, FRAME_MAGIC);
  p[4] = FRAME_VERSION;
  p[5] = flags;
  p[6] = (uint8_t)(method >> 8);
  p[7] = (uint8_t)method;
  put_be32(p + 8, (uint32_t)msg_len);
}

void frame_write_head(void *buf, uint16_t method, uint8_t flags, const ProtobufCMessage *msg)
{
  uint8_t *p = buf;
  size_t n = protobuf_c_message_pack(msg, p + FRAME_HEADER_BYTES);
  frame_write_header(p, method, flags, n);
}

int frame_unpack(const frame_view *v, const ProtobufCMessageDescriptor *d, ProtobufCMessage **out,
                 tport_err *err)
{
  ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, v->msg_len, v->msg);
  if (!m)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "frame message is not a valid %s", d->name);
  *out = m;
  return TPORT_OK;
}

int frame_unpack_in(const frame_view *v, const ProtobufCMessageDescriptor *d, struct arena *a,
                    ProtobufCMessage **out, tport_err *err)
{
  if (!a)
    return frame_unpack(v, d, out, err);
  ProtobufCMessage *m = protobuf_c_message_unpack(d, &a->allocator, v->msg_len, v->msg);
  if (!m)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "frame message is not a valid %s", d->name);
  *out = m;
  return TPORT_OK;
}

const ProtobufCMethodDescriptor *frame_method(uint16_t method)
{
  const ProtobufCServiceDescriptor *s = &tport__tensor_port__descriptor;
  if (method == 0 || method > s->n_methods)
    return NULL;
  return &s->methods[method - 1];
}
