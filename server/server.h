/*
 * server.h: tportd's service: nng REP sockets with many contexts, each an
 * async state machine (RECV -> WORK -> SEND -> RECV) whose callbacks never
 * block; a worker pool runs the handlers (engine work); sessions follow nng
 * pipes.  Usable in-process (tests, embedding) through server_start.
 */
#ifndef TPORT_SERVER_H
#define TPORT_SERVER_H

#include "config.h"

typedef struct server server;

/* Configures the devices, opens the sockets and listeners and starts serving. */
int server_start(const server_config *cfg, server **out, tport_err *err);
/* Stops accepting requests, lets in-flight work finish for up to grace_ms,
 * aborts the rest, frees every tensor and returns. */
void server_stop(server *s, unsigned long grace_ms);
/* Loads the auth file again (SIGHUP): connections keep the identity they
 * proved; new ones are checked against the new file.  On an error the old
 * file stays in force. */
int server_reload_auth(server *s, tport_err *err);

#endif
