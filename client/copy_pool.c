/*
 * copy_pool.c: libtport's threads for copying large buffers.
 *
 * On the same host a tport_put copies the caller's bytes into the client's
 * automatic region and a tport_get copies them out of it (shm.c, ops.c);
 * tportd's side of the transfer is already a threaded copy, so one memcpy
 * on the client's side was the bottleneck (a few GB/s against tens).  This
 * pool splits such a copy across a few threads of libtport's own: pthreads
 * only (libtport stays dependency-light, and the CPU kernels' pool is the
 * server's: client/ may not use kernels/).
 *
 * - Lazy: no thread exists until the first copy of COPY_POOL_MIN_BYTES or
 *   more; a program that never makes one never starts one.
 * - Bounded: copy_pool_threads() threads in all, the caller included.
 * - One job at a time: the caller publishes its job, the workers and the
 *   caller take pieces from an atomic counter, and the caller waits until
 *   every piece is done.  A second copy that finds the pool busy (another
 *   client thread, another client) is one memcpy in its own thread instead
 *   of waiting: no deadlock, no queue, and the two copies still run side by
 *   side.
 * - Streams: a job its caller does not wait for at once -- the copy into
 *   the region of a put sent chunk by chunk (the caller waits for each
 *   chunk's bytes), or out of it for a get (gated: a piece is taken only
 *   once the caller supplied its source bytes).  Pieces are taken in
 *   order; a stream holds the pool until its end, takes three quarters of
 *   its threads, and its end returns only once no piece is being copied.
 * - Exit and dlclose: a destructor stops and joins the workers (a worker
 *   must not outlive the code it runs, and nothing is left for valgrind).
 *   A copy that starts after that is one memcpy.
 * - fork: the child has none of the workers.  The prepare handler waits
 *   for a running copy or stream to finish (it holds the pool while the
 *   process is copied), so the child inherits an idle pool with no job; the child
 *   handler forgets the parent's workers, and the child's first large copy
 *   starts its own.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "copy_pool.h"
#include "copy_stream.h"
#include "env.h"

#define PAGE ((size_t)4096)

/* ---------------------------------------------------------------- the split */

void copy_split_make(copy_split *s, uintptr_t dst, size_t n, size_t want_pieces)
{
  if (want_pieces < 1)
    want_pieces = 1;
  s->n = n;
  s->head = (PAGE - (size_t)(dst % PAGE)) % PAGE;
  size_t piece = n / want_pieces + (n % want_pieces != 0);
  /* whole pages; a piece too large to round is the whole copy anyway */
  if (piece > SIZE_MAX - (PAGE - 1))
    piece = SIZE_MAX - (PAGE - 1);
  piece = (piece + PAGE - 1) & ~(PAGE - 1);
  if (piece == 0)
    piece = PAGE;
  s->piece = piece;
  /* piece 0 is [0, head + piece); then pieces of piece bytes; the last
   * takes what is left.  head + piece is computed only once it is < n. */
  if (n <= s->head || n - s->head <= piece) {
    s->npieces = 1;
    return;
  }
  size_t rest = n - s->head - piece; /* > 0 */
  s->npieces = 1 + rest / piece + (rest % piece != 0);
}

void copy_split_piece(const copy_split *s, size_t k, size_t *off, size_t *len)
{
  if (s->npieces == 1) {
    *off = 0;
    *len = s->n;
    return;
  }
  if (k == 0) {
    *off = 0;
    *len = s->head + s->piece;
    return;
  }
  /* k < npieces: (k - 1) * piece < n - head - piece, so nothing overflows */
  size_t o = s->head + s->piece + (k - 1) * s->piece;
  *off = o;
  *len = s->n - o < s->piece ? s->n - o : s->piece;
}

/* ---------------------------------------------------------------- the pool */

typedef struct copy_job {
  uint8_t *dst;
  const uint8_t *src;
  copy_split split;
  atomic_size_t next; /* the next piece to take */
  atomic_size_t done; /* pieces copied */
  /* a stream's (else NULL / false): which pieces are copied, whether its
   * caller waits for one, and whether pieces may still be taken */
  atomic_uchar *piece_done;
  atomic_bool waiting;
  atomic_bool stopped;
  /* a gated stream's: bytes [0, avail) of src may be read (else SIZE_MAX) */
  atomic_size_t avail;
  bool gated;
  bool nt; /* non-temporal stores (a copy out: copy_pool_copy_out) */
  int seats; /* workers that may still join it (pool.mu) */
} copy_job;

static struct {
  pthread_once_t once;
  pthread_mutex_t busy; /* held by the caller whose job or stream runs (and across fork) */
  pthread_mutex_t mu;   /* everything below */
  pthread_cond_t work, finished, supplied;
  copy_job *job;       /* the job running (a copy's on its caller's stack, a
                        * stream's on the heap); NULL: none */
  uint64_t generation; /* bumped for every job published */
  int active;          /* workers holding a pointer to job */
  int nworkers;        /* workers started (and not yet joined) */
  int nthreads;        /* threads a copy uses, the caller included */
  bool threads_set;    /* ... as TPORT_COPY_THREADS says */
  bool stopping;       /* the destructor ran: no more workers, no more jobs */
  pthread_t workers[COPY_POOL_MAX_THREADS];
} pool = {.once = PTHREAD_ONCE_INIT,
          .busy = PTHREAD_MUTEX_INITIALIZER,
          .mu = PTHREAD_MUTEX_INITIALIZER,
          .work = PTHREAD_COND_INITIALIZER,
          .finished = PTHREAD_COND_INITIALIZER,
          .supplied = PTHREAD_COND_INITIALIZER};

static void wake_finished(void)
{
  pthread_mutex_lock(&pool.mu);
  pthread_cond_broadcast(&pool.finished);
  pthread_mutex_unlock(&pool.mu);
}

/* Whether piece k of a gated job may be read now. */
static bool piece_supplied(copy_job *j, size_t k)
{
  size_t off, len;
  copy_split_piece(&j->split, k, &off, &len);
  return off + len <= atomic_load(&j->avail);
}

/* Takes the next piece of j into *k; false when there is none to take
 * (all taken, the job stopped, or a gated job's next not supplied yet). */
static bool take_piece(copy_job *j, size_t *k)
{
  if (atomic_load_explicit(&j->stopped, memory_order_acquire))
    return false;
  if (!j->gated) {
    *k = atomic_fetch_add(&j->next, 1);
    return *k < j->split.npieces;
  }
  size_t next = atomic_load(&j->next);
  do {
    if (next >= j->split.npieces || !piece_supplied(j, next))
      return false;
  } while (!atomic_compare_exchange_weak(&j->next, &next, next + 1));
  *k = next;
  return true;
}

/* Copies piece k of j; false when there is none to take. */
static bool run_one(copy_job *j)
{
  size_t k;
  if (!take_piece(j, &k))
    return false;
  size_t off, len;
  copy_split_piece(&j->split, k, &off, &len);
  if (j->nt)
    memcpy_stream(j->dst + off, j->src + off, len);
  else
    memcpy(j->dst + off, j->src + off, len);
  /* seq_cst, as the waiter's flag: either this thread sees it waiting
   * (and wakes it) or the waiter sees this piece done */
  if (j->piece_done)
    atomic_store(&j->piece_done[k], 1);
  if (atomic_fetch_add(&j->done, 1) + 1 == j->split.npieces ||
      (j->piece_done && atomic_load(&j->waiting)))
    wake_finished();
  return true;
}

static void run_pieces(copy_job *j)
{
  while (run_one(j))
    ;
}

/* arg: the generation before the job its creator is about to publish (the
 * worker must not take that job for one it has seen). */
static void *worker_main(void *arg)
{
  prctl(PR_SET_NAME, "tport:copy"); /* what top -H, perf and gdb show */
  uint64_t seen = (uint64_t)(uintptr_t)arg;
  pthread_mutex_lock(&pool.mu);
  for (;;) {
    while (pool.generation == seen && !pool.stopping)
      pthread_cond_wait(&pool.work, &pool.mu);
    if (pool.stopping)
      break; /* a job running now is finished by its caller */
    seen = pool.generation;
    copy_job *j = pool.job;
    if (!j || j->seats <= 0)
      continue; /* woke after that job was done, or it has its threads */
    j->seats--;
    pool.active++;
    pthread_mutex_unlock(&pool.mu);
    run_pieces(j);
    pthread_mutex_lock(&pool.mu);
    /* a gated stream's worker stays for the pieces still to be supplied */
    while (j->gated && !atomic_load(&j->stopped) && !pool.stopping &&
           atomic_load(&j->next) < j->split.npieces) {
      if (!piece_supplied(j, atomic_load(&j->next))) {
        pthread_cond_wait(&pool.supplied, &pool.mu);
        continue;
      }
      pthread_mutex_unlock(&pool.mu);
      run_pieces(j);
      pthread_mutex_lock(&pool.mu);
    }
    if (--pool.active == 0)
      pthread_cond_broadcast(&pool.finished);
  }
  pthread_mutex_unlock(&pool.mu);
  return NULL;
}

static void atfork_prepare(void)
{
  /* busy first, as a copy takes them: fork waits for a running copy */
  pthread_mutex_lock(&pool.busy);
  pthread_mutex_lock(&pool.mu);
}

static void atfork_parent(void)
{
  pthread_mutex_unlock(&pool.mu);
  pthread_mutex_unlock(&pool.busy);
}

static void atfork_child(void)
{
  /* the parent's workers do not exist here (their waits on work are
   * forgotten with fresh condition variables); no job was running */
  pool.nworkers = 0;
  pool.active = 0;
  pool.job = NULL;
  pthread_cond_init(&pool.work, NULL);
  pthread_cond_init(&pool.finished, NULL);
  pthread_cond_init(&pool.supplied, NULL);
  pthread_mutex_unlock(&pool.mu);
  pthread_mutex_unlock(&pool.busy);
}

/* The CPUs this process may run on (its affinity mask: taskset, a
 * container's cpuset), else the CPUs online. */
static int cpu_count(void)
{
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
    return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (n > COPY_POOL_MAX_THREADS ? COPY_POOL_MAX_THREADS : (int)n) : 1;
}

static void pool_init(void)
{
  int n = cpu_count();
  if (n > COPY_POOL_DEFAULT_MAX)
    n = COPY_POOL_DEFAULT_MAX;
  uint64_t v; /* tport_connect refuses a value that does not parse (env.c) */
  if (client_env_count("TPORT_COPY_THREADS", &v, NULL) == TPORT_OK && v) {
    n = v > COPY_POOL_MAX_THREADS ? COPY_POOL_MAX_THREADS : (int)v;
    pool.threads_set = true;
  }
  pool.nthreads = n;
  pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
}

int copy_pool_threads(void)
{
  pthread_once(&pool.once, pool_init);
  return pool.nthreads;
}

/* Starts workers up to want (mu held).  A worker blocks every signal: the
 * application's signals go to its own threads, as it arranged them. */
static void pool_grow(int want)
{
  if (pool.nworkers >= want)
    return;
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  while (pool.nworkers < want) {
    if (pthread_create(&pool.workers[pool.nworkers], NULL, worker_main,
                       (void *)(uintptr_t)pool.generation) != 0)
      break; /* fewer workers: the caller takes the pieces they would have */
    pool.nworkers++;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* One copy in the calling thread. */
static void copy_here(void *dst, const void *src, size_t n, bool nt)
{
  if (nt)
    memcpy_stream(dst, src, n);
  else
    memcpy(dst, src, n);
}

static void copy_any(void *dst, const void *src, size_t n, bool nt)
{
  if (n < COPY_POOL_MIN_BYTES || copy_pool_threads() <= 1 ||
      pthread_mutex_trylock(&pool.busy) != 0) {
    copy_here(dst, src, n, nt);
    return;
  }
  int threads = pool.nthreads;
  /* a few pieces per thread (a thread the scheduler holds back costs one
   * piece, not its share), none below COPY_POOL_MIN_PIECE */
  size_t want = (size_t)threads * 4, most = n / COPY_POOL_MIN_PIECE;
  copy_job j = {.dst = dst, .src = src, .seats = threads - 1, .nt = nt};
  copy_split_make(&j.split, (uintptr_t)dst, n, want < most ? want : most);
  atomic_init(&j.next, 0);
  atomic_init(&j.done, 0);
  pthread_mutex_lock(&pool.mu);
  if (!pool.stopping)
    pool_grow(threads - 1);
  if (pool.stopping || pool.nworkers == 0 || j.split.npieces < 2) {
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool.busy);
    copy_here(dst, src, n, nt);
    return;
  }
  pool.job = &j;
  pool.generation++;
  pthread_cond_broadcast(&pool.work);
  pthread_mutex_unlock(&pool.mu);
  run_pieces(&j);
  pthread_mutex_lock(&pool.mu);
  /* j lives on this stack: wait for the last piece and the last worker */
  while (atomic_load(&j.done) < j.split.npieces || pool.active > 0)
    pthread_cond_wait(&pool.finished, &pool.mu);
  pool.job = NULL; /* a worker waking late finds no job */
  pthread_mutex_unlock(&pool.mu);
  pthread_mutex_unlock(&pool.busy);
}

void copy_pool_copy(void *dst, const void *src, size_t n)
{
  copy_any(dst, src, n, false);
}

void copy_pool_copy_out(void *dst, const void *src, size_t n, size_t total)
{
  copy_any(dst, src, n, total >= COPY_POOL_OUT_STREAM_MIN);
}

/* ---------------------------------------------------------------- streams */

/* A stream's pieces: small enough that the copied prefix grows steadily
 * (the caller sends a chunk as soon as it is in), large enough to outweigh
 * a thread's wake-up, and at most STREAM_MAX_PIECES of them. */
#define STREAM_MAX_PIECES 4096

/* A stream's threads, its caller's included: the pool's when
 * TPORT_COPY_THREADS says how many, else three quarters of them.  A stream
 * runs while its caller sends and a server on this host writes or reads
 * the region; on a 16-core H200 host (bench/RESULTS.md, twelfth session)
 * the automatic region to and from cuda:0 at 256 MiB ran at 0.55-0.56x
 * the explicit region with 8 threads, 0.62 (put) and 0.64 (get) with 12,
 * and 0.45-0.49 (put) with 16: every core copying, tportd's threads
 * starve. */
static int stream_threads(void)
{
  int n = pool.nthreads;
  if (pool.threads_set)
    return n;
  int most = n * 3 / 4;
  return most > 2 ? most : 2; /* a stream begins only where the pool has 2 or more */
}

static bool stream_begin(copy_stream *s, void *dst, const void *src, size_t n, bool gated,
                         size_t total)
{
  /* a gated stream is a get's copy out (of total bytes in all) */
  s->job = NULL;
  s->ready = 0;
  if (n < COPY_POOL_MIN_BYTES || copy_pool_threads() <= 1 || pthread_mutex_trylock(&pool.busy) != 0)
    return false;
  size_t want = n / COPY_POOL_MIN_PIECE;
  if (want > STREAM_MAX_PIECES)
    want = STREAM_MAX_PIECES;
  copy_job *j = calloc(1, sizeof *j);
  if (j) {
    j->dst = dst;
    j->src = src;
    j->nt = gated && total >= COPY_POOL_OUT_STREAM_MIN;
    copy_split_make(&j->split, (uintptr_t)dst, n, want);
    j->piece_done = calloc(j->split.npieces, sizeof *j->piece_done);
  }
  pthread_mutex_lock(&pool.mu);
  if (j && j->piece_done && !pool.stopping)
    pool_grow(pool.nthreads - 1);
  if (!j || !j->piece_done || pool.stopping || pool.nworkers == 0 || j->split.npieces < 2) {
    pthread_mutex_unlock(&pool.mu);
    pthread_mutex_unlock(&pool.busy);
    if (j)
      free((void *)j->piece_done);
    free(j);
    return false;
  }
  atomic_init(&j->next, 0);
  atomic_init(&j->done, 0);
  atomic_init(&j->waiting, false);
  atomic_init(&j->stopped, false);
  atomic_init(&j->avail, gated ? 0 : SIZE_MAX);
  j->gated = gated;
  j->seats = stream_threads() - 1;
  pool.job = j;
  pool.generation++;
  pthread_cond_broadcast(&pool.work);
  pthread_mutex_unlock(&pool.mu);
  s->job = j;
  return true;
}

bool copy_pool_stream_begin(copy_stream *s, void *dst, const void *src, size_t n)
{
  return stream_begin(s, dst, src, n, false, 0);
}

bool copy_pool_stream_begin_gated(copy_stream *s, void *dst, const void *src, size_t n,
                                  size_t total)
{
  return stream_begin(s, dst, src, n, true, total > n ? total : n);
}

void copy_pool_stream_supply(copy_stream *s, size_t upto)
{
  copy_job *j = s->job;
  if (!j || !j->gated)
    return;
  if (upto > j->split.n)
    upto = j->split.n;
  if (upto <= atomic_load(&j->avail))
    return;
  atomic_store(&j->avail, upto);
  pthread_mutex_lock(&pool.mu);
  pthread_cond_broadcast(&pool.supplied);
  pthread_mutex_unlock(&pool.mu);
}

/* Moves s->ready over the pieces copied from it on. */
static void advance(copy_stream *s)
{
  copy_job *j = s->job;
  while (s->ready < j->split.n) {
    /* the piece holding byte ready starts there (pieces tile the copy) */
    size_t k = s->ready < j->split.head + j->split.piece || j->split.npieces == 1
                   ? 0
                   : 1 + (s->ready - j->split.head - j->split.piece) / j->split.piece;
    if (!atomic_load(&j->piece_done[k]))
      return;
    size_t off, len;
    copy_split_piece(&j->split, k, &off, &len);
    s->ready = off + len;
  }
}

void copy_pool_stream_wait(copy_stream *s, size_t upto)
{
  copy_job *j = s->job;
  if (!j)
    return;
  if (upto > j->split.n)
    upto = j->split.n;
  /* a gated stream's bytes past what was supplied could never be copied */
  if (upto > atomic_load(&j->avail))
    upto = atomic_load(&j->avail);
  advance(s);
  while (s->ready < upto) {
    /* a piece of our own rather than wait idle; once none is left to
     * take, wait for the ones being copied */
    if (!run_one(j)) {
      pthread_mutex_lock(&pool.mu);
      atomic_store(&j->waiting, true);
      advance(s);
      while (s->ready < upto) {
        pthread_cond_wait(&pool.finished, &pool.mu);
        advance(s);
      }
      atomic_store(&j->waiting, false);
      pthread_mutex_unlock(&pool.mu);
    }
    advance(s);
  }
}

void copy_pool_stream_end(copy_stream *s, bool finish)
{
  copy_job *j = s->job;
  if (!j)
    return;
  if (finish) {
    copy_pool_stream_supply(s, j->split.n); /* finishing says it is all there */
    run_pieces(j);                          /* the caller helps with what is left */
  }
  atomic_store_explicit(&j->stopped, true, memory_order_release);
  pthread_mutex_lock(&pool.mu);
  pthread_cond_broadcast(&pool.supplied); /* a gated stream's workers leave */
  /* no piece starts now; the job is freed once no worker holds it */
  while (pool.active > 0 || (finish && atomic_load(&j->done) < j->split.npieces))
    pthread_cond_wait(&pool.finished, &pool.mu);
  pool.job = NULL;
  pthread_mutex_unlock(&pool.mu);
  pthread_mutex_unlock(&pool.busy);
  free((void *)j->piece_done);
  free(j);
  s->job = NULL;
  s->ready = 0;
}

/* At exit (and dlclose): the workers stop and are joined.  A job running
 * in another thread is finished by its caller. */
__attribute__((destructor)) static void copy_pool_stop(void)
{
  pthread_t ids[COPY_POOL_MAX_THREADS];
  pthread_mutex_lock(&pool.mu);
  pool.stopping = true;
  int n = pool.nworkers;
  memcpy(ids, pool.workers, (size_t)n * sizeof *ids);
  pool.nworkers = 0;
  pthread_cond_broadcast(&pool.work);
  /* a gated stream's workers too: its owner copies what is left */
  pthread_cond_broadcast(&pool.supplied);
  pthread_mutex_unlock(&pool.mu);
  for (int i = 0; i < n; i++)
    pthread_join(ids[i], NULL);
}
