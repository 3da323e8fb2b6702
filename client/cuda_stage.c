/*
 * cuda_stage.c: device memory staged through a client's ring of pinned
 * chunks (cuda_stage.h).
 *
 * A slot's life is a small state machine: FREE (its bytes may be
 * overwritten), COPYING (an async copy reads or writes it; its event marks
 * the end) and, for a put, READY (the D2H copy of a known chunk has been
 * waited for).  A slot is written by the host only when FREE, and made FREE
 * only by waiting for its event.
 */
#include "cuda_stage.h"

#include <stdlib.h>
#include <string.h>

#include "client_internal.h"

typedef enum { SLOT_FREE, SLOT_COPYING } slot_state;

struct client_stage {
  tport_client *client;
  const cuda_rt *rt;
  uint8_t *ring; /* CLIENT_STAGE_SLOTS * slot_bytes, pinned */
  size_t slot_bytes;
  int device; /* of stream and events; -1: none made yet */
  cuda_rt_stream stream;
  cuda_rt_event ev[CLIENT_STAGE_SLOTS];
  slot_state state[CLIENT_STAGE_SLOTS];
  /* the transfer holding the ring */
  client_devmem mem;
  size_t nbytes, chunk;
  int prev_device; /* the thread's, restored by stage_end */
  unsigned turn;   /* the slot the next get piece goes to */
  /* a put's prefetched chunk: [pf_off, pf_off + pf_len) in slot pf_slot */
  bool pf_valid;
  size_t pf_off, pf_len;
  unsigned pf_slot;
};

int stage_check_pointer(const void *ptr, int device_id, bool managed, tport_err *err)
{
  const cuda_rt *rt;
  int rc = cuda_rt_load(&rt, err);
  if (rc)
    return rc;
  cuda_rt_pointer_attributes a;
  memset(&a, 0, sizeof a);
  cuda_rt_status st = rt->pointer_get_attributes(&a, ptr);
  if (st)
    return cuda_rt_fail(rt, st, TPORT_UNAVAILABLE, "cudaPointerGetAttributes", err);
  int want = managed ? CUDA_RT_MEMORY_MANAGED : CUDA_RT_MEMORY_DEVICE;
  if (a.type != want)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "DLPack data %p is CUDA memory of type %d, not %s memory", ptr, a.type,
                         managed ? "managed" : "device");
  if (a.type == CUDA_RT_MEMORY_DEVICE && a.device != device_id)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "DLPack device_id is %d but the data is on device %d", device_id,
                         a.device);
  return TPORT_OK;
}

/* Waits for slot i's copy, if one runs. */
static int slot_wait(client_stage *s, unsigned i, tport_err *err)
{
  if (s->state[i] != SLOT_COPYING)
    return TPORT_OK;
  cuda_rt_status st = s->rt->event_synchronize(s->ev[i]);
  if (st)
    return cuda_rt_fail(s->rt, st, TPORT_INTERNAL, "cudaEventSynchronize (staging)", err);
  s->state[i] = SLOT_FREE;
  return TPORT_OK;
}

static int wait_all(client_stage *s, tport_err *err)
{
  int rc = TPORT_OK;
  for (unsigned i = 0; i < CLIENT_STAGE_SLOTS; i++) {
    int r = slot_wait(s, i, rc ? NULL : err);
    if (r && !rc)
      rc = r;
    s->state[i] = SLOT_FREE; /* a failed copy is over too */
  }
  return rc;
}

/* Stream and events on the transfer's device (the thread's current one). */
static int make_device_objects(client_stage *s, tport_err *err)
{
  if (s->device == s->mem.device)
    return TPORT_OK;
  const cuda_rt *rt = s->rt;
  if (s->device >= 0) {
    /* made on another device: they go with it */
    rt->set_device(s->device);
    for (unsigned i = 0; i < CLIENT_STAGE_SLOTS; i++)
      rt->event_destroy(s->ev[i]);
    rt->stream_destroy(s->stream);
    s->device = -1;
    rt->set_device(s->mem.device);
  }
  cuda_rt_status st = rt->stream_create_with_flags(&s->stream, CUDA_RT_STREAM_DEFAULT);
  if (st)
    return cuda_rt_fail(rt, st, TPORT_INTERNAL, "cudaStreamCreateWithFlags", err);
  for (unsigned i = 0; i < CLIENT_STAGE_SLOTS; i++) {
    st = rt->event_create_with_flags(&s->ev[i], CUDA_RT_EVENT_DISABLE_TIMING);
    if (st) {
      while (i-- > 0)
        rt->event_destroy(s->ev[i]);
      rt->stream_destroy(s->stream);
      return cuda_rt_fail(rt, st, TPORT_INTERNAL, "cudaEventCreateWithFlags", err);
    }
  }
  s->device = s->mem.device;
  return TPORT_OK;
}

/* A ring of slots of at least chunk bytes (one cudaHostAlloc, kept). */
static int make_ring(client_stage *s, size_t chunk, tport_err *err)
{
  if (s->ring && s->slot_bytes >= chunk)
    return TPORT_OK;
  size_t total;
  if (__builtin_mul_overflow(chunk, (size_t)CLIENT_STAGE_SLOTS, &total))
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "a staging ring of %zu-byte chunks overflows",
                         chunk);
  void *p = NULL;
  cuda_rt_status st = s->rt->host_alloc(&p, total, CUDA_RT_HOST_ALLOC_PORTABLE);
  if (st)
    return cuda_rt_fail(s->rt, st, TPORT_RESOURCE_EXHAUSTED, "cudaHostAlloc (staging ring)", err);
  if (s->ring)
    s->rt->free_host(s->ring); /* its slots are all FREE between transfers */
  s->ring = p;
  s->slot_bytes = chunk;
  return TPORT_OK;
}

int stage_begin(tport_client *c, const client_devmem *mem, size_t nbytes, size_t chunk,
                client_stage **out, tport_err *err)
{
  const cuda_rt *rt;
  int rc = cuda_rt_load(&rt, err);
  if (rc)
    return rc;
  if (chunk == 0)
    return tport_err_set(err, TPORT_INTERNAL, "a staged transfer with chunks of 0 bytes");
  pthread_mutex_lock(&c->stage_mu);
  client_stage *s = c->stage;
  if (!s) {
    s = calloc(1, sizeof *s);
    if (!s) {
      pthread_mutex_unlock(&c->stage_mu);
      return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
    }
    s->client = c;
    s->rt = rt;
    s->device = -1;
    c->stage = s;
  }
  s->mem = *mem;
  s->nbytes = nbytes;
  s->chunk = chunk;
  s->turn = 0;
  s->pf_valid = false;
  s->prev_device = 0;
  cuda_rt_status st = rt->get_device(&s->prev_device);
  if (st)
    rc = cuda_rt_fail(rt, st, TPORT_UNAVAILABLE, "cudaGetDevice", err);
  else if ((st = rt->set_device(mem->device)) != 0)
    rc = cuda_rt_fail(rt, st, TPORT_UNAVAILABLE, "cudaSetDevice", err);
  if (!rc)
    rc = make_device_objects(s, err);
  if (!rc)
    rc = make_ring(s, chunk, err);
  if (rc) {
    if (!st)
      rt->set_device(s->prev_device);
    pthread_mutex_unlock(&c->stage_mu);
    return rc;
  }
  *out = s;
  return TPORT_OK;
}

int stage_set_chunk(client_stage *s, size_t chunk, tport_err *err)
{
  if (chunk == 0)
    return tport_err_set(err, TPORT_INTERNAL, "a staged transfer with chunks of 0 bytes");
  if (chunk > s->slot_bytes) {
    int rc = wait_all(s, err);
    if (!rc)
      rc = make_ring(s, chunk, err);
    if (rc)
      return rc;
    s->pf_valid = false;
  }
  s->chunk = chunk;
  return TPORT_OK;
}

/* Starts the D2H copy of [off, off + len) into slot i. */
static int put_fetch(client_stage *s, unsigned i, size_t off, size_t len, tport_err *err)
{
  int rc = slot_wait(s, i, err);
  if (rc)
    return rc;
  if (len > s->slot_bytes || off > s->nbytes || len > s->nbytes - off)
    return tport_err_set(err, TPORT_INTERNAL, "staged chunk [%zu, +%zu) is outside %zu bytes", off,
                         len, s->nbytes);
  uint8_t *dst = s->ring + (size_t)i * s->slot_bytes;
  cuda_rt_status st =
      s->rt->memcpy_async(dst, s->mem.base + off, len, CUDA_RT_MEMCPY_D2H, s->stream);
  if (!st)
    st = s->rt->event_record(s->ev[i], s->stream);
  if (st)
    return cuda_rt_fail(s->rt, st, TPORT_INTERNAL, "cudaMemcpyAsync (device to host)", err);
  s->state[i] = SLOT_COPYING;
  return TPORT_OK;
}

int stage_put_chunk(client_stage *s, size_t off, size_t len, const uint8_t **bytes, tport_err *err)
{
  unsigned i;
  int rc;
  if (s->pf_valid && s->pf_off == off && s->pf_len == len) {
    i = s->pf_slot;
  } else {
    /* not the one prefetched (the first, or a put that starts over) */
    if ((rc = wait_all(s, err)) != TPORT_OK)
      return rc;
    i = 0;
    if ((rc = put_fetch(s, i, off, len, err)) != TPORT_OK)
      return rc;
  }
  s->pf_valid = false;
  if ((rc = slot_wait(s, i, err)) != TPORT_OK)
    return rc;
  /* the next chunk's copy runs while this one is sent */
  size_t next = off + len;
  if (next < s->nbytes) {
    unsigned j = (i + 1) % CLIENT_STAGE_SLOTS;
    size_t nlen = s->nbytes - next < s->chunk ? s->nbytes - next : s->chunk;
    if ((rc = put_fetch(s, j, next, nlen, err)) != TPORT_OK)
      return rc;
    s->pf_valid = true;
    s->pf_off = next;
    s->pf_len = nlen;
    s->pf_slot = j;
  }
  *bytes = s->ring + (size_t)i * s->slot_bytes;
  return TPORT_OK;
}

int stage_get_chunk(client_stage *s, size_t off, const uint8_t *data, size_t len, tport_err *err)
{
  if (off > s->nbytes || len > s->nbytes - off)
    return tport_err_set(err, TPORT_DATA_LOSS,
                         "chunk [%zu, +%zu) is outside the tensor's %zu bytes", off, len,
                         s->nbytes);
  while (len > 0) {
    unsigned i = s->turn;
    s->turn = (s->turn + 1) % CLIENT_STAGE_SLOTS;
    int rc = slot_wait(s, i, err);
    if (rc)
      return rc;
    size_t n = len < s->slot_bytes ? len : s->slot_bytes;
    uint8_t *slot = s->ring + (size_t)i * s->slot_bytes;
    memcpy(slot, data, n);
    cuda_rt_status st =
        s->rt->memcpy_async(s->mem.base + off, slot, n, CUDA_RT_MEMCPY_H2D, s->stream);
    if (!st)
      st = s->rt->event_record(s->ev[i], s->stream);
    if (st)
      return cuda_rt_fail(s->rt, st, TPORT_INTERNAL, "cudaMemcpyAsync (host to device)", err);
    s->state[i] = SLOT_COPYING;
    off += n;
    data += n;
    len -= n;
  }
  return TPORT_OK;
}

int stage_end(client_stage *s, int rc, tport_err *err)
{
  /* every copy ends before the ring (or the caller's memory) is let go */
  int w = wait_all(s, rc ? NULL : err);
  cuda_rt_status st = s->rt->stream_synchronize(s->stream);
  if (!rc && w)
    rc = w;
  if (!rc && st)
    rc = cuda_rt_fail(s->rt, st, TPORT_INTERNAL, "cudaStreamSynchronize (staging)", err);
  s->pf_valid = false;
  s->mem.base = NULL;
  s->rt->set_device(s->prev_device);
  pthread_mutex_unlock(&s->client->stage_mu);
  return rc;
}

void stage_destroy(client_stage *s)
{
  if (!s)
    return;
  const cuda_rt *rt = s->rt;
  if (s->device >= 0) {
    int prev = 0;
    rt->get_device(&prev);
    rt->set_device(s->device);
    for (unsigned i = 0; i < CLIENT_STAGE_SLOTS; i++)
      rt->event_destroy(s->ev[i]);
    rt->stream_destroy(s->stream);
    rt->set_device(prev);
  }
  if (s->ring)
    rt->free_host(s->ring);
  free(s);
}
