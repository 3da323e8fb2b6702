/*
 * async.c: the API's calls as requests that complete later (request.c).
 * Each copies what it may not keep a pointer to (sizes, strides, options,
 * refs) into its work, and runs, on a library thread, the same function
 * its blocking call runs on the caller's: client_put, client_get, tport_to,
 * tport_copy, the DLPack calls, the batches.  A put and a get on the socket
 * stop between chunks once cancelled (the put then aborted on the server);
 * small puts queued together leave as one PutBatch.
 */
#include <stdlib.h>
#include <string.h>

#include "client_internal.h"

/* Small puts taken off the queue into one batch, at most. */
#define ASYNC_PUT_BATCH_MAX 256

/* ---------------------------------------------------------------- options */

typedef struct put_work {
  tport_dtype dtype;
  int ndim;
  int64_t sizes[TPORT_MAX_DIMS], strides[TPORT_MAX_DIMS];
  bool has_strides;
  const void *data;
  size_t nbytes;
  const DLTensor *dl; /* a DLPack put */
  tport_put_options opts;
  char *name, *device;
  tport_tensor_info *out;
} put_work;

static void free_put(void *p)
{
  put_work *w = p;
  free(w->name);
  free(w->device);
  free(w);
}

/* w's copy of opts (NULL: the defaults), its strings its own. */
static int copy_put_options(put_work *w, const tport_put_options *opts, tport_err *err)
{
  if (!opts)
    tport_put_options_init(&w->opts);
  else
    w->opts = *opts;
  w->name = opts && opts->name ? strdup(opts->name) : NULL;
  w->device = opts && opts->device ? strdup(opts->device) : NULL;
  if ((opts && opts->name && !w->name) || (opts && opts->device && !w->device))
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  w->opts.name = w->name;
  w->opts.device = w->device;
  return TPORT_OK;
}

static put_work *new_put(const tport_put_options *opts, tport_tensor_info *out, tport_err *err)
{
  put_work *w = calloc(1, sizeof *w);
  if (!w) {
    tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  if (copy_put_options(w, opts, err)) {
    free_put(w);
    return NULL;
  }
  w->out = out;
  return w;
}

/* ---------------------------------------------------------------- puts */

static int run_put(tport_request *r, tport_err *err)
{
  put_work *w = r->work;
  client_put_desc d = {.dtype = w->dtype,
                       .ndim = w->ndim,
                       .sizes = w->sizes,
                       .strides = w->has_strides ? w->strides : NULL,
                       .nbytes = w->nbytes,
                       .data = w->data,
                       .opts = &w->opts,
                       .cancel = &r->cancel};
  return client_put(r->client, &d, w->out, err);
}

static void put_item_of(const put_work *w, tport_put_item *it)
{
  memset(it, 0, sizeof *it);
  it->dtype = w->dtype;
  it->ndim = w->ndim;
  it->sizes = w->sizes;
  it->strides = w->has_strides ? w->strides : NULL;
  it->data = w->data;
  it->nbytes = w->nbytes;
  it->opts = &w->opts;
}

/* A small put, and the small puts queued behind it: one PutBatch. */
static int run_put_small(tport_request *r, tport_err *err)
{
  tport_request *more[ASYNC_PUT_BATCH_MAX];
  size_t k = client_requests_take(r->client, run_put_small, more, ASYNC_PUT_BATCH_MAX - 1);
  if (k == 0)
    return run_put(r, err);
  tport_put_item *items = calloc(k + 1, sizeof *items);
  if (!items) {
    for (size_t i = 0; i < k; i++)
      client_request_finish(more[i], tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory"),
                            err);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  }
  put_item_of(r->work, &items[0]);
  for (size_t i = 0; i < k; i++)
    put_item_of(more[i]->work, &items[i + 1]);
  client_put_batch(r->client, items, k + 1, NULL, NULL); /* each was tested for cancel */
  for (size_t i = 0; i < k; i++) {
    put_work *w = more[i]->work;
    if (w->out && items[i + 1].err.code == TPORT_OK)
      *w->out = items[i + 1].info;
    client_request_finish(more[i], items[i + 1].err.code, &items[i + 1].err);
  }
  put_work *w = r->work;
  if (w->out && items[0].err.code == TPORT_OK)
    *w->out = items[0].info;
  int rc = items[0].err.code;
  if (rc && err)
    *err = items[0].err;
  free(items);
  return rc;
}

int tport_put_async(tport_client *c, tport_dtype dtype, int ndim, const int64_t *sizes,
                    const int64_t *strides, const void *data, size_t nbytes,
                    const tport_put_options *opts, tport_tensor_info *out, tport_request_fn done,
                    void *done_arg, tport_request **req, tport_err *err)
{
  if (ndim < 0 || ndim > TPORT_MAX_DIMS || (ndim && !sizes))
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "ndim is %d: it must be in [0, %d]", ndim,
                         TPORT_MAX_DIMS);
  put_work *w = new_put(opts, out, err);
  if (!w)
    return TPORT_RESOURCE_EXHAUSTED;
  w->dtype = dtype;
  w->ndim = ndim;
  if (ndim)
    memcpy(w->sizes, sizes, (size_t)ndim * sizeof *sizes);
  if (strides && ndim)
    memcpy(w->strides, strides, (size_t)ndim * sizeof *strides);
  w->has_strides = strides != NULL;
  w->data = data;
  w->nbytes = nbytes;
  /* a small one with nothing to report on the way may go in a batch */
  client_run_fn run = client_batch_fits(c, nbytes) && !w->opts.progress ? run_put_small : run_put;
  return client_request_start(c, run, w, free_put, done, done_arg, req, err);
}

static int run_put_dlpack(tport_request *r, tport_err *err)
{
  put_work *w = r->work;
  return tport_put_dlpack(r->client, w->dl, &w->opts, w->out, err);
}

int tport_put_dlpack_async(tport_client *c, const DLTensor *t, const tport_put_options *opts,
                           tport_tensor_info *out, tport_request_fn done, void *done_arg,
                           tport_request **req, tport_err *err)
{
  put_work *w = new_put(opts, out, err);
  if (!w)
    return TPORT_RESOURCE_EXHAUSTED;
  w->dl = t;
  return client_request_start(c, run_put_dlpack, w, free_put, done, done_arg, req, err);
}

/* ---------------------------------------------------------------- gets */

typedef struct get_work {
  tport_ref ref;
  uint32_t wait_ms; /* an info that waits for its name */
  void *buf;
  size_t cap;
  const DLTensor *dl; /* a DLPack get */
  tport_tensor_info *info;
} get_work;

static get_work *new_get(const tport_ref *ref, tport_tensor_info *info, tport_err *err)
{
  get_work *w = calloc(1, sizeof *w);
  if (!w) {
    tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
    return NULL;
  }
  w->ref = *ref;
  w->info = info;
  return w;
}

static int run_get(tport_request *r, tport_err *err)
{
  get_work *w = r->work;
  client_get_desc g = {.ref = &w->ref, .buf = w->buf, .cap = w->cap, .cancel = &r->cancel};
  return client_get(r->client, &g, NULL, NULL, w->info, err);
}

int tport_get_async(tport_client *c, const tport_ref *ref, void *buf, size_t cap,
                    tport_tensor_info *info, tport_request_fn done, void *done_arg,
                    tport_request **req, tport_err *err)
{
  get_work *w = new_get(ref, info, err);
  if (!w)
    return TPORT_RESOURCE_EXHAUSTED;
  w->buf = buf;
  w->cap = cap;
  return client_request_start(c, run_get, w, free, done, done_arg, req, err);
}

static int run_get_dlpack(tport_request *r, tport_err *err)
{
  get_work *w = r->work;
  return tport_get_into_dlpack(r->client, &w->ref, w->dl, w->info, err);
}

int tport_get_into_dlpack_async(tport_client *c, const tport_ref *ref, const DLTensor *dst,
                                tport_tensor_info *info, tport_request_fn done, void *done_arg,
                                tport_request **req, tport_err *err)
{
  get_work *w = new_get(ref, info, err);
  if (!w)
    return TPORT_RESOURCE_EXHAUSTED;
  w->dl = dst;
  return client_request_start(c, run_get_dlpack, w, free, done, done_arg, req, err);
}

static int run_info(tport_request *r, tport_err *err)
{
  get_work *w = r->work;
  return tport_info_wait(r->client, &w->ref, w->wait_ms, w->info, err);
}

int tport_info_async(tport_client *c, const tport_ref *ref, uint32_t wait_ms,
                     tport_tensor_info *out, tport_request_fn done, void *done_arg,
                     tport_request **req, tport_err *err)
{
  if (!out)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "tport_info_async: out is NULL");
  get_work *w = new_get(ref, out, err);
  if (!w)
    return TPORT_RESOURCE_EXHAUSTED;
  w->wait_ms = wait_ms;
  if (wait_ms)
    return client_request_start_waiting(c, run_info, w, free, done, done_arg, req, err);
  return client_request_start(c, run_info, w, free, done, done_arg, req, err);
}

/* ---------------------------------------------------------------- to, copy */

typedef struct op_work {
  tport_ref ref, src;
  tport_to_options opts;
  char *device, *name;
  bool non_blocking;
  tport_tensor_info *out;
  bool *alias;
} op_work;

static void free_op(void *p)
{
  op_work *w = p;
  free(w->device);
  free(w->name);
  free(w);
}

static int run_to(tport_request *r, tport_err *err)
{
  op_work *w = r->work;
  return tport_to(r->client, &w->ref, &w->opts, w->out, w->alias, err);
}

int tport_to_async(tport_client *c, const tport_ref *ref, const tport_to_options *opts,
                   tport_tensor_info *out, bool *alias, tport_request_fn done, void *done_arg,
                   tport_request **req, tport_err *err)
{
  op_work *w = calloc(1, sizeof *w);
  if (!w)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  w->ref = *ref;
  w->opts = *opts;
  w->device = opts->device ? strdup(opts->device) : NULL;
  w->name = opts->name ? strdup(opts->name) : NULL;
  if ((opts->device && !w->device) || (opts->name && !w->name)) {
    free_op(w);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  }
  w->opts.device = w->device;
  w->opts.name = w->name;
  w->out = out;
  w->alias = alias;
  return client_request_start(c, run_to, w, free_op, done, done_arg, req, err);
}

static int run_copy(tport_request *r, tport_err *err)
{
  op_work *w = r->work;
  return tport_copy(r->client, &w->ref, &w->src, w->non_blocking, err);
}

int tport_copy_async(tport_client *c, const tport_ref *dst, const tport_ref *src,
                     bool non_blocking, tport_request_fn done, void *done_arg, tport_request **req,
                     tport_err *err)
{
  op_work *w = calloc(1, sizeof *w);
  if (!w)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  w->ref = *dst;
  w->src = *src;
  w->non_blocking = non_blocking;
  return client_request_start(c, run_copy, w, free_op, done, done_arg, req, err);
}

/* ---------------------------------------------------------------- batches */

typedef struct batch_work {
  tport_put_item *puts;
  tport_get_item *gets;
  DLManagedTensor **managed; /* a DLPack batch get's out */
  size_t n;
} batch_work;

static int run_batch(tport_request *r, tport_err *err)
{
  batch_work *w = r->work;
  return w->puts ? client_put_batch(r->client, w->puts, w->n, &r->cancel, err)
                 : client_get_batch(r->client, w->gets, w->n, w->managed, &r->cancel, err);
}

/* Every element as one cancelled before the request ran, which is what
 * they say when it never runs (tport_cancel, tport_close); a run that
 * starts writes each anew.  Here, on the caller's thread, before the
 * request is queued: a caller reusing its arrays must not find the last
 * batch's results (or DLManagedTensors, deleted twice) in them. */
static void batch_unanswered(tport_put_item *puts, tport_get_item *gets,
                             DLManagedTensor **managed, size_t n)
{
  tport_err never;
  tport_err_set(&never, TPORT_CANCELLED, "the batch's request was cancelled before it started");
  for (size_t i = 0; i < n; i++) {
    *(puts ? &puts[i].err : &gets[i].err) = never;
    if (puts) {
      memset(&puts[i].info, 0, sizeof puts[i].info);
    } else {
      gets[i].data = NULL;
      gets[i].nbytes = 0;
      memset(&gets[i].info, 0, sizeof gets[i].info);
    }
    if (managed)
      managed[i] = NULL;
  }
}

static int start_batch(tport_client *c, tport_put_item *puts, tport_get_item *gets,
                       DLManagedTensor **managed, size_t n, tport_request_fn done, void *done_arg,
                       tport_request **req, tport_err *err)
{
  batch_unanswered(puts, gets, managed, n);
  batch_work *w = calloc(1, sizeof *w);
  if (!w)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  w->puts = puts;
  w->gets = gets;
  w->managed = managed;
  w->n = n;
  return client_request_start(c, run_batch, w, free, done, done_arg, req, err);
}

int tport_put_batch_async(tport_client *c, tport_put_item *items, size_t n, tport_request_fn done,
                          void *done_arg, tport_request **req, tport_err *err)
{
  return start_batch(c, items, NULL, NULL, n, done, done_arg, req, err);
}

int tport_get_batch_async(tport_client *c, tport_get_item *items, size_t n, tport_request_fn done,
                          void *done_arg, tport_request **req, tport_err *err)
{
  return start_batch(c, NULL, items, NULL, n, done, done_arg, req, err);
}

int tport_get_batch_dlpack_async(tport_client *c, tport_get_item *items, size_t n,
                                 DLManagedTensor **out, tport_request_fn done, void *done_arg,
                                 tport_request **req, tport_err *err)
{
  if (n && !out)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "out is NULL: it has a slot per element");
  return start_batch(c, NULL, items, out, n, done, done_arg, req, err);
}
