/*
 * backend.h: the device backend table.  The engine never asks "is this
 * CUDA?"; it asks the table of the tensor's device type.
 *
 * Contracts shared by every backend (CUDA's, which the others follow):
 *  - Device memory from alloc() is reachable only through these calls (the sim
 *    backend enforces it: its device addresses fault when dereferenced).
 *  - *_async calls enqueue work on a stream and return; work on one stream runs
 *    in order.  Errors that can be seen at enqueue time (a pointer that is not
 *    the device's memory) are returned then, and nothing is enqueued.
 *  - An event records the point a stream has reached; stream_wait_event makes
 *    a stream wait for that point (a never-recorded event is complete).
 *    event_destroy may be called while the event is still pending.
 *  - An event is recorded only on a stream of the device it was created for,
 *    and copy_kernel(dev, s) needs a stream s of dev (CUDA refuses both with
 *    cudaErrorInvalidResourceHandle; sim refuses them too, as INTERNAL).  A
 *    stream may wait for an event of another device.
 *  - free() is called by the engine only once all work using the memory has
 *    completed (engine/storage.c keeps that promise).
 *  - No call blocks unless its name says synchronize; none calls back into
 *    the engine except launch_host_func's function, on the stream's thread.
 */
#ifndef TPORT_BACKEND_H
#define TPORT_BACKEND_H

#include "plan.h"
#include "tport_types.h"

typedef struct be_stream be_stream; /* opaque, per backend */
typedef struct be_event be_event;

typedef enum { BE_H2D, BE_D2H, BE_D2D, BE_H2H } be_copy_kind;

typedef void (*be_host_fn)(void *arg);

/* One counter of a backend (kernel cache, allocator), for Stats. */
typedef struct be_stat {
  char name[48];
  int64_t value;
} be_stat;

typedef struct backend_ops {
  const char *name;
  tport_device_type type;
  /* copy_kernel runs the copy on the calling thread before it returns (the
   * cpu's): the engine splits a long one into pieces to check the request's
   * deadline between them.  A backend that enqueues would only pay a launch
   * per piece (64 for a 1 GiB copy, about 0.25 ms on an H200) for checks
   * that all pass before the first piece has run. */
  bool copy_kernel_blocks;

  /* Devices usable now; 0 when the backend is not viable on this host, with
   * the reason in unavailable_reason (e.g. the CUDA driver's message). */
  int (*device_count)(void);
  const char *(*unavailable_reason)(void);
  /* Total and free bytes of device memory. */
  int (*mem_info)(int dev, size_t *free_bytes, size_t *total_bytes, tport_err *err);

  /* Device memory (aligned to 256 bytes); free may not fail. */
  int (*alloc)(int dev, size_t bytes, void **out, tport_err *err);
  void (*free)(int dev, void *ptr);
  /* Managed memory: reachable from the host and from the device.  Where the
   * device has none (cpu; a CUDA device without concurrent managed access):
   * FAILED_PRECONDITION saying so. */
  int (*alloc_managed)(int dev, size_t bytes, void **out, tport_err *err);
  /* Page-locked host memory, for staging and for pinned host tensors. */
  int (*host_alloc)(size_t bytes, void **out, tport_err *err);
  void (*host_free)(void *ptr);

  /* The stream the engine uses for device dev (never NULL for a valid dev). */
  be_stream *(*stream_default)(int dev);
  int (*stream_create)(int dev, be_stream **out, tport_err *err);
  void (*stream_destroy)(be_stream *s); /* waits for its pending work */
  int (*stream_synchronize)(be_stream *s, tport_err *err);

  /* Async copy of n bytes on stream s of device dev.  For BE_D2D the two
   * pointers may be on different devices only when peer access is enabled. */
  int (*memcpy_async)(int dev, be_stream *s, void *dst, const void *src, size_t n,
                      be_copy_kind kind, tport_err *err);
  /* Copy between two devices without peer access (staged by the driver). */
  int (*memcpy_peer_async)(int dst_dev, void *dst, int src_dev, const void *src, size_t n,
                           be_stream *s, tport_err *err);
  /* The copy kernel over a 2-operand plan (operand 0 dst), as cpu_copy. */
  int (*copy_kernel)(int dev, be_stream *s, const plan *p, void *dst, tport_dtype dst_dtype,
                     const void *src, tport_dtype src_dtype, unsigned flags, tport_err *err);
  /* Runs fn(arg) on the stream's timeline (cudaLaunchHostFunc). */
  int (*launch_host_func)(be_stream *s, be_host_fn fn, void *arg, tport_err *err);

  int (*event_create)(int dev, be_event **out, tport_err *err);
  void (*event_destroy)(be_event *e);
  int (*event_record)(be_event *e, be_stream *s, tport_err *err);
  int (*stream_wait_event)(be_stream *s, be_event *e, tport_err *err);
  bool (*event_query)(be_event *e); /* true when complete */
  int (*event_synchronize)(be_event *e, tport_err *err);

  /* Peer access: can dev reach peer's memory, and switch it on (idempotent). */
  bool (*can_access_peer)(int dev, int peer);
  int (*enable_peer_access)(int dev, int peer, tport_err *err);

  /* Managed memory hints (dev -1 means the host); FAILED_PRECONDITION where
   * the target device has no managed memory. */
  int (*mem_advise_preferred)(void *ptr, size_t n, int dev, tport_err *err);
  int (*mem_prefetch_async)(void *ptr, size_t n, int dev, be_stream *s, tport_err *err);

  /* A device's name and compute capability ("" when it has none). */
  void (*describe)(int dev, char *name, size_t name_len, char *cc, size_t cc_len);
  /* Up to max counters of the backend; returns how many. */
  size_t (*stats)(be_stat *out, size_t max);
  /* Sets an option ("kernel-cache" = a directory); UNIMPLEMENTED when unknown. */
  int (*set_option)(const char *key, const char *value, tport_err *err);
  /* Optional (NULL where the device reads host memory anyway): page-locks
   * caller memory for the device's copies (cudaHostRegister), and undoes it. */
  int (*host_register)(void *ptr, size_t bytes, tport_err *err);
  void (*host_unregister)(void *ptr);
  /* Optional (NULL where the backend has no inter-process memory): opens
   * another process's allocation by its IPC handle (cudaIpcOpenMemHandle,
   * len bytes of cudaIpcMemHandle_t): *ptr its base here, *dev the device
   * it lives on in this process's numbering.  ipc_close undoes it, once no
   * copy from or to it is pending.  Neither blocks on other work. */
  int (*ipc_open)(const void *handle, size_t len, int *dev, void **ptr, tport_err *err);
  void (*ipc_close)(void *ptr);
} backend_ops;

/* The table of a device type; every entry is non-NULL (unsupported ops point
 * to a function that says so). */
const backend_ops *backend_get(tport_device_type t);
/* Where pinned host memory comes from: the first accelerator backend with a
 * device (CUDA's cudaHostAlloc where present, then the sim's), else plain
 * host memory (the cpu backend). */
const backend_ops *backend_pinned_host(void);
/* One of be->stats by name; -1 when be does not report it. */
int64_t backend_stat(const backend_ops *be, const char *name);
/* Checks that no required op of `ops` is NULL (called once per backend). */
bool backend_complete(const backend_ops *ops);

extern const backend_ops backend_cpu;
extern const backend_ops backend_sim;
extern const backend_ops backend_cuda;

/* sim configuration: n devices with `bytes` of memory each; all pairs have
 * peer access possible unless set otherwise.  Call before use; reconfiguring
 * requires that no sim memory or stream is in use. */
typedef struct sim_config {
  int ndevices;
  size_t mem_bytes;      /* per device (default 1 GiB) */
  unsigned max_delay_us; /* each stream op sleeps a random 0..max before running */
  unsigned seed;
} sim_config;
int sim_configure(const sim_config *cfg, tport_err *err);
/* Whether dev may ever reach peer's memory (cudaDeviceCanAccessPeer). */
void sim_set_peer_possible(int dev, int peer, bool possible);
void sim_set_delay(unsigned max_delay_us);
/* Each stream op sleeps a random time in [min_us, max_us] (min == max: exactly). */
void sim_set_delay_range(unsigned min_us, unsigned max_us);
/* Bytes of device memory in use on dev (for leak tests). */
size_t sim_bytes_in_use(int dev);
/* The most device memory dev has had in use since the last sim_reset_peak
 * (which sets it to what is in use now): what a request made the server
 * allocate at its worst, for the quota tests. */
size_t sim_bytes_peak(int dev);
void sim_reset_peak(int dev);

#endif
