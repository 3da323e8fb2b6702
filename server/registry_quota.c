/*
 * registry_quota.c: tenants and what they pay (registry.h): each tenant's
 * record, its charges (once per storage), its account of lent bytes, and
 * the reservations requests take against its quota before they allocate.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "registry_internal.h"

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
size_t tenant_held(const reg_tenant *t)
{
  size_t lent = atomic_load(&t->acct->lent);
  return t->bytes > SIZE_MAX - lent ? SIZE_MAX : t->bytes + lent;
}

/* What is left of its quota.  mu held (lends only fall without it). */
size_t tenant_left(const registry *r, const reg_tenant *t)
{
  size_t q = r->limits.tenant_quota_bytes, held = tenant_held(t);
  return held < q ? q - held : 0;
}

/* ---------------------------------------------------------------- later charges */

int reg_later_begin(registry *r, uint32_t pipe, reg_later *l, tport_err *err)
{
  *l = (reg_later){0};
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_find(r, pipe);
  if (s && s->tn) {
    l->acct = s->tn->acct;
    atomic_fetch_add(&l->acct->refs, 1);
    atomic_fetch_add(&l->acct->later, 1); /* its tenant kept till the end */
  }
  pthread_mutex_unlock(&r->mu);
  return l->acct ? TPORT_OK : tport_err_set(err, TPORT_ABORTED, "the connection is closing");
}

void reg_later_charge(reg_later *l, size_t n)
{
  if (!l->acct)
    return;
  atomic_fetch_add(&l->acct->lent, n);
  l->charged += n;
}

void reg_later_end(reg_later *l)
{
  if (!l->acct)
    return;
  atomic_fetch_sub(&l->acct->later, 1);
  account_give_back(l->acct, l->charged);
  *l = (reg_later){0};
}

/* ---------------------------------------------------------------- tenants */

/* A reference to the tenant record of that name, created on first use.  mu held. */
reg_tenant *tenant_ref(registry *r, const char *name)
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

static void linger_unlink(registry *r, reg_tenant *t)
{
  if (t->lprev)
    t->lprev->lnext = t->lnext;
  else
    r->lingering = t->lnext;
  if (t->lnext)
    t->lnext->lprev = t->lprev;
  t->lprev = t->lnext = NULL;
  t->lingering = false;
}

void tenant_forget(registry *r, reg_tenant *t)
{
  if (t->lingering)
    linger_unlink(r, t);
  /* its charges went with its entries; were one left, a tenant made later
   * at the same address would inherit it (the table is keyed by address) */
  reg_charge *c, *tmp;
  if (t->charges)
    HASH_ITER(hh, r->charges, c, tmp)
    {
      if (c->key.tenant == t) {
        HASH_DELETE(hh, r->charges, c);
        free(c);
      }
    }
  HASH_DEL(r->tenants, t);
  r->ntenants--;
  account_unref(t->acct);
  free(t);
}

/* A tenant no one names any more is forgotten -- once nothing lent is
 * charged to it either: until then it stays (a new connection of that name
 * finds its lends still charged), and reg_expire forgets it after.  mu held. */
void tenant_unref(registry *r, reg_tenant *t)
{
  if (!t || --t->refs > 0)
    return;
  if (!account_busy(t->acct)) {
    tenant_forget(r, t);
  } else if (!t->lingering) { /* the reaper looks at these alone */
    t->lingering = true;
    t->lnext = r->lingering;
    if (r->lingering)
      r->lingering->lprev = t;
    r->lingering = t;
  }
}

void tenants_forget_lingering(registry *r)
{
  for (reg_tenant *t = r->lingering, *next; t; t = next) {
    next = t->lnext;
    r->tenants_walked++;
    if (t->refs > 0)
      linger_unlink(r, t); /* named again: its next unref decides */
    else if (!account_busy(t->acct))
      tenant_forget(r, t);
  }
}

static reg_charge *charge_find(registry *r, const reg_tenant *t, const tport_storage *s)
{
  reg_charge_key k = {.tenant = t, .storage = s};
  reg_charge *c;
  HASH_FIND(hh, r->charges, &k, sizeof k, c);
  return c;
}

/* Bytes the tenant would newly pay for storage s.  mu held. */
size_t tenant_charge_cost(registry *r, reg_tenant *t, const tport_storage *s)
{
  if (!s)
    return 0;
  return charge_find(r, t, s) ? 0 : storage_nbytes(s);
}

bool tenant_charge(registry *r, reg_tenant *t, const tport_storage *s)
{
  return tenant_charge_new(r, t, s, false);
}

bool tenant_charge_new(registry *r, reg_tenant *t, const tport_storage *s, bool fresh)
{
  reg_charge *c = fresh ? NULL : charge_find(r, t, s);
  if (!c) {
    c = calloc(1, sizeof *c);
    if (!c)
      return false;
    c->key.tenant = t;
    c->key.storage = s;
    c->nbytes = storage_nbytes(s);
    reg_oom = false;
    HASH_ADD(hh, r->charges, key, sizeof c->key, c);
    if (reg_oom) {
      free(c);
      return false;
    }
    t->bytes += c->nbytes;
    t->charges++;
  }
  c->count++;
  return true;
}

void tenant_uncharge(registry *r, reg_tenant *t, const tport_storage *s)
{
  reg_charge *c = charge_find(r, t, s);
  if (c && --c->count == 0) {
    t->bytes -= c->nbytes;
    t->charges--;
    HASH_DELETE(hh, r->charges, c);
    free(c);
  }
}

/* ---------------------------------------------------------------- reservations */

/* Gives res's bytes back to its tenant.  mu held. */
void reservation_drop(registry *r, reg_reservation *res)
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
