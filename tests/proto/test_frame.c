/* test_frame.c: the frame codec: round trip, and each malformed frame. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "frame.h"

static uint8_t *make_frame(uint16_t method, const char *payload, size_t *len)
{
  Tport__PutChunkRequest req = TPORT__PUT_CHUNK_REQUEST__INIT;
  Tport__Ref ref = TPORT__REF__INIT;
  uint8_t h[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  ref.handle.data = h;
  ref.handle.len = 16;
  req.ref = &ref;
  req.offset = 1u << 20;
  size_t head = frame_head_size(&req.base), pl = payload ? strlen(payload) : 0;
  uint8_t *buf = malloc(head + pl);
  frame_write_head(buf, method, 0, &req.base);
  if (pl)
    memcpy(buf + head, payload, pl);
  *len = head + pl;
  return buf;
}

Test(frame, round_trip)
{
  size_t len;
  uint8_t *buf = make_frame(TPORT__METHOD__METHOD_PUT_CHUNK, "tensor bytes", &len);
  frame_view v;
  cr_assert_eq(frame_parse(buf, len, &v, NULL), 0);
  cr_assert_eq(v.method, TPORT__METHOD__METHOD_PUT_CHUNK);
  cr_assert_eq(v.payload_len, 12);
  cr_assert(memcmp(v.payload, "tensor bytes", 12) == 0);
  ProtobufCMessage *m;
  cr_assert_eq(frame_unpack(&v, &tport__put_chunk_request__descriptor, &m, NULL), 0);
  Tport__PutChunkRequest *r = (Tport__PutChunkRequest *)m;
  cr_assert_eq(r->offset, 1u << 20);
  cr_assert_eq(r->ref->handle.len, 16);
  protobuf_c_message_free_unpacked(m, NULL);
  free(buf);
}

Test(frame, empty_payload)
{
  size_t len;
  uint8_t *buf = make_frame(TPORT__METHOD__METHOD_INFO, NULL, &len);
  frame_view v;
  cr_assert_eq(frame_parse(buf, len, &v, NULL), 0);
  cr_assert_eq(v.payload_len, 0);
  cr_assert_null(v.payload);
  free(buf);
}

Test(frame, malformed)
{
  size_t len;
  uint8_t *buf = make_frame(TPORT__METHOD__METHOD_PUT_CHUNK, "abc", &len);
  frame_view v;
  tport_err e;
  for (size_t cut = 0; cut < FRAME_HEADER_BYTES; cut++)
    cr_assert_eq(frame_parse(buf, cut, &v, &e), TPORT_INVALID_ARGUMENT, "truncated at %zu", cut);
  /* truncated inside the message: the length now runs past the end */
  cr_assert_eq(frame_parse(buf, FRAME_HEADER_BYTES + 2, &v, &e), TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(e.msg, "only 2 bytes follow"), "%s", e.msg);
  uint8_t *bad = malloc(len);
  memcpy(bad, buf, len);
  bad[0] = 'X';
  cr_assert_eq(frame_parse(bad, len, &v, &e), TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(e.msg, "magic"), "%s", e.msg);
  memcpy(bad, buf, len);
  bad[4] = 2;
  cr_assert_eq(frame_parse(bad, len, &v, &e), TPORT_FAILED_PRECONDITION);
  cr_assert(strstr(e.msg, "version is 2"), "%s", e.msg);
  memcpy(bad, buf, len);
  bad[8] = 0x7f; /* a huge message length */
  cr_assert_eq(frame_parse(bad, len, &v, &e), TPORT_INVALID_ARGUMENT);
  /* garbage message bytes fail to unpack, with the message type named */
  memcpy(bad, buf, len);
  memset(bad + FRAME_HEADER_BYTES, 0xff, len - FRAME_HEADER_BYTES - 3);
  cr_assert_eq(frame_parse(bad, len, &v, &e), 0);
  ProtobufCMessage *m;
  cr_assert_eq(frame_unpack(&v, &tport__put_chunk_request__descriptor, &m, &e),
               TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(e.msg, "PutChunkRequest"), "%s", e.msg);
  free(bad);
  free(buf);
}

Test(frame, method_numbers_follow_the_service)
{
  const ProtobufCServiceDescriptor *s = &tport__tensor_port__descriptor;
  cr_assert_eq(s->n_methods, 21);
  cr_assert_str_eq(frame_method(TPORT__METHOD__METHOD_HELLO)->name, "Hello");
  cr_assert_str_eq(frame_method(TPORT__METHOD__METHOD_PUT_CHUNK)->name, "PutChunk");
  cr_assert_str_eq(frame_method(TPORT__METHOD__METHOD_GET_CHUNK)->name, "GetChunk");
  cr_assert_str_eq(frame_method(TPORT__METHOD__METHOD_CONTIGUOUS)->name, "Contiguous");
  cr_assert_str_eq(frame_method(TPORT__METHOD__METHOD_STATS)->name, "Stats");
  cr_assert_null(frame_method(0));
  cr_assert_str_eq(frame_method(TPORT__METHOD__METHOD_SHM_REGISTER)->name, "ShmRegister");
  cr_assert_str_eq(frame_method(TPORT__METHOD__METHOD_SHM_RELEASE)->name, "ShmRelease");
  cr_assert_str_eq(frame_method(TPORT__METHOD__METHOD_PUT_BATCH)->name, "PutBatch");
  cr_assert_str_eq(frame_method(TPORT__METHOD__METHOD_GET_BATCH)->name, "GetBatch");
  cr_assert_null(frame_method(22));
  /* each method's name matches its enum value's name */
  const ProtobufCEnumDescriptor *e = &tport__method__descriptor;
  for (unsigned i = 1; i <= s->n_methods; i++) {
    const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(e, (int)i);
    cr_assert_not_null(ev);
    char want[64] = "METHOD_", *w = want + 7;
    for (const char *c = frame_method((uint16_t)i)->name; *c; c++) {
      if (c != frame_method((uint16_t)i)->name && *c >= 'A' && *c <= 'Z')
        *w++ = '_';
      *w++ = (char)(*c >= 'a' && *c <= 'z' ? *c - 32 : *c);
    }
    *w = 0;
    cr_assert_str_eq(ev->name, want);
  }
}
