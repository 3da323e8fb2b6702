/*
 * fairq.h: the workers' queue, fair between tenants.
 *
 * Requests wait in one FIFO per tenant; workers take them round-robin, one
 * tenant at a time, and a tenant never has more than `cap` of its requests
 * in the workers at once.  A tenant that queues hundreds of long copies
 * then holds at most cap workers, and another tenant's small request waits
 * for the next free worker, not for the copies queued before it (a single
 * FIFO made another tenant's Devices wait 7-14 s behind 16 x 32 queued
 * 128 MiB copies).
 *
 * Not thread-safe: the caller holds its own lock around every call.
 */
#ifndef TPORT_FAIRQ_H
#define TPORT_FAIRQ_H

#include <stdbool.h>
#include <stddef.h>

typedef struct fair_queue fair_queue;
struct fq_tenant;

/* Embedded in what is queued. */
typedef struct fq_node {
  struct fq_node *next;
  struct fq_tenant *owner; /* set by fq_push, read by fq_done */
} fq_node;

/* cap: a tenant's requests in the workers at once (at least 1).  NULL when
 * out of memory. */
fair_queue *fq_new(int cap);
/* Everything queued must have been popped, and every popped node done. */
void fq_free(fair_queue *q);
/* Queues n for the tenant named key (any string; "" is a tenant too).  Never
 * fails: when no memory is left for a new tenant's queue, n joins a shared
 * overflow queue that is served like a tenant. */
void fq_push(fair_queue *q, const char *key, fq_node *n);
/* The next request by round-robin among the tenants under their cap, or NULL
 * when none may run now.  any: ignore the cap (the server is stopping). */
fq_node *fq_pop(fair_queue *q, bool any);
/* A popped request is finished: its tenant may run another. */
void fq_done(fair_queue *q, fq_node *n);
/* Requests queued (not popped). */
size_t fq_queued(const fair_queue *q);
/* Tenants with requests queued or running. */
size_t fq_tenants(const fair_queue *q);

#endif
