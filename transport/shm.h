/*
 * shm.h: same-host shared memory by descriptor passing, both ends.
 *
 * A region is a memfd the client creates, sizes, seals against shrinking
 * (F_SEAL_SHRINK, then F_SEAL_SEAL so no seal can be added or removed) and
 * maps.  It travels to the server as a descriptor (SCM_RIGHTS) over a Unix
 * stream socket, never by name: no other process can open it, and the
 * server maps exactly what the client sealed.  Each handoff is one message:
 *
 *   client -> server  "TPSH" | u32 version (1) | 16-byte token, plus the fd
 *   server -> client  u32 code (tport_status) | u32 length | message
 *
 * The token was handed to the client on its nng connection (ShmRegister):
 * it names the region the descriptor is for, and so ties the descriptor to
 * that connection and its authenticated tenant.  Each end checks the
 * other's credentials (SO_PEERCRED); the server checks the seals
 * (F_GET_SEALS) and the size before it maps anything: a region that could
 * shrink under a mapping would make the server fault (SIGBUS) on a client's
 * whim.  All integers little-endian.
 *
 * Linux only (memfd_create, F_ADD_SEALS, SO_PEERCRED, SCM_RIGHTS).
 */
#ifndef TPORT_TRANSPORT_SHM_H
#define TPORT_TRANSPORT_SHM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "tport_types.h"

#define TRANSPORT_SHM_TOKEN_BYTES 16
#define TRANSPORT_SHM_VERSION 1

/* ---- client side */

/* A fresh region: a memfd of nbytes (> 0), sealed against shrinking and
 * sealing, mapped read-write.  *fd is close-on-exec. */
int transport_shm_create(size_t nbytes, int *fd, void **base, tport_err *err);
/* Hands fd to the server listening on path, with the token of its region,
 * and returns the server's verdict (TPORT_OK: the server mapped it).  The
 * server must run as this process's user or as root (SO_PEERCRED): a
 * region is never handed to a process that merely took the socket's path.
 * Waits up to timeout_ms for each step. */
int transport_shm_send(const char *path, const uint8_t token[TRANSPORT_SHM_TOKEN_BYTES], int fd,
                       int timeout_ms, tport_err *err);
/* The same, to a server that may also run as server_uid: the user the
 * client's data connection already reaches (an ipc:// peer's uid, read by
 * the client from its connection), so that a server of another user that
 * shares its sockets through a group (--shm-mode 660) gets the regions of
 * the clients it serves, while a process of a third user that merely took
 * the socket's path still gets nothing.  (uid_t)-1: none. */
int transport_shm_send_to(const char *path, const uint8_t token[TRANSPORT_SHM_TOKEN_BYTES], int fd,
                          int timeout_ms, uid_t server_uid, tport_err *err);

/* ---- server side */

#define TRANSPORT_SHM_PEER_GROUPS 64

/* Who is on the other end of a Unix socket: SO_PEERCRED, and the
 * supplementary groups (SO_PEERGROUPS; ngroups -1 when the peer has more
 * than TRANSPORT_SHM_PEER_GROUPS or the kernel does not say: then only its
 * primary group counts). */
typedef struct transport_shm_peer {
  pid_t pid;
  uid_t uid;
  gid_t gid;
  int ngroups;
  gid_t groups[TRANSPORT_SHM_PEER_GROUPS];
} transport_shm_peer;

/* Listens on a Unix stream socket at path with permissions mode (the
 * directory is created 0700 when missing; a stale socket file is replaced,
 * anything else at path is an error).  *fd is close-on-exec. */
int transport_shm_listen(const char *path, unsigned mode, int *fd, tport_err *err);
/* May this peer hand the server regions?  Its own user and root always;
 * a member of the socket's group (primary or supplementary, as the kernel
 * lets it connect) when mode grants the group access; anyone when it
 * grants others access. */
bool transport_shm_peer_allowed(const transport_shm_peer *peer, unsigned mode);
/* Reads one handoff from an accepted connection: the token and the one
 * descriptor (close-on-exec; any other descriptor that came is closed), and
 * the peer's credentials.  INVALID_ARGUMENT for a malformed message,
 * DEADLINE_EXCEEDED after timeout_ms. */
int transport_shm_recv(int conn, int timeout_ms, uint8_t token[TRANSPORT_SHM_TOKEN_BYTES], int *fd,
                       transport_shm_peer *peer, tport_err *err);
/* Sends the verdict (best effort: the client may be gone). */
void transport_shm_reply(int conn, int code, const char *msg);
/* Is fd a region the server may map for nbytes?  A memfd (sealable:
 * F_GET_SEALS answers) sealed with F_SEAL_SHRINK and F_SEAL_SEAL, not
 * write-sealed (gets write into it), a regular file of at least nbytes. */
int transport_shm_check(int fd, size_t nbytes, tport_err *err);

#endif
