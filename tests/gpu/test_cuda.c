/* test_cuda.c: the GPU suite (ctest -L gpu).  Every test skips, saying why,
 * where no CUDA device is present.  On a GPU: the backend contract, every
 * transfer path and the copy kernel through the engine, ordering with the
 * sim suite's fault knobs, managed moves, the kernel cache. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "conformance.h"
#include "cuda_jit.h"
#include "engine.h"

static const tport_device CPU = {TPORT_DEV_CPU, 0}, G0 = {TPORT_DEV_CUDA, 0};

static void need_gpu(int n)
{
  if (backend_cuda.device_count() < n)
    cr_skip_test("needs %d CUDA device%s: %s", n, n == 1 ? "" : "s",
                 backend_cuda.device_count() ? "fewer present" : backend_cuda.unavailable_reason());
}

static void teardown(void)
{
  engine_set_test_faults(0);
  engine_synchronize_all();
}

TestSuite(cuda, .fini = teardown);

Test(cuda, availability_is_explained)
{
  if (backend_cuda.device_count() == 0)
    cr_assert_gt(strlen(backend_cuda.unavailable_reason()), 0, "the runtime's message is kept");
  else
    cr_assert_eq(strlen(backend_cuda.unavailable_reason()), 0);
}

Test(cuda, conformance)
{
  need_gpu(1);
  conformance(&backend_cuda);
}

static tport_tensor *host_seq(int n)
{
  tport_tensor *t;
  cr_assert_eq(
      tensor_empty(CPU, TPORT_FLOAT32, 1, (int64_t[]){n}, TPORT_MF_CONTIGUOUS, 0, &t, NULL), 0);
  for (int i = 0; i < n; i++)
    ((float *)t->storage->ptr)[i] = (float)i;
  return t;
}

Test(cuda, transfers_and_kernels)
{
  need_gpu(1);
  tport_err e;
  enum { R = 300, C = 1000 };
  tport_tensor *h = host_seq(R * C), *hv, *d = NULL, *t = NULL, *back = NULL;
  cr_assert_eq(tensor_as_strided(h, 2, (int64_t[]){C, R}, (int64_t[]){1, C}, 0, &hv, &e), 0);
  for (int nb = 0; nb < 2; nb++) {
    bool a;
    /* a transposed host view -> cuda:0 as float16 channels... plain 2-D: the
     * copy runs through temporaries and the conversion kernel */
    to_options o = {.has_device = true,
                    .device = G0,
                    .has_dtype = true,
                    .dtype = TPORT_FLOAT16,
                    .non_blocking = nb};
    cr_assert_eq(tensor_to(hv, &o, &d, &a, &e), 0, "%s", e.msg);
    o = (to_options){.has_format = true,
                     .format = TPORT_MF_CONTIGUOUS,
                     .exact_format = true,
                     .has_dtype = true,
                     .dtype = TPORT_FLOAT64};
    cr_assert_eq(tensor_to(d, &o, &t, &a, &e), 0, "%s", e.msg);
    double *v = malloc(R * C * 8);
    cr_assert_eq(tensor_read(t, v, R * C * 8, &e), 0, "%s", e.msg);
    for (int i = 0; i < C; i++)
      for (int j = 0; j < R; j++) {
        float f = (float)(j * C + i);
        /* float16 holds integers up to 2048 exactly, then rounds */
        if (f <= 2048)
          cr_assert_eq(v[i * R + j], (double)f, "(%d,%d)", i, j);
      }
    free(v);
    tensor_release(t);
    tensor_release(d);
  }
  tensor_release(back);
  tensor_release(hv);
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
  for (int trial = 0; trial < 20; trial++) {
    tport_tensor *h = host_seq(4 << 20), *d, *r;
    bool a;
    to_options o = {.has_device = true, .device = G0, .non_blocking = true};
    cr_assert_eq(tensor_to(h, &o, &d, &a, NULL), 0);
    o.device = CPU;
    cr_assert_eq(tensor_to(d, &o, &r, &a, NULL), 0);
    cr_assert(r->storage->flags & STORAGE_PINNED);
    float *v = malloc(16 << 20);
    cr_assert_eq(tensor_read(r, v, 16 << 20, NULL), 0);
    for (int i = 0; i < 4 << 20; i += 4097)
      cr_assert_eq(v[i], (float)i);
    free(v);
    tensor_release(r);
    tensor_release(d);
    tensor_release(h);
  }
}

Test(cuda, managed_moves)
{
  need_gpu(1);
  tport_tensor *m;
  tport_err e;
  cr_assert_eq(tensor_empty(G0, TPORT_INT32, 1, (int64_t[]){1000}, TPORT_MF_CONTIGUOUS,
                            STORAGE_MANAGED, &m, &e),
               0, "%s", e.msg);
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

Test(cuda, kernel_cache)
{
  need_gpu(1);
  char dir[] = "/tmp/tport-kcache-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  cuda_jit_set_cache_dir(dir);
  cuda_jit_stats s0, s1;
  cuda_jit_get_stats(&s0);
  tport_tensor *h = host_seq(1000), *d, *r;
  bool a;
  to_options o = {.has_device = true, .device = G0};
  cr_assert_eq(tensor_to(h, &o, &d, &a, NULL), 0);
  o = (to_options){.has_dtype = true, .dtype = TPORT_BFLOAT16};
  cr_assert_eq(tensor_to(d, &o, &r, &a, NULL), 0);
  tensor_release(r);
  cr_assert_eq(tensor_to(d, &o, &r, &a, NULL), 0);
  cuda_jit_get_stats(&s1);
  cr_assert_eq(s1.misses - s0.misses, 1, "compiled once");
  cr_assert_geq(s1.hits - s0.hits, 1, "then served from memory");
  tensor_release(r);
  tensor_release(d);
  tensor_release(h);
  cuda_jit_set_cache_dir(NULL);
}

/* Every conversion kernel path (tiled transpose, strided copy) gives the
 * CPU kernels' bits: the same to() on cpu and on cuda:0, compared byte for
 * byte (both follow kernels/cpu/convert.c's rules).  NaN payloads are the one
 * thing a GPU may change (it canonicalizes NaN in float conversions), so the
 * inputs hold none. */
Test(cuda, kernels_match_the_cpu_bit_for_bit)
{
  need_gpu(1);
  const tport_dtype pairs[][2] = {
      {TPORT_FLOAT32, TPORT_FLOAT32},  {TPORT_FLOAT16, TPORT_FLOAT32},
      {TPORT_BFLOAT16, TPORT_FLOAT64}, {TPORT_UINT8, TPORT_FLOAT32},
      {TPORT_INT8, TPORT_FLOAT16},     {TPORT_COMPLEX64, TPORT_INT64},
      {TPORT_BOOL, TPORT_COMPLEX128},  {TPORT_FLOAT32, TPORT_UINT8},
      {TPORT_INT32, TPORT_FLOAT64},    {TPORT_COMPLEX128, TPORT_COMPLEX64}};
  int64_t sz[] = {3, 37, 19, 23};
  size_t n = 3 * 37 * 19 * 23;
  for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
    tport_dtype dt = pairs[k][0], st = pairs[k][1];
    /* random int16 values in the source dtype: out-of-range conversions
     * included, but no NaN (whose payload a GPU may canonicalize) */
    tport_tensor *h, *r16;
    cr_assert_eq(tensor_empty(CPU, st, 4, sz, TPORT_MF_CONTIGUOUS, 0, &h, NULL), 0);
    cr_assert_eq(tensor_empty(CPU, TPORT_INT16, 4, sz, TPORT_MF_CONTIGUOUS, 0, &r16, NULL), 0);
    unsigned seed = (unsigned)k;
    int16_t *rv = r16->storage->ptr;
    for (size_t i = 0; i < n; i++)
      rv[i] = (int16_t)rand_r(&seed);
    cr_assert_eq(tensor_copy_(h, r16, false, NULL), 0);
    tensor_release(r16);
    for (int fmt = 0; fmt < 2; fmt++) {
      to_options o = {.has_dtype = true,
                      .dtype = dt,
                      .has_format = true,
                      .format = fmt ? TPORT_MF_CHANNELS_LAST : TPORT_MF_CONTIGUOUS};
      tport_tensor *want, *d, *got;
      bool a;
      cr_assert_eq(tensor_to(h, &o, &want, &a, NULL), 0);
      to_options up = {.has_device = true, .device = G0};
      cr_assert_eq(tensor_to(h, &up, &d, &a, NULL), 0);
      cr_assert_eq(tensor_to(d, &o, &got, &a, NULL), 0);
      size_t nb = tensor_nbytes(want);
      uint8_t *w = malloc(nb), *g = malloc(nb);
      cr_assert_eq(tensor_read(want, w, nb, NULL), 0);
      cr_assert_eq(tensor_read(got, g, nb, NULL), 0);
      cr_assert(memcmp(w, g, nb) == 0, "%d <- %d, %s", dt, st,
                fmt ? "channels_last" : "contiguous");
      free(w);
      free(g);
      tensor_release(got);
      tensor_release(d);
      tensor_release(want);
    }
    tensor_release(h);
  }
}
