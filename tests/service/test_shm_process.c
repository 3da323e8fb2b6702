/*
 * test_shm_process.c: process regions (server/regions.h): over ipc:// a
 * large put's chunks name the caller's own buffer and tportd reads them
 * with process_vm_readv (client/process_region.c).  Checked: the bytes
 * exact from a tportd in another process, through an odd last chunk and
 * with verify; what does not take that way (gets, a device's put, a
 * converted one, TPORT_SHM_DIRECT=0, tcp://); a batch's puts read together
 * behind a fence; and hostile registrations and slices, each costing its
 * request only.  Reads that do not end: test_shm_process_stuck.c.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "client_internal.h"
#include "process_util.h"
#include "server_internal.h"
#include "service_util.h"

Test(shm_process, a_large_put_is_read_from_the_callers_buffer_by_another_process)
{
  need_pidfd();
  char url[96], sock[128];
  svc_ipc_url(url, sizeof url);
  snprintf(sock_dir, sizeof sock_dir, "/tmp/tport-procx-%d", (int)getpid());
  snprintf(sock, sizeof sock, "%s/shm.sock", sock_dir);
  const char *args[] = {"--shm-socket", sock, NULL};
  pid_t pid = svc_spawn(url, args);
  cr_assert_gt(pid, 0, "tportd did not start");
  for (int verify = 0; verify < 2; verify++) {
    tport_client *c = connect_with(url, verify);
    int64_t reads = svc_server_counter(url, "shm_process_reads");
    /* several chunks a request, as many as tportd said it reads at once:
     * five whole chunks and an odd piece in one read, a span and as much
     * again in two */
    cr_assert_eq(c->proc_read_max, SPAN, "the Hello said %llu bytes a read",
                 (unsigned long long)c->proc_read_max);
    put_and_check(c, 5 * CHUNK + 1234, NULL, 1 + (uint32_t)verify);
    cr_assert_eq(svc_server_counter(url, "shm_process_reads") - reads, 1,
                 "tportd did not read the six chunks from this process at once (verify %d)",
                 verify);
    put_and_check(c, SPAN + 5 * CHUNK + 1234, NULL, 3 + (uint32_t)verify);
    cr_assert_eq(svc_server_counter(url, "shm_process_reads") - reads, 3,
                 "tportd did not read a span and six chunks in two (verify %d)", verify);
    /* a read of a MiB or more is shared by threads: not at a page's end */
    put_and_check(c, ((size_t)1 << 20) + 3 * CHUNK + 777, NULL, 5 + (uint32_t)verify);
    cr_assert_eq(svc_server_counter(url, "shm_process_reads") - reads, 4);
    cr_assert_eq(svc_server_counter(url, "shm_process_regions"), 1);
    tport_close(c);
  }
  /* the region goes with its connection */
  for (int i = 0; i < 100 && svc_server_counter(url, "shm_process_regions") != 0; i++)
    usleep(10000);
  cr_assert_eq(svc_server_counter(url, "shm_process_regions"), 0);
  cr_assert_eq(svc_terminate(pid), 0);
  rmdir(sock_dir);
}

/* What the server reads at once is heard again on every Hello: a client
 * that redials (the server restarted; it may be another version) follows
 * the new one.  Here the figure is spoiled before the restart, and the new
 * server's Hello puts it right. */
Test(shm_process, a_redial_hears_how_much_the_server_reads_at_once, .timeout = 60)
{
  need_pidfd();
  char url[96], sock[128];
  svc_ipc_url(url, sizeof url);
  snprintf(sock_dir, sizeof sock_dir, "/tmp/tport-procr-%d", (int)getpid());
  snprintf(sock, sizeof sock, "%s/shm.sock", sock_dir);
  const char *args[] = {"--shm-socket", sock, NULL};
  pid_t pid = svc_spawn(url, args);
  cr_assert_gt(pid, 0, "tportd did not start");
  tport_client *c = connect_with(url, false);
  cr_assert_eq(atomic_load(&c->proc_read_max), SPAN);
  atomic_store(&c->proc_read_max, 0);
  cr_assert_eq(client_process_span(c, CHUNK), CHUNK, "no figure: a chunk a request");
  cr_assert_eq(svc_terminate(pid), 0);
  pid = -1;
  for (int tries = 0; tries < 50 && pid <= 0; tries++) {
    pid = svc_spawn(url, args);
    if (pid <= 0)
      usleep(100 * 1000);
  }
  cr_assert_gt(pid, 0, "tportd did not start again on %s", url);
  /* one call may go out before the new connection is seen; then a put of
   * more than a chunk is read at once again */
  uint8_t *v = malloc(3 * CHUNK);
  fill(v, 3 * CHUNK, 71);
  int64_t sz = 3 * CHUNK;
  tport_err err;
  int rc = -1;
  for (int calls = 0; rc && calls < 40; calls++)
    if ((rc = tport_put(c, TPORT_UINT8, 1, &sz, NULL, v, 3 * CHUNK, NULL, NULL, &err)) != 0)
      usleep(250 * 1000);
  cr_assert_eq(rc, 0, "no put served after the restart: %s", err.msg);
  cr_assert_eq(atomic_load(&c->proc_read_max), SPAN, "the new Hello's figure was not taken");
  int64_t reads = svc_server_counter(url, "shm_process_reads");
  put_and_check(c, 3 * CHUNK, NULL, 72);
  cr_assert_eq(svc_server_counter(url, "shm_process_reads") - reads, 1);
  free(v);
  tport_close(c);
  cr_assert_eq(svc_terminate(pid), 0);
  rmdir(sock_dir);
}

/* A process the kernel keeps from its own user (not dumpable, as a setuid
 * program's is) is not read, though tportd runs as root here (its readers
 * drop CAP_SYS_PTRACE): the registration is refused, and puts take the
 * region. */
Test(shm_process, a_process_not_dumpable_is_not_read)
{
  need_pidfd();
  char url[96], sock[128];
  svc_ipc_url(url, sizeof url);
  snprintf(sock_dir, sizeof sock_dir, "/tmp/tport-procd-%d", (int)getpid());
  snprintf(sock, sizeof sock, "%s/shm.sock", sock_dir);
  const char *args[] = {"--shm-socket", sock, NULL};
  pid_t pid = svc_spawn(url, args);
  cr_assert_gt(pid, 0, "tportd did not start");
  cr_assert_eq(prctl(PR_SET_DUMPABLE, 0), 0);
  tport_client *c = connect_with(url, false);
  int64_t reads = svc_server_counter(url, "shm_process_reads");
  put_and_check(c, 5 * CHUNK, NULL, 41);
  cr_assert_eq(svc_server_counter(url, "shm_process_reads"), reads,
               "tportd read a process that is not dumpable");
  cr_assert_eq(svc_server_counter(url, "shm_process_regions"), 0);
  uint64_t id;
  cr_assert_neq(client_process_region(c, &id), 0);
  tport_close(c);
  prctl(PR_SET_DUMPABLE, 1);
  cr_assert_eq(svc_terminate(pid), 0);
  rmdir(sock_dir);
}

Test(shm_process, what_does_not_take_the_callers_buffer)
{
  need_pidfd();
  char url[96];
  server *s = start(url, sizeof url);
  tport_client *c = connect_with(url, false);
  int64_t reads = svc_server_counter(url, "shm_process_reads");
  /* a chunk or less: one request through the region or the socket */
  put_and_check(c, CHUNK, NULL, 3);
  /* to a device, and converted: the region serves them */
  tport_put_options o;
  tport_put_options_init(&o);
  o.device = "sim:0";
  put_and_check(c, 4 * CHUNK, &o, 4);
  cr_assert_eq(svc_server_counter(url, "shm_process_reads"), reads,
               "a small put or a device's read the caller's memory");
  put_and_check(c, 4 * CHUNK, NULL, 5);
  cr_assert_eq(svc_server_counter(url, "shm_process_reads") - reads, 1);
  tport_close(c);
  /* turned off in the environment */
  setenv("TPORT_SHM_DIRECT", "0", 1);
  c = connect_with(url, false);
  unsetenv("TPORT_SHM_DIRECT");
  reads = svc_server_counter(url, "shm_process_reads");
  put_and_check(c, 4 * CHUNK, NULL, 6);
  cr_assert_eq(svc_server_counter(url, "shm_process_reads"), reads);
  tport_close(c);
  stop(s);
}

Test(shm_process, a_put_batchs_large_elements_are_read_from_the_callers_buffers)
{
  need_pidfd();
  char url[96];
  server *s = start(url, sizeof url);
  tport_client *c = connect_with(url, false);
  /* two of more than a chunk (a span and 3 + 1 chunks: two reads; 2
   * chunks: one), one small, one large but converted (the region's) */
  enum { K = 4 };
  size_t sizes[K] = {SPAN + 3 * CHUNK + 100, 1000, 2 * CHUNK, 2 * CHUNK};
  uint8_t *v[K];
  int64_t dims[K];
  tport_put_item items[K];
  tport_put_options conv;
  tport_put_options_init(&conv);
  conv.has_dtype = true;
  conv.dtype = TPORT_INT16;
  for (int i = 0; i < K; i++) {
    v[i] = malloc(sizes[i]);
    fill(v[i], sizes[i], 20 + (uint32_t)i);
    dims[i] = (int64_t)sizes[i];
    items[i] = (tport_put_item){.dtype = TPORT_UINT8,
                                .ndim = 1,
                                .sizes = &dims[i],
                                .data = v[i],
                                .nbytes = sizes[i],
                                .opts = i == 3 ? &conv : NULL};
  }
  int64_t reads = svc_server_counter(url, "shm_process_reads");
  tport_err err;
  cr_assert_eq(tport_put_batch(c, items, K, &err), 0, "%s", err.msg);
  cr_assert_eq(svc_server_counter(url, "shm_process_reads") - reads, 2 + 1,
               "the large elements' chunks were not read from this process");
  for (int i = 0; i < K; i++) {
    cr_assert_eq(items[i].err.code, 0, "element %d: %s", i, items[i].err.msg);
    size_t n = sizes[i] * (i == 3 ? 2 : 1);
    uint8_t *back = calloc(1, n);
    cr_assert_eq(tport_get(c, &items[i].info.ref, back, n, NULL, NULL, NULL, &err), 0, "%s",
                 err.msg);
    for (size_t k = 0; k < sizes[i]; k++) {
      int got = i == 3 ? ((int16_t *)back)[k] : back[k];
      cr_assert_eq(got, v[i][k], "element %d byte %zu", i, k);
    }
    free(back);
    free(v[i]);
  }
  tport_close(c);
  stop(s);
}

/* A batch of n elements sizes[i] bytes (seed 40 + i): put, read back exact;
 * the reads of this process's memory it took. */
static int64_t batch_and_check(tport_client *c, const char *url, const size_t *sizes, int n)
{
  uint8_t **v = calloc((size_t)n, sizeof *v);
  int64_t *dims = calloc((size_t)n, sizeof *dims);
  tport_put_item *items = calloc((size_t)n, sizeof *items);
  for (int i = 0; i < n; i++) {
    v[i] = malloc(sizes[i] ? sizes[i] : 1);
    fill(v[i], sizes[i], 40 + (uint32_t)i);
    dims[i] = (int64_t)sizes[i];
    items[i] = (tport_put_item){
        .dtype = TPORT_UINT8, .ndim = 1, .sizes = &dims[i], .data = v[i], .nbytes = sizes[i]};
  }
  int64_t reads = svc_server_counter(url, "shm_process_reads");
  tport_err err;
  cr_assert_eq(tport_put_batch(c, items, (size_t)n, &err), 0, "%s", err.msg);
  reads = svc_server_counter(url, "shm_process_reads") - reads;
  for (int i = 0; i < n; i++) {
    cr_assert_eq(items[i].err.code, 0, "element %d: %s", i, items[i].err.msg);
    cr_assert_eq(items[i].info.nbytes, (int64_t)sizes[i]);
    uint8_t *back = calloc(1, sizes[i] ? sizes[i] : 1);
    cr_assert_eq(tport_get(c, &items[i].info.ref, back, sizes[i], NULL, NULL, NULL, &err), 0,
                 "%s", err.msg);
    cr_assert_eq(memcmp(back, v[i], sizes[i]), 0, "element %d came back changed", i);
    tport_free(c, &items[i].info.ref, NULL);
    free(back);
    free(v[i]);
  }
  free(v), free(dims), free(items);
  return reads;
}

Test(shm_process, a_batchs_direct_elements_are_read_together)
{
  need_pidfd();
  char url[96];
  server *s = start(url, sizeof url);
  for (int verify = 0; verify < 2; verify++) {
    tport_client *c = connect_with(url, verify);
    cr_assert(c->proc_put_once, "the Hello did not offer puts read in one request");
    /* a state dict's mix: weights of a quarter MiB to several chunks (one
     * read for all), the small ones beside them through the region */
    size_t sizes[] = {256 << 10, 100, 3 * CHUNK + 5, 1 << 20, 0, (1 << 20) + 4096 + 3,
                      (256 << 10) + 1, 7, 5 * CHUNK};
    int n = (int)(sizeof sizes / sizeof *sizes);
    cr_assert_eq(batch_and_check(c, url, sizes, n), 1, "not one read (verify %d)", verify);
    /* more than tportd reads for one request: a read a request, each as
     * full as the order allows (a span, then 300 KiB and half a span, then
     * half a span) */
    size_t big[] = {SPAN / 2, SPAN / 2, 300 << 10, SPAN / 2 + 1, SPAN / 2};
    cr_assert_eq(batch_and_check(c, url, big, 5), 3, "(verify %d)", verify);
    tport_close(c);
  }
  stop(s);
}

/* The bytes of ref are len bytes at p. */
static void expect_bytes(tport_client *c, const tport_ref *ref, const void *p, size_t len)
{
  uint8_t *back = calloc(1, len ? len : 1);
  tport_err err;
  cr_assert_eq(tport_get(c, ref, back, len, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(memcmp(back, p, len), 0, "the bytes came back changed");
  free(back);
}

/* A batch's element put into managed memory is not read from the caller's
 * buffer (tportd stores only plain cpu tensors that way): it is answered
 * by the put's own rules (managed memory is a device's), beside one that
 * is read. */
Test(shm_process, a_managed_element_of_a_batch_is_not_read_directly)
{
  need_pidfd();
  char url[96];
  server *s = start(url, sizeof url);
  tport_client *c = connect_with(url, false);
  size_t n = 512 << 10;
  uint8_t *v = malloc(2 * n);
  fill(v, 2 * n, 66);
  int64_t sz = (int64_t)n;
  tport_put_options managed;
  tport_put_options_init(&managed);
  managed.managed = true;
  tport_put_item items[2] = {
      {.dtype = TPORT_UINT8, .ndim = 1, .sizes = &sz, .data = v, .nbytes = n, .opts = &managed},
      {.dtype = TPORT_UINT8, .ndim = 1, .sizes = &sz, .data = v + n, .nbytes = n}};
  int64_t reads = svc_server_counter(url, "shm_process_reads");
  tport_err err;
  cr_assert_neq(tport_put_batch(c, items, 2, &err), 0);
  cr_assert_neq(items[0].err.code, 0);
  cr_assert(strstr(items[0].err.msg, "managed memory needs a device"), "%s", items[0].err.msg);
  cr_assert_eq(items[1].err.code, 0, "%s", items[1].err.msg);
  cr_assert_eq(svc_server_counter(url, "shm_process_reads") - reads, 1);
  expect_bytes(c, &items[1].info.ref, v + n, n);
  free(v);
  tport_close(c);
  stop(s);
}

Test(shm_process, many_small_elements_are_read_directly_a_few_ride)
{
  need_pidfd();
  char url[96];
  server *s = start(url, sizeof url);
  tport_client *c = connect_with(url, false);
  /* 300 of 4 KiB: as many bytes as would take the region, read instead,
   * 256 elements a request */
  enum { N = 300 };
  size_t *sizes = malloc(N * sizeof *sizes);
  for (int i = 0; i < N; i++)
    sizes[i] = i % 7 == 3 ? 0 : 4096 + (size_t)(i % 5);
  cr_assert_eq(batch_and_check(c, url, sizes, N), 2);
  /* a few small ones ride in the request */
  size_t few[] = {100, 4096, 1};
  cr_assert_eq(batch_and_check(c, url, few, 3), 0);
  free(sizes);
  tport_close(c);
  stop(s);
}

Test(shm_process, hostile_direct_elements_of_a_batch_cost_their_element_only)
{
  need_pidfd();
  char url[96];
  server *s = start(url, sizeof url);
  tport_client *c = svc_connect(url, "hostile"), *other = svc_connect(url, "other");
  uint64_t mine, theirs;
  cr_assert_eq(client_process_region(c, &mine), 0);
  cr_assert_eq(client_process_region(other, &theirs), 0);
  size_t n = 4 * CHUNK;
  uint8_t *v = malloc(n);
  fill(v, n, 77);
  uint64_t at = (uint64_t)(uintptr_t)v;
  void *hole = mmap(NULL, 2 * 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(hole, MAP_FAILED);
  cr_assert_eq(munmap(hole, 2 * 4096), 0);
  /* good ones around an unmapped page, a range that wraps, a converted
   * put, more than one request reads; then another connection's region */
  raw_put el[] = {RAW(mine, at, CHUNK),
                  RAW(mine, (uint64_t)(uintptr_t)hole, 4096),
                  RAW(mine, at + CHUNK, CHUNK),
                  RAW(mine, UINT64_MAX - 100, 4096),
                  {.region = mine, .addr = at, .len = CHUNK, .convert = true},
                  RAW(mine, at, SPAN),
                  RAW(mine, at + 2 * CHUNK, 2 * CHUNK),
                  RAW(theirs, at, CHUNK)};
  int want[] = {0, TPORT_OUT_OF_RANGE, 0, TPORT_OUT_OF_RANGE, TPORT_INVALID_ARGUMENT,
                TPORT_OUT_OF_RANGE, 0, TPORT_NOT_FOUND};
  enum { K = sizeof el / sizeof *el };
  int code[K];
  tport_ref ref[K];
  static uint64_t fence = 0x5eed;
  int64_t reads = svc_server_counter(url, "shm_process_reads");
  batch_raw(c, el, K, &fence, fence, code, ref);
  for (int i = 0; i < K; i++)
    cr_assert_eq(code[i], want[i], "element %d: %d, not %d", i, code[i], want[i]);
  /* the good ones stored exact, in the one read that met the hole */
  cr_assert_eq(svc_server_counter(url, "shm_process_reads") - reads, 1);
  for (int i = 0; i < K; i++)
    if (!want[i])
      expect_bytes(c, &ref[i], (void *)(uintptr_t)el[i].addr, el[i].len);
  /* what the batch charged and did not store was given back: with the
   * stored ones freed, the tenant holds nothing */
  for (int i = 0; i < K; i++)
    if (!want[i])
      tport_free(c, &ref[i], NULL);
  cr_assert_eq(tenant_counter(url, "hostile", "tensor_bytes"), 0);
  free(v);
  tport_close(other);
  tport_close(c);
  stop(s);
}

/* A batch's puts from the client's memory name a fence that holds its
 * token while the client waits (else nothing is stored: the client may
 * have changed the bytes by then), come together, and take their names in
 * the batch's order. */
Test(shm_process, a_batchs_reads_need_a_live_fence_and_keep_its_order)
{
  need_pidfd();
  char url[96];
  server *s = start(url, sizeof url);
  tport_client *c = svc_connect(url, "fence");
  uint64_t mine;
  cr_assert_eq(client_process_region(c, &mine), 0);
  size_t n = 4 * CHUNK;
  uint8_t *v = malloc(n);
  fill(v, n, 55);
  uint64_t at = (uint64_t)(uintptr_t)v;
  int code[3];
  tport_ref ref[3];
  /* no fence: refused, the payload's element stored */
  raw_put two[] = {RAW(mine, at, CHUNK), RAW(0, at + CHUNK, CHUNK)};
  batch_raw(c, two, 2, NULL, 0, code, ref);
  cr_assert_eq(code[0], TPORT_INVALID_ARGUMENT);
  cr_assert_eq(code[1], 0);
  tport_free(c, &ref[1], NULL);
  /* a fence that no longer holds the token: read, nothing stored (nor
   * counted as a read stored from) */
  static uint64_t fence = 0;
  int64_t reads = svc_server_counter(url, "shm_process_reads");
  raw_put gone[] = {RAW(mine, at, CHUNK), RAW(mine, at + CHUNK, 2 * CHUNK)};
  batch_raw(c, gone, 2, &fence, 0x1234, code, ref);
  cr_assert_eq(code[0], TPORT_ABORTED);
  cr_assert_eq(code[1], TPORT_ABORTED);
  cr_assert_eq(svc_server_counter(url, "shm_process_reads"), reads);
  cr_assert_eq(tenant_counter(url, "fence", "tensors"), 0, "a put was stored");
  cr_assert_eq(tenant_counter(url, "fence", "tensor_bytes"), 0, "a charge was kept");
  /* a zero token, managed memory: refused */
  fence = 0;
  batch_raw(c, two, 1, &fence, 0, code, ref);
  cr_assert_eq(code[0], TPORT_INVALID_ARGUMENT, "a zero token");
  raw_put managed[] = {{.region = mine, .addr = at, .len = CHUNK, .managed = true}};
  fence = 9;
  batch_raw(c, managed, 1, &fence, fence, code, ref);
  cr_assert_eq(code[0], TPORT_INVALID_ARGUMENT, "managed memory");
  /* a client's tokens: never zero, never the same twice */
  uint64_t t1 = client_fence_token(), t2 = client_fence_token();
  cr_assert(t1 && t2 && t1 != t2);
  /* the order: the read one named "w" first, the payload's after it */
  fence = 0x1234;
  raw_put order[] = {{.region = mine, .addr = at, .len = CHUNK, .name = "w", .replace = true},
                     {.addr = at + CHUNK, .len = CHUNK, .name = "w", .replace = true},
                     RAW(mine, at + 2 * CHUNK, CHUNK)};
  batch_raw(c, order, 3, &fence, fence, code, ref);
  cr_assert_eq(code[0], 0);
  cr_assert_eq(code[1], 0);
  cr_assert_eq(code[2], TPORT_INVALID_ARGUMENT, "a second read in one batch");
  tport_ref w = {0};
  snprintf(w.name, sizeof w.name, "w");
  expect_bytes(c, &w, v + CHUNK, CHUNK);
  tport_free(c, &w, NULL);
  free(v);
  tport_close(c);
  stop(s);
}

/* One step of ShmRegister of a process region, raw: the status code; the
 * first (addr 0) fills *id and token. */
static int register_raw(tport_client *c, uint64_t addr, bool with_ipc, uint64_t *id, uint8_t *token)
{
  Tport__ShmRegisterRequest q = TPORT__SHM_REGISTER_REQUEST__INIT;
  q.process = true;
  q.process_probe_addr = addr;
  q.process_region = *id;
  uint8_t handle[64] = {1};
  if (with_ipc) {
    q.cuda_ipc_handle.data = handle;
    q.cuda_ipc_handle.len = sizeof handle;
  }
  Tport__ShmRegisterReply *a = NULL;
  tport_err err;
  int rc = client_rpc(c, TPORT__METHOD__METHOD_SHM_REGISTER, &q.base, NULL, 0,
                      &tport__shm_register_reply__descriptor, (ProtobufCMessage **)&a, NULL, &err);
  if (!rc) {
    cr_assert_eq(a->ready, addr != 0, "the first step is not ready, the second is");
    if (!addr) {
      cr_assert_eq(a->token.len, (size_t)16);
      memcpy(token, a->token.data, 16);
      *id = a->region;
    }
    protobuf_c_message_free_unpacked(&a->base, NULL);
  }
  return rc;
}

Test(shm_process, a_registration_proves_its_process)
{
  need_pidfd();
  char url[96];
  server_config cfg;
  svc_config_shm(&cfg, "procr", sock_dir, sizeof sock_dir);
  cfg.shm_token_ms = 300;
  server *s = svc_start_with(&cfg, url, sizeof url);
  tport_client *c = connect_with(url, false), *other = connect_with(url, false);
  static uint8_t probe[16];
  uint8_t token[16];
  uint64_t id = 0, at = (uint64_t)(uintptr_t)probe;
  cr_assert_eq(register_raw(c, 0, true, &id, token), TPORT_INVALID_ARGUMENT);
  /* the token is not where the client says: refused, and the region gone;
   * an address with nothing there is refused alike (what another process
   * holds is not the client's to learn) */
  cr_assert_eq(register_raw(c, 0, false, &id, token), 0);
  memcpy(probe, token, 16);
  probe[15] ^= 1;
  cr_assert_eq(register_raw(c, at, false, &id, token), TPORT_PERMISSION_DENIED);
  cr_assert_eq(register_raw(c, at, false, &id, token), TPORT_NOT_FOUND);
  cr_assert_eq(register_raw(c, 0, false, &id, token), 0);
  cr_assert_eq(register_raw(c, 4096, false, &id, token), TPORT_PERMISSION_DENIED);
  cr_assert_eq(register_raw(c, UINT64_MAX - 3, false, &id, (uint8_t[16]){0}), TPORT_NOT_FOUND);
  /* confirmed too late */
  cr_assert_eq(register_raw(c, 0, false, &id, token), 0);
  memcpy(probe, token, 16);
  usleep(400 * 1000);
  cr_assert_eq(register_raw(c, at, false, &id, token), TPORT_DEADLINE_EXCEEDED);
  cr_assert_eq(svc_server_counter(url, "shm_process_regions"), 0,
               "a refused registration left a region");
  /* another connection cannot confirm it */
  cr_assert_eq(register_raw(c, 0, false, &id, token), 0);
  memcpy(probe, token, 16);
  cr_assert_eq(register_raw(other, at, false, &id, token), TPORT_NOT_FOUND);
  cr_assert_eq(register_raw(c, at, false, &id, token), 0);
  cr_assert_eq(register_raw(c, at, false, &id, token), TPORT_ALREADY_EXISTS);
  uint64_t again = 0;
  cr_assert_eq(register_raw(c, 0, false, &again, token), TPORT_ALREADY_EXISTS);
  cr_assert_eq(svc_server_counter(url, "shm_process_regions"), 1);
  tport_close(other);
  tport_close(c);
  stop(s);
}

Test(shm_process, not_over_tcp)
{
  char url[96];
  server_config cfg;
  svc_config_shm(&cfg, "proct", sock_dir, sizeof sock_dir);
  svc_tcp_url(url, sizeof url);
  for (int i = 0; i < cfg.nlisten; i++)
    free(cfg.listen[i]);
  cfg.listen[0] = strdup(url);
  cfg.nlisten = 1;
  server *s;
  tport_err err;
  cr_assert_eq(server_start(&cfg, &s, &err), 0, "%s", err.msg);
  config_free(&cfg);
  tport_client *c = connect_with(url, false);
  uint8_t token[16];
  uint64_t none = 0;
  /* the peer's pid is not known over tcp: nothing to read from */
  cr_assert_eq(register_raw(c, 0, false, &none, token), TPORT_FAILED_PRECONDITION);
  uint64_t id;
  cr_assert_neq(client_process_region(c, &id), 0, "a tcp:// client took a process region");
  put_and_check(c, 4 * CHUNK, NULL, 8);
  tport_close(c);
  stop(s);
}

Test(shm_process, hostile_slices_of_a_process_region_cost_their_request_only)
{
  need_pidfd();
  char url[96];
  server *s = start(url, sizeof url);
  tport_client *c = connect_with(url, false), *other = connect_with(url, false);
  uint64_t mine, theirs;
  cr_assert_eq(client_process_region(c, &mine), 0);
  cr_assert_eq(client_process_region(other, &theirs), 0);
  cr_assert_neq(mine, theirs);
  size_t n = 2 * CHUNK;
  uint8_t *v = malloc(n);
  fill(v, n, 11);
  Tport__Ref w;
  uint8_t handle[TPORT_HANDLE_BYTES];
  begin_put(c, n, &w, handle);
  uint64_t at = (uint64_t)(uintptr_t)v;
  /* an unmapped page, a range that wraps, one that runs off the mapping */
  void *hole = mmap(NULL, 2 * 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(hole, MAP_FAILED);
  cr_assert_eq(munmap(hole, 2 * 4096), 0);
  cr_assert_eq(chunk_raw(c, &w, 0, mine, (uint64_t)(uintptr_t)hole, CHUNK, NULL, 0),
               TPORT_OUT_OF_RANGE);
  cr_assert_eq(chunk_raw(c, &w, 0, mine, UINT64_MAX - 100, CHUNK, NULL, 0), TPORT_OUT_OF_RANGE);
  cr_assert_eq(chunk_raw(c, &w, 0, mine, 0, CHUNK, NULL, 0), TPORT_OUT_OF_RANGE);
  /* the wrong size for the chunk, not a whole number of chunks, past the
   * tensor's end, more than tportd reads at once, a payload besides */
  cr_assert_eq(chunk_raw(c, &w, 0, mine, at, CHUNK - 1, NULL, 0), TPORT_INVALID_ARGUMENT);
  cr_assert_eq(chunk_raw(c, &w, 0, mine, at, CHUNK + 1, NULL, 0), TPORT_INVALID_ARGUMENT);
  cr_assert_eq(chunk_raw(c, &w, CHUNK, mine, at, 2 * CHUNK, NULL, 0), TPORT_INVALID_ARGUMENT);
  cr_assert_eq(chunk_raw(c, &w, 0, mine, at, SPAN + CHUNK, NULL, 0), TPORT_INVALID_ARGUMENT);
  cr_assert_eq(chunk_raw(c, &w, 0, mine, at, CHUNK, v, 16), TPORT_INVALID_ARGUMENT);
  /* another connection's process region is none of this one's */
  cr_assert_eq(chunk_raw(c, &w, 0, theirs, at, CHUNK, NULL, 0), TPORT_NOT_FOUND);
  /* a whole put naming the client's memory: a batch's element only (a
   * batch has a fence) */
  {
    int64_t sz = (int64_t)CHUNK;
    Tport__TensorDesc desc;
    Tport__PutBeginRequest q;
    tport_put_options o;
    tport_put_options_init(&o);
    client_put_request(c, TPORT_UINT8, 1, &sz, NULL, &o, &desc, &q);
    q.commit = true;
    Tport__ShmSlice sl = TPORT__SHM_SLICE__INIT;
    sl.region = mine;
    sl.offset = at;
    sl.length = CHUNK;
    q.shm = &sl;
    ProtobufCMessage *r = NULL;
    tport_err err;
    cr_assert_eq(client_rpc(c, TPORT__METHOD__METHOD_PUT_BEGIN, &q.base, NULL, 0,
                            &tport__put_begin_reply__descriptor, &r, NULL, &err),
                 TPORT_INVALID_ARGUMENT);
    cr_assert(strstr(err.msg, "client's own memory"), "%s", err.msg);
  }
  /* the put still completes from good slices, exact: both chunks at once */
  cr_assert_eq(chunk_raw(c, &w, 0, mine, at, 2 * CHUNK, NULL, 0), 0);
  Tport__PutCommitRequest cq = TPORT__PUT_COMMIT_REQUEST__INIT;
  cq.ref = &w;
  Tport__PutCommitReply *cr;
  tport_err err;
  cr_assert_eq(client_rpc(c, TPORT__METHOD__METHOD_PUT_COMMIT, &cq.base, NULL, 0,
                          &tport__put_commit_reply__descriptor, (ProtobufCMessage **)&cr, NULL,
                          &err),
               0, "%s", err.msg);
  tport_tensor_info info;
  client_info_from_wire(cr->info, &info);
  protobuf_c_message_free_unpacked(&cr->base, NULL);
  uint8_t *back = calloc(1, n);
  cr_assert_eq(tport_get(c, &info.ref, back, n, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(memcmp(back, v, n), 0);
  free(back);
  free(v);
  tport_close(other);
  tport_close(c);
  stop(s);
}
