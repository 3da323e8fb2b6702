/*
 * regions.h: the server's same-host regions (transport/shm.h has the handoff).
 *
 * A region's life: ShmRegister makes it PENDING for its connection and
 * tenant, with a one-time token that expires; the handoff thread (serving
 * --shm-socket) takes a descriptor with that token, checks the peer, the
 * seals and the size, maps it once (and registers the mapping with CUDA
 * when a GPU is present, so copies to a device read it directly) and turns
 * it READY.  Puts and gets of that connection then hold it while they copy
 * (shm_hold/shm_unhold), so a release or a disconnect in the meantime
 * unmaps it only once the last holder is done.  Regions belong to their
 * connection: another connection's, even of the same tenant, is NOT_FOUND.
 * Every byte registered counts against the tenant's quota (--shm-quota)
 * and the server's limit (--shm-max) until the region is released, or, for
 * a region still PENDING, until its token expires: one never handed over
 * ends then (ShmRegister and the statistics sweep them), so registering
 * and walking away holds nothing for long.
 *
 * Bytes in a region can change under the server at any time (the client
 * shares them): the server copies them once and never trusts what it read
 * from them for anything but data.  Their size cannot change (sealed).
 *
 * CUDA IPC regions (issue 19): a same-host client's GPU allocation, named
 * by its cudaIpcMemHandle_t, registered as a region of its connection so
 * that puts and gets name bytes of it as they name a region's (slices are
 * offsets into the allocation, checked against its size).  Either the
 * server opens the handle at once (cudaIpcOpenMemHandle, through the
 * engine: a device pointer, READY without a handoff), or the allocation
 * comes as an exported descriptor over the shm socket with the token, as a
 * memfd does (the emulated runtime's device memory is such a memfd: it
 * maps like a region's).  Each is opened once, when it is registered, and
 * closed when it is released, when its connection closes, or at
 * shm_stop.  A handle is one tenant's: while a tenant has it registered,
 * another tenant's registration of the same handle is PERMISSION_DENIED
 * (and the same connection's second one ALREADY_EXISTS: one open per
 * allocation).  CUDA IPC regions count against no byte quota (the memory
 * is the client's) but against shm_config.max_ipc per tenant.  A CUDA IPC
 * handle is a capability: whoever holds its bytes can open it; the
 * descriptor form, whose peer's pid is checked, is the strict one.
 *
 * Process regions (regions_process.c): a same-host client's own address
 * space, registered as a region of its connection so that a put's chunks
 * name the caller's buffer itself (slice offsets are addresses there) and
 * the server reads them with process_vm_readv: one copy, where the
 * automatic region costs two (the client's into the region, the server's
 * out).  Only for a peer the kernel already lets tportd read: an ipc:// or
 * inproc:// connection (its pid known) of the user tportd runs as, which
 * proves at registration that the pid is a process it controls (it writes
 * random bytes tportd sends into its memory, and tportd reads them back),
 * read by a thread without CAP_SYS_PTRACE (a root tportd reads only what
 * any process of its user may).  The process is held by a pidfd: a read is
 * refused once it has exited, and a read during which it exited is thrown
 * away (its pid may name another process by then).  A get may name the
 * region too (get_direct.h): the tensor's bytes written into the caller's
 * buffer (process_vm_writev), in calls each made while the process runs.
 * A write cannot be taken back: one whose get the client stopped waiting
 * for (its timeout) may land in memory it has reused since -- the
 * client's own, as a CUDA IPC get's is, and tport.h says so.  A read may
 * never end (a page the client never lets fault in: userfaultfd, FUSE): each
 * runs on threads of its own (two share a read of a MiB or more: one
 * thread's process_vm_readv is half a memcpy), which the worker waits for
 * five seconds at most (then DEADLINE_EXCEEDED, the chunk given up); at most
 * max_process_reads run at once, SHM_PROCESS_READS_PER_TENANT of one
 * tenant's, stuck ones included; past them a read waits a second for one
 * to end, then is RESOURCE_EXHAUSTED (the client puts through its region
 * instead); one none of the taken slots will come free from is refused at
 * once.  A stuck read keeps the tensor it writes, charged to its tenant
 * until the read ends (its upload, aborted, no longer pays for it), and one
 * still stuck at shm_stop leaves the table as it is.  No bytes of the region are
 * charged (the memory is the client's).
 */
#ifndef TPORT_SERVER_REGIONS_H
#define TPORT_SERVER_REGIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "shm.h"
#include "tport_types.h"

typedef struct shm_table shm_table;
typedef struct shm_region shm_region;
struct reg_later; /* registry.h */

typedef struct shm_config {
  const char *path; /* the Unix socket */
  unsigned mode;    /* its permissions */
  size_t quota;     /* bytes registered per tenant (0: half of total_max, at most 16 GiB) */
  size_t total_max; /* bytes registered in all (0: half the machine's memory): with a GPU, a
                       region is pinned, and pinned pages are the server's to pay for */
  size_t max_regions; /* per connection */
  unsigned long token_ms; /* a token's life, and a PENDING region's (0: 10 s) */
  size_t max_ipc;         /* CUDA IPC regions open per tenant (0: SHM_DEFAULT_MAX_IPC) */
  size_t max_process_reads; /* reads of clients' memory at once, all tenants (0: 1) */
} shm_config;

#define SHM_DEFAULT_MAX_IPC 256
/* reads of clients' memory one tenant may have running at once */
#define SHM_PROCESS_READS_PER_TENANT 2
/* The most bytes one chunk from a process region may name: a whole number
 * of chunks of chunk_bytes, at least one, SHM_PROCESS_READ_SPAN at most (on
 * a 2-core VM a put of 256 MiB read 4 MiB a request ran at 4.2-4.6 GB/s,
 * 32 MiB a request at 5.2-6.0: fewer requests and wake-ups per byte). */
#define SHM_PROCESS_READ_SPAN ((size_t)32 << 20)
size_t shm_process_read_max(size_t chunk_bytes);
#define SHM_IPC_HANDLE_BYTES 64 /* cudaIpcMemHandle_t */

/* Listens on cfg->path and starts the handoff thread. */
int shm_start(const shm_config *cfg, shm_table **out, tport_err *err);
/* Stops the thread, removes the socket file, unmaps every region (no
 * request may be running). */
void shm_stop(shm_table *t);
const char *shm_socket_path(const shm_table *t);

/* A new PENDING region of nbytes for the connection (pipe) of tenant.
 * peer_pid: the process at the other end of that connection where it is
 * known (ipc, inproc; 0 where not: tcp): only that process may hand the
 * region's descriptor over, so a token relayed by anyone else is worth
 * nothing to them. */
int shm_register(shm_table *t, uint32_t pipe, const char *tenant, pid_t peer_pid, uint64_t nbytes,
                 uint64_t *id, uint8_t token[TRANSPORT_SHM_TOKEN_BYTES], tport_err *err);
/* A CUDA IPC region of nbytes (the allocation's size) for the connection:
 * handle (SHM_IPC_HANDLE_BYTES) names it.  With fd, PENDING as
 * shm_register's (the descriptor comes with *token); without, opened now
 * through the engine and READY (*ready true, no token). */
int shm_register_ipc(shm_table *t, uint32_t pipe, const char *tenant, pid_t peer_pid,
                     uint64_t nbytes, const uint8_t *handle, size_t handle_len, bool fd,
                     uint64_t *id, uint8_t token[TRANSPORT_SHM_TOKEN_BYTES], bool *ready,
                     tport_err *err);
/* The connection's process region (ShmRegisterRequest.process), in two
 * steps.  Registered PENDING: *id, and token, the random bytes the client
 * must write into its memory (peer_pid, peer_uid: the connection's peer;
 * 0 pid: unknown, refused); then confirmed once the peer's memory holds
 * token at probe_addr: READY. */
int shm_register_process(shm_table *t, uint32_t pipe, const char *tenant, pid_t peer_pid,
                         uid_t peer_uid, uint64_t *id, uint8_t token[TRANSPORT_SHM_TOKEN_BYTES],
                         tport_err *err);
int shm_confirm_process(shm_table *t, uint32_t pipe, uint64_t id, uint64_t probe_addr,
                        tport_err *err);
/* Whether region id of the connection is its process region. */
bool shm_is_process(shm_table *t, uint32_t pipe, uint64_t id);
/* Reads n bytes at address addr of the connection's process region id into
 * dst, which is keep's (retained while the read may write it): all of
 * them, or an error.  *stuck: the read did not end in time and was given up
 * (DEADLINE_EXCEEDED): it may still write dst later, so what dst is for
 * must never be used (a chunk left claimed).  A read given up charges
 * keep_bytes (what keeping keep holds that nothing else charges) to hold
 * until it ends; hold (may be NULL) is the read's in every case, ended with
 * it. */
int shm_process_read(shm_table *t, uint32_t pipe, uint64_t id, uint64_t addr, void *dst, size_t n,
                     tport_tensor *keep, struct reg_later *hold, size_t keep_bytes, bool *stuck,
                     tport_err *err);
/* One run of a read of several: n bytes at the client's addr into dst. */
typedef struct shm_read_seg {
  uint64_t addr;
  uint8_t *dst;
  size_t n;
} shm_read_seg;
/* Most runs one read takes (a batch's elements, PutBatch's bound). */
#define SHM_PROCESS_READ_SEGS 4096
/* A read of several runs (shm_process_read_segs). */
typedef struct shm_read_many {
  const shm_read_seg *seg; /* 1 .. SHM_PROCESS_READ_SEGS runs, none empty */
  size_t nseg;
  tport_tensor *const *keep; /* the dsts' tensors, each fresh and written by this read alone */
  size_t nkeep, keep_bytes;  /* ... and what keeping them holds */
  /* read after every run, where addr: whether its 8 bytes held want then
   * (fence_held) -- the client still waiting for the request, so that
   * what was read before is what it meant to put */
  uint64_t fence_addr, fence_want;
  bool *bad;       /* nseg flags: a run that could not be read (nothing mapped) */
  bool fence_held; /* out */
} shm_read_many;
/* shm_process_read of m's runs as one read -- one slot, one deadline, the
 * same threads (a batch's elements): each run read or flagged bad, or an
 * error for all. */
int shm_process_read_segs(shm_table *t, uint32_t pipe, uint64_t id, shm_read_many *m,
                          struct reg_later *hold, bool *stuck, tport_err *err);
/* Writes n bytes at src, which are keep's (retained while the write may
 * read them), into the connection's process region id at address addr
 * (a get straight into the caller's buffer): all of them, or an error.
 * The same slots, threads and deadline as a read's: *stuck, the write was
 * given up (DEADLINE_EXCEEDED) and may still land there -- the client is
 * told so.  Nothing is written where the process has exited; a write is
 * made in pieces, each while it still runs. */
int shm_process_write(shm_table *t, uint32_t pipe, uint64_t id, uint64_t addr, const void *src,
                      size_t n, tport_tensor *keep, struct reg_later *hold, size_t keep_bytes,
                      bool *stuck, tport_err *err);
/* shm_process_write of m's runs as one write (a batch's elements: each
 * run's dst is what is written at its addr; m's fence unused): each run
 * written or flagged bad (nothing mapped there, or read-only), or an error
 * for all. */
int shm_process_write_segs(shm_table *t, uint32_t pipe, uint64_t id, shm_read_many *m,
                           struct reg_later *hold, bool *stuck, tport_err *err);
int shm_release(shm_table *t, uint32_t pipe, uint64_t id, tport_err *err);
/* The connection closed: its regions go (once their holders are done). */
void shm_drop_pipe(shm_table *t, uint32_t pipe);

/* Bytes [offset, offset + length) of the connection's READY region id,
 * checked against its size: *p points at them, *r is held (shm_unhold it).
 * *pinned: the mapping is registered with the GPU driver. */
int shm_hold(shm_table *t, uint32_t pipe, uint64_t id, uint64_t offset, uint64_t length,
             shm_region **r, uint8_t **p, bool *pinned, tport_err *err);
/* The same for a caller that also takes GPU memory: *on_dev true when
 * *p is device memory of *dev (an opened CUDA IPC handle: wrap it with
 * tensor_wrap_device, never read it here).  shm_hold refuses those. */
int shm_hold_any(shm_table *t, uint32_t pipe, uint64_t id, uint64_t offset, uint64_t length,
                 shm_region **r, uint8_t **p, bool *pinned, tport_device *dev, bool *on_dev,
                 tport_err *err);
void shm_unhold(shm_table *t, shm_region *r);

typedef struct shm_stats {
  uint64_t regions, bytes;                /* registered now (pending ones included) */
  uint64_t handoffs_ok, handoffs_refused; /* descriptors taken / refused, ever */
  uint64_t transfers;                     /* puts and gets through a region, ever */
  uint64_t ipc_regions;                   /* CUDA IPC regions registered now (in regions) */
  uint64_t ipc_opens, ipc_refused;        /* CUDA IPC allocations opened / refused, ever */
  uint64_t process_regions;               /* process regions registered now */
  uint64_t process_reads, process_bytes;  /* reads / bytes of clients' memory stored from, ever */
  uint64_t process_writes, process_written; /* writes / bytes into clients' memory, ever */
  uint64_t process_reading, process_stuck; /* reads running now; of them, given up */
} shm_stats;
void shm_get_stats(shm_table *t, shm_stats *out);
/* The limits in force (the defaults resolved): bytes per tenant, in all. */
void shm_limits(const shm_table *t, size_t *quota, size_t *total_max);
/* A put or a get went through a region (once per tensor, however many
 * chunks it took). */
void shm_count_transfer(shm_table *t);
/* Tests: the k-th allocation of the table's hashes from now (1: the next)
 * fails, as it would out of memory (the registration that needs it is
 * refused); 0: none. */
void shm_test_fail_hash_alloc(int k);

#endif
