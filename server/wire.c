/* wire.c: protobuf <-> engine helpers (see wire.h). */
#include "wire.h"

#include "device.h"
#include "dtype.h"

Tport__Status *wire_ok(void)
{
  static Tport__Status ok = TPORT__STATUS__INIT;
  return &ok;
}

void wire_fill_info(wire_info *wi, const reg_entry *e, const tport_tensor *t)
{
  tport__tensor_info__init(&wi->info);
  tport__tensor_desc__init(&wi->desc);
  tport__ref__init(&wi->ref);
  wi->ref.handle.data = (uint8_t *)e->handle;
  wi->ref.handle.len = REG_HANDLE_BYTES;
  wi->ref.name = (char *)e->name;
  wi->desc.dtype = (Tport__DType)t->dtype;
  wi->desc.n_sizes = wi->desc.n_strides = (size_t)t->layout.ndim;
  wi->desc.sizes = (int64_t *)t->layout.sizes;
  wi->desc.strides = (int64_t *)t->layout.strides;
  wi->desc.storage_offset = t->layout.offset;
  wi->desc.device = (char *)device_format(tensor_device(t), wi->device, sizeof wi->device);
  wi->info.ref = &wi->ref;
  wi->info.desc = &wi->desc;
  wi->info.actual_format = (Tport__MemoryFormat)meta_actual_memory_format(&t->layout);
  wi->info.suggested_format = (Tport__MemoryFormat)meta_suggest_memory_format(&t->layout);
  wi->info.is_contiguous = meta_is_contiguous(&t->layout);
  wi->info.nbytes = (int64_t)tensor_nbytes(t);
  wi->info.managed = tensor_is_managed(t);
  wi->info.conj = t->conj;
  wi->info.neg = t->neg;
  wi->info.expires_unix_ms = e->expires_ms;
  wi->info.storage_nbytes = (int64_t)storage_nbytes(t->storage);
}

int wire_find(call *c, const Tport__Ref *ref, const char *field, reg_entry **e, tport_tensor **t)
{
  if (!ref)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT, "%s is missing", field);
  reg_state state;
  int rc = reg_find(&c->srv->reg, c->pipe, ref->handle.data, ref->handle.len, ref->name, e, &state,
                    &c->err);
  if (rc)
    return rc;
  if (state != REG_READY) {
    reg_put(&c->srv->reg, *e);
    *e = NULL;
    return tport_err_set(&c->err, TPORT_FAILED_PRECONDITION,
                         "%s is still being uploaded (commit it first)", field);
  }
  *t = (*e)->tensor;
  return TPORT_OK;
}

int wire_find_wait(call *c, const Tport__Ref *ref, uint32_t wait_ms, reg_entry **e,
                   tport_tensor **t)
{
  *e = NULL;
  /* no waiter: a call that cannot park (a batch's element) looks once */
  if (!wait_ms || !c->waiter || !ref || ref->handle.len || !ref->name || !*ref->name)
    return wire_find(c, ref, "ref", e, t);
  server *s = c->srv;
  uint64_t wait = wait_ms < s->cfg.deadline_ms ? wait_ms : s->cfg.deadline_ms;
  int64_t until = c->first_ms + (int64_t)wait;
  if (mono_ms() >= until) {
    int rc = wire_find(c, ref, "ref", e, t);
    if (rc == TPORT_NOT_FOUND || rc == TPORT_FAILED_PRECONDITION)
      rc = tport_err_set(&c->err, TPORT_DEADLINE_EXCEEDED,
                         "no tensor named '%.100s' was ready within %llu ms", ref->name,
                         (unsigned long long)wait);
    return rc;
  }
  if (atomic_load(&s->draining))
    return tport_err_set(&c->err, TPORT_UNAVAILABLE,
                         "the server is stopping: it waits for no name");
  int rc = reg_find_or_wait(&s->reg, c->pipe, ref->name, c->waiter, e, &c->err);
  if (rc)
    return rc;
  if (*e)
    *t = (*e)->tensor;
  else
    c->park_until_ms = until;
  return TPORT_OK;
}

int wire_device(const char *s, const char *field, tport_device fallback, tport_device *out,
                tport_err *err)
{
  if (!s || !*s) {
    *out = fallback;
    return TPORT_OK;
  }
  int rc = device_parse(s, field, out, err);
  if (!rc && out->index < 0)
    out->index = 0;
  return rc;
}

int wire_dtype(int v, const char *field, tport_dtype *out, tport_err *err)
{
  if (!dtype_name(v))
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s is %d: not a dtype", field, v);
  *out = (tport_dtype)v;
  return TPORT_OK;
}

int wire_format(int v, const char *field, tport_memory_format *out, tport_err *err)
{
  if (v < TPORT_MF_CONTIGUOUS || v > TPORT_MF_PRESERVE)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "%s is %d: contiguous, channels_last, channels_last_3d or preserve", field,
                         v);
  *out = (tport_memory_format)v;
  return TPORT_OK;
}

void wire_stage_since(call *c, metrics_stage st, int64_t since_ns)
{
  int64_t ns = metrics_now_ns() - since_ns;
  if (c->stage_ns)
    c->stage_ns[st] += ns > 0 ? ns : 0;
  else
    metrics_observe(&c->srv->metrics.stage[st], ns);
}

int wire_reply_stored(call *c, ProtobufCMessage *reply, reg_entry *out, const reg_entry *in)
{
  int rc = call_reply(c, reply, NULL, 0);
  if (rc && out != in)
    reg_remove(&c->srv->reg, out);
  return rc;
}

int wire_register_result(call *c, reg_entry *in, tport_tensor *res, bool aliased, const char *name,
                         bool keep, uint64_t ttl_ms, reg_reservation *paid, reg_entry **out)
{
  registry *r = &c->srv->reg;
  if (aliased && (!name || !*name) && (!keep || !reg_connection_scoped(r, in))) {
    reg_reservation_release(paid);
    tensor_release(res);
    pthread_mutex_lock(&r->mu);
    in->refs++;
    pthread_mutex_unlock(&r->mu);
    *out = in;
    return TPORT_OK;
  }
  return reg_add(r, c->pipe, res, NULL, name, keep, ttl_ms, 0, paid, out, &c->err);
}

int wire_charge_begin(call *c, reg_reservation *res, size_t upfront, const char *what)
{
  *res = REG_RESERVATION_INIT(&c->srv->reg, c->pipe);
  int rc = reg_reserve(res, upfront, what, &c->err);
  if (!rc)
    engine_set_alloc_guard(reg_reservation_guard, res);
  return rc;
}

int wire_charge_lend_begin(call *c, reg_reservation *res, size_t upfront, const char *what)
{
  *res = REG_RESERVATION_INIT(&c->srv->reg, c->pipe);
  res->for_life = true;
  int rc = reg_reserve(res, upfront, what, &c->err);
  if (!rc)
    engine_set_alloc_guard(reg_reservation_guard, res);
  return rc;
}

void wire_charge_end(reg_reservation *res)
{
  (void)res;
  engine_set_alloc_guard(NULL, NULL);
}

int wire_check_bytes(call *c, const char *what, int64_t numel, size_t esize)
{
  int64_t bytes;
  size_t limit = c->srv->cfg.max_tensor_bytes;
  if (numel < 0 || __builtin_mul_overflow(numel, (int64_t)esize, &bytes) || (uint64_t)bytes > limit)
    return tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED,
                         "%s would be %lld elements of %zu bytes: the limit per tensor is %zu bytes",
                         what, (long long)numel, esize, limit);
  return TPORT_OK;
}
