/* transfers.c: the gets in progress (see transfers.h). */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static _Thread_local bool transfers_oom;
#define HASH_NONFATAL_OOM 1
#define uthash_nonfatal_oom(e) (transfers_oom = true)

#include "transfers.h"

int64_t transfers_now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void transfers_init(transfers *ts, registry *reg)
{
  memset(ts, 0, sizeof *ts);
  pthread_mutex_init(&ts->mu, NULL);
  ts->reg = reg;
}

void transfers_destroy(transfers *ts)
{
  transfers_drop(ts, 0);
  pthread_mutex_destroy(&ts->mu);
}

void transfers_free(transfers *ts, get_transfer *g)
{
  if (!g)
    return;
  reader_close(g->reader);
  if (g->tn)
    reg_transfer_leave(ts->reg, g->pipe, g->tn, g->charged);
  free(g);
}

int transfers_reserve(transfers *ts, get_transfer *g, size_t charge, tport_err *err)
{
  int rc = reg_transfer_enter(ts->reg, g->pipe, charge, &g->tn, err);
  if (!rc)
    g->charged = charge;
  return rc;
}

/* g last in the order of reading (the most recently read).  mu held. */
static void idle_append(transfers *ts, get_transfer *g)
{
  g->idle_next = NULL;
  g->idle_prev = ts->idle_tail;
  if (ts->idle_tail)
    ts->idle_tail->idle_next = g;
  else
    ts->idle_head = g;
  ts->idle_tail = g;
}

static void idle_unlink(transfers *ts, get_transfer *g)
{
  if (g->idle_prev)
    g->idle_prev->idle_next = g->idle_next;
  else
    ts->idle_head = g->idle_next;
  if (g->idle_next)
    g->idle_next->idle_prev = g->idle_prev;
  else
    ts->idle_tail = g->idle_prev;
  g->idle_prev = g->idle_next = NULL;
}

int transfers_insert(transfers *ts, get_transfer *g, tport_err *err)
{
  char tenant[REG_TENANT_MAX];
  int rc = TPORT_OK;
  pthread_mutex_lock(&ts->mu);
  /* Checked and listed under one lock: a connection that goes after the
   * check has its transfers dropped after this insert (pipe events close the
   * session first, then drop its transfers under this lock). */
  if (!reg_session_tenant(ts->reg, g->pipe, tenant, sizeof tenant)) {
    rc = tport_err_set(err, TPORT_ABORTED, "the connection is closing");
  } else {
    transfer_pipe *tp;
    HASH_FIND(hh, ts->by_pipe, &g->pipe, sizeof g->pipe, tp);
    bool made = !tp;
    if (made && (tp = calloc(1, sizeof *tp)) != NULL) {
      tp->pipe = g->pipe;
      transfers_oom = false;
      HASH_ADD(hh, ts->by_pipe, pipe, sizeof tp->pipe, tp);
      if (transfers_oom) {
        free(tp);
        tp = NULL;
      }
    }
    if (tp) {
      transfers_oom = false;
      HASH_ADD(hh, ts->by_id, id, TRANSFER_ID_BYTES, g);
    }
    if (!tp || transfers_oom) {
      if (tp && made) {
        HASH_DEL(ts->by_pipe, tp);
        free(tp);
      }
      rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for a transfer");
    } else {
      g->refs = 1;
      g->listed = true;
      g->last_ms = transfers_now_ms();
      g->owner = tp;
      g->pipe_prev = NULL;
      g->pipe_next = tp->list;
      if (tp->list)
        tp->list->pipe_prev = g;
      tp->list = g;
      idle_append(ts, g);
      ts->count++;
    }
  }
  pthread_mutex_unlock(&ts->mu);
  return rc;
}

get_transfer *transfers_get(transfers *ts, uint32_t pipe, const uint8_t *id)
{
  get_transfer *g;
  pthread_mutex_lock(&ts->mu);
  HASH_FIND(hh, ts->by_id, id, TRANSFER_ID_BYTES, g);
  if (g && g->pipe != pipe)
    g = NULL; /* another connection's: as if it did not exist */
  if (g) {
    g->refs++;
    g->last_ms = transfers_now_ms();
    idle_unlink(ts, g); /* the most recently read now */
    idle_append(ts, g);
  }
  pthread_mutex_unlock(&ts->mu);
  return g;
}

/* Takes g off the table (the table's reference goes with it).  mu held. */
static bool unlist(transfers *ts, get_transfer *g)
{
  if (!g->listed)
    return false;
  HASH_DEL(ts->by_id, g);
  idle_unlink(ts, g);
  transfer_pipe *tp = g->owner;
  if (g->pipe_prev)
    g->pipe_prev->pipe_next = g->pipe_next;
  else
    tp->list = g->pipe_next;
  if (g->pipe_next)
    g->pipe_next->pipe_prev = g->pipe_prev;
  g->pipe_prev = g->pipe_next = NULL;
  g->owner = NULL;
  if (!tp->list) { /* its connection has none left */
    HASH_DEL(ts->by_pipe, tp);
    free(tp);
  }
  g->listed = false;
  ts->count--;
  return --g->refs == 0;
}

void transfers_release(transfers *ts, get_transfer *g, size_t served)
{
  pthread_mutex_lock(&ts->mu);
  bool gone = false;
  g->served += served;
  if (served && g->served >= g->nbytes)
    gone = unlist(ts, g); /* every byte has gone out once: the transfer ends */
  gone = --g->refs == 0 || gone;
  pthread_mutex_unlock(&ts->mu);
  if (gone)
    transfers_free(ts, g);
}

/* g off the table, onto *dead when that was its last reference (else a
 * chunk being served frees it at its release); counted in *n.  mu held. */
static void end_one(transfers *ts, get_transfer *g, get_transfer **dead, int *n)
{
  ts->walked++;
  (*n)++;
  if (unlist(ts, g)) {
    g->hh.next = *dead; /* reuse the link: g is off the table */
    *dead = g;
  }
}

static void free_dead(transfers *ts, get_transfer *dead)
{
  while (dead) {
    get_transfer *g = dead;
    dead = g->hh.next;
    transfers_free(ts, g);
  }
}

void transfers_drop(transfers *ts, uint32_t pipe)
{
  get_transfer *dead = NULL, *g, *next;
  int n = 0;
  pthread_mutex_lock(&ts->mu);
  if (pipe == 0) {
    get_transfer *tmp;
    HASH_ITER(hh, ts->by_id, g, tmp)
    {
      end_one(ts, g, &dead, &n);
    }
  } else {
    transfer_pipe *tp;
    HASH_FIND(hh, ts->by_pipe, &pipe, sizeof pipe, tp);
    /* (the last one's unlist frees tp: nothing of it is read after) */
    for (g = tp ? tp->list : NULL; g; g = next) {
      next = g->pipe_next;
      end_one(ts, g, &dead, &n);
    }
  }
  pthread_mutex_unlock(&ts->mu);
  free_dead(ts, dead);
}

int transfers_expire(transfers *ts, int64_t now_mono_ms, int64_t idle_ms)
{
  int64_t idle_before = now_mono_ms - idle_ms;
  get_transfer *dead = NULL, *g, *next;
  int n = 0;
  pthread_mutex_lock(&ts->mu);
  /* from the least recently read, while they are idle; one whose chunk is
   * being served (read from too, so rarely here) is left */
  for (g = ts->idle_head; g && g->last_ms < idle_before; g = next) {
    next = g->idle_next;
    if (g->refs == 1)
      end_one(ts, g, &dead, &n);
    else
      ts->walked++;
  }
  pthread_mutex_unlock(&ts->mu);
  free_dead(ts, dead);
  return n;
}

uint64_t transfers_count(transfers *ts)
{
  pthread_mutex_lock(&ts->mu);
  uint64_t n = ts->count;
  pthread_mutex_unlock(&ts->mu);
  return n;
}
