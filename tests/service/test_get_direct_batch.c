/*
 * test_get_direct_batch.c: a get batch's elements written straight into
 * the caller's buffers (server/get_scatter.h, client/batch_get_plan.c):
 * the bytes exact, a request's in one write (past one write's bytes, a
 * write each, begun within the request's time), an element whose memory
 * cannot be written failing alone, the elements tportd would not write so
 * (a device's) in a second window, and a write with no slot free: the
 * elements deferred, no transfer left behind (nor any refused for the
 * connection's limit of them), also where a request's second write found
 * none.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "client_internal.h"
#include "get_direct.h"
#include "process_util.h"
#include "server_internal.h"
#include "service_util.h"

/* tportd in this process with a shm socket and chunks of 1 MiB: room for
 * eight direct elements of 128 KiB a GetBatch. */
static server *start_mib_chunks(char *url, size_t len)
{
  server_config cfg;
  svc_config_shm(&cfg, "proc", sock_dir, sizeof sock_dir);
  cfg.chunk_bytes = (size_t)1 << 20;
  return svc_start_with(&cfg, url, len);
}

/* A raw GetBatch of three gets of ref, each offering n bytes at addr[j] of
 * the process region: the RPC's status, the reply into *out. */
static int batch_raw3(tport_client *c, const tport_ref *ref, uint64_t region,
                      uint8_t *const addr[3], size_t n, Tport__GetBatchReply **out, tport_err *err)
{
  Tport__Ref w[3];
  Tport__GetBeginRequest qs[3], *qp[3];
  for (int j = 0; j < 3; j++) {
    client_ref_to_wire(ref, &w[j]);
    tport__get_begin_request__init(&qs[j]);
    qs[j].ref = &w[j];
    qs[j].direct_region = region;
    qs[j].direct_addr = (uintptr_t)addr[j];
    qs[j].direct_length = n;
    qp[j] = &qs[j];
  }
  Tport__GetBatchRequest q = TPORT__GET_BATCH_REQUEST__INIT;
  q.n_gets = 3;
  q.gets = qp;
  *out = NULL;
  return client_rpc(c, TPORT__METHOD__METHOD_GET_BATCH, &q.base, NULL, 0,
                    &tport__get_batch_reply__descriptor, (ProtobufCMessage **)out, NULL, err);
}

/* tport_get_batch into the caller's buffers: an element of a quarter MiB
 * or more is written there by the server -- in the first GetBatch, in a
 * deferred one (up to a chunk), or as a get of its own (larger); smaller
 * ones come inline. */
Test(get_direct, a_batchs_elements_are_written_into_the_callers_buffers)
{
  need_pidfd();
  char url[96];
  server *s = start_mib_chunks(url, sizeof url);
  for (int verify = 0; verify < 2; verify++) {
    tport_client *c = connect_with(url, verify);
    enum { K = 12 };
    const size_t sizes[K] = {300000,  5000,   700000, 262144, 64,    1048576,
                             3000000, 400000, 12,     900000, 33333, (size_t)1 << 18};
    uint8_t *v[K], *back[K];
    tport_get_item items[K];
    memset(items, 0, sizeof items);
    for (int i = 0; i < K; i++) {
      v[i] = malloc(sizes[i]);
      back[i] = malloc(sizes[i]);
      memset(back[i], 0, sizes[i]);
      fill(v[i], sizes[i], 30 + (uint32_t)i);
      items[i].ref = put_u8(c, v[i], sizes[i], "cpu").ref;
      items[i].buf = back[i];
      items[i].cap = sizes[i];
    }
    int64_t writes = svc_server_counter(url, "shm_process_writes"),
            written = svc_server_counter(url, "shm_process_written");
    tport_err err;
    cr_assert_eq(tport_get_batch(c, items, K, &err), 0, "%s", err.msg);
    int direct = 0;
    size_t direct_bytes = 0;
    for (int i = 0; i < K; i++) {
      cr_assert_eq(items[i].err.code, 0, "element %d: %s", i, items[i].err.msg);
      cr_assert_eq(items[i].nbytes, sizes[i]);
      cr_assert_eq(memcmp(back[i], v[i], sizes[i]), 0, "element %d (verify %d)", i, verify);
      direct += sizes[i] >= ((size_t)256 << 10);
      direct_bytes += sizes[i] >= ((size_t)256 << 10) ? sizes[i] : 0;
    }
    /* written in the first GetBatch, a deferred one, or a get of its own:
     * a request's together */
    int64_t wrote = svc_server_counter(url, "shm_process_written") - written;
    cr_assert_eq(wrote, direct_bytes, "%lld of the %zu bytes of large elements written directly",
                 (long long)wrote, direct_bytes);
    int64_t nw = svc_server_counter(url, "shm_process_writes") - writes;
    cr_assert(nw >= 1 && nw < direct, "%lld writes for %d elements", (long long)nw, direct);
    for (int i = 0; i < K; i++)
      free(v[i]), free(back[i]);
    tport_close(c);
  }
  stop(s);
}

/* A raw GetBatch of three elements offering the caller's memory, written
 * in one write: the first's memory is not there, the second's read-only --
 * each fails alone (the write flags its run and goes on), the third is
 * written; a request of good ones is written whole. */
Test(get_direct, a_batch_element_whose_memory_cannot_be_written_fails_alone)
{
  need_pidfd();
  char url[96];
  server *s = start_mib_chunks(url, sizeof url);
  tport_client *c = connect_with(url, false);
  uint64_t mine;
  cr_assert_eq(client_process_region(c, &mine), 0);
  enum { E = 128 << 10 }; /* past GET_DIRECT_MIN_BYTES */
  uint8_t *v = malloc(E);
  fill(v, E, 41);
  tport_tensor_info info = put_u8(c, v, E, "cpu");
  uint8_t *gone = mmap(NULL, E, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  uint8_t *ro = mmap(NULL, E, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  cr_assert(gone != MAP_FAILED && ro != MAP_FAILED);
  for (int round = 0; round < 2; round++) {
    uint8_t *buf[3];
    for (int j = 0; j < 3; j++)
      buf[j] = calloc(1, E);
    uint8_t *at[3] = {round == 0 ? gone : buf[0], round == 0 ? ro : buf[1], buf[2]};
    int64_t writes = svc_server_counter(url, "shm_process_writes");
    Tport__GetBatchReply *r;
    tport_err err;
    cr_assert_eq(batch_raw3(c, &info.ref, mine, at, E, &r, &err), 0, "%s", err.msg);
    cr_assert_eq(r->n_gets, 3);
    for (int j = 0; j < 3; j++) {
      const Tport__GetBeginReply *b = r->gets[j];
      int code = b->status ? (int)b->status->code : 0;
      if (round == 0 && j < 2) {
        cr_assert_eq(code, TPORT_OUT_OF_RANGE, "element %d: %d", j, code);
        cr_assert(strstr(b->status->message, "cannot be written") != NULL, "%s",
                  b->status->message);
      } else {
        cr_assert_eq(code, 0, "element %d (round %d): %s", j, round,
                     b->status ? b->status->message : "");
        cr_assert(b->direct, "element %d (round %d)", j, round);
        cr_assert_eq(memcmp(at[j], v, E), 0);
      }
    }
    protobuf_c_message_free_unpacked(&r->base, NULL);
    cr_assert_eq(svc_server_counter(url, "shm_process_writes") - writes, 1, "one write a request");
    for (int j = 0; j < 3; j++)
      free(buf[j]);
  }
  for (size_t i = 0; i < E; i++)
    cr_assert_eq(ro[i], 0, "the read-only memory changed");
  munmap(gone, E), munmap(ro, E);
  free(v);
  tport_close(c);
  stop(s);
}

/* Serves the pages once tportd's write into them has begun and the
 * request's time for direct writes has passed: whatever the machine's
 * speed, the first element's write starts in time and ends past it. */
static void *serve_later(void *arg)
{
  void **a = arg;
  for (int i = 0; i < 2000 && svc_server_counter(a[3], "shm_process_reading") < 1; i++)
    usleep(5000);
  usleep(3 * 200000);
  serve_pages(*(int *)a[0], a[1], *(size_t *)a[2]);
  return NULL;
}

/* With chunks of 64 MiB a request's direct bytes pass one write's
 * (SHM_PROCESS_READ_SPAN): three elements of 20 MiB are three writes, the
 * next begun only within get_batch_direct_ms of the request's start (here
 * 200 ms) -- the first element's pages fault in well past that, its write
 * succeeds, and the others go the other way (inline); with the server's
 * time all three are written. */
Test(get_direct, a_batchs_writes_past_a_span_start_within_its_time, .timeout = 60)
{
  need_pidfd();
  char url[96];
  server_config cfg;
  svc_config_shm(&cfg, "proc", sock_dir, sizeof sock_dir);
  cfg.chunk_bytes = (size_t)64 << 20;
  server *s = svc_start_with(&cfg, url, sizeof url);
  tport_client *c = connect_with(url, false);
  uint64_t mine;
  cr_assert_eq(client_process_region(c, &mine), 0);
  size_t E = (size_t)20 << 20;
  uint8_t *v = malloc(E);
  fill(v, E, 43);
  tport_tensor_info info = put_u8(c, v, E, "cpu");
  int uffd;
  uint8_t *slow = stuck_pages(E, &uffd), *buf[3] = {slow, calloc(1, E), calloc(1, E)};
  int64_t was = get_batch_direct_ms;
  get_batch_direct_ms = 200;
  pthread_t th;
  void *args[4] = {&uffd, slow, &E, url};
  int64_t writes = svc_server_counter(url, "shm_process_writes");
  cr_assert_eq(pthread_create(&th, NULL, serve_later, args), 0);
  Tport__GetBatchReply *r;
  tport_err err;
  int rc = batch_raw3(c, &info.ref, mine, buf, E, &r, &err);
  get_batch_direct_ms = was;
  pthread_join(th, NULL);
  cr_assert_eq(rc, 0, "%s", err.msg);
  cr_assert_eq(r->n_gets, 3);
  cr_assert(r->gets[0]->direct, "the first element was not written directly");
  cr_assert_eq(memcmp(slow, v, E), 0);
  for (int j = 1; j < 3; j++) {
    cr_assert(!r->gets[j]->status || r->gets[j]->status->code == 0, "element %d", j);
    cr_assert(!r->gets[j]->direct, "element %d was written directly past the request's time", j);
    for (size_t i = 0; i < E; i++)
      cr_assert_eq(buf[j][i], 0, "element %d's buffer was written", j);
  }
  protobuf_c_message_free_unpacked(&r->base, NULL);
  cr_assert_eq(svc_server_counter(url, "shm_process_writes") - writes, 1);
  /* the same request with the server's time: all three written, a write each */
  buf[0] = calloc(1, E);
  rc = batch_raw3(c, &info.ref, mine, buf, E, &r, &err);
  cr_assert_eq(rc, 0, "%s", err.msg);
  for (int j = 0; j < 3; j++) {
    cr_assert(r->gets[j]->direct, "element %d", j);
    cr_assert_eq(memcmp(buf[j], v, E), 0);
  }
  protobuf_c_message_free_unpacked(&r->base, NULL);
  cr_assert_eq(svc_server_counter(url, "shm_process_writes") - writes, 4);
  free(buf[0]);
  close(uffd);
  munmap(slow, E);
  free(buf[1]), free(buf[2]), free(v);
  tport_close(c);
  stop(s);
}

/* tport_get_batch into the caller's buffers of a device's tensors (which
 * the server does not write directly) among cpu ones: the cpu ones are
 * written directly, the others come in a second window of GetBatches
 * (into the region's slots) -- none by a GetBegin of its own. */
Test(get_direct, a_batchs_device_tensors_come_in_a_window_of_their_own)
{
  need_pidfd();
  char url[96];
  server *s = start_mib_chunks(url, sizeof url);
  tport_client *c = connect_with(url, false);
  enum { K = 8 };
  const size_t sizes[K] = {300000, 700000, 262144, 900000, 400000, 1048576, 5000, 500000};
  uint8_t *v[K], *back[K];
  tport_get_item items[K];
  memset(items, 0, sizeof items);
  size_t cpu_bytes = 0;
  for (int i = 0; i < K; i++) {
    v[i] = malloc(sizes[i]);
    back[i] = calloc(1, sizes[i]);
    fill(v[i], sizes[i], 50 + (uint32_t)i);
    bool cpu = i % 3 == 0;
    items[i].ref = put_u8(c, v[i], sizes[i], cpu ? "cpu" : "sim:0").ref;
    items[i].buf = back[i];
    items[i].cap = sizes[i];
    cpu_bytes += cpu && sizes[i] >= ((size_t)256 << 10) ? sizes[i] : 0;
  }
  int64_t written = svc_server_counter(url, "shm_process_written");
  uint64_t begins = atomic_load(&s->requests[TPORT__METHOD__METHOD_GET_BEGIN]);
  tport_err err;
  cr_assert_eq(tport_get_batch(c, items, K, &err), 0, "%s", err.msg);
  for (int i = 0; i < K; i++) {
    cr_assert_eq(items[i].err.code, 0, "element %d: %s", i, items[i].err.msg);
    cr_assert_eq(items[i].nbytes, sizes[i]);
    cr_assert_eq(memcmp(back[i], v[i], sizes[i]), 0, "element %d", i);
  }
  cr_assert_eq(svc_server_counter(url, "shm_process_written") - written, (int64_t)cpu_bytes);
  cr_assert_eq(atomic_load(&s->requests[TPORT__METHOD__METHOD_GET_BEGIN]), begins,
               "an element was gotten by a GetBegin of its own");
  for (int i = 0; i < K; i++)
    free(v[i]), free(back[i]);
  tport_close(c);
  stop(s);
}

/* tportd of two workers (one reader's slot) in this process, chunks of
 * chunk bytes, at most max_transfers gets in progress a connection (0:
 * the default), its one slot held by a get into pages nobody serves yet;
 * c a client of it. */
typedef struct no_slot {
  char url[96];
  server *s;
  tport_client *c, *holder;
  size_t held;
  uint8_t *hv, *slow;
  int uffd;
  tport_tensor_info hinfo;
  pthread_t th;
} no_slot;

static void *stuck_get(void *arg)
{
  no_slot *ns = arg;
  tport_err err;
  tport_get(ns->holder, &ns->hinfo.ref, ns->slow, ns->held, NULL, NULL, NULL,
            &err); /* (served, or given up) */
  return NULL;
}

static void no_slot_start(no_slot *ns, size_t chunk, size_t max_transfers)
{
  server_config cfg;
  svc_config_shm(&cfg, "proc", sock_dir, sizeof sock_dir);
  cfg.chunk_bytes = chunk;
  cfg.workers = 2;
  if (max_transfers)
    cfg.max_transfers = max_transfers;
  ns->s = svc_start_with(&cfg, ns->url, sizeof ns->url);
  ns->c = connect_with(ns->url, false);
  ns->holder = connect_with(ns->url, false);
  ns->held = (size_t)1 << 20;
  ns->hv = malloc(ns->held);
  fill(ns->hv, ns->held, 60);
  ns->hinfo = put_u8(ns->holder, ns->hv, ns->held, "cpu");
  ns->slow = stuck_pages(ns->held, &ns->uffd);
  cr_assert_eq(pthread_create(&ns->th, NULL, stuck_get, ns), 0);
  wait_counter(ns->url, "shm_process_reading", 1, 500);
}

static void no_slot_stop(no_slot *ns)
{
  serve_pages(ns->uffd, ns->slow, ns->held);
  pthread_join(ns->th, NULL);
  close(ns->uffd);
  munmap(ns->slow, ns->held);
  free(ns->hv);
  tport_close(ns->holder);
  tport_close(ns->c);
  stop(ns->s);
}

/* tport_get_batch of k tensors of sizes[i] into buffers of the caller's
 * on ns's client: every element exact, and no transfer left open. */
static void get_all_exact(no_slot *ns, const size_t *sizes, int k)
{
  uint8_t *v[8], *back[8];
  tport_get_item items[8];
  cr_assert_leq(k, 8);
  memset(items, 0, sizeof items);
  for (int i = 0; i < k; i++) {
    v[i] = malloc(sizes[i]);
    back[i] = calloc(1, sizes[i]);
    fill(v[i], sizes[i], 61 + (uint32_t)i);
    items[i].ref = put_u8(ns->c, v[i], sizes[i], "cpu").ref;
    items[i].buf = back[i];
    items[i].cap = sizes[i];
  }
  int64_t written = svc_server_counter(ns->url, "shm_process_written");
  tport_err err;
  cr_assert_eq(tport_get_batch(ns->c, items, (size_t)k, &err), 0, "%s", err.msg);
  for (int i = 0; i < k; i++) {
    cr_assert_eq(items[i].err.code, 0, "element %d: %s", i, items[i].err.msg);
    cr_assert_eq(memcmp(back[i], v[i], sizes[i]), 0, "element %d", i);
  }
  cr_assert_eq(svc_server_counter(ns->url, "shm_process_written"), written, "a write had a slot");
  cr_assert_eq(svc_server_counter(ns->url, "transfers_in_progress"), 0, "a transfer was left open");
  for (int i = 0; i < k; i++)
    free(v[i]), free(back[i]);
}

/* With no reader's slot free for its write, a batch's elements offered a
 * direct write are answered as if they had not been: inline while the
 * reply has room, else deferred -- read by the client in its second
 * window -- and one past a write's bytes, by its GetBegin's transfer,
 * read to its end.  No transfer left open (the connection's limit). */
Test(get_direct, a_batch_with_no_slot_for_its_write_leaves_no_transfer_open, .timeout = 120)
{
  need_pidfd();
  no_slot ns;
  no_slot_start(&ns, (size_t)1 << 20, 0);
  const size_t sizes[] = {300000, 300000, 300000, 300000, 300000, 300000, (size_t)33 << 20};
  get_all_exact(&ns, sizes, 7);
  no_slot_stop(&ns);
}

/* The transfers of large elements not written directly are read before
 * an element fetched again on its own needs one of the connection's
 * --max-transfers (here two): none refused. */
Test(get_direct, late_transfers_are_read_before_gets_of_their_own, .timeout = 120)
{
  need_pidfd();
  no_slot ns;
  no_slot_start(&ns, (size_t)1 << 20, 2);
  const size_t sizes[] = {(size_t)3 << 20, (size_t)33 << 20, (size_t)34 << 20};
  get_all_exact(&ns, sizes, 3);
  no_slot_stop(&ns);
}

/* With chunks of 64 MiB a request's direct bytes pass one write's: the
 * element that makes the request write what it holds, finding no slot,
 * is looked at again as one not written directly -- deferred past the
 * reply's room (defer_large), never given a transfer. */
Test(get_direct, an_element_after_a_failed_write_is_deferred_not_a_transfer, .timeout = 120)
{
  need_pidfd();
  no_slot ns;
  no_slot_start(&ns, (size_t)64 << 20, 0);
  uint64_t mine;
  cr_assert_eq(client_process_region(ns.c, &mine), 0);
  enum { K = 4 };
  /* two inline (50 MiB of the reply's 64), then two offered directly */
  const size_t sizes[K] = {(size_t)30 << 20, (size_t)20 << 20, (size_t)17 << 20, (size_t)16 << 20};
  uint8_t *v = calloc(1, sizes[0]), *back[K];
  Tport__Ref w[K];
  tport_tensor_info info[K]; /* (w[i] points into info[i]) */
  Tport__GetBeginRequest qs[K], *qp[K];
  for (int i = 0; i < K; i++) {
    back[i] = calloc(1, sizes[i]);
    info[i] = put_u8(ns.c, v, sizes[i], "cpu");
    client_ref_to_wire(&info[i].ref, &w[i]);
    tport__get_begin_request__init(&qs[i]);
    qs[i].ref = &w[i];
    qs[i].inline_max = (size_t)64 << 20;
    if (i >= 2) {
      qs[i].direct_region = mine;
      qs[i].direct_addr = (uintptr_t)back[i];
      qs[i].direct_length = sizes[i];
      qs[i].direct_min_bytes = CLIENT_SHM_MIN_BYTES;
    }
    qp[i] = &qs[i];
  }
  Tport__GetBatchRequest q = TPORT__GET_BATCH_REQUEST__INIT;
  q.n_gets = K;
  q.gets = qp;
  q.defer_large = true;
  Tport__GetBatchReply *r = NULL;
  client_payload p = {0};
  tport_err err;
  cr_assert_eq(client_rpc(ns.c, TPORT__METHOD__METHOD_GET_BATCH, &q.base, NULL, 0,
                          &tport__get_batch_reply__descriptor, (ProtobufCMessage **)&r, &p, &err),
               0, "%s", err.msg);
  cr_assert_eq(r->n_gets, K);
  for (int i = 2; i < K; i++) {
    const Tport__GetBeginReply *b = r->gets[i];
    cr_assert(!b->status || b->status->code == 0, "element %d", i);
    cr_assert_eq(b->transfer.len, 0, "element %d was given a transfer", i);
    cr_assert(r->n_deferred == K && r->deferred[i],
              "element %d was not deferred (direct %d, %llu bytes, %zu inline)", i, b->direct,
              (unsigned long long)b->nbytes, p.len);
  }
  cr_assert_eq(svc_server_counter(ns.url, "transfers_in_progress"), 0);
  protobuf_c_message_free_unpacked(&r->base, NULL);
  if (p.msg)
    nng_msg_free(p.msg);
  for (int i = 0; i < K; i++)
    free(back[i]);
  free(v);
  no_slot_stop(&ns);
}
