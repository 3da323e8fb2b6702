/*
 * backend_sim.c: N simulated GPUs.
 *
 * It exists so that the engine's ordering logic (events, staging reuse, D2D
 * synchronization, non_blocking) is exercised on machines without a GPU, and
 * so that clients can be developed against a multi-GPU server anywhere.  It
 * behaves like CUDA where the engine relies on it:
 *  - device memory is reachable only through backend calls: a device address
 *    is the host address with a tag in its top byte, so dereferencing it
 *    faults, and every call checks that a pointer is memory of the right
 *    device (or of a peer whose access was enabled);
 *  - each stream is a worker thread running its ops in order, after an
 *    optional random delay (sim_set_delay) that makes missing events show;
 *  - events: record / wait on another stream / query / synchronize, with
 *    CUDA's rule that a never-recorded event is complete;
 *  - an event belongs to the device it was created for and a kernel runs on
 *    the stream of its own device: recording an event on another device's
 *    stream, or launching a kernel for a device on a stream of another, is
 *    refused as CUDA refuses it (cudaErrorInvalidResourceHandle, which the
 *    cuda backend reports as INTERNAL), so that an engine that mixes them up
 *    fails here and not first on a GPU.  Waiting on another device's event
 *    is allowed, as in CUDA;
 *  - peer access is possible per pair (sim_set_peer_possible) and enabled
 *    explicitly; a kernel touching a peer's memory without it fails;
 *  - device memory is bounded (sim_config.mem_bytes); managed memory counts
 *    against its device and is refused beyond what is free.
 * Where it deliberately differs from CUDA:
 *  - "pinned" host memory is ordinary memory, locked where the limit allows
 *    (allocating and freeing it cost what they cost CUDA: sim_host_alloc),
 *    and a pageable host pointer in an async copy is not synchronized the way CUDA does it (the engine never
 *    relies on that: it stages pageable memory through pinned blocks);
 *  - managed memory is host memory: prefetch only costs a delay and records
 *    the location, page faults and oversubscription are not simulated;
 *  - errors are reported at enqueue time, never asynchronously (no sticky
 *    errors); events carry no timing.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "cpu_kernels.h"
#include "host_cache.h"

#define SIM_MAX_DEVICES 16
#define SIM_TAG ((uintptr_t)0x5A << 56)
#define SIM_TAG_MASK ((uintptr_t)0xFF << 56)

typedef enum { OP_MEMCPY, OP_KERNEL, OP_MARK, OP_WAIT, OP_HOSTFN, OP_PREFETCH, OP_STOP } op_kind;

struct be_event {
  int dev; /* the device it was created for */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t recorded, completed;
  atomic_int refs; /* the owner's plus one per queued op */
};

typedef struct sim_op {
  op_kind kind;
  struct sim_op *next;
  union {
    struct {
      void *dst;
      const void *src;
      size_t n;
    } copy;
    struct {
      plan p;
      void *dst;
      const void *src;
      tport_dtype dt, st;
      unsigned flags;
    } kernel;
    struct {
      be_event *ev;
      uint64_t seq;
    } event;
    struct {
      be_host_fn fn;
      void *arg;
    } host;
  } u;
} sim_op;

struct be_stream {
  int dev;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  sim_op *head, *tail;
  uint64_t enqueued, completed;
  unsigned rng;
};

typedef struct sim_alloc {
  uintptr_t base; /* host address */
  size_t size;
  int dev;
  bool managed;
  int location; /* managed: device index, -1 host */
} sim_alloc;

static struct {
  pthread_mutex_t mu;
  int ndevices;
  size_t mem_bytes;
  size_t used[SIM_MAX_DEVICES];
  size_t peak[SIM_MAX_DEVICES]; /* the most used has been since sim_reset_peak */
  bool peer_possible[SIM_MAX_DEVICES][SIM_MAX_DEVICES];
  bool peer_enabled[SIM_MAX_DEVICES][SIM_MAX_DEVICES];
  be_stream *streams[SIM_MAX_DEVICES];
  sim_alloc *allocs; /* sorted by base */
  int nallocs, cap;
  atomic_uint max_delay_us;
  atomic_uint min_delay_us;
  unsigned seed;
} sim = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* ---------------------------------------------------------------- memory map */

static uintptr_t untag(const void *p)
{
  return (uintptr_t)p & ~SIM_TAG_MASK;
}
static bool is_tagged(const void *p)
{
  return ((uintptr_t)p & SIM_TAG_MASK) == SIM_TAG;
}

/* Index of the allocation containing [addr, addr+n); -1 if none. mu held. */
static int find_alloc(uintptr_t addr, size_t n)
{
  int lo = 0, hi = sim.nallocs - 1, hit = -1;
  while (lo <= hi) {
    int mid = (lo + hi) / 2;
    if (sim.allocs[mid].base <= addr) {
      hit = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  if (hit < 0)
    return -1;
  const sim_alloc *a = &sim.allocs[hit];
  if (addr + n > a->base + a->size || addr + n < addr)
    return -1;
  return hit;
}

static int add_alloc(sim_alloc a)
{
  if (sim.nallocs == sim.cap) {
    int cap = sim.cap ? sim.cap * 2 : 64;
    sim_alloc *n = realloc(sim.allocs, (size_t)cap * sizeof *n);
    if (!n)
      return -1;
    sim.allocs = n;
    sim.cap = cap;
  }
  int i = sim.nallocs;
  while (i > 0 && sim.allocs[i - 1].base > a.base) {
    sim.allocs[i] = sim.allocs[i - 1];
    i--;
  }
  sim.allocs[i] = a;
  sim.nallocs++;
  return 0;
}

/* Resolves a pointer used by work on device `dev`: its device memory, a
 * peer's with access enabled, or managed memory.  Returns the host address. */
static int resolve_device(int dev, const void *p, size_t n, const char *what, void **out,
                          tport_err *err)
{
  pthread_mutex_lock(&sim.mu);
  int i = find_alloc(untag(p), n ? n : 1);
  int rc = TPORT_OK;
  if (i < 0) {
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT,
                       "sim:%d: %s (%zu bytes) is not sim device memory", dev, what, n);
  } else {
    const sim_alloc *a = &sim.allocs[i];
    if (!a->managed && !is_tagged(p))
      rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "sim:%d: %s is an untagged alias", dev,
                         what);
    else if (!a->managed && a->dev != dev && !sim.peer_enabled[dev][a->dev])
      rc = tport_err_set(err, TPORT_FAILED_PRECONDITION,
                         "sim:%d: %s is memory of sim:%d and peer access %d->%d is not enabled",
                         dev, what, a->dev, dev, a->dev);
  }
  pthread_mutex_unlock(&sim.mu);
  if (rc == TPORT_OK)
    *out = (void *)untag(p);
  return rc;
}

/* A host pointer must not be sim device memory (managed memory is both). */
static int resolve_host(const void *p, size_t n, const char *what, void **out, tport_err *err)
{
  if (is_tagged(p)) {
    pthread_mutex_lock(&sim.mu);
    int i = find_alloc(untag(p), n ? n : 1);
    pthread_mutex_unlock(&sim.mu);
    (void)i;
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "sim: %s is device memory, not host",
                         what);
  }
  *out = (void *)p;
  return TPORT_OK;
}

/* ---------------------------------------------------------------- streams */

static void event_unref(be_event *e)
{
  if (atomic_fetch_sub(&e->refs, 1) == 1) {
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
  }
}

static void sim_delay(be_stream *s)
{
  unsigned max = atomic_load(&sim.max_delay_us), min = atomic_load(&sim.min_delay_us);
  if (!max)
    return;
  if (min > max)
    min = max;
  unsigned us = min + (unsigned)(rand_r(&s->rng) % (max - min + 1));
  struct timespec ts = {us / 1000000, (long)(us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static void run_op(be_stream *s, sim_op *op)
{
  switch (op->kind) {
  case OP_MEMCPY:
    sim_delay(s);
    memmove(op->u.copy.dst, op->u.copy.src, op->u.copy.n);
    break;
  case OP_KERNEL:
    sim_delay(s);
    cpu_copy(&op->u.kernel.p, op->u.kernel.dst, op->u.kernel.dt, op->u.kernel.src, op->u.kernel.st,
             op->u.kernel.flags);
    break;
  case OP_MARK: {
    be_event *e = op->u.event.ev;
    pthread_mutex_lock(&e->mu);
    if (op->u.event.seq > e->completed)
      e->completed = op->u.event.seq;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    event_unref(e);
    break;
  }
  case OP_WAIT: {
    be_event *e = op->u.event.ev;
    pthread_mutex_lock(&e->mu);
    while (e->completed < op->u.event.seq)
      pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    event_unref(e);
    break;
  }
  case OP_HOSTFN:
    sim_delay(s);
    op->u.host.fn(op->u.host.arg);
    break;
  case OP_PREFETCH: sim_delay(s); break;
  case OP_STOP: break;
  }
}

static void *stream_main(void *arg)
{
  be_stream *s = arg;
  for (;;) {
    pthread_mutex_lock(&s->mu);
    while (!s->head)
      pthread_cond_wait(&s->cv, &s->mu);
    sim_op *op = s->head;
    s->head = op->next;
    if (!s->head)
      s->tail = NULL;
    pthread_mutex_unlock(&s->mu);
    op_kind kind = op->kind;
    run_op(s, op);
    free(op);
    pthread_mutex_lock(&s->mu);
    s->completed++;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    if (kind == OP_STOP)
      return NULL;
  }
}

static int enqueue(be_stream *s, sim_op *op)
{
  op->next = NULL;
  pthread_mutex_lock(&s->mu);
  if (s->tail)
    s->tail->next = op;
  else
    s->head = op;
  s->tail = op;
  s->enqueued++;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return TPORT_OK;
}

static sim_op *new_op(op_kind kind, tport_err *err)
{
  sim_op *op = calloc(1, sizeof *op);
  if (!op)
    tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "sim: out of host memory for a stream op");
  else
    op->kind = kind;
  return op;
}

static int stream_start(int dev, be_stream **out, tport_err *err)
{
  be_stream *s = calloc(1, sizeof *s);
  if (!s)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "sim: out of host memory for a stream");
  s->dev = dev;
  s->rng = sim.seed * 2654435761u + (unsigned)dev * 40503u + (unsigned)(uintptr_t)s;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->cv, NULL);
  if (pthread_create(&s->thread, NULL, stream_main, s) != 0) {
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "sim: cannot start a stream thread");
  }
  *out = s;
  return TPORT_OK;
}

static void stream_stop(be_stream *s)
{
  sim_op *op = calloc(1, sizeof *op);
  if (op) {
    op->kind = OP_STOP;
    enqueue(s, op);
    pthread_join(s->thread, NULL);
  }
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

/* ---------------------------------------------------------------- config */

int sim_configure(const sim_config *cfg, tport_err *err)
{
  if (cfg->ndevices < 0 || cfg->ndevices > SIM_MAX_DEVICES)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "sim: %d devices: the limit is %d",
                         cfg->ndevices, SIM_MAX_DEVICES);
  pthread_mutex_lock(&sim.mu);
  if (sim.nallocs > 0) {
    int n = sim.nallocs;
    pthread_mutex_unlock(&sim.mu);
    return tport_err_set(err, TPORT_FAILED_PRECONDITION,
                         "sim: cannot reconfigure while %d allocations are live", n);
  }
  int old = sim.ndevices;
  sim.ndevices = 0;
  pthread_mutex_unlock(&sim.mu);
  for (int d = 0; d < old; d++) {
    stream_stop(sim.streams[d]);
    sim.streams[d] = NULL;
  }
  for (int d = 0; d < cfg->ndevices; d++) {
    int rc = stream_start(d, &sim.streams[d], err);
    if (rc != TPORT_OK) {
      while (d-- > 0)
        stream_stop(sim.streams[d]);
      return rc;
    }
  }
  pthread_mutex_lock(&sim.mu);
  sim.mem_bytes = cfg->mem_bytes ? cfg->mem_bytes : (size_t)1 << 30;
  sim.seed = cfg->seed;
  atomic_store(&sim.max_delay_us, cfg->max_delay_us);
  atomic_store(&sim.min_delay_us, 0);
  memset(sim.used, 0, sizeof sim.used);
  for (int a = 0; a < SIM_MAX_DEVICES; a++)
    for (int b = 0; b < SIM_MAX_DEVICES; b++) {
      sim.peer_possible[a][b] = a != b;
      sim.peer_enabled[a][b] = false;
    }
  sim.ndevices = cfg->ndevices;
  pthread_mutex_unlock(&sim.mu);
  return TPORT_OK;
}

void sim_set_peer_possible(int dev, int peer, bool possible)
{
  if (dev < 0 || peer < 0 || dev >= SIM_MAX_DEVICES || peer >= SIM_MAX_DEVICES || dev == peer)
    return;
  pthread_mutex_lock(&sim.mu);
  sim.peer_possible[dev][peer] = possible;
  if (!possible)
    sim.peer_enabled[dev][peer] = false;
  pthread_mutex_unlock(&sim.mu);
}

void sim_set_delay(unsigned max_delay_us)
{
  sim_set_delay_range(0, max_delay_us);
}

void sim_set_delay_range(unsigned min_us, unsigned max_us)
{
  atomic_store(&sim.min_delay_us, min_us);
  atomic_store(&sim.max_delay_us, max_us);
}

size_t sim_bytes_in_use(int dev)
{
  pthread_mutex_lock(&sim.mu);
  size_t n = dev >= 0 && dev < SIM_MAX_DEVICES ? sim.used[dev] : 0;
  pthread_mutex_unlock(&sim.mu);
  return n;
}

size_t sim_bytes_peak(int dev)
{
  pthread_mutex_lock(&sim.mu);
  size_t n = dev >= 0 && dev < SIM_MAX_DEVICES ? sim.peak[dev] : 0;
  pthread_mutex_unlock(&sim.mu);
  return n;
}

void sim_reset_peak(int dev)
{
  pthread_mutex_lock(&sim.mu);
  if (dev >= 0 && dev < SIM_MAX_DEVICES)
    sim.peak[dev] = sim.used[dev];
  pthread_mutex_unlock(&sim.mu);
}

/* ---------------------------------------------------------------- ops */

static int sim_count(void)
{
  pthread_mutex_lock(&sim.mu);
  int n = sim.ndevices;
  pthread_mutex_unlock(&sim.mu);
  return n;
}

static const char *sim_reason(void)
{
  return "no sim devices configured (--devices sim:N)";
}

static int check_dev(int dev, tport_err *err)
{
  if (dev < 0 || dev >= sim_count())
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "sim:%d does not exist (%d sim devices)", dev,
                         sim_count());
  return TPORT_OK;
}

static int sim_mem_info(int dev, size_t *free_bytes, size_t *total, tport_err *err)
{
  int rc = check_dev(dev, err);
  if (rc)
    return rc;
  pthread_mutex_lock(&sim.mu);
  *total = sim.mem_bytes;
  *free_bytes = sim.mem_bytes - sim.used[dev];
  pthread_mutex_unlock(&sim.mu);
  return TPORT_OK;
}

static int alloc_common(int dev, size_t bytes, bool managed, void **out, tport_err *err)
{
  int rc = check_dev(dev, err);
  if (rc)
    return rc;
  size_t rounded = (bytes + 255) & ~(size_t)255;
  if (rounded < bytes || rounded == 0)
    rounded = 256;
  pthread_mutex_lock(&sim.mu);
  if (rounded > sim.mem_bytes - sim.used[dev]) {
    size_t freeb = sim.mem_bytes - sim.used[dev];
    pthread_mutex_unlock(&sim.mu);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                         "sim:%d: out of memory: %zu bytes asked, %zu free of %zu", dev, bytes,
                         freeb, sim.mem_bytes);
  }
  sim.used[dev] += rounded;
  if (sim.used[dev] > sim.peak[dev])
    sim.peak[dev] = sim.used[dev];
  pthread_mutex_unlock(&sim.mu);
  /* from the host cache, as the cuda backend's memory comes from its
   * caching allocator (cuda_alloc.c): a fresh block of hundreds of MiB
   * would fault in a page at a time on first use, which no GPU does, and
   * made a put to sim 10x slower than the same put to the cpu */
  void *p = host_cache_alloc(rounded);
  pthread_mutex_lock(&sim.mu);
  if (!p || add_alloc((sim_alloc){(uintptr_t)p, rounded, dev, managed, dev}) != 0) {
    sim.used[dev] -= rounded;
    pthread_mutex_unlock(&sim.mu);
    if (p)
      host_cache_free(p);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "sim:%d: host memory exhausted", dev);
  }
  pthread_mutex_unlock(&sim.mu);
  if (((uintptr_t)p & SIM_TAG_MASK) != 0) {
    /* Cannot happen on x86-64/arm64 user space (addresses < 2^56). */
    abort();
  }
  *out = managed ? p : (void *)((uintptr_t)p | SIM_TAG);
  return TPORT_OK;
}

static int sim_alloc_dev(int dev, size_t bytes, void **out, tport_err *err)
{
  return alloc_common(dev, bytes, false, out, err);
}

static int sim_alloc_managed(int dev, size_t bytes, void **out, tport_err *err)
{
  return alloc_common(dev, bytes, true, out, err);
}

static void sim_free(int dev, void *p)
{
  if (!p)
    return;
  uintptr_t base = untag(p);
  pthread_mutex_lock(&sim.mu);
  int i = find_alloc(base, 1);
  if (i >= 0 && sim.allocs[i].base == base) {
    sim.used[sim.allocs[i].dev] -= sim.allocs[i].size;
    memmove(&sim.allocs[i], &sim.allocs[i + 1], (size_t)(sim.nallocs - i - 1) * sizeof(sim_alloc));
    sim.nallocs--;
    pthread_mutex_unlock(&sim.mu);
    host_cache_free((void *)base);
    return;
  }
  pthread_mutex_unlock(&sim.mu);
  abort(); /* freeing memory that is not a live sim allocation is an engine bug */
}

/* "Pinned" host memory costs here what pinning costs on a GPU machine:
 * cudaHostAlloc maps, zeroes and page-locks every page before it returns
 * (101-117 ms for 256 MiB on an H200, twenty times the copy into it), and
 * cudaFreeHost unlocks and unmaps them (26-33 ms).  The sim does the same
 * work -- mmap with MAP_POPULATE, mlock where RLIMIT_MEMLOCK allows;
 * munlock, munmap -- so that a path allocating pinned memory per request is
 * slow here too, not only on the first GPU it meets.  Under AddressSanitizer
 * the block comes from its allocator instead (it then sees overflows). */
#if defined(__SANITIZE_ADDRESS__)
#define SIM_HOST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SIM_HOST_ASAN 1
#endif
#endif

typedef struct sim_host_header {
  size_t len; /* mapped bytes, this header's page included */
  bool locked;
} sim_host_header;

static atomic_uint_fast64_t sim_host_allocs, sim_host_bytes;

static int sim_host_alloc(size_t bytes, void **out, tport_err *err)
{
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (bytes > SIZE_MAX - 2 * page)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "sim: cannot allocate %zu host bytes",
                         bytes);
  size_t len = page + ((bytes ? bytes : 1) + page - 1) / page * page;
#ifdef SIM_HOST_ASAN
  char *m = aligned_alloc(page, len);
  if (m)
    memset(m, 0, len); /* what populating costs */
#else
  char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                 -1, 0);
  if (m == MAP_FAILED)
    m = NULL;
#endif
  if (!m)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "sim: cannot allocate %zu host bytes",
                         bytes);
  sim_host_header *h = (sim_host_header *)m;
  h->len = len;
  h->locked = mlock(m, len) == 0; /* else only populated: a user's small limit */
  atomic_fetch_add(&sim_host_allocs, 1);
  atomic_fetch_add(&sim_host_bytes, len);
  *out = m + page;
  return TPORT_OK;
}

static void sim_host_free(void *p)
{
  if (!p)
    return;
  char *m = (char *)p - sysconf(_SC_PAGESIZE);
  sim_host_header *h = (sim_host_header *)m;
  size_t len = h->len;
  if (h->locked)
    munlock(m, len);
  atomic_fetch_sub(&sim_host_bytes, len);
#ifdef SIM_HOST_ASAN
  free(m);
#else
  munmap(m, len);
#endif
}

static be_stream *sim_stream_default(int dev)
{
  return dev >= 0 && dev < SIM_MAX_DEVICES ? sim.streams[dev] : NULL;
}

static int sim_stream_create(int dev, be_stream **out, tport_err *err)
{
  int rc = check_dev(dev, err);
  return rc ? rc : stream_start(dev, out, err);
}

static int sim_stream_sync(be_stream *s, tport_err *err)
{
  pthread_mutex_lock(&s->mu);
  uint64_t target = s->enqueued;
  while (s->completed < target)
    pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  return TPORT_OK;
}

static void sim_stream_destroy(be_stream *s)
{
  sim_stream_sync(s, NULL);
  stream_stop(s);
}

static int sim_memcpy(int dev, be_stream *s, void *dst, const void *src, size_t n,
                      be_copy_kind kind, tport_err *err)
{
  void *d = NULL, *sp = NULL;
  int rc = TPORT_OK;
  switch (kind) {
  case BE_H2D:
    rc = resolve_device(dev, dst, n, "destination", &d, err);
    if (!rc)
      rc = resolve_host(src, n, "source", &sp, err);
    break;
  case BE_D2H:
    rc = resolve_host(dst, n, "destination", &d, err);
    if (!rc)
      rc = resolve_device(dev, src, n, "source", &sp, err);
    break;
  case BE_D2D:
    rc = resolve_device(dev, dst, n, "destination", &d, err);
    if (!rc)
      rc = resolve_device(dev, src, n, "source", &sp, err);
    break;
  case BE_H2H:
    rc = resolve_host(dst, n, "destination", &d, err);
    if (!rc)
      rc = resolve_host(src, n, "source", &sp, err);
    break;
  }
  if (rc)
    return rc;
  if (s->dev != dev)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "sim: stream of sim:%d used for sim:%d",
                         s->dev, dev);
  sim_op *op = new_op(OP_MEMCPY, err);
  if (!op)
    return TPORT_RESOURCE_EXHAUSTED;
  op->u.copy.dst = d;
  op->u.copy.src = sp;
  op->u.copy.n = n;
  return enqueue(s, op);
}

/* Without peer access, the "driver" stages the copy: it may use either
 * device's memory, so each pointer is resolved against its own device. */
static int sim_memcpy_peer(int dst_dev, void *dst, int src_dev, const void *src, size_t n,
                           be_stream *s, tport_err *err)
{
  void *d, *sp;
  int rc = resolve_device(dst_dev, dst, n, "destination", &d, err);
  if (!rc)
    rc = resolve_device(src_dev, src, n, "source", &sp, err);
  if (rc)
    return rc;
  sim_op *op = new_op(OP_MEMCPY, err);
  if (!op)
    return TPORT_RESOURCE_EXHAUSTED;
  op->u.copy.dst = d;
  op->u.copy.src = sp;
  op->u.copy.n = n;
  return enqueue(s, op);
}

/* Byte extent of operand op of a plan: from element 0 to the last byte. */
static size_t plan_extent(const plan *p, int op, size_t esize)
{
  if (plan_numel(p) == 0)
    return 0;
  int64_t last = 0;
  for (int d = 0; d < p->ndim; d++)
    last += (p->shape[d] - 1) * p->strides[op][d];
  return (size_t)last + esize;
}

/* CUDA's answer to a stream or event used on a device it does not belong to. */
static int invalid_handle(const char *call, const char *what, int what_dev, int dev, tport_err *err)
{
  return tport_err_set(err, TPORT_INTERNAL,
                       "sim: %s: invalid resource handle (cudaErrorInvalidResourceHandle): %s of "
                       "sim:%d used on sim:%d",
                       call, what, what_dev, dev);
}

static int sim_kernel(int dev, be_stream *s, const plan *p, void *dst, tport_dtype dt,
                      const void *src, tport_dtype st, unsigned flags, tport_err *err)
{
  /* a launch goes to the current device's context, where another device's
   * stream is not a handle: the launch itself fails, whatever the pointers */
  if (s->dev != dev)
    return invalid_handle("cudaLaunchKernel", "a stream", s->dev, dev, err);
  void *d, *sp;
  int rc =
      resolve_device(dev, dst, plan_extent(p, 0, tport_dtype_size(dt)), "kernel output", &d, err);
  if (!rc)
    rc =
        resolve_device(dev, src, plan_extent(p, 1, tport_dtype_size(st)), "kernel input", &sp, err);
  if (rc)
    return rc;
  sim_op *op = new_op(OP_KERNEL, err);
  if (!op)
    return TPORT_RESOURCE_EXHAUSTED;
  op->u.kernel.p = *p;
  op->u.kernel.dst = d;
  op->u.kernel.src = sp;
  op->u.kernel.dt = dt;
  op->u.kernel.st = st;
  op->u.kernel.flags = flags;
  return enqueue(s, op);
}

static int sim_host_func(be_stream *s, be_host_fn fn, void *arg, tport_err *err)
{
  sim_op *op = new_op(OP_HOSTFN, err);
  if (!op)
    return TPORT_RESOURCE_EXHAUSTED;
  op->u.host.fn = fn;
  op->u.host.arg = arg;
  return enqueue(s, op);
}

static int sim_event_create(int dev, be_event **out, tport_err *err)
{
  int rc = check_dev(dev, err);
  if (rc)
    return rc;
  be_event *e = calloc(1, sizeof *e);
  if (!e)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "sim: out of host memory for an event");
  e->dev = dev;
  pthread_mutex_init(&e->mu, NULL);
  pthread_cond_init(&e->cv, NULL);
  atomic_init(&e->refs, 1);
  *out = e;
  return TPORT_OK;
}

static void sim_event_destroy(be_event *e)
{
  event_unref(e);
}

static int sim_event_record(be_event *e, be_stream *s, tport_err *err)
{
  if (e->dev != s->dev)
    return invalid_handle("cudaEventRecord", "an event", e->dev, s->dev, err);
  sim_op *op = new_op(OP_MARK, err);
  if (!op)
    return TPORT_RESOURCE_EXHAUSTED;
  pthread_mutex_lock(&e->mu);
  op->u.event.seq = ++e->recorded;
  pthread_mutex_unlock(&e->mu);
  atomic_fetch_add(&e->refs, 1);
  op->u.event.ev = e;
  return enqueue(s, op);
}

static int sim_stream_wait(be_stream *s, be_event *e, tport_err *err)
{
  pthread_mutex_lock(&e->mu);
  uint64_t target = e->recorded;
  pthread_mutex_unlock(&e->mu);
  if (target == 0)
    return TPORT_OK; /* never recorded: complete */
  sim_op *op = new_op(OP_WAIT, err);
  if (!op)
    return TPORT_RESOURCE_EXHAUSTED;
  atomic_fetch_add(&e->refs, 1);
  op->u.event.ev = e;
  op->u.event.seq = target;
  return enqueue(s, op);
}

static bool sim_event_query(be_event *e)
{
  pthread_mutex_lock(&e->mu);
  bool done = e->completed >= e->recorded;
  pthread_mutex_unlock(&e->mu);
  return done;
}

static int sim_event_sync(be_event *e, tport_err *err)
{
  pthread_mutex_lock(&e->mu);
  uint64_t target = e->recorded;
  while (e->completed < target)
    pthread_cond_wait(&e->cv, &e->mu);
  pthread_mutex_unlock(&e->mu);
  return TPORT_OK;
}

static bool sim_can_access_peer(int dev, int peer)
{
  int n = sim_count();
  if (dev < 0 || peer < 0 || dev >= n || peer >= n)
    return false;
  if (dev == peer)
    return true;
  pthread_mutex_lock(&sim.mu);
  bool ok = sim.peer_possible[dev][peer];
  pthread_mutex_unlock(&sim.mu);
  return ok;
}

static int sim_enable_peer(int dev, int peer, tport_err *err)
{
  if (!sim_can_access_peer(dev, peer))
    return tport_err_set(err, TPORT_FAILED_PRECONDITION, "sim:%d cannot access sim:%d", dev, peer);
  pthread_mutex_lock(&sim.mu);
  if (dev != peer)
    sim.peer_enabled[dev][peer] = true;
  pthread_mutex_unlock(&sim.mu);
  return TPORT_OK;
}

static int managed_index(void *ptr, size_t n, tport_err *err)
{
  int i = find_alloc((uintptr_t)ptr, n ? n : 1);
  if (i < 0 || !sim.allocs[i].managed)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "sim: the pointer is not managed memory"), -1;
  return i;
}

static int sim_advise(void *ptr, size_t n, int dev, tport_err *err)
{
  if (dev >= sim_count())
    return check_dev(dev, err);
  pthread_mutex_lock(&sim.mu);
  int i = managed_index(ptr, n, err);
  pthread_mutex_unlock(&sim.mu);
  return i < 0 ? TPORT_INVALID_ARGUMENT : TPORT_OK;
}

static int sim_prefetch(void *ptr, size_t n, int dev, be_stream *s, tport_err *err)
{
  if (dev >= sim_count())
    return check_dev(dev, err);
  pthread_mutex_lock(&sim.mu);
  int i = managed_index(ptr, n, err);
  if (i >= 0)
    sim.allocs[i].location = dev;
  pthread_mutex_unlock(&sim.mu);
  if (i < 0)
    return TPORT_INVALID_ARGUMENT;
  sim_op *op = new_op(OP_PREFETCH, err);
  return op ? enqueue(s, op) : TPORT_RESOURCE_EXHAUSTED;
}

static void sim_describe(int dev, char *name, size_t nl, char *cc, size_t cl)
{
  snprintf(name, nl, "simulated GPU");
  snprintf(cc, cl, "%s", "");
}

static size_t sim_stats(be_stat *out, size_t max)
{
  size_t n = 0;
  for (int d = 0; d < sim_count() && n < max; d++, n++) {
    snprintf(out[n].name, sizeof out[n].name, "sim%d_bytes_in_use", d);
    out[n].value = (int64_t)sim_bytes_in_use(d);
  }
  for (int d = 0; d < sim_count() && n < max; d++, n++) {
    snprintf(out[n].name, sizeof out[n].name, "sim%d_bytes_peak", d);
    out[n].value = (int64_t)sim_bytes_peak(d);
  }
  if (sim_count() > 0 && n + 2 <= max) {
    snprintf(out[n].name, sizeof out[n].name, "sim_host_allocs");
    out[n++].value = (int64_t)atomic_load(&sim_host_allocs);
    snprintf(out[n].name, sizeof out[n].name, "sim_host_pinned_bytes");
    out[n++].value = (int64_t)atomic_load(&sim_host_bytes);
  }
  return n;
}

static int sim_set_option(const char *key, const char *value, tport_err *err)
{
  return tport_err_set(err, TPORT_UNIMPLEMENTED, "sim has no option '%s'", key);
}

const backend_ops backend_sim = {
    .name = "sim",
    .type = TPORT_DEV_SIM,
    .device_count = sim_count,
    .unavailable_reason = sim_reason,
    .mem_info = sim_mem_info,
    .alloc = sim_alloc_dev,
    .free = sim_free,
    .alloc_managed = sim_alloc_managed,
    .host_alloc = sim_host_alloc,
    .host_free = sim_host_free,
    .stream_default = sim_stream_default,
    .stream_create = sim_stream_create,
    .stream_destroy = sim_stream_destroy,
    .stream_synchronize = sim_stream_sync,
    .memcpy_async = sim_memcpy,
    .memcpy_peer_async = sim_memcpy_peer,
    .copy_kernel = sim_kernel,
    .launch_host_func = sim_host_func,
    .event_create = sim_event_create,
    .event_destroy = sim_event_destroy,
    .event_record = sim_event_record,
    .stream_wait_event = sim_stream_wait,
    .event_query = sim_event_query,
    .event_synchronize = sim_event_sync,
    .can_access_peer = sim_can_access_peer,
    .enable_peer_access = sim_enable_peer,
    .mem_advise_preferred = sim_advise,
    .mem_prefetch_async = sim_prefetch,
    .describe = sim_describe,
    .stats = sim_stats,
    .set_option = sim_set_option,
};
