/*
 * regions_process_access.c: the system calls under a process region's
 * reads and writes (regions_process_read.c): process_vm_readv and
 * process_vm_writev of a same-host client's memory, made by the calling
 * thread with CAP_SYS_PTRACE out of its effective set, so that the kernel's
 * own rule (the same uids and gids, a dumpable process, Yama) is the whole
 * reach even of a root tportd.
 *
 * A write cannot be taken back as a read can (a read during which the
 * process exited is thrown away; bytes written into a pid that came to
 * name another process would stay there): it goes in calls of at most
 * PROCESS_WRITE_CALL bytes, each made only while the pidfd's process still
 * runs -- its pid is then its own, and a pid is reused only after its
 * process has exited, been reaped, and the kernel's pid counter has come
 * round to it again.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/capability.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "log.h"
#include "regions_internal.h"

/* The most bytes one process_vm_writev writes (4 MiB: about a millisecond
 * here), the process checked alive before each. */
#define PROCESS_WRITE_CALL ((size_t)4 << 20)

/* Whether the process behind pidfd still runs (a pidfd polls readable once
 * its process has exited). */
bool process_alive(int pidfd)
{
  struct pollfd p = {.fd = pidfd, .events = POLLIN};
  int n;
  do
    n = poll(&p, 1, 0);
  while (n < 0 && errno == EINTR);
  return n == 0;
}

/* iovecs one process_vm_readv takes here (IOV_MAX is 1024): a batch's
 * request of 256 elements in one call, on the reading thread's stack */
#define READ_IOV 256

/* The iovecs of bytes [at, to) of the runs seg (at most READ_IOV of them,
 * from the run holding at): how many; *bytes, what they cover. */
static int iov_of(const shm_read_seg *seg, size_t nseg, size_t at, size_t to, struct iovec *local,
                  struct iovec *remote, size_t *bytes)
{
  int k = 0;
  size_t base = 0;
  *bytes = 0;
  for (size_t i = 0; i < nseg && base < to && k < READ_IOV; base += seg[i++].n) {
    size_t a = at > base ? at - base : 0, b = to - base < seg[i].n ? to - base : seg[i].n;
    if (a >= b)
      continue;
    local[k] = (struct iovec){seg[i].dst + a, b - a};
    remote[k] = (struct iovec){(void *)(uintptr_t)(seg[i].addr + a), b - a};
    *bytes += b - a;
    k++;
  }
  return k;
}

/* The client's address of byte at of the runs (at within them). */
static uint64_t addr_at(const shm_read_seg *seg, size_t nseg, size_t at)
{
  for (size_t i = 0; i < nseg; at -= seg[i++].n)
    if (at < seg[i].n)
      return seg[i].addr + at;
  return 0;
}

/* The run holding byte at of the runs (at within them), and where it
 * begins. */
static size_t run_at(const shm_read_seg *seg, size_t nseg, size_t at, size_t *base)
{
  size_t r = 0;
  for (*base = 0; r + 1 < nseg && at >= *base + seg[r].n; r++)
    *base += seg[r].n;
  return r;
}

/* Bytes [from, to) of the runs seg (none wraps the address space) of
 * process pid into their dsts -- or, write, from them into the process:
 * all of them, or why not.  With bad (a flag a run), a run that cannot be
 * read (nothing mapped) is flagged and the read goes on with the next:
 * each of a batch's elements answered for its own bytes, in the one read.
 * A write goes in calls of at most PROCESS_WRITE_CALL bytes, the process
 * checked alive before each (process_write_as_user). */
static int access_process(pid_t pid, int pidfd, const shm_read_seg *seg, size_t nseg, size_t from,
                          size_t to, bool write, atomic_bool *bad, tport_err *err)
{
  struct iovec local[READ_IOV], remote[READ_IOV];
  size_t done = from;
  while (done < to) {
    size_t want;
    size_t upto = write && to - done > PROCESS_WRITE_CALL ? done + PROCESS_WRITE_CALL : to;
    int k = iov_of(seg, nseg, done, upto, local, remote, &want);
    if (write && !process_alive(pidfd))
      return tport_err_set(err, TPORT_ABORTED, "the client process has exited");
    ssize_t got = write
                      ? process_vm_writev(pid, local, (unsigned long)k, remote, (unsigned long)k, 0)
                      : process_vm_readv(pid, local, (unsigned long)k, remote, (unsigned long)k, 0);
    if (got > 0) {
      done += (size_t)got;
      continue;
    }
    if ((got == 0 || errno == EFAULT) && bad) {
      size_t base, r = run_at(seg, nseg, done, &base);
      atomic_store(&bad[r], true);
      done = base + seg[r].n; /* (the next run, or past to) */
      continue;
    }
    if (got == 0 || errno == EFAULT)
      return tport_err_set(err, TPORT_OUT_OF_RANGE,
                           "bytes [0x%llx, +%zu) of the client's memory cannot be %s",
                           (unsigned long long)addr_at(seg, nseg, done), local[0].iov_len,
                           write ? "written" : "read");
    if (errno == ESRCH)
      return tport_err_set(err, TPORT_ABORTED, "the client process has exited");
    if (errno == EPERM)
      return tport_err_set(err, TPORT_PERMISSION_DENIED,
                           "the kernel does not let tportd %s the client's memory (ptrace "
                           "access: the same user, a dumpable process, Yama's ptrace_scope)",
                           write ? "write" : "read");
    return tport_err_set(err, TPORT_INTERNAL, "process_vm_%sv: %s", write ? "write" : "read",
                         strerror(errno));
  }
  return TPORT_OK;
}

/* CAP_SYS_PTRACE out of this thread's effective set for a read, and back
 * after it (capabilities are a thread's own): a root tportd reads only
 * what the kernel lets any process of its user read (the same uids and
 * gids, a dumpable process), never a process a client might have made
 * become another (an exec of a setuid program).  Put back because the
 * thread's other work (a CUDA IPC open, say) may need it. */
typedef struct ptrace_cap {
  struct __user_cap_header_struct h;
  struct __user_cap_data_struct d[_LINUX_CAPABILITY_U32S_3];
  bool dropped;
} ptrace_cap;

#define PTRACE_WORD (CAP_SYS_PTRACE / 32)
#define PTRACE_BIT (1u << (CAP_SYS_PTRACE % 32))

static bool ptrace_cap_drop(ptrace_cap *pc)
{
  pc->h = (struct __user_cap_header_struct){.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
  pc->dropped = false;
  if (syscall(SYS_capget, &pc->h, pc->d) != 0)
    return false;
  if (!(pc->d[PTRACE_WORD].effective & PTRACE_BIT))
    return true;
  pc->d[PTRACE_WORD].effective &= ~PTRACE_BIT;
  if (syscall(SYS_capset, &pc->h, pc->d) != 0)
    return false;
  pc->dropped = true;
  return true;
}

static void ptrace_cap_restore(ptrace_cap *pc)
{
  if (!pc->dropped)
    return;
  pc->d[PTRACE_WORD].effective |= PTRACE_BIT;
  if (syscall(SYS_capset, &pc->h, pc->d) != 0)
    log_msg(LOG_WARN, "CAP_SYS_PTRACE could not be put back on a reading thread: %s",
            strerror(errno));
}

/* The access as this thread's user alone (CAP_SYS_PTRACE dropped). */
static int access_as_user(pid_t pid, int pidfd, const shm_read_seg *seg, size_t nseg, size_t from,
                          size_t to, bool write, atomic_bool *bad, tport_err *err)
{
  ptrace_cap pc;
  if (!ptrace_cap_drop(&pc))
    return tport_err_set(err, TPORT_INTERNAL,
                         "cannot drop CAP_SYS_PTRACE before %s a client's memory: %s",
                         write ? "writing" : "reading", strerror(errno));
  int rc = access_process(pid, pidfd, seg, nseg, from, to, write, bad, err);
  ptrace_cap_restore(&pc);
  return rc;
}

int process_read_as_user(pid_t pid, const shm_read_seg *seg, size_t nseg, size_t from, size_t to,
                         atomic_bool *bad, tport_err *err)
{
  return access_as_user(pid, -1, seg, nseg, from, to, false, bad, err);
}

int process_write_as_user(pid_t pid, int pidfd, const shm_read_seg *seg, size_t nseg, size_t from,
                          size_t to, atomic_bool *bad, tport_err *err)
{
  return access_as_user(pid, pidfd, seg, nseg, from, to, true, bad, err);
}
