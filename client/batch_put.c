/*
 * batch_put.c: tport_put_batch -- n tensors through one window of requests.
 *
 * The elements travel three ways, all in the same window (window.c's
 * client_run_units), so that it never drains between them:
 *   - small ones ride together: a PutBatch carries up to BATCH_MAX_ELEMENTS
 *     of them and a chunk's worth of their bytes, each element a PutBegin
 *     that commits at once;
 *   - one of at least BATCH_LEND_MIN up to a chunk rides too, its bytes lent
 *     to the request (nng sends them from the caller's memory) rather than
 *     copied, up to four such a request (nng_msg_add_tail: the 1-4 MB
 *     weights of a state dict went one a request, and on a VM a request's
 *     wake-ups cost more than its bytes);
 *   - one of several chunks is begun, uncommitted, in a PutBatch with the
 *     others of its kind (the batch's first request), then its chunks go as
 *     PutChunks and its PutCommit follows them.  A chunk waits for its
 *     PutBegin's answer, a commit for its chunks'; a commit goes one
 *     element late, behind the next one's chunks, so that the window stays
 *     full while it waits.  Before this each went as a put of its own: two
 *     round trips and a drained window apiece (ResNet-50's five 8-9 MB
 *     tensors cost ~6 ms of 60).
 * Where the automatic region is on, tensors of at least its size go by
 * path.c as a tport_put of their own would (one copy into the region beats
 * the socket), and the small ones' bytes go through it too: each group in
 * flight has a slot of it (batch_region.h), the request names slices.  An
 * element begun with a server that refuses it (a server before uncommitted
 * batch elements) or whose chunks are smaller than the client's goes by
 * path.c too, after the window.  Every element keeps its
 * own result; one that fails mid-way is aborted on the server.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batch_put.h"

bool client_batch_fits(const tport_client *c, size_t nbytes)
{
  return nbytes < CLIENT_SHM_MIN_BYTES && nbytes <= c->chunk_bytes;
}

/* Whether an element rides in a batch's request: a small one always; one
 * of up to a chunk where no region would carry it faster alone. */
static bool rides_in_batch(const tport_client *c, size_t nbytes)
{
  return client_batch_fits(c, nbytes) || (nbytes <= c->chunk_bytes && !atomic_load(&c->shm_auto));
}

/* Whether an element goes in chunks through the batch's window: longer
 * than a chunk, and no region would carry it. */
static bool chunked_in_batch(const tport_client *c, size_t nbytes)
{
  return nbytes > c->chunk_bytes && !atomic_load(&c->shm_auto);
}

/* ---------------------------------------------------------------- the units */

/* Group g's PutBatch, its bytes in a slot of the region where one is free. */
static int group_make(put_plan *pp, size_t g, nng_msg **out, tport_err *err)
{
  size_t first = pp->start[g];
  bool direct = g >= pp->direct_from;
  pp->slot[g] = direct ? BATCH_NO_SLOT : batch_region_take(pp->c, &pp->region);
  int rc = batch_put_request(pp, first, pp->start[g + 1] - first, batch_put_group_kth, true,
                             direct ? BATCH_DIRECT : pp->slot[g], &pp->runs[g], out, err);
  if (rc) { /* never sent */
    batch_region_give(&pp->region, pp->slot[g]);
    pp->slot[g] = BATCH_NO_SLOT;
  }
  return rc;
}

/* Element j of group g answered by a reply of its own, one. */
static void element_take(put_plan *pp, size_t g, size_t j, const Tport__PutBeginReply *one)
{
  size_t first = pp->start[g];
  tport_put_item *it = batch_put_group_kth(pp, first, j);
  if (batch_element_status(one->status, &it->err) != TPORT_OK) {
    /* read from the caller's buffer: the server gave up the read (memory
     * that pages in slowly) or had no reader free -- put on its own after
     * the window, through the region where it gave up */
    int code = it->err.code;
    bool direct = g >= pp->direct_from;
    if (direct && (code == TPORT_DEADLINE_EXCEEDED || code == TPORT_RESOURCE_EXHAUSTED)) {
      size_t item = pp->idx[first + j];
      pp->redo[item] = true;
      pp->not_direct[item] = code == TPORT_DEADLINE_EXCEEDED;
      it->err.code = NOT_ANSWERED;
    }
  } else if (!one->info) {
    tport_err_set(&it->err, TPORT_DATA_LOSS, "the server's reply describes no tensor");
  } else {
    client_info_from_wire(one->info, &it->info);
  }
}

/* Run x of group g's reply, its elements from *j on (*j moved past them):
 * each stored as the run's info says, under its handle, or answered by a
 * reply of its own. */
static void run_take(put_plan *pp, size_t g, const Tport__PutRunReply *run, size_t *j)
{
  size_t n = run->handles.len / TPORT_HANDLE_BYTES, next = 0;
  tport_tensor_info base;
  client_info_from_wire(run->info, &base); /* (none: each replied) */
  for (size_t i = 0; i < n; i++, (*j)++) {
    if (next < run->n_replied && run->replied[next] == i) {
      element_take(pp, g, *j, run->replies[next++]);
      continue;
    }
    tport_put_item *it = batch_put_group_kth(pp, pp->start[g], *j);
    it->info = base;
    memcpy(it->info.ref.handle, run->handles.data + i * TPORT_HANDLE_BYTES, TPORT_HANDLE_BYTES);
  }
}

/* Group g's reply: each element's result, or the group's error for all.
 * Answered, the server has read its slot: free again. */
static void group_take(put_plan *pp, client_slot *s, size_t g)
{
  size_t first = pp->start[g], k = pp->start[g + 1] - first;
  batch_region_give(&pp->region, pp->slot[g]);
  pp->slot[g] = BATCH_NO_SLOT;
  Tport__PutBatchReply *r = NULL;
  tport_err ge;
  int rc = batch_put_reply(pp, s, k, &pp->runs[g], &r, &ge);
  for (size_t j = 0; j < k; j++) {
    tport_put_item *it = batch_put_group_kth(pp, first, j);
    tport_err_clear(&it->err);
    if (rc)
      it->err = ge;
  }
  if (rc)
    return;
  for (size_t j = 0; j < r->n_puts; j++)
    element_take(pp, g, j, r->puts[j]);
  for (size_t x = 0, j = r->n_puts; x < r->n_runs; x++)
    run_take(pp, g, r->runs[x], &j);
}

static int unit_make(void *ctx, size_t u, size_t one, nng_msg **out, tport_err *err)
{
  (void)one;
  put_plan *pp = ctx;
  const unit *un = &pp->units[u];
  switch (un->kind) {
  case U_BEGINS:
    return batch_put_begins_make(pp, un->which, out, err);
  case U_GROUP:
    return group_make(pp, un->which, out, err);
  case U_CHUNK:
    return batch_put_chunk_make(pp, u, &pp->ch[un->which], out, err);
  default:
    return batch_put_end_make(pp, &pp->ch[un->which], out, err);
  }
}

/* A unit's reply: its elements' results; the window goes on whatever they
 * are (an element's error is its own). */
static int unit_take(void *ctx, client_slot *s, tport_err *err)
{
  (void)err;
  put_plan *pp = ctx;
  size_t u = s->offset;
  const unit *un = &pp->units[u];
  switch (un->kind) {
  case U_BEGINS:
    batch_put_begins_take(pp, s, un->which);
    arena_reset(&pp->replies); /* what the reply was unpacked into */
    break;
  case U_GROUP:
    group_take(pp, s, un->which);
    arena_reset(&pp->replies);
    break;
  case U_CHUNK:
    batch_put_chunk_take(pp, s, u, &pp->ch[un->which]);
    break;
  default:
    batch_put_end_take(pp, s, &pp->ch[un->which]);
  }
  return TPORT_OK;
}

/* What unit u waits for: a chunk its element's PutBegin, an end its chunks. */
static size_t unit_after(void *ctx, size_t u)
{
  put_plan *pp = ctx;
  const unit *un = &pp->units[u];
  if (un->kind == U_CHUNK)
    return pp->ch[un->which].begin_unit + 1;
  if (un->kind == U_END)
    return pp->ch[un->which].first_chunk + pp->ch[un->which].nchunks;
  return 0;
}

/* ---------------------------------------------------------------- planning */

/* Moves the lent elements to the end of idx[0..k), the others kept in
 * order: the copied ones then fill groups together instead of being cut
 * into a group between each two lent ones (a state dict alternates a
 * convolution's weight with its batch norm's two vectors: half the
 * requests), and a group's lent elements follow its copied ones (a
 * request's body, then what it borrows).  The elements are independent;
 * each keeps its own result slot. */
static void lent_last(const tport_client *c, const tport_put_item *items, size_t *idx, size_t k,
                      size_t *scratch)
{
  size_t a = 0, b = 0;
  for (size_t j = 0; j < k; j++)
    if (batch_put_is_lent(c, items[idx[j]].nbytes))
      scratch[b++] = idx[j];
    else
      idx[a++] = idx[j];
  memcpy(idx + a, scratch, b * sizeof *idx);
}

/* The groups of the k riding elements idx[0..k) into pp->start: at most
 * BATCH_MAX_ELEMENTS, a chunk of bytes and CLIENT_LEND_SEGMENTS lent
 * elements each (the lent ones last, as lent_last put them). */
static void plan_groups(put_plan *pp, size_t k)
{
  tport_client *c = pp->c;
  size_t bytes = 0, lent = 0;
  lent_last(c, pp->items, pp->idx, k, pp->start);
  pp->ngroups = 0;
  for (size_t j = 0; j < k; j++) {
    size_t n = pp->items[pp->idx[j]].nbytes;
    bool lends = batch_put_is_lent(c, n);
    if (j == 0 || (lends && lent == CLIENT_LEND_SEGMENTS) ||
        j - pp->start[pp->ngroups - 1] == BATCH_MAX_ELEMENTS || bytes + n > c->chunk_bytes) {
      pp->start[pp->ngroups++] = j;
      bytes = lent = 0;
    }
    bytes += n;
    lent += lends;
  }
  pp->start[pp->ngroups] = k;
}

/* The groups of the nd direct elements idx[k .. k + nd), after the riding
 * ones': at most BATCH_MAX_ELEMENTS and the bytes the server reads for one
 * request (room) each. */
static void plan_direct_groups(put_plan *pp, size_t k, size_t nd, size_t room)
{
  size_t bytes = 0;
  pp->direct_from = pp->ngroups;
  for (size_t j = k; j < k + nd; j++) {
    size_t n = pp->items[pp->idx[j]].nbytes;
    if (j == k || j - pp->start[pp->ngroups - 1] == BATCH_MAX_ELEMENTS || bytes + n > room) {
      pp->start[pp->ngroups++] = j;
      bytes = 0;
    }
    bytes += n;
  }
  pp->start[pp->ngroups] = k + nd;
}

/* The units in the order they go: the begins (answered while the groups
 * go), the groups, then each element's chunks with the end of the one
 * before after them. */
static void plan_units(put_plan *pp)
{
  size_t u = 0, chunk = pp->c->chunk_bytes;
  pp->nbegins = (pp->nch + BATCH_MAX_ELEMENTS - 1) / BATCH_MAX_ELEMENTS;
  for (size_t b = 0; b < pp->nbegins; b++) {
    pp->bstart[b] = b * BATCH_MAX_ELEMENTS;
    pp->units[u++] = (unit){U_BEGINS, b};
  }
  pp->bstart[pp->nbegins] = pp->nch;
  for (size_t g = 0; g < pp->ngroups; g++)
    pp->units[u++] = (unit){U_GROUP, g};
  for (size_t i = 0; i < pp->nch; i++) {
    chunked *e = &pp->ch[i];
    size_t n = pp->items[e->item].nbytes;
    e->begin_unit = i / BATCH_MAX_ELEMENTS;
    e->first_chunk = u;
    /* a direct element's requests each name as many chunks as the server
     * reads at once */
    e->chunk_bytes = e->direct ? client_process_span(pp->c, chunk) : chunk;
    e->nchunks = n / e->chunk_bytes + (n % e->chunk_bytes != 0);
    for (size_t j = 0; j < e->nchunks; j++)
      pp->units[u++] = (unit){U_CHUNK, i};
    if (i > 0)
      pp->units[u++] = (unit){U_END, i - 1};
  }
  if (pp->nch)
    pp->units[u++] = (unit){U_END, pp->nch - 1};
  pp->nunits = u;
}

/* The units needed for k riding elements and the elements in chunks. */
static size_t count_units(const tport_client *c, const tport_put_item *items, size_t k,
                          const chunked *ch, size_t nch)
{
  /* k: the elements in groups (no more groups than elements) */
  size_t n = k + nch + (nch + BATCH_MAX_ELEMENTS - 1) / BATCH_MAX_ELEMENTS;
  for (size_t i = 0; i < nch; i++)
    n += items[ch[i].item].nbytes / c->chunk_bytes + 1;
  return n;
}

/* After the window: what a stopped window left begun is aborted (best
 * effort), what it never answered gets its error. */
static void finish_window(put_plan *pp, int rc, const tport_err *werr)
{
  for (size_t i = 0; i < pp->nch; i++) {
    chunked *e = &pp->ch[i];
    tport_put_item *it = &pp->items[e->item];
    if (e->begun && rc != TPORT_UNAVAILABLE) {
      Tport__PutAbortRequest aq = TPORT__PUT_ABORT_REQUEST__INIT;
      aq.ref = &e->ref;
      ProtobufCMessage *ar;
      if (client_rpc(pp->c, TPORT__METHOD__METHOD_PUT_ABORT, &aq.base, NULL, 0,
                     &tport__put_abort_reply__descriptor, &ar, NULL, NULL) == TPORT_OK)
        protobuf_c_message_free_unpacked(ar, NULL);
    }
    if (rc && e->state != CH_ENDED && e->state != CH_FAILED && e->state != CH_LOST)
      it->err = *werr; /* the window stopped before it ended */
    else if (e->state == CH_REDO)
      it->err.code = NOT_ANSWERED; /* put on its own next */
  }
  for (size_t j = 0; j < pp->start[pp->ngroups]; j++)
    if (pp->items[pp->idx[j]].err.code == NOT_ANSWERED && !pp->redo[pp->idx[j]])
      pp->items[pp->idx[j]].err = *werr;
}

/* Same host: a slot of the automatic region for each group that may be in
 * flight at once, as large as the largest group (at most a chunk). */
static void open_region(put_plan *pp)
{
  size_t most = 0;
  for (size_t g = 0; g < pp->direct_from; g++) {
    size_t bytes = 0;
    for (size_t j = pp->start[g]; j < pp->start[g + 1]; j++)
      bytes += pp->items[pp->idx[j]].nbytes;
    most = bytes > most ? bytes : most;
  }
  batch_region_open(pp->c, &pp->region, pp->direct_from, most, true);
}

/* What one window puts: the riding elements idx[0..k), the direct ones
 * idx[k..k + nd) (read by the server from the process region proc), the
 * elements in chunks ch[0..nch); by item, those a direct group could not
 * put (redo: on their own after the window; not_direct: not read again). */
typedef struct window_sets {
  size_t *idx, k, nd;
  chunked *ch;
  size_t nch;
  uint64_t proc;
  size_t room; /* the most bytes a direct group names */
  bool *redo, *not_direct;
} window_sets;

/* The elements of ws through one window. */
static void put_window(tport_client *c, tport_put_item *items, const window_sets *ws,
                       const atomic_bool *cancel)
{
  size_t k = ws->k, nd = ws->nd, nch = ws->nch, *idx = ws->idx;
  chunked *ch = ws->ch;
  size_t nunits = count_units(c, items, k + nd, ch, nch);
  put_plan pp = {.c = c,
                 .items = items,
                 .idx = idx,
                 .start = malloc((k + nd + 1) * sizeof(size_t)),
                 .runs = malloc((k + nd + 1) * sizeof(group_runs)),
                 .runlens = malloc((k + nd + 1) * sizeof(size_t)),
                 .slot = malloc((k + nd + 1) * sizeof(size_t)),
                 .redo = ws->redo,
                 .not_direct = ws->not_direct,
                 .ch = ch,
                 .nch = nch,
                 .proc = ws->proc,
                 .bstart = malloc((nch / BATCH_MAX_ELEMENTS + 2) * sizeof(size_t)),
                 .units = malloc(nunits * sizeof(unit)),
                 .lent = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0}};
  tport_err err;
  tport_err_set(&err, TPORT_INTERNAL, "the batch stopped before this element was answered");
  int rc = pp.start && pp.runs && pp.runlens && pp.slot && pp.bstart && pp.units
               ? TPORT_OK
               : tport_err_set(&err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  arena_init(&pp.replies);
  if (!rc) {
    plan_groups(&pp, k);
    plan_direct_groups(&pp, k, nd, ws->room);
    plan_units(&pp);
    for (size_t g = 0; g < pp.ngroups; g++) {
      pp.slot[g] = BATCH_NO_SLOT;
      pp.runs[g] = (group_runs){.runlen = pp.runlens + pp.start[g]};
    }
    if (atomic_load(&c->shm_auto))
      open_region(&pp);
    if (nd)
      pp.fence_token = client_fence_token();
    atomic_store(&pp.fence, pp.fence_token);
    rc = client_run_units(c, pp.nunits, unit_make, unit_take, unit_after, NULL, &pp, cancel,
                          &err);
    /* every reply taken, or the window stopped (a timeout): tportd stores
     * nothing it reads for a direct group from now on, before the caller
     * may change its buffers */
    atomic_store(&pp.fence, 0);
    batch_region_close(c, &pp.region); /* before the elements put on their own use it */
  } else {
    pp.ngroups = 0;
    if (pp.start)
      pp.start[0] = k + nd; /* every riding element gets the error */
  }
  client_lent_wait(c, &pp.lent); /* the caller's bytes are theirs again */
  if (pp.start)
    finish_window(&pp, rc, &err);
  else
    for (size_t j = 0; j < k + nd; j++)
      items[idx[j]].err = err;
  arena_fini(&pp.replies);
  free(pp.start), free(pp.runs), free(pp.runlens), free(pp.slot);
  free(pp.bstart), free(pp.units);
}

/* Where each element goes (classify's answer). */
typedef enum element_way { WAY_RIDE, WAY_DIRECT, WAY_CHUNKS, WAY_DIRECT_CHUNKS, WAY_SOLO } element_way;

/* How it goes: one on the same host, stored as it is, is read by the
 * server from the caller's buffer -- with others in a direct group where
 * the server reads such puts together and it fits one (room), else in
 * chunks -- unless it is small and the batch's small ones are few
 * (small_direct false: they ride in their requests' payloads, cheaper than
 * a read by threads of tportd's).  Else a small one rides (through the
 * region where one is on), one larger than a chunk without a region goes
 * in chunks, the rest on their own.  *proc_rc: whether the process region
 * could be had (asked once, -1 before). */
static element_way classify(tport_client *c, const tport_put_item *it, size_t room,
                            bool small_direct, uint64_t *proc, int *proc_rc)
{
  bool rides = rides_in_batch(c, it->nbytes);
  bool direct = it->nbytes > 0 && (!rides || small_direct) &&
                client_put_reads_direct(c, it->opts, it->data, it->nbytes);
  if (direct && *proc_rc < 0)
    *proc_rc = client_process_region(c, proc);
  if (direct && *proc_rc == TPORT_OK)
    return it->nbytes <= room ? WAY_DIRECT : rides ? WAY_RIDE : WAY_DIRECT_CHUNKS;
  if (rides)
    return WAY_RIDE;
  if (chunked_in_batch(c, it->nbytes))
    return WAY_CHUNKS;
  return WAY_SOLO;
}

/* Whether the small elements that could be read from the callers' buffers
 * are many enough bytes to be: as many as would take the region (a
 * 10,000 x 4 KiB batch went from ~75 to ~60 ms on a 2-core VM read
 * directly, the region's fresh pages no longer faulted in by the client). */
static bool small_ones_direct(tport_client *c, const tport_put_item *items, size_t n)
{
  if (!client_process_batch_bytes(c))
    return false;
  size_t bytes = 0;
  for (size_t i = 0; i < n && bytes < CLIENT_SHM_MIN_BYTES; i++)
    if (items[i].ndim >= 0 && items[i].ndim <= TPORT_MAX_DIMS &&
        rides_in_batch(c, items[i].nbytes) &&
        client_put_reads_direct(c, items[i].opts, items[i].data, items[i].nbytes))
      bytes += items[i].nbytes;
  return bytes >= CLIENT_SHM_MIN_BYTES;
}

int client_put_batch(tport_client *c, tport_put_item *items, size_t n, const atomic_bool *cancel,
                     tport_err *err)
{
  /* idx: the riding elements, then (from didx) the direct ones; solo: the
   * ones put on their own (decided once: whether the region is on may
   * change meanwhile) */
  size_t m = n ? n : 1, k = 0, nd = 0, nch = 0, nsolo = 0;
  size_t *idx = malloc(m * sizeof *idx), *didx = malloc(m * sizeof *didx),
         *solo = malloc(m * sizeof *solo);
  chunked *ch = calloc(m, sizeof *ch);
  bool *not_direct = calloc(m, sizeof *not_direct); /* by item: read given up */
  bool *redo = calloc(m, sizeof *redo);
  uint64_t proc = 0;
  int proc_rc = -1; /* not asked yet */
  if (!idx || !didx || !solo || !ch || !not_direct || !redo) {
    free(idx), free(didx), free(solo), free(ch), free(not_direct), free(redo);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for a batch of %zu", n);
  }
  size_t room = client_process_batch_bytes(c);
  bool small_direct = small_ones_direct(c, items, n);
  for (size_t i = 0; i < n; i++) {
    tport_put_item *it = &items[i];
    tport_err_clear(&it->err);
    memset(&it->info, 0, sizeof it->info);
    if (it->ndim < 0 || it->ndim > TPORT_MAX_DIMS) {
      tport_err_set(&it->err, TPORT_INVALID_ARGUMENT, "ndim is %d: it must be in [0, %d]",
                    it->ndim, TPORT_MAX_DIMS);
      continue;
    }
    it->err.code = NOT_ANSWERED;
    switch (classify(c, it, room, small_direct, &proc, &proc_rc)) {
    case WAY_RIDE: idx[k++] = i; break;
    case WAY_DIRECT: didx[nd++] = i; break;
    case WAY_CHUNKS: ch[nch++].item = i; break;
    case WAY_DIRECT_CHUNKS:
      /* in chunks through the window all the same (its PutBegin among
       * others'), the server reading them from the caller's buffer */
      ch[nch].direct = true, ch[nch++].item = i;
      break;
    default: it->err.code = TPORT_OK, solo[nsolo++] = i;
    }
  }
  memcpy(idx + k, didx, nd * sizeof *idx);
  window_sets ws = {idx, k, nd, ch, nch, proc, room, redo, not_direct};
  if (k || nd || nch)
    put_window(c, items, &ws, cancel);
  for (size_t j = k; j < k + nd; j++)
    if (redo[idx[j]] && items[idx[j]].err.code == NOT_ANSWERED)
      solo[nsolo++] = idx[j]; /* not read by the server: on its own */
  for (size_t i = 0; i < nch; i++)
    if (items[ch[i].item].err.code == NOT_ANSWERED) {
      not_direct[ch[i].item] = ch[i].given_up;
      solo[nsolo++] = ch[i].item; /* refused in chunks: on its own */
    }
  for (size_t j = 0; j < nsolo; j++) {
    tport_put_item *it = &items[solo[j]];
    tport_err_clear(&it->err);
    if (batch_cancelled(cancel, &it->err))
      continue;
    client_put_desc d = {.dtype = it->dtype,
                         .ndim = it->ndim,
                         .sizes = it->sizes,
                         .strides = it->strides,
                         .nbytes = it->nbytes,
                         .data = it->data,
                         .opts = it->opts,
                         .cancel = cancel,
                         .not_direct = not_direct[solo[j]]};
    client_put(c, &d, &it->info, &it->err);
  }
  free(idx), free(didx), free(solo), free(ch), free(not_direct), free(redo);
  return n ? batch_result(&items[0].err, sizeof *items, n, err) : TPORT_OK;
}

int tport_put_batch(tport_client *c, tport_put_item *items, size_t n, tport_err *err)
{
  return client_put_batch(c, items, n, NULL, err);
}
