/*
 * test_hostile_quota.c: what a client may hold and make the server do.
 * Racing commits (2), get limits (4), unbounded work (6), storage
 * accounting (7), named half-uploads (8) and the tensors, sessions and
 * tenants of the registry (9).
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
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "host_cache.h"
#include "hostile_util.h"
#include "registry.h"
#include "staging.h"

/* A server that stalls must fail the test, never hang it. */
TestSuite(hostile, .timeout = 120);

/* ================================================================ 2: racing commits */

Test(hostile, d2_racing_commits_publish_an_upload_once)
{
  char url[128];
  server *s = start_default(url, sizeof url);
  rawc r;
  raw_open(&r, url);
  const size_t n = 3 * CHUNK + 100; /* 4 chunks */
  uint8_t *data = malloc(n);
  fill(data, n, 2);
  int64_t held = 0;
  for (int iter = 0; iter < 30; iter++) {
    /* odd iterations: on sim:0 with a conversion at the commit and slow
     * device work, so that the commits surely overlap on the workers */
    bool slow = iter % 2;
    uint8_t h[16];
    char msg[256];
    int code = raw_put_begin_as(&r, n, slow ? "sim:0" : NULL, NULL,
                                slow ? TPORT__DTYPE__DTYPE_FLOAT32 : -1, h, msg);
    cr_assert_eq(code, 0, "iteration %d: PutBegin: %s", iter, msg);
    raw_chunks(&r, h, data, n, 0, nchunks(n));
    if (slow)
      sim_set_delay_range(20000, 30000);
    Tport__Ref ref = mkref(h, 16, NULL);
    Tport__PutCommitRequest q = TPORT__PUT_COMMIT_REQUEST__INIT;
    q.ref = &ref;
    for (int i = 0; i < RAW_CTXS; i++)
      raw_send(&r, i, TPORT__METHOD__METHOD_PUT_COMMIT, &q.base, NULL, 0);
    int ok = 0;
    for (int i = 0; i < RAW_CTXS; i++) {
      ProtobufCMessage *out;
      code = raw_wait(&r, i, &tport__put_commit_reply__descriptor, msg, &out, NULL);
      Tport__PutCommitReply *cr = (Tport__PutCommitReply *)out;
      if (code == 0) {
        ok++;
        cr_assert(cr->info, "iteration %d: an OK PutCommit without the tensor's info", iter);
        cr_assert_geq(cr->info->storage_nbytes, (int64_t)n,
                      "iteration %d: the stored tensor has %lld storage bytes for %zu", iter,
                      (long long)cr->info->storage_nbytes, n);
        held += cr->info->storage_nbytes;
      } else {
        cr_expect(code == TPORT_FAILED_PRECONDITION || code == TPORT_NOT_FOUND,
                  "iteration %d: a losing PutCommit got %s (%s), want FAILED_PRECONDITION or "
                  "NOT_FOUND",
                  iter, tport_strerror(code), msg);
      }
      protobuf_c_message_free_unpacked(out, NULL);
    }
    sim_set_delay(0);
    cr_assert_eq(ok, 1, "iteration %d (%s): %d of %d racing PutCommits of one upload succeeded",
                 iter, slow ? "sim:0, converted" : "cpu", ok, RAW_CTXS);
  }
  /* the 30 tensors live with r's connection: the server holds exactly them */
  int64_t bytes = op_counter(url, "tensor_bytes"), ups = op_counter(url, "uploads_in_progress");
  cr_assert_eq(bytes, held,
               "the operator's tensor_bytes is %lld; the 30 committed tensors hold %lld",
               (long long)bytes, (long long)held);
  cr_assert_eq(ups, 0, "uploads_in_progress is %lld after every upload was committed",
               (long long)ups);
  raw_close(&r);
  free(data);
  server_stop(s, 1000);
}

Test(hostile, d2_chunks_racing_a_commit)
{
  char url[128];
  server *s = start_default(url, sizeof url);
  rawc r;
  raw_open(&r, url);
  const size_t n = 4 * CHUNK;
  uint8_t *data = malloc(n);
  for (int iter = 0; iter < 30; iter++) {
    fill(data, n, 100 + (unsigned)iter);
    uint8_t h[16];
    char msg[256];
    int code = raw_put_begin(&r, n, iter % 2 ? "sim:0" : NULL, NULL, h, msg);
    cr_assert_eq(code, 0, "iteration %d: PutBegin: %s", iter, msg);
    raw_chunks(&r, h, data, n, 0, 3);
    Tport__Ref ref = mkref(h, 16, NULL);
    /* the last chunk, duplicates of the first three and two commits, at once */
    Tport__PutChunkRequest cq[4];
    for (int k = 0; k < 4; k++)
      chunk_req(&cq[k], &ref, (uint64_t)k * CHUNK);
    Tport__PutCommitRequest q = TPORT__PUT_COMMIT_REQUEST__INIT;
    q.ref = &ref;
    raw_send(&r, 0, TPORT__METHOD__METHOD_PUT_CHUNK, &cq[3].base, data + 3 * CHUNK, CHUNK);
    raw_send(&r, 1, TPORT__METHOD__METHOD_PUT_COMMIT, &q.base, NULL, 0);
    for (int k = 0; k < 3; k++)
      raw_send(&r, 2 + k, TPORT__METHOD__METHOD_PUT_CHUNK, &cq[k].base, data + k * CHUNK, CHUNK);
    raw_send(&r, 5, TPORT__METHOD__METHOD_PUT_COMMIT, &q.base, NULL, 0);
    int codes[6], commits_ok = 0;
    char msgs[6][256];
    for (int i = 0; i < 6; i++)
      codes[i] = raw_wait(&r, i,
                          i == 1 || i == 5 ? &tport__put_commit_reply__descriptor
                                           : &tport__put_chunk_reply__descriptor,
                          msgs[i], NULL, NULL);
    for (int i = 0; i < 6; i++) {
      if (i == 1 || i == 5) {
        commits_ok += codes[i] == 0;
        cr_expect(codes[i] == 0 ||
                      (codes[i] == TPORT_FAILED_PRECONDITION &&
                       (strstr(msgs[i], "missing") || strstr(msgs[i], "being written") ||
                        strstr(msgs[i], "commit"))),
                  "iteration %d: a PutCommit racing chunks: %s (%s), want OK or "
                  "FAILED_PRECONDITION saying chunks are missing or being written",
                  iter, tport_strerror(codes[i]), msgs[i]);
      } else {
        cr_expect(codes[i] == 0 || codes[i] == TPORT_FAILED_PRECONDITION,
                  "iteration %d: a PutChunk racing a commit: %s (%s)", iter,
                  tport_strerror(codes[i]), msgs[i]);
      }
    }
    cr_assert_leq(commits_ok, 1, "iteration %d: both racing PutCommits succeeded", iter);
    if (codes[0] != 0) {
      code = raw_chunk(&r, h, 3 * CHUNK, data + 3 * CHUNK, CHUNK, msg);
      cr_assert_eq(code, 0, "iteration %d: the last chunk again: %s (%s)", iter,
                   tport_strerror(code), msg);
    }
    if (!commits_ok) {
      code = raw_commit(&r, h, msg, NULL);
      cr_assert_eq(code, 0, "iteration %d: PutCommit after the race: %s (%s)", iter,
                   tport_strerror(code), msg);
    }
    raw_expect_bytes(&r, h, data, n, "a commit raced by chunks");
    Tport__FreeRequest fq = TPORT__FREE_REQUEST__INIT;
    fq.ref = &ref;
    code = raw_call(&r, TPORT__METHOD__METHOD_FREE, &fq.base, NULL, 0,
                    &tport__free_reply__descriptor, msg, NULL, NULL);
    cr_assert_eq(code, 0, "iteration %d: Free: %s", iter, msg);
  }
  int64_t ups = op_counter(url, "uploads_in_progress");
  cr_assert_eq(ups, 0, "uploads_in_progress is %lld after the races", (long long)ups);
  raw_close(&r);
  free(data);
  server_stop(s, 1000);
}

/* ================================================================ 4: get limits */

Test(hostile, d4_views_and_gets_past_max_tensor_are_refused)
{
  char url[128];
  server_config cfg;
  config(&cfg);
  cfg.max_tensor_bytes = 1 << 20;
  server *s = start(&cfg, url, sizeof url);
  tport_client *c = svc_connect(url, NULL);
  tport_tensor_info a, big;
  tport_err err;
  uint8_t one = 42;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, (int64_t[]){1}, NULL, &one, 1, NULL, &a, &err), 0,
               "put 1 byte: %s", err.msg);
  int rc = tport_view(c, &a.ref, 1, (int64_t[]){1 << 30}, (int64_t[]){0}, 0, NULL, &big, &err);
  cr_assert_eq(rc, TPORT_RESOURCE_EXHAUSTED,
               "View sizes [2^30] strides [0] of a 1-byte tensor (1 GiB to read, --max-tensor 1 "
               "MiB): %s (%s), want RESOURCE_EXHAUSTED",
               tport_strerror(rc), err.msg);
  cr_assert(strstr(err.msg, "limit") || strstr(err.msg, "max-tensor") || strstr(err.msg, "1048576"),
            "the refusal does not mention the limit: '%s'", err.msg);
  /* 2 MiB: a server may refuse the view itself, or its get */
  rc = tport_view(c, &a.ref, 1, (int64_t[]){2 << 20}, (int64_t[]){0}, 0, NULL, &big, &err);
  if (rc == 0) {
    rawc r;
    raw_open(&r, url);
    Tport__Ref ref = mkref(big.ref.handle, 16, NULL);
    char msg[256];
    rc = raw_get_begin(&r, &ref, 0, msg, NULL);
    cr_assert_eq(rc, TPORT_RESOURCE_EXHAUSTED,
                 "GetBegin of a 2 MiB view (--max-tensor 1 MiB): %s (%s), want RESOURCE_EXHAUSTED",
                 tport_strerror(rc), msg);
    cr_assert(strstr(msg, "limit") || strstr(msg, "max-tensor") || strstr(msg, "1048576"),
              "the refusal does not mention the limit: '%s'", msg);
    raw_close(&r);
  } else {
    cr_assert_eq(rc, TPORT_RESOURCE_EXHAUSTED,
                 "View of 2 MiB (--max-tensor 1 MiB): %s (%s), want RESOURCE_EXHAUSTED",
                 tport_strerror(rc), err.msg);
  }
  uint8_t back;
  cr_assert_eq(tport_get(c, &a.ref, &back, 1, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(back, 42, "the 1-byte tensor reads %u after the refusals", back);
  tport_close(c);
  server_stop(s, 1000);
}

Test(hostile, d4_gets_in_progress_per_connection_are_bounded)
{
  char url[128];
  server_config cfg;
  config(&cfg);
  cfg.max_transfers = 4;
  server *s = start(&cfg, url, sizeof url);
  rawc r;
  raw_open(&r, url);
  const size_t n = 4 * CHUNK;
  uint8_t *data = malloc(n), h[16], t[16];
  fill(data, n, 4);
  raw_put(&r, data, n, NULL, NULL, h);
  Tport__Ref ref = mkref(h, 16, NULL);
  char msg[256];
  uint8_t first[16];
  for (int i = 0; i < 4; i++) {
    int code = raw_get_begin(&r, &ref, 0, msg, t);
    cr_assert_eq(code, 0, "GetBegin %d of 4 (--max-transfers 4): %s (%s)", i + 1,
                 tport_strerror(code), msg);
    if (i == 0)
      memcpy(first, t, 16);
  }
  int code = raw_get_begin(&r, &ref, 0, msg, t);
  cr_assert_eq(code, TPORT_RESOURCE_EXHAUSTED,
               "a fifth GetBegin with four unread (--max-transfers 4): %s (%s), want "
               "RESOURCE_EXHAUSTED",
               tport_strerror(code), msg);
  /* nothing else changed: the first transfer still serves its bytes */
  code = raw_get_chunk(&r, first, 16, 0, CHUNK, NULL, 0, msg);
  cr_assert_eq(code, 0, "GetChunk of the first transfer after the refusal: %s (%s)",
               tport_strerror(code), msg);
  raw_close(&r);
  free(data);
  server_stop(s, 1000);
}

Test(hostile, d4_an_unread_get_ends_after_the_transfer_timeout)
{
  char url[128];
  server_config cfg;
  config(&cfg);
  cfg.transfer_timeout_ms = 500;
  server *s = start(&cfg, url, sizeof url);
  rawc r;
  raw_open(&r, url);
  const size_t n = 4 * CHUNK;
  uint8_t *data = malloc(n), h[2][16], t[2][16];
  fill(data, n, 5);
  const char *devices[2] = {"cpu", "sim:0"};
  char msg[256];
  for (int i = 0; i < 2; i++) {
    raw_put(&r, data, n, devices[i], NULL, h[i]);
    Tport__Ref ref = mkref(h[i], 16, NULL);
    int code = raw_get_begin(&r, &ref, 0, msg, t[i]);
    cr_assert_eq(code, 0, "GetBegin of %s: %s (%s)", devices[i], tport_strerror(code), msg);
  }
  sleep(3); /* six times --transfer-timeout, without a GetChunk */
  for (int i = 0; i < 2; i++) {
    int code = raw_get_chunk(&r, t[i], 16, 0, CHUNK, NULL, 0, msg);
    cr_expect_eq(code, TPORT_NOT_FOUND,
                 "GetChunk of a %s transfer 3 s after its GetBegin (--transfer-timeout 500): %s "
                 "(%s), want NOT_FOUND",
                 devices[i], tport_strerror(code), msg);
  }
  int64_t left = op_counter_until(url, "transfers_in_progress", 0, 5000);
  cr_assert_eq(left, 0, "the operator's transfers_in_progress is %lld (-1: absent), want 0",
               (long long)left);
  raw_close(&r);
  free(data);
  server_stop(s, 1000);
}

/* A get that makes a copy (a device view made contiguous, on the device)
 * holds it against the tenant's quota for the transfer's life; a get of a
 * contiguous device tensor makes none (it is read back through the bounded
 * read-back pool's blocks) and so is not charged: a tenant at its quota
 * can still read its tensors back. */
Test(hostile, d4_gets_count_against_the_tenant_quota)
{
  char url[128];
  server_config cfg;
  config(&cfg);
  cfg.tenant_quota_bytes = 1 << 20;
  server *s = start(&cfg, url, sizeof url);
  tport_client *c = svc_connect(url, "t4");
  const size_t n = 384 << 10;
  uint8_t *data = malloc(n);
  fill(data, n, 6);
  tport_put_options po;
  tport_put_options_init(&po);
  po.device = "sim:0";
  po.name = "flat";
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, (int64_t[]){(int64_t)n}, NULL, data, n, &po, NULL,
                         &err),
               0, "%s", err.msg);
  /* its transpose, [2, 192 Ki] with strides (1, 2): a get makes a 384 KiB copy */
  cr_assert_eq(tport_view(c, &(tport_ref){.name = "flat"}, 2, (int64_t[]){2, (int64_t)n / 2},
                          (int64_t[]){1, 2}, 0, "tr", NULL, &err),
               0, "%s", err.msg);
  rawc r;
  raw_open(&r, url);
  char msg[256];
  cr_assert_eq(raw_hello(&r, "t4", msg), 0, "Hello: %s", msg);
  Tport__Ref tr = mkref(NULL, 0, "tr"), flat = mkref(NULL, 0, "flat");
  uint8_t t[16];
  int code = raw_get_begin(&r, &tr, 0, msg, t);
  cr_assert_eq(code, 0, "GetBegin of the transpose with 384 + 384 KiB of a 1 MiB quota: %s (%s)",
               tport_strerror(code), msg);
  code = raw_get_begin(&r, &tr, 0, msg, t);
  cr_assert_eq(code, TPORT_RESOURCE_EXHAUSTED,
               "a second GetBegin of the 384 KiB transpose (the tensor and two copies: 1152 KiB "
               "of a 1 MiB quota): %s (%s), want RESOURCE_EXHAUSTED",
               tport_strerror(code), msg);
  cr_assert(strstr(msg, "quota"), "the refusal does not mention the quota: '%s'", msg);
  /* the contiguous tensor itself: no copy, no charge, at the quota or not */
  for (int i = 0; i < 3; i++) {
    code = raw_get_begin(&r, &flat, 0, msg, t);
    cr_assert_eq(code, 0, "GetBegin %d of the contiguous sim:0 tensor (768 KiB held): %s (%s)", i,
                 tport_strerror(code), msg);
  }
  raw_close(&r);
  tport_close(c);
  free(data);
  server_stop(s, 1000);
}

/* ================================================================ 6: unbounded work */

Test(hostile, d6_huge_views_cost_no_work)
{
  char url[128];
  server_config cfg;
  config(&cfg);
  cfg.max_tensor_bytes = 1 << 20;
  server *s = start(&cfg, url, sizeof url);
  /* a 10 s client time-out: a server that works on these for long fails */
  tport_client *c = connect_as(url, NULL, REPLY_MS);
  const size_t n = 1 << 20;
  uint8_t *v = malloc(n);
  fill(v, n, 8);
  tport_tensor_info a, w;
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, (int64_t[]){(int64_t)n}, NULL, v, n, NULL, &a, &err), 0,
               "%s", err.msg);
  int64_t m = 1 << 20;
  int rc = tport_view(c, &a.ref, 3, (int64_t[]){m, m, m}, (int64_t[]){1, 1, 1}, 0, NULL, &w, &err);
  /* it reaches byte 3 MiB of a 1 MiB storage: OUT_OF_RANGE is the right refusal too */
  cr_expect(rc == TPORT_RESOURCE_EXHAUSTED || rc == TPORT_INVALID_ARGUMENT ||
                rc == TPORT_OUT_OF_RANGE,
            "View sizes [2^20, 2^20, 2^20] strides [1, 1, 1] of 1 MiB: %s (%s), want a refusal "
            "(a time-out means the server worked on it)",
            tport_strerror(rc), err.msg);
  tport_to_options o = {.has_dtype = true, .dtype = TPORT_FLOAT64};
  rc = tport_to(c, &a.ref, &o, NULL, NULL, &err);
  cr_expect_eq(rc, TPORT_RESOURCE_EXHAUSTED,
               "to(float64) of 1 MiB of uint8 (8 MiB, --max-tensor 1 MiB): %s (%s)",
               tport_strerror(rc), err.msg);
  /* views whose element count times element size passes --max-tensor: refused
   * outright, or else nothing may be made or copied from or into them */
  static const struct {
    const char *what;
    int ndim;
    int64_t sizes[3], strides[3];
  } views[] = {
      {"[2^20, 2^20, 2^20] strides [0, 0, 1]", 3, {1 << 20, 1 << 20, 1 << 20}, {0, 0, 1}},
      {"[4, 2^20] strides [0, 1]", 2, {4, 1 << 20}, {0, 1}},
      {"[2^21] strides [0]", 1, {1 << 21}, {0}},
  };
  for (size_t i = 0; i < sizeof views / sizeof views[0]; i++) {
    rc = tport_view(c, &a.ref, views[i].ndim, views[i].sizes, views[i].strides, 0, NULL, &w, &err);
    if (rc) {
      cr_expect_eq(rc, TPORT_RESOURCE_EXHAUSTED, "View %s of 1 MiB (--max-tensor 1 MiB): %s (%s)",
                   views[i].what, tport_strerror(rc), err.msg);
      continue;
    }
    bool alias;
    rc = tport_contiguous(c, &w.ref, TPORT_MF_CONTIGUOUS, NULL, NULL, &alias, &err);
    cr_expect_eq(rc, TPORT_RESOURCE_EXHAUSTED, "Contiguous of the view %s: %s (%s)", views[i].what,
                 tport_strerror(rc), err.msg);
    tport_to_options copy = {.copy = true};
    rc = tport_to(c, &w.ref, &copy, NULL, NULL, &err);
    cr_expect_eq(rc, TPORT_RESOURCE_EXHAUSTED, "To(copy) of the view %s: %s (%s)", views[i].what,
                 tport_strerror(rc), err.msg);
    rc = tport_copy(c, &w.ref, &a.ref, false, &err);
    cr_expect_eq(rc, TPORT_RESOURCE_EXHAUSTED, "Copy into the view %s: %s (%s)", views[i].what,
                 tport_strerror(rc), err.msg);
    tport_free(c, &w.ref, NULL);
  }
  uint8_t *back = malloc(n);
  rc = tport_get(c, &a.ref, back, n, NULL, NULL, NULL, &err);
  cr_assert_eq(rc, 0, "get of the original: %s (%s)", tport_strerror(rc), err.msg);
  cr_assert(memcmp(v, back, n) == 0, "the original changed");
  tport_close(c);
  free(v);
  free(back);
  server_stop(s, 1000);
}

/* ================================================================ 7: storage accounting */

/* Puts 768 KiB under `name` (kept for the tenant); returns the rc. */
static int put768(tport_client *c, const char *name, tport_tensor_info *out, tport_err *err)
{
  static uint8_t v[768 << 10];
  fill(v, sizeof v, 9);
  tport_put_options po;
  tport_put_options_init(&po);
  po.name = name;
  return tport_put(c, TPORT_UINT8, 1, (int64_t[]){768 << 10}, NULL, v, sizeof v, &po, out, err);
}

/* What a derived tensor (a view, an alias) of a 768 KiB tensor costs under a
 * 1 MiB quota once the original is freed: all of its storage. */
static void storage_stays_charged(bool by_view)
{
  char url[128];
  server_config cfg;
  config(&cfg);
  cfg.tenant_quota_bytes = 1 << 20;
  server *s = start(&cfg, url, sizeof url);
  tport_client *c = svc_connect(url, "acct");
  const char *kind = by_view ? "a named View" : "an aliasing named To";
  tport_tensor_info a, d;
  tport_err err;
  int rc = put768(c, "orig", &a, &err);
  cr_assert_eq(rc, 0, "put 768 KiB of a 1 MiB quota: %s", err.msg);
  if (by_view) {
    rc = tport_view(c, &a.ref, 1, (int64_t[]){768 << 10}, (int64_t[]){1}, 0, "derived", &d, &err);
  } else {
    bool alias = false;
    tport_to_options o = {.name = "derived"};
    rc = tport_to(c, &a.ref, &o, &d, &alias, &err);
    cr_assert(rc || alias, "to() with no change must alias");
  }
  cr_assert_eq(rc, 0, "%s of it: %s (%s)", kind, tport_strerror(rc), err.msg);
  cr_assert_eq(tport_free(c, &a.ref, &err), 0, "free the original: %s", err.msg);
  int64_t bytes = svc_counter(c, "tensor_bytes");
  cr_assert_eq(bytes, 768 << 10,
               "the tenant's tensor_bytes is %lld while only %s of a 768 KiB tensor lives, want "
               "786432",
               (long long)bytes, kind);
  rc = put768(c, "second", NULL, &err);
  cr_assert_eq(rc, TPORT_RESOURCE_EXHAUSTED,
               "another 768 KiB while %s still holds the first 768 KiB (1 MiB quota): %s (%s)",
               kind, tport_strerror(rc), err.msg);
  cr_assert_eq(tport_free(c, &d.ref, &err), 0, "free %s: %s", kind, err.msg);
  rc = put768(c, "second", NULL, &err);
  cr_assert_eq(rc, 0, "768 KiB once %s is freed too: %s (%s)", kind, tport_strerror(rc), err.msg);
  tport_close(c);
  server_stop(s, 1000);
}

Test(hostile, d7_a_view_keeps_its_storage_charged)
{
  storage_stays_charged(true);
}

Test(hostile, d7_an_alias_keeps_its_storage_charged)
{
  storage_stays_charged(false);
}

/* ================================================================ 8: named half-uploads */

Test(hostile, d8_a_named_half_upload_goes_with_its_connection)
{
  char url[128];
  server *s = start_default(url, sizeof url);
  const size_t n = 4 * CHUNK;
  uint8_t *data = malloc(n), h[16];
  fill(data, n, 10);
  char msg[256];
  rawc a;
  raw_open(&a, url);
  int code = raw_put_begin(&a, n, NULL, "x", h, msg);
  cr_assert_eq(code, 0, "A: PutBegin 'x': %s", msg);
  raw_chunks(&a, h, data, n, 0, 1);
  raw_close(&a);
  rawc b;
  raw_open(&b, url);
  int64_t end = now_ms() + 5000;
  while ((code = raw_put_begin(&b, n, NULL, "x", h, msg)) == TPORT_ALREADY_EXISTS && now_ms() < end)
    usleep(100000);
  cr_assert_eq(code, 0,
               "B: PutBegin 'x' up to 5 s after A closed with its upload of 'x' uncommitted: %s "
               "(%s)",
               tport_strerror(code), msg);
  raw_chunks(&b, h, data, n, 0, nchunks(n));
  code = raw_commit(&b, h, msg, NULL);
  cr_assert_eq(code, 0, "B: PutCommit 'x': %s", msg);
  raw_expect_bytes(&b, h, data, n, "B's 'x'");
  raw_close(&b);
  free(data);
  server_stop(s, 1000);
}

/* ================================================================ 9: tensors, sessions, tenants */

Test(hostile, d9_tensors_per_tenant_are_bounded)
{
  char url[128];
  server_config cfg;
  config(&cfg);
  cfg.max_tensors = 10;
  server *s = start(&cfg, url, sizeof url);
  tport_client *c = svc_connect(url, "t9");
  rawc r;
  raw_open(&r, url);
  char msg[256];
  cr_assert_eq(raw_hello(&r, "t9", msg), 0, "Hello t9: %s", msg);
  uint8_t h[16];
  int code = raw_put_begin(&r, 4 * CHUNK, NULL, NULL, h, msg);
  cr_assert_eq(code, 0, "t9's upload in progress (its first tensor): %s", msg);
  tport_tensor_info t[9];
  tport_err err;
  for (int i = 0; i < 9; i++) {
    int rc = tport_put(c, TPORT_UINT8, 1, (int64_t[]){0}, NULL, NULL, 0, NULL, &t[i], &err);
    cr_assert_eq(rc, 0, "t9's zero-byte tensor %d (tensor %d of 10): %s (%s)", i + 1, i + 2,
                 tport_strerror(rc), err.msg);
  }
  int rc = tport_put(c, TPORT_UINT8, 1, (int64_t[]){0}, NULL, NULL, 0, NULL, NULL, &err);
  cr_assert_eq(rc, TPORT_RESOURCE_EXHAUSTED,
               "t9's 11th tensor (9 zero-byte ones and an upload, --max-tensors 10): %s (%s), want "
               "RESOURCE_EXHAUSTED",
               tport_strerror(rc), err.msg);
  tport_client *other = svc_connect(url, "u9");
  rc = tport_put(other, TPORT_UINT8, 1, (int64_t[]){0}, NULL, NULL, 0, NULL, NULL, &err);
  cr_assert_eq(rc, 0, "another tenant's first tensor: %s (%s)", tport_strerror(rc), err.msg);
  cr_assert_eq(tport_free(c, &t[0].ref, &err), 0, "%s", err.msg);
  rc = tport_put(c, TPORT_UINT8, 1, (int64_t[]){0}, NULL, NULL, 0, NULL, NULL, &err);
  cr_assert_eq(rc, 0, "t9's put after freeing one: %s (%s)", tport_strerror(rc), err.msg);
  tport_close(other);
  raw_close(&r);
  tport_close(c);
  server_stop(s, 1000);
}

Test(hostile, d9_sessions_and_tenants_go_with_their_connections)
{
  char url[128];
  server *s = start_default(url, sizeof url);
  tport_client *op = svc_connect(url, OPERATOR);
  int64_t s0 = svc_counter(op, "sessions"), t0 = svc_counter(op, "tenants");
  cr_assert(s0 >= 1 && t0 >= 1,
            "the operator's Stats has sessions %lld and tenants %lld (-1: absent); each counts "
            "at least the operator's own",
            (long long)s0, (long long)t0);
  tport_client *cs[20];
  for (int i = 0; i < 20; i++) {
    char tenant[32];
    snprintf(tenant, sizeof tenant, "passer-%d", i);
    cs[i] = svc_connect(url, tenant);
  }
  int64_t s1 = svc_counter(op, "sessions"), t1 = svc_counter(op, "tenants");
  cr_assert_geq(s1, s0 + 20, "sessions is %lld with 20 more connections open (%lld before)",
                (long long)s1, (long long)s0);
  cr_assert_geq(t1, t0 + 20, "tenants is %lld with 20 more tenants connected (%lld before)",
                (long long)t1, (long long)t0);
  for (int i = 0; i < 20; i++)
    tport_close(cs[i]);
  int64_t s2 = s1, t2 = t1;
  for (int64_t end = now_ms() + 10000; (s2 > s0 || t2 > t0) && now_ms() < end;) {
    usleep(100000);
    s2 = svc_counter(op, "sessions");
    t2 = svc_counter(op, "tenants");
  }
  cr_assert(s2 <= s0 && t2 <= t0,
            "10 s after 20 connections of tenants holding nothing closed: sessions %lld (was "
            "%lld), tenants %lld (was %lld)",
            (long long)s2, (long long)s0, (long long)t2, (long long)t0);
  tport_close(op);
  server_stop(s, 1000);
}

/* ================================================================ 20.3: charged before made */

/* Issue 20, finding 3: the quota was checked after the work -- To,
 * Contiguous, a Copy's temporaries and PutBegin's landing tensor were
 * allocated (and filled) in full and only then refused.  Every byte is now
 * reserved against the tenant's quota before it is allocated.  "Allocated"
 * is read from the server's own figure: sim:0's peak device memory in use
 * (the Stats counter sim0_bytes_peak), never from how long anything took. */

#define Q20_QUOTA (1 << 20)
#define Q20_TENANT "q20"

static server *q20_start(char *url, size_t len)
{
  server_config cfg;
  config(&cfg);
  cfg.tenant_quota_bytes = Q20_QUOTA;
  return start(&cfg, url, len);
}

/* Puts n bytes of dtype (element size es) named name on device; OK or the test fails. */
static void q20_put(tport_client *c, tport_dtype dt, size_t es, size_t n, const char *device,
                    const char *name, tport_tensor_info *out)
{
  uint8_t *v = calloc(n, 1);
  fill(v, n, 20);
  if (dt == TPORT_FLOAT32)
    memset(v, 0, n); /* finite values */
  tport_put_options po;
  tport_put_options_init(&po);
  po.name = name;
  po.device = device;
  tport_err err;
  int64_t numel = (int64_t)(n / es);
  int rc = tport_put(c, dt, 1, &numel, NULL, v, n, &po, out, &err);
  cr_assert_eq(rc, 0, "put %zu bytes as '%s' on %s: %s (%s)", n, name, device, tport_strerror(rc),
               err.msg);
  free(v);
}

/* The tenant's charged bytes: exactly what its tensors hold. */
static void q20_expect_bytes(tport_client *c, int64_t want, const char *when)
{
  int64_t bytes = svc_counter(c, "tensor_bytes");
  cr_assert_eq(bytes, want, "%s: the tenant is charged %lld bytes; its tensors hold %lld", when,
               (long long)bytes, (long long)want);
}

/* The same, for charges that go when their memory is freed: a device
 * copy whose last work is still pending when it is released is freed by
 * the reaper's next round (each second). */
static void q20_expect_bytes_soon(tport_client *c, int64_t want, const char *when)
{
  int64_t bytes = -1;
  for (int i = 0; i < 50 && (bytes = svc_counter(c, "tensor_bytes")) != want; i++)
    usleep(100000);
  cr_assert_eq(bytes, want, "%s: the tenant is charged %lld bytes 5 s on; its tensors hold %lld",
               when, (long long)bytes, (long long)want);
}

/* A refusal for the quota, before the work, that names the bytes asked
 * and the bytes left. */
static void q20_expect_refusal(int code, const char *msg, const char *asked, const char *left,
                               const char *what)
{
  cr_assert_eq(code, TPORT_RESOURCE_EXHAUSTED, "%s: %s (%s), want RESOURCE_EXHAUSTED", what,
               tport_strerror(code), msg);
  cr_assert(strstr(msg, "quota") && strstr(msg, asked) && strstr(msg, left),
            "%s: the refusal '%s' does not name the quota, the %s bytes asked and the %s left",
            what, msg, asked, left);
}

Test(hostile, d20c_results_past_the_quota_are_refused_before_they_are_made)
{
  char url[128];
  server *s = q20_start(url, sizeof url);
  tport_client *c = svc_connect(url, Q20_TENANT);
  const size_t n = 256 << 10;
  tport_tensor_info base, wide;
  q20_put(c, TPORT_UINT8, 1, n, "sim:0", "base", &base);
  /* a free broadcast view whose materialization is 1 MiB: more than the
   * 768 KiB the tenant has left */
  tport_err err;
  int rc = tport_view(c, &base.ref, 2, (int64_t[]){4, (int64_t)n}, (int64_t[]){0, 1}, 0, "wide",
                      &wide, &err);
  cr_assert_eq(rc, 0, "View [4, 256Ki] strides [0, 1]: %s (%s)", tport_strerror(rc), err.msg);
  q20_expect_bytes(c, (int64_t)n, "after the put and the view");
  size_t before = sim_bytes_in_use(0);
  sim_reset_peak(0);

  /* 4 Contiguous of the view and 4 to(float32) of the tensor (1 MiB each),
   * all at once on one connection of the tenant */
  rawc r;
  raw_open(&r, url);
  char msg[256];
  cr_assert_eq(raw_hello(&r, Q20_TENANT, msg), 0, "Hello: %s", msg);
  Tport__Ref wref = mkref(NULL, 0, "wide"), bref = mkref(NULL, 0, "base");
  Tport__ContiguousRequest cq = TPORT__CONTIGUOUS_REQUEST__INIT;
  cq.ref = &wref;
  cq.memory_format = TPORT__MEMORY_FORMAT__MF_CONTIGUOUS;
  Tport__ToRequest tq = TPORT__TO_REQUEST__INIT;
  tq.ref = &bref;
  tq.dtype_set = true;
  tq.dtype = TPORT__DTYPE__DTYPE_FLOAT32;
  for (int i = 0; i < RAW_CTXS; i++)
    if (i % 2)
      raw_send(&r, i, TPORT__METHOD__METHOD_TO, &tq.base, NULL, 0);
    else
      raw_send(&r, i, TPORT__METHOD__METHOD_CONTIGUOUS, &cq.base, NULL, 0);
  int codes[RAW_CTXS];
  char msgs[RAW_CTXS][256];
  for (int i = 0; i < RAW_CTXS; i++)
    codes[i] =
        raw_wait(&r, i, i % 2 ? &tport__to_reply__descriptor : &tport__contiguous_reply__descriptor,
                 msgs[i], NULL, NULL);
  int64_t peak = op_counter(url, "sim0_bytes_peak");
  cr_assert_eq(peak, (int64_t)before,
               "sim:0 had %lld bytes in use at its peak during 8 requests past the quota; %zu "
               "before: their results were allocated",
               (long long)peak, before);
  for (int i = 0; i < RAW_CTXS; i++)
    q20_expect_refusal(codes[i], msgs[i], "1048576", "786432",
                       i % 2 ? "to(float32) of 256 KiB of uint8 with 768 KiB of 1 MiB left"
                             : "Contiguous of a 1 MiB view with 768 KiB of 1 MiB left");
  q20_expect_bytes(c, (int64_t)n, "after 8 refusals");

  /* what fits is still made, and charged exactly */
  tport_tensor_info half;
  bool alias = true;
  rc = tport_view(c, &base.ref, 2, (int64_t[]){2, (int64_t)n}, (int64_t[]){0, 1}, 0, "half", NULL,
                  &err);
  cr_assert_eq(rc, 0, "View [2, 256Ki]: %s (%s)", tport_strerror(rc), err.msg);
  rc = tport_contiguous(c, &(tport_ref){.name = "half"}, TPORT_MF_CONTIGUOUS, "made", &half, &alias,
                        &err);
  cr_assert_eq(rc, 0, "Contiguous of a 512 KiB view with 768 KiB left: %s (%s)", tport_strerror(rc),
               err.msg);
  cr_assert(!alias, "a broadcast view's Contiguous is a fresh tensor");
  q20_expect_bytes(c, (int64_t)(3 * n), "after a 512 KiB Contiguous");
  cr_assert_eq(tport_free(c, &half.ref, &err), 0, "free: %s", err.msg);
  q20_expect_bytes(c, (int64_t)n, "after freeing it");
  raw_close(&r);
  tport_close(c);
  server_stop(s, 1000);
}

Test(hostile, d20c_a_put_past_the_quota_is_refused_at_put_begin)
{
  char url[128];
  server *s = q20_start(url, sizeof url);
  rawc r;
  raw_open(&r, url);
  char msg[256];
  cr_assert_eq(raw_hello(&r, Q20_TENANT, msg), 0, "Hello: %s", msg);
  tport_client *c = svc_connect(url, Q20_TENANT);
  size_t before = sim_bytes_in_use(0);
  sim_reset_peak(0);
  uint8_t h[16];
  /* a landing tensor of 2 MiB */
  int code = raw_put_begin(&r, 2 << 20, "sim:0", NULL, h, msg);
  q20_expect_refusal(code, msg, "2097152", "1048576", "PutBegin of 2 MiB with a 1 MiB quota");
  /* 512 KiB of uint8 stored as float32: a 2 MiB final tensor */
  code = raw_put_begin_as(&r, 512 << 10, "sim:0", NULL, TPORT__DTYPE__DTYPE_FLOAT32, h, msg);
  q20_expect_refusal(code, msg, "2097152", "1048576",
                     "PutBegin of 512 KiB of uint8 as float32 with a 1 MiB quota");
  /* a named one: refused the same, and no name is taken */
  code = raw_put_begin(&r, 1536 << 10, "sim:0", "big", h, msg);
  q20_expect_refusal(code, msg, "1572864", "1048576", "PutBegin of 1.5 MiB named 'big'");
  int64_t peak = op_counter(url, "sim0_bytes_peak");
  cr_assert_eq(peak, (int64_t)before,
               "sim:0 had %lld bytes in use at its peak during 3 refused PutBegins; %zu before: "
               "a landing tensor was allocated",
               (long long)peak, before);
  q20_expect_bytes(c, 0, "after 3 refused puts");
  cr_assert_eq(svc_counter(c, "uploads_in_progress"), 0, "a refused put left an upload");
  /* what fits goes in, and is charged exactly (384 KiB: its get's host copy fits too) */
  uint8_t *data = malloc(384 << 10);
  fill(data, 384 << 10, 21);
  raw_put(&r, data, 384 << 10, "sim:0", "big", h);
  q20_expect_bytes(c, 384 << 10, "after a 384 KiB put");
  raw_expect_bytes(&r, h, data, 384 << 10, "the 384 KiB put");
  q20_expect_bytes(c, 384 << 10, "after its get");
  free(data);
  raw_close(&r);
  tport_close(c);
  server_stop(s, 1000);
}

Test(hostile, d20c_a_copys_temporaries_are_charged)
{
  char url[128];
  server *s = q20_start(url, sizeof url);
  tport_client *c = svc_connect(url, Q20_TENANT);
  /* cpu uint8 into sim:0 float32: the engine converts on the host first,
   * into a float32 temporary as large as the destination (640 KiB) */
  const size_t numel = 160 << 10;
  tport_tensor_info dst, src;
  q20_put(c, TPORT_FLOAT32, 4, 4 * numel, "sim:0", "dst", &dst);
  q20_put(c, TPORT_UINT8, 1, numel, "cpu", "src", &src);
  const int64_t held = 5 * (int64_t)numel; /* 800 KiB of 1 MiB */
  tport_err err;
  int rc = tport_copy(c, &dst.ref, &src.ref, false, &err);
  q20_expect_refusal(rc, err.msg, "655360", "229376",
                     "Copy of 160 Ki uint8 on the cpu into float32 on sim:0 (a 640 KiB "
                     "temporary) with 224 KiB of 1 MiB left");
  q20_expect_bytes(c, held, "after the refused Copy");
  /* the destination is untouched (no kernel ran): its first 64 values,
   * read through a view (a get of all of it would need a 640 KiB host copy) */
  float back[64];
  tport_tensor_info head;
  rc = tport_view(c, &dst.ref, 1, (int64_t[]){64}, (int64_t[]){1}, 0, "head", &head, &err);
  cr_assert_eq(rc, 0, "View of dst's head: %s", err.msg);
  rc = tport_get(c, &head.ref, back, sizeof back, NULL, NULL, NULL, &err);
  cr_assert_eq(rc, 0, "get dst's head: %s (%s)", tport_strerror(rc), err.msg);
  for (size_t i = 0; i < 64; i++)
    cr_assert_eq(back[i], 0.0f, "dst[%zu] is %g after a refused Copy", i, (double)back[i]);
  q20_expect_bytes(c, held, "after the get");
  /* with room for the temporary, the Copy runs, and only the tensors stay charged */
  cr_assert_eq(tport_free(c, &(tport_ref){.name = "src"}, &err), 0, "free src: %s", err.msg);
  uint8_t *small = malloc(numel / 4);
  fill(small, numel / 4, 22);
  tport_tensor_info part;
  q20_put(c, TPORT_UINT8, 1, numel / 4, "cpu", "small", &part);
  tport_tensor_info dview;
  rc = tport_view(c, &dst.ref, 1, (int64_t[]){(int64_t)numel / 4}, (int64_t[]){1}, 0, "dview",
                  &dview, &err);
  cr_assert_eq(rc, 0, "View: %s", err.msg);
  rc = tport_copy(c, &dview.ref, &part.ref, false, &err);
  cr_assert_eq(rc, 0,
               "Copy of 40 Ki uint8 into float32 (a 160 KiB temporary, 344 KiB left): %s "
               "(%s)",
               tport_strerror(rc), err.msg);
  q20_expect_bytes(c, 4 * (int64_t)numel + (int64_t)numel / 4, "after a Copy that fit");
  free(small);
  tport_close(c);
  server_stop(s, 1000);
}

/* A get that comes back in its first reply makes a copy too (here a
 * broadcast view on sim:0 made contiguous on the device before it is read
 * back): the copy is charged before it is made, as To's result is.  Before,
 * a tenant with 768 KiB left got a 1 MiB copy made for it. */
Test(hostile, d20c_an_inline_gets_copy_is_charged_before_it_is_made)
{
  char url[128];
  server_config cfg;
  config(&cfg);
  cfg.tenant_quota_bytes = Q20_QUOTA;
  cfg.chunk_bytes = 2 << 20; /* the 1 MiB copy comes back inline */
  server *s = start(&cfg, url, sizeof url);
  tport_client *c = svc_connect(url, Q20_TENANT);
  const size_t n = 256 << 10;
  tport_tensor_info base;
  q20_put(c, TPORT_UINT8, 1, n, "sim:0", "base", &base);
  tport_err err;
  int rc = tport_view(c, &base.ref, 2, (int64_t[]){4, (int64_t)n}, (int64_t[]){0, 1}, 0, "wide",
                      NULL, &err);
  cr_assert_eq(rc, 0, "View [4, 256Ki] strides [0, 1]: %s (%s)", tport_strerror(rc), err.msg);
  size_t before = sim_bytes_in_use(0);
  sim_reset_peak(0);
  uint8_t *back = malloc(4 * n);
  rc = tport_get(c, &(tport_ref){.name = "wide"}, back, 4 * n, NULL, NULL, NULL, &err);
  int64_t peak = op_counter(url, "sim0_bytes_peak");
  cr_assert_eq(peak, (int64_t)before,
               "sim:0 peaked at %lld bytes, %zu before: the get's 1 MiB copy was made", (long long)peak,
               before);
  q20_expect_refusal(rc, err.msg, "1048576", "786432",
                     "a get of a 1 MiB view (copied inline) with 768 KiB of 1 MiB left");
  q20_expect_bytes(c, (int64_t)n, "after the refused get");
  /* a copy that fits is made, and its charge goes with the request: the
   * copy on the device and the read-back block it comes back through
   * (256 KiB each: with the tensor, 768 KiB of 1 MiB) */
  rc = tport_view(c, &base.ref, 2, (int64_t[]){2, (int64_t)n / 2}, (int64_t[]){0, 1}, 0, "half",
                  NULL, &err);
  cr_assert_eq(rc, 0, "%s", err.msg);
  rc = tport_get(c, &(tport_ref){.name = "half"}, back, n, NULL, NULL, NULL, &err);
  cr_assert_eq(rc, 0, "a get of a 256 KiB view (its copy and its read-back block: 512 KiB) with "
               "768 KiB left: %s (%s)",
               tport_strerror(rc), err.msg);
  cr_assert_eq(memcmp(back, back + n / 2, n / 2), 0, "both rows are the tensor's first half");
  q20_expect_bytes_soon(c, (int64_t)n, "after the get");
  free(back);
  tport_close(c);
  server_stop(s, 1000);
}

/* ================================================================ 20.2: lent, still charged */

/* Issue 20, finding 2: a get's bytes are lent to its reply (nng writes them
 * to the socket from there), and a reply its client does not read lives
 * until the send timeout.  A get's host copy was charged only while the
 * request made it, and a get from a device's read-back blocks never: a
 * tenant that stopped reading held as many copies and blocks as it asked
 * for (6 connections x 50 gets: 1.24 GB held, 9 bytes charged against a
 * 1 MiB quota) and could take the whole read-back pool from everyone else.
 * Now each is charged before it is taken, for as long as it lives: a
 * connection that does not read is refused once its tenant's quota is held,
 * and the charge goes when the reply is read or the connection goes.
 * "Held" is the server's own figure: the host cache's bytes in use (the
 * copies) plus the read-back pool's (the blocks). */

#define L20_QUOTA ((size_t)16 << 20)
#define L20_TENANT "lender"
/* each get's copy or block: a whole huge page (the host cache counts blocks
 * of 1 MiB and up, rounded to 2 MiB) */
#define L20_N ((size_t)2 << 20)
#define L20_CONNS 3
#define L20_GETS 16 /* per connection: 96 MiB asked for in all */

typedef enum { L20_HOST_INLINE, L20_SIM_INLINE, L20_HOST_CHUNKED, L20_SIM_CHUNKED } l20_kind;

/* Bytes the server holds in host copies and read-back blocks. */
static size_t l20_held(void)
{
  host_cache_stats hc;
  host_cache_get_stats(&hc);
  staging_stats rb;
  staging_get_stats(staging_readback(), &rb);
  return hc.in_use_bytes + (size_t)rb.bytes_in_use;
}

/* Sends the gets of one connection, none of whose payloads it reads (a
 * chunked get's GetBegin replies, which carry none, excepted): how many
 * GetBegins were refused for the quota. */
static int l20_send_gets(int fd, l20_kind kind, const char *name)
{
  bool chunked = kind == L20_HOST_CHUNKED || kind == L20_SIM_CHUNKED;
  Tport__Ref ref = mkref(NULL, 0, name);
  Tport__GetBeginRequest g;
  get_begin_req(&g, &ref, chunked ? 0 : 64 << 20);
  for (uint32_t i = 0; i < L20_GETS; i++)
    cr_assert(sp_send(fd, 100 + i, TPORT__METHOD__METHOD_GET_BEGIN, &g.base));
  if (!chunked)
    return 0;
  uint8_t ids[L20_GETS][16];
  int ok = 0;
  for (int i = 0; i < L20_GETS; i++) {
    uint32_t id;
    char msg[256];
    ProtobufCMessage *out;
    int code = sp_recv_reply(fd, &id, &tport__get_begin_reply__descriptor, msg, &out);
    Tport__GetBeginReply *r = (Tport__GetBeginReply *)out;
    if (code == 0) {
      cr_assert_eq(r->transfer.len, 16, "a chunked GetBegin without a transfer id");
      memcpy(ids[ok++], r->transfer.data, 16);
    } else {
      cr_assert(code == TPORT_RESOURCE_EXHAUSTED && strstr(msg, "quota"),
                "GetBegin %u: %s (%s), want OK or RESOURCE_EXHAUSTED for the quota", id,
                tport_strerror(code), msg);
    }
    protobuf_c_message_free_unpacked(out, NULL);
  }
  for (int i = 0; i < L20_GETS; i++) {
    /* a refused GetBegin's place is taken by a chunk of one that was not:
     * NOT_FOUND once that transfer has served its bytes (or when none was) */
    static uint8_t none[16]; /* every GetBegin refused: NOT_FOUND */
    Tport__GetChunkRequest q = TPORT__GET_CHUNK_REQUEST__INIT;
    q.transfer.data = ok ? ids[i % ok] : none;
    q.transfer.len = 16;
    q.offset = 0;
    q.length = L20_N;
    cr_assert(sp_send(fd, 200 + (uint32_t)i, TPORT__METHOD__METHOD_GET_CHUNK, &q.base));
  }
  return L20_GETS - ok;
}

/* Reads the L20_GETS replies that carry (or would carry) bytes: how many
 * were refused for the quota; any other error fails the test. */
static int l20_read_replies(int fd)
{
  int refused = 0;
  for (int i = 0; i < L20_GETS; i++) {
    uint32_t id;
    char msg[256];
    int code = sp_recv_reply(fd, &id, NULL, msg, NULL);
    if (code == TPORT_RESOURCE_EXHAUSTED && strstr(msg, "quota"))
      refused++;
    else
      cr_assert(code == 0 || code == TPORT_NOT_FOUND,
                "request %u: %s (%s), want OK or RESOURCE_EXHAUSTED for the quota", id,
                tport_strerror(code), msg);
  }
  return refused;
}

static void lent_gets_are_charged(l20_kind kind)
{
  static const char *what[] = {"inline gets of a host copy", "inline gets from sim:0",
                               "chunked gets of a host copy", "chunked gets from sim:0"};
  server_config cfg;
  config(&cfg);
  cfg.tenant_quota_bytes = L20_QUOTA;
  cfg.chunk_bytes = L20_N;
  cfg.send_timeout_ms = 60000; /* the replies stay unread for the whole test */
  cfg.max_transfers = 2 * L20_GETS;
  char inproc[128], tcp[128];
  server *s = start_tcp(&cfg, inproc, sizeof inproc, tcp, sizeof tcp);
  tport_client *c = svc_connect(inproc, L20_TENANT);
  /* a 1-byte host tensor whose stride-0 view is a fresh 2 MiB copy per get,
   * and 2 MiB on sim:0 read back through a 2 MiB block per get */
  tport_tensor_info one;
  uint8_t v = 7;
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, (int64_t[]){1}, NULL, &v, 1, NULL, &one, &err), 0,
               "%s", err.msg);
  cr_assert_eq(tport_view(c, &one.ref, 1, (int64_t[]){(int64_t)L20_N}, (int64_t[]){0}, 0, "bc",
                          NULL, &err),
               0, "%s", err.msg);
  tport_tensor_info dev;
  q20_put(c, TPORT_UINT8, 1, L20_N, "sim:0", "dev", &dev);
  int64_t base = svc_counter(c, "tensor_bytes");
  bool host = kind == L20_HOST_INLINE || kind == L20_HOST_CHUNKED;
  const char *name = host ? "bc" : "dev";
  size_t held0 = l20_held();
  int fds[L20_CONNS], refused = 0;
  for (int k = 0; k < L20_CONNS; k++) {
    fds[k] = sp_connect_as(tcp, 4096, L20_TENANT);
    refused += l20_send_gets(fds[k], kind, name);
  }
  /* what the unread replies hold, sampled while the server works on them */
  size_t most = 0;
  for (int i = 0; i < 30; i++) {
    size_t now = l20_held();
    now = now > held0 ? now - held0 : 0;
    most = now > most ? now : most;
    usleep(50000);
  }
  int64_t charged = svc_counter(c, "tensor_bytes");
  cr_assert_leq(most, L20_QUOTA,
                "%s: %d connections of a tenant with a %zu-byte quota that read nothing hold %zu "
                "bytes of the server's memory (charged %lld)",
                what[kind], L20_CONNS, L20_QUOTA, most, (long long)charged);
  cr_assert_leq(charged, (int64_t)L20_QUOTA, "%s: the tenant is charged %lld bytes of %zu",
                what[kind], (long long)charged, L20_QUOTA);
  /* the tenant's own reading client is refused too while its quota is held
   * (chunked gets refused at GetBegin are never sent again: the replies the
   * sockets' buffers took may have left room) */
  uint8_t *back = malloc(L20_N);
  tport_ref nref = {0};
  snprintf(nref.name, sizeof nref.name, "%s", name);
  int rc = charged + (int64_t)L20_N > (int64_t)L20_QUOTA
               ? tport_get(c, &nref, back, L20_N, NULL, NULL, NULL, &err)
               : (err.msg[0] = 0, TPORT_RESOURCE_EXHAUSTED);
  cr_assert_eq(rc, TPORT_RESOURCE_EXHAUSTED,
               "%s: a get of %zu bytes with %lld of %zu charged: %s (%s), want "
               "RESOURCE_EXHAUSTED",
               what[kind], L20_N, (long long)charged, L20_QUOTA, tport_strerror(rc), err.msg);
  /* two connections read their replies, one goes without: nothing stays charged */
  for (int k = 0; k < L20_CONNS - 1; k++)
    refused += l20_read_replies(fds[k]);
  close(fds[L20_CONNS - 1]);
  cr_assert_gt(refused, 0, "%s: no get was refused for the quota", what[kind]);
  q20_expect_bytes_soon(c, base, "once the replies were read or their connection went");
  rc = tport_get(c, &nref, back, L20_N, NULL, NULL, NULL, &err);
  cr_assert_eq(rc, 0, "%s: a get after the charges went: %s (%s)", what[kind], tport_strerror(rc),
               err.msg);
  for (int k = 0; k < L20_CONNS - 1; k++)
    close(fds[k]);
  free(back);
  tport_close(c);
  server_stop(s, 2000);
}

Test(hostile, d20b_unread_inline_gets_of_host_copies_hold_only_the_quota)
{
  lent_gets_are_charged(L20_HOST_INLINE);
}

Test(hostile, d20b_unread_inline_gets_from_a_device_hold_only_the_quota)
{
  lent_gets_are_charged(L20_SIM_INLINE);
}

Test(hostile, d20b_unread_chunks_of_host_copies_hold_only_the_quota)
{
  lent_gets_are_charged(L20_HOST_CHUNKED);
}

Test(hostile, d20b_unread_chunks_from_a_device_hold_only_the_quota)
{
  lent_gets_are_charged(L20_SIM_CHUNKED);
}

/* One tenant's unread gets from a device cannot take the whole read-back
 * pool: with a 64 MiB pool, tenant lender leaves 32 inline gets of a 4 MiB
 * sim:0 tensor unread on two connections (128 MiB asked for), yet tenant
 * other's get from sim:0 is served.  Without a tenant's share of the pool,
 * lender's replies held every block until the send timeout and other's
 * get waited for one. */
Test(hostile, d20b_unread_gets_from_a_device_leave_the_pool_to_others)
{
  setenv("TPORT_READBACK_BYTES", "67108864", 1); /* before the pool is made */
  const size_t n = (size_t)4 << 20;
  server_config cfg;
  config(&cfg);
  cfg.tenant_quota_bytes = (size_t)1 << 30;
  cfg.chunk_bytes = n;
  cfg.send_timeout_ms = 60000; /* the replies stay unread for the whole test */
  char inproc[128], tcp[128];
  server *s = start_tcp(&cfg, inproc, sizeof inproc, tcp, sizeof tcp);
  tport_client *lender = svc_connect(inproc, L20_TENANT);
  tport_client *other = svc_connect(inproc, "other");
  tport_tensor_info a, b;
  q20_put(lender, TPORT_UINT8, 1, n, "sim:0", "dev", &a);
  q20_put(other, TPORT_UINT8, 1, n, "sim:0", "mine", &b);
  Tport__Ref ref;
  Tport__GetBeginRequest q;
  sp_get_begin(&q, &ref, "dev");
  int fds[2];
  for (int k = 0; k < 2; k++) {
    fds[k] = sp_connect_as(tcp, 4096, L20_TENANT);
    for (int i = 0; i < 16; i++)
      cr_assert(sp_send(fds[k], (uint32_t)i + 1, TPORT__METHOD__METHOD_GET_BEGIN, &q.base));
  }
  /* lender's gets take what the pool lends them (sampled: the most held) */
  size_t most = 0;
  for (int i = 0; i < 30; i++) {
    staging_stats st;
    staging_get_stats(staging_readback(), &st);
    most = st.bytes_in_use > most ? (size_t)st.bytes_in_use : most;
    usleep(50000);
  }
  cr_assert_geq(most, 2 * n, "lender's unread gets hold only %zu bytes of the pool", most);
  tport_client *probe = NULL;
  tport_connect_options o = {.tenant = "other", .timeout_ms = 5000};
  tport_err err;
  cr_assert_eq(tport_connect(inproc, &o, &probe, &err), 0, "%s", err.msg);
  uint8_t *back = malloc(n);
  int rc = tport_get(probe, &b.ref, back, n, NULL, NULL, NULL, &err);
  cr_assert_eq(rc, 0,
               "tenant other's get of 4 MiB from sim:0 while lender's unread gets hold %zu "
               "bytes of the 64 MiB read-back pool: %s (%s)",
               most, tport_strerror(rc), err.msg);
  free(back);
  close(fds[0]);
  close(fds[1]);
  tport_close(probe);
  tport_close(other);
  tport_close(lender);
  server_stop(s, 2000);
}

/* ================================================================ 20.9: frees outside the lock */

/* Issue 20, finding 9: the registry's lock was held while entries -- and
 * so large storages -- were freed (a Free, a disconnect, an expiry), and
 * ctx_cb needs that lock on nng's poller thread.  The test's hook runs as
 * each entry is freed and asks whether the freeing thread holds the lock:
 * a trylock that fails for 200 ms (no other holder keeps it that long) is
 * this thread's own. */
static atomic_int l9_frees, l9_locked;

static void l9_on_entry_free(registry *r)
{
  atomic_fetch_add(&l9_frees, 1);
  for (int i = 0; i < 200; i++) {
    if (pthread_mutex_trylock(&r->mu) == 0) {
      pthread_mutex_unlock(&r->mu);
      return;
    }
    usleep(1000);
  }
  atomic_fetch_add(&l9_locked, 1);
}

Test(hostile, d20i_entries_are_freed_outside_the_registry_lock)
{
  char url[128];
  server_config cfg;
  config(&cfg);
  cfg.ttl_s = 1; /* the named one expires */
  server *s = start(&cfg, url, sizeof url);
  reg_test_entry_free = l9_on_entry_free;
  tport_client *c = svc_connect(url, "t9");
  tport_tensor_info a, b, n;
  q20_put(c, TPORT_UINT8, 1, 4 << 20, "cpu", NULL, &a);   /* freed by Free */
  q20_put(c, TPORT_UINT8, 1, 4 << 20, "sim:0", NULL, &b); /* by the disconnect */
  q20_put(c, TPORT_UINT8, 1, 4 << 20, "cpu", "kept", &n); /* by its expiry */
  tport_err err;
  cr_assert_eq(tport_free(c, &a.ref, &err), 0, "free: %s", err.msg);
  tport_close(c);
  for (int i = 0; i < 50 && atomic_load(&l9_frees) < 3; i++)
    usleep(100000);
  cr_assert_geq(atomic_load(&l9_frees), 3, "%d of 3 entries were freed", atomic_load(&l9_frees));
  cr_assert_eq(atomic_load(&l9_locked), 0,
               "%d of %d entries were freed with the registry's lock held",
               atomic_load(&l9_locked), atomic_load(&l9_frees));
  reg_test_entry_free = NULL;
  server_stop(s, 1000);
}
