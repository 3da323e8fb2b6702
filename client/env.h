/* env.h: libtport's TPORT_* variables, each read one way (a leaf of its
 * own: client.c and copy_pool.c use it).
 *
 *   TPORT_SHM=0|1          same-host regions on a local URL (default 1)
 *   TPORT_CUDA_IPC=0|1     CUDA IPC on the same host (default 1)
 *   TPORT_SHM_DIRECT=0|1   puts read by the server from the caller's memory (default 1)
 *   TPORT_PUT_RUNS=0|1     a put batch's alike elements as runs (default 1)
 *   TPORT_COPY_THREADS=N   the copy pool's threads, a whole number >= 1
 *                          (more than COPY_POOL_MAX_THREADS is that many)
 *   TPORT_GET_CACHE_BYTES=SIZE  the most bytes of freed get buffers kept
 *                          for reuse (get_blocks.h; "512MiB", 0 for none)
 *
 * tport_connect checks them all first: a value that does not parse fails it
 * with INVALID_ARGUMENT naming the variable, where it used to mean the
 * default without a word ("TPORT_SHM=off" left regions on).
 */
#ifndef TPORT_CLIENT_ENV_H
#define TPORT_CLIENT_ENV_H

#include <stdbool.h>
#include <stdint.h>

#include "tport_types.h"

/* A 0|1 variable: *on is dflt when it is unset or empty. */
int client_env_flag(const char *var, bool dflt, bool *on, tport_err *err);

/* A whole number >= 1: *n is 0 when it is unset or empty. */
int client_env_count(const char *var, uint64_t *n, tport_err *err);

/* A size ("1GiB", bytes; tport_parse_size): *set false when it is unset
 * or empty. */
int client_env_size(const char *var, uint64_t *bytes, bool *set, tport_err *err);

/* Every variable above, checked. */
int client_env_check(tport_err *err);

#endif
