/* cuda_memory.c: the CUDA backend's memory: device memory from the caching
 * allocator, managed memory, pinned host memory, other processes'
 * allocations by IPC handle (cuda_internal.h). */
#include <stdio.h>
#include <string.h>

#include "cuda_alloc.h"
#include "cuda_internal.h"

/* ---------------------------------------------------------------- memory */

int cu_alloc(int dev, size_t bytes, void **out, tport_err *err)
{
  int rc = cu_check_dev(dev, err);
  cu_guard g;
  if (rc || (rc = cu_guard_enter(dev, &g, err)))
    return rc;
  rc = cuda_alloc(dev, bytes, out, err);
  cu_guard_exit(&g);
  return rc;
}

void cu_free(int dev, void *p)
{
  if (!p)
    return;
  if (cuda_alloc_free(dev, p))
    return;
  /* not a cached block: managed memory */
  cu_guard g;
  if (cu_guard_enter(dev, &g, NULL) == TPORT_OK) {
    if (cudaFree(p) != cudaSuccess)
      cudaGetLastError();
    cu_guard_exit(&g);
  }
}

int cu_managed_unsupported(int dev, const char *what, tport_err *err)
{
  return tport_err_set(err, TPORT_FAILED_PRECONDITION,
                       "cuda:%d does not support %s: the host and the device cannot use managed "
                       "memory concurrently there (cudaDevAttrConcurrentManagedAccess is 0)",
                       dev, what);
}

/* Free bytes of dev after giving the allocator's cache back to the device:
 * cached blocks are free memory as far as a new allocation is concerned. */
static int free_after_reclaim(int dev, size_t want, size_t *freeb, tport_err *err)
{
  size_t total;
  int rc = cu_mem_info(dev, freeb, &total, err);
  if (rc || *freeb >= want)
    return rc;
  cu_guard g;
  if ((rc = cu_guard_enter(dev, &g, err)))
    return rc;
  size_t released = cuda_alloc_empty_cache(dev);
  cu_guard_exit(&g);
  return released ? cu_mem_info(dev, freeb, &total, err) : TPORT_OK;
}

int cu_alloc_managed(int dev, size_t bytes, void **out, tport_err *err)
{
  int rc = cu_check_dev(dev, err);
  if (rc)
    return rc;
  if (!cu.managed_ok[dev])
    return cu_managed_unsupported(dev, "managed memory", err);
  size_t freeb;
  if ((rc = free_after_reclaim(dev, bytes, &freeb, err)))
    return rc;
  /* never ask for more managed memory than the device has free (SEMANTICS.md §6) */
  if (bytes > freeb)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                         "cuda:%d: %zu bytes of managed memory asked, %zu free", dev, bytes, freeb);
  GUARDED(dev, cudaMallocManaged(out, bytes ? bytes : 1, cudaMemAttachGlobal), err);
  return TPORT_OK;
}

/* Pinned memory is portable (every context may use it), but allocating and
 * freeing it needs a context: one that exists already. */
int cu_host_alloc(size_t bytes, void **out, tport_err *err)
{
  if (cu_count() == 0)
    return tport_err_set(err, TPORT_UNAVAILABLE, "cuda: %s", cu_reason());
  GUARDED(cu_context_device(), cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocPortable), err);
  return TPORT_OK;
}

/* Caller memory (a same-host region) page-locked for every context, so
 * host-to-device copies read it directly instead of through staging. */
int cu_host_register(void *p, size_t bytes, tport_err *err)
{
  if (cu_count() == 0)
    return tport_err_set(err, TPORT_UNAVAILABLE, "cuda: %s", cu_reason());
  GUARDED(cu_context_device(), cudaHostRegister(p, bytes, cudaHostRegisterPortable), err);
  return TPORT_OK;
}

void cu_host_unregister(void *p)
{
  cu_guard g;
  if (p && cu_guard_enter(cu_context_device(), &g, NULL) == TPORT_OK) {
    if (cudaHostUnregister(p) != cudaSuccess)
      cudaGetLastError();
    cu_guard_exit(&g);
  }
}

/* Another process's allocation (a same-host client's): opened in a context
 * that exists already, peer access enabled lazily where it lives on
 * another device; *dev is the device it lives on here (what copies to and
 * from it must name). */
int cu_ipc_open(const void *handle, size_t len, int *dev, void **out, tport_err *err)
{
  if (cu_count() == 0)
    return tport_err_set(err, TPORT_UNAVAILABLE, "cuda: %s", cu_reason());
  cudaIpcMemHandle_t h;
  if (len != sizeof h.reserved)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "a CUDA IPC handle is %zu bytes: %zu came",
                         sizeof h.reserved, len);
  memcpy(h.reserved, handle, len);
  void *p = NULL;
  cu_guard g;
  int rc = cu_guard_enter(cu_context_device(), &g, err);
  if (rc)
    return rc;
  cudaError_t oe = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  cu_guard_exit(&g);
  if (oe != cudaSuccess) {
    /* not this server's to open (another host's GPU, a freed allocation, a
     * handle that is not one): UNAVAILABLE, so the client stages instead */
    cudaGetLastError();
    return tport_err_set(err, TPORT_UNAVAILABLE, "cudaIpcOpenMemHandle: %s (%s)",
                         cudaGetErrorString(oe), cudaGetErrorName(oe));
  }
  struct cudaPointerAttributes a;
  cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess || a.type != cudaMemoryTypeDevice || a.device < 0 ||
      a.device >= cu_count()) {
    cudaGetLastError();
    if (cudaIpcCloseMemHandle(p) != cudaSuccess)
      cudaGetLastError();
    return e != cudaSuccess ? cu_fail(e, "cudaPointerGetAttributes", err)
                            : tport_err_set(err, TPORT_INVALID_ARGUMENT,
                                            "the opened IPC handle is not device memory of a "
                                            "visible device (type %d, device %d)",
                                            (int)a.type, a.device);
  }
  *dev = a.device;
  *out = p;
  return TPORT_OK;
}

void cu_ipc_close(void *p)
{
  cu_guard g;
  if (p && cu_guard_enter(cu_context_device(), &g, NULL) == TPORT_OK) {
    if (cudaIpcCloseMemHandle(p) != cudaSuccess)
      cudaGetLastError();
    cu_guard_exit(&g);
  }
}

void cu_host_free(void *p)
{
  cu_guard g;
  if (p && cu_guard_enter(cu_context_device(), &g, NULL) == TPORT_OK) {
    if (cudaFreeHost(p) != cudaSuccess)
      cudaGetLastError();
    cu_guard_exit(&g);
  }
}
