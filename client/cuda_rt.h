/*
 * cuda_rt.h: the CUDA runtime as libtport sees it -- loaded with dlopen() the
 * first time a device pointer is handed to the library, never linked.
 *
 * libtport builds and runs without the CUDA toolkit: the few types it needs
 * are declared here (ABI-equal to cuda_runtime_api.h's; cuda_rt.c checks
 * them against the real header wherever the toolkit is present).  Which
 * library: $TPORT_CUDART_LIBRARY when set (a path, or a name for the dynamic
 * loader), else libcudart.so.13, then libcudart.so.12.
 */
#ifndef TPORT_CLIENT_CUDA_RT_H
#define TPORT_CLIENT_CUDA_RT_H

#include <stddef.h>

#include "tport.h"

typedef int cuda_rt_status;                 /* cudaError_t (an int-sized enum); 0 is cudaSuccess */
typedef struct CUstream_st *cuda_rt_stream; /* cudaStream_t */
typedef struct CUevent_st *cuda_rt_event;   /* cudaEvent_t */

/* cudaMemcpyKind */
enum { CUDA_RT_MEMCPY_H2D = 1, CUDA_RT_MEMCPY_D2H = 2 };
/* cudaMemoryType */
enum {
  CUDA_RT_MEMORY_UNREGISTERED = 0,
  CUDA_RT_MEMORY_HOST = 1,
  CUDA_RT_MEMORY_DEVICE = 2,
  CUDA_RT_MEMORY_MANAGED = 3
};
/* cudaHostAllocPortable, cudaEventDisableTiming, cudaStreamDefault */
#define CUDA_RT_HOST_ALLOC_PORTABLE 0x01u
#define CUDA_RT_EVENT_DISABLE_TIMING 0x02u
#define CUDA_RT_STREAM_DEFAULT 0x00u

/* struct cudaPointerAttributes: the four fields every runtime since CUDA 11
 * has, then room for what a newer one appends (CUDA 13: long reserved[8]),
 * so that a runtime newer than the header this was built against never
 * writes past it. */
typedef struct cuda_rt_pointer_attributes {
  int type; /* enum cudaMemoryType */
  int device;
  void *device_pointer;
  void *host_pointer;
  long reserved[32];
} cuda_rt_pointer_attributes;

/* cudaIpcMemHandle_t */
#define CUDA_RT_IPC_HANDLE_BYTES 64
typedef struct cuda_rt_ipc_handle {
  char reserved[CUDA_RT_IPC_HANDLE_BYTES];
} cuda_rt_ipc_handle;

/* The calls libtport makes, with the runtime's own signatures. */
typedef struct cuda_rt {
  char path[64]; /* the library loaded (as named to dlopen) */
  cuda_rt_status (*pointer_get_attributes)(cuda_rt_pointer_attributes *attr, const void *ptr);
  cuda_rt_status (*get_device)(int *device);
  cuda_rt_status (*set_device)(int device);
  cuda_rt_status (*memcpy_async)(void *dst, const void *src, size_t count, int kind,
                                 cuda_rt_stream stream);
  cuda_rt_status (*stream_create_with_flags)(cuda_rt_stream *stream, unsigned flags);
  cuda_rt_status (*stream_synchronize)(cuda_rt_stream stream);
  cuda_rt_status (*stream_destroy)(cuda_rt_stream stream);
  cuda_rt_status (*event_create_with_flags)(cuda_rt_event *event, unsigned flags);
  cuda_rt_status (*event_record)(cuda_rt_event event, cuda_rt_stream stream);
  cuda_rt_status (*event_synchronize)(cuda_rt_event event);
  cuda_rt_status (*event_destroy)(cuda_rt_event event);
  cuda_rt_status (*host_alloc)(void **ptr, size_t size, unsigned flags);
  cuda_rt_status (*free_host)(void *ptr);
  const char *(*get_error_string)(cuda_rt_status error);
  /* Optional (NULL where the runtime lacks them: same-host GPU memory is
   * then staged as for a remote server): cudaIpcGetMemHandle and
   * cudaGetDriverEntryPointByVersion (the driver's calls of cuda_ipc.c,
   * without linking libcuda; its last argument is an enum's address). */
  cuda_rt_status (*ipc_get_mem_handle)(cuda_rt_ipc_handle *handle, void *dev_ptr);
  cuda_rt_status (*get_driver_entry_point)(const char *symbol, void **fn, unsigned int version,
                                           unsigned long long flags, void *status);
} cuda_rt;

/* The runtime, loaded on the first call (once per process, thread-safe):
 * TPORT_FAILED_PRECONDITION naming the libraries tried and dlerror() when
 * none loads or one lacks a call.  The table lives as long as the process. */
int cuda_rt_load(const cuda_rt **out, tport_err *err);

/* Sets err to code with "what: <cudaGetErrorString> (cudaError <st>)" and
 * returns code: the message of a failed runtime call. */
int cuda_rt_fail(const cuda_rt *rt, cuda_rt_status st, int code, const char *what, tport_err *err);

#endif
