/* test_cuda.c: the GPU suite (ctest -L gpu).  On a GPU: the backend
 * contract; every transfer path, each element checked; the copy kernels
 * through the engine against the CPU kernels bit for bit (random bit
 * patterns and special values, every dtype pair, each kernel: vectorized,
 * tiled transpose, generic strided, broadcast, with conj/neg, and 64-bit
 * indexing over views of more than 4 GiB and near 2^32 elements); managed
 * memory; the kernel cache reloaded from disk; no context on a device that no
 * call named.
 *
 * Where the devices a test needs are missing it skips, printing why with
 * cudaDriverGetVersion and cudaRuntimeGetVersion.  With TPORT_REQUIRE_GPU=N
 * (N >= 1; any other non-empty value but 0 means 1) a test that needs at most
 * N devices fails instead, so that a GPU run cannot pass by skipping; a test
 * that needs more devices than N still skips (a 2-GPU test on a 1-GPU
 * machine under TPORT_REQUIRE_GPU=1).  One test needs no GPU: it checks,
 * with the launch planner, that the layouts below reach the kernels they are
 * meant to test. */
#include <criterion/criterion.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conformance.h"
#include "cuda_alloc.h"
#include "cuda_jit.h"
#include "engine.h"
#include "storage.h"

static const tport_device CPU = {TPORT_DEV_CPU, 0}, G0 = {TPORT_DEV_CUDA, 0};
static const char *const DT[TPORT_NUM_DTYPES] = {"bool",    "uint8",   "int8",      "int16",
                                                 "int32",   "int64",   "float16",   "bfloat16",
                                                 "float32", "float64", "complex64", "complex128"};

/* ---------------------------------------------------------------- skipping */

static int required_gpus(void)
{
  const char *v = getenv("TPORT_REQUIRE_GPU");
  if (!v || !*v)
    return 0;
  char *end;
  long n = strtol(v, &end, 10);
  if (*end)
    return 1; /* "yes", "true" */
  return n < 0 ? 0 : n > 64 ? 64 : (int)n;
}

static void cuda_versions(char *buf, size_t n)
{
  int drv = -1, rt = -1;
  cudaError_t de = cudaDriverGetVersion(&drv), re = cudaRuntimeGetVersion(&rt);
  cudaGetLastError();
  snprintf(buf, n,
           "cudaDriverGetVersion %d%s, cudaRuntimeGetVersion %d%s (the static CUDA 13 runtime "
           "needs an R580-series driver or newer: a driver version of 13000 or more)",
           drv,
           de != cudaSuccess ? " (failed)"
           : drv == 0        ? " (no driver)"
                             : "",
           rt, re != cudaSuccess ? " (failed)" : "");
}

/* Returns when n devices are present; else skips, or fails under
 * TPORT_REQUIRE_GPU, saying why. */
static void need_gpu(int n)
{
  int have = backend_cuda.device_count();
  if (have >= n)
    return;
  char v[300];
  cuda_versions(v, sizeof v);
  const char *why = have ? "fewer devices than that" : backend_cuda.unavailable_reason();
  if (required_gpus() >= n)
    cr_assert_fail("TPORT_REQUIRE_GPU=%d and this test needs %d CUDA device%s, %d present: %s; %s",
                   required_gpus(), n, n == 1 ? "" : "s", have, why, v);
  cr_skip_test("needs %d CUDA device%s, %d present: %s; %s", n, n == 1 ? "" : "s", have, why, v);
}

/* Whether dev's primary context is active, asked of the driver as the backend asks it. */
static bool ctx_active(int dev)
{
  static PFN_cuDevicePrimaryCtxGetState_v7000 get_state;
  if (!get_state) {
    void *p = NULL;
    enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    cr_assert_eq(cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &p, 12000,
                                                  cudaEnableDefault, &q),
                 cudaSuccess);
    cr_assert(q == cudaDriverEntryPointSuccess && p, "cuDevicePrimaryCtxGetState: %d", (int)q);
    get_state = (PFN_cuDevicePrimaryCtxGetState_v7000)p;
  }
  unsigned flags = 0;
  int active = 0;
  cr_assert_eq(get_state(dev, &flags, &active), CUDA_SUCCESS);
  return active == 1;
}

static void teardown(void)
{
  engine_set_test_faults(0);
  engine_synchronize_all();
}

TestSuite(cuda, .fini = teardown);

/* ---------------------------------------------------------------- helpers */

static tport_tensor *host_empty(tport_dtype dt, int n, const int64_t *sz)
{
  tport_tensor *t;
  tport_err e;
  cr_assert_eq(tensor_empty(CPU, dt, n, sz, TPORT_MF_CONTIGUOUS, 0, &t, &e), 0, "%s", e.msg);
  return t;
}

static tport_tensor *host_seq(int n)
{
  tport_tensor *t = host_empty(TPORT_FLOAT32, 1, (int64_t[]){n});
  for (int i = 0; i < n; i++)
    ((float *)t->storage->ptr)[i] = (float)i;
  return t;
}

static tport_tensor *to(tport_tensor *t, to_options o)
{
  tport_tensor *r;
  bool a;
  tport_err e;
  cr_assert_eq(tensor_to(t, &o, &r, &a, &e), 0, "%s", e.msg);
  return r;
}

static tport_tensor *view(tport_tensor *t, int n, const int64_t *sz, const int64_t *st, int64_t off)
{
  tport_tensor *v;
  tport_err e;
  cr_assert_eq(tensor_as_strided(t, n, sz, st, off, &v, &e), 0, "%s", e.msg);
  return v;
}

/* t's values in logical C order (malloc'ed). */
static uint8_t *read_all(tport_tensor *t)
{
  size_t n = tensor_nbytes(t);
  uint8_t *b = malloc(n ? n : 1);
  tport_err e;
  cr_assert_not_null(b);
  cr_assert_eq(tensor_read(t, b, n, &e), 0, "%s", e.msg);
  return b;
}

/* Index of the first differing element of two arrays of n elements of es bytes; -1 if none. */
static int64_t first_diff(const uint8_t *a, const uint8_t *b, int64_t n, size_t es)
{
  if (memcmp(a, b, (size_t)n * es) == 0)
    return -1;
  for (int64_t i = 0; i < n; i++)
    if (memcmp(a + i * es, b + i * es, es))
      return i;
  return -1;
}

/* ---------------------------------------------------------------- availability */

Test(cuda, availability_is_explained)
{
  int n = backend_cuda.device_count(), rt = 0;
  const char *why = backend_cuda.unavailable_reason();
  char v[300];
  cuda_versions(v, sizeof v);
  cr_log_info("cuda: %d device%s; %s", n, n == 1 ? "" : "s", v);
  if (n > 0) {
    cr_assert_eq(strlen(why), 0);
    return;
  }
  cr_assert_gt(strlen(why), 0, "the runtime's message is kept");
  /* with the versions, so that a driver too old for the runtime shows */
  cr_assert_eq(cudaRuntimeGetVersion(&rt), cudaSuccess);
  char want[32];
  snprintf(want, sizeof want, "runtime %d.%d", rt / 1000, rt % 1000 / 10);
  cr_assert(strstr(why, want) && strstr(why, "driver"), "%s", why);
  if (required_gpus() > 0)
    need_gpu(1); /* fails: a GPU run without a GPU */
}

Test(cuda, conformance)
{
  need_gpu(1);
  conformance(&backend_cuda);
}

/* ---------------------------------------------------------------- transfers */

/* Values float16 holds exactly (multiples of 1/4 in [-512, 512)), in an
 * order that tells a transposition from the right answer. */
static float f16_exact(int64_t k)
{
  return (float)((k * 7919) % 4096) * 0.25f - 512.0f;
}

Test(cuda, transfers_and_kernels)
{
  need_gpu(1);
  enum { R = 300, C = 1000 };
  tport_tensor *h = host_empty(TPORT_FLOAT32, 1, (int64_t[]){R * C});
  for (int i = 0; i < R * C; i++)
    ((float *)h->storage->ptr)[i] = f16_exact(i);
  /* a transposed host view: element (i, j) is h[j * C + i] */
  tport_tensor *hv = view(h, 2, (int64_t[]){C, R}, (int64_t[]){1, C}, 0);
  tport_tensor *want16 = to(hv, (to_options){.has_dtype = true, .dtype = TPORT_FLOAT16});
  uint8_t *w16 = read_all(want16);
  for (int nb = 0; nb < 2; nb++) {
    /* host view -> cuda:0 as float16: temporaries and the conversion kernel */
    tport_tensor *d = to(hv, (to_options){.has_device = true,
                                          .device = G0,
                                          .has_dtype = true,
                                          .dtype = TPORT_FLOAT16,
                                          .non_blocking = nb});
    uint8_t *g16 = read_all(d); /* D2H */
    int64_t k = first_diff(w16, g16, R * C, 2);
    cr_assert_eq(k, -1, "nb %d: float16 element %lld: cpu %04x, cuda %04x", nb, (long long)k,
                 k < 0 ? 0 : ((uint16_t *)w16)[k], k < 0 ? 0 : ((uint16_t *)g16)[k]);
    free(g16);
    /* on the device: transposed float16 -> contiguous float64 */
    tport_tensor *t = to(d, (to_options){.has_format = true,
                                         .format = TPORT_MF_CONTIGUOUS,
                                         .exact_format = true,
                                         .has_dtype = true,
                                         .dtype = TPORT_FLOAT64});
    /* back to the host (pinned when non_blocking) */
    tport_tensor *back = to(t, (to_options){.has_device = true, .device = CPU, .non_blocking = nb});
    if (nb)
      cr_assert(back->storage->flags & STORAGE_PINNED);
    double *v = (double *)read_all(t), *vb = (double *)read_all(back);
    for (int i = 0; i < C; i++)
      for (int j = 0; j < R; j++) {
        double want = (double)f16_exact((int64_t)j * C + i);
        if (v[i * R + j] != want || vb[i * R + j] != want)
          cr_assert_fail("nb %d: (%d,%d): %g on cuda:0, %g back on the host, want %g", nb, i, j,
                         v[i * R + j], vb[i * R + j], want);
      }
    free(v);
    free(vb);
    tensor_release(back);
    tensor_release(t);
    tensor_release(d);
  }
  free(w16);
  tensor_release(want16);
  tensor_release(hv);
  tensor_release(h);
}

/* float32 -> float16 on a device rounds by the hardware's conversion
 * (copy.cu), the host by arithmetic (kernels/cpu/half.h): the same bits for
 * every sign, exponent and top 10 bits of mantissa, each with the low 13
 * bits that decide a normal result's rounding (0, 1, just below, at and just
 * above half, all ones); a subnormal result's rounding bits lie higher, in
 * the enumerated part.  NaNs with payloads, infinities, +-0 among them. */
Test(cuda, float16_rounding_matches_the_cpu_everywhere)
{
  need_gpu(1);
  static const uint32_t low[] = {0, 1, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x0800};
  enum { NLOW = sizeof low / sizeof low[0] };
  const int64_t n = (int64_t)NLOW << 19;
  tport_tensor *h = host_empty(TPORT_FLOAT32, 1, (int64_t[]){n});
  uint32_t *w = (uint32_t *)h->storage->ptr;
  for (int64_t hi = 0; hi < (1 << 19); hi++)
    for (int k = 0; k < NLOW; k++)
      w[hi * NLOW + k] = ((uint32_t)hi << 13) | low[k];
  tport_tensor *want = to(h, (to_options){.has_dtype = true, .dtype = TPORT_FLOAT16});
  tport_tensor *d = to(h, (to_options){.has_device = true, .device = G0});
  tport_tensor *d16 = to(d, (to_options){.has_dtype = true, .dtype = TPORT_FLOAT16});
  uint8_t *a = read_all(want), *b = read_all(d16);
  int64_t k = first_diff(a, b, n, 2);
  cr_assert_eq(k, -1, "float32 %08x: cpu %04x, cuda %04x", k < 0 ? 0 : w[k],
               k < 0 ? 0 : ((uint16_t *)a)[k], k < 0 ? 0 : ((uint16_t *)b)[k]);
  free(a);
  free(b);
  tensor_release(d16);
  tensor_release(d);
  tensor_release(want);
  tensor_release(h);
}

/* complex -> bool is true when either part is nonzero, NaN included (PyTorch
 * 2.x; 1.13 read the real part alone), by the device kernel and on either
 * side of a transfer (non_blocking picks which), through a conj view too. */
Test(cuda, complex_to_bool_looks_at_both_parts)
{
  need_gpu(1);
  static const float in[][2] = {{0, 1},  {0, 0},   {1, 0},   {-0.0f, 0},
                                {0, -2}, {NAN, 0}, {0, NAN}, {-0.0f, -0.0f}};
  static const uint8_t want[] = {1, 0, 1, 0, 1, 1, 1, 0};
  enum { N = sizeof want };
  tport_tensor *h = host_empty(TPORT_COMPLEX64, 1, (int64_t[]){N}), *hc;
  memcpy(h->storage->ptr, in, sizeof in);
  cr_assert_eq(tensor_conj_view(h, &hc, NULL), 0);
  for (int nb = 0; nb < 2; nb++)
    for (int conj = 0; conj < 2; conj++) {
      tport_tensor *src = conj ? hc : h;
      tport_tensor *d = to(src, (to_options){.has_device = true, .device = G0, .non_blocking = nb});
      tport_tensor *r[3] = {
          to(src, (to_options){.has_device = true,
                               .device = G0,
                               .has_dtype = true,
                               .dtype = TPORT_BOOL,
                               .non_blocking = nb}),                   /* host -> cuda:0 */
          to(d, (to_options){.has_dtype = true, .dtype = TPORT_BOOL}), /* on cuda:0 */
          to(d, (to_options){.has_device = true,
                             .device = CPU,
                             .has_dtype = true,
                             .dtype = TPORT_BOOL,
                             .non_blocking = nb}), /* cuda:0 -> host */
      };
      static const char *const how[] = {"host -> cuda:0", "on cuda:0", "cuda:0 -> host"};
      for (int k = 0; k < 3; k++) {
        uint8_t *got = read_all(r[k]);
        for (int i = 0; i < N; i++)
          cr_assert_eq(got[i], want[i], "%s, nb %d, conj %d: element %d (%g, %g): %u, want %u",
                       how[k], nb, conj, i, in[i][0], in[i][1], got[i], want[i]);
        free(got);
        tensor_release(r[k]);
      }
      tensor_release(d);
    }
  tensor_release(hc);
  tensor_release(h);
}

Test(cuda, device_to_device)
{
  need_gpu(2);
  tport_err e;
  tport_tensor *h = host_seq(1 << 20), *a, *b, *r;
  bool al;
  to_options o = {.has_device = true, .device = G0};
  cr_assert_eq(tensor_to(h, &o, &a, &al, &e), 0, "%s", e.msg);
  o.device.index = 1;
  cr_assert_eq(tensor_to(a, &o, &b, &al, &e), 0, "%s", e.msg);
  float *v = malloc(4 << 20);
  cr_assert_eq(tensor_read(b, v, 4 << 20, &e), 0, "%s", e.msg);
  for (int i = 0; i < 1 << 20; i++)
    cr_assert_eq(v[i], (float)i);
  /* a converting copy across devices (peer kernel or temporaries) */
  o = (to_options){.has_device = true, .device = G0, .has_dtype = true, .dtype = TPORT_INT32};
  cr_assert_eq(tensor_to(b, &o, &r, &al, &e), 0, "%s", e.msg);
  int32_t *iv = malloc(4 << 20);
  cr_assert_eq(tensor_read(r, iv, 4 << 20, &e), 0);
  for (int i = 0; i < 1 << 20; i++)
    cr_assert_eq(iv[i], i);
  /* peer access: enabling is idempotent, and its answer does not change */
  bool can = backend_cuda.can_access_peer(1, 0);
  for (int k = 0; k < 2; k++)
    cr_assert_eq(backend_cuda.enable_peer_access(1, 0, &e), can ? 0 : TPORT_FAILED_PRECONDITION,
                 "%s", e.msg);
  cr_assert_eq(backend_cuda.can_access_peer(1, 0), can);
  free(iv);
  free(v);
  tensor_release(r);
  tensor_release(b);
  tensor_release(a);
  tensor_release(h);
}

/* The sim suite's ordering scenario, on real streams: a non_blocking result
 * read through the engine at once. */
Test(cuda, non_blocking_results_are_safe_to_read)
{
  need_gpu(1);
  tport_tensor *h = host_seq(4 << 20);
  for (int trial = 0; trial < 20; trial++) {
    tport_tensor *d, *r;
    bool a;
    to_options o = {.has_device = true, .device = G0, .non_blocking = true};
    cr_assert_eq(tensor_to(h, &o, &d, &a, NULL), 0);
    o.device = CPU;
    cr_assert_eq(tensor_to(d, &o, &r, &a, NULL), 0);
    cr_assert(r->storage->flags & STORAGE_PINNED);
    uint8_t *v = read_all(r);
    int64_t k = first_diff(h->storage->ptr, v, 4 << 20, 4);
    cr_assert_eq(k, -1, "trial %d: element %lld is %g", trial, (long long)k,
                 k < 0 ? 0.0 : (double)((float *)v)[k]);
    free(v);
    tensor_release(r);
    tensor_release(d);
  }
  tensor_release(h);
}

/* ---------------------------------------------------------------- contexts */

typedef struct {
  int dev;
  tport_err err; /* code 0: the work was done and its values checked */
} work_arg;

/* Up to dev and back, converting; no Criterion assertion (it may run on
 * another thread): the outcome goes to w->err. */
static void *work_on(void *arg)
{
  work_arg *w = arg;
  enum { N = 1 << 16 };
  tport_tensor *h = NULL;
  w->err.code =
      tensor_empty(CPU, TPORT_FLOAT32, 1, (int64_t[]){N}, TPORT_MF_CONTIGUOUS, 0, &h, &w->err);
  for (int i = 0; i < N && h; i++)
    ((float *)h->storage->ptr)[i] = (float)i;
  for (int nb = 0; nb < 2 && !w->err.code; nb++) {
    tport_tensor *d = NULL, *r = NULL;
    bool a;
    to_options up = {.has_device = true,
                     .device = {TPORT_DEV_CUDA, w->dev},
                     .has_dtype = true,
                     .dtype = TPORT_FLOAT64,
                     .non_blocking = nb},
               down = {.has_device = true, .device = CPU, .non_blocking = nb};
    double *v = malloc(N * sizeof *v);
    if (!v)
      w->err.code = tport_err_set(&w->err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
    else if (!(w->err.code = tensor_to(h, &up, &d, &a, &w->err)) &&
             !(w->err.code = tensor_to(d, &down, &r, &a, &w->err)) &&
             !(w->err.code = tensor_read(r, v, N * sizeof *v, &w->err)))
      for (int i = 0; i < N; i++)
        if (v[i] != (double)i) {
          tport_err_set(&w->err, TPORT_DATA_LOSS, "element %d is %g", i, v[i]);
          break;
        }
    free(v);
    tensor_release(r);
    tensor_release(d);
  }
  tensor_release(h);
  return NULL;
}

/* Since CUDA 12 cudaSetDevice creates the device's context, so a device
 * guard that restores a thread's previous device (0 on a fresh thread)
 * leaves a context there.  Questions about devices create none; work on
 * the last device, from this thread and from another (pinned staging,
 * events, kernels), creates one on that device only. */
Test(cuda, no_context_on_a_device_never_named)
{
  need_gpu(1);
  int n = backend_cuda.device_count();
  for (int d = 0; d < n; d++)
    cr_assert_not(ctx_active(d), "cuda:%d has a context after device_count()", d);
  char name[256], cc[16];
  be_stat st[64];
  for (int d = 0; d < n; d++) {
    backend_cuda.describe(d, name, sizeof name, cc, sizeof cc);
    for (int p = 0; p < n; p++)
      backend_cuda.can_access_peer(d, p);
    cr_assert_eq(backend_cuda.stream_synchronize(backend_cuda.stream_default(d), NULL), 0);
  }
  backend_cuda.stats(st, 64);
  engine_synchronize_all(); /* asks every device's default stream */
  for (int d = 0; d < n; d++)
    cr_assert_not(ctx_active(d), "cuda:%d: a context from a call that does no work on it", d);
  work_arg w = {.dev = n - 1}, w2 = {.dev = n - 1};
  work_on(&w);
  cr_assert_eq(w.err.code, 0, "%s", w.err.msg);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, work_on, &w2), 0);
  pthread_join(t, NULL);
  cr_assert_eq(w2.err.code, 0, "another thread: %s", w2.err.msg);
  engine_synchronize_all();
  cr_assert(ctx_active(n - 1));
  for (int d = 0; d < n - 1; d++)
    cr_assert_not(ctx_active(d), "cuda:%d was never named, yet has a context", d);
}

/* ---------------------------------------------------------------- managed memory */

static bool concurrent_managed(int dev)
{
  int v = 0;
  cr_assert_eq(cudaDeviceGetAttribute(&v, cudaDevAttrConcurrentManagedAccess, dev), cudaSuccess);
  return v != 0;
}

Test(cuda, managed_moves)
{
  need_gpu(1);
  tport_tensor *m;
  tport_err e;
  int rc = tensor_empty(G0, TPORT_INT32, 1, (int64_t[]){1000}, TPORT_MF_CONTIGUOUS, STORAGE_MANAGED,
                        &m, &e);
  if (!concurrent_managed(0)) {
    cr_assert_eq(rc, TPORT_FAILED_PRECONDITION, "unsupported, and said so");
    cr_assert(strstr(e.msg, "cudaDevAttrConcurrentManagedAccess"), "%s", e.msg);
    return;
  }
  cr_assert_eq(rc, 0, "%s", e.msg);
  int32_t in[1000];
  for (int i = 0; i < 1000; i++)
    in[i] = i * 3;
  cr_assert_eq(tensor_write(m, in, sizeof in, &e), 0, "%s", e.msg);
  void *ptr = m->storage->ptr;
  tport_tensor *r;
  bool a;
  to_options o = {.has_device = true, .device = CPU};
  cr_assert_eq(tensor_to(m, &o, &r, &a, &e), 0, "%s", e.msg);
  cr_assert(a && r->storage->ptr == ptr, "a move");
  cr_assert(memcmp(ptr, in, sizeof in) == 0, "readable on the host after a blocking move");
  tensor_release(r);
  tensor_release(m);
}

/* Blocks the caching allocator keeps are free memory: a managed allocation
 * larger than what the device reports free, but smaller than that plus the
 * cache, gets the cache back and succeeds. */
Test(cuda, managed_allocations_reclaim_the_allocator_cache)
{
  need_gpu(1);
  tport_err e;
  void *m = NULL, *big;
  if (!concurrent_managed(0)) {
    cr_assert_eq(backend_cuda.alloc_managed(0, 1 << 20, &m, &e), TPORT_FAILED_PRECONDITION);
    return;
  }
  size_t freeb, total;
  cr_assert_eq(backend_cuda.mem_info(0, &freeb, &total, &e), 0, "%s", e.msg);
  size_t hold = freeb / 2 & ~(((size_t)2 << 20) - 1);
  cr_assert_eq(backend_cuda.alloc(0, hold, &big, &e), 0, "%s", e.msg);
  backend_cuda.free(0, big); /* into the cache, not back to the device */
  cuda_alloc_stats as;
  cuda_alloc_get_stats(0, &as);
  cr_assert_geq(as.bytes_cached, hold);
  size_t free2;
  cr_assert_eq(backend_cuda.mem_info(0, &free2, &total, &e), 0);
  size_t ask = free2 + hold / 2;
  cr_assert_eq(backend_cuda.alloc_managed(0, ask, &m, &e), 0,
               "%zu bytes with %zu free and %zu cached: %s", ask, free2, (size_t)as.bytes_cached,
               e.msg);
  cuda_alloc_get_stats(0, &as);
  cr_assert_eq(as.bytes_cached, 0, "the cache was given back");
  backend_cuda.free(0, m);
  /* more than the whole device stays refused */
  cr_assert_eq(backend_cuda.alloc_managed(0, total + ((size_t)1 << 30), &m, &e),
               TPORT_RESOURCE_EXHAUSTED);
  cr_assert(strstr(e.msg, "managed memory asked"), "%s", e.msg);
}

/* ---------------------------------------------------------------- kernel cache */

static int files_in(const char *dir)
{
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *de; d && (de = readdir(d));)
    n += de->d_name[0] != '.';
  if (d)
    closedir(d);
  return n;
}

static void remove_dir(const char *dir)
{
  DIR *d = opendir(dir);
  char path[1024];
  for (struct dirent *de; d && (de = readdir(d));)
    if (de->d_name[0] != '.') {
      snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
      remove(path);
    }
  if (d)
    closedir(d);
  rmdir(dir);
}

/* float32 -> bfloat16 on cuda:0, checked against the CPU kernels. */
static void convert_and_check(tport_tensor *h, tport_tensor *d, uint8_t *want)
{
  tport_tensor *r = to(d, (to_options){.has_dtype = true, .dtype = TPORT_BFLOAT16});
  uint8_t *got = read_all(r);
  cr_assert_eq(first_diff(want, got, tensor_numel(h), 2), -1);
  free(got);
  tensor_release(r);
}

Test(cuda, kernel_cache_reloads_from_disk)
{
  need_gpu(1);
  char dir[] = "/tmp/tport-kcache-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  cuda_jit_set_cache_dir(dir);
  cuda_jit_reset(); /* nothing in memory: the first use compiles */
  tport_tensor *h = host_seq(1000);
  tport_tensor *want = to(h, (to_options){.has_dtype = true, .dtype = TPORT_BFLOAT16});
  uint8_t *w = read_all(want);
  tport_tensor *d = to(h, (to_options){.has_device = true, .device = G0}); /* a memcpy */
  cuda_jit_stats s0, s1, s2, s3;
  cuda_jit_get_stats(&s0);
  convert_and_check(h, d, w);
  cuda_jit_get_stats(&s1);
  cr_assert_eq(s1.misses - s0.misses, 1, "compiled once");
  cr_assert_eq(s1.disk_hits, s0.disk_hits, "an empty cache directory");
  cr_assert_gt(s1.compile_ms, s0.compile_ms, "NVRTC ran");
  cr_assert_geq(files_in(dir), 1, "the kernel was written to %s", dir);
  convert_and_check(h, d, w);
  cuda_jit_get_stats(&s2);
  cr_assert_eq(s2.misses, s1.misses, "then served from memory");
  cr_assert_geq(s2.hits - s1.hits, 1);
  /* forget the memory cache: the next use loads the file, NVRTC does not run */
  cuda_jit_reset();
  convert_and_check(h, d, w);
  cuda_jit_get_stats(&s3);
  cr_assert_eq(s3.disk_hits - s2.disk_hits, 1, "reloaded from disk");
  cr_assert_eq(s3.compile_ms, s2.compile_ms, "without compiling");
  tensor_release(d);
  tensor_release(want);
  tensor_release(h);
  free(w);
  engine_synchronize_all();
  cuda_jit_reset();
  cuda_jit_set_cache_dir(NULL);
  remove_dir(dir);
}

/* ---------------------------------------------------------------- kernels, bit for bit */

/* A 4-D shape of more elements than 2^16 (every 16-bit pattern fits in the
 * dense layouts), odd so that the vectorized kernel has a tail. */
enum { KN = 5, KC = 37, KH = 19, KW = 19, KHW = KH * KW, KCW = KC * KW, KCHW = KC * KHW };
static const int64_t KSZ[4] = {KN, KC, KH, KW};
static const int64_t KSL[4] = {KCHW, 1, KCW, KC}; /* channels_last strides */

/* Source layouts, as views of one buffer, and the kernel each copy takes. */
typedef struct src_layout {
  const char *name;
  int64_t strides[4], offset;
  tport_memory_format format; /* of the result */
  cuda_jit_kernel kernel;
} src_layout;
static const src_layout LAYOUTS[] = {
    {"dense", {KCHW, KHW, KW, 1}, 0, TPORT_MF_CONTIGUOUS, CUDA_JIT_CAST_VEC},
    {"to channels_last", {KCHW, KHW, KW, 1}, 0, TPORT_MF_CHANNELS_LAST, CUDA_JIT_TRANSPOSE},
    /* no two dims coalesce, and the start is one element off alignment */
    {"strided", {40853, 1104, 58, 3}, 1, TPORT_MF_CONTIGUOUS, CUDA_JIT_COPY},
    {"broadcast", {0, KHW, KW, 1}, 0, TPORT_MF_CONTIGUOUS, CUDA_JIT_COPY},
};
#define NLAYOUTS ((int)(sizeof LAYOUTS / sizeof LAYOUTS[0]))
#define KBUF (1 + 4 * 40853 + 36 * 1104 + 18 * 58 + 18 * 3 + 1) /* elements the views reach */

static uint64_t rng(uint64_t *s) /* splitmix64 */
{
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* NaNs with payloads (quiet and signaling, both signs), infinities, zeros,
 * subnormals, the largest values, halves (rounding to even), the edges of
 * every integer type, float16's and bfloat16's overflow and rounding ties. */
static const uint32_t F32_SPECIAL[] = {
    0x7FC00000, 0xFFC00000, 0x7FC00001, 0xFFC12345, 0x7FA5A5A5, 0xFF812345, 0x7FFFFFFF, 0x7F800000,
    0xFF800000, 0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00800000, 0x7F7FFFFF,
    0xFF7FFFFF, 0x3F000000, 0xBF000000, 0x3FC00000, 0x40200000, 0xC0200000, 0x3EFFFFFF, 0x3F7FFFFF,
    0x42FF0000, 0x43000000, 0xC3008000, 0xC3010000, 0x437F8000, 0x43800000, 0x46FFFF00, 0x47000000,
    0xC7000080, 0xC7000100, 0x4EFFFFFF, 0x4F000000, 0xCF000000, 0xCF000001, 0x4F800000, 0x5EFFFFFF,
    0x5F000000, 0xDF000000, 0xDF000001, 0x60AD78EC, 0x477FE000, 0x477FEFFF, 0x477FF000, 0x38800000,
    0x33800000, 0x33000000, 0x33000001, 0x3F801000, 0x3F803000, 0x3F808000, 0x3F818000, 0x7F7F8000,
    0x7F7F7FFF, 0xBF800000, 0x3F800000};
static const uint64_t F64_SPECIAL[] = {
    0x7FF8000000000000, 0x7FF8000000000001, 0xFFF8DEADBEEF0001, 0x7FF0000000000001,
    0xFFF4000000000000, 0x7FF0000000000000, 0xFFF0000000000000, 0x0000000000000000,
    0x8000000000000000, 0x0000000000000001, 0x800FFFFFFFFFFFFF, 0x0010000000000000,
    0x7FEFFFFFFFFFFFFF, 0x3FE0000000000000, 0x3FF8000000000000, 0x4004000000000000,
    0xC004000000000000, 0x41DFFFFFFFE00000, 0x41E0000000000000, 0xC1E0000000100000,
    0xC1E0000000200000, 0x43DFFFFFFFFFFFFF, 0x43E0000000000000, 0xC3E0000000000000,
    0xC3E0000000000001, 0x47EFFFFFE0000000, 0x47EFFFFFF0000000, 0x47F0000000000000,
    0x36A0000000000000, 0x3690000000000000, 0x3FF0000010000000, 0x3FF0000010000001,
    0x40EFFE0000000000, 0x40EFFE0000000001, 0x40EFFDFFFFFFFFFF, 0x3E70000000000000,
    0x4330000000000001, 0xBFF0000000000000};
/* clang-format off */
static const int64_t INT_SPECIAL[] = {
    0, 1, -1, 127, 128, -128, -129, 255, 256, 32767, 32768, -32768, -32769, 2049, 2051, 65504,
    65520, (1 << 24) + 1, -(1 << 24) - 1, INT32_MAX, INT32_MIN, 1LL << 31, UINT32_MAX, 1LL << 32,
    (1LL << 53) + 1, -(1LL << 53) - 1, INT64_MAX - 511, INT64_MAX, INT64_MIN};
/* clang-format on */

/* A float with a fraction or not, of a magnitude from 2^-53 to 2^69: in and
 * out of the range of every integer type. */
static double moderate(uint64_t r)
{
  return ldexp((double)((int64_t)(r & 0xFFFFFF) - 0x800000), (int)((r >> 24) % 100) - 53);
}

static void fill_float(uint8_t *p, size_t es, int64_t n, uint64_t *s)
{
  for (int64_t k = 0; k < n; k++) {
    uint64_t r = rng(s);
    if (es == 4) {
      uint32_t v = (uint32_t)r;
      float f = (float)moderate(r >> 32);
      if (k < (int64_t)(sizeof F32_SPECIAL / 4))
        v = F32_SPECIAL[k];
      else if (r >> 62)
        memcpy(&v, &f, 4);
      memcpy(p + k * 4, &v, 4);
    } else {
      uint64_t v = r;
      double f = moderate(rng(s));
      if (k < (int64_t)(sizeof F64_SPECIAL / 8))
        v = F64_SPECIAL[k];
      else if (rng(s) >> 62)
        memcpy(&v, &f, 8);
      memcpy(p + k * 8, &v, 8);
    }
  }
}

/* A host buffer of n elements of st: every 16-bit pattern first for the
 * 16-bit types, the special values first for the others, then random bits
 * (bool: 0 and 1 only, the bytes a bool may hold). */
static tport_tensor *host_bits(tport_dtype st, int64_t n, uint64_t seed)
{
  tport_tensor *t = host_empty(st, 1, &n);
  uint8_t *p = t->storage->ptr;
  uint64_t s = seed;
  const int64_t nspecial = sizeof INT_SPECIAL / sizeof INT_SPECIAL[0];
  for (int64_t k = 0; k < n; k++) {
    uint64_t r = rng(&s);
    switch (st) {
    case TPORT_BOOL: p[k] = r & 1; break;
    case TPORT_UINT8:
    case TPORT_INT8: p[k] = (uint8_t)(k < 256 ? k : (int64_t)r); break;
    case TPORT_INT16:
    case TPORT_FLOAT16:
    case TPORT_BFLOAT16: ((uint16_t *)p)[k] = (uint16_t)(k < 65536 ? k : (int64_t)r); break;
    case TPORT_INT32:
      ((int32_t *)p)[k] = (int32_t)(k < nspecial ? INT_SPECIAL[k]
                                    : (r >> 63)  ? (int64_t)r % 70000
                                                 : (int64_t)r);
      break;
    case TPORT_INT64:
      ((int64_t *)p)[k] = k < nspecial ? INT_SPECIAL[k]
                          : (r >> 63)  ? (int64_t)r % 70000
                                       : (int64_t)r;
      break;
    default: break;
    }
  }
  if (st == TPORT_FLOAT32 || st == TPORT_COMPLEX64)
    fill_float(p, 4, n * (st == TPORT_COMPLEX64 ? 2 : 1), &s);
  else if (st == TPORT_FLOAT64 || st == TPORT_COMPLEX128)
    fill_float(p, 8, n * (st == TPORT_COMPLEX128 ? 2 : 1), &s);
  return t;
}

static bool nan_bits(tport_dtype t, const uint8_t *p)
{
  uint16_t h;
  uint32_t f;
  uint64_t d;
  switch (t) {
  case TPORT_FLOAT16: memcpy(&h, p, 2); return (h & 0x7C00) == 0x7C00 && (h & 0x3FF);
  case TPORT_BFLOAT16: memcpy(&h, p, 2); return (h & 0x7F80) == 0x7F80 && (h & 0x7F);
  case TPORT_FLOAT32:
  case TPORT_COMPLEX64:
    memcpy(&f, p, 4);
    return ((f & 0x7FFFFFFF) > 0x7F800000) ||
           (t == TPORT_COMPLEX64 && nan_bits(TPORT_FLOAT32, p + 4));
  case TPORT_FLOAT64:
  case TPORT_COMPLEX128:
    memcpy(&d, p, 8);
    return ((d & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull) ||
           (t == TPORT_COMPLEX128 && nan_bits(TPORT_FLOAT64, p + 8));
  default: return false;
  }
}

static void hex(char *buf, size_t n, const uint8_t *p, size_t es)
{
  size_t at = (size_t)snprintf(buf, n, "0x");
  for (size_t b = es; b-- > 0 && at + 2 < n;)
    at += (size_t)snprintf(buf + at, n - at, "%02x", p[b]);
}

/* How the results of one case compare. */
enum { SAME = 0, NAN_BITS = 1, VALUES = 2 };

/* Compares want (cpu) and got (cuda) of a to() from src; logs the first
 * differing element with its source bits.  NAN_BITS: every difference is
 * between two NaNs (the payload or the sign: a GPU's float arithmetic
 * gives its one canonical NaN where the host keeps the operand's). */
static int compare(const char *what, tport_tensor *want, tport_tensor *got, tport_tensor *src)
{
  cr_assert_eq(memcmp(want->layout.strides, got->layout.strides,
                      sizeof(int64_t) * (size_t)want->layout.ndim),
               0, "%s: the same strides", what);
  size_t es = tport_dtype_size(want->dtype), ss = tport_dtype_size(src->dtype);
  int64_t n = tensor_numel(want);
  uint8_t *w = read_all(want), *g = read_all(got);
  int64_t first = first_diff(w, g, n, es), ndiff = 0, nnan = 0;
  if (first >= 0) {
    for (int64_t i = first; i < n; i++)
      if (memcmp(w + i * es, g + i * es, es)) {
        ndiff++;
        nnan += nan_bits(want->dtype, w + i * es) && nan_bits(want->dtype, g + i * es);
      }
    /* the source element of logical index `first` */
    int64_t off = src->layout.offset, rest = first;
    for (int d = src->layout.ndim - 1; d >= 0; d--) {
      off += rest % src->layout.sizes[d] * src->layout.strides[d];
      rest /= src->layout.sizes[d];
    }
    char sb[40], wb[40], gb[40];
    hex(sb, sizeof sb, (const uint8_t *)src->storage->ptr + off * (int64_t)ss, ss);
    hex(wb, sizeof wb, w + first * es, es);
    hex(gb, sizeof gb, g + first * es, es);
    cr_log_error("%s: %lld of %lld elements differ%s; first, element %lld: source %s, cpu %s, "
                 "cuda %s",
                 what, (long long)ndiff, (long long)n,
                 nnan == ndiff ? " (each one a NaN on both sides: NaN payload or sign bits)" : "",
                 (long long)first, sb, wb, gb);
  }
  free(w);
  free(g);
  return first < 0 ? SAME : nnan == ndiff ? NAN_BITS : VALUES;
}

/* src as a view of buffer b in layout L, conjugated and negated if asked. */
static tport_tensor *layout_view(tport_tensor *b, const src_layout *L, bool conj_neg)
{
  tport_tensor *v = view(b, 4, KSZ, L->strides, L->offset), *c, *n;
  if (!conj_neg)
    return v;
  cr_assert_eq(tensor_conj_view(v, &c, NULL), 0);
  cr_assert_eq(tensor_neg_view(c, &n, NULL), 0);
  tensor_release(c);
  tensor_release(v);
  return n;
}

/* One to(dtype, format, copy) from layout L on the cpu and on cuda:0. */
static int one_case(tport_tensor *hb, tport_tensor *db, tport_dtype dt, const src_layout *L,
                    bool conj_neg)
{
  tport_tensor *hv = layout_view(hb, L, conj_neg), *dv = layout_view(db, L, conj_neg);
  tport_tensor *want, *got;
  to_options o = {
      .has_dtype = true, .dtype = dt, .has_format = true, .format = L->format, .copy = true};
  bool a;
  tport_err e1, e2;
  int r1 = tensor_to(hv, &o, &want, &a, &e1), r2 = tensor_to(dv, &o, &got, &a, &e2);
  char what[96];
  snprintf(what, sizeof what, "%s <- %s, %s%s", DT[dt], DT[hb->dtype], L->name,
           conj_neg ? ", conj+neg" : "");
  cr_assert_eq(r1, r2, "%s: cpu %s / cuda %s", what, r1 ? e1.msg : "ok", r2 ? e2.msg : "ok");
  int res = SAME;
  if (!r1) {
    res = compare(what, want, got, hv);
    tensor_release(got);
    tensor_release(want);
  }
  tensor_release(dv);
  tensor_release(hv);
  return res;
}

/* 64-bit indexing: views of a float32 storage of more than 4 GiB, written
 * (a kernel whose destination is wide) and read (source wide: the generic
 * kernel and the transpose), compared with the same values on the cpu. */
static void wide_views(int *results)
{
  enum { K = 5, M = 4099 };
  const int64_t S = ((int64_t)1 << 28) + 3, elems = (K - 1) * S + M; /* 4 GiB + 16 KiB */
  tport_tensor *big, *hs = host_bits(TPORT_FLOAT32, K * M, 99);
  tport_err e;
  cr_assert_eq(tensor_empty(G0, TPORT_FLOAT32, 1, &elems, TPORT_MF_CONTIGUOUS, 0, &big, &e), 0,
               "%s", e.msg);
  tport_tensor *wa = view(big, 2, (int64_t[]){K, M}, (int64_t[]){S, 1}, 0);
  tport_tensor *wb = view(big, 2, (int64_t[]){M, K}, (int64_t[]){1, S}, 0);
  tport_tensor *hsv = view(hs, 2, (int64_t[]){K, M}, (int64_t[]){M, 1}, 0);
  tport_tensor *hst = view(hs, 2, (int64_t[]){M, K}, (int64_t[]){1, M}, 0);
  cr_assert_eq(tensor_copy_(wa, hsv, false, &e), 0, "%s", e.msg);
  uint8_t *back = read_all(wa);
  int64_t k = first_diff(hs->storage->ptr, back, K * M, 4);
  if (k >= 0) {
    cr_log_error("a float32 view spanning 4 GiB: element %lld reads back %08x, written %08x",
                 (long long)k, ((uint32_t *)back)[k], ((uint32_t *)hs->storage->ptr)[k]);
    results[VALUES]++;
  } else {
    results[SAME]++;
  }
  free(back);
  const struct {
    tport_tensor *h, *d;
    tport_dtype dt;
    bool neg;
    const char *name;
  } cases[] = {{hsv, wa, TPORT_FLOAT64, false, "float64 <- float32, 4 GiB view, generic"},
               {hst, wb, TPORT_FLOAT64, false, "float64 <- float32, 4 GiB view, transpose"},
               {hsv, wa, TPORT_FLOAT16, true, "float16 <- float32, 4 GiB view, neg"}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    tport_tensor *h = cases[c].h, *d = cases[c].d, *hn = NULL, *dn = NULL;
    if (cases[c].neg) {
      cr_assert_eq(tensor_neg_view(h, &hn, NULL), 0);
      cr_assert_eq(tensor_neg_view(d, &dn, NULL), 0);
      h = hn;
      d = dn;
    }
    to_options o = {.has_dtype = true,
                    .dtype = cases[c].dt,
                    .has_format = true,
                    .format = TPORT_MF_CONTIGUOUS,
                    .copy = true};
    tport_tensor *want = to(h, o), *got = to(d, o);
    results[compare(cases[c].name, want, got, h)]++;
    tensor_release(got);
    tensor_release(want);
    tensor_release(hn);
    tensor_release(dn);
  }
  tensor_release(hst);
  tensor_release(hsv);
  tensor_release(wb);
  tensor_release(wa);
  tensor_release(big);
  tensor_release(hs);
}

/* Every dtype pair, each kernel, with and without conj+neg, over random bit
 * patterns and special values (NaN payloads included: the kernels promise
 * the host's bits), against the CPU kernels.  Differences are logged one
 * line per case and counted: a failure lists them all, those that differ
 * only in the bits of NaNs apart. */
Test(cuda, kernels_match_the_cpu_bit_for_bit, .timeout = 1200)
{
  need_gpu(1);
  int results[3] = {0};
  for (int st = 0; st < TPORT_NUM_DTYPES; st++) {
    tport_tensor *hb = host_bits((tport_dtype)st, KBUF, 0x5EED0000u + (uint64_t)st);
    tport_tensor *db =
        to(hb, (to_options){.has_device = true, .device = G0}); /* bits as they are */
    for (int dt = 0; dt < TPORT_NUM_DTYPES; dt++)
      for (int l = 0; l < NLAYOUTS; l++)
        for (int cn = 0; cn < 2; cn++) {
          if (cn && st == TPORT_BOOL)
            continue; /* bool has no negation */
          results[one_case(hb, db, (tport_dtype)dt, &LAYOUTS[l], cn)]++;
        }
    tensor_release(db);
    tensor_release(hb);
  }
  wide_views(results);
  cr_assert_eq(results[NAN_BITS] + results[VALUES], 0,
               "%d of %d cases differ from the CPU kernels (each logged above): %d in values, "
               "%d only in the bits of NaNs",
               results[NAN_BITS] + results[VALUES],
               results[SAME] + results[NAN_BITS] + results[VALUES], results[VALUES],
               results[NAN_BITS]);
}

/* A copy of nearly 2^32 elements whose byte offsets all fit 32 bits: only
 * the grid-stride loop's last step does not, which is where a narrow index
 * wrapped and threads started again at low indices. */
Test(cuda, grid_stride_loops_near_2_to_the_32_elements, .timeout = 900)
{
  need_gpu(1);
  enum { R = 65535, C = 65520, P = 65536 }; /* rows, columns, row pitch (bytes) */
  size_t freeb, total;
  tport_err e;
  cr_assert_eq(backend_cuda.mem_info(0, &freeb, &total, &e), 0);
  if (freeb < (size_t)R * P * 2 + ((size_t)1 << 30)) {
    if (required_gpus() > 0)
      cr_assert_fail("TPORT_REQUIRE_GPU: needs 9 GiB of free device memory, %zu bytes free", freeb);
    cr_skip_test("needs 9 GiB of free device memory, %zu bytes free", freeb);
  }
  tport_tensor *h = host_empty(TPORT_UINT8, 1, (int64_t[]){(int64_t)R * P});
  uint8_t *hp = h->storage->ptr;
  for (int64_t r = 0; r < R; r++)
    for (int64_t c = 0; c < P; c++)
      hp[r * P + c] = (uint8_t)(r * 131 + c * 7 + (r >> 7));
  tport_tensor *d = to(h, (to_options){.has_device = true, .device = G0});
  tensor_release(h);
  tport_tensor *dv = view(d, 2, (int64_t[]){R, C}, (int64_t[]){P, 1}, 0);
  tport_tensor *r8 = to(dv, (to_options){.has_dtype = true, .dtype = TPORT_INT8});
  tensor_release(dv);
  tensor_release(d);
  int8_t *v = (int8_t *)read_all(r8);
  for (int64_t r = 0; r < R; r++)
    for (int64_t c = 0; c < C; c++)
      if (v[r * C + c] != (int8_t)(uint8_t)(r * 131 + c * 7 + (r >> 7)))
        cr_assert_fail("element (%lld, %lld) of %d x %d: %d, want %d", (long long)r, (long long)c,
                       R, C, v[r * C + c], (int8_t)(uint8_t)(r * 131 + c * 7 + (r >> 7)));
  free(v);
  tensor_release(r8);
}

/* ---------------------------------------------------------------- the plans (no GPU) */

static void plan_of(plan *p, int n, const int64_t *sz, const int64_t *dst, size_t ds,
                    const int64_t *src, size_t ss)
{
  int64_t db[TPORT_MAX_DIMS], sb[TPORT_MAX_DIMS];
  for (int d = 0; d < n; d++) {
    db[d] = dst[d] * (int64_t)ds;
    sb[d] = src[d] * (int64_t)ss;
  }
  const int64_t *strides[2] = {db, sb};
  plan_build(p, n, sz, 2, strides);
}

static cuda_jit_launch launch_of(const plan *p, tport_dtype dt, tport_dtype st, int64_t src_off,
                                 const cuda_jit_limits *lim)
{
  cuda_jit_launch L;
  /* device memory is 256-byte aligned, as cudaMalloc gives it */
  const char *dst = (const char *)(uintptr_t)0x7f0000000000ull,
             *src = (const char *)(uintptr_t)0x7e0000000000ull +
                    src_off * (int64_t)tport_dtype_size(st);
  cr_assert_eq(cuda_jit_plan_launch(p, dt, dst, st, src, lim, &L), 0);
  return L;
}

/* The tests above are only as good as the kernels they reach: the launch
 * planner, with the limits of cuda:0 (an H100's where there is none), must
 * send each layout to its kernel and the big views to the 64-bit index. */
Test(cuda, the_layouts_reach_the_kernels_they_test)
{
  cuda_jit_limits lim = {{CUDA_JIT_MAX_BLOCKS, 65535, 65535}, 32};
  if (backend_cuda.device_count() > 0) {
    int x = 0, y = 0, z = 0;
    cr_assert_eq(cudaDeviceGetAttribute(&x, cudaDevAttrMaxGridDimX, 0), cudaSuccess);
    cr_assert_eq(cudaDeviceGetAttribute(&y, cudaDevAttrMaxGridDimY, 0), cudaSuccess);
    cr_assert_eq(cudaDeviceGetAttribute(&z, cudaDevAttrMaxGridDimZ, 0), cudaSuccess);
    lim.max_grid[0] = x < CUDA_JIT_MAX_BLOCKS ? (unsigned)x : CUDA_JIT_MAX_BLOCKS;
    lim.max_grid[1] = (unsigned)y;
    lim.max_grid[2] = (unsigned)z;
  }
  const int64_t contiguous[4] = {KCHW, KHW, KW, 1};
  const tport_dtype pairs[][2] = {{TPORT_FLOAT16, TPORT_FLOAT32},
                                  {TPORT_COMPLEX128, TPORT_UINT8},
                                  {TPORT_INT8, TPORT_BFLOAT16},
                                  {TPORT_BOOL, TPORT_COMPLEX128}};
  for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++)
    for (int l = 0; l < NLAYOUTS; l++) {
      const src_layout *L = &LAYOUTS[l];
      tport_dtype dt = pairs[k][0], st = pairs[k][1];
      plan p;
      plan_of(&p, 4, KSZ, L->format == TPORT_MF_CHANNELS_LAST ? KSL : contiguous,
              tport_dtype_size(dt), L->strides, tport_dtype_size(st));
      cuda_jit_launch la = launch_of(&p, dt, st, L->offset, &lim);
      cr_assert_eq(la.kernel, L->kernel, "%s <- %s, %s: kernel %d", DT[dt], DT[st], L->name,
                   (int)la.kernel);
      cr_assert_not(la.wide, "%s: the narrow index", L->name);
      if (l == 2)
        cr_assert_eq(p.ndim, 4, "strided: no dims coalesce");
    }
  /* wide_views: written, read by the generic kernel, read by the transpose */
  enum { K = 5, M = 4099 };
  const int64_t S = ((int64_t)1 << 28) + 3;
  plan p;
  plan_of(&p, 2, (int64_t[]){K, M}, (int64_t[]){S, 1}, 4, (int64_t[]){M, 1}, 4);
  cuda_jit_launch la = launch_of(&p, TPORT_FLOAT32, TPORT_FLOAT32, 0, &lim);
  cr_assert(la.kernel == CUDA_JIT_COPY && la.wide, "written: %d %d", (int)la.kernel, la.wide);
  plan_of(&p, 2, (int64_t[]){K, M}, (int64_t[]){M, 1}, 8, (int64_t[]){S, 1}, 4);
  la = launch_of(&p, TPORT_FLOAT64, TPORT_FLOAT32, 0, &lim);
  cr_assert(la.kernel == CUDA_JIT_COPY && la.wide, "generic: %d %d", (int)la.kernel, la.wide);
  plan_of(&p, 2, (int64_t[]){M, K}, (int64_t[]){K, 1}, 8, (int64_t[]){1, S}, 4);
  la = launch_of(&p, TPORT_FLOAT64, TPORT_FLOAT32, 0, &lim);
  cr_assert(la.kernel == CUDA_JIT_TRANSPOSE && la.wide, "transpose: %d %d", (int)la.kernel,
            la.wide);
  /* the 2^32 edge: every byte offset fits 32 bits, the loop's reach does not */
  enum { R = 65535, C = 65520, P = 65536 };
  cr_assert_lt((uint64_t)R * P - 1, 1ull << 32);
  plan_of(&p, 2, (int64_t[]){R, C}, (int64_t[]){C, 1}, 1, (int64_t[]){P, 1}, 1);
  la = launch_of(&p, TPORT_INT8, TPORT_UINT8, 0, &lim);
  cr_assert(la.kernel == CUDA_JIT_COPY && la.wide, "near 2^32: %d %d", (int)la.kernel, la.wide);
  cr_assert_gt((uint64_t)R * C - 1 + (uint64_t)la.grid[0] * la.block[0], 0xFFFFFFFFull,
               "a narrow loop index would wrap");
}
