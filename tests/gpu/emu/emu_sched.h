/*
 * emu_sched.h: the host side of the kernel emulation (emu_sched.cpp), in C
 * for the runtime emulation and the tests: the table of kernel variants that
 * variant.cpp fills (one per dtype pair, index width and kernel of
 * kernels/cuda/copy.cu) and the block scheduler that runs one launch.
 */
#ifndef TPORT_EMU_SCHED_H
#define TPORT_EMU_SCHED_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct emu_dim3 {
  unsigned x, y, z;
} emu_dim3;

/* What the scheduler sets for the running thread (emu.h reads them). */
extern emu_dim3 emu_block_idx, emu_thread_idx, emu_block_dim, emu_grid_dim;
/* Suspends the calling thread of the block until all of them have called it. */
void emu_syncthreads(void);

/* A kernel's entry as a launch calls it: args[0] points to its struct Params. */
typedef void (*emu_kernel_fn)(void **args);

typedef struct emu_kernel {
  int dst, src;     /* tport_dtype numbers */
  int idx_bits;     /* TPORT_IDX: 16 (unsigned short), 32 or 64 */
  const char *name; /* "tport_copy", "tport_transpose", "tport_cast_vec" */
  emu_kernel_fn fn;
} emu_kernel;

/* Called by each variant's static constructor (before main). */
void emu_register_kernel(int dst, int src, int idx_bits, const char *name, emu_kernel_fn fn);
/* The registered kernel, or NULL (no such variant was built). */
const emu_kernel *emu_find_kernel(int dst, int src, int idx_bits, const char *name);

typedef enum emu_status {
  EMU_OK = 0,
  EMU_BAD_CONFIG = 1,        /* a zero or too large dimension, more than 1024 threads */
  EMU_DIVERGENT_BARRIER = 2, /* threads of one block reached different numbers of barriers */
} emu_status;

/* Runs the whole grid on the calling thread and returns when every block is
 * done.  Launches are serialized (the dims are globals).  A launch that runs
 * longer than the watchdog's limit aborts the process with a message naming
 * the kernel: a grid-stride loop that never ends (an index that wraps) must
 * fail the test rather than hang it.  The message of a failure is kept for
 * emu_last_error(). */
emu_status emu_run(const emu_kernel *k, emu_dim3 grid, emu_dim3 block, void **args);
const char *emu_last_error(void);

/* Seconds one launch may run (default 20, or $TPORT_EMU_LAUNCH_SECONDS). */
void emu_set_watchdog(double seconds);

typedef struct emu_sched_stats {
  unsigned long long launches, blocks, threads, barriers;
} emu_sched_stats;
void emu_get_sched_stats(emu_sched_stats *out);

#ifdef __cplusplus
}
#endif

#endif
