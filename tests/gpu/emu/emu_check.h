/*
 * emu_check.h: the emulation suite's shared helpers: values worth converting
 * (emu_values.c) and one copy run through cuda_jit_copy on the emulated
 * device and through cpu_copy, compared bit for bit (emu_check.c).
 */
#ifndef TPORT_EMU_CHECK_H
#define TPORT_EMU_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cpu_kernels.h"
#include "cuda_jit.h"
#include "emu_runtime.h"

extern const char *const emu_dtype_name[TPORT_NUM_DTYPES];

/* Fills n elements of dtype dt: a deterministic mix (by seed and position)
 * of special values (NaN with payloads, +-inf, -0.0, subnormals, the
 * boundaries of every integer type and values just past them, halfway cases
 * of float16/bfloat16/float32 rounding), fractions, and random bit patterns. */
void emu_fill(void *buf, size_t n, tport_dtype dt, uint64_t seed);

/* A layout as a tensor lists it: dims outermost first, strides in elements
 * (0: broadcast), storage offsets in elements from a 64-byte aligned base. */
typedef struct emu_layout {
  const char *name;
  int ndim;
  int64_t shape[6], dst_stride[6], src_stride[6];
  int64_t dst_offset, src_offset;
  int expect; /* the cuda_jit_kernel it is meant to reach; -1: not checked */
} emu_layout;

/* One copy of layout l, dst dtype dt from src dtype st, through cuda_jit_copy
 * (device 0) and cpu_copy, each into its own copy of one dst buffer of
 * exactly the bytes the layout spans (so AddressSanitizer sees a kernel that
 * reaches past it), compared over the whole buffer: bytes the copy must not
 * touch included.  in_place: dst is src (dt == st, same strides).  Also
 * checks that the source is unchanged and that the kernel launched is
 * l->expect.  Returns true when all holds; else false with why in msg. */
bool emu_check_copy(const emu_layout *l, tport_dtype dt, tport_dtype st, unsigned flags,
                    bool in_place, uint64_t seed, char *msg, size_t n);

/* As emu_check_copy, but planned by cuda_jit_plan_launch with *lim and
 * launched directly (emu_launch_direct) with the variant of index width
 * bits: 0 for the planner's choice (64 when it says wide, else
 * lim->narrow_bits, which must then be 16 or 32).  *wide (may be NULL): the
 * planner's choice. */
bool emu_check_direct(const emu_layout *l, tport_dtype dt, tport_dtype st, unsigned flags,
                      bool in_place, uint64_t seed, const cuda_jit_limits *lim, int bits,
                      bool *wide, char *msg, size_t n);

/* The kernel launched last on the emulated device ("tport_copy"...), and how
 * many launches there have been. */
const char *emu_last_kernel(void);
unsigned long long emu_launch_count(void);

#endif
