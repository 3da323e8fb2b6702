/* device.h: device strings ("cpu", "cuda:N", "sim:N") as PyTorch writes them. */
#ifndef TPORT_DEVICE_H
#define TPORT_DEVICE_H

#include "tport_types.h"

/* Parses "cpu", "cuda", "cuda:N", "sim", "sim:N".  Without an index the
 * device's index is -1 ("the current one"); cpu is always index 0. */
int device_parse(const char *s, const char *field, tport_device *out, tport_err *err);
/* Writes "cpu", "cuda:0", "sim:1" into buf; returns buf. */
const char *device_format(tport_device d, char *buf, size_t len);
const char *device_type_name(tport_device_type t);
bool device_equal(tport_device a, tport_device b);

#endif
