/* test_client_cuda.c: puts from and gets into GPU memory over the network
 * (tport_put_dlpack / tport_get_into_dlpack with kDLCUDA tensors), staged
 * through the client's pinned ring (client/cuda_stage.c) with the CUDA
 * runtime loaded on first use (client/cuda_rt.c).
 *
 * Without a GPU the runtime is libcudart_client_emu.so
 * (tests/gpu/emu/cudart_client_emu.c): its device memory is host memory it
 * tracks, its copies check direction and bounds and run only when waited
 * for, and it counts cudaHostAlloc calls.  The same code then runs against
 * the real libcudart (suite real_gpu): skipped with a message where no GPU
 * is, failed under TPORT_REQUIRE_GPU=1. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service_util.h"

#define CHUNK (64 << 10) /* the tests' servers' (svc_config, svc_spawn) */
enum { H2D = 1, D2H = 2 };

/* The runtime as the test drives it (the emulator's or the real one). */
typedef struct rt_api {
  void *lib;
  int (*malloc_)(void **p, size_t n);
  int (*free_)(void *p);
  int (*memcpy_)(void *dst, const void *src, size_t n, int kind);
  int (*device_count)(int *n);
  /* the emulator's counters (NULL on the real runtime) */
  int (*host_alloc_calls)(void);
  int (*free_host_calls)(void);
  int (*violations)(void);
  const char *(*last_violation)(void);
} rt_api;

static rt_api rt;
static server *srv;
static char url[256];

static void *sym(const char *name)
{
  void *p = dlsym(rt.lib, name);
  cr_assert_not_null(p, "%s lacks %s", "the runtime", name);
  return p;
}

static void bind_runtime(void)
{
  *(void **)&rt.malloc_ = sym("cudaMalloc");
  *(void **)&rt.free_ = sym("cudaFree");
  *(void **)&rt.memcpy_ = sym("cudaMemcpy");
  *(void **)&rt.device_count = sym("cudaGetDeviceCount");
}

/* libtport loads the emulator (the same file: one copy in the process). */
static void use_emulator(void)
{
  setenv("TPORT_CUDART_LIBRARY", CUDART_EMU_PATH, 1);
  rt.lib = dlopen(CUDART_EMU_PATH, RTLD_NOW | RTLD_LOCAL);
  cr_assert_not_null(rt.lib, "%s", dlerror());
  bind_runtime();
  *(void **)&rt.host_alloc_calls = sym("emu_cudart_host_alloc_calls");
  *(void **)&rt.free_host_calls = sym("emu_cudart_free_host_calls");
  *(void **)&rt.violations = sym("emu_cudart_violations");
  *(void **)&rt.last_violation = sym("emu_cudart_last_violation");
}

static void start_emu(void)
{
  use_emulator();
  srv = svc_start_inproc(url, sizeof url, NULL);
}

static void stop(void)
{
  if (srv)
    server_stop(srv, 1000);
  srv = NULL;
  if (rt.violations)
    cr_expect_eq(rt.violations(), 0, "the runtime refused a call: %s", rt.last_violation());
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

/* Device memory holding n bytes of host (or garbage when host is NULL). */
static uint8_t *dev_alloc(size_t n, const uint8_t *host)
{
  void *d = NULL;
  cr_assert_eq(rt.malloc_(&d, n ? n : 1), 0, "cudaMalloc(%zu)", n);
  if (host && n)
    cr_assert_eq(rt.memcpy_(d, host, n, H2D), 0);
  return d;
}

static DLTensor dl_u8(void *data, int64_t *shape, int device_type, int device_id)
{
  DLTensor t = {0};
  t.data = data;
  t.device = (DLDevice){(DLDeviceType)device_type, device_id};
  t.ndim = 1;
  t.dtype = (DLDataType){kDLUInt, 8, 1};
  t.shape = shape;
  return t;
}

/* Put n bytes from device memory to server device dev, check them there
 * (a host get) and get them back into device memory. */
static void round_trip(tport_client *c, size_t n, const char *dev, unsigned seed)
{
  uint8_t *want = pattern(n, seed);
  uint8_t *src = dev_alloc(n, want);
  int64_t shape[1] = {(int64_t)n};
  DLTensor t = dl_u8(src, shape, kDLCUDA, 0);
  tport_put_options o;
  tport_put_options_init(&o);
  o.device = dev;
  tport_tensor_info info;
  tport_err err = {0};
  cr_assert_eq(tport_put_dlpack(c, &t, &o, &info, &err), 0, "put of %zu bytes to %s: %s", n, dev,
               err.msg);
  cr_assert_eq(info.nbytes, (int64_t)n);
  cr_assert_str_eq(info.device, strcmp(dev, "cpu") ? dev : "cpu");
  uint8_t *host = malloc(n + 1);
  cr_assert_eq(tport_get(c, &info.ref, host, n, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(memcmp(host, want, n), 0, "%zu bytes on %s differ from the device's", n, dev);

  uint8_t *dst = dev_alloc(n, NULL);
  DLTensor d = dl_u8(dst, shape, kDLCUDA, 0);
  tport_tensor_info got;
  cr_assert_eq(tport_get_into_dlpack(c, &info.ref, &d, &got, &err), 0, "get of %zu bytes: %s", n,
               err.msg);
  cr_assert_eq(got.nbytes, (int64_t)n);
  memset(host, 0, n);
  cr_assert_eq(rt.memcpy_(host, dst, n, D2H), 0);
  cr_assert_eq(memcmp(host, want, n), 0, "%zu bytes got back into device memory differ", n);
  cr_assert_eq(tport_free(c, &info.ref, &err), 0, "%s", err.msg);
  rt.free_(src);
  rt.free_(dst);
  free(host);
  free(want);
}

static const size_t sizes[] = {1, CHUNK - 1, CHUNK, CHUNK + 1, 5 * CHUNK + 777};

TestSuite(client_cuda, .init = start_emu, .fini = stop);

Test(client_cuda, put_and_get_are_byte_exact_around_the_chunk_size)
{
  tport_client *c = svc_connect(url, NULL);
  const char *devs[] = {"cpu", "sim:0", "sim:1"};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
    for (size_t d = 0; d < 3; d++)
      round_trip(c, sizes[k], devs[d], (unsigned)(k * 3 + d));
  tport_close(c);
}

Test(client_cuda, an_empty_tensor_moves)
{
  tport_client *c = svc_connect(url, NULL);
  uint8_t *src = dev_alloc(16, NULL);
  int64_t shape[1] = {0};
  DLTensor t = dl_u8(src, shape, kDLCUDA, 0);
  tport_tensor_info info;
  tport_err err = {0};
  cr_assert_eq(tport_put_dlpack(c, &t, NULL, &info, &err), 0, "%s", err.msg);
  cr_assert_eq(info.nbytes, 0);
  cr_assert_eq(tport_get_into_dlpack(c, &info.ref, &t, NULL, &err), 0, "%s", err.msg);
  rt.free_(src);
  tport_close(c);
}

/* A dense tensor with permuted strides goes as the host path sends it: its
 * storage bytes and strides; a get returns the logical C order. */
Test(client_cuda, a_dense_transposed_tensor_keeps_its_layout)
{
  tport_client *c = svc_connect(url, NULL);
  enum { R = 300, C = 170 }; /* 204000 bytes of float32: several chunks */
  float *storage = malloc(sizeof(float) * R * C);
  for (int i = 0; i < R * C; i++)
    storage[i] = (float)i * 0.5f - 7.0f;
  uint8_t *src = dev_alloc(sizeof(float) * R * C, (const uint8_t *)storage);
  int64_t shape[2] = {R, C}, strides[2] = {1, R}; /* column-major */
  DLTensor t = {.data = src,
                .device = {kDLCUDA, 0},
                .ndim = 2,
                .dtype = {kDLFloat, 32, 1},
                .shape = shape,
                .strides = strides};
  tport_put_options o;
  tport_put_options_init(&o);
  o.device = "sim:0";
  tport_tensor_info info;
  tport_err err = {0};
  cr_assert_eq(tport_put_dlpack(c, &t, &o, &info, &err), 0, "%s", err.msg);
  cr_assert_eq(info.strides[0], 1);
  cr_assert_eq(info.strides[1], R);
  float *back = malloc(sizeof(float) * R * C);
  cr_assert_eq(tport_get(c, &info.ref, back, sizeof(float) * R * C, NULL, NULL, NULL, &err), 0,
               "%s", err.msg);
  for (int i = 0; i < R; i++)
    for (int j = 0; j < C; j++)
      cr_assert_eq(back[i * C + j], storage[j * R + i], "[%d][%d]", i, j);
  /* and back into device memory, row-major */
  uint8_t *dst = dev_alloc(sizeof(float) * R * C, NULL);
  DLTensor d = t;
  d.data = dst;
  d.strides = NULL;
  cr_assert_eq(tport_get_into_dlpack(c, &info.ref, &d, NULL, &err), 0, "%s", err.msg);
  float *dev_back = malloc(sizeof(float) * R * C);
  cr_assert_eq(rt.memcpy_(dev_back, dst, sizeof(float) * R * C, D2H), 0);
  cr_assert_eq(memcmp(dev_back, back, sizeof(float) * R * C), 0);
  free(storage);
  free(back);
  free(dev_back);
  rt.free_(src);
  rt.free_(dst);
  tport_close(c);
}

Test(client_cuda, the_pinned_ring_is_allocated_once_per_client)
{
  int before = rt.host_alloc_calls(), freed = rt.free_host_calls();
  tport_client *c = svc_connect(url, NULL);
  for (unsigned i = 0; i < 4; i++)
    round_trip(c, 3 * CHUNK + 5, i % 2 ? "sim:0" : "cpu", i);
  round_trip(c, 10, "cpu", 9); /* one chunk, in the PutBegin */
  cr_assert_eq(rt.host_alloc_calls() - before, 1, "cudaHostAlloc ran %d times for 10 transfers",
               rt.host_alloc_calls() - before);
  tport_close(c);
  cr_assert_eq(rt.free_host_calls() - freed, 1, "tport_close frees the ring");
  /* another client: its own ring */
  c = svc_connect(url, NULL);
  round_trip(c, 2 * CHUNK, "cpu", 11);
  cr_assert_eq(rt.host_alloc_calls() - before, 2);
  tport_close(c);
}

Test(client_cuda, tensors_with_gaps_or_negative_strides_are_refused)
{
  tport_client *c = svc_connect(url, NULL);
  uint8_t *src = dev_alloc(64, NULL);
  int64_t shape[2] = {4, 4}, gaps[2] = {8, 1}, neg[2] = {-4, 1};
  DLTensor t = {.data = src,
                .device = {kDLCUDA, 0},
                .ndim = 2,
                .dtype = {kDLUInt, 8, 1},
                .shape = shape,
                .strides = gaps};
  tport_err err = {0};
  cr_assert_eq(tport_put_dlpack(c, &t, NULL, NULL, &err), TPORT_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(err.msg, "contiguous"), "%s", err.msg);
  t.strides = neg;
  cr_assert_eq(tport_put_dlpack(c, &t, NULL, NULL, &err), TPORT_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(err.msg, "negative"), "%s", err.msg);
  /* a get writes row-major only */
  uint8_t v[16] = {1};
  int64_t s16[1] = {16};
  tport_tensor_info info;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, s16, NULL, v, 16, NULL, &info, &err), 0, "%s", err.msg);
  int64_t one[1] = {2};
  DLTensor d = dl_u8(src, s16, kDLCUDA, 0);
  d.strides = one;
  cr_assert_eq(tport_get_into_dlpack(c, &info.ref, &d, NULL, &err), TPORT_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(err.msg, "strides[0] is 2"), "%s", err.msg);
  rt.free_(src);
  tport_close(c);
}

Test(client_cuda, memory_not_on_the_named_device_is_refused)
{
  tport_client *c = svc_connect(url, NULL);
  uint8_t *src = dev_alloc(32, NULL);
  int64_t shape[1] = {32};
  tport_err err = {0};
  DLTensor t = dl_u8(src, shape, kDLCUDA, 1); /* it is on device 0 */
  cr_assert_eq(tport_put_dlpack(c, &t, NULL, NULL, &err), TPORT_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(err.msg, "device 0"), "%s", err.msg);
  uint8_t host[32] = {0};
  t = dl_u8(host, shape, kDLCUDA, 0); /* host memory called device memory */
  cr_assert_eq(tport_put_dlpack(c, &t, NULL, NULL, &err), TPORT_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(err.msg, "not device memory"), "%s", err.msg);
  rt.free_(src);
  tport_close(c);
}

Test(client_cuda, a_get_into_the_wrong_shape_or_dtype_writes_nothing)
{
  tport_client *c = svc_connect(url, NULL);
  size_t n = 2 * CHUNK;
  uint8_t *want = pattern(n, 5);
  int64_t shape[1] = {(int64_t)n};
  tport_tensor_info info;
  tport_err err = {0};
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, shape, NULL, want, n, NULL, &info, &err), 0, "%s",
               err.msg);
  uint8_t *dst = dev_alloc(n, NULL);
  int64_t shorter[1] = {(int64_t)n - 1};
  DLTensor d = dl_u8(dst, shorter, kDLCUDA, 0);
  cr_assert_eq(tport_get_into_dlpack(c, &info.ref, &d, NULL, &err), TPORT_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(err.msg, "sizes[0]"), "%s", err.msg);
  d.shape = shape;
  d.dtype = (DLDataType){kDLInt, 8, 1};
  cr_assert_eq(tport_get_into_dlpack(c, &info.ref, &d, NULL, &err), TPORT_INVALID_ARGUMENT);
  cr_assert_not_null(strstr(err.msg, "dtype"), "%s", err.msg);
  uint8_t *host = malloc(n);
  cr_assert_eq(rt.memcpy_(host, dst, n, D2H), 0);
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(host[i], 0xA5, "byte %zu was written", i); /* the emulator's fresh memory */
  /* the host path of the same call */
  d = dl_u8(host, shape, kDLCPU, 0);
  cr_assert_eq(tport_get_into_dlpack(c, &info.ref, &d, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(memcmp(host, want, n), 0);
  free(host);
  free(want);
  rt.free_(dst);
  tport_close(c);
}

/* Over tcp the host path lends its bytes to the transport; staged chunks
 * live in slots reused two chunks on, so they must be copied. */
Test(client_cuda, over_tcp_to_a_tportd)
{
  pid_t child = -1;
  char turl[128];
  for (int tries = 0; tries < 5 && child < 0; tries++) {
    svc_tcp_url(turl, sizeof turl);
    child = svc_spawn(turl, NULL);
  }
  cr_assert_gt(child, 0, "tportd did not start");
  tport_client *c = svc_connect(turl, NULL);
  round_trip(c, 9 * CHUNK + 3, "cpu", 21);
  round_trip(c, CHUNK - 1, "cpu", 22);
  tport_close(c);
  cr_assert_eq(svc_terminate(child), 0);
}

Test(client_cuda_missing, without_a_runtime_device_memory_is_a_clear_error)
{
  setenv("TPORT_CUDART_LIBRARY", "/nonexistent/libcudart_missing.so.13", 1);
  srv = svc_start_inproc(url, sizeof url, NULL);
  tport_client *c = svc_connect(url, NULL);
  uint8_t bytes[8] = {0};
  int64_t shape[1] = {8};
  DLTensor t = dl_u8(bytes, shape, kDLCUDA, 0);
  tport_err err = {0};
  cr_assert_eq(tport_put_dlpack(c, &t, NULL, NULL, &err), TPORT_FAILED_PRECONDITION);
  cr_assert_not_null(strstr(err.msg, "/nonexistent/libcudart_missing.so.13"), "%s", err.msg);
  cr_assert_not_null(strstr(err.msg, "TPORT_CUDART_LIBRARY"), "%s", err.msg);
  memset(&err, 0, sizeof err);
  cr_assert_eq(tport_get_into_dlpack(c, &(tport_ref){.name = "x"}, &t, NULL, &err),
               TPORT_FAILED_PRECONDITION, "%s", err.msg);
  /* host memory needs no runtime */
  t.device.device_type = kDLCPU;
  cr_assert_eq(tport_put_dlpack(c, &t, NULL, NULL, &err), 0, "%s", err.msg);
  tport_close(c);
  server_stop(srv, 1000);
  srv = NULL;
}

/* ---------------------------------------------------------------- real runtime */

#ifndef CUDART_REAL_PATH
#define CUDART_REAL_PATH "libcudart.so.13"
#endif
/* the build's toolkit, or where a GPU machine has its runtime (the GPU
 * check's runner finds it: bench/gpu-check/run) */
static const char *real_path(void)
{
  const char *e = getenv("TPORT_TEST_REAL_CUDART");
  return e && *e ? e : CUDART_REAL_PATH;
}
#define REAL_PATH real_path()

static bool require_gpu(void)
{
  const char *e = getenv("TPORT_REQUIRE_GPU");
  return e && strcmp(e, "1") == 0;
}

/* The real runtime, or a skip (a failure under TPORT_REQUIRE_GPU=1). */
static bool use_real_runtime(bool need_device)
{
  rt.lib = dlopen(REAL_PATH, RTLD_NOW | RTLD_LOCAL);
  if (!rt.lib) {
    cr_assert(!require_gpu(), "TPORT_REQUIRE_GPU=1 and no CUDA runtime: %s", dlerror());
    cr_skip_test("no CUDA runtime (%s): the real-GPU path is not run here", REAL_PATH);
    return false;
  }
  setenv("TPORT_CUDART_LIBRARY", REAL_PATH, 1);
  bind_runtime();
  int n = 0;
  int st = rt.device_count(&n);
  if (need_device && (st || n == 0)) {
    cr_assert(!require_gpu(), "TPORT_REQUIRE_GPU=1 and no GPU: cudaGetDeviceCount %d, %d devices",
              st, n);
    cr_skip_test("no GPU (cudaGetDeviceCount: error %d, %d devices): the real-GPU path is not "
                 "run here",
                 st, n);
    return false;
  }
  return true;
}

/* Needs only the library: every call libtport resolves is in it (a missing
 * one would be FAILED_PRECONDITION naming it), and a host pointer handed
 * over as device memory is refused (no driver: the runtime says why). */
Test(real_gpu, the_real_runtime_resolves)
{
  if (!use_real_runtime(false))
    return;
  srv = svc_start_inproc(url, sizeof url, NULL);
  tport_client *c = svc_connect(url, NULL);
  static uint8_t bytes[8];
  int64_t shape[1] = {8};
  DLTensor t = dl_u8(bytes, shape, kDLCUDA, 0);
  tport_err err = {0};
  int rc = tport_put_dlpack(c, &t, NULL, NULL, &err);
  cr_assert(rc == TPORT_INVALID_ARGUMENT || rc == TPORT_UNAVAILABLE, "%d: %s", rc, err.msg);
  cr_assert_null(strstr(err.msg, "lacks"), "%s", err.msg);
  tport_close(c);
  server_stop(srv, 1000);
  srv = NULL;
}

Test(real_gpu, put_and_get_through_a_gpu)
{
  if (!use_real_runtime(true))
    return;
  /* the server's GPU too: GPU memory to GPU memory through the socket */
  srv = svc_start_inproc(url, sizeof url, "cpu,sim:2,cuda");
  tport_client *c = svc_connect(url, NULL);
  const char *devs[] = {"cpu", "sim:0", "cuda:0"};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++)
    for (size_t d = 0; d < 3; d++)
      round_trip(c, sizes[k], devs[d], (unsigned)(k * 2 + d));
  tport_close(c);
  server_stop(srv, 1000);
  srv = NULL;
}
