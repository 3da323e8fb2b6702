/* test_validate.c: every rejection of a wire descriptor, with its code and
 * the field its message names. */
#include <criterion/criterion.h>
#include <string.h>

#include "validate.h"

static int V(int dtype, size_t n, const int64_t *sz, size_t ns, const int64_t *st, int64_t off,
             int64_t storage, tport_err *err)
{
  meta_layout l;
  validate_result r;
  return validate_desc(dtype, n, sz, ns, st, off, storage, &l, &r, err);
}

Test(validate, accepts_and_computes)
{
  meta_layout l;
  validate_result r;
  int64_t sz[] = {2, 3}, st[] = {1, 2};
  cr_assert_eq(validate_desc(TPORT_FLOAT32, 2, sz, 2, st, 5, -1, &l, &r, NULL), 0);
  cr_assert_eq(r.numel, 6);
  cr_assert_eq(r.nbytes, 24);
  cr_assert_eq(r.storage_bytes, (5 + 6) * 4);
  cr_assert_eq(validate_desc(TPORT_INT8, 2, sz, 0, NULL, 0, -1, &l, &r, NULL), 0);
  cr_assert(l.strides[0] == 3 && l.strides[1] == 1, "no strides: contiguous");
  cr_assert_eq(validate_desc(TPORT_INT8, 0, NULL, 0, NULL, 0, -1, &l, &r, NULL), 0);
  cr_assert_eq(r.numel, 1, "a 0-dim tensor has one element");
}

Test(validate, rejections)
{
  tport_err e;
  int64_t sz[17] = {2, 3}, st[17] = {3, 1};
  cr_assert_eq(V(12, 2, sz, 2, st, 0, -1, &e), TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(e.msg, "dtype is 12"), "%s", e.msg);
  cr_assert_eq(V(-1, 2, sz, 2, st, 0, -1, &e), TPORT_INVALID_ARGUMENT);
  cr_assert_eq(V(TPORT_FLOAT32, 17, sz, 0, NULL, 0, -1, &e), TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(e.msg, "sizes has 17 dims"), "%s", e.msg);
  cr_assert_eq(V(TPORT_FLOAT32, 2, sz, 1, st, 0, -1, &e), TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(e.msg, "strides has 1 entries"), "%s", e.msg);
  int64_t neg[] = {2, -3};
  cr_assert_eq(V(TPORT_FLOAT32, 2, neg, 0, NULL, 0, -1, &e), TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(e.msg, "sizes[1] is -3"), "%s", e.msg);
  int64_t nst[] = {3, -1};
  cr_assert_eq(V(TPORT_FLOAT32, 2, sz, 2, nst, 0, -1, &e), TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(e.msg, "strides[1] is -1: negative strides"), "%s", e.msg);
  cr_assert_eq(V(TPORT_FLOAT32, 2, sz, 2, st, -2, -1, &e), TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(e.msg, "storage_offset is -2"), "%s", e.msg);
}

Test(validate, overflow_is_caught)
{
  tport_err e;
  int64_t huge[] = {INT64_MAX / 2, 4};
  cr_assert_eq(V(TPORT_FLOAT32, 2, huge, 0, NULL, 0, -1, &e), TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(e.msg, "sizes"), "%s", e.msg);
  int64_t big[] = {(int64_t)1 << 40, (int64_t)1 << 22};
  cr_assert_eq(V(TPORT_FLOAT64, 2, big, 0, NULL, 0, -1, &e), TPORT_INVALID_ARGUMENT);
  int64_t sz[] = {3, 3}, st[] = {INT64_MAX / 2 + 1, 1};
  cr_assert_eq(V(TPORT_UINT8, 2, sz, 2, st, 0, -1, &e), TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(e.msg, "strides[0]"), "%s", e.msg);
  int64_t s1[] = {2}, t1[] = {1};
  cr_assert_eq(V(TPORT_UINT8, 1, s1, 1, t1, INT64_MAX - 1, -1, &e), TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(e.msg, "storage_offset"), "%s", e.msg);
  /* zero elements: huge strides never matter */
  int64_t z[] = {0, 5}, zst[] = {INT64_MAX, INT64_MAX};
  cr_assert_eq(V(TPORT_UINT8, 2, z, 2, zst, 0, -1, &e), 0);
}

Test(validate, offset_within_storage)
{
  tport_err e;
  int64_t sz[] = {4}, st[] = {2};
  cr_assert_eq(V(TPORT_INT32, 1, sz, 1, st, 1, 9 * 4, &e), 0, "reaches element 1+6 = 7 < 9");
  cr_assert_eq(V(TPORT_INT32, 1, sz, 1, st, 3, 9 * 4, &e), TPORT_OUT_OF_RANGE);
  cr_assert(strstr(e.msg, "storage of 36 bytes"), "%s", e.msg);
  int64_t z[] = {0};
  cr_assert_eq(V(TPORT_INT32, 1, z, 0, NULL, 10, 36, &e), TPORT_OUT_OF_RANGE,
               "an empty view's offset still has to lie in the storage");
}
