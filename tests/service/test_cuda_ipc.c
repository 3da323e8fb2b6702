/* test_cuda_ipc.c: same-host puts from and gets into GPU memory by CUDA IPC
 * (issue 19 item 4; client/cuda_ipc.c, server/regions.c's CUDA IPC
 * regions).
 *
 * Without a GPU the client's runtime is libcudart_client_emu.so: its device
 * memory is a sealed memfd, its IPC handles unique per allocation, and it
 * exports an allocation as a descriptor, which tportd maps as it maps a
 * region: the protocol, the per-connection cache and the lifetimes run
 * here for real.  Most tests run tportd in this process, so that what it
 * maps shows in /proc/self/maps ("tport-emu-device": the client's mapping
 * of each allocation, plus the server's of each one it opened).  The
 * restart test runs tportd as a child.  Suite real_gpu runs the real path
 * (cudaIpcGetMemHandle, and a tportd child that opens it) where a GPU is:
 * skipped with a message elsewhere, failed under TPORT_REQUIRE_GPU=1. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_internal.h"
#include "service_util.h"
#include "shm.h"

enum { H2D = 1, D2H = 2 };

typedef struct rt_api {
  void *lib;
  int (*malloc_)(void **p, size_t n);
  int (*free_)(void *p);
  int (*memcpy_)(void *dst, const void *src, size_t n, int kind);
  int (*device_count)(int *n);
  int (*ipc_handle)(void *h64, void *p);
  int (*exports)(void);    /* emulator only */
  int (*violations)(void); /* emulator only */
  const char *(*last_violation)(void);
} rt_api;

static rt_api rt;
static server *srv;
static char url[256];
static char sock_dir[64], sock_path[128];

static void *sym(const char *name)
{
  void *p = dlsym(rt.lib, name);
  cr_assert_not_null(p, "the runtime lacks %s", name);
  return p;
}

static void bind_runtime(const char *path)
{
  setenv("TPORT_CUDART_LIBRARY", path, 1);
  rt.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  cr_assert_not_null(rt.lib, "%s", dlerror());
  *(void **)&rt.malloc_ = sym("cudaMalloc");
  *(void **)&rt.free_ = sym("cudaFree");
  *(void **)&rt.memcpy_ = sym("cudaMemcpy");
  *(void **)&rt.device_count = sym("cudaGetDeviceCount");
  *(void **)&rt.ipc_handle = sym("cudaIpcGetMemHandle");
}

static void shm_paths(void)
{
  snprintf(sock_dir, sizeof sock_dir, "/tmp/tport-ipc-%d", (int)getpid());
  snprintf(sock_path, sizeof sock_path, "%s/shm.sock", sock_dir);
}

/* An in-process server with a shm socket of this test's own (quota 0:
 * the default --shm-quota). */
static server *start_server_quota(size_t max_ipc, size_t quota)
{
  shm_paths();
  server_config cfg;
  svc_config(&cfg);
  cfg.shm_socket = strdup(sock_path);
  cfg.shm_socket_set = true;
  cfg.cuda_ipc_max = max_ipc;
  if (quota)
    cfg.shm_quota = quota;
  return svc_start_with(&cfg, url, sizeof url);
}

static server *start_server(size_t max_ipc)
{
  return start_server_quota(max_ipc, 0);
}

static void start_emu(void)
{
  bind_runtime(CUDART_EMU_PATH);
  *(void **)&rt.exports = sym("emu_cudart_ipc_exports");
  *(void **)&rt.violations = sym("emu_cudart_violations");
  *(void **)&rt.last_violation = sym("emu_cudart_last_violation");
  srv = start_server(0);
}

static void stop(void)
{
  if (srv)
    server_stop(srv, 1000);
  srv = NULL;
  rmdir(sock_dir);
  if (rt.violations)
    cr_expect_eq(rt.violations(), 0, "the runtime refused a call: %s", rt.last_violation());
}

static int64_t counter(const char *name)
{
  return svc_server_counter(url, name);
}

static tport_client *connect_as(const char *tenant)
{
  tport_client *c;
  tport_err err;
  tport_connect_options o = {.tenant = tenant, .timeout_ms = 20000};
  cr_assert_eq(tport_connect(url, &o, &c, &err), 0, "connect %s: %s", url, err.msg);
  return c;
}

/* Mappings of the emulator's device memory in this process. */
static int device_mappings(void)
{
  FILE *f = fopen("/proc/self/maps", "r");
  cr_assert_not_null(f);
  char line[512];
  int n = 0;
  while (fgets(line, sizeof line, f))
    n += strstr(line, "/memfd:tport-emu-device") != NULL;
  fclose(f);
  return n;
}

static uint8_t *pattern(size_t n, unsigned seed)
{
  uint8_t *p = malloc(n ? n : 1);
  uint32_t x = 2463534242u ^ seed;
  for (size_t i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    p[i] = (uint8_t)x;
  }
  return p;
}

static uint8_t *dev_alloc(size_t n, const uint8_t *host)
{
  void *d = NULL;
  cr_assert_eq(rt.malloc_(&d, n ? n : 1), 0, "cudaMalloc(%zu)", n);
  if (host && n)
    cr_assert_eq(rt.memcpy_(d, host, n, H2D), 0);
  return d;
}

static DLTensor dl_of(void *data, int ndim, int64_t *shape, DLDataType dt)
{
  DLTensor t = {0};
  t.data = data;
  t.device = (DLDevice){kDLCUDA, 0};
  t.ndim = ndim;
  t.dtype = dt;
  t.shape = shape;
  return t;
}

static const DLDataType U8 = {kDLUInt, 8, 1};

static tport_tensor_info put_dev(tport_client *c, void *p, size_t n, const char *dev)
{
  int64_t shape[1] = {(int64_t)n};
  DLTensor t = dl_of(p, 1, shape, U8);
  tport_put_options o;
  tport_put_options_init(&o);
  o.device = dev;
  tport_tensor_info info;
  tport_err err = {0};
  cr_assert_eq(tport_put_dlpack(c, &t, &o, &info, &err), 0, "put of %zu bytes to %s: %s", n, dev,
               err.msg);
  return info;
}

static void expect_host(tport_client *c, const tport_ref *ref, const uint8_t *want, size_t n)
{
  uint8_t *host = malloc(n + 1);
  tport_err err = {0};
  cr_assert_eq(tport_get(c, ref, host, n, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(memcmp(host, want, n), 0, "the server's %zu bytes differ from the device's", n);
  free(host);
}

static void expect_dev(const uint8_t *d, const uint8_t *want, size_t n)
{
  uint8_t *host = malloc(n + 1);
  cr_assert_eq(rt.memcpy_(host, d, n, D2H), 0);
  cr_assert_eq(memcmp(host, want, n), 0, "%zu bytes in device memory differ", n);
  free(host);
}

/* ---------------------------------------------------------------- emulated */

TestSuite(cuda_ipc, .init = start_emu, .fini = stop);

Test(cuda_ipc, put_and_get_round_trip_through_the_allocation)
{
  tport_client *c = connect_as(NULL);
  const char *devs[] = {"cpu", "sim:0", "sim:1"};
  const size_t sizes[] = {1, 4095, 1 << 20, (3 << 20) + 5};
  for (size_t k = 0; k < 4; k++)
    for (size_t d = 0; d < 3; d++) {
      size_t n = sizes[k];
      uint8_t *want = pattern(n, (unsigned)(k * 3 + d));
      uint8_t *src = dev_alloc(n, want);
      int64_t before = counter("cuda_ipc_opens");
      tport_tensor_info info = put_dev(c, src, n, devs[d]);
      cr_assert_str_eq(info.device, devs[d]);
      cr_assert_eq(counter("cuda_ipc_opens"), before + 1, "the put did not go by IPC");
      expect_host(c, &info.ref, want, n);
      uint8_t *dst = dev_alloc(n, NULL);
      int64_t shape[1] = {(int64_t)n};
      DLTensor t = dl_of(dst, 1, shape, U8);
      tport_err err = {0};
      tport_tensor_info got;
      cr_assert_eq(tport_get_into_dlpack(c, &info.ref, &t, &got, &err), 0, "%s", err.msg);
      cr_assert_eq(got.nbytes, (int64_t)n);
      cr_assert_eq(counter("cuda_ipc_opens"), before + 2, "the get did not go by IPC");
      expect_dev(dst, want, n);
      tport_free(c, &info.ref, NULL);
      rt.free_(src);
      rt.free_(dst);
      free(want);
    }
  cr_expect_gt(counter("shm_transfers"), 0);
  tport_close(c);
}

Test(cuda_ipc, a_slice_inside_an_allocation_and_a_conversion)
{
  tport_client *c = connect_as(NULL);
  size_t n = 64 * 1024;
  uint8_t *want = pattern(n, 7);
  uint8_t *base = dev_alloc(n, want);
  /* float32 [8, 16] at offset 4096 of the allocation, converted to float64 */
  int64_t shape[2] = {8, 16};
  DLTensor t = dl_of(base + 4096, 2, shape, (DLDataType){kDLFloat, 32, 1});
  float f[128];
  for (int i = 0; i < 128; i++)
    f[i] = (float)i * 0.5f - 3.0f;
  cr_assert_eq(rt.memcpy_(base + 4096, f, sizeof f, H2D), 0);
  tport_put_options o;
  tport_put_options_init(&o);
  o.device = "sim:0";
  o.has_dtype = true;
  o.dtype = TPORT_FLOAT64;
  tport_tensor_info info;
  tport_err err = {0};
  cr_assert_eq(tport_put_dlpack(c, &t, &o, &info, &err), 0, "%s", err.msg);
  cr_assert_eq(info.dtype, TPORT_FLOAT64);
  double d[128];
  cr_assert_eq(tport_get(c, &info.ref, d, sizeof d, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  for (int i = 0; i < 128; i++)
    cr_assert_eq(d[i], (double)f[i], "element %d", i);
  /* back as float64 into another slice of the same allocation */
  DLTensor back = dl_of(base + 8192, 2, shape, (DLDataType){kDLFloat, 64, 1});
  cr_assert_eq(tport_get_into_dlpack(c, &info.ref, &back, NULL, &err), 0, "%s", err.msg);
  double e[128];
  cr_assert_eq(rt.memcpy_(e, base + 8192, sizeof e, D2H), 0);
  cr_assert_eq(memcmp(d, e, sizeof d), 0);
  cr_assert_eq(counter("cuda_ipc_opens"), 1, "one allocation, one open");
  rt.free_(base);
  free(want);
  tport_close(c);
}

/* A get into GPU memory by CUDA IPC is one round trip: the server checks
 * the destination (GetBegin's expect_*) before it writes a byte, where
 * once an Info went first.  A destination of other sizes or dtype gets
 * nothing, by the server's check or, with a server that does not say it
 * checks (get_expect off, as an older tportd), by the Info as before. */
Test(cuda_ipc, a_get_into_gpu_memory_is_checked_by_the_server_in_one_round_trip)
{
  tport_client *c = connect_as(NULL);
  size_t n = 4096;
  uint8_t *want = pattern(n, 11);
  uint8_t *src = dev_alloc(n, want);
  tport_tensor_info info = put_dev(c, src, n, "sim:0"); /* uint8 [4096] */
  cr_assert(atomic_load(&c->get_expect), "tportd's Hello says it checks expect_*");
  uint8_t *dst = dev_alloc(n, NULL);
  uint8_t *zero = calloc(1, n);
  cr_assert_eq(rt.memcpy_(dst, zero, n, H2D), 0);
  tport_err err = {0};
  for (int old = 0; old < 2; old++) {
    atomic_store(&c->get_expect, !old);
    /* of other sizes, then of another dtype, of the same bytes: nothing written */
    int64_t rows[2] = {64, 64}, one[1] = {1024};
    DLTensor wrong[2] = {dl_of(dst, 2, rows, U8), dl_of(dst, 1, one, (DLDataType){kDLInt, 32, 1})};
    const char *why[2] = {"dimensions", "dtype"};
    for (int k = 0; k < 2; k++) {
      int64_t infos = counter("requests_Info"), gets = counter("requests_GetBegin");
      cr_assert_eq(tport_get_into_dlpack(c, &info.ref, &wrong[k], NULL, &err),
                   TPORT_INVALID_ARGUMENT, "old %d, case %d: %s", old, k, err.msg);
      cr_assert_neq(strstr(err.msg, why[k]), NULL, "%s", err.msg);
      cr_assert_eq(counter("requests_Info") - infos, old, "old %d: Infos", old);
      cr_assert_eq(counter("requests_GetBegin") - gets, 1 - old, "old %d: GetBegins", old);
      expect_dev(dst, zero, n);
    }
    int64_t shape[1] = {(int64_t)n};
    DLTensor right = dl_of(dst, 1, shape, U8);
    int64_t infos = counter("requests_Info"), opens = counter("cuda_ipc_opens");
    cr_assert_eq(tport_get_into_dlpack(c, &info.ref, &right, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(counter("requests_Info") - infos, old, "old %d: an Info first", old);
    cr_assert_eq(counter("cuda_ipc_opens"), opens, "the destination was open already");
    expect_dev(dst, want, n);
    cr_assert_eq(rt.memcpy_(dst, zero, n, H2D), 0);
  }
  tport_free(c, &info.ref, NULL);
  rt.free_(src);
  rt.free_(dst);
  free(zero);
  free(want);
  tport_close(c);
}

Test(cuda_ipc, many_puts_from_one_allocation_open_it_once)
{
  tport_client *c = connect_as(NULL);
  size_t n = 256 * 1024;
  uint8_t *want = pattern(n, 3);
  uint8_t *src = dev_alloc(n, want);
  int maps0 = device_mappings();
  int exports0 = rt.exports();
  for (int i = 0; i < 20; i++) {
    tport_tensor_info info = put_dev(c, src + (size_t)i * 1024, n - (size_t)i * 1024, "cpu");
    expect_host(c, &info.ref, want + (size_t)i * 1024, n - (size_t)i * 1024);
    tport_free(c, &info.ref, NULL);
  }
  cr_assert_eq(counter("cuda_ipc_opens"), 1);
  cr_assert_eq(counter("cuda_ipc_regions"), 1);
  cr_assert_eq(rt.exports() - exports0, 1, "the allocation was exported %d times",
               rt.exports() - exports0);
  cr_assert_eq(device_mappings(), maps0 + 1, "the server maps the allocation once");
  /* a second connection of the same tenant opens it for itself */
  tport_client *c2 = connect_as(NULL);
  tport_tensor_info info = put_dev(c2, src, n, "cpu");
  expect_host(c2, &info.ref, want, n);
  cr_assert_eq(counter("cuda_ipc_regions"), 2);
  tport_close(c2);
  rt.free_(src);
  free(want);
  tport_close(c);
}

Test(cuda_ipc, a_closed_client_leaves_nothing_open_on_the_server)
{
  int maps0 = device_mappings();
  tport_client *c = connect_as(NULL);
  uint8_t *bufs[3];
  for (int i = 0; i < 3; i++) {
    uint8_t *want = pattern(1 << 16, (unsigned)i);
    bufs[i] = dev_alloc(1 << 16, want);
    tport_tensor_info info = put_dev(c, bufs[i], 1 << 16, "cpu");
    expect_host(c, &info.ref, want, 1 << 16);
    free(want);
  }
  cr_assert_eq(counter("cuda_ipc_regions"), 3);
  cr_assert_eq(device_mappings(), maps0 + 6, "three allocations here, three opened by the server");
  tport_close(c);
  /* the connection's end drops its regions (the server's pipe callback) */
  for (int i = 0; i < 100 && counter("cuda_ipc_regions") != 0; i++)
    usleep(20000);
  cr_assert_eq(counter("cuda_ipc_regions"), 0);
  cr_assert_eq(device_mappings(), maps0 + 3, "the server still maps a closed client's memory");
  for (int i = 0; i < 3; i++)
    rt.free_(bufs[i]);
  cr_assert_eq(device_mappings(), maps0);
}

Test(cuda_ipc, a_stopped_server_closes_what_it_opened)
{
  int maps0 = device_mappings();
  tport_client *c = connect_as(NULL);
  uint8_t *want = pattern(1 << 16, 4);
  uint8_t *p = dev_alloc(1 << 16, want);
  tport_tensor_info info = put_dev(c, p, 1 << 16, "sim:1");
  expect_host(c, &info.ref, want, 1 << 16);
  cr_assert_eq(device_mappings(), maps0 + 2);
  server_stop(srv, 1000);
  srv = NULL;
  cr_assert_eq(device_mappings(), maps0 + 1, "the stopped server still maps the allocation");
  tport_close(c);
  rt.free_(p);
  free(want);
  cr_assert_eq(device_mappings(), maps0);
}

Test(cuda_ipc, an_address_reused_after_free_is_registered_anew)
{
  tport_client *c = connect_as(NULL);
  size_t n = 1 << 20;
  uint8_t *a_bytes = pattern(n, 11), *b_bytes = pattern(n, 12);
  uint8_t *a = dev_alloc(n, a_bytes);
  tport_tensor_info ia = put_dev(c, a, n, "cpu");
  expect_host(c, &ia.ref, a_bytes, n);
  rt.free_(a);
  uint8_t *b = dev_alloc(n, b_bytes);
  if (b != a)
    cr_log_warn("cudaMalloc did not reuse the address (%p, then %p): the check is weaker", a, b);
  tport_tensor_info ib = put_dev(c, b, n, "cpu");
  expect_host(c, &ib.ref, b_bytes, n); /* not the freed allocation's stale mapping */
  cr_assert_eq(counter("cuda_ipc_opens"), 2);
  cr_assert_eq(counter("cuda_ipc_regions"), 1, "the stale allocation's region was not released");
  /* a get into the new allocation lands there */
  uint8_t *zero = calloc(1, n);
  cr_assert_eq(rt.memcpy_(b, zero, n, H2D), 0);
  int64_t shape[1] = {(int64_t)n};
  DLTensor t = dl_of(b, 1, shape, U8);
  tport_err err = {0};
  cr_assert_eq(tport_get_into_dlpack(c, &ib.ref, &t, NULL, &err), 0, "%s", err.msg);
  expect_dev(b, b_bytes, n);
  rt.free_(b);
  free(zero);
  free(a_bytes);
  free(b_bytes);
  tport_close(c);
}

/* A raw ShmRegister of a CUDA IPC region (no client library checks). */
static int raw_register(tport_client *c, uint64_t nbytes, const uint8_t *handle, size_t hlen,
                        bool fd, uint64_t *id, uint8_t *token, tport_err *err)
{
  Tport__ShmRegisterRequest q = TPORT__SHM_REGISTER_REQUEST__INIT;
  q.nbytes = nbytes;
  q.cuda_ipc_handle.data = (uint8_t *)handle;
  q.cuda_ipc_handle.len = hlen;
  q.cuda_ipc_fd = fd;
  Tport__ShmRegisterReply *a;
  int rc = client_rpc(c, TPORT__METHOD__METHOD_SHM_REGISTER, &q.base, NULL, 0,
                      &tport__shm_register_reply__descriptor, (ProtobufCMessage **)&a, NULL, err);
  if (!rc) {
    *id = a->region;
    if (token && a->token.len == 16)
      memcpy(token, a->token.data, 16);
    protobuf_c_message_free_unpacked(&a->base, NULL);
  }
  return rc;
}

static int raw_put(tport_client *c, uint64_t region, uint64_t offset, uint64_t length,
                   tport_err *err)
{
  Tport__TensorDesc desc = TPORT__TENSOR_DESC__INIT;
  int64_t sz = (int64_t)length;
  desc.dtype = TPORT__DTYPE__DTYPE_UINT8;
  desc.n_sizes = 1;
  desc.sizes = &sz;
  Tport__PutBeginRequest q = TPORT__PUT_BEGIN_REQUEST__INIT;
  q.desc = &desc;
  q.commit = true;
  Tport__ShmSlice sl = TPORT__SHM_SLICE__INIT;
  sl.region = region;
  sl.offset = offset;
  sl.length = length;
  q.shm = &sl;
  ProtobufCMessage *r;
  int rc = client_rpc(c, TPORT__METHOD__METHOD_PUT_BEGIN, &q.base, NULL, 0,
                      &tport__put_begin_reply__descriptor, &r, NULL, err);
  if (!rc)
    protobuf_c_message_free_unpacked(r, NULL);
  return rc;
}

Test(cuda_ipc, another_tenants_handle_or_region_is_refused)
{
  tport_client *a = connect_as("alice"), *b = connect_as("bob");
  size_t n = 1 << 16;
  uint8_t *want = pattern(n, 5);
  uint8_t *p = dev_alloc(n, want);
  tport_tensor_info info = put_dev(a, p, n, "cpu");
  expect_host(a, &info.ref, want, n);
  uint8_t h[64];
  cr_assert_eq(rt.ipc_handle(h, p), 0);
  tport_err err = {0};
  uint64_t id = 0;
  /* alice's handle, as bob: refused, however it would come */
  cr_assert_eq(raw_register(b, n, h, 64, true, &id, NULL, &err), TPORT_PERMISSION_DENIED, "%s",
               err.msg);
  cr_assert_not_null(strstr(err.msg, "another tenant"), "%s", err.msg);
  cr_assert_eq(raw_register(b, n, h, 64, false, &id, NULL, &err), TPORT_PERMISSION_DENIED, "%s",
               err.msg);
  /* alice's region id, named by bob: not found */
  pthread_mutex_lock(&a->ipc_mu);
  cr_assert_not_null(a->ipc);
  pthread_mutex_unlock(&a->ipc_mu);
  for (uint64_t guess = 0; guess < 4; guess++) {
    uint64_t region;
    cr_assert_eq(raw_register(a, n, h, 64, true, &region, NULL, &err), TPORT_ALREADY_EXISTS, "%s",
                 err.msg); /* one open per allocation: the message names it */
    const char *at = strstr(err.msg, "region ");
    cr_assert_not_null(at, "%s", err.msg);
    region = strtoull(at + 7, NULL, 10);
    cr_assert_eq(raw_put(b, region, 0, n, &err), TPORT_NOT_FOUND, "%s", err.msg);
  }
  /* bob's own put from that memory still works: staged, not by IPC */
  int64_t opens = counter("cuda_ipc_opens");
  tport_tensor_info ib = put_dev(b, p, n, "cpu");
  expect_host(b, &ib.ref, want, n);
  cr_assert_eq(counter("cuda_ipc_opens"), opens);
  cr_assert_geq(counter("cuda_ipc_refused"), 3);
  rt.free_(p);
  free(want);
  tport_close(a);
  tport_close(b);
}

Test(cuda_ipc, hostile_sizes_offsets_and_handles_are_refused)
{
  tport_client *c = connect_as(NULL);
  size_t n = 1 << 16;
  uint8_t *want = pattern(n, 9);
  uint8_t *p = dev_alloc(n, want);
  tport_tensor_info info = put_dev(c, p, n, "cpu");
  tport_free(c, &info.ref, NULL);
  uint8_t h[64];
  cr_assert_eq(rt.ipc_handle(h, p), 0);
  tport_err err = {0};
  uint64_t region = 0;
  cr_assert_eq(raw_register(c, n, h, 64, true, &region, NULL, &err), TPORT_ALREADY_EXISTS);
  region = strtoull(strstr(err.msg, "region ") + 7, NULL, 10);
  /* slices past the allocation, and ones whose end overflows */
  struct {
    uint64_t off, len;
  } bad[] = {{0, n + 1},
             {n, 1},
             {n + 1, 0},
             {1, n},
             {UINT64_MAX, 2},
             {2, UINT64_MAX - 1},
             {UINT64_MAX, UINT64_MAX}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int rc = raw_put(c, region, bad[i].off, bad[i].len, &err);
    cr_assert(rc == TPORT_OUT_OF_RANGE || rc == TPORT_INVALID_ARGUMENT,
              "offset %llu length %llu: %d %s", (unsigned long long)bad[i].off,
              (unsigned long long)bad[i].len, rc, err.msg);
  }
  /* handles of the wrong size, sizes of nothing or more than an address
   * space, an IPC handle this server cannot open (no GPU) */
  uint8_t other[80]; /* room for the 65-byte handle */
  memset(other, 0x5a, sizeof other);
  uint64_t id = 0;
  cr_assert_eq(raw_register(c, n, other, 63, false, &id, NULL, &err), TPORT_INVALID_ARGUMENT);
  cr_assert_eq(raw_register(c, n, other, 65, true, &id, NULL, &err), TPORT_INVALID_ARGUMENT);
  cr_assert_eq(raw_register(c, 0, other, 64, true, &id, NULL, &err), TPORT_INVALID_ARGUMENT);
  cr_assert_eq(raw_register(c, UINT64_MAX, other, 64, true, &id, NULL, &err),
               TPORT_INVALID_ARGUMENT, "%s", err.msg);
  cr_assert_eq(raw_register(c, n, other, 64, false, &id, NULL, &err), TPORT_FAILED_PRECONDITION,
               "%s", err.msg);
  /* a descriptor smaller than the size it was registered with */
  uint8_t tok[16];
  memset(other, 0x6b, sizeof other);
  cr_assert_eq(raw_register(c, 4 * n, other, 64, true, &id, tok, &err), 0, "%s", err.msg);
  uint8_t *small = dev_alloc(n, NULL);
  int (*retain)(unsigned long long *, void *) = NULL;
  int (*exp)(void *, unsigned long long, int, unsigned long long) = NULL;
  int (*entry)(const char *, void **, unsigned, unsigned long long, int *) =
      (int (*)(const char *, void **, unsigned, unsigned long long, int *))sym(
          "cudaGetDriverEntryPointByVersion");
  cr_assert_eq(entry("cuMemRetainAllocationHandle", (void **)&retain, 12000, 0, NULL), 0);
  cr_assert_eq(entry("cuMemExportToShareableHandle", (void **)&exp, 12000, 0, NULL), 0);
  unsigned long long ah;
  int fd = -1;
  cr_assert_eq(retain(&ah, small), 0);
  cr_assert_eq(exp(&fd, ah, 1, 0), 0);
  int rc = transport_shm_send(sock_path, tok, fd, 5000, &err);
  close(fd);
  cr_assert_eq(rc, TPORT_INVALID_ARGUMENT, "a descriptor of %zu bytes for %zu: %d %s", n, 4 * n, rc,
               err.msg);
  cr_assert_eq(raw_put(c, id, 0, 1, &err), TPORT_NOT_FOUND, "%s", err.msg);
  /* and the good one still works */
  tport_tensor_info again = put_dev(c, p, n, "cpu");
  expect_host(c, &again.ref, want, n);
  rt.free_(small);
  rt.free_(p);
  free(want);
  tport_close(c);
}

Test(cuda_ipc, the_opt_outs_are_staged)
{
  setenv("TPORT_CUDA_IPC", "0", 1);
  tport_client *c = connect_as(NULL);
  unsetenv("TPORT_CUDA_IPC");
  size_t n = 1 << 18;
  uint8_t *want = pattern(n, 21);
  uint8_t *p = dev_alloc(n, want);
  tport_tensor_info info = put_dev(c, p, n, "cpu");
  expect_host(c, &info.ref, want, n);
  cr_assert_eq(counter("cuda_ipc_opens"), 0);
  tport_close(c);
  tport_connect_options o = {.timeout_ms = 20000, .no_shm = true};
  tport_err err;
  cr_assert_eq(tport_connect(url, &o, &c, &err), 0, "%s", err.msg);
  info = put_dev(c, p, n, "cpu");
  expect_host(c, &info.ref, want, n);
  cr_assert_eq(counter("cuda_ipc_opens"), 0);
  tport_close(c);
  rt.free_(p);
  free(want);
}

Test(cuda_ipc, past_the_tenants_bound_puts_are_staged)
{
  server_stop(srv, 1000);
  srv = start_server(3);
  tport_client *a = connect_as(NULL), *b = connect_as(NULL), *other = connect_as("other");
  uint8_t *want = pattern(4096, 2);
  uint8_t *bufs[5];
  for (int i = 0; i < 5; i++) {
    bufs[i] = dev_alloc(4096, want);
    /* two connections of one tenant share its bound */
    tport_client *c = i % 2 ? b : a;
    tport_tensor_info info = put_dev(c, bufs[i], 4096, "cpu");
    expect_host(c, &info.ref, want, 4096);
  }
  cr_assert_eq(counter("cuda_ipc_regions"), 3);
  cr_assert_eq(counter("cuda_ipc_refused"), 2, "the fourth and fifth allocations were opened");
  /* another tenant has a bound of its own */
  tport_tensor_info info = put_dev(other, bufs[4], 4096, "cpu");
  expect_host(other, &info.ref, want, 4096);
  cr_assert_eq(counter("cuda_ipc_regions"), 4);
  tport_close(a);
  tport_close(b);
  tport_close(other);
  for (int i = 0; i < 5; i++)
    rt.free_(bufs[i]);
  free(want);
}

/* A descriptor handed over as GPU memory is mapped by tportd as host memory
 * (a memfd, here and from a hostile client alike): its bytes count against
 * the tenant's --shm-quota and the server's region bytes as a region's do.
 * Before the fix only --cuda-ipc-max bounded them: a tenant could have
 * tportd map 256 descriptors of any size. */
Test(cuda_ipc, a_descriptor_handed_over_counts_against_the_shm_quota)
{
  server_stop(srv, 1000);
  size_t quota = (size_t)1 << 20;
  srv = start_server_quota(0, quota);
  tport_client *c = connect_as(NULL);
  uint8_t h[64];
  memset(h, 0x3c, sizeof h);
  uint64_t id = 0;
  tport_err err;
  int rc = raw_register(c, 2 * quota, h, sizeof h, true, &id, NULL, &err);
  cr_assert_eq(rc, TPORT_RESOURCE_EXHAUSTED, "a descriptor twice the quota: %d %s", rc, err.msg);
  cr_assert(strstr(err.msg, "quota") != NULL, "%s", err.msg);
  int64_t before = counter("shm_region_bytes");
  cr_assert_eq(raw_register(c, quota / 2 + 1, h, sizeof h, true, &id, NULL, &err), 0, "%s",
               err.msg);
  cr_assert_eq(counter("shm_region_bytes"), before + (int64_t)(quota / 2 + 1));
  h[0] ^= 1; /* another allocation: the two pass the quota together */
  rc = raw_register(c, quota / 2 + 1, h, sizeof h, true, &id, NULL, &err);
  cr_assert_eq(rc, TPORT_RESOURCE_EXHAUSTED, "two descriptors past the quota: %d %s", rc, err.msg);
  tport_close(c);
}

Test(cuda_ipc, the_client_keeps_a_bounded_number_of_allocations)
{
  tport_client *c = connect_as(NULL);
  /* the connection's region bound (64 by default) is the first limit met */
  enum { N = 70 };
  uint8_t *bufs[N];
  uint8_t *want = pattern(4096, 1);
  for (int i = 0; i < N; i++) {
    bufs[i] = dev_alloc(4096, want);
    tport_tensor_info info = put_dev(c, bufs[i], 4096, "cpu");
    expect_host(c, &info.ref, want, 4096);
    tport_free(c, &info.ref, NULL);
  }
  /* the client keeps at most CLIENT_IPC_MAX, releasing the oldest */
  cr_assert_leq(counter("cuda_ipc_regions"), 32);
  cr_assert_geq(counter("cuda_ipc_opens"), N);
  for (int i = 0; i < N; i++)
    rt.free_(bufs[i]);
  free(want);
  tport_close(c);
}

/* ---------------------------------------------------------------- restart */

/* Claimed tenants (--local-secret off): libtport redials a restarted
 * server without a new Hello, which a server that wants the proof refuses
 * (a matter of the client's handshake, not of IPC). */
static pid_t spawn(const char *u)
{
  const char *args[] = {"--shm-socket", sock_path, "--local-secret", "off", NULL};
  return svc_spawn(u, args);
}

Test(cuda_ipc_restart, a_restarted_server_gets_the_allocation_registered_again)
{
  bind_runtime(CUDART_EMU_PATH);
  shm_paths();
  svc_ipc_url(url, sizeof url);
  pid_t pid = spawn(url);
  cr_assert_gt(pid, 0);
  tport_client *c = connect_as(NULL);
  size_t n = 1 << 20;
  uint8_t *want = pattern(n, 31);
  uint8_t *p = dev_alloc(n, want);
  tport_tensor_info info = put_dev(c, p, n, "cpu");
  expect_host(c, &info.ref, want, n);
  cr_assert_eq(svc_terminate(pid), 0);
  pid = spawn(url);
  cr_assert_gt(pid, 0);
  /* the client redials; its region is unknown there: registered again */
  tport_err err = {0};
  int rc = -1;
  for (int i = 0; i < 50 && rc != 0; i++) {
    int64_t shape[1] = {(int64_t)n};
    DLTensor t = dl_of(p, 1, shape, U8);
    rc = tport_put_dlpack(c, &t, NULL, &info, &err);
    if (rc)
      usleep(100000);
  }
  /* it worked at all only because the region was registered again: the
   * new server knows no region of the old one's (its ids start elsewhere) */
  cr_assert_eq(rc, 0, "%s", err.msg);
  expect_host(c, &info.ref, want, n);
  uint8_t *dst = dev_alloc(n, NULL);
  int64_t shape[1] = {(int64_t)n};
  DLTensor t = dl_of(dst, 1, shape, U8);
  cr_assert_eq(tport_get_into_dlpack(c, &info.ref, &t, NULL, &err), 0, "%s", err.msg);
  expect_dev(dst, want, n);
  tport_close(c);
  cr_assert_eq(svc_terminate(pid), 0);
  rt.free_(p);
  rt.free_(dst);
  free(want);
  rmdir(sock_dir);
}

/* ---------------------------------------------------------------- real GPU */

#ifndef CUDART_REAL_PATH
#define CUDART_REAL_PATH "libcudart.so.13"
#endif

static bool require_gpu(void)
{
  const char *e = getenv("TPORT_REQUIRE_GPU");
  return e && strcmp(e, "1") == 0;
}

/* The real runtime and a GPU, or a skip (a failure under TPORT_REQUIRE_GPU=1). */
static bool use_real_gpu(void)
{
  const char *e = getenv("TPORT_TEST_REAL_CUDART");
  const char *path = e && *e ? e : CUDART_REAL_PATH;
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    cr_assert(!require_gpu(), "TPORT_REQUIRE_GPU=1 and no CUDA runtime: %s", dlerror());
    cr_skip_test("no CUDA runtime (%s): the real IPC path is not run here", path);
    return false;
  }
  dlclose(lib);
  bind_runtime(path);
  int n = 0;
  int st = rt.device_count(&n);
  if (st || n == 0) {
    cr_assert(!require_gpu(), "TPORT_REQUIRE_GPU=1 and no GPU: cudaGetDeviceCount %d, %d devices",
              st, n);
    cr_skip_test("no GPU (cudaGetDeviceCount: error %d, %d devices): the real IPC path is not "
                 "run here",
                 st, n);
    return false;
  }
  return true;
}

/* tportd in a child (a process cannot open its own IPC handles) with the
 * GPU: puts and gets device to device, the allocation opened once. */
Test(real_gpu_ipc, put_and_get_by_cuda_ipc)
{
  if (!use_real_gpu())
    return;
  shm_paths();
  svc_ipc_url(url, sizeof url);
  const char *args[] = {"--shm-socket", sock_path, "--devices", "cpu,cuda", NULL};
  pid_t pid = svc_spawn(url, args);
  cr_assert_gt(pid, 0);
  tport_client *c = connect_as(NULL);
  const char *devs[] = {"cuda:0", "cpu"};
  size_t n = (64 << 20) + 3;
  uint8_t *want = pattern(n, 41);
  uint8_t *src = dev_alloc(n, want);
  uint8_t *dst = dev_alloc(n, NULL);
  for (int d = 0; d < 2; d++) {
    tport_tensor_info info = put_dev(c, src, n, devs[d]);
    expect_host(c, &info.ref, want, n);
    int64_t shape[1] = {(int64_t)n};
    DLTensor t = dl_of(dst, 1, shape, U8);
    tport_err err = {0};
    cr_assert_eq(tport_get_into_dlpack(c, &info.ref, &t, NULL, &err), 0, "%s", err.msg);
    expect_dev(dst, want, n);
    tport_free(c, &info.ref, NULL);
  }
  cr_assert_eq(counter("cuda_ipc_opens"), 2, "src and dst, each opened once");
  tport_close(c);
  cr_assert_eq(svc_terminate(pid), 0);
  rt.free_(src);
  rt.free_(dst);
  free(want);
  rmdir(sock_dir);
}
