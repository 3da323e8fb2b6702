/* storage.c: refcounted memory, pending events and deferred frees. */
#include "storage.h"

#include "engine.h"

#include <stdlib.h>
#include <unistd.h>

#include "host_cache.h"

/* Storages released while their work was pending. */
static struct {
  pthread_mutex_t mu;
  tport_storage **items;
  int n, cap;
} graveyard = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* The calling thread's allocation guard (engine.h). */
static _Thread_local struct {
  engine_alloc_guard fn;
  void *ctx;
} guard;

void engine_set_alloc_guard(engine_alloc_guard fn, void *ctx)
{
  guard.fn = fn;
  guard.ctx = ctx;
}

int storage_guard_ask(engine_alloc_kind kind, size_t nbytes, engine_charge *keep, tport_err *err)
{
  *keep = (engine_charge){0};
  if (nbytes == 0 || !guard.fn)
    return TPORT_OK;
  int rc = guard.fn(guard.ctx, kind, nbytes, keep, err);
  if (rc)
    *keep = (engine_charge){0}; /* a refusal holds nothing */
  return rc;
}

void storage_charge_release(engine_charge *c)
{
  if (c->release)
    c->release(c->token, c->nbytes);
  *c = (engine_charge){0};
}

void storage_attach_charge(tport_storage *s, engine_charge *charge)
{
  s->charge = *charge;
  *charge = (engine_charge){0};
}

int storage_new(tport_device device, size_t nbytes, unsigned flags, tport_storage **out,
                tport_err *err)
{
  storage_reap(false);
  const backend_ops *be = backend_get(device.type);
  if (!be)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "device type %d is unknown", device.type);
  int n = be->device_count();
  if (device.index < 0 || device.index >= n)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "device %s:%d does not exist (this server has %d %s device%s)%s%s",
                         be->name, device.index, n, be->name, n == 1 ? "" : "s", n == 0 ? ": " : "",
                         n == 0 ? be->unavailable_reason() : "");
  /* paid for before it exists: a refusal allocates nothing */
  engine_charge keep;
  int grc = storage_guard_ask(ENGINE_ALLOC_STORAGE, nbytes, &keep, err);
  if (grc)
    return grc;
  tport_storage *s = calloc(1, sizeof *s);
  if (!s) {
    storage_charge_release(&keep);
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of host memory for a storage");
  }
  atomic_init(&s->refs, 1);
  pthread_mutex_init(&s->mu, NULL);
  s->device = device;
  s->nbytes = nbytes;
  s->flags = flags;
  s->mem_be = be;
  s->mem_dev = device.index;
  int rc = TPORT_OK;
  if (nbytes > 0) {
    if (flags & STORAGE_MANAGED) {
      rc = be->alloc_managed(device.index, nbytes, &s->ptr, err);
    } else if ((flags & STORAGE_PINNED) && device.type == TPORT_DEV_CPU) {
      /* from the caching pinned allocator: a fresh block per storage costs
       * twenty times the copy into it */
      s->mem_be = backend_pinned_host();
      s->mem_dev = -1;
      s->ptr = pinned_cache_alloc(nbytes);
      if (!s->ptr)
        rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                           "out of pinned host memory: %zu bytes asked", nbytes);
    } else {
      rc = be->alloc(device.index, nbytes, &s->ptr, err);
    }
  }
  if (rc != TPORT_OK) {
    storage_charge_release(&keep);
    pthread_mutex_destroy(&s->mu);
    free(s);
    return rc;
  }
  storage_attach_charge(s, &keep);
  *out = s;
  return TPORT_OK;
}

int storage_wrap_host(void *ptr, size_t nbytes, tport_storage **out, tport_err *err)
{
  tport_storage *s = calloc(1, sizeof *s);
  if (!s)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of host memory for a storage");
  atomic_init(&s->refs, 1);
  pthread_mutex_init(&s->mu, NULL);
  s->device = (tport_device){TPORT_DEV_CPU, 0};
  s->mem_be = &backend_cpu;
  s->ptr = ptr;
  s->nbytes = nbytes;
  s->external = true;
  *out = s;
  return TPORT_OK;
}

int storage_wrap_given(void *ptr, size_t nbytes, void (*give_back)(void *ctx), void *ctx,
                       tport_storage **out, tport_err *err)
{
  int rc = storage_wrap_host(ptr, nbytes, out, err);
  if (rc)
    return rc;
  (*out)->flags = STORAGE_PINNED;
  (*out)->give_back = give_back;
  (*out)->give_back_ctx = ctx;
  return TPORT_OK;
}

size_t storage_nbytes(const tport_storage *s)
{
  return s->nbytes;
}

bool tensor_sole_owner(const tport_tensor *t)
{
  return t && t->storage && atomic_load(&t->refs) == 1 && atomic_load(&t->storage->refs) == 1;
}

tport_storage *storage_retain(tport_storage *s)
{
  atomic_fetch_add(&s->refs, 1);
  return s;
}

static void storage_destroy(tport_storage *s)
{
  if (s->ev)
    s->ev_be->event_destroy(s->ev);
  if (s->give_back)
    s->give_back(s->give_back_ctx);
  else if (s->ptr && !s->external) {
    if (s->mem_dev < 0)
      pinned_cache_free(s->ptr);
    else
      s->mem_be->free(s->mem_dev, s->ptr);
  }
  /* the memory is gone (or back in its pool): so is its charge */
  storage_charge_release(&s->charge);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

/* Puts s in the graveyard (freed by storage_reap); false when out of memory. */
static bool graveyard_add(tport_storage *s)
{
  pthread_mutex_lock(&graveyard.mu);
  if (graveyard.n == graveyard.cap) {
    int cap = graveyard.cap ? graveyard.cap * 2 : 64;
    tport_storage **items = realloc(graveyard.items, (size_t)cap * sizeof *items);
    if (!items) {
      pthread_mutex_unlock(&graveyard.mu);
      return false;
    }
    graveyard.items = items;
    graveyard.cap = cap;
  }
  graveyard.items[graveyard.n++] = s;
  pthread_mutex_unlock(&graveyard.mu);
  return true;
}

void storage_release(tport_storage *s)
{
  if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
    return;
  if (!s->ev || s->ev_be->event_query(s->ev)) {
    storage_destroy(s);
    return;
  }
  if (!graveyard_add(s)) {
    /* Cannot defer: wait for the work, then free (correct, only slower). */
    s->ev_be->event_synchronize(s->ev, NULL);
    storage_destroy(s);
  }
}

void storage_release_deferred(tport_storage *s)
{
  if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
    return;
  /* a pool's block with nothing pending goes back now: a reader may be
   * waiting for it, and the reaper runs only once a second */
  if (s->give_back && !s->ev) {
    storage_destroy(s);
    return;
  }
  if (!graveyard_add(s))
    storage_destroy(s); /* out of memory for the list: free it here after all */
}

/* One reaper at a time: a reap that waits must see every storage, not an
 * empty graveyard another reaper has taken out (Sync and shutdown rely on
 * "with wait, all of them"); a reap that does not wait skips its turn. */
static pthread_mutex_t reaper_mu = PTHREAD_MUTEX_INITIALIZER;

void storage_reap(bool wait)
{
  if (wait)
    pthread_mutex_lock(&reaper_mu);
  else if (pthread_mutex_trylock(&reaper_mu) != 0)
    return;
  /* The graveyard is taken whole and the storages freed without its lock:
   * storage_release_deferred adds to it on nng's threads (the poller among
   * them), which must never wait for a cudaFreeHost or a device's work. */
  pthread_mutex_lock(&graveyard.mu);
  tport_storage **items = graveyard.items;
  int n = graveyard.n;
  graveyard.items = NULL;
  graveyard.n = graveyard.cap = 0;
  pthread_mutex_unlock(&graveyard.mu);
  int kept = 0;
  for (int i = 0; i < n; i++) {
    tport_storage *s = items[i];
    /* no event: put here by storage_release_deferred, nothing to wait for */
    if (wait && s->ev)
      s->ev_be->event_synchronize(s->ev, NULL);
    if (wait || !s->ev || s->ev_be->event_query(s->ev))
      storage_destroy(s);
    else
      items[kept++] = s;
  }
  /* the ones whose work is still running go back (rare: a device's copies
   * outlived their tensor) */
  for (int i = 0; i < kept; i++)
    if (!graveyard_add(items[i])) {
      /* out of memory for the list: wait for its work and free it here */
      items[i]->ev_be->event_synchronize(items[i]->ev, NULL);
      storage_destroy(items[i]);
    }
  free(items);
  pthread_mutex_unlock(&reaper_mu);
}

int storage_deferred_count(void)
{
  pthread_mutex_lock(&graveyard.mu);
  int n = graveyard.n;
  pthread_mutex_unlock(&graveyard.mu);
  return n;
}

int storage_wait(tport_storage *st, const backend_ops *be, be_stream *s, tport_err *err)
{
  pthread_mutex_lock(&st->mu);
  int rc = TPORT_OK;
  if (st->ev) {
    if (st->ev_be == be && be != &backend_cpu)
      rc = be->stream_wait_event(s, st->ev, err);
    else
      rc = st->ev_be->event_synchronize(st->ev, err);
  }
  pthread_mutex_unlock(&st->mu);
  return rc;
}

int storage_sync(tport_storage *st, tport_err *err)
{
  pthread_mutex_lock(&st->mu);
  int rc = TPORT_OK;
  if (st->ev) {
    rc = st->ev_be->event_synchronize(st->ev, err);
    if (rc == TPORT_OK) {
      st->ev_be->event_destroy(st->ev);
      st->ev = NULL;
    }
  }
  pthread_mutex_unlock(&st->mu);
  return rc;
}

/* ENGINE_SLOW_MARK's pause: up to 0.5 ms. */
static void test_pause(void)
{
  if (engine_test_faults() & ENGINE_SLOW_MARK)
    usleep((useconds_t)(rand() % 500));
}

/* A storage keeps one event: the one that follows every op enqueued on it.
 * So the event is recorded under the storage's lock, after waiting for the
 * one it replaces: recorded outside it, two threads marking the same
 * storage (two chunks of one put, on two workers) could install the
 * earlier-recorded event last, and the storage then looked done -- and was
 * freed, its memory reused -- while the later copy was still queued (a
 * sim stream thread wrote a put's chunk into a block the host cache had
 * taken back).  The old event's wait is enqueued on s where it is of the
 * same backend (another stream's work), else waited for here. */
int storage_mark(tport_storage *const *sts, int n, const backend_ops *be, int dev, be_stream *s,
                 tport_err *err)
{
  if (be == &backend_cpu)
    return TPORT_OK;
  for (int i = 0; i < n; i++) {
    be_event *ev;
    int rc = be->event_create(dev, &ev, err);
    if (rc != TPORT_OK)
      return rc;
    pthread_mutex_lock(&sts[i]->mu);
    be_event *old = sts[i]->ev;
    if (old && sts[i]->ev_be == be && sts[i]->ev_stream != s)
      rc = be->stream_wait_event(s, old, err);
    else if (old && sts[i]->ev_be != be)
      rc = sts[i]->ev_be->event_synchronize(old, err);
    if (rc == TPORT_OK)
      rc = be->event_record(ev, s, err);
    if (rc != TPORT_OK) {
      pthread_mutex_unlock(&sts[i]->mu);
      be->event_destroy(ev);
      return rc;
    }
    test_pause();
    if (sts[i]->ev)
      sts[i]->ev_be->event_destroy(sts[i]->ev);
    sts[i]->ev_be = be;
    sts[i]->ev = ev;
    sts[i]->ev_stream = s;
    sts[i]->ev_dev = dev;
    pthread_mutex_unlock(&sts[i]->mu);
  }
  return TPORT_OK;
}

int storage_fence(tport_storage *st, const backend_ops **be, be_event **ev, tport_err *err)
{
  pthread_mutex_lock(&st->mu);
  int rc = TPORT_OK;
  *ev = NULL;
  if (st->ev && !st->ev_be->event_query(st->ev)) {
    /* a new event on the same stream, after the pending work */
    rc = st->ev_be->event_create(st->ev_dev, ev, err);
    if (!rc && (rc = st->ev_be->event_record(*ev, st->ev_stream, err)) != TPORT_OK) {
      st->ev_be->event_destroy(*ev);
      *ev = NULL;
    }
    *be = st->ev_be;
  }
  pthread_mutex_unlock(&st->mu);
  return rc;
}
