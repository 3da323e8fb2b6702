/*
 * npy.h: NumPy .npy files (format versions 1.0, 2.0 and 3.0) for the tport
 * tool.  dtypes: every NumPy dtype tensorport has (bool, uint8, int8, int16,
 * int32, int64, float16, float32, float64, complex64, complex128), either
 * byte order (big-endian data is swapped on read), C or Fortran order.
 *
 * bfloat16 convention: NumPy has no bfloat16, so tensorport writes bfloat16
 * tensors as '<u2' (the raw bit patterns), and reads '<u2' as bfloat16 (there
 * is no uint16 dtype in tensorport, so '<u2' is never anything else).
 */
#ifndef TPORT_NPY_H
#define TPORT_NPY_H

#include "tport.h"

typedef struct npy_array {
  tport_dtype dtype;
  int ndim;
  int64_t sizes[TPORT_MAX_DIMS];
  int64_t strides[TPORT_MAX_DIMS]; /* elements: C or Fortran order */
  bool fortran_order;
  void *data; /* malloc'ed, little-endian */
  size_t nbytes;
} npy_array;

int npy_read(const char *path, npy_array *out, tport_err *err);
/* Writes values given in logical C order. */
int npy_write(const char *path, tport_dtype dtype, int ndim, const int64_t *sizes, const void *data,
              size_t nbytes, tport_err *err);
void npy_free(npy_array *a);

#endif
