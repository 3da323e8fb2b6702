/*
 * server_internal.h: what the server's files share: the server, a request
 * being handled (call), and the functions of each file that others call.
 * Calls between the files go one way, never back: server.c (start, stop,
 * reaper) -> workers.c -> dispatch.c -> handlers_*.c -> reply.c, with
 * contexts.c, connections.c and authn.c called from above and calling
 * only below (reply.c, connections.c, the registry).
 */
#ifndef TPORT_SERVER_INTERNAL_H
#define TPORT_SERVER_INTERNAL_H

#include <nng/nng.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "auth.h"
#include "config.h"
#include "fairq.h"
#include "frame.h"
#include "http.h"
#include "lends.h"
#include "metrics.h"
#include "regions.h"
#include "registry.h"
#include "server.h"
#include "transfers.h"

#define SERVER_METHODS 22 /* 1..21 */

/* IDLE: opened, neither receiving nor holding a request (a spare).
 * PARKED: holding a request that waits for a name (wait_ms): no worker,
 * only its timer and its registry waiter, either of which requeues it. */
typedef enum { CTX_IDLE, CTX_RECV, CTX_WORK, CTX_SEND, CTX_PARKED } ctx_state;

/* One nng context: a request slot with its own async state machine. */
typedef struct srv_ctx {
  struct server *srv;
  nng_ctx ctx;
  nng_aio *aio;
  ctx_state state;
  nng_msg *msg;
  int64_t queued_ms;
  /* A PutChunk counts against its connection's in-flight limit from the
   * moment it arrives until its reply is built. */
  enum { CHUNK_NONE, CHUNK_COUNTED, CHUNK_REFUSED } chunk;
  tport_err chunk_err;
  nng_pipe pipe;  /* of the request held */
  const char *drop_why; /* the connection is over a limit: drop it, answer nothing */
  size_t held_bytes;    /* of --request-memory: the request's body, until handled */
  int64_t arrived_ns; /* metrics_now_ns() when the request arrived */
  uint16_t method;    /* of the reply being sent (0: unknown) */
  int64_t send_ns;    /* when a get's reply was handed to nng (0: not timed) */
  fq_node fq;         /* in the workers' queue, under its tenant */
  char tenant[REG_TENANT_MAX]; /* what it is queued under (again, when a wait wakes) */
  /* a request that waits for a name: it is parked (CTX_PARKED) until its
   * waiter is woken or its timer ends, then queued and handled again */
  nng_aio *timer;
  reg_waiter waiter;
  int64_t first_ms;           /* mono_ms() of its arrival: its wait counts from there */
  int64_t park_until_ms;      /* set by dispatch_request: park till then (0: answered) */
  bool wake_pending;          /* woken before it was parked: queue it again at once */
  bool again;                 /* handled before (parked since): counted once */
  struct srv_ctx *all_next;   /* every context opened (server.ctxs) */
  struct srv_ctx *spare_next; /* the idle ones (server.spare) */
} srv_ctx;


struct server {
  server_config cfg;
  nng_socket sock;
  nng_listener listeners[CONFIG_MAX_LISTEN];
  int nlisteners;
  /* contexts, under qmu: every one opened (linked by all_next, freed at
   * stop), the idle ones, and how many receives are posted (--contexts:
   * each context that takes a request is replaced at once) */
  srv_ctx *ctxs, *spare;
  int nctx, receiving;
  bool open_failed; /* said in the log, receives not yet back to --contexts */
  pthread_t *workers;
  int nworkers;
  pthread_mutex_t qmu;
  pthread_cond_t qcv, idle;
  fair_queue *fq; /* requests waiting for a worker, by tenant */
  int busy;       /* requests queued, being handled or being answered */
  size_t request_bytes, request_memory; /* bodies held now / --request-memory */
  uint64_t max_connections;             /* --max-connections, resolved */
  bool stopping;
  registry reg;
  transfers xfers;
  pthread_mutex_t amu; /* guards auth (swapped by SIGHUP's reload) */
  auth_file *auth;     /* NULL: authentication is off */
  auth_limiter *limiter;
  bool mtls;    /* tls+tcp:// clients prove their tenant with a certificate */
  bool authn;   /* some proof is required (auth file, local secret or mutual TLS): no claims */
  bool local;   /* auth holds the local secret (any tenant), not an auth file */
  pthread_t reaper;
  pthread_mutex_t rmu; /* guards reaper_stop */
  pthread_cond_t rcv;
  bool reaper_stop;
  atomic_uint_fast64_t requests[SERVER_METHODS], errors, bytes_in, bytes_out, dropped;
  atomic_uint_fast64_t bytes_lent; /* of bytes_out: sent from a storage, not copied */
  atomic_uint_fast64_t refused_connections; /* over --max-connections */
  atomic_uint_fast64_t refused_requests;    /* over --request-memory */
  atomic_int_fast64_t refused_log_ms;       /* when a refused connection was last logged */
  int64_t started_ms;
  /* operations: the metrics of the hot path (metrics.h) and the HTTP
   * endpoint; ready is what /readyz says (listeners and devices up, not
   * stopping); devices_up: the backends may be asked for their state;
   * draining: stopping, new connections are refused */
  metrics metrics;
  uint8_t metrics_key[METRICS_TENANT_KEY_BYTES]; /* --metrics-tenants hash: random per server */
  http_server *http;
  atomic_bool ready, devices_up, draining;
  shm_table *shm; /* same-host regions; NULL: none offered */
  lends *lends;   /* replies whose bytes are lent (call_reply_lent); NULL: none */
};

/* Testing knob: called by server_start just before the server turns ready
 * (the endpoint then serves, /readyz still 503).  Never set outside tests. */
extern void (*server_test_before_ready)(struct server *s);
/* Testing knob: called by a worker just before it handles a request (a test
 * holds a worker there to fill the queue behind it).  Never set outside
 * tests. */
extern void (*server_test_before_handle)(struct server *s, uint32_t pipe, uint16_t method);

/* The replies of a batch's elements, one after another (reply.c). */
typedef struct reply_sink {
  uint8_t *buf;
  size_t len, cap;
} reply_sink;

/* A request being handled. */
typedef struct call {
  struct server *srv;
  uint32_t pipe;
  uint16_t method;
  ProtobufCMessage *req;
  const uint8_t *payload;
  size_t payload_len;
  nng_msg *out;
  tport_err err;
  int64_t arrived_ns; /* metrics_now_ns() when the request arrived in full */
  /* an element of a batch (handlers_batch.c): its reply's payload is read
   * back out of the message, so it is copied in, never lent -- unless
   * lend_to_batch: then a payload call_reply_lent would lend is left out of
   * the reply and held for the batch's reply instead (lent: lends_begin's,
   * for the lent_n bytes at lent_p); h_get_begin clears it for a device's
   * tensor, whose bytes are in a read-back block the batch's next element
   * may be waiting for */
  bool copy_payload;
  bool lend_to_batch;
  /* an element of a PutBatch of many bytes: its bytes written into its
   * tensor with non-temporal stores (memcpy_stream), which leave the
   * caches to the rest of the batch's work */
  bool stream_writes;
  /* an element of a PutBatch: the times of its stages added here (one sum
   * a metrics_stage), observed once for the batch's request -- a sample an
   * element was ~6% of tportd's work on a batch of 4 KiB tensors (shared
   * counters bouncing between the workers' cores) */
  int64_t *stage_ns;
  void *lent;
  const void *lent_p;
  size_t lent_n;
  /* an element of a batch: its reply packed into the batch's buffer (no
   * frame, no message of its own), sink_packed bytes at sink_at, then its
   * sink_payload bytes (reply.c); sunk once it is there */
  struct reply_sink *sink;
  size_t sink_at, sink_packed, sink_payload;
  bool sunk;
  /* an element of a PutBatch: a put from the client's memory is gathered
   * there (put_gather.h) rather than read now, and answered later
   * (gathered) */
  struct put_gather *gather;
  /* an element of a GetBatch: a get written into the client's memory is
   * held there (get_scatter.h) rather than written now, and answered later
   * (gathered) */
  struct get_scatter *scatter;
  bool gathered;
  /* an element of a PutBatch's run (put_runs.h): answered by its handle
   * alone (run_answered set) where its tensor's info is the run's.  Every
   * element of a PutBatch has run_handle: its entry's handle is written
   * there, and stored set, once it is in the registry -- the batch removes
   * it again if the batch's reply cannot be made */
  struct put_run_info *run;
  uint8_t *run_handle;
  bool run_answered;
  bool stored;
  /* an element of a PutBatch (its index `element`): added to the registry
   * with others of the batch where it can be (put_bulk.h) */
  struct put_bulk *bulk;
  size_t element;
  /* waiting for a name: the context's waiter and first arrival; a handler
   * that registered the waiter sets park_until_ms and gives no reply */
  reg_waiter *waiter;
  int64_t first_ms;
  int64_t park_until_ms;
} call;

/* Testing knob: asked before a reply's message is allocated (element: a
 * batch element's place in its batch's reply, method PUT_BEGIN or
 * GET_BEGIN); true fails that allocation as running out of memory would.
 * Never set outside tests. */
extern bool (*server_test_reply_fails)(uint16_t method, bool element);

/* The contexts and the workers' queue, now (under qmu). */
typedef struct server_queue_stats {
  uint64_t contexts;      /* opened: receiving, handling, answering or spare */
  uint64_t queued;        /* requests waiting for a worker */
  uint64_t queue_tenants; /* tenants with requests queued or running */
  uint64_t request_bytes; /* bodies held, of --request-memory */
} server_queue_stats;
/* Inline: Stats and /metrics read it, and contexts.c reports to metrics.c
 * (a call back from there would close a circle). */
static inline void server_queue_stats_get(struct server *s, server_queue_stats *out)
{
  pthread_mutex_lock(&s->qmu);
  out->contexts = (uint64_t)s->nctx;
  out->queued = fq_queued(s->fq);
  out->queue_tenants = fq_tenants(s->fq);
  out->request_bytes = s->request_bytes;
  pthread_mutex_unlock(&s->qmu);
}

/* The clock of queue deadlines and log limits (monotonic, ms). */
static inline int64_t mono_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* authn.c: the auth file in force, with a reference (auth_file_release
 * it); NULL when authentication is off. */
auth_file *server_auth(struct server *s);
/* The proof the server asks (auth file, local secret or none), loaded and
 * said in the log; part of server_start. */
int server_auth_start(struct server *s, const server_config *cfg, tport_err *err);

/* connections.c: the peer address of a connection ("ipc", "inproc" for
 * local ones). */
void server_peer_address(uint32_t pipe, char *buf, size_t len);
/* Is the connection from this host (ipc, inproc, loopback tcp)? */
bool server_peer_is_local(uint32_t pipe);
/* A connection over a limit is dropped: that costs only itself.  logged:
 * say so in the log (a flood's drops are summed up by the caller). */
void server_drop_pipe_logged(struct server *s, nng_pipe p, const char *why, bool logged);
void server_drop_pipe(struct server *s, nng_pipe p, const char *why);
/* nng's pipe events (ADD_PRE, REM_POST) of the server's socket; arg: the
 * server. */
void server_pipe_event(nng_pipe p, nng_pipe_ev ev, void *arg);

/* contexts.c: one more context, idle (qmu held).  NULL when nng or memory
 * refuses. */
srv_ctx *ctx_open(struct server *s);
/* Keeps --contexts receives posted (qmu held). */
void ctx_post_receives(struct server *s);
/* The request of x is done: its reply (if any) goes out with a time limit,
 * else x goes idle. */
void ctx_finish(struct server *s, srv_ctx *x, nng_msg *reply);
/* The method of a request frame, read from its header (0: too short). */
uint16_t frame_method_of(nng_msg *m);
/* x's request waits for a name till x->park_until_ms (its waiter is
 * registered): it leaves its worker and is queued again when woken or
 * at the time (at once when woken already, or the server is draining). */
void ctx_park(struct server *s, srv_ctx *x);
/* The server is draining: every parked request is queued again now (the
 * handlers then answer UNAVAILABLE instead of waiting). */
void ctx_wake_parked(struct server *s);

/* workers.c: the workers' queue and --workers threads, started. */
int workers_start(struct server *s, const server_config *cfg, tport_err *err);

/* dispatch.c: x's request parsed, checked and handled; its reply (the
 * handler's or an error reply; NULL only when out of memory). */
nng_msg *dispatch_request(struct server *s, srv_ctx *x, struct arena *a);

/* reply.c: packs a reply (whose status the handler has set) and a payload
 * into the reply message. */
int call_reply(call *c, ProtobufCMessage *reply, const void *payload, size_t n);
/* The same with a payload lent from st's memory instead of copied into the
 * reply: nng sends it straight from there (tcp, ipc; other transports copy
 * it when they send) and the reply keeps a reference to st until then.  The
 * bytes must not change before the reply is sent: a chunk of a get's host
 * copy or of a tensor being read.  Payloads under REPLY_LEND_MIN_BYTES are
 * copied (the reference costs more than the copy). */
#define REPLY_LEND_MIN_BYTES (64u << 10)
int call_reply_lent(call *c, ProtobufCMessage *reply, tport_storage *st, const void *payload,
                    size_t n);

/* The call a batch's element gathered earlier (put_gather.h, get_scatter.h)
 * is answered on at the batch's end: c's connection and sink, method's. */
call call_for_element(const call *c, uint16_t method);
/* The error reply of a request of that method (NULL: out of memory). */
nng_msg *error_reply(uint16_t method, const tport_err *e);

/* Handlers, grouped by file (dispatch.c's table names them). */
int h_hello(call *c);
int h_devices(call *c);
int h_stats(call *c);
int h_put_begin(call *c);
int h_put_chunk(call *c);
int h_put_commit(call *c);
int h_put_abort(call *c);
int h_get_begin(call *c);
int h_get_chunk(call *c);
int h_to(call *c);
int h_copy(call *c);
int h_view(call *c);
int h_contiguous(call *c);
int h_info(call *c);
int h_list(call *c);
int h_free(call *c);
int h_sync(call *c);
int h_shm_register(call *c);
int h_shm_release(call *c);
int h_put_batch(call *c);
int h_get_batch(call *c);

#endif
