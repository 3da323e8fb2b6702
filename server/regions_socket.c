/*
 * regions_socket.c: the same-host socket of the regions (regions.h): the
 * table started and stopped with it, and the thread that takes each
 * region's descriptor from the client that registered it (a handoff).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine.h"
#include "log.h"
#include "regions_internal.h"

/* ---------------------------------------------------------------- handoff */

/* Checks and maps the descriptor for the region its token names. */
static int handoff(shm_table *t, int conn, tport_err *err)
{
  uint8_t token[TRANSPORT_SHM_TOKEN_BYTES];
  int fd = -1;
  transport_shm_peer peer;
  int rc = transport_shm_recv(conn, HANDOFF_TIMEOUT_MS, token, &fd, &peer, err);
  if (rc)
    return rc;
  if (!transport_shm_peer_allowed(&peer, t->cfg.mode)) {
    close(fd);
    return tport_err_set(err, TPORT_PERMISSION_DENIED,
                         "uid %u may not hand regions to this server (--shm-mode %o)",
                         (unsigned)peer.uid, t->cfg.mode);
  }
  /* the token: good once, for its own connection's region, until it expires */
  pthread_mutex_lock(&t->mu);
  shm_region *r;
  HASH_FIND(hh_tok, t->by_token, token, sizeof token, r);
  if (r) {
    HASH_DELETE(hh_tok, t->by_token, r);
    pending_remove(t, r);
    r->tokened = false;
    r->handing_off = true;
  }
  pthread_mutex_unlock(&t->mu);
  if (!r) {
    close(fd);
    return tport_err_set(err, TPORT_PERMISSION_DENIED,
                         "the token names no region waiting for its descriptor");
  }
  if (r->peer_pid && peer.pid != r->peer_pid)
    rc = tport_err_set(err, TPORT_PERMISSION_DENIED,
                       "the descriptor came from pid %d: region %llu was registered by pid %d's "
                       "connection",
                       (int)peer.pid, (unsigned long long)r->id, (int)r->peer_pid);
  else if (now_ms() > r->token_expires_ms)
    rc = tport_err_set(err, TPORT_DEADLINE_EXCEEDED,
                       "the region's token expired (%lu ms after ShmRegister): register again",
                       t->cfg.token_ms);
  if (!rc)
    rc = transport_shm_check(fd, r->nbytes, err);
  void *base = MAP_FAILED;
  if (!rc &&
      (base = mmap(NULL, r->nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED)
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "the region cannot be mapped: %s",
                       strerror(errno));
  close(fd); /* the mapping keeps the memory */
  bool pinned = false;
  /* a CUDA allocation's descriptor is the client's device memory: the
   * driver has it already */
  if (!rc && r->kind == KIND_MEMFD) {
    tport_err why;
    if (engine_host_register(base, r->nbytes, &pinned, &why) != TPORT_OK)
      log_msg(LOG_WARN, "region %llu stays pageable: %s", (unsigned long long)r->id, why.msg);
  }
  pthread_mutex_lock(&t->mu);
  r->handing_off = false;
  bool gone = r->released;
  if (!rc && !gone) {
    r->base = base;
    r->pinned = pinned;
    r->state = REGION_READY;
    if (is_ipc(r))
      t->stats.ipc_opens++;
  } else if (!gone) {
    /* a failed handoff ends the region: register again */
    region_remove(t, r);
    gone = true;
  }
  pthread_mutex_unlock(&t->mu);
  if (gone) {
    if (base != MAP_FAILED && !r->base) {
      r->base = base;
      r->pinned = pinned;
    }
    region_free(r);
    if (!rc)
      rc = tport_err_set(err, TPORT_ABORTED, "the region was released during its handoff");
  }
  return rc;
}

typedef struct handoff_job {
  shm_table *t;
  int conn;
} handoff_job;

/* One connection of the socket: its handoff, the verdict, the end. */
static void *handoff_thread(void *arg)
{
  prctl(PR_SET_NAME, "tportd:handoff"); /* what top -H, perf and gdb show */
  handoff_job *j = arg;
  shm_table *t = j->t;
  tport_err err;
  tport_err_clear(&err);
  int rc = handoff(t, j->conn, &err);
  /* counted before the client hears the verdict (it may ask for the count) */
  pthread_mutex_lock(&t->mu);
  if (rc)
    t->stats.handoffs_refused++;
  else
    t->stats.handoffs_ok++;
  pthread_mutex_unlock(&t->mu);
  transport_shm_reply(j->conn, rc, rc ? err.msg : "");
  close(j->conn);
  free(j);
  if (rc)
    log_event(LOG_INFO, "region handoff refused", "code", tport_status_name(rc), "error", err.msg,
              NULL);
  OPENSSL_thread_stop(); /* this thread's RAND and error state */
  pthread_mutex_lock(&t->mu);
  t->handoffs_running--;
  pthread_cond_broadcast(&t->handoffs_done);
  pthread_mutex_unlock(&t->mu);
  return NULL;
}

static void *handoff_main(void *arg)
{
  prctl(PR_SET_NAME, "tportd:shm"); /* what top -H, perf and gdb show */
  shm_table *t = arg;
  for (;;) {
    struct pollfd p[2] = {{.fd = t->listen_fd, .events = POLLIN},
                          {.fd = t->wake[0], .events = POLLIN}};
    if (poll(p, 2, -1) < 0 && errno != EINTR)
      break;
    if (p[1].revents)
      break;
    if (!(p[0].revents & POLLIN))
      continue;
    int conn = accept4(t->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (conn < 0) {
      /* out of descriptors or memory: the connection stays pending and
       * poll says so again at once -- wait a little (or for the stop) */
      if (errno == EMFILE || errno == ENFILE || errno == ENOMEM || errno == ENOBUFS)
        poll(&p[1], 1, 100);
      continue;
    }
    handoff_job *j = malloc(sizeof *j);
    pthread_mutex_lock(&t->mu);
    bool room = j && t->handoffs_running < MAX_HANDOFFS;
    if (room)
      t->handoffs_running++;
    pthread_mutex_unlock(&t->mu);
    pthread_t th;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (room) {
      *j = (handoff_job){t, conn};
      if (pthread_create(&th, &attr, handoff_thread, j) != 0) {
        pthread_mutex_lock(&t->mu);
        t->handoffs_running--;
        pthread_mutex_unlock(&t->mu);
        room = false;
      }
    }
    pthread_attr_destroy(&attr);
    if (!room) {
      free(j);
      transport_shm_reply(conn, TPORT_RESOURCE_EXHAUSTED,
                          "the server is busy with other handoffs: try again");
      close(conn);
      pthread_mutex_lock(&t->mu);
      t->stats.handoffs_refused++;
      pthread_mutex_unlock(&t->mu);
    }
  }
  return NULL;
}

/* ---------------------------------------------------------------- table */

int shm_start(const shm_config *cfg, shm_table **out, tport_err *err)
{
  shm_table *t = calloc(1, sizeof *t);
  if (!t)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  t->cfg = *cfg;
  t->path = strdup(cfg->path);
  t->listen_fd = -1;
  t->wake[0] = t->wake[1] = -1;
  t->euid = geteuid();
  /* ids start anywhere: a client's id of a server it knew before a
   * restart names nothing on the new one (by all odds) */
  if (RAND_bytes((unsigned char *)&t->next_id, sizeof t->next_id) != 1)
    t->next_id = (uint64_t)now_ms();
  t->next_id = (t->next_id >> 2) | 1; /* never 0, and far from wrapping */
  if (!t->cfg.total_max) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    t->cfg.total_max = pages > 0 && page > 0 ? (size_t)pages * (size_t)page / 2 : SIZE_MAX;
  }
  /* one tenant never fills what all share: at most half of it by default
   * (16 GiB was over --shm-max on hosts under 32 GiB) */
  if (!t->cfg.quota)
    t->cfg.quota = t->cfg.total_max / 2 < DEFAULT_QUOTA ? t->cfg.total_max / 2 : DEFAULT_QUOTA;
  else if (t->cfg.quota > t->cfg.total_max)
    log_msg(LOG_WARN,
            "--shm-quota %zu is over --shm-max %zu: one tenant's regions can refuse everyone "
            "else's",
            t->cfg.quota, t->cfg.total_max);
  if (!t->cfg.token_ms)
    t->cfg.token_ms = TOKEN_TTL_MS;
  if (!t->cfg.max_ipc)
    t->cfg.max_ipc = SHM_DEFAULT_MAX_IPC;
  if (!t->cfg.max_process_reads)
    t->cfg.max_process_reads = 1;
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->handoffs_done, NULL);
  regions_cond_init(&t->readers_free);
  int rc = t->path ? TPORT_OK : tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  if (!rc)
    rc = transport_shm_listen(cfg->path, cfg->mode, &t->listen_fd, err);
  if (!rc && pipe2(t->wake, O_CLOEXEC) != 0)
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "pipe: %s", strerror(errno));
  if (!rc && pthread_create(&t->thread, NULL, handoff_main, t) != 0)
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "cannot start the shm thread");
  if (rc) {
    if (t->listen_fd >= 0) {
      close(t->listen_fd);
      unlink(cfg->path);
    }
    if (t->wake[0] >= 0) {
      close(t->wake[0]);
      close(t->wake[1]);
    }
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->handoffs_done);
    pthread_cond_destroy(&t->readers_free);
    free(t->path);
    free(t);
    return rc;
  }
  *out = t;
  return TPORT_OK;
}

void shm_stop(shm_table *t)
{
  if (!t)
    return;
  ssize_t n;
  do
    n = write(t->wake[1], "x", 1);
  while (n < 0 && errno == EINTR);
  pthread_join(t->thread, NULL);
  /* the handoffs in progress end within their timeout */
  pthread_mutex_lock(&t->mu);
  while (t->handoffs_running > 0)
    pthread_cond_wait(&t->handoffs_done, &t->mu);
  /* a read of a client's memory that never ended still has its thread
   * (regions_process.c): the table stays for it to touch, as it is */
  t->stopped = true;
  size_t stuck = t->process_reading;
  pthread_mutex_unlock(&t->mu);
  close(t->listen_fd);
  unlink(t->path);
  close(t->wake[0]);
  close(t->wake[1]);
  if (stuck) {
    log_msg(LOG_WARN, "%zu read%s of clients' memory never ended: their regions are left mapped",
            stuck, stuck == 1 ? "" : "s");
    return;
  }
  shm_region *r, *tmp;
  HASH_ITER(hh, t->by_id, r, tmp)
  {
    region_remove(t, r);
    region_free(r);
  }
  index_free(t); /* (emptied by the removals: whatever is left) */
  tenant_use *u, *ut;
  HASH_ITER(hh, t->tenants, u, ut)
  {
    HASH_DEL(t->tenants, u);
    free(u);
  }
  pthread_mutex_destroy(&t->mu);
  pthread_cond_destroy(&t->handoffs_done);
  pthread_cond_destroy(&t->readers_free);
  free(t->path);
  free(t);
}

const char *shm_socket_path(const shm_table *t)
{
  return t ? t->path : NULL;
}
