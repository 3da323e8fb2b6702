/*
 * batch_put_msg.c: a PutBatch request of a put batch (batch_put.h) and its
 * reply.  An element that commits at once has its bytes in the request's
 * payload (copied in, or lent where large), or, on the same host, copied
 * into its group's slot of the automatic region and named by a slice.
 * Alike elements one after another go as runs (PutBatchRequest.runs, where
 * the server takes them): one PutBegin for all, answered by a handle each.
 */
#include <stdlib.h>
#include <string.h>

#include "batch_put.h"
#include "crc32c.h"

bool batch_put_is_lent(const tport_client *c, size_t nbytes)
{
  return c->lend_chunks && nbytes >= BATCH_LEND_MIN;
}

tport_put_item *batch_put_group_kth(put_plan *pp, size_t first, size_t j)
{
  return &pp->items[pp->idx[first + j]];
}

tport_put_item *batch_put_begun_kth(put_plan *pp, size_t first, size_t j)
{
  return &pp->items[pp->ch[first + j].item];
}

/* ---------------------------------------------------------------- runs */

/* Whether a request q may be one of a run: a put that commits with no
 * name (a name is one tensor's), its bytes not lent (a run's bytes are in
 * the body, before the lent ones). */
static bool runnable(const tport_client *c, const Tport__PutBeginRequest *q, uint64_t len)
{
  return q->commit && !q->name[0] && !batch_put_is_lent(c, len);
}

static bool same_ints(const int64_t *a, const int64_t *b, size_t n)
{
  return !n || !memcmp(a, b, n * sizeof *a);
}

/* Whether b goes as a's run does: the same PutBegin (its options, layout
 * and bytes -- so the same place for them) but for its slice's offset and
 * its CRC32C. */
static bool alike(const Tport__PutBeginRequest *a, const Tport__PutBeginRequest *b,
                  const tport_put_item *ia, const tport_put_item *ib)
{
  const Tport__TensorDesc *da = a->desc, *db = b->desc;
  return ia->nbytes == ib->nbytes && da->dtype == db->dtype && da->n_sizes == db->n_sizes &&
         da->n_strides == db->n_strides && same_ints(da->sizes, db->sizes, da->n_sizes) &&
         same_ints(da->strides, db->strides, da->n_strides) &&
         da->storage_offset == db->storage_offset && a->ttl_ms == b->ttl_ms &&
         a->replace == b->replace && !strcmp(a->device, b->device) &&
         a->dtype_set == b->dtype_set && a->dtype == b->dtype &&
         a->memory_format == b->memory_format && a->managed == b->managed &&
         a->non_blocking == b->non_blocking && a->keep == b->keep &&
         a->crc32c_set == b->crc32c_set && (a->shm == NULL) == (b->shm == NULL) &&
         (!a->shm || (a->shm->region == b->shm->region && a->shm->length == b->shm->length));
}

/* The order of the group's request (perm[r]: its r-th element's j): each
 * element alone first, then the runs -- two or more alike one after
 * another -- all in the group's order (runlen[x]: run x's elements, *nruns
 * runs; scratch: room for k).  None where one of them is lent (the body's
 * bytes come before the lent ones').  Returns how many go alone. */
static size_t plan_runs(put_plan *pp, size_t first, size_t k, kth_fn kth,
                        const Tport__PutBeginRequest *qs, const uint64_t *lens, size_t *perm,
                        size_t *runlen, size_t *nruns, size_t *scratch)
{
  size_t a = 0, b = 0;
  *nruns = 0;
  for (size_t j = 0; j < k; j++)
    if (batch_put_is_lent(pp->c, kth(pp, first, j)->nbytes))
      return k;
  for (size_t j = 0, e; j < k; j = e) {
    e = j + 1;
    if (runnable(pp->c, &qs[j], lens[j]))
      while (e < k && runnable(pp->c, &qs[e], lens[e]) &&
             alike(&qs[j], &qs[e], kth(pp, first, j), kth(pp, first, e)))
        e++;
    if (e - j < 2) {
      perm[a++] = j;
      continue;
    }
    runlen[(*nruns)++] = e - j;
    for (size_t i = j; i < e; i++)
      scratch[b++] = i; /* the runs' elements, after those alone */
  }
  memcpy(perm + a, scratch, b * sizeof *perm);
  return a;
}

/* Group first's elements (pp->idx) and their lengths put in perm's order
 * (through room for k of each). */
static void permute(put_plan *pp, size_t first, size_t k, const size_t *perm, uint64_t *lens,
                    size_t *idx_room, uint64_t *len_room)
{
  size_t *idx = pp->idx + first;
  for (size_t r = 0; r < k; r++) {
    idx_room[r] = idx[perm[r]];
    len_room[r] = lens[perm[r]];
  }
  memcpy(idx, idx_room, k * sizeof *idx);
  memcpy(lens, len_room, k * sizeof *lens);
}

/* The runs of a request whose elements qp[nputs ..) are, runlen[r] long
 * (plan_runs), into rs (offs and crcs: room for each element's slice
 * offset and CRC32C). */
static void fill_runs(Tport__PutBeginRequest **qp, const uint64_t *lens, size_t nputs,
                      const size_t *runlen, size_t nruns, Tport__PutRun *rs, Tport__PutRun **rp,
                      uint64_t *offs, uint32_t *crcs)
{
  for (size_t r = 0, at = nputs; r < nruns; at += runlen[r++]) {
    const Tport__PutBeginRequest *q = qp[at];
    rs[r] = (Tport__PutRun)TPORT__PUT_RUN__INIT;
    rs[r].put = qp[at];
    rs[r].count = (uint32_t)runlen[r];
    rs[r].nbytes = q->shm ? 0 : lens[at];
    for (size_t i = at; i < at + runlen[r]; i++) {
      offs[i] = q->shm ? qp[i]->shm->offset : 0;
      crcs[i] = qp[i]->crc32c;
    }
    if (q->shm) {
      rs[r].n_shm_offsets = runlen[r];
      rs[r].shm_offsets = offs + at;
    }
    if (q->crc32c_set) {
      rs[r].n_crc32c = runlen[r];
      rs[r].crc32c = crcs + at;
    }
    rp[r] = &rs[r];
  }
}

/* ---------------------------------------------------------------- requests */

/* The PutBatch q of the group's k elements (lens: their payloads' lengths,
 * in q's order -- its puts', then its runs'): its head, then the copied
 * elements' bytes (copied of them in all), then the nlent lent ones' (the
 * group's last), lent to the message. */
static int batch_message(put_plan *pp, Tport__PutBatchRequest *q, uint64_t *lens, size_t k,
                         kth_fn kth, size_t first, size_t copied, size_t nlent, bool direct,
                         nng_msg **out, tport_err *err)
{
  if (direct) { /* read only while this window waits (put_window) */
    q->fence_addr = (uint64_t)(uintptr_t)&pp->fence;
    q->fence_token = pp->fence_token;
  }
  size_t head = frame_head_size(&q->base);
  if (nng_msg_alloc(out, head + copied) != 0)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for a %zu-byte batch",
                         head + copied);
  uint8_t *at = nng_msg_body(*out);
  frame_write_head(at, TPORT__METHOD__METHOD_PUT_BATCH, 0, &q->base);
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

int batch_put_request(put_plan *pp, size_t first, size_t k, kth_fn kth, bool commit, size_t slot,
                      group_runs *gr, nng_msg **out, tport_err *err)
{
  bool direct = commit && slot == BATCH_DIRECT;
  bool in_slot = commit && slot != BATCH_NO_SLOT && !direct;
  bool runs = commit && gr && atomic_load(&pp->c->put_runs) && k >= 2;
  Tport__TensorDesc *descs = calloc(k, sizeof *descs);
  Tport__PutBeginRequest *qs = calloc(k, sizeof *qs);
  Tport__PutBeginRequest **qp = calloc(k, sizeof *qp);
  uint64_t *lens = calloc(k, sizeof *lens);
  Tport__ShmSlice *slices = in_slot || direct ? calloc(k, sizeof *slices) : NULL;
  /* the runs': their lengths, the planning's scratch, each element's
   * slice offset and CRC32C */
  size_t *runlen = runs ? calloc(k, sizeof *runlen) : NULL, nputs = k, nruns = 0;
  size_t *scratch = runs ? calloc(k, sizeof *scratch) : NULL;
  size_t *perm = runs ? calloc(k, sizeof *perm) : NULL;
  uint64_t *offs = runs ? calloc(k, sizeof *offs) : NULL;
  uint32_t *crcs = runs ? calloc(k, sizeof *crcs) : NULL;
  Tport__PutRun *rs = runs ? calloc(k / 2, sizeof *rs) : NULL;
  Tport__PutRun **rp = runs ? calloc(k / 2, sizeof *rp) : NULL;
  tport_put_options defaults;
  tport_put_options_init(&defaults);
  size_t copied = 0, nlent = 0, at = 0;
  int rc = descs && qs && qp && lens && (slices || !(in_slot || direct)) &&
                   (!runs || (runlen && scratch && perm && offs && crcs && rs && rp))
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
    if (direct) {
      /* read by the server from where they are (the plan's direct
       * elements: none empty) */
      slices[j] = (Tport__ShmSlice)TPORT__SHM_SLICE__INIT;
      slices[j].region = pp->proc;
      slices[j].offset = (uint64_t)(uintptr_t)it->data;
      slices[j].length = it->nbytes;
      qs[j].shm = &slices[j];
      lens[j] = 0;
    } else if (in_slot && it->nbytes && it->nbytes <= pp->region.slot_bytes - at) {
      /* (the slots are as large as the largest group: always within) */
      memcpy(batch_region_at(&pp->region, slot) + at, it->data, it->nbytes);
      slices[j] = client_slice(pp->region.r, slot * pp->region.slot_bytes + at, it->nbytes);
      qs[j].shm = &slices[j];
      at += it->nbytes;
      lens[j] = 0;
    } else if (commit && batch_put_is_lent(pp->c, it->nbytes)) {
      nlent++; /* the group's last (plan_groups) */
    } else {
      copied += lens[j]; /* within a chunk (the groups' bound) */
    }
  }
  if (!rc && runs) {
    nputs = plan_runs(pp, first, k, kth, qs, lens, perm, runlen, &nruns, scratch);
    if (nruns) {
      for (size_t r = 0; r < k; r++)
        qp[r] = &qs[perm[r]];
      permute(pp, first, k, perm, lens, scratch, offs); /* (offs: filled after) */
      fill_runs(qp, lens, nputs, runlen, nruns, rs, rp, offs, crcs);
    }
  }
  Tport__PutBatchRequest q = TPORT__PUT_BATCH_REQUEST__INIT;
  q.n_puts = q.n_payload_bytes = nputs;
  q.puts = qp;
  q.payload_bytes = lens;
  q.n_runs = nruns;
  q.runs = rp;
  if (gr) {
    gr->alone = nputs;
    gr->nruns = nruns;
    if (nruns)
      memcpy(gr->runlen, runlen, nruns * sizeof *runlen);
  }
  if (!rc)
    rc = batch_message(pp, &q, lens, k, kth, first, copied, nlent, direct, out, err);
  free(descs), free(qs), free(qp), free(lens), free(slices);
  free(runlen), free(scratch), free(perm), free(offs), free(crcs), free(rs), free(rp);
  return rc;
}

/* Run x of a reply, which answers the n elements of the request's run x,
 * checked. */
static int check_run_reply(const Tport__PutRunReply *run, size_t x, size_t n, tport_err *err)
{
  if (run->handles.len != n * TPORT_HANDLE_BYTES)
    return tport_err_set(err, TPORT_DATA_LOSS,
                         "the server answered run %zu of %zu elements with %zu handle bytes", x, n,
                         run->handles.len);
  if (run->n_replied != run->n_replies || run->n_replied > n)
    return tport_err_set(err, TPORT_DATA_LOSS,
                         "the server answered %zu of run %zu's %zu elements with %zu replies",
                         run->n_replied, x, n, run->n_replies);
  for (size_t i = 0; i < run->n_replied; i++)
    if (run->replied[i] >= n || (i && run->replied[i] <= run->replied[i - 1]))
      return tport_err_set(err, TPORT_DATA_LOSS,
                           "the server's replies to run %zu name element %u out of order", x,
                           run->replied[i]);
  if (run->n_replied < n && !run->info)
    return tport_err_set(err, TPORT_DATA_LOSS,
                         "the server's answer to run %zu describes no tensor", x);
  return TPORT_OK;
}

int batch_put_reply(put_plan *pp, client_slot *s, size_t k, const group_runs *gr,
                    Tport__PutBatchReply **r, tport_err *err)
{
  int rc = client_unpack_in(TPORT__METHOD__METHOD_PUT_BATCH, s->reply,
                            &tport__put_batch_reply__descriptor, &pp->replies,
                            (ProtobufCMessage **)r, NULL, err);
  if (rc)
    return rc;
  size_t alone = gr ? gr->alone : k, nruns = gr ? gr->nruns : 0;
  if ((*r)->n_puts != alone || (*r)->n_runs != nruns)
    return tport_err_set(err, TPORT_DATA_LOSS,
                         "the server answered %zu puts and %zu runs: the request had %zu and %zu",
                         (*r)->n_puts, (*r)->n_runs, alone, nruns);
  for (size_t x = 0; x < nruns; x++)
    if ((rc = check_run_reply((*r)->runs[x], x, gr->runlen[x], err)) != TPORT_OK)
      return rc;
  return TPORT_OK;
}
