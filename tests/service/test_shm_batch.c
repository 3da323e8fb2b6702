/*
 * test_shm_batch.c: on the same host, a put batch's small elements go
 * through the automatic region (client/batch_region.h): each group in
 * flight copies its elements' bytes into a slot of the region and names
 * them by slices.  Checked on the real server in this process: every
 * element's bytes exact -- more groups than slots, so that slots are
 * reused, conversions, strides, with and without verify -- and that the
 * server read them from the region (its shm_transfers count them); a
 * small batch and a client without shared memory stay on the socket.
 * Where tportd can read the client's memory it reads such elements there
 * instead (test_shm_process.c): these tests keep to the region
 * (TPORT_SHM_DIRECT=0), as a client in a container of its own would.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_internal.h"
#include "get_direct.h"
#include "service_util.h"

static char sock_dir[64];

static server *start(char *url, size_t len, size_t chunk)
{
  setenv("TPORT_SHM_DIRECT", "0", 1); /* (read by tport_connect) */
  server_config cfg;
  svc_config_shm(&cfg, "shmb", sock_dir, sizeof sock_dir);
  cfg.chunk_bytes = chunk;
  return svc_start_with(&cfg, url, len);
}

static void stop(server *s)
{
  server_stop(s, 0);
  rmdir(sock_dir);
}

static tport_client *connect_with(const char *url, bool verify, bool no_shm)
{
  tport_client *c;
  tport_err err;
  tport_connect_options o = {.timeout_ms = 20000, .verify = verify, .no_shm = no_shm};
  cr_assert_eq(tport_connect(url, &o, &c, &err), 0, "connect %s: %s", url, err.msg);
  return c;
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
  uint32_t x = seed * 2654435761u + 7;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    p[i] = (uint8_t)(x >> 24);
  }
}

/* n float32 elements of each's floats, element i's values its own; every
 * third a [each/4, 4] transposed view (strides 1, each/4), every fifth
 * converted to float64 on the way.  Puts them as one batch, then reads each
 * back and compares with what the put asked for. */
static void round_trip(tport_client *c, size_t n, size_t each)
{
  float *v = malloc(n * each * sizeof(float));
  tport_put_item *items = calloc(n, sizeof *items);
  tport_put_options *opts = calloc(n, sizeof *opts);
  int64_t flat[1] = {(int64_t)each}, mat[2] = {(int64_t)each / 4, 4},
          tstrides[2] = {1, (int64_t)each / 4};
  fill((uint8_t *)v, n * each * sizeof(float), (uint32_t)n);
  for (size_t i = 0; i < n * each; i++)
    v[i] = (float)(((uint8_t *)v)[i] % 200) - 100.0f + (float)i * 0.5f;
  for (size_t i = 0; i < n; i++) {
    tport_put_options_init(&opts[i]);
    if (i % 5 == 0) {
      opts[i].has_dtype = true;
      opts[i].dtype = TPORT_FLOAT64;
    }
    bool t = i % 3 == 0;
    items[i] = (tport_put_item){.dtype = TPORT_FLOAT32,
                                .ndim = t ? 2 : 1,
                                .sizes = t ? mat : flat,
                                .strides = t ? tstrides : NULL,
                                .data = v + i * each,
                                .nbytes = each * sizeof(float),
                                .opts = &opts[i]};
  }
  tport_err err;
  cr_assert_eq(tport_put_batch(c, items, n, &err), 0, "%s", err.msg);
  double *back = malloc(each * sizeof(double));
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(items[i].err.code, 0, "element %zu: %s", i, items[i].err.msg);
    tport_tensor_info info;
    size_t bytes = each * (i % 5 == 0 ? sizeof(double) : sizeof(float));
    cr_assert_eq(tport_get(c, &items[i].info.ref, back, bytes, &info, NULL, NULL, &err), 0,
                 "element %zu: %s", i, err.msg);
    /* the values in logical (row-major) order of what was put */
    bool t = i % 3 == 0;
    const float *src = v + i * each;
    for (size_t k = 0; k < each; k++) {
      float want = t ? src[(k % 4) * (each / 4) + k / 4] : src[k];
      float got = i % 5 == 0 ? (float)back[k] : ((const float *)back)[k];
      cr_assert(got == want, "element %zu value %zu: %g, put %g", i, k, got, want);
    }
  }
  free(back);
  free(v);
  free(items);
  free(opts);
}

Test(shm_batch, small_elements_go_through_the_region_exact)
{
  char url[96];
  server *s = start(url, sizeof url, (size_t)64 << 10);
  /* 64 KiB chunks: groups of 16 elements of 4 KiB, 40 groups through 8
   * slots (the window) and back */
  for (int verify = 0; verify < 2; verify++) {
    tport_client *c = connect_with(url, verify, false);
    int64_t before = svc_server_counter(url, "shm_transfers");
    round_trip(c, 640, 1024);
    int64_t after = svc_server_counter(url, "shm_transfers");
    /* 640 from the region (the gets of 4 KiB are not offered it) */
    cr_assert_eq(after - before, 640, "%lld of 640 elements came through the region (verify %d)",
                 (long long)(after - before), verify);
    tport_close(c);
  }
  stop(s);
}

Test(shm_batch, a_group_as_large_as_a_chunk_and_the_slots_reused)
{
  char url[96];
  server *s = start(url, sizeof url, (size_t)1 << 20);
  tport_client *c = connect_with(url, false, false);
  /* 1 MiB chunks: groups of 256 x 4 KiB, 12 groups (more than the slots) */
  int64_t before = svc_server_counter(url, "shm_transfers");
  round_trip(c, 3000, 1024);
  cr_assert_eq(svc_server_counter(url, "shm_transfers") - before, 3000);
  /* the region stays the client's for what comes next */
  cr_assert_not_null(c->shm_cache);
  tport_close(c);
  stop(s);
}

Test(shm_batch, a_small_batch_and_a_client_without_shm_use_the_socket)
{
  char url[96];
  server *s = start(url, sizeof url, (size_t)1 << 20);
  tport_client *c = connect_with(url, false, false);
  int64_t before = svc_server_counter(url, "shm_transfers");
  round_trip(c, 10, 256); /* 10 KiB in all: no region made for it */
  cr_assert_eq(svc_server_counter(url, "shm_transfers"), before);
  cr_assert_null(c->shm_cache, "a region was made for a batch of 10 KiB");
  tport_close(c);
  c = connect_with(url, false, true);
  round_trip(c, 640, 1024);
  cr_assert_eq(svc_server_counter(url, "shm_transfers"), before);
  tport_close(c);
  stop(s);
}

/* Elements of no bytes (data NULL) among the ones in the region ride as
 * the socket would carry them (no slice of nothing); all come back. */
Test(shm_batch, empty_elements_among_them)
{
  char url[96];
  server *s = start(url, sizeof url, (size_t)1 << 20);
  tport_client *c = connect_with(url, false, false);
  enum { K = 100, EACH = 4096 };
  uint8_t *v = malloc((size_t)K * EACH), *back = malloc(EACH);
  fill(v, (size_t)K * EACH, 5);
  int64_t each = EACH, none = 0;
  tport_put_item items[K];
  for (int i = 0; i < K; i++)
    items[i] = (tport_put_item){.dtype = TPORT_UINT8,
                                .ndim = 1,
                                .sizes = i % 10 == 3 ? &none : &each,
                                .data = i % 10 == 3 ? NULL : v + (size_t)i * EACH,
                                .nbytes = i % 10 == 3 ? 0 : EACH};
  int64_t before = svc_server_counter(url, "shm_transfers");
  tport_err err;
  cr_assert_eq(tport_put_batch(c, items, K, &err), 0, "%s", err.msg);
  cr_assert_eq(svc_server_counter(url, "shm_transfers") - before, K - K / 10);
  for (int i = 0; i < K; i++) {
    tport_tensor_info info;
    cr_assert_eq(tport_get(c, &items[i].info.ref, back, EACH, &info, NULL, NULL, &err), 0,
                 "element %d: %s", i, err.msg);
    cr_assert_eq(info.nbytes, (int64_t)items[i].nbytes);
    cr_assert(i % 10 == 3 || memcmp(back, v + (size_t)i * EACH, EACH) == 0, "element %d", i);
  }
  free(v);
  free(back);
  tport_close(c);
  stop(s);
}

/* ---------------------------------------------------------------- gets */

/* Puts n tensors of each bytes (values from seed) by a client without
 * shared memory; their refs into refs. */
static uint8_t *put_n(tport_client *c, size_t n, size_t each, tport_ref *refs)
{
  uint8_t *v = malloc(n * each);
  fill(v, n * each, (uint32_t)(n + each));
  int64_t sz = (int64_t)each;
  for (size_t i = 0; i < n; i++) {
    tport_tensor_info info;
    tport_err err;
    cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &sz, NULL, v + i * each, each, NULL, &info, &err), 0,
                 "%s", err.msg);
    refs[i] = info.ref;
  }
  return v;
}

/* A get batch of the n refs into fresh buffers: every element exact. */
static void get_all(tport_client *c, size_t n, size_t each, const tport_ref *refs, const uint8_t *v)
{
  tport_get_item *items = calloc(n, sizeof *items);
  uint8_t *into = malloc(n * each);
  memset(into, 0xee, n * each);
  for (size_t i = 0; i < n; i++)
    items[i] = (tport_get_item){.ref = refs[i], .buf = into + i * each, .cap = each};
  tport_err err;
  cr_assert_eq(tport_get_batch(c, items, n, &err), 0, "%s", err.msg);
  for (size_t i = 0; i < n; i++) {
    cr_assert_eq(items[i].nbytes, each, "element %zu", i);
    cr_assert(memcmp(into + i * each, v + i * each, each) == 0, "element %zu's bytes", i);
  }
  free(items);
  free(into);
}

/* 1 MiB chunks: of 40 tensors of 200 KB the GetBatch answers five inline
 * (a chunk of reply) and defers the rest, read in GetBatches of four; on
 * the same host those are written into slots of the region, once it holds
 * them (the first batch wants it that large, the next makes it: a fresh
 * region's pages cost more than the socket's copies, and a client that
 * never comes back would have made one for nothing). */
Test(shm_batch, deferred_gets_are_written_into_the_region)
{
  enum { K = 40, EACH = 200000 };
  char url[96];
  server *s = start(url, sizeof url, (size_t)1 << 20);
  tport_client *p = connect_with(url, false, true);
  tport_ref refs[K];
  uint8_t *v = put_n(p, K, EACH, refs);
  for (int verify = 0; verify < 2; verify++) {
    tport_client *c = connect_with(url, verify, false);
    /* the same tenant's tensors: this client may read them by ref */
    /* no region yet: by the socket, and wanted for the next (made then) */
    int64_t before = svc_server_counter(url, "shm_transfers");
    get_all(c, K, EACH, refs, v);
    cr_assert_eq(svc_server_counter(url, "shm_transfers"), before);
    cr_assert_null(c->shm_cache, "a region was made at the end of a batch");
    get_all(c, K, EACH, refs, v);
    int64_t through = svc_server_counter(url, "shm_transfers") - before;
    cr_assert_not_null(c->shm_cache);
    cr_assert_geq(tport_shm_size(c->shm_cache), (size_t)8 * 4 * EACH);
    cr_assert_geq(through, K - 5, "%lld of %d deferred gets came through the region (verify %d)",
                  (long long)through, K - 5, verify);
    /* a server whose Hello does not say it takes slices in a GetBatch (one
     * before them, which refuses them) is not sent any */
    atomic_store(&c->batch_get_slices, false);
    before = svc_server_counter(url, "shm_transfers");
    get_all(c, K, EACH, refs, v);
    cr_assert_eq(svc_server_counter(url, "shm_transfers"), before);
    tport_close(c);
  }
  free(v);
  tport_close(p);
  stop(s);
}

/* A GetBatch as q says, sent as it is; its reply (and payload into p). */
static Tport__GetBatchReply *raw_get_batch(tport_client *c, const Tport__GetBatchRequest *q,
                                           client_payload *p)
{
  Tport__GetBatchReply *rep;
  tport_err err;
  *p = (client_payload){0};
  cr_assert_eq(client_rpc(c, TPORT__METHOD__METHOD_GET_BATCH, &q->base, NULL, 0,
                          &tport__get_batch_reply__descriptor, (ProtobufCMessage **)&rep, p, &err),
               0, "%s", err.msg);
  return rep;
}

static void free_reply(Tport__GetBatchReply *rep, client_payload *p)
{
  protobuf_c_message_free_unpacked(&rep->base, NULL);
  if (p->msg)
    nng_msg_free(p->msg);
}

/* A GetBatch's elements naming region slices no client library would:
 * each answered on its own (past the region, another's region, chunks
 * into a region, a slice too small: deferred where asked, else refused),
 * the good ones beside them written where they said. */
Test(shm_batch, hostile_region_slices_in_a_get_batch_cost_their_element_only)
{
  enum { N = 1000, K = 6 };
  char url[96];
  server *s = start(url, sizeof url, (size_t)1 << 20);
  tport_client *c = connect_with(url, false, false);
  tport_client *other = connect_with(url, false, false);
  tport_shm *r, *theirs;
  tport_err err;
  cr_assert_eq(tport_shm_create(c, (size_t)1 << 16, &r, &err), 0, "%s", err.msg);
  cr_assert_eq(tport_shm_create(other, (size_t)1 << 16, &theirs, &err), 0, "%s", err.msg);
  tport_ref ref;
  uint8_t *v = put_n(c, 1, N, &ref);
  Tport__Ref w;
  client_ref_to_wire(&ref, &w);
  Tport__ShmSlice sl[K];
  Tport__GetBeginRequest qs[K], *qp[K];
  for (int j = 0; j < K; j++) {
    tport__get_begin_request__init(&qs[j]);
    qs[j].ref = &w;
    qs[j].inline_max = 1 << 20;
    tport__shm_slice__init(&sl[j]);
    sl[j].region = r->id;
    sl[j].offset = 2 * N;
    sl[j].length = N;
    qs[j].shm = &sl[j];
    qp[j] = &qs[j];
  }
  sl[0].offset = 0;                      /* good */
  sl[1].offset = ((size_t)1 << 16) - 10; /* past the region's end */
  qs[2].shm_chunks = true;               /* a transfer's way */
  sl[3].length = N - 1;                  /* too small: deferred */
  sl[4].region = theirs->id;             /* another connection's */
  qs[5].shm = NULL;                      /* inline, as ever */
  Tport__GetBatchRequest q = TPORT__GET_BATCH_REQUEST__INIT;
  q.n_gets = K;
  q.gets = qp;
  q.defer_large = true;
  Tport__GetBatchReply *rep;
  client_payload p = {0};
  rep = raw_get_batch(c, &q, &p);
  cr_assert_eq(rep->n_gets, (size_t)K);
  int want[K] = {0, TPORT_OUT_OF_RANGE, TPORT_INVALID_ARGUMENT, 0, TPORT_NOT_FOUND, 0};
  for (int j = 0; j < K; j++) {
    int code = rep->gets[j]->status ? (int)rep->gets[j]->status->code : 0;
    cr_assert_eq(
        code, want[j], "element %d: code %d, expected %d (%s)", j, code, want[j],
        rep->gets[j]->status && rep->gets[j]->status->message ? rep->gets[j]->status->message : "");
  }
  cr_assert(rep->gets[0]->shm, "element 0 was not written into the region");
  cr_assert_eq(memcmp(tport_shm_data(r), v, N), 0);
  cr_assert(rep->n_deferred == K && rep->deferred[3] && rep->gets[3]->nbytes == N,
            "the slice too small for it deferred element 3");
  cr_assert(!rep->gets[5]->shm && p.len == N && memcmp(p.data, v, N) == 0);
  uint8_t zero[N] = {0};
  cr_assert_eq(memcmp((uint8_t *)tport_shm_data(theirs) + 2 * N, zero, N), 0,
               "another connection's region was written");
  free_reply(rep, &p);
  /* without defer_large, the slice too small is refused */
  q.n_gets = 1;
  q.gets = &qp[3];
  q.defer_large = false;
  rep = raw_get_batch(c, &q, &p);
  cr_assert_eq(rep->gets[0]->status ? (int)rep->gets[0]->status->code : 0, TPORT_OUT_OF_RANGE);
  free_reply(rep, &p);
  /* a batch copies at most a chunk (1 MiB here) into regions: of three
   * tensors of 400 KB into slices, the third is deferred, or refused */
  enum { BIG = 400000 };
  tport_shm *wide;
  cr_assert_eq(tport_shm_create(c, (size_t)2 << 20, &wide, &err), 0, "%s", err.msg);
  tport_ref big;
  uint8_t *bv = put_n(c, 1, BIG, &big);
  Tport__Ref bw;
  client_ref_to_wire(&big, &bw);
  for (int defer = 0; defer < 2; defer++) {
    for (int j = 0; j < 3; j++) {
      tport__get_begin_request__init(&qs[j]);
      qs[j].ref = &bw;
      tport__shm_slice__init(&sl[j]);
      sl[j].region = wide->id;
      sl[j].offset = (uint64_t)j * BIG;
      sl[j].length = BIG;
      qs[j].shm = &sl[j];
      qp[j] = &qs[j];
    }
    q.n_gets = 3;
    q.gets = qp;
    q.defer_large = defer;
    rep = raw_get_batch(c, &q, &p);
    for (int j = 0; j < 2; j++) {
      cr_assert(rep->gets[j]->shm && (!rep->gets[j]->status || !rep->gets[j]->status->code),
                "element %d", j);
      cr_assert_eq(memcmp((uint8_t *)tport_shm_data(wide) + (size_t)j * BIG, bv, BIG), 0);
    }
    int code = rep->gets[2]->status ? (int)rep->gets[2]->status->code : 0;
    if (defer)
      cr_assert(code == 0 && rep->n_deferred == 3 && rep->deferred[2] && !rep->gets[2]->shm,
                "the third was not deferred (code %d)", code);
    else
      cr_assert_eq(code, TPORT_OUT_OF_RANGE, "the third: code %d", code);
    free_reply(rep, &p);
  }
  free(bv);
  tport_shm_release(wide, NULL);
  free(v);
  tport_shm_release(r, NULL);
  tport_shm_release(theirs, NULL);
  tport_close(other);
  tport_close(c);
  stop(s);
}

/* The name a GetBatch's element asks for is replaced by a larger tensor
 * between the batch's look at it (which spent its bytes of the request's
 * room for regions) and its get: that one is not written into the slice,
 * however large the slice -- the request copies what it looked at, at
 * most. */
static tport_client *replacer;
static uint8_t *larger;
enum { LOOKED = 1000 };

static void replace_name(size_t element)
{
  (void)element;
  tport_put_options o;
  tport_put_options_init(&o);
  o.name = "looked";
  o.replace = true;
  int64_t sz = 3 * LOOKED;
  tport_err err;
  cr_assert_eq(tport_put(replacer, TPORT_UINT8, 1, &sz, NULL, larger, 3 * LOOKED, &o, NULL, &err),
               0, "%s", err.msg);
}

Test(shm_batch, a_name_replaced_after_the_batch_looked_is_not_written_past_that)
{
  char url[96];
  server *s = start(url, sizeof url, (size_t)1 << 20);
  tport_client *c = connect_with(url, false, false);
  replacer = connect_with(url, false, false);
  tport_shm *r;
  tport_err err;
  cr_assert_eq(tport_shm_create(c, (size_t)1 << 16, &r, &err), 0, "%s", err.msg);
  uint8_t v[LOOKED];
  fill(v, LOOKED, 77);
  larger = malloc(3 * LOOKED);
  fill(larger, 3 * LOOKED, 78);
  tport_put_options o;
  tport_put_options_init(&o);
  o.name = "looked";
  int64_t sz = LOOKED;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &sz, NULL, v, LOOKED, &o, NULL, &err), 0, "%s",
               err.msg);
  Tport__Ref w = TPORT__REF__INIT;
  w.name = (char *)"looked";
  Tport__ShmSlice sl = TPORT__SHM_SLICE__INIT;
  sl.region = r->id;
  sl.length = 4 * LOOKED; /* room for either */
  Tport__GetBeginRequest g = TPORT__GET_BEGIN_REQUEST__INIT, *gp = &g;
  g.ref = &w;
  g.inline_max = 1 << 20;
  g.shm = &sl;
  Tport__GetBatchRequest q = TPORT__GET_BATCH_REQUEST__INIT;
  q.n_gets = 1;
  q.gets = &gp;
  memset(tport_shm_data(r), 0, 4 * LOOKED);
  get_batch_test_looked = replace_name;
  client_payload p;
  Tport__GetBatchReply *rep = raw_get_batch(c, &q, &p);
  get_batch_test_looked = NULL;
  int code = rep->gets[0]->status ? (int)rep->gets[0]->status->code : 0;
  cr_assert_eq(code, TPORT_OUT_OF_RANGE, "the larger tensor was answered (code %d)", code);
  uint8_t zero[3 * LOOKED] = {0};
  cr_assert_eq(memcmp(tport_shm_data(r), zero, sizeof zero), 0, "the slice was written");
  free_reply(rep, &p);
  /* asked again, the batch looks at the larger one: written whole */
  rep = raw_get_batch(c, &q, &p);
  code = rep->gets[0]->status ? (int)rep->gets[0]->status->code : 0;
  cr_assert(rep->gets[0]->shm && code == 0, "not written into the slice (code %d)", code);
  cr_assert_eq(memcmp(tport_shm_data(r), larger, 3 * LOOKED), 0);
  free_reply(rep, &p);
  free(larger);
  tport_shm_release(r, NULL);
  tport_close(replacer);
  tport_close(c);
  stop(s);
}
