/*
 * wire.h: between protobuf messages and the engine: refs, tensor info,
 * options.  Every value read from a message is checked here or by the engine.
 */
#ifndef TPORT_WIRE_H
#define TPORT_WIRE_H

#include "server_internal.h"

/* Storage for a TensorInfo that points into a tensor (valid while it lives). */
typedef struct wire_info {
  Tport__TensorInfo info;
  Tport__TensorDesc desc;
  Tport__Ref ref;
  char device[32];
} wire_info;

/* Fills wi from entry e (its ref) and tensor t. */
void wire_fill_info(wire_info *wi, const reg_entry *e, const tport_tensor *t);
/* Finds a ready tensor by ref: NOT_FOUND, or FAILED_PRECONDITION while it uploads.
 * On success *e holds a reference (reg_put it) and *t is its tensor. */
int wire_find(call *c, const Tport__Ref *ref, const char *field, reg_entry **e, tport_tensor **t);
/* wire_find, waiting for a ref by name that finds no ready tensor (absent,
 * or still uploading) up to wait_ms from the request's arrival (at most
 * --deadline): the request's waiter is registered and *e is NULL with
 * TPORT_OK -- the handler returns at once, without a reply, and is run
 * again when the name is published or the time is up (then
 * DEADLINE_EXCEEDED).  A ref by handle, or wait_ms 0, is wire_find.  A
 * draining server answers UNAVAILABLE instead of waiting. */
int wire_find_wait(call *c, const Tport__Ref *ref, uint32_t wait_ms, reg_entry **e,
                   tport_tensor **t);
/* A device string from the wire: empty means `fallback`. */
int wire_device(const char *s, const char *field, tport_device fallback, tport_device *out,
                tport_err *err);
int wire_dtype(int v, const char *field, tport_dtype *out, tport_err *err);
int wire_format(int v, const char *field, tport_memory_format *out, tport_err *err);
/* A status OK message (static, shared). */
Tport__Status *wire_ok(void);
/* The time since since_ns spent in stage st: observed in the stage's
 * histogram, or added to the batch's sums for a batch's element
 * (call.stage_ns). */
void wire_stage_since(call *c, metrics_stage st, int64_t since_ns);
/* The reply to a request that stored out (a result, a put): sent, or where
 * it cannot be made, out removed -- the client, told the request failed,
 * never learns of it, so nothing may stay stored under it (nor hold its
 * name).  in: the request's input, which an aliased result may be (never
 * removed). */
int wire_reply_stored(call *c, ProtobufCMessage *reply, reg_entry *out, const reg_entry *in);
/* Registers a result of to/contiguous/view: aliased results with no name
 * reuse the input's entry (unless keep asks to keep a connection-scoped
 * input).  The tenant pays for the result's storage unless it already does,
 * from paid (may be NULL: what the request reserved for it, given back in
 * any case).  On success *out holds a reference. */
int wire_register_result(call *c, reg_entry *in, tport_tensor *res, bool aliased, const char *name,
                         bool keep, uint64_t ttl_ms, reg_reservation *paid, reg_entry **out);
/* Every byte the engine allocates for a request is charged to the request's
 * tenant before it is allocated.  wire_charge_begin initializes res,
 * reserves `upfront` bytes (what the request is known to make: its result),
 * refused RESOURCE_EXHAUSTED naming `what`, the bytes asked and the bytes
 * left before any work is done, and then makes each engine allocation of
 * this thread draw from res -- reserving more for what was not known up
 * front (a copy's temporaries) -- until wire_charge_end (call it whatever
 * happened).  What is left in res goes with reg_add (wire_register_result)
 * or reg_reservation_release. */
int wire_charge_begin(call *c, reg_reservation *res, size_t upfront, const char *what);
/* The same for memory that may outlive the request (what a get lends to its
 * replies: its copy, read-back blocks): each allocation is charged from
 * res's upfront bytes, or against the quota, for as long as it lives,
 * released when it is freed -- after nng has sent the reply that held it. */
int wire_charge_lend_begin(call *c, reg_reservation *res, size_t upfront, const char *what);
void wire_charge_end(reg_reservation *res);
/* The work of a request is bounded by what it makes and what it iterates:
 * numel elements of esize bytes (overflow-checked) must fit in --max-tensor,
 * else RESOURCE_EXHAUSTED naming `what`. */
int wire_check_bytes(call *c, const char *what, int64_t numel, size_t esize);

#endif
