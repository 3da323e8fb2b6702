/*
 * hold_util.h: requests of one method held in their worker until released,
 * through the server's test hook (server_test_before_handle), for the
 * tests that need tportd's workers busy (test_admission, test_shm_process_stuck).
 * The server runs in the test's process.
 */
#ifndef TPORT_HOLD_UTIL_H
#define TPORT_HOLD_UTIL_H

#include <stdint.h>

/* From now on requests of method wait in their worker until release();
 * installs the hook (call it before the server starts where its workers
 * may be running: the hook is read by them without a lock). */
void hold(uint16_t method);
/* Waits (up to 10 s) until n requests are held; fails the test if not. */
void wait_held(int n);
/* Requests held now. */
int held_now(void);
/* Lets the held requests go (and holds none any more). */
void release(void);

#endif
