/*
 * registry.h: the server's tensors, sessions and tenants.
 *
 * A session is one connection (an nng pipe) and belongs to a tenant.  A
 * tensor is either connection-scoped (unnamed: freed when its connection
 * goes) or kept for its tenant under a unique name with a time to live.  A
 * handle is 128 random bits; a handle or name of another tenant is "not
 * found".  Entries are refcounted: a handler holds its own reference while
 * it works, so a concurrent free or disconnect never pulls a tensor from
 * under it.  Bytes are accounted per tenant against a quota.
 */
#ifndef TPORT_REGISTRY_H
#define TPORT_REGISTRY_H

#include <pthread.h>

#include "engine.h"

#define REG_HANDLE_BYTES 16
#define REG_NAME_MAX 128
#define REG_TENANT_MAX 64

typedef enum { REG_UPLOADING, REG_READY } reg_state;

/* An upload in progress (PutBegin .. PutCommit). */
typedef struct reg_upload {
  tport_tensor *landing; /* the bytes land here, in the client's layout */
  size_t nbytes, chunk_bytes;
  uint64_t nchunks;
  uint8_t *claimed, *received; /* bitmaps: a chunk being written / written */
  uint64_t nreceived;
  int inflight;
  /* what commit makes of the landing tensor */
  to_options convert;
  bool needs_convert;
} reg_upload;

typedef struct reg_entry {
  uint8_t handle[REG_HANDLE_BYTES];
  char name[REG_NAME_MAX]; /* "" when unnamed */
  char tenant[REG_TENANT_MAX];
  uint32_t owner_pipe; /* 0: kept for the tenant */
  int64_t expires_ms;  /* 0: no time limit */
  reg_state state;
  tport_tensor *tensor; /* READY */
  reg_upload *up;       /* UPLOADING */
  size_t bytes;         /* accounted to the tenant */
  int refs;             /* the registry's own plus one per holder */
  bool removed;
  struct reg_entry *next;
} reg_entry;

/* A closed session is kept this long so late requests of its pipe fail. */
#define REG_TOMBSTONE_MS (10 * 60 * 1000)

typedef struct reg_session {
  uint32_t pipe;
  char tenant[REG_TENANT_MAX];
  bool alive;
  int64_t dropped_ms;
  int inflight_chunks;
  struct reg_session *next;
} reg_session;

typedef struct reg_limits {
  size_t max_tensor_bytes;
  size_t tenant_quota_bytes;
  int max_inflight_chunks;
  uint64_t default_ttl_ms;
} reg_limits;

typedef struct registry {
  pthread_mutex_t mu;
  reg_entry *entries;
  reg_session *sessions;
  struct reg_tenant *tenants;
  reg_limits limits;
  uint64_t count;
} registry;

void reg_init(registry *r, const reg_limits *limits);
/* Frees every entry (the server is stopping). */
void reg_destroy(registry *r);

/* The session of a pipe, created on first sight (tenant "default"). */
void reg_session_touch(registry *r, uint32_t pipe);
void reg_session_set_tenant(registry *r, uint32_t pipe, const char *tenant);
/* The pipe went away: its connection-scoped tensors and half-done uploads go. */
void reg_session_drop(registry *r, uint32_t pipe);
/* Claims an in-flight chunk slot for the pipe (RESOURCE_EXHAUSTED past the limit). */
int reg_chunk_enter(registry *r, uint32_t pipe, tport_err *err);
void reg_chunk_leave(registry *r, uint32_t pipe);

/* Registers a ready tensor t, or an upload up (exactly one of the two; the
 * entry takes ownership of it, and frees it on failure) for the pipe's
 * session.  name may be NULL or ""; a named entry, or one with keep, is kept for
 * the tenant with a time to live (ttl_ms 0: the default), any other lives with
 * the connection.  new_bytes is
 * what the entry adds to the tenant's quota.  Returns the entry with a
 * reference for the caller (reg_put it). */
int reg_add(registry *r, uint32_t pipe, tport_tensor *t, reg_upload *up, const char *name,
            bool keep, uint64_t ttl_ms, size_t new_bytes, reg_entry **out, tport_err *err);
/* Finds a tensor by handle bytes or name, for the pipe's tenant; NOT_FOUND
 * otherwise (another tenant's handle included). */
int reg_find(registry *r, uint32_t pipe, const uint8_t *handle, size_t handle_len, const char *name,
             reg_entry **out, tport_err *err);
void reg_put(registry *r, reg_entry *e);
/* Removes an entry (free, abort); its memory goes once no holder remains. */
void reg_remove(registry *r, reg_entry *e);
/* Turns an upload into a ready tensor (and accounts its bytes instead of the
 * landing tensor's). */
void reg_ready(registry *r, reg_entry *e, tport_tensor *t);
/* Removes expired entries. */
int reg_expire(registry *r, int64_t now_ms);
/* Entries of the pipe's tenant (references held; reg_put each, free the array). */
int reg_list(registry *r, uint32_t pipe, reg_entry ***out, size_t *n);
/* Tenant bytes and entry counts for stats. */
void reg_counts(registry *r, uint64_t *entries, uint64_t *uploads, uint64_t *bytes);

int64_t reg_now_ms(void);
void reg_upload_free(reg_upload *up);

#endif
