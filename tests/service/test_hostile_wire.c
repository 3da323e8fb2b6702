/*
 * test_hostile_wire.c: what a request says.  Extents that overflow (1),
 * the small ones (11: empty chunks, chunk sizes, endless ttls, pointers in
 * messages, whose Stats, trailers, memory formats) and a table of absurd
 * values, each refused by a message that names the field.
 *
 * The hostile-client regression suite.  Each test is one defect of the
 * hostile-client review (its number leads the test's name: d1_... is defect
 * 1, d11c_... item (c) of defect 11) written as the behaviour the server
 * must have: what a client that lies, races, stalls or asks for absurd
 * amounts gets back, and that nothing else changes for anyone.  The suite
 * is three files by concern (test_hostile_wire.c, test_hostile_conn.c,
 * test_hostile_quota.c) over the raw-frame and SP-over-TCP helpers of
 * hostile_util.h, which also says how every wait is bounded.
 */
#include <criterion/criterion.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hostile_util.h"

/* A server that stalls must fail the test, never hang it. */
TestSuite(hostile, .timeout = 120);

/* ================================================================ 1: view extents */

Test(hostile, d1_view_extent_overflow_is_refused)
{
  char url[128];
  server *s = start_default(url, sizeof url);
  tport_client *c = svc_connect(url, NULL);
  uint8_t v[16], back[16];
  fill(v, 16, 1);
  tport_tensor_info a, out;
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, (int64_t[]){16}, NULL, v, 16, NULL, &a, &err), 0, "%s",
               err.msg);
  static const struct {
    const char *what;
    int ndim;
    int64_t sizes[2], strides[2], offset;
    const char *field;
    int code; /* -1: any error */
  } cases[] = {
      {"sizes [2] strides [INT64_MAX]", 1, {2}, {INT64_MAX}, 0, "strides", TPORT_INVALID_ARGUMENT},
      {"sizes [2,2] strides [2^62, 1]", 2, {2, 2}, {INT64_MAX / 2 + 1, 1}, 0, "strides", -1},
      {"sizes [1] storage_offset INT64_MAX", 1, {1}, {1}, INT64_MAX, "storage_offset", -1},
      {"sizes [INT64_MAX] strides [1]", 1, {INT64_MAX}, {1}, 0, "sizes", -1},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int rc = tport_view(c, &a.ref, cases[i].ndim, cases[i].sizes, cases[i].strides, cases[i].offset,
                        NULL, &out, &err);
    cr_expect_neq(rc, 0, "View %s of a 16-byte tensor was accepted: it reaches outside its storage",
                  cases[i].what);
    if (rc == 0) {
      tport_free(c, &out.ref, NULL); /* never read it: that is the defect */
      continue;
    }
    if (cases[i].code >= 0)
      cr_expect_eq(rc, cases[i].code, "View %s: %s (%s), want %s", cases[i].what,
                   tport_strerror(rc), err.msg, tport_strerror(cases[i].code));
    cr_expect(strstr(err.msg, cases[i].field), "View %s: the message does not name %s: '%s'",
              cases[i].what, cases[i].field, err.msg);
  }
  int rc = tport_get(c, &a.ref, back, 16, NULL, NULL, NULL, &err);
  cr_assert_eq(rc, 0, "GetBegin of the original after the refused views: %s (%s)",
               tport_strerror(rc), err.msg);
  cr_assert(memcmp(v, back, 16) == 0, "the original's bytes changed");
  tport_close(c);
  server_stop(s, 1000);
}

Test(hostile, d1_dlpack_shape_overflow_is_an_error_in_the_client)
{
  char url[128];
  server *s = start_default(url, sizeof url);
  tport_client *c = svc_connect(url, NULL);
  uint8_t data[64] = {0};
  static const struct {
    const char *what;
    int64_t shape[2], strides[2];
    bool strided;
  } cases[] = {
      {"shape {2^40, 2^40} (2^80 elements: 0 after a wrap)", {1LL << 40, 1LL << 40}, {0}, false},
      {"shape {3, INT64_MAX/2} (negative after a wrap)", {3, INT64_MAX / 2}, {0}, false},
      {"shape {2^40, 2^40} strides {1, 1}", {1LL << 40, 1LL << 40}, {1, 1}, true},
      /* 2^64 + 2^33 elements: 2^33 after a wrap, which malloc may grant */
      {"shape {2^33, 2^31 + 1} strides {1, 1}", {1LL << 33, (1LL << 31) + 1}, {1, 1}, true},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int64_t shape[2] = {cases[i].shape[0], cases[i].shape[1]};
    int64_t strides[2] = {cases[i].strides[0], cases[i].strides[1]};
    DLTensor t = {.data = data,
                  .device = {kDLCPU, 0},
                  .ndim = 2,
                  .dtype = {kDLUInt, 8, 1},
                  .shape = shape,
                  .strides = cases[i].strided ? strides : NULL};
    tport_err err;
    int rc = tport_put_dlpack(c, &t, NULL, NULL, &err);
    cr_expect_neq(rc, 0, "tport_put_dlpack of %s succeeded", cases[i].what);
  }
  round_trip(c, 1000, 7, "after the DLPack puts");
  tport_close(c);
  server_stop(s, 1000);
}

/* ================================================================ 11: small ones */

Test(hostile, d11a_a_zero_element_tensor_takes_its_empty_chunk)
{
  char url[128];
  server *s = start_default(url, sizeof url);
  rawc r;
  raw_open(&r, url);
  uint8_t h[16];
  char msg[256];
  int code = raw_put_begin(&r, 0, NULL, NULL, h, msg);
  cr_assert_eq(code, 0, "PutBegin of 0 bytes: %s", msg);
  code = raw_chunk(&r, h, 0, NULL, 0, msg);
  cr_assert_eq(code, 0, "a zero-length PutChunk at offset 0 of a zero-element tensor: %s (%s)",
               tport_strerror(code), msg);
  code = raw_commit(&r, h, msg, NULL);
  cr_assert_eq(code, 0, "PutCommit after the empty chunk: %s (%s)", tport_strerror(code), msg);
  Tport__Ref ref = mkref(h, 16, NULL);
  Tport__InfoRequest q = TPORT__INFO_REQUEST__INIT;
  q.ref = &ref;
  ProtobufCMessage *out;
  code = raw_call(&r, TPORT__METHOD__METHOD_INFO, &q.base, NULL, 0, &tport__info_reply__descriptor,
                  msg, &out, NULL);
  cr_assert_eq(code, 0, "Info of the committed empty tensor: %s (%s)", tport_strerror(code), msg);
  Tport__InfoReply *ir = (Tport__InfoReply *)out;
  cr_assert(ir->info && ir->info->desc && ir->info->desc->n_sizes == 1 &&
                ir->info->desc->sizes[0] == 0 && ir->info->nbytes == 0,
            "Info does not show a tensor of sizes [0]");
  protobuf_c_message_free_unpacked(out, NULL);
  raw_close(&r);
  server_stop(s, 1000);
}

Test(hostile, d11b_chunk_sizes_that_cannot_work_are_refused_at_start)
{
  server_config cfg;
  config(&cfg);
  size_t bad[2] = {0, cfg.max_message_bytes - CONFIG_MESSAGE_ROOM + 1};
  cfg.listen[0] = strdup("inproc://hostile-never");
  cfg.nlisten = 1;
  for (int i = 0; i < 2; i++) {
    cfg.chunk_bytes = bad[i];
    server *s = NULL;
    tport_err err = {0};
    int rc = server_start(&cfg, &s, &err);
    if (rc == 0)
      server_stop(s, 0);
    cr_expect_neq(rc, 0, "server_start with chunk_bytes %zu (max_message_bytes %zu) succeeded",
                  bad[i], cfg.max_message_bytes);
    cr_expect(rc == 0 || strstr(err.msg, "--chunk"),
              "server_start with chunk_bytes %zu: the message does not name --chunk: '%s'", bad[i],
              err.msg);
  }
  config_free(&cfg);
}

Test(hostile, d11c_an_endless_ttl_is_refused)
{
  char url[128];
  server *s = start_default(url, sizeof url);
  rawc r;
  raw_open(&r, url);
  char msg[256];
  uint8_t v[16] = {1}, h[16];
  raw_put(&r, v, 16, NULL, NULL, h);
  Tport__Ref ref = mkref(h, 16, NULL);
  /* PutBegin, committed at once */
  Tport__TensorDesc d = TPORT__TENSOR_DESC__INIT;
  int64_t sz[1] = {16};
  d.dtype = TPORT__DTYPE__DTYPE_UINT8;
  d.n_sizes = 1;
  d.sizes = sz;
  Tport__PutBeginRequest pq = TPORT__PUT_BEGIN_REQUEST__INIT;
  pq.desc = &d;
  pq.memory_format = TPORT__MEMORY_FORMAT__MF_PRESERVE;
  pq.name = "ttl-put";
  pq.ttl_ms = UINT64_MAX;
  pq.commit = true;
  int code = raw_call(&r, TPORT__METHOD__METHOD_PUT_BEGIN, &pq.base, v, 16,
                      &tport__put_begin_reply__descriptor, msg, NULL, NULL);
  cr_expect_eq(code, TPORT_INVALID_ARGUMENT, "PutBegin name 'ttl-put' ttl_ms UINT64_MAX: %s (%s)",
               tport_strerror(code), msg);
  cr_expect(code == 0 || strstr(msg, "ttl"), "PutBegin: the message does not mention ttl: '%s'",
            msg);
  Tport__ToRequest tq = TPORT__TO_REQUEST__INIT;
  tq.ref = &ref;
  tq.name = "ttl-to";
  tq.ttl_ms = UINT64_MAX;
  code = raw_call(&r, TPORT__METHOD__METHOD_TO, &tq.base, NULL, 0, &tport__to_reply__descriptor,
                  msg, NULL, NULL);
  cr_expect_eq(code, TPORT_INVALID_ARGUMENT, "To name 'ttl-to' ttl_ms UINT64_MAX: %s (%s)",
               tport_strerror(code), msg);
  cr_expect(code == 0 || strstr(msg, "ttl"), "To: the message does not mention ttl: '%s'", msg);
  Tport__ViewRequest vq = TPORT__VIEW_REQUEST__INIT;
  int64_t vs[1] = {4}, vst[1] = {1};
  vq.ref = &ref;
  vq.n_sizes = vq.n_strides = 1;
  vq.sizes = vs;
  vq.strides = vst;
  vq.name = "ttl-view";
  vq.ttl_ms = UINT64_MAX;
  code = raw_call(&r, TPORT__METHOD__METHOD_VIEW, &vq.base, NULL, 0, &tport__view_reply__descriptor,
                  msg, NULL, NULL);
  cr_expect_eq(code, TPORT_INVALID_ARGUMENT, "View name 'ttl-view' ttl_ms UINT64_MAX: %s (%s)",
               tport_strerror(code), msg);
  cr_expect(code == 0 || strstr(msg, "ttl"), "View: the message does not mention ttl: '%s'", msg);
  raw_close(&r);
  server_stop(s, 1000);
}

/* The error messages of many refusals, to look for pointers in. */
static int collect(char (*msgs)[256], int n, int rc, const tport_err *err)
{
  cr_expect_neq(rc, 0, "case %d was expected to fail and did not", n);
  snprintf(msgs[n], 256, "%s", err->msg);
  return n + 1;
}

Test(hostile, d11d_error_messages_carry_no_pointers)
{
  char url[128];
  server *s = start_default(url, sizeof url);
  tport_client *c = svc_connect(url, NULL);
  tport_err err;
  char msgs[40][256];
  int n = 0;
  float f[4] = {1, 2, 3, 4};
  tport_put_options p0, p1;
  tport_put_options_init(&p0);
  tport_put_options_init(&p1);
  p0.device = "sim:0";
  p1.device = "sim:1";
  tport_tensor_info a0, b1, h, ov;
  cr_assert_eq(tport_put(c, TPORT_FLOAT32, 1, (int64_t[]){3}, NULL, f, 12, &p0, &a0, &err), 0,
               "put on sim:0: %s", err.msg);
  cr_assert_eq(tport_put(c, TPORT_FLOAT32, 1, (int64_t[]){4}, NULL, f, 16, &p1, &b1, &err), 0,
               "put on sim:1: %s", err.msg);
  cr_assert_eq(tport_put(c, TPORT_FLOAT32, 1, (int64_t[]){4}, NULL, f, 16, NULL, &h, &err), 0,
               "put on cpu: %s", err.msg);
  /* copy_ between sim devices with shapes that do not broadcast, both ways */
  n = collect(msgs, n, tport_copy(c, &b1.ref, &a0.ref, false, &err), &err);
  n = collect(msgs, n, tport_copy(c, &a0.ref, &b1.ref, true, &err), &err);
  n = collect(msgs, n, tport_copy(c, &a0.ref, &h.ref, false, &err), &err);
  /* into an overlapping view on a device */
  cr_assert_eq(tport_view(c, &b1.ref, 1, (int64_t[]){4}, (int64_t[]){0}, 0, NULL, &ov, &err), 0,
               "%s", err.msg);
  n = collect(msgs, n, tport_copy(c, &ov.ref, &a0.ref, false, &err), &err);
  n = collect(msgs, n, tport_copy(c, &ov.ref, &h.ref, false, &err), &err);
  /* views out of their storage, on the host and on devices */
  n = collect(msgs, n,
              tport_view(c, &a0.ref, 1, (int64_t[]){4}, (int64_t[]){1}, 0, NULL, NULL, &err), &err);
  n = collect(msgs, n,
              tport_view(c, &b1.ref, 2, (int64_t[]){2, 2}, (int64_t[]){2, 1}, 1, NULL, NULL, &err),
              &err);
  n = collect(msgs, n,
              tport_view(c, &h.ref, 1, (int64_t[]){5}, (int64_t[]){1}, 0, NULL, NULL, &err), &err);
  /* a view whose extent wraps (defect 1): where a server still takes it,
   * reading it and copying it between devices must fail without pointers */
  tport_tensor_info u0, wv;
  uint8_t bytes[12] = {1, 2, 3};
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, (int64_t[]){12}, NULL, bytes, 12, &p0, &u0, &err), 0,
               "put uint8 on sim:0: %s", err.msg);
  int rc = tport_view(c, &u0.ref, 1, (int64_t[]){2}, (int64_t[]){INT64_MAX}, 0, NULL, &wv, &err);
  if (rc == 0) {
    uint8_t back[2];
    n = collect(msgs, n, tport_get(c, &wv.ref, back, sizeof back, NULL, NULL, NULL, &err), &err);
    tport_tensor_info b2;
    cr_assert_eq(tport_put(c, TPORT_UINT8, 1, (int64_t[]){2}, NULL, bytes, 2, &p1, &b2, &err), 0,
                 "put uint8 on sim:1: %s", err.msg);
    n = collect(msgs, n, tport_copy(c, &b2.ref, &wv.ref, false, &err), &err);
    tport_to_options mv = {.device = "sim:1"};
    n = collect(msgs, n, tport_to(c, &wv.ref, &mv, NULL, NULL, &err), &err);
  } else {
    n = collect(msgs, n, rc, &err);
  }
  tport_to_options o = {.device = "sim:7"};
  n = collect(msgs, n, tport_to(c, &a0.ref, &o, NULL, NULL, &err), &err);
  o = (tport_to_options){.has_dtype = true, .dtype = (tport_dtype)77};
  n = collect(msgs, n, tport_to(c, &b1.ref, &o, NULL, NULL, &err), &err);
  tport_ref nobody;
  memset(&nobody, 0, sizeof nobody);
  memset(nobody.handle, 0xab, 16);
  tport_tensor_info info;
  n = collect(msgs, n, tport_info(c, &nobody, &info, &err), &err);
  regex_t re;
  cr_assert_eq(regcomp(&re, "0x[0-9a-f]{6,}", REG_EXTENDED | REG_ICASE | REG_NOSUB), 0);
  for (int i = 0; i < n; i++) {
    cr_log_info("error message %d: %s", i, msgs[i]);
    cr_expect_neq(regexec(&re, msgs[i], 0, NULL, 0), 0, "error message %d carries a pointer: '%s'",
                  i, msgs[i]);
  }
  regfree(&re);
  tport_close(c);
  server_stop(s, 1000);
}

static bool has(const tport_counter *v, size_t n, const char *name, bool prefix)
{
  for (size_t i = 0; i < n; i++)
    if (prefix ? strncmp(v[i].name, name, strlen(name)) == 0 : strcmp(v[i].name, name) == 0)
      return true;
  return false;
}

Test(hostile, d11e_a_tenant_sees_its_own_stats_only)
{
  char url[128];
  server *s = start_default(url, sizeof url);
  tport_client *u = svc_connect(url, "someone"), *op = svc_connect(url, OPERATOR);
  round_trip(u, 1000, 13, "before Stats");
  tport_counter *v;
  size_t n;
  tport_err err;
  cr_assert_eq(tport_stats(u, &v, &n, &err), 0, "Stats as a tenant: %s", err.msg);
  static const char *server_wide[] = {"bytes_in", "requests_", "staging_"};
  for (int i = 0; i < 3; i++)
    cr_expect_not(has(v, n, server_wide[i], i > 0),
                  "a tenant's Stats has the server-wide counter%s %s", i ? "s" : "",
                  server_wide[i]);
  static const char *own[] = {"tensors", "tensor_bytes", "quota_bytes"};
  for (int i = 0; i < 3; i++)
    cr_expect(has(v, n, own[i], false), "a tenant's Stats lacks %s", own[i]);
  free(v);
  cr_assert_eq(tport_stats(op, &v, &n, &err), 0, "Stats as the operator: %s", err.msg);
  static const char *all[] = {"bytes_in", "requests_", "staging_", "tensors", "tensor_bytes"};
  for (int i = 0; i < 5; i++)
    cr_expect(has(v, n, all[i], i == 1 || i == 2), "the operator's Stats lacks %s%s", all[i],
              i == 1 || i == 2 ? "*" : "");
  free(v);
  tport_close(u);
  tport_close(op);
  server_stop(s, 1000);
}

Test(hostile, d11f_trailers_only_where_a_method_takes_them)
{
  char url[128];
  server *s = start_default(url, sizeof url);
  rawc r;
  raw_open(&r, url);
  const char trailer[3] = {'x', 'y', 'z'};
  uint8_t v[16] = {3}, h[16], h2[16], hb[16], tid[16];
  fill(v, 16, 14);
  raw_put(&r, v, 16, NULL, NULL, h);
  raw_put(&r, v, 16, NULL, NULL, h2);
  const size_t n = 4 * CHUNK;
  uint8_t *data = malloc(n);
  fill(data, n, 15);
  raw_put(&r, data, n, NULL, NULL, hb);
  Tport__Ref ref = mkref(h, 16, NULL), ref2 = mkref(h2, 16, NULL), refb = mkref(hb, 16, NULL);
  char msg[256];
  cr_assert_eq(raw_get_begin(&r, &refb, 0, msg, tid), 0, "GetBegin: %s", msg);
  uint8_t hu[16];
  cr_assert_eq(raw_put_begin(&r, 16, NULL, NULL, hu, msg), 0, "%s", msg);
  cr_assert_eq(raw_chunk(&r, hu, 0, v, 16, msg), 0, "%s", msg);
  Tport__Ref refu = mkref(hu, 16, NULL);

  Tport__InfoRequest info = TPORT__INFO_REQUEST__INIT;
  info.ref = &ref;
  Tport__ListRequest list = TPORT__LIST_REQUEST__INIT;
  Tport__FreeRequest fr = TPORT__FREE_REQUEST__INIT;
  fr.ref = &ref2;
  Tport__ToRequest to = TPORT__TO_REQUEST__INIT;
  to.ref = &ref;
  to.device = "cpu";
  Tport__ViewRequest view = TPORT__VIEW_REQUEST__INIT;
  int64_t vs[1] = {4}, vst[1] = {1};
  view.ref = &ref;
  view.n_sizes = view.n_strides = 1;
  view.sizes = vs;
  view.strides = vst;
  Tport__CopyRequest copy = TPORT__COPY_REQUEST__INIT;
  copy.dst = &ref;
  copy.src = &ref2;
  Tport__HelloRequest hello = TPORT__HELLO_REQUEST__INIT;
  hello.protocol_version = 1;
  hello.tenant = "default";
  Tport__StatsRequest stats = TPORT__STATS_REQUEST__INIT;
  Tport__GetBeginRequest gb;
  get_begin_req(&gb, &ref, 1 << 20);
  Tport__GetChunkRequest gc = TPORT__GET_CHUNK_REQUEST__INIT;
  gc.transfer.data = tid;
  gc.transfer.len = 16;
  gc.length = CHUNK;
  Tport__PutCommitRequest pc = TPORT__PUT_COMMIT_REQUEST__INIT;
  pc.ref = &refu;
  static const uint16_t methods[] = {
      TPORT__METHOD__METHOD_INFO,      TPORT__METHOD__METHOD_LIST,
      TPORT__METHOD__METHOD_FREE,      TPORT__METHOD__METHOD_TO,
      TPORT__METHOD__METHOD_VIEW,      TPORT__METHOD__METHOD_COPY,
      TPORT__METHOD__METHOD_HELLO,     TPORT__METHOD__METHOD_STATS,
      TPORT__METHOD__METHOD_GET_BEGIN, TPORT__METHOD__METHOD_GET_CHUNK,
      TPORT__METHOD__METHOD_PUT_COMMIT};
  const ProtobufCMessage *reqs[] = {&info.base, &list.base, &fr.base,    &to.base,
                                    &view.base, &copy.base, &hello.base, &stats.base,
                                    &gb.base,   &gc.base,   &pc.base};
  for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
    int code = raw_call(&r, methods[i], reqs[i], trailer, sizeof trailer, NULL, msg, NULL, NULL);
    cr_expect_eq(code, TPORT_INVALID_ARGUMENT, "%s with a 3-byte payload after it: %s (%s)",
                 method_name(methods[i]), tport_strerror(code), msg);
    cr_expect(code == 0 || strstr(msg, "payload"), "%s: the message does not mention payload: '%s'",
              method_name(methods[i]), msg);
  }
  /* nothing happened: the tensor Free was sent is there, the upload commits */
  Tport__InfoRequest i2 = TPORT__INFO_REQUEST__INIT;
  i2.ref = &ref2;
  int code = raw_call(&r, TPORT__METHOD__METHOD_INFO, &i2.base, NULL, 0, NULL, msg, NULL, NULL);
  cr_expect_eq(code, 0, "Info of the tensor a refused Free named: %s (%s)", tport_strerror(code),
               msg);
  code = raw_commit(&r, hu, msg, NULL);
  cr_expect_eq(code, 0, "PutCommit without a payload after the refused one: %s (%s)",
               tport_strerror(code), msg);
  raw_close(&r);
  free(data);
  server_stop(s, 1000);
}

Test(hostile, d11g_a_memory_format_the_rank_cannot_have_is_refused_at_begin)
{
  char url[128];
  server *s = start_default(url, sizeof url);
  rawc r;
  raw_open(&r, url);
  Tport__TensorDesc d = TPORT__TENSOR_DESC__INIT;
  int64_t sz[2] = {2, 3};
  d.dtype = TPORT__DTYPE__DTYPE_FLOAT32;
  d.n_sizes = 2;
  d.sizes = sz;
  Tport__PutBeginRequest q = TPORT__PUT_BEGIN_REQUEST__INIT;
  q.desc = &d;
  q.memory_format = TPORT__MEMORY_FORMAT__MF_CHANNELS_LAST;
  char msg[256];
  int code = raw_call(&r, TPORT__METHOD__METHOD_PUT_BEGIN, &q.base, NULL, 0,
                      &tport__put_begin_reply__descriptor, msg, NULL, NULL);
  cr_expect_eq(code, TPORT_INVALID_ARGUMENT,
               "PutBegin of a rank-2 tensor as channels_last: %s (%s), want INVALID_ARGUMENT",
               tport_strerror(code), msg);
  cr_expect(code == 0 || strstr(msg, "memory_format"),
            "the message does not mention memory_format: '%s'", msg);
  q.memory_format = TPORT__MEMORY_FORMAT__MF_CHANNELS_LAST_3D;
  code = raw_call(&r, TPORT__METHOD__METHOD_PUT_BEGIN, &q.base, NULL, 0,
                  &tport__put_begin_reply__descriptor, msg, NULL, NULL);
  cr_expect_eq(code, TPORT_INVALID_ARGUMENT,
               "PutBegin of a rank-2 tensor as channels_last_3d: %s (%s), want INVALID_ARGUMENT",
               tport_strerror(code), msg);
  raw_close(&r);
  server_stop(s, 1000);
}

/* ================================================================ absurd values */

/* One row: the request was refused (with `code` unless it is -1) by a
 * message naming one of the fields (a |-separated list). */
static void refused(const char *what, int got, const char *msg, int code, const char *fields)
{
  cr_log_info("%s: %s (%s)", what, tport_strerror(got), msg);
  cr_expect_neq(got, 0, "%s was accepted", what);
  if (got == 0)
    return;
  if (code >= 0)
    cr_expect_eq(got, code, "%s: %s (%s), want %s", what, tport_strerror(got), msg,
                 tport_strerror(code));
  cr_expect_neq(got, TPORT_INTERNAL, "%s: INTERNAL (%s): a client's error, not the server's", what,
                msg);
  char list[128];
  snprintf(list, sizeof list, "%s", fields);
  bool named = false;
  char *save = NULL;
  for (char *f = strtok_r(list, "|", &save); f && !named; f = strtok_r(NULL, "|", &save))
    named = strstr(msg, f) != NULL;
  cr_expect(named, "%s: the message does not name %s: '%s'", what, fields, msg);
}

/* PutBegin of a descriptor, with optional device and memory format. */
static int put_desc(rawc *r, int dtype, size_t ndim, const int64_t *sizes, size_t nstrides,
                    const int64_t *strides, int64_t offset, const char *device, int mf, char *msg)
{
  Tport__TensorDesc d = TPORT__TENSOR_DESC__INIT;
  d.dtype = (Tport__DType)dtype;
  d.n_sizes = ndim;
  d.sizes = (int64_t *)sizes;
  d.n_strides = nstrides;
  d.strides = (int64_t *)strides;
  d.storage_offset = offset;
  Tport__PutBeginRequest q = TPORT__PUT_BEGIN_REQUEST__INIT;
  q.desc = &d;
  q.device = (char *)(device ? device : "");
  q.memory_format = (Tport__MemoryFormat)mf;
  return raw_call(r, TPORT__METHOD__METHOD_PUT_BEGIN, &q.base, NULL, 0,
                  &tport__put_begin_reply__descriptor, msg, NULL, NULL);
}

static int view_of(rawc *r, const Tport__Ref *ref, size_t ndim, const int64_t *sizes,
                   const int64_t *strides, int64_t offset, char *msg)
{
  Tport__ViewRequest q = TPORT__VIEW_REQUEST__INIT;
  q.ref = (Tport__Ref *)ref;
  q.n_sizes = q.n_strides = ndim;
  q.sizes = (int64_t *)sizes;
  q.strides = (int64_t *)strides;
  q.storage_offset = offset;
  return raw_call(r, TPORT__METHOD__METHOD_VIEW, &q.base, NULL, 0, &tport__view_reply__descriptor,
                  msg, NULL, NULL);
}

static int info_of(rawc *r, const Tport__Ref *ref, char *msg)
{
  Tport__InfoRequest q = TPORT__INFO_REQUEST__INIT;
  q.ref = (Tport__Ref *)ref;
  return raw_call(r, TPORT__METHOD__METHOD_INFO, &q.base, NULL, 0, &tport__info_reply__descriptor,
                  msg, NULL, NULL);
}

/* The same request with ref a and with ref b: both NOT_FOUND, and alike. */
static void same_not_found(rawc *r, uint16_t method, const char *what, Tport__Ref *slot,
                           const Tport__Ref *a, const Tport__Ref *b, const ProtobufCMessage *q)
{
  char ma[256], mb[256];
  *slot = *a;
  int ca = raw_call(r, method, q, NULL, 0, NULL, ma, NULL, NULL);
  *slot = *b;
  int cb = raw_call(r, method, q, NULL, 0, NULL, mb, NULL, NULL);
  cr_expect_eq(ca, TPORT_NOT_FOUND, "%s of another tenant's handle: %s (%s), want NOT_FOUND", what,
               tport_strerror(ca), ma);
  cr_expect_eq(cb, TPORT_NOT_FOUND, "%s of an unknown handle: %s (%s)", what, tport_strerror(cb),
               mb);
  cr_expect_str_eq(ma, mb,
                   "%s: another tenant's handle ('%s') is told apart from an unknown one "
                   "('%s')",
                   what, ma, mb);
}

Test(hostile, absurd_values_are_refused_by_name)
{
  char url[128];
  server_config cfg;
  config(&cfg);
  cfg.tenant_quota_bytes = 4 << 20;
  server *s = start(&cfg, url, sizeof url);
  rawc r;
  raw_open(&r, url);
  char msg[256], what[160];
  const int U8 = TPORT__DTYPE__DTYPE_UINT8, PRESERVE = TPORT__MEMORY_FORMAT__MF_PRESERVE;

  /* descriptors, through PutBegin and through View */
  static int64_t ones[1000];
  for (int i = 0; i < 1000; i++)
    ones[i] = 1;
  uint8_t v16[16], hv[16];
  fill(v16, 16, 16);
  raw_put(&r, v16, 16, NULL, NULL, hv);
  Tport__Ref vref = mkref(hv, 16, NULL);
  static const size_t ranks[] = {17, 1000};
  for (int i = 0; i < 2; i++) {
    snprintf(what, sizeof what, "PutBegin of rank %zu", ranks[i]);
    refused(what, put_desc(&r, U8, ranks[i], ones, 0, NULL, 0, NULL, PRESERVE, msg), msg,
            TPORT_INVALID_ARGUMENT, "sizes|rank|dims");
    snprintf(what, sizeof what, "View of rank %zu", ranks[i]);
    refused(what, view_of(&r, &vref, ranks[i], ones, ones, 0, msg), msg, TPORT_INVALID_ARGUMENT,
            "sizes|rank|dims");
  }
  static const int64_t absurd[2] = {-1, INT64_MAX};
  for (int i = 0; i < 2; i++) {
    int64_t x[1] = {absurd[i]}, two[1] = {2}, one[1] = {1};
    snprintf(what, sizeof what, "PutBegin sizes [%lld]", (long long)x[0]);
    refused(what, put_desc(&r, U8, 1, x, 0, NULL, 0, NULL, PRESERVE, msg), msg, -1, "sizes");
    snprintf(what, sizeof what, "View sizes [%lld]", (long long)x[0]);
    refused(what, view_of(&r, &vref, 1, x, one, 0, msg), msg, -1, "sizes");
    snprintf(what, sizeof what, "PutBegin sizes [2] strides [%lld]", (long long)x[0]);
    refused(what, put_desc(&r, U8, 1, two, 1, x, 0, NULL, PRESERVE, msg), msg, -1, "strides");
    snprintf(what, sizeof what, "View sizes [2] strides [%lld]", (long long)x[0]);
    refused(what, view_of(&r, &vref, 1, two, x, 0, msg), msg, -1, "strides");
    snprintf(what, sizeof what, "PutBegin storage_offset %lld", (long long)x[0]);
    refused(what, put_desc(&r, U8, 1, two, 0, NULL, x[0], NULL, PRESERVE, msg), msg, -1,
            "storage_offset");
    snprintf(what, sizeof what, "View storage_offset %lld", (long long)x[0]);
    refused(what, view_of(&r, &vref, 1, one, one, x[0], msg), msg, -1, "storage_offset");
  }
  static const int dtypes[2] = {99, -5};
  int64_t four[1] = {4};
  for (int i = 0; i < 2; i++) {
    snprintf(what, sizeof what, "PutBegin dtype %d", dtypes[i]);
    refused(what, put_desc(&r, dtypes[i], 1, four, 0, NULL, 0, NULL, PRESERVE, msg), msg,
            TPORT_INVALID_ARGUMENT, "dtype");
  }
  refused("PutBegin memory_format 42", put_desc(&r, U8, 1, four, 0, NULL, 0, NULL, 42, msg), msg,
          TPORT_INVALID_ARGUMENT, "memory_format");
  Tport__ToRequest tq = TPORT__TO_REQUEST__INIT;
  tq.ref = &vref;
  tq.memory_format_set = true;
  tq.memory_format = (Tport__MemoryFormat)42;
  refused("To memory_format 42",
          raw_call(&r, TPORT__METHOD__METHOD_TO, &tq.base, NULL, 0, NULL, msg, NULL, NULL), msg,
          TPORT_INVALID_ARGUMENT, "memory_format");

  /* device strings */
  char long_dev[301];
  memset(long_dev, 'a', 300);
  long_dev[300] = 0;
  const char *devices[] = {"sim:99", "cuda:-1", "cpu:1x", long_dev, "sim:2147483648"};
  for (size_t i = 0; i < sizeof devices / sizeof devices[0]; i++) {
    snprintf(what, sizeof what, "PutBegin device '%.40s%s'", devices[i],
             strlen(devices[i]) > 40 ? "...' (300 bytes" : "");
    refused(what, put_desc(&r, U8, 1, four, 0, NULL, 0, devices[i], PRESERVE, msg), msg, -1,
            "device|sim:|cuda:|cpu:");
    snprintf(what, sizeof what, "To device '%.40s%s'", devices[i],
             strlen(devices[i]) > 40 ? "...' (300 bytes" : "");
    Tport__ToRequest dq = TPORT__TO_REQUEST__INIT;
    dq.ref = &vref;
    dq.device = (char *)devices[i];
    refused(what, raw_call(&r, TPORT__METHOD__METHOD_TO, &dq.base, NULL, 0, NULL, msg, NULL, NULL),
            msg, -1, "device|sim:|cuda:|cpu:");
  }
  /* "": the documented default (cpu) where a device is optional */
  int code = put_desc(&r, U8, 1, four, 0, NULL, 0, "", PRESERVE, msg);
  cr_expect(code == 0 || strstr(msg, "device"), "PutBegin device '': %s (%s)", tport_strerror(code),
            msg);

  /* chunks of an upload of 200 KiB (4 chunks, the last of 8 KiB) */
  const size_t un = 200 << 10;
  uint8_t *data = malloc(un), hu[16];
  fill(data, un, 17);
  cr_assert_eq(raw_put_begin(&r, un, NULL, NULL, hu, msg), 0, "%s", msg);
  refused("PutChunk at an offset past the end", raw_chunk(&r, hu, 300 << 10, data, 1, msg), msg, -1,
          "offset");
  refused("PutChunk at an offset that is not a multiple of the chunk size",
          raw_chunk(&r, hu, 1000, data, CHUNK, msg), msg, -1, "offset");
  refused("PutChunk at offset UINT64_MAX", raw_chunk(&r, hu, UINT64_MAX, data, 1, msg), msg, -1,
          "offset");
  refused("PutChunk at offset 2^64 - chunk",
          raw_chunk(&r, hu, 0 - (uint64_t)CHUNK, data, CHUNK, msg), msg, -1, "offset");
  refused("a short PutChunk (100 of 65536 bytes)", raw_chunk(&r, hu, 0, data, 100, msg), msg,
          TPORT_INVALID_ARGUMENT, "bytes|length|payload");
  refused("a long PutChunk (65537 bytes)", raw_chunk(&r, hu, 0, data, CHUNK + 1, msg), msg, -1,
          "bytes|length|payload");
  refused("a long last PutChunk (8 KiB + 1 at 192 KiB)",
          raw_chunk(&r, hu, 3 * CHUNK, data, (8 << 10) + 1, msg), msg, -1, "bytes|length|payload");

  /* gets: a transfer of 256 KiB, asked for bytes that are not there */
  const size_t gn = 4 * CHUNK;
  uint8_t *gdata = malloc(gn), hg[16], tid[16];
  fill(gdata, gn, 18);
  raw_put(&r, gdata, gn, NULL, NULL, hg);
  Tport__Ref gref = mkref(hg, 16, NULL);
  cr_assert_eq(raw_get_begin(&r, &gref, 0, msg, tid), 0, "%s", msg);
  refused("GetChunk offset UINT64_MAX", raw_get_chunk(&r, tid, 16, UINT64_MAX, 1, NULL, 0, msg),
          msg, -1, "offset");
  refused("GetChunk length UINT64_MAX", raw_get_chunk(&r, tid, 16, 0, UINT64_MAX, NULL, 0, msg),
          msg, -1, "length");
  refused("GetChunk offset 100 length 2^64 - 50 (the end wraps)",
          raw_get_chunk(&r, tid, 16, 100, UINT64_MAX - 49, NULL, 0, msg), msg, -1, "offset|length");
  refused("GetChunk offset 2^64 - 10 length 20 (the end wraps)",
          raw_get_chunk(&r, tid, 16, UINT64_MAX - 9, 20, NULL, 0, msg), msg, -1, "offset|length");
  uint8_t ids[17] = {0};
  static const size_t id_lens[] = {0, 15, 17};
  for (int i = 0; i < 3; i++) {
    snprintf(what, sizeof what, "GetChunk of a %zu-byte transfer id", id_lens[i]);
    refused(what, raw_get_chunk(&r, ids, id_lens[i], 0, 1, NULL, 0, msg), msg,
            TPORT_INVALID_ARGUMENT, "transfer");
  }
  uint8_t unknown[16];
  fill(unknown, 16, (unsigned)getpid());
  refused("GetChunk of an unknown transfer id", raw_get_chunk(&r, unknown, 16, 0, 1, NULL, 0, msg),
          msg, TPORT_NOT_FOUND, "transfer");
  code = raw_get_chunk(&r, tid, 16, 0, CHUNK, NULL, 0, msg);
  cr_expect_eq(code, 0, "the transfer serves its bytes after the refusals: %s (%s)",
               tport_strerror(code), msg);

  /* handles and names */
  static const size_t h_lens[] = {0, 15, 17};
  for (int i = 0; i < 3; i++) {
    Tport__Ref bad = mkref(ids, h_lens[i], NULL);
    snprintf(what, sizeof what, "Info of a %zu-byte handle", h_lens[i]);
    refused(what, info_of(&r, &bad, msg), msg, TPORT_INVALID_ARGUMENT, "handle|ref");
  }
  /* the registry keeps its handle table with an entry of the all-zero
   * handle (registry.handle_keep): never found, never freed */
  uint8_t zero[16] = {0};
  Tport__Ref zref = mkref(zero, 16, NULL);
  refused("Info of the all-zero handle", info_of(&r, &zref, msg), msg, TPORT_NOT_FOUND, "handle");
  refused("GetBegin of the all-zero handle", raw_get_begin(&r, &zref, 0, msg, NULL), msg,
          TPORT_NOT_FOUND, "handle");
  Tport__FreeRequest zq = TPORT__FREE_REQUEST__INIT;
  zq.ref = &zref;
  for (int i = 0; i < 2; i++)
    refused("Free of the all-zero handle",
            raw_call(&r, TPORT__METHOD__METHOD_FREE, &zq.base, NULL, 0, NULL, msg, NULL, NULL),
            msg, TPORT_NOT_FOUND, "handle");
  char long_name[201];
  memset(long_name, 'n', 200);
  long_name[200] = 0;
  Tport__Ref named = mkref(NULL, 0, long_name);
  refused("Info of a 200-byte name", info_of(&r, &named, msg), msg, -1, "name");
  Tport__PutBeginRequest nq = TPORT__PUT_BEGIN_REQUEST__INIT;
  Tport__TensorDesc nd = TPORT__TENSOR_DESC__INIT;
  nd.dtype = TPORT__DTYPE__DTYPE_UINT8;
  nd.n_sizes = 1;
  nd.sizes = four;
  nq.desc = &nd;
  nq.memory_format = TPORT__MEMORY_FORMAT__MF_PRESERVE;
  nq.name = long_name;
  refused("PutBegin with a 200-byte name",
          raw_call(&r, TPORT__METHOD__METHOD_PUT_BEGIN, &nq.base, NULL, 0, NULL, msg, NULL, NULL),
          msg, TPORT_INVALID_ARGUMENT, "name");
  nq.commit = true; /* the whole tensor in the request: refused before it is copied */
  refused("PutBegin with commit and a 200-byte name",
          raw_call(&r, TPORT__METHOD__METHOD_PUT_BEGIN, &nq.base, v16, 4, NULL, msg, NULL, NULL),
          msg, TPORT_INVALID_ARGUMENT, "name");
  nq.name = "ttl";
  nq.ttl_ms = UINT64_MAX;
  refused("PutBegin with commit and ttl_ms UINT64_MAX",
          raw_call(&r, TPORT__METHOD__METHOD_PUT_BEGIN, &nq.base, v16, 4, NULL, msg, NULL, NULL),
          msg, TPORT_INVALID_ARGUMENT, "ttl");
  Tport__Ref empty = mkref(NULL, 0, "");
  refused("Info of a ref with a 0-byte name and no handle", info_of(&r, &empty, msg), msg,
          TPORT_INVALID_ARGUMENT, "name|ref|handle");

  /* another tenant's handle is exactly an unknown one */
  tport_client *alice = svc_connect(url, "alice");
  tport_tensor_info at;
  tport_err err;
  cr_assert_eq(tport_put(alice, TPORT_UINT8, 1, (int64_t[]){16}, NULL, v16, 16, NULL, &at, &err), 0,
               "%s", err.msg);
  Tport__Ref theirs = mkref(at.ref.handle, 16, NULL), nobody = mkref(unknown, 16, NULL), slot;
  Tport__InfoRequest iq = TPORT__INFO_REQUEST__INIT;
  iq.ref = &slot;
  same_not_found(&r, TPORT__METHOD__METHOD_INFO, "Info", &slot, &theirs, &nobody, &iq.base);
  Tport__GetBeginRequest gq;
  get_begin_req(&gq, &slot, 1 << 20);
  same_not_found(&r, TPORT__METHOD__METHOD_GET_BEGIN, "GetBegin", &slot, &theirs, &nobody,
                 &gq.base);
  Tport__ViewRequest vq = TPORT__VIEW_REQUEST__INIT;
  int64_t one[1] = {1};
  vq.ref = &slot;
  vq.n_sizes = vq.n_strides = 1;
  vq.sizes = one;
  vq.strides = one;
  same_not_found(&r, TPORT__METHOD__METHOD_VIEW, "View", &slot, &theirs, &nobody, &vq.base);
  Tport__ToRequest toq = TPORT__TO_REQUEST__INIT;
  toq.ref = &slot;
  toq.copy = true;
  same_not_found(&r, TPORT__METHOD__METHOD_TO, "To", &slot, &theirs, &nobody, &toq.base);
  Tport__CopyRequest cq = TPORT__COPY_REQUEST__INIT;
  cq.dst = &vref;
  cq.src = &slot;
  same_not_found(&r, TPORT__METHOD__METHOD_COPY, "Copy from", &slot, &theirs, &nobody, &cq.base);
  Tport__FreeRequest fq = TPORT__FREE_REQUEST__INIT;
  fq.ref = &slot;
  same_not_found(&r, TPORT__METHOD__METHOD_FREE, "Free", &slot, &theirs, &nobody, &fq.base);
  uint8_t back[16];
  cr_expect_eq(tport_get(alice, &at.ref, back, 16, NULL, NULL, NULL, &err), 0,
               "alice's tensor after the other tenant's attempts: %s", err.msg);
  cr_expect(memcmp(back, v16, 16) == 0, "alice's tensor changed");
  tport_close(alice);

  /* the quota (4 MiB) */
  int64_t eight[1] = {8 << 20};
  refused("PutBegin of 8 MiB with a 4 MiB quota",
          put_desc(&r, U8, 1, eight, 0, NULL, 0, NULL, PRESERVE, msg), msg,
          TPORT_RESOURCE_EXHAUSTED, "quota");

  /* and a normal client is served, bytes exact */
  raw_expect_bytes(&r, hv, v16, 16, "the raw connection's first tensor after it all");
  tport_client *c = svc_connect(url, NULL);
  round_trip(c, 300 << 10, 19, "a normal client after the absurd requests");
  tport_close(c);
  raw_close(&r);
  free(data);
  free(gdata);
  server_stop(s, 1000);
}

/* A GetBatch element that asks to wait for a name: an element is no
 * context of its own and cannot park.  It made tportd follow a NULL waiter
 * (found by review) wherever --deadline was longer than the host's uptime,
 * and failed every such element at once elsewhere; now the element alone is
 * refused by name, the others answered. */
Test(hostile, a_batch_get_that_waits_for_a_name_is_refused_alone)
{
  char url[128];
  server_config cfg;
  config(&cfg);
  cfg.deadline_ms = 1000ul * 3600 * 24 * 365 * 30; /* past any uptime */
  server *s = start(&cfg, url, sizeof url);
  rawc r;
  raw_open(&r, url);
  char msg[256];
  uint8_t v16[16], hv[16];
  fill(v16, 16, 3);
  raw_put(&r, v16, 16, NULL, NULL, hv);
  Tport__Ref there = mkref(hv, 16, NULL), missing = mkref(NULL, 0, "never-put");
  Tport__GetBeginRequest g[2], *gp[2] = {&g[0], &g[1]};
  get_begin_req(&g[0], &missing, 1 << 20);
  g[0].wait_ms = UINT32_MAX;
  get_begin_req(&g[1], &there, 1 << 20);
  Tport__GetBatchRequest q = TPORT__GET_BATCH_REQUEST__INIT;
  q.n_gets = 2;
  q.gets = gp;
  ProtobufCMessage *out = NULL;
  int code = raw_call(&r, TPORT__METHOD__METHOD_GET_BATCH, &q.base, NULL, 0,
                      &tport__get_batch_reply__descriptor, msg, &out, NULL);
  cr_assert_eq(code, TPORT_OK, "GetBatch: %d %s", code, msg);
  Tport__GetBatchReply *b = (Tport__GetBatchReply *)out;
  cr_assert_eq(b->n_gets, 2);
  cr_expect_eq(b->gets[0]->status->code, TPORT_INVALID_ARGUMENT, "the waiting element: %d %s",
               b->gets[0]->status->code, b->gets[0]->status->message);
  cr_expect_neq(strstr(b->gets[0]->status->message, "wait"), NULL, "%s",
                b->gets[0]->status->message);
  cr_expect_eq(b->gets[1]->status->code, TPORT_OK, "the other element: %s",
               b->gets[1]->status->message);
  protobuf_c_message_free_unpacked(out, NULL);
  /* the server still answers */
  cr_expect_eq(raw_get_begin(&r, &there, 1 << 20, msg, NULL), TPORT_OK, "%s", msg);
  raw_close(&r);
  server_stop(s, 1000);
}

/* A request that waits for a name holds its body (counted against
 * --request-memory) for as long as it waits: one padded with unknown fields
 * would hold other tenants' requests out for the whole wait.  Past 4 KiB
 * it is refused at once; a plain one parks and times out as asked. */
Test(hostile, a_request_that_waits_for_a_name_is_small)
{
  char url[128];
  server *s = start_default(url, sizeof url);
  rawc r;
  raw_open(&r, url);
  char msg[256];
  Tport__Ref missing = mkref(NULL, 0, "never-put");
  /* an unknown length-delimited field: protobuf-c packs its data as is,
   * the length's varint first (4998 = 0x86 0x27) */
  static uint8_t pad[5000] = {0x86, 0x27};
  ProtobufCMessageUnknownField unknown = {.tag = 1000,
                                          .wire_type = PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED,
                                          .len = sizeof pad,
                                          .data = pad};
  Tport__InfoRequest q = TPORT__INFO_REQUEST__INIT;
  q.ref = &missing;
  q.wait_ms = 60000;
  q.base.n_unknown_fields = 1;
  q.base.unknown_fields = &unknown;
  int64_t t0 = now_ms();
  ProtobufCMessage *out = NULL;
  int code = raw_call(&r, TPORT__METHOD__METHOD_INFO, &q.base, NULL, 0,
                      &tport__info_reply__descriptor, msg, &out, NULL);
  cr_assert_eq(code, TPORT_INVALID_ARGUMENT, "a padded waiting Info: %d %s", code, msg);
  cr_expect_neq(strstr(msg, "at most 4096 bytes"), NULL, "%s", msg);
  cr_expect_lt(now_ms() - t0, 30000, "refused at once, not after its wait");
  if (out)
    protobuf_c_message_free_unpacked(out, NULL);
  /* the same request without the padding parks, and times out as asked */
  q.base.n_unknown_fields = 0;
  q.base.unknown_fields = NULL;
  q.wait_ms = 200;
  out = NULL;
  code = raw_call(&r, TPORT__METHOD__METHOD_INFO, &q.base, NULL, 0, &tport__info_reply__descriptor,
                  msg, &out, NULL);
  cr_assert_eq(code, TPORT_DEADLINE_EXCEEDED, "a plain waiting Info: %d %s", code, msg);
  if (out)
    protobuf_c_message_free_unpacked(out, NULL);
  raw_close(&r);
  server_stop(s, 1000);
}
