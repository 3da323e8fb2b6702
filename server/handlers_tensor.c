/* handlers_tensor.c: To, Copy, View, Contiguous, Info, List, Free, Sync. */
#include <stdlib.h>

#include "dtype.h"
#include "wire.h"

static int reply_info(call *c, const reg_entry *e, const tport_tensor *t)
{
  wire_info wi;
  wire_fill_info(&wi, e, t);
  Tport__InfoReply r = TPORT__INFO_REPLY__INIT;
  r.status = wire_ok();
  r.info = &wi.info;
  return call_reply(c, &r.base, NULL, 0);
}

int h_info(call *c)
{
  Tport__InfoRequest *q = (Tport__InfoRequest *)c->req;
  reg_entry *e;
  tport_tensor *t;
  int rc = wire_find_wait(c, q->ref, q->wait_ms, &e, &t);
  if (rc || !e)
    return rc; /* !e: waiting for the name */
  rc = reply_info(c, e, t);
  reg_put(&c->srv->reg, e);
  return rc;
}

int h_to(call *c)
{
  Tport__ToRequest *q = (Tport__ToRequest *)c->req;
  reg_entry *e, *out = NULL;
  tport_tensor *t;
  int rc = wire_find(c, q->ref, "ref", &e, &t);
  if (rc)
    return rc;
  to_options o = {
      .copy = q->copy, .non_blocking = q->non_blocking, .exact_format = q->exact_format};
  if (q->device && *q->device) {
    o.has_device = true;
    rc = wire_device(q->device, "device", tensor_device(t), &o.device, &c->err);
  }
  if (!rc && q->dtype_set) {
    o.has_dtype = true;
    rc = wire_dtype(q->dtype, "dtype", &o.dtype, &c->err);
  }
  if (!rc && q->memory_format_set) {
    o.has_format = true;
    rc = wire_format(q->memory_format, "memory_format", &o.format, &c->err);
  }
  /* the work: what it reads and what it makes */
  if (!rc)
    rc = wire_check_bytes(c, "the source", tensor_numel(t), tport_dtype_size(t->dtype));
  if (!rc)
    rc = wire_check_bytes(c, "the result", tensor_numel(t),
                          tport_dtype_size(o.has_dtype ? o.dtype : t->dtype));
  tport_tensor *res = NULL;
  bool aliased = false;
  /* the result is charged before it is made */
  size_t need = 0;
  reg_reservation paid = REG_RESERVATION_INIT(&c->srv->reg, c->pipe);
  if (!rc)
    rc = tensor_to_nbytes(t, &o, &need, &c->err);
  if (!rc && (rc = wire_charge_begin(c, &paid, need, "To's result")) == TPORT_OK) {
    rc = tensor_to(t, &o, &res, &aliased, &c->err);
    wire_charge_end(&paid);
  }
  if (!rc)
    rc = wire_register_result(c, e, res, aliased, q->name, q->keep, q->ttl_ms, &paid, &out);
  reg_reservation_release(&paid);
  if (!rc) {
    wire_info wi;
    wire_fill_info(&wi, out, out->tensor);
    Tport__ToReply r = TPORT__TO_REPLY__INIT;
    r.status = wire_ok();
    r.info = &wi.info;
    r.alias = aliased;
    rc = wire_reply_stored(c, &r.base, out, e);
  }
  reg_put(&c->srv->reg, out);
  reg_put(&c->srv->reg, e);
  return rc;
}

int h_contiguous(call *c)
{
  Tport__ContiguousRequest *q = (Tport__ContiguousRequest *)c->req;
  reg_entry *e, *out = NULL;
  tport_tensor *t;
  int rc = wire_find(c, q->ref, "ref", &e, &t);
  if (rc)
    return rc;
  tport_memory_format fmt;
  tport_tensor *res = NULL;
  bool aliased = false;
  rc = wire_format(q->memory_format, "memory_format", &fmt, &c->err);
  if (!rc)
    rc = wire_check_bytes(c, "the result", tensor_numel(t), tport_dtype_size(t->dtype));
  size_t need = 0;
  reg_reservation paid = REG_RESERVATION_INIT(&c->srv->reg, c->pipe);
  if (!rc)
    rc = tensor_contiguous_nbytes(t, fmt, &need, &c->err);
  if (!rc && (rc = wire_charge_begin(c, &paid, need, "Contiguous's result")) == TPORT_OK) {
    rc = tensor_contiguous(t, fmt, &res, &aliased, &c->err);
    wire_charge_end(&paid);
  }
  if (!rc)
    rc = wire_register_result(c, e, res, aliased, q->name, q->keep, q->ttl_ms, &paid, &out);
  reg_reservation_release(&paid);
  if (!rc) {
    wire_info wi;
    wire_fill_info(&wi, out, out->tensor);
    Tport__ContiguousReply r = TPORT__CONTIGUOUS_REPLY__INIT;
    r.status = wire_ok();
    r.info = &wi.info;
    r.alias = aliased;
    rc = wire_reply_stored(c, &r.base, out, e);
  }
  reg_put(&c->srv->reg, out);
  reg_put(&c->srv->reg, e);
  return rc;
}

int h_view(call *c)
{
  Tport__ViewRequest *q = (Tport__ViewRequest *)c->req;
  reg_entry *e, *out = NULL;
  tport_tensor *t, *v = NULL;
  int rc = wire_find(c, q->ref, "ref", &e, &t);
  if (rc)
    return rc;
  if (q->n_sizes > TPORT_MAX_DIMS)
    rc = tport_err_set(&c->err, TPORT_INVALID_ARGUMENT, "sizes has %zu dims: the limit is %d",
                       q->n_sizes, TPORT_MAX_DIMS);
  else if (q->n_strides != q->n_sizes)
    rc = tport_err_set(&c->err, TPORT_INVALID_ARGUMENT, "strides has %zu entries but sizes has %zu",
                       q->n_strides, q->n_sizes);
  if (!rc)
    rc =
        tensor_as_strided(t, (int)q->n_sizes, q->sizes, q->strides, q->storage_offset, &v, &c->err);
  /* a view costs nothing now, but whatever reads it later iterates all of it */
  if (!rc)
    rc = wire_check_bytes(c, "the view", tensor_numel(v), tport_dtype_size(v->dtype));
  if (!rc)
    rc = wire_register_result(c, e, v, false, q->name, q->keep, q->ttl_ms, NULL, &out);
  else
    tensor_release(v);
  if (!rc) {
    wire_info wi;
    wire_fill_info(&wi, out, out->tensor);
    Tport__ViewReply r = TPORT__VIEW_REPLY__INIT;
    r.status = wire_ok();
    r.info = &wi.info;
    rc = wire_reply_stored(c, &r.base, out, e);
  }
  reg_put(&c->srv->reg, out);
  reg_put(&c->srv->reg, e);
  return rc;
}

int h_copy(call *c)
{
  Tport__CopyRequest *q = (Tport__CopyRequest *)c->req;
  reg_entry *de, *se;
  tport_tensor *d, *s;
  int rc = wire_find(c, q->dst, "dst", &de, &d);
  if (rc)
    return rc;
  rc = wire_find(c, q->src, "src", &se, &s);
  if (rc) {
    reg_put(&c->srv->reg, de);
    return rc;
  }
  size_t esize = tport_dtype_size(d->dtype) > tport_dtype_size(s->dtype)
                     ? tport_dtype_size(d->dtype)
                     : tport_dtype_size(s->dtype);
  rc = wire_check_bytes(c, "the copy", tensor_numel(d), esize);
  /* the temporaries a copy between layouts, dtypes and devices needs are
   * charged as the engine makes them, and given back when it is done */
  reg_reservation scratch;
  if (!rc && (rc = wire_charge_begin(c, &scratch, 0, "Copy")) == TPORT_OK) {
    rc = tensor_copy_(d, s, q->non_blocking, &c->err);
    wire_charge_end(&scratch);
    reg_reservation_release(&scratch);
  }
  if (!rc) {
    Tport__CopyReply r = TPORT__COPY_REPLY__INIT;
    r.status = wire_ok();
    rc = call_reply(c, &r.base, NULL, 0);
  }
  reg_put(&c->srv->reg, se);
  reg_put(&c->srv->reg, de);
  return rc;
}

int h_list(call *c)
{
  Tport__ListRequest *q = (Tport__ListRequest *)c->req;
  reg_entry **v;
  size_t n;
  if (reg_list(&c->srv->reg, c->pipe, q->prefix, q->named, &v, &n))
    return tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory listing tensors");
  wire_info *wi = calloc(n ? n : 1, sizeof *wi);
  Tport__TensorInfo **infos = calloc(n ? n : 1, sizeof *infos);
  int rc;
  if (!wi || !infos) {
    rc = tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory listing tensors");
  } else {
    for (size_t i = 0; i < n; i++) {
      wire_fill_info(&wi[i], v[i], v[i]->tensor);
      infos[i] = &wi[i].info;
    }
    Tport__ListReply r = TPORT__LIST_REPLY__INIT;
    r.status = wire_ok();
    r.n_tensors = n;
    r.tensors = infos;
    rc = call_reply(c, &r.base, NULL, 0);
  }
  for (size_t i = 0; i < n; i++)
    reg_put(&c->srv->reg, v[i]);
  free(v);
  free(wi);
  free(infos);
  return rc;
}

/* Refs one Free may name (ref and refs together). */
#define FREE_MAX_REFS 1024

/* Frees the tensor of ref, if it exists (true). */
static bool free_one(call *c, const Tport__Ref *ref)
{
  reg_entry *e;
  tport_err ignored;
  if (!ref || reg_find(&c->srv->reg, c->pipe, ref->handle.data, ref->handle.len, ref->name, &e,
                       NULL, &ignored))
    return false;
  reg_remove(&c->srv->reg, e);
  reg_put(&c->srv->reg, e);
  return true;
}

int h_free(call *c)
{
  Tport__FreeRequest *q = (Tport__FreeRequest *)c->req;
  if (!q->ref && !q->n_refs)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT, "ref is missing");
  if (q->n_refs > FREE_MAX_REFS - (q->ref != NULL))
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "refs names %zu tensors: one Free frees at most %d", q->n_refs,
                         FREE_MAX_REFS);
  uint32_t freed = 0;
  if (q->ref && !q->n_refs) {
    /* one ref alone: NOT_FOUND when there is none, as always */
    reg_entry *e;
    int rc = reg_find(&c->srv->reg, c->pipe, q->ref->handle.data, q->ref->handle.len, q->ref->name,
                      &e, NULL, &c->err);
    if (rc)
      return rc;
    reg_remove(&c->srv->reg, e);
    reg_put(&c->srv->reg, e);
    freed = 1;
  } else {
    /* several: each that exists (a collector's frees race the TTL and the
     * names' replacements) */
    freed += free_one(c, q->ref);
    for (size_t i = 0; i < q->n_refs; i++)
      freed += free_one(c, q->refs[i]);
  }
  Tport__FreeReply r = TPORT__FREE_REPLY__INIT;
  r.status = wire_ok();
  r.freed = freed;
  return call_reply(c, &r.base, NULL, 0);
}

int h_sync(call *c)
{
  Tport__SyncRequest *q = (Tport__SyncRequest *)c->req;
  int rc = TPORT_OK;
  if (q->ref) {
    reg_entry *e;
    tport_tensor *t;
    rc = wire_find(c, q->ref, "ref", &e, &t);
    if (rc)
      return rc;
    rc = tensor_sync(t, &c->err);
    reg_put(&c->srv->reg, e);
  } else {
    engine_synchronize_all();
  }
  if (rc)
    return rc;
  Tport__SyncReply r = TPORT__SYNC_REPLY__INIT;
  r.status = wire_ok();
  return call_reply(c, &r.base, NULL, 0);
}
