/*
 * test_shm_process.c: process regions (server/regions.h): over ipc:// a
 * large put's chunks name the caller's own buffer and tportd reads them
 * with process_vm_readv (client/process_region.c).  Checked: the bytes
 * exact from a tportd in another process, through an odd last chunk and
 * with verify; what does not take that way (gets, a device's put, a
 * converted one, TPORT_SHM_DIRECT=0, tcp://); and hostile registrations
 * and slices, each costing its request only.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "client_internal.h"
#include "hold_util.h"
#include "server_internal.h"
#include "service_util.h"

#define CHUNK ((size_t)64 << 10) /* svc_config's and svc_spawn's */
#define SPAN SHM_PROCESS_READ_SPAN  /* a whole number of CHUNKs */

static char sock_dir[64];

static server *start(char *url, size_t len)
{
  server_config cfg;
  svc_config_shm(&cfg, "proc", sock_dir, sizeof sock_dir);
  return svc_start_with(&cfg, url, len);
}

static void stop(server *s)
{
  server_stop(s, 0);
  rmdir(sock_dir);
}

static tport_client *connect_with(const char *url, bool verify)
{
  tport_client *c;
  tport_err err;
  tport_connect_options o = {.timeout_ms = 20000, .verify = verify};
  cr_assert_eq(tport_connect(url, &o, &c, &err), 0, "connect %s: %s", url, err.msg);
  return c;
}

/* tportd holds a client process by a pidfd: without pidfd_open (a kernel
 * before 5.3, valgrind 3.19) it refuses process regions and puts take the
 * region; the tests of the way itself are skipped there. */
static void need_pidfd(void)
{
  int fd = (int)syscall(SYS_pidfd_open, getpid(), 0);
  if (fd < 0 && errno == ENOSYS)
    cr_skip_test("pidfd_open is not available here: no process regions to test");
  if (fd >= 0)
    close(fd);
}

static void fill(uint8_t *p, size_t n, uint32_t seed)
{
  uint32_t x = seed * 2654435761u + 7;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    p[i] = (uint8_t)(x >> 24);
  }
}

/* Puts n bytes (opts may be NULL) and reads them back as they were put. */
static void put_and_check(tport_client *c, size_t n, const tport_put_options *opts, uint32_t seed)
{
  uint8_t *v = malloc(n), *back = malloc(n);
  fill(v, n, seed);
  int64_t sz = (int64_t)n;
  tport_tensor_info info;
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &sz, NULL, v, n, opts, &info, &err), 0, "put: %s",
               err.msg);
  memset(back, 0, n);
  cr_assert_eq(tport_get(c, &info.ref, back, n, NULL, NULL, NULL, &err), 0, "get: %s", err.msg);
  cr_assert_eq(memcmp(v, back, n), 0, "the bytes came back changed (%zu bytes)", n);
  tport_free(c, &info.ref, NULL);
  free(v);
  free(back);
}

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

/* A raw PutBatch of n puts, each committed: from the slice (region, addr,
 * len), or, region 0, len bytes at addr in the payload; converted to int16
 * where convert; by name, replacing, where asked.  fence (NULL: none) and
 * token are the batch's fence.  Each element's status code into code[],
 * its ref into ref[] where OK. */
typedef struct raw_put {
  uint64_t region, addr, len;
  bool convert;
  const char *name;
  bool replace, managed;
} raw_put;

#define RAW(r, a, l) {.region = (r), .addr = (a), .len = (l)}

static void batch_raw(tport_client *c, const raw_put *el, size_t n, const uint64_t *fence,
                      uint64_t token, int *code, tport_ref *ref)
{
  Tport__TensorDesc *desc = calloc(n, sizeof *desc);
  Tport__PutBeginRequest *qs = calloc(n, sizeof *qs), **qp = calloc(n, sizeof *qp);
  Tport__ShmSlice *sl = calloc(n, sizeof *sl);
  int64_t *sz = calloc(n, sizeof *sz);
  uint64_t *lens = calloc(n, sizeof *lens);
  size_t total = 0;
  for (size_t i = 0; i < n; i++)
    total += el[i].region ? 0 : el[i].len;
  uint8_t *payload = malloc(total + 1), *at = payload;
  for (size_t i = 0; i < n; i++) {
    tport_put_options o;
    tport_put_options_init(&o);
    o.has_dtype = el[i].convert;
    o.dtype = TPORT_INT16;
    o.name = el[i].name;
    o.replace = el[i].replace;
    o.managed = el[i].managed;
    sz[i] = (int64_t)el[i].len;
    client_put_request(c, TPORT_UINT8, 1, &sz[i], NULL, &o, &desc[i], &qs[i]);
    qs[i].commit = true;
    if (el[i].region) {
      sl[i] = (Tport__ShmSlice)TPORT__SHM_SLICE__INIT;
      sl[i].region = el[i].region;
      sl[i].offset = el[i].addr;
      sl[i].length = el[i].len;
      qs[i].shm = &sl[i];
    } else {
      memcpy(at, (void *)(uintptr_t)el[i].addr, el[i].len);
      at += el[i].len;
      lens[i] = el[i].len;
    }
    qp[i] = &qs[i];
  }
  Tport__PutBatchRequest q = TPORT__PUT_BATCH_REQUEST__INIT;
  q.n_puts = q.n_payload_bytes = n;
  q.puts = qp;
  q.payload_bytes = lens;
  q.fence_addr = (uint64_t)(uintptr_t)fence;
  q.fence_token = token;
  Tport__PutBatchReply *r = NULL;
  tport_err err;
  cr_assert_eq(client_rpc(c, TPORT__METHOD__METHOD_PUT_BATCH, &q.base, payload, total,
                          &tport__put_batch_reply__descriptor, (ProtobufCMessage **)&r, NULL,
                          &err),
               0, "%s", err.msg);
  cr_assert_eq(r->n_puts, n);
  for (size_t i = 0; i < n; i++) {
    code[i] = r->puts[i]->status ? (int)r->puts[i]->status->code : 0;
    if (!code[i]) {
      tport_tensor_info info;
      client_info_from_wire(r->puts[i]->info, &info);
      ref[i] = info.ref;
    }
  }
  protobuf_c_message_free_unpacked(&r->base, NULL);
  free(desc), free(qs), free(qp), free(sl), free(sz), free(lens), free(payload);
}


static int64_t tenant_counter(const char *url, const char *tenant, const char *name);

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

/* PutBegin of a tensor of n bytes, not committed: its ref into w/handle. */
static void begin_put(tport_client *c, size_t n, Tport__Ref *w, uint8_t *handle)
{
  int64_t sz = (int64_t)n;
  Tport__TensorDesc desc;
  Tport__PutBeginRequest q;
  tport_put_options o;
  tport_put_options_init(&o);
  client_put_request(c, TPORT_UINT8, 1, &sz, NULL, &o, &desc, &q);
  q.commit = false;
  Tport__PutBeginReply *b;
  tport_err err;
  cr_assert_eq(client_rpc(c, TPORT__METHOD__METHOD_PUT_BEGIN, &q.base, NULL, 0,
                          &tport__put_begin_reply__descriptor, (ProtobufCMessage **)&b, NULL, &err),
               0, "%s", err.msg);
  cr_assert_eq(b->ref->handle.len, (size_t)TPORT_HANDLE_BYTES);
  memcpy(handle, b->ref->handle.data, TPORT_HANDLE_BYTES);
  protobuf_c_message_free_unpacked(&b->base, NULL);
  tport__ref__init(w);
  w->handle.data = handle;
  w->handle.len = TPORT_HANDLE_BYTES;
}

/* PutChunk at offset naming slice (region, addr, len), with payload bytes
 * if any: the status code. */
static int chunk_raw(tport_client *c, const Tport__Ref *w, uint64_t offset, uint64_t region,
                     uint64_t addr, uint64_t len, const void *payload, size_t plen)
{
  Tport__ShmSlice sl = TPORT__SHM_SLICE__INIT;
  sl.region = region;
  sl.offset = addr;
  sl.length = len;
  Tport__PutChunkRequest q = TPORT__PUT_CHUNK_REQUEST__INIT;
  q.ref = (Tport__Ref *)w;
  q.offset = offset;
  q.shm = &sl;
  ProtobufCMessage *r = NULL;
  tport_err err;
  int rc = client_rpc(c, TPORT__METHOD__METHOD_PUT_CHUNK, &q.base, payload, plen,
                      &tport__put_chunk_reply__descriptor, &r, NULL, &err);
  if (r)
    protobuf_c_message_free_unpacked(r, NULL);
  return rc;
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

/* n bytes of fresh memory under userfaultfd, whose pages nobody serves
 * until serve_pages: a read of them waits (skipped where userfaultfd is
 * not available). */
static uint8_t *stuck_pages(size_t n, int *uffd)
{
  *uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
  if (*uffd < 0)
    cr_skip_test("userfaultfd is not available here (%s)", strerror(errno));
  struct uffdio_api api = {.api = UFFD_API};
  cr_assert_eq(ioctl(*uffd, UFFDIO_API, &api), 0);
  uint8_t *area = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(area, MAP_FAILED);
  struct uffdio_register reg = {.range = {(uintptr_t)area, n},
                                .mode = UFFDIO_REGISTER_MODE_MISSING};
  cr_assert_eq(ioctl(*uffd, UFFDIO_REGISTER, &reg), 0, "%s", strerror(errno));
  return area;
}

/* Serves them (zeros), a page at a time (a range stops at the first page
 * already there): the reads waiting on them go on. */
static void serve_pages(int uffd, uint8_t *area, size_t n)
{
  for (size_t at = 0; at < n; at += 4096) {
    struct uffdio_zeropage zp = {.range = {(uintptr_t)area + at, 4096}, .mode = 0};
    ioctl(uffd, UFFDIO_ZEROPAGE, &zp); /* EEXIST for a page served already: fine */
  }
  struct uffdio_range all = {(uintptr_t)area, n};
  ioctl(uffd, UFFDIO_WAKE, &all);
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
  need_pidfd();
  size_t n = 8 * CHUNK;
  int uffd;
  uint8_t *area = stuck_pages(n, &uffd);
  char url[96];
  server *s = start(url, sizeof url); /* 4 workers: 3 readers at most, 2 a tenant */
  /* two tenants' puts (each may keep 3 of the 4 workers busy): without a
   * bound on the reads, every worker would wait for ever */
  stuck_put sp[2] = {{url, "stuck1", area, n / 2, -1}, {url, "stuck2", area + n / 2, n / 2, -1}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++)
    cr_assert_eq(pthread_create(&th[i], NULL, put_stuck, &sp[i]), 0);
  /* the server's reads meet the pages: their faults wait for this test */
  struct pollfd pf = {.fd = uffd, .events = POLLIN};
  cr_assert_eq(poll(&pf, 1, 20000), 1, "the server's read never met the stuck pages");
  usleep(500 * 1000); /* the others */
  /* another tenant's large put still goes (by what readers are left, or
   * the region), exact, and a small request is answered */
  tport_client *c = svc_connect(url, "other");
  put_and_check(c, 5 * CHUNK + 7, NULL, 31);
  put_and_check(c, 1000, NULL, 32);
  tport_close(c);
  /* the faults served: the stuck put ends */
  serve_pages(uffd, area, n);
  /* each ends: put once its pages came, or given up by the server after its
   * deadline (the reads that were stuck then) */
  for (int i = 0; i < 2; i++) {
    pthread_join(th[i], NULL);
    cr_assert(sp[i].rc == 0 || sp[i].rc == TPORT_DEADLINE_EXCEEDED, "a stuck put: %d", sp[i].rc);
  }
  close(uffd);
  munmap(area, n);
  stop(s);
}

/* The pages of a put (or a batch's element) that tportd gave up reading,
 * served once it had: the put goes through the region instead, whole. */
static void expect_zeros(tport_client *c, const tport_ref *ref, size_t n)
{
  uint8_t *back = malloc(n), *zero = calloc(1, n);
  memset(back, 0xee, n);
  tport_err err;
  cr_assert_eq(tport_get(c, ref, back, n, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(memcmp(back, zero, n), 0, "the bytes came back changed");
  free(back);
  free(zero);
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
  b->items[0] = (tport_put_item){.dtype = TPORT_UINT8, .ndim = 1, .sizes = &dims[0],
                                 .data = b->area, .nbytes = b->n};
  b->items[1] = (tport_put_item){.dtype = TPORT_UINT8, .ndim = 1, .sizes = &dims[1],
                                 .data = b->small, .nbytes = sizeof b->small};
  tport_put_options keep;
  tport_put_options_init(&keep);
  keep.name = "stuck-batch"; /* outlives this connection */
  b->items[0].opts = &keep;
  tport_err err;
  b->rc = tport_put_batch(c, b->items, 2, &err);
  tport_close(c);
  return NULL;
}

/* Waits up to tries x 10 ms for tportd's counter name to read want. */
static void wait_counter(const char *url, const char *name, int64_t want, int tries)
{
  for (int i = 0; i < tries && svc_server_counter(url, name) != want; i++)
    usleep(10000);
  cr_assert_eq(svc_server_counter(url, name), want, "%s", name);
}

static void wait_stuck(const char *url, int64_t want)
{
  wait_counter(url, "shm_process_stuck", want, 800); /* past the 5 s deadline */
}

/* A read shared by two threads, one half served and the other not until
 * the read was given up: the read ends with its last piece (which frees
 * it) and its slot serves again; the put itself went through the region
 * meanwhile, as does a batch's element whose read was given up. */
Test(shm_process, a_read_given_up_ends_with_its_last_piece_and_its_put_goes_on,
     .timeout = 120)
{
  need_pidfd();
  size_t n = (size_t)2 << 20; /* two pieces */
  int uffd;
  uint8_t *area = stuck_pages(2 * n, &uffd);
  serve_pages(uffd, area, n / 2);
  char url[96];
  server *s = start(url, sizeof url);
  stuck_put sp = {url, "stuck", area, n, -1};
  pthread_t putter;
  cr_assert_eq(pthread_create(&putter, NULL, put_stuck, &sp), 0);
  struct pollfd pf = {.fd = uffd, .events = POLLIN};
  cr_assert_eq(poll(&pf, 1, 20000), 1, "the server's read never met the stuck pages");
  wait_stuck(url, 1);
  cr_assert_eq(svc_server_counter(url, "shm_process_reading"), 1);
  /* the put copies the same pages into the region now: it ends once they
   * come, as does the read given up */
  serve_pages(uffd, area + n / 2, n / 2);
  pthread_join(putter, NULL);
  cr_assert_eq(sp.rc, 0, "the put did not go on through the region: %d", sp.rc);
  wait_counter(url, "shm_process_reading", 0, 200);
  wait_stuck(url, 0);
  /* a batch's element: put again on its own, through the region */
  stuck_batch *b = calloc(1, sizeof *b);
  *b = (stuck_batch){.url = url, .area = area + n, .n = n, .rc = -1};
  cr_assert_eq(pthread_create(&putter, NULL, put_batch_stuck, b), 0);
  wait_stuck(url, 1);
  serve_pages(uffd, area + n, n);
  pthread_join(putter, NULL);
  cr_assert_eq(b->rc, 0, "the batch: %d (%s; %s)", b->rc, b->items[0].err.msg,
               b->items[1].err.msg);
  tport_client *c = svc_connect(url, "stuck");
  tport_ref named = {0};
  snprintf(named.name, sizeof named.name, "stuck-batch");
  expect_zeros(c, &named, n);
  /* the slots serve again */
  int64_t reads = svc_server_counter(url, "shm_process_reads");
  put_and_check(c, n, NULL, 61);
  cr_assert_eq(svc_server_counter(url, "shm_process_reads") - reads, 1);
  tport_close(c);
  free(b);
  close(uffd);
  munmap(area, 2 * n);
  stop(s);
}

/* A counter of tport_stats as tenant sees it. */
static int64_t tenant_counter(const char *url, const char *tenant, const char *name)
{
  tport_client *c = svc_connect(url, tenant);
  tport_counter *cs = NULL;
  size_t n = 0;
  tport_err err;
  cr_assert_eq(tport_stats(c, &cs, &n, &err), 0, "%s", err.msg);
  int64_t v = -1;
  for (size_t i = 0; i < n; i++)
    if (!strcmp(cs[i].name, name))
      v = cs[i].value;
  free(cs);
  tport_close(c);
  return v;
}

/* The charges of tenant "stuck" given back, soon after its reads ended. */
static void wait_charge_gone(const char *url)
{
  /* given back just after the read stops counting */
  for (int i = 0; i < 200 && tenant_counter(url, "stuck", "tensor_bytes") != 0; i++)
    usleep(10000);
  cr_assert_eq(tenant_counter(url, "stuck", "tensor_bytes"), 0, "the charge outlived the read");
}

/* PutBegin of n bytes by hand on c, not committed (w, handle), and c's
 * process region: *mine. */
static void begin_direct_put(tport_client *c, size_t n, Tport__Ref *w, uint8_t *handle,
                             uint64_t *mine)
{
  cr_assert_eq(client_process_region(c, mine), 0);
  begin_put(c, n, w, handle);
}

/* A read given up keeps the tensor it writes after its put is aborted:
 * the tenant pays for it until the read ends (it was nobody's before).
 * The put by hand, so that nothing else of the tenant's is charged. */
Test(shm_process, a_read_given_up_is_charged_to_its_tenant_until_it_ends, .timeout = 120)
{
  need_pidfd();
  size_t n = 4 * CHUNK;
  int uffd;
  uint8_t *area = stuck_pages(n, &uffd);
  char url[96];
  server *s = start(url, sizeof url);
  tport_client *c = svc_connect(url, "stuck");
  uint64_t mine;
  Tport__Ref w;
  uint8_t handle[TPORT_HANDLE_BYTES];
  begin_direct_put(c, n, &w, handle, &mine);
  cr_assert_eq(chunk_raw(c, &w, 0, mine, (uint64_t)(uintptr_t)area, n, NULL, 0),
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
  cr_assert_eq(svc_server_counter(url, "shm_process_stuck"), 1);
  cr_assert_eq(tenant_counter(url, "stuck", "tensors"), 0, "the upload is gone");
  int64_t held = tenant_counter(url, "stuck", "tensor_bytes");
  cr_assert_geq(held, (int64_t)n, "the stuck read's tensor is charged to nobody (%lld bytes)",
                (long long)held);
  serve_pages(uffd, area, n);
  wait_counter(url, "shm_process_reading", 0, 200);
  wait_charge_gone(url);
  close(uffd);
  munmap(area, n);
  stop(s);
}

/* A batch's elements read together, one of them on pages nobody serves:
 * the read is given up, every element gathered fails with it and their
 * tensors stay charged to the tenant until the read ends; through
 * tport_put_batch each is put again on its own (through the region) and
 * comes back exact. */
Test(shm_process, a_gathered_read_given_up_fails_its_elements_and_stays_charged,
     .timeout = 120)
{
  need_pidfd();
  size_t n = 4 * CHUNK;
  int uffd;
  uint8_t *area = stuck_pages(2 * n, &uffd);
  uint8_t *v = malloc(2 * n);
  fill(v, 2 * n, 91);
  char url[96];
  server *s = start(url, sizeof url);
  tport_client *c = svc_connect(url, "stuck");
  uint64_t mine;
  cr_assert_eq(client_process_region(c, &mine), 0);
  raw_put el[] = {RAW(mine, (uint64_t)(uintptr_t)v, n), RAW(mine, (uint64_t)(uintptr_t)area, n),
                  RAW(mine, (uint64_t)(uintptr_t)v + n, n)};
  int code[3];
  tport_ref ref[3];
  static uint64_t fence = 7;
  batch_raw(c, el, 3, &fence, fence, code, ref);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(code[i], TPORT_DEADLINE_EXCEEDED, "element %d: %d", i, code[i]);
  cr_assert_eq(svc_server_counter(url, "shm_process_stuck"), 1);
  cr_assert_eq(tenant_counter(url, "stuck", "tensors"), 0, "an element was stored");
  int64_t held = tenant_counter(url, "stuck", "tensor_bytes");
  cr_assert_geq(held, (int64_t)(3 * n), "the read's tensors are not charged (%lld bytes)",
                (long long)held);
  serve_pages(uffd, area, n);
  wait_counter(url, "shm_process_reading", 0, 200);
  wait_charge_gone(url);
  /* the same through tport_put_batch: given up, then put on their own */
  stuck_batch *b = calloc(1, sizeof *b);
  *b = (stuck_batch){.url = url, .area = area + n, .n = n, .rc = -1};
  pthread_t putter;
  cr_assert_eq(pthread_create(&putter, NULL, put_batch_stuck, b), 0);
  wait_stuck(url, 1);
  serve_pages(uffd, area + n, n);
  pthread_join(putter, NULL);
  cr_assert_eq(b->rc, 0, "the batch: %d (%s; %s)", b->rc, b->items[0].err.msg,
               b->items[1].err.msg);
  tport_ref named = {0};
  snprintf(named.name, sizeof named.name, "stuck-batch");
  expect_zeros(c, &named, n);
  free(b);
  free(v);
  tport_close(c);
  close(uffd);
  munmap(area, 2 * n);
  stop(s);
}

/* A client that stops waiting for a batch (its timeout) while tportd is
 * still reading the elements' bytes: what tportd reads after that is not
 * stored (the batch's fence no longer holds), for the caller may have
 * changed its buffers once tport_put_batch returned. */
Test(shm_process, a_batch_the_client_stopped_waiting_for_stores_nothing, .timeout = 120)
{
  need_pidfd();
  size_t n = 4 * CHUNK;
  int uffd;
  uint8_t *area = stuck_pages(n, &uffd);
  char url[96];
  server *s = start(url, sizeof url);
  tport_client *c;
  tport_err err;
  tport_connect_options o = {.timeout_ms = 1000, .tenant = "fence"};
  cr_assert_eq(tport_connect(url, &o, &c, &err), 0, "%s", err.msg);
  int64_t sz = (int64_t)n;
  tport_put_options keep;
  tport_put_options_init(&keep);
  keep.name = "late"; /* would outlive the connection */
  tport_put_item item = {.dtype = TPORT_UINT8, .ndim = 1, .sizes = &sz, .data = area,
                         .nbytes = n, .opts = &keep};
  int64_t reads = svc_server_counter(url, "shm_process_reads");
  cr_assert_neq(tport_put_batch(c, &item, 1, &err), 0, "the batch did not time out");
  /* the caller has its buffer back: served now, the read ends within its
   * deadline, after the client stopped waiting */
  serve_pages(uffd, area, n);
  wait_counter(url, "shm_process_reading", 0, 700);
  tport_close(c);
  cr_assert_eq(tenant_counter(url, "fence", "tensors"), 0, "what was read late was stored");
  cr_assert_eq(svc_server_counter(url, "shm_process_reads"), reads,
               "a read whose fence had moved was counted as one stored from");
  close(uffd);
  munmap(area, n);
  stop(s);
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
  need_pidfd();
  size_t n = 2 * CHUNK;
  int uffd;
  uint8_t *area = stuck_pages(n, &uffd);
  char url[96];
  server *s = start(url, sizeof url);
  tport_client *c = svc_connect(url, "stuck");
  uint64_t mine;
  Tport__Ref w;
  uint8_t handle[TPORT_HANDLE_BYTES];
  begin_direct_put(c, n, &w, handle, &mine);
  raw_chunk k[2];
  pthread_t th[2];
  for (int i = 0; i < 2; i++) {
    k[i] = (raw_chunk){c, &w, i * CHUNK, mine, (uint64_t)(uintptr_t)area + i * CHUNK, CHUNK, -1};
    cr_assert_eq(pthread_create(&th[i], NULL, chunk_thread, &k[i]), 0);
  }
  for (int i = 0; i < 2; i++) {
    pthread_join(th[i], NULL);
    cr_assert_eq(k[i].rc, TPORT_DEADLINE_EXCEEDED, "chunk %d: %d", i, k[i].rc);
  }
  tport_close(c); /* the upload goes */
  cr_assert_eq(svc_server_counter(url, "shm_process_stuck"), 2);
  int64_t held = tenant_counter(url, "stuck", "tensor_bytes");
  cr_assert(held >= (int64_t)n && held < 2 * (int64_t)n,
            "the tensor two reads keep is charged %lld bytes (%zu once)", (long long)held, n);
  /* the read that paid ends first or second: the other pays on */
  serve_pages(uffd, area, CHUNK);
  wait_counter(url, "shm_process_stuck", 1, 200);
  held = tenant_counter(url, "stuck", "tensor_bytes");
  cr_assert_geq(held, (int64_t)n, "the read still keeping the tensor pays for it (%lld)",
                (long long)held);
  serve_pages(uffd, area + CHUNK, CHUNK);
  wait_charge_gone(url);
  close(uffd);
  munmap(area, n);
  stop(s);
}

/* A connection that closes while its read is still waited for: the read,
 * given up after, is charged to its tenant all the same (the tenant's
 * record is kept for it). */
Test(shm_process, a_read_given_up_after_its_connection_closed_is_charged, .timeout = 120)
{
  need_pidfd();
  size_t n = 4 * CHUNK;
  int uffd;
  uint8_t *area = stuck_pages(n, &uffd);
  char url[96];
  server *s = start(url, sizeof url);
  tport_client *c;
  tport_err err;
  tport_connect_options o = {.tenant = "stuck", .timeout_ms = 2000};
  cr_assert_eq(tport_connect(url, &o, &c, &err), 0, "%s", err.msg);
  uint64_t mine;
  Tport__Ref w;
  uint8_t handle[TPORT_HANDLE_BYTES];
  begin_direct_put(c, n, &w, handle, &mine);
  /* this library's own timeout, long before tportd's */
  cr_assert_eq(chunk_raw(c, &w, 0, mine, (uint64_t)(uintptr_t)area, n, NULL, 0),
               TPORT_DEADLINE_EXCEEDED);
  tport_close(c);
  wait_stuck(url, 1);
  int64_t held = tenant_counter(url, "stuck", "tensor_bytes");
  cr_assert_geq(held, (int64_t)n, "the read given up is charged to nobody (%lld bytes)",
                (long long)held);
  serve_pages(uffd, area, n);
  wait_charge_gone(url);
  close(uffd);
  munmap(area, n);
  stop(s);
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
