/*
 * meta.c: contiguity predicates, memory-format heuristics and stride rules,
 * each transcribed from c10 (c10/core/TensorImpl.cpp, c10/core/MemoryFormat.h,
 * c10/core/Contiguity.h) and ATen (ExpandUtils.cpp) as of PyTorch 1.13.
 */
#include "meta.h"

#include <stdio.h>
#include <string.h>

int64_t meta_numel(const meta_layout *l)
{
  int64_t n = 1;
  for (int d = 0; d < l->ndim; d++)
    n *= l->sizes[d];
  return n;
}

bool meta_is_contiguous(const meta_layout *l)
{
  if (meta_numel(l) == 0)
    return true;
  int64_t expected = 1;
  for (int d = l->ndim - 1; d >= 0; d--) {
    if (l->sizes[d] == 1)
      continue;
    if (l->strides[d] != expected)
      return false;
    expected *= l->sizes[d];
  }
  return true;
}

/* The channels-last walks: no shortcut for 0 elements (c10 has none). */
static bool walk_order(const meta_layout *l, const int *order, int n)
{
  int64_t expected = 1;
  for (int i = 0; i < n; i++) {
    int d = order[i];
    if (l->sizes[d] == 1)
      continue;
    if (l->strides[d] != expected)
      return false;
    expected *= l->sizes[d];
  }
  return true;
}

static const int order_cl[4] = {1, 3, 2, 0};
static const int order_cl3d[5] = {1, 4, 3, 2, 0};

bool meta_is_channels_last_contiguous(const meta_layout *l)
{
  return l->ndim == 4 && walk_order(l, order_cl, 4);
}

bool meta_is_channels_last_3d_contiguous(const meta_layout *l)
{
  return l->ndim == 5 && walk_order(l, order_cl3d, 5);
}

bool meta_is_contiguous_as(const meta_layout *l, tport_memory_format fmt)
{
  switch (fmt) {
  case TPORT_MF_CONTIGUOUS: return meta_is_contiguous(l);
  case TPORT_MF_CHANNELS_LAST: return meta_is_channels_last_contiguous(l);
  case TPORT_MF_CHANNELS_LAST_3D: return meta_is_channels_last_3d_contiguous(l);
  case TPORT_MF_NONE: return true;
  case TPORT_MF_PRESERVE: return false;
  }
  return false;
}

bool meta_is_non_overlapping_and_dense(const meta_layout *l)
{
  int n = l->ndim;
  if (n == 1)
    return l->sizes[0] < 2 || l->strides[0] == 1;
  if (meta_is_contiguous(l) || meta_is_channels_last_contiguous(l) ||
      meta_is_channels_last_3d_contiguous(l))
    return true;
  /* Sort dims by stride ascending, size<2 dims last (insertion sort: n <= 16). */
  int perm[TPORT_MAX_DIMS];
  for (int i = 0; i < n; i++)
    perm[i] = i;
  for (int i = 1; i < n; i++) {
    int p = perm[i], j = i;
    for (; j > 0; j--) {
      int q = perm[j - 1];
      bool p_before_q;
      if (l->sizes[p] < 2)
        p_before_q = false;
      else if (l->sizes[q] < 2)
        p_before_q = true;
      else
        p_before_q = l->strides[p] < l->strides[q];
      if (!p_before_q)
        break;
      perm[j] = q;
    }
    perm[j] = p;
  }
  int64_t require = 1;
  for (int i = 0; i < n; i++) {
    int64_t size = l->sizes[perm[i]];
    if (size < 2)
      return true;
    if (l->strides[perm[i]] != require)
      return false;
    require *= size;
  }
  return true;
}

static bool strides_look_like(const meta_layout *l, const int *order, int n)
{
  if (l->strides[1] == 0)
    return false;
  int64_t min = 0;
  for (int i = 0; i < n; i++) {
    int d = order[i];
    if (l->sizes[d] == 0 || l->strides[d] < min)
      return false;
    /* N,1,1,1 (and N11W sliced on W): ambiguous, fall back to contiguous. */
    if (d == 0 && min == l->strides[1])
      return false;
    min = l->strides[d];
    /* An empty tensor's strides are not bounded by any extent (validate.h):
     * past int64, no later stride reaches min -- and the last dim's
     * product is never used. */
    if (l->sizes[d] > 1 && __builtin_mul_overflow(min, l->sizes[d], &min))
      return i == n - 1;
  }
  return true;
}

bool meta_strides_look_channels_last(const meta_layout *l)
{
  return l->ndim == 4 && strides_look_like(l, order_cl, 4);
}

bool meta_strides_look_channels_last_3d(const meta_layout *l)
{
  return l->ndim == 5 && strides_look_like(l, order_cl3d, 5);
}

tport_memory_format meta_suggest_memory_format(const meta_layout *l)
{
  if (meta_strides_look_channels_last(l))
    return TPORT_MF_CHANNELS_LAST;
  if (meta_strides_look_channels_last_3d(l))
    return TPORT_MF_CHANNELS_LAST_3D;
  return TPORT_MF_CONTIGUOUS;
}

tport_memory_format meta_actual_memory_format(const meta_layout *l)
{
  if (meta_is_contiguous(l))
    return TPORT_MF_CONTIGUOUS;
  if (meta_is_channels_last_contiguous(l))
    return TPORT_MF_CHANNELS_LAST;
  if (meta_is_channels_last_3d_contiguous(l))
    return TPORT_MF_CHANNELS_LAST_3D;
  return TPORT_MF_NONE;
}

meta_overlap meta_internal_overlap(const meta_layout *l)
{
  if (meta_is_non_overlapping_and_dense(l))
    return META_OVERLAP_NO;
  for (int d = 0; d < l->ndim; d++)
    if (l->strides[d] == 0 && l->sizes[d] > 1)
      return META_OVERLAP_YES;
  return META_OVERLAP_TOO_HARD;
}

int meta_fresh_strides(int ndim, const int64_t *s, tport_memory_format fmt, int64_t *st,
                       tport_err *err)
{
  switch (fmt) {
  case TPORT_MF_CONTIGUOUS:
    if (ndim > 0) {
      st[ndim - 1] = 1;
      for (int i = ndim - 2; i >= 0; i--)
        st[i] = st[i + 1] * (s[i + 1] > 1 ? s[i + 1] : 1);
    }
    return TPORT_OK;
  case TPORT_MF_CHANNELS_LAST:
    if (ndim != 4)
      return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                           "required rank 4 tensor to use channels_last format");
    st[1] = 1;
    st[3] = s[1];
    st[2] = st[3] * s[3];
    st[0] = st[2] * s[2];
    return TPORT_OK;
  case TPORT_MF_CHANNELS_LAST_3D:
    if (ndim != 5)
      return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                           "required rank 5 tensor to use channels_last_3d format");
    st[1] = 1;
    st[4] = s[1];
    st[3] = st[4] * s[4];
    st[2] = st[3] * s[3];
    st[0] = st[2] * s[2];
    return TPORT_OK;
  case TPORT_MF_PRESERVE:
  case TPORT_MF_NONE: break;
  }
  return tport_err_set(err, TPORT_INVALID_ARGUMENT, "memory_format %d cannot give fresh strides",
                       (int)fmt);
}

void meta_infer_dense_strides(int n, const int64_t *sizes, const int64_t *strides, int64_t *out)
{
  int perm[TPORT_MAX_DIMS];
  for (int i = 0; i < n; i++)
    perm[i] = n - 1 - i;
  for (int i = 1; i < n; i++) {
    int dim1 = i;
    for (int dim0 = i - 1; dim0 >= 0; dim0--) {
      int a = perm[dim0], b = perm[dim1], c;
      int64_t s0 = strides[a], s1 = strides[b];
      if (s0 == 0 || s1 == 0)
        c = 0;
      else if (s0 < s1)
        c = -1;
      else if (s0 > s1)
        c = 1;
      else
        c = sizes[a] > sizes[b] ? 1 : 0;
      if (c > 0) {
        perm[dim0] = b;
        perm[dim1] = a;
        dim1 = dim0;
      } else if (c < 0) {
        break;
      }
    }
  }
  int64_t s = 1;
  for (int i = 0; i < n; i++) {
    int idx = perm[i];
    out[idx] = s;
    if (sizes[idx] > 1)
      s *= sizes[idx];
  }
}

int64_t meta_span_elements(const meta_layout *l)
{
  /* an empty tensor spans nothing, whatever its other dims (whose strides
   * are not bounded by any extent: validate.h) */
  for (int d = 0; d < l->ndim; d++)
    if (l->sizes[d] == 0)
      return 0;
  int64_t last = 0;
  for (int d = 0; d < l->ndim; d++)
    last += (l->sizes[d] - 1) * l->strides[d];
  return last + 1;
}

bool meta_same_sizes(const meta_layout *a, const meta_layout *b)
{
  if (a->ndim != b->ndim)
    return false;
  for (int d = 0; d < a->ndim; d++)
    if (a->sizes[d] != b->sizes[d])
      return false;
  return true;
}

const char *meta_format_dims(char *buf, size_t len, int ndim, const int64_t *v)
{
  size_t used = 0;
  int w = snprintf(buf, len, "[");
  used = w > 0 ? (size_t)w : 0;
  for (int d = 0; d < ndim && used < len; d++) {
    w = snprintf(buf + used, len - used, d ? ", %lld" : "%lld", (long long)v[d]);
    if (w < 0)
      break;
    used += (size_t)w;
  }
  if (used < len)
    snprintf(buf + used, len - used, "]");
  return buf;
}
