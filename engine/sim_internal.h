/*
 * sim_internal.h: what the files of the sim backend share (backend_sim.c:
 * configuration, devices, copies and kernels; sim_memory.c: its device,
 * managed and "pinned" memory; sim_stream.c: streams and events).  The
 * sim's contract with the engine is backend.h's, and its differences from
 * CUDA are told at the top of backend_sim.c.
 */
#ifndef TPORT_SIM_INTERNAL_H
#define TPORT_SIM_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "backend.h"

#define SIM_MAX_DEVICES 16
#define SIM_TAG ((uintptr_t)0x5A << 56)
#define SIM_TAG_MASK ((uintptr_t)0xFF << 56)

typedef enum { OP_MEMCPY, OP_KERNEL, OP_MARK, OP_WAIT, OP_HOSTFN, OP_PREFETCH, OP_STOP } op_kind;

struct be_event {
  int dev; /* the device it was created for */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t recorded, completed;
  atomic_int refs; /* the owner's plus one per queued op */
};

typedef struct sim_op {
  op_kind kind;
  struct sim_op *next;
  union {
    struct {
      void *dst;
      const void *src;
      size_t n;
    } copy;
    struct {
      plan p;
      void *dst;
      const void *src;
      tport_dtype dt, st;
      unsigned flags;
    } kernel;
    struct {
      be_event *ev;
      uint64_t seq;
    } event;
    struct {
      be_host_fn fn;
      void *arg;
    } host;
  } u;
} sim_op;

struct be_stream {
  int dev;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  sim_op *head, *tail;
  uint64_t enqueued, completed;
  unsigned rng;
};

typedef struct sim_alloc {
  uintptr_t base; /* host address */
  size_t size;
  int dev;
  bool managed;
  int location; /* managed: device index, -1 host */
} sim_alloc;

typedef struct sim_state {
  pthread_mutex_t mu;
  int ndevices;
  size_t mem_bytes;
  size_t used[SIM_MAX_DEVICES];
  size_t peak[SIM_MAX_DEVICES]; /* the most used has been since sim_reset_peak */
  bool peer_possible[SIM_MAX_DEVICES][SIM_MAX_DEVICES];
  bool peer_enabled[SIM_MAX_DEVICES][SIM_MAX_DEVICES];
  be_stream *streams[SIM_MAX_DEVICES];
  sim_alloc *allocs; /* sorted by base */
  int nallocs, cap;
  atomic_uint max_delay_us;
  atomic_uint min_delay_us;
  unsigned seed;
} sim_state;
extern sim_state sim;

/* ---- devices (backend_sim.c) */
int sim_count(void);
/* INVALID_ARGUMENT unless dev is a configured sim device. */
int sim_check_dev(int dev, tport_err *err);

/* ---- memory (sim_memory.c) */
uintptr_t sim_untag(const void *p);
bool sim_is_tagged(const void *p);
/* Index of the allocation containing [addr, addr+n); -1 if none.  mu held. */
int sim_find_alloc(uintptr_t addr, size_t n);
int sim_add_alloc(sim_alloc a);
/* The host address of n bytes of dev's memory at p (or of a peer's whose
 * access dev enabled); what names the operand in an error. */
int sim_resolve_device(int dev, const void *p, size_t n, const char *what, void **out,
                       tport_err *err);
/* The same for host memory (never a device address). */
int sim_resolve_host(const void *p, size_t n, const char *what, void **out, tport_err *err);
int sim_alloc_dev(int dev, size_t bytes, void **out, tport_err *err);
int sim_alloc_managed(int dev, size_t bytes, void **out, tport_err *err);
void sim_free(int dev, void *p);
int sim_host_alloc(size_t bytes, void **out, tport_err *err);
void sim_host_free(void *p);
/* "Pinned" host allocations made, and bytes held now. */
void sim_host_counts(uint64_t *allocs, uint64_t *bytes);

/* ---- streams and events (sim_stream.c) */
int sim_stream_start(int dev, be_stream **out, tport_err *err);
void sim_stream_stop(be_stream *s);
sim_op *sim_new_op(op_kind kind, tport_err *err);
int sim_enqueue(be_stream *s, sim_op *op);
void sim_event_unref(be_event *e);
/* CUDA's answer to a stream or event used on a device it does not belong to. */
int sim_invalid_handle(const char *call, const char *what, int what_dev, int dev, tport_err *err);
be_stream *sim_stream_default(int dev);
int sim_stream_create(int dev, be_stream **out, tport_err *err);
int sim_stream_sync(be_stream *s, tport_err *err);
void sim_stream_destroy(be_stream *s);
int sim_host_func(be_stream *s, be_host_fn fn, void *arg, tport_err *err);
int sim_event_create(int dev, be_event **out, tport_err *err);
void sim_event_destroy(be_event *e);
int sim_event_record(be_event *e, be_stream *s, tport_err *err);
int sim_stream_wait(be_stream *s, be_event *e, tport_err *err);
bool sim_event_query(be_event *e);
int sim_event_sync(be_event *e, tport_err *err);

#endif
