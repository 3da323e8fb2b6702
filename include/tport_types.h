/*
 * tport_types.h: the vocabulary every layer of tensorport shares.
 *
 * Status codes (the same values travel on the wire), dtypes with PyTorch's
 * names, memory formats, device types and the error value that carries a
 * message naming the field at fault.  Plain C, no dependencies: the kernels,
 * the engine, the server and libtport all include it.
 */
#ifndef TPORT_TYPES_H
#define TPORT_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes, numbered as gRPC numbers them. */
typedef enum tport_status {
  TPORT_OK = 0,
  TPORT_CANCELLED = 1,
  TPORT_UNKNOWN = 2,
  TPORT_INVALID_ARGUMENT = 3,
  TPORT_DEADLINE_EXCEEDED = 4,
  TPORT_NOT_FOUND = 5,
  TPORT_ALREADY_EXISTS = 6,
  TPORT_PERMISSION_DENIED = 7,
  TPORT_RESOURCE_EXHAUSTED = 8,
  TPORT_FAILED_PRECONDITION = 9,
  TPORT_ABORTED = 10,
  TPORT_OUT_OF_RANGE = 11,
  TPORT_UNIMPLEMENTED = 12,
  TPORT_INTERNAL = 13,
  TPORT_UNAVAILABLE = 14,
  TPORT_DATA_LOSS = 15,
  TPORT_UNAUTHENTICATED = 16,
} tport_status;

/* Upper-case name of a status ("INVALID_ARGUMENT"); "UNKNOWN_STATUS" if out of range. */
const char *tport_status_name(int status);

/* An error: a status and a message a user can act on.  Functions that can
 * fail take a `tport_err *` (which may be NULL) and return the status. */
#define TPORT_ERR_MSG_MAX 256
typedef struct tport_err {
  int code;
  char msg[TPORT_ERR_MSG_MAX];
} tport_err;

/* Sets err (when not NULL) and returns code. */
int tport_err_set(tport_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Clears err to OK. */
void tport_err_clear(tport_err *err);

/* Dtypes.  The numbering is tensorport's (and the wire's), the names PyTorch's. */
typedef enum tport_dtype {
  TPORT_BOOL = 0,
  TPORT_UINT8 = 1,
  TPORT_INT8 = 2,
  TPORT_INT16 = 3,
  TPORT_INT32 = 4,
  TPORT_INT64 = 5,
  TPORT_FLOAT16 = 6,
  TPORT_BFLOAT16 = 7,
  TPORT_FLOAT32 = 8,
  TPORT_FLOAT64 = 9,
  TPORT_COMPLEX64 = 10,
  TPORT_COMPLEX128 = 11,
  TPORT_NUM_DTYPES = 12,
} tport_dtype;

/* Bytes per element; 0 for a value that is not a dtype. */
static inline size_t tport_dtype_size(int dtype)
{
  static const unsigned char sizes[TPORT_NUM_DTYPES] = {1, 1, 1, 2, 4, 8, 2, 2, 4, 8, 8, 16};
  return (dtype >= 0 && dtype < TPORT_NUM_DTYPES) ? sizes[dtype] : 0;
}

static inline bool tport_dtype_is_complex(int dtype)
{
  return dtype == TPORT_COMPLEX64 || dtype == TPORT_COMPLEX128;
}

/* Memory formats.  PRESERVE is a request only; NONE is only ever an answer
 * (the actual format of a tensor contiguous in no format). */
typedef enum tport_memory_format {
  TPORT_MF_CONTIGUOUS = 0,
  TPORT_MF_CHANNELS_LAST = 1,
  TPORT_MF_CHANNELS_LAST_3D = 2,
  TPORT_MF_PRESERVE = 3,
  TPORT_MF_NONE = 4,
} tport_memory_format;

typedef enum tport_device_type {
  TPORT_DEV_CPU = 0,
  TPORT_DEV_CUDA = 1,
  TPORT_DEV_SIM = 2,
  TPORT_NUM_DEVICE_TYPES = 3,
} tport_device_type;

typedef struct tport_device {
  tport_device_type type;
  int index; /* -1: "the current/default one" (cpu is always index 0) */
} tport_device;

#define TPORT_MAX_DIMS 16

#ifdef __cplusplus
}
#endif
#endif
