/*
 * engine.h: tensors and the operations of SEMANTICS.md (to, copy_,
 * contiguous, views) over the device backends.
 *
 * Ownership: functions that return a tensor through `out` give the caller one
 * reference; release it with tensor_release.  Tensors are refcounted and views
 * share their storage.  Every function returns a tport_status and fills err
 * (which may be NULL) on failure; out-parameters are set only on success.
 *
 * Thread safety: distinct tensors may be used from different threads at once;
 * one tensor's data may not be written by two operations concurrently (as in
 * PyTorch).  Async work is ordered per storage (storage.h).
 */
#ifndef TPORT_ENGINE_H
#define TPORT_ENGINE_H

#include <stdatomic.h>
#include <stddef.h>

#include "meta.h"

/* A storage: the engine's refcounted memory under one or more tensors.
 * Opaque outside the engine (storage.h is private): tportd holds references
 * to lend a storage's bytes to replies and compares them (what a tenant
 * pays for), nothing more. */
typedef struct tport_storage tport_storage;

typedef struct tport_tensor {
  atomic_int refs;
  tport_storage *storage;
  tport_dtype dtype;
  meta_layout layout;
  bool conj; /* lazily conjugated view (complex) */
  bool neg;  /* lazily negated view */
} tport_tensor;

/* storage_flags of a fresh tensor */
enum {
  STORAGE_MANAGED = 1u << 0, /* managed memory (SEMANTICS.md §6) */
  STORAGE_PINNED = 1u << 1,  /* page-locked host memory */
};

/* ---- creation */
/* A fresh tensor in memory format fmt (CONTIGUOUS, CHANNELS_LAST, CHANNELS_LAST_3D). */
int tensor_empty(tport_device dev, tport_dtype dtype, int ndim, const int64_t *sizes,
                 tport_memory_format fmt, unsigned storage_flags, tport_tensor **out,
                 tport_err *err);
/* A fresh tensor with the given strides (validated like a wire descriptor). */
int tensor_empty_strided(tport_device dev, tport_dtype dtype, int ndim, const int64_t *sizes,
                         const int64_t *strides, unsigned storage_flags, tport_tensor **out,
                         tport_err *err);
/* A cpu tensor over caller memory of `nbytes` (borrowed: keep it alive and
 * unchanged-size while the tensor lives).  Layout validated against nbytes. */
int tensor_wrap_host(void *data, size_t nbytes, tport_dtype dtype, int ndim, const int64_t *sizes,
                     const int64_t *strides, int64_t offset, tport_tensor **out, tport_err *err);
/* The same over memory page-locked by engine_host_register: copies to and
 * from a device use it directly (keep it registered until they end). */
int tensor_wrap_host_pinned(void *data, size_t nbytes, tport_dtype dtype, int ndim,
                            const int64_t *sizes, const int64_t *strides, int64_t offset,
                            tport_tensor **out, tport_err *err);
tport_tensor *tensor_retain(tport_tensor *t);
void tensor_release(tport_tensor *t);

/* ---- views (share storage) */
/* as_strided: validated against the storage's size; strides >= 0. */
int tensor_as_strided(tport_tensor *t, int ndim, const int64_t *sizes, const int64_t *strides,
                      int64_t offset, tport_tensor **out, tport_err *err);
/* expand_as: broadcast t to ndim/sizes (stride 0 on new or size-1 dims). */
int tensor_expand(tport_tensor *t, int ndim, const int64_t *sizes, tport_tensor **out,
                  tport_err *err);
/* A 1-D uint8 view of bytes [byte_offset, byte_offset + nbytes) of t's data.
 * t must be non-overlapping and dense (its elements are then exactly
 * tensor_nbytes(t) bytes from its first one, in storage order). */
int tensor_byte_view(tport_tensor *t, size_t byte_offset, size_t nbytes, tport_tensor **out,
                     tport_err *err);
/* Lazy conj()/neg views (conj is a no-op alias for non-complex dtypes). */
int tensor_conj_view(tport_tensor *t, tport_tensor **out, tport_err *err);
int tensor_neg_view(tport_tensor *t, tport_tensor **out, tport_err *err);

/* ---- queries */
tport_device tensor_device(const tport_tensor *t);
int64_t tensor_numel(const tport_tensor *t);
size_t tensor_nbytes(const tport_tensor *t); /* numel * element size */
bool tensor_is_managed(const tport_tensor *t);
/* Exact format mode's query: the format t is contiguous in, NONE if none. */
tport_memory_format tensor_actual_format(const tport_tensor *t);
/* Same storage, offset, sizes, strides, dtype and conj/neg bits. */
bool tensor_same_data(const tport_tensor *a, const tport_tensor *b);

/* ---- operations */
/* copy_(dst, src, non_blocking): SEMANTICS.md §3 and §4. */
int tensor_copy_(tport_tensor *dst, tport_tensor *src, bool non_blocking, tport_err *err);

typedef struct to_options {
  bool has_dtype;
  tport_dtype dtype;
  bool has_device;
  tport_device device; /* index -1: the device type's current (default) device */
  bool has_format;
  tport_memory_format format; /* CONTIGUOUS, CHANNELS_LAST(_3D) or PRESERVE */
  bool copy;
  bool non_blocking;
  bool exact_format; /* alias only when is_contiguous(format) (seed 000) */
} to_options;

/* to(): *out is t itself (an extra reference) when PyTorch would alias, with
 * *aliased true; otherwise a fresh tensor.  Managed tensors move (§6). */
int tensor_to(tport_tensor *t, const to_options *o, tport_tensor **out, bool *aliased,
              tport_err *err);
/* contiguous(fmt): aliases iff is_contiguous(fmt); PRESERVE aliases a contiguous
 * tensor and is an error for any other (SEMANTICS.md 2). */
int tensor_contiguous(tport_tensor *t, tport_memory_format fmt, tport_tensor **out, bool *aliased,
                      tport_err *err);

/* Reads t's values in logical C order into host memory (nbytes must equal
 * numel * element size); waits for pending work. */
int tensor_read(tport_tensor *t, void *host, size_t nbytes, tport_err *err);
/* Writes values given in logical C order into t (which may be any layout). */
int tensor_write(tport_tensor *t, const void *host, size_t nbytes, tport_err *err);
/* Waits for all pending work on t's storage. */
int tensor_sync(tport_tensor *t, tport_err *err);
/* Writes n host bytes at byte offset off of t's data (t non-overlapping and
 * dense, as for tensor_byte_view) with a memcpy where t is plain host
 * memory (the cpu device's, not managed), after its pending work: true.
 * False, writing nothing, for any other tensor or a range outside t: the
 * caller copies as for any tensor (a byte view and tensor_copy_).  For the
 * many small puts that land on the cpu, that copy's two tensors and kernel
 * dispatch cost more than the bytes. */
bool tensor_write_host_bytes(tport_tensor *t, size_t off, const void *src, size_t n);
/* Where bytes [off, off + n) of t's data are, for a caller that fills them
 * itself (n > 0, t as for tensor_write_host_bytes, its pending work waited
 * for): valid while t is held; NULL for any other tensor or range. */
uint8_t *tensor_host_bytes(tport_tensor *t, size_t off, size_t n);

/* Testing knobs: each disables one ordering step (or makes one step fail),
 * so that the concurrency tests can show that the step (or what is done on
 * its failure) is needed.  Never set outside tests. */
enum {
  ENGINE_SKIP_DST_READY = 1u << 0,     /* D2D: copy stream does not wait for dst's stream */
  ENGINE_SKIP_STAGING_EVENT = 1u << 1, /* H2D: staging block released without its event */
  ENGINE_SKIP_RESULT_EVENT = 1u << 2,  /* non_blocking: result storage gets no event */
  ENGINE_FAIL_MARK = 1u << 3,          /* H2D from pinned memory: fails after the copy is enqueued */
  /* storage_mark pauses (up to 2 ms) between recording a storage's event
   * and installing it: the window a worker preempted there opens.  Not a
   * step switched off: the mark must stay right with it. */
  ENGINE_SLOW_MARK = 1u << 4,
  /* reader_read_into fails for bytes past the first (a get a chunk at a
   * time through a region stops half way) */
  ENGINE_FAIL_READ_INTO = 1u << 5,
};
void engine_set_test_faults(unsigned faults);
unsigned engine_test_faults(void);

/* A deadline for the engine work of the calling thread (CLOCK_MONOTONIC
 * milliseconds; 0: none).  A kernel over more than ENGINE_PIECE_ELEMS
 * elements runs in pieces along its outermost dimension, and past the
 * deadline no further piece starts: the call returns DEADLINE_EXCEEDED (a
 * copy_ into an existing tensor then leaves it partly written; work already
 * queued on a device stream completes). */
#define ENGINE_PIECE_ELEMS ((int64_t)1 << 24)
void engine_set_deadline(int64_t mono_ms);
int64_t engine_deadline(void);

/* An allocation guard for the calling thread (NULL: none): while it is set,
 * every storage the engine allocates on this thread -- a result, a
 * temporary of a copy, a landing tensor -- and every block it takes from
 * the read-back pool for a reader (readback.h: a block lent to a reply) is
 * first offered to fn(ctx, kind, nbytes, keep, err), and when fn fails
 * nothing is allocated and the operation fails with fn's error.  tportd
 * charges a tenant's quota through it, before the bytes exist.  Memory the
 * engine takes from the staging pool (puts' and copies' blocks, held for
 * the length of one call) is not asked about: it is bounded by the pool.
 *
 * A charge may live with the memory rather than with the request: the
 * guard then fills *keep (zeroed before the call), and keep->release(token,
 * nbytes) is called exactly once when that memory is freed or handed back
 * to its pool -- on whatever thread drops the last reference, nng's
 * included, which may hold nng's own locks: release must be cheap, never
 * block and take no lock.  Left unset, the charge is the request's. */
typedef enum {
  ENGINE_ALLOC_STORAGE,  /* a storage (storage_new) */
  ENGINE_ALLOC_READBACK, /* a block of the read-back pool (its class size) */
  ENGINE_ALLOC_READAHEAD, /* the same, read ahead: may be skipped, so never waited for */
} engine_alloc_kind;
typedef struct engine_charge {
  void (*release)(void *token, size_t nbytes); /* NULL: none */
  void *token;
  size_t nbytes;
} engine_charge;
typedef int (*engine_alloc_guard)(void *ctx, engine_alloc_kind kind, size_t nbytes,
                                  engine_charge *keep, tport_err *err);
void engine_set_alloc_guard(engine_alloc_guard fn, void *ctx);

/* The bytes of the read-back pool (gets from a device read through its
 * blocks: TPORT_READBACK_BYTES, default 256 MiB); creates the pool, so call
 * it once the devices are configured. */
size_t engine_readback_budget(void);

/* What to() and contiguous() would allocate, without doing it: *nbytes is
 * the storage bytes of the fresh result, 0 when they would alias t (a
 * managed move included).  Any error the operation itself would report for
 * these arguments is reported here too.  Temporaries the copy into the
 * result may need are not included (the guard sees them). */
int tensor_to_nbytes(const tport_tensor *t, const to_options *o, size_t *nbytes, tport_err *err);
int tensor_contiguous_nbytes(const tport_tensor *t, tport_memory_format fmt, size_t *nbytes,
                             tport_err *err);

/* Caller host memory (a same-host region) page-locked with the GPU driver,
 * so that copies between it and a device need no staging: *registered is
 * false, and nothing done, when no backend wants it (no GPU).  Unregister
 * only once no copy from or to it is pending. */
int engine_host_register(void *p, size_t n, bool *registered, tport_err *err);
void engine_host_unregister(void *p);

/* Same-host GPU memory of another process (engine/ipc.c): opens the
 * allocation its IPC handle names (len bytes; cudaIpcMemHandle_t) with the
 * first backend that can, *dev where it lives and *ptr its base here.
 * FAILED_PRECONDITION, saying why, where no backend can (no GPU).  Close it
 * only once no copy from or to it is pending. */
int engine_ipc_open(const void *handle, size_t len, tport_device *dev, void **ptr, tport_err *err);
void engine_ipc_close(tport_device dev, void *ptr);
/* A tensor over nbytes of device memory at data that the engine did not
 * allocate (an opened IPC allocation): borrowed, never freed, validated as
 * tensor_wrap_host validates. */
int tensor_wrap_device(tport_device dev, void *data, size_t nbytes, tport_dtype dtype, int ndim,
                       const int64_t *sizes, const int64_t *strides, int64_t offset,
                       tport_tensor **out, tport_err *err);

/* Waits for all work of every device and frees deferred storages and the
 * staging pool's cache. */
void engine_synchronize_all(void);
/* Gives back what the engine keeps for a busy server's next requests and
 * holds for nobody: the small host blocks' cache (small_cache.h).  tportd
 * calls it once idle, before malloc_trim; anything running may go on. */
void engine_release_idle(void);

/* ---- storages held outside the engine (a reply lent a storage's bytes) */
/* The bytes of s (its tensors may view only part of them). */
size_t storage_nbytes(const tport_storage *s);
/* Whether t is the only tensor over its storage and held once: no other
 * holder (a registry entry, a lend) can share its bytes until t is shared. */
bool tensor_sole_owner(const tport_tensor *t);
tport_storage *storage_retain(tport_storage *s);
void storage_release(tport_storage *s);
/* Drops a reference but never frees on this thread: the last one puts the
 * storage in the graveyard, freed by the next storage_reap (every
 * storage_new calls it; so does tportd's reaper, each second).  For threads
 * that must not block: nng's, which may hold nng's own locks. */
void storage_release_deferred(tport_storage *s);
/* Frees storages whose last reference went while work was pending and whose
 * work has now completed; with wait, waits for all of them. */
void storage_reap(bool wait);

/* ---- devices */
/* What tportd asks of the engine at start, besides its devices. */
typedef struct engine_options {
  const char *kernel_cache; /* a directory of compiled CUDA kernels (NULL: none) */
  bool host_cache_set;      /* else host_cache.h's default limit */
  size_t host_cache_bytes;  /* freed large host blocks kept for reuse */
} engine_options;
/* Configures the devices served from a list ("cpu", "cuda", "sim:N",
 * comma-separated; NULL: the cpu and every CUDA GPU present -- cpu and
 * cuda are always served, the list only adds sim devices) and opts (NULL:
 * none).  Call once, before any tensor is made.  An option the engine
 * cannot honour without failing to serve (a kernel cache where no backend
 * compiles kernels) does not fail: *warning (may be NULL) says why, its
 * code TPORT_OK when there is nothing to say.  A TPORT_*_BYTES variable of
 * the engine's that does not parse fails it, naming the variable. */
int engine_configure(const char *devices, const engine_options *opts, tport_err *warning,
                     tport_err *err);

#define ENGINE_MAX_DEVICES 64
/* One device served, as Devices and /metrics show it. */
typedef struct engine_device_info {
  tport_device device;
  char name[64];               /* "" when it has none */
  char compute_capability[16]; /* "" when it has none */
  bool managed_memory;
  bool has_memory;             /* the backend told free and total bytes */
  size_t free_bytes, total_bytes;
  int npeers;
  int peers[ENGINE_MAX_DEVICES]; /* indices of devices of its type it can reach */
} engine_device_info;
/* The devices served (at most max, every type in order, then by index);
 * returns how many were filled. */
size_t engine_devices(engine_device_info *out, size_t max);
/* Why no CUDA device is served (the driver's or the build's reason); NULL
 * when at least one is. */
const char *engine_cuda_unavailable_reason(void);

#endif
