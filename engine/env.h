/* env.h: the engine's own TPORT_* variables, sizes in proto/units.c's
 * grammar ("256M", "1GiB"), read where they are used:
 *
 *   TPORT_STAGING_BYTES       the pinned staging pool's budget (staging.c)
 *   TPORT_READBACK_BYTES      the readback pool's budget (staging.c)
 *   TPORT_PINNED_CACHE_BYTES  the pinned host cache's limit (host_cache.c)
 *
 * engine_configure checks them all (engine_env_check): tportd refuses to
 * start on a value that does not parse, naming the variable.  The pools
 * read them lazily, where no error can be returned; there a value that
 * does not parse (only a program that skipped engine_configure sees one)
 * is the default.
 */
#ifndef TPORT_ENGINE_ENV_H
#define TPORT_ENGINE_ENV_H

#include <stdbool.h>
#include <stddef.h>

#include "tport_types.h"

/* true and *bytes when var is set to a size; false when it is unset,
 * empty or does not parse. */
bool engine_env_size(const char *var, size_t *bytes);

/* Every variable above: TPORT_OK, or INVALID_ARGUMENT naming the one that
 * does not parse and the forms it takes. */
int engine_env_check(tport_err *err);

#endif
