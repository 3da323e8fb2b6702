/* test_batch.c: tport_put_batch and tport_get_batch against a server in
 * this process: a ResNet-sized state dict of 161 tensors round trip exact
 * (small ones batched, large ones alone, gets inline and deferred), and
 * errors per element beside good ones (a bad dtype, an element over the
 * tenant's quota, a name that does not exist), the small elements of a
 * state dict sharing requests between the large ones lent alone, and a
 * DLPack batch get into the buffers libtport keeps. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "get_blocks.h"      /* the kept get buffers a DLPack batch draws on */
#include "server_internal.h" /* the server's count of requests by method */
#include "service_util.h"

#define WAIT_MS 30000

static server *srv;
static char url[256];

static void start(void)
{
  server_config cfg;
  svc_config(&cfg);
  cfg.tenant_quota_bytes = (size_t)64 << 20;
  srv = svc_start_with(&cfg, url, sizeof url);
}

static void stop(void)
{
  server_stop(srv, 1000);
}

static tport_client *connect_plain(void)
{
  tport_connect_options o = {.timeout_ms = WAIT_MS, .no_shm = true};
  tport_client *c;
  tport_err err;
  cr_assert_eq(tport_connect(url, &o, &c, &err), TPORT_OK, "%s", err.msg);
  return c;
}

TestSuite(batch, .init = start, .fini = stop, .timeout = 120);

/* 161 float32 tensors: mostly small (biases, norms), some of several
 * chunks (the tests' server has 64 KiB chunks), one over 256 KiB. */
static size_t numel_of(int i)
{
  if (i % 40 == 0)
    return 80000; /* 320 KB: goes alone */
  if (i % 7 == 0)
    return 20000; /* 80 KB: batched put, deferred get (over a chunk) */
  return 1 + (size_t)(i * 37 % 900);
}

Test(batch, state_dict_of_161_round_trip_exact)
{
  tport_client *c = connect_plain();
  enum { N = 161 };
  tport_put_item *puts = calloc(N, sizeof *puts);
  tport_get_item *gets = calloc(N, sizeof *gets);
  float **vals = calloc(N, sizeof *vals);
  int64_t *sizes = calloc(N, sizeof *sizes);
  tport_put_options *opts = calloc(N, sizeof *opts);
  char(*names)[32] = calloc(N, sizeof *names);
  for (int i = 0; i < N; i++) {
    size_t n = numel_of(i);
    vals[i] = malloc(n * sizeof(float));
    for (size_t j = 0; j < n; j++)
      vals[i][j] = (float)i + (float)j / 1024.0f;
    sizes[i] = (int64_t)n;
    snprintf(names[i], sizeof names[i], "sd/layer%d.weight", i);
    tport_put_options_init(&opts[i]);
    opts[i].name = names[i];
    puts[i] = (tport_put_item){.dtype = TPORT_FLOAT32,
                               .ndim = 1,
                               .sizes = &sizes[i],
                               .data = vals[i],
                               .nbytes = n * sizeof(float),
                               .opts = &opts[i]};
  }
  tport_err err;
  cr_assert_eq(tport_put_batch(c, puts, N, &err), TPORT_OK, "%s", err.msg);
  for (int i = 0; i < N; i++) {
    cr_assert_eq(puts[i].err.code, TPORT_OK);
    cr_assert_eq(puts[i].info.sizes[0], sizes[i]);
    cr_assert_str_eq(puts[i].info.ref.name, names[i]);
    tport_ref_name(&gets[i].ref, names[i]);
    if (i % 2) { /* half into the caller's buffers, half allocated */
      gets[i].buf = calloc(1, puts[i].nbytes);
      gets[i].cap = puts[i].nbytes;
    }
  }
  cr_assert_eq(tport_get_batch(c, gets, N, &err), TPORT_OK, "%s", err.msg);
  for (int i = 0; i < N; i++) {
    cr_assert_eq(gets[i].err.code, TPORT_OK, "%d: %s", i, gets[i].err.msg);
    cr_assert_eq(gets[i].nbytes, puts[i].nbytes, "element %d", i);
    cr_assert_eq(memcmp(gets[i].data, vals[i], gets[i].nbytes), 0, "element %d", i);
    cr_assert_eq(gets[i].info.dtype, TPORT_FLOAT32);
    cr_assert(gets[i].buf == NULL || gets[i].data == gets[i].buf);
    if (!gets[i].buf)
      free(gets[i].data);
    free(vals[i]);
  }
  /* the same as requests */
  tport_request *r;
  cr_assert_eq(tport_get_batch_async(c, gets, N, NULL, NULL, &r, &err), TPORT_OK);
  cr_assert_eq(tport_wait(r, WAIT_MS, &err), TPORT_OK, "%s", err.msg);
  tport_request_free(r);
  for (int i = 0; i < N; i++) {
    cr_assert_eq(gets[i].nbytes, puts[i].nbytes);
    if (!gets[i].buf)
      free(gets[i].data);
    free(gets[i].buf);
  }
  tport_close(c);
  free(puts), free(gets), free(vals), free(sizes), free(opts), free(names);
}

Test(batch, errors_per_element)
{
  tport_client *c = connect_plain();
  static float small[16], big[32 << 20]; /* big: 128 MiB, over the 64 MiB quota */
  int64_t s16[1] = {16}, sbig[1] = {32 << 20};
  tport_put_item puts[5] = {
      {.dtype = TPORT_FLOAT32, .ndim = 1, .sizes = s16, .data = small, .nbytes = sizeof small},
      {.dtype = (tport_dtype)99, .ndim = 1, .sizes = s16, .data = small, .nbytes = sizeof small},
      {.dtype = TPORT_FLOAT32, .ndim = 1, .sizes = sbig, .data = big, .nbytes = sizeof big},
      {.dtype = TPORT_FLOAT32, .ndim = 1, .sizes = s16, .data = small, .nbytes = 8}, /* short */
      {.dtype = TPORT_FLOAT32, .ndim = 1, .sizes = s16, .data = small, .nbytes = sizeof small},
  };
  for (int i = 0; i < 16; i++)
    small[i] = (float)i;
  tport_err err;
  int rc = tport_put_batch(c, puts, 5, &err);
  cr_assert_eq(rc, TPORT_INVALID_ARGUMENT, "the first failure's: %s", err.msg);
  cr_assert(strstr(err.msg, "3 of 5") != NULL, "%s", err.msg);
  cr_assert_eq(puts[0].err.code, TPORT_OK);
  cr_assert_eq(puts[1].err.code, TPORT_INVALID_ARGUMENT, "%s", puts[1].err.msg);
  cr_assert_eq(puts[2].err.code, TPORT_RESOURCE_EXHAUSTED, "%s", puts[2].err.msg);
  cr_assert_neq(puts[3].err.code, TPORT_OK);
  cr_assert_eq(puts[4].err.code, TPORT_OK);
  /* gets: the two stored, and a name that is not there */
  tport_get_item gets[3] = {{.ref = puts[0].info.ref}, {.ref = puts[4].info.ref}};
  tport_ref_name(&gets[2].ref, "no-such-tensor");
  float back[16];
  gets[1].buf = back;
  gets[1].cap = sizeof back;
  rc = tport_get_batch(c, gets, 3, &err);
  cr_assert_eq(rc, TPORT_NOT_FOUND, "%s", err.msg);
  cr_assert_eq(gets[0].err.code, TPORT_OK);
  cr_assert_eq(memcmp(gets[0].data, small, sizeof small), 0);
  free(gets[0].data);
  cr_assert_eq(gets[1].err.code, TPORT_OK);
  cr_assert_eq(memcmp(back, small, sizeof small), 0);
  cr_assert_eq(gets[2].err.code, TPORT_NOT_FOUND);
  cr_assert_null(gets[2].data);
  /* a buffer too small for its tensor fails that element only */
  float tiny[2];
  tport_get_item two[2] = {{.ref = puts[0].info.ref, .buf = tiny, .cap = sizeof tiny},
                           {.ref = puts[4].info.ref, .buf = back, .cap = sizeof back}};
  cr_assert_eq(tport_get_batch(c, two, 2, &err), TPORT_OUT_OF_RANGE, "%s", err.msg);
  cr_assert_eq(two[1].err.code, TPORT_OK);
  tport_close(c);
}

Test(batch, empty_batches)
{
  tport_client *c = connect_plain();
  tport_err err;
  cr_assert_eq(tport_put_batch(c, NULL, 0, &err), TPORT_OK);
  cr_assert_eq(tport_get_batch(c, NULL, 0, &err), TPORT_OK);
  tport_close(c);
}

/* A state dict alternates a convolution's weight, large enough to be lent
 * to a request, with its norm's small vectors.  Those small ones share
 * requests whatever their order in the batch (one small group cut between
 * each two lent ones, before: 32 requests), and the lent ones share them
 * too, up to four a request within its 1 MiB (one a request, before: 17):
 * 16 of 300 KB and 16 small go in 6. */
Test(batch, small_elements_between_lent_ones_share_requests)
{
  server_config cfg;
  svc_config(&cfg);
  cfg.chunk_bytes = (size_t)1 << 20; /* a 300 KB element rides in a batch, lent */
  char ipc[256];
  svc_ipc_url(ipc, sizeof ipc);
  free(cfg.listen[0]);
  cfg.listen[0] = strdup(ipc);
  cfg.nlisten = 1;
  server *s;
  tport_err err;
  cr_assert_eq(server_start(&cfg, &s, &err), 0, "%s", err.msg);
  config_free(&cfg);
  tport_connect_options o = {.timeout_ms = WAIT_MS, .no_shm = true};
  tport_client *c;
  cr_assert_eq(tport_connect(ipc, &o, &c, &err), TPORT_OK, "%s", err.msg);

  enum { PAIRS = 16, BIG = 75000, SMALL = 16 }; /* floats: 300 KB and 64 bytes */
  tport_put_item puts[2 * PAIRS];
  int64_t sizes[2 * PAIRS];
  float *vals[2 * PAIRS];
  for (int i = 0; i < 2 * PAIRS; i++) {
    size_t n = i % 2 ? SMALL : BIG;
    vals[i] = malloc(n * sizeof(float));
    for (size_t j = 0; j < n; j++)
      vals[i][j] = (float)i * 1000.0f + (float)j;
    sizes[i] = (int64_t)n;
    puts[i] = (tport_put_item){.dtype = TPORT_FLOAT32,
                               .ndim = 1,
                               .sizes = &sizes[i],
                               .data = vals[i],
                               .nbytes = n * sizeof(float)};
  }
  uint64_t before = atomic_load(&s->requests[TPORT__METHOD__METHOD_PUT_BATCH]);
  cr_assert_eq(tport_put_batch(c, puts, 2 * PAIRS, &err), TPORT_OK, "%s", err.msg);
  /* counted on arrival: every one arrived before its reply */
  uint64_t requests = atomic_load(&s->requests[TPORT__METHOD__METHOD_PUT_BATCH]) - before;
  cr_assert_leq(requests, 6, "%llu PutBatch requests for %d lent and %d small elements",
                (unsigned long long)requests, PAIRS, PAIRS);
  /* each element's result is its own, in its own slot */
  tport_get_item gets[2 * PAIRS];
  memset(gets, 0, sizeof gets);
  for (int i = 0; i < 2 * PAIRS; i++) {
    cr_assert_eq(puts[i].err.code, TPORT_OK, "%d: %s", i, puts[i].err.msg);
    cr_assert_eq(puts[i].info.sizes[0], sizes[i], "element %d", i);
    gets[i].ref = puts[i].info.ref;
  }
  cr_assert_eq(tport_get_batch(c, gets, 2 * PAIRS, &err), TPORT_OK, "%s", err.msg);
  for (int i = 0; i < 2 * PAIRS; i++) {
    cr_assert_eq(gets[i].nbytes, puts[i].nbytes, "element %d", i);
    cr_assert_eq(memcmp(gets[i].data, vals[i], gets[i].nbytes), 0, "element %d", i);
    free(gets[i].data);
    free(vals[i]);
  }
  tport_close(c);
  server_stop(s, 1000);
}

/* tport_get_batch_dlpack: the elements without a buffer get one of the
 * buffers libtport keeps for its gets (get_blocks.h), each handed over as a
 * DLManagedTensor; once their deleters ran, the next state dict's get finds
 * them again (no fresh memory), each time with the new values whole.  An
 * element with a buffer of its own and one that fails get none. */
Test(batch, a_dlpack_batch_get_hands_over_kept_buffers)
{
  tport_client *c = connect_plain();
  enum { N = 6 };
  /* two of several MiB (kept blocks; deferred, each a get of its own), one
   * over a chunk, small ones inline */
  static const size_t bytes[N] = {(size_t)3 << 20, 100000, 4096, (size_t)2 << 20, 12, 40000};
  uint8_t *vals[2][N];
  int64_t sizes[N];
  tport_put_item puts[N];
  tport_tensor_info info[2][N];
  tport_err err;
  for (int round = 0; round < 2; round++) {
    for (int i = 0; i < N; i++) {
      vals[round][i] = malloc(bytes[i]);
      for (size_t j = 0; j < bytes[i]; j++)
        vals[round][i][j] = (uint8_t)(j * 31 + (size_t)i * 7 + (size_t)round * 101);
      sizes[i] = (int64_t)bytes[i];
      puts[i] = (tport_put_item){.dtype = TPORT_UINT8,
                                 .ndim = 1,
                                 .sizes = &sizes[i],
                                 .data = vals[round][i],
                                 .nbytes = bytes[i]};
    }
    cr_assert_eq(tport_put_batch(c, puts, N, &err), TPORT_OK, "%s", err.msg);
    for (int i = 0; i < N; i++)
      info[round][i] = puts[i].info;
  }
  get_blocks_empty();
  block_cache_stats st0, st1;
  get_blocks_get_stats(&st0);
  uint8_t own[12];
  for (int round = 0; round < 2; round++) {
    tport_get_item gets[N + 1];
    DLManagedTensor *out[N + 1];
    memset(gets, 0, sizeof gets);
    for (int i = 0; i < N; i++)
      gets[i].ref = info[round][i].ref;
    gets[4].buf = own; /* a buffer of the caller's: no DLManagedTensor */
    gets[4].cap = sizeof own;
    tport_ref_name(&gets[N].ref, "no-such-tensor");
    if (round == 0) {
      cr_assert_eq(tport_get_batch_dlpack(c, gets, N + 1, out, &err), TPORT_NOT_FOUND, "%s",
                   err.msg);
    } else { /* the same as a request */
      tport_request *r;
      cr_assert_eq(tport_get_batch_dlpack_async(c, gets, N + 1, out, NULL, NULL, &r, &err),
                   TPORT_OK, "%s", err.msg);
      cr_assert_eq(tport_wait(r, WAIT_MS, &err), TPORT_NOT_FOUND, "%s", err.msg);
      tport_request_free(r);
    }
    cr_assert_eq(gets[N].err.code, TPORT_NOT_FOUND);
    cr_assert_null(out[N], "a failed element hands over nothing");
    cr_assert_null(out[4], "nor one into the caller's buffer");
    cr_assert_eq(memcmp(own, vals[round][4], sizeof own), 0);
    for (int i = 0; i < N; i++) {
      cr_assert_eq(gets[i].err.code, TPORT_OK, "%d: %s", i, gets[i].err.msg);
      if (i == 4)
        continue;
      cr_assert_not_null(out[i], "element %d", i);
      const DLTensor *t = &out[i]->dl_tensor;
      cr_assert_eq(t->data, gets[i].data, "element %d's data is its DLManagedTensor's", i);
      cr_assert_eq(t->device.device_type, kDLCPU);
      cr_assert_eq(t->ndim, 1);
      cr_assert_eq(t->shape[0], sizes[i]);
      cr_assert_eq(t->dtype.code, kDLUInt);
      cr_assert_eq(t->dtype.bits, 8);
      cr_assert_null(t->strides);
      cr_assert_eq(memcmp(t->data, vals[round][i], bytes[i]), 0, "round %d, element %d", round,
                   i);
    }
    for (int i = 0; i < N; i++)
      if (out[i])
        out[i]->deleter(out[i]);
  }
  get_blocks_get_stats(&st1);
  cr_assert_eq(st1.misses - st0.misses, 2, "the two large buffers mapped once");
  cr_assert_eq(st1.hits - st0.hits, 2, "and found again by the second state dict");
  cr_assert_eq(st1.in_use_bytes, st0.in_use_bytes, "every deleter gave its buffer back");
  /* out is required (a slot per element) */
  tport_get_item one = {.ref = info[0][0].ref};
  cr_assert_eq(tport_get_batch_dlpack(c, &one, 1, NULL, &err), TPORT_INVALID_ARGUMENT);
  tport_request *r = NULL;
  cr_assert_eq(tport_get_batch_dlpack_async(c, &one, 1, NULL, NULL, NULL, &r, &err),
               TPORT_INVALID_ARGUMENT);
  cr_assert_null(r);
  for (int round = 0; round < 2; round++)
    for (int i = 0; i < N; i++)
      free(vals[round][i]);
  tport_close(c);
}

/* A batch request cancelled before it ran leaves its elements saying so,
 * and out[] without the caller's old pointers: a caller that reuses its
 * arrays must never delete a DLManagedTensor twice.  Issued and cancelled
 * at once, many times: some are cancelled before they start, some during,
 * some complete; every outcome must hold. */
Test(batch, a_cancelled_dlpack_batch_leaves_no_stale_results)
{
  tport_client *c = connect_plain();
  enum { N = 3 };
  static const size_t bytes[N] = {(size_t)1 << 20, 300, 70000};
  uint8_t *vals[N];
  int64_t sizes[N];
  tport_put_item puts[N];
  tport_err err;
  for (int i = 0; i < N; i++) {
    vals[i] = malloc(bytes[i]);
    memset(vals[i], 'a' + i, bytes[i]);
    sizes[i] = (int64_t)bytes[i];
    puts[i] = (tport_put_item){
        .dtype = TPORT_UINT8, .ndim = 1, .sizes = &sizes[i], .data = vals[i], .nbytes = bytes[i]};
  }
  cr_assert_eq(tport_put_batch(c, puts, N, &err), TPORT_OK, "%s", err.msg);
  DLManagedTensor *const stale = (DLManagedTensor *)(uintptr_t)0x1;
  int before_start = 0;
  for (int round = 0; round < 40; round++) {
    tport_get_item gets[N];
    DLManagedTensor *out[N] = {stale, stale, stale};
    memset(gets, 0, sizeof gets);
    for (int i = 0; i < N; i++) {
      gets[i].ref = puts[i].info.ref;
      gets[i].data = stale; /* the last round's, as a caller might leave it */
      tport_err_clear(&gets[i].err);
    }
    tport_request *r;
    cr_assert_eq(tport_get_batch_dlpack_async(c, gets, N, out, NULL, NULL, &r, &err), TPORT_OK,
                 "%s", err.msg);
    tport_cancel(r);
    int rc = tport_wait(r, WAIT_MS, &err);
    tport_request_free(r);
    for (int i = 0; i < N; i++) {
      cr_assert_neq(out[i], stale, "round %d (status %d), element %d: the caller's old pointer",
                    round, rc, i);
      cr_assert_neq(gets[i].data, (void *)stale, "round %d, element %d", round, i);
      if (gets[i].err.code == TPORT_OK) {
        cr_assert_not_null(out[i]);
        cr_assert_eq(memcmp(out[i]->dl_tensor.data, vals[i], bytes[i]), 0);
      } else {
        cr_assert_null(out[i], "round %d: a failed element hands over nothing", round);
        cr_assert_eq(gets[i].err.code, TPORT_CANCELLED, "round %d: %s", round, gets[i].err.msg);
        before_start += strstr(gets[i].err.msg, "before it started") != NULL;
      }
      if (out[i])
        out[i]->deleter(out[i]);
    }
  }
  cr_log_info("elements cancelled before their request started: %d of %d", before_start,
              40 * N);
  for (int i = 0; i < N; i++)
    free(vals[i]);
  tport_close(c);
}

/* A batch in requests of a MiB and more (the server's default 4 MiB chunks),
 * whose elements' bytes tportd writes with streaming stores
 * (memcpy_stream): 2,000 elements of an odd size, so that the payload's
 * elements lie at every alignment, come back exact. */
Test(batch, elements_of_large_requests_come_back_exact)
{
  server_config cfg;
  svc_config(&cfg);
  cfg.chunk_bytes = (size_t)4 << 20;
  char big_url[256];
  server *s = svc_start_with(&cfg, big_url, sizeof big_url);
  tport_connect_options o = {.timeout_ms = WAIT_MS, .no_shm = true};
  tport_client *c;
  tport_err err;
  cr_assert_eq(tport_connect(big_url, &o, &c, &err), TPORT_OK, "%s", err.msg);
  enum { K = 2000, B = 4099 };
  static int64_t n = B;
  uint8_t *data = malloc((size_t)K * B);
  tport_put_item *items = calloc(K, sizeof *items);
  for (size_t i = 0; i < (size_t)K * B; i++)
    data[i] = (uint8_t)(i * 131 + (i >> 12));
  for (int i = 0; i < K; i++)
    items[i] = (tport_put_item){.dtype = TPORT_UINT8,
                                .ndim = 1,
                                .sizes = &n,
                                .data = data + (size_t)i * B,
                                .nbytes = B};
  uint64_t before = atomic_load(&s->requests[TPORT__METHOD__METHOD_PUT_BATCH]);
  cr_assert_eq(tport_put_batch(c, items, K, &err), TPORT_OK, "%s", err.msg);
  int64_t requests = (int64_t)(atomic_load(&s->requests[TPORT__METHOD__METHOD_PUT_BATCH]) - before);
  /* what makes tportd stream: requests of BATCH_STREAM_MIN_BYTES (512 KiB) */
  cr_assert(requests > 0 && (int64_t)K * B / requests >= 512 << 10,
            "%lld requests for %d bytes: too small to stream", (long long)requests, K * B);
  tport_get_item *gets = calloc(K, sizeof *gets);
  for (int i = 0; i < K; i++)
    gets[i].ref = items[i].info.ref;
  cr_assert_eq(tport_get_batch(c, gets, K, &err), TPORT_OK, "%s", err.msg);
  for (int i = 0; i < K; i++) {
    cr_assert_eq(gets[i].nbytes, (size_t)B, "element %d", i);
    cr_assert_eq(memcmp(gets[i].data, data + (size_t)i * B, B), 0, "element %d's bytes", i);
    free(gets[i].data);
  }
  free(gets);
  free(items);
  free(data);
  tport_close(c);
  server_stop(s, 1000);
}
