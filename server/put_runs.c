/* put_runs.c: a PutBatch's runs spread into elements, and answered alike
 * (put_runs.h). */
#include "put_runs.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- answers */

static void keep_key(put_run_info *ri, const wire_info *wi)
{
  const Tport__TensorDesc *d = &wi->desc;
  const Tport__TensorInfo *in = &wi->info;
  ri->dtype = d->dtype;
  ri->ndim = d->n_sizes;
  memcpy(ri->sizes, d->sizes, d->n_sizes * sizeof *d->sizes);
  memcpy(ri->strides, d->strides, d->n_strides * sizeof *d->strides);
  ri->storage_offset = d->storage_offset;
  snprintf(ri->device, sizeof ri->device, "%s", d->device ? d->device : "");
  ri->actual = in->actual_format;
  ri->suggested = in->suggested_format;
  ri->is_contiguous = in->is_contiguous;
  ri->nbytes = in->nbytes;
  ri->managed = in->managed;
  ri->conj = in->conj;
  ri->neg = in->neg;
  ri->expires_unix_ms = in->expires_unix_ms;
  ri->storage_nbytes = in->storage_nbytes;
}

static bool same_key(const put_run_info *ri, const wire_info *wi)
{
  const Tport__TensorDesc *d = &wi->desc;
  const Tport__TensorInfo *in = &wi->info;
  const char *dev = d->device ? d->device : "";
  return ri->dtype == d->dtype && ri->ndim == d->n_sizes &&
         !memcmp(ri->sizes, d->sizes, d->n_sizes * sizeof *d->sizes) &&
         !memcmp(ri->strides, d->strides, d->n_strides * sizeof *d->strides) &&
         ri->storage_offset == d->storage_offset && !strcmp(ri->device, dev) &&
         ri->actual == in->actual_format && ri->suggested == in->suggested_format &&
         ri->is_contiguous == (bool)in->is_contiguous && ri->nbytes == in->nbytes &&
         ri->managed == (bool)in->managed && ri->conj == (bool)in->conj &&
         ri->neg == (bool)in->neg && ri->expires_unix_ms == in->expires_unix_ms &&
         ri->storage_nbytes == in->storage_nbytes;
}

bool put_run_same(put_run_info *ri, const wire_info *wi)
{
  const Tport__TensorDesc *d = &wi->desc;
  /* (a layout's ndim is within the bound; a device's name within 32) */
  if (d->n_sizes > TPORT_MAX_DIMS || d->n_strides != d->n_sizes ||
      (d->device && strlen(d->device) >= sizeof ri->device))
    return false;
  if (ri->set)
    return same_key(ri, wi);
  Tport__TensorInfo info = wi->info;
  info.ref = NULL; /* each element's own: its handle */
  size_t len = protobuf_c_message_get_packed_size(&info.base);
  uint8_t *p = malloc(len ? len : 1);
  if (!p)
    return false; /* answered by a reply of its own */
  protobuf_c_message_pack(&info.base, p);
  ri->packed = p;
  ri->packed_len = len;
  keep_key(ri, wi);
  ri->set = true;
  return true;
}

/* ---------------------------------------------------------------- elements */

/* Run r, checked on its own. */
static int check_run(call *c, const Tport__PutRun *run, size_t r)
{
  const Tport__PutBeginRequest *p = run->put;
  if (!p)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT, "run %zu has no put", r);
  if (!run->count)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT, "run %zu has no elements", r);
  if (!p->commit)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "run %zu: a run's elements commit at once (commit)", r);
  if (p->name && p->name[0])
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "run %zu names its elements '%.64s': a name is one tensor's", r, p->name);
  if (run->n_shm_offsets != (p->shm ? run->count : 0))
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "run %zu: %zu slice offsets for %u elements %s", r, run->n_shm_offsets,
                         run->count, p->shm ? "(one each)" : "without a slice (none)");
  if (p->shm && run->nbytes)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "run %zu: elements in a region carry no payload (nbytes %llu)", r,
                         (unsigned long long)run->nbytes);
  if (run->n_crc32c != (p->crc32c_set ? run->count : 0))
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT, "run %zu: %zu CRC32Cs for %u elements %s",
                         r, run->n_crc32c, run->count,
                         p->crc32c_set ? "(one each)" : "without crc32c_set (none)");
  return TPORT_OK;
}

/* The elements of runs, after the puts, into b (sized). */
static void spread_runs(const Tport__PutBatchRequest *q, batch_puts *b)
{
  size_t i = b->nputs, j = 0, s = 0;
  for (size_t r = 0; r < q->n_runs; r++) {
    const Tport__PutRun *run = q->runs[r];
    const Tport__PutBeginRequest *p = run->put;
    bool own = p->shm || p->crc32c_set;
    for (uint32_t k = 0; k < run->count; k++, i++) {
      b->len[i] = run->nbytes;
      b->run[i] = r + 1;
      b->req[i] = p;
      if (!own)
        continue;
      Tport__PutBeginRequest *e = &b->copies[j++];
      *e = *p;
      if (p->crc32c_set)
        e->crc32c = run->crc32c[k];
      if (p->shm) {
        b->slices[s] = *p->shm;
        b->slices[s].offset = run->shm_offsets[k];
        e->shm = &b->slices[s++];
      }
      b->req[i] = e;
    }
  }
}

/* Whether the elements' lengths are the payload's: the request's error
 * otherwise. */
static int check_lengths(call *c, const batch_puts *b)
{
  size_t total = 0;
  for (size_t i = 0; i < b->n; i++)
    if (b->len[i] > SIZE_MAX || __builtin_add_overflow(total, (size_t)b->len[i], &total) ||
        total > c->payload_len)
      return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                           "the elements' lengths pass the %zu-byte payload at element %zu",
                           c->payload_len, i);
  if (total != c->payload_len)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "the elements' lengths add up to %zu bytes: the payload is %zu", total,
                         c->payload_len);
  return TPORT_OK;
}

int batch_puts_expand(call *c, const Tport__PutBatchRequest *q, size_t max, batch_puts *b)
{
  *b = (batch_puts){.n = q->n_puts, .nputs = q->n_puts, .nruns = q->n_runs};
  if (b->n > max)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "a batch of %zu elements: at most %zu in one request", b->n, max);
  if (q->n_payload_bytes != b->n)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "%zu payload lengths for %zu elements: one each", q->n_payload_bytes,
                         b->n);
  size_t ncopies = 0, nslices = 0;
  for (size_t r = 0; r < q->n_runs; r++) {
    const Tport__PutRun *run = q->runs[r];
    int rc = check_run(c, run, r);
    if (rc)
      return rc;
    if (run->count > max - b->n) /* (b->n <= max: no overflow) */
      return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                           "a batch of more than %zu elements (at run %zu): at most %zu in one "
                           "request",
                           max, r, max);
    b->n += run->count;
    if (run->put->shm || run->put->crc32c_set)
      ncopies += run->count;
    if (run->put->shm)
      nslices += run->count;
  }
  size_t m = b->n ? b->n : 1;
  b->req = malloc(m * sizeof *b->req);
  b->len = malloc(m * sizeof *b->len);
  b->run = malloc(m * sizeof *b->run);
  b->runs = calloc(b->nruns ? b->nruns : 1, sizeof *b->runs);
  b->copies = ncopies ? malloc(ncopies * sizeof *b->copies) : NULL;
  b->slices = nslices ? malloc(nslices * sizeof *b->slices) : NULL;
  if (!b->req || !b->len || !b->run || !b->runs || (ncopies && !b->copies) ||
      (nslices && !b->slices)) {
    batch_puts_free(b);
    return tport_err_set(&c->err, TPORT_RESOURCE_EXHAUSTED, "out of memory for %zu elements", m);
  }
  for (size_t i = 0; i < b->nputs; i++) {
    b->req[i] = q->puts[i];
    b->len[i] = q->payload_bytes[i];
    b->run[i] = 0;
  }
  spread_runs(q, b);
  int rc = check_lengths(c, b);
  if (rc)
    batch_puts_free(b);
  return rc;
}

void batch_puts_free(batch_puts *b)
{
  for (size_t r = 0; b->runs && r < b->nruns; r++)
    free(b->runs[r].packed);
  free(b->req), free(b->len), free(b->run), free(b->runs), free(b->copies), free(b->slices);
  *b = (batch_puts){0};
}
