/*
 * process_util.c: what the process-region suites share (process_util.h):
 * a tportd in the test's process with a shm socket, raw PutBegin /
 * PutChunk / PutBatch requests naming the caller's memory, memory whose
 * pages fault in only when the test says, and tportd's counters waited for.
 */
#include "process_util.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "client_internal.h"
#include "service_util.h"

char sock_dir[64];

server *start(char *url, size_t len)
{
  server_config cfg;
  svc_config_shm(&cfg, "proc", sock_dir, sizeof sock_dir);
  return svc_start_with(&cfg, url, len);
}

void stop(server *s)
{
  server_stop(s, 0);
  rmdir(sock_dir);
}

tport_client *connect_with(const char *url, bool verify)
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
void need_pidfd(void)
{
  int fd = (int)syscall(SYS_pidfd_open, getpid(), 0);
  if (fd < 0 && errno == ENOSYS)
    cr_skip_test("pidfd_open is not available here: no process regions to test");
  if (fd >= 0)
    close(fd);
}

void fill(uint8_t *p, size_t n, uint32_t seed)
{
  uint32_t x = seed * 2654435761u + 7;
  for (size_t i = 0; i < n; i++) {
    x = x * 1664525u + 1013904223u;
    p[i] = (uint8_t)(x >> 24);
  }
}

/* Puts n bytes (opts may be NULL) and reads them back as they were put. */
void put_and_check(tport_client *c, size_t n, const tport_put_options *opts, uint32_t seed)
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

void batch_raw(tport_client *c, const raw_put *el, size_t n, const uint64_t *fence, uint64_t token,
               int *code, tport_ref *ref)
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
                          &tport__put_batch_reply__descriptor, (ProtobufCMessage **)&r, NULL, &err),
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

/* PutBegin of a tensor of n bytes, not committed: its ref into w/handle. */
void begin_put(tport_client *c, size_t n, Tport__Ref *w, uint8_t *handle)
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
int chunk_raw(tport_client *c, const Tport__Ref *w, uint64_t offset, uint64_t region, uint64_t addr,
              uint64_t len, const void *payload, size_t plen)
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

/* n bytes of fresh memory under userfaultfd, whose pages nobody serves
 * until serve_pages: a read of them waits (skipped where userfaultfd is
 * not available). */
uint8_t *stuck_pages(size_t n, int *uffd)
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
void serve_pages(int uffd, uint8_t *area, size_t n)
{
  for (size_t at = 0; at < n; at += 4096) {
    struct uffdio_zeropage zp = {.range = {(uintptr_t)area + at, 4096}, .mode = 0};
    ioctl(uffd, UFFDIO_ZEROPAGE, &zp); /* EEXIST for a page served already: fine */
  }
  struct uffdio_range all = {(uintptr_t)area, n};
  ioctl(uffd, UFFDIO_WAKE, &all);
}

/* The pages of a put (or a batch's element) that tportd gave up reading,
 * served once it had: the put goes through the region instead, whole. */
void expect_zeros(tport_client *c, const tport_ref *ref, size_t n)
{
  uint8_t *back = malloc(n), *zero = calloc(1, n);
  memset(back, 0xee, n);
  tport_err err;
  cr_assert_eq(tport_get(c, ref, back, n, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(memcmp(back, zero, n), 0, "the bytes came back changed");
  free(back);
  free(zero);
}

/* Waits up to tries x 10 ms for tportd's counter name to read want. */
void wait_counter(const char *url, const char *name, int64_t want, int tries)
{
  for (int i = 0; i < tries && svc_server_counter(url, name) != want; i++)
    usleep(10000);
  cr_assert_eq(svc_server_counter(url, name), want, "%s", name);
}

void wait_stuck(const char *url, int64_t want)
{
  wait_counter(url, "shm_process_stuck", want, 800); /* past the 5 s deadline */
}

/* A counter of tport_stats as tenant sees it. */
int64_t tenant_counter(const char *url, const char *tenant, const char *name)
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
void wait_charge_gone(const char *url)
{
  /* given back just after the read stops counting */
  for (int i = 0; i < 200 && tenant_counter(url, "stuck", "tensor_bytes") != 0; i++)
    usleep(10000);
  cr_assert_eq(tenant_counter(url, "stuck", "tensor_bytes"), 0, "the charge outlived the read");
}

/* PutBegin of n bytes by hand on c, not committed (w, handle), and c's
 * process region: *mine. */
void begin_direct_put(tport_client *c, size_t n, Tport__Ref *w, uint8_t *handle, uint64_t *mine)
{
  cr_assert_eq(client_process_region(c, mine), 0);
  begin_put(c, n, w, handle);
}

tport_tensor_info put_u8(tport_client *c, const uint8_t *v, size_t n, const char *device)
{
  tport_put_options o;
  tport_put_options_init(&o);
  o.device = device;
  int64_t sz = (int64_t)n;
  tport_tensor_info info;
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &sz, NULL, v, n, &o, &info, &err), 0, "put: %s",
               err.msg);
  return info;
}
