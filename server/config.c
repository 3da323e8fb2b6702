/* config.c: tportd flags and TPORT_* environment variables. */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "http.h"
#include "listen_url.h"
#include "local_secret.h"
#include "log.h"
#include "units.h"

#define DEFAULT_URL "tcp://127.0.0.1:7450"

void config_defaults(server_config *c)
{
  memset(c, 0, sizeof *c);
  c->workers = 4;
  c->contexts = 1024;
  c->max_message_bytes = (size_t)80 << 20;
  c->chunk_bytes = (size_t)4 << 20;
  c->window = 8;
  c->max_tensor_bytes = (size_t)16 << 30;
  c->tenant_quota_bytes = (size_t)64 << 30;
  c->max_inflight_chunks = 32;
  c->ttl_s = 3600;
  c->deadline_ms = 30000;
  c->grace_ms = 5000;
  c->log_level = 2;
  c->max_outstanding = 32;
  c->send_timeout_ms = 10000;
  c->max_transfers = 16;
  c->transfer_timeout_ms = 60000;
  c->max_tensors = 65536;
  c->max_ttl_s = 7 * 24 * 3600;
  c->ipc_mode = 0600;
  c->auth_timeout_ms = 10000;
  c->shm_mode = 0600;
  c->shm_quota = 0; /* half of --shm-max, at most 16 GiB (regions.c) */
  c->shm_max_regions = 64;
  c->metrics_tenants = METRICS_TENANTS_HASH; /* names are for the operator, not the endpoint */
}

char *config_shm_default_path(void)
{
  const char *x = getenv("XDG_RUNTIME_DIR");
  char buf[256];
  if (x && *x == '/' && strlen(x) < 160)
    snprintf(buf, sizeof buf, "%s/tportd/shm.sock", x);
  else
    snprintf(buf, sizeof buf, "/run/tportd/shm.sock");
  return strdup(buf);
}

void config_free(server_config *c)
{
  for (int i = 0; i < c->nlisten; i++)
    free(c->listen[i]);
  free(c->devices);
  free(c->kernel_cache);
  free(c->admin);
  free(c->auth_file);
  c->auth_file = NULL;
  free(c->local_secret);
  c->local_secret = NULL;
  free(c->tls_cert);
  free(c->tls_key);
  free(c->tls_ca);
  c->tls_cert = c->tls_key = c->tls_ca = NULL;
  free(c->http_listen);
  c->http_listen = NULL;
  free(c->shm_socket);
  c->shm_socket = NULL;
  c->nlisten = 0;
  c->devices = NULL;
  c->kernel_cache = NULL;
  c->admin = NULL;
}

static const struct {
  const char *flag, *env, *arg, *help;
} opts[] = {
    {"listen", "TPORT_LISTEN", "URL",
     "listen on URL: tcp://HOST:PORT, tls+tcp://HOST:PORT, ipc:///PATH, inproc://NAME (any "
     "scheme of nng's: tcp4, tcp6, unix, abstract, ws, wss...; repeatable; the variable takes a "
     "comma-separated list; default " DEFAULT_URL ").  Loopback is 127.0.0.0/8, ::1 or "
     "localhost, never another host name; anything else needs --auth-file or --tls-ca"},
    {"devices", "TPORT_DEVICES", "LIST",
     "devices to serve: cpu, sim:N (N simulated GPUs), cuda (every CUDA GPU); default cpu plus "
     "every CUDA GPU present"},
    {"workers", "TPORT_WORKERS", "N", "engine worker threads (default 4)"},
    {"contexts", "TPORT_CONTEXTS", "N",
     "receives posted at once: each request taken off a connection is replaced by a new "
     "receive, so requests being handled and replies waiting for their connection hold none "
     "(default 1024)"},
    {"max-message", "TPORT_MAX_MESSAGE", "SIZE", "largest request accepted (default 80 MiB)"},
    {"chunk", "TPORT_CHUNK", "SIZE", "put/get chunk size offered to clients (default 4 MiB)"},
    {"window", "TPORT_WINDOW", "N", "chunks a client may keep in flight (default 8)"},
    {"max-tensor", "TPORT_MAX_TENSOR", "SIZE", "largest tensor (default 16 GiB)"},
    {"quota", "TPORT_QUOTA", "SIZE", "bytes each tenant may hold (default 64 GiB)"},
    {"max-inflight", "TPORT_MAX_INFLIGHT", "N", "chunks in flight per connection (default 32)"},
    {"ttl", "TPORT_TTL", "DURATION", "default time to live of named tensors (default 1h; a bare number is seconds)"},
    {"deadline", "TPORT_DEADLINE_MS", "DURATION", "request deadline in the queue (default 30s; a bare number is ms)"},
    {"grace", "TPORT_GRACE_MS", "DURATION", "on SIGINT/SIGTERM, time to finish work (default 5s; a bare number is ms)"},
    {"log-level", "TPORT_LOG_LEVEL", "LEVEL", "error, warn, info (default) or debug (or 0 to 3)"},
    {"kernel-cache", "TPORT_KERNEL_CACHE", "DIR",
     "keep runtime-compiled CUDA kernels in DIR across restarts (tport stats shows the cache's "
     "hits, misses and compile time)"},
    {"uvm", "TPORT_UVM", "0|1", "1: tensors put on a GPU are managed (unified) memory"},
    {"admin", "TPORT_ADMIN", "LIST",
     "operator tenants (comma-separated): they see server-wide Stats; others see their own"},
    {"max-outstanding", "TPORT_MAX_OUTSTANDING", "N",
     "requests one connection may have unanswered (libtport keeps to it); past twice that the "
     "connection is dropped (default 32)"},
    {"send-timeout", "TPORT_SEND_TIMEOUT_MS", "DURATION",
     "a reply its connection does not take within it drops that connection (default 10s; a bare "
     "number is ms)"},
    {"max-transfers", "TPORT_MAX_TRANSFERS", "N", "gets in progress per connection (default 16)"},
    {"transfer-timeout", "TPORT_TRANSFER_TIMEOUT_MS", "DURATION",
     "a get not read from for this long ends (default 60s; a bare number is ms)"},
    {"max-tensors", "TPORT_MAX_TENSORS", "N", "tensors each tenant may hold (default 65536)"},
    {"max-ttl", "TPORT_MAX_TTL", "DURATION",
     "longest time to live a client may ask for (default 7d; a bare number is seconds)"},
    {"auth-file", "TPORT_AUTH_FILE", "PATH",
     "tenants and their secrets, one 'TENANT SECRET' a line (SECRET: 32+ hex digits; mode 600); "
     "clients must prove their tenant (reloaded on SIGHUP); without it tportd listens on "
     "loopback only and clients prove the local secret (--local-secret)"},
    {"insecure", "TPORT_INSECURE", "",
     "allow plain tcp:// on an address that is not loopback (bytes and the answers to "
     "challenges travel unencrypted; the variable takes 0 or 1)"},
    {"ipc-mode", "TPORT_IPC_MODE", "OCTAL", "permissions of ipc:// socket files (default 600)"},
    {"tls-cert", "TPORT_TLS_CERT", "FILE",
     "PEM certificate (and chain) of tls+tcp:// listeners (TLS 1.3 on OpenSSL)"},
    {"tls-key", "TPORT_TLS_KEY", "FILE", "PEM private key of --tls-cert (default: in that file)"},
    {"tls-ca", "TPORT_TLS_CA", "FILE",
     "PEM CAs of client certificates: tls+tcp:// clients must present one, and its subject CN "
     "is their tenant (mutual TLS)"},
    {"tls-min-version", "TPORT_TLS_MIN_VERSION", "1.2|1.3", "oldest TLS accepted (default 1.3)"},
    {"auth-timeout", "TPORT_AUTH_TIMEOUT_MS", "DURATION",
     "with authentication on, a connection that has not proved its tenant within it is dropped "
     "(default 10s; a bare number is ms)"},
    {"host-cache", "TPORT_HOST_CACHE", "BYTES",
     "freed host blocks of 1 MiB or more kept for reuse (a fresh one costs its page faults; "
     "default an eighth of RAM, at most 8 GiB; 0: none)"},
    {"http-listen", "TPORT_HTTP_LISTEN", "HOST:PORT",
     "serve GET /metrics (Prometheus), /healthz and /readyz on HOST:PORT ([::1]:PORT for IPv6; "
     "0.0.0.0:PORT or another interface for probes from outside; default " HTTP_DEFAULT_ADDRESS
     "; off: none).  It shows counters and each tenant's bytes, never tensors"},
    {"log-format", "TPORT_LOG_FORMAT", "text|json",
     "text (default) or json: one JSON object a line (time, level, message, and fields such as "
     "tenant, peer, method, code)"},
    {"shm-socket", "TPORT_SHM_SOCKET", "PATH",
     "same-host shared memory: clients on this machine hand sealed memfd regions over the Unix "
     "socket PATH and put and get through them at memory speed (default "
     "$XDG_RUNTIME_DIR/tportd/shm.sock, else /run/tportd/shm.sock; off: none)"},
    {"shm-mode", "TPORT_SHM_MODE", "OCTAL",
     "permissions of the shm socket (default 600: this user and root; 660 lets the group in)"},
    {"shm-quota", "TPORT_SHM_QUOTA", "BYTES",
     "bytes of regions each tenant may register (default half of --shm-max, at most 16 GiB; a "
     "region never handed over stops counting when its token expires, after 10 s)"},
    {"shm-max", "TPORT_SHM_MAX", "BYTES",
     "bytes of regions all tenants together may register (default half the machine's memory: "
     "with a GPU, regions are pinned)"},
    {"metrics-tenants", "TPORT_METRICS_TENANTS", "name|hash|off",
     "how /metrics labels each tenant's bytes (tport_tenant_bytes{tenant}): hash (default) a "
     "keyed hash of the name, the same while this server runs (a random key of its own: "
     "nobody can check a guessed name against it; the log line of an authenticated connection "
     "has it as metrics_tenant); name the name itself, for anyone who reaches --http-listen; off "
     "none"},
    {"max-connections", "TPORT_MAX_CONNECTIONS", "N",
     "connections open at once; more are closed as they arrive (default the open-file limit "
     "less 128, at least 16)"},
    {"request-memory", "TPORT_REQUEST_MEMORY", "BYTES",
     "request bodies held at once, all connections together (waiting for a worker or being "
     "handled); a request past it is answered RESOURCE_EXHAUSTED at once (default an eighth "
     "of the machine's memory, at least 2 x --max-message)"},
    {"tenant-workers", "TPORT_TENANT_WORKERS", "N",
     "workers one tenant's requests may keep busy at once; tenants are served round-robin "
     "(default --workers less 1, at least 1: a tenant's long copies leave a worker to the "
     "others)"},
    {"local-secret", LOCAL_SECRET_ENV, "PATH|off",
     "without --auth-file and --tls-ca: clients prove they can read PATH, a secret of this user's "
     "(mode 600) that tportd makes if missing, and may then be any tenant; other users' "
     "processes are refused.  libtport, tport and Python read it by themselves for local URLs "
     "with the same variable and default: $XDG_RUNTIME_DIR/tensorport/local-secret, else "
     "/tmp/tensorport-UID/local-secret.  off: tenants are claimed without proof by anyone who "
     "reaches the socket, --admin tenants never"},
    {"cuda-ipc-max", "TPORT_CUDA_IPC_MAX", "N",
     "GPU allocations each tenant's same-host clients may have open on this server by CUDA IPC "
     "(through the shm socket; default 256)"},
};
#define NOPTS (int)(sizeof opts / sizeof opts[0])

void config_usage(FILE *out)
{
  fprintf(out, "usage: tportd [options]\n\n"
               "tensorport server: serves tensors on this machine's devices over nng.\n\n"
               "options (each also read from its environment variable).  A SIZE is bytes, or with\n"
               "K M G T, KiB MiB GiB TiB (1024s) or KB MB GB TB (1000s): 64GiB, 1.5G, 512M.  A\n"
               "DURATION has ms, s, m, h or d: 500ms, 30s, 1.5h, 7d (a bare number: the unit the\n"
               "flag says).\n");
  for (int i = 0; i < NOPTS; i++)
    fprintf(out, "  --%-13s %-8s %s\n  %-24s [%s]\n", opts[i].flag, opts[i].arg, opts[i].help, "",
            opts[i].env);
  fprintf(out, "  --help                 this text\n");
}

/* Sizes, durations and log levels: proto/units.c's grammar, the same for
 * every flag, its TPORT_* variable, tport and Python. */
static int parse_size(const char *s, const char *what, size_t *out, tport_err *err)
{
  char flag[48];
  snprintf(flag, sizeof flag, "--%s", what);
  uint64_t v;
  int rc = units_parse_size(s, flag, &v, err);
  if (rc)
    return rc;
  if (v > SIZE_MAX)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "--%s: '%s' is out of range", what, s);
  *out = (size_t)v;
  return TPORT_OK;
}

/* A duration into *out in the flag's own unit (ms, or s for a flag in
 * seconds, which a bare number is in too), at least min of that unit. */
static int parse_duration(const char *s, const char *what, units_time unit, unsigned long min,
                          unsigned long *out, tport_err *err)
{
  char flag[48];
  snprintf(flag, sizeof flag, "--%s", what);
  uint64_t ms;
  int rc = units_parse_duration_ms(s, unit, flag, &ms, err);
  if (rc)
    return rc;
  if (unit == UNITS_S && ms % 1000)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "--%s: '%s' is not a whole number of seconds", what, s);
  uint64_t v = unit == UNITS_S ? ms / 1000 : ms;
  if (v > ULONG_MAX || v < min)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "--%s: '%s' is %s", what, s,
                         v < min ? (min == 1 ? "zero: give a positive duration" : "too short")
                                 : "out of range");
  *out = (unsigned long)v;
  return TPORT_OK;
}

/* A whole number, at least min: digits only (no sign, no space, no
 * suffix), within range. */
static int parse_ulong(const char *s, const char *what, unsigned long min, unsigned long *out,
                       tport_err *err)
{
  char *end;
  errno = 0;
  unsigned long v = (s[0] >= '0' && s[0] <= '9') ? strtoul(s, &end, 10) : 0;
  if (s[0] < '0' || s[0] > '9' || *end || errno == ERANGE || v < min)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "--%s: '%s' is not a whole number >= %lu",
                         what, s, min);
  *out = v;
  return TPORT_OK;
}

static int add_listen(server_config *c, const char *url, tport_err *err)
{
  if (c->nlisten == CONFIG_MAX_LISTEN)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "--listen: at most %d URLs",
                         CONFIG_MAX_LISTEN);
  c->listen[c->nlisten++] = strdup(url);
  return TPORT_OK;
}

/* Where an option whose value is kept as given (a path, a list) goes;
 * NULL: not one of them. */
static char **text_slot(server_config *c, int i)
{
  switch (i) {
  case 1: return &c->devices;
  case 14: return &c->kernel_cache;
  case 16: return &c->admin;
  case 23: return &c->auth_file;
  case 26: return &c->tls_cert;
  case 27: return &c->tls_key;
  case 28: return &c->tls_ca;
  default: return NULL;
  }
}

/* A file mode, in octal (--ipc-mode, --shm-mode). */
static int parse_mode(const char *v, const char *what, unsigned *out, tport_err *err)
{
  char *end;
  unsigned long m = strtoul(v, &end, 8);
  if (end == v || *end || m > 0777)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "--%s: '%s' is not an octal mode", what, v);
  *out = (unsigned)m;
  return TPORT_OK;
}

static int parse_metrics_tenants(const char *v, int *out, tport_err *err)
{
  static const char *const modes[] = {[METRICS_TENANTS_HASH] = "hash",
                                      [METRICS_TENANTS_NAME] = "name",
                                      [METRICS_TENANTS_OFF] = "off"};
  for (int m = 0; m < 3; m++)
    if (strcmp(v, modes[m]) == 0) {
      *out = m;
      return TPORT_OK;
    }
  return tport_err_set(err, TPORT_INVALID_ARGUMENT, "--metrics-tenants: '%s': name, hash or off",
                       v);
}

/* --http-listen: an address checked now (a typo is said at start), or off. */
static int apply_http_listen(server_config *c, const char *v, tport_err *err)
{
  c->http_listen_set = true;
  free(c->http_listen);
  c->http_listen = NULL;
  if (strcmp(v, "off") == 0)
    return TPORT_OK;
  struct sockaddr_storage ss;
  socklen_t sl;
  int rc = http_parse_address(v, &ss, &sl, err);
  if (!rc)
    c->http_listen = strdup(v);
  return rc;
}

static int apply(server_config *c, int i, const char *v, tport_err *err)
{
  unsigned long u = 0;
  int rc = TPORT_OK;
  char **slot = text_slot(c, i);
  if (slot) {
    free(*slot);
    *slot = strdup(v);
    return TPORT_OK;
  }
  switch (i) {
  case 0: {
    char *copy = strdup(v), *save = NULL;
    for (char *t = strtok_r(copy, ",", &save); t && !rc; t = strtok_r(NULL, ",", &save))
      rc = add_listen(c, t, err);
    free(copy);
    return rc;
  }
  case 2: rc = parse_ulong(v, opts[i].flag, 1, &u, err), c->workers = (int)u; break;
  case 3: rc = parse_ulong(v, opts[i].flag, 1, &u, err), c->contexts = (int)u; break;
  case 4: return parse_size(v, opts[i].flag, &c->max_message_bytes, err);
  case 5: return parse_size(v, opts[i].flag, &c->chunk_bytes, err);
  case 6: rc = parse_ulong(v, opts[i].flag, 1, &u, err), c->window = (int)u; break;
  case 7: return parse_size(v, opts[i].flag, &c->max_tensor_bytes, err);
  case 8: return parse_size(v, opts[i].flag, &c->tenant_quota_bytes, err);
  case 9: rc = parse_ulong(v, opts[i].flag, 1, &u, err), c->max_inflight_chunks = (int)u; break;
  case 10: return parse_duration(v, opts[i].flag, UNITS_S, 0, &c->ttl_s, err);
  case 11: return parse_duration(v, opts[i].flag, UNITS_MS, 1, &c->deadline_ms, err);
  case 12: return parse_duration(v, opts[i].flag, UNITS_MS, 0, &c->grace_ms, err);
  case 13: {
    int level;
    rc = units_parse_log_level(v, "--log-level", &level, err);
    if (!rc)
      c->log_level = level;
    break;
  }
  case 15: rc = parse_ulong(v, opts[i].flag, 0, &u, err), c->uvm = u != 0; break;
  case 17: rc = parse_ulong(v, opts[i].flag, 1, &u, err), c->max_outstanding = (int)u; break;
  case 18: return parse_duration(v, opts[i].flag, UNITS_MS, 1, &c->send_timeout_ms, err);
  case 19: rc = parse_ulong(v, opts[i].flag, 1, &u, err), c->max_transfers = (int)u; break;
  case 20: return parse_duration(v, opts[i].flag, UNITS_MS, 1, &c->transfer_timeout_ms, err);
  case 21: rc = parse_ulong(v, opts[i].flag, 1, &u, err), c->max_tensors = u; break;
  case 22: return parse_duration(v, opts[i].flag, UNITS_S, 1, &c->max_ttl_s, err);
  case 24: rc = parse_ulong(v, opts[i].flag, 0, &u, err), c->insecure = u != 0; break;
  case 25: return parse_mode(v, opts[i].flag, &c->ipc_mode, err);
  case 35: return parse_mode(v, opts[i].flag, &c->shm_mode, err);
  case 34:
    c->shm_socket_set = true;
    free(c->shm_socket);
    c->shm_socket = strcmp(v, "off") == 0 ? NULL : strdup(v);
    return TPORT_OK;
  case 38: return parse_metrics_tenants(v, &c->metrics_tenants, err);
  case 42:
    c->local_secret_set = true;
    free(c->local_secret);
    c->local_secret = strcmp(v, "off") == 0 ? NULL : strdup(v);
    return TPORT_OK;
  case 36:
    rc = parse_size(v, opts[i].flag, &c->shm_quota, err);
    if (!rc && c->shm_quota == 0)
      return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                           "--shm-quota: '%s': at least 1 byte (--shm-socket off turns regions off)",
                           v);
    return rc;
  case 37: return parse_size(v, opts[i].flag, &c->shm_max, err);
  case 39: rc = parse_ulong(v, opts[i].flag, 1, &u, err), c->max_connections = u; break;
  case 40: return parse_size(v, opts[i].flag, &c->request_memory, err);
  case 41: rc = parse_ulong(v, opts[i].flag, 1, &u, err), c->tenant_workers = (int)u; break;
  case 43: rc = parse_ulong(v, opts[i].flag, 1, &u, err), c->cuda_ipc_max = u; break;
  case 29:
    if (strcmp(v, "1.2") && strcmp(v, "1.3"))
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "--tls-min-version: '%s': 1.2 or 1.3", v);
    c->tls12 = strcmp(v, "1.2") == 0;
    return TPORT_OK;
  case 30: return parse_duration(v, opts[i].flag, UNITS_MS, 1, &c->auth_timeout_ms, err);
  case 31: c->host_cache_set = true; return parse_size(v, opts[i].flag, &c->host_cache_bytes, err);
  case 32: return apply_http_listen(c, v, err);
  case 33:
    if (strcmp(v, "text") && strcmp(v, "json"))
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "--log-format: '%s': text or json", v);
    c->log_format = strcmp(v, "json") == 0 ? LOG_JSON : LOG_TEXT;
    return TPORT_OK;
  }
  if (!rc && (c->workers > 1024 || c->contexts > 4096 || c->window > 1024 ||
              c->tenant_workers > 1024 ||
              c->max_outstanding > 4096 || c->max_transfers > 4096))
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "--%s: '%s' is too large", opts[i].flag, v);
  return rc;
}

int config_parse(server_config *c, int argc, char **argv, tport_err *err)
{
  /* environment first, then flags override */
  for (int i = 0; i < NOPTS; i++) {
    const char *v = getenv(opts[i].env);
    if (v && *v) {
      int rc = apply(c, i, v, err);
      if (rc && err) { /* the message names the flag; the user set the variable */
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        tport_err_set(err, rc, "%s (from $%s)", why, opts[i].env);
      }
      if (rc)
        return rc;
    }
  }
  struct option lopts[NOPTS + 2];
  for (int i = 0; i < NOPTS; i++)
    lopts[i] = (struct option){opts[i].flag, opts[i].arg[0] ? required_argument : no_argument,
                               NULL, i};
  lopts[NOPTS] = (struct option){"help", no_argument, NULL, 'h'};
  lopts[NOPTS + 1] = (struct option){0, 0, 0, 0};
  bool cli_listen = false;
  optind = 1;
  opterr = 0;
  int ch;
  while ((ch = getopt_long(argc, argv, ":h", lopts, NULL)) != -1) {
    if (ch == 'h') {
      config_usage(stdout);
      return 1;
    }
    if (ch == '?' || ch == ':')
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s: '%s' (try --help)",
                           ch == ':' ? "missing value" : "unknown option", argv[optind - 1]);
    if (ch == 0 && !cli_listen) {
      /* --listen on the command line replaces the variable's URLs */
      for (int i = 0; i < c->nlisten; i++)
        free(c->listen[i]);
      c->nlisten = 0;
      cli_listen = true;
    }
    int rc = apply(c, ch, optarg ? optarg : "1", err);
    if (rc)
      return rc;
  }
  if (optind < argc)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "unexpected argument '%s' (try --help)",
                         argv[optind]);
  if (c->nlisten == 0)
    add_listen(c, DEFAULT_URL, err);
  if (!c->http_listen_set)
    c->http_listen = strdup(HTTP_DEFAULT_ADDRESS);
  if (!c->shm_socket_set)
    c->shm_socket = config_shm_default_path();
  if (!c->local_secret_set) {
    /* the same rule as the clients' (TPORT_LOCAL_SECRET read above already) */
    char path[LOCAL_SECRET_PATH_MAX];
    bool off;
    int rc = transport_local_secret_default(path, sizeof path, &off, err);
    if (rc)
      return rc;
    c->local_secret = off ? NULL : strdup(path);
  }
  return config_check(c, err);
}

/* What no single flag can check: the flags against each other. */
int config_check(const server_config *c, tport_err *err)
{
  /* safe defaults: nothing off loopback without authentication, and no
   * plain tcp off loopback unless asked for in so many words -- by the
   * address nng will listen on, never by the spelling (listen_url.h) */
  listen_url u[CONFIG_MAX_LISTEN];
  for (int i = 0; i < c->nlisten; i++) {
    int rc = listen_url_parse(c->listen[i], &u[i], err);
    if (rc)
      return rc;
    if (!u[i].network || u[i].loopback)
      continue;
    if (!c->auth_file && !c->tls_ca)
      return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                           "--listen %s is not a loopback address and authentication is off: "
                           "add --auth-file FILE or --tls-ca FILE (and listen on tls+tcp:// with "
                           "--tls-cert and --tls-key), or listen on 127.0.0.1 (a host name is "
                           "not loopback; localhost, 127.0.0.0/8 and ::1 are)",
                           c->listen[i]);
    if (!u[i].encrypted && !c->insecure)
      return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                           "--listen %s is plain tcp off loopback (%s:// is not encrypted): "
                           "tensors travel unencrypted; listen on tls+tcp:// instead, or add "
                           "--insecure",
                           c->listen[i], u[i].scheme);
  }
  for (int i = 0; i < c->nlisten; i++)
    if (u[i].encrypted && !c->tls_cert)
      return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                           "--listen %s needs a certificate: add --tls-cert FILE (and --tls-key)",
                           c->listen[i]);
  if (c->shm_quota && c->shm_max && c->shm_quota > c->shm_max)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "--shm-quota %zu is over --shm-max %zu: one tenant's regions could refuse "
                         "every other tenant's",
                         c->shm_quota, c->shm_max);
  if (c->chunk_bytes < 4096)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "--chunk is %zu bytes: at least 4096",
                         c->chunk_bytes);
  if (c->max_message_bytes < CONFIG_MESSAGE_ROOM ||
      c->chunk_bytes > c->max_message_bytes - CONFIG_MESSAGE_ROOM)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "--chunk %zu does not fit in --max-message %zu with %d bytes for the "
                         "request around it",
                         c->chunk_bytes, c->max_message_bytes, CONFIG_MESSAGE_ROOM);
  if (c->max_ttl_s > CONFIG_MAX_TTL_S)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "--max-ttl %lu: at most %d seconds",
                         c->max_ttl_s, CONFIG_MAX_TTL_S);
  if (c->ttl_s > c->max_ttl_s)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "--ttl %lu is over --max-ttl %lu", c->ttl_s,
                         c->max_ttl_s);
  if (c->window > c->max_outstanding)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "--window %d is over --max-outstanding %d: a client's window must fit",
                         c->window, c->max_outstanding);
  if (c->request_memory && c->request_memory < 2 * (uint64_t)c->max_message_bytes)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "--request-memory %zu is under twice --max-message %zu: two requests "
                         "of the largest size must fit",
                         c->request_memory, c->max_message_bytes);
  return TPORT_OK;
}

uint64_t config_max_connections(const server_config *c)
{
  if (c->max_connections)
    return c->max_connections;
  /* one descriptor a connection; the rest for listeners, regions' handoffs,
   * the endpoint, devices and files */
  struct rlimit rl;
  uint64_t n = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                   ? (uint64_t)rl.rlim_cur
                   : 1u << 20;
  return n > 128 + 16 ? n - 128 : 16;
}

size_t config_request_memory(const server_config *c)
{
  if (c->request_memory)
    return c->request_memory;
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  uint64_t ram = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : (uint64_t)8 << 30;
  uint64_t floor = 2 * (uint64_t)c->max_message_bytes, v = ram / 8;
  v = v > floor ? v : floor;
  return v > SIZE_MAX ? SIZE_MAX : (size_t)v;
}

int config_tenant_workers(const server_config *c)
{
  if (c->tenant_workers)
    return c->tenant_workers;
  return c->workers > 1 ? c->workers - 1 : 1;
}
