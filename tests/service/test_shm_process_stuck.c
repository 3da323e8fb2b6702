/*
 * test_shm_process_stuck.c: reads of a client's memory that do not end
 * (pages under userfaultfd that the test serves late, or never): tportd's
 * workers and readers stay bounded, a read is given up after its deadline
 * and charged to its tenant until it ends, the put goes on through the
 * region, and a batch the client stopped waiting for stores nothing.
 */
#include <criterion/criterion.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client_internal.h"
#include "hold_util.h"
#include "process_util.h"
#include "server_internal.h"
#include "service_util.h"

/* A test's server and its memory whose pages nobody serves yet. */
typedef struct stuck_env {
  int uffd;
  uint8_t *area;
  size_t len;
  char url[96];
  server *s;
} stuck_env;

static void stuck_begin(stuck_env *e, size_t len)
{
  need_pidfd();
  e->len = len;
  e->area = stuck_pages(len, &e->uffd);
  e->s = start(e->url, sizeof e->url);
}

static void stuck_end(stuck_env *e)
{
  close(e->uffd);
  munmap(e->area, e->len);
  stop(e->s);
}

/* A put from memory whose pages never fault in (userfaultfd, not served):
 * the server's reads of it never end. */
typedef struct stuck_put {
  const char *url, *tenant;
  uint8_t *area;
  size_t n;
  int rc;
} stuck_put;

static void *put_stuck(void *arg)
{
  stuck_put *p = arg;
  tport_client *c = svc_connect(p->url, p->tenant);
  int64_t sz = (int64_t)p->n;
  tport_tensor_info info;
  tport_err err;
  p->rc = tport_put(c, TPORT_UINT8, 1, &sz, NULL, p->area, p->n, NULL, &info, &err);
  tport_close(c);
  return NULL;
}

Test(shm_process, reads_that_never_end_leave_workers_and_readers_to_others, .timeout = 120)
{
  size_t n = 8 * CHUNK;
  stuck_env e;
  stuck_begin(&e, n); /* 4 workers: 3 readers at most, 2 a tenant */
  /* two tenants' puts (each may keep 3 of the 4 workers busy): without a
   * bound on the reads, every worker would wait for ever */
  stuck_put sp[2] = {{e.url, "stuck1", e.area, n / 2, -1},
                     {e.url, "stuck2", e.area + n / 2, n / 2, -1}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++)
    cr_assert_eq(pthread_create(&th[i], NULL, put_stuck, &sp[i]), 0);
  /* the server's reads meet the pages: their faults wait for this test */
  struct pollfd pf = {.fd = e.uffd, .events = POLLIN};
  cr_assert_eq(poll(&pf, 1, 20000), 1, "the server's read never met the stuck pages");
  usleep(500 * 1000); /* the others */
  /* another tenant's large put still goes (by what readers are left, or
   * the region), exact, and a small request is answered */
  tport_client *c = svc_connect(e.url, "other");
  put_and_check(c, 5 * CHUNK + 7, NULL, 31);
  put_and_check(c, 1000, NULL, 32);
  tport_close(c);
  /* the faults served: the stuck put ends */
  serve_pages(e.uffd, e.area, n);
  /* each ends: put once its pages came, or given up by the server after its
   * deadline (the reads that were stuck then) */
  for (int i = 0; i < 2; i++) {
    pthread_join(th[i], NULL);
    cr_assert(sp[i].rc == 0 || sp[i].rc == TPORT_DEADLINE_EXCEEDED, "a stuck put: %d", sp[i].rc);
  }
  stuck_end(&e);
}

typedef struct stuck_batch {
  const char *url;
  uint8_t *area;
  size_t n;
  uint8_t small[1000];
  tport_put_item items[2];
  int rc;
} stuck_batch;

static void *put_batch_stuck(void *arg)
{
  stuck_batch *b = arg;
  tport_client *c = svc_connect(b->url, "stuck");
  static int64_t dims[2];
  dims[0] = (int64_t)b->n;
  dims[1] = (int64_t)sizeof b->small;
  b->items[0] = (tport_put_item){
      .dtype = TPORT_UINT8, .ndim = 1, .sizes = &dims[0], .data = b->area, .nbytes = b->n};
  b->items[1] = (tport_put_item){.dtype = TPORT_UINT8,
                                 .ndim = 1,
                                 .sizes = &dims[1],
                                 .data = b->small,
                                 .nbytes = sizeof b->small};
  tport_put_options keep;
  tport_put_options_init(&keep);
  keep.name = "stuck-batch"; /* outlives this connection */
  b->items[0].opts = &keep;
  tport_err err;
  b->rc = tport_put_batch(c, b->items, 2, &err);
  tport_close(c);
  return NULL;
}

/* A read shared by two threads, one half served and the other not until
 * the read was given up: the read ends with its last piece (which frees
 * it) and its slot serves again; the put itself went through the region
 * meanwhile, as does a batch's element whose read was given up. */
Test(shm_process, a_read_given_up_ends_with_its_last_piece_and_its_put_goes_on, .timeout = 120)
{
  size_t n = (size_t)2 << 20; /* two pieces */
  stuck_env e;
  stuck_begin(&e, 2 * n);
  serve_pages(e.uffd, e.area, n / 2);
  stuck_put sp = {e.url, "stuck", e.area, n, -1};
  pthread_t putter;
  cr_assert_eq(pthread_create(&putter, NULL, put_stuck, &sp), 0);
  struct pollfd pf = {.fd = e.uffd, .events = POLLIN};
  cr_assert_eq(poll(&pf, 1, 20000), 1, "the server's read never met the stuck pages");
  wait_stuck(e.url, 1);
  cr_assert_eq(svc_server_counter(e.url, "shm_process_reading"), 1);
  /* the put copies the same pages into the region now: it ends once they
   * come, as does the read given up */
  serve_pages(e.uffd, e.area + n / 2, n / 2);
  pthread_join(putter, NULL);
  cr_assert_eq(sp.rc, 0, "the put did not go on through the region: %d", sp.rc);
  wait_counter(e.url, "shm_process_reading", 0, 200);
  wait_stuck(e.url, 0);
  /* a batch's element: put again on its own, through the region */
  stuck_batch *b = calloc(1, sizeof *b);
  *b = (stuck_batch){.url = e.url, .area = e.area + n, .n = n, .rc = -1};
  cr_assert_eq(pthread_create(&putter, NULL, put_batch_stuck, b), 0);
  wait_stuck(e.url, 1);
  serve_pages(e.uffd, e.area + n, n);
  pthread_join(putter, NULL);
  cr_assert_eq(b->rc, 0, "the batch: %d (%s; %s)", b->rc, b->items[0].err.msg, b->items[1].err.msg);
  tport_client *c = svc_connect(e.url, "stuck");
  tport_ref named = {0};
  snprintf(named.name, sizeof named.name, "stuck-batch");
  expect_zeros(c, &named, n);
  /* the slots serve again */
  int64_t reads = svc_server_counter(e.url, "shm_process_reads");
  put_and_check(c, n, NULL, 61);
  cr_assert_eq(svc_server_counter(e.url, "shm_process_reads") - reads, 1);
  tport_close(c);
  free(b);
  stuck_end(&e);
}

/* A read given up keeps the tensor it writes after its put is aborted:
 * the tenant pays for it until the read ends (it was nobody's before).
 * The put by hand, so that nothing else of the tenant's is charged. */
Test(shm_process, a_read_given_up_is_charged_to_its_tenant_until_it_ends, .timeout = 120)
{
  size_t n = 4 * CHUNK;
  stuck_env e;
  stuck_begin(&e, n);
  tport_client *c = svc_connect(e.url, "stuck");
  uint64_t mine;
  Tport__Ref w;
  uint8_t handle[TPORT_HANDLE_BYTES];
  begin_direct_put(c, n, &w, handle, &mine);
  cr_assert_eq(chunk_raw(c, &w, 0, mine, (uint64_t)(uintptr_t)e.area, n, NULL, 0),
               TPORT_DEADLINE_EXCEEDED);
  Tport__PutAbortRequest aq = TPORT__PUT_ABORT_REQUEST__INIT;
  aq.ref = &w;
  ProtobufCMessage *ar = NULL;
  tport_err err;
  cr_assert_eq(client_rpc(c, TPORT__METHOD__METHOD_PUT_ABORT, &aq.base, NULL, 0,
                          &tport__put_abort_reply__descriptor, &ar, NULL, &err),
               0, "%s", err.msg);
  protobuf_c_message_free_unpacked(ar, NULL);
  tport_close(c);
  cr_assert_eq(svc_server_counter(e.url, "shm_process_stuck"), 1);
  cr_assert_eq(tenant_counter(e.url, "stuck", "tensors"), 0, "the upload is gone");
  int64_t held = tenant_counter(e.url, "stuck", "tensor_bytes");
  cr_assert_geq(held, (int64_t)n, "the stuck read's tensor is charged to nobody (%lld bytes)",
                (long long)held);
  serve_pages(e.uffd, e.area, n);
  wait_counter(e.url, "shm_process_reading", 0, 200);
  wait_charge_gone(e.url);
  stuck_end(&e);
}

/* A batch's elements read together, one of them on pages nobody serves:
 * the read is given up, every element gathered fails with it and their
 * tensors stay charged to the tenant until the read ends; through
 * tport_put_batch each is put again on its own (through the region) and
 * comes back exact. */
Test(shm_process, a_gathered_read_given_up_fails_its_elements_and_stays_charged, .timeout = 120)
{
  size_t n = 4 * CHUNK;
  stuck_env e;
  stuck_begin(&e, 2 * n);
  uint8_t *v = malloc(2 * n);
  fill(v, 2 * n, 91);
  tport_client *c = svc_connect(e.url, "stuck");
  uint64_t mine;
  cr_assert_eq(client_process_region(c, &mine), 0);
  raw_put el[] = {RAW(mine, (uint64_t)(uintptr_t)v, n), RAW(mine, (uint64_t)(uintptr_t)e.area, n),
                  RAW(mine, (uint64_t)(uintptr_t)v + n, n)};
  int code[3];
  tport_ref ref[3];
  static uint64_t fence = 7;
  batch_raw(c, el, 3, &fence, fence, code, ref);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(code[i], TPORT_DEADLINE_EXCEEDED, "element %d: %d", i, code[i]);
  cr_assert_eq(svc_server_counter(e.url, "shm_process_stuck"), 1);
  cr_assert_eq(tenant_counter(e.url, "stuck", "tensors"), 0, "an element was stored");
  int64_t held = tenant_counter(e.url, "stuck", "tensor_bytes");
  cr_assert_geq(held, (int64_t)(3 * n), "the read's tensors are not charged (%lld bytes)",
                (long long)held);
  serve_pages(e.uffd, e.area, n);
  wait_counter(e.url, "shm_process_reading", 0, 200);
  wait_charge_gone(e.url);
  /* the same through tport_put_batch: given up, then put on their own */
  stuck_batch *b = calloc(1, sizeof *b);
  *b = (stuck_batch){.url = e.url, .area = e.area + n, .n = n, .rc = -1};
  pthread_t putter;
  cr_assert_eq(pthread_create(&putter, NULL, put_batch_stuck, b), 0);
  wait_stuck(e.url, 1);
  serve_pages(e.uffd, e.area + n, n);
  pthread_join(putter, NULL);
  cr_assert_eq(b->rc, 0, "the batch: %d (%s; %s)", b->rc, b->items[0].err.msg, b->items[1].err.msg);
  tport_ref named = {0};
  snprintf(named.name, sizeof named.name, "stuck-batch");
  expect_zeros(c, &named, n);
  free(b);
  free(v);
  tport_close(c);
  stuck_end(&e);
}

/* A client that stops waiting for a batch (its timeout) while tportd is
 * still reading the elements' bytes: what tportd reads after that is not
 * stored (the batch's fence no longer holds), for the caller may have
 * changed its buffers once tport_put_batch returned. */
Test(shm_process, a_batch_the_client_stopped_waiting_for_stores_nothing, .timeout = 120)
{
  size_t n = 4 * CHUNK;
  stuck_env e;
  stuck_begin(&e, n);
  tport_client *c;
  tport_err err;
  tport_connect_options o = {.timeout_ms = 1000, .tenant = "fence"};
  cr_assert_eq(tport_connect(e.url, &o, &c, &err), 0, "%s", err.msg);
  int64_t sz = (int64_t)n;
  tport_put_options keep;
  tport_put_options_init(&keep);
  keep.name = "late"; /* would outlive the connection */
  tport_put_item item = {
      .dtype = TPORT_UINT8, .ndim = 1, .sizes = &sz, .data = e.area, .nbytes = n, .opts = &keep};
  int64_t reads = svc_server_counter(e.url, "shm_process_reads");
  cr_assert_neq(tport_put_batch(c, &item, 1, &err), 0, "the batch did not time out");
  /* the caller has its buffer back: served now, the read ends within its
   * deadline, after the client stopped waiting */
  serve_pages(e.uffd, e.area, n);
  wait_counter(e.url, "shm_process_reading", 0, 700);
  tport_close(c);
  cr_assert_eq(tenant_counter(e.url, "fence", "tensors"), 0, "what was read late was stored");
  cr_assert_eq(svc_server_counter(e.url, "shm_process_reads"), reads,
               "a read whose fence had moved was counted as one stored from");
  stuck_end(&e);
}

/* A PutChunk by hand on a thread of its own. */
typedef struct raw_chunk {
  tport_client *c;
  const Tport__Ref *w;
  uint64_t offset, region, addr, len;
  int rc;
} raw_chunk;

static void *chunk_thread(void *arg)
{
  raw_chunk *k = arg;
  k->rc = chunk_raw(k->c, k->w, k->offset, k->region, k->addr, k->len, NULL, 0);
  return NULL;
}

/* Two reads of one put given up together keep one tensor: it is charged
 * once, and stays charged until the last of them ends. */
Test(shm_process, reads_given_up_that_keep_one_tensor_charge_it_once, .timeout = 120)
{
  size_t n = 2 * CHUNK;
  stuck_env e;
  stuck_begin(&e, n);
  tport_client *c = svc_connect(e.url, "stuck");
  uint64_t mine;
  Tport__Ref w;
  uint8_t handle[TPORT_HANDLE_BYTES];
  begin_direct_put(c, n, &w, handle, &mine);
  raw_chunk k[2];
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    k[i] = (raw_chunk){c, &w, i * CHUNK, mine, (uint64_t)(uintptr_t)e.area + i * CHUNK, CHUNK, -1};
    cr_assert_eq(pthread_create(&th[i], NULL, chunk_thread, &k[i]), 0);
  }
  for (int i = 0; i < 2; i++) {
    pthread_join(th[i], NULL);
    cr_assert_eq(k[i].rc, TPORT_DEADLINE_EXCEEDED, "chunk %d: %d", i, k[i].rc);
  }
  tport_close(c); /* the upload goes */
  cr_assert_eq(svc_server_counter(e.url, "shm_process_stuck"), 2);
  int64_t held = tenant_counter(e.url, "stuck", "tensor_bytes");
  cr_assert(held >= (int64_t)n && held < 2 * (int64_t)n,
            "the tensor two reads keep is charged %lld bytes (%zu once)", (long long)held, n);
  /* the read that paid ends first or second: the other pays on */
  serve_pages(e.uffd, e.area, CHUNK);
  wait_counter(e.url, "shm_process_stuck", 1, 200);
  held = tenant_counter(e.url, "stuck", "tensor_bytes");
  cr_assert_geq(held, (int64_t)n, "the read still keeping the tensor pays for it (%lld)",
                (long long)held);
  serve_pages(e.uffd, e.area + CHUNK, CHUNK);
  wait_charge_gone(e.url);
  stuck_end(&e);
}

/* A connection that closes while its read is still waited for: the read,
 * given up after, is charged to its tenant all the same (the tenant's
 * record is kept for it). */
Test(shm_process, a_read_given_up_after_its_connection_closed_is_charged, .timeout = 120)
{
  size_t n = 4 * CHUNK;
  stuck_env e;
  stuck_begin(&e, n);
  tport_client *c;
  tport_err err;
  tport_connect_options o = {.tenant = "stuck", .timeout_ms = 2000};
  cr_assert_eq(tport_connect(e.url, &o, &c, &err), 0, "%s", err.msg);
  uint64_t mine;
  Tport__Ref w;
  uint8_t handle[TPORT_HANDLE_BYTES];
  begin_direct_put(c, n, &w, handle, &mine);
  /* this library's own timeout, long before tportd's */
  cr_assert_eq(chunk_raw(c, &w, 0, mine, (uint64_t)(uintptr_t)e.area, n, NULL, 0),
               TPORT_DEADLINE_EXCEEDED);
  tport_close(c);
  wait_stuck(e.url, 1);
  int64_t held = tenant_counter(e.url, "stuck", "tensor_bytes");
  cr_assert_geq(held, (int64_t)n, "the read given up is charged to nobody (%lld bytes)",
                (long long)held);
  serve_pages(e.uffd, e.area, n);
  wait_charge_gone(e.url);
  stuck_end(&e);
}

static void *list_once(void *arg)
{
  tport_client *c = svc_connect(arg, "hog");
  tport_tensor_info *out = NULL;
  size_t n = 0;
  tport_list(c, &out, &n, NULL);
  free(out);
  tport_close(c);
  return NULL;
}

/* Two workers: one held by another request, the other reading pages that
 * never fault in.  The read is given up after its deadline, so a third
 * tenant is answered: with the worker waiting for the read, nobody was. */
Test(shm_process, a_read_that_never_ends_gives_its_worker_back, .timeout = 120)
{
  need_pidfd();
  size_t n = 4 * CHUNK;
  int uffd;
  uint8_t *area = stuck_pages(n, &uffd);
  char url[96];
  server_config cfg;
  svc_config_shm(&cfg, "procw", sock_dir, sizeof sock_dir);
  cfg.workers = 2;                  /* one reader at most */
  hold(TPORT__METHOD__METHOD_LIST); /* before the workers read the hook */
  server *s = svc_start_with(&cfg, url, sizeof url);
  pthread_t lister, putter;
  cr_assert_eq(pthread_create(&lister, NULL, list_once, url), 0);
  wait_held(1);
  stuck_put sp = {url, "stuck", area, n, -1};
  cr_assert_eq(pthread_create(&putter, NULL, put_stuck, &sp), 0);
  struct pollfd pf = {.fd = uffd, .events = POLLIN};
  cr_assert_eq(poll(&pf, 1, 20000), 1, "the server's read never met the stuck pages");
  /* both workers taken: a small put of another tenant waits for the read's
   * deadline, no longer */
  tport_client *c = svc_connect(url, "other");
  put_and_check(c, 1000, NULL, 51);
  tport_close(c);
  cr_assert_eq(svc_server_counter(url, "shm_process_stuck"), 1, "the read was not given up");
  /* the hold let go, the pages served: all ends */
  release();
  serve_pages(uffd, area, n);
  pthread_join(lister, NULL);
  pthread_join(putter, NULL);
  /* the given-up read's thread has ended and its slot is free again */
  wait_counter(url, "shm_process_reading", 0, 200);
  cr_assert_eq(svc_server_counter(url, "shm_process_stuck"), 0);
  c = connect_with(url, false);
  int64_t reads = svc_server_counter(url, "shm_process_reads");
  for (int i = 0; i < 100 && svc_server_counter(url, "shm_process_reads") == reads; i++)
    put_and_check(c, 3 * CHUNK, NULL, 52);
  cr_assert_gt(svc_server_counter(url, "shm_process_reads"), reads);
  tport_close(c);
  close(uffd);
  munmap(area, n);
  stop(s);
  server_test_before_handle = NULL;
}
