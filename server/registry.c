/* registry.c: tensors, sessions and tenants of the server (see registry.h). */
#include "registry.h"

#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct reg_tenant {
  char name[REG_TENANT_MAX];
  size_t bytes;
  struct reg_tenant *next;
} reg_tenant;

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

static void entry_free(reg_entry *e)
{
  tensor_release(e->tensor);
  reg_upload_free(e->up);
  free(e);
}

static reg_tenant *tenant_get(registry *r, const char *name)
{
  for (reg_tenant *t = r->tenants; t; t = t->next)
    if (strcmp(t->name, name) == 0)
      return t;
  reg_tenant *t = calloc(1, sizeof *t);
  if (!t)
    return NULL;
  snprintf(t->name, sizeof t->name, "%s", name);
  t->next = r->tenants;
  r->tenants = t;
  return t;
}

static reg_session *session_get(registry *r, uint32_t pipe, bool create)
{
  for (reg_session *s = r->sessions; s; s = s->next)
    if (s->pipe == pipe)
      return s;
  if (!create)
    return NULL;
  reg_session *s = calloc(1, sizeof *s);
  if (!s)
    return NULL;
  s->pipe = pipe;
  s->alive = true;
  snprintf(s->tenant, sizeof s->tenant, "default");
  s->next = r->sessions;
  r->sessions = s;
  return s;
}

/* Unlinks e and drops the registry's reference.  mu held. */
static void unlink_entry(registry *r, reg_entry *e)
{
  for (reg_entry **p = &r->entries; *p; p = &(*p)->next)
    if (*p == e) {
      *p = e->next;
      break;
    }
  e->removed = true;
  reg_tenant *t = tenant_get(r, e->tenant);
  if (t)
    t->bytes -= e->bytes;
  r->count--;
  if (--e->refs == 0)
    entry_free(e);
}

void reg_destroy(registry *r)
{
  pthread_mutex_lock(&r->mu);
  while (r->entries)
    unlink_entry(r, r->entries);
  while (r->sessions) {
    reg_session *s = r->sessions;
    r->sessions = s->next;
    free(s);
  }
  while (r->tenants) {
    reg_tenant *t = r->tenants;
    r->tenants = t->next;
    free(t);
  }
  pthread_mutex_unlock(&r->mu);
  pthread_mutex_destroy(&r->mu);
}

void reg_session_touch(registry *r, uint32_t pipe)
{
  pthread_mutex_lock(&r->mu);
  session_get(r, pipe, true);
  pthread_mutex_unlock(&r->mu);
}

void reg_session_set_tenant(registry *r, uint32_t pipe, const char *tenant)
{
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_get(r, pipe, true);
  if (s)
    snprintf(s->tenant, sizeof s->tenant, "%s", tenant && *tenant ? tenant : "default");
  pthread_mutex_unlock(&r->mu);
}

void reg_session_drop(registry *r, uint32_t pipe)
{
  pthread_mutex_lock(&r->mu);
  for (reg_entry *e = r->entries, *next; e; e = next) {
    next = e->next;
    if (e->owner_pipe == pipe)
      unlink_entry(r, e);
  }
  /* A tombstone, not a free: a request of this pipe still in a worker must
   * find the session closed and register nothing (reg_add: ABORTED). */
  reg_session *s = session_get(r, pipe, true);
  if (s) {
    s->alive = false;
    s->dropped_ms = reg_now_ms();
  }
  pthread_mutex_unlock(&r->mu);
}

int reg_chunk_enter(registry *r, uint32_t pipe, tport_err *err)
{
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_get(r, pipe, true);
  int rc = TPORT_OK;
  if (!s)
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for a session");
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
  reg_session *s = session_get(r, pipe, false);
  if (s && s->inflight_chunks > 0)
    s->inflight_chunks--;
  pthread_mutex_unlock(&r->mu);
}

static reg_entry *find_name(registry *r, const char *tenant, const char *name)
{
  for (reg_entry *e = r->entries; e; e = e->next)
    if (e->name[0] && strcmp(e->name, name) == 0 && strcmp(e->tenant, tenant) == 0)
      return e;
  return NULL;
}

int reg_add(registry *r, uint32_t pipe, tport_tensor *t, reg_upload *up, const char *name,
            bool keep, uint64_t ttl_ms, size_t new_bytes, reg_entry **out, tport_err *err)
{
  if (name && strlen(name) >= REG_NAME_MAX) {
    tensor_release(t);
    reg_upload_free(up);
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "name is %zu bytes: the limit is %d",
                         strlen(name), REG_NAME_MAX - 1);
  }
  reg_entry *e = calloc(1, sizeof *e);
  if (!e || RAND_bytes(e->handle, REG_HANDLE_BYTES) != 1) {
    free(e);
    tensor_release(t);
    reg_upload_free(up);
    return tport_err_set(err, TPORT_INTERNAL, "cannot create a handle");
  }
  e->tensor = t;
  e->up = up;
  e->state = up ? REG_UPLOADING : REG_READY;
  e->bytes = new_bytes;
  e->refs = 2; /* the registry's and the caller's */
  pthread_mutex_lock(&r->mu);
  int rc = TPORT_OK;
  reg_session *s = session_get(r, pipe, true);
  reg_tenant *tn = s ? tenant_get(r, s->tenant) : NULL;
  if (!s || !tn) {
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for a session");
  } else if (!s->alive) {
    rc = tport_err_set(err, TPORT_ABORTED, "the connection is closing");
  } else if (name && *name && find_name(r, s->tenant, name)) {
    rc = tport_err_set(err, TPORT_ALREADY_EXISTS, "a tensor named '%s' already exists", name);
  } else if (tn->bytes + new_bytes > r->limits.tenant_quota_bytes) {
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                       "tenant '%s' would hold %zu bytes: its quota is %zu", s->tenant,
                       tn->bytes + new_bytes, r->limits.tenant_quota_bytes);
  }
  if (rc) {
    pthread_mutex_unlock(&r->mu);
    entry_free(e); /* releases t or up */
    return rc;
  }
  snprintf(e->tenant, sizeof e->tenant, "%s", s->tenant);
  if (name && *name)
    snprintf(e->name, sizeof e->name, "%s", name);
  if ((name && *name) || keep) {
    uint64_t ttl = ttl_ms ? ttl_ms : r->limits.default_ttl_ms;
    e->expires_ms = ttl ? reg_now_ms() + (int64_t)ttl : 0;
  } else {
    e->owner_pipe = pipe;
  }
  tn->bytes += new_bytes;
  e->next = r->entries;
  r->entries = e;
  r->count++;
  pthread_mutex_unlock(&r->mu);
  *out = e;
  return TPORT_OK;
}

int reg_find(registry *r, uint32_t pipe, const uint8_t *handle, size_t handle_len, const char *name,
             reg_entry **out, tport_err *err)
{
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_get(r, pipe, true);
  const char *tenant = s ? s->tenant : "default";
  reg_entry *hit = NULL;
  if (handle_len == REG_HANDLE_BYTES) {
    for (reg_entry *e = r->entries; e; e = e->next)
      if (memcmp(e->handle, handle, REG_HANDLE_BYTES) == 0 && strcmp(e->tenant, tenant) == 0) {
        hit = e;
        break;
      }
  } else if (handle_len == 0 && name && *name) {
    hit = find_name(r, tenant, name);
  } else if (handle_len != 0) {
    pthread_mutex_unlock(&r->mu);
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "ref.handle is %zu bytes: handles are %d",
                         handle_len, REG_HANDLE_BYTES);
  } else {
    pthread_mutex_unlock(&r->mu);
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "ref has neither a handle nor a name");
  }
  if (hit)
    hit->refs++;
  pthread_mutex_unlock(&r->mu);
  if (!hit)
    return name && *name && handle_len == 0
               ? tport_err_set(err, TPORT_NOT_FOUND, "no tensor named '%.100s'", name)
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
    entry_free(e);
}

void reg_remove(registry *r, reg_entry *e)
{
  pthread_mutex_lock(&r->mu);
  if (!e->removed)
    unlink_entry(r, e);
  pthread_mutex_unlock(&r->mu);
}

void reg_ready(registry *r, reg_entry *e, tport_tensor *t)
{
  pthread_mutex_lock(&r->mu);
  reg_upload *up = e->up;
  e->up = NULL;
  e->tensor = t;
  e->state = REG_READY;
  /* the tenant now holds the stored tensor's bytes, not the landing's */
  size_t bytes = t->storage->nbytes;
  reg_tenant *tn = e->removed ? NULL : tenant_get(r, e->tenant);
  if (tn)
    tn->bytes = tn->bytes - e->bytes + bytes;
  e->bytes = bytes;
  pthread_mutex_unlock(&r->mu);
  reg_upload_free(up);
}

int reg_expire(registry *r, int64_t now_ms)
{
  int n = 0;
  pthread_mutex_lock(&r->mu);
  for (reg_session **p = &r->sessions; *p;) {
    reg_session *s = *p;
    if (!s->alive && now_ms - s->dropped_ms > REG_TOMBSTONE_MS) {
      *p = s->next;
      free(s);
    } else {
      p = &s->next;
    }
  }
  for (reg_entry *e = r->entries, *next; e; e = next) {
    next = e->next;
    if (e->expires_ms && e->expires_ms <= now_ms) {
      unlink_entry(r, e);
      n++;
    }
  }
  pthread_mutex_unlock(&r->mu);
  return n;
}

int reg_list(registry *r, uint32_t pipe, reg_entry ***out, size_t *n)
{
  pthread_mutex_lock(&r->mu);
  reg_session *s = session_get(r, pipe, true);
  const char *tenant = s ? s->tenant : "default";
  size_t count = 0;
  for (reg_entry *e = r->entries; e; e = e->next)
    count += strcmp(e->tenant, tenant) == 0 && e->state == REG_READY;
  reg_entry **v = calloc(count ? count : 1, sizeof *v);
  if (!v) {
    pthread_mutex_unlock(&r->mu);
    return TPORT_RESOURCE_EXHAUSTED;
  }
  size_t i = 0;
  for (reg_entry *e = r->entries; e; e = e->next)
    if (strcmp(e->tenant, tenant) == 0 && e->state == REG_READY) {
      e->refs++;
      v[i++] = e;
    }
  pthread_mutex_unlock(&r->mu);
  *out = v;
  *n = i;
  return TPORT_OK;
}

void reg_counts(registry *r, uint64_t *entries, uint64_t *uploads, uint64_t *bytes)
{
  pthread_mutex_lock(&r->mu);
  uint64_t n = 0, u = 0, b = 0;
  for (reg_entry *e = r->entries; e; e = e->next) {
    n++;
    u += e->state == REG_UPLOADING;
    b += e->bytes;
  }
  pthread_mutex_unlock(&r->mu);
  *entries = n;
  *uploads = u;
  *bytes = b;
}
