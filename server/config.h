/*
 * config.h: tportd's configuration: defaults, command-line flags and their
 * TPORT_* environment variables (a flag wins over its variable).
 */
#ifndef TPORT_CONFIG_H
#define TPORT_CONFIG_H

#include <stdio.h>

#include "tport_types.h"

#define CONFIG_MAX_LISTEN 16
/* room in a message for the frame header and the request around a chunk */
#define CONFIG_MESSAGE_ROOM 4096
/* ten years: keeps every deadline computed from a time to live far from overflow */
#define CONFIG_MAX_TTL_S (10 * 366 * 24 * 3600)

/* --metrics-tenants: a tenant's label in /metrics */
enum {
  METRICS_TENANTS_HASH, /* a keyed hash, stable for the server's life (the default) */
  METRICS_TENANTS_NAME, /* the tenant's name */
  METRICS_TENANTS_OFF   /* no per-tenant series */
};

typedef struct server_config {
  char *listen[CONFIG_MAX_LISTEN]; /* URLs (owned) */
  int nlisten;
  char *devices;            /* "cpu", "cpu,sim:2", "cpu,cuda" ... (owned); NULL: cpu + every GPU */
  int workers;              /* engine worker threads */
  int contexts;             /* nng REP receives posted at once (each one taken is replaced) */
  size_t max_message_bytes; /* receive limit per listener */
  size_t chunk_bytes;       /* put/get chunk size offered to clients */
  int window;               /* chunks a client may keep in flight */
  size_t max_tensor_bytes;
  size_t tenant_quota_bytes;
  int max_inflight_chunks;   /* per connection */
  unsigned long ttl_s;       /* named tensors' default time to live */
  unsigned long deadline_ms; /* a request queued longer than this is DEADLINE_EXCEEDED */
  unsigned long grace_ms;    /* SIGINT/SIGTERM: time to finish in-flight work */
  int log_level;             /* 0 error, 1 warn, 2 info, 3 debug */
  char *kernel_cache;        /* directory for compiled CUDA kernels (owned); NULL: memory only */
  bool uvm;                  /* tensors put on a GPU are managed (unified) memory */
  /* hostile clients: what one connection or tenant may hold */
  char *admin;                  /* comma-separated operator tenants (owned); NULL: none */
  int max_outstanding;          /* requests of one connection received and not yet answered */
  unsigned long send_timeout_ms; /* a reply not taken by its connection in time drops it */
  int max_transfers;            /* gets in progress per connection */
  unsigned long transfer_timeout_ms; /* a get not read from this long ends */
  size_t max_tensors;           /* tensors (and uploads) per tenant */
  unsigned long max_ttl_s;      /* the longest time to live a client may ask for */
  /* who may connect (see auth.h) */
  char *auth_file;              /* tenants and their secrets (owned); NULL: see local_secret */
  char *local_secret;           /* without auth_file and tls_ca: the file of the local secret of
                                   this user (owned; transport/local_secret.h) that clients
                                   prove, any tenant theirs; NULL: tenants are claimed, operators
                                   (--admin) refused.  config_parse's default is
                                   transport_local_secret_default(), config_defaults' none */
  bool local_secret_set;        /* --local-secret given ("off" included) */
  bool insecure;                /* allow plain tcp:// on an address that is not loopback */
  unsigned ipc_mode;            /* permissions of ipc:// socket files */
  /* TLS of tls+tcp:// listeners (transport/tls_openssl.h) */
  char *tls_cert, *tls_key;     /* PEM (owned) */
  char *tls_ca;                 /* PEM CAs of client certificates (owned): mutual TLS, the
                                   certificate's subject CN is the tenant */
  bool tls12;                   /* --tls-min-version 1.2 */
  unsigned long auth_timeout_ms; /* a connection must prove its tenant within this */
  uint64_t max_connections;      /* open at once (0: from the fd limit, config_max_connections) */
  size_t request_memory;         /* request bodies held server-wide (0: from RAM,
                                    config_request_memory) */
  int tenant_workers;            /* workers one tenant may keep busy (0: workers - 1, >= 1) */
  bool host_cache_set;           /* --host-cache given (else host_cache.h's default) */
  size_t host_cache_bytes;       /* freed large host blocks kept for reuse */
  /* operations (http.h, log.h) */
  char *http_listen;    /* HOST:PORT of /metrics, /healthz, /readyz (owned); NULL: none.
                           config_parse's default is HTTP_DEFAULT_ADDRESS, config_defaults' none */
  bool http_listen_set; /* --http-listen given ("off" included) */
  int log_format;       /* LOG_TEXT or LOG_JSON */
  int metrics_tenants;  /* METRICS_TENANTS_*: how /metrics labels each tenant's bytes */
  /* same-host shared memory (regions.h) */
  char *shm_socket;     /* the Unix socket regions are handed over on (owned); NULL: none.
                           config_parse's default is config_shm_default_path(), config_defaults'
                           none */
  bool shm_socket_set;  /* --shm-socket given ("off" included): failing to listen is an error
                           (the default path only warns) */
  unsigned shm_mode;    /* its permissions */
  size_t shm_quota;     /* bytes of regions per tenant (0: half of shm_max, at most 16 GiB) */
  size_t shm_max;       /* bytes of regions in all (0: half the machine's memory) */
  int shm_max_regions;  /* per connection */
  size_t cuda_ipc_max;  /* CUDA IPC regions per tenant (0: regions.h's default) */
  unsigned long shm_token_ms; /* a region's token, and a region never handed over, lives this
                                 long (0: 10 s); no flag: tests shorten it */
} server_config;

/* $XDG_RUNTIME_DIR/tportd/shm.sock, else /run/tportd/shm.sock (malloc'd). */
char *config_shm_default_path(void);

/* What the 0 defaults of max_connections, request_memory and tenant_workers
 * come to on this machine. */
uint64_t config_max_connections(const server_config *c);
size_t config_request_memory(const server_config *c);
int config_tenant_workers(const server_config *c);

void config_defaults(server_config *c);
/* Parses argv (and TPORT_* variables).  Returns 0, or 1 when --help was
 * printed (exit 0), or an error with a message. */
int config_parse(server_config *c, int argc, char **argv, tport_err *err);
/* Checks the flags against each other (chunk within message, ttl within
 * max-ttl...); config_parse calls it, server_start again for configs built in code. */
int config_check(const server_config *c, tport_err *err);
void config_free(server_config *c);
void config_usage(FILE *out);

#endif
