/*
 * plan.c: reorder and coalesce, transcribed from TensorIterator
 * (reorder_dimensions, coalesce_dimensions) of PyTorch 1.13.
 */
#include "plan.h"

#include <string.h>

/* TensorIterator's should_swap: compare operands in order, dst first; skip a
 * pair where either stride is 0; equal strides: the smaller size goes first. */
static int should_swap(const plan *p, const int64_t *const *st, const int64_t *shape, int d0,
                       int d1)
{
  for (int op = 0; op < p->nops; op++) {
    int64_t s0 = st[op][d0], s1 = st[op][d1];
    if (s0 == 0 || s1 == 0)
      continue;
    if (s0 < s1)
      return -1;
    if (s0 > s1)
      return 1;
    if (shape[d0] > shape[d1])
      return 1;
  }
  return 0;
}

void plan_build(plan *p, int ndim, const int64_t *shape, int nops,
                const int64_t *const *byte_strides)
{
  memset(p, 0, sizeof *p);
  p->nops = nops;
  int *perm = p->perm;
  for (int i = 0; i < ndim; i++)
    perm[i] = ndim - 1 - i;
  for (int i = 1; i < ndim; i++) {
    int dim1 = i;
    for (int dim0 = i - 1; dim0 >= 0; dim0--) {
      int c = should_swap(p, byte_strides, shape, perm[dim0], perm[dim1]);
      if (c > 0) {
        int t = perm[dim0];
        perm[dim0] = perm[dim1];
        perm[dim1] = t;
        dim1 = dim0;
      } else if (c < 0) {
        break;
      }
    }
  }
  for (int i = 0; i < ndim; i++) {
    p->shape[i] = shape[perm[i]];
    for (int op = 0; op < nops; op++)
      p->strides[op][i] = byte_strides[op][perm[i]];
  }
  if (ndim == 0) {
    p->ndim = 0;
    return;
  }
  /* coalesce_dimensions */
  int prev = 0;
  for (int dim = 1; dim < ndim; dim++) {
    int64_t s0 = p->shape[prev], s1 = p->shape[dim];
    bool can = s0 == 1 || s1 == 1;
    if (!can) {
      can = true;
      for (int op = 0; op < nops; op++)
        if (s0 * p->strides[op][prev] != p->strides[op][dim]) {
          can = false;
          break;
        }
    }
    if (can) {
      if (s0 == 1)
        for (int op = 0; op < nops; op++)
          p->strides[op][prev] = p->strides[op][dim];
      p->shape[prev] *= s1;
    } else {
      prev++;
      if (prev != dim) {
        for (int op = 0; op < nops; op++)
          p->strides[op][prev] = p->strides[op][dim];
        p->shape[prev] = p->shape[dim];
      }
    }
  }
  p->ndim = prev + 1;
}

int64_t plan_numel(const plan *p)
{
  int64_t n = 1;
  for (int d = 0; d < p->ndim; d++)
    n *= p->shape[d];
  return n;
}

bool plan_is_contiguous(const plan *p, const size_t *elem_sizes)
{
  if (plan_numel(p) == 1)
    return true;
  if (p->ndim != 1)
    return false;
  for (int op = 0; op < p->nops; op++)
    if (p->strides[op][0] != (int64_t)elem_sizes[op])
      return false;
  return true;
}

bool plan_broadcast_strides(int dst_ndim, const int64_t *dst_sizes, int src_ndim,
                            const int64_t *src_sizes, const int64_t *src_strides, size_t elem_size,
                            int64_t *out)
{
  if (src_ndim > dst_ndim)
    return false;
  int lead = dst_ndim - src_ndim;
  for (int d = 0; d < dst_ndim; d++) {
    if (d < lead) {
      out[d] = 0;
      continue;
    }
    int64_t s = src_sizes[d - lead];
    if (s == dst_sizes[d])
      out[d] =
          src_strides[d - lead] * (int64_t)elem_size; /* as TensorIterator: kept even for size 1 */
    else if (s == 1)
      out[d] = 0;
    else
      return false;
  }
  return true;
}
