/* test_rpcs.c: every RPC through libtport, against a server in this process
 * (inproc) and tportd in another (tcp and ipc). */
#include <complex.h>
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "service_util.h"
#include "readback.h"
#include "staging.h"

typedef enum { INPROC, TCP, IPC } transport;

static server *srv;
static pid_t child;
static char url[256];

static void start(transport t)
{
  if (t == INPROC) {
    srv = svc_start_inproc(url, sizeof url, NULL);
  } else {
    child = -1;
    for (int tries = 0; tries < 5 && child < 0; tries++) {
      if (t == TCP)
        svc_tcp_url(url, sizeof url);
      else
        svc_ipc_url(url, sizeof url);
      child = svc_spawn(url, NULL);
    }
    cr_assert_gt(child, 0, "tportd did not start");
  }
}

static void stop(void)
{
  if (srv)
    server_stop(srv, 1000);
  if (child > 0)
    cr_assert_eq(svc_terminate(child), 0, "tportd exits 0 on SIGTERM");
  srv = NULL;
  child = 0;
}

static void every_rpc(void)
{
  tport_client *c = svc_connect(url, NULL);
  tport_err err;
  /* devices */
  tport_device_info *devs;
  size_t ndev;
  char why[256];
  cr_assert_eq(tport_devices(c, &devs, &ndev, why, sizeof why, &err), 0, "%s", err.msg);
  cr_assert_eq(ndev, 3, "cpu, sim:0, sim:1");
  cr_assert_str_eq(devs[0].device, "cpu");
  cr_assert_str_eq(devs[1].device, "sim:0");
  cr_assert_eq(devs[1].npeers, 1);
  cr_assert(strlen(why) > 0, "the reason cuda is off is given");
  free(devs);

  /* put a 3x1000 float32 tensor (many 64 KiB chunks) onto sim:0, get it back */
  enum { R = 30, C = 1000 };
  float *v = malloc(R * C * 4), *back = malloc(R * C * 4);
  for (int i = 0; i < R * C; i++)
    v[i] = (float)i * 0.5f;
  tport_put_options po;
  tport_put_options_init(&po);
  po.device = "sim:0";
  tport_tensor_info a;
  cr_assert_eq(tport_put(c, TPORT_FLOAT32, 2, (int64_t[]){R, C}, NULL, v, R * C * 4, &po, &a, &err),
               0, "%s", err.msg);
  cr_assert_str_eq(a.device, "sim:0");
  cr_assert(a.is_contiguous && a.nbytes == R * C * 4);
  cr_assert_eq(tport_get(c, &a.ref, back, R * C * 4, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert(memcmp(v, back, R * C * 4) == 0);

  /* info */
  tport_tensor_info i;
  cr_assert_eq(tport_info(c, &a.ref, &i, &err), 0);
  cr_assert(i.ndim == 2 && i.sizes[0] == R && i.strides[0] == C && i.dtype == TPORT_FLOAT32);

  /* view: the transpose; its actual format is none */
  tport_tensor_info t;
  cr_assert_eq(tport_view(c, &a.ref, 2, (int64_t[]){C, R}, (int64_t[]){1, C}, 0, NULL, &t, &err), 0,
               "%s", err.msg);
  cr_assert_eq(t.actual_format, TPORT_MF_NONE);
  cr_assert_not(t.is_contiguous);

  /* to: issue #62027 aliasing, and the exact mode */
  bool alias;
  tport_tensor_info r;
  tport_to_options to = {.has_memory_format = true, .memory_format = TPORT_MF_CONTIGUOUS};
  cr_assert_eq(tport_to(c, &t.ref, &to, &r, &alias, &err), 0, "%s", err.msg);
  cr_assert(alias);
  to.exact_format = true;
  cr_assert_eq(tport_to(c, &t.ref, &to, &r, &alias, &err), 0, "%s", err.msg);
  cr_assert_not(alias);
  cr_assert(r.is_contiguous);
  /* to float64 on sim:1 (device to device with a conversion), then get */
  tport_to_options to2 = {
      .device = "sim:1", .has_dtype = true, .dtype = TPORT_FLOAT64, .name = "t64"};
  tport_tensor_info r64;
  cr_assert_eq(tport_to(c, &t.ref, &to2, &r64, &alias, &err), 0, "%s", err.msg);
  cr_assert_str_eq(r64.device, "sim:1");
  cr_assert_str_eq(r64.ref.name, "t64");
  cr_assert(r64.strides[0] == 1 && r64.strides[1] == C, "preserve keeps the transposed layout");
  double *d = malloc(R * C * 8);
  tport_ref byname;
  tport_ref_name(&byname, "t64");
  cr_assert_eq(tport_get(c, &byname, d, R * C * 8, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  for (int x = 0; x < C; x++)
    for (int y = 0; y < R; y++)
      cr_assert_eq(d[x * R + y], (double)v[y * C + x]);

  /* contiguous(channels_last) of a 2-D tensor: PyTorch's error */
  cr_assert_eq(tport_contiguous(c, &a.ref, TPORT_MF_CHANNELS_LAST, NULL, &r, &alias, &err),
               TPORT_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "required rank 4 tensor to use channels_last format");
  cr_assert_eq(tport_contiguous(c, &a.ref, TPORT_MF_CONTIGUOUS, NULL, &r, &alias, &err), 0);
  cr_assert(alias);

  /* copy: the transpose's values into a fresh contiguous float64 tensor */
  double *zeros = calloc(R * C, 8);
  tport_tensor_info z;
  cr_assert_eq(
      tport_put(c, TPORT_FLOAT64, 2, (int64_t[]){C, R}, NULL, zeros, R * C * 8, NULL, &z, &err), 0);
  cr_assert_eq(tport_copy(c, &z.ref, &t.ref, false, &err), 0, "%s", err.msg);
  cr_assert_eq(tport_get(c, &z.ref, d, R * C * 8, NULL, NULL, NULL, &err), 0);
  cr_assert_eq(d[1], (double)v[C]);

  /* list, sync, stats, free */
  tport_tensor_info *all;
  size_t n;
  cr_assert_eq(tport_list(c, &all, &n, &err), 0);
  cr_assert_geq(n, 4);
  free(all);
  cr_assert_eq(tport_sync(c, &a.ref, &err), 0);
  cr_assert_eq(tport_sync(c, NULL, &err), 0);
  /* a tenant sees its own counters; the operator sees the server's */
  cr_assert_geq(svc_counter(c, "tensors"), 4);
  cr_assert_eq(svc_counter(c, "requests_PutChunk"), -1, "server-wide counters are the operator's");
  tport_client *op = svc_connect(url, SVC_OPERATOR);
  cr_assert_geq(svc_counter(op, "requests_PutChunk"), 1);
  cr_assert_geq(svc_counter(op, "sessions"), 2);
  tport_close(op);
  cr_assert_eq(tport_free(c, &byname, &err), 0);
  cr_assert_eq(tport_info(c, &byname, &i, &err), TPORT_NOT_FOUND);
  cr_assert_eq(tport_free(c, &a.ref, &err), 0);
  cr_assert_eq(tport_get(c, &a.ref, back, R * C * 4, NULL, NULL, NULL, &err), TPORT_NOT_FOUND);
  free(v);
  free(back);
  free(d);
  free(zeros);
  tport_close(c);
}

Test(rpcs, inproc)
{
  start(INPROC);
  every_rpc();
  stop();
}
Test(rpcs, tcp)
{
  start(TCP);
  every_rpc();
  stop();
}
Test(rpcs, ipc)
{
  start(IPC);
  every_rpc();
  stop();
}

static void progress_cb(void *arg, uint64_t done, uint64_t total)
{
  uint64_t *last = arg;
  cr_assert_geq(done, *last);
  cr_assert_leq(done, total);
  *last = done;
}

Test(rpcs, conversions_on_put_dlpack_and_names)
{
  start(INPROC);
  tport_client *c = svc_connect(url, "alice");
  tport_err err;
  /* uint8 NHWC from a loader -> float16 channels_last on sim:1, with progress */
  enum { N = 2, H = 8, W = 9, CH = 3 };
  uint8_t img[N * H * W * CH];
  for (int i = 0; i < (int)sizeof img; i++)
    img[i] = (uint8_t)(i * 7);
  tport_put_options po;
  tport_put_options_init(&po);
  po.device = "sim:1";
  po.has_dtype = true;
  po.dtype = TPORT_FLOAT16;
  po.memory_format = TPORT_MF_CHANNELS_LAST;
  po.name = "batch";
  uint64_t last = 0;
  po.progress = progress_cb;
  po.progress_arg = &last;
  /* NCHW sizes with NHWC strides: the bytes are in NHWC order */
  int64_t sizes[] = {N, CH, H, W}, strides[] = {H * W * CH, 1, W * CH, CH};
  tport_tensor_info b;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 4, sizes, strides, img, sizeof img, &po, &b, &err), 0,
               "%s", err.msg);
  cr_assert_eq(last, sizeof img);
  cr_assert_eq(b.dtype, TPORT_FLOAT16);
  cr_assert_eq(b.actual_format, TPORT_MF_CHANNELS_LAST);
  cr_assert_gt(b.expires_unix_ms, 0, "named: kept with a time to live");
  /* a second put under the same name: ALREADY_EXISTS */
  cr_assert_eq(tport_put(c, TPORT_UINT8, 4, sizes, strides, img, sizeof img, &po, NULL, &err),
               TPORT_ALREADY_EXISTS);
  /* get through DLPack: values in logical (NCHW) order as float16 */
  DLManagedTensor *m;
  cr_assert_eq(tport_get_dlpack(c, &b.ref, &m, &err), 0, "%s", err.msg);
  cr_assert_eq(m->dl_tensor.ndim, 4);
  cr_assert(m->dl_tensor.dtype.code == kDLFloat && m->dl_tensor.dtype.bits == 16);
  const uint16_t *h = m->dl_tensor.data;
  /* element (n=1, c=2, h=3, w=4) */
  int li = ((1 * CH + 2) * H + 3) * W + 4, pi = ((1 * H + 3) * W + 4) * CH + 2;
  uint16_t want;
  {
    /* float16 of an integer < 2048 is exact: build it from the float */
    float f = (float)img[pi];
    uint32_t u;
    memcpy(&u, &f, 4);
    int e = (int)((u >> 23) & 0xff) - 127;
    want = f == 0 ? 0 : (uint16_t)(((e + 15) << 10) | ((u >> 13) & 0x3ff));
  }
  cr_assert_eq(h[li], want);
  m->deleter(m);
  /* put from a DLTensor with gaps (every other column) */
  float src[4][6];
  for (int i = 0; i < 24; i++)
    ((float *)src)[i] = (float)i;
  int64_t shape[] = {4, 3}, dstr[] = {6, 2};
  DLTensor dl = {.data = src,
                 .device = {kDLCPU, 0},
                 .ndim = 2,
                 .dtype = {kDLFloat, 32, 1},
                 .shape = shape,
                 .strides = dstr};
  tport_tensor_info g;
  cr_assert_eq(tport_put_dlpack(c, &dl, NULL, &g, &err), 0, "%s", err.msg);
  float got[12];
  cr_assert_eq(tport_get(c, &g.ref, got, sizeof got, NULL, NULL, NULL, &err), 0);
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 3; j++)
      cr_assert_eq(got[i * 3 + j], src[i][2 * j]);
  tport_close(c);
  /* the named tensor outlives its connection; another tenant cannot see it */
  tport_client *c2 = svc_connect(url, "alice");
  tport_ref byname;
  tport_ref_name(&byname, "batch");
  tport_tensor_info i;
  cr_assert_eq(tport_info(c2, &byname, &i, &err), 0, "%s", err.msg);
  cr_assert_eq(tport_info(c2, &g.ref, &i, &err), TPORT_NOT_FOUND, "unnamed: went with c");
  tport_client *bob = svc_connect(url, "bob");
  cr_assert_eq(tport_info(bob, &byname, &i, &err), TPORT_NOT_FOUND);
  cr_assert_eq(tport_info(bob, &b.ref, &i, &err), TPORT_NOT_FOUND, "another tenant's handle");
  tport_close(bob);
  tport_close(c2);
  stop();
}

/* A get reads a tensor; it never moves it.  A managed tensor on a device
 * that fits in one chunk used to come back from the get on the cpu. */
Test(rpcs, a_get_leaves_a_managed_tensor_where_it_is)
{
  start(INPROC);
  tport_client *c = svc_connect(url, NULL);
  tport_put_options po;
  tport_put_options_init(&po);
  po.device = "sim:0";
  po.managed = true;
  int32_t v[64], back[64];
  for (int i = 0; i < 64; i++)
    v[i] = i * 3;
  tport_tensor_info t, i;
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_INT32, 1, (int64_t[]){64}, NULL, v, sizeof v, &po, &t, &err), 0,
               "%s", err.msg);
  cr_assert_eq(tport_get(c, &t.ref, back, sizeof back, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(memcmp(v, back, sizeof v), 0);
  cr_assert_eq(tport_info(c, &t.ref, &i, &err), 0, "%s", err.msg);
  cr_assert_str_eq(i.device, "sim:0", "the get moved the tensor to %s", i.device);
  cr_assert(i.managed);
  tport_close(c);
  stop();
}

/* A put that changes only the dtype converts each chunk as it lands
 * (handlers_transfer.c); the result must be bit for bit what converting
 * after the whole upload gives (a plain put, then To).  Every dtype pair,
 * random bits (NaN payloads, infinities, subnormals, out-of-range values),
 * several chunks with a short last one, on the cpu and on sim:1, contiguous
 * and channels_last (NHWC bytes stored as channels_last). */
Test(rpcs, convert_on_arrival_is_bit_identical_to_convert_after)
{
  start(INPROC); /* 64 KiB chunks */
  tport_client *c = svc_connect(url, "alice");
  tport_err err;
  enum { N = 3, CH = 7, H = 37, W = 23 }; /* 17871 elements: 2 to 5 chunks but for 1-byte */
  const int64_t numel = N * CH * H * W;
  int64_t sizes4[] = {N, CH, H, W}, nhwc[] = {H * W * CH, 1, W * CH, CH}, sizes1[] = {numel};
  uint8_t *src = malloc((size_t)numel * 16), *a = malloc((size_t)numel * 16),
          *b = malloc((size_t)numel * 16);
  uint64_t x = 88172645463325252ull;
  for (int64_t i = 0; i < numel * 16; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    src[i] = (uint8_t)x;
  }
  for (int k = 0; k < 12 * 12; k++) {
    tport_dtype from = (tport_dtype)(k / 12), to = (tport_dtype)(k % 12);
    if (from == to)
      continue;
    if (from == TPORT_BOOL)
      for (int64_t i = 0; i < numel; i++)
        src[i] &= 1; /* a bool's bytes are 0 or 1 */
    bool four_d = k % 2;
    size_t nbytes = (size_t)numel * tport_dtype_size(from), nout = (size_t)numel * tport_dtype_size(to);
    tport_put_options po;
    tport_put_options_init(&po);
    po.device = k % 3 ? "sim:1" : "cpu";
    tport_tensor_info plain, conv, after;
    int nd = four_d ? 4 : 1;
    const int64_t *sz = four_d ? sizes4 : sizes1, *st = four_d ? nhwc : NULL;
    cr_assert_eq(tport_put(c, from, nd, sz, st, src, nbytes, &po, &plain, &err), 0, "%s", err.msg);
    po.has_dtype = true;
    po.dtype = to;
    if (four_d)
      po.memory_format = TPORT_MF_CHANNELS_LAST;
    cr_assert_eq(tport_put(c, from, nd, sz, st, src, nbytes, &po, &conv, &err), 0, "%d -> %d: %s",
                 from, to, err.msg);
    tport_to_options to_o = {.has_dtype = true,
                             .dtype = to,
                             .has_memory_format = four_d,
                             .memory_format = TPORT_MF_CHANNELS_LAST};
    bool alias;
    cr_assert_eq(tport_to(c, &plain.ref, &to_o, &after, &alias, &err), 0, "%s", err.msg);
    cr_assert_eq(conv.dtype, after.dtype);
    cr_assert_eq(memcmp(conv.strides, after.strides, sizeof conv.strides), 0,
                 "%d -> %d: the same layout", from, to);
    cr_assert_eq(tport_get(c, &conv.ref, a, nout, NULL, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(tport_get(c, &after.ref, b, nout, NULL, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(memcmp(a, b, nout), 0, "%d -> %d (%s, %s): converted on arrival differs", from,
                 to, po.device, four_d ? "channels_last" : "1-D");
    tport_free(c, &plain.ref, NULL);
    tport_free(c, &conv.ref, NULL);
    tport_free(c, &after.ref, NULL);
  }
  free(src);
  free(a);
  free(b);
  tport_close(c);
  stop();
}

static int64_t sim_host_allocs(void)
{
  int64_t v = backend_stat(&backend_sim, "sim_host_allocs");
  cr_assert_geq(v, 0, "the sim reports no sim_host_allocs");
  return v;
}

/* Waits (up to 10 s) until every read-back block is back in the pool.  The
 * last reply of a get can reach the client before the server's worker has
 * closed the get's reader (its read-ahead blocks go back then): a get begun
 * in that gap finds fewer cached blocks and grows the pool, which is what
 * a cache should do under overlap, but not what this test measures. */
static void readback_pool_idle(void)
{
  staging_stats st;
  for (int i = 0; i < 1000; i++) {
    staging_get_stats(staging_readback(), &st);
    if (st.bytes_in_use == 0)
      return;
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  cr_assert_fail("%llu read-back bytes still out 10 s after a get",
                 (unsigned long long)st.bytes_in_use);
}

/* A get from a device reads back through recycled pinned blocks: the pool
 * grows only to what one get holds at once, however many gets follow
 * (cudaHostAlloc of the whole tensor per get held gets from a GPU at a third
 * of the speed of gets from the cpu).  Chunked (3 MiB in the tests' 64 KiB
 * chunks), inline (small), and a transposed view made contiguous first.
 * How many blocks a get holds at its peak depends on how fast the client
 * frees the replies, so the test bounds the growth by the reader's limit
 * (window + 2 lent, + READER_AHEAD read ahead) rather than expect none: 60
 * gets allocate at most that many blocks, where a copy per get makes 60. */
Test(rpcs, gets_from_a_device_allocate_no_pinned_memory_per_request)
{
  server_config cfg;
  svc_config(&cfg);
  int window = cfg.window;
  srv = svc_start_with(&cfg, url, sizeof url);
  tport_client *c = svc_connect(url, NULL);
  tport_put_options po;
  tport_put_options_init(&po);
  po.device = "sim:1";
  size_t n = (size_t)3 << 20;
  uint8_t *v = malloc(n), *back = malloc(n);
  for (size_t i = 0; i < n; i++)
    v[i] = (uint8_t)(i * 7 + (i >> 11));
  tport_tensor_info big, small, tr;
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 2, (int64_t[]){1536, 2048}, NULL, v, n, &po, &big, &err),
               0, "%s", err.msg);
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, (int64_t[]){100}, NULL, v, 100, &po, &small, &err), 0,
               "%s", err.msg);
  /* [2048, 1536] with strides (1, 2048): made contiguous on the device */
  cr_assert_eq(tport_view(c, &big.ref, 2, (int64_t[]){2048, 1536}, (int64_t[]){1, 2048}, 0, NULL,
                          &tr, &err),
               0, "%s", err.msg);
  int64_t before = sim_host_allocs();
  int rounds = 20;
  for (int round = 0; round < rounds; round++) {
    memset(back, 0, n);
    cr_assert_eq(tport_get(c, &big.ref, back, n, NULL, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(memcmp(back, v, n), 0);
    readback_pool_idle();
    cr_assert_eq(tport_get(c, &small.ref, back, 100, NULL, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(memcmp(back, v, 100), 0);
    readback_pool_idle();
    cr_assert_eq(tport_get(c, &tr.ref, back, n, NULL, NULL, NULL, &err), 0, "%s", err.msg);
    for (size_t i = 0; i < 2048; i += 97)
      for (size_t j = 0; j < 1536; j += 89)
        cr_assert_eq(back[i * 1536 + j], v[j * 2048 + i], "[%zu][%zu]", i, j);
    readback_pool_idle();
  }
  int64_t allocs = sim_host_allocs() - before;
  int64_t bound = window + 2 + READER_AHEAD;
  cr_assert_leq(allocs, bound, "%lld pinned allocations in %d gets (one get holds at most %lld)",
                (long long)allocs, 3 * rounds, (long long)bound);
  staging_stats st;
  staging_get_stats(staging_readback(), &st);
  cr_assert_leq(st.bytes_allocated, (uint64_t)bound * STAGING_MIN_BLOCK,
                "the read-back pool holds %llu bytes", (unsigned long long)st.bytes_allocated);
  free(v);
  free(back);
  tport_close(c);
  stop();
}

/* A get from a device reads back into pinned pool blocks of at most
 * STAGING_MAX_BLOCK (64 MiB): with a larger --chunk, GetBegin tells the
 * client to ask for 64 MiB at a time, and a full window of such chunks
 * stays within what one get may have out. */
Test(rpcs, a_get_from_a_device_with_chunks_over_64_MiB)
{
  server_config cfg;
  svc_config(&cfg);
  cfg.chunk_bytes = (size_t)72 << 20;
  cfg.max_message_bytes = (size_t)80 << 20;
  cfg.window = 8;
  srv = svc_start_with(&cfg, url, sizeof url);
  tport_client *c = svc_connect(url, NULL);
  size_t n = ((size_t)200 << 20) + 12345;
  uint8_t *v = calloc(n, 1), *back = malloc(n);
  for (size_t i = 0; i < n; i += 4096)
    v[i] = (uint8_t)(i >> 12);
  v[n - 1] = 0x5a;
  tport_put_options po;
  tport_put_options_init(&po);
  po.device = "sim:0";
  tport_tensor_info t;
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, (int64_t[]){(int64_t)n}, NULL, v, n, &po, &t, &err),
               0, "%s", err.msg);
  memset(back, 0, n);
  cr_assert_eq(tport_get(c, &t.ref, back, n, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  for (size_t i = 0; i < n; i += 4096)
    cr_assert_eq(back[i], v[i], "byte %zu", i);
  cr_assert_eq(back[n - 1], 0x5a);
  free(v);
  free(back);
  tport_close(c);
  stop();
}
