/*
 * regions.c: the server's same-host regions (regions.h): registered,
 * released, held for a copy, and counted against their tenant's quota.
 * The socket and its handoff thread are regions_socket.c.
 */
#define _GNU_SOURCE
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine.h"
#include "log.h"
#include "regions_internal.h"

tenant_use *tenant_of(shm_table *t, const char *name, bool create)
{
  tenant_use *u;
  HASH_FIND_STR(t->tenants, name, u);
  if (!u && create && (u = calloc(1, sizeof *u))) {
    snprintf(u->name, sizeof u->name, "%s", name);
    shm_oom = false;
    HASH_ADD_STR(t->tenants, name, u);
    if (shm_oom) {
      free(u);
      u = NULL;
    }
  }
  return u;
}

/* What a region counts against: its bytes, or, a CUDA IPC one, its place
 * among the tenant's IPC regions. */
static void uncharge(shm_table *t, const shm_region *r)
{
  tenant_use *u = tenant_of(t, r->tenant, false);
  if (!u)
    return;
  if (is_ipc(r))
    u->ipc--;
  if (r->kind == KIND_PROCESS)
    u->process--;
  if (host_mapped(r->kind))
    u->bytes -= r->nbytes;
  if (tenant_unused(u)) {
    HASH_DEL(t->tenants, u);
    free(u);
  }
}

/* Unmaps a region nobody holds any more.  Never under mu (cudaHostUnregister
 * and munmap of a large mapping take a while). */
void region_free(shm_region *r)
{
  if (r->kind == KIND_PROCESS) {
    if (r->pidfd >= 0)
      close(r->pidfd);
  } else if (r->kind == KIND_IPC_CUDA) {
    if (r->map && atomic_fetch_sub(&r->map->refs, 1) == 1) {
      engine_ipc_close(r->map->dev, r->map->base);
      free(r->map);
    }
  } else if (r->base) {
    if (r->pinned)
      engine_host_unregister(r->base);
    munmap(r->base, r->nbytes);
  }
  free(r);
}

/* Takes r out of the tables and the quota (mu held); true when the caller
 * must free it (nobody holds it). */
bool region_remove(shm_table *t, shm_region *r)
{
  HASH_DELETE(hh, t->by_id, r);
  index_remove(t, r);
  if (r->tokened) {
    HASH_DELETE(hh_tok, t->by_token, r);
    pending_remove(t, r);
  }
  r->tokened = false;
  uncharge(t, r);
  t->stats.regions--;
  if (is_ipc(r))
    t->stats.ipc_regions--;
  if (r->kind == KIND_PROCESS)
    t->stats.process_regions--;
  if (host_mapped(r->kind))
    t->stats.bytes -= r->nbytes;
  r->released = true;
  /* the handoff thread owns a region it is checking: it frees it */
  return r->holds == 0 && !r->handing_off;
}

/* r by its id, and by its token where its descriptor comes through the
 * socket (not an IPC handle's nor a process's, which are opened at once);
 * false out of memory, neither added.  mu held. */
static bool tables_add(shm_table *t, shm_region *r)
{
  bool tokened = r->kind != KIND_IPC_CUDA && r->kind != KIND_PROCESS;
  shm_oom = false;
  r->id = t->next_id;
  HASH_ADD(hh, t->by_id, id, sizeof r->id, r);
  if (!shm_oom && tokened) {
    HASH_ADD(hh_tok, t->by_token, token, sizeof r->token, r);
    if (shm_oom)
      HASH_DELETE(hh, t->by_id, r);
  }
  if (shm_oom)
    return false;
  t->next_id++;
  return true;
}

/* Ends the regions whose token expired before their descriptor came (mu
 * held): they count against no quota any more.  Those still in by_token
 * are exactly the PENDING regions no handoff has taken; one a handoff
 * thread is checking has left it, and that thread decides.  The caller
 * frees what comes back in *dead (linked by hh.next; nothing is mapped). */
static void expire_pending(shm_table *t, shm_region **dead)
{
  int64_t now = now_ms();
  shm_region *r, *next;
  /* oldest first (every token lives cfg.token_ms): the expired front */
  for (r = t->pending_head; r && now > r->token_expires_ms; r = next) {
    next = r->tok_next;
    t->walked++;
    if (region_remove(t, r)) {
      r->hh.next = *dead; /* out of the table: the link is free to reuse */
      *dead = r;
    }
  }
}

static void free_dead(shm_region *dead)
{
  while (dead) {
    shm_region *next = dead->hh.next;
    region_free(dead);
    dead = next;
  }
}


/* Why a CUDA IPC region may not be registered (mu held): its handle is
 * another tenant's, or this connection's already, or the tenant has its
 * fill of them. */
static int ipc_refusal(shm_table *t, uint32_t pipe, const char *tenant, const uint8_t *handle,
                       const tenant_use *u, tport_err *err)
{
  for (shm_region *x = index_ipc_first(t, handle); x; x = x->ipc_next) {
    t->walked++;
    if (strcmp(x->tenant, tenant) != 0)
      return tport_err_set(err, TPORT_PERMISSION_DENIED,
                           "that CUDA IPC handle is registered by another tenant: a tenant opens "
                           "only its own allocations");
    if (x->pipe == pipe)
      return tport_err_set(err, TPORT_ALREADY_EXISTS,
                           "this connection has that allocation open already (region %llu): one "
                           "open per allocation",
                           (unsigned long long)x->id);
  }
  if (u->ipc >= t->cfg.max_ipc)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                         "tenant '%s' has %zu CUDA IPC allocations open: the limit is %zu (release "
                         "one first)",
                         tenant, u->ipc, t->cfg.max_ipc);
  return TPORT_OK;
}

/* Why a connection may not have its process region (mu held): it has one. */
static int process_refusal(shm_table *t, uint32_t pipe, tport_err *err)
{
  shm_region *x = index_pipe_process(t, pipe);
  if (x)
    return tport_err_set(err, TPORT_ALREADY_EXISTS,
                         "this connection has its process region already (region %llu)",
                         (unsigned long long)x->id);
  return TPORT_OK;
}

/* Why the connection may not register a region of nbytes of that kind
 * (mu held): it has its fill, its process region already, a CUDA IPC
 * handle it may not have, or the bytes would pass a limit. */
static int refusal(shm_table *t, uint32_t pipe, const char *tenant, region_kind kind,
                   const uint8_t *handle, size_t nbytes, const tenant_use *u, tport_err *err)
{
  /* the process region is one a connection, beside its others */
  size_t mine = index_pipe_regions(t, pipe);
  int rc = TPORT_OK;
  if (kind != KIND_PROCESS && mine >= t->cfg.max_regions)
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                       "this connection holds %zu regions already: release one first", mine);
  else if (kind == KIND_PROCESS && (rc = process_refusal(t, pipe, err)) != TPORT_OK)
    ; /* said why */
  else if (kind_is_ipc(kind) && (rc = ipc_refusal(t, pipe, tenant, handle, u, err)) != TPORT_OK)
    ; /* said why */
  else if (!host_mapped(kind))
    ; /* a CUDA IPC handle: no host bytes */
  else if (t->stats.bytes + nbytes > t->cfg.total_max)
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                       "the server holds %llu bytes of regions: %llu more would pass its limit "
                       "(--shm-max, %zu bytes)",
                       (unsigned long long)t->stats.bytes, (unsigned long long)nbytes,
                       t->cfg.total_max);
  else if (u->bytes + nbytes > t->cfg.quota || u->bytes + nbytes < u->bytes)
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                       "tenant '%s' has %zu bytes of regions: %llu more would pass its shm quota "
                       "(%zu bytes)",
                       tenant, u->bytes, (unsigned long long)nbytes, t->cfg.quota);
  return rc;
}

int register_region(shm_table *t, uint32_t pipe, const char *tenant, pid_t peer_pid,
                    uint64_t nbytes, region_kind kind, const uint8_t *handle, uint64_t *id,
                    uint8_t token[TRANSPORT_SHM_TOKEN_BYTES], shm_region **opening, tport_err *err)
{
  if (kind == KIND_PROCESS)
    nbytes = 0; /* an address space: what a slice names is checked as it is read */
  else if (nbytes == 0)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "a region holds at least one byte");
  if (nbytes > (uint64_t)PTRDIFF_MAX)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "an allocation of %llu bytes is more than this host can address",
                         (unsigned long long)nbytes);
  if (host_mapped(kind) && nbytes > t->cfg.quota)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED,
                         "a region of %llu bytes is over the tenant's shm quota (%zu bytes)",
                         (unsigned long long)nbytes, t->cfg.quota);
  shm_region *r = calloc(1, sizeof *r);
  if (!r)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  if (RAND_bytes(r->token, sizeof r->token) != 1) {
    free(r);
    return tport_err_set(err, TPORT_INTERNAL, "RAND_bytes failed");
  }
  snprintf(r->tenant, sizeof r->tenant, "%s", tenant);
  r->pipe = pipe;
  r->peer_pid = peer_pid;
  r->nbytes = (size_t)nbytes;
  r->state = REGION_PENDING;
  r->kind = kind;
  r->pidfd = -1;
  if (handle)
    memcpy(r->ipc_handle, handle, SHM_IPC_HANDLE_BYTES);
  pthread_mutex_lock(&t->mu);
  shm_region *dead = NULL;
  expire_pending(t, &dead);
  r->token_expires_ms = now_ms() + (int64_t)t->cfg.token_ms;
  tenant_use *u = tenant_of(t, tenant, true);
  int rc = u ? refusal(t, pipe, tenant, kind, handle, r->nbytes, u, err)
             : tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  if (!rc && !index_add(t, r))
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  if (!rc && !tables_add(t, r)) {
    index_remove(t, r);
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  }
  if (rc) {
    if (kind_is_ipc(kind))
      t->stats.ipc_refused++;
    if (u && tenant_unused(u)) {
      HASH_DEL(t->tenants, u);
      free(u);
    }
    pthread_mutex_unlock(&t->mu);
    free(r);
    free_dead(dead);
    return rc;
  }
  if (host_mapped(kind))
    u->bytes += r->nbytes;
  if (is_ipc(r)) {
    u->ipc++;
    t->stats.ipc_regions++;
  }
  if (kind == KIND_PROCESS) {
    u->process++;
    t->stats.process_regions++;
  }
  if (kind == KIND_IPC_CUDA || kind == KIND_PROCESS) {
    r->handing_off = true; /* the caller opens it outside mu, and frees it if it goes */
    *opening = r;
  } else {
    pending_append(t, r);
    r->tokened = true;
  }
  t->stats.regions++;
  if (host_mapped(kind))
    t->stats.bytes += r->nbytes;
  *id = r->id;
  memcpy(token, r->token, sizeof r->token);
  pthread_mutex_unlock(&t->mu);
  free_dead(dead);
  return TPORT_OK;
}

int shm_register(shm_table *t, uint32_t pipe, const char *tenant, pid_t peer_pid, uint64_t nbytes,
                 uint64_t *id, uint8_t token[TRANSPORT_SHM_TOKEN_BYTES], tport_err *err)
{
  return register_region(t, pipe, tenant, peer_pid, nbytes, KIND_MEMFD, NULL, id, token, NULL, err);
}

/* Opens a KIND_IPC_CUDA region registered a moment ago (its handing_off
 * keeps it this thread's to free). */
static int ipc_open_now(shm_table *t, shm_region *r, tport_err *err)
{
  /* another connection of the tenant has it open: shared (a region in the
   * table holds its reference, so the map cannot go meanwhile) */
  pthread_mutex_lock(&t->mu);
  for (shm_region *x = index_ipc_first(t, r->ipc_handle); x && !r->map; x = x->ipc_next)
    if (x != r && x->kind == KIND_IPC_CUDA && x->map && strcmp(x->tenant, r->tenant) == 0) {
      atomic_fetch_add(&x->map->refs, 1);
      r->map = x->map;
    }
  pthread_mutex_unlock(&t->mu);
  int rc = TPORT_OK;
  if (!r->map) {
    ipc_map *m = calloc(1, sizeof *m);
    if (!m)
      rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
    else if ((rc = engine_ipc_open(r->ipc_handle, sizeof r->ipc_handle, &m->dev, &m->base, err)) !=
             TPORT_OK)
      free(m);
    else {
      atomic_init(&m->refs, 1);
      /* under the lock another open's search above reads it under (it was
       * written without: a search could see the map before its count) */
      pthread_mutex_lock(&t->mu);
      r->map = m;
      pthread_mutex_unlock(&t->mu);
    }
  }
  if (!rc) {
    r->base = r->map->base;
    r->ipc_dev = r->map->dev;
  }
  return region_opened(t, r, rc, err);
}

int region_opened(shm_table *t, shm_region *r, int rc, tport_err *err)
{
  pthread_mutex_lock(&t->mu);
  r->handing_off = false;
  bool gone = r->released;
  if (!rc && !gone) {
    r->state = REGION_READY;
    if (is_ipc(r))
      t->stats.ipc_opens++;
  } else if (!gone) {
    region_remove(t, r);
    if (is_ipc(r))
      t->stats.ipc_refused++;
    gone = true;
  }
  pthread_mutex_unlock(&t->mu);
  if (gone) {
    if (!rc)
      rc = tport_err_set(err, TPORT_ABORTED, "the region was released during its open");
    region_free(r); /* its reference to the map, or its pidfd */
  }
  return rc;
}

int shm_register_ipc(shm_table *t, uint32_t pipe, const char *tenant, pid_t peer_pid,
                     uint64_t nbytes, const uint8_t *handle, size_t handle_len, bool fd,
                     uint64_t *id, uint8_t token[TRANSPORT_SHM_TOKEN_BYTES], bool *ready,
                     tport_err *err)
{
  if (handle_len != SHM_IPC_HANDLE_BYTES)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "cuda_ipc_handle is %zu bytes: a cudaIpcMemHandle_t is %d", handle_len,
                         SHM_IPC_HANDLE_BYTES);
  shm_region *opening = NULL;
  int rc = register_region(t, pipe, tenant, peer_pid, nbytes, fd ? KIND_IPC_FD : KIND_IPC_CUDA,
                           handle, id, token, &opening, err);
  if (rc || fd) {
    *ready = false;
    return rc;
  }
  if ((rc = ipc_open_now(t, opening, err)) != TPORT_OK)
    return rc;
  memset(token, 0, TRANSPORT_SHM_TOKEN_BYTES);
  *ready = true;
  return TPORT_OK;
}

shm_region *find_mine(shm_table *t, uint32_t pipe, uint64_t id)
{
  shm_region *r;
  HASH_FIND(hh, t->by_id, &id, sizeof id, r);
  return r && r->pipe == pipe ? r : NULL; /* another connection's: as if none */
}

int shm_release(shm_table *t, uint32_t pipe, uint64_t id, tport_err *err)
{
  pthread_mutex_lock(&t->mu);
  shm_region *r = find_mine(t, pipe, id);
  bool free_it = r && region_remove(t, r);
  pthread_mutex_unlock(&t->mu);
  if (!r)
    return tport_err_set(err, TPORT_NOT_FOUND, "this connection has no region %llu",
                         (unsigned long long)id);
  if (free_it)
    region_free(r);
  return TPORT_OK;
}

void shm_drop_pipe(shm_table *t, uint32_t pipe)
{
  if (!t)
    return;
  shm_region *dead = NULL;
  pthread_mutex_lock(&t->mu);
  shm_region *next;
  /* (the last one's removal frees the connection's record: not read after) */
  for (shm_region *r = index_pipe_first(t, pipe); r; r = next) {
    next = r->pipe_next;
    t->walked++;
    if (region_remove(t, r)) {
      r->hh.next = dead; /* out of the table: the link is free to reuse */
      dead = r;
    }
  }
  pthread_mutex_unlock(&t->mu);
  free_dead(dead);
}

int shm_hold(shm_table *t, uint32_t pipe, uint64_t id, uint64_t offset, uint64_t length,
             shm_region **out, uint8_t **p, bool *pinned, tport_err *err)
{
  tport_device dev;
  bool on_dev = false;
  int rc = shm_hold_any(t, pipe, id, offset, length, out, p, pinned, &dev, &on_dev, err);
  if (!rc && on_dev) {
    shm_unhold(t, *out);
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "region %llu is GPU memory (CUDA IPC): name it in a whole put "
                         "(PutBegin with commit) or a get, not a chunk",
                         (unsigned long long)id);
  }
  return rc;
}

int shm_hold_any(shm_table *t, uint32_t pipe, uint64_t id, uint64_t offset, uint64_t length,
                 shm_region **out, uint8_t **p, bool *pinned, tport_device *dev, bool *on_dev,
                 tport_err *err)
{
  if (!t)
    return tport_err_set(err, TPORT_FAILED_PRECONDITION,
                         "this server offers no shared memory (--shm-socket off)");
  pthread_mutex_lock(&t->mu);
  shm_region *r = find_mine(t, pipe, id);
  int rc = TPORT_OK;
  if (!r)
    rc = tport_err_set(err, TPORT_NOT_FOUND, "this connection has no region %llu",
                       (unsigned long long)id);
  else if (r->state != REGION_READY)
    rc = tport_err_set(err, TPORT_FAILED_PRECONDITION,
                       "region %llu has not been handed over yet (its descriptor goes to the shm "
                       "socket first)",
                       (unsigned long long)id);
  else if (r->kind == KIND_PROCESS)
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT,
                       "region %llu is the client's own memory: only a put's chunks name it",
                       (unsigned long long)id);
  else if (offset > r->nbytes || length > r->nbytes - offset)
    rc = tport_err_set(
        err, TPORT_OUT_OF_RANGE, "bytes [%llu, +%llu) are past region %llu's %zu bytes",
        (unsigned long long)offset, (unsigned long long)length, (unsigned long long)id, r->nbytes);
  if (!rc) {
    r->holds++;
    *out = r;
    *p = r->base + offset;
    *pinned = r->pinned;
    *on_dev = r->kind == KIND_IPC_CUDA;
    if (*on_dev)
      *dev = r->ipc_dev;
  }
  pthread_mutex_unlock(&t->mu);
  return rc;
}

void shm_unhold(shm_table *t, shm_region *r)
{
  if (!r)
    return;
  pthread_mutex_lock(&t->mu);
  bool free_it = --r->holds == 0 && r->released && !r->handing_off;
  pthread_mutex_unlock(&t->mu);
  if (free_it)
    region_free(r);
}

void shm_count_transfer(shm_table *t)
{
  if (!t)
    return;
  pthread_mutex_lock(&t->mu);
  t->stats.transfers++;
  pthread_mutex_unlock(&t->mu);
}

void shm_get_stats(shm_table *t, shm_stats *out)
{
  memset(out, 0, sizeof *out);
  if (!t)
    return;
  shm_region *dead = NULL;
  pthread_mutex_lock(&t->mu);
  expire_pending(t, &dead); /* what is counted is what counts */
  *out = t->stats;
  out->process_reading = t->process_reading;
  out->process_stuck = t->process_stuck;
  pthread_mutex_unlock(&t->mu);
  free_dead(dead);
}

void shm_limits(const shm_table *t, size_t *quota, size_t *total_max)
{
  *quota = t ? t->cfg.quota : 0;
  *total_max = t ? t->cfg.total_max : 0;
}
