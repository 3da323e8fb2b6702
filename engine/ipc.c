/*
 * ipc.c: another process's device memory on this host, opened by its IPC
 * handle (engine.h, "Same-host GPU memory").  tportd opens a same-host
 * client's CUDA allocation once (server/regions.c caches it per connection)
 * and copies device to device between it and its tensors: the tensor over
 * it is borrowed memory, never the engine's to free.
 */
#include "engine.h"
#include "storage.h"

#include <stdlib.h>

int engine_ipc_open(const void *handle, size_t len, tport_device *dev, void **ptr, tport_err *err)
{
  const char *why = "no backend of this server opens IPC handles";
  for (int type = 0; type < TPORT_NUM_DEVICE_TYPES; type++) {
    const backend_ops *be = backend_get((tport_device_type)type);
    if (!be->ipc_open)
      continue;
    if (be->device_count() == 0) {
      why = be->unavailable_reason();
      continue;
    }
    int d = -1;
    void *p = NULL;
    int rc = be->ipc_open(handle, len, &d, &p, err);
    if (rc)
      return rc;
    *dev = (tport_device){(tport_device_type)type, d};
    *ptr = p;
    return TPORT_OK;
  }
  return tport_err_set(err, TPORT_FAILED_PRECONDITION,
                       "this server cannot open a CUDA IPC handle (%s): hand the allocation over "
                       "as a descriptor, or let the client stage it",
                       why);
}

void engine_ipc_close(tport_device dev, void *ptr)
{
  const backend_ops *be = backend_get(dev.type);
  if (ptr && be && be->ipc_close)
    be->ipc_close(ptr);
}

int tensor_wrap_device(tport_device dev, void *data, size_t nbytes, tport_dtype dtype, int ndim,
                       const int64_t *sizes, const int64_t *strides, int64_t offset,
                       tport_tensor **out, tport_err *err)
{
  const backend_ops *be = backend_get(dev.type);
  if (!be)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "device type %d is unknown", (int)dev.type);
  tport_tensor *t;
  int rc = tensor_wrap_host(data, nbytes, dtype, ndim, sizes, strides, offset, &t, err);
  if (rc)
    return rc;
  /* the same borrowed storage, on the device: work on it is ordered by its
   * event as on any storage, and nothing frees it */
  t->storage->device = dev;
  t->storage->mem_be = be;
  t->storage->mem_dev = dev.index;
  *out = t;
  return TPORT_OK;
}
