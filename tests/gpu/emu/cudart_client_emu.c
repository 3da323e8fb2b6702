/*
 * cudart_client_emu.c: the CUDA runtime calls libtport's client makes
 * (client/cuda_rt.h), emulated on the host for the tests of puts from and
 * gets into GPU memory where no GPU is (libcudart_client_emu.so, loaded by
 * libtport through $TPORT_CUDART_LIBRARY).  Built without the toolkit.
 *
 * "Device memory" is host memory this library hands out (cudaMalloc) and
 * tracks; cudaPointerGetAttributes says cudaMemoryTypeDevice (and its
 * device) for any address inside it, cudaMemoryTypeHost inside a
 * cudaHostAlloc block, unregistered elsewhere.  Every copy checks its
 * direction and that both ranges lie inside one allocation of the right
 * kind (the host side must be pinned: staging goes through the client's
 * ring).  Copies are asynchronous for real: they run only when a stream or
 * event is synchronized (up to the event), so a client that reads a pinned
 * slot before waiting for its copy, or overwrites one a copy still reads,
 * gets wrong bytes.  A refused call is counted (emu_cudart_violations) and
 * described (emu_cudart_last_violation).  Not the kernel emulation of
 * cudart_emu.c: this is a separate, small runtime.
 *
 * IPC (issue 19): device memory is a sealed memfd mapped shared (named
 * "tport-emu-device"), so that it can leave the process as a descriptor.
 * cudaIpcGetMemHandle gives a 64-byte handle unique to the allocation
 * (a later cudaMalloc at the same address gets another), and the driver's
 * calls that libtport asks cudaGetDriverEntryPointByVersion for are here:
 * cuMemGetAddressRange, and cuMemRetainAllocationHandle +
 * cuMemExportToShareableHandle (a POSIX descriptor: a dup of the memfd) +
 * cuMemRelease.  tportd maps such a descriptor as it maps a region, so the
 * whole same-host protocol runs without a GPU.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define EMU_API __attribute__((visibility("default")))

typedef int cudaError_t;
enum { OK = 0, ERR_INVALID_VALUE = 1, ERR_MEMORY = 2, ERR_INVALID_DEVICE = 101 };
enum { H2D = 1, D2H = 2 };
enum { MEM_UNREGISTERED = 0, MEM_HOST = 1, MEM_DEVICE = 2 };
#define EMU_DEVICES 2

struct cudaPointerAttributes {
  int type;
  int device;
  void *devicePointer;
  void *hostPointer;
  long reserved[8]; /* CUDA 13's layout */
};

typedef struct alloc {
  uint8_t *base;
  size_t size;
  int kind; /* MEM_HOST (pinned) or MEM_DEVICE */
  int device;
  int fd;          /* MEM_DEVICE: the memfd behind the mapping */
  uint64_t serial; /* unique per allocation: what its IPC handle says */
  struct alloc *next;
} alloc;

typedef struct op {
  uint8_t *dst;
  const uint8_t *src;
  size_t n;
  struct op *next;
} op;

typedef struct CUstream_st {
  int device;
  op *head, *tail;
  uint64_t enqueued, done; /* ops */
} stream;

typedef struct CUevent_st {
  stream *s; /* NULL: never recorded */
  uint64_t at;
} event;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static alloc *allocs;
static __thread int current_device;
static int host_alloc_calls, free_host_calls, violations, live_streams;
static int ipc_handles, ipc_exports;
static uint64_t next_serial = 1;
static char last_violation[256];

static cudaError_t violation(cudaError_t e, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static cudaError_t violation(cudaError_t e, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_violation, sizeof last_violation, fmt, ap);
  va_end(ap);
  __atomic_fetch_add(&violations, 1, __ATOMIC_SEQ_CST);
  return e;
}

/* The allocation holding [p, p + n), or NULL. */
static alloc *find(const void *p, size_t n)
{
  uintptr_t a = (uintptr_t)p;
  for (alloc *x = allocs; x; x = x->next) {
    uintptr_t b = (uintptr_t)x->base;
    if (a >= b && a - b <= x->size && n <= x->size - (a - b) && (n > 0 || a < b + x->size))
      return x;
  }
  return NULL;
}

static cudaError_t add_alloc(void **out, size_t size, int kind)
{
  if (!out)
    return violation(ERR_INVALID_VALUE, "allocation: NULL out pointer");
  alloc *x = calloc(1, sizeof *x);
  uint8_t *p = NULL;
  int fd = -1;
  if (x && kind == MEM_DEVICE) {
    /* a sealed memfd, shared: what an exported descriptor maps */
    size_t len = size ? size : 1;
    fd = memfd_create("tport-emu-device", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd >= 0 && ftruncate(fd, (off_t)len) == 0 &&
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0) {
      p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED)
        p = NULL;
    }
    if (!p && fd >= 0)
      close(fd);
  } else if (x) {
    p = malloc(size ? size : 1);
  }
  if (!x || !p) {
    free(x);
    return ERR_MEMORY;
  }
  x->fd = kind == MEM_DEVICE ? fd : -1;
  /* fresh device memory is garbage, not zeros */
  memset(p, 0xA5, size);
  x->base = p;
  x->size = size;
  x->kind = kind;
  x->device = current_device;
  pthread_mutex_lock(&mu);
  x->serial = next_serial++;
  x->next = allocs;
  allocs = x;
  pthread_mutex_unlock(&mu);
  *out = p;
  return OK;
}

static cudaError_t drop_alloc(void *p, int kind)
{
  if (!p)
    return OK;
  pthread_mutex_lock(&mu);
  for (alloc **pp = &allocs; *pp; pp = &(*pp)->next) {
    alloc *x = *pp;
    if (x->base == p && x->kind == kind) {
      *pp = x->next;
      pthread_mutex_unlock(&mu);
      if (x->fd >= 0) {
        munmap(x->base, x->size ? x->size : 1);
        close(x->fd);
      } else {
        free(x->base);
      }
      free(x);
      return OK;
    }
  }
  cudaError_t e = violation(ERR_INVALID_VALUE, "free of %p: not a %s allocation", p,
                            kind == MEM_HOST ? "cudaHostAlloc" : "cudaMalloc");
  pthread_mutex_unlock(&mu);
  return e;
}

EMU_API cudaError_t cudaMalloc(void **p, size_t size)
{
  return add_alloc(p, size, MEM_DEVICE);
}
EMU_API cudaError_t cudaFree(void *p)
{
  return drop_alloc(p, MEM_DEVICE);
}
EMU_API cudaError_t cudaHostAlloc(void **p, size_t size, unsigned flags)
{
  (void)flags;
  pthread_mutex_lock(&mu);
  host_alloc_calls++;
  pthread_mutex_unlock(&mu);
  return add_alloc(p, size, MEM_HOST);
}
EMU_API cudaError_t cudaFreeHost(void *p)
{
  pthread_mutex_lock(&mu);
  free_host_calls++;
  pthread_mutex_unlock(&mu);
  return drop_alloc(p, MEM_HOST);
}

EMU_API cudaError_t cudaGetDeviceCount(int *n)
{
  *n = EMU_DEVICES;
  return OK;
}
EMU_API cudaError_t cudaGetDevice(int *d)
{
  *d = current_device;
  return OK;
}
EMU_API cudaError_t cudaSetDevice(int d)
{
  if (d < 0 || d >= EMU_DEVICES)
    return ERR_INVALID_DEVICE;
  current_device = d;
  return OK;
}

EMU_API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
  if (!a)
    return ERR_INVALID_VALUE;
  memset(a, 0, sizeof *a);
  pthread_mutex_lock(&mu);
  alloc *x = find(p, 0);
  if (x) {
    a->type = x->kind;
    a->device = x->device;
    if (x->kind == MEM_DEVICE)
      a->devicePointer = (void *)p;
    else
      a->hostPointer = a->devicePointer = (void *)p;
  } else {
    a->type = MEM_UNREGISTERED;
    a->device = -2;
    a->hostPointer = (void *)p;
  }
  pthread_mutex_unlock(&mu);
  return OK;
}

/* Runs s's ops until `upto` of them are done (mu held). */
static void run_until(stream *s, uint64_t upto)
{
  while (s->done < upto && s->head) {
    op *o = s->head;
    s->head = o->next;
    if (!s->head)
      s->tail = NULL;
    memcpy(o->dst, o->src, o->n);
    free(o);
    s->done++;
  }
}

EMU_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, stream *s)
{
  if (!s)
    return violation(ERR_INVALID_VALUE, "cudaMemcpyAsync on the default stream (emulated: none)");
  pthread_mutex_lock(&mu);
  cudaError_t e = OK;
  alloc *d = find(dst, n), *r = find(src, n);
  int want_dst = kind == H2D ? MEM_DEVICE : MEM_HOST,
      want_src = kind == H2D ? MEM_HOST : MEM_DEVICE;
  if (kind != H2D && kind != D2H)
    e = violation(ERR_INVALID_VALUE, "cudaMemcpyAsync kind %d: the client moves H2D or D2H", kind);
  else if (!d || d->kind != want_dst)
    e = violation(ERR_INVALID_VALUE, "cudaMemcpyAsync %s: dst %p + %zu is not inside %s memory",
                  kind == H2D ? "H2D" : "D2H", dst, n, kind == H2D ? "device" : "pinned host");
  else if (!r || r->kind != want_src)
    e = violation(ERR_INVALID_VALUE, "cudaMemcpyAsync %s: src %p + %zu is not inside %s memory",
                  kind == H2D ? "H2D" : "D2H", src, n, kind == H2D ? "pinned host" : "device");
  if (!e && n) {
    op *o = calloc(1, sizeof *o);
    if (!o) {
      pthread_mutex_unlock(&mu);
      return ERR_MEMORY;
    }
    o->dst = dst;
    o->src = src;
    o->n = n;
    if (s->tail)
      s->tail->next = o;
    else
      s->head = o;
    s->tail = o;
    s->enqueued++;
  }
  pthread_mutex_unlock(&mu);
  return e;
}

EMU_API cudaError_t cudaStreamCreateWithFlags(stream **out, unsigned flags)
{
  (void)flags;
  stream *s = calloc(1, sizeof *s);
  if (!s)
    return ERR_MEMORY;
  s->device = current_device;
  pthread_mutex_lock(&mu);
  live_streams++;
  pthread_mutex_unlock(&mu);
  *out = s;
  return OK;
}
EMU_API cudaError_t cudaStreamSynchronize(stream *s)
{
  if (!s)
    return OK;
  pthread_mutex_lock(&mu);
  run_until(s, s->enqueued);
  pthread_mutex_unlock(&mu);
  return OK;
}
EMU_API cudaError_t cudaStreamDestroy(stream *s)
{
  if (!s)
    return violation(ERR_INVALID_VALUE, "cudaStreamDestroy(NULL)");
  pthread_mutex_lock(&mu);
  run_until(s, s->enqueued); /* CUDA finishes the work of a destroyed stream */
  live_streams--;
  pthread_mutex_unlock(&mu);
  free(s);
  return OK;
}

EMU_API cudaError_t cudaEventCreateWithFlags(event **out, unsigned flags)
{
  (void)flags;
  event *e = calloc(1, sizeof *e);
  if (!e)
    return ERR_MEMORY;
  *out = e;
  return OK;
}
EMU_API cudaError_t cudaEventRecord(event *e, stream *s)
{
  if (!e || !s)
    return violation(ERR_INVALID_VALUE, "cudaEventRecord: NULL event or stream");
  pthread_mutex_lock(&mu);
  cudaError_t r = OK;
  if (s->device != current_device)
    r = violation(ERR_INVALID_VALUE, "cudaEventRecord on a stream of device %d from device %d",
                  s->device, current_device);
  e->s = s;
  e->at = s->enqueued;
  pthread_mutex_unlock(&mu);
  return r;
}
EMU_API cudaError_t cudaEventSynchronize(event *e)
{
  if (!e)
    return violation(ERR_INVALID_VALUE, "cudaEventSynchronize(NULL)");
  pthread_mutex_lock(&mu);
  if (e->s)
    run_until(e->s, e->at);
  pthread_mutex_unlock(&mu);
  return OK;
}
EMU_API cudaError_t cudaEventDestroy(event *e)
{
  free(e);
  return OK;
}

/* Plain host-side helpers for the tests (synchronous, checked like copies). */
EMU_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, int kind)
{
  pthread_mutex_lock(&mu);
  alloc *x = find(kind == H2D ? dst : src, n);
  cudaError_t e = OK;
  if (!x || x->kind != MEM_DEVICE)
    e = violation(ERR_INVALID_VALUE, "cudaMemcpy: %p + %zu is not inside device memory",
                  kind == H2D ? dst : src, n);
  pthread_mutex_unlock(&mu);
  if (!e)
    memcpy(dst, src, n);
  return e;
}

/* ---------------------------------------------------------------- IPC */

typedef struct {
  char reserved[64];
} cudaIpcMemHandle_t;
#define HANDLE_MAGIC "TPEMUIPC"

/* Base pointer of an allocation, as CUDA asks for (mu held). */
static alloc *find_base(const void *p)
{
  for (alloc *x = allocs; x; x = x->next)
    if (x->base == p && x->kind == MEM_DEVICE)
      return x;
  return NULL;
}

EMU_API cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *h, void *p)
{
  if (!h)
    return violation(ERR_INVALID_VALUE, "cudaIpcGetMemHandle: NULL handle");
  pthread_mutex_lock(&mu);
  alloc *x = find_base(p);
  cudaError_t e = OK;
  if (!x) {
    e = violation(ERR_INVALID_VALUE, "cudaIpcGetMemHandle(%p): not the base of a cudaMalloc", p);
  } else {
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, HANDLE_MAGIC, 8);
    uint64_t pid = (uint64_t)getpid(), sz = x->size;
    memcpy(h->reserved + 8, &pid, 8);
    memcpy(h->reserved + 16, &x->serial, 8);
    memcpy(h->reserved + 24, &sz, 8);
    ipc_handles++;
  }
  pthread_mutex_unlock(&mu);
  return e;
}

/* The driver's calls libtport asks for (CUresult: 0 success, 1 invalid value). */
typedef unsigned long long cu_handle;
static int cu_mem_get_address_range(uintptr_t *base, size_t *size, uintptr_t p)
{
  pthread_mutex_lock(&mu);
  alloc *x = find((const void *)p, 0);
  int r = 1;
  if (x && x->kind == MEM_DEVICE) {
    if (base)
      *base = (uintptr_t)x->base;
    if (size)
      *size = x->size;
    r = 0;
  }
  pthread_mutex_unlock(&mu);
  return r;
}
static int cu_mem_retain_allocation_handle(cu_handle *h, void *p)
{
  pthread_mutex_lock(&mu);
  alloc *x = find(p, 0);
  int r = 1;
  if (x && x->kind == MEM_DEVICE) {
    *h = x->serial;
    r = 0;
  }
  pthread_mutex_unlock(&mu);
  return r;
}
static int cu_mem_export_to_shareable_handle(void *out, cu_handle h, int type,
                                             unsigned long long flags)
{
  (void)flags;
  if (type != 1) /* CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */
    return 1;
  pthread_mutex_lock(&mu);
  int r = 1;
  for (alloc *x = allocs; x; x = x->next)
    if (x->kind == MEM_DEVICE && x->serial == h) {
      int fd = fcntl(x->fd, F_DUPFD_CLOEXEC, 0);
      if (fd >= 0) {
        *(int *)out = fd;
        ipc_exports++;
        r = 0;
      }
      break;
    }
  pthread_mutex_unlock(&mu);
  return r;
}
static int cu_mem_release(cu_handle h)
{
  (void)h;
  return 0;
}

EMU_API cudaError_t cudaGetDriverEntryPointByVersion(const char *sym, void **fn, unsigned version,
                                                     unsigned long long flags, int *status)
{
  (void)version;
  (void)flags;
  static const struct {
    const char *name;
    void *fn;
  } table[] = {
      {"cuMemGetAddressRange", (void *)cu_mem_get_address_range},
      {"cuMemRetainAllocationHandle", (void *)cu_mem_retain_allocation_handle},
      {"cuMemExportToShareableHandle", (void *)cu_mem_export_to_shareable_handle},
      {"cuMemRelease", (void *)cu_mem_release},
  };
  if (!sym || !fn)
    return ERR_INVALID_VALUE;
  for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
    if (strcmp(table[i].name, sym) == 0) {
      *fn = table[i].fn;
      if (status)
        *status = 0; /* cudaDriverEntryPointSuccess */
      return OK;
    }
  *fn = NULL;
  if (status)
    *status = 1; /* cudaDriverEntryPointSymbolNotFound */
  return OK;
}

EMU_API int emu_cudart_ipc_handles(void)
{
  pthread_mutex_lock(&mu);
  int n = ipc_handles;
  pthread_mutex_unlock(&mu);
  return n;
}
EMU_API int emu_cudart_ipc_exports(void)
{
  pthread_mutex_lock(&mu);
  int n = ipc_exports;
  pthread_mutex_unlock(&mu);
  return n;
}

EMU_API const char *cudaGetErrorString(cudaError_t e)
{
  switch (e) {
  case OK: return "no error";
  case ERR_INVALID_VALUE: return "invalid argument (emulated)";
  case ERR_MEMORY: return "out of memory (emulated)";
  case ERR_INVALID_DEVICE: return "invalid device ordinal (emulated)";
  default: return "unknown error (emulated)";
  }
}

/* The emulator's own counters, for the tests. */
EMU_API int emu_cudart_host_alloc_calls(void)
{
  pthread_mutex_lock(&mu);
  int n = host_alloc_calls;
  pthread_mutex_unlock(&mu);
  return n;
}
EMU_API int emu_cudart_free_host_calls(void)
{
  pthread_mutex_lock(&mu);
  int n = free_host_calls;
  pthread_mutex_unlock(&mu);
  return n;
}
EMU_API int emu_cudart_violations(void)
{
  return __atomic_load_n(&violations, __ATOMIC_SEQ_CST);
}
EMU_API const char *emu_cudart_last_violation(void)
{
  return last_violation;
}
EMU_API int emu_cudart_live_streams(void)
{
  pthread_mutex_lock(&mu);
  int n = live_streams;
  pthread_mutex_unlock(&mu);
  return n;
}
