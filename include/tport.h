/*
 * tport.h: libtport, the C client of tensorport.
 *
 * Connect to a tportd, put tensors (from host memory or DLPack), convert them
 * on the server with PyTorch's semantics (to, contiguous, copy, views), and
 * get them back.  libtport links protobuf-c, OpenSSL (TLS, the HMAC of the
 * tenant's proof) and ISA-L (CRC32C); nng is compiled in statically (our
 * patched build); this header needs DLPack's (libdlpack-dev).  pkg-config's
 * tport.pc (installed) or tport-uninstalled.pc (the build tree) names them.
 *
 * Errors: every function returns a status (TPORT_OK = 0, else one of
 * tport_status, gRPC's numbering) and, when err is not NULL, fills it with
 * the code and a message (the server's own message for server-side errors).
 * tport_strerror() names a code.
 *
 * Ownership: the caller owns what it passes; results written to caller
 * structs are plain values.  tport_list/tport_devices/tport_stats allocate
 * arrays the caller frees with free().  tport_get_dlpack returns a
 * DLManagedTensor whose deleter frees it.
 *
 * Thread safety: a tport_client may be used by many threads at once; each
 * call runs on its own nng context over the client's one connection.
 * tport_close must not race with calls on the same client.  Asynchronous
 * requests (below) run on threads of libtport's own.
 *
 * Tensors put without a name live as long as the connection; named ones are
 * kept for the tenant (see tport_connect_options) until freed or until their
 * time to live ends.
 */
#ifndef TPORT_H
#define TPORT_H

#include <dlpack/dlpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tport_types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tport_client tport_client;

#define TPORT_HANDLE_BYTES 16
#define TPORT_NAME_MAX 128

/* A tensor on the server: its handle, or a name (then handle is all zero). */
typedef struct tport_ref {
  uint8_t handle[TPORT_HANDLE_BYTES];
  char name[TPORT_NAME_MAX];
} tport_ref;

typedef struct tport_tensor_info {
  tport_ref ref;
  tport_dtype dtype;
  int ndim;
  int64_t sizes[TPORT_MAX_DIMS];
  int64_t strides[TPORT_MAX_DIMS]; /* elements */
  int64_t storage_offset;
  char device[32];
  tport_memory_format actual_format;    /* NONE when contiguous in no format */
  tport_memory_format suggested_format; /* PyTorch's suggest_memory_format() */
  bool is_contiguous;
  int64_t nbytes;
  int64_t storage_nbytes;
  bool managed, conj, neg;
  int64_t expires_unix_ms; /* 0: lives with its connection */
} tport_tensor_info;

typedef struct tport_connect_options {
  const char *tenant; /* NULL: "default" */
  int timeout_ms;     /* per request; 0: 60000 */
  bool keep;          /* keep every tensor this client makes for the tenant (with the server's
                         time to live), named or not: a command-line tool's mode */
  /* The tenant's secret, for a server that authenticates (--auth-file): in
   * hex (secret), or in a file only its owner may read (secret_file).  It
   * never travels: the client answers the server's challenge with an HMAC.
   * A server without an auth file asks instead for the local secret of the
   * user who runs it, which libtport reads by itself on a URL of this host
   * (ipc://, inproc://, 127.0.0.0/8, [::1], localhost), from
   * $TPORT_LOCAL_SECRET (a path, or off), else
   * $XDG_RUNTIME_DIR/tensorport/local-secret, else
   * /tmp/tensorport-UID/local-secret; these two are then unused. */
  const char *secret;
  const char *secret_file;
  /* tls+tcp:// URLs (TLS 1.3 on OpenSSL): the CAs that sign the server's
   * certificate (NULL: the system's store), this client's certificate and
   * key for a server that asks for one (its subject CN is the tenant), and
   * the name the server's certificate must carry (NULL: the URL's host). */
  const char *tls_ca;
  const char *tls_cert;
  const char *tls_key;
  const char *tls_server_name;
  /* End-to-end integrity: every chunk of a put and a get carries its CRC32C
   * (Castagnoli), checked by the other end; a mismatch is TPORT_DATA_LOSS
   * naming the chunk.  Costs a CRC pass over the bytes on each end. */
  bool verify;
  /* Same host: tport_put and tport_get (and the DLPack calls) move large
   * tensors through a shared-memory region (see tport_shm_create) when the
   * URL is local (ipc://, inproc://, tcp:// on loopback) and the server
   * offers one; no_shm (or TPORT_SHM=0 in the environment) keeps them on
   * the socket.  The client's copies into and out of the region of 4 MiB or
   * more are split across a few threads of libtport's own, started on the
   * first such copy (TPORT_COPY_THREADS=N: that many, 1: none; by default
   * the CPU count, at most 16); a tensor of more than two chunks goes
   * through the region a chunk at a time, those threads copying while the
   * server reads or writes (three quarters of them unless set).  Over
   * ipc:// and inproc://, a put of more than a chunk stored on the cpu as
   * it is (no device, no conversion) is read by the server straight from
   * the caller's buffer (process_vm_readv, where the kernel lets a process
   * of the server's user read this one; TPORT_SHM_DIRECT=0: not). */
  bool no_shm;
} tport_connect_options;

/* Progress of a transfer: bytes done of total.  Called on the calling
 * thread, between its requests; it must not fork (a transfer through the
 * automatic region holds libtport's copy threads, which a fork waits for).
 * A same-host put that the server gave up reading from the caller's buffer
 * is made again through the region, and reports from 0 again. */
typedef void (*tport_progress_fn)(void *arg, uint64_t done, uint64_t total);

typedef struct tport_put_options {
  const char *name;   /* NULL: connection-scoped */
  uint64_t ttl_ms;    /* with a name; 0: the server's default */
  const char *device; /* "cpu", "cuda:0", "sim:1"; NULL: cpu */
  bool has_dtype;     /* convert to dtype on the server */
  tport_dtype dtype;
  tport_memory_format memory_format; /* of the stored tensor; PRESERVE keeps the layout sent */
  bool managed;                      /* managed (unified) memory on the device */
  bool non_blocking;                 /* return before the device copies end */
  tport_progress_fn progress;
  void *progress_arg;
  /* With name: replace the tensor of that name, if any, once this one is
   * complete -- in one step: a reader by name gets the old tensor or the
   * new one, never a part of either (publishing "the latest weights").
   * The old one's handle goes; a get already reading it finishes; its
   * bytes leave the tenant's quota at the swap (the quota holds both while
   * the new one uploads).  Without it an existing name is ALREADY_EXISTS. */
  bool replace;
} tport_put_options;

/* Fills o with the defaults (memory_format PRESERVE, everything else off). */
void tport_put_options_init(tport_put_options *o);

typedef struct tport_to_options {
  const char *device; /* NULL: unchanged */
  bool has_dtype;
  tport_dtype dtype;
  bool has_memory_format;
  tport_memory_format memory_format;
  bool copy;
  bool non_blocking;
  bool exact_format; /* alias only when is_contiguous(format) */
  const char *name;  /* register the result under a name */
  uint64_t ttl_ms;
} tport_to_options;

typedef struct tport_device_info {
  char device[32];
  char name[64];
  uint64_t total_bytes, free_bytes;
  char compute_capability[16];
  int npeers;
  char peers[16][32];
  bool managed_memory;
  /* free_bytes is withheld (0): only an operator tenant sees what is free
   * (it tells of other tenants' use); in the padding, so the size stays */
  bool free_hidden;
} tport_device_info;

typedef struct tport_counter {
  char name[48];
  int64_t value;
} tport_counter;

const char *tport_strerror(int code);

/* Sizes and durations as people type them, parsed as tport's and tportd's
 * flags are (for bindings: Python's ttl="10m", timeout="5s"):
 *   size      a number of bytes, or with K M G T, KiB MiB GiB TiB (1024s),
 *             KB MB GB TB (1000s): "64GiB", "1.5G", "512M"
 *   duration  with ms, s, m, h or d: "500ms", "30s", "1.5h"; a bare number
 *             is seconds when bare_seconds, else milliseconds
 * Negatives, junk, fractions of a byte or millisecond and overflow fail
 * with INVALID_ARGUMENT; the message starts with what (the argument's
 * name) and names the accepted forms. */
int tport_parse_size(const char *text, const char *what, uint64_t *bytes, tport_err *err);
int tport_parse_duration_ms(const char *text, const char *what, bool bare_seconds, uint64_t *ms,
                            tport_err *err);

int tport_connect(const char *url, const tport_connect_options *opts, tport_client **out,
                  tport_err *err);
void tport_close(tport_client *c);

/* Refs: from a name, and to/from text (32 hex digits is a handle, anything
 * else a name). */
void tport_ref_name(tport_ref *ref, const char *name);
void tport_ref_format(const tport_ref *ref, char *buf, size_t len);
int tport_ref_parse(const char *text, tport_ref *ref, tport_err *err);

/* Puts a tensor whose bytes (nbytes = numel * element size) are laid out by
 * strides (elements; NULL: contiguous), which must be dense.  Over tcp://
 * and ipc:// the transport writes data straight from the caller's memory,
 * which must not change until the call returns; it returns only once nothing
 * reads it any more.  A put that fails while one of its chunks is still
 * stuck in the transport a timeout later (the server stopped reading) closes
 * the connection to take the bytes back: the tensors put on it without a
 * name go with it. */
int tport_put(tport_client *c, tport_dtype dtype, int ndim, const int64_t *sizes,
              const int64_t *strides, const void *data, size_t nbytes,
              const tport_put_options *opts, tport_tensor_info *out, tport_err *err);
/* Gets a tensor's values in logical C order into buf (cap bytes); info, when
 * not NULL, receives its description.  Over ipc:// and inproc:// (same
 * host, same user), a large tensor that the server holds on its cpu as it
 * is gets written by the server straight into buf (process_vm_writev; off
 * with TPORT_SHM_DIRECT=0): a get into buf that fails before the server's
 * answer came (the client's timeout, the connection lost) or whose write
 * the server gave up (DEADLINE_EXCEEDED, "may still land": memory that
 * never faults in, userfaultfd or FUSE) may still write buf later, as a
 * CUDA IPC get may write device memory (tport_get_dlpack). */
int tport_get(tport_client *c, const tport_ref *ref, void *buf, size_t cap, tport_tensor_info *info,
              tport_progress_fn progress, void *progress_arg, tport_err *err);
/* The same into a buffer it allocates (free() it). */
int tport_get_alloc(tport_client *c, const tport_ref *ref, void **buf, size_t *nbytes,
                    tport_tensor_info *info, tport_err *err);

int tport_info(tport_client *c, const tport_ref *ref, tport_tensor_info *out, tport_err *err);
/* Waiting for a name (a consumer of what a producer publishes, like Redis
 * BLPOP): with a ref by name that no ready tensor holds yet (none, or one
 * still uploading), the server answers once one is -- a put's commit, a
 * replace -- or TPORT_DEADLINE_EXCEEDED after wait_ms (counted on the
 * server from the request's arrival, and at most its --deadline, 30 s by
 * default: wait again for longer).  The client does not poll: the request
 * waits on the server, holding no thread there, and this call blocks (up to
 * wait_ms beyond the client's timeout).  A name that exists answers at
 * once; wait_ms 0 or a ref by handle is the call without _wait.  A
 * connection may have 16 requests waiting, a tenant 1024: past that,
 * TPORT_RESOURCE_EXHAUSTED at once.  A stopping server answers
 * TPORT_UNAVAILABLE. */
int tport_info_wait(tport_client *c, const tport_ref *ref, uint32_t wait_ms, tport_tensor_info *out,
                    tport_err *err);
/* tport_get / tport_get_alloc that wait for the name as tport_info_wait
 * does, in the same request (the get's first). */
int tport_get_wait(tport_client *c, const tport_ref *ref, uint32_t wait_ms, void *buf, size_t cap,
                   tport_tensor_info *info, tport_err *err);
int tport_get_alloc_wait(tport_client *c, const tport_ref *ref, uint32_t wait_ms, void **buf,
                         size_t *nbytes, tport_tensor_info *info, tport_err *err);
int tport_to(tport_client *c, const tport_ref *ref, const tport_to_options *opts,
             tport_tensor_info *out, bool *alias, tport_err *err);
int tport_copy(tport_client *c, const tport_ref *dst, const tport_ref *src, bool non_blocking,
               tport_err *err);
int tport_view(tport_client *c, const tport_ref *ref, int ndim, const int64_t *sizes,
               const int64_t *strides, int64_t offset, const char *name, tport_tensor_info *out,
               tport_err *err);
int tport_contiguous(tport_client *c, const tport_ref *ref, tport_memory_format fmt,
                     const char *name, tport_tensor_info *out, bool *alias, tport_err *err);
int tport_free(tport_client *c, const tport_ref *ref, tport_err *err);
/* Frees n tensors in as few requests as it can (up to TPORT_FREE_MAX_REFS
 * each): every one that exists is freed, and one that does not (freed
 * already, gone with its TTL or connection, replaced) is skipped, not an
 * error.  *freed (may be NULL): how many were. */
#define TPORT_FREE_MAX_REFS 1024
int tport_free_many(tport_client *c, const tport_ref *refs, size_t n, size_t *freed,
                    tport_err *err);
/* Waits for the tensor's pending device work (ref NULL: all work). */
int tport_sync(tport_client *c, const tport_ref *ref, tport_err *err);
/* The tenant's tensors (those of each of its connections, and those kept or
 * named) into *out (free() it), *n of them. */
int tport_list(tport_client *c, tport_tensor_info **out, size_t *n, tport_err *err);
/* The tenant's named tensors whose names begin with prefix (NULL or "":
 * every named one), sorted by name (strcmp): a state dict's names without
 * the rest of what the tenant holds.  The server filters (a server older
 * than the prefix sends everything, and libtport filters). */
int tport_list_named(tport_client *c, const char *prefix, tport_tensor_info **out, size_t *n,
                     tport_err *err);
int tport_devices(tport_client *c, tport_device_info **out, size_t *n, char *cuda_reason,
                  size_t reason_len, tport_err *err);
int tport_stats(tport_client *c, tport_counter **out, size_t *n, tport_err *err);

/* DLPack (dlpack.h): put a DLTensor, and get into a DLManagedTensor (host
 * memory, contiguous) or into a DLTensor of the caller's.
 *
 * Host tensors (kDLCPU, kDLCUDAHost) may have any strides.  GPU memory
 * (kDLCUDA; kDLCUDAManaged) is moved through the client's own pinned
 * chunks: the device-to-host copy of one chunk runs while the one before is
 * on the wire (a get: the mirror), never through a host copy of the whole
 * tensor.  It must be dense (any order of dimensions; a tensor with gaps or
 * overlaps is refused: make it contiguous on its device first), and
 * device_id must be the device the memory is on.  The CUDA runtime is
 * loaded (dlopen) the first time device memory is handed over:
 * $TPORT_CUDART_LIBRARY, else libcudart.so.13, else libcudart.so.12; a
 * client without one gets TPORT_FAILED_PRECONDITION naming what it looked
 * for.  The copies run on a stream of libtport's on the tensor's device,
 * ordered after the legacy default stream: work on other streams that
 * writes (a put) or reads (a get) the tensor must be complete before the
 * call.  Each client has one ring of pinned chunks (two of the server's
 * chunk size, allocated once and kept until tport_close): transfers of
 * device memory on one client take turns on it; use several clients to run
 * them side by side.  The calling thread's current device is the tensor's
 * during the call and restored before it returns.  Same host (the server's
 * shm socket reachable, shared memory not turned off by no_shm or
 * TPORT_SHM=0, TPORT_CUDA_IPC not 0): instead of the ring, the allocation
 * itself is handed to the server by CUDA IPC, once per connection, and
 * copied device to device; a put or get that fails before the server's
 * answer came (the client's timeout, the connection lost) may still be
 * carried out there, reading or writing the memory later. */
int tport_put_dlpack(tport_client *c, const DLTensor *t, const tport_put_options *opts,
                     tport_tensor_info *out, tport_err *err);
int tport_get_dlpack(tport_client *c, const tport_ref *ref, DLManagedTensor **out, tport_err *err);
/* Gets a tensor's values into dst, which the caller owns and which must
 * have the tensor's dtype (uint8 for a bool tensor) and sizes, and be
 * contiguous (strides NULL or row-major): kDLCPU, kDLCUDAHost, kDLCUDA or
 * kDLCUDAManaged memory (see above).  A mismatch is refused before a byte is
 * written; on another error dst may hold part of the values.  info, when
 * not NULL, receives the tensor's description.  When it returns TPORT_OK
 * the values are in dst (device copies complete). */
int tport_get_into_dlpack(tport_client *c, const tport_ref *ref, const DLTensor *dst,
                          tport_tensor_info *info, tport_err *err);

/* ---- Asynchronous requests
 *
 * tport_put_async, tport_get_async, tport_to_async, tport_copy_async, the
 * DLPack and batch variants return at once with a tport_request; the work
 * runs on libtport's threads (a small pool per client, started on the first
 * request: $TPORT_ASYNC_THREADS, default 4, at most 64), and many requests
 * in flight on one client share its connection, its window of chunks and
 * the server's limit of requests in flight.  Small puts waiting in the
 * queue together go to the server as one batch (tport_put_batch).  The
 * blocking calls run the same code on the calling thread.
 *
 * Buffers and results in flight: what a request reads (data, the DLTensor,
 * the batch's items) and writes (buf, out, info, alias) are the caller's
 * and must stay valid until the request completes -- after tport_cancel
 * too: a cancelled request may still be reading or writing until it
 * completes.  tport_request_free of a request in flight cancels it; the
 * memory it used is the caller's again only once it has completed (wait
 * first) -- except a get's buffer that the server was writing directly
 * when the get failed (see tport_get).  A get written directly is one
 * request: a cancel waits for it.  Options (names, devices) and sizes are
 * copied: they need not outlive the call.
 *
 * Completion: tport_test polls, tport_wait waits (timeout_ms < 0: for ever;
 * 0: a poll), tport_wait_any waits for the first of several; the waits
 * return the request's status once complete (TPORT_DEADLINE_EXCEEDED while
 * it is not: tport_test tells the two apart) and fill err with its error.  tport_cancel stops a put or get on the
 * socket between chunks (a put is aborted on the server: nothing of it
 * stays), and any request not yet started; it then completes with
 * TPORT_CANCELLED.  A request that is already past the point of no return
 * completes as it would have.  Each request is freed by tport_request_free
 * (also after its client is closed).
 *
 * The completion callback (done, when not NULL) runs once, on one of the
 * client's library threads, when the request's work is over (its results
 * written) and before it counts as complete: a tport_wait that returns
 * (or a tport_test that says true) has seen the callback return.  It may
 * read the results, test or free any request (its own too), and issue new
 * requests on any client.  It must not wait for a request that has not
 * completed -- its own never has, inside its callback -- (tport_wait with
 * a timeout other than 0, tport_wait_any) nor close the client: that
 * request may need the very thread the callback runs on.  Keep it short:
 * it holds up the requests queued behind it.
 *
 * tport_close with requests in flight: those not yet started complete with
 * TPORT_CANCELLED, those running with an error (TPORT_UNAVAILABLE or
 * TPORT_CANCELLED), their callbacks run, and tport_close returns once the
 * library's threads have ended; the requests stay valid until freed.  No
 * new request may be issued on a client being closed. */
typedef struct tport_request tport_request;
typedef void (*tport_request_fn)(tport_request *req, int status, void *arg);

int tport_put_async(tport_client *c, tport_dtype dtype, int ndim, const int64_t *sizes,
                    const int64_t *strides, const void *data, size_t nbytes,
                    const tport_put_options *opts, tport_tensor_info *out, tport_request_fn done,
                    void *done_arg, tport_request **req, tport_err *err);
int tport_get_async(tport_client *c, const tport_ref *ref, void *buf, size_t cap,
                    tport_tensor_info *info, tport_request_fn done, void *done_arg,
                    tport_request **req, tport_err *err);
int tport_to_async(tport_client *c, const tport_ref *ref, const tport_to_options *opts,
                   tport_tensor_info *out, bool *alias, tport_request_fn done, void *done_arg,
                   tport_request **req, tport_err *err);
int tport_copy_async(tport_client *c, const tport_ref *dst, const tport_ref *src,
                     bool non_blocking, tport_request_fn done, void *done_arg, tport_request **req,
                     tport_err *err);
/* tport_info_wait as a request (wait_ms 0: tport_info): the consumer of a
 * name that waits for it without a thread of the caller's.  While the
 * server waits the request holds a library thread of its own, past the
 * pool's bound (up to 16 such, as the server allows a connection), and no
 * window credit: waits never hold up the requests that would answer them.
 * tport_cancel ends the wait at once (the server's answer is dropped). */
int tport_info_async(tport_client *c, const tport_ref *ref, uint32_t wait_ms,
                     tport_tensor_info *out, tport_request_fn done, void *done_arg,
                     tport_request **req, tport_err *err);
/* t (and its shape and strides) / dst must live until completion. */
int tport_put_dlpack_async(tport_client *c, const DLTensor *t, const tport_put_options *opts,
                           tport_tensor_info *out, tport_request_fn done, void *done_arg,
                           tport_request **req, tport_err *err);
int tport_get_into_dlpack_async(tport_client *c, const tport_ref *ref, const DLTensor *dst,
                                tport_tensor_info *info, tport_request_fn done, void *done_arg,
                                tport_request **req, tport_err *err);

/* Whether req has completed (then tport_wait(req, 0, err) is its status). */
bool tport_test(tport_request *req);
int tport_wait(tport_request *req, int timeout_ms, tport_err *err);
/* Waits for the first of reqs[0..n) to complete (NULL entries are
 * skipped): *index is its index, and its status is returned.  No request
 * completes within the timeout: TPORT_DEADLINE_EXCEEDED, *index -1. */
int tport_wait_any(tport_request *const *reqs, size_t n, int timeout_ms, size_t *index,
                   tport_err *err);
/* The request's error (code TPORT_OK when it succeeded; the message the
 * blocking call would have given), readable from when its callback is
 * called -- inside the callback too -- until tport_request_free; NULL
 * before. */
const tport_err *tport_request_error(const tport_request *req);
void tport_cancel(tport_request *req);
void tport_request_free(tport_request *req);

/* ---- Batches
 *
 * n tensors in as few round trips as the server allows: small ones (under
 * 256 KiB, and each within the server's chunk) ride together in PutBatch
 * and GetBatch requests, with the server's window of such requests in
 * flight; without a shared-memory region, a put's elements of up to a
 * chunk do too (one of 256 KiB or more alone, its bytes lent to the
 * request as tport_put lends them: they must not change until the call
 * returns).  A larger put element without a region goes in chunks through
 * the same window: begun with the others of its kind in one PutBatch, its
 * chunks (lent too) and its commit following, the window kept full across
 * elements; a get's deferred elements are read in one window too (up to
 * a chunk: four to a GetBatch; larger: a GetBegin each, one element ahead
 * of its GetChunks); with a region, a
 * larger element goes as a tport_put or tport_get of its own would, and
 * the small put elements' bytes are copied into the automatic region (a
 * part of it for each PutBatch in flight) rather than sent on the socket;
 * a get's deferred elements of up to a chunk are written by the server
 * into such parts and copied out, once the region holds them (a get batch
 * grows it for the next one: a fresh region's pages cost more than the
 * socket, once).  The region is the batch's while its window runs: other
 * threads' transfers on the client go by the socket meanwhile.  A batch
 * whose requests time out unanswered retires that region, as a tport_put
 * or tport_get does.  A batch cancelled
 * (tport_cancel) first waits for the replies of the requests it has in
 * flight, so that each element's result says what the server did; an
 * element begun and not committed is aborted.  Each element has its
 * own result and error; one element's failure leaves the others alone.
 * An element the server answered with an error left nothing stored there
 * (a request whose reply the server could not make takes back what it had
 * stored; a replaced name's previous tensor is not brought back); one that
 * failed on this side (a timeout, the connection lost) may have been
 * stored.  Elements are independent, stored in no set order (the small
 * ones are grouped together, whatever lies between them): of two elements
 * with one name, either may be stored first.  Returns TPORT_OK when every
 * element succeeded, else the status of the first that failed (err: which,
 * and how many failed), or an error of the batch as a whole (the
 * connection). */
typedef struct tport_put_item {
  tport_dtype dtype;
  int ndim;
  const int64_t *sizes, *strides; /* strides NULL: contiguous */
  const void *data;
  size_t nbytes;
  const tport_put_options *opts; /* NULL: the defaults; progress is not called */
  tport_tensor_info info;        /* out: the stored tensor */
  tport_err err;                 /* out: TPORT_OK or this element's error */
} tport_put_item;

typedef struct tport_get_item {
  tport_ref ref;
  void *buf; /* cap bytes of the caller's; NULL: a buffer is allocated into data (free() it;
                tport_get_batch_dlpack: its DLManagedTensor's deleter, never free()) */
  size_t cap;
  void *data;             /* out: the values (buf, or the allocated buffer) */
  size_t nbytes;          /* out: how many bytes they are */
  tport_tensor_info info; /* out */
  tport_err err;          /* out */
} tport_get_item;

int tport_put_batch(tport_client *c, tport_put_item *items, size_t n, tport_err *err);
/* An element's buf of 256 KiB or more may be written by the server
 * directly, as tport_get's (same host): after an element failed without its
 * answer (a timeout, the connection lost), the server may still write it.
 * Where every element has its buf, the batch is planned by their caps
 * (no first GetBatch to learn the sizes): such writes go up to 32 MiB of
 * them a request, each request's in one write. */
int tport_get_batch(tport_client *c, tport_get_item *items, size_t n, tport_err *err);
/* The same as requests: items (and what they point to) live until completion. */
int tport_put_batch_async(tport_client *c, tport_put_item *items, size_t n, tport_request_fn done,
                          void *done_arg, tport_request **req, tport_err *err);
int tport_get_batch_async(tport_client *c, tport_get_item *items, size_t n, tport_request_fn done,
                          void *done_arg, tport_request **req, tport_err *err);
/* tport_get_batch whose elements without a buffer (buf NULL) get one as
 * tport_get_dlpack's: from the buffers libtport keeps for its gets, where a
 * pipeline's next state dict finds the memory of its values of 1 MiB or
 * more already mapped, up to TPORT_GET_CACHE_BYTES (malloc maps every block
 * over its threshold, 32 MiB at most, fresh, and fresh memory faults in a
 * page at a time: a get_dict of 4 x 64 MiB went from ~150 to ~90 ms on a
 * VM).  out (n slots) receives element i's as a DLManagedTensor (its data
 * is items[i].data), whose shape and dtype make exactly its bytes (a server
 * that says otherwise fails the element, TPORT_DATA_LOSS): call its deleter
 * when done, never free() the data.  out[i] is NULL where element i failed
 * or had a buffer of its own; the _async variant sets every out[i] to NULL
 * (and each element to TPORT_CANCELLED) before it returns, so that a
 * request cancelled before it starts leaves nothing of an earlier call. */
int tport_get_batch_dlpack(tport_client *c, tport_get_item *items, size_t n,
                           DLManagedTensor **out, tport_err *err);
int tport_get_batch_dlpack_async(tport_client *c, tport_get_item *items, size_t n,
                                 DLManagedTensor **out, tport_request_fn done, void *done_arg,
                                 tport_request **req, tport_err *err);

/* ---- Same-host shared memory
 *
 * A region is memory this process shares with the server: a memfd, sealed
 * so that it can never shrink, handed to the server as a file descriptor
 * over its Unix socket (never by a name another process could open) and
 * tied to this client's connection.  Fill it in place and put from it, or
 * get into it: the bytes are copied once, by the server, and never cross a
 * socket.  A region lives until tport_shm_release (or the connection's
 * end, on the server's side).  Needs a local URL and a server that offers
 * shared memory (tport_shm_available).  A put or get of a region that
 * fails before the server's answer came (DEADLINE_EXCEEDED from the
 * client's timeout, the connection lost) may still be carried out: the
 * server may read or write the slice later, so put other bytes there only
 * in a region made since (libtport's automatic region does so). */
typedef struct tport_shm tport_shm;

bool tport_shm_available(tport_client *c);
/* A region of nbytes, mapped here and registered with the server. */
int tport_shm_create(tport_client *c, size_t nbytes, tport_shm **out, tport_err *err);
void *tport_shm_data(const tport_shm *r);
size_t tport_shm_size(const tport_shm *r);
/* Puts the tensor whose bytes lie at offset in the region (laid out by
 * strides, dense, as tport_put). */
int tport_put_shm(tport_client *c, tport_shm *r, size_t offset, tport_dtype dtype, int ndim,
                  const int64_t *sizes, const int64_t *strides, const tport_put_options *opts,
                  tport_tensor_info *out, tport_err *err);
/* Gets a tensor's values (logical C order) into the region at offset, in
 * at most cap bytes; *nbytes (when not NULL) is how many it holds. */
int tport_get_shm(tport_client *c, const tport_ref *ref, tport_shm *r, size_t offset, size_t cap,
                  tport_tensor_info *info, size_t *nbytes, tport_err *err);
/* The same in the order of memory format fmt (TPORT_MF_CHANNELS_LAST: the
 * NHWC bytes of an NCHW tensor; CONTIGUOUS: as tport_get_shm). */
int tport_get_shm_format(tport_client *c, const tport_ref *ref, tport_shm *r, size_t offset,
                         size_t cap, tport_memory_format fmt, tport_tensor_info *info,
                         size_t *nbytes, tport_err *err);
/* A DLTensor (kDLCPU, contiguous) over the bytes a tport_get_shm wrote at
 * offset, described by its info: no copy (valid while the region lives). */
int tport_shm_dlpack(const tport_shm *r, size_t offset, const tport_tensor_info *info,
                     DLTensor *out, int64_t shape[TPORT_MAX_DIMS], tport_err *err);
/* Releases the region on the server and unmaps it here; r is freed.
 * tport_close releases (and frees) every region of its client: a region
 * may not be used after its client is closed. */
int tport_shm_release(tport_shm *r, tport_err *err);

#ifdef __cplusplus
}
#endif
#endif
