/*
 * registry.c: the tensors of the server (see registry.h): entries added,
 * found, freed and expired, and what they count.  Sessions, uploads and
 * tenants' quotas are registry_sessions.c, registry_uploads.c and
 * registry_quota.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "random_ids.h"
#include "registry_internal.h"

int64_t reg_now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Adds the entries that keep the registry's hashes from emptying
 * (registry.handle_keep).  Out of memory, the tables come and go as before:
 * slower, no different. */
static void keep_tables(registry *r)
{
  r->handle_keep = calloc(1, sizeof *r->handle_keep);
  r->charge_keep = calloc(1, sizeof *r->charge_keep);
  reg_oom = false;
  if (r->handle_keep)
    HASH_ADD(hh, r->by_handle, handle, REG_HANDLE_BYTES, r->handle_keep);
  if (reg_oom) {
    free(r->handle_keep);
    r->handle_keep = NULL;
  }
  reg_oom = false;
  if (r->charge_keep)
    HASH_ADD(hh, r->charges, key, sizeof r->charge_keep->key, r->charge_keep);
  if (reg_oom) {
    free(r->charge_keep);
    r->charge_keep = NULL;
  }
}

static void drop_tables(registry *r)
{
  if (r->handle_keep)
    HASH_DELETE(hh, r->by_handle, r->handle_keep);
  if (r->charge_keep)
    HASH_DELETE(hh, r->charges, r->charge_keep);
  free(r->handle_keep);
  free(r->charge_keep);
  r->handle_keep = NULL;
  r->charge_keep = NULL;
}

void reg_init(registry *r, const reg_limits *limits)
{
  memset(r, 0, sizeof *r);
  /* held for short steps by every worker: spinning a little before sleeping
   * saves the futex sleep and wake-up, which a VM makes dear */
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
#ifdef __GLIBC__
  pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ADAPTIVE_NP);
#endif
  pthread_mutex_init(&r->mu, &a);
  pthread_mutexattr_destroy(&a);
  r->limits = *limits;
  keep_tables(r);
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
void entry_free(registry *r, reg_entry *e)
{
  if (reg_test_entry_free)
    reg_test_entry_free(r);
  tensor_release(e->tensor);
  reg_upload_free(e->up);
  free(e);
}

/* Frees entries that entry_unlink set aside (linked by next), after the
 * lock is let go. */
void entry_free_dead(registry *r, reg_entry *dead)
{
  while (dead) {
    reg_entry *e = dead;
    dead = e->next;
    entry_free(r, e);
  }
}

void entry_owner_unlink(reg_entry *e)
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
 * when that was the last, e goes on *dead (through next) for entry_free_dead to
 * free once the lock is let go.  mu held. */
void entry_unlink(registry *r, reg_entry *e, reg_entry **dead)
{
  expiry_remove(r, e);
  HASH_DELETE(hh, r->by_handle, e);
  if (e->holds_name)
    HASH_DELETE(hh_name, e->tn->names, e);
  e->holds_name = false;
  if (e->prev)
    e->prev->next = e->next;
  else
    r->entries = e->next;
  if (e->next)
    e->next->prev = e->prev;
  if (e->tprev)
    e->tprev->tnext = e->tnext;
  else
    e->tn->entries = e->tnext;
  if (e->tnext)
    e->tnext->tprev = e->tprev;
  e->tprev = e->tnext = NULL;
  entry_owner_unlink(e);
  e->removed = true;
  if (e->charged)
    tenant_uncharge(r, e->tn, e->charged);
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
    entry_unlink(r, r->entries, &dead);
  expiry_free(r);
  reg_session *s, *stmp;
  HASH_ITER(hh, r->sessions, s, stmp)
  {
    HASH_DEL(r->sessions, s);
    tenant_unref(r, s->tn);
    free(s);
  }
  r->unproved = r->unproved_tail = r->overdue = r->overdue_tail = NULL;
  memset(r->nsessions_via, 0, sizeof r->nsessions_via);
  /* only transfers not yet ended could still name some, and lends not yet
   * given back (their accounts outlive the records) */
  reg_tenant *t, *ttmp;
  HASH_ITER(hh, r->tenants, t, ttmp)
  {
    tenant_forget(r, t);
  }
  pthread_mutex_unlock(&r->mu);
  entry_free_dead(r, dead);
  drop_tables(r);
  pthread_mutex_destroy(&r->mu);
}

/* ---------------------------------------------------------------- add, find */

static reg_entry *find_name(reg_tenant *t, const char *name)
{
  reg_entry *e;
  HASH_FIND(hh_name, t->names, name, strlen(name), e);
  return e;
}

void entry_set_expiry(registry *r, reg_entry *e, uint64_t ttl_ms)
{
  uint64_t ttl = ttl_ms ? ttl_ms : r->limits.default_ttl_ms;
  expiry_remove(r, e); /* (set once today; were it set again, moved) */
  e->expires_ms = ttl ? reg_now_ms() + (int64_t)ttl : 0; /* ttl <= max_ttl: no overflow */
  if (e->expires_ms)
    expiry_add(r, e);
}

/* The name's holder, for an entry about to take it: none (*holder NULL),
 * or one that a replace swaps out (ready).  ALREADY_EXISTS otherwise. */
static int name_holder(reg_tenant *tn, const char *name, bool replace, reg_entry **holder,
                       tport_err *err)
{
  *holder = find_name(tn, name);
  if (!*holder)
    return TPORT_OK;
  if (!replace)
    return tport_err_set(err, TPORT_ALREADY_EXISTS, "a tensor named '%s' already exists", name);
  if ((*holder)->state != REG_READY)
    return tport_err_set(err, TPORT_ALREADY_EXISTS,
                         "a tensor named '%s' is being uploaded by a put without replace", name);
  return TPORT_OK;
}

/* Tests: name adds still to fail as an allocation failure would. */
static atomic_int failing_name_adds;

void reg_test_fail_name_adds(int n)
{
  atomic_store(&failing_name_adds, n);
}

int name_take(registry *r, reg_entry *e, reg_entry *holder, reg_entry **dead, tport_err *err)
{
  /* e joins the table before holder leaves it (uthash keeps a key twice
   * for that moment, and deletes by the entry, not the key): an add that
   * fails for memory rolls itself back, so the old tensor keeps its name
   * -- holder unlinked first, it was lost (found by review) */
  int fail = atomic_load(&failing_name_adds);
  while (fail > 0 && !atomic_compare_exchange_weak(&failing_name_adds, &fail, fail - 1))
    ;
  reg_oom = fail > 0;
  if (!reg_oom)
    HASH_ADD(hh_name, e->tn->names, name, strlen(e->name), e);
  if (reg_oom)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for a name");
  if (holder)
    entry_unlink(r, holder, dead);
  e->holds_name = true;
  return TPORT_OK;
}

/* The checks and charge of reg_add, under the lock; *holder the entry a
 * replace swaps out. */
int add_check(registry *r, reg_session *s, const reg_entry *e, const tport_storage *st,
              bool take_name, bool replace, size_t reserve, reg_entry **holder, tport_err *err)
{
  *holder = NULL;
  reg_tenant *tn = s ? s->tn : NULL;
  /* an upload's landing was made by its PutBegin, and a tensor that alone
   * holds its storage shares it with no entry: no tenant pays for either
   * yet, and a lookup (a cache miss or two in a table of every tensor held)
   * would only say so */
  bool fresh = e->up != NULL || tensor_sole_owner(e->tensor);
  size_t add = !tn ? 0 : fresh ? storage_nbytes(st) : tenant_charge_cost(r, tn, st);
  if (!s)
    return tport_err_set(err, TPORT_ABORTED, "the connection is closing");
  int rc = take_name ? name_holder(tn, e->name, replace, holder, err) : TPORT_OK;
  if (rc)
    return rc;
  if (tn->tensors - (*holder != NULL) >= r->limits.max_tensors)
    return tport_err_set(
        err, TPORT_RESOURCE_EXHAUSTED, "tenant '%s' holds %llu tensors: its limit is %llu",
        tn->name, (unsigned long long)tn->tensors, (unsigned long long)r->limits.max_tensors);
  if (add > tenant_left(r, tn) || reserve > tenant_left(r, tn) - add)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                         "tenant '%s' would hold %zu more bytes than its %zu: its quota is %zu",
                         tn->name, add > SIZE_MAX - reserve ? SIZE_MAX : add + reserve,
                         tenant_held(tn), r->limits.tenant_quota_bytes);
  if (!tenant_charge_new(r, tn, st, fresh))
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for an entry");
  return TPORT_OK;
}

/* e into the registry's lists and its session's (or kept for its tenant). */
void add_link(registry *r, reg_session *s, reg_entry *e, bool keep, uint64_t ttl_ms)
{
  reg_tenant *tn = s->tn;
  tn->refs++;
  tn->tensors++;
  if (!e->up && (e->name[0] || keep)) {
    entry_set_expiry(r, e, ttl_ms);
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
  e->tnext = tn->entries;
  if (tn->entries)
    tn->entries->tprev = e;
  tn->entries = e;
  r->count++;
  r->uploads += e->up != NULL;
  tn->uploads += e->up != NULL;
}

int reg_add_check(const registry *r, const char *name, uint64_t ttl_ms, tport_err *err)
{
  if (name && *name && strlen(name) >= REG_NAME_MAX)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "name is %zu bytes: the limit is %d",
                         strlen(name), REG_NAME_MAX - 1);
  if (ttl_ms > r->limits.max_ttl_ms)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "ttl_ms is %llu: the longest is %llu",
                         (unsigned long long)ttl_ms, (unsigned long long)r->limits.max_ttl_ms);
  return TPORT_OK;
}

static int add_entry(registry *r, uint32_t pipe, tport_tensor *t, reg_upload *up, const char *name,
                     bool keep, uint64_t ttl_ms, size_t reserve, reg_reservation *paid,
                     bool replace, reg_entry **out, tport_err *err)
{
  bool named = name && *name;
  int rc = reg_add_check(r, name, ttl_ms, err);
  reg_entry *e = rc ? NULL : calloc(1, sizeof *e);
  if (!rc && (!e || !random_ids(e->handle, REG_HANDLE_BYTES)))
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
    up->replace = named && replace;
  }
  /* an upload with replace takes its name at its commit */
  bool take_name = named && !(up && replace);
  const tport_storage *st = up ? up->landing->storage : t->storage;
  reg_entry *dead = NULL, *holder;
  pthread_mutex_lock(&r->mu);
  /* what was reserved for it becomes its charge: given back and charged in
   * one step under the lock, so the check below counts it once */
  reservation_drop(r, paid);
  reg_session *s = session_find(r, pipe);
  rc = add_check(r, s, e, st, take_name, replace, reserve, &holder, err);
  if (!rc) {
    e->tn = s->tn;
    reg_oom = false;
    HASH_ADD(hh, r->by_handle, handle, REG_HANDLE_BYTES, e);
    if (reg_oom)
      rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for an entry");
    else if (take_name && (rc = name_take(r, e, holder, &dead, err)) != TPORT_OK)
      HASH_DELETE(hh, r->by_handle, e);
    if (rc)
      tenant_uncharge(r, s->tn, st);
  }
  if (rc) {
    pthread_mutex_unlock(&r->mu);
    entry_free_dead(r, dead);
    entry_free(r, e); /* releases t or up */
    return rc;
  }
  e->charged = st;
  e->reserved = reserve;
  s->tn->bytes += reserve;
  add_link(r, s, e, keep, ttl_ms);
  reg_tenant *wake_tn = take_name && !up ? e->tn : NULL;
  if (wake_tn)
    wake_tn->refs++; /* dropped by waiters_wake_name */
  pthread_mutex_unlock(&r->mu);
  entry_free_dead(r, dead);
  if (wake_tn)
    waiters_wake_name(r, wake_tn, e->name);
  *out = e;
  return TPORT_OK;
}

int reg_add(registry *r, uint32_t pipe, tport_tensor *t, reg_upload *up, const char *name,
            bool keep, uint64_t ttl_ms, size_t reserve, reg_reservation *paid, reg_entry **out,
            tport_err *err)
{
  return add_entry(r, pipe, t, up, name, keep, ttl_ms, reserve, paid, false, out, err);
}

int reg_add_replacing(registry *r, uint32_t pipe, tport_tensor *t, reg_upload *up, const char *name,
                      bool keep, uint64_t ttl_ms, size_t reserve, reg_reservation *paid,
                      reg_entry **out, tport_err *err)
{
  return add_entry(r, pipe, t, up, name, keep, ttl_ms, reserve, paid, true, out, err);
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
    if (hit && (hit == r->handle_keep || hit->tn != s->tn))
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
    entry_unlink(r, e, &dead);
  pthread_mutex_unlock(&r->mu);
  entry_free_dead(r, dead);
}

bool reg_connection_scoped(registry *r, const reg_entry *e)
{
  pthread_mutex_lock(&r->mu);
  bool scoped = e->owner != NULL;
  pthread_mutex_unlock(&r->mu);
  return scoped;
}

/* ---------------------------------------------------------------- the rest */

int reg_expire(registry *r, int64_t now_ms)
{
  int n = 0;
  reg_entry *dead = NULL;
  pthread_mutex_lock(&r->mu);
  /* what is due, off the heap's top; every entry only while some that
   * expire could not join the heap */
  for (reg_entry *e = r->expiry_unindexed ? r->entries : NULL, *next; e; e = next) {
    next = e->next;
    r->expire_walked++;
    if (e->expires_ms && e->expires_ms <= now_ms) {
      entry_unlink(r, e, &dead);
      n++;
    } else if (e->expires_ms && !e->expiry_at) {
      r->expiry_unindexed--; /* into the heap again, memory allowing (else counted again) */
      expiry_add(r, e);
    }
  }
  for (reg_entry *e; (e = expiry_due(r, now_ms)); n++) {
    r->expire_walked++;
    entry_unlink(r, e, &dead);
  }
  /* tenants no one names whose lends have all come back (tenant_unref) */
  tenants_forget_lingering(r);
  pthread_mutex_unlock(&r->mu);
  entry_free_dead(r, dead);
  return n;
}

int reg_list(registry *r, uint32_t pipe, const char *prefix, bool named, reg_entry ***out,
             size_t *n)
{
  size_t plen = prefix ? strlen(prefix) : 0;
  named = named || plen;
  if (plen >= REG_NAME_MAX) { /* longer than any name: none, without a walk */
    *out = calloc(1, sizeof **out);
    *n = 0;
    return *out ? TPORT_OK : TPORT_RESOURCE_EXHAUSTED;
  }
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  size_t count = s ? (size_t)s->tn->tensors : 0;
  reg_entry **v = calloc(count ? count : 1, sizeof *v);
  if (!v) {
    pthread_mutex_unlock(&r->mu);
    return TPORT_RESOURCE_EXHAUSTED;
  }
  size_t i = 0;
  /* the tenant's own: a List costs what the tenant holds, not what every
   * tenant does (under the lock every request takes); a named one, what
   * it holds by name */
  if (s && named) {
    for (reg_entry *e = s->tn->names; e && i < count; e = e->hh_name.next) {
      r->list_walked++;
      if (e->state == REG_READY && strncmp(e->name, prefix ? prefix : "", plen) == 0) {
        e->refs++;
        v[i++] = e;
      }
    }
  }
  for (reg_entry *e = s && !named ? s->tn->entries : NULL; e && i < count; e = e->tnext) {
    r->list_walked++;
    if (e->state == REG_READY) {
      e->refs++;
      v[i++] = e;
    }
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
  for (reg_tenant *t = r->tenants; t; t = t->hh.next) {
    out->bytes += tenant_held(t);
    out->waiters += t->nwaiters;
  }
  out->sessions = r->nsessions;
  out->tenants = r->ntenants;
  memcpy(out->sessions_via, r->nsessions_via, sizeof out->sessions_via);
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
    out->waiters = s->tn->nwaiters;
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
