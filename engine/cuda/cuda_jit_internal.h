/* cuda_jit_internal.h: what cuda_jit.c (compiles and caches the kernels)
 * and cuda_launch.c (launches them) share. */
#ifndef TPORT_CUDA_JIT_INTERNAL_H
#define TPORT_CUDA_JIT_INTERNAL_H

#include "cuda_jit.h"

/* The kernels' names in copy.cu, by cuda_jit_kernel. */
extern const char *const cuda_jit_kernel_names[CUDA_JIT_NUM_KERNELS];
/* A dtype the kernels know. */
bool cuda_jit_dtype_ok(tport_dtype t);
/* The kernel `which` for (dt, st, wide, cc): from memory, else compiled (or
 * read from disk) by this thread while others wait only if they want the
 * same entry. */
int cuda_jit_get_kernel(int cc, int dt, int st, int wide, cuda_jit_kernel which, cudaKernel_t *out,
                        tport_err *err);
/* Forgets the device limits read (cuda_jit_reset). */
void cuda_jit_forget_devices(void);

#endif
