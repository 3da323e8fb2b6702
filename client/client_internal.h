/*
 * client_internal.h: what libtport's files share, layer by layer from the
 * bottom up.  A file calls only what the layers below its own declare: no
 * file calls back up, so there is no circle (test_client_layers reads the
 * calls from the objects and fails on one).  copy_pool.h, cuda_rt.h,
 * cuda_stage.h, cuda_ipc.h, env.h (the TPORT_* variables) and
 * scheme_probe.h (what a failed dial's other end speaks) declare leaves of
 * their own.
 *
 *   rpc.c, copy_pool.c, cuda_rt.c   a request's frame, slots, credits, one
 *                                   exchange; large copies; the CUDA runtime
 *   request.c                       requests that complete later: the queue,
 *                                   the library's threads, waits, cancel
 *   session.c                       the Hello, and the gate every request passes
 *   wire.c                          conversions to and from the wire's messages
 *   window.c                        a transfer's chunks with the window in flight
 *   shm.c, cuda_stage.c, cuda_ipc.c regions (the application's, the automatic
 *                                   one); device memory: the ring, CUDA IPC
 *   put_socket.c, get_socket.c      a put or a get by requests on the socket
 *   path.c                          which way a put or a get goes
 *   batch.c                         many tensors: small ones in one request
 *   client.c, ops.c, dlpack.c       the API: connection, one-request calls, DLPack
 *   parse.c                         the API: sizes and durations (proto/units.c)
 *   async.c                         the API's calls as requests (request.c)
 */
#ifndef TPORT_CLIENT_INTERNAL_H
#define TPORT_CLIENT_INTERNAL_H

#include <nng/nng.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>
#include <time.h>

#include "frame.h"
#include "tport.h"

#define CLIENT_MAX_WINDOW 64

struct tport_client {
  nng_socket sock;
  int timeout_ms;
  size_t chunk_bytes; /* the server's */
  int window;
  bool keep;
  bool verify; /* CRC32C on every chunk (tport_connect_options.verify) */
  /* a put's chunks lend the caller's bytes to their requests instead of
   * copying them (ops.c): tcp:// and ipc:// send them from there */
  bool lend_chunks;
  /* the client's connection now (0: none), kept by pipe events: a put whose
   * lent bytes are stuck in it closes it (ops.c) */
  atomic_uint live_pipe;
  /* requests in flight across all threads stay within the server's
   * max_outstanding (it drops a connection that goes past it) */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int credits;
  nng_pipe reply_pipe; /* the connection the latest reply came on (the Hello's
                          challenge binds to it) */
  /* same host (shm.c): the server's shm socket ("" when it offers none),
   * whether tport_put/tport_get use a region on their own, and the region
   * they use (one at a time: shm_mu) */
  char shm_socket[108];
  /* the user at the other end of an ipc:// connection (SO_PEERCRED, read
   * at each Hello; -1 for other transports): regions may go to a server of
   * that user as well as of this one or root (transport_shm_send_to) */
  _Atomic uid_t server_uid;
  atomic_bool shm_auto; /* read before shm_mu is taken; turned off under it */
  atomic_bool get_expect; /* the last Hello's get_expect: GetBegin checks expect_* */
  atomic_bool batch_get_slices; /* the last Hello's: GetBatch elements may name slices */
  pthread_mutex_t shm_mu;
  struct tport_shm *shm_cache;
  struct tport_shm *shm_retired; /* unmapped, not yet released on the server (shm_mu) */
  size_t shm_grow_to; /* a transfer found the region short of this: grown at its next use (shm_mu) */
  int64_t shm_retry_ms; /* a region refused for now (quota): not asked again before this */
  /* the server reads a large put's chunks from the caller's buffer itself
   * (process_region.c): whether it may (ipc:// or inproc://, the server
   * says it can, TPORT_SHM_DIRECT not 0), the region it took on which
   * connection, the connection that refused one, and the token the server
   * sent that proves this process is the connection's (proc_mu) */
  bool proc_on;
  pthread_mutex_t proc_mu;
  uint64_t proc_region;
  unsigned proc_pipe, proc_refused_pipe;
  uint8_t proc_probe[16];
  _Atomic uint64_t proc_read_max; /* the last Hello's: bytes one chunk of it may name (0: one) */
  _Atomic bool proc_put_once;     /* the last Hello's: a PutBegin with commit may name it */
  _Atomic bool proc_gets;         /* the last Hello's: a get may be written straight into it */
  _Atomic bool put_runs;          /* the last Hello's: a PutBatch's alike elements go as runs */
  /* the application's regions, unmapped by tport_close */
  pthread_mutex_t regions_mu;
  struct tport_shm *regions;
  /* device memory over the network (cuda_stage.c): the ring of pinned
   * chunks, made on first use and held by one transfer at a time */
  pthread_mutex_t stage_mu;
  struct client_stage *stage;
  /* device memory on the same host (cuda_ipc.c): whether it may go by
   * CUDA IPC, and the allocations this connection registered (ipc_mu) */
  bool cuda_ipc;
  pthread_mutex_t ipc_mu;
  struct client_ipc *ipc;
  /* the Hello, said again when nng has redialed (the server restarted or
   * dropped the connection): a new connection has proved nothing and would
   * be refused, or served as tenant "default".  What it needs (owned; the
   * secret cleansed at close), and the connection it was last said on. */
  char *url, *tenant, *secret, *secret_file;
  /* the open slots of every thread, library threads' requests included:
   * tport_close ends their waits (client_slots_abort) before it closes the
   * socket -- nng 1.5.2 panics on a context closed while its socket closes */
  pthread_mutex_t slots_mu;
  struct client_slot *slots;
  bool closing; /* no slot opens or sends any more (slots_mu) */
  pthread_mutex_t hello_mu;
  atomic_uint hello_pipe; /* 0: not yet said */
  /* asynchronous requests: their queue and threads (request.c) */
  struct client_pool *pool;
};

/* A request in flight on its own context. */
typedef struct client_slot {
  tport_client *owner;
  nng_ctx ctx;
  nng_aio *aio;
  nng_msg *reply;
  size_t offset, len; /* the chunk it carries */
  enum { SLOT_IDLE, SLOT_SENDING, SLOT_RECEIVING } phase;
  bool refused; /* a send not started: the client is closing */
  struct client_slot *prev, *next; /* the client's open slots (slots_mu) */
  /* The end of the reply's payload read by nng straight into the caller's
   * memory (client_slot_recv_into): armed, where (up to CLIENT_TAIL_SEGMENTS
   * places, in order), and how much of the reply went there (placed: 0 for
   * one that came whole in the reply). */
  bool tail_armed;
  unsigned ntail;
  uint8_t *tail[4];
  size_t tail_n[4], tail_len, placed;
} client_slot;

/* The places a reply's end may be read into (deploy/nng 0014). */
#define CLIENT_TAIL_SEGMENTS 4

/* A reply's raw payload; msg owns the bytes (nng_msg_free it). */
typedef struct client_payload {
  const uint8_t *data;
  size_t len;
  nng_msg *msg;
} client_payload;

/* ---------------------------------------------------------------- rpc.c */

int client_pack(uint16_t method, const ProtobufCMessage *q, const void *payload, size_t n,
                nng_msg **out, tport_err *err);
int client_unpack(uint16_t method, nng_msg *m, const ProtobufCMessageDescriptor *d,
                  ProtobufCMessage **out, client_payload *payload, tport_err *err);
/* The same, unpacked into arena a (NULL: malloc): the message goes with the
 * arena, never freed by itself. */
int client_unpack_in(uint16_t method, nng_msg *m, const ProtobufCMessageDescriptor *d,
                     struct arena *a, ProtobufCMessage **out, client_payload *payload,
                     tport_err *err);
/* CLOCK_REALTIME ms from now, for pthread_cond_timedwait */
struct timespec client_deadline_after(int ms);
/* Takes k request credits, all at once (so that threads that each need
 * several never deadlock), waiting up to the client's timeout.  Only the
 * Hello takes them so: every other request through client_credits_take. */
int client_credits_wait(tport_client *c, int k, tport_err *err);
void client_credits_give(tport_client *c, int k);
int client_slot_open(tport_client *c, client_slot *s, tport_err *err);
void client_slot_close(client_slot *s);
/* tport_close: no slot opens or sends from now on, and every wait of an
 * open one ends (UNAVAILABLE). */
void client_slots_abort(tport_client *c);
void client_slot_send(client_slot *s, nng_msg *m);
/* Before client_slot_send: the last n[0] + .. + n[k-1] bytes of the reply's
 * payload are read by nng straight into dst[0..k) in order (deploy/nng
 * 0014: over tcp, ipc and tls, a reply from NNG_RECV_TAIL_MIN bytes on; a
 * no-op without it): the reply's take finds s->placed bytes there, not in
 * s->reply (a frame whose payload lacks them: the take checks that the
 * reply is the one planned).  The places are written by nng until the
 * slot's reply was taken or the slot closed -- a request that fails while
 * its reply is arriving waits for the read to end (up to the client's
 * timeout, then the connection is closed). */
void client_slot_recv_into(client_slot *s, uint8_t *const *dst, const size_t *n, unsigned k);
/* s's placed bytes back at the end of its reply, read from their places
 * (a reply not laid out as planned, taken as if nothing was placed).
 * RESOURCE_EXHAUSTED without the memory. */
int client_slot_unplace(client_slot *s, tport_err *err);
int client_slot_finish(client_slot *s, tport_err *err);
/* One request and its reply on a slot of its own, credits not taken
 * (reply_pipe, when not NULL: the connection the reply came on). */
int client_exchange(tport_client *c, uint16_t method, const ProtobufCMessage *q,
                    const void *payload, size_t n, const ProtobufCMessageDescriptor *d,
                    ProtobufCMessage **out, client_payload *reply_payload, nng_pipe *reply_pipe,
                    tport_err *err);

/* ---------------------------------------------------------------- request.c */

/* A request's work, on a library thread: its status (err its error). */
typedef int (*client_run_fn)(tport_request *r, tport_err *err);

struct tport_request {
  tport_client *client; /* until it completes */
  client_run_fn run;
  void *work; /* what run needs (async.c's), freed with the request */
  void (*free_work)(void *);
  tport_request_fn done;
  void *done_arg;
  atomic_bool cancel;
  bool waits; /* it waits for a name on the server: outside the pool's bound */
  /* under request.c's lock */
  int refs;
  bool finished; /* status and err final: its callback may be running */
  bool complete; /* and the callback has returned */
  int waiters;   /* tport_wait/_any calls waiting for it: its completion wakes them */
  nng_aio *abort; /* the aio its wait for a name blocks on: tport_cancel aborts it */
  int status;
  tport_err err;
  /* under the client's pool lock */
  struct tport_request *next;                /* the queue */
  struct tport_request *live_prev, *live_next; /* queued or running */
};

/* The client's pool, no thread started yet / at tport_close: every request
 * cancelled and no new one taken (stop), then its threads ended once the
 * queue is empty (join; the socket closed between the two ends the running
 * requests' waits). */
int client_pool_init(tport_client *c, tport_err *err);
void client_pool_stop(tport_client *c);
void client_pool_join(tport_client *c);
/* Queues a request running run(work) (free_work frees work, also when the
 * request cannot be made) and starts a thread where none is idle. */
int client_request_start(tport_client *c, client_run_fn run, void *work,
                         void (*free_work)(void *), tport_request_fn done, void *done_arg,
                         tport_request **out, tport_err *err);
/* client_request_start of a request that waits for a name on the server:
 * it gets a thread of its own past the pool's bound (the server lets a
 * connection have 16 such requests), so that waits never hold up the
 * requests that would answer them. */
int client_request_start_waiting(tport_client *c, client_run_fn run, void *work,
                                 void (*free_work)(void *), tport_request_fn done,
                                 void *done_arg, tport_request **out, tport_err *err);
/* On a library thread running a request: aio (NULL: none any more) is what
 * it blocks on, aborted by tport_cancel.  false where no request runs. */
bool client_request_abortable(nng_aio *aio);
/* aio's operation has just started: aborts it where that request was
 * cancelled meanwhile (rpc.c calls it after each send and receive starts). */
void client_request_started(nng_aio *aio);
/* Takes up to max queued requests of run, oldest first, off the queue: the
 * caller runs them and finishes each (client_request_finish). */
size_t client_requests_take(tport_client *c, client_run_fn run, tport_request **out, size_t max);
/* r has completed with status (e its error): its callback called, then
 * its waiters woken, then the library's reference dropped. */
void client_request_finish(tport_request *r, int status, const tport_err *e);
/* The same for a request (no payload) that waits for a name on the
 * server: its reply may take wait_ms longer than the client's timeout.
 * *unanswered (when not NULL): it failed after the request went out and
 * before its reply was read (a timeout, a cancel, the connection lost) --
 * the server may still carry it out. */
int client_exchange_waiting(tport_client *c, uint32_t wait_ms, uint16_t method,
                            const ProtobufCMessage *q, const ProtobufCMessageDescriptor *d,
                            ProtobufCMessage **out, client_payload *reply_payload,
                            bool *unanswered, tport_err *err);

/* ---------------------------------------------------------------- session.c */

/* The Hello on the connection of the moment (answering a challenge when
 * the server asks); *out the server's reply (free it).  On success
 * hello_pipe is the connection it was said on. */
int client_say_hello(tport_client *c, Tport__HelloReply **out, tport_err *err);
/* Frees what the Hello needs (its secret cleansed). */
void client_session_forget(tport_client *c);
/* Every request's first step: the Hello said again where nng has redialed
 * since, then k credits (client_credits_wait). */
int client_credits_take(tport_client *c, int k, tport_err *err);
/* One request through that gate, and its reply. */
int client_rpc(tport_client *c, uint16_t method, const ProtobufCMessage *q, const void *payload,
               size_t n, const ProtobufCMessageDescriptor *d, ProtobufCMessage **out,
               client_payload *reply_payload, tport_err *err);
/* client_rpc of a request (no payload) that may wait wait_ms for a name;
 * *unanswered as client_exchange_waiting's. */
int client_rpc_waiting(tport_client *c, uint32_t wait_ms, uint16_t method,
                       const ProtobufCMessage *q, const ProtobufCMessageDescriptor *d,
                       ProtobufCMessage **out, client_payload *reply_payload, bool *unanswered,
                       tport_err *err);

/* ---------------------------------------------------------------- wire.c */

void client_ref_to_wire(const tport_ref *ref, Tport__Ref *w);
void client_info_from_wire(const Tport__TensorInfo *w, tport_tensor_info *out);
/* The PutBeginRequest of a put (without data or commit) into q and desc. */
void client_put_request(tport_client *c, tport_dtype dtype, int ndim, const int64_t *sizes,
                        const int64_t *strides, const tport_put_options *opts,
                        Tport__TensorDesc *desc, Tport__PutBeginRequest *q);
/* What a get into a caller's tensor expects: the tensor's dtype and sizes
 * (its bytes then fill the cap bytes exactly). */
typedef struct client_get_want {
  tport_dtype dtype;
  int ndim;
  const int64_t *sizes;
} client_get_want;
/* A tensor the caller's does not match (want): INVALID_ARGUMENT naming
 * the difference. */
int client_want_mismatch(const client_get_want *w, const Tport__TensorInfo *wire, tport_err *err);

/* ---------------------------------------------------------------- window.c */

/* Builds the request for bytes [off, off + len) / takes its reply. */
typedef int (*window_make_fn)(void *ctx, size_t off, size_t len, nng_msg **out, tport_err *err);
typedef int (*window_reply_fn)(void *ctx, client_slot *s, tport_err *err);
/* Moves nbytes in chunks with up to the server's window of requests in
 * flight, each on its own context; chunks go out in order and their replies
 * are taken oldest first.  Once *stop is set (stop not NULL) no chunk more
 * is sent and it returns TPORT_CANCELLED (the request was cancelled). */
int client_run_window(tport_client *c, size_t nbytes, size_t chunk, window_make_fn make,
                      window_reply_fn take, void *ctx, tport_progress_fn progress, void *arg,
                      const atomic_bool *stop, tport_err *err);
/* Where the end of the reply to the chunk [off, off + len) (a unit: off =
 * u, len = 1) may be read by nng (client_slot_recv_into): up to
 * CLIENT_TAIL_SEGMENTS places dst[i] of n[i] bytes; returns how many (0:
 * none). */
typedef unsigned (*window_into_fn)(void *ctx, size_t off, size_t len, uint8_t **dst, size_t *n);
/* client_run_window whose chunks' replies may be read straight into place
 * (into: the take finds s->placed). */
int client_run_window_into(tport_client *c, size_t nbytes, size_t chunk, window_make_fn make,
                           window_reply_fn take, window_into_fn into, void *ctx,
                           tport_progress_fn progress, void *arg, const atomic_bool *stop,
                           tport_err *err);
/* How many of the first units must have been answered before unit u goes
 * (at most u). */
typedef size_t (*window_after_fn)(void *ctx, size_t u);
/* n requests (units 0..n-1: make and take see off = u, len = 1) through the
 * window as client_run_window's chunks, unit u sent only once the replies
 * of units [0, after(ctx, u)) were taken; a unit make gives no message for
 * (*out NULL) is skipped: nothing is sent, its take is not called. */
int client_run_units(tport_client *c, size_t n, window_make_fn make, window_reply_fn take,
                     window_after_fn after, window_into_fn into, void *ctx,
                     const atomic_bool *stop, tport_err *err);

/* ---------------------------------------------------------------- shm.c */

/* A region: the server's name for it, and its mapping here. */
struct tport_shm {
  tport_client *client;
  uint64_t id;
  int fd; /* until the server has it */
  uint8_t *data;
  size_t nbytes;
  unsigned pipe;                 /* the connection it was registered on */
  struct tport_shm *prev, *next; /* the client's regions (regions_mu) */
  struct tport_shm *retired;     /* the automatic regions retired after it (shm_mu) */
};

/* Bytes [off, off + len) of a region, as the wire names them. */
static inline Tport__ShmSlice client_slice(const struct tport_shm *r, size_t off, size_t len)
{
  Tport__ShmSlice s = TPORT__SHM_SLICE__INIT;
  s.region = r->id;
  s.offset = off;
  s.length = len;
  return s;
}

/* Puts and gets of at least this many bytes go through the automatic
 * region (smaller ones cost less on the socket than the copy in). */
#define CLIENT_SHM_MIN_BYTES ((size_t)256 << 10)
/* ... and at most this many (a region that large is not kept for reuse) */
#define CLIENT_SHM_MAX_BYTES ((size_t)4 << 30)
/* The most bytes a chunk from the process region names, whatever the
 * server says it reads at once (client_process_span). */
#define CLIENT_PROCESS_SPAN_MAX ((size_t)1 << 30)

/* Bytes [offset, offset + the tensor's) of r, for a dense tensor of that
 * dtype and sizes: *nbytes, checked to lie within the region. */
int client_shm_tensor_at(const struct tport_shm *r, size_t offset, tport_dtype dtype, int ndim,
                         const int64_t *sizes, size_t *nbytes, tport_err *err);
/* A put from nbytes at offset of r, in one request (opts NULL: the
 * defaults).  *unanswered (when not NULL): it failed with the request sent
 * and no answer read, so the server may still read r (and store what it
 * finds there then). */
int client_shm_put(tport_client *c, struct tport_shm *r, size_t offset, size_t nbytes,
                   tport_dtype dtype, int ndim, const int64_t *sizes, const int64_t *strides,
                   const tport_put_options *opts, tport_tensor_info *out, bool *unanswered,
                   tport_err *err);
/* The automatic region for a transfer of up to cap bytes (cap 0: whatever
 * size it has; grown to cap where it may be, and to what a transfer before
 * asked for), locked: NULL when there is none to use (busy, off).  Unlock
 * with client_shm_auto_done (want: a tensor of that many bytes had no room
 * in it, grow it at the next use). */
struct tport_shm *client_shm_auto_take(tport_client *c, size_t cap);
void client_shm_auto_done(tport_client *c, size_t want);
/* The automatic region is wanted this large (want) at its next use, where
 * it was not taken now (none yet, or busy). */
void client_shm_auto_want(tport_client *c, size_t want);
/* Unlocks the automatic region and never uses it again: the server may
 * still write into it (a get's chunk requests were in flight when it
 * failed), so the next transfer gets a fresh one. */
void client_shm_auto_retire(tport_client *c);
/* Unmaps the client's regions (tport_close). */
void client_shm_close(tport_client *c);
struct client_get_desc;
/* GetBegin with the automatic region r offered (and g's direct_region,
 * if any): the server writes the
 * tensor there when it fits and is not small (reply's shm), else answers
 * as an ordinary GetBegin.  *unanswered: it failed with the request sent
 * and no answer read, so the server may still write r. */
int client_shm_get_begin(tport_client *c, const struct client_get_desc *g, struct tport_shm *r,
                         Tport__GetBeginReply **out, client_payload *payload, bool *unanswered,
                         tport_err *err);
/* The bytes a get wrote at offset of r (at most cap): checked against the
 * reply (and its CRC32C with verify). */
int client_shm_check_get(tport_client *c, const Tport__GetBeginReply *b, const struct tport_shm *r,
                         size_t offset, size_t cap, tport_err *err);
bool client_url_is_local(const char *url);

/* ------------------------------------------------------- put_socket.c, get_socket.c */

/* Device memory a put reads or a get writes (cuda_stage.h). */
struct client_devmem;
/* Writes a put's nbytes into dst, in logical C order. */
typedef void (*client_fill_fn)(void *dst, size_t nbytes, void *arg);
/* A put: the tensor, and where its bytes are -- exactly one of data (host
 * memory, laid out as strides say), dev (dense device memory) and fill
 * (values written on demand, strides NULL). */
typedef struct client_put_desc {
  tport_dtype dtype;
  int ndim;
  const int64_t *sizes, *strides;
  size_t nbytes;
  const void *data;
  const struct client_devmem *dev;
  client_fill_fn fill;
  void *fill_arg;
  const tport_put_options *opts; /* NULL: the defaults (never NULL below path.c) */
  const atomic_bool *cancel;     /* set: stop between chunks (NULL: never) */
  bool not_direct; /* never read by the server from the caller's buffer (it gave up once) */
} client_put_desc;
/* A get: the tensor, and where its bytes go -- buf (host memory of cap
 * bytes), dev (device memory of cap bytes), or a buffer made for them
 * (alloc: malloc'd, or with alloc_blocks from get_blocks.h, freed with
 * get_block_free); want, when not NULL, the tensor the destination is
 * (checked before a byte is written). */
typedef struct client_get_desc {
  const tport_ref *ref;
  void *buf;
  const struct client_devmem *dev;
  size_t cap;
  bool alloc;
  bool alloc_blocks;
  const client_get_want *want;
  tport_progress_fn progress;
  void *progress_arg;
  const atomic_bool *cancel; /* set: stop between chunks (NULL: never) */
  uint32_t wait_ms; /* a ref by name not there yet: the server waits this long */
  /* the connection's process region, offered for a get straight into buf
   * (process_region.c; 0: none) */
  uint64_t direct_region;
  /* the bytes of what this get is a part of (a batch's deferred elements;
   * 0: its own): from COPY_POOL_OUT_STREAM_MIN its bytes are copied into
   * their buffer with streaming stores, as one get of them all would be */
  size_t out_total;
} client_get_desc;
/* Requests that lend the caller's bytes (nng sends them from there, tcp
 * and ipc) instead of copying them, and how many nng still holds. */
typedef struct lent_chunks {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int outstanding;
} lent_chunks;
/* Lends the k (1 to CLIENT_LEND_SEGMENTS) segments ps[i] (ns[i] bytes) to
 * m, after its body, as its payload's end (copied where nng cannot take
 * them). */
#define CLIENT_LEND_SEGMENTS 4
int client_msg_lend(lent_chunks *l, nng_msg *m, const void *const *ps, const size_t *ns, int k,
                    tport_err *err);
/* The request q with the n bytes at p lent to it as its payload (copied
 * where nng cannot take them). */
int client_pack_lent(lent_chunks *l, uint16_t method, const ProtobufCMessage *q, const void *p,
                     size_t n, nng_msg **out, tport_err *err);
/* Returns once nng holds none of l's bytes (closing the connection where
 * a request is stuck in the transport a timeout later). */
void client_lent_wait(tport_client *c, lent_chunks *l);
/* A put of d's data or dev (not fill) by requests on the socket: with
 * region (the automatic one, locked by the caller, as large as the
 * tensor), each chunk is copied into it and named by its slice; dev is
 * staged through the pinned ring. */
int client_socket_put(tport_client *c, const client_put_desc *d, struct tport_shm *region,
                      tport_tensor_info *out, tport_err *err);
/* The same for d's host data of more than a chunk, its chunks named as
 * slices of the process region proc (the caller's own buffer, read by the
 * server: process_region.c).  *given_up: the server gave up a read of it
 * (DEADLINE_EXCEEDED: memory that pages in too slowly, or never). */
int client_socket_put_direct(tport_client *c, const client_put_desc *d, uint64_t proc,
                             tport_tensor_info *out, bool *given_up, tport_err *err);
/* The connection's process region (regions.h on the server): registered on
 * first use, *id; nonzero where the server cannot read this process (not
 * ipc:// or inproc://, another user, refused on this connection). */
int client_process_region(tport_client *c, uint64_t *id);
/* Whether this client may use one (set at tport_connect). */
void client_process_init(tport_client *c, const char *url, bool server_can);
/* The bytes a put's chunk from the process region names, for chunks of
 * chunk bytes: a whole number of them, as many as the server reads at once
 * (the last Hello's process_read_max_bytes), CLIENT_PROCESS_SPAN_MAX at most. */
size_t client_process_span(const tport_client *c, size_t chunk);
/* The most bytes one PutBatch may name of the process region, its elements
 * read together by the server (0: none, the server reads no such put). */
size_t client_process_batch_bytes(const tport_client *c);
/* The connection's process region for a get of up to cap bytes straight
 * into buf (the server writes them there, process_vm_writev), or 0: a host
 * buffer of the caller's, large enough for the automatic region, on a
 * connection whose server writes so. */
uint64_t client_get_direct_region(tport_client *c, const void *buf, size_t cap);
/* The same for any such buffer: the connection's process region, or 0. */
uint64_t client_gets_direct_region(tport_client *c);
/* The most bytes one GetBatch's elements may ask written into the
 * caller's memory (the server writes them in one write: the last Hello's
 * process_read_max_bytes, or a chunk). */
size_t client_get_batch_direct_bytes(const tport_client *c);
/* GetBeginRequest's direct_* from g (none where g offers none). */
void client_get_direct_fill(const struct client_get_desc *g, Tport__GetBeginRequest *q);
/* A fresh nonzero token for a batch's fence (PutBatchRequest.fence_token):
 * none this process made before (counted from a random start), so that
 * memory an earlier batch's fence was never holds this one's. */
uint64_t client_fence_token(void);
/* Whether a put of host data with opts is one the server should read from
 * the caller's buffer (if large enough: the caller's rule): one stored on
 * the cpu as it is (a device's or a converted tensor would be copied again
 * from what was read; the region, copied into by a few threads and read by
 * the GPU where it is pinned, serves those better).  Not whether it can
 * (client_process_region). */
bool client_put_reads_direct(const tport_client *c, const tport_put_options *opts,
                             const void *data, size_t nbytes);
/* A get by requests on the socket, with region (locked by the caller)
 * offered: *alloced the buffer (g->alloc), *nbytes the tensor's bytes;
 * *region_want the bytes of a tensor the region had no room for (0: none),
 * for client_shm_auto_done; *region_spoiled when the server may still
 * write into the region (client_shm_auto_retire then). */
int client_socket_get(tport_client *c, const client_get_desc *g, struct tport_shm *region,
                      void **alloced, size_t *nbytes, tport_tensor_info *info, size_t *region_want,
                      bool *region_spoiled, tport_err *err);
/* With verify: the n bytes at p (the chunk at off) must have the CRC32C
 * the server sent (set: whether it sent one). */
int client_check_crc32c(bool verify, bool set, uint32_t sent, const uint8_t *p, size_t n,
                        size_t off, tport_err *err);
/* Where the tensor of b (n bytes) goes: a buffer made for it (g->alloc),
 * or the caller's, checked before a byte is written; device memory takes
 * the ring (*stage). */
int client_get_destination(tport_client *c, const client_get_desc *g, const Tport__GetBeginReply *b,
                           size_t n, size_t chunk, uint8_t **buf, struct client_stage **stage,
                           tport_err *err);
/* The rest of a get whose GetBegin (or a batch's element of one) was
 * answered by b, inl its inline bytes (msg may be NULL), region the one
 * offered (NULL: none; a reply that says it wrote into one is DATA_LOSS). */
int client_socket_get_rest(tport_client *c, const client_get_desc *g, const Tport__GetBeginReply *b,
                           const client_payload *inl, const struct tport_shm *region,
                           void **alloced, size_t *nbytes, tport_tensor_info *info, tport_err *err);

/* ---------------------------------------------------------------- path.c */

/* tport_put of d, by the way path.c chooses. */
int client_put(tport_client *c, const client_put_desc *d, tport_tensor_info *out, tport_err *err);
/* tport_get of g, likewise: *alloced and *nbytes as client_socket_get's. */
int client_get(tport_client *c, const client_get_desc *g, void **alloced, size_t *nbytes,
               tport_tensor_info *info, tport_err *err);

/* ---------------------------------------------------------------- batch.c */

/* Whether a put of nbytes rides in a batch's request (else goes alone). */
bool client_batch_fits(const tport_client *c, size_t nbytes);
/* tport_put_batch / tport_get_batch, stopped between elements and chunks
 * once *cancel is set (NULL: never). */
int client_put_batch(tport_client *c, tport_put_item *items, size_t n, const atomic_bool *cancel,
                     tport_err *err);
/* With managed (n slots): the elements without a buffer of their own get
 * one of get_blocks.h, handed over as managed[i] (NULL where none). */
int client_get_batch(tport_client *c, tport_get_item *items, size_t n, DLManagedTensor **managed,
                     const atomic_bool *cancel, tport_err *err);

/* ---------------------------------------------------------------- dlpack.c */

/* buf (a block of get_blocks.h holding the nbytes of info's values) as a
 * DLManagedTensor whose deleter gives the block back; TPORT_DATA_LOSS when
 * info's sizes and dtype do not make exactly nbytes (a lying server: the
 * DLTensor's readers would read past the block).  On failure buf is given
 * back. */
int client_managed_block(void *buf, size_t nbytes, const tport_tensor_info *info,
                         DLManagedTensor **out, tport_err *err);

#endif
