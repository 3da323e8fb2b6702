/*
 * registry.h: the server's tensors, sessions and tenants, and what each may
 * hold.
 *
 * A session is one connection (an nng pipe): it exists from the pipe's
 * ADD_PRE event to its REM_POST event, never longer, and belongs to one
 * tenant.  A tensor is either connection-scoped (owned by its session, freed
 * when the connection goes) or kept for its tenant under a unique name with a
 * time to live.  An upload always belongs to its connection until it is
 * committed, whatever its name.  A handle is 128 random bits; a handle or
 * name of another tenant is "not found".  Entries are refcounted: a handler
 * holds its own reference while it works, so a concurrent free or disconnect
 * never pulls a tensor from under it.  Handles, names, sessions and tenants
 * are found through hash tables.
 *
 * What a tenant pays for is storage: each distinct storage its entries
 * reference is counted once, however many views and aliases reference it,
 * for as long as any of them lives; plus what is reserved (the converted
 * result of an upload in progress and what requests at work are about to
 * allocate: reg_reservation); plus what it lends to replies (a get's copy,
 * the read-back blocks of a get from a device) for as long as that memory
 * lives, which may be past the request's end, until nng frees the reply.  Every
 * byte is charged before it is allocated: a request reserves what it will
 * make, under the lock (two requests never both pass a check that only one
 * fits), and its result's charge is paid from the reservation when the
 * result is registered.
 * One mutex guards it all; every operation under it is O(1) (an expiring
 * entry's O(log n): registry_expiry.c) but a List (O(what the tenant
 * holds)), reg_expire (O(what is due)) and the dropping of a session
 * (O(what that session owns)): none costs what other tenants hold.  Nothing is
 * freed under it (entries removed are freed once it is let go), and what is
 * lent is given back without it (an atomic count per tenant).
 */
#ifndef TPORT_REGISTRY_H
#define TPORT_REGISTRY_H

#include <pthread.h>
#include <uthash.h>

#include "engine.h"

#define REG_HANDLE_BYTES 16
#define REG_NAME_MAX 128
#define REG_TENANT_MAX 64
#define REG_CHALLENGE_BYTES 32

/* How a connection came (the listener's scheme), for tport_connections. */
typedef enum {
  REG_VIA_TCP,
  REG_VIA_TLS,
  REG_VIA_IPC,
  REG_VIA_INPROC,
  REG_VIA_OTHER,
  REG_VIAS
} reg_via;
extern const char *const reg_via_names[REG_VIAS];
typedef enum { REG_UPLOADING, REG_READY } reg_state;

/* An upload's life: RECEIVING (chunks are claimed and written) ->
 * COMMITTING (one PutCommit owns it; chunks are refused) -> the entry turns
 * READY and the upload is freed; a failed commit goes back to RECEIVING. */
typedef enum { UP_RECEIVING, UP_COMMITTING } upload_state;

typedef struct reg_upload {
  upload_state state;
  tport_tensor *landing; /* the bytes land here, in the client's layout -- or, when
                            convert_on_arrival, already converted: the final tensor */
  bool convert_on_arrival;  /* each chunk is converted as it lands (dtype only) */
  tport_dtype source_dtype; /* the client's, with convert_on_arrival */
  size_t nbytes, chunk_bytes;
  uint64_t nchunks;
  uint8_t *claimed, *received; /* bitmaps: a chunk being written / written */
  uint64_t nreceived;
  int inflight;
  /* what commit makes of the landing tensor */
  to_options convert;
  bool needs_convert;
  /* what commit makes of the entry: kept for the tenant (named or keep) */
  bool keep;
  uint64_t ttl_ms;
  /* named with replace: the name is taken at the commit, from whatever
   * tensor holds it then (reg_add_replacing) */
  bool replace;
} reg_upload;

struct reg_tenant;
struct reg_session;

typedef struct reg_entry {
  uint8_t handle[REG_HANDLE_BYTES];
  char name[REG_NAME_MAX]; /* "" when unnamed */
  struct reg_tenant *tn;
  struct reg_session *owner; /* NULL: kept for the tenant */
  int64_t expires_ms;        /* 0: no time limit */
  size_t expiry_at;          /* its place in registry.expiry, from 1 (0: not there) */
  reg_state state;
  tport_tensor *tensor; /* READY */
  reg_upload *up;       /* UPLOADING */
  const tport_storage *charged; /* the storage the tenant pays for (NULL: none) */
  size_t reserved;              /* bytes reserved beyond it */
  int refs;                     /* the registry's own plus one per holder */
  bool removed;
  bool holds_name; /* in its tenant's names (an upload with replace is not, till its commit) */
  UT_hash_handle hh;      /* by handle */
  UT_hash_handle hh_name; /* by name, in its tenant */
  struct reg_entry *prev, *next;   /* every entry */
  struct reg_entry *sprev, *snext; /* its owner session's */
  struct reg_entry *tprev, *tnext; /* its tenant's (a List walks these alone) */
} reg_entry;

typedef struct reg_limits {
  size_t max_tensor_bytes;
  size_t tenant_quota_bytes;
  uint64_t max_tensors; /* per tenant, uploads included */
  int max_inflight_chunks;
  int max_outstanding; /* requests per connection not yet answered */
  int max_transfers;   /* gets in progress per connection */
  uint64_t default_ttl_ms;
  uint64_t max_ttl_ms;
  /* bytes of the read-back pool one tenant's replies not yet sent may
   * hold (0: no bound but the quota) */
  size_t max_readback_bytes;
} reg_limits;

/* The entries with a time limit, soonest first (registry_expiry.c). */
typedef struct reg_expiry {
  struct reg_entry **v;
  size_t n, cap;
} reg_expiry;

typedef struct registry {
  pthread_mutex_t mu;
  reg_entry *by_handle; /* hash */
  struct reg_charge *charges; /* hash: what each tenant pays, per storage */
  /* Entries that keep the two hashes above from ever emptying: uthash frees
   * an empty table, and a client that puts 10,000 tensors and closes made
   * the next one regrow both from 32 buckets, rehashing every entry at each
   * doubling (~10% of tportd's time in a batch of small puts).  Never found:
   * the handle's all zero and its tenant none, the charge's tenant none. */
  reg_entry *handle_keep;
  struct reg_charge *charge_keep;
  reg_entry *entries;   /* list */
  /* Entries reg_list has looked at, ever (tests: a tenant's List walks its own
   * entries, not every tenant's under the lock). */
  uint64_t list_walked;
  reg_expiry expiry;
  uint64_t expiry_unindexed; /* entries with a time limit not in it (out of memory) */
  uint64_t expire_walked;    /* entries reg_expire has looked at, ever (tests) */
  struct reg_session *sessions;
  struct reg_tenant *tenants;
  struct reg_tenant *lingering; /* list: tenants named by no one, with lends out */
  uint64_t tenants_walked;      /* tenants reg_expire has looked at, ever (tests) */
  uint64_t added_in_bulk;       /* entries reg_add_many added, ever (tests) */
  /* the sessions that have not proved a tenant, oldest first, and those of
   * them the reaper was told of, least recently first: its look for the
   * overdue ones walks what it returns, not every session */
  struct reg_session *unproved, *unproved_tail, *overdue, *overdue_tail;
  uint64_t unproved_walked; /* sessions reg_unproved_sessions has looked at, ever (tests) */
  /* sessions by transport, kept as they open, are described and close:
   * the reaper's count of activity each second walked every session */
  uint64_t nsessions_via[REG_VIAS];
  reg_limits limits;
  uint64_t count, uploads, nsessions, ntenants;
} registry;

void reg_init(registry *r, const reg_limits *limits);
/* Frees every entry, session and tenant (the server is stopping). */
void reg_destroy(registry *r);
/* Tests: the next n names a tensor takes fail as the name table's
 * allocation failing would (RESOURCE_EXHAUSTED, nothing changed). */
void reg_test_fail_name_adds(int n);
/* Tests: the next n growths of the heap of expiring entries fail as an
 * allocation failure would (those entries are found by walking them all). */
void reg_test_fail_expiry_growth(int n);

/* A connection arrived (the pipe's ADD_PRE event: before its first
 * request): its session, of tenant "default".  False when max_sessions
 * (0: no limit) are open already, or out of memory: the caller closes the
 * connection (--max-connections). */
bool reg_session_open(registry *r, uint32_t pipe, uint64_t max_sessions);
#define REG_PEER_MAX 64
/* What the session remembers of its connection: how it came and its peer's
 * address, which nng no longer gives once the connection has gone (the
 * log line of its closing names it). */
void reg_session_describe(registry *r, uint32_t pipe, reg_via via, const char *peer);
/* The peer recorded for the pipe ("unknown" when none). */
void reg_session_peer(registry *r, uint32_t pipe, char *buf, size_t len);
/* The connection went (REM_POST): its connection-scoped tensors and
 * uploads go, then the session itself.  A request of that pipe still in a
 * worker finds no session and registers nothing. */
void reg_session_close(registry *r, uint32_t pipe);
/* Fixes the session's tenant, once: a later call naming another tenant is
 * PERMISSION_DENIED and changes nothing (as is one on a connection that
 * already holds something). */
int reg_session_set_tenant(registry *r, uint32_t pipe, const char *tenant, tport_err *err);
/* Fixes the tenant as reg_session_set_tenant and marks the connection
 * authenticated (its identity proven, or authentication is off). */
int reg_session_authenticate(registry *r, uint32_t pipe, const char *tenant, tport_err *err);
bool reg_session_authenticated(registry *r, uint32_t pipe);
/* A fresh random challenge for the connection (replacing any other). */
int reg_session_challenge(registry *r, uint32_t pipe, uint8_t out[REG_CHALLENGE_BYTES],
                          tport_err *err);
/* The connection's outstanding challenge, taken: each is answered once. */
bool reg_session_take_challenge(registry *r, uint32_t pipe, uint8_t out[REG_CHALLENGE_BYTES]);
/* The session's tenant name into buf; false when the session is gone. */
bool reg_session_tenant(registry *r, uint32_t pipe, char *buf, size_t len);

/* Up to max connections open for longer than timeout_ms that have not
 * proved a tenant (the reaper drops them when authentication is on): first
 * those returned a second ago or more (a close may not have taken), then
 * the newly overdue, oldest first -- but one told to close less than a
 * second ago, which waits for the second.  Looks at what it returns and at
 * one more of each list. */
size_t reg_unproved_sessions(registry *r, int64_t timeout_ms, uint32_t *out, size_t max);
/* A request of the pipe arrived / its reply was sent.  enter says whether
 * the request may be served; every enter, admitted or not, is matched by a
 * leave.  Refused (the caller drops the connection): the pipe is gone or
 * being dropped; it has twice max_outstanding requests unanswered already
 * (clients are told max_outstanding in HelloReply and libtport keeps to it;
 * the margin absorbs the delay with which a send's completion is reported);
 * or, while proof_required and the connection has not proved its tenant,
 * the request is larger than REG_UNPROVED_REQUEST_MAX or a third one is
 * unanswered (a Hello and its proof go one at a time).  tenant (len bytes)
 * receives the tenant to queue the request under: "" before the proof. */
#define REG_UNPROVED_REQUEST_MAX 4096
typedef enum {
  REG_ADMIT_OK,
  REG_ADMIT_GONE,
  REG_ADMIT_TOO_MANY,
  REG_ADMIT_UNPROVED_TOO_MANY,
  REG_ADMIT_UNPROVED_TOO_LARGE
} reg_admit;
reg_admit reg_request_enter(registry *r, uint32_t pipe, size_t bytes, bool proof_required,
                            char *tenant, size_t len);
/* Why a request was refused, for the log. */
const char *reg_admit_reason(reg_admit a);
/* The server is dropping the pipe's connection: true the first time (its
 * later requests are dropped unanswered too). */
bool reg_session_mark_dropped(registry *r, uint32_t pipe);
void reg_request_leave(registry *r, uint32_t pipe);
/* Claims an in-flight chunk slot for the pipe (RESOURCE_EXHAUSTED past the limit). */
int reg_chunk_enter(registry *r, uint32_t pipe, tport_err *err);
void reg_chunk_leave(registry *r, uint32_t pipe);

/* A get in progress of the pipe that holds bytes of host memory: counted
 * against the connection's transfer limit and its tenant's quota.  Fails
 * with ABORTED when the connection is gone.  On success *tn is a tenant
 * reference for reg_transfer_leave. */
int reg_transfer_enter(registry *r, uint32_t pipe, size_t bytes, struct reg_tenant **tn,
                       tport_err *err);
void reg_transfer_leave(registry *r, uint32_t pipe, struct reg_tenant *tn, size_t bytes);

/* What one request has reserved against its tenant's quota for the memory it
 * is about to allocate (reg_reserve), released when the request ends
 * (reg_reservation_release) or paid into the charge of the tensor it
 * registers (reg_add).  While a connection holds one its tenant cannot
 * change.  Zero it with REG_RESERVATION_INIT. */
typedef struct reg_reservation {
  registry *reg;
  uint32_t pipe;
  struct reg_tenant *tn; /* NULL: nothing reserved yet */
  size_t bytes;          /* reserved */
  size_t used;           /* of those, taken by allocations (reg_reservation_guard) */
  bool for_life;         /* allocations are charged until freed, not till the request ends */
} reg_reservation;
#define REG_RESERVATION_INIT(r, p) ((reg_reservation){.reg = (r), .pipe = (p)})

/* Reserves bytes more for the request (what: what they are for, named in
 * the refusal): RESOURCE_EXHAUSTED, naming the bytes asked and the bytes
 * left, when the tenant's charges and reservations would pass its quota;
 * ABORTED when the connection is gone.  Nothing changes on failure. */
int reg_reserve(reg_reservation *res, size_t bytes, const char *what, tport_err *err);
/* Gives back what is still reserved (nothing when reg_add took it). */
void reg_reservation_release(reg_reservation *res);
/* An engine allocation guard (engine_set_alloc_guard) with ctx a
 * reg_reservation: each allocation is taken from what is reserved and not
 * yet used, reserving the rest first when that is not enough.  With
 * for_life -- and for every read-back block, whatever the reservation --
 * the allocation is charged for as long as its memory lives instead (a
 * get's copy, a block lent to a reply: nng may hold them past the
 * request): moved out of the reservation (the part it covers) into the
 * tenant's account, the rest checked against the quota first, a read-back
 * block also against max_readback_bytes (waiting up to 2 s for the
 * tenant's own blocks to come back, a block read ahead not at all); the
 * charge goes back, lock-free,
 * when the memory is freed or returns to its pool (engine.h's keep). */
int reg_reservation_guard(void *res, engine_alloc_kind kind, size_t nbytes, engine_charge *keep,
                          tport_err *err);

/* A charge that may come later, from any thread and without the lock: for
 * memory a request's helper may go on holding after the request has ended
 * (a read of a client's memory given up keeps the tensor it writes).
 * reg_later_begin holds the account of the pipe's tenant (ABORTED when the
 * connection is gone); reg_later_charge adds n bytes to it, held already
 * and so not checked against the quota (it may pass it: the tenant's next
 * requests are refused until the bytes go); reg_later_end gives back what
 * was charged, and the account.  The account outlives the registry. */
typedef struct reg_later {
  struct reg_account *acct; /* NULL: nothing held */
  size_t charged;
} reg_later;
int reg_later_begin(registry *r, uint32_t pipe, reg_later *l, tport_err *err);
void reg_later_charge(reg_later *l, size_t n);
void reg_later_end(reg_later *l);

/* Testing knob: called as each entry is freed (never set outside tests). */
extern void (*reg_test_entry_free)(registry *r);

/* Registers a ready tensor t, or an upload up (exactly one of the two; the
 * entry takes ownership of it, and frees it on failure) for the pipe's
 * session.  name may be NULL or ""; a named ready tensor, or one with keep,
 * is kept for the tenant with a time to live (ttl_ms 0: the default; over
 * the maximum: INVALID_ARGUMENT), any other lives with the connection (an
 * upload always does until its commit).  The tenant pays for the tensor's
 * storage unless it already does, plus reserve bytes.  paid (may be NULL)
 * is what the request reserved for them: it is given back in the same step
 * that charges the entry (success or not), so the bytes are never counted
 * twice nor left uncounted.  Returns the entry with a reference for the
 * caller (reg_put it). */
/* reg_add's checks of its arguments alone (the name's length, ttl_ms),
 * for a caller to make before the work of the tensor it would add. */
int reg_add_check(const registry *r, const char *name, uint64_t ttl_ms, tport_err *err);
int reg_add(registry *r, uint32_t pipe, tport_tensor *t, reg_upload *up, const char *name,
            bool keep, uint64_t ttl_ms, size_t reserve, reg_reservation *paid, reg_entry **out,
            tport_err *err);
/* reg_add that takes the name from the tensor holding it, if any (a put
 * with replace): a ready t swaps at once; an upload holds no name until
 * reg_commit_end, which swaps then.  Swapped: the old entry leaves the
 * registry (its handle and its charge go; holders keep its memory until
 * they let go), in the same step that the new one takes the name, so a
 * reader by name finds the one or the other.  A name held by an upload of
 * a put without replace is ALREADY_EXISTS. */
int reg_add_replacing(registry *r, uint32_t pipe, tport_tensor *t, reg_upload *up, const char *name,
                      bool keep, uint64_t ttl_ms, size_t reserve, reg_reservation *paid,
                      reg_entry **out, tport_err *err);
/* Tensors added together (registry_bulk.c): a PutBatch's plain elements,
 * each made by its worker, then added under one hold of the lock for many
 * rather than under two of their own (the add and the caller's reference
 * dropped).  Unnamed and connection-scoped: what reg_add without a name,
 * keep or reserve would make of them, with the same checks and charges. */
typedef struct reg_pending {
  reg_entry *e;         /* its entry: handle set, tensor held, not in the registry */
  reg_reservation paid; /* what its request reserved for the tensor */
} reg_pending;

/* An entry for t under handle, not added (reg_add_many adds it, or
 * reg_pending_free frees it without t); NULL when out of memory. */
reg_entry *reg_pending_entry(tport_tensor *t, const uint8_t *handle);
void reg_pending_free(reg_entry *e);
/* Adds p[0..n) in order until one fails; returns how many were added
 * (the registry holds them, their p[i].e set to NULL: the caller has no
 * reference).  The one at
 * the index returned, if it is below n, failed with *err and is freed with
 * its tensor; nothing it reserved stays reserved.  The lock is let go
 * every REG_ADD_MANY_HOLD entries. */
#define REG_ADD_MANY_HOLD 64
size_t reg_add_many(registry *r, uint32_t pipe, reg_pending *p, size_t n, tport_err *err);
/* What p[0..n), never added, hold: their entries and tensors freed, their
 * reservations given back. */
void reg_pending_drop(registry *r, reg_pending *p, size_t n);
/* Finds a tensor by handle bytes or name, for the pipe's tenant; NOT_FOUND
 * otherwise (another tenant's handle included).  *state (when not NULL) is
 * the entry's state read under the lock: the only way a caller may look at
 * it, as a commit on another thread changes it.  REG_READY is final, so a
 * caller that saw it may read e->tensor; an upload's own transitions are
 * checked again by reg_chunk_claim and reg_commit_begin. */
int reg_find(registry *r, uint32_t pipe, const uint8_t *handle, size_t handle_len, const char *name,
             reg_entry **out, reg_state *state, tport_err *err);
void reg_put(registry *r, reg_entry *e);
/* Removes an entry (free, abort); its memory goes once no holder remains. */
void reg_remove(registry *r, reg_entry *e);
/* True when the entry lives with a connection rather than its tenant. */
bool reg_connection_scoped(registry *r, const reg_entry *e);

/* The upload's state machine (every transition under the registry's lock).
 * Claims the whole chunks of bytes [offset, offset + len) for writing:
 * *landing is a reference to the landing tensor to write them into, or NULL
 * when they were all written already (chunks are idempotent);
 * *convert_from is the client's dtype when the landing tensor converts on
 * arrival (it is the final tensor, in another dtype), else -1. */
int reg_chunk_claim(registry *r, reg_entry *e, uint64_t offset, size_t len,
                    tport_tensor **landing, int *convert_from, tport_err *err);
/* The claimed chunks were written (ok) or not (they can be sent again). */
void reg_chunk_done(registry *r, reg_entry *e, uint64_t offset, size_t len, bool ok);
/* RECEIVING -> COMMITTING when every chunk arrived and none is being
 * written; *landing (a reference) and *up's conversion are the caller's to
 * use until reg_commit_end or reg_commit_fail. */
int reg_commit_begin(registry *r, reg_entry *e, tport_tensor **landing, to_options *convert,
                     bool *needs_convert, tport_err *err);
/* COMMITTING -> READY with the stored tensor final (the entry takes it): the
 * tenant now pays for final's storage instead of the landing's and the
 * reservation; a named or kept upload goes to its tenant.  ABORTED (final
 * released) when the entry was removed meanwhile. */
int reg_commit_end(registry *r, reg_entry *e, tport_tensor *final, tport_err *err);
/* COMMITTING -> RECEIVING: the commit failed; it may be tried again. */
void reg_commit_fail(registry *r, reg_entry *e);

/* ---------------------------------------------------------------- waiters
 *
 * A request waiting for a name to exist (Info, GetBegin with wait_ms): it
 * holds no thread.  Its waiter is registered under the lock that publishes
 * names, so a publish after the lookup always wakes it; wake(arg) is then
 * called once, without the registry's lock, on the publishing thread (or
 * the one closing its connection).  A wake says only "look again": the
 * waiter is no longer registered, and the request looks the name up anew
 * (it may be gone again).  A waiter lives in its request's context, which
 * outlives the registry's use of it: reg_unwait before reusing it. */
typedef struct reg_waiter {
  char name[REG_NAME_MAX];
  struct reg_tenant *tn; /* NULL: not registered */
  uint32_t pipe;
  void (*wake)(void *arg);
  void *arg;
  struct reg_waiter *prev, *next; /* its tenant's */
} reg_waiter;
/* Waiters one connection / one tenant may have registered: past them a
 * wait is RESOURCE_EXHAUSTED at once (each holds a request's context). */
#define REG_WAITERS_PER_SESSION 16
#define REG_WAITERS_PER_TENANT 1024
/* The ready tensor named name of the pipe's tenant into *out (a reference),
 * or, when there is none (absent, or still uploading), w registered for it
 * and *out NULL.  RESOURCE_EXHAUSTED past the bounds above, ABORTED when
 * the connection is gone, INVALID_ARGUMENT for a name over the limit. */
int reg_find_or_wait(registry *r, uint32_t pipe, const char *name, reg_waiter *w, reg_entry **out,
                     tport_err *err);
/* w no longer registered (a no-op when it is not): true when it was. */
bool reg_unwait(registry *r, reg_waiter *w);

/* Removes expired entries. */
int reg_expire(registry *r, int64_t now_ms);
/* Entries of the pipe's tenant (references held; reg_put each, free the array). */
/* The tenant's ready entries (references taken) into *out (malloc'd): only
 * the named ones whose names begin with prefix when named or prefix is
 * not empty. */
int reg_list(registry *r, uint32_t pipe, const char *prefix, bool named, reg_entry ***out,
             size_t *n);

typedef struct reg_stats {
  uint64_t tensors, uploads, bytes; /* of the tenant, or of everyone */
  uint64_t waiters;                 /* requests waiting for a name, likewise */
  uint64_t sessions, tenants;       /* server-wide only */
  uint64_t sessions_via[REG_VIAS];  /* server-wide only */
} reg_stats;
/* Server-wide counts. */
void reg_counts(registry *r, reg_stats *out);
/* The counts of the pipe's tenant. */
void reg_tenant_counts(registry *r, uint32_t pipe, reg_stats *out);
/* What one tenant holds (the metrics endpoint's tport_tenant_bytes). */
typedef struct reg_tenant_usage {
  char name[REG_TENANT_MAX];
  uint64_t bytes, tensors;
} reg_tenant_usage;
/* Up to max tenants' usage into out (in no order); returns how many
 * tenants there are (possibly more than max). */
size_t reg_tenants_usage(registry *r, reg_tenant_usage *out, size_t max);

int64_t reg_now_ms(void);
void reg_upload_free(reg_upload *up);

#endif
