/* test_batch_runs.c: a put batch's alike elements as runs
 * (PutBatchRequest.runs, server/put_runs.h).  Through libtport: a batch of
 * several shapes, a named element among them, stored and read back exact,
 * its answer a fraction of the bytes of the same batch with runs off
 * (TPORT_PUT_RUNS=0), which gives the same results; an element of a run over
 * the tenant's quota fails alone.  By hand on the wire: a run whose middle
 * element's CRC32C is wrong (that element alone DATA_LOSS, the answer's
 * shape as PutRunReply says), and runs that cannot be, each refused as a
 * whole while the server goes on serving.  A run's elements past the
 * tenant's tensor limit, refused when the batch adds them together. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "crc32c.h"
#include "hostile_util.h"
#include "server_internal.h" /* the server's count of bytes answered */

#define WAIT_MS 30000

TestSuite(runs, .timeout = 120);

static tport_client *connect_plain(const char *url)
{
  tport_connect_options o = {.timeout_ms = WAIT_MS, .no_shm = true};
  tport_client *c;
  tport_err err;
  cr_assert_eq(tport_connect(url, &o, &c, &err), TPORT_OK, "%s", err.msg);
  return c;
}

/* ---------------------------------------------------------------- libtport */

enum { N = 620 };

/* Element i's dtype and shape: runs of several shapes (scalars among
 * them), with lone ones and a named one between them. */
static void shape_of(int i, tport_dtype *dt, int *ndim, int64_t sizes[2])
{
  *ndim = 1;
  if (i < 250 || i == 400 || i == 401) {
    *dt = TPORT_FLOAT32, *ndim = 2, sizes[0] = 16, sizes[1] = 16;
  } else if (i < 400) {
    *dt = TPORT_INT64, sizes[0] = 3;
  } else if (i == 402) {
    *dt = TPORT_FLOAT64, sizes[0] = 5;
  } else if (i < 410) {
    *dt = TPORT_FLOAT32, *ndim = 0; /* scalars */
  } else {
    *dt = TPORT_UINT8, sizes[0] = 4096;
  }
}

typedef struct mixed {
  tport_put_item items[N];
  int64_t sizes[N][2];
  uint8_t *data[N];
  tport_put_options named;
} mixed;

static mixed *mixed_make(void)
{
  mixed *m = calloc(1, sizeof *m);
  tport_put_options_init(&m->named);
  m->named.name = "runs/named";
  for (int i = 0; i < N; i++) {
    tport_dtype dt;
    int ndim;
    shape_of(i, &dt, &ndim, m->sizes[i]);
    size_t nbytes = (size_t)tport_dtype_size(dt);
    for (int d = 0; d < ndim; d++)
      nbytes *= (size_t)m->sizes[i][d];
    m->data[i] = malloc(nbytes);
    fill(m->data[i], nbytes, (unsigned)i + 1);
    m->items[i] = (tport_put_item){.dtype = dt,
                                   .ndim = ndim,
                                   .sizes = ndim ? m->sizes[i] : NULL,
                                   .data = m->data[i],
                                   .nbytes = nbytes,
                                   .opts = i == 250 ? &m->named : NULL};
  }
  return m;
}

static void mixed_free(mixed *m)
{
  for (int i = 0; i < N; i++)
    free(m->data[i]);
  free(m);
}

static int by_handle(const void *a, const void *b)
{
  return memcmp(a, b, TPORT_HANDLE_BYTES);
}

/* m's batch through c: each element stored as it was sent, its handle its
 * own; read back exact.  Returns the bytes the server answered the puts
 * with. */
static uint64_t put_mixed(server *s, tport_client *c, mixed *m)
{
  tport_err err;
  uint64_t before = atomic_load(&s->bytes_out);
  cr_assert_eq(tport_put_batch(c, m->items, N, &err), TPORT_OK, "%s", err.msg);
  uint64_t answered = atomic_load(&s->bytes_out) - before;
  uint8_t(*handles)[TPORT_HANDLE_BYTES] = calloc(N, TPORT_HANDLE_BYTES);
  tport_get_item *gets = calloc(N, sizeof *gets);
  for (int i = 0; i < N; i++) {
    const tport_put_item *it = &m->items[i];
    const tport_tensor_info *info = &it->info;
    cr_assert_eq(it->err.code, TPORT_OK, "element %d: %s", i, it->err.msg);
    cr_assert_eq(info->dtype, it->dtype, "element %d", i);
    cr_assert_eq(info->ndim, it->ndim, "element %d", i);
    for (int d = 0; d < it->ndim; d++)
      cr_assert_eq(info->sizes[d], it->sizes[d], "element %d, dim %d", i, d);
    cr_assert_eq(info->nbytes, (int64_t)it->nbytes, "element %d", i);
    cr_assert(info->is_contiguous, "element %d", i);
    cr_assert_str_eq(info->device, "cpu", "element %d", i);
    cr_assert_str_eq(info->ref.name, i == 250 ? m->named.name : "", "element %d", i);
    memcpy(handles[i], info->ref.handle, TPORT_HANDLE_BYTES);
    gets[i].ref = info->ref;
  }
  qsort(handles, N, TPORT_HANDLE_BYTES, by_handle);
  static const uint8_t zero[TPORT_HANDLE_BYTES];
  cr_assert_neq(memcmp(handles[0], zero, sizeof zero), 0, "an element has no handle");
  for (int i = 1; i < N; i++)
    cr_assert_neq(by_handle(handles[i - 1], handles[i]), 0, "two elements share a handle");
  cr_assert_eq(tport_get_batch(c, gets, N, &err), TPORT_OK, "%s", err.msg);
  for (int i = 0; i < N; i++) {
    cr_assert_eq(gets[i].nbytes, m->items[i].nbytes, "element %d", i);
    cr_assert_eq(memcmp(gets[i].data, m->data[i], gets[i].nbytes), 0, "element %d's bytes", i);
    free(gets[i].data);
  }
  free(gets);
  free(handles);
  return answered;
}

Test(runs, alike_elements_go_as_runs_and_come_back_exact)
{
  char url[128];
  server *s = start_default(url, sizeof url);
  mixed *m = mixed_make();
  tport_client *c = connect_plain(url);
  uint64_t with_runs = put_mixed(s, c, m);
  tport_close(c);
  /* the same batch, each element alone in its request (the named tensor
   * outlives its connection: the second one takes another name) */
  cr_assert_eq(setenv("TPORT_PUT_RUNS", "0", 1), 0);
  c = connect_plain(url);
  cr_assert_eq(unsetenv("TPORT_PUT_RUNS"), 0);
  m->named.name = "runs/named-again";
  uint64_t alone = put_mixed(s, c, m);
  /* 620 answers of a PutBeginReply each (~80 bytes) against a handle each
   * and an info a run */
  cr_assert_lt(with_runs * 2, alone, "runs answered in %llu bytes, alone in %llu",
               (unsigned long long)with_runs, (unsigned long long)alone);
  tport_close(c);
  mixed_free(m);
  server_stop(s, 1000);
}

Test(runs, an_element_of_a_run_over_the_quota_fails_alone)
{
  char url[128];
  server_config cfg;
  config(&cfg);
  cfg.tenant_quota_bytes = (size_t)1 << 20;
  server *s = start(&cfg, url, sizeof url);
  tport_client *c = connect_plain(url);
  /* 3000 bytes each: 21 a request (64 KiB chunks), the quota's end in the
   * middle of one */
  enum { K = 400, B = 3000 };
  static uint8_t data[K][B];
  static tport_put_item items[K];
  static int64_t n = B;
  for (int i = 0; i < K; i++) {
    fill(data[i], B, (unsigned)i);
    items[i] = (tport_put_item){
        .dtype = TPORT_UINT8, .ndim = 1, .sizes = &n, .data = data[i], .nbytes = B};
  }
  tport_err err;
  cr_assert_eq(tport_put_batch(c, items, K, &err), TPORT_RESOURCE_EXHAUSTED, "%s", err.msg);
  /* each request's elements are stored in their order: within one (21 a
   * request) those stored come before those refused */
  for (int g = 0; g < K; g += 21)
    for (int i = g + 1; i < g + 21 && i < K; i++)
      cr_assert(!(items[i].err.code == TPORT_OK && items[i - 1].err.code != TPORT_OK),
                "element %d stored after %d was refused", i, i - 1);
  int ok = 0, over = 0;
  for (int i = 0; i < K; i++) {
    if (items[i].err.code == TPORT_OK) {
      ok++;
      cr_assert_eq(items[i].info.nbytes, B, "element %d", i);
      uint8_t back[B];
      cr_assert_eq(tport_get(c, &items[i].info.ref, back, B, NULL, NULL, NULL, &err), TPORT_OK,
                   "element %d: %s", i, err.msg);
      cr_assert_eq(memcmp(back, data[i], B), 0, "element %d", i);
    } else {
      over++;
      cr_assert_eq(items[i].err.code, TPORT_RESOURCE_EXHAUSTED, "element %d: %s", i,
                   items[i].err.msg);
      cr_assert(strstr(items[i].err.msg, "quota") != NULL, "%s", items[i].err.msg);
    }
  }
  cr_assert_gt(ok, 0);
  cr_assert_gt(over, 0);
  cr_assert_leq((size_t)ok * B, (size_t)1 << 20, "%d stored", ok);
  tport_close(c);
  server_stop(s, 1000);
}

/* A run's plain elements join the registry together, after the batch's
 * copies (server/put_bulk.h); the tenant's tensor limit is checked there.
 * Past it each element fails alone, in order, its tensor and what it
 * reserved given back: the quota's every byte is still there for the
 * tenant's next put. */
Test(runs, a_run_past_the_tenants_tensor_limit_fails_from_there)
{
  char url[128];
  server_config cfg;
  config(&cfg);
  /* 50,000 bytes: one request (a chunk is 64 KiB).  Spread over several,
   * the requests are served side by side and which of them reaches the
   * limit first is a matter of timing (the quota test above). */
  enum { K = 100, B = 500, LIMIT = 40, QUOTA = 1 << 20 };
  cfg.max_tensors = LIMIT;
  cfg.tenant_quota_bytes = QUOTA;
  server *s = start(&cfg, url, sizeof url);
  tport_client *c = connect_plain(url);
  static uint8_t data[K][B];
  static tport_put_item items[K];
  static int64_t n = B;
  for (int i = 0; i < K; i++) {
    fill(data[i], B, (unsigned)i + 7);
    items[i] = (tport_put_item){
        .dtype = TPORT_UINT8, .ndim = 1, .sizes = &n, .data = data[i], .nbytes = B};
  }
  uint64_t bulk0 = s->reg.added_in_bulk;
  tport_err err;
  cr_assert_eq(tport_put_batch(c, items, K, &err), TPORT_RESOURCE_EXHAUSTED, "%s", err.msg);
  cr_assert_eq(s->reg.added_in_bulk - bulk0, LIMIT, "%llu added together, want %d",
               (unsigned long long)(s->reg.added_in_bulk - bulk0), LIMIT);
  for (int i = 0; i < K; i++) {
    if (i >= LIMIT) {
      cr_assert_eq(items[i].err.code, TPORT_RESOURCE_EXHAUSTED, "element %d: %s", i,
                   items[i].err.msg);
      cr_assert(strstr(items[i].err.msg, "its limit is 40") != NULL, "%s", items[i].err.msg);
      continue;
    }
    cr_assert_eq(items[i].err.code, TPORT_OK, "element %d: %s", i, items[i].err.msg);
    uint8_t back[B];
    cr_assert_eq(tport_get(c, &items[i].info.ref, back, B, NULL, NULL, NULL, &err), TPORT_OK,
                 "element %d: %s", i, err.msg);
    cr_assert_eq(memcmp(back, data[i], B), 0, "element %d", i);
  }
  /* one freed: the rest of the quota, to the byte, is the tenant's again */
  cr_assert_eq(tport_free(c, &items[0].info.ref, &err), TPORT_OK, "%s", err.msg);
  int64_t rest = QUOTA - (LIMIT - 1) * B;
  uint8_t *big = calloc(1, (size_t)rest + 1);
  int rc = tport_put(c, TPORT_UINT8, 1, (int64_t[]){rest + 1}, NULL, big, (size_t)rest + 1, NULL,
                     NULL, &err);
  cr_assert_eq(rc, TPORT_RESOURCE_EXHAUSTED, "a byte past the quota: %s", err.msg);
  rc = tport_put(c, TPORT_UINT8, 1, &rest, NULL, big, (size_t)rest, NULL, NULL, &err);
  cr_assert_eq(rc, TPORT_OK, "the quota's last %lld bytes: %s", (long long)rest, err.msg);
  free(big);
  tport_close(c);
  server_stop(s, 1000);
}

/* ---------------------------------------------------------------- by hand */

static Tport__TensorDesc desc_u8(int64_t *n)
{
  Tport__TensorDesc d = TPORT__TENSOR_DESC__INIT;
  d.dtype = TPORT__DTYPE__DTYPE_UINT8;
  d.n_sizes = 1;
  d.sizes = n;
  return d;
}

Test(runs, a_run_element_with_a_wrong_crc_fails_alone)
{
  char url[128];
  server *s = start_default(url, sizeof url);
  rawc r;
  raw_open(&r, url);
  int64_t n = 64;
  Tport__TensorDesc d = desc_u8(&n);
  Tport__PutBeginRequest p = TPORT__PUT_BEGIN_REQUEST__INIT;
  p.desc = &d;
  p.commit = true;
  p.crc32c_set = true;
  uint8_t payload[3 * 64];
  fill(payload, sizeof payload, 7);
  uint32_t crcs[3];
  for (int i = 0; i < 3; i++)
    crcs[i] = transport_crc32c(0, payload + 64 * i, 64);
  crcs[1] ^= 1;
  Tport__PutRun run = TPORT__PUT_RUN__INIT, *rp = &run;
  run.put = &p;
  run.count = 3;
  run.nbytes = 64;
  run.n_crc32c = 3;
  run.crc32c = crcs;
  Tport__PutBatchRequest q = TPORT__PUT_BATCH_REQUEST__INIT;
  q.n_runs = 1;
  q.runs = &rp;
  char msg[256];
  ProtobufCMessage *out = NULL;
  int code = raw_call(&r, TPORT__METHOD__METHOD_PUT_BATCH, &q.base, payload, sizeof payload,
                      &tport__put_batch_reply__descriptor, msg, &out, NULL);
  cr_assert_eq(code, TPORT_OK, "PutBatch: %d %s", code, msg);
  Tport__PutBatchReply *b = (Tport__PutBatchReply *)out;
  cr_assert_eq(b->n_puts, 0);
  cr_assert_eq(b->n_runs, 1);
  Tport__PutRunReply *rr = b->runs[0];
  cr_assert_eq(rr->handles.len, 3 * 16);
  cr_assert_not_null(rr->info);
  cr_assert_null(rr->info->ref, "a run's info leaves each element's ref to its handle");
  cr_assert_eq(rr->info->nbytes, 64);
  cr_assert_eq(rr->info->desc->n_sizes, 1);
  cr_assert_eq(rr->info->desc->sizes[0], 64);
  cr_assert_eq(rr->n_replied, 1);
  cr_assert_eq(rr->replied[0], 1);
  cr_assert_eq(rr->n_replies, 1);
  cr_assert_eq(rr->replies[0]->status->code, TPORT_DATA_LOSS, "%s",
               rr->replies[0]->status->message);
  static const uint8_t zero[16];
  cr_assert_eq(memcmp(rr->handles.data + 16, zero, 16), 0, "the failed one has no handle");
  for (int i = 0; i < 3; i += 2) {
    cr_assert_neq(memcmp(rr->handles.data + 16 * i, zero, 16), 0);
    raw_expect_bytes(&r, rr->handles.data + 16 * i, payload + 64 * i, 64, "a run's element");
  }
  protobuf_c_message_free_unpacked(out, NULL);
  raw_close(&r);
  server_stop(s, 1000);
}

/* A PutBatch of the run (with the payload) answered with code, its
 * message holding why. */
static void run_refused(rawc *r, Tport__PutRun *run, size_t nputs, const void *payload, size_t n,
                        const char *why, const char *what)
{
  Tport__PutBatchRequest q = TPORT__PUT_BATCH_REQUEST__INIT;
  static Tport__PutBeginRequest one = TPORT__PUT_BEGIN_REQUEST__INIT;
  static Tport__TensorDesc d = TPORT__TENSOR_DESC__INIT;
  one.desc = &d;
  one.commit = true;
  Tport__PutBeginRequest **puts = calloc(nputs ? nputs : 1, sizeof *puts);
  uint64_t *lens = calloc(nputs ? nputs : 1, sizeof *lens);
  for (size_t i = 0; i < nputs; i++)
    puts[i] = &one;
  q.n_puts = q.n_payload_bytes = nputs;
  q.puts = puts;
  q.payload_bytes = lens;
  q.n_runs = 1;
  q.runs = &run;
  char msg[256];
  int code = raw_call(r, TPORT__METHOD__METHOD_PUT_BATCH, &q.base, payload, n,
                      &tport__put_batch_reply__descriptor, msg, NULL, NULL);
  cr_expect_eq(code, TPORT_INVALID_ARGUMENT, "%s: %d %s", what, code, msg);
  cr_expect_neq(strstr(msg, why), NULL, "%s: '%s' lacks '%s'", what, msg, why);
  free(puts), free(lens);
}

Test(runs, runs_that_cannot_be_are_refused_whole)
{
  char url[128];
  server *s = start_default(url, sizeof url);
  rawc r;
  raw_open(&r, url);
  int64_t n8 = 8;
  Tport__TensorDesc d = desc_u8(&n8);
  uint8_t payload[64] = {0};
  uint64_t offs[2] = {0, 8};
  uint32_t crcs[2] = {0, 0};
  Tport__ShmSlice slice = TPORT__SHM_SLICE__INIT;
  slice.region = 1;
  slice.length = 8;
  static const struct {
    const char *what, *why;
    size_t nputs, n;
  } cases[] = {
      {"no put", "has no put", 0, 8},
      {"no elements", "has no elements", 0, 0},
      {"not committed", "commit at once", 0, 8},
      {"a name for many", "a name is one tensor's", 0, 8},
      {"offsets without a slice", "slice offsets", 0, 8},
      {"a slice short of offsets", "slice offsets", 0, 0},
      {"a slice with a payload", "carry no payload", 0, 0},
      {"CRCs short", "CRC32Cs", 0, 16},
      {"bytes past the payload", "pass the", 0, 8},
      {"bytes short of the payload", "add up to", 0, 64},
      {"lengths that overflow", "pass the", 0, 8},
      {"too many elements", "at most 4096", 0, 0},
      {"too many with the puts", "at most 4096", 4000, 0},
  };
  enum { NC = sizeof cases / sizeof cases[0] };
  Tport__PutRun runs[NC];
  Tport__PutBeginRequest puts[NC];
  for (size_t i = 0; i < NC; i++) {
    runs[i] = (Tport__PutRun)TPORT__PUT_RUN__INIT;
    puts[i] = (Tport__PutBeginRequest)TPORT__PUT_BEGIN_REQUEST__INIT;
    puts[i].desc = &d;
    puts[i].commit = true;
    runs[i].put = &puts[i];
    runs[i].count = 1;
    runs[i].nbytes = 8;
  }
  runs[0].put = NULL;
  runs[1].count = 0;
  puts[2].commit = false;
  puts[3].name = "one-name";
  runs[4].n_shm_offsets = 1, runs[4].shm_offsets = offs;
  puts[5].shm = &slice, runs[5].count = 2, runs[5].nbytes = 0;
  runs[5].n_shm_offsets = 1, runs[5].shm_offsets = offs;
  puts[6].shm = &slice, runs[6].n_shm_offsets = 1, runs[6].shm_offsets = offs;
  puts[7].crc32c_set = true, runs[7].count = 2, runs[7].n_crc32c = 1, runs[7].crc32c = crcs;
  runs[8].count = 2;
  runs[9].count = 2;
  runs[10].count = 3, runs[10].nbytes = UINT64_MAX / 2;
  runs[11].count = UINT32_MAX, runs[11].nbytes = 0;
  runs[12].count = 97, runs[12].nbytes = 0;
  for (size_t i = 0; i < NC; i++)
    run_refused(&r, &runs[i], cases[i].nputs, payload, cases[i].n, cases[i].why, cases[i].what);
  /* the server still serves, runs too */
  uint8_t v[8], hv[16];
  fill(v, 8, 1);
  raw_put(&r, v, 8, NULL, NULL, hv);
  raw_expect_bytes(&r, hv, v, 8, "after the refusals");
  Tport__PutRun ok = TPORT__PUT_RUN__INIT, *okp = &ok;
  Tport__PutBeginRequest p = TPORT__PUT_BEGIN_REQUEST__INIT;
  p.desc = &d;
  p.commit = true;
  ok.put = &p;
  ok.count = 2;
  ok.nbytes = 8;
  Tport__PutBatchRequest q = TPORT__PUT_BATCH_REQUEST__INIT;
  q.n_runs = 1;
  q.runs = &okp;
  char msg[256];
  ProtobufCMessage *out = NULL;
  fill(payload, 16, 9);
  cr_assert_eq(raw_call(&r, TPORT__METHOD__METHOD_PUT_BATCH, &q.base, payload, 16,
                        &tport__put_batch_reply__descriptor, msg, &out, NULL),
               TPORT_OK, "%s", msg);
  Tport__PutBatchReply *b = (Tport__PutBatchReply *)out;
  cr_assert_eq(b->n_runs, 1);
  cr_assert_eq(b->runs[0]->n_replied, 0);
  raw_expect_bytes(&r, b->runs[0]->handles.data + 16, payload + 8, 8, "a run after them");
  protobuf_c_message_free_unpacked(out, NULL);
  raw_close(&r);
  server_stop(s, 1000);
}
