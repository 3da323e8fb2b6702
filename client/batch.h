/*
 * batch.h: what the put and get halves of a batch share (batch.c,
 * batch_put.c): an element's status from its reply, the batch's from its
 * elements' (batch_common.c), and the bounds of one request; and the get
 * batch's deferred elements (batch_get_deferred.c).
 */
#ifndef TPORT_CLIENT_BATCH_H
#define TPORT_CLIENT_BATCH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "client_internal.h"

/* The server's bound (server/handlers_batch.c) is larger: this keeps one
 * request's reply small. */
#define BATCH_MAX_ELEMENTS 256

/* An element not answered yet (never a status of the wire's). */
#define NOT_ANSWERED (-1)

/* Whether *cancel is set, and then err says so for the element. */
bool batch_cancelled(const atomic_bool *cancel, tport_err *err);
/* An element's error from its reply's status (none: OK). */
int batch_element_status(const Tport__Status *st, tport_err *err);
/* The batch's status from its n elements' errors (stride bytes apart):
 * OK, or the first failed element's, named. */
int batch_result(const tport_err *errs, size_t stride, size_t n, tport_err *err);

/* The elements of items[0..k) a GetBatch deferred (err.code NOT_ANSWERED;
 * planned[j]: element j's bytes, as it said -- exact -- or its buffer's
 * cap), all in one window; each gets its result (buffers made from
 * get_blocks.h where blocks). */
void batch_get_deferred(tport_client *c, tport_get_item *items, size_t k, const size_t *planned,
                        bool exact, bool blocks, const atomic_bool *cancel);

#endif
