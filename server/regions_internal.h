/*
 * regions_internal.h: what the files of the same-host regions share
 * (regions.h is their face): the records of a region, a tenant's use and
 * the table, and the region primitives.  regions_socket.c (the socket, its
 * handoff thread, start and stop) calls regions.c, never the other way.
 */
#ifndef TPORT_REGIONS_INTERNAL_H
#define TPORT_REGIONS_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <time.h>

/* uthash: an allocation failure leaves the table as it was (reported through
 * shm_oom, set and read within one HASH_ADD's caller) instead of exiting
 * the process -- uthash's default, by which a registration under memory
 * pressure took tportd down.  Its allocations go through shm_hash_malloc,
 * which tests make fail (shm_test_fail_hash_alloc). */
static _Thread_local bool shm_oom __attribute__((unused));
void *shm_hash_malloc(size_t n);
#define uthash_malloc(sz) shm_hash_malloc(sz)
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(e) (shm_oom = true)
#include <uthash.h>

#include "regions.h"

/* a token is good this long after ShmRegister (shm_config.token_ms 0) */
#define TOKEN_TTL_MS 10000
/* the default --shm-quota: half of --shm-max, at most this */
#define DEFAULT_QUOTA ((size_t)16 << 30)
/* the time a peer of the socket has to send its handoff */
#define HANDOFF_TIMEOUT_MS 2000
/* handoffs served at once, each on a thread of its own: a peer that
 * connects and says nothing holds one for HANDOFF_TIMEOUT_MS, never the
 * others' */
#define MAX_HANDOFFS 16
#define TENANT_MAX 64

typedef enum { REGION_PENDING, REGION_READY } region_state;
/* a memfd of the client's; a CUDA allocation as an exported descriptor
 * (mapped as a memfd is); a CUDA allocation opened by its IPC handle; the
 * client process's own memory (regions_process.c: read, never mapped) */
typedef enum { KIND_MEMFD, KIND_IPC_FD, KIND_IPC_CUDA, KIND_PROCESS } region_kind;

/* An opened CUDA IPC handle.  CUDA opens a handle once per process, so the
 * regions of one tenant's connections that name the same allocation share
 * it; the last one to go closes it. */
typedef struct ipc_map {
  atomic_int refs;
  void *base;
  tport_device dev;
} ipc_map;

struct shm_region {
  uint64_t id;
  uint32_t pipe;
  char tenant[TENANT_MAX];
  uint8_t token[TRANSPORT_SHM_TOKEN_BYTES];
  int64_t token_expires_ms;
  pid_t peer_pid; /* who must hand the descriptor over (0: any allowed peer) */
  region_state state;
  region_kind kind;
  uint8_t ipc_handle[SHM_IPC_HANDLE_BYTES]; /* a CUDA IPC region's name */
  tport_device ipc_dev;                     /* KIND_IPC_CUDA: where base is */
  ipc_map *map;                             /* KIND_IPC_CUDA: the open it shares */
  int pidfd;                                /* KIND_PROCESS: the client process (-1: none) */
  bool tokened;                             /* in by_token: its token has not been used */
  bool handing_off;                         /* the handoff thread is checking its descriptor */
  bool released;                            /* gone from the tables; unmapped by the last holder */
  uint8_t *base;
  size_t nbytes;
  bool pinned;
  int holds;
  UT_hash_handle hh;     /* by id */
  UT_hash_handle hh_tok; /* by token, while PENDING */
  /* regions_index.c's lists: its connection's, its IPC handle's, and the
   * pending ones' (while tokened) */
  struct shm_region *pipe_prev, *pipe_next, *ipc_prev, *ipc_next, *tok_prev, *tok_next;
  struct shm_pipe *owner;
  struct shm_ipc_key *ipc_key;
};

typedef struct shm_pipe shm_pipe;
typedef struct shm_ipc_key shm_ipc_key;

typedef struct tenant_use {
  char name[TENANT_MAX];
  size_t bytes;
  size_t ipc;     /* CUDA IPC regions */
  size_t process; /* process regions (one a connection) */
  size_t reading; /* reads of its clients' memory running */
  size_t stuck;   /* ... of which given up by their workers */
  UT_hash_handle hh;
} tenant_use;

struct shm_table {
  shm_config cfg;
  char *path;
  int listen_fd;
  int wake[2]; /* a pipe that stops the thread */
  pthread_t thread;
  pthread_mutex_t mu;
  shm_region *by_id, *by_token;
  shm_pipe *by_pipe;       /* regions_index.c */
  shm_ipc_key *by_handle;  /* regions_index.c */
  shm_region *pending_head, *pending_tail; /* the tokened, oldest first */
  uint64_t walked; /* regions the registrations and ends looked at, ever (tests) */
  tenant_use *tenants;
  uint64_t next_id;
  shm_stats stats;
  int handoffs_running; /* threads serving one connection each (mu) */
  pthread_cond_t handoffs_done;
  uid_t euid; /* tportd's: a process region's peer must run as it */
  size_t process_reading;  /* reads of clients' memory running (mu) */
  size_t process_stuck;    /* ... of which given up by their workers */
  pthread_cond_t readers_free; /* one of them ended */
  struct read_job *given_up;   /* of them, those given up (regions_process.c) */
  bool stopped;                /* shm_stop has run (a stuck read's thread leaves all be) */
};

/* Whether nothing counts against u any more (it may go). */
static inline bool tenant_unused(const tenant_use *u)
{
  return u->bytes == 0 && u->ipc == 0 && u->process == 0 && u->reading == 0;
}

/* A condition variable whose timed waits run on CLOCK_MONOTONIC (a step
 * of the wall clock neither stretches nor cuts them). */
static inline void regions_cond_init(pthread_cond_t *cv)
{
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(cv, &a);
  pthread_condattr_destroy(&a);
}

static inline int64_t now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline bool kind_is_ipc(region_kind k)
{
  return k == KIND_IPC_FD || k == KIND_IPC_CUDA;
}

static inline bool is_ipc(const shm_region *r)
{
  return kind_is_ipc(r->kind);
}

/* Memory tportd maps as host memory, whose bytes count against
 * --shm-quota and --shm-max: a memfd region, and a descriptor a client
 * hands over as its GPU memory (KIND_IPC_FD is mmapped like a memfd: a
 * hostile client may send any sealed memfd that way, and pages tportd
 * writes there would be tportd's).  A CUDA IPC handle is the client's GPU
 * memory, counted by --cuda-ipc-max alone. */
static inline bool host_mapped(region_kind k)
{
  return k == KIND_MEMFD || k == KIND_IPC_FD;
}

/* The tenant's use of regions (mu held): NULL where it has none, unless
 * create. */
tenant_use *tenant_of(shm_table *t, const char *name, bool create);
/* Unmaps a region nobody holds any more.  Never under mu. */
void region_free(shm_region *r);
/* Takes r out of the tables and the quota (mu held); true when the caller
 * must free it (nobody holds it). */
bool region_remove(shm_table *t, shm_region *r);
/* A new region of the connection (regions.c): PENDING with a token for its
 * handoff, or, *opening set (KIND_IPC_CUDA, KIND_PROCESS), for the caller
 * to open outside mu and then turn READY with region_opened. */
int register_region(shm_table *t, uint32_t pipe, const char *tenant, pid_t peer_pid,
                    uint64_t nbytes, region_kind kind, const uint8_t *handle, uint64_t *id,
                    uint8_t token[TRANSPORT_SHM_TOKEN_BYTES], shm_region **opening, tport_err *err);
/* The end of an open: READY where it went well (rc 0) and the region was
 * not released meanwhile, else the region ends (and is freed here). */
int region_opened(shm_table *t, shm_region *r, int rc, tport_err *err);
/* The connection's region id (mu held); NULL where it has none. */
shm_region *find_mine(shm_table *t, uint32_t pipe, uint64_t id);

/* regions_index.c (mu held): r into its connection's list and its IPC
 * handle's (false: no memory for a new connection's or handle's record or
 * its place in a hash, nothing changed), and out of them; the
 * connection's count of regions (its process region aside), its process
 * region, its first region (then pipe_next); the first region of a handle
 * (then ipc_next); the pending list (tokened regions, oldest first); the
 * index's records freed (the table is going). */
bool index_add(shm_table *t, shm_region *r);
void index_remove(shm_table *t, shm_region *r);
size_t index_pipe_regions(shm_table *t, uint32_t pipe);
shm_region *index_pipe_process(shm_table *t, uint32_t pipe);
shm_region *index_pipe_first(shm_table *t, uint32_t pipe);
shm_region *index_ipc_first(shm_table *t, const uint8_t *handle);
void pending_append(shm_table *t, shm_region *r);
void pending_remove(shm_table *t, shm_region *r);
void index_free(shm_table *t);

/* regions_process_access.c, for the registration's check too: whether the
 * process behind pidfd still runs; bytes [from, to) of the runs seg of
 * process pid into their dsts, read by this thread without CAP_SYS_PTRACE
 * meanwhile (with bad, a flag a run: one that cannot be read is flagged
 * and skipped rather than failing the read); or written from their dsts
 * into the process, in calls each made while pidfd's process runs (with
 * bad, a run that cannot be written flagged and skipped the same way). */
bool process_alive(int pidfd);
int process_read_as_user(pid_t pid, const shm_read_seg *seg, size_t nseg, size_t from, size_t to,
                         atomic_bool *bad, tport_err *err);
int process_write_as_user(pid_t pid, int pidfd, const shm_read_seg *seg, size_t nseg, size_t from,
                          size_t to, atomic_bool *bad, tport_err *err);

#endif
