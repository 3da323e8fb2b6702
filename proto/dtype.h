/* dtype.h: dtype names (PyTorch's) and their parsing. */
#ifndef TPORT_DTYPE_H
#define TPORT_DTYPE_H

#include "tport_types.h"

/* PyTorch's name without the "torch." prefix ("float32"); NULL if not a dtype. */
const char *dtype_name(int dtype);
/* Parses "float32", "torch.float32" and PyTorch's aliases (float, half, double,
 * long, int, short, cfloat, cdouble, ...).  Returns TPORT_INVALID_ARGUMENT with a
 * message naming `field` when the name is unknown. */
int dtype_parse(const char *name, const char *field, tport_dtype *out, tport_err *err);
bool dtype_is_floating(int dtype); /* float16, bfloat16, float32, float64 */
bool dtype_is_integral(int dtype); /* bool excluded */

const char *memory_format_name(int fmt);
int memory_format_parse(const char *name, const char *field, tport_memory_format *out,
                        tport_err *err);

#endif
