/* env.c: libtport's TPORT_* variables (env.h). */
#include "env.h"

#include "tport.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int client_env_flag(const char *var, bool dflt, bool *on, tport_err *err)
{
  const char *v = getenv(var);
  *on = dflt;
  if (!v || !*v)
    return TPORT_OK;
  if (strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s='%.64s': give 0 (off) or 1 (on)", var,
                         v);
  *on = v[0] == '1';
  return TPORT_OK;
}

int client_env_count(const char *var, uint64_t *n, tport_err *err)
{
  const char *v = getenv(var);
  *n = 0;
  if (!v || !*v)
    return TPORT_OK;
  char *end;
  errno = 0;
  unsigned long long u = strtoull(v, &end, 10);
  /* strtoull takes "-1" as ULLONG_MAX and leading blanks: digits only */
  if (v[0] < '0' || v[0] > '9' || *end || errno == ERANGE || u == 0)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s='%.64s': give a whole number, 1 or more",
                         var, v);
  *n = u;
  return TPORT_OK;
}

int client_env_size(const char *var, uint64_t *bytes, bool *set, tport_err *err)
{
  const char *v = getenv(var);
  *bytes = 0;
  *set = false;
  if (!v || !*v)
    return TPORT_OK;
  tport_err why;
  int rc = tport_parse_size(v, var, bytes, &why);
  if (rc) /* named as the other variables are: VAR='value' */
    return tport_err_set(err, rc, "%s='%.64s': %s", var, v,
                         strncmp(why.msg, var, strlen(var)) == 0 ? why.msg + strlen(var) + 2
                                                                 : why.msg);
  *set = true;
  return TPORT_OK;
}

int client_env_check(tport_err *err)
{
  bool on;
  uint64_t n;
  int rc = client_env_flag("TPORT_SHM", true, &on, err);
  if (!rc)
    rc = client_env_flag("TPORT_CUDA_IPC", true, &on, err);
  if (!rc)
    rc = client_env_flag("TPORT_SHM_DIRECT", true, &on, err);
  if (!rc)
    rc = client_env_flag("TPORT_PUT_RUNS", true, &on, err);
  if (!rc)
    rc = client_env_count("TPORT_COPY_THREADS", &n, err);
  if (!rc)
    rc = client_env_size("TPORT_GET_CACHE_BYTES", &n, &on, err);
  return rc;
}
