/*
 * cuda_rt.c: the CUDA runtime, loaded with dlopen() when a client first
 * hands libtport device memory (cuda_rt.h).
 *
 * The library is never linked: a host-only client needs no toolkit and no
 * driver, and one that never touches device memory never loads it.  The
 * table is filled once per process (under a mutex; a failure is kept, with
 * its message, so every later device call answers at once and the same).
 * Where the toolkit's headers are present (TPORT_CUDART_HEADERS) the
 * signatures and the types declared in cuda_rt.h are checked at compile
 * time against cuda_runtime_api.h.
 */
#include "cuda_rt.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef TPORT_CUDART_HEADERS
#include <cuda_runtime_api.h>
#include <stddef.h>
#define SAME_TYPE(fn, type)                                                                        \
  _Static_assert(__builtin_types_compatible_p(__typeof__(&fn), type),                              \
                 #fn " does not have the signature cuda_rt.h assumes")
SAME_TYPE(cudaPointerGetAttributes, cudaError_t (*)(struct cudaPointerAttributes *, const void *));
SAME_TYPE(cudaGetDevice, cudaError_t (*)(int *));
SAME_TYPE(cudaSetDevice, cudaError_t (*)(int));
SAME_TYPE(cudaMemcpyAsync,
          cudaError_t (*)(void *, const void *, size_t, enum cudaMemcpyKind, cudaStream_t));
SAME_TYPE(cudaStreamCreateWithFlags, cudaError_t (*)(cudaStream_t *, unsigned int));
SAME_TYPE(cudaStreamSynchronize, cudaError_t (*)(cudaStream_t));
SAME_TYPE(cudaStreamDestroy, cudaError_t (*)(cudaStream_t));
SAME_TYPE(cudaEventCreateWithFlags, cudaError_t (*)(cudaEvent_t *, unsigned int));
SAME_TYPE(cudaEventRecord, cudaError_t (*)(cudaEvent_t, cudaStream_t));
SAME_TYPE(cudaEventSynchronize, cudaError_t (*)(cudaEvent_t));
SAME_TYPE(cudaEventDestroy, cudaError_t (*)(cudaEvent_t));
SAME_TYPE(cudaHostAlloc, cudaError_t (*)(void **, size_t, unsigned int));
SAME_TYPE(cudaFreeHost, cudaError_t (*)(void *));
SAME_TYPE(cudaGetErrorString, const char *(*)(cudaError_t));
SAME_TYPE(cudaIpcGetMemHandle, cudaError_t (*)(cudaIpcMemHandle_t *, void *));
SAME_TYPE(cudaGetDriverEntryPointByVersion,
          cudaError_t (*)(const char *, void **, unsigned int, unsigned long long,
                          enum cudaDriverEntryPointQueryResult *));
_Static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(cuda_rt_ipc_handle), "cudaIpcMemHandle_t");
/* the types cuda_rt.h declares in the runtime's stead */
_Static_assert(sizeof(cudaError_t) == sizeof(cuda_rt_status), "cudaError_t is not int-sized");
_Static_assert(sizeof(enum cudaMemcpyKind) == sizeof(int), "cudaMemcpyKind is not int-sized");
_Static_assert(__builtin_types_compatible_p(cudaStream_t, cuda_rt_stream), "cudaStream_t");
_Static_assert(__builtin_types_compatible_p(cudaEvent_t, cuda_rt_event), "cudaEvent_t");
_Static_assert((int)cudaMemcpyHostToDevice == (int)CUDA_RT_MEMCPY_H2D, "cudaMemcpyHostToDevice");
_Static_assert((int)cudaMemcpyDeviceToHost == (int)CUDA_RT_MEMCPY_D2H, "cudaMemcpyDeviceToHost");
_Static_assert((int)cudaMemoryTypeHost == (int)CUDA_RT_MEMORY_HOST, "cudaMemoryTypeHost");
_Static_assert((int)cudaMemoryTypeDevice == (int)CUDA_RT_MEMORY_DEVICE, "cudaMemoryTypeDevice");
_Static_assert((int)cudaMemoryTypeManaged == (int)CUDA_RT_MEMORY_MANAGED, "cudaMemoryTypeManaged");
_Static_assert(cudaHostAllocPortable == CUDA_RT_HOST_ALLOC_PORTABLE, "cudaHostAllocPortable");
_Static_assert(cudaEventDisableTiming == CUDA_RT_EVENT_DISABLE_TIMING, "cudaEventDisableTiming");
_Static_assert(cudaStreamDefault == CUDA_RT_STREAM_DEFAULT, "cudaStreamDefault");
_Static_assert(offsetof(struct cudaPointerAttributes, type) ==
                       offsetof(cuda_rt_pointer_attributes, type) &&
                   offsetof(struct cudaPointerAttributes, device) ==
                       offsetof(cuda_rt_pointer_attributes, device) &&
                   offsetof(struct cudaPointerAttributes, devicePointer) ==
                       offsetof(cuda_rt_pointer_attributes, device_pointer) &&
                   offsetof(struct cudaPointerAttributes, hostPointer) ==
                       offsetof(cuda_rt_pointer_attributes, host_pointer),
               "cudaPointerAttributes' fields moved");
_Static_assert(sizeof(struct cudaPointerAttributes) <= sizeof(cuda_rt_pointer_attributes),
               "cudaPointerAttributes grew past cuda_rt_pointer_attributes");
#endif

static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
static int load_state; /* 0: not tried, 1: loaded, -1: failed (load_err says why) */
static cuda_rt rt_table;
static tport_err load_err;

/* Resolves every call of the table in lib; the first one missing fails. */
static int resolve(void *lib, cuda_rt *t, tport_err *err)
{
  struct {
    const char *name;
    void **slot;
  } calls[] = {
      {"cudaPointerGetAttributes", (void **)&t->pointer_get_attributes},
      {"cudaGetDevice", (void **)&t->get_device},
      {"cudaSetDevice", (void **)&t->set_device},
      {"cudaMemcpyAsync", (void **)&t->memcpy_async},
      {"cudaStreamCreateWithFlags", (void **)&t->stream_create_with_flags},
      {"cudaStreamSynchronize", (void **)&t->stream_synchronize},
      {"cudaStreamDestroy", (void **)&t->stream_destroy},
      {"cudaEventCreateWithFlags", (void **)&t->event_create_with_flags},
      {"cudaEventRecord", (void **)&t->event_record},
      {"cudaEventSynchronize", (void **)&t->event_synchronize},
      {"cudaEventDestroy", (void **)&t->event_destroy},
      {"cudaHostAlloc", (void **)&t->host_alloc},
      {"cudaFreeHost", (void **)&t->free_host},
      {"cudaGetErrorString", (void **)&t->get_error_string},
  };
  /* optional: without them, no same-host IPC */
  void *opt = dlsym(lib, "cudaIpcGetMemHandle");
  memcpy(&t->ipc_get_mem_handle, &opt, sizeof opt);
  opt = dlsym(lib, "cudaGetDriverEntryPointByVersion");
  memcpy(&t->get_driver_entry_point, &opt, sizeof opt);
  for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
    dlerror();
    void *p = dlsym(lib, calls[i].name);
    if (!p) {
      const char *why = dlerror();
      return tport_err_set(err, TPORT_FAILED_PRECONDITION,
                           "the CUDA runtime %s lacks %s (%s): device memory cannot be moved",
                           t->path, calls[i].name, why ? why : "no such symbol");
    }
    /* POSIX: a function's address and a data pointer convert both ways */
    memcpy(calls[i].slot, &p, sizeof p);
  }
  return TPORT_OK;
}

static int load_locked(tport_err *err)
{
  const char *env = getenv("TPORT_CUDART_LIBRARY");
  const char *names[2] = {"libcudart.so.13", "libcudart.so.12"};
  int n = 2;
  if (env && env[0]) {
    names[0] = env;
    n = 1;
  }
  char tried[TPORT_ERR_MSG_MAX] = "";
  size_t used = 0;
  for (int i = 0; i < n; i++) {
    /* RTLD_LOCAL: its symbols stay out of the application's namespace */
    void *lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char *why = dlerror();
      int w = snprintf(tried + used, sizeof tried - used, "%s%s", used ? "; " : "",
                       why ? why : names[i]);
      if (w > 0)
        used = used + (size_t)w < sizeof tried ? used + (size_t)w : sizeof tried - 1;
      continue;
    }
    snprintf(rt_table.path, sizeof rt_table.path, "%s", names[i]);
    int rc = resolve(lib, &rt_table, err);
    if (rc) {
      dlclose(lib);
      return rc;
    }
    return TPORT_OK; /* never closed: the table points into it */
  }
  return tport_err_set(
      err, TPORT_FAILED_PRECONDITION, "device memory needs the CUDA runtime (%s%s): %s",
      n == 1 ? "TPORT_CUDART_LIBRARY=" : "libcudart.so.13 or .12", n == 1 ? names[0] : "", tried);
}

int cuda_rt_load(const cuda_rt **out, tport_err *err)
{
  pthread_mutex_lock(&load_mu);
  if (load_state == 0)
    load_state = load_locked(&load_err) == TPORT_OK ? 1 : -1;
  int state = load_state;
  pthread_mutex_unlock(&load_mu);
  if (state < 0) {
    if (err)
      *err = load_err;
    return load_err.code;
  }
  *out = &rt_table;
  return TPORT_OK;
}

int cuda_rt_fail(const cuda_rt *rt, cuda_rt_status st, int code, const char *what, tport_err *err)
{
  const char *s = rt->get_error_string ? rt->get_error_string(st) : NULL;
  return tport_err_set(err, code, "%s: %s (cudaError %d)", what, s ? s : "unknown error", st);
}
