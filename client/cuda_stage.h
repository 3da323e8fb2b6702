/*
 * cuda_stage.h: a client's staging of device memory through its own pinned
 * chunks, for puts from and gets into GPU memory over the network
 * (DESIGN.md, "Clients' GPU memory", the remote case).
 *
 * Each client owns one ring of CLIENT_STAGE_SLOTS pinned chunk buffers,
 * allocated with cudaHostAlloc the first time device memory is moved and
 * reused by every later transfer (cudaHostAlloc and cudaFreeHost are slow
 * and synchronizing); tport_close frees it.  A put asks for its chunks in
 * order: the chunk asked for is waited on and the next one's device-to-host
 * copy is started into the other slot, so it runs while the chunk is on the
 * wire.  A get hands each chunk that came to a slot whose previous
 * host-to-device copy has ended and starts its copy, which runs while the
 * next chunk is received.  One transfer holds the ring at a time (others on
 * the same client wait for it).  The copies run on a stream of the ring's,
 * on the tensor's device, made with cudaStreamDefault flags: they are
 * ordered after work on the legacy default stream; work on other streams
 * must be complete before the call (DLPack's producer's duty).
 */
#ifndef TPORT_CLIENT_CUDA_STAGE_H
#define TPORT_CLIENT_CUDA_STAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda_rt.h"
#include "tport.h"

#define CLIENT_STAGE_SLOTS 2

typedef struct client_stage client_stage;

/* Device memory of a transfer: base (device address) and its device. */
typedef struct client_devmem {
  uint8_t *base;
  int device;
  bool managed; /* cudaMallocManaged memory (never by IPC) */
} client_devmem;

/* Checks that ptr is device (or managed) memory of device_id and says which
 * device (the runtime loaded first, if need be). */
int stage_check_pointer(const void *ptr, int device_id, bool managed, tport_err *err);

/* Takes c's ring (created on first use, under c->stage_mu, which the
 * transfer holds until stage_end) for a transfer of nbytes at mem, in
 * chunks of at most chunk bytes: the ring grows to chunk where it is
 * smaller; the calling thread's current device is mem's until stage_end. */
int stage_begin(tport_client *c, const client_devmem *mem, size_t nbytes, size_t chunk,
                client_stage **out, tport_err *err);
/* The transfer's chunks are chunk bytes from now on (the ring grows where
 * they are larger than its slots). */
int stage_set_chunk(client_stage *s, size_t chunk, tport_err *err);
/* A put's chunk [off, off + len) in host memory: *bytes is valid until the
 * next call.  Chunks must be asked for in order; the next one (off + len,
 * at most chunk bytes) is prefetched. */
int stage_put_chunk(client_stage *s, size_t off, size_t len, const uint8_t **bytes, tport_err *err);
/* A get's len bytes that came for [off, off + len): copied to the device
 * through the ring (any length: pieces of a slot). */
int stage_get_chunk(client_stage *s, size_t off, const uint8_t *data, size_t len, tport_err *err);
/* Ends the transfer: waits for its copies (a get's bytes are on the device
 * when it returns TPORT_OK), restores the thread's device and lets the ring
 * go.  Returns rc when rc is an error, else the copies' status. */
int stage_end(client_stage *s, int rc, tport_err *err);
/* Frees a client's ring (tport_close); NULL is fine. */
void stage_destroy(client_stage *s);

#endif
