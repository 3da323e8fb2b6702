/*
 * emu.h: just enough of CUDA's device language for kernels/cuda/copy.cu to
 * compile as host C++ (g++ -std=c++17 -ffp-contract=off -fno-fast-math), so
 * that the real kernel source runs on the CPU, under AddressSanitizer too,
 * with the launch parameters engine/cuda/cuda_jit.c chooses (issue 13).
 *
 * What it models:
 *   - __global__, __device__, __host__ vanish; __shared__ is a function-local
 *     static, one copy that every thread of the running block sees;
 *   - blockIdx, threadIdx, blockDim, gridDim are read-only views of globals
 *     that the scheduler (emu_sched.cpp) sets before it resumes a thread;
 *   - the threads of a block are cooperative fibers, each on its own stack;
 *     __syncthreads() is an out-of-line call that suspends the thread until
 *     every thread of the block has reached it (a barrier), and, being opaque
 *     to the compiler (another translation unit: no LTO here), makes the
 *     kernel reload threadIdx and the rest after it.  Threads run one at a
 *     time, in index order in even blocks and in reverse order in odd ones,
 *     so a read of another thread's shared-memory write without a barrier
 *     between gives different results across blocks.  A block whose threads
 *     reach different numbers of barriers is an error;
 *   - blocks run one after another, x fastest, then y, then z;
 *   - __uint_as_float / __float_as_uint / __double_as_longlong /
 *     __longlong_as_double are bit casts; fabsf is the host's;
 *     "#pragma unroll" is ignored (-Wno-unknown-pragmas).
 *
 * What it does not model:
 *   - warps: no lockstep execution, no warp shuffles or votes, no divergence
 *     cost; a kernel that relies on implicit warp synchrony passes here;
 *   - memory ordering across blocks or between threads of a block other than
 *     through __syncthreads: every access is immediately visible, so a race
 *     that a GPU could lose shows only as the order dependence above;
 *   - atomics, dynamic shared memory, streams and concurrency: a launch runs
 *     to completion before cudaLaunchKernel returns;
 *   - timing, occupancy, registers, shared-memory size limits and bank
 *     conflicts;
 *   - the device's arithmetic where it differs from the host's: both are IEEE
 *     754 with round-to-nearest-even (and copy.cu rounds float16/bfloat16
 *     with integer operations), but here NaN payloads propagate as x86-64
 *     propagates them where a GPU may give its canonical NaN, subnormals are
 *     never flushed (a cubin built with --ftz=true is counted by the runtime
 *     emulation as not bit-exact), and nothing is contracted into fused
 *     multiply-adds, as NVRTC's --fmad=false makes it on the device;
 *   - uninitialized shared memory: it holds the previous block's values
 *     (zero at first), not garbage.
 */
#ifndef TPORT_EMU_H
#define TPORT_EMU_H

#include "emu_sched.h"

#define __global__
#define __device__
#define __launch_bounds__(...)
#define __host__
#define __forceinline__ inline
#define __shared__ static

/* Read-only, as on the device: the kernel cannot assign to them. */
#define blockIdx (static_cast<const emu_dim3 &>(emu_block_idx))
#define threadIdx (static_cast<const emu_dim3 &>(emu_thread_idx))
#define blockDim (static_cast<const emu_dim3 &>(emu_block_dim))
#define gridDim (static_cast<const emu_dim3 &>(emu_grid_dim))
#define __syncthreads() emu_syncthreads()

// Builtins rather than <math.h> and <string.h>: C++'s <math.h> alone is half
// the time of compiling a variant, and the build compiles hundreds.
static inline float emu_uint_as_float(unsigned u)
{
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}
static inline unsigned emu_float_as_uint(float f)
{
  unsigned u;
  __builtin_memcpy(&u, &f, sizeof u);
  return u;
}
static inline double emu_longlong_as_double(long long u)
{
  double f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}
static inline long long emu_double_as_longlong(double f)
{
  long long u;
  __builtin_memcpy(&u, &f, sizeof u);
  return u;
}
#define __uint_as_float emu_uint_as_float
#define __float_as_uint emu_float_as_uint
#define __longlong_as_double emu_longlong_as_double
#define __double_as_longlong emu_double_as_longlong
#define fabsf __builtin_fabsf

#endif
