/* auth.c: the auth file and the limiter of failed attempts (see auth.h). */
#include <ctype.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static _Thread_local bool auth_oom;
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(e) (auth_oom = true)
#include <uthash.h>

#include "auth.h"
#include "os_error.h"
#include "registry.h"

typedef struct auth_tenant {
  char name[REG_TENANT_MAX];
  uint8_t secret[HELLO_SECRET_MAX_BYTES];
  size_t len;
  UT_hash_handle hh;
} auth_tenant;

struct auth_file {
  atomic_int refs;
  auth_tenant *tenants;
  size_t count;
  auth_tenant *any; /* the local secret: every tenant's (tenants is then empty) */
};

static void file_free(auth_file *a)
{
  auth_tenant *t, *tmp;
  HASH_ITER(hh, a->tenants, t, tmp)
  {
    HASH_DEL(a->tenants, t);
    OPENSSL_cleanse(t, sizeof *t);
    free(t);
  }
  if (a->any) {
    OPENSSL_cleanse(a->any, sizeof *a->any);
    free(a->any);
  }
  free(a);
}

int auth_file_any_tenant(const uint8_t *secret, size_t len, auth_file **out, tport_err *err)
{
  if (len < HELLO_SECRET_MIN_BYTES || len > HELLO_SECRET_MAX_BYTES)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "the secret is %zu bytes", len);
  auth_file *a = calloc(1, sizeof *a);
  if (a)
    a->any = calloc(1, sizeof *a->any);
  if (!a || !a->any) {
    free(a);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  }
  atomic_init(&a->refs, 1);
  memcpy(a->any->secret, secret, len);
  a->any->len = len;
  *out = a;
  return TPORT_OK;
}

int auth_file_load(const char *path, auth_file **out, tport_err *err)
{
  FILE *f = fopen(path, "re");
  if (!f)
    return os_error(err, errno, "--auth-file %s", path);
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || (st.st_mode & 077)) {
    fclose(f);
    return tport_err_set(err, TPORT_PERMISSION_DENIED,
                         "--auth-file %s can be read by group or others (mode %03o): chmod 600 it",
                         path, (unsigned)(st.st_mode & 0777));
  }
  auth_file *a = calloc(1, sizeof *a);
  if (!a) {
    fclose(f);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  }
  atomic_init(&a->refs, 1);
  char line[1024];
  int rc = TPORT_OK, lineno = 0;
  while (!rc && fgets(line, sizeof line, f)) {
    lineno++;
    if (!strchr(line, '\n') && !feof(f)) {
      rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "--auth-file %s:%d: the line is too long",
                         path, lineno);
      break;
    }
    char *hash = strchr(line, '#');
    if (hash)
      *hash = 0;
    char *save = NULL, *name = strtok_r(line, " \t\r\n", &save);
    if (!name)
      continue; /* blank or comment */
    char *secret = strtok_r(NULL, " \t\r\n", &save), *extra = strtok_r(NULL, " \t\r\n", &save);
    auth_tenant *t = calloc(1, sizeof *t), *dup = NULL;
    tport_err why;
    if (!t)
      rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
    else if (!secret || extra)
      rc = tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "--auth-file %s:%d: a line is TENANT SECRET (two words)", path, lineno);
    else if (strlen(name) >= REG_TENANT_MAX)
      rc = tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "--auth-file %s:%d: the tenant is longer than %d bytes", path, lineno,
                         REG_TENANT_MAX - 1);
    else if (transport_hello_secret_parse(secret, t->secret, &t->len, &why))
      rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "--auth-file %s:%d: %s", path, lineno,
                         why.msg);
    if (!rc) {
      snprintf(t->name, sizeof t->name, "%s", name);
      HASH_FIND_STR(a->tenants, t->name, dup);
      if (dup)
        rc = tport_err_set(err, TPORT_INVALID_ARGUMENT,
                           "--auth-file %s:%d: tenant '%s' is listed twice", path, lineno, name);
    }
    if (!rc) {
      auth_oom = false;
      HASH_ADD_STR(a->tenants, name, t);
      if (auth_oom)
        rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
      else
        a->count++;
    }
    if (rc)
      free(t);
    OPENSSL_cleanse(line, sizeof line);
  }
  fclose(f);
  if (rc) {
    file_free(a);
    return rc;
  }
  *out = a;
  return TPORT_OK;
}

auth_file *auth_file_retain(auth_file *a)
{
  if (a)
    atomic_fetch_add(&a->refs, 1);
  return a;
}

void auth_file_release(auth_file *a)
{
  if (a && atomic_fetch_sub(&a->refs, 1) == 1)
    file_free(a);
}

bool auth_file_secret(const auth_file *a, const char *tenant, uint8_t *secret, size_t *len)
{
  auth_tenant *t = a->any;
  if (!t)
    HASH_FIND_STR(a->tenants, tenant, t);
  if (!t)
    return false;
  memcpy(secret, t->secret, t->len);
  *len = t->len;
  return true;
}

size_t auth_file_count(const auth_file *a)
{
  return a->count;
}

/* ---------------------------------------------------------------- limiter */

typedef struct auth_peer {
  char addr[64];
  int failures;
  int64_t since_ms;
  UT_hash_handle hh;
} auth_peer;

struct auth_limiter {
  pthread_mutex_t mu;
  auth_peer *peers;
  size_t count;
};

auth_limiter *auth_limiter_new(void)
{
  auth_limiter *l = calloc(1, sizeof *l);
  if (l)
    pthread_mutex_init(&l->mu, NULL);
  return l;
}

void auth_limiter_free(auth_limiter *l)
{
  if (!l)
    return;
  auth_peer *p, *tmp;
  HASH_ITER(hh, l->peers, p, tmp)
  {
    HASH_DEL(l->peers, p);
    free(p);
  }
  pthread_mutex_destroy(&l->mu);
  free(l);
}

/* Forgets windows that have passed (bounded work: the table is bounded). mu held. */
static void forget_old(auth_limiter *l, int64_t now_ms)
{
  auth_peer *p, *tmp;
  HASH_ITER(hh, l->peers, p, tmp)
  {
    if (now_ms - p->since_ms > AUTH_WINDOW_MS) {
      HASH_DEL(l->peers, p);
      free(p);
      l->count--;
    }
  }
}

bool auth_limiter_allows(auth_limiter *l, const char *peer, int64_t now_ms)
{
  pthread_mutex_lock(&l->mu);
  auth_peer *p;
  HASH_FIND_STR(l->peers, peer, p);
  bool ok = !p || now_ms - p->since_ms > AUTH_WINDOW_MS || p->failures < AUTH_FAILURES_MAX;
  pthread_mutex_unlock(&l->mu);
  return ok;
}

void auth_limiter_fail(auth_limiter *l, const char *peer, int64_t now_ms)
{
  pthread_mutex_lock(&l->mu);
  auth_peer *p;
  HASH_FIND_STR(l->peers, peer, p);
  if (p && now_ms - p->since_ms > AUTH_WINDOW_MS) {
    p->failures = 0;
    p->since_ms = now_ms;
  }
  if (!p) {
    if (l->count >= 65536)
      forget_old(l, now_ms); /* an attacker with many addresses costs bounded memory */
    if (l->count < 65536 && (p = calloc(1, sizeof *p)) != NULL) {
      snprintf(p->addr, sizeof p->addr, "%s", peer);
      p->since_ms = now_ms;
      auth_oom = false;
      HASH_ADD_STR(l->peers, addr, p);
      if (auth_oom) {
        free(p);
        p = NULL;
      } else {
        l->count++;
      }
    }
  }
  if (p)
    p->failures++;
  pthread_mutex_unlock(&l->mu);
}
