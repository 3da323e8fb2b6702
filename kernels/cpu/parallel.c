/*
 * parallel.c: the thread pool behind the CPU kernels.
 *
 * One job runs at a time: the caller publishes it, the workers and the
 * caller take pieces from an atomic counter, and the caller waits until every
 * piece is done.  A second caller that finds the pool busy (another engine
 * thread, a sim stream worker, a nested call) runs its job inline instead of
 * waiting: no deadlock, and no unbounded queue.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "cpu_kernels.h"

#define POOL_MAX_THREADS 256

typedef struct pool_job {
  parallel_fn fn;
  void *ctx;
  int64_t n, piece;
  int64_t npieces;
  atomic_int_fast64_t next;
  atomic_int_fast64_t done;
} pool_job;

static struct {
  pthread_once_t once;
  pthread_mutex_t busy; /* held by the caller whose job is running */
  pthread_mutex_t mu;
  pthread_cond_t work, finished;
  pool_job *job;
  uint64_t generation;
  int active;   /* workers holding a pointer to the current job */
  int nworkers; /* threads started */
  int nthreads; /* threads used, caller included */
} pool = {.once = PTHREAD_ONCE_INIT,
          .busy = PTHREAD_MUTEX_INITIALIZER,
          .mu = PTHREAD_MUTEX_INITIALIZER,
          .work = PTHREAD_COND_INITIALIZER,
          .finished = PTHREAD_COND_INITIALIZER};

static void run_pieces(pool_job *j)
{
  for (;;) {
    int64_t k = atomic_fetch_add(&j->next, 1);
    if (k >= j->npieces)
      return;
    int64_t b = k * j->piece, e = b + j->piece < j->n ? b + j->piece : j->n;
    j->fn(j->ctx, b, e);
    if (atomic_fetch_add(&j->done, 1) + 1 == j->npieces) {
      pthread_mutex_lock(&pool.mu);
      pthread_cond_broadcast(&pool.finished);
      pthread_mutex_unlock(&pool.mu);
    }
  }
}

static void *worker_main(void *arg)
{
  prctl(PR_SET_NAME, "tport:kernel"); /* what top -H, perf and gdb show */
  (void)arg;
  uint64_t seen = 0;
  for (;;) {
    pthread_mutex_lock(&pool.mu);
    while (pool.generation == seen)
      pthread_cond_wait(&pool.work, &pool.mu);
    seen = pool.generation;
    pool_job *j = pool.job;
    if (!j) {
      pthread_mutex_unlock(&pool.mu);
      continue;
    }
    pool.active++;
    pthread_mutex_unlock(&pool.mu);
    run_pieces(j);
    pthread_mutex_lock(&pool.mu);
    if (--pool.active == 0)
      pthread_cond_broadcast(&pool.finished);
    pthread_mutex_unlock(&pool.mu);
  }
  return NULL;
}

static void pool_init(void)
{
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int n = ncpu > 0 ? (int)ncpu : 1;
  const char *env = getenv("TPORT_NUM_THREADS");
  if (env && atoi(env) > 0)
    n = atoi(env);
  if (n > POOL_MAX_THREADS)
    n = POOL_MAX_THREADS;
  pool.nthreads = n;
}

/* Workers start on first use, up to the number of threads wanted. */
static void pool_grow(int want_workers)
{
  while (pool.nworkers < want_workers) {
    pthread_t t;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, worker_main, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0)
      break; /* fewer workers: the caller still does all the work */
    pool.nworkers++;
  }
}

int parallel_num_threads(void)
{
  pthread_once(&pool.once, pool_init);
  return pool.nthreads;
}

void parallel_set_num_threads(int n)
{
  pthread_once(&pool.once, pool_init);
  pthread_mutex_lock(&pool.busy);
  pool.nthreads = n < 1 ? 1 : n > POOL_MAX_THREADS ? POOL_MAX_THREADS : n;
  pthread_mutex_unlock(&pool.busy);
}

void parallel_for(int64_t n, int64_t grain, parallel_fn fn, void *ctx)
{
  if (n <= 0)
    return;
  pthread_once(&pool.once, pool_init);
  if (grain < 1)
    grain = 1;
  if (pool.nthreads <= 1 || n <= grain || pthread_mutex_trylock(&pool.busy) != 0) {
    fn(ctx, 0, n);
    return;
  }
  int threads = pool.nthreads;
  pool_grow(threads - 1);
  /* Pieces: a few per thread for balance, never smaller than the grain. */
  int64_t npieces = (int64_t)threads * 4;
  if (npieces > n / grain)
    npieces = n / grain;
  if (npieces < 1)
    npieces = 1;
  pool_job j = {.fn = fn, .ctx = ctx, .n = n};
  j.piece = (n + npieces - 1) / npieces;
  j.npieces = (n + j.piece - 1) / j.piece;
  atomic_init(&j.next, 0);
  atomic_init(&j.done, 0);
  pthread_mutex_lock(&pool.mu);
  pool.job = &j;
  pool.generation++;
  pthread_cond_broadcast(&pool.work);
  pthread_mutex_unlock(&pool.mu);
  run_pieces(&j);
  pthread_mutex_lock(&pool.mu);
  /* j lives on this stack: wait for the last piece and the last worker. */
  while (atomic_load(&j.done) < j.npieces || pool.active > 0)
    pthread_cond_wait(&pool.finished, &pool.mu);
  pool.job = NULL; /* a worker waking late finds no job */
  pthread_mutex_unlock(&pool.mu);
  pthread_mutex_unlock(&pool.busy);
}
