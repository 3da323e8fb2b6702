/*
 * cuda_ipc.h: same-host puts from and gets into GPU memory by CUDA IPC
 * (DESIGN.md, "Clients' GPU memory", the same-host case; issue 19).
 *
 * When the server is on this host (its shm socket is reachable, as for
 * regions) and the CUDA runtime can export memory, a put from or a get
 * into device memory hands the server the allocation itself: the whole
 * allocation (found with cuMemGetAddressRange) is registered once per
 * connection as a CUDA IPC region (ShmRegister with its cudaIpcMemHandle_t;
 * where the runtime can export the allocation as a POSIX descriptor --
 * cuMemRetainAllocationHandle + cuMemExportToShareableHandle, as the
 * emulated runtime does -- the descriptor goes over the shm socket with
 * the token, as a region's memfd does), and each transfer then names
 * [offset, offset + nbytes) of it: the server copies device to device.
 *
 * The client keeps what it registered per connection (at most
 * CLIENT_IPC_MAX allocations, the least recently used released first) and
 * checks an allocation's handle on every use: a freed allocation whose
 * address came back with cudaMalloc has another handle, and its stale
 * region is released and the new one registered.  A region the server no
 * longer knows (it restarted; the connection changed) is registered again
 * and the transfer retried once.  Where any of this is not possible (a
 * remote server, no_shm or TPORT_SHM=0 or TPORT_CUDA_IPC=0, a runtime
 * without IPC, managed memory, a server that cannot open the handle) the
 * transfer is staged through the pinned ring (cuda_stage.h) instead.
 *
 * Ordering: work on the legacy default stream is waited for before the
 * server reads or writes the memory; work on other streams must be
 * complete before the call, as for the staged path (DLPack's producer's
 * duty).  A get's bytes are on the device when it returns.
 */
#ifndef TPORT_CLIENT_CUDA_IPC_H
#define TPORT_CLIENT_CUDA_IPC_H

#include <stdbool.h>

#include "client_internal.h"
#include "cuda_stage.h"

#define CLIENT_IPC_MAX 32

typedef struct client_ipc client_ipc;

/* A put of the device memory at mem through its allocation's IPC region:
 * *used false (nothing sent) when the same-host path is not possible, and
 * the caller stages instead; else the put's status. */
int client_ipc_put(tport_client *c, tport_dtype dtype, int ndim, const int64_t *sizes,
                   const int64_t *strides, const client_devmem *mem, size_t nbytes,
                   const tport_put_options *opts, tport_tensor_info *out, bool *used,
                   tport_err *err);
/* A get into the device memory at mem (cap bytes, exactly the tensor want
 * describes: checked before the server writes a byte), likewise. */
int client_ipc_get(tport_client *c, const tport_ref *ref, const client_devmem *mem, size_t cap,
                   const client_get_want *want, tport_tensor_info *info, bool *used,
                   tport_err *err);
/* Frees the client's table (tport_close: its connection's end releases
 * the regions on the server). */
void client_ipc_destroy(client_ipc *ipc);

#endif
