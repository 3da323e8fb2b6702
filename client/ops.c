/* ops.c: libtport's one-request operations (info, to, copy, view,
 * contiguous, free, sync, list, devices, stats).  Puts and gets, which move
 * bytes, are path.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"

/* A request whose reply carries nothing but its status. */
static int call_status(tport_client *c, uint16_t method, const ProtobufCMessage *q,
                       const ProtobufCMessageDescriptor *d, tport_err *err)
{
  ProtobufCMessage *r;
  int rc = client_rpc(c, method, q, NULL, 0, d, &r, NULL, err);
  if (!rc)
    protobuf_c_message_free_unpacked(r, NULL);
  return rc;
}

int tport_info(tport_client *c, const tport_ref *ref, tport_tensor_info *out, tport_err *err)
{
  Tport__Ref w;
  client_ref_to_wire(ref, &w);
  Tport__InfoRequest q = TPORT__INFO_REQUEST__INIT;
  q.ref = &w;
  Tport__InfoReply *r;
  int rc = client_rpc(c, TPORT__METHOD__METHOD_INFO, &q.base, NULL, 0,
                      &tport__info_reply__descriptor, (ProtobufCMessage **)&r, NULL, err);
  if (!rc) {
    client_info_from_wire(r->info, out);
    protobuf_c_message_free_unpacked(&r->base, NULL);
  }
  return rc;
}

int tport_info_wait(tport_client *c, const tport_ref *ref, uint32_t wait_ms, tport_tensor_info *out,
                    tport_err *err)
{
  Tport__Ref w;
  client_ref_to_wire(ref, &w);
  Tport__InfoRequest q = TPORT__INFO_REQUEST__INIT;
  q.ref = &w;
  q.wait_ms = wait_ms;
  Tport__InfoReply *r;
  int rc = client_rpc_waiting(c, wait_ms, TPORT__METHOD__METHOD_INFO, &q.base,
                              &tport__info_reply__descriptor, (ProtobufCMessage **)&r, NULL, NULL,
                              err);
  if (!rc) {
    client_info_from_wire(r->info, out);
    protobuf_c_message_free_unpacked(&r->base, NULL);
  }
  return rc;
}

int tport_to(tport_client *c, const tport_ref *ref, const tport_to_options *o,
             tport_tensor_info *out, bool *alias, tport_err *err)
{
  Tport__Ref w;
  client_ref_to_wire(ref, &w);
  Tport__ToRequest q = TPORT__TO_REQUEST__INIT;
  q.ref = &w;
  q.device = (char *)(o->device ? o->device : "");
  q.dtype_set = o->has_dtype;
  q.dtype = (Tport__DType)o->dtype;
  q.memory_format_set = o->has_memory_format;
  q.memory_format = (Tport__MemoryFormat)o->memory_format;
  q.copy = o->copy;
  q.non_blocking = o->non_blocking;
  q.exact_format = o->exact_format;
  q.name = (char *)(o->name ? o->name : "");
  q.ttl_ms = o->ttl_ms;
  q.keep = c->keep;
  Tport__ToReply *r;
  int rc = client_rpc(c, TPORT__METHOD__METHOD_TO, &q.base, NULL, 0, &tport__to_reply__descriptor,
                      (ProtobufCMessage **)&r, NULL, err);
  if (!rc) {
    if (out)
      client_info_from_wire(r->info, out);
    if (alias)
      *alias = r->alias;
    protobuf_c_message_free_unpacked(&r->base, NULL);
  }
  return rc;
}

int tport_copy(tport_client *c, const tport_ref *dst, const tport_ref *src, bool non_blocking,
               tport_err *err)
{
  Tport__Ref wd, ws;
  client_ref_to_wire(dst, &wd);
  client_ref_to_wire(src, &ws);
  Tport__CopyRequest q = TPORT__COPY_REQUEST__INIT;
  q.dst = &wd;
  q.src = &ws;
  q.non_blocking = non_blocking;
  return call_status(c, TPORT__METHOD__METHOD_COPY, &q.base, &tport__copy_reply__descriptor, err);
}

int tport_view(tport_client *c, const tport_ref *ref, int ndim, const int64_t *sizes,
               const int64_t *strides, int64_t offset, const char *name, tport_tensor_info *out,
               tport_err *err)
{
  if (ndim < 0 || ndim > TPORT_MAX_DIMS)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "ndim is %d: it must be in [0, %d]", ndim,
                         TPORT_MAX_DIMS);
  Tport__Ref w;
  client_ref_to_wire(ref, &w);
  Tport__ViewRequest q = TPORT__VIEW_REQUEST__INIT;
  q.ref = &w;
  q.n_sizes = q.n_strides = (size_t)ndim;
  q.sizes = (int64_t *)sizes;
  q.strides = (int64_t *)strides;
  q.storage_offset = offset;
  q.name = (char *)(name ? name : "");
  q.keep = c->keep;
  Tport__ViewReply *r;
  int rc = client_rpc(c, TPORT__METHOD__METHOD_VIEW, &q.base, NULL, 0,
                      &tport__view_reply__descriptor, (ProtobufCMessage **)&r, NULL, err);
  if (!rc) {
    if (out)
      client_info_from_wire(r->info, out);
    protobuf_c_message_free_unpacked(&r->base, NULL);
  }
  return rc;
}

int tport_contiguous(tport_client *c, const tport_ref *ref, tport_memory_format fmt,
                     const char *name, tport_tensor_info *out, bool *alias, tport_err *err)
{
  Tport__Ref w;
  client_ref_to_wire(ref, &w);
  Tport__ContiguousRequest q = TPORT__CONTIGUOUS_REQUEST__INIT;
  q.ref = &w;
  q.memory_format = (Tport__MemoryFormat)fmt;
  q.name = (char *)(name ? name : "");
  q.keep = c->keep;
  Tport__ContiguousReply *r;
  int rc = client_rpc(c, TPORT__METHOD__METHOD_CONTIGUOUS, &q.base, NULL, 0,
                      &tport__contiguous_reply__descriptor, (ProtobufCMessage **)&r, NULL, err);
  if (!rc) {
    if (out)
      client_info_from_wire(r->info, out);
    if (alias)
      *alias = r->alias;
    protobuf_c_message_free_unpacked(&r->base, NULL);
  }
  return rc;
}

int tport_free(tport_client *c, const tport_ref *ref, tport_err *err)
{
  Tport__Ref w;
  client_ref_to_wire(ref, &w);
  Tport__FreeRequest q = TPORT__FREE_REQUEST__INIT;
  q.ref = &w;
  return call_status(c, TPORT__METHOD__METHOD_FREE, &q.base, &tport__free_reply__descriptor, err);
}

int tport_free_many(tport_client *c, const tport_ref *refs, size_t n, size_t *freed, tport_err *err)
{
  if (freed)
    *freed = 0;
  if (n && !refs)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "refs is NULL");
  size_t per = n < TPORT_FREE_MAX_REFS ? n : TPORT_FREE_MAX_REFS;
  Tport__Ref *w = calloc(per ? per : 1, sizeof *w);
  Tport__Ref **pw = calloc(per ? per : 1, sizeof *pw);
  int rc = w && pw ? TPORT_OK : tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  for (size_t done = 0; !rc && done < n; done += per) {
    size_t k = n - done < per ? n - done : per;
    for (size_t i = 0; i < k; i++) {
      client_ref_to_wire(&refs[done + i], &w[i]);
      pw[i] = &w[i];
    }
    Tport__FreeRequest q = TPORT__FREE_REQUEST__INIT;
    q.n_refs = k;
    q.refs = pw;
    Tport__FreeReply *r;
    rc = client_rpc(c, TPORT__METHOD__METHOD_FREE, &q.base, NULL, 0, &tport__free_reply__descriptor,
                    (ProtobufCMessage **)&r, NULL, err);
    if (!rc) {
      if (freed)
        *freed += r->freed;
      protobuf_c_message_free_unpacked(&r->base, NULL);
    }
  }
  free(w);
  free(pw);
  return rc;
}

int tport_sync(tport_client *c, const tport_ref *ref, tport_err *err)
{
  Tport__Ref w;
  Tport__SyncRequest q = TPORT__SYNC_REQUEST__INIT;
  if (ref) {
    client_ref_to_wire(ref, &w);
    q.ref = &w;
  }
  return call_status(c, TPORT__METHOD__METHOD_SYNC, &q.base, &tport__sync_reply__descriptor, err);
}

static int by_name(const void *a, const void *b)
{
  return strcmp(((const tport_tensor_info *)a)->ref.name, ((const tport_tensor_info *)b)->ref.name);
}

/* List; named: only the named tensors under prefix, sorted by name. */
static int list(tport_client *c, const char *prefix, bool named, tport_tensor_info **out,
                size_t *n, tport_err *err)
{
  Tport__ListRequest q = TPORT__LIST_REQUEST__INIT;
  q.prefix = (char *)(prefix ? prefix : "");
  q.named = named;
  Tport__ListReply *r;
  int rc = client_rpc(c, TPORT__METHOD__METHOD_LIST, &q.base, NULL, 0,
                      &tport__list_reply__descriptor, (ProtobufCMessage **)&r, NULL, err);
  if (rc)
    return rc;
  tport_tensor_info *v = calloc(r->n_tensors ? r->n_tensors : 1, sizeof *v);
  if (!v) {
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  }
  size_t k = 0, plen = strlen(q.prefix);
  for (size_t i = 0; i < r->n_tensors; i++) {
    client_info_from_wire(r->tensors[i], &v[k]);
    /* (a server older than the prefix sends every tensor: the filter again) */
    k += !named || (v[k].ref.name[0] && strncmp(v[k].ref.name, q.prefix, plen) == 0);
  }
  protobuf_c_message_free_unpacked(&r->base, NULL);
  if (named)
    qsort(v, k, sizeof *v, by_name);
  *n = k;
  *out = v;
  return TPORT_OK;
}

int tport_list(tport_client *c, tport_tensor_info **out, size_t *n, tport_err *err)
{
  return list(c, NULL, false, out, n, err);
}

int tport_list_named(tport_client *c, const char *prefix, tport_tensor_info **out, size_t *n,
                     tport_err *err)
{
  return list(c, prefix, true, out, n, err);
}

int tport_devices(tport_client *c, tport_device_info **out, size_t *n, char *cuda_reason,
                  size_t reason_len, tport_err *err)
{
  Tport__DevicesRequest q = TPORT__DEVICES_REQUEST__INIT;
  Tport__DevicesReply *r;
  int rc = client_rpc(c, TPORT__METHOD__METHOD_DEVICES, &q.base, NULL, 0,
                      &tport__devices_reply__descriptor, (ProtobufCMessage **)&r, NULL, err);
  if (rc)
    return rc;
  tport_device_info *v = calloc(r->n_devices ? r->n_devices : 1, sizeof *v);
  if (!v) {
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  }
  for (size_t i = 0; i < r->n_devices; i++) {
    const Tport__DeviceInfo *d = r->devices[i];
    snprintf(v[i].device, sizeof v[i].device, "%s", d->device ? d->device : "");
    snprintf(v[i].name, sizeof v[i].name, "%s", d->name ? d->name : "");
    snprintf(v[i].compute_capability, sizeof v[i].compute_capability, "%s",
             d->compute_capability ? d->compute_capability : "");
    v[i].total_bytes = d->total_bytes;
    v[i].free_bytes = d->free_bytes;
    v[i].free_hidden = d->free_hidden;
    v[i].managed_memory = d->managed_memory;
    for (size_t p = 0; p < d->n_peer_access && p < 16; p++)
      snprintf(v[i].peers[v[i].npeers++], sizeof v[i].peers[0], "%s", d->peer_access[p]);
  }
  if (cuda_reason && reason_len)
    snprintf(cuda_reason, reason_len, "%s",
             r->cuda_unavailable_reason ? r->cuda_unavailable_reason : "");
  *n = r->n_devices;
  *out = v;
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return TPORT_OK;
}

int tport_stats(tport_client *c, tport_counter **out, size_t *n, tport_err *err)
{
  Tport__StatsRequest q = TPORT__STATS_REQUEST__INIT;
  Tport__StatsReply *r;
  int rc = client_rpc(c, TPORT__METHOD__METHOD_STATS, &q.base, NULL, 0,
                      &tport__stats_reply__descriptor, (ProtobufCMessage **)&r, NULL, err);
  if (rc)
    return rc;
  tport_counter *v = calloc(r->n_counters ? r->n_counters : 1, sizeof *v);
  if (!v) {
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  }
  for (size_t i = 0; i < r->n_counters; i++) {
    snprintf(v[i].name, sizeof v[i].name, "%s", r->counters[i]->name);
    v[i].value = r->counters[i]->value;
  }
  *n = r->n_counters;
  *out = v;
  protobuf_c_message_free_unpacked(&r->base, NULL);
  return TPORT_OK;
}
