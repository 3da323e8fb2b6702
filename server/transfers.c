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
    g->refs = 1;
    g->listed = true;
    g->last_ms = transfers_now_ms();
    transfers_oom = false;
    HASH_ADD(hh, ts->by_id, id, TRANSFER_ID_BYTES, g);
    if (transfers_oom) {
      g->listed = false;
      rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory for a transfer");
    } else {
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

/* Ends the transfers that match; frees them outside the lock. */
static int drop_where(transfers *ts, uint32_t pipe, bool all, int64_t idle_before)
{
  get_transfer *g, *tmp, *dead = NULL;
  int n = 0;
  pthread_mutex_lock(&ts->mu);
  HASH_ITER(hh, ts->by_id, g, tmp)
  {
    bool match = all || (pipe && g->pipe == pipe) ||
                 (idle_before && g->refs == 1 && g->last_ms < idle_before);
    if (match && unlist(ts, g)) {
      g->hh.next = dead; /* reuse the link: g is off the table */
      dead = g;
      n++;
    } else if (match) {
      n++; /* a chunk is being served: its release frees it */
    }
  }
  pthread_mutex_unlock(&ts->mu);
  while (dead) {
    g = dead;
    dead = g->hh.next;
    transfers_free(ts, g);
  }
  return n;
}

void transfers_drop(transfers *ts, uint32_t pipe)
{
  drop_where(ts, pipe, pipe == 0, 0);
}

int transfers_expire(transfers *ts, int64_t now_mono_ms, int64_t idle_ms)
{
  return drop_where(ts, 0, false, now_mono_ms - idle_ms);
}

uint64_t transfers_count(transfers *ts)
{
  pthread_mutex_lock(&ts->mu);
  uint64_t n = ts->count;
  pthread_mutex_unlock(&ts->mu);
  return n;
}
