/* registry.c: tensors, sessions and tenants of the server (see registry.h). */
#include <openssl/rand.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* uthash: an allocation failure leaves the table as it was (reported through
 * reg_oom) instead of exiting the process. */
static _Thread_local bool reg_oom;
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(e) (reg_oom = true)

#include "registry.h"

/* What a tenant pays for one storage, however many entries reference it. */
typedef struct reg_charge {
  const tport_storage *storage;
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
  atomic_int refs;
} reg_account;

typedef struct reg_tenant {
  char name[REG_TENANT_MAX];
  size_t bytes;     /* distinct storages plus reservations (and acct->lent) */
  reg_account *acct;
  uint64_t tensors; /* entries, uploads included */
  uint64_t uploads;
  int refs;         /* sessions, entries and transfers that name it */
  reg_charge *charges;
  reg_entry *names; /* hash (hh_name) */
  UT_hash_handle hh;
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
  int64_t opened_ms;
  int inflight_chunks, outstanding, transfers;
  int reservations; /* reg_reservations holding bytes of its tenant */
  reg_entry *owned; /* list (sprev/snext) */
  UT_hash_handle hh;
} reg_session;

int64_t reg_now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void reg_init(registry *r, const reg_limits *limits)
{
  memset(r, 0, sizeof *r);
  pthread_mutex_init(&r->mu, NULL);
  r->limits = *limits;
}

void reg_upload_free(reg_upload *up)
{
  if (!up)
    return;
  tensor_release(up->landing);
  free(up->claimed);
  free(up->received);
  free(up);
}

void (*reg_test_entry_free)(registry *r);

/* Frees an entry and what it holds: never under the registry's lock (a
 * storage's free may wait for a device, and ctx_cb needs the lock on nng's
 * poller thread). */
static void entry_free(registry *r, reg_entry *e)
{
  if (reg_test_entry_free)
    reg_test_entry_free(r);
  tensor_release(e->tensor);
  reg_upload_free(e->up);
  free(e);
}

/* Frees entries that unlink_entry set aside (linked by next), after the
 * lock is let go. */
static void free_dead(registry *r, reg_entry *dead)
{
  while (dead) {
    reg_entry *e = dead;
    dead = e->next;
    entry_free(r, e);
  }
}

/* ---------------------------------------------------------------- accounts */

static void account_unref(reg_account *a)
{
  if (atomic_fetch_sub(&a->refs, 1) == 1)
    free(a);
}

/* engine_charge releases: on any thread, no lock */
static void account_give_back(void *token, size_t n)
{
  reg_account *a = token;
  atomic_fetch_sub(&a->lent, n);
  account_unref(a);
}

static void account_give_back_readback(void *token, size_t n)
{
  reg_account *a = token;
  atomic_fetch_sub(&a->readback, n);
  account_give_back(a, n);
}

/* What the tenant holds: charges, reservations and lends (saturating). */
static size_t tenant_held(const reg_tenant *t)
{
  size_t lent = atomic_load(&t->acct->lent);
  return t->bytes > SIZE_MAX - lent ? SIZE_MAX : t->bytes + lent;
}

/* What is left of its quota.  mu held (lends only fall without it). */
static size_t tenant_left(const registry *r, const reg_tenant *t)
{
  size_t q = r->limits.tenant_quota_bytes, held = tenant_held(t);
  return held < q ? q - held : 0;
}

/* ---------------------------------------------------------------- tenants */

/* A reference to the tenant record of that name, created on first use.  mu held. */
static reg_tenant *tenant_ref(registry *r, const char *name)
{
  reg_tenant *t;
  HASH_FIND_STR(r->tenants, name, t);
  if (!t) {
    t = calloc(1, sizeof *t);
    reg_account *a = calloc(1, sizeof *a);
    if (!t || !a) {
      free(t);
      free(a);
      return NULL;
    }
    atomic_init(&a->lent, 0);
    atomic_init(&a->readback, 0);
    atomic_init(&a->refs, 1);
    t->acct = a;
    snprintf(t->name, sizeof t->name, "%s", name);
    reg_oom = false;
    HASH_ADD_STR(r->tenants, name, t);
    if (reg_oom) {
      free(a);
      free(t);
      return NULL;
    }
    r->ntenants++;
  }
  t->refs++;
  return t;
}

static void tenant_forget(registry *r, reg_tenant *t)
{
  HASH_DEL(r->tenants, t);
  r->ntenants--;
  account_unref(t->acct);
  free(t);
}

/* A tenant no one names any more is forgotten -- once nothing lent is
 * charged to it either: until then it stays (a new connection of that name
 * finds its lends still charged), and reg_expire forgets it after.  mu held. */
static void tenant_unref(registry *r, reg_tenant *t)
{
  if (!t || --t->refs > 0 || atomic_load(&t->acct->lent) > 0)
    return;
  tenant_forget(r, t);
}

/* Bytes the tenant would newly pay for storage s.  mu held. */
static size_t charge_cost(reg_tenant *t, const tport_storage *s)
{
  reg_charge *c;
  if (!s)
    return 0;
  HASH_FIND_PTR(t->charges, &s, c);
  return c ? 0 : storage_nbytes(s);
}

static bool charge(reg_tenant *t, const tport_storage *s)
{
  reg_charge *c;
  HASH_FIND_PTR(t->charges, &s, c);
  if (!c) {
    c = calloc(1, sizeof *c);
    if (!c)
      return false;
    c->storage = s;
    c->nbytes = storage_nbytes(s);
    reg_oom = false;
    HASH_ADD_PTR(t->charges, storage, c);
    if (reg_oom) {
      free(c);
      return false;
    }
    t->bytes += c->nbytes;
  }
  c->count++;
  return true;
}

static void uncharge(reg_tenant *t, const tport_storage *s)
{
  reg_charge *c;
  HASH_FIND_PTR(t->charges, &s, c);
  if (c && --c->count == 0) {
    t->bytes -= c->nbytes;
    HASH_DEL(t->charges, c);
    free(c);
  }
}

/* ---------------------------------------------------------------- entries */

static reg_session *session_find(registry *r, uint32_t pipe)
{
  reg_session *s;
  HASH_FIND(hh, r->sessions, &pipe, sizeof pipe, s);
  return s;
}

static void owner_unlink(reg_entry *e)
{
  reg_session *s = e->owner;
  if (!s)
    return;
  if (e->sprev)
    e->sprev->snext = e->snext;
  else
    s->owned = e->snext;
  if (e->snext)
    e->snext->sprev = e->sprev;
  e->owner = NULL;
  e->sprev = e->snext = NULL;
}

/* Unlinks e, stops charging its tenant and drops the registry's reference;
 * when that was the last, e goes on *dead (through next) for free_dead to
 * free once the lock is let go.  mu held. */
static void unlink_entry(registry *r, reg_entry *e, reg_entry **dead)
{
  HASH_DELETE(hh, r->by_handle, e);
  if (e->name[0])
    HASH_DELETE(hh_name, e->tn->names, e);
  if (e->prev)
    e->prev->next = e->next;
  else
    r->entries = e->next;
  if (e->next)
    e->next->prev = e->prev;
  owner_unlink(e);
  e->removed = true;
  if (e->charged)
    uncharge(e->tn, e->charged);
  e->charged = NULL;
  e->tn->bytes -= e->reserved;
  e->reserved = 0;
  e->tn->tensors--;
  e->tn->uploads -= e->state == REG_UPLOADING;
  r->count--;
  r->uploads -= e->state == REG_UPLOADING;
  tenant_unref(r, e->tn);
  if (--e->refs == 0) {
    e->next = *dead;
    *dead = e;
  }
}

void reg_destroy(registry *r)
{
  reg_entry *dead = NULL;
  pthread_mutex_lock(&r->mu);
  while (r->entries)
    unlink_entry(r, r->entries, &dead);
  reg_session *s, *stmp;
  HASH_ITER(hh, r->sessions, s, stmp)
  {
    HASH_DEL(r->sessions, s);
    tenant_unref(r, s->tn);
    free(s);
  }
  /* only transfers not yet ended could still name some, and lends not yet
   * given back (their accounts outlive the records) */
  reg_tenant *t, *ttmp;
  HASH_ITER(hh, r->tenants, t, ttmp)
  {
    tenant_forget(r, t);
  }
  pthread_mutex_unlock(&r->mu);
  free_dead(r, dead);
  pthread_mutex_destroy(&r->mu);
}

/* ---------------------------------------------------------------- sessions */

bool reg_session_open(registry *r, uint32_t pipe, uint64_t max_sessions)
{
  bool ok = false;
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  if (s) {
    ok = true;
  } else if (max_sessions && r->nsessions >= max_sessions) {
    /* counted and refused under one lock: concurrent arrivals cannot both
     * take the last place */
  } else if ((s = calloc(1, sizeof *s)) != NULL) {
    s->pipe = pipe;
    s->opened_ms = reg_now_ms();
    s->tn = tenant_ref(r, "default");
    reg_oom = false;
    if (s->tn)
      HASH_ADD(hh, r->sessions, pipe, sizeof s->pipe, s);
    if (!s->tn || reg_oom) {
      /* no session: every request of this pipe is refused */
      tenant_unref(r, s->tn);
      free(s);
    } else {
      r->nsessions++;
      ok = true;
    }
  }
  pthread_mutex_unlock(&r->mu);
  return ok;
}

void reg_session_close(registry *r, uint32_t pipe)
{
  reg_entry *dead = NULL;
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  if (s) {
    while (s->owned)
      unlink_entry(r, s->owned, &dead);
    HASH_DEL(r->sessions, s);
    r->nsessions--;
    tenant_unref(r, s->tn);
    free(s);
  }
  pthread_mutex_unlock(&r->mu);
  free_dead(r, dead);
}

int reg_session_set_tenant(registry *r, uint32_t pipe, const char *tenant, tport_err *err)
{
  if (!tenant || !*tenant)
    tenant = "default";
  if (strlen(tenant) >= REG_TENANT_MAX)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "tenant is longer than %d bytes",
                         REG_TENANT_MAX - 1);
  int rc = TPORT_OK;
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  if (!s) {
    rc = tport_err_set(err, TPORT_ABORTED, "the connection is closing");
  } else if (strcmp(s->tn->name, tenant) == 0) {
    s->tenant_fixed = true;
  } else if (s->tenant_fixed) {
    rc = tport_err_set(err, TPORT_PERMISSION_DENIED,
                       "this connection is tenant '%s': a connection's tenant is set once",
                       s->tn->name);
  } else if (s->owned || s->transfers || s->reservations) {
    rc = tport_err_set(err, TPORT_PERMISSION_DENIED,
                       "this connection already holds tensors of tenant '%s'", s->tn->name);
  } else {
    reg_tenant *t = tenant_ref(r, tenant);
    if (!t) {
      rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for a tenant");
    } else {
      tenant_unref(r, s->tn);
      s->tn = t;
      s->tenant_fixed = true;
    }
  }
  pthread_mutex_unlock(&r->mu);
  return rc;
}

int reg_session_authenticate(registry *r, uint32_t pipe, const char *tenant, tport_err *err)
{
  int rc = reg_session_set_tenant(r, pipe, tenant, err);
  if (!rc) {
    pthread_mutex_lock(&r->mu);
    reg_session *s = session_find(r, pipe);
    if (s)
      s->authenticated = true;
    pthread_mutex_unlock(&r->mu);
  }
  return rc;
}

bool reg_session_authenticated(registry *r, uint32_t pipe)
{
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  bool ok = s && s->authenticated;
  pthread_mutex_unlock(&r->mu);
  return ok;
}

int reg_session_challenge(registry *r, uint32_t pipe, uint8_t out[REG_CHALLENGE_BYTES],
                          tport_err *err)
{
  if (RAND_bytes(out, REG_CHALLENGE_BYTES) != 1)
    return tport_err_set(err, TPORT_INTERNAL, "cannot make a challenge");
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  if (s) {
    memcpy(s->challenge, out, REG_CHALLENGE_BYTES);
    s->challenged = true;
  }
  pthread_mutex_unlock(&r->mu);
  return s ? TPORT_OK : tport_err_set(err, TPORT_ABORTED, "the connection is closing");
}

bool reg_session_take_challenge(registry *r, uint32_t pipe, uint8_t out[REG_CHALLENGE_BYTES])
{
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  bool had = s && s->challenged;
  if (had) {
    memcpy(out, s->challenge, REG_CHALLENGE_BYTES);
    s->challenged = false; /* used once, whatever the answer */
  }
  pthread_mutex_unlock(&r->mu);
  return had;
}

bool reg_session_tenant(registry *r, uint32_t pipe, char *buf, size_t len)
{
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  if (s)
    snprintf(buf, len, "%s", s->tn->name);
  pthread_mutex_unlock(&r->mu);
  return s != NULL;
}

size_t reg_unproved_sessions(registry *r, int64_t before_ms, uint32_t *out, size_t max)
{
  size_t n = 0;
  int64_t now = reg_now_ms();
  pthread_mutex_lock(&r->mu);
  for (reg_session *s = r->sessions; s && n < max; s = s->hh.next)
    /* dropped ones again a second later: a close may not have taken */
    if (!s->authenticated && s->opened_ms < before_ms &&
        (!s->dropped || now - s->dropped_ms >= 1000))
      out[n++] = s->pipe;
  pthread_mutex_unlock(&r->mu);
  return n;
}

bool reg_session_mark_dropped(registry *r, uint32_t pipe)
{
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  bool first = s && !s->dropped;
  if (s) {
    s->dropped = true;
    s->dropped_ms = reg_now_ms();
  }
  pthread_mutex_unlock(&r->mu);
  return first;
}

reg_admit reg_request_enter(registry *r, uint32_t pipe, size_t bytes, bool proof_required,
                            char *tenant, size_t len)
{
  reg_admit a;
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  bool unproved = s && proof_required && !s->authenticated;
  /* Twice the limit a client is told: the count falls when a reply's send
   * completes, which nng reports a little after the reply may already have
   * reached the client and been answered by a new request.  A connection
   * that has not proved its tenant is told nothing yet and needs one Hello
   * at a time: the same margin over one. */
  if (!s || s->dropped)
    a = REG_ADMIT_GONE;
  else if (unproved && bytes > REG_UNPROVED_REQUEST_MAX)
    a = REG_ADMIT_UNPROVED_TOO_LARGE;
  else if (s->outstanding >= (unproved ? 2 : 2 * r->limits.max_outstanding))
    a = unproved ? REG_ADMIT_UNPROVED_TOO_MANY : REG_ADMIT_TOO_MANY;
  else
    a = REG_ADMIT_OK;
  if (s)
    s->outstanding++; /* left by reg_request_leave whatever happens */
  if (tenant && len)
    snprintf(tenant, len, "%s", !s || unproved ? "" : s->tn->name);
  pthread_mutex_unlock(&r->mu);
  return a;
}

const char *reg_admit_reason(reg_admit a)
{
  switch (a) {
  case REG_ADMIT_OK: return "admitted";
  case REG_ADMIT_GONE: return "the connection is closing";
  case REG_ADMIT_TOO_MANY: return "too many requests unanswered";
  case REG_ADMIT_UNPROVED_TOO_MANY:
    return "more than one request at a time before proving its tenant";
  case REG_ADMIT_UNPROVED_TOO_LARGE:
    return "a request larger than a Hello before proving its tenant";
  }
  return "refused";
}

void reg_request_leave(registry *r, uint32_t pipe)
{
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  if (s && s->outstanding > 0)
    s->outstanding--;
  pthread_mutex_unlock(&r->mu);
}

int reg_chunk_enter(registry *r, uint32_t pipe, tport_err *err)
{
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  int rc = TPORT_OK;
  if (!s)
    rc = tport_err_set(err, TPORT_ABORTED, "the connection is closing");
  else if (s->inflight_chunks >= r->limits.max_inflight_chunks)
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                       "%d chunks already in flight on this connection (limit %d)",
                       s->inflight_chunks, r->limits.max_inflight_chunks);
  else
    s->inflight_chunks++;
  pthread_mutex_unlock(&r->mu);
  return rc;
}

void reg_chunk_leave(registry *r, uint32_t pipe)
{
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  if (s && s->inflight_chunks > 0)
    s->inflight_chunks--;
  pthread_mutex_unlock(&r->mu);
}

int reg_transfer_enter(registry *r, uint32_t pipe, size_t bytes, reg_tenant **tn, tport_err *err)
{
  int rc = TPORT_OK;
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  if (!s)
    rc = tport_err_set(err, TPORT_ABORTED, "the connection is closing");
  else if (s->transfers >= r->limits.max_transfers)
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                       "%d gets already in progress on this connection (limit %d): read or "
                       "finish them first",
                       s->transfers, r->limits.max_transfers);
  else if (bytes > tenant_left(r, s->tn))
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                       "tenant '%s' would hold %zu bytes more than its %zu with this get's host "
                       "copy: its quota is %zu",
                       s->tn->name, bytes, tenant_held(s->tn), r->limits.tenant_quota_bytes);
  if (!rc) {
    s->transfers++;
    s->tn->bytes += bytes;
    s->tn->refs++;
    *tn = s->tn;
  }
  pthread_mutex_unlock(&r->mu);
  return rc;
}

void reg_transfer_leave(registry *r, uint32_t pipe, reg_tenant *tn, size_t bytes)
{
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  if (s && s->transfers > 0)
    s->transfers--;
  tn->bytes -= bytes;
  tenant_unref(r, tn);
  pthread_mutex_unlock(&r->mu);
}

/* ---------------------------------------------------------------- reservations */

/* Gives res's bytes back to its tenant.  mu held. */
static void reservation_drop(registry *r, reg_reservation *res)
{
  if (!res || !res->tn)
    return;
  res->tn->bytes -= res->bytes;
  reg_session *s = session_find(r, res->pipe);
  if (s && s->reservations > 0)
    s->reservations--;
  tenant_unref(r, res->tn);
  res->tn = NULL;
  res->bytes = res->used = 0;
}

int reg_reserve(reg_reservation *res, size_t bytes, const char *what, tport_err *err)
{
  registry *r = res->reg;
  int rc = TPORT_OK;
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, res->pipe);
  reg_tenant *tn = res->tn ? res->tn : s ? s->tn : NULL;
  size_t quota = r->limits.tenant_quota_bytes;
  size_t left = tn ? tenant_left(r, tn) : 0;
  if (!s)
    rc = tport_err_set(err, TPORT_ABORTED, "the connection is closing");
  else if (bytes > left || res->bytes > SIZE_MAX - bytes)
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                       "%s needs %zu bytes: tenant '%s' has %zu left of its quota of %zu "
                       "(%zu held or reserved)",
                       what, bytes, tn->name, left, quota, tenant_held(tn));
  if (!rc && bytes) {
    if (!res->tn) {
      res->tn = tn;
      tn->refs++;
      s->reservations++;
    }
    tn->bytes += bytes;
    res->bytes += bytes;
  }
  pthread_mutex_unlock(&r->mu);
  return rc;
}

void reg_reservation_release(reg_reservation *res)
{
  if (!res || !res->tn)
    return;
  pthread_mutex_lock(&res->reg->mu);
  reservation_drop(res->reg, res);
  pthread_mutex_unlock(&res->reg->mu);
}

/* Charges nbytes of kind for the life of the memory (res->for_life, and
 * read-back blocks always): taken from what res has reserved and not used,
 * the rest checked against the quota -- and a read-back block against the
 * tenant's share of the read-back pool -- all under the lock, and moved to
 * the tenant's account, which *keep gives back when the memory goes. */
/* How long a read-back block over its tenant's share waits for the
 * tenant's own blocks to come back (replies being sent) before it is
 * refused: a client that reads gets its chunks, one that does not is
 * refused without holding a worker for long. */
#define REG_READBACK_WAIT_MS 2000

static int reservation_lend(reg_reservation *res, engine_alloc_kind kind, size_t nbytes,
                            engine_charge *keep, tport_err *err)
{
  registry *r = res->reg;
  bool readback = kind != ENGINE_ALLOC_STORAGE;
  int rc = TPORT_OK;
  for (int waited = 0; kind == ENGINE_ALLOC_READBACK && waited < REG_READBACK_WAIT_MS;
       waited += 5) {
    pthread_mutex_lock(&r->mu);
    reg_session *s = session_find(r, res->pipe);
    reg_tenant *tn = res->tn ? res->tn : s ? s->tn : NULL;
    size_t share = r->limits.max_readback_bytes;
    bool fits = !tn || !share || nbytes > share ||
                atomic_load(&tn->acct->readback) <= share - nbytes;
    pthread_mutex_unlock(&r->mu);
    if (fits)
      break;
    usleep(5000);
  }
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, res->pipe);
  reg_tenant *tn = res->tn ? res->tn : s ? s->tn : NULL;
  size_t unused = res->tn ? res->bytes - res->used : 0;
  size_t from_res = nbytes < unused ? nbytes : unused; /* already counted in tn->bytes */
  size_t more = nbytes - from_res;
  size_t share = r->limits.max_readback_bytes;
  size_t rb = tn ? atomic_load(&tn->acct->readback) : 0;
  if (!s || !tn) {
    rc = tport_err_set(err, TPORT_ABORTED, "the connection is closing");
  } else if (more > tenant_left(r, tn)) {
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                       "%s needs %zu bytes: tenant '%s' has %zu left of its quota of %zu "
                       "(%zu held or reserved, %zu of them by gets' copies and read-back blocks)",
                       readback ? "a read-back block of this get" : "this get's copy", nbytes,
                       tn->name, tenant_left(r, tn), r->limits.tenant_quota_bytes,
                       tenant_held(tn), (size_t)atomic_load(&tn->acct->lent));
  } else if (readback && share && (nbytes > share || rb > share - nbytes)) {
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                       "a read-back block of %zu bytes: tenant '%s' holds %zu bytes of the "
                       "read-back pool in replies not yet sent, and may hold %zu (its share): "
                       "read the replies first",
                       nbytes, tn->name, rb, share);
  }
  if (!rc) {
    res->bytes -= from_res; /* out of the reservation, into the account: never uncounted */
    tn->bytes -= from_res;
    atomic_fetch_add(&tn->acct->lent, nbytes);
    if (readback)
      atomic_fetch_add(&tn->acct->readback, nbytes);
    atomic_fetch_add(&tn->acct->refs, 1);
    *keep = (engine_charge){.release = readback ? account_give_back_readback : account_give_back,
                            .token = tn->acct,
                            .nbytes = nbytes};
  }
  pthread_mutex_unlock(&r->mu);
  return rc;
}

int reg_reservation_guard(void *ctx, engine_alloc_kind kind, size_t nbytes, engine_charge *keep,
                          tport_err *err)
{
  reg_reservation *res = ctx;
  if (res->for_life || kind != ENGINE_ALLOC_STORAGE)
    return reservation_lend(res, kind, nbytes, keep, err);
  size_t unused = res->bytes - res->used;
  if (nbytes > unused) {
    char what[96];
    snprintf(what, sizeof what, "an allocation of %zu bytes for this request", nbytes);
    int rc = reg_reserve(res, nbytes - unused, what, err);
    if (rc)
      return rc;
  }
  res->used += nbytes;
  return TPORT_OK;
}

/* ---------------------------------------------------------------- add, find */

static reg_entry *find_name(reg_tenant *t, const char *name)
{
  reg_entry *e;
  HASH_FIND(hh_name, t->names, name, strlen(name), e);
  return e;
}

static void set_expiry(registry *r, reg_entry *e, uint64_t ttl_ms)
{
  uint64_t ttl = ttl_ms ? ttl_ms : r->limits.default_ttl_ms;
  e->expires_ms = ttl ? reg_now_ms() + (int64_t)ttl : 0; /* ttl <= max_ttl: no overflow */
}

int reg_add(registry *r, uint32_t pipe, tport_tensor *t, reg_upload *up, const char *name,
            bool keep, uint64_t ttl_ms, size_t reserve, reg_reservation *paid, reg_entry **out,
            tport_err *err)
{
  int rc = TPORT_OK;
  bool named = name && *name;
  if (named && strlen(name) >= REG_NAME_MAX)
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "name is %zu bytes: the limit is %d",
                       strlen(name), REG_NAME_MAX - 1);
  else if (ttl_ms > r->limits.max_ttl_ms)
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "ttl_ms is %llu: the longest is %llu",
                       (unsigned long long)ttl_ms, (unsigned long long)r->limits.max_ttl_ms);
  reg_entry *e = rc ? NULL : calloc(1, sizeof *e);
  if (!rc && (!e || RAND_bytes(e->handle, REG_HANDLE_BYTES) != 1))
    rc = tport_err_set(err, TPORT_INTERNAL, "cannot create a handle");
  if (rc) {
    free(e);
    tensor_release(t);
    reg_upload_free(up);
    reg_reservation_release(paid);
    return rc;
  }
  e->tensor = t;
  e->up = up;
  e->state = up ? REG_UPLOADING : REG_READY;
  e->refs = 2; /* the registry's and the caller's */
  if (named)
    snprintf(e->name, sizeof e->name, "%s", name);
  if (up) {
    up->keep = named || keep;
    up->ttl_ms = ttl_ms;
  }
  const tport_storage *st = up ? up->landing->storage : t->storage;
  pthread_mutex_lock(&r->mu);
  /* what was reserved for it becomes its charge: given back and charged in
   * one step under the lock, so the check below counts it once */
  reservation_drop(r, paid);
  reg_session *s = session_find(r, pipe);
  reg_tenant *tn = s ? s->tn : NULL;
  size_t add = tn ? charge_cost(tn, st) : 0;
  if (!s) {
    rc = tport_err_set(err, TPORT_ABORTED, "the connection is closing");
  } else if (named && find_name(tn, name)) {
    rc = tport_err_set(err, TPORT_ALREADY_EXISTS, "a tensor named '%s' already exists", name);
  } else if (tn->tensors >= r->limits.max_tensors) {
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                       "tenant '%s' holds %llu tensors: its limit is %llu", tn->name,
                       (unsigned long long)tn->tensors, (unsigned long long)r->limits.max_tensors);
  } else if (add > tenant_left(r, tn) || reserve > tenant_left(r, tn) - add) {
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                       "tenant '%s' would hold %zu more bytes than its %zu: its quota is %zu",
                       tn->name, add > SIZE_MAX - reserve ? SIZE_MAX : add + reserve,
                       tenant_held(tn), r->limits.tenant_quota_bytes);
  } else if (!charge(tn, st)) {
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for an entry");
  }
  if (!rc) {
    reg_oom = false;
    HASH_ADD(hh, r->by_handle, handle, REG_HANDLE_BYTES, e);
    if (!reg_oom && named) {
      HASH_ADD(hh_name, tn->names, name, strlen(e->name), e);
      if (reg_oom)
        HASH_DELETE(hh, r->by_handle, e);
    }
    if (reg_oom) {
      uncharge(tn, st);
      rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for an entry");
    }
  }
  if (rc) {
    pthread_mutex_unlock(&r->mu);
    entry_free(r, e); /* releases t or up */
    return rc;
  }
  e->tn = tn;
  tn->refs++;
  tn->tensors++;
  e->charged = st;
  e->reserved = reserve;
  tn->bytes += reserve;
  if (!up && (named || keep)) {
    set_expiry(r, e, ttl_ms);
  } else {
    e->owner = s;
    e->snext = s->owned;
    if (s->owned)
      s->owned->sprev = e;
    s->owned = e;
  }
  e->next = r->entries;
  if (r->entries)
    r->entries->prev = e;
  r->entries = e;
  r->count++;
  r->uploads += up != NULL;
  tn->uploads += up != NULL;
  pthread_mutex_unlock(&r->mu);
  *out = e;
  return TPORT_OK;
}

int reg_find(registry *r, uint32_t pipe, const uint8_t *handle, size_t handle_len, const char *name,
             reg_entry **out, reg_state *state, tport_err *err)
{
  if (handle_len != 0 && handle_len != REG_HANDLE_BYTES)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "ref.handle is %zu bytes: handles are %d",
                         handle_len, REG_HANDLE_BYTES);
  if (handle_len == 0 && (!name || !*name))
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "ref has neither a handle nor a name");
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  reg_entry *hit = NULL;
  if (!s) {
    pthread_mutex_unlock(&r->mu);
    return tport_err_set(err, TPORT_ABORTED, "the connection is closing");
  }
  if (handle_len) {
    HASH_FIND(hh, r->by_handle, handle, REG_HANDLE_BYTES, hit);
    if (hit && hit->tn != s->tn)
      hit = NULL; /* another tenant's: exactly as if it did not exist */
  } else if (strlen(name) < REG_NAME_MAX) {
    hit = find_name(s->tn, name);
  }
  if (hit) {
    hit->refs++;
    if (state)
      *state = hit->state;
  }
  pthread_mutex_unlock(&r->mu);
  if (!hit)
    return handle_len == 0 ? tport_err_set(err, TPORT_NOT_FOUND, "no tensor named '%.100s'", name)
                           : tport_err_set(err, TPORT_NOT_FOUND, "no tensor with that handle");
  *out = hit;
  return TPORT_OK;
}

void reg_put(registry *r, reg_entry *e)
{
  if (!e)
    return;
  pthread_mutex_lock(&r->mu);
  bool last = --e->refs == 0;
  pthread_mutex_unlock(&r->mu);
  if (last)
    entry_free(r, e);
}

void reg_remove(registry *r, reg_entry *e)
{
  reg_entry *dead = NULL;
  pthread_mutex_lock(&r->mu);
  if (!e->removed)
    unlink_entry(r, e, &dead);
  pthread_mutex_unlock(&r->mu);
  free_dead(r, dead);
}

bool reg_connection_scoped(registry *r, const reg_entry *e)
{
  pthread_mutex_lock(&r->mu);
  bool scoped = e->owner != NULL;
  pthread_mutex_unlock(&r->mu);
  return scoped;
}

/* ---------------------------------------------------------------- uploads */

static bool bit(const uint8_t *b, uint64_t i)
{
  return b[i / 8] >> (i % 8) & 1;
}

static void set_bit(uint8_t *b, uint64_t i, bool v)
{
  if (v)
    b[i / 8] |= (uint8_t)(1u << (i % 8));
  else
    b[i / 8] &= (uint8_t) ~(1u << (i % 8));
}

/* The upload of e, if it is still receiving.  mu held. */
static reg_upload *receiving(reg_entry *e, tport_err *err)
{
  if (e->removed)
    return tport_err_set(err, TPORT_ABORTED, "the upload was aborted"), NULL;
  if (e->state != REG_UPLOADING)
    return tport_err_set(err, TPORT_FAILED_PRECONDITION,
                         "ref is not an upload in progress (already committed)"),
           NULL;
  if (e->up->state != UP_RECEIVING)
    return tport_err_set(err, TPORT_FAILED_PRECONDITION, "the upload is being committed"), NULL;
  return e->up;
}

int reg_chunk_claim(registry *r, reg_entry *e, uint64_t offset, size_t len,
                    tport_tensor **landing, int *convert_from, tport_err *err)
{
  *landing = NULL;
  *convert_from = -1;
  pthread_mutex_lock(&r->mu);
  reg_upload *up = receiving(e, err);
  int rc = up ? TPORT_OK : err->code;
  uint64_t first = 0, end = 0;
  if (!rc && up->nbytes == 0) {
    /* an empty tensor: the only chunk is the empty one at 0, and it is
     * complete from the start */
    if (offset != 0 || len != 0)
      rc = tport_err_set(err, TPORT_OUT_OF_RANGE,
                         "the tensor has no bytes: the only chunk is offset 0 with none");
    pthread_mutex_unlock(&r->mu);
    return rc;
  }
  if (!rc && offset >= up->nbytes)
    rc = tport_err_set(err, TPORT_OUT_OF_RANGE, "offset %llu is past the tensor's %zu bytes",
                       (unsigned long long)offset, up->nbytes);
  else if (!rc && offset % up->chunk_bytes)
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT,
                       "offset %llu is not a multiple of the chunk size %zu: chunks may not "
                       "overlap",
                       (unsigned long long)offset, up->chunk_bytes);
  else if (!rc && (len > up->nbytes - offset ||
                   (offset + len != up->nbytes && len % up->chunk_bytes) || len == 0))
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT,
                       "chunk at offset %llu carries %zu bytes: it must carry %zu",
                       (unsigned long long)offset, len,
                       up->nbytes - offset < up->chunk_bytes ? up->nbytes - (size_t)offset
                                                             : up->chunk_bytes);
  if (!rc) {
    first = offset / up->chunk_bytes;
    end = first + (len + up->chunk_bytes - 1) / up->chunk_bytes;
    uint64_t done = 0;
    for (uint64_t i = first; i < end && !rc; i++) {
      if (bit(up->claimed, i) && !bit(up->received, i))
        rc = tport_err_set(err, TPORT_ABORTED,
                           "chunk %llu is being written by another request: retry",
                           (unsigned long long)i);
      done += bit(up->received, i);
    }
    if (!rc && done == end - first) {
      pthread_mutex_unlock(&r->mu);
      return TPORT_OK; /* all written already: idempotent */
    }
    if (!rc && done)
      rc = tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "bytes [%llu, %llu) were partly written already",
                         (unsigned long long)offset, (unsigned long long)(offset + len));
  }
  if (!rc) {
    for (uint64_t i = first; i < end; i++)
      set_bit(up->claimed, i, true);
    up->inflight++;
    *landing = tensor_retain(up->landing);
    if (up->convert_on_arrival)
      *convert_from = (int)up->source_dtype;
  }
  pthread_mutex_unlock(&r->mu);
  return rc;
}

void reg_chunk_done(registry *r, reg_entry *e, uint64_t offset, size_t len, bool ok)
{
  pthread_mutex_lock(&r->mu);
  reg_upload *up = e->up; /* not freed while a chunk is in flight: commit waits for none */
  uint64_t first = offset / up->chunk_bytes;
  uint64_t end = first + (len + up->chunk_bytes - 1) / up->chunk_bytes;
  up->inflight--;
  for (uint64_t i = first; i < end; i++) {
    if (ok) {
      set_bit(up->received, i, true);
      up->nreceived++;
    } else {
      set_bit(up->claimed, i, false);
    }
  }
  pthread_mutex_unlock(&r->mu);
}

int reg_commit_begin(registry *r, reg_entry *e, tport_tensor **landing, to_options *convert,
                     bool *needs_convert, tport_err *err)
{
  pthread_mutex_lock(&r->mu);
  reg_upload *up = receiving(e, err);
  int rc = up ? TPORT_OK : err->code;
  if (!rc && up->inflight)
    rc = tport_err_set(err, TPORT_FAILED_PRECONDITION, "%d chunk%s still being written",
                       up->inflight, up->inflight == 1 ? " is" : "s are");
  else if (!rc && up->nreceived != up->nchunks)
    rc = tport_err_set(err, TPORT_FAILED_PRECONDITION, "%llu of %llu chunks are missing",
                       (unsigned long long)(up->nchunks - up->nreceived),
                       (unsigned long long)up->nchunks);
  if (!rc) {
    up->state = UP_COMMITTING;
    *landing = tensor_retain(up->landing);
    *convert = up->convert;
    *needs_convert = up->needs_convert;
  }
  pthread_mutex_unlock(&r->mu);
  return rc;
}

int reg_commit_end(registry *r, reg_entry *e, tport_tensor *final, tport_err *err)
{
  pthread_mutex_lock(&r->mu);
  if (e->removed) {
    pthread_mutex_unlock(&r->mu);
    tensor_release(final);
    return tport_err_set(err, TPORT_ABORTED, "the upload was aborted during its commit");
  }
  reg_upload *up = e->up;
  reg_tenant *tn = e->tn;
  /* the tenant now pays for the stored tensor's storage, not the landing's
   * nor the reservation (charged before uncharged: they may be one storage) */
  if (!charge(tn, final->storage)) {
    up->state = UP_RECEIVING;
    pthread_mutex_unlock(&r->mu);
    tensor_release(final);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for an entry");
  }
  uncharge(tn, e->charged);
  e->charged = final->storage;
  tn->bytes -= e->reserved;
  e->reserved = 0;
  e->up = NULL;
  e->tensor = final;
  e->state = REG_READY;
  r->uploads--;
  tn->uploads--;
  if (up->keep) {
    owner_unlink(e);
    set_expiry(r, e, up->ttl_ms);
  }
  pthread_mutex_unlock(&r->mu);
  reg_upload_free(up);
  return TPORT_OK;
}

void reg_commit_fail(registry *r, reg_entry *e)
{
  pthread_mutex_lock(&r->mu);
  if (e->up)
    e->up->state = UP_RECEIVING;
  pthread_mutex_unlock(&r->mu);
}

/* ---------------------------------------------------------------- the rest */

int reg_expire(registry *r, int64_t now_ms)
{
  int n = 0;
  reg_entry *dead = NULL;
  pthread_mutex_lock(&r->mu);
  for (reg_entry *e = r->entries, *next; e; e = next) {
    next = e->next;
    if (e->expires_ms && e->expires_ms <= now_ms) {
      unlink_entry(r, e, &dead);
      n++;
    }
  }
  /* tenants no one names whose lends have all come back (tenant_unref) */
  reg_tenant *t, *ttmp;
  HASH_ITER(hh, r->tenants, t, ttmp)
  {
    if (t->refs == 0 && atomic_load(&t->acct->lent) == 0)
      tenant_forget(r, t);
  }
  pthread_mutex_unlock(&r->mu);
  free_dead(r, dead);
  return n;
}

int reg_list(registry *r, uint32_t pipe, reg_entry ***out, size_t *n)
{
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  size_t count = s ? (size_t)s->tn->tensors : 0;
  reg_entry **v = calloc(count ? count : 1, sizeof *v);
  if (!v) {
    pthread_mutex_unlock(&r->mu);
    return TPORT_RESOURCE_EXHAUSTED;
  }
  size_t i = 0;
  for (reg_entry *e = r->entries; s && e && i < count; e = e->next)
    if (e->tn == s->tn && e->state == REG_READY) {
      e->refs++;
      v[i++] = e;
    }
  pthread_mutex_unlock(&r->mu);
  *out = v;
  *n = i;
  return TPORT_OK;
}

void reg_counts(registry *r, reg_stats *out)
{
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&r->mu);
  out->tensors = r->count;
  out->uploads = r->uploads;
  for (reg_tenant *t = r->tenants; t; t = t->hh.next)
    out->bytes += tenant_held(t);
  out->sessions = r->nsessions;
  out->tenants = r->ntenants;
  pthread_mutex_unlock(&r->mu);
}

void reg_tenant_counts(registry *r, uint32_t pipe, reg_stats *out)
{
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  if (s) {
    out->tensors = s->tn->tensors;
    out->bytes = tenant_held(s->tn);
    out->uploads = s->tn->uploads;
  }
  pthread_mutex_unlock(&r->mu);
}

size_t reg_tenants_usage(registry *r, reg_tenant_usage *out, size_t max)
{
  size_t n = 0;
  pthread_mutex_lock(&r->mu);
  for (reg_tenant *t = r->tenants; t; t = t->hh.next, n++)
    if (n < max) {
      memcpy(out[n].name, t->name, sizeof out[n].name); /* NUL-terminated within */
      out[n].bytes = tenant_held(t);
      out[n].tensors = t->tensors;
    }
  pthread_mutex_unlock(&r->mu);
  return n;
}
