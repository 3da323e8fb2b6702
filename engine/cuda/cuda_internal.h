/*
 * cuda_internal.h: what the files of the CUDA backend share (backend_cuda.c:
 * devices, the device guard, peers, managed memory, the table;
 * cuda_memory.c: device, managed, pinned and IPC memory; cuda_stream.c:
 * streams, copies, kernels and events).  What the backend promises is
 * backend.h's; how it maps onto the runtime, backend_cuda.c's top.
 */
#ifndef TPORT_CUDA_INTERNAL_H
#define TPORT_CUDA_INTERNAL_H

#include <cudaTypedefs.h> /* PFN_cuDevicePrimaryCtxGetState: types only, libcuda is not linked */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>

#include "backend.h"

#define CU_MAX_DEVICES 64

struct be_stream {
  int dev;
  atomic_bool created; /* s exists (default streams are created on first use) */
  cudaStream_t s;      /* 0: the legacy default stream, where creating one failed */
};

struct be_event {
  int dev;
  cudaEvent_t e;
};

/* What is known of peer access from dev to peer (cached: asking the driver
 * and enabling access on every copy costs a driver call each time). */
enum { PEER_UNKNOWN = 0, PEER_NEVER, PEER_POSSIBLE, PEER_ENABLED };

typedef struct cu_state {
  pthread_once_t once;
  int count;
  /* cudaDriverGetVersion (0: no driver) and cudaRuntimeGetVersion */
  int driver_version, runtime_version;
  char reason[512];
  /* cuDevicePrimaryCtxGetState of the driver; NULL when it could not be had */
  PFN_cuDevicePrimaryCtxGetState_v7000 ctx_state;
  bool managed_ok[CU_MAX_DEVICES]; /* cudaDevAttrConcurrentManagedAccess != 0 */
  pthread_mutex_t mu;              /* guards streams and stream creation */
  be_stream *streams[CU_MAX_DEVICES];
  pthread_mutex_t peer_mu; /* serializes cudaDeviceEnablePeerAccess */
  atomic_uchar peer[CU_MAX_DEVICES][CU_MAX_DEVICES];
} cu_state;
extern cu_state cu;

/* Turns a CUDA error into a tensorport error naming the call; clears the
 * runtime's last-error state so that a failed call does not poison the next. */
int cu_fail(cudaError_t e, const char *call, tport_err *err);
#define CU_CALL(expr, err)                                                                         \
  do {                                                                                             \
    cudaError_t cu_e_ = (expr);                                                                    \
    if (cu_e_ != cudaSuccess)                                                                      \
      return cu_fail(cu_e_, #expr, err);                                                           \
  } while (0)

/* ---- devices (backend_cuda.c) */
int cu_count(void);
const char *cu_reason(void);
int cu_check_dev(int dev, tport_err *err);
int cu_mem_info(int dev, size_t *free_bytes, size_t *total, tport_err *err);

/* The device guard (backend_cuda.c says why it is as it is): dev current
 * for one call, the thread's previous device put back only where that
 * creates no context. */
typedef struct cu_guard {
  int prev;
  bool changed;
} cu_guard;

bool cu_has_context(int dev);
int cu_guard_enter(int dev, cu_guard *g, tport_err *err);
void cu_guard_exit(cu_guard *g);
/* Runs one runtime call under the device guard. */
#define GUARDED(dev, expr, err)                                                                    \
  do {                                                                                             \
    cu_guard g_;                                                                                   \
    int rc_ = cu_guard_enter((dev), &g_, (err));                                                   \
    if (rc_)                                                                                       \
      return rc_;                                                                                  \
    cudaError_t e_ = (expr);                                                                       \
    cu_guard_exit(&g_);                                                                            \
    if (e_ != cudaSuccess)                                                                         \
      return cu_fail(e_, #expr, (err));                                                            \
  } while (0)
/* The device for calls that act on no device of their own (pinned host
 * memory, advice for the host). */
int cu_context_device(void);

/* ---- memory (cuda_memory.c) */
int cu_alloc(int dev, size_t bytes, void **out, tport_err *err);
void cu_free(int dev, void *p);
/* FAILED_PRECONDITION: dev has no concurrent managed access (what says why). */
int cu_managed_unsupported(int dev, const char *what, tport_err *err);
int cu_alloc_managed(int dev, size_t bytes, void **out, tport_err *err);
int cu_host_alloc(size_t bytes, void **out, tport_err *err);
void cu_host_free(void *p);
int cu_host_register(void *p, size_t bytes, tport_err *err);
void cu_host_unregister(void *p);
int cu_ipc_open(const void *handle, size_t len, int *dev, void **out, tport_err *err);
void cu_ipc_close(void *p);

/* ---- streams, copies and events (cuda_stream.c) */
/* The runtime's stream of s (created on first use for a default stream). */
cudaStream_t cu_stream_of(be_stream *s);
be_stream *cu_stream_default(int dev);
int cu_stream_create(int dev, be_stream **out, tport_err *err);
int cu_stream_sync(be_stream *s, tport_err *err);
void cu_stream_destroy(be_stream *s);
int cu_memcpy(int dev, be_stream *s, void *dst, const void *src, size_t n, be_copy_kind kind,
              tport_err *err);
int cu_memcpy_peer(int dst_dev, void *dst, int src_dev, const void *src, size_t n, be_stream *s,
                   tport_err *err);
int cu_kernel(int dev, be_stream *s, const plan *p, void *dst, tport_dtype dt, const void *src,
              tport_dtype st, unsigned flags, tport_err *err);
int cu_host_fn(be_stream *s, be_host_fn fn, void *arg, tport_err *err);
int cu_event_create(int dev, be_event **out, tport_err *err);
void cu_event_destroy(be_event *e);
int cu_event_record(be_event *e, be_stream *s, tport_err *err);
int cu_stream_wait(be_stream *s, be_event *e, tport_err *err);
bool cu_event_query(be_event *e);
int cu_event_sync(be_event *e, tport_err *err);

#endif
