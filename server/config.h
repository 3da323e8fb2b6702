/*
 * config.h: tportd's configuration: defaults, command-line flags and their
 * TPORT_* environment variables (a flag wins over its variable).
 */
#ifndef TPORT_CONFIG_H
#define TPORT_CONFIG_H

#include <stdio.h>

#include "tport_types.h"

#define CONFIG_MAX_LISTEN 16

typedef struct server_config {
  char *listen[CONFIG_MAX_LISTEN]; /* URLs (owned) */
  int nlisten;
  char *devices;            /* "cpu", "cpu,sim:2", "cpu,cuda" ... (owned); NULL: cpu + every GPU */
  int workers;              /* engine worker threads */
  int contexts;             /* nng REP contexts (requests served at once) */
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
} server_config;

void config_defaults(server_config *c);
/* Parses argv (and TPORT_* variables).  Returns 0, or 1 when --help was
 * printed (exit 0), or an error with a message. */
int config_parse(server_config *c, int argc, char **argv, tport_err *err);
void config_free(server_config *c);
void config_usage(FILE *out);

#endif
