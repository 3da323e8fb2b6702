/* cli_args.c: tport's flags, one table for the global ones and the
 * commands' own (cli_args.h). */
#include "cli_args.h"

#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "units.h"

/* The flags, in the order --help lists them. */
enum {
  O_HELP,
  O_JSON,
  O_URL,
  O_TENANT,
  O_SECRET_FILE,
  O_TLS_CA,
  O_TLS_CERT,
  O_TLS_KEY,
  O_TLS_SERVER_NAME,
  O_VERIFY,
  O_NO_SHM,
  O_NAME,
  O_DEVICE,
  O_DTYPE,
  O_FORMAT,
  O_TTL,
  O_NONBLOCKING,
  O_COPY,
  O_EXACT,
  O_SIZES,
  O_STRIDES,
  O_OFFSET,
  O_WAIT,
  O_REPLACE,
  O_COUNT
};

typedef struct cli_option {
  const char *name;
  int has_arg;
  /* the commands that take it, space-separated; NULL: a global flag, which
   * every command takes */
  const char *commands;
} cli_option;

static const cli_option options[O_COUNT] = {
    [O_HELP] = {"help", no_argument, NULL},
    [O_JSON] = {"json", no_argument, NULL},
    [O_URL] = {"url", required_argument, NULL},
    [O_TENANT] = {"tenant", required_argument, NULL},
    [O_SECRET_FILE] = {"secret-file", required_argument, NULL},
    [O_TLS_CA] = {"tls-ca", required_argument, NULL},
    [O_TLS_CERT] = {"tls-cert", required_argument, NULL},
    [O_TLS_KEY] = {"tls-key", required_argument, NULL},
    [O_TLS_SERVER_NAME] = {"tls-server-name", required_argument, NULL},
    [O_VERIFY] = {"verify", no_argument, NULL},
    [O_NO_SHM] = {"no-shm", no_argument, NULL},
    [O_NAME] = {"name", required_argument, "put view to contiguous"},
    [O_DEVICE] = {"device", required_argument, "put to"},
    [O_DTYPE] = {"dtype", required_argument, "put to"},
    [O_FORMAT] = {"memory-format", required_argument, "put to contiguous"},
    [O_TTL] = {"ttl", required_argument, "put to"},
    [O_NONBLOCKING] = {"non-blocking", no_argument, "put to copy"},
    [O_COPY] = {"copy", no_argument, "to"},
    [O_EXACT] = {"exact-format", no_argument, "to"},
    [O_SIZES] = {"sizes", required_argument, "view"},
    [O_STRIDES] = {"strides", required_argument, "view"},
    [O_OFFSET] = {"offset", required_argument, "view"},
    [O_WAIT] = {"wait", required_argument, "get info"},
    [O_REPLACE] = {"replace", no_argument, "put"},
};

/* getopt_long's values: past every character, so that none is taken for
 * '?' (unknown) or ':' (no value) */
#define OPTION_VAL(i) (0x100 + (i))

_Static_assert(O_COUNT <= 32, "cli_args.seen has a bit for each flag");

void cli_usage(FILE *o)
{
  fprintf(o, "usage: tport [FLAGS] COMMAND ARGS [FLAGS]   (flags go before or after the command)\n\n"
             "  --url URL     the server (default $TPORT_URL, else tcp://127.0.0.1:7450)\n"
             "  --tenant T    the tenant (default $TPORT_TENANT, else default)\n"
             "  --secret-file F  the tenant's secret, in hex, for a server that authenticates\n"
             "                (default $TPORT_SECRET_FILE; mode 600).  A server without an\n"
             "                auth file asks for its user's local secret instead, which\n"
             "                tport reads by itself on a local URL ($TPORT_LOCAL_SECRET:\n"
             "                its path, or off; see tportd --help)\n"
             "  --tls-ca F    tls+tcp://: PEM CAs of the server's certificate (default\n"
             "                $TPORT_TLS_CA, else the system's store)\n"
             "  --tls-cert F --tls-key F  this client's certificate and key, for a server that\n"
             "                asks for one ($TPORT_TLS_CERT, $TPORT_TLS_KEY)\n"
             "  --tls-server-name N  the name the server's certificate must carry (default\n"
             "                $TPORT_TLS_SERVER_NAME, else the URL's host)\n"
             "  --verify      a CRC32C on every chunk, checked by the other end (default\n"
             "                $TPORT_VERIFY=1)\n"
             "  --no-shm      keep tensors on the socket: by default, on a local URL\n"
             "                (ipc://, tcp:// on loopback) to a server that offers shared\n"
             "                memory, large ones go through a sealed memfd region at memory\n"
             "                speed ($TPORT_SHM=0 too)\n"
             "  --json        machine-readable output\n\n"
             "commands (a REF is a handle or a name):\n"
             "  put FILE.npy [--name N [--replace]] [--device D] [--dtype T] [--memory-format F]\n"
             "               [--ttl S] [--non-blocking]  (--replace: swap the name, once whole)\n"
             "  get REF OUT.npy [--wait S]      values in logical C order\n"
             "  info REF [--wait S]             (--wait: for a name not there yet, up to S)\n"
             "  view REF --sizes A,B,.. --strides X,Y,.. [--offset K] [--name N]\n"
             "  to REF [--device D] [--dtype T] [--memory-format F] [--copy] [--non-blocking]\n"
             "         [--exact-format] [--name N] [--ttl S]\n"
             "  copy DST SRC [--non-blocking]\n"
             "  contiguous REF [--memory-format F] [--name N]\n"
             "  ls [PREFIX]   the tenant's tensors (PREFIX: the named ones under it, by name)\n"
             "  rm REF | devices | stats\n\n"
             "--ttl and --wait take a duration (30s, 10m, 1.5h; a bare number is seconds).\n"
             "bfloat16 tensors travel in .npy files as '<u2' bit patterns.\n"
             "Exit status: 0 done, 1 failed, 2 a usage error.\n");
}

static int parse_dims(const char *s, int64_t *out, int *n)
{
  *n = 0;
  if (!s || !*s)
    return 0;
  while (*s) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *n == TPORT_MAX_DIMS || errno == ERANGE)
      return -1;
    out[(*n)++] = v;
    s = *end == ',' ? end + 1 : end;
    if (*end && *end != ',')
      return -1;
  }
  return 0;
}

static int parse_offset(const char *s, int64_t *out, tport_err *err)
{
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (end == s || *end || errno == ERANGE)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "--offset '%s': a whole number of elements", s);
  *out = v;
  return 0;
}

/* The global flags: where they go. */
static const char **global_string(cli_args *a, int id)
{
  switch (id) {
  case O_URL: return &a->url;
  case O_TENANT: return &a->tenant;
  case O_SECRET_FILE: return &a->secret_file;
  case O_TLS_CA: return &a->tls_ca;
  case O_TLS_CERT: return &a->tls_cert;
  case O_TLS_KEY: return &a->tls_key;
  case O_TLS_SERVER_NAME: return &a->tls_server_name;
  default: return NULL;
  }
}

/* One flag and its value (v) into *a: 0, or a usage error in err. */
static int apply_option(cli_args *a, int id, const char *v, tport_err *err)
{
  const char **g = global_string(a, id);
  if (g) {
    *g = v;
    return 0;
  }
  switch (id) {
  case O_HELP: a->help = true; return 0;
  case O_JSON: a->json = true; return 0;
  case O_VERIFY: a->verify = true; return 0;
  case O_NO_SHM: a->no_shm = true; return 0;
  case O_NAME: a->name = v; return 0;
  case O_DEVICE: a->device = v; return 0;
  case O_NONBLOCKING: a->nonblocking = true; return 0;
  case O_COPY: a->copy = true; return 0;
  case O_EXACT: a->exact = true; return 0;
  case O_DTYPE: a->has_dtype = true; return dtype_parse(v, "--dtype", &a->dtype, err);
  case O_FORMAT:
    a->has_format = true;
    return memory_format_parse(v, "--memory-format", &a->format, err);
  case O_TTL: /* proto/units.c: 30s, 10m, 1.5h; a bare number is seconds */
    return units_parse_duration_ms(v, UNITS_S, "--ttl", &a->ttl_ms, err);
  case O_WAIT: {
    uint64_t ms;
    int rc = units_parse_duration_ms(v, UNITS_S, "--wait", &ms, err);
    a->wait_ms = ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms; /* the server caps it anyway */
    return rc;
  }
  case O_REPLACE: a->replace = true; return 0;
  case O_SIZES:
    a->has_sizes = true;
    return parse_dims(v, a->sizes, &a->nsizes)
               ? tport_err_set(err, TPORT_INVALID_ARGUMENT, "--sizes '%s': A,B,...", v)
               : 0;
  case O_STRIDES:
    a->has_strides = true;
    return parse_dims(v, a->strides, &a->nstrides)
               ? tport_err_set(err, TPORT_INVALID_ARGUMENT, "--strides '%s': X,Y,...", v)
               : 0;
  case O_OFFSET: return parse_offset(v, &a->offset, err);
  default: return tport_err_set(err, TPORT_INTERNAL, "flag %d has no handler", id);
  }
}

/* Whether the space-separated list names cmd. */
static bool names(const char *list, const char *cmd)
{
  size_t n = strlen(cmd);
  for (const char *p = list; (p = strstr(p, cmd)) != NULL; p += n)
    if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0'))
      return true;
  return false;
}

int cli_check_flags(const cli_args *a, tport_err *err)
{
  for (int i = 0; i < O_COUNT; i++) {
    if (!(a->seen & (1u << i)) || !options[i].commands || !a->command ||
        names(options[i].commands, a->command))
      continue;
    char takes[160] = "";
    size_t len = 0;
    for (int j = 0; j < O_COUNT && len < sizeof takes; j++)
      if (options[j].commands && names(options[j].commands, a->command))
        len += (size_t)snprintf(takes + len, sizeof takes - len, " --%s", options[j].name);
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s takes no --%s (its flags:%s)",
                         a->command, options[i].name, takes[0] ? takes : " none"),
           2;
  }
  return 0;
}

int cli_parse(int argc, char **argv, cli_args *a, tport_err *err)
{
  struct option longs[O_COUNT + 1];
  for (int i = 0; i < O_COUNT; i++)
    longs[i] = (struct option){options[i].name, options[i].has_arg, NULL, OPTION_VAL(i)};
  longs[O_COUNT] = (struct option){0, 0, 0, 0};
  memset(a, 0, sizeof *a);
  optind = 1;
  opterr = 0;
  int ch;
  /* ":" first: a flag without its value comes back as ':', apart from an
   * unknown one ('?'); GNU getopt lets flags and arguments mix */
  while ((ch = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
    if (ch == 'h') {
      a->help = true;
    } else if (ch >= OPTION_VAL(0) && ch < OPTION_VAL(O_COUNT)) {
      a->seen |= 1u << (ch - OPTION_VAL(0));
      if (apply_option(a, ch - OPTION_VAL(0), optarg, err))
        return 2;
    } else if (ch == ':') {
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "'%s' needs a value", argv[optind - 1]), 2;
    } else if (optopt) {
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "unknown option '-%c'", optopt), 2;
    } else {
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "unknown option '%s'", argv[optind - 1]),
             2;
    }
  }
  for (; optind < argc; optind++) {
    if (!a->command) {
      a->command = argv[optind];
      continue;
    }
    if (a->npos == CLI_MAX_POSITIONAL)
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "too many arguments"), 2;
    a->pos[a->npos++] = argv[optind];
  }
  return 0;
}
