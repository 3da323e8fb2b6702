/*
 * authn.c: the proof the server asks of its clients: an auth file of
 * tenants (reloaded on SIGHUP), a client certificate (mutual TLS), the local
 * secret of the server's own user, or none.  Hello checks the proof
 * (handlers_server.c) against what is in force here.
 */
#include <openssl/crypto.h>
#include <pthread.h>

#include "local_secret.h"
#include "log.h"
#include "server_internal.h"

auth_file *server_auth(server *s)
{
  pthread_mutex_lock(&s->amu);
  auth_file *a = auth_file_retain(s->auth);
  pthread_mutex_unlock(&s->amu);
  return a;
}

int server_reload_auth(server *s, tport_err *err)
{
  if (!s->cfg.auth_file)
    return tport_err_set(err, TPORT_FAILED_PRECONDITION, "no --auth-file to reload");
  auth_file *fresh;
  int rc = auth_file_load(s->cfg.auth_file, &fresh, err);
  if (rc)
    return rc;
  pthread_mutex_lock(&s->amu);
  auth_file *old = s->auth;
  s->auth = fresh;
  pthread_mutex_unlock(&s->amu);
  auth_file_release(old);
  log_msg(LOG_INFO, "auth file reloaded: %zu tenants", auth_file_count(fresh));
  return TPORT_OK;
}

int server_auth_start(server *s, const server_config *cfg, tport_err *err)
{
  int rc = TPORT_OK;
  if (cfg->auth_file) {
    rc = auth_file_load(cfg->auth_file, &s->auth, err);
    if (!rc && !(s->limiter = auth_limiter_new()))
      rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
    if (!rc)
      log_msg(LOG_INFO, "authentication on: %zu tenants in %s", auth_file_count(s->auth),
              cfg->auth_file);
  }
  if (!rc && !cfg->auth_file && !cfg->tls_ca && cfg->local_secret) {
    /* no auth file: the local secret proves the server's own user, and
     * nobody else is anybody (local_secret.h) */
    uint8_t secret[HELLO_SECRET_MAX_BYTES];
    size_t len = 0;
    tport_err why;
    rc = transport_local_secret_ensure(cfg->local_secret, secret, &len, &why);
    if (rc)
      tport_err_set(err, rc, "--local-secret: %s (or --local-secret off, or --auth-file)",
                    why.msg);
    else
      rc = auth_file_any_tenant(secret, len, &s->auth, err);
    OPENSSL_cleanse(secret, sizeof secret);
    if (!rc) {
      s->authn = s->local = true;
      log_event(LOG_INFO, "authentication on: clients prove the local secret of this user",
                "file", cfg->local_secret, NULL);
    }
  } else if (!rc && !s->authn) {
    log_msg(LOG_WARN, "authentication off (--local-secret off): any process that reaches the "
                      "listeners may claim any tenant but an --admin one");
  }
  return rc;
}
