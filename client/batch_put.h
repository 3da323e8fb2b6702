/*
 * batch_put.h: what the files of tport_put_batch share -- the plan of one
 * window (put_plan: the groups of small elements, the elements in chunks,
 * the units that go as requests), a PutBatch's request and reply
 * (batch_put_msg.c), the units of the elements in chunks
 * (batch_put_chunked.c); batch_put.c plans and runs them.
 */
#ifndef TPORT_CLIENT_BATCH_PUT_H
#define TPORT_CLIENT_BATCH_PUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "batch.h"
#include "batch_region.h"
#include "client_internal.h"

/* An element this large has its bytes lent to its request (where the
 * transport can send from them) rather than copied: up to
 * CLIENT_LEND_SEGMENTS of them a request, after the copied ones. */
#define BATCH_LEND_MIN ((size_t)256 << 10)

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
  bool direct;                  /* its chunks name the caller's buffer (put_plan.proc) */
  bool given_up;                /* ... and the server gave up reading one */
  size_t chunk_bytes;           /* bytes a PutChunk of it carries or names */
  size_t landed;                /* bytes answered */
  uint8_t handle[TPORT_HANDLE_BYTES];
  Tport__Ref ref;
} chunked;

/* How a group's request carries its elements: the first alone of them as
 * puts of their own, then nruns runs of runlen[x] each
 * (PutBatchRequest.runs). */
typedef struct group_runs {
  size_t alone, nruns;
  size_t *runlen; /* room for the group's elements */
} group_runs;

typedef struct unit {
  unit_kind kind;
  size_t which; /* the group (U_GROUP, U_BEGINS), or the element in chunks */
} unit;

typedef struct put_plan {
  tport_client *c;
  tport_put_item *items;
  size_t *idx, *start;  /* the groups: group g is idx[start[g] .. start[g + 1]) */
  group_runs *runs;     /* how group g's request carries its elements */
  size_t *runlens;      /* their runlen: group g's from start[g] */
  size_t ngroups;
  size_t direct_from;   /* groups from here on name the caller's buffers (proc) */
  /* the direct groups' fence (PutBatchRequest): fence_token while the
   * window waits for their replies, 0 once it does not */
  _Atomic uint64_t fence;
  uint64_t fence_token;
  bool *redo;           /* by item: a direct group's element to put on its own */
  bool *not_direct;     /* by item: ... and the server gave up reading it */
  size_t *slot;         /* group g's slot of the region (BATCH_NO_SLOT: none) */
  chunked *ch;          /* the elements in chunks */
  size_t nch, *bstart;  /* begins' group b is ch[bstart[b] .. bstart[b + 1]) */
  size_t nbegins;
  unit *units;
  size_t nunits;
  lent_chunks lent;     /* bytes lent to requests, the caller's again at the end */
  batch_region region;  /* same host: where the groups' bytes go instead */
  uint64_t proc;        /* the process region the direct elements' chunks name */
  arena replies;        /* where a PutBatch's reply is unpacked (reset after it) */
} put_plan;

/* ---- batch_put_msg.c: a PutBatch */

/* Whether an element of nbytes has its bytes lent to its request. */
bool batch_put_is_lent(const tport_client *c, size_t nbytes);

/* The j-th of the k elements a request carries from first on. */
typedef tport_put_item *(*kth_fn)(put_plan *pp, size_t first, size_t j);
tport_put_item *batch_put_group_kth(put_plan *pp, size_t first, size_t j);
tport_put_item *batch_put_begun_kth(put_plan *pp, size_t first, size_t j);

/* The PutBatch of k elements (kth(pp, first, j) the j-th), each a PutBegin
 * that commits at once (commit) or begins an upload.  Committed elements'
 * bytes ride in the request, or, with slot (not BATCH_NO_SLOT), are copied
 * into that slot of pp's region and named by slices of it, or, direct
 * (BATCH_DIRECT), are named where they are, slices of the process region
 * (pp->proc) that the server reads.  With gr (a group's elements, in
 * pp->idx from first), where the server takes runs, alike ones go as runs
 * (PutBatchRequest.runs): the group's elements are put in the request's
 * order -- gr->alone of them as puts of their own, then the runs' (gr
 * says how many and how long). */
#define BATCH_DIRECT ((size_t)-2)
int batch_put_request(put_plan *pp, size_t first, size_t k, kth_fn kth, bool commit, size_t slot,
                      group_runs *gr, nng_msg **out, tport_err *err);
/* A PutBatch's reply, unpacked into pp->replies, to a request of k
 * elements carried as gr says (NULL: each alone): an error for all, or
 * the reply whose puts answer the first gr->alone and whose runs the
 * rest, run by run as the request's, each run's elements in order: by a
 * handle each (PutRunReply.handles), and those it names in replied
 * (increasing, each within the run) by PutBeginReplies of their own. */
int batch_put_reply(put_plan *pp, client_slot *s, size_t k, const group_runs *gr,
                    Tport__PutBatchReply **r, tport_err *err);

/* ---- batch_put_chunked.c: the units of the elements in chunks */

/* Begins' group b: a PutBatch of their PutBegins, uncommitted. */
int batch_put_begins_make(put_plan *pp, size_t b, nng_msg **out, tport_err *err);
/* Its answer: each element begun (its handle kept), or to be put on its
 * own after the window (refused, or chunked finer than here). */
void batch_put_begins_take(put_plan *pp, client_slot *s, size_t b);
/* Unit u, a chunk of e (no message once e stopped), and its answer. */
int batch_put_chunk_make(put_plan *pp, size_t u, chunked *e, nng_msg **out, tport_err *err);
void batch_put_chunk_take(put_plan *pp, client_slot *s, size_t u, chunked *e);
/* e's end: PutCommit where every chunk landed, PutAbort where it was begun
 * and something failed, nothing where nothing was begun; and its answer. */
int batch_put_end_make(put_plan *pp, chunked *e, nng_msg **out, tport_err *err);
void batch_put_end_take(put_plan *pp, client_slot *s, chunked *e);

#endif
