/* test_engine.c: to / copy_ / contiguous / views on the cpu device, with the
 * examples of SEMANTICS.md (verified on PyTorch 1.13) and PyTorch's errors. */
#include <complex.h>
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "storage.h"

static const tport_device CPU = {TPORT_DEV_CPU, 0};

static tport_tensor *strided(tport_dtype dt, int n, const int64_t *sz, const int64_t *st)
{
  tport_tensor *t;
  tport_err e;
  cr_assert_eq(tensor_empty_strided(CPU, dt, n, sz, st, 0, &t, &e), 0, "%s", e.msg);
  return t;
}

static tport_tensor *arange_f32(int n, const int64_t *sz)
{
  tport_tensor *t;
  cr_assert_eq(tensor_empty(CPU, TPORT_FLOAT32, n, sz, TPORT_MF_CONTIGUOUS, 0, &t, NULL), 0);
  float *p = t->storage->ptr;
  for (int64_t i = 0; i < tensor_numel(t); i++)
    p[i] = (float)i;
  return t;
}

static void assert_strides(const tport_tensor *t, int n, const int64_t *want)
{
  cr_assert_eq(t->layout.ndim, n);
  for (int d = 0; d < n; d++)
    cr_assert_eq(t->layout.strides[d], want[d], "stride %d: %lld vs %lld", d,
                 (long long)t->layout.strides[d], (long long)want[d]);
}

static tport_tensor *to(tport_tensor *t, to_options o, bool *aliased)
{
  tport_tensor *r;
  tport_err e;
  cr_assert_eq(tensor_to(t, &o, &r, aliased, &e), 0, "%s", e.msg);
  return r;
}

Test(engine, semantics_table_row1_size_one_channel)
{
  /* empty(2,1,4,4) strides (16,16,4,1) | to(channels_last) -> C(16,1,4,1) */
  tport_tensor *t = strided(TPORT_FLOAT32, 4, (int64_t[]){2, 1, 4, 4}, (int64_t[]){16, 16, 4, 1});
  bool a;
  tport_tensor *r = to(t, (to_options){.has_format = true, .format = TPORT_MF_CHANNELS_LAST}, &a);
  cr_assert_not(a);
  assert_strides(r, 4, (int64_t[]){16, 1, 4, 1});
  tensor_release(r);
  tensor_release(t);
}

Test(engine, semantics_table_row2_n111_copies_every_time)
{
  tport_tensor *t = strided(TPORT_FLOAT32, 4, (int64_t[]){4, 1, 1, 1}, (int64_t[]){1, 1, 1, 1});
  to_options o = {.has_format = true, .format = TPORT_MF_CHANNELS_LAST};
  bool a;
  tport_tensor *r1 = to(t, o, &a);
  cr_assert_not(a);
  assert_strides(r1, 4, (int64_t[]){1, 1, 1, 1});
  tport_tensor *r2 = to(r1, o, &a);
  cr_assert_not(a, "N111 suggests contiguous: to(channels_last) copies again");
  /* exact format mode: it is channels_last contiguous, so it aliases */
  o.exact_format = true;
  tport_tensor *r3 = to(r1, o, &a);
  cr_assert(a);
  cr_assert_eq(r3, r1);
  tensor_release(r3);
  tensor_release(r2);
  tensor_release(r1);
  tensor_release(t);
}

Test(engine, semantics_table_row3_transposed)
{
  tport_tensor *base = arange_f32(2, (int64_t[]){4, 3});
  tport_tensor *t;
  cr_assert_eq(tensor_as_strided(base, 2, (int64_t[]){3, 4}, (int64_t[]){1, 3}, 0, &t, NULL), 0);
  bool a;
  tport_tensor *r = to(t, (to_options){.has_format = true, .format = TPORT_MF_CONTIGUOUS}, &a);
  cr_assert(a, "issue #62027: to(contiguous) of a transpose returns it unchanged");
  cr_assert_eq(r, t);
  tensor_release(r);
  r = to(t, (to_options){.has_dtype = true, .dtype = TPORT_FLOAT64}, &a);
  cr_assert_not(a);
  assert_strides(r, 2, (int64_t[]){1, 3});
  double v[12];
  cr_assert_eq(tensor_read(r, v, sizeof v, NULL), 0);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 4; j++)
      cr_assert_eq(v[i * 4 + j], (double)(j * 3 + i));
  tensor_release(r);
  r = to(t, (to_options){.copy = true}, &a);
  cr_assert_not(a);
  assert_strides(r, 2, (int64_t[]){1, 3});
  tensor_release(r);
  /* exact mode: the transpose is contiguous in no format, so it copies */
  cr_assert_eq(tensor_actual_format(t), TPORT_MF_NONE);
  r = to(t, (to_options){.has_format = true, .format = TPORT_MF_CONTIGUOUS, .exact_format = true},
         &a);
  cr_assert_not(a);
  assert_strides(r, 2, (int64_t[]){4, 1});
  tensor_release(r);
  tensor_release(t);
  tensor_release(base);
}

Test(engine, semantics_table_row4_expanded)
{
  tport_tensor *ones = arange_f32(2, (int64_t[]){3, 1});
  tport_tensor *e;
  cr_assert_eq(tensor_expand(ones, 2, (int64_t[]){3, 4}, &e, NULL), 0);
  assert_strides(e, 2, (int64_t[]){1, 0});
  bool a;
  tport_tensor *r = to(e, (to_options){.has_dtype = true, .dtype = TPORT_FLOAT64}, &a);
  assert_strides(r, 2, (int64_t[]){4, 1});
  double v[12];
  tensor_read(r, v, sizeof v, NULL);
  for (int i = 0; i < 12; i++)
    cr_assert_eq(v[i], (double)(i / 4));
  tensor_release(r);
  tensor_release(e);
  tensor_release(ones);
}

Test(engine, semantics_table_row5_channels_last)
{
  tport_tensor *t = strided(TPORT_FLOAT32, 4, (int64_t[]){2, 3, 4, 5}, (int64_t[]){60, 1, 15, 3});
  bool a;
  tport_tensor *r = to(t, (to_options){.has_dtype = true, .dtype = TPORT_FLOAT64}, &a);
  assert_strides(r, 4, (int64_t[]){60, 1, 15, 3});
  tensor_release(r);
  r = to(t, (to_options){.has_format = true, .format = TPORT_MF_CHANNELS_LAST}, &a);
  cr_assert(a);
  tensor_release(r);
  r = to(t, (to_options){.has_format = true, .format = TPORT_MF_CONTIGUOUS}, &a);
  cr_assert_not(a);
  assert_strides(r, 4, (int64_t[]){60, 20, 5, 1});
  tensor_release(r);
  tensor_release(t);
}

Test(engine, semantics_table_row6_internal_overlap)
{
  tport_tensor *z = arange_f32(1, (int64_t[]){1}), *e, *src = arange_f32(1, (int64_t[]){3});
  cr_assert_eq(tensor_expand(z, 1, (int64_t[]){3}, &e, NULL), 0);
  tport_err err;
  cr_assert_eq(tensor_copy_(e, src, false, &err), TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "more than one element of the written-to tensor"), "%s", err.msg);
  tensor_release(e);
  tensor_release(z);
  tensor_release(src);
}

Test(engine, copy_errors)
{
  tport_tensor *a = arange_f32(2, (int64_t[]){3, 4}), *b = arange_f32(2, (int64_t[]){2, 4});
  tport_err err;
  cr_assert_eq(tensor_copy_(a, b, false, &err), TPORT_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "The size of tensor a (3) must match the size of tensor b (2) at "
                            "non-singleton dimension 0");
  tport_tensor *c = arange_f32(3, (int64_t[]){2, 3, 4});
  cr_assert_eq(tensor_copy_(a, c, false, &err), TPORT_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "output with shape [3, 4] doesn't match the broadcast shape [2, 3, 4]");
  /* partial overlap: two views of one storage shifted by one element */
  tport_tensor *v1, *v2;
  tensor_as_strided(a, 1, (int64_t[]){6}, (int64_t[]){1}, 0, &v1, NULL);
  tensor_as_strided(a, 1, (int64_t[]){6}, (int64_t[]){1}, 1, &v2, NULL);
  cr_assert_eq(tensor_copy_(v1, v2, false, &err), TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "some elements of the input tensor"), "%s", err.msg);
  /* full overlap with the same strides: allowed, nothing to do */
  tport_tensor *v3;
  tensor_as_strided(a, 1, (int64_t[]){6}, (int64_t[]){1}, 0, &v3, NULL);
  cr_assert_eq(tensor_copy_(v1, v3, false, &err), 0);
  /* views out of the storage are refused */
  tport_tensor *bad;
  cr_assert_eq(tensor_as_strided(a, 1, (int64_t[]){13}, (int64_t[]){1}, 0, &bad, &err),
               TPORT_OUT_OF_RANGE);
  tensor_release(v1);
  tensor_release(v2);
  tensor_release(v3);
  tensor_release(a);
  tensor_release(b);
  tensor_release(c);
}

Test(engine, copy_broadcasts_and_converts)
{
  tport_tensor *row = arange_f32(1, (int64_t[]){4}), *dst;
  cr_assert_eq(
      tensor_empty(CPU, TPORT_INT16, 2, (int64_t[]){3, 4}, TPORT_MF_CONTIGUOUS, 0, &dst, NULL), 0);
  cr_assert_eq(tensor_copy_(dst, row, false, NULL), 0);
  int16_t v[12];
  tensor_read(dst, v, sizeof v, NULL);
  for (int i = 0; i < 12; i++)
    cr_assert_eq(v[i], i % 4);
  tensor_release(dst);
  tensor_release(row);
}

Test(engine, contiguous_rules)
{
  tport_tensor *t = strided(TPORT_FLOAT32, 4, (int64_t[]){2, 3, 4, 5}, (int64_t[]){60, 1, 15, 3});
  tport_tensor *r;
  bool a;
  tport_err err;
  cr_assert_eq(tensor_contiguous(t, TPORT_MF_CHANNELS_LAST, &r, &a, NULL), 0);
  cr_assert(a);
  tensor_release(r);
  cr_assert_eq(tensor_contiguous(t, TPORT_MF_CONTIGUOUS, &r, &a, NULL), 0);
  cr_assert_not(a);
  assert_strides(r, 4, (int64_t[]){60, 20, 5, 1});
  tensor_release(r);
  cr_assert_eq(tensor_contiguous(t, TPORT_MF_PRESERVE, &r, &a, &err), TPORT_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "preserve memory format is unsupported by the contiguous operator");
  cr_assert_eq(tensor_contiguous(t, TPORT_MF_CHANNELS_LAST_3D, &r, &a, &err),
               TPORT_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "required rank 5 tensor to use channels_last_3d format");
  /* preserve (SEMANTICS.md 2): a contiguous input is returned itself */
  tport_tensor *c = NULL;
  cr_assert_eq(tensor_contiguous(t, TPORT_MF_CONTIGUOUS, &c, &a, NULL), 0);
  cr_assert_eq(tensor_contiguous(c, TPORT_MF_PRESERVE, &r, &a, &err), 0, "%s", err.msg);
  cr_assert(a, "contiguous(preserve) of a contiguous tensor aliases it");
  cr_assert_eq(r, c);
  tensor_release(r);
  tensor_release(c);
  tensor_release(t);
}

Test(engine, preserve_keeps_odd_size_one_strides)
{
  /* NOAD input with a strange size-1 stride: to(float64) keeps it exactly */
  tport_tensor *t = strided(TPORT_FLOAT32, 3, (int64_t[]){2, 1, 3}, (int64_t[]){3, 77, 1});
  bool a;
  tport_tensor *r = to(t, (to_options){.has_dtype = true, .dtype = TPORT_FLOAT64}, &a);
  assert_strides(r, 3, (int64_t[]){3, 77, 1});
  tensor_release(r);
  tensor_release(t);
}

Test(engine, conj_and_neg_views_materialize)
{
  tport_tensor *z;
  cr_assert_eq(
      tensor_empty(CPU, TPORT_COMPLEX64, 1, (int64_t[]){3}, TPORT_MF_CONTIGUOUS, 0, &z, NULL), 0);
  float complex *p = z->storage->ptr;
  for (int i = 0; i < 3; i++)
    p[i] = CMPLXF((float)i, (float)(i + 1));
  tport_tensor *c, *n;
  cr_assert_eq(tensor_conj_view(z, &c, NULL), 0);
  cr_assert_eq(tensor_neg_view(c, &n, NULL), 0);
  bool a;
  tport_tensor *r = to(n, (to_options){.copy = true}, &a);
  cr_assert_not(r->conj || r->neg, "the result carries no bits");
  float complex v[3];
  tensor_read(r, v, sizeof v, NULL);
  for (int i = 0; i < 3; i++)
    cr_assert(crealf(v[i]) == -(float)i && cimagf(v[i]) == (float)(i + 1));
  /* conj into a real dtype keeps the real part */
  tport_tensor *re = to(c, (to_options){.has_dtype = true, .dtype = TPORT_FLOAT32}, &a);
  float rv[3];
  tensor_read(re, rv, sizeof rv, NULL);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(rv[i], (float)i);
  tport_tensor *b;
  cr_assert_eq(tensor_empty(CPU, TPORT_BOOL, 1, (int64_t[]){2}, TPORT_MF_CONTIGUOUS, 0, &b, NULL),
               0);
  tport_tensor *nb;
  tport_err err;
  cr_assert_eq(tensor_neg_view(b, &nb, &err), TPORT_INVALID_ARGUMENT);
  tensor_release(b);
  tensor_release(re);
  tensor_release(r);
  tensor_release(n);
  tensor_release(c);
  tensor_release(z);
}

/* complex -> bool is true when either part is nonzero, NaN included (PyTorch
 * 2.x and NumPy; 1.13 read the real part alone): by to() and by copy_(), and
 * through conj and neg views, which change no part's zero-ness. */
static const float complex CB_IN[] = {CMPLXF(0, 1),       CMPLXF(0, 0),    CMPLXF(1, 0),
                                      CMPLXF(-0.0f, 0),   CMPLXF(0, -2),   CMPLXF(NAN, 0),
                                      CMPLXF(-0.0f, NAN), CMPLXF(0, -0.0f)};
static const uint8_t CB_WANT[] = {1, 0, 1, 0, 1, 1, 1, 0};
#define CB_N ((int64_t)(sizeof CB_WANT))

static void assert_bools(tport_tensor *t, const char *what)
{
  uint8_t got[CB_N];
  tport_err e;
  cr_assert_eq(t->dtype, TPORT_BOOL, "%s: dtype %d", what, (int)t->dtype);
  cr_assert_eq(tensor_read(t, got, sizeof got, &e), 0, "%s: %s", what, e.msg);
  for (int64_t i = 0; i < CB_N; i++)
    cr_assert_eq(got[i], CB_WANT[i], "%s: element %lld (%g, %g): %u, want %u", what, (long long)i,
                 crealf(CB_IN[i]), cimagf(CB_IN[i]), got[i], CB_WANT[i]);
}

Test(engine, complex_to_bool_looks_at_both_parts)
{
  for (int wide = 0; wide < 2; wide++) {
    tport_dtype dt = wide ? TPORT_COMPLEX128 : TPORT_COMPLEX64;
    tport_tensor *z, *c, *n, *b;
    cr_assert_eq(tensor_empty(CPU, dt, 1, (int64_t[]){CB_N}, TPORT_MF_CONTIGUOUS, 0, &z, NULL), 0);
    for (int64_t i = 0; i < CB_N; i++)
      if (wide)
        ((double complex *)z->storage->ptr)[i] = CMPLX(crealf(CB_IN[i]), cimagf(CB_IN[i]));
      else
        ((float complex *)z->storage->ptr)[i] = CB_IN[i];
    cr_assert_eq(tensor_conj_view(z, &c, NULL), 0);
    cr_assert_eq(tensor_neg_view(c, &n, NULL), 0);
    tport_tensor *srcs[] = {z, c, n};
    const char *names[] = {"plain", "conj view", "neg of conj view"};
    for (int k = 0; k < 3; k++) {
      bool a;
      char what[64];
      snprintf(what, sizeof what, "%s %s to(bool)", wide ? "complex128" : "complex64", names[k]);
      tport_tensor *r = to(srcs[k], (to_options){.has_dtype = true, .dtype = TPORT_BOOL}, &a);
      assert_bools(r, what);
      tensor_release(r);
      snprintf(what, sizeof what, "%s %s copy_ to bool", wide ? "complex128" : "complex64",
               names[k]);
      cr_assert_eq(
          tensor_empty(CPU, TPORT_BOOL, 1, (int64_t[]){CB_N}, TPORT_MF_CONTIGUOUS, 0, &b, NULL), 0);
      tport_err e;
      cr_assert_eq(tensor_copy_(b, srcs[k], false, &e), 0, "%s: %s", what, e.msg);
      assert_bools(b, what);
      tensor_release(b);
    }
    tensor_release(n);
    tensor_release(c);
    tensor_release(z);
  }
}

/* A device past the count its backend reports does not exist, on a machine
 * with GPUs or without (where the count is 0 and the reason is given). */
Test(engine, to_errors)
{
  tport_tensor *t = arange_f32(1, (int64_t[]){3});
  tport_tensor *r;
  bool a;
  tport_err err;
  const backend_ops *cuda = backend_get(TPORT_DEV_CUDA);
  const int ncuda = cuda->device_count();
  to_options o = {.has_device = true, .device = {TPORT_DEV_CUDA, ncuda}};
  cr_assert_eq(tensor_to(t, &o, &r, &a, &err), TPORT_INVALID_ARGUMENT);
  char want[96];
  snprintf(want, sizeof want, "cuda:%d does not exist (%d present)", ncuda, ncuda);
  cr_assert(strstr(err.msg, want), "%s (want \"%s\")", err.msg, want);
  if (ncuda == 0) {
    /* why, after the count: the reason as far as the message holds it */
    const char *why = strstr(err.msg, "(0 present): ");
    cr_assert(why, "%s", err.msg);
    why += strlen("(0 present): ");
    cr_assert(*why && strncmp(why, cuda->unavailable_reason(), strlen(why)) == 0,
              "%s (the reason: %s)", err.msg, cuda->unavailable_reason());
  }
  o.device = (tport_device){TPORT_DEV_SIM, backend_get(TPORT_DEV_SIM)->device_count()};
  cr_assert_eq(tensor_to(t, &o, &r, &a, &err), TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "does not exist"), "%s", err.msg);
  o = (to_options){.has_format = true, .format = TPORT_MF_CHANNELS_LAST};
  cr_assert_eq(tensor_to(t, &o, &r, &a, &err), TPORT_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "required rank 4 tensor to use channels_last format");
  o = (to_options){.has_format = true, .format = TPORT_MF_NONE};
  cr_assert_eq(tensor_to(t, &o, &r, &a, &err), TPORT_INVALID_ARGUMENT);
  o = (to_options){.has_dtype = true, .dtype = (tport_dtype)42};
  cr_assert_eq(tensor_to(t, &o, &r, &a, &err), TPORT_INVALID_ARGUMENT);
  tensor_release(t);
}

Test(engine, wrap_host_and_read_write)
{
  float buf[6] = {0};
  tport_tensor *t;
  cr_assert_eq(tensor_wrap_host(buf, sizeof buf, TPORT_FLOAT32, 2, (int64_t[]){3, 2},
                                (int64_t[]){1, 3}, 0, &t, NULL),
               0);
  float in[6] = {1, 2, 3, 4, 5, 6}, out[6];
  cr_assert_eq(tensor_write(t, in, sizeof in, NULL), 0);
  cr_assert(buf[0] == 1 && buf[3] == 2 && buf[1] == 3, "written through the transposed view");
  cr_assert_eq(tensor_read(t, out, sizeof out, NULL), 0);
  cr_assert(memcmp(in, out, sizeof in) == 0);
  tport_err err;
  cr_assert_eq(tensor_read(t, out, 5, &err), TPORT_INVALID_ARGUMENT);
  tport_tensor *bad;
  cr_assert_eq(
      tensor_wrap_host(buf, sizeof buf, TPORT_FLOAT32, 1, (int64_t[]){7}, NULL, 0, &bad, &err),
      TPORT_OUT_OF_RANGE);
  tensor_release(t);
}

/* Hostile clients, defect 6: a deadline stops a running copy between pieces
 * of work; without one (or before it) the same copy runs whole, and a copy
 * run in pieces gives the bits of one run. */
Test(engine, deadline_stops_a_copy_between_pieces)
{
  int64_t sz[2] = {64, ENGINE_PIECE_ELEMS / 16}; /* 4 pieces' worth of floats */
  int64_t tsz[2] = {sz[1], sz[0]};
  tport_tensor *src = arange_f32(2, sz), *dst, *ref;
  cr_assert_eq(tensor_empty(CPU, TPORT_FLOAT64, 2, tsz, TPORT_MF_CONTIGUOUS, 0, &dst, NULL), 0);
  cr_assert_eq(tensor_empty(CPU, TPORT_FLOAT64, 2, tsz, TPORT_MF_CONTIGUOUS, 0, &ref, NULL), 0);
  tport_tensor *srct;
  tport_err e;
  /* a transposed, converting copy: the strided kernel, not a memcpy */
  cr_assert_eq(tensor_as_strided(src, 2, tsz, (int64_t[]){1, sz[1]}, 0, &srct, &e), 0);
  engine_set_deadline(1); /* long past */
  cr_assert_eq(tensor_copy_(dst, srct, false, &e), TPORT_DEADLINE_EXCEEDED);
  cr_assert(strstr(e.msg, "deadline"), "%s", e.msg);
  engine_set_deadline(0);
  cr_assert_eq(tensor_copy_(ref, srct, false, &e), 0, "%s", e.msg);
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  engine_set_deadline((int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + 600000);
  cr_assert_eq(tensor_copy_(dst, srct, false, &e), 0, "%s", e.msg);
  engine_set_deadline(0);
  cr_assert_eq(memcmp(dst->storage->ptr, ref->storage->ptr, tensor_nbytes(ref)), 0,
               "pieces must give the bits of one run");
  tensor_release(srct);
  tensor_release(src);
  tensor_release(dst);
  tensor_release(ref);
}

/* tensor_write_host_bytes: a memcpy into a dense cpu tensor's bytes at its
 * own offset (how small puts land), and nothing for a range it does not
 * hold or a tensor that is not dense. */
Test(engine, host_bytes_are_written_at_the_tensors_offset)
{
  int64_t n = 16;
  tport_tensor *t = arange_f32(1, &n), *view;
  int64_t four = 4, one = 1;
  tport_err e;
  /* elements [8, 12): the view's bytes start 32 bytes into the storage */
  cr_assert_eq(tensor_as_strided(t, 1, &four, &one, 8, &view, &e), 0, "%s", e.msg);
  const float v[2] = {-1.0f, -2.0f};
  cr_assert(tensor_write_host_bytes(view, 4, v, sizeof v), "bytes [4, 12) of 16");
  const float *p = t->storage->ptr;
  for (int i = 0; i < 16; i++)
    cr_assert_eq(p[i], i == 9 ? -1.0f : i == 10 ? -2.0f : (float)i, "element %d is %g", i, p[i]);
  cr_assert_not(tensor_write_host_bytes(view, 12, v, sizeof v), "past its 16 bytes");
  cr_assert_not(tensor_write_host_bytes(view, SIZE_MAX, v, 1), "an offset past everything");
  cr_assert(tensor_write_host_bytes(view, 16, v, 0), "nothing at its end");
  /* every second element: not dense, so not bytes in a row */
  int64_t two = 2;
  tport_tensor *gaps;
  cr_assert_eq(tensor_as_strided(t, 1, &four, &two, 0, &gaps, &e), 0, "%s", e.msg);
  cr_assert_not(tensor_write_host_bytes(gaps, 0, v, sizeof v));
  cr_assert_eq(p[0], 0.0f);
  tensor_release(gaps);
  tensor_release(view);
  tensor_release(t);
}

/* A plain copy of HOST_COPY_STREAM_MIN bytes and more (host_copy.c: its
 * bytes written with streaming stores), between views at odd offsets, whole
 * and in the pieces a deadline cuts it into: every byte where it belongs,
 * and none before or after the destination's view. */
Test(engine, a_large_plain_copy_is_exact_whole_and_in_pieces)
{
  int64_t n = 2 * ENGINE_PIECE_ELEMS + 4099, all = n + 16;
  tport_tensor *sbuf, *dbuf, *src, *dst;
  tport_err e;
  cr_assert_eq(tensor_empty(CPU, TPORT_UINT8, 1, &all, TPORT_MF_CONTIGUOUS, 0, &sbuf, &e), 0);
  cr_assert_eq(tensor_empty(CPU, TPORT_UINT8, 1, &all, TPORT_MF_CONTIGUOUS, 0, &dbuf, &e), 0);
  uint8_t *s = sbuf->storage->ptr, *d = dbuf->storage->ptr;
  for (int64_t i = 0; i < all; i++)
    s[i] = (uint8_t)(i * 7 + (i >> 13));
  int64_t one = 1;
  cr_assert_eq(tensor_as_strided(sbuf, 1, &n, &one, 3, &src, &e), 0, "%s", e.msg);
  cr_assert_eq(tensor_as_strided(dbuf, 1, &n, &one, 5, &dst, &e), 0, "%s", e.msg);
  for (int pieces = 0; pieces < 2; pieces++) {
    memset(d, 0xA5, (size_t)all);
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    engine_set_deadline(pieces ? (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + 600000 : 0);
    cr_assert_eq(tensor_copy_(dst, src, false, &e), 0, "%s", e.msg);
    engine_set_deadline(0);
    cr_assert_eq(memcmp(d + 5, s + 3, (size_t)n), 0, "pieces %d: the bytes differ", pieces);
    for (int64_t i = 0; i < 5; i++)
      cr_assert_eq(d[i], 0xA5, "pieces %d: byte %lld before the view", pieces, (long long)i);
    for (int64_t i = 5 + n; i < all; i++)
      cr_assert_eq(d[i], 0xA5, "pieces %d: byte %lld after the view", pieces, (long long)i);
  }
  tensor_release(src);
  tensor_release(dst);
  tensor_release(sbuf);
  tensor_release(dbuf);
}
