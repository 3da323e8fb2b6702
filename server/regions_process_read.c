/*
 * regions_process_read.c: reads of a same-host client's own memory, a
 * process region's (regions.h; registered and confirmed in
 * regions_process.c): a put's chunks, or a batch's elements together, taken
 * with process_vm_readv straight into the tensors that store them -- and
 * its writes, a get's bytes written straight into the caller's buffer
 * (process_vm_writev), run the same way.
 *
 * A read runs on threads of its own (two share one of a MiB or more), each
 * without CAP_SYS_PTRACE (regions_process_access.c), and checks before and
 * after that the pidfd's process still runs; the worker that asked waits
 * for it until a deadline, then gives it up (what it keeps stays charged to
 * its tenant until it ends).  A batch's read flags an element whose bytes
 * cannot be read and goes on with the next, then reads the batch's fence.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "log.h"
#include "regions_internal.h"
#include "registry.h"

/* how long a read waits for a reader's slot (regions.h) before it is
 * refused, and how long a worker waits for the read */
#define PROCESS_READ_WAIT_MS 1000
#define PROCESS_READ_DEADLINE_MS 5000

/* Reads of at least this many bytes are split over PROCESS_READ_PIECES
 * threads: process_vm_readv pins and copies the client's pages one by one,
 * and one thread does about half of what memcpy does (3.3-4.1 GB/s against
 * 7.7-8.9 on a 2-core VM, 6.4-6.8 with two threads). */
#define PROCESS_READ_PIECES 2
#define PROCESS_READ_SPLIT_MIN ((size_t)1 << 20)

typedef struct read_job read_job;

/* One thread's share of a read: bytes [from, to) of its runs. */
typedef struct read_piece {
  read_job *j;
  size_t from, to;
} read_piece;

/* A read of a client's memory for a worker (shm_process_read), by one
 * thread a piece.  Its state is under the table's mu. */
struct read_job {
  shm_table *t;
  shm_region *r; /* held for the read (its pidfd open) */
  tenant_use *u; /* counted in reading */
  pid_t pid;
  int pidfd;
  size_t n;            /* the runs' bytes */
  shm_read_seg *seg;   /* the runs (the job's copy) */
  size_t nseg;
  tport_tensor **keep; /* the dsts' tensors, retained while the read may touch them */
  size_t nkeep;
  atomic_bool *bad;    /* a flag a run (NULL: a fault fails the read) */
  uint64_t fence_addr, fence_want; /* read after the runs where fence_addr */
  bool fence_held;                 /* ... and it held fence_want */
  bool write;          /* from the dsts into the client (a get) */
  reg_later hold;      /* charged keep_bytes once given up, until the end */
  size_t keep_bytes;
  read_job *next_given_up; /* in the table's given_up (mu) */
  read_piece piece[PROCESS_READ_PIECES];
  int npieces, running; /* pieces, and those not ended */
  int rc;               /* the first piece's failure */
  tport_err err;
  bool done, abandoned;
  pthread_cond_t cv; /* done */
};

static void job_free(read_job *j)
{
  pthread_cond_destroy(&j->cv);
  free(j->seg);
  free(j->keep);
  free(j->bad);
  free(j);
}

/* Another read given up that keeps j's storage and whose hold is charged
 * to the same account as j's (charged: one that pays for it, else one
 * that does not), or NULL.  mu held. */
static read_job *sharing(shm_table *t, const read_job *j, bool charged)
{
  /* (a read of several keeps tensors of its own: only a chunk's read of
   * an upload, one tensor, may keep what another keeps) */
  for (read_job *o = t->given_up; o; o = o->next_given_up)
    if (o != j && o->nkeep == 1 && j->nkeep == 1 && o->keep[0]->storage == j->keep[0]->storage &&
        o->hold.acct == j->hold.acct && (o->hold.charged > 0) == charged)
      return o;
  return NULL;
}

/* j is given up (mu held): the storage it keeps is its tenant's to pay
 * for until it ends -- once, whichever of the reads given up that keep it
 * pays (a put's chunks in flight together share one tensor). */
static void give_up(shm_table *t, read_job *j)
{
  j->abandoned = true; /* the thread frees it, and what it holds, if it ever ends */
  t->process_stuck++;
  j->u->stuck++;
  if (!sharing(t, j, true))
    reg_later_charge(&j->hold, j->keep_bytes);
  j->next_given_up = t->given_up;
  t->given_up = j;
}

/* j, given up, has ended (mu held): out of the list, its charge handed to
 * another that keeps the same storage, if any. */
static void given_up_ended(shm_table *t, read_job *j)
{
  for (read_job **p = &t->given_up; *p; p = &(*p)->next_given_up)
    if (*p == j) {
      *p = j->next_given_up;
      break;
    }
  read_job *heir = j->hold.charged ? sharing(t, j, false) : NULL;
  if (heir) {
    heir->hold.charged += j->hold.charged;
    j->hold.charged = 0;
  }
  t->process_stuck--;
  j->u->stuck--;
}

/* The read has ended (j->rc): in one step under mu, its slot, counts and
 * region hold given back and its waiter woken -- nothing of the table is
 * touched after it, for shm_stop may free the table once the read no
 * longer counts (a read still counted makes shm_stop leave the table as it
 * is) -- then the tensor it wrote let go, and its charge.  An abandoned job
 * is freed here. */
static void read_ended(read_job *j)
{
  shm_table *t = j->t;
  shm_region *r = j->r;
  pthread_mutex_lock(&t->mu);
  bool abandoned = j->abandoned;
  if (abandoned)
    given_up_ended(t, j);
  /* let go below, the charge after the memory */
  reg_later hold = j->hold; /* charged, if given up, under mu */
  tport_tensor **keep = j->keep;
  size_t nkeep = j->nkeep;
  j->keep = NULL;
  t->process_reading--;
  j->u->reading--; /* kept while reading > 0 (tenant_unused) */
  pthread_cond_broadcast(&t->readers_free);
  if (!t->stopped && tenant_unused(j->u)) {
    HASH_DEL(t->tenants, j->u);
    free(j->u);
  }
  /* counted where its bytes may be stored: read whole, waited for, and
   * its fence (if it names one) held */
  if (!j->rc && !abandoned && j->write) {
    t->stats.process_writes++;
    t->stats.process_written += j->n;
  } else if (!j->rc && !abandoned && (!j->fence_addr || j->fence_held)) {
    t->stats.process_reads++;
    t->stats.process_bytes += j->n;
  }
  /* shm_unhold's rule, in this step: a released region is ours to free */
  bool free_r = --r->holds == 0 && r->released && !r->handing_off && !t->stopped;
  j->done = true;
  pthread_cond_signal(&j->cv); /* its waiter may free j once mu is let go */
  pthread_mutex_unlock(&t->mu);
  for (size_t i = 0; i < nkeep; i++)
    tensor_release(keep[i]); /* the engine outlives the server */
  free(keep);
  reg_later_end(&hold); /* the account outlives the registry */
  if (free_r)
    region_free(r);
  if (abandoned)
    job_free(j);
}

/* The read's fence (once every run was read, by the thread of its last
 * piece): whether it still holds what the request said. */
static void read_fence(read_job *j)
{
  uint64_t seen = 0;
  tport_err why;
  shm_read_seg f = {.addr = j->fence_addr, .dst = (uint8_t *)&seen, .n = sizeof seen};
  j->fence_held = j->fence_addr <= UINT64_MAX - sizeof seen &&
                  process_read_as_user(j->pid, &f, 1, 0, sizeof seen, NULL, &why) == TPORT_OK &&
                  seen == j->fence_want && process_alive(j->pidfd);
}

/* A piece has ended with rc (why: err): the read ends with the last (in a
 * reader's thread when it read: its fence read there too). */
static void piece_ended(read_job *j, int rc, const tport_err *err)
{
  pthread_mutex_lock(&j->t->mu);
  if (rc && !j->rc) {
    j->rc = rc;
    j->err = *err;
  }
  bool last = --j->running == 0;
  bool fence = last && !j->rc && j->fence_addr;
  pthread_mutex_unlock(&j->t->mu);
  if (fence)
    read_fence(j);
  if (last)
    read_ended(j);
}

static void *read_thread(void *arg)
{
  prctl(PR_SET_NAME, "tportd:read"); /* what top -H, perf and gdb show */
  read_piece *p = arg;
  read_job *j = p->j;
  tport_err err;
  tport_err_clear(&err);
  int rc = TPORT_OK;
  if (!process_alive(j->pidfd))
    rc = tport_err_set(&err, TPORT_ABORTED, "the client process has exited");
  if (!rc && j->write)
    rc = process_write_as_user(j->pid, j->pidfd, j->seg, j->nseg, p->from, p->to, j->bad, &err);
  else if (!rc)
    rc = process_read_as_user(j->pid, j->seg, j->nseg, p->from, p->to, j->bad, &err);
  /* while the process runs its pid is its own: gone now, the pid may have
   * named another process during the read */
  if (!rc && !process_alive(j->pidfd))
    rc = tport_err_set(&err, TPORT_ABORTED, "the client process exited during the %s",
                       j->write ? "write" : "read: what was read is thrown away");
  piece_ended(j, rc, &err);
  return NULL;
}

/* The connection's process region id and its tenant's use, once a
 * reader's slot is free for them (mu held; waited for a little): rc. */
static int take_slot(shm_table *t, uint32_t pipe, uint64_t id, shm_region **rp, tenant_use **up,
                     tport_err *err)
{
  int64_t until = now_ms() + PROCESS_READ_WAIT_MS;
  shm_region *r;
  tenant_use *u;
  int rc;
  for (;;) {
    r = find_mine(t, pipe, id);
    u = r ? tenant_of(t, r->tenant, false) : NULL;
    rc = TPORT_OK;
    if (!r)
      rc = tport_err_set(err, TPORT_NOT_FOUND, "this connection has no region %llu",
                         (unsigned long long)id);
    else if (r->kind != KIND_PROCESS)
      rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "region %llu is not a process region",
                         (unsigned long long)id);
    else if (r->state != REGION_READY)
      rc = tport_err_set(err, TPORT_FAILED_PRECONDITION, "process region %llu is not confirmed",
                         (unsigned long long)id);
    else if (!u)
      rc = tport_err_set(err, TPORT_INTERNAL, "process region %llu has no tenant",
                         (unsigned long long)id);
    bool all = !rc && t->process_reading >= t->cfg.max_process_reads;
    bool mine = !rc && u->reading >= SHM_PROCESS_READS_PER_TENANT;
    if (!all && !mine)
      break;
    /* a read may never end: never all the workers, nor more than a few
     * for one tenant -- a slot is waited for a little (not when those
     * taken are all stuck: none will come free), then refused */
    bool hopeless =
        (all && t->process_stuck >= t->process_reading) || (mine && u->stuck >= u->reading);
    int64_t left = hopeless ? 0 : until - now_ms();
    if (left <= 0) {
      rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                         "tportd is reading or writing %zu clients' memory at once (%zu for "
                         "tenant '%s'): send these bytes another way",
                         t->process_reading, u->reading, r->tenant);
      break;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += left / 1000;
    ts.tv_nsec += (left % 1000) * 1000000;
    if (ts.tv_nsec >= 1000000000) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait(&t->readers_free, &t->mu, &ts);
  }
  *rp = r;
  *up = u;
  return rc;
}

/* shm_process_read's refusals before a read begins: the hold ended. */
static int refused(reg_later *hold, int rc)
{
  if (hold)
    reg_later_end(hold);
  return rc;
}

/* The runs' bytes cut into j->npieces pieces of about the same size, each
 * cut where a page of the client's memory begins (two threads pin one page
 * only where two runs share it), or at the start of its run; a piece left
 * empty is dropped. */
static void split(read_job *j)
{
  int k = 0;
  size_t at = 0;
  for (int i = 0; i < j->npieces; i++) {
    size_t cut = j->n;
    if (i + 1 < j->npieces) {
      size_t want = j->n / (size_t)j->npieces * (size_t)(i + 1), base = 0, r = 0;
      while (base + j->seg[r].n <= want)
        base += j->seg[r++].n; /* (want < n: within the runs) */
      uint64_t a = (j->seg[r].addr + (want - base)) & ~(uint64_t)4095;
      cut = a > j->seg[r].addr ? base + (size_t)(a - j->seg[r].addr) : base;
    }
    if (cut <= at)
      continue;
    j->piece[k++] = (read_piece){.j = j, .from = at, .to = cut};
    at = cut;
  }
  j->npieces = j->running = k;
}

/* Each piece on a thread of its own; those no thread was made for end
 * here, unread (one running already ends the read when it does: the job is
 * freed by its waiter or, abandoned, by that piece). */
static void start_pieces(read_job *j)
{
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  for (int i = 0; i < j->npieces; i++) {
    pthread_t th;
    if (pthread_create(&th, &attr, read_thread, &j->piece[i]) == 0)
      continue;
    tport_err why;
    tport_err_set(&why, TPORT_RESOURCE_EXHAUSTED,
                  "no thread for a read of the client's memory: send these bytes another way");
    for (int k = i; k < j->npieces; k++)
      piece_ended(j, TPORT_RESOURCE_EXHAUSTED, &why);
    break;
  }
  pthread_attr_destroy(&attr);
}

int shm_process_read(shm_table *t, uint32_t pipe, uint64_t id, uint64_t addr, void *dst, size_t n,
                     tport_tensor *keep, reg_later *hold, size_t keep_bytes, bool *stuck,
                     tport_err *err)
{
  shm_read_seg one = {.addr = addr, .dst = dst, .n = n};
  shm_read_many m = {.seg = &one, .nseg = 1, .keep = &keep, .nkeep = 1, .keep_bytes = keep_bytes};
  return shm_process_read_segs(t, pipe, id, &m, hold, stuck, err);
}

/* The runs checked (none empty or wrapping past the end of the address
 * space, their sum counted) into *total. */
static int check_segs(const shm_read_seg *seg, size_t nseg, size_t *total, tport_err *err)
{
  *total = 0;
  if (nseg == 0 || nseg > SHM_PROCESS_READ_SEGS)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "a read of %zu runs: 1 to %d", nseg,
                         SHM_PROCESS_READ_SEGS);
  for (size_t i = 0; i < nseg; i++) {
    if (seg[i].n == 0)
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "run %zu of a read is empty", i);
    if (seg[i].addr > UINT64_MAX - seg[i].n)
      return tport_err_set(err, TPORT_OUT_OF_RANGE,
                           "bytes [0x%llx, +%zu) wrap past the end of the address space",
                           (unsigned long long)seg[i].addr, seg[i].n);
    if (__builtin_add_overflow(*total, seg[i].n, total))
      return tport_err_set(err, TPORT_OUT_OF_RANGE, "a read of more bytes than can be counted");
  }
  return TPORT_OK;
}

/* A job for m's runs, its own copies of them and of keep, and a flag a
 * run where m asks (NULL: out of memory). */
static read_job *job_new(const shm_read_many *m)
{
  read_job *j = calloc(1, sizeof *j);
  if (!j)
    return NULL;
  j->seg = malloc(m->nseg * sizeof *m->seg);
  j->keep = calloc(m->nkeep ? m->nkeep : 1, sizeof *m->keep);
  j->bad = m->bad ? calloc(m->nseg, sizeof *j->bad) : NULL;
  if (!j->seg || !j->keep || (m->bad && !j->bad)) {
    free(j->seg), free(j->keep), free(j->bad), free(j);
    return NULL;
  }
  memcpy(j->seg, m->seg, m->nseg * sizeof *m->seg);
  j->nseg = m->nseg;
  for (size_t i = 0; i < m->nkeep; i++)
    j->keep[j->nkeep++] = tensor_retain(m->keep[i]);
  j->keep_bytes = m->keep_bytes;
  j->fence_addr = m->fence_addr;
  j->fence_want = m->fence_want;
  return j;
}

/* A read of m's runs, or (write) a write of them: shm_process_read_segs,
 * shm_process_write. */
static int process_job(shm_table *t, uint32_t pipe, uint64_t id, shm_read_many *m, bool write,
                       reg_later *hold, bool *stuck, tport_err *err)
{
  *stuck = false;
  if (!t)
    return refused(hold, tport_err_set(err, TPORT_FAILED_PRECONDITION,
                                       "this server offers no shared memory (--shm-socket off)"));
  size_t n;
  int rc = check_segs(m->seg, m->nseg, &n, err);
  if (rc)
    return refused(hold, rc);
  pthread_mutex_lock(&t->mu);
  shm_region *r;
  tenant_use *u;
  rc = take_slot(t, pipe, id, &r, &u, err);
  read_job *j = rc ? NULL : job_new(m);
  if (!j) {
    pthread_mutex_unlock(&t->mu);
    return refused(hold, rc ? rc : tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory"));
  }
  r->holds++;
  t->process_reading++;
  u->reading++;
  j->t = t;
  j->write = write;
  j->r = r;
  j->u = u;
  j->pid = r->peer_pid;
  j->pidfd = r->pidfd;
  j->n = n;
  j->npieces = n >= PROCESS_READ_SPLIT_MIN ? PROCESS_READ_PIECES : 1;
  if (hold) {
    j->hold = *hold; /* the read's from here */
    *hold = (reg_later){0};
  }
  split(j);
  regions_cond_init(&j->cv);
  pthread_mutex_unlock(&t->mu);
  /* waited for until a deadline: a read that never ends keeps its threads
   * (and its slot), never this worker */
  start_pieces(j);
  struct timespec deadline;
  clock_gettime(CLOCK_MONOTONIC, &deadline);
  deadline.tv_sec += PROCESS_READ_DEADLINE_MS / 1000;
  pthread_mutex_lock(&t->mu);
  while (!j->done && pthread_cond_timedwait(&j->cv, &t->mu, &deadline) == 0) {
  }
  if (!j->done) {
    /* what it holds stays its tenant's to pay for, whatever becomes of the
     * request (the job's end, under mu too, gives it back) */
    give_up(t, j);
    pthread_mutex_unlock(&t->mu);
    *stuck = true;
    if (write)
      return tport_err_set(err, TPORT_DEADLINE_EXCEEDED,
                           "the client's memory at 0x%llx (+%zu bytes) was not written in %d s: "
                           "given up, though the write may still land there (memory that pages "
                           "in slowly: TPORT_SHM_DIRECT=0 gets through the shared region instead)",
                           (unsigned long long)m->seg[0].addr, n, PROCESS_READ_DEADLINE_MS / 1000);
    return tport_err_set(err, TPORT_DEADLINE_EXCEEDED,
                         "the client's memory at 0x%llx (+%zu bytes%s) was not read in %d s: "
                         "given up (memory that pages in slowly: TPORT_SHM_DIRECT=0 puts "
                         "through the shared region instead)",
                         (unsigned long long)m->seg[0].addr, n,
                         m->nseg > 1 ? " in several runs" : "",
                         PROCESS_READ_DEADLINE_MS / 1000);
  }
  pthread_mutex_unlock(&t->mu);
  rc = j->rc;
  if (rc)
    *err = j->err;
  for (size_t i = 0; m->bad && i < m->nseg; i++)
    m->bad[i] = atomic_load(&j->bad[i]);
  m->fence_held = j->fence_held;
  job_free(j);
  return rc;
}

int shm_process_read_segs(shm_table *t, uint32_t pipe, uint64_t id, shm_read_many *m,
                          reg_later *hold, bool *stuck, tport_err *err)
{
  return process_job(t, pipe, id, m, false, hold, stuck, err);
}

int shm_process_write(shm_table *t, uint32_t pipe, uint64_t id, uint64_t addr, const void *src,
                      size_t n, tport_tensor *keep, reg_later *hold, size_t keep_bytes, bool *stuck,
                      tport_err *err)
{
  /* (a run's dst is the local side: here what is written) */
  shm_read_seg one = {.addr = addr, .dst = (uint8_t *)(uintptr_t)src, .n = n};
  shm_read_many m = {.seg = &one, .nseg = 1, .keep = &keep, .nkeep = 1, .keep_bytes = keep_bytes};
  return process_job(t, pipe, id, &m, true, hold, stuck, err);
}

int shm_process_write_segs(shm_table *t, uint32_t pipe, uint64_t id, shm_read_many *m,
                           reg_later *hold, bool *stuck, tport_err *err)
{
  m->fence_addr = 0; /* a write has none */
  return process_job(t, pipe, id, m, true, hold, stuck, err);
}
