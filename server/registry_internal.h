/*
 * registry_internal.h: what the registry's files share (registry.h is its
 * face): the records of tenants, their accounts and charges, and sessions,
 * and the functions one file of the registry calls in another.  Calls go
 * one way: registry_sessions.c and registry_uploads.c -> registry.c (the
 * tensors) -> registry_quota.c (tenants, charges, reservations) and
 * registry_expiry.c (the entries that expire).  Every
 * function here but the clock wants the registry's mutex held.
 */
#ifndef TPORT_REGISTRY_INTERNAL_H
#define TPORT_REGISTRY_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* uthash: an allocation failure leaves the table as it was (reported through
 * reg_oom) instead of exiting the process.  Each file has its own flag: it
 * is set and read within one HASH_ADD's caller. */
static _Thread_local bool reg_oom __attribute__((unused));
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(e) (reg_oom = true)

#include "registry.h"

/* What a tenant pays for one storage, however many entries reference it:
 * in the registry's one table (registry.charges), keyed by both, so that it
 * outlives a tenant's record and keeps its buckets. */
typedef struct reg_charge_key {
  const struct reg_tenant *tenant;
  const tport_storage *storage;
} reg_charge_key;

typedef struct reg_charge {
  reg_charge_key key;
  size_t nbytes;
  int count;
  UT_hash_handle hh;
} reg_charge;

/* What a tenant pays for memory that lives longer than any request or
 * entry: the host copies and read-back blocks a get lends to its replies,
 * charged when taken (under the registry's lock, against the quota) and
 * given back when nng frees the reply -- on nng's threads, maybe under
 * nng's locks, so without the registry's lock (which ctx_cb takes on nng's
 * poller thread): one atomic subtraction.  Refcounted by its tenant and
 * each charge, so a charge may outlive the tenant's record (the server
 * stopping). */
typedef struct reg_account {
  atomic_size_t lent;     /* bytes charged for the life of their memory */
  atomic_size_t readback; /* of those, blocks of the read-back pool */
  atomic_int later;       /* holds that may still charge it (reg_later) */
  atomic_int refs;
} reg_account;

/* Whether something is or may yet be charged to a: its tenant's record
 * stays while it is (a new connection of that name finds it). */
static inline bool account_busy(reg_account *a)
{
  return atomic_load(&a->lent) > 0 || atomic_load(&a->later) > 0;
}

typedef struct reg_tenant {
  char name[REG_TENANT_MAX];
  size_t bytes;     /* distinct storages plus reservations (and acct->lent) */
  reg_account *acct;
  uint64_t tensors; /* entries, uploads included */
  uint64_t uploads;
  int refs;         /* sessions, entries and transfers that name it */
  uint64_t charges; /* its records in registry.charges (entries', so none once it is forgotten) */
  reg_entry *names; /* hash (hh_name) */
  reg_entry *entries; /* list (tprev/tnext): all of its entries, newest first */
  reg_waiter *waiters; /* list: requests waiting for one of its names */
  uint64_t nwaiters;
  UT_hash_handle hh;
  /* named by no one, kept for what is lent (registry.lingering): the
   * reaper forgets it once that came back */
  bool lingering;
  struct reg_tenant *lprev, *lnext;
} reg_tenant;

typedef struct reg_session {
  uint32_t pipe;
  reg_tenant *tn;
  bool tenant_fixed;  /* by Hello */
  bool authenticated; /* proved its tenant (or authentication is off) */
  bool challenged;    /* a challenge is out, unanswered */
  uint8_t challenge[REG_CHALLENGE_BYTES];
  bool dropped; /* the server is closing it */
  int64_t dropped_ms; /* when it was last told to close */
  int64_t opened_ms; /* CLOCK_MONOTONIC */
  /* not yet proved: in registry.unproved (opening order) until overdue, then
   * in registry.overdue (by looked_ms: when the reaper was last told of it) */
  struct reg_session *uprev, *unext;
  uint8_t ulist; /* 0: in neither, UNPROVED_NEW, UNPROVED_OVERDUE */
  int64_t looked_ms; /* CLOCK_MONOTONIC */
  reg_via via;
  char peer[REG_PEER_MAX];
  int inflight_chunks, outstanding, transfers;
  int reservations; /* reg_reservations holding bytes of its tenant */
  int waiters;      /* reg_waiters registered (they hold its tenant) */
  reg_entry *owned; /* list (sprev/snext) */
  UT_hash_handle hh;
} reg_session;

static inline reg_session *session_find(registry *r, uint32_t pipe)
{
  reg_session *s;
  HASH_FIND(hh, r->sessions, &pipe, sizeof pipe, s);
  return s;
}

/* registry_quota.c: what the tenant holds (charges, reservations and lends,
 * saturating) and what is left of its quota. */
size_t tenant_held(const reg_tenant *t);
size_t tenant_left(const registry *r, const reg_tenant *t);
/* A reference to the tenant record of that name, created on first use
 * (NULL: out of memory); given back by tenant_unref, which forgets a tenant
 * no one names once nothing lent is charged to it. */
reg_tenant *tenant_ref(registry *r, const char *name);
void tenant_unref(registry *r, reg_tenant *t);
void tenant_forget(registry *r, reg_tenant *t);
/* The tenants no one names whose lends have all come back, forgotten: the
 * lingering ones alone are looked at (the reaper, each second). */
void tenants_forget_lingering(registry *r);
/* Bytes the tenant would newly pay for storage s; its charge for s taken
 * (false: out of memory) and given back, counted per storage. */
size_t tenant_charge_cost(registry *r, reg_tenant *t, const tport_storage *s);
bool tenant_charge(registry *r, reg_tenant *t, const tport_storage *s);
/* tenant_charge of a storage that fresh says no entry has yet (an upload's
 * landing, made by its PutBegin): no lookup, its cost its size. */
bool tenant_charge_new(registry *r, reg_tenant *t, const tport_storage *s, bool fresh);
void tenant_uncharge(registry *r, reg_tenant *t, const tport_storage *s);
/* Gives res's bytes back to its tenant. */
void reservation_drop(registry *r, reg_reservation *res);

/* registry.c: an entry freed (never under the lock), and those that
 * entry_unlink set aside, freed once the lock is let go. */
void entry_free(registry *r, reg_entry *e);
void entry_free_dead(registry *r, reg_entry *dead);
/* e no longer in its session's list (kept for its tenant, or going). */
void entry_owner_unlink(reg_entry *e);
/* Unlinks e, stops charging its tenant and drops the registry's reference;
 * the last one puts e on *dead. */
void entry_unlink(registry *r, reg_entry *e, reg_entry **dead);
/* reg_add's checks and charge for e (st its storage) under the lock, *holder
 * the entry a replace swaps out (registry.c); then e into the registry's
 * lists and its session's, or kept for its tenant. */
int add_check(registry *r, reg_session *s, const reg_entry *e, const tport_storage *st,
              bool take_name, bool replace, size_t reserve, reg_entry **holder, tport_err *err);
void add_link(registry *r, reg_session *s, reg_entry *e, bool keep, uint64_t ttl_ms);
/* e takes its name from holder (NULL: none), which leaves the registry in
 * the same step (onto *dead); on failure neither changes. */
int name_take(registry *r, reg_entry *e, reg_entry *holder, reg_entry **dead, tport_err *err);
/* e kept for its tenant: it expires after ttl_ms (0: the default TTL). */
void entry_set_expiry(registry *r, reg_entry *e, uint64_t ttl_ms);
/* registry_expiry.c: e into the heap of entries that expire (its
 * expires_ms set), and out of it (whether there or not: unlinked); the
 * soonest one due by now_ms (NULL: none); the heap's memory freed. */
void expiry_add(registry *r, reg_entry *e);
void expiry_remove(registry *r, reg_entry *e);
reg_entry *expiry_due(const registry *r, int64_t now_ms);
void expiry_free(registry *r);
/* registry_waiters.c (called by the three above, calls none of them): every waiter of the pipe's
 * session unregistered (it is closing) into wake/arg (up to max; returns how many: call again while
 * it fills max), and the same for the waiters of name in t. */
size_t waiters_take_session(registry *r, reg_session *s, void (**wake)(void *), void **arg,
                            size_t max);
/* Wakes every waiter of name in tn (the lock NOT held: it is taken in
 * rounds, and the wakes are called without it), then drops a reference to
 * tn the caller took under the lock (tn->refs++): the entry that published
 * the name may lose its tenant meanwhile (a Free, its time to live, its
 * session's close), and the tenant with it (found by review). */
void waiters_wake_name(registry *r, reg_tenant *tn, const char *name);

#endif
