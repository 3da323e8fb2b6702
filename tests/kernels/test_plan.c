/* test_plan.c: reorder and coalesce (SEMANTICS.md §5). */
#include <criterion/criterion.h>

#include "plan.h"

static void build2(plan *p, int n, const int64_t *shape, const int64_t *d, const int64_t *s)
{
  const int64_t *st[2] = {d, s};
  plan_build(p, n, shape, 2, st);
}

Test(plan, contiguous_coalesces_to_one_dim)
{
  plan p;
  int64_t shape[] = {2, 3, 4}, st[] = {48, 16, 4};
  build2(&p, 3, shape, st, st);
  cr_assert_eq(p.ndim, 1);
  cr_assert_eq(p.shape[0], 24);
  size_t es[2] = {4, 4};
  cr_assert(plan_is_contiguous(&p, es));
}

Test(plan, same_layout_non_contiguous_is_memcpy_eligible)
{
  /* both transposed (3,4) with strides (1,3): they lie in memory the same way */
  plan p;
  int64_t shape[] = {3, 4}, st[] = {4, 12};
  build2(&p, 2, shape, st, st);
  cr_assert_eq(p.ndim, 1);
  size_t es[2] = {4, 4};
  cr_assert(plan_is_contiguous(&p, es));
}

Test(plan, transpose_orders_by_dst)
{
  /* dst contiguous (3,4), src transposed: dim 0 of the plan is dst's innermost */
  plan p;
  int64_t shape[] = {3, 4}, d[] = {16, 4}, s[] = {4, 12};
  build2(&p, 2, shape, d, s);
  cr_assert_eq(p.ndim, 2);
  cr_assert_eq(p.shape[0], 4);
  cr_assert_eq(p.strides[0][0], 4);
  cr_assert_eq(p.strides[1][0], 12);
  cr_assert_eq(p.perm[0], 1);
  size_t es[2] = {4, 4};
  cr_assert_not(plan_is_contiguous(&p, es));
}

Test(plan, nchw_to_nhwc_is_three_dims)
{
  plan p;
  int64_t shape[] = {2, 3, 4, 5};
  int64_t d[] = {60 * 4, 1 * 4, 15 * 4, 3 * 4}; /* channels_last */
  int64_t s[] = {60 * 4, 20 * 4, 5 * 4, 1 * 4}; /* contiguous */
  build2(&p, 4, shape, d, s);
  cr_assert_eq(p.ndim, 3);
  cr_assert(p.shape[0] == 3 && p.shape[1] == 20 && p.shape[2] == 2);
  cr_assert(p.strides[1][1] == 4, "src is dense along plan dim 1");
}

Test(plan, broadcast)
{
  int64_t out[3];
  cr_assert(plan_broadcast_strides(3, (int64_t[]){2, 3, 4}, 2, (int64_t[]){1, 4}, (int64_t[]){4, 1},
                                   8, out));
  cr_assert(out[0] == 0 && out[1] == 0 && out[2] == 8);
  cr_assert_not(plan_broadcast_strides(2, (int64_t[]){3, 4}, 2, (int64_t[]){2, 4},
                                       (int64_t[]){4, 1}, 4, out));
  cr_assert_not(
      plan_broadcast_strides(1, (int64_t[]){4}, 2, (int64_t[]){1, 4}, (int64_t[]){4, 1}, 4, out));
  /* a size-1 dim against size 1 keeps its stride (as TensorIterator does) */
  cr_assert(plan_broadcast_strides(2, (int64_t[]){1, 4}, 2, (int64_t[]){1, 4}, (int64_t[]){7, 1}, 4,
                                   out));
  cr_assert_eq(out[0], 28);
  /* broadcast src: a stride-0 dim is never memcpy eligible */
  plan p;
  int64_t shape[] = {3, 4}, d[] = {16, 4}, s[] = {0, 4};
  build2(&p, 2, shape, d, s);
  size_t es[2] = {4, 4};
  cr_assert_not(plan_is_contiguous(&p, es));
}

Test(plan, single_element_and_scalar)
{
  plan p;
  int64_t shape[] = {1, 1}, d[] = {4, 4}, s[] = {100, 4};
  build2(&p, 2, shape, d, s);
  size_t es[2] = {4, 4};
  cr_assert(plan_is_contiguous(&p, es));
  build2(&p, 0, NULL, NULL, NULL);
  cr_assert_eq(p.ndim, 0);
  cr_assert_eq(plan_numel(&p), 1);
}
