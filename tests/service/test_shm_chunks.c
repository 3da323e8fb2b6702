/*
 * test_shm_chunks.c: a large get through a same-host region a chunk at a
 * time (GetBeginRequest.shm_chunks, GetChunkRequest.shm): the server writes
 * each chunk into the slice its request names while the client copies the
 * one before out.  On the wire (what the server writes where, what it
 * refuses) and through libtport's automatic region (cpu and sim:0, with
 * CRC32C verification and progress).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_internal.h"
#include "crc32c.h"
#include "engine.h"
#include "service_util.h"

#define CHUNK ((size_t)64 << 10) /* svc_config's */

static char sock_dir[64];

static server *start(char *url, size_t len)
{
  server_config cfg;
  svc_config_shm(&cfg, "shmc", sock_dir, sizeof sock_dir);
  return svc_start_with(&cfg, url, len);
}

static void stop(server *s)
{
  server_stop(s, 0);
  rmdir(sock_dir);
}

/* direct: a large get from the cpu may be written straight into the
 * caller's buffer (server/get_direct.h) -- else (TPORT_SHM_DIRECT=0) it
 * goes through the region as a device's does. */
static tport_client *connect_direct(const char *url, bool verify, bool direct)
{
  tport_client *c;
  tport_err err;
  tport_connect_options o = {.tenant = "t", .timeout_ms = 20000, .verify = verify};
  if (!direct)
    cr_assert_eq(setenv("TPORT_SHM_DIRECT", "0", 1), 0);
  cr_assert_eq(tport_connect(url, &o, &c, &err), 0, "connect %s: %s", url, err.msg);
  cr_assert_eq(unsetenv("TPORT_SHM_DIRECT"), 0);
  return c;
}

static tport_client *connect_to(const char *url, bool verify)
{
  return connect_direct(url, verify, false);
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    p[i] = (uint8_t)(x >> 24);
  }
}

/* A uint8 tensor of n bytes of seed's values on device, put by socket. */
static tport_tensor_info put_bytes(tport_client *c, const char *device, size_t n, unsigned seed,
                                   uint8_t **values)
{
  uint8_t *v = malloc(n);
  cr_assert(v);
  fill(v, n, seed);
  tport_put_options o;
  tport_put_options_init(&o);
  o.device = device;
  int64_t sz = (int64_t)n;
  tport_tensor_info info;
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &sz, NULL, v, n, &o, &info, &err), 0, "%s", err.msg);
  *values = v;
  return info;
}

/* GetBegin offering region id's bytes [0, cap) with shm_fallback and
 * (chunks) shm_chunks; the reply is the caller's to free. */
static Tport__GetBeginReply *begin(tport_client *c, const tport_ref *ref, uint64_t id, size_t cap,
                                   bool chunks, bool crc)
{
  Tport__Ref w;
  client_ref_to_wire(ref, &w);
  Tport__ShmSlice s = TPORT__SHM_SLICE__INIT;
  s.region = id;
  s.length = cap;
  Tport__GetBeginRequest q = TPORT__GET_BEGIN_REQUEST__INIT;
  q.ref = &w;
  q.shm = &s;
  q.shm_fallback = true;
  q.shm_chunks = chunks;
  q.want_crc32c = crc;
  q.inline_max = CHUNK;
  Tport__GetBeginReply *b;
  tport_err err;
  cr_assert_eq(client_rpc(c, TPORT__METHOD__METHOD_GET_BEGIN, &q.base, NULL, 0,
                          &tport__get_begin_reply__descriptor, (ProtobufCMessage **)&b, NULL, &err),
               0, "%s", err.msg);
  return b;
}

/* GetChunk [off, off + len) of the transfer into region id's [roff, roff +
 * rlen); *crc (with want) what the reply says. */
static int chunk_into(tport_client *c, const ProtobufCBinaryData *transfer, uint64_t off,
                      uint64_t len, uint64_t id, uint64_t roff, uint64_t rlen, uint32_t *crc,
                      tport_err *err)
{
  Tport__ShmSlice s = TPORT__SHM_SLICE__INIT;
  s.region = id;
  s.offset = roff;
  s.length = rlen;
  Tport__GetChunkRequest q = TPORT__GET_CHUNK_REQUEST__INIT;
  q.transfer = *transfer;
  q.offset = off;
  q.length = len;
  q.shm = &s;
  q.want_crc32c = crc != NULL;
  Tport__GetChunkReply *r;
  client_payload p = {0};
  int rc = client_rpc(c, TPORT__METHOD__METHOD_GET_CHUNK, &q.base, NULL, 0,
                      &tport__get_chunk_reply__descriptor, (ProtobufCMessage **)&r, &p, err);
  if (rc)
    return rc;
  cr_assert_eq(p.len, 0, "a chunk into a region came with %zu payload bytes", p.len);
  if (p.msg)
    nng_msg_free(p.msg);
  if (crc) {
    cr_assert(r->crc32c_set);
    *crc = r->crc32c;
  }
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return TPORT_OK;
}

/* ---------------------------------------------------------------- the wire */

/* A tensor of more than two chunks that fits the region: the reply names
 * a transfer and writes nothing; each GetChunk writes its bytes into the
 * slice it names (in any order, anywhere in the region) and nowhere else.
 * Two chunks or less, or without shm_chunks: written whole at GetBegin. */
Test(shm_chunks, each_chunk_lands_in_the_slice_its_request_names)
{
  char url[96];
  server *s = start(url, sizeof url);
  tport_client *c = connect_to(url, false);
  size_t n = 5 * CHUNK + 4097, cap = 8 * CHUNK;
  tport_shm *r;
  tport_err err;
  cr_assert_eq(tport_shm_create(c, cap, &r, &err), 0, "%s", err.msg);
  uint8_t *region = tport_shm_data(r);
  const char *devices[] = {"cpu", "sim:0"};
  for (int d = 0; d < 2; d++) {
    uint8_t *v;
    tport_tensor_info info = put_bytes(c, devices[d], n, 3u + (unsigned)d, &v);
    memset(region, 0xee, cap);
    Tport__GetBeginReply *b = begin(c, &info.ref, r->id, cap, true, false);
    cr_assert(b->shm_chunks && !b->shm, "%s: not asked for chunks into the region", devices[d]);
    cr_assert_eq(b->transfer.len, 16);
    cr_assert_eq(b->nbytes, n);
    cr_assert_eq(b->chunk_bytes, CHUNK);
    cr_assert_eq(region[0], 0xee, "GetBegin wrote into the region");
    /* the last chunk first, each one chunk further into the region than
     * its offset (the slice is the request's, not the tensor's offset) */
    size_t nchunks = (n + CHUNK - 1) / CHUNK;
    for (size_t k = nchunks; k-- > 0;) {
      size_t off = k * CHUNK, len = n - off < CHUNK ? n - off : CHUNK;
      uint32_t crc;
      cr_assert_eq(chunk_into(c, &b->transfer, off, len, r->id, off + CHUNK, len, &crc, &err), 0,
                   "%s chunk %zu: %s", devices[d], k, err.msg);
      cr_assert_eq(crc, transport_crc32c(0, v + off, len), "%s chunk %zu: CRC32C", devices[d], k);
    }
    cr_assert_eq(memcmp(region + CHUNK, v, n), 0, "%s: the region holds other bytes", devices[d]);
    for (size_t i = 0; i < CHUNK; i++)
      cr_assert_eq(region[i], 0xee, "%s: byte %zu before the slices was written", devices[d], i);
    for (size_t i = CHUNK + n; i < cap; i++)
      cr_assert_eq(region[i], 0xee, "%s: byte %zu after the slices was written", devices[d], i);
    /* the transfer ended with its last byte served */
    cr_assert_eq(chunk_into(c, &b->transfer, 0, CHUNK, r->id, 0, CHUNK, NULL, &err),
                 TPORT_NOT_FOUND, "%s", err.msg);
    protobuf_c_message_free_unpacked(&b->base, NULL);
    /* without shm_chunks: the whole tensor at GetBegin, as before */
    memset(region, 0xee, cap);
    b = begin(c, &info.ref, r->id, cap, false, false);
    cr_assert(b->shm && !b->shm_chunks && b->transfer.len == 0);
    cr_assert_eq(memcmp(region, v, n), 0);
    protobuf_c_message_free_unpacked(&b->base, NULL);
    free(v);
  }
  /* two chunks: written whole even when chunks are asked for */
  uint8_t *v;
  tport_tensor_info info = put_bytes(c, "cpu", 2 * CHUNK, 9, &v);
  Tport__GetBeginReply *b = begin(c, &info.ref, r->id, cap, true, true);
  cr_assert(b->shm && !b->shm_chunks);
  cr_assert_eq(memcmp(region, v, 2 * CHUNK), 0);
  cr_assert(b->crc32c_set && b->crc32c == transport_crc32c(0, v, 2 * CHUNK));
  protobuf_c_message_free_unpacked(&b->base, NULL);
  free(v);
  tport_shm_release(r, NULL);
  tport_close(c);
  stop(s);
}

/* A GetChunk's slice is checked as any slice is, and more: exactly the
 * chunk's length, this connection's region, inside it, host memory; a
 * refused chunk writes nothing and the transfer goes on. */
Test(shm_chunks, a_chunks_slice_is_checked_before_a_byte_is_written)
{
  char url[96];
  server *s = start(url, sizeof url);
  tport_client *c = connect_to(url, false), *other = connect_to(url, false);
  size_t n = 4 * CHUNK, cap = 4 * CHUNK;
  tport_shm *r, *theirs;
  tport_err err;
  cr_assert_eq(tport_shm_create(c, cap, &r, &err), 0, "%s", err.msg);
  cr_assert_eq(tport_shm_create(other, cap, &theirs, &err), 0, "%s", err.msg);
  uint8_t *region = tport_shm_data(r);
  memset(region, 0xee, cap);
  memset(tport_shm_data(theirs), 0xee, cap);
  uint8_t *v;
  tport_tensor_info info = put_bytes(c, "sim:0", n, 5, &v);
  Tport__GetBeginReply *b = begin(c, &info.ref, r->id, cap, true, false);
  cr_assert(b->shm_chunks);
  const ProtobufCBinaryData *x = &b->transfer;
  cr_assert_eq(chunk_into(c, x, 0, CHUNK, r->id, 0, CHUNK - 1, NULL, &err), TPORT_INVALID_ARGUMENT,
               "a slice shorter than the chunk: %s", err.msg);
  cr_assert_eq(chunk_into(c, x, 0, CHUNK, r->id, 0, CHUNK + 1, NULL, &err), TPORT_INVALID_ARGUMENT,
               "a slice longer than the chunk: %s", err.msg);
  cr_assert_eq(chunk_into(c, x, 0, CHUNK, theirs->id, 0, CHUNK, NULL, &err), TPORT_NOT_FOUND,
               "another connection's region: %s", err.msg);
  cr_assert_eq(chunk_into(c, x, 0, CHUNK, r->id + 1000, 0, CHUNK, NULL, &err), TPORT_NOT_FOUND);
  cr_assert_eq(chunk_into(c, x, 0, CHUNK, r->id, cap - CHUNK + 1, CHUNK, NULL, &err),
               TPORT_OUT_OF_RANGE, "a slice past the region: %s", err.msg);
  cr_assert_eq(chunk_into(c, x, 0, CHUNK, r->id, UINT64_MAX - 7, CHUNK, NULL, &err),
               TPORT_OUT_OF_RANGE, "a slice whose end overflows: %s", err.msg);
  cr_assert_eq(chunk_into(c, x, 0, 2 * CHUNK, r->id, 0, 2 * CHUNK, NULL, &err),
               TPORT_INVALID_ARGUMENT, "two chunks in one request: %s", err.msg);
  cr_assert_eq(chunk_into(c, x, n - 8, 16, r->id, 0, 16, NULL, &err), TPORT_OUT_OF_RANGE,
               "bytes past the tensor: %s", err.msg);
  cr_assert_eq(chunk_into(other, x, 0, CHUNK, theirs->id, 0, CHUNK, NULL, &err), TPORT_NOT_FOUND,
               "another connection's transfer: %s", err.msg);
  for (size_t i = 0; i < cap; i++) {
    cr_assert_eq(region[i], 0xee, "byte %zu written by a refused chunk", i);
    cr_assert_eq(((uint8_t *)tport_shm_data(theirs))[i], 0xee, "their byte %zu written", i);
  }
  /* the transfer is whole after all that */
  for (size_t off = 0; off < n; off += CHUNK)
    cr_assert_eq(chunk_into(c, x, off, CHUNK, r->id, off, CHUNK, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(memcmp(region, v, n), 0);
  protobuf_c_message_free_unpacked(&b->base, NULL);
  free(v);
  tport_shm_release(theirs, NULL);
  tport_shm_release(r, NULL);
  tport_close(other);
  tport_close(c);
  stop(s);
}

/* ---------------------------------------------------------------- libtport */

static void count_progress(void *arg, size_t done, size_t total)
{
  size_t *last = arg;
  cr_assert_geq(done, *last, "progress went back");
  cr_assert_leq(done, total);
  *last = done;
}

/* tport_get of large tensors through the automatic region, from cpu and
 * sim:0, at odd sizes, verified or not: one region transfer of one
 * GetChunk a chunk, every byte right, the progress reaching the end.  With
 * the caller's buffer offered too, the cpu's are written there instead
 * (no GetChunk) and the devices' still come through the region. */
Test(shm_chunks, libtport_gets_large_tensors_a_chunk_at_a_time)
{
  char url[96];
  server *s = start(url, sizeof url);
  const size_t sizes[] = {5 * CHUNK + 1, 40 * CHUNK + 12345, (size_t)9 << 20 | 7};
  const char *devices[] = {"cpu", "sim:0", "sim:1"};
  for (int mode = 0; mode < 4; mode++) {
    bool verify = mode & 1, direct = mode & 2;
    tport_client *c = connect_direct(url, verify, direct);
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
      for (int d = 0; d < 3; d++) {
        uint8_t *v;
        tport_tensor_info info = put_bytes(c, devices[d], sizes[i], (unsigned)(i * 3 + d), &v);
        uint8_t *back = malloc(sizes[i]);
        memset(back, 0, sizes[i]);
        size_t last = 0;
        tport_err err;
        client_get_desc g = {.ref = &info.ref,
                             .buf = back,
                             .cap = sizes[i],
                             .progress = count_progress,
                             .progress_arg = &last};
        int64_t chunks0 = svc_server_counter(url, "requests_GetChunk"),
                shm0 = svc_server_counter(url, "shm_transfers"),
                direct0 = svc_server_counter(url, "shm_process_writes");
        cr_assert_eq(client_get(c, &g, NULL, NULL, NULL, &err), 0, "%s", err.msg);
        /* through the region (one transfer there), by GetChunks: one a chunk
         * -- or, from the cpu, written straight into back */
        bool wrote = direct && d == 0;
        cr_assert_eq(svc_server_counter(url, "shm_transfers"), shm0 + 1,
                     "the get did not use the region");
        cr_assert_eq(svc_server_counter(url, "shm_process_writes"), direct0 + wrote,
                     "%s: the get was %swritten straight into the buffer", devices[d],
                     wrote ? "not " : "");
        cr_assert_eq(svc_server_counter(url, "requests_GetChunk"),
                     chunks0 + (wrote ? 0 : (int64_t)((sizes[i] + CHUNK - 1) / CHUNK)),
                     "the get was not a chunk at a time");
        cr_assert_eq(last, sizes[i], "progress stopped at %zu of %zu", last, sizes[i]);
        cr_assert_eq(memcmp(back, v, sizes[i]), 0, "%zu bytes from %s (verify %d)", sizes[i],
                     devices[d], verify);
        void *alloc = NULL;
        size_t got = 0;
        cr_assert_eq(tport_get_alloc(c, &info.ref, &alloc, &got, NULL, &err), 0, "%s", err.msg);
        cr_assert_eq(got, sizes[i]);
        cr_assert_eq(memcmp(alloc, v, sizes[i]), 0);
        free(alloc);
        free(back);
        free(v);
      }
    tport_close(c);
  }
  stop(s);
}

/* A get that fails half way (here: the server's reads past the first
 * chunk fail) had chunk requests in flight that the server may still
 * write into the region after the get returned: libtport never uses that
 * region again, and the next get, through a fresh one, is whole.  Before
 * the fix the next transfer reused it. */
Test(shm_chunks, a_get_that_fails_half_way_never_reuses_its_region)
{
  char url[96];
  server *s = start(url, sizeof url);
  tport_client *c = connect_to(url, false);
  size_t n = 8 * CHUNK;
  uint8_t *v, *back = malloc(n);
  tport_tensor_info info = put_bytes(c, "cpu", n, 11, &v);
  tport_err err;
  cr_assert_eq(tport_get(c, &info.ref, back, n, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert_not_null(c->shm_cache, "the get did not take the automatic region");
  uint64_t first = c->shm_cache->id;
  engine_set_test_faults(ENGINE_FAIL_READ_INTO);
  int rc = tport_get(c, &info.ref, back, n, NULL, NULL, NULL, &err);
  engine_set_test_faults(0);
  cr_assert_eq(rc, TPORT_INTERNAL, "%d %s", rc, err.msg);
  cr_assert(strstr(err.msg, "test fault") != NULL, "%s", err.msg);
  cr_assert(c->shm_cache == NULL || c->shm_cache->id != first,
            "region %llu is still the automatic region after a get into it failed half way",
            (unsigned long long)first);
  memset(back, 0, n);
  cr_assert_eq(tport_get(c, &info.ref, back, n, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(memcmp(back, v, n), 0);
  cr_assert_not_null(c->shm_cache);
  cr_assert_neq(c->shm_cache->id, first, "the next get went through the region that failed");
  free(back);
  free(v);
  tport_close(c);
  stop(s);
}
