/*
 * put_once.h: a put in one request -- a PutBegin with commit whose bytes
 * are in its payload or in a slice of a same-host region -- copied once,
 * straight into the tensor that is stored (put_once.c).  The upload a put
 * of several chunks makes (a landing, chunk maps, a commit) is
 * handlers_put.c's, which sends every such PutBegin here but one into
 * managed memory.
 */
#ifndef TPORT_PUT_ONCE_H
#define TPORT_PUT_ONCE_H

#include "server_internal.h"
#include "validate.h"

/* Where the put's bytes are: its payload, or a region's slice (held until
 * the copy from it has ended). */
typedef struct put_source {
  uint8_t *p;
  size_t len;
  bool pinned; /* host memory the GPU driver reads directly */
  bool on_dev; /* GPU memory of mem_dev (a CUDA IPC region) */
  tport_device mem_dev;
  shm_region *held; /* the region's; NULL for the payload */
} put_source;

/* The put of q (its descriptor's layout l, dtype from) onto dev, converted
 * as convert asks, from in's bytes: stored, added to the registry and
 * answered. */
int put_once(call *c, const Tport__PutBeginRequest *q, const meta_layout *l, tport_dtype from,
             tport_device dev, const to_options *convert, const put_source *in);
/* The same from the region slice q names (held for the copy). */
int put_once_from_region(call *c, const Tport__PutBeginRequest *q, const meta_layout *l,
                         tport_dtype from, tport_device dev, const to_options *convert);

/* Shared with the uploads of handlers_put.c: PutBegin's reply (the stored
 * tensor's info when the put committed; releases the caller's reference to
 * e), and the check of bytes sent with their CRC32C (DATA_LOSS naming the
 * chunk at off). */
int put_begin_reply(call *c, reg_entry *e, tport_tensor *final);
int check_crc32c_of(call *c, bool set, uint32_t sent, uint64_t off, const uint8_t *p, size_t n);

#endif
