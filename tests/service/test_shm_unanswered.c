/*
 * test_shm_unanswered.c: a request through libtport's automatic region
 * whose answer never came (the client's timeout) may still be carried out
 * by the server -- a get's bytes written into the region, a put's read
 * from it -- so that region is never the automatic one again: the next
 * transfer gets a fresh one.  Before, the next transfer's bytes went into
 * the same region, where a late write could land on them, and a late put
 * stored (and published, under a name) the next transfer's bytes.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "client_internal.h"
#include "server_internal.h"
#include "service_util.h"

static char sock_dir[64];

/* A server with the shm socket; chunks of 1 MiB, so that a tensor of 512
 * KiB is offered the automatic region and moved there in one request. */
static server *start(char *url, size_t len, int workers)
{
  server_config cfg;
  svc_config_shm(&cfg, "shmu", sock_dir, sizeof sock_dir);
  cfg.chunk_bytes = 1 << 20;
  if (workers)
    cfg.workers = workers;
  return svc_start_with(&cfg, url, len);
}

static void stop(server *s)
{
  server_stop(s, 0);
  rmdir(sock_dir);
}

#define N ((size_t)512 << 10)

static uint8_t *values(unsigned seed)
{
  uint8_t *v = malloc(N);
  cr_assert(v);
  uint32_t x = seed * 2654435761u + 1;
  for (size_t i = 0; i < N; i++) {
    x = x * 1664525u + 1013904223u;
    v[i] = (uint8_t)(x >> 24);
  }
  return v;
}

/* Puts v (N bytes) to device under name (NULL: none); the call's status. */
static int put(tport_client *c, const uint8_t *v, const char *device, const char *name,
               tport_tensor_info *info, tport_err *err)
{
  tport_put_options o;
  tport_put_options_init(&o);
  o.device = device;
  o.name = name;
  int64_t sz = (int64_t)N;
  return tport_put(c, TPORT_UINT8, 1, &sz, NULL, v, N, &o, info, err);
}

static uint64_t region_id(const tport_client *c)
{
  cr_assert_not_null(c->shm_cache, "no automatic region");
  return c->shm_cache->id;
}

Test(shm_unanswered, a_get_whose_answer_never_came_never_reuses_its_region)
{
  char url[96];
  server *s = start(url, sizeof url, 0);
  tport_client *c = svc_connect(url, "t");
  uint8_t *v = values(12), *back = malloc(N);
  tport_tensor_info info;
  tport_err err;
  cr_assert_eq(put(c, v, "sim:0", NULL, &info, &err), 0, "%s", err.msg);
  cr_assert_eq(tport_get(c, &info.ref, back, N, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  uint64_t first = region_id(c);
  sim_set_delay_range(600000, 600000); /* each sim op 0.6 s */
  int timeout = c->timeout_ms;
  c->timeout_ms = 150;
  int rc = tport_get(c, &info.ref, back, N, NULL, NULL, NULL, &err);
  c->timeout_ms = timeout;
  cr_assert_eq(rc, TPORT_DEADLINE_EXCEEDED, "%s (%s)", tport_strerror(rc), err.msg);
  cr_assert(c->shm_cache == NULL || c->shm_cache->id != first,
            "region %llu is still the automatic region after a get into it got no answer",
            (unsigned long long)first);
  usleep(900000); /* the late write ends */
  sim_set_delay_range(0, 0);
  memset(back, 0, N);
  cr_assert_eq(tport_get(c, &info.ref, back, N, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(memcmp(back, v, N), 0);
  cr_assert_neq(region_id(c), first, "the next get went through the region written late");
  /* the retired region is released on the server at the region's next use
   * (once the late write has let go of it); the connection's process
   * region (offered to large gets, client/process_region.c) stays */
  int64_t regions = 0;
  for (int k = 0; k < 500 && (regions = svc_server_counter(url, "shm_regions") -
                                        svc_server_counter(url, "shm_process_regions")) != 1;
       k++)
    usleep(10000);
  cr_assert_eq(regions, 1, "%lld regions on the server", (long long)regions);
  free(back);
  free(v);
  tport_close(c);
  stop(s);
}

/* ---- holding the one worker: a List of another connection waits in
 * server_test_before_handle until released (no timing decides the order) */

static pthread_mutex_t hold_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hold_cv = PTHREAD_COND_INITIALIZER;
static bool holding, hold_on;

static void hold_list(server *s, uint32_t pipe, uint16_t method)
{
  (void)s;
  (void)pipe;
  if (method != TPORT__METHOD__METHOD_LIST)
    return;
  pthread_mutex_lock(&hold_mu);
  holding = true;
  pthread_cond_broadcast(&hold_cv);
  while (hold_on)
    pthread_cond_wait(&hold_cv, &hold_mu);
  holding = false;
  pthread_mutex_unlock(&hold_mu);
}

static void *list_once(void *arg)
{
  tport_client *c = svc_connect(arg, "t");
  tport_tensor_info *v;
  size_t n;
  tport_err err;
  if (tport_list(c, &v, &n, &err) == 0)
    free(v);
  tport_close(c);
  return NULL;
}

/* Waits until the server has n requests queued or at work. */
static void wait_busy(server *s, int n)
{
  for (int i = 0;; i++) {
    pthread_mutex_lock(&s->qmu);
    int b = s->busy;
    pthread_mutex_unlock(&s->qmu);
    if (b >= n)
      return;
    cr_assert_lt(i, 2000, "%d requests in the server, waited for %d", b, n);
    usleep(5000);
  }
}

/* The one worker held by another connection's List until release_hold;
 * the List's thread. */
static pthread_t hold_worker(char *url)
{
  hold_on = true;
  server_test_before_handle = hold_list;
  pthread_t t;
  pthread_create(&t, NULL, list_once, url);
  pthread_mutex_lock(&hold_mu);
  while (!holding)
    pthread_cond_wait(&hold_cv, &hold_mu);
  pthread_mutex_unlock(&hold_mu);
  return t;
}

static void release_hold(void)
{
  pthread_mutex_lock(&hold_mu);
  hold_on = false;
  pthread_cond_broadcast(&hold_cv);
  pthread_mutex_unlock(&hold_mu);
}

/* The next put through the region, of b under the name "second", queued
 * behind the held worker and the late request; then the worker let go and
 * that put waited for. */
static void put_second_behind(server *s, pthread_t held, tport_client *c, const uint8_t *b)
{
  int64_t sz = (int64_t)N;
  tport_put_options o;
  tport_put_options_init(&o);
  o.name = "second";
  tport_request *second;
  tport_err err;
  cr_assert_eq(tport_put_async(c, TPORT_UINT8, 1, &sz, NULL, b, N, &o, NULL, NULL, NULL, &second,
                               &err),
               0, "%s", err.msg);
  wait_busy(s, 3); /* the List, the late request, the next one */
  release_hold();
  pthread_join(held, NULL);
  cr_assert_eq(tport_wait(second, -1, &err), 0, "%s", err.msg);
  tport_request_free(second);
  server_test_before_handle = NULL;
}

/* One worker, held by another connection's List: a named put through the
 * region waits in the queue past the client's timeout, and the next put
 * (or, now, the release of the retired region it begins with) is queued
 * behind it.  When the late put runs it reads the region: were the next
 * put's bytes there, "first" would hold them. */
Test(shm_unanswered, a_put_whose_answer_never_came_stores_its_own_bytes)
{
  char url[96];
  server *s = start(url, sizeof url, 1);
  tport_client *c = svc_connect(url, "t");
  uint8_t *a = values(21), *b = values(22), *back = malloc(N);
  tport_err err;
  cr_assert_eq(put(c, a, "cpu", NULL, NULL, &err), 0, "%s", err.msg); /* makes the region */
  uint64_t first = region_id(c);
  pthread_t t = hold_worker(url);
  int timeout = c->timeout_ms;
  c->timeout_ms = 100;
  int rc = put(c, a, "cpu", "first", NULL, &err);
  c->timeout_ms = timeout;
  cr_assert_eq(rc, TPORT_DEADLINE_EXCEEDED, "%s (%s)", tport_strerror(rc), err.msg);
  cr_assert(c->shm_cache == NULL || c->shm_cache->id != first,
            "region %llu is still the automatic region after a put from it got no answer",
            (unsigned long long)first);
  put_second_behind(s, t, c, b);
  tport_ref byname = {0};
  snprintf(byname.name, sizeof byname.name, "first");
  tport_tensor_info i;
  for (int k = 0; k < 200 && tport_info(c, &byname, &i, &err) != 0; k++)
    usleep(10000);
  cr_assert_eq(tport_get(c, &byname, back, N, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert(memcmp(back, a, N) == 0,
            "the put that got no answer stored bytes that are not its own%s",
            memcmp(back, b, N) == 0 ? " (the next put's)" : "");
  snprintf(byname.name, sizeof byname.name, "second");
  cr_assert_eq(tport_get(c, &byname, back, N, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(memcmp(back, b, N), 0);
  free(back);
  free(a);
  free(b);
  tport_close(c);
  stop(s);
}

/* The same for a put batch whose small elements went through slots of the
 * automatic region (client/batch_region.h): the batch's one request waits
 * behind the held List past the client's timeout, the next put through
 * the region is queued behind it; when the late batch runs, each element
 * must store its own bytes. */
Test(shm_unanswered, a_put_batch_whose_answer_never_came_stores_its_own_bytes)
{
  enum { K = 128, EACH = 4096 };
  char url[96];
  server *s = start(url, sizeof url, 1);
  tport_client *c = svc_connect(url, "t");
  uint8_t *a = values(31), *b = values(32), *back = malloc(N);
  tport_err err;
  cr_assert_eq(put(c, a, "cpu", NULL, NULL, &err), 0, "%s", err.msg); /* makes the region */
  uint64_t first = region_id(c);
  tport_put_item items[K];
  tport_put_options opts[K];
  char names[K][16];
  int64_t each = EACH;
  for (int i = 0; i < K; i++) {
    tport_put_options_init(&opts[i]);
    snprintf(names[i], sizeof names[i], "b%d", i);
    opts[i].name = names[i];
    items[i] = (tport_put_item){.dtype = TPORT_UINT8,
                                .ndim = 1,
                                .sizes = &each,
                                .data = a + (size_t)i * EACH,
                                .nbytes = EACH,
                                .opts = &opts[i]};
  }
  pthread_t t = hold_worker(url);
  int timeout = c->timeout_ms;
  c->timeout_ms = 100;
  int rc = tport_put_batch(c, items, K, &err);
  c->timeout_ms = timeout;
  cr_assert_eq(rc, TPORT_DEADLINE_EXCEEDED, "%s (%s)", tport_strerror(rc), err.msg);
  cr_assert(c->shm_cache == NULL || c->shm_cache->id != first,
            "region %llu is still the automatic region after a batch from it got no answer",
            (unsigned long long)first);
  put_second_behind(s, t, c, b);
  for (int i = 0; i < K; i++) {
    tport_ref byname = {0};
    snprintf(byname.name, sizeof byname.name, "b%d", i);
    tport_tensor_info info;
    for (int k = 0; k < 200 && tport_info(c, &byname, &info, &err) != 0; k++)
      usleep(10000);
    cr_assert_eq(tport_get(c, &byname, back, EACH, NULL, NULL, NULL, &err), 0, "%s: %s",
                 names[i], err.msg);
    cr_assert(memcmp(back, a + (size_t)i * EACH, EACH) == 0,
              "element %d of the batch that got no answer stored bytes not its own%s", i,
              memcmp(back, b + (size_t)i * EACH, EACH) == 0 ? " (the next put's)" : "");
  }
  free(back);
  free(a);
  free(b);
  tport_close(c);
  stop(s);
}

/* ---- a get batch's deferred elements written into slots of the region */

static int get_batches; /* GetBatches seen by the hook */

static void hold_deferred(server *s, uint32_t pipe, uint16_t method)
{
  (void)s;
  (void)pipe;
  if (method != TPORT__METHOD__METHOD_GET_BATCH)
    return;
  pthread_mutex_lock(&hold_mu);
  if (++get_batches == 2) { /* the batch's first GetBatch went; hold the next */
    holding = true;
    pthread_cond_broadcast(&hold_cv);
    while (hold_on)
      pthread_cond_wait(&hold_cv, &hold_mu);
    holding = false;
  }
  pthread_mutex_unlock(&hold_mu);
}

/* Gets the k tensors refs (each bytes) as one batch; its status. */
static int get_batch(tport_client *c, const tport_ref *refs, size_t k, size_t each, uint8_t *into,
                     tport_err *err)
{
  tport_get_item items[64];
  cr_assert_leq(k, 64);
  for (size_t i = 0; i < k; i++)
    items[i] = (tport_get_item){.ref = refs[i], .buf = into + i * each, .cap = each};
  return tport_get_batch(c, items, k, err);
}

/* 1 MiB chunks: of 40 tensors of 200 KB, five come inline and the others
 * are deferred, then written by GetBatches into slots of the region (the
 * batch before grew it).  The first of those is held in the server past
 * the client's timeout: the region it would write is retired. */
Test(shm_unanswered, a_get_batch_whose_answer_never_came_never_reuses_its_region)
{
  enum { K = 40, EACH = 200000 };
  char url[96];
  server *s = start(url, sizeof url, 1);
  tport_client *c = svc_connect(url, "t");
  uint8_t *v = malloc((size_t)K * EACH), *into = malloc((size_t)K * EACH);
  for (size_t i = 0; i < (size_t)K * EACH; i++)
    v[i] = (uint8_t)(i * 13 + 5);
  tport_ref refs[K];
  int64_t sz = EACH;
  tport_err err;
  for (int i = 0; i < K; i++) {
    tport_tensor_info info;
    cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &sz, NULL, v + (size_t)i * EACH, EACH, NULL, &info,
                           &err),
                 0, "%s", err.msg);
    refs[i] = info.ref;
  }
  /* the first wants the region, the second makes and uses it */
  for (int i = 0; i < 2; i++)
    cr_assert_eq(get_batch(c, refs, K, EACH, into, &err), 0, "%s", err.msg);
  uint64_t first = region_id(c);
  hold_on = true;
  get_batches = 0;
  server_test_before_handle = hold_deferred;
  int timeout = c->timeout_ms;
  /* long enough for the first GetBatch on a loaded machine (a sanitizer's
   * CI): only the held one may run out of it */
  c->timeout_ms = 2000;
  int rc = get_batch(c, refs, K, EACH, into, &err);
  c->timeout_ms = timeout;
  cr_assert_eq(rc, TPORT_DEADLINE_EXCEEDED, "%s (%s)", tport_strerror(rc), err.msg);
  pthread_mutex_lock(&hold_mu);
  cr_assert(holding, "the deferred GetBatch was not held");
  pthread_mutex_unlock(&hold_mu);
  cr_assert(c->shm_cache == NULL || c->shm_cache->id != first,
            "region %llu is still the automatic region after a get batch into it got no answer",
            (unsigned long long)first);
  release_hold();
  server_test_before_handle = NULL;
  memset(into, 0, (size_t)K * EACH);
  cr_assert_eq(get_batch(c, refs, K, EACH, into, &err), 0, "%s", err.msg);
  cr_assert_eq(memcmp(into, v, (size_t)K * EACH), 0);
  free(v);
  free(into);
  tport_close(c);
  stop(s);
}
