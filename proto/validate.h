/*
 * validate.h: checks of tensor descriptors that come from the wire.
 *
 * Every number a client sends passes through here before anything is
 * allocated or indexed: rank at most TPORT_MAX_DIMS, sizes >= 0, no negative
 * strides, byte counts computed without overflow, the offset inside the
 * storage.  Each rejection is TPORT_INVALID_ARGUMENT (or OUT_OF_RANGE for an
 * offset past the storage) with a message naming the field and the value.
 */
#ifndef TPORT_VALIDATE_H
#define TPORT_VALIDATE_H

#include "meta.h"

/* Largest byte count any tensor may have (2^62): keeps every later sum of a
 * byte count and an offset inside int64. */
#define VALIDATE_MAX_BYTES ((int64_t)1 << 62)

typedef struct validate_result {
  int64_t numel;
  int64_t nbytes;        /* numel * element size: the logical payload */
  int64_t storage_bytes; /* bytes the storage must hold: (offset + span) * element size */
} validate_result;

/* Validates dtype, sizes and strides (nstrides == 0: contiguous strides are
 * filled in) and offset; on success fills *out and *res.  storage_bytes < 0
 * means "a fresh storage of the needed size"; otherwise the layout must fit
 * inside a storage of that many bytes. */
int validate_desc(int dtype, size_t ndim, const int64_t *sizes, size_t nstrides,
                  const int64_t *strides, int64_t offset, int64_t storage_bytes, meta_layout *out,
                  validate_result *res, tport_err *err);

/* Overflow-checked arithmetic (false on overflow). */
bool validate_mul(int64_t a, int64_t b, int64_t *out);
bool validate_add(int64_t a, int64_t b, int64_t *out);

#endif
