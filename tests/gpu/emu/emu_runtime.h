/*
 * emu_runtime.h: what the emulation suite sets in and reads from the
 * emulated CUDA runtime (cudart_emu.c, linked into the test) and the
 * emulated NVRTC (nvrtc_emu.c, libtport_nvrtc_emu.so, which engine/cuda/cuda_jit.c
 * opens with dlopen: a test reaches its functions through dlsym).
 */
#ifndef TPORT_EMU_RUNTIME_H
#define TPORT_EMU_RUNTIME_H

#include "emu_sched.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the emulated device (cudart_emu.c) */
typedef struct emu_device {
  int count; /* devices 0..count-1, all alike */
  int cc_major, cc_minor;
  unsigned max_grid[3]; /* cudaDevAttrMaxGridDimX/Y/Z */
} emu_device;

/* NULL: the default, one device of compute capability 9.0 with a real
 * device's grid limits (2^31-1, 65535, 65535). */
void emu_device_set(const emu_device *d);
void emu_device_get(emu_device *out);

typedef struct emu_cudart_stats {
  unsigned long long loads, load_failures, unloads, live_libraries;
  /* cubins compiled so that the device's arithmetic differs from the host's
   * the emulation runs (--fmad=true, NVRTC's default; --ftz=true;
   * --use_fast_math): their bits could differ on a GPU where here they match */
  unsigned long long loads_not_bit_exact;
  unsigned long long launches, launch_failures;
  /* the last launch that ran */
  char kernel[32];
  int dst, src, idx_bits;
  unsigned grid[3], block[3];
} emu_cudart_stats;
void emu_cudart_get_stats(emu_cudart_stats *out);
/* Why the last failing call of the emulated runtime failed (its error codes
 * say less), "" when none has. */
const char *emu_cudart_last_message(void);

/* A launch of one variant without a library, checked exactly as
 * cudaLaunchKernel checks one against the emulated device (the test of the
 * narrow-index edge runs the unsigned short variants, which NVRTC is never
 * asked for).  Returns a cudaError_t as an int. */
int emu_launch_direct(const emu_kernel *k, emu_dim3 grid, emu_dim3 block, void **args);

/* ---- the emulated NVRTC (nvrtc_emu.c) */
typedef struct emu_nvrtc_stats {
  unsigned long long creates, destroys, compiles, failed_compiles;
  char last_options[512]; /* of the last compile, joined by spaces */
} emu_nvrtc_stats;
void emu_nvrtc_get_stats(emu_nvrtc_stats *out);
/* Each compile sleeps this long (to test waiting for a compile in progress). */
void emu_nvrtc_set_delay_ms(int ms);
/* The next n compiles that would succeed fail with NVRTC_ERROR_COMPILATION. */
void emu_nvrtc_fail_compiles(int n);

#ifdef __cplusplus
}
#endif

#endif
