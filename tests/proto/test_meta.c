/* test_meta.c: contiguity predicates, format heuristics and stride rules
 * (SEMANTICS.md §1-§2), with the examples verified on PyTorch 1.13. */
#include <criterion/criterion.h>
#include <string.h>

#include "device.h"
#include "dtype.h"
#include "meta.h"

static meta_layout L(int n, const int64_t *sz, const int64_t *st)
{
  meta_layout l = {.ndim = n};
  memcpy(l.sizes, sz, sizeof(int64_t) * (size_t)n);
  memcpy(l.strides, st, sizeof(int64_t) * (size_t)n);
  return l;
}
#define LAYOUT(n, ...) L(n, (int64_t[])__VA_ARGS__

Test(meta, contiguous_skips_size_one_and_empty)
{
  meta_layout a = L(3, (int64_t[]){2, 1, 4}, (int64_t[]){4, 99, 1});
  cr_assert(meta_is_contiguous(&a));
  meta_layout b = L(2, (int64_t[]){3, 4}, (int64_t[]){1, 3});
  cr_assert_not(meta_is_contiguous(&b));
  meta_layout e = L(2, (int64_t[]){0, 4}, (int64_t[]){7, 7});
  cr_assert(meta_is_contiguous(&e), "0 elements is contiguous");
  meta_layout z = {.ndim = 0};
  cr_assert(meta_is_contiguous(&z));
}

Test(meta, channels_last_walk)
{
  meta_layout cl = L(4, (int64_t[]){2, 3, 4, 5}, (int64_t[]){60, 1, 15, 3});
  cr_assert(meta_is_channels_last_contiguous(&cl));
  cr_assert_not(meta_is_contiguous(&cl));
  cr_assert_eq(meta_suggest_memory_format(&cl), TPORT_MF_CHANNELS_LAST);
  cr_assert_eq(meta_actual_memory_format(&cl), TPORT_MF_CHANNELS_LAST);
  meta_layout c3 = L(5, (int64_t[]){2, 3, 2, 4, 5}, (int64_t[]){120, 1, 60, 15, 3});
  cr_assert(meta_is_channels_last_3d_contiguous(&c3));
  cr_assert_eq(meta_suggest_memory_format(&c3), TPORT_MF_CHANNELS_LAST_3D);
  cr_assert_not(meta_is_channels_last_contiguous(&c3), "channels_last is 4-D only");
}

Test(meta, suggest_is_a_guess)
{
  /* N,1,H,W with strides (HW,1,W,1): contiguous, and suggests channels_last */
  meta_layout a = L(4, (int64_t[]){2, 1, 4, 4}, (int64_t[]){16, 1, 4, 1});
  cr_assert(meta_is_contiguous(&a));
  cr_assert_eq(meta_suggest_memory_format(&a), TPORT_MF_CHANNELS_LAST);
  /* N,1,1,1 always suggests contiguous */
  meta_layout b = L(4, (int64_t[]){4, 1, 1, 1}, (int64_t[]){1, 1, 1, 1});
  cr_assert_eq(meta_suggest_memory_format(&b), TPORT_MF_CONTIGUOUS);
  cr_assert(meta_is_channels_last_contiguous(&b));
  /* empty(2,1,4,4) strides (16,16,4,1): suggests contiguous */
  meta_layout c = L(4, (int64_t[]){2, 1, 4, 4}, (int64_t[]){16, 16, 4, 1});
  cr_assert_eq(meta_suggest_memory_format(&c), TPORT_MF_CONTIGUOUS);
  /* stride 0 on C: never channels_last */
  meta_layout d = L(4, (int64_t[]){2, 3, 4, 5}, (int64_t[]){60, 0, 15, 3});
  cr_assert_not(meta_strides_look_channels_last(&d));
}

Test(meta, non_overlapping_and_dense)
{
  meta_layout t = L(2, (int64_t[]){3, 4}, (int64_t[]){1, 3});
  cr_assert(meta_is_non_overlapping_and_dense(&t));
  meta_layout e = L(2, (int64_t[]){3, 4}, (int64_t[]){1, 0});
  cr_assert_not(meta_is_non_overlapping_and_dense(&e));
  cr_assert_eq(meta_internal_overlap(&e), META_OVERLAP_YES);
  meta_layout g = L(2, (int64_t[]){3, 4}, (int64_t[]){8, 2}); /* gaps */
  cr_assert_not(meta_is_non_overlapping_and_dense(&g));
  cr_assert_eq(meta_internal_overlap(&g), META_OVERLAP_TOO_HARD);
  meta_layout one = L(1, (int64_t[]){1}, (int64_t[]){5});
  cr_assert(meta_is_non_overlapping_and_dense(&one));
  meta_layout odd = L(3, (int64_t[]){2, 1, 3}, (int64_t[]){1, 77, 2});
  cr_assert(meta_is_non_overlapping_and_dense(&odd), "size-1 strides do not matter");
}

Test(meta, fresh_strides)
{
  int64_t st[5];
  cr_assert_eq(meta_fresh_strides(3, (int64_t[]){2, 0, 4}, TPORT_MF_CONTIGUOUS, st, NULL), 0);
  cr_assert(st[0] == 4 && st[1] == 4 && st[2] == 1, "max(size,1) in contiguous strides");
  cr_assert_eq(meta_fresh_strides(4, (int64_t[]){2, 3, 4, 5}, TPORT_MF_CHANNELS_LAST, st, NULL), 0);
  cr_assert(st[0] == 60 && st[1] == 1 && st[2] == 15 && st[3] == 3);
  cr_assert_eq(meta_fresh_strides(4, (int64_t[]){2, 0, 4, 5}, TPORT_MF_CHANNELS_LAST, st, NULL), 0);
  cr_assert(st[0] == 0 && st[1] == 1 && st[2] == 0 && st[3] == 0, "raw sizes in channels_last");
  cr_assert_eq(
      meta_fresh_strides(5, (int64_t[]){2, 3, 2, 4, 5}, TPORT_MF_CHANNELS_LAST_3D, st, NULL), 0);
  cr_assert(st[0] == 120 && st[1] == 1 && st[2] == 60 && st[3] == 15 && st[4] == 3);
  tport_err err;
  cr_assert_eq(meta_fresh_strides(3, (int64_t[]){2, 3, 4}, TPORT_MF_CHANNELS_LAST, st, &err),
               TPORT_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "required rank 4 tensor to use channels_last format");
  cr_assert_eq(meta_fresh_strides(4, (int64_t[]){2, 3, 4, 5}, TPORT_MF_CHANNELS_LAST_3D, st, &err),
               TPORT_INVALID_ARGUMENT);
  cr_assert_str_eq(err.msg, "required rank 5 tensor to use channels_last_3d format");
}

Test(meta, infer_dense_strides)
{
  int64_t out[4];
  /* expanded (3,4) strides (1,0) -> (4,1) as in ones(3,1).expand(3,4).to(float64) */
  meta_infer_dense_strides(2, (int64_t[]){3, 4}, (int64_t[]){1, 0}, out);
  cr_assert(out[0] == 4 && out[1] == 1);
  /* transposed with gaps keeps the order: (3,4) strides (2,8) -> (1,3) */
  meta_infer_dense_strides(2, (int64_t[]){3, 4}, (int64_t[]){2, 8}, out);
  cr_assert(out[0] == 1 && out[1] == 3);
  /* channels-last order with gaps */
  meta_infer_dense_strides(4, (int64_t[]){2, 3, 4, 5}, (int64_t[]){120, 2, 30, 6}, out);
  cr_assert(out[0] == 60 && out[1] == 1 && out[2] == 15 && out[3] == 3);
}

Test(meta, span)
{
  meta_layout l = L(2, (int64_t[]){3, 4}, (int64_t[]){1, 3});
  cr_assert_eq(meta_span_elements(&l), 12);
  meta_layout e = L(2, (int64_t[]){0, 4}, (int64_t[]){1, 3});
  cr_assert_eq(meta_span_elements(&e), 0);
}

Test(dtype, names_and_aliases)
{
  tport_dtype d;
  cr_assert_eq(dtype_parse("torch.float32", "dtype", &d, NULL), 0);
  cr_assert_eq(d, TPORT_FLOAT32);
  cr_assert_eq(dtype_parse("half", "dtype", &d, NULL), 0);
  cr_assert_eq(d, TPORT_FLOAT16);
  cr_assert_eq(dtype_parse("long", "dtype", &d, NULL), 0);
  cr_assert_eq(d, TPORT_INT64);
  for (int i = 0; i < TPORT_NUM_DTYPES; i++) {
    cr_assert_eq(dtype_parse(dtype_name(i), "dtype", &d, NULL), 0);
    cr_assert_eq((int)d, i);
  }
  tport_err err;
  cr_assert_eq(dtype_parse("float8", "desc.dtype", &d, &err), TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(err.msg, "desc.dtype is 'float8'"), "%s", err.msg);
  cr_assert_eq(tport_dtype_size(TPORT_COMPLEX128), 16);
  cr_assert_eq(tport_dtype_size(TPORT_BFLOAT16), 2);
  cr_assert_eq(tport_dtype_size(99), 0);
}

Test(dtype, memory_formats)
{
  tport_memory_format f;
  cr_assert_eq(memory_format_parse("torch.channels_last", "f", &f, NULL), 0);
  cr_assert_eq(f, TPORT_MF_CHANNELS_LAST);
  cr_assert_eq(memory_format_parse("contiguous_format", "f", &f, NULL), 0);
  cr_assert_eq(f, TPORT_MF_CONTIGUOUS);
  cr_assert_eq(memory_format_parse("none", "f", &f, NULL), TPORT_INVALID_ARGUMENT,
               "none is an answer, never a request");
  cr_assert_str_eq(memory_format_name(TPORT_MF_NONE), "none");
}

Test(device, parse_and_format)
{
  tport_device d;
  char buf[32];
  cr_assert_eq(device_parse("cuda:3", "device", &d, NULL), 0);
  cr_assert(d.type == TPORT_DEV_CUDA && d.index == 3);
  cr_assert_str_eq(device_format(d, buf, sizeof buf), "cuda:3");
  cr_assert_eq(device_parse("sim", "device", &d, NULL), 0);
  cr_assert(d.type == TPORT_DEV_SIM && d.index == -1);
  cr_assert_eq(device_parse("cpu", "device", &d, NULL), 0);
  cr_assert(d.type == TPORT_DEV_CPU && d.index == 0);
  tport_err err;
  const char *bad[] = {"",        "gpu",   "cuda:",     "cuda:-1", "cuda:x",
                       "cuda:1x", "cpu:1", "sim:99999", "cuda:+1"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    cr_assert_eq(device_parse(bad[i], "device", &d, &err), TPORT_INVALID_ARGUMENT, "'%s'", bad[i]);
}

/* An empty tensor's strides are bounded by nothing (no element to reach):
 * the format guess must not multiply one by a size past int64 (found by
 * fuzz_frame: UBSan, signed overflow in strides_look_like). */
Test(meta, empty_tensors_with_huge_strides_guess_without_overflow)
{
  meta_layout a = L(4, (int64_t[]){0, 218103807, 1, 1},
                    (int64_t[]){1, 4398046511103, 1, 1});
  cr_assert_eq(meta_suggest_memory_format(&a), TPORT_MF_CONTIGUOUS);
  meta_layout b = L(4, (int64_t[]){2, 3, 1 << 30, 0},
                    (int64_t[]){INT64_MAX / 2, 1, INT64_MAX / 4, 3});
  (void)meta_suggest_memory_format(&b);
  cr_assert_eq(meta_span_elements(&b), 0);
  meta_layout c = L(5, (int64_t[]){0, 1 << 20, 1 << 20, 1 << 20, 1 << 20},
                    (int64_t[]){INT64_MAX, 1, INT64_MAX / 3, INT64_MAX / 5, INT64_MAX / 7});
  (void)meta_suggest_memory_format(&c);
  cr_assert_eq(meta_span_elements(&c), 0);
}
