/* sim_memory.c: the sim's device, managed and "pinned" host memory
 * (sim_internal.h; what it mimics of CUDA: backend_sim.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "host_cache.h"
#include "sim_internal.h"

/* ---------------------------------------------------------------- memory map */

uintptr_t sim_untag(const void *p)
{
  return (uintptr_t)p & ~SIM_TAG_MASK;
}
bool sim_is_tagged(const void *p)
{
  return ((uintptr_t)p & SIM_TAG_MASK) == SIM_TAG;
}

/* Index of the allocation containing [addr, addr+n); -1 if none. mu held. */
int sim_find_alloc(uintptr_t addr, size_t n)
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

int sim_add_alloc(sim_alloc a)
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
int sim_resolve_device(int dev, const void *p, size_t n, const char *what, void **out,
                       tport_err *err)
{
  pthread_mutex_lock(&sim.mu);
  int i = sim_find_alloc(sim_untag(p), n ? n : 1);
  int rc = TPORT_OK;
  if (i < 0) {
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT,
                       "sim:%d: %s (%zu bytes) is not sim device memory", dev, what, n);
  } else {
    const sim_alloc *a = &sim.allocs[i];
    if (!a->managed && !sim_is_tagged(p))
      rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "sim:%d: %s is an untagged alias", dev, what);
    else if (!a->managed && a->dev != dev && !sim.peer_enabled[dev][a->dev])
      rc = tport_err_set(err, TPORT_FAILED_PRECONDITION,
                         "sim:%d: %s is memory of sim:%d and peer access %d->%d is not enabled",
                         dev, what, a->dev, dev, a->dev);
  }
  pthread_mutex_unlock(&sim.mu);
  if (rc == TPORT_OK)
    *out = (void *)sim_untag(p);
  return rc;
}

/* A host pointer must not be sim device memory (managed memory is both). */
int sim_resolve_host(const void *p, size_t n, const char *what, void **out, tport_err *err)
{
  if (sim_is_tagged(p)) {
    pthread_mutex_lock(&sim.mu);
    int i = sim_find_alloc(sim_untag(p), n ? n : 1);
    pthread_mutex_unlock(&sim.mu);
    (void)i;
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "sim: %s is device memory, not host", what);
  }
  *out = (void *)p;
  return TPORT_OK;
}

static int alloc_common(int dev, size_t bytes, bool managed, void **out, tport_err *err)
{
  int rc = sim_check_dev(dev, err);
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
  if (!p || sim_add_alloc((sim_alloc){(uintptr_t)p, rounded, dev, managed, dev}) != 0) {
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

int sim_alloc_dev(int dev, size_t bytes, void **out, tport_err *err)
{
  return alloc_common(dev, bytes, false, out, err);
}

int sim_alloc_managed(int dev, size_t bytes, void **out, tport_err *err)
{
  return alloc_common(dev, bytes, true, out, err);
}

void sim_free(int dev, void *p)
{
  if (!p)
    return;
  uintptr_t base = sim_untag(p);
  pthread_mutex_lock(&sim.mu);
  int i = sim_find_alloc(base, 1);
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

void sim_host_counts(uint64_t *allocs, uint64_t *bytes)
{
  *allocs = atomic_load(&sim_host_allocs);
  *bytes = atomic_load(&sim_host_bytes);
}

int sim_host_alloc(size_t bytes, void **out, tport_err *err)
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
  char *m =
      mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
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

void sim_host_free(void *p)
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
