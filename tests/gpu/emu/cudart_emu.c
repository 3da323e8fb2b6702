/*
 * cudart_emu.c: the CUDA runtime calls engine/cuda/cuda_jit.c makes, with the
 * runtime's own names and signatures (cuda_runtime_api.h), answered on the
 * host.  The emulation suite links this file instead of cudart_static.
 *
 * A "library" is an emu_cubin (emu_cubin.h) that names a variant the build
 * compiled; loading checks it as the driver checks a cubin (the format, the
 * architecture against the device, and here also that it was compiled from
 * the copy.cu this build embeds).  A launch is checked as CUDA checks one
 * (a live kernel handle, at most 1024 threads per block, the grid within
 * the device's limits) and then runs to completion on the calling thread
 * (emu_sched.h): the stream is ignored, and the data are where the kernel's
 * pointers say, in host memory.
 */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "copy_cu_src.h" /* tport_copy_cu_src: the source the variants were built from */
#include "emu_cubin.h"
#include "emu_runtime.h"

#define NUM_KERNELS 3
static const char *const kernel_names[NUM_KERNELS] = {"tport_copy", "tport_transpose",
                                                      "tport_cast_vec"};

struct CUlib_st;
struct CUkern_st {
  const emu_kernel *k;
  struct CUlib_st *lib;
};
struct CUlib_st {
  emu_cubin cubin;
  struct CUkern_st kernels[NUM_KERNELS];
  struct CUlib_st *next;
};

static struct {
  pthread_mutex_t mu;
  emu_device dev;
  struct CUlib_st *libs; /* the loaded ones: a handle not here is not valid */
  emu_cudart_stats st;
  char msg[256];
} rt = {
    .mu = PTHREAD_MUTEX_INITIALIZER,
    .dev = {.count = 1, .cc_major = 9, .cc_minor = 0, .max_grid = {2147483647u, 65535, 65535}},
};

static _Thread_local cudaError_t last_error = cudaSuccess;

/* Records why a call failed; called with rt.mu held. */
static cudaError_t failed(cudaError_t e, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(rt.msg, sizeof rt.msg, fmt, ap);
  va_end(ap);
  last_error = e;
  return e;
}

void emu_device_set(const emu_device *d)
{
  static const emu_device def = {1, 9, 0, {2147483647u, 65535, 65535}};
  pthread_mutex_lock(&rt.mu);
  rt.dev = d ? *d : def;
  pthread_mutex_unlock(&rt.mu);
}

void emu_device_get(emu_device *out)
{
  pthread_mutex_lock(&rt.mu);
  *out = rt.dev;
  pthread_mutex_unlock(&rt.mu);
}

void emu_cudart_get_stats(emu_cudart_stats *out)
{
  pthread_mutex_lock(&rt.mu);
  *out = rt.st;
  pthread_mutex_unlock(&rt.mu);
}

const char *emu_cudart_last_message(void)
{
  return rt.msg;
}

cudaError_t cudaGetLastError(void)
{
  cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void)
{
  return last_error;
}

const char *cudaGetErrorName(cudaError_t e)
{
  switch (e) {
  case cudaSuccess: return "cudaSuccess";
  case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
  case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
  case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
  case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
  case cudaErrorInvalidKernelImage: return "cudaErrorInvalidKernelImage";
  case cudaErrorNoKernelImageForDevice: return "cudaErrorNoKernelImageForDevice";
  case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
  case cudaErrorSymbolNotFound: return "cudaErrorSymbolNotFound";
  case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  default: return "cudaErrorUnknown";
  }
}

/* The runtime's own strings for the codes the emulation returns. */
const char *cudaGetErrorString(cudaError_t e)
{
  switch (e) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorInvalidConfiguration: return "invalid configuration argument";
  case cudaErrorInvalidDeviceFunction: return "invalid device function";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorInvalidKernelImage: return "device kernel image is invalid";
  case cudaErrorNoKernelImageForDevice:
    return "no kernel image is available for execution on the device";
  case cudaErrorInvalidResourceHandle: return "invalid resource handle";
  case cudaErrorSymbolNotFound: return "named symbol not found";
  case cudaErrorLaunchFailure: return "unspecified launch failure";
  default: return "unknown error";
  }
}

cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
  pthread_mutex_lock(&rt.mu);
  cudaError_t e = cudaSuccess;
  if (!value)
    e = failed(cudaErrorInvalidValue, "cudaDeviceGetAttribute: value is NULL");
  else if (device < 0 || device >= rt.dev.count)
    e = failed(cudaErrorInvalidDevice, "cudaDeviceGetAttribute: no device %d", device);
  else
    switch (attr) {
    case cudaDevAttrComputeCapabilityMajor: *value = rt.dev.cc_major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = rt.dev.cc_minor; break;
    case cudaDevAttrMaxGridDimX: *value = (int)rt.dev.max_grid[0]; break;
    case cudaDevAttrMaxGridDimY: *value = (int)rt.dev.max_grid[1]; break;
    case cudaDevAttrMaxGridDimZ: *value = (int)rt.dev.max_grid[2]; break;
    case cudaDevAttrMaxBlockDimX:
    case cudaDevAttrMaxBlockDimY:
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *value = 64; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = 132; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 << 10; break;
    default:
      /* a new query of cuda_jit.c shows here, to be emulated */
      e = failed(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute %d is not emulated",
                 (int)attr);
    }
  pthread_mutex_unlock(&rt.mu);
  return e;
}

/* Whether a cubin for sm_<arch><suffix> runs on the device: the same major
 * version and a minor at least the cubin's; an 'a' cubin only on its own
 * version (the driver's rules for cubins, no PTX to JIT here). */
static bool arch_runs_on_device(int arch, char suffix)
{
  int major = arch / 10, minor = arch % 10;
  if (major != rt.dev.cc_major)
    return false;
  return suffix == 'a' ? minor == rt.dev.cc_minor : minor <= rt.dev.cc_minor;
}

cudaError_t cudaLibraryLoadData(cudaLibrary_t *library, const void *code,
                                enum cudaJitOption *jit_options, void **jit_values,
                                unsigned int num_jit_options,
                                enum cudaLibraryOption *library_options, void **library_values,
                                unsigned int num_library_options)
{
  pthread_mutex_lock(&rt.mu);
  cudaError_t e = cudaSuccess;
  emu_cubin cb;
  if (!library || !code) {
    e = failed(cudaErrorInvalidValue, "cudaLibraryLoadData: library or code is NULL");
    goto out;
  }
  /* the magic byte by byte: a short garbage file is refused before its end */
  for (size_t i = 0; i < sizeof cb.magic; i++)
    if (((const char *)code)[i] != EMU_CUBIN_MAGIC[i]) {
      e = failed(cudaErrorInvalidKernelImage, "cudaLibraryLoadData: not an emulated cubin");
      goto out;
    }
  memcpy(&cb, code, sizeof cb);
  if (cb.check != emu_cubin_check(&cb)) {
    e = failed(cudaErrorInvalidKernelImage, "cudaLibraryLoadData: the cubin is corrupt");
    goto out;
  }
  if (cb.source_hash != emu_fnv1a(tport_copy_cu_src, strlen(tport_copy_cu_src))) {
    e = failed(cudaErrorInvalidKernelImage,
               "cudaLibraryLoadData: compiled from another source than kernels/cuda/copy.cu");
    goto out;
  }
  if (!arch_runs_on_device(cb.arch, cb.arch_suffix)) {
    e = failed(cudaErrorNoKernelImageForDevice,
               "cudaLibraryLoadData: a cubin for sm_%d%c on a device of compute capability %d.%d",
               cb.arch, cb.arch_suffix ? cb.arch_suffix : ' ', rt.dev.cc_major, rt.dev.cc_minor);
    goto out;
  }
  struct CUlib_st *lib = calloc(1, sizeof *lib);
  if (!lib) {
    e = failed(cudaErrorMemoryAllocation, "cudaLibraryLoadData: out of memory");
    goto out;
  }
  lib->cubin = cb;
  for (int i = 0; i < NUM_KERNELS; i++) {
    lib->kernels[i].lib = lib;
    lib->kernels[i].k = emu_find_kernel(cb.dst, cb.src, cb.idx_bits, kernel_names[i]);
    if (!lib->kernels[i].k) {
      free(lib);
      e = failed(cudaErrorInvalidKernelImage,
                 "cudaLibraryLoadData: no variant %s %d <- %d (%d-bit)", kernel_names[i], cb.dst,
                 cb.src, cb.idx_bits);
      goto out;
    }
  }
  lib->next = rt.libs;
  rt.libs = lib;
  rt.st.loads++;
  rt.st.live_libraries++;
  rt.st.loads_not_bit_exact += cb.fmad || cb.ftz || cb.fast_math;
  *library = lib;
out:
  if (e != cudaSuccess)
    rt.st.load_failures++;
  pthread_mutex_unlock(&rt.mu);
  return e;
}

static bool lib_is_live(const struct CUlib_st *lib)
{
  for (const struct CUlib_st *l = rt.libs; l; l = l->next)
    if (l == lib)
      return true;
  return false;
}

cudaError_t cudaLibraryGetKernel(cudaKernel_t *kernel, cudaLibrary_t library, const char *name)
{
  pthread_mutex_lock(&rt.mu);
  cudaError_t e = cudaErrorSymbolNotFound;
  if (!kernel || !name)
    e = failed(cudaErrorInvalidValue, "cudaLibraryGetKernel: kernel or name is NULL");
  else if (!lib_is_live(library))
    e = failed(cudaErrorInvalidResourceHandle, "cudaLibraryGetKernel: library %p is not loaded",
               (void *)library);
  else {
    for (int i = 0; i < NUM_KERNELS; i++)
      if (!strcmp(name, kernel_names[i])) {
        *kernel = &library->kernels[i];
        e = cudaSuccess;
      }
    if (e != cudaSuccess)
      failed(e, "cudaLibraryGetKernel: no kernel %s", name);
  }
  pthread_mutex_unlock(&rt.mu);
  return e;
}

cudaError_t cudaLibraryUnload(cudaLibrary_t library)
{
  pthread_mutex_lock(&rt.mu);
  struct CUlib_st **l = &rt.libs;
  while (*l && *l != library)
    l = &(*l)->next;
  cudaError_t e = cudaSuccess;
  if (*l) {
    *l = library->next;
    free(library);
    rt.st.unloads++;
    rt.st.live_libraries--;
  } else {
    e = failed(cudaErrorInvalidResourceHandle, "cudaLibraryUnload: %p is not loaded",
               (void *)library);
  }
  pthread_mutex_unlock(&rt.mu);
  return e;
}

/* CUDA's checks of a launch configuration, against the emulated device. */
static cudaError_t check_config(const char *what, dim3 grid, dim3 block, void **args)
{
  unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
  if (!block.x || !block.y || !block.z || block.x > 1024 || block.y > 1024 || block.z > 64 ||
      threads > 1024)
    return failed(cudaErrorInvalidConfiguration, "%s: block (%u,%u,%u) is not a valid block", what,
                  block.x, block.y, block.z);
  if (!grid.x || !grid.y || !grid.z || grid.x > rt.dev.max_grid[0] || grid.y > rt.dev.max_grid[1] ||
      grid.z > rt.dev.max_grid[2])
    return failed(cudaErrorInvalidConfiguration,
                  "%s: grid (%u,%u,%u) is outside the device's (%u,%u,%u)", what, grid.x, grid.y,
                  grid.z, rt.dev.max_grid[0], rt.dev.max_grid[1], rt.dev.max_grid[2]);
  if (!args || !args[0])
    return failed(cudaErrorInvalidValue, "%s: no kernel arguments", what);
  return cudaSuccess;
}

/* Runs a checked launch; called with rt.mu held, which it releases. */
static cudaError_t run(const emu_kernel *k, dim3 grid, dim3 block, void **args)
{
  rt.st.launches++;
  snprintf(rt.st.kernel, sizeof rt.st.kernel, "%s", k->name);
  rt.st.dst = k->dst;
  rt.st.src = k->src;
  rt.st.idx_bits = k->idx_bits;
  unsigned g[3] = {grid.x, grid.y, grid.z}, b[3] = {block.x, block.y, block.z};
  memcpy(rt.st.grid, g, sizeof g);
  memcpy(rt.st.block, b, sizeof b);
  pthread_mutex_unlock(&rt.mu);
  emu_status s =
      emu_run(k, (emu_dim3){grid.x, grid.y, grid.z}, (emu_dim3){block.x, block.y, block.z}, args);
  if (s == EMU_OK)
    return cudaSuccess;
  pthread_mutex_lock(&rt.mu);
  rt.st.launch_failures++;
  cudaError_t e = failed(cudaErrorLaunchFailure, "%s", emu_last_error());
  pthread_mutex_unlock(&rt.mu);
  return e;
}

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args,
                             size_t shared_mem, cudaStream_t stream)
{
  pthread_mutex_lock(&rt.mu);
  const struct CUkern_st *kern = func;
  cudaError_t e = cudaSuccess;
  bool live = false;
  for (const struct CUlib_st *l = rt.libs; l && !live; l = l->next)
    for (int i = 0; i < NUM_KERNELS; i++)
      live |= kern == &l->kernels[i];
  if (!live)
    e = failed(cudaErrorInvalidDeviceFunction,
               "cudaLaunchKernel: %p is not a kernel of a loaded library", func);
  else if (shared_mem > (48 << 10))
    e = failed(cudaErrorInvalidValue, "cudaLaunchKernel: %zu bytes of shared memory", shared_mem);
  else
    e = check_config(kern->k->name, grid, block, args);
  if (e != cudaSuccess) {
    rt.st.launch_failures++;
    pthread_mutex_unlock(&rt.mu);
    return e;
  }
  return run(kern->k, grid, block, args);
}

int emu_launch_direct(const emu_kernel *k, emu_dim3 grid, emu_dim3 block, void **args)
{
  pthread_mutex_lock(&rt.mu);
  cudaError_t e = k ? check_config(k->name, (dim3){grid.x, grid.y, grid.z},
                                   (dim3){block.x, block.y, block.z}, args)
                    : failed(cudaErrorInvalidDeviceFunction, "emu_launch_direct: no kernel");
  if (e != cudaSuccess) {
    rt.st.launch_failures++;
    pthread_mutex_unlock(&rt.mu);
    return e;
  }
  return run(k, (dim3){grid.x, grid.y, grid.z}, (dim3){block.x, block.y, block.z}, args);
}
