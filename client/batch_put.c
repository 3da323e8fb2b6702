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
 * the socket).  An element begun with a server that refuses it (a server
 * before uncommitted batch elements) or whose chunks are smaller than the
 * client's goes by path.c too, after the window.  Every element keeps its
 * own result; one that fails mid-way is aborted on the server.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "batch.h"
#include "crc32c.h"

bool client_batch_fits(const tport_client *c, size_t nbytes)
{
  return nbytes < CLIENT_SHM_MIN_BYTES && nbytes <= c->chunk_bytes;
}

/* An element this large has its bytes lent to its request (where the
 * transport can send from them) rather than copied: up to
 * CLIENT_LEND_SEGMENTS of them a request, after the copied ones. */
#define BATCH_LEND_MIN ((size_t)256 << 10)

static bool is_lent(const tport_client *c, size_t nbytes)
{
  return c->lend_chunks && nbytes >= BATCH_LEND_MIN;
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

/* ---------------------------------------------------------------- the plan */

typedef enum unit_kind { U_BEGINS, U_GROUP, U_CHUNK, U_END } unit_kind;

/* Where an element in chunks stands. */
typedef enum chunked_state {
  CH_WAITING, /* its PutBegin not answered */
  CH_BEGUN,   /* an upload on the server: chunks go */
  CH_FAILED,  /* a chunk failed (the element's err says why): aborted */
  CH_REDO,    /* refused here: put by path.c after the window (aborted if begun) */
  CH_LOST,    /* its PutBegin's answer unreadable: nothing more to send */
  CH_ENDED,   /* committed or aborted */
} chunked_state;

typedef struct chunked {
  size_t item;                  /* in items */
  size_t begin_unit;            /* the unit whose answer begins it */
  size_t first_chunk, nchunks;  /* its chunks' units */
  chunked_state state;
  bool begun;                   /* an upload exists on the server (to end) */
  bool aborting;                /* its end unit sent PutAbort, not PutCommit */
  size_t landed;                /* bytes answered */
  uint8_t handle[TPORT_HANDLE_BYTES];
  Tport__Ref ref;
} chunked;

typedef struct unit {
  unit_kind kind;
  size_t which; /* the group (U_GROUP, U_BEGINS), or the element in chunks */
} unit;

typedef struct put_plan {
  tport_client *c;
  tport_put_item *items;
  size_t *idx, *start;  /* the groups: group g is idx[start[g] .. start[g + 1]) */
  size_t ngroups;
  chunked *ch;          /* the elements in chunks */
  size_t nch, *bstart;  /* begins' group b is ch[bstart[b] .. bstart[b + 1]) */
  size_t nbegins;
  unit *units;
  size_t nunits;
  lent_chunks lent;     /* bytes lent to requests, the caller's again at the end */
  arena replies;        /* where a PutBatch's reply is unpacked (reset after it) */
} put_plan;

/* ---------------------------------------------------------------- PutBatch */

/* The j-th of the k elements a request carries from first on. */
typedef tport_put_item *(*kth_fn)(put_plan *pp, size_t first, size_t j);

/* A PutBatch of the k PutBegins qp (lens: their payloads' lengths): its
 * head, then the copied elements' bytes (copied of them in all), then the
 * nlent lent ones' (the group's last), lent to the message. */
static int batch_message(put_plan *pp, Tport__PutBeginRequest **qp, uint64_t *lens, size_t k,
                         kth_fn kth, size_t first, size_t copied, size_t nlent, nng_msg **out,
                         tport_err *err)
{
  Tport__PutBatchRequest q = TPORT__PUT_BATCH_REQUEST__INIT;
  q.n_puts = q.n_payload_bytes = k;
  q.puts = qp;
  q.payload_bytes = lens;
  size_t head = frame_head_size(&q.base);
  if (nng_msg_alloc(out, head + copied) != 0)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for a %zu-byte batch",
                         head + copied);
  uint8_t *at = nng_msg_body(*out);
  frame_write_head(at, TPORT__METHOD__METHOD_PUT_BATCH, 0, &q.base);
  at += head;
  for (size_t j = 0; j < k - nlent; j++) {
    tport_put_item *it = kth(pp, first, j);
    if (lens[j])
      memcpy(at, it->data, it->nbytes);
    at += lens[j];
  }
  if (!nlent)
    return TPORT_OK;
  const void *ps[CLIENT_LEND_SEGMENTS];
  size_t ns[CLIENT_LEND_SEGMENTS];
  for (size_t j = 0; j < nlent; j++) {
    tport_put_item *it = kth(pp, first, k - nlent + j);
    ps[j] = it->data;
    ns[j] = it->nbytes;
  }
  int rc = client_msg_lend(&pp->lent, *out, ps, ns, (int)nlent, err);
  if (rc)
    nng_msg_free(*out);
  return rc;
}

/* The PutBegins of k elements (kth(pp, first, j) the j-th), commit as said,
 * into arrays made here: a group's (its lent elements last) or the begins'
 * (no bytes). */
static int batch_request(put_plan *pp, size_t first, size_t k, kth_fn kth, bool commit,
                         nng_msg **out, tport_err *err)
{
  Tport__TensorDesc *descs = calloc(k, sizeof *descs);
  Tport__PutBeginRequest *qs = calloc(k, sizeof *qs);
  Tport__PutBeginRequest **qp = calloc(k, sizeof *qp);
  uint64_t *lens = calloc(k, sizeof *lens);
  tport_put_options defaults;
  tport_put_options_init(&defaults);
  size_t copied = 0, nlent = 0;
  int rc = descs && qs && qp && lens
               ? TPORT_OK
               : tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for a batch");
  for (size_t j = 0; !rc && j < k; j++) {
    tport_put_item *it = kth(pp, first, j);
    client_put_request(pp->c, it->dtype, it->ndim, it->sizes, it->strides,
                       it->opts ? it->opts : &defaults, &descs[j], &qs[j]);
    qs[j].commit = commit;
    if (commit && pp->c->verify) {
      qs[j].crc32c_set = true;
      qs[j].crc32c = transport_crc32c(0, it->data, it->nbytes);
    }
    qp[j] = &qs[j];
    lens[j] = commit ? it->nbytes : 0;
    if (commit && is_lent(pp->c, it->nbytes))
      nlent++; /* the group's last (plan_groups) */
    else
      copied += lens[j]; /* within a chunk (the groups' bound) */
  }
  if (!rc)
    rc = batch_message(pp, qp, lens, k, kth, first, copied, nlent, out, err);
  free(descs), free(qs), free(qp), free(lens);
  return rc;
}

static tport_put_item *group_kth(put_plan *pp, size_t first, size_t j)
{
  return &pp->items[pp->idx[first + j]];
}

static tport_put_item *begun_kth(put_plan *pp, size_t first, size_t j)
{
  return &pp->items[pp->ch[first + j].item];
}

/* A PutBatch's reply: its k elements' replies, or an error for all. */
static int batch_reply(put_plan *pp, client_slot *s, size_t k, Tport__PutBatchReply **r,
                       tport_err *err)
{
  int rc = client_unpack_in(TPORT__METHOD__METHOD_PUT_BATCH, s->reply,
                            &tport__put_batch_reply__descriptor, &pp->replies,
                            (ProtobufCMessage **)r, NULL, err);
  if (!rc && (*r)->n_puts != k)
    rc = tport_err_set(err, TPORT_DATA_LOSS, "the server answered %zu of %zu elements",
                       (*r)->n_puts, k);
  return rc;
}

/* ---------------------------------------------------------------- the units */

static int group_make(put_plan *pp, size_t g, nng_msg **out, tport_err *err)
{
  size_t first = pp->start[g];
  return batch_request(pp, first, pp->start[g + 1] - first, group_kth, true, out, err);
}

/* Group g's reply: each element's result, or the group's error for all. */
static void group_take(put_plan *pp, client_slot *s, size_t g)
{
  size_t first = pp->start[g], k = pp->start[g + 1] - first;
  Tport__PutBatchReply *r = NULL;
  tport_err ge;
  int rc = batch_reply(pp, s, k, &r, &ge);
  for (size_t j = 0; j < k; j++) {
    tport_put_item *it = group_kth(pp, first, j);
    tport_err_clear(&it->err);
    if (rc) {
      it->err = ge;
    } else if (batch_element_status(r->puts[j]->status, &it->err) == TPORT_OK) {
      if (!r->puts[j]->info)
        tport_err_set(&it->err, TPORT_DATA_LOSS, "the server's reply describes no tensor");
      else
        client_info_from_wire(r->puts[j]->info, &it->info);
    }
  }
}

static int begins_make(put_plan *pp, size_t b, nng_msg **out, tport_err *err)
{
  size_t first = pp->bstart[b];
  return batch_request(pp, first, pp->bstart[b + 1] - first, begun_kth, false, out, err);
}

/* Begins' group b answered: each element begun (its handle kept), or to be
 * put on its own after the window (refused, or chunked finer than here). */
static void begins_take(put_plan *pp, client_slot *s, size_t b)
{
  size_t first = pp->bstart[b], k = pp->bstart[b + 1] - first;
  Tport__PutBatchReply *r = NULL;
  tport_err ge;
  int rc = batch_reply(pp, s, k, &r, &ge);
  for (size_t j = 0; j < k; j++) {
    chunked *e = &pp->ch[first + j];
    tport_put_item *it = &pp->items[e->item];
    if (rc) { /* whether any began cannot be known: the connection's end frees them */
      it->err = ge;
      e->state = CH_LOST;
      continue;
    }
    const Tport__PutBeginReply *b1 = r->puts[j];
    tport_err why;
    if (batch_element_status(b1->status, &why) != TPORT_OK) {
      e->state = CH_REDO; /* the put of its own says what is wrong, if anything */
      continue;
    }
    if (!b1->ref || b1->ref->handle.len != TPORT_HANDLE_BYTES) {
      tport_err_set(&it->err, TPORT_DATA_LOSS, "the server's reply names no upload");
      e->state = CH_LOST;
      continue;
    }
    memcpy(e->handle, b1->ref->handle.data, TPORT_HANDLE_BYTES);
    tport__ref__init(&e->ref);
    e->ref.handle.data = e->handle;
    e->ref.handle.len = TPORT_HANDLE_BYTES;
    e->begun = true;
    /* a server whose chunks are smaller than the ones planned here */
    e->state = b1->chunk_bytes && b1->chunk_bytes < pp->c->chunk_bytes ? CH_REDO : CH_BEGUN;
  }
}

static int chunk_make(put_plan *pp, size_t u, chunked *e, nng_msg **out, tport_err *err)
{
  if (e->state != CH_BEGUN) {
    *out = NULL; /* nothing more of it goes */
    return TPORT_OK;
  }
  tport_put_item *it = &pp->items[e->item];
  size_t chunk = pp->c->chunk_bytes, off = (u - e->first_chunk) * chunk;
  size_t len = it->nbytes - off < chunk ? it->nbytes - off : chunk;
  const uint8_t *bytes = (const uint8_t *)it->data + off;
  Tport__PutChunkRequest q = TPORT__PUT_CHUNK_REQUEST__INIT;
  q.ref = &e->ref;
  q.offset = off;
  if (pp->c->verify) {
    q.crc32c_set = true;
    q.crc32c = transport_crc32c(0, bytes, len);
  }
  if (pp->c->lend_chunks)
    return client_pack_lent(&pp->lent, TPORT__METHOD__METHOD_PUT_CHUNK, &q.base, bytes, len, out,
                            err);
  return client_pack(TPORT__METHOD__METHOD_PUT_CHUNK, &q.base, bytes, len, out, err);
}

static void chunk_take(put_plan *pp, client_slot *s, size_t u, chunked *e)
{
  tport_put_item *it = &pp->items[e->item];
  ProtobufCMessage *r;
  if (client_unpack(TPORT__METHOD__METHOD_PUT_CHUNK, s->reply,
                    &tport__put_chunk_reply__descriptor, &r, NULL, &it->err) != TPORT_OK) {
    e->state = CH_FAILED; /* its commit becomes an abort */
    return;
  }
  protobuf_c_message_free_unpacked(r, NULL);
  size_t chunk = pp->c->chunk_bytes, off = (u - e->first_chunk) * chunk;
  e->landed += it->nbytes - off < chunk ? it->nbytes - off : chunk;
  if (it->opts && it->opts->progress)
    it->opts->progress(it->opts->progress_arg, e->landed, it->nbytes);
}

/* PutCommit where every chunk landed, PutAbort where it was begun and
 * something failed, nothing where nothing was begun. */
static int end_message(tport_client *c, chunked *e, const tport_put_item *it, nng_msg **out,
                       tport_err *err)
{
  if (!e->begun || e->state == CH_ENDED) {
    *out = NULL;
    return TPORT_OK;
  }
  e->aborting = e->state != CH_BEGUN;
  if (e->aborting) {
    Tport__PutAbortRequest aq = TPORT__PUT_ABORT_REQUEST__INIT;
    aq.ref = &e->ref;
    return client_pack(TPORT__METHOD__METHOD_PUT_ABORT, &aq.base, NULL, 0, out, err);
  }
  Tport__PutCommitRequest cq = TPORT__PUT_COMMIT_REQUEST__INIT;
  cq.ref = &e->ref;
  cq.non_blocking = it->opts && it->opts->non_blocking;
  return client_pack(TPORT__METHOD__METHOD_PUT_COMMIT, &cq.base, NULL, 0, out, err);
}

static void end_take(put_plan *pp, client_slot *s, chunked *e)
{
  tport_put_item *it = &pp->items[e->item];
  chunked_state was = e->state;
  e->state = CH_ENDED;
  e->begun = false;
  if (e->aborting) {
    e->state = was == CH_REDO ? CH_REDO : CH_ENDED; /* its own put still to come */
    return; /* best effort: the element's error is what failed before */
  }
  Tport__PutCommitReply *cr;
  if (client_unpack(TPORT__METHOD__METHOD_PUT_COMMIT, s->reply,
                    &tport__put_commit_reply__descriptor, (ProtobufCMessage **)&cr, NULL,
                    &it->err) != TPORT_OK)
    return;
  tport_err_clear(&it->err);
  client_info_from_wire(cr->info, &it->info);
  protobuf_c_message_free_unpacked(&cr->base, NULL);
}

static int unit_make(void *ctx, size_t u, size_t one, nng_msg **out, tport_err *err)
{
  (void)one;
  put_plan *pp = ctx;
  const unit *un = &pp->units[u];
  switch (un->kind) {
  case U_BEGINS:
    return begins_make(pp, un->which, out, err);
  case U_GROUP:
    return group_make(pp, un->which, out, err);
  case U_CHUNK:
    return chunk_make(pp, u, &pp->ch[un->which], out, err);
  default:
    return end_message(pp->c, &pp->ch[un->which], &pp->items[pp->ch[un->which].item], out, err);
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
    begins_take(pp, s, un->which);
    arena_reset(&pp->replies); /* what the reply was unpacked into */
    break;
  case U_GROUP:
    group_take(pp, s, un->which);
    arena_reset(&pp->replies);
    break;
  case U_CHUNK:
    chunk_take(pp, s, u, &pp->ch[un->which]);
    break;
  default:
    end_take(pp, s, &pp->ch[un->which]);
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
    if (is_lent(c, items[idx[j]].nbytes))
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
    bool lends = is_lent(c, n);
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
    e->nchunks = n / chunk + (n % chunk != 0);
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
  size_t n = k + nch + (nch + BATCH_MAX_ELEMENTS - 1) / BATCH_MAX_ELEMENTS; /* groups <= k */
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
    if (pp->items[pp->idx[j]].err.code == NOT_ANSWERED)
      pp->items[pp->idx[j]].err = *werr;
}

/* The riding elements idx[0..k) and the elements in chunks ch[0..nch)
 * through one window. */
static void put_window(tport_client *c, tport_put_item *items, size_t *idx, size_t k, chunked *ch,
                       size_t nch, const atomic_bool *cancel)
{
  size_t nunits = count_units(c, items, k, ch, nch);
  put_plan pp = {.c = c,
                 .items = items,
                 .idx = idx,
                 .start = malloc((k + 1) * sizeof(size_t)),
                 .ch = ch,
                 .nch = nch,
                 .bstart = malloc((nch / BATCH_MAX_ELEMENTS + 2) * sizeof(size_t)),
                 .units = malloc(nunits * sizeof(unit)),
                 .lent = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0}};
  tport_err err;
  tport_err_set(&err, TPORT_INTERNAL, "the batch stopped before this element was answered");
  int rc = pp.start && pp.bstart && pp.units
               ? TPORT_OK
               : tport_err_set(&err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  arena_init(&pp.replies);
  if (!rc) {
    plan_groups(&pp, k);
    plan_units(&pp);
    rc = client_run_units(c, pp.nunits, unit_make, unit_take, unit_after, &pp, cancel, &err);
  } else {
    pp.ngroups = 0;
    if (pp.start)
      pp.start[0] = k; /* every riding element gets the error */
  }
  client_lent_wait(c, &pp.lent); /* the caller's bytes are theirs again */
  if (pp.start)
    finish_window(&pp, rc, &err);
  else
    for (size_t j = 0; j < k; j++)
      items[idx[j]].err = err;
  arena_fini(&pp.replies);
  free(pp.start), free(pp.bstart), free(pp.units);
}

int client_put_batch(tport_client *c, tport_put_item *items, size_t n, const atomic_bool *cancel,
                     tport_err *err)
{
  /* idx: the riding elements; solo: the ones put on their own (decided
   * once: whether the region is on may change meanwhile) */
  size_t *idx = malloc((n ? n : 1) * sizeof *idx), *solo = malloc((n ? n : 1) * sizeof *solo);
  size_t k = 0, nch = 0, nsolo = 0;
  chunked *ch = calloc(n ? n : 1, sizeof *ch);
  if (!idx || !solo || !ch) {
    free(idx), free(solo), free(ch);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for a batch of %zu", n);
  }
  for (size_t i = 0; i < n; i++) {
    tport_put_item *it = &items[i];
    tport_err_clear(&it->err);
    memset(&it->info, 0, sizeof it->info);
    if (it->ndim < 0 || it->ndim > TPORT_MAX_DIMS)
      tport_err_set(&it->err, TPORT_INVALID_ARGUMENT, "ndim is %d: it must be in [0, %d]",
                    it->ndim, TPORT_MAX_DIMS);
    else if (rides_in_batch(c, it->nbytes))
      idx[k++] = i, it->err.code = NOT_ANSWERED;
    else if (chunked_in_batch(c, it->nbytes))
      ch[nch++].item = i, it->err.code = NOT_ANSWERED;
    else
      solo[nsolo++] = i;
  }
  if (k || nch)
    put_window(c, items, idx, k, ch, nch, cancel);
  for (size_t i = 0; i < nch; i++)
    if (items[ch[i].item].err.code == NOT_ANSWERED)
      solo[nsolo++] = ch[i].item; /* refused in chunks: on its own */
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
                         .cancel = cancel};
    client_put(c, &d, &it->info, &it->err);
  }
  free(idx), free(solo), free(ch);
  return n ? batch_result(&items[0].err, sizeof *items, n, err) : TPORT_OK;
}

int tport_put_batch(tport_client *c, tport_put_item *items, size_t n, tport_err *err)
{
  return client_put_batch(c, items, n, NULL, err);
}
