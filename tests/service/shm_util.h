/*
 * shm_util.h: same-host regions by hand, for the tests that count what the
 * server's region table does (test_shm_walks, test_shm_hash_oom).
 */
#ifndef TPORT_TEST_SHM_UTIL_H
#define TPORT_TEST_SHM_UTIL_H

#include <stdint.h>

#include "tport.h"

/* A region of nbytes registered on c's connection and left pending (its
 * descriptor never handed over): a raw ShmRegister. */
int shm_register_pending(tport_client *c, uint64_t nbytes, tport_err *err);

#endif
