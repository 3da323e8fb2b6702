/*
 * regions_index.c: the regions by connection, by CUDA IPC handle, and the
 * pending ones by when their tokens expire.
 *
 * A registration asks how many regions its connection holds, whether it
 * has its process region, and who else registered its IPC handle; a
 * connection's end takes its regions away; a registration first ends the
 * pending regions whose tokens expired.  Each of these walked every region
 * of the server under the table's lock, which every put and get through a
 * region takes: what one connection held set what every other's
 * registration, and every connection's end, cost.  Now each is a walk of
 * its own: the connection's list, the handle's, the expired front of the
 * pending list (a token lives cfg.token_ms from its registration, so
 * registration order is expiry order).
 *
 * Every function here runs with the table's mutex held.
 */
#include <stdlib.h>
#include <string.h>

#include "regions_internal.h"

struct shm_pipe {
  uint32_t pipe;
  size_t regions; /* of them, those that are not its process region */
  shm_region *process;
  shm_region *list;
  UT_hash_handle hh;
};

struct shm_ipc_key {
  uint8_t handle[SHM_IPC_HANDLE_BYTES];
  shm_region *list;
  UT_hash_handle hh;
};

static shm_pipe *pipe_of(shm_table *t, uint32_t pipe)
{
  shm_pipe *p;
  HASH_FIND(hh, t->by_pipe, &pipe, sizeof pipe, p);
  return p;
}

static shm_ipc_key *key_of(shm_table *t, const uint8_t *handle)
{
  shm_ipc_key *k;
  HASH_FIND(hh, t->by_handle, handle, SHM_IPC_HANDLE_BYTES, k);
  return k;
}

static atomic_int hash_alloc_fails_at;

void shm_test_fail_hash_alloc(int k)
{
  atomic_store(&hash_alloc_fails_at, k);
}

void *shm_hash_malloc(size_t n)
{
  /* counts down to the one that fails (1), then stops (0) */
  int k = atomic_load(&hash_alloc_fails_at);
  while (k > 0 && !atomic_compare_exchange_weak(&hash_alloc_fails_at, &k, k - 1))
    ;
  return k == 1 ? NULL : malloc(n);
}

bool index_add(shm_table *t, shm_region *r)
{
  shm_pipe *p = pipe_of(t, r->pipe);
  shm_ipc_key *k = is_ipc(r) ? key_of(t, r->ipc_handle) : NULL;
  bool new_pipe = !p, new_key = is_ipc(r) && !k;
  if (new_pipe && (p = calloc(1, sizeof *p)) == NULL)
    return false;
  if (new_key && (k = calloc(1, sizeof *k)) == NULL) {
    if (new_pipe)
      free(p);
    return false;
  }
  shm_oom = false;
  if (new_pipe) {
    p->pipe = r->pipe;
    HASH_ADD(hh, t->by_pipe, pipe, sizeof p->pipe, p);
  }
  if (new_key && !shm_oom) {
    memcpy(k->handle, r->ipc_handle, sizeof k->handle);
    HASH_ADD(hh, t->by_handle, handle, sizeof k->handle, k);
    if (shm_oom && new_pipe)
      HASH_DEL(t->by_pipe, p); /* (in it: the handle's add failed) */
  }
  if (shm_oom) {
    if (new_pipe)
      free(p);
    if (new_key)
      free(k);
    return false;
  }
  r->owner = p;
  r->pipe_prev = NULL;
  r->pipe_next = p->list;
  if (p->list)
    p->list->pipe_prev = r;
  p->list = r;
  if (r->kind == KIND_PROCESS)
    p->process = r;
  else
    p->regions++;
  r->ipc_key = k;
  if (k) {
    r->ipc_prev = NULL;
    r->ipc_next = k->list;
    if (k->list)
      k->list->ipc_prev = r;
    k->list = r;
  }
  return true;
}

void index_remove(shm_table *t, shm_region *r)
{
  shm_pipe *p = r->owner;
  if (p) {
    if (r->pipe_prev)
      r->pipe_prev->pipe_next = r->pipe_next;
    else
      p->list = r->pipe_next;
    if (r->pipe_next)
      r->pipe_next->pipe_prev = r->pipe_prev;
    if (p->process == r)
      p->process = NULL;
    else
      p->regions--;
    if (!p->list) {
      HASH_DEL(t->by_pipe, p);
      free(p);
    }
  }
  shm_ipc_key *k = r->ipc_key;
  if (k) {
    if (r->ipc_prev)
      r->ipc_prev->ipc_next = r->ipc_next;
    else
      k->list = r->ipc_next;
    if (r->ipc_next)
      r->ipc_next->ipc_prev = r->ipc_prev;
    if (!k->list) {
      HASH_DEL(t->by_handle, k);
      free(k);
    }
  }
  r->owner = NULL;
  r->ipc_key = NULL;
  r->pipe_prev = r->pipe_next = r->ipc_prev = r->ipc_next = NULL;
}

size_t index_pipe_regions(shm_table *t, uint32_t pipe)
{
  shm_pipe *p = pipe_of(t, pipe);
  return p ? p->regions : 0;
}

shm_region *index_pipe_process(shm_table *t, uint32_t pipe)
{
  shm_pipe *p = pipe_of(t, pipe);
  return p ? p->process : NULL;
}

shm_region *index_pipe_first(shm_table *t, uint32_t pipe)
{
  shm_pipe *p = pipe_of(t, pipe);
  return p ? p->list : NULL;
}

shm_region *index_ipc_first(shm_table *t, const uint8_t *handle)
{
  shm_ipc_key *k = key_of(t, handle);
  return k ? k->list : NULL;
}

void pending_append(shm_table *t, shm_region *r)
{
  r->tok_next = NULL;
  r->tok_prev = t->pending_tail;
  if (t->pending_tail)
    t->pending_tail->tok_next = r;
  else
    t->pending_head = r;
  t->pending_tail = r;
}

void pending_remove(shm_table *t, shm_region *r)
{
  if (r->tok_prev)
    r->tok_prev->tok_next = r->tok_next;
  else
    t->pending_head = r->tok_next;
  if (r->tok_next)
    r->tok_next->tok_prev = r->tok_prev;
  else
    t->pending_tail = r->tok_prev;
  r->tok_prev = r->tok_next = NULL;
}

void index_free(shm_table *t)
{
  shm_pipe *p, *ptmp;
  HASH_ITER(hh, t->by_pipe, p, ptmp)
  {
    HASH_DEL(t->by_pipe, p);
    free(p);
  }
  shm_ipc_key *k, *ktmp;
  HASH_ITER(hh, t->by_handle, k, ktmp)
  {
    HASH_DEL(t->by_handle, k);
    free(k);
  }
}
