/*
 * test_get_direct.c: a get written straight into the caller's buffer
 * (server/get_direct.h, client/process_region.c): over ipc:// tportd writes
 * a large cpu tensor into the caller's memory with process_vm_writev.
 * Checked: the bytes exact (verified or not, into a larger buffer whose
 * tail stays as it was); what goes another way (small, a device's, a
 * non-contiguous tensor, tport_get_alloc, TPORT_SHM_DIRECT=0); a
 * destination of another dtype gets nothing; hostile requests (memory that
 * is not there or not writable, an address that wraps, another
 * connection's region, a region that is not a process region), each
 * costing its request only; and a write that never ends, given up and said
 * so, which lands once its pages are served.
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

#define BIG (5 * CHUNK + 1234) /* past CLIENT_SHM_MIN_BYTES */

static void count_progress(void *arg, size_t done, size_t total)
{
  size_t *last = arg;
  cr_assert_leq(done, total);
  *last = done;
}

Test(get_direct, a_large_get_is_written_into_the_callers_buffer)
{
  need_pidfd();
  char url[96];
  server *s = start(url, sizeof url);
  for (int verify = 0; verify < 2; verify++) {
    tport_client *c = connect_with(url, verify);
    cr_assert(c->proc_gets, "the Hello did not offer direct gets");
    uint8_t *v = malloc(BIG), *back = malloc(BIG + 100);
    fill(v, BIG, 7 + (uint32_t)verify);
    tport_tensor_info info = put_u8(c, v, BIG, "cpu");
    memset(back, 0xa5, BIG + 100);
    int64_t writes = svc_server_counter(url, "shm_process_writes"),
            written = svc_server_counter(url, "shm_process_written");
    size_t last = 0;
    tport_err err;
    /* room for more than the tensor: only its bytes are written */
    cr_assert_eq(tport_get(c, &info.ref, back, BIG + 100, NULL, count_progress, &last, &err), 0,
                 "%s", err.msg);
    cr_assert_eq(svc_server_counter(url, "shm_process_writes") - writes, 1,
                 "the get was not written into the buffer (verify %d)", verify);
    cr_assert_eq(svc_server_counter(url, "shm_process_written") - written, BIG);
    cr_assert_eq(memcmp(back, v, BIG), 0, "the bytes came back changed (verify %d)", verify);
    for (size_t i = BIG; i < BIG + 100; i++)
      cr_assert_eq(back[i], 0xa5, "byte %zu past the tensor was written", i);
    cr_assert_eq(last, BIG, "progress stopped at %zu", last);
    /* a MiB or more: two threads write it, each its part */
    size_t big = ((size_t)3 << 20) + 4097;
    uint8_t *v2 = malloc(big), *back2 = calloc(1, big);
    fill(v2, big, 11);
    tport_tensor_info i2 = put_u8(c, v2, big, "cpu");
    cr_assert_eq(tport_get(c, &i2.ref, back2, big, NULL, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(svc_server_counter(url, "shm_process_writes") - writes, 2);
    cr_assert_eq(memcmp(back2, v2, big), 0);
    /* past a span: a write a span, each with its own deadline */
    size_t huge = 2 * SPAN + 4097;
    uint8_t *v3 = malloc(huge), *back3 = calloc(1, huge);
    fill(v3, huge, 19);
    tport_tensor_info i3 = put_u8(c, v3, huge, "cpu");
    cr_assert_eq(tport_get(c, &i3.ref, back3, huge, NULL, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(svc_server_counter(url, "shm_process_writes") - writes, 5);
    cr_assert_eq(memcmp(back3, v3, huge), 0);
    tport_free(c, &i3.ref, NULL);
    free(v3), free(back3);
    free(v), free(back), free(v2), free(back2);
    tport_close(c);
  }
  stop(s);
}

Test(get_direct, what_is_not_written_into_the_callers_buffer)
{
  need_pidfd();
  char url[96];
  server *s = start(url, sizeof url);
  tport_client *c = connect_with(url, false);
  uint8_t *v = malloc(BIG), *back = malloc(BIG);
  fill(v, BIG, 3);
  int64_t writes = svc_server_counter(url, "shm_process_writes");
  tport_err err;
  /* small: in the reply; on a device: through the region */
  tport_tensor_info small = put_u8(c, v, CHUNK, "cpu"), dev = put_u8(c, v, BIG, "sim:0");
  memset(back, 0, BIG);
  cr_assert_eq(tport_get(c, &small.ref, back, CHUNK, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(memcmp(back, v, CHUNK), 0);
  cr_assert_eq(tport_get(c, &dev.ref, back, BIG, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(memcmp(back, v, BIG), 0);
  /* stored transposed (its strides as put): its logical order is made */
  enum { R = 600, K = 700 };
  int64_t sizes[2] = {R, K}, strides[2] = {1, R};
  tport_tensor_info tr;
  uint8_t *col = malloc(R * K), *row = malloc(R * K);
  fill(col, R * K, 5);
  cr_assert_eq(tport_put(c, TPORT_UINT8, 2, sizes, strides, col, R * K, NULL, &tr, &err), 0, "%s",
               err.msg);
  cr_assert_eq(tport_get(c, &tr.ref, row, R * K, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  for (int i = 0; i < R; i++)
    for (int k = 0; k < K; k++)
      cr_assert_eq(row[i * K + k], col[k * R + i], "[%d, %d]", i, k);
  /* allocated by the get: no buffer to offer before the answer */
  tport_tensor_info cpu = put_u8(c, v, BIG, "cpu");
  void *alloc = NULL;
  size_t got = 0;
  cr_assert_eq(tport_get_alloc(c, &cpu.ref, &alloc, &got, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(got, BIG);
  cr_assert_eq(memcmp(alloc, v, BIG), 0);
  free(alloc);
  cr_assert_eq(svc_server_counter(url, "shm_process_writes"), writes,
               "a small, a device's, a transposed or an allocated get was written directly");
  tport_close(c);
  /* turned off in the environment */
  setenv("TPORT_SHM_DIRECT", "0", 1);
  c = connect_with(url, false);
  unsetenv("TPORT_SHM_DIRECT");
  cpu = put_u8(c, v, BIG, "cpu");
  memset(back, 0, BIG);
  cr_assert_eq(tport_get(c, &cpu.ref, back, BIG, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(memcmp(back, v, BIG), 0);
  cr_assert_eq(svc_server_counter(url, "shm_process_writes"), writes);
  free(v), free(back), free(col), free(row);
  tport_close(c);
  stop(s);
}

/* The server writes before the answer says what it wrote: a destination
 * of another dtype or shape is refused first, and keeps every byte. */
Test(get_direct, a_destination_that_does_not_match_gets_nothing)
{
  need_pidfd();
  char url[96];
  server *s = start(url, sizeof url);
  tport_client *c = connect_with(url, false);
  size_t n = 4 * BIG;
  uint8_t *v = malloc(n), *back = malloc(n);
  fill(v, n, 9);
  tport_tensor_info info = put_u8(c, v, n, "cpu");
  int64_t writes = svc_server_counter(url, "shm_process_writes");
  int64_t as_f32 = (int64_t)n / 4, as_u8 = (int64_t)n - 1;
  client_get_want wants[] = {{TPORT_FLOAT32, 1, &as_f32}, {TPORT_UINT8, 1, &as_u8}};
  for (int w = 0; w < 2; w++) {
    memset(back, 0x5a, n);
    client_get_desc g = {.ref = &info.ref, .buf = back, .cap = n, .want = &wants[w]};
    tport_err err;
    cr_assert_eq(client_get(c, &g, NULL, NULL, NULL, &err), TPORT_INVALID_ARGUMENT, "%s", err.msg);
    for (size_t i = 0; i < n; i++)
      cr_assert_eq(back[i], 0x5a, "byte %zu was written (want %d)", i, w);
  }
  cr_assert_eq(svc_server_counter(url, "shm_process_writes"), writes);
  /* the same with the tensor's own dtype and sizes: written */
  int64_t sz = (int64_t)n;
  client_get_want right = {TPORT_UINT8, 1, &sz};
  client_get_desc g = {.ref = &info.ref, .buf = back, .cap = n, .want = &right};
  tport_err err;
  cr_assert_eq(client_get(c, &g, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(memcmp(back, v, n), 0);
  cr_assert_eq(svc_server_counter(url, "shm_process_writes") - writes, 1);
  free(v), free(back);
  tport_close(c);
  stop(s);
}

/* A raw GetBegin naming region at addr (room len): the status code, and
 * whether the reply said direct. */
static int get_raw(tport_client *c, const tport_ref *ref, uint64_t region, uint64_t addr,
                   uint64_t len, bool *direct)
{
  Tport__Ref w;
  client_ref_to_wire(ref, &w);
  Tport__GetBeginRequest q = TPORT__GET_BEGIN_REQUEST__INIT;
  q.ref = &w;
  q.direct_region = region;
  q.direct_addr = addr;
  q.direct_length = len;
  Tport__GetBeginReply *r = NULL;
  tport_err err;
  int rc = client_rpc(c, TPORT__METHOD__METHOD_GET_BEGIN, &q.base, NULL, 0,
                      &tport__get_begin_reply__descriptor, (ProtobufCMessage **)&r, NULL, &err);
  *direct = r && r->direct;
  if (r)
    protobuf_c_message_free_unpacked(&r->base, NULL);
  return rc;
}

Test(get_direct, hostile_direct_gets_cost_their_request_only)
{
  need_pidfd();
  char url[96];
  server *s = start(url, sizeof url);
  tport_client *c = connect_with(url, false), *other = connect_with(url, false);
  uint8_t *v = malloc(BIG);
  fill(v, BIG, 13);
  tport_tensor_info info = put_u8(c, v, BIG, "cpu");
  uint64_t mine, theirs;
  cr_assert_eq(client_process_region(c, &mine), 0);
  cr_assert_eq(client_process_region(other, &theirs), 0);
  int64_t writes = svc_server_counter(url, "shm_process_writes");
  bool direct;
  /* memory that cannot be touched (PROT_NONE: unmapped, its range could be
   * mapped again meanwhile by whatever allocates next) */
  size_t room = (size_t)BIG + 4096;
  uint8_t *gone = mmap(NULL, room, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(gone, MAP_FAILED);
  cr_assert_eq(get_raw(c, &info.ref, mine, (uintptr_t)gone, room, &direct), TPORT_OUT_OF_RANGE);
  /* memory this process may not write itself: nor may tportd */
  uint8_t *ro = mmap(NULL, room, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  cr_assert_neq(ro, MAP_FAILED);
  memset(ro, 0x77, room);
  cr_assert_eq(mprotect(ro, room, PROT_READ), 0);
  cr_assert_eq(get_raw(c, &info.ref, mine, (uintptr_t)ro, room, &direct), TPORT_OUT_OF_RANGE);
  for (size_t i = 0; i < room; i++)
    cr_assert_eq(ro[i], 0x77, "byte %zu of read-only memory was written", i);
  /* an address whose bytes wrap past the end of the address space */
  cr_assert_eq(get_raw(c, &info.ref, mine, UINT64_MAX - 100, room, &direct), TPORT_OUT_OF_RANGE);
  /* another connection's process region: not this one's to name */
  uint8_t *buf = malloc(room);
  memset(buf, 0x33, room);
  cr_assert_eq(get_raw(c, &info.ref, theirs, (uintptr_t)buf, room, &direct), TPORT_NOT_FOUND);
  /* a region that is not a process region */
  tport_shm *r;
  tport_err err;
  cr_assert_eq(tport_shm_create(c, room, &r, &err), 0, "%s", err.msg);
  cr_assert_eq(get_raw(c, &info.ref, r->id, (uintptr_t)buf, room, &direct), TPORT_INVALID_ARGUMENT);
  for (size_t i = 0; i < room; i++)
    cr_assert_eq(buf[i], 0x33, "byte %zu was written", i);
  cr_assert_eq(svc_server_counter(url, "shm_process_writes"), writes);
  /* too little room: not direct, the ordinary way (a transfer) */
  cr_assert_eq(get_raw(c, &info.ref, mine, (uintptr_t)buf, BIG - 1, &direct), 0);
  cr_assert(!direct);
  /* and the connection, and the server, go on */
  cr_assert_eq(get_raw(c, &info.ref, mine, (uintptr_t)buf, room, &direct), 0);
  cr_assert(direct);
  cr_assert_eq(memcmp(buf, v, BIG), 0);
  cr_assert_eq(buf[BIG], 0x33);
  put_and_check(other, BIG, NULL, 17);
  tport_shm_release(r, NULL);
  munmap(ro, room);
  munmap(gone, room);
  free(v), free(buf);
  tport_close(other);
  tport_close(c);
  stop(s);
}

/* A write into pages nobody serves never ends: tportd gives it up after
 * its deadline and says that it may still land; served, it does. */
Test(get_direct, a_write_that_never_ends_is_given_up_and_said_so, .timeout = 120)
{
  need_pidfd();
  char url[96];
  server *s = start(url, sizeof url);
  tport_client *c = connect_with(url, false);
  size_t n = (size_t)1 << 20;
  uint8_t *v = malloc(n);
  fill(v, n, 21);
  tport_tensor_info info = put_u8(c, v, n, "cpu");
  int uffd;
  uint8_t *area = stuck_pages(n, &uffd);
  int64_t writes = svc_server_counter(url, "shm_process_writes");
  tport_err err;
  int rc = tport_get(c, &info.ref, area, n, NULL, NULL, NULL, &err);
  cr_assert_eq(rc, TPORT_DEADLINE_EXCEEDED, "%d %s", rc, err.msg);
  cr_assert(strstr(err.msg, "may still land") != NULL, "%s", err.msg);
  wait_stuck(url, 1);
  /* the server goes on meanwhile */
  put_and_check(c, BIG, NULL, 23);
  serve_pages(uffd, area, n);
  wait_stuck(url, 0);
  /* the write given up landed once its pages were there: what tport.h
   * warns of */
  cr_assert_eq(memcmp(area, v, n), 0);
  cr_assert_eq(svc_server_counter(url, "shm_process_writes"), writes + 1,
               "only put_and_check's get is counted");
  close(uffd);
  munmap(area, n);
  free(v);
  tport_close(c);
  stop(s);
}
