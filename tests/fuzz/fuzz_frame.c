/*
 * fuzz_frame.c: what the server reads before any handler runs: the frame
 * codec (frame_parse, frame_unpack, and frame_write_head on the way back)
 * and validate_desc on every layout a request carries.
 *
 * Input: a frame as it comes off the wire.  Its header's method picks the
 * message type; when the frame does not parse or names no method, the first
 * byte picks the method and the rest is the message, so that the fuzzer
 * reaches every type without having to learn the header first.  The message
 * is unpacked as that method's request and as its reply (a client reads
 * replies with the same codec).  Every TensorDesc found (PutBegin.desc, the
 * TensorInfo.desc of replies) and every View's sizes/strides/offset go
 * through validate_desc, and every layout it accepts is checked with exact
 * 128-bit arithmetic: its counts are right and it never reaches past its
 * storage.  Accepted layouts then go through the meta.c predicates the
 * handlers call on them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "frame.h"
#include "fuzz_target.h"
#include "meta.h"
#include "validate.h"

typedef __int128 i128;

/* Anything past this is rejected by validate_desc anyway; clamping keeps the
 * oracle's own sums inside 128 bits. */
#define ORACLE_CLAMP ((i128)1 << 100)

static i128 clamp(i128 v)
{
  return v > ORACLE_CLAMP ? ORACLE_CLAMP : v;
}

/* FUZZ_SKIP_KNOWN=1 (exploration only; `make fuzz` and the replays never
 * set it): layouts that hit a defect already reported and not fixed yet are
 * skipped, so that the fuzzer can look past them.  Each test names its
 * regression; delete it once that regression passes. */
static bool skip_known(size_t ndim, const int64_t *sizes, size_t nstrides, const int64_t *strides)
{
  static int on = -1;
  if (on < 0)
    on = getenv("FUZZ_SKIP_KNOWN") != NULL;
  if (!on || ndim > TPORT_MAX_DIMS)
    return false;
  /* regressions/frame/put-begin-empty-huge-dims-contiguous-strides-overflow:
   * meta_fresh_strides overflows for an empty tensor with huge sizes */
  i128 prod = 1;
  for (size_t d = 0; nstrides == 0 && d < ndim; d++)
    if ((prod *= sizes[d] > 1 ? sizes[d] : 1) > INT64_MAX)
      return true;
  return false;
}

/* validate_desc, then the oracle on what it accepted. */
static void check_desc(int dtype, size_t ndim, const int64_t *sizes, size_t nstrides,
                       const int64_t *strides, int64_t offset, int64_t storage_bytes)
{
  if (skip_known(ndim, sizes, nstrides, strides))
    return;
  meta_layout l;
  validate_result r;
  tport_err err;
  tport_err_clear(&err);
  int rc =
      validate_desc(dtype, ndim, sizes, nstrides, strides, offset, storage_bytes, &l, &r, &err);
  if (rc) {
    FUZZ_CHECK(err.code == rc && err.msg[0], "a rejection (%d) without its message", rc);
    return;
  }
  FUZZ_CHECK(dtype_name(dtype) != NULL, "dtype %d accepted", dtype);
  FUZZ_CHECK(ndim <= TPORT_MAX_DIMS, "%zu dims accepted", ndim);
  FUZZ_CHECK(nstrides == 0 || nstrides == ndim, "%zu strides for %zu dims", nstrides, ndim);
  FUZZ_CHECK(l.ndim == (int)ndim && l.offset == offset, "the layout is not the one given");
  i128 esize = (i128)tport_dtype_size(dtype);
  i128 numel = 1;
  for (size_t d = 0; d < ndim; d++) {
    FUZZ_CHECK(sizes[d] >= 0 && l.sizes[d] == sizes[d], "sizes[%zu] is %lld", d,
               (long long)sizes[d]);
    FUZZ_CHECK(nstrides == 0 || (strides[d] >= 0 && l.strides[d] == strides[d]),
               "strides[%zu] is %lld", d, (long long)l.strides[d]);
    FUZZ_CHECK(l.strides[d] >= 0, "a filled-in stride is negative");
    numel *= sizes[d]; /* at most 2^63 * 2^63: inside 128 bits */
    if (numel > (i128)1 << 63)
      numel = (i128)1 << 63;
  }
  FUZZ_CHECK(offset >= 0, "storage_offset %lld accepted", (long long)offset);
  FUZZ_CHECK(numel == r.numel, "numel is %lld, validate_desc says %lld", (long long)numel,
             (long long)r.numel);
  FUZZ_CHECK(numel * esize == r.nbytes && r.nbytes <= VALIDATE_MAX_BYTES,
             "nbytes is %lld for %lld elements of %d bytes", (long long)r.nbytes, (long long)numel,
             (int)esize);
  /* the last element reached, exactly: (offset + sum (size-1) * stride + 1) */
  i128 end = offset;
  if (numel > 0) {
    for (size_t d = 0; d < ndim; d++)
      end = clamp(end + clamp((i128)(l.sizes[d] - 1) * l.strides[d]));
    end += 1;
  }
  i128 need = end * esize;
  FUZZ_CHECK(need <= VALIDATE_MAX_BYTES,
             "an accepted layout reaches byte 0x%llx%016llx (offset %lld): past 2^62",
             (unsigned long long)(need >> 64), (unsigned long long)need, (long long)offset);
  FUZZ_CHECK(need == r.storage_bytes,
             "the layout needs %lld storage bytes, validate_desc says %lld", (long long)need,
             (long long)r.storage_bytes);
  FUZZ_CHECK(storage_bytes < 0 || need <= storage_bytes,
             "a layout reaching byte %lld accepted in a storage of %lld bytes", (long long)need,
             (long long)storage_bytes);
  /* what the handlers ask of an accepted layout */
  (void)meta_numel(&l);
  (void)meta_is_contiguous(&l);
  (void)meta_is_non_overlapping_and_dense(&l);
  (void)meta_suggest_memory_format(&l);
  (void)meta_actual_memory_format(&l);
}

static void check_tensor_desc(const Tport__TensorDesc *d, int64_t storage_bytes)
{
  check_desc((int)d->dtype, d->n_sizes, d->sizes, d->n_strides, d->strides, d->storage_offset,
             storage_bytes);
}

/* A View carries no dtype: the server takes its tensor's.  Two element
 * widths, with and without a storage to fit in, cover the arithmetic. */
static void check_view(const Tport__ViewRequest *q, int64_t storage_bytes)
{
  check_desc(TPORT_UINT8, q->n_sizes, q->sizes, q->n_strides, q->strides, q->storage_offset, -1);
  check_desc(TPORT_COMPLEX128, q->n_sizes, q->sizes, q->n_strides, q->strides, q->storage_offset,
             storage_bytes);
}

/* Walks an unpacked message and its submessages; checks every layout. */
static void walk(const ProtobufCMessage *m, int64_t payload_len)
{
  const ProtobufCMessageDescriptor *md = m->descriptor;
  if (md == &tport__tensor_desc__descriptor) {
    check_tensor_desc((const Tport__TensorDesc *)m, -1);
    check_tensor_desc((const Tport__TensorDesc *)m, payload_len);
  } else if (md == &tport__tensor_info__descriptor) {
    const Tport__TensorInfo *i = (const Tport__TensorInfo *)m;
    if (i->desc)
      check_tensor_desc(i->desc, i->storage_nbytes);
  } else if (md == &tport__view_request__descriptor) {
    check_view((const Tport__ViewRequest *)m, payload_len);
  }
  for (unsigned f = 0; f < md->n_fields; f++) {
    const ProtobufCFieldDescriptor *fd = &md->fields[f];
    if (fd->type != PROTOBUF_C_TYPE_MESSAGE)
      continue;
    const char *base = (const char *)m + fd->offset;
    if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
      size_t n = *(const size_t *)((const char *)m + fd->quantifier_offset);
      ProtobufCMessage *const *v = *(ProtobufCMessage *const *const *)base;
      for (size_t k = 0; k < n; k++)
        if (v[k])
          walk(v[k], payload_len);
    } else {
      const ProtobufCMessage *sub = *(const ProtobufCMessage *const *)base;
      if (sub)
        walk(sub, payload_len);
    }
  }
}

/* Packs m into a frame and reads it back: the writer and the parser agree. */
static void round_trip(const ProtobufCMessage *m, uint16_t method)
{
  size_t n = frame_head_size(m);
  uint8_t *buf = malloc(n + 3);
  FUZZ_CHECK(buf != NULL, "out of memory");
  memcpy(buf + n, "xyz", 3); /* a payload trailer */
  frame_write_head(buf, method, FRAME_FLAG_REPLY, m);
  frame_view v;
  tport_err err;
  FUZZ_CHECK(frame_parse(buf, n + 3, &v, &err) == TPORT_OK, "a written frame does not parse: %s",
             err.msg);
  FUZZ_CHECK(v.method == method && v.flags == FRAME_FLAG_REPLY && v.version == FRAME_VERSION,
             "header fields changed on the way");
  FUZZ_CHECK(v.msg_len + FRAME_HEADER_BYTES == n && v.payload_len == 3 &&
                 memcmp(v.payload, "xyz", 3) == 0,
             "the message is %zu bytes of %zu, the payload %zu", v.msg_len, n, v.payload_len);
  /* protobuf-c 1.4 reads an unknown field numbered 0 when its tag is a
   * non-canonical 2-byte varint, and rejects the 1-byte tag it packs it
   * back as: so a re-packed message need not unpack (not ours to check) */
  ProtobufCMessage *again;
  if (frame_unpack(&v, m->descriptor, &again, &err) == TPORT_OK) {
    FUZZ_CHECK(protobuf_c_message_get_packed_size(again) == v.msg_len,
               "a re-packed %s changes size", m->descriptor->name);
    protobuf_c_message_free_unpacked(again, NULL);
  }
  free(buf);
}

static void unpack_as(const frame_view *v, const ProtobufCMessageDescriptor *d)
{
  ProtobufCMessage *m;
  tport_err err;
  if (frame_unpack(v, d, &m, &err) != TPORT_OK) {
    FUZZ_CHECK(err.code == TPORT_INVALID_ARGUMENT && err.msg[0], "an unpack failure says %d",
               err.code);
    return;
  }
  walk(m, (int64_t)v->payload_len);
  round_trip(m, v->method);
  protobuf_c_message_free_unpacked(m, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  frame_view v;
  tport_err err;
  const ProtobufCMethodDescriptor *md = NULL;
  int rc = frame_parse(data, size, &v, &err);
  if (rc == TPORT_OK) {
    FUZZ_CHECK(size >= FRAME_HEADER_BYTES && v.msg >= data && v.msg + v.msg_len <= data + size &&
                   v.msg_len + v.payload_len + FRAME_HEADER_BYTES == size,
               "frame_parse's view leaves the buffer");
    FUZZ_CHECK((v.payload == NULL) == (v.payload_len == 0), "payload pointer and length disagree");
    md = frame_method(v.method);
  } else {
    FUZZ_CHECK((rc == TPORT_INVALID_ARGUMENT || rc == TPORT_FAILED_PRECONDITION) && err.msg[0],
               "frame_parse fails with %d", rc);
  }
  if (!md) {
    /* the leading byte picks the method; the rest is the message */
    if (size == 0)
      return 0;
    const ProtobufCServiceDescriptor *s = &tport__tensor_port__descriptor;
    memset(&v, 0, sizeof v);
    v.version = FRAME_VERSION;
    v.method = (uint16_t)(data[0] % s->n_methods + 1);
    v.msg = data + 1;
    v.msg_len = size - 1;
    md = frame_method(v.method);
    FUZZ_CHECK(md != NULL, "method %u has no descriptor", v.method);
  }
  unpack_as(&v, md->input);
  unpack_as(&v, md->output);
  unpack_as(&v, &tport__error_reply__descriptor);
  return 0;
}
