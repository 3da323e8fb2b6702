/*
 * regions_process.c: process regions (regions.h): a same-host client's own
 * memory, which tportd reads with process_vm_readv -- a put's chunks or a
 * batch's elements taken from the caller's buffers themselves, one copy in
 * all.  Their registration here; the reads in regions_process_read.c.
 *
 * Which process: the connection's peer as the kernel reported it at
 * connect (SO_PEERCRED through nng), opened as a pidfd at registration.
 * That pid may name another process by then (the client gone and reaped,
 * its connection passed on), so the registration is confirmed only once
 * the pidfd's process holds the random token tportd sent back, written
 * there by the client: a process the client controls, not one it merely
 * knows the memory of.  Every read checks, before and after, that the
 * pidfd's process still runs: while it does, its pid is its own, and a
 * read that ends with it gone is thrown away.  The reads are made by
 * threads without CAP_SYS_PTRACE, so the kernel's own rule is the whole
 * reach (the same uids and gids, a dumpable process, Yama): a process that
 * became a setuid program's is out of it.  tportd asks in addition that
 * the peer runs as tportd's user.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "log.h"
#include "regions_internal.h"
#include "registry.h"

static int pidfd_of(pid_t pid)
{
  return (int)syscall(SYS_pidfd_open, pid, 0);
}

int shm_register_process(shm_table *t, uint32_t pipe, const char *tenant, pid_t peer_pid,
                         uid_t peer_uid, uint64_t *id, uint8_t token[TRANSPORT_SHM_TOKEN_BYTES],
                         tport_err *err)
{
  if (peer_pid <= 0)
    return tport_err_set(err, TPORT_FAILED_PRECONDITION,
                         "this connection's process is not known (only an ipc:// or inproc:// "
                         "peer may lend its memory)");
  if (peer_uid != t->euid)
    return tport_err_set(err, TPORT_PERMISSION_DENIED,
                         "the client runs as uid %u and tportd as uid %u: only a process of "
                         "tportd's own user may lend its memory",
                         (unsigned)peer_uid, (unsigned)t->euid);
  shm_region *r = NULL;
  int rc = register_region(t, pipe, tenant, peer_pid, 0, KIND_PROCESS, NULL, id, token, &r, err);
  if (rc)
    return rc;
  /* outside mu: the process held from now on; the token proves it the
   * client's once the client has written it into its memory
   * (shm_confirm_process) */
  int fd = pidfd_of(peer_pid);
  if (fd < 0)
    /* ENOSYS before Linux 5.3, EPERM under a seccomp filter that forbids
     * it (a container's): not here, for good */
    rc = tport_err_set(err, errno == ESRCH ? TPORT_ABORTED : TPORT_FAILED_PRECONDITION,
                       "tportd cannot hold the client process: pidfd_open(%d): %s", (int)peer_pid,
                       strerror(errno));
  pthread_mutex_lock(&t->mu);
  r->pidfd = fd;
  r->handing_off = false; /* PENDING, the connection's to confirm or drop */
  bool gone = r->released;
  if (rc && !gone) {
    region_remove(t, r);
    gone = true;
  }
  pthread_mutex_unlock(&t->mu);
  if (gone) {
    region_free(r); /* and its pidfd */
    if (!rc)
      rc = tport_err_set(err, TPORT_ABORTED, "the region was released during its registration");
  }
  return rc;
}

int shm_confirm_process(shm_table *t, uint32_t pipe, uint64_t id, uint64_t probe_addr,
                        tport_err *err)
{
  uint8_t want[TRANSPORT_SHM_TOKEN_BYTES], seen[TRANSPORT_SHM_TOKEN_BYTES];
  pthread_mutex_lock(&t->mu);
  shm_region *r = find_mine(t, pipe, id);
  int rc = TPORT_OK;
  if (!r || r->kind != KIND_PROCESS)
    rc = tport_err_set(err, TPORT_NOT_FOUND, "this connection has no process region %llu",
                       (unsigned long long)id);
  else if (r->state == REGION_READY)
    rc = tport_err_set(err, TPORT_ALREADY_EXISTS, "process region %llu is confirmed already",
                       (unsigned long long)id);
  else if (r->handing_off)
    rc = tport_err_set(err, TPORT_ABORTED, "process region %llu is being confirmed",
                       (unsigned long long)id);
  if (!rc && now_ms() > r->token_expires_ms) {
    rc = tport_err_set(err, TPORT_DEADLINE_EXCEEDED,
                       "process region %llu was not confirmed in time: register again",
                       (unsigned long long)id);
    if (region_remove(t, r)) {
      pthread_mutex_unlock(&t->mu);
      region_free(r);
      return rc;
    }
  }
  pid_t pid = 0;
  int fd = -1;
  if (!rc) {
    r->handing_off = true; /* this thread's until region_opened */
    memcpy(want, r->token, sizeof want);
    pid = r->peer_pid;
    fd = r->pidfd;
  }
  pthread_mutex_unlock(&t->mu);
  if (rc)
    return rc;
  /* one answer for every way it fails: what another process holds at an
   * address is not the client's to learn */
  tport_err why;
  shm_read_seg probe = {.addr = probe_addr, .dst = seen, .n = sizeof seen};
  if (probe_addr > UINT64_MAX - sizeof seen ||
      process_read_as_user(pid, &probe, 1, 0, sizeof seen, NULL, &why) != TPORT_OK ||
      CRYPTO_memcmp(seen, want, sizeof want) != 0 || !process_alive(fd))
    rc = tport_err_set(err, TPORT_PERMISSION_DENIED,
                       "the connection's process did not hold the region's token at 0x%llx "
                       "(register again)",
                       (unsigned long long)probe_addr);
  OPENSSL_cleanse(want, sizeof want);
  return region_opened(t, r, rc, err);
}

size_t shm_process_read_max(size_t chunk_bytes)
{
  if (chunk_bytes == 0 || chunk_bytes >= SHM_PROCESS_READ_SPAN)
    return chunk_bytes;
  return SHM_PROCESS_READ_SPAN / chunk_bytes * chunk_bytes;
}

bool shm_is_process(shm_table *t, uint32_t pipe, uint64_t id)
{
  if (!t)
    return false;
  pthread_mutex_lock(&t->mu);
  shm_region *r = find_mine(t, pipe, id);
  bool yes = r && r->kind == KIND_PROCESS;
  pthread_mutex_unlock(&t->mu);
  return yes;
}
