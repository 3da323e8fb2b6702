/*
 * regions_process.c: process regions (regions.h): a same-host client's own
 * memory, which tportd reads with process_vm_readv -- a put's chunks taken
 * from the caller's buffer itself, one copy in all.
 *
 * Which process: the connection's peer as the kernel reported it at
 * connect (SO_PEERCRED through nng), opened as a pidfd at registration and
 * proved there to be the client by a random probe the client put at an
 * address of its memory.  A pid may name another process once its own has
 * exited and been reaped, so every read checks, before and after, that the
 * pidfd's process still runs: while it does, its pid is its own, and a read
 * that ends with it gone is thrown away.  What the kernel lets tportd read
 * is its own rule (ptrace access: the same user, dumpable, Yama); tportd
 * asks in addition that the peer runs as tportd's user, so that a root
 * tportd lends no reach to a client of another user.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "regions_internal.h"

#define PROBE_BYTES 16

static int pidfd_of(pid_t pid)
{
  return (int)syscall(SYS_pidfd_open, pid, 0);
}

/* Whether the process behind pidfd still runs (a pidfd polls readable once
 * its process has exited). */
static bool process_alive(int pidfd)
{
  struct pollfd p = {.fd = pidfd, .events = POLLIN};
  int n;
  do
    n = poll(&p, 1, 0);
  while (n < 0 && errno == EINTR);
  return n == 0;
}

/* n bytes at addr (addr + n does not wrap) of process pid into dst: all of
 * them, or why not. */
static int read_process(pid_t pid, uint64_t addr, void *dst, size_t n, tport_err *err)
{
  size_t done = 0;
  while (done < n) {
    struct iovec local = {(uint8_t *)dst + done, n - done};
    struct iovec remote = {(void *)(uintptr_t)(addr + done), n - done};
    ssize_t k = process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (k > 0) {
      done += (size_t)k;
      continue;
    }
    if (k == 0 || errno == EFAULT)
      return tport_err_set(err, TPORT_OUT_OF_RANGE,
                           "bytes [0x%llx, +%zu) of the client's memory cannot be read",
                           (unsigned long long)(addr + done), n - done);
    if (errno == ESRCH)
      return tport_err_set(err, TPORT_ABORTED, "the client process has exited");
    if (errno == EPERM)
      return tport_err_set(err, TPORT_PERMISSION_DENIED,
                           "the kernel does not let tportd read the client's memory (ptrace "
                           "access: the same user, a dumpable process, Yama's ptrace_scope)");
    return tport_err_set(err, TPORT_INTERNAL, "process_vm_readv: %s", strerror(errno));
  }
  return TPORT_OK;
}

int shm_register_process(shm_table *t, uint32_t pipe, const char *tenant, pid_t peer_pid,
                         uid_t peer_uid, uint64_t probe_addr, const uint8_t *probe,
                         size_t probe_len, uint64_t *id, tport_err *err)
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
  if (probe_len != PROBE_BYTES)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "process_probe is %zu bytes: it must be %d",
                         probe_len, PROBE_BYTES);
  if (probe_addr == 0 || probe_addr > UINT64_MAX - PROBE_BYTES)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "process_probe_addr 0x%llx is no address",
                         (unsigned long long)probe_addr);
  shm_region *r = NULL;
  uint8_t token[TRANSPORT_SHM_TOKEN_BYTES];
  int rc = register_region(t, pipe, tenant, peer_pid, 0, KIND_PROCESS, NULL, id, token, &r, err);
  if (rc)
    return rc;
  /* outside mu: the process held, then proved to be the client */
  int fd = pidfd_of(peer_pid);
  uint8_t seen[PROBE_BYTES];
  if (fd < 0)
    rc = tport_err_set(err,
                       errno == ESRCH    ? TPORT_ABORTED
                       : errno == ENOSYS ? TPORT_FAILED_PRECONDITION /* before Linux 5.3 */
                                         : TPORT_INTERNAL,
                       "pidfd_open(%d): %s", (int)peer_pid, strerror(errno));
  if (!rc)
    rc = read_process(peer_pid, probe_addr, seen, sizeof seen, err);
  if (!rc && CRYPTO_memcmp(seen, probe, PROBE_BYTES) != 0)
    rc = tport_err_set(err, TPORT_PERMISSION_DENIED,
                       "process %d does not hold the probe at 0x%llx: it is not this "
                       "connection's client",
                       (int)peer_pid, (unsigned long long)probe_addr);
  if (!rc && !process_alive(fd))
    rc = tport_err_set(err, TPORT_ABORTED, "the client process has exited");
  r->pidfd = fd; /* closed with the region, whatever happened */
  return region_opened(t, r, rc, err);
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

int shm_process_read(shm_table *t, uint32_t pipe, uint64_t id, uint64_t addr, void *dst, size_t n,
                     tport_err *err)
{
  if (!t)
    return tport_err_set(err, TPORT_FAILED_PRECONDITION,
                         "this server offers no shared memory (--shm-socket off)");
  if (addr > UINT64_MAX - n)
    return tport_err_set(err, TPORT_OUT_OF_RANGE,
                         "bytes [0x%llx, +%zu) wrap past the end of the address space",
                         (unsigned long long)addr, n);
  pthread_mutex_lock(&t->mu);
  shm_region *r = find_mine(t, pipe, id);
  int rc = TPORT_OK;
  if (!r)
    rc = tport_err_set(err, TPORT_NOT_FOUND, "this connection has no region %llu",
                       (unsigned long long)id);
  else if (r->kind != KIND_PROCESS)
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "region %llu is not a process region",
                       (unsigned long long)id);
  else if (r->state != REGION_READY)
    rc = tport_err_set(err, TPORT_FAILED_PRECONDITION, "region %llu is still being registered",
                       (unsigned long long)id);
  else
    r->holds++;
  pid_t pid = r ? r->peer_pid : 0;
  int fd = r ? r->pidfd : -1;
  pthread_mutex_unlock(&t->mu);
  if (rc)
    return rc;
  if (!process_alive(fd))
    rc = tport_err_set(err, TPORT_ABORTED, "the client process has exited");
  if (!rc)
    rc = read_process(pid, addr, dst, n, err);
  /* while the process runs its pid is its own: gone now, the pid may have
   * named another process during the read */
  if (!rc && !process_alive(fd))
    rc = tport_err_set(err, TPORT_ABORTED,
                       "the client process exited during the read: what was read is thrown away");
  if (!rc) {
    pthread_mutex_lock(&t->mu);
    t->stats.process_reads++;
    t->stats.process_bytes += n;
    pthread_mutex_unlock(&t->mu);
  }
  shm_unhold(t, r);
  return rc;
}
