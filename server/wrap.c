/*
 * wrap.c: tensors over bytes a transfer does not own -- a request's payload
 * or a slice of a same-host region (regions.h) -- for the one copy between
 * them and a stored tensor, put or get.
 */
#include "wrap.h"

/* A cpu tensor over n bytes at p (a payload, or a slice of a region:
 * pinned when the region is registered with the GPU driver). */
int wrap_host(const uint8_t *p, size_t n, bool pinned, tport_dtype dt, int ndim,
                     const int64_t *sizes, const int64_t *strides, tport_tensor **out,
                     tport_err *err)
{
  return pinned ? tensor_wrap_host_pinned((void *)p, n, dt, ndim, sizes, strides, 0, out, err)
                : tensor_wrap_host((void *)p, n, dt, ndim, sizes, strides, 0, out, err);
}

/* A whole put's or get's slice: host memory, or GPU memory of *dev (a
 * CUDA IPC region, *on_dev): wrapped on its device, never read here. */
int hold_whole(call *c, const Tport__ShmSlice *sl, shm_region **held, uint8_t **p,
                      bool *pinned, tport_device *dev, bool *on_dev)
{
  return shm_hold_any(c->srv->shm, c->pipe, sl->region, sl->offset, sl->length, held, p, pinned,
                      dev, on_dev, &c->err);
}

int wrap_any(uint8_t *p, size_t n, bool pinned, bool on_dev, tport_device dev,
                    tport_dtype dt, int ndim, const int64_t *sizes, const int64_t *strides,
                    tport_tensor **out, tport_err *err)
{
  return on_dev ? tensor_wrap_device(dev, p, n, dt, ndim, sizes, strides, 0, out, err)
                : wrap_host(p, n, pinned, dt, ndim, sizes, strides, out, err);
}


/* A copy from or into a region the GPU driver reads directly (pinned) may
 * have been enqueued before the call failed: whatever happened, it ends
 * before the region may go (issue 20, finding 9).  wrap is the tensor over
 * the region: its pending event is the last copy that touched it. */
int settle_region(tport_tensor *wrap, bool pinned, int rc, tport_err *err)
{
  if (!pinned || !wrap)
    return rc;
  int src = tensor_sync(wrap, rc ? NULL : err);
  return rc ? rc : src;
}
