/*
 * wire.c: what libtport says on the wire and reads back from it -- refs,
 * tensor infos, a put's request -- and the checks of a reply against what
 * the caller expects.  Pure conversions: nothing here sends a request, so
 * every other file may use them.
 */
#include <stdio.h>
#include <string.h>

#include "client_internal.h"

void tport_put_options_init(tport_put_options *o)
{
  memset(o, 0, sizeof *o);
  o->memory_format = TPORT_MF_PRESERVE;
}

void client_put_request(tport_client *c, tport_dtype dtype, int ndim, const int64_t *sizes,
                        const int64_t *strides, const tport_put_options *opts,
                        Tport__TensorDesc *desc, Tport__PutBeginRequest *q)
{
  tport__tensor_desc__init(desc);
  desc->dtype = (Tport__DType)dtype;
  desc->n_sizes = (size_t)ndim;
  desc->sizes = (int64_t *)sizes;
  desc->n_strides = strides ? (size_t)ndim : 0;
  desc->strides = (int64_t *)strides;
  tport__put_begin_request__init(q);
  q->desc = desc;
  q->name = (char *)(opts->name ? opts->name : "");
  q->ttl_ms = opts->ttl_ms;
  q->replace = opts->replace;
  q->device = (char *)(opts->device ? opts->device : "");
  q->dtype_set = opts->has_dtype;
  q->dtype = (Tport__DType)opts->dtype;
  q->memory_format = (Tport__MemoryFormat)opts->memory_format;
  q->managed = opts->managed;
  q->non_blocking = opts->non_blocking;
  q->keep = c->keep;
}

/* A tensor the caller's does not match (want). */
int client_want_mismatch(const client_get_want *w, const Tport__TensorInfo *wire, tport_err *err)
{
  if (!wire)
    return tport_err_set(err, TPORT_DATA_LOSS, "the get's reply describes no tensor");
  tport_tensor_info ti;
  client_info_from_wire(wire, &ti);
  /* DLPack 0.6 has no bool: a bool tensor goes into uint8 */
  bool bool_as_u8 = w->dtype == TPORT_UINT8 && ti.dtype == TPORT_BOOL;
  if (ti.dtype != w->dtype && !bool_as_u8)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "the tensor's dtype is %d: the destination's is %d (tport_dtype)",
                         (int)ti.dtype, (int)w->dtype);
  if (ti.ndim != w->ndim)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "the tensor has %d dimensions: the destination has %d", ti.ndim, w->ndim);
  for (int d = 0; d < w->ndim; d++)
    if (ti.sizes[d] != w->sizes[d])
      return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                           "the tensor's sizes[%d] is %lld: the destination's is %lld", d,
                           (long long)ti.sizes[d], (long long)w->sizes[d]);
  return TPORT_OK;
}

void tport_ref_name(tport_ref *ref, const char *name)
{
  memset(ref, 0, sizeof *ref);
  snprintf(ref->name, sizeof ref->name, "%s", name ? name : "");
}

static bool handle_is_zero(const tport_ref *r)
{
  for (int i = 0; i < TPORT_HANDLE_BYTES; i++)
    if (r->handle[i])
      return false;
  return true;
}

void tport_ref_format(const tport_ref *ref, char *buf, size_t len)
{
  if (!handle_is_zero(ref) || !ref->name[0]) {
    char hex[2 * TPORT_HANDLE_BYTES + 1];
    for (int i = 0; i < TPORT_HANDLE_BYTES; i++)
      snprintf(hex + 2 * i, 3, "%02x", ref->handle[i]);
    snprintf(buf, len, "%s", hex);
  } else {
    snprintf(buf, len, "%s", ref->name);
  }
}

int tport_ref_parse(const char *text, tport_ref *ref, tport_err *err)
{
  memset(ref, 0, sizeof *ref);
  if (!text || !*text)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "an empty REF");
  size_t n = strlen(text);
  bool hex = n == 2 * TPORT_HANDLE_BYTES;
  for (size_t i = 0; hex && i < n; i++)
    hex = (text[i] >= '0' && text[i] <= '9') || (text[i] >= 'a' && text[i] <= 'f');
  if (hex) {
    for (int i = 0; i < TPORT_HANDLE_BYTES; i++) {
      unsigned v;
      sscanf(text + 2 * i, "%2x", &v);
      ref->handle[i] = (uint8_t)v;
    }
    return TPORT_OK;
  }
  if (n >= TPORT_NAME_MAX)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "name is longer than %d bytes",
                         TPORT_NAME_MAX - 1);
  memcpy(ref->name, text, n + 1);
  return TPORT_OK;
}

void client_ref_to_wire(const tport_ref *ref, Tport__Ref *w)
{
  tport__ref__init(w);
  if (!handle_is_zero(ref)) {
    w->handle.data = (uint8_t *)ref->handle;
    w->handle.len = TPORT_HANDLE_BYTES;
  } else {
    w->name = (char *)ref->name;
  }
}

/* src (NULL: "") into dst's cap bytes, cut short as snprintf's "%s" would:
 * without the formatting, which a batch of 10,000 small puts paid twice an
 * element here. */
static void copy_cut(char *dst, size_t cap, const char *src)
{
  size_t n = src ? strnlen(src, cap - 1) : 0;
  memcpy(dst, src ? src : "", n);
  dst[n] = '\0';
}

void client_info_from_wire(const Tport__TensorInfo *w, tport_tensor_info *out)
{
  memset(out, 0, sizeof *out);
  if (!w)
    return;
  if (w->ref) {
    if (w->ref->handle.len == TPORT_HANDLE_BYTES)
      memcpy(out->ref.handle, w->ref->handle.data, TPORT_HANDLE_BYTES);
    copy_cut(out->ref.name, sizeof out->ref.name, w->ref->name);
  }
  if (w->desc) {
    out->dtype = (tport_dtype)w->desc->dtype;
    out->ndim = (int)(w->desc->n_sizes <= TPORT_MAX_DIMS ? w->desc->n_sizes : TPORT_MAX_DIMS);
    for (int d = 0; d < out->ndim; d++) {
      out->sizes[d] = w->desc->sizes[d];
      out->strides[d] = d < (int)w->desc->n_strides ? w->desc->strides[d] : 0;
    }
    out->storage_offset = w->desc->storage_offset;
    copy_cut(out->device, sizeof out->device, w->desc->device);
  }
  out->actual_format = (tport_memory_format)w->actual_format;
  out->suggested_format = (tport_memory_format)w->suggested_format;
  out->is_contiguous = w->is_contiguous;
  out->nbytes = w->nbytes;
  out->storage_nbytes = w->storage_nbytes;
  out->managed = w->managed;
  out->conj = w->conj;
  out->neg = w->neg;
  out->expires_unix_ms = w->expires_unix_ms;
}
