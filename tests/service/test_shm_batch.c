/*
 * test_shm_batch.c: on the same host, a put batch's small elements go
 * through the automatic region (client/batch_region.h): each group in
 * flight copies its elements' bytes into a slot of the region and names
 * them by slices.  Checked on the real server in this process: every
 * element's bytes exact -- more groups than slots, so that slots are
 * reused, conversions, strides, with and without verify -- and that the
 * server read them from the region (its shm_transfers count them); a
 * small batch and a client without shared memory stay on the socket.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_internal.h"
#include "service_util.h"

static char sock_dir[64];

static server *start(char *url, size_t len, size_t chunk)
{
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
