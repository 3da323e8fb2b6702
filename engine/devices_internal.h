/* devices_internal.h: what the engine's own files ask of devices.c. */
#ifndef TPORT_DEVICES_INTERNAL_H
#define TPORT_DEVICES_INTERNAL_H

#include <stdbool.h>

/* True once engine_configure has succeeded: the backends may be asked for
 * their state (before, asking the CUDA one may start its driver for
 * nothing, and the sim has no devices yet). */
bool engine_configured(void);

#endif
