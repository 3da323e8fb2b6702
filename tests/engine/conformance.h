/* conformance.h: the backend conformance suite (conformance.c). */
#ifndef TPORT_CONFORMANCE_H
#define TPORT_CONFORMANCE_H

#include "backend.h"

/* Runs the contract against every device of be; logs and returns when be has
 * no device here. */
void conformance(const backend_ops *be);

#endif
