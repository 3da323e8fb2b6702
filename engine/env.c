/* env.c: the engine's own TPORT_* variables (env.h). */
#include "env.h"

#include <stdint.h>
#include <stdlib.h>

#include "units.h"

static const char *const size_vars[] = {"TPORT_STAGING_BYTES", "TPORT_READBACK_BYTES",
                                        "TPORT_PINNED_CACHE_BYTES"};

static int parse(const char *var, size_t *bytes, tport_err *err)
{
  const char *v = getenv(var);
  if (!v || !*v)
    return TPORT_NOT_FOUND;
  uint64_t u;
  int rc = units_parse_size(v, var, &u, err);
  if (!rc && u > SIZE_MAX)
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s: '%s' is out of range", var, v);
  if (!rc)
    *bytes = (size_t)u;
  return rc;
}

bool engine_env_size(const char *var, size_t *bytes)
{
  return parse(var, bytes, NULL) == TPORT_OK;
}

int engine_env_check(tport_err *err)
{
  for (size_t i = 0; i < sizeof size_vars / sizeof *size_vars; i++) {
    size_t bytes;
    int rc = parse(size_vars[i], &bytes, err);
    if (rc && rc != TPORT_NOT_FOUND)
      return rc;
  }
  return TPORT_OK;
}
