/*
 * storage.h: refcounted device (or host) memory, and the one pending event
 * that orders work on it.
 *
 * Every async operation that touches a storage first waits for the storage's
 * pending event (on its stream, or on the host), then records a new event on
 * its own stream and makes that the storage's pending event.  Work on one
 * storage is thereby serialized across streams and devices; a non_blocking
 * result is safe to use through the engine at any time.  A storage whose last
 * reference goes while its event is pending is freed only once the event
 * completes (storage_reap).
 */
#ifndef TPORT_STORAGE_H
#define TPORT_STORAGE_H

#include <pthread.h>
#include <stdatomic.h>

#include "backend.h"
#include "engine.h"

/* The storage itself: engine.h declares it opaque, with the calls tportd
 * may make on one (retain, release, reap); the rest is the engine's. */
struct tport_storage {
  atomic_int refs;
  tport_device device;       /* where the data lives now (managed moves change it) */
  const backend_ops *mem_be; /* the backend that allocated ptr */
  int mem_dev;
  void *ptr; /* NULL for 0 bytes */
  size_t nbytes;
  unsigned flags;
  bool external;      /* caller's memory: never freed by the engine */
  /* memory lent by a pool (storage_wrap_given): handed back, not freed */
  void (*give_back)(void *ctx);
  void *give_back_ctx;
  /* what the memory costs whoever asked for it (engine.h), given back when
   * the memory is freed or handed back to its pool */
  engine_charge charge;
  pthread_mutex_t mu; /* guards the pending event */
  const backend_ops *ev_be;
  be_event *ev;
  be_stream *ev_stream; /* where ev was recorded */
  int ev_dev;
};

/* New storage of nbytes on device (flags: STORAGE_MANAGED, STORAGE_PINNED for
 * cpu).  The memory is uninitialized.  The calling thread's allocation guard
 * (engine_set_alloc_guard), if any, is asked first. */
int storage_new(tport_device device, size_t nbytes, unsigned flags, tport_storage **out,
                tport_err *err);
/* Asks the calling thread's allocation guard (engine.h) for nbytes of
 * kind: *keep (zeroed first) is the charge to release when that memory
 * goes (storage_charge_release), when the guard made one.  OK with no
 * guard or nbytes 0. */
int storage_guard_ask(engine_alloc_kind kind, size_t nbytes, engine_charge *keep, tport_err *err);
/* Releases a charge (once; a zeroed one is nothing). */
void storage_charge_release(engine_charge *c);
/* Wraps caller-owned host memory (never freed; the caller keeps it alive). */
int storage_wrap_host(void *ptr, size_t nbytes, tport_storage **out, tport_err *err);
/* Wraps pinned host memory that a pool lends (a read-back block): when the
 * last reference goes and no work is pending on it, give_back(ctx) hands
 * it back -- at once, even from storage_release_deferred (so on nng's
 * threads): give_back must only take short locks, never wait for a device. */
int storage_wrap_given(void *ptr, size_t nbytes, void (*give_back)(void *ctx), void *ctx,
                       tport_storage **out, tport_err *err);
/* Makes charge live with s: released once s's memory is freed or given back
 * (after give_back).  s takes it (*charge is zeroed). */
void storage_attach_charge(tport_storage *s, engine_charge *charge);

/* Make stream `s` of backend `be` (or the host, when be is the cpu backend or
 * the pending event belongs to another backend) wait for pending work. */
int storage_wait(tport_storage *st, const backend_ops *be, be_stream *s, tport_err *err);
/* Block the host until the storage's pending work is done. */
int storage_sync(tport_storage *st, tport_err *err);
/* Record a new event on stream s and make it the pending event of each storage.
 * A no-op for the cpu backend (its work is done when the call returns). */
int storage_mark(tport_storage *const *sts, int n, const backend_ops *be, int dev, be_stream *s,
                 tport_err *err);

/* A fence: an event of the caller's own that completes once all work now
 * pending on the storage has (NULL *ev: nothing is pending).  Destroy it
 * with (*be)->event_destroy.  Lets a caller wait for one step of a series
 * of async copies while later ones still run (read-ahead). */
int storage_fence(tport_storage *st, const backend_ops **be, be_event **ev, tport_err *err);

/* (storage_retain, storage_release, storage_release_deferred and
 * storage_reap: engine.h) */

/* Storages waiting for their work to finish before being freed. */
int storage_deferred_count(void);

#endif
