/* sim_stream.c: the sim's streams -- a worker thread each, running its ops
 * in order after an optional random delay -- and its events
 * (sim_internal.h; what they mimic of CUDA: backend_sim.c). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#include "cpu_kernels.h"
#include "host_copy.h"
#include "sim_internal.h"

void sim_event_unref(be_event *e)
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
    host_copy(&op->u.kernel.p, op->u.kernel.dst, op->u.kernel.dt, op->u.kernel.src,
              op->u.kernel.st, op->u.kernel.flags);
    break;
  case OP_MARK: {
    be_event *e = op->u.event.ev;
    pthread_mutex_lock(&e->mu);
    if (op->u.event.seq > e->completed)
      e->completed = op->u.event.seq;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    sim_event_unref(e);
    break;
  }
  case OP_WAIT: {
    be_event *e = op->u.event.ev;
    pthread_mutex_lock(&e->mu);
    while (e->completed < op->u.event.seq)
      pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    sim_event_unref(e);
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
  prctl(PR_SET_NAME, "tport:sim"); /* what top -H, perf and gdb show */
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

int sim_enqueue(be_stream *s, sim_op *op)
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

sim_op *sim_new_op(op_kind kind, tport_err *err)
{
  sim_op *op = calloc(1, sizeof *op);
  if (!op)
    tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "sim: out of host memory for a stream op");
  else
    op->kind = kind;
  return op;
}

int sim_stream_start(int dev, be_stream **out, tport_err *err)
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

void sim_stream_stop(be_stream *s)
{
  sim_op *op = calloc(1, sizeof *op);
  if (op) {
    op->kind = OP_STOP;
    sim_enqueue(s, op);
    pthread_join(s->thread, NULL);
  }
  pthread_cond_destroy(&s->cv);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

int sim_invalid_handle(const char *call, const char *what, int what_dev, int dev, tport_err *err)
{
  return tport_err_set(err, TPORT_INTERNAL,
                       "sim: %s: invalid resource handle (cudaErrorInvalidResourceHandle): %s of "
                       "sim:%d used on sim:%d",
                       call, what, what_dev, dev);
}

be_stream *sim_stream_default(int dev)
{
  return dev >= 0 && dev < SIM_MAX_DEVICES ? sim.streams[dev] : NULL;
}

int sim_stream_create(int dev, be_stream **out, tport_err *err)
{
  int rc = sim_check_dev(dev, err);
  return rc ? rc : sim_stream_start(dev, out, err);
}

int sim_stream_sync(be_stream *s, tport_err *err)
{
  pthread_mutex_lock(&s->mu);
  uint64_t target = s->enqueued;
  while (s->completed < target)
    pthread_cond_wait(&s->cv, &s->mu);
  pthread_mutex_unlock(&s->mu);
  return TPORT_OK;
}

void sim_stream_destroy(be_stream *s)
{
  sim_stream_sync(s, NULL);
  sim_stream_stop(s);
}

int sim_host_func(be_stream *s, be_host_fn fn, void *arg, tport_err *err)
{
  sim_op *op = sim_new_op(OP_HOSTFN, err);
  if (!op)
    return TPORT_RESOURCE_EXHAUSTED;
  op->u.host.fn = fn;
  op->u.host.arg = arg;
  return sim_enqueue(s, op);
}

int sim_event_create(int dev, be_event **out, tport_err *err)
{
  int rc = sim_check_dev(dev, err);
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

void sim_event_destroy(be_event *e)
{
  sim_event_unref(e);
}

int sim_event_record(be_event *e, be_stream *s, tport_err *err)
{
  if (e->dev != s->dev)
    return sim_invalid_handle("cudaEventRecord", "an event", e->dev, s->dev, err);
  sim_op *op = sim_new_op(OP_MARK, err);
  if (!op)
    return TPORT_RESOURCE_EXHAUSTED;
  pthread_mutex_lock(&e->mu);
  op->u.event.seq = ++e->recorded;
  pthread_mutex_unlock(&e->mu);
  atomic_fetch_add(&e->refs, 1);
  op->u.event.ev = e;
  return sim_enqueue(s, op);
}

int sim_stream_wait(be_stream *s, be_event *e, tport_err *err)
{
  pthread_mutex_lock(&e->mu);
  uint64_t target = e->recorded;
  pthread_mutex_unlock(&e->mu);
  if (target == 0)
    return TPORT_OK; /* never recorded: complete */
  sim_op *op = sim_new_op(OP_WAIT, err);
  if (!op)
    return TPORT_RESOURCE_EXHAUSTED;
  atomic_fetch_add(&e->refs, 1);
  op->u.event.ev = e;
  op->u.event.seq = target;
  return sim_enqueue(s, op);
}

bool sim_event_query(be_event *e)
{
  pthread_mutex_lock(&e->mu);
  bool done = e->completed >= e->recorded;
  pthread_mutex_unlock(&e->mu);
  return done;
}

int sim_event_sync(be_event *e, tport_err *err)
{
  pthread_mutex_lock(&e->mu);
  uint64_t target = e->recorded;
  while (e->completed < target)
    pthread_cond_wait(&e->cv, &e->mu);
  pthread_mutex_unlock(&e->mu);
  return TPORT_OK;
}
