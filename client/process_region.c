/*
 * process_region.c: the server reads a large put's chunks straight from
 * the caller's buffer (server/regions.h, "Process regions"), and writes a
 * large get straight into it (server/get_direct.h): one copy in all, where
 * the automatic region costs two (this process's into the region, the
 * server's out of it).
 *
 * The connection registers this process's memory once, as a region whose
 * slices are addresses here; it proves that the server's idea of its peer
 * is this process by writing the random token the server sends into its
 * memory, where the server reads it back.  Only over
 * ipc:// and inproc:// (the server knows the peer's pid) and when the
 * server says it can; TPORT_SHM_DIRECT=0 turns it off.  Where the server
 * refuses (another user, a kernel that does not let it read this process),
 * that connection is not asked again and large puts take the automatic
 * region.  A get offers the caller's buffer and the automatic region
 * together: the server writes the buffer where the tensor's values lie in
 * its memory as they are (cpu, contiguous), the region otherwise (a
 * device's, whose copy engine writes the region).  A get into the
 * caller's buffer whose answer never came (the client's timeout, the
 * connection lost) may still be written by the server later, as a CUDA
 * IPC get may (tport.h).
 */
#include <string.h>
#include <strings.h>
#include <time.h>

#include <openssl/rand.h>

#include "client_internal.h"
#include "env.h"

void client_process_init(tport_client *c, const char *url, bool server_can)
{
  pthread_mutex_init(&c->proc_mu, NULL);
  bool on = true; /* tport_connect has checked it (env.c) */
  client_env_flag("TPORT_SHM_DIRECT", true, &on, NULL);
  bool local = strncasecmp(url, "ipc://", 6) == 0 || strncasecmp(url, "inproc://", 9) == 0;
  c->proc_on = on && local && server_can && atomic_load(&c->shm_auto);
}

/* One step of ShmRegister of this process's memory: the first (probe_addr
 * 0: *id and the token into c->proc_probe) or the second. */
static int register_step(tport_client *c, uint64_t *id, uint64_t probe_addr, tport_err *err)
{
  Tport__ShmRegisterRequest q = TPORT__SHM_REGISTER_REQUEST__INIT;
  q.process = true;
  q.process_probe_addr = probe_addr;
  q.process_region = *id;
  Tport__ShmRegisterReply *a;
  int rc = client_rpc(c, TPORT__METHOD__METHOD_SHM_REGISTER, &q.base, NULL, 0,
                      &tport__shm_register_reply__descriptor, (ProtobufCMessage **)&a, NULL, err);
  if (rc)
    return rc;
  if (!probe_addr && !a->ready && a->token.len == sizeof c->proc_probe) {
    *id = a->region;
    memcpy(c->proc_probe, a->token.data, sizeof c->proc_probe);
  } else if (probe_addr && a->ready && a->region == *id) {
    /* confirmed */
  } else {
    rc = tport_err_set(err, TPORT_INTERNAL, "the server's answer to a process region is odd");
  }
  protobuf_c_message_free_unpacked(&a->base, NULL);
  return rc;
}

/* ShmRegister of this process's memory on the connection now: the server
 * sends a token, this process writes it where the server can read it back
 * from its memory (the proof that the connection's process is this one):
 * *id, or why not. */
static int register_process(tport_client *c, uint64_t *id, tport_err *err)
{
  *id = 0;
  int rc = register_step(c, id, 0, err);
  if (!rc)
    rc = register_step(c, id, (uint64_t)(uintptr_t)c->proc_probe, err);
  return rc;
}

size_t client_process_span(const tport_client *c, size_t chunk)
{
  uint64_t most = atomic_load(&c->proc_read_max);
  if (most > CLIENT_PROCESS_SPAN_MAX)
    most = CLIENT_PROCESS_SPAN_MAX; /* whatever a server says */
  if (chunk == 0 || most <= chunk)
    return chunk;
  return (size_t)(most / chunk) * chunk;
}

size_t client_process_batch_bytes(const tport_client *c)
{
  if (!atomic_load(&c->proc_put_once))
    return 0;
  uint64_t most = atomic_load(&c->proc_read_max);
  return most > CLIENT_PROCESS_SPAN_MAX ? CLIENT_PROCESS_SPAN_MAX : (size_t)most;
}

size_t client_get_batch_direct_bytes(const tport_client *c)
{
  uint64_t most = atomic_load(&c->proc_read_max);
  if (most < c->chunk_bytes) /* (a server that said none) */
    return c->chunk_bytes;
  return most > CLIENT_PROCESS_SPAN_MAX ? CLIENT_PROCESS_SPAN_MAX : (size_t)most;
}

static _Atomic uint64_t fence_next;

/* The tokens' random start (the monotonic clock's nanoseconds where no
 * random bytes can be had). */
static void fence_start(void)
{
  uint64_t t;
  if (RAND_bytes((unsigned char *)&t, sizeof t) != 1) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    t = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  }
  atomic_store(&fence_next, t);
}

uint64_t client_fence_token(void)
{
  /* one apart from the last, from a random start: never one an earlier
   * batch of this process used (whatever became of RAND_bytes) */
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, fence_start);
  uint64_t t;
  while ((t = atomic_fetch_add(&fence_next, 1)) == 0) {
  }
  return t;
}

bool client_put_reads_direct(const tport_client *c, const tport_put_options *o, const void *data,
                             size_t nbytes)
{
  bool converts = o && (o->has_dtype || o->memory_format != TPORT_MF_PRESERVE);
  bool on_cpu = !o || !o->device || strcmp(o->device, "cpu") == 0;
  return c->proc_on && data && nbytes > 0 && on_cpu && !converts && !(o && o->managed);
}

uint64_t client_gets_direct_region(tport_client *c)
{
  uint64_t id = 0;
  if (!c->proc_on || !atomic_load(&c->proc_gets) || client_process_region(c, &id) != TPORT_OK)
    return 0;
  return id;
}

uint64_t client_get_direct_region(tport_client *c, const void *buf, size_t cap)
{
  return buf && cap >= CLIENT_SHM_MIN_BYTES ? client_gets_direct_region(c) : 0;
}

void client_get_direct_fill(const client_get_desc *g, Tport__GetBeginRequest *q)
{
  if (!g->direct_region)
    return;
  q->direct_region = g->direct_region;
  q->direct_addr = (uint64_t)(uintptr_t)g->buf;
  q->direct_length = g->cap;
  q->direct_min_bytes = CLIENT_SHM_MIN_BYTES; /* smaller: inline, as before */
  if (g->want) { /* written before the reply says what: checked there first */
    q->expect_set = true;
    q->expect_dtype = (Tport__DType)g->want->dtype;
    q->n_expect_sizes = (size_t)g->want->ndim;
    q->expect_sizes = (int64_t *)g->want->sizes;
  }
}

int client_process_region(tport_client *c, uint64_t *id)
{
  if (!c->proc_on)
    return TPORT_FAILED_PRECONDITION;
  pthread_mutex_lock(&c->proc_mu);
  unsigned pipe = atomic_load(&c->live_pipe);
  int rc = TPORT_OK;
  if (pipe == 0 || pipe == c->proc_refused_pipe) {
    rc = TPORT_FAILED_PRECONDITION;
  } else if (c->proc_pipe != pipe) {
    /* a new connection (nng redialed): its own region, registered once;
     * one taken on a connection that went meanwhile is the server's to
     * drop with it */
    uint64_t fresh = 0;
    tport_err why;
    rc = register_process(c, &fresh, &why);
    unsigned now = atomic_load(&c->live_pipe);
    if (!rc && now == pipe) {
      c->proc_region = fresh;
      c->proc_pipe = pipe;
    } else if (now == pipe && rc != TPORT_UNAVAILABLE && rc != TPORT_DEADLINE_EXCEEDED &&
               rc != TPORT_ABORTED && rc != TPORT_RESOURCE_EXHAUSTED) {
      c->proc_refused_pipe = pipe; /* refused here for good: not asked again */
    } else if (!rc) {
      rc = TPORT_UNAVAILABLE; /* the connection changed under it: next time */
    }
  }
  *id = c->proc_region;
  pthread_mutex_unlock(&c->proc_mu);
  return rc;
}
