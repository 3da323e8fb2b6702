/*
 * plan.h: the iteration plan (SEMANTICS.md §5, ATen's TensorIterator).
 *
 * Operands share one shape (broadcast already applied: a broadcast dim has
 * byte stride 0).  plan_build() reorders dims so that dim 0 is innermost in
 * the first operand's (dst's) memory order, then coalesces dims that can be
 * walked as one.  Kernels, CPU and CUDA alike, only iterate over a plan: this
 * is the one place where layout cleverness lives.
 */
#ifndef TPORT_PLAN_H
#define TPORT_PLAN_H

#include "tport_types.h"

#define PLAN_MAX_OPERANDS 3

typedef struct plan {
  int ndim; /* after coalescing; 0 for a single element */
  int nops;
  int64_t shape[TPORT_MAX_DIMS];                      /* dim 0 innermost */
  int64_t strides[PLAN_MAX_OPERANDS][TPORT_MAX_DIMS]; /* bytes */
  int perm[TPORT_MAX_DIMS]; /* plan dim i (before coalescing) = tensor dim perm[i] */
} plan;

/* Builds the plan for nops operands over `shape` (ndim tensor dims, outermost
 * first as a tensor lists them); byte_strides[op][d] is operand op's stride of
 * tensor dim d in bytes.  Operand 0 is the output. */
void plan_build(plan *p, int ndim, const int64_t *shape, int nops,
                const int64_t *const *byte_strides);

int64_t plan_numel(const plan *p);

/* TensorIterator::is_contiguous(): one element, or one dim after coalescing
 * whose stride is the element size for every operand.  With the same dtype
 * on both sides this is the memcpy-eligible test of SEMANTICS.md §4. */
bool plan_is_contiguous(const plan *p, const size_t *elem_sizes);

/* Broadcasts `src` (sizes/strides in elements) to `dst_ndim`/`dst_sizes`,
 * writing byte strides.  Returns false when src does not broadcast (it may not
 * have more dims than dst). */
bool plan_broadcast_strides(int dst_ndim, const int64_t *dst_sizes, int src_ndim,
                            const int64_t *src_sizes, const int64_t *src_strides, size_t elem_size,
                            int64_t *out_byte_strides);

#endif
