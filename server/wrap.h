/*
 * wrap.h: tensors over a payload's or a region slice's bytes, for the
 * copy of a put or a get (wrap.c).  The bytes stay their owner's: a tensor
 * made here only borrows them.
 */
#ifndef TPORT_WRAP_H
#define TPORT_WRAP_H

#include "server_internal.h"

/* A cpu tensor over n bytes at p (a payload, or a slice of a region:
 * pinned when the region is registered with the GPU driver). */
int wrap_host(const uint8_t *p, size_t n, bool pinned, tport_dtype dt, int ndim,
              const int64_t *sizes, const int64_t *strides, tport_tensor **out, tport_err *err);
/* A whole put's or get's slice: host memory, or GPU memory of *dev (a
 * CUDA IPC region, *on_dev): wrapped on its device, never read here. */
int hold_whole(call *c, const Tport__ShmSlice *sl, shm_region **held, uint8_t **p, bool *pinned,
               tport_device *dev, bool *on_dev);
/* A tensor over a held slice: on its device (on_dev), else on the host. */
int wrap_any(uint8_t *p, size_t n, bool pinned, bool on_dev, tport_device dev, tport_dtype dt,
             int ndim, const int64_t *sizes, const int64_t *strides, tport_tensor **out,
             tport_err *err);
/* A copy from or into a region the GPU driver reads directly (pinned) may
 * have been enqueued before the call failed: whatever happened, it ends
 * before the region may go.  wrap is the tensor over the region; rc the
 * copy's result, which is returned unless it was OK and the wait fails. */
int settle_region(tport_tensor *wrap, bool pinned, int rc, tport_err *err);

#endif
