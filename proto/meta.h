/*
 * meta.h: tensor metadata and the layout rules of SEMANTICS.md §1 and §2.
 *
 * A layout is sizes, strides (in elements) and a storage offset.  Everything
 * here is pure arithmetic on layouts; it assumes a layout that passed
 * validate.h (sizes >= 0, extents that fit in int64).
 */
#ifndef TPORT_META_H
#define TPORT_META_H

#include "tport_types.h"

typedef struct meta_layout {
  int ndim;
  int64_t sizes[TPORT_MAX_DIMS];
  int64_t strides[TPORT_MAX_DIMS]; /* elements */
  int64_t offset;                  /* storage offset, elements */
} meta_layout;

int64_t meta_numel(const meta_layout *l);

/* c10's compute_contiguous: 0 elements is contiguous; size-1 dims are skipped. */
bool meta_is_contiguous(const meta_layout *l);
/* NHWC walk over dims [1,3,2,0]; false unless 4-D. */
bool meta_is_channels_last_contiguous(const meta_layout *l);
/* NDHWC walk over dims [1,4,3,2,0]; false unless 5-D. */
bool meta_is_channels_last_3d_contiguous(const meta_layout *l);
/* is_contiguous(memory_format=fmt); NONE is always true, PRESERVE false. */
bool meta_is_contiguous_as(const meta_layout *l, tport_memory_format fmt);
/* Non-overlapping and dense (every element of a dense block used exactly once). */
bool meta_is_non_overlapping_and_dense(const meta_layout *l);
/* The heuristic behind suggest_memory_format (is_channels_last_strides_2d/3d). */
bool meta_strides_look_channels_last(const meta_layout *l);
bool meta_strides_look_channels_last_3d(const meta_layout *l);
/* suggest_memory_format(): ChannelsLast, ChannelsLast3d or Contiguous. */
tport_memory_format meta_suggest_memory_format(const meta_layout *l);
/* Exact format mode (seed 000): the format the tensor is contiguous in,
 * preferring contiguous, then channels_last, then channels_last_3d; NONE when
 * it is contiguous in no format. */
tport_memory_format meta_actual_memory_format(const meta_layout *l);

/* Internal overlap (at::has_internal_overlap): NO when non-overlapping and
 * dense, YES when a dim of size > 1 has stride 0, else TOO_HARD. */
typedef enum { META_OVERLAP_NO, META_OVERLAP_YES, META_OVERLAP_TOO_HARD } meta_overlap;
meta_overlap meta_internal_overlap(const meta_layout *l);

/* Strides of a fresh tensor in format fmt (CONTIGUOUS, CHANNELS_LAST (rank 4),
 * CHANNELS_LAST_3D (rank 5)).  PyTorch's error for a wrong rank. */
int meta_fresh_strides(int ndim, const int64_t *sizes, tport_memory_format fmt, int64_t *strides,
                       tport_err *err);
/* at::infer_dense_strides: dense strides that keep the input's memory order. */
void meta_infer_dense_strides(int ndim, const int64_t *sizes, const int64_t *strides, int64_t *out);

/* Largest element index reached, plus one (0 when numel is 0): the storage
 * elements a layout needs beyond its offset.  Assumes a validated layout. */
int64_t meta_span_elements(const meta_layout *l);

/* Same sizes (ndim included). */
bool meta_same_sizes(const meta_layout *a, const meta_layout *b);
/* Formats "[2, 3, 4]" into buf. */
const char *meta_format_dims(char *buf, size_t len, int ndim, const int64_t *v);

#endif
