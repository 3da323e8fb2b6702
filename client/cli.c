/*
 * cli.c: tport, the command line of tensorport.
 *
 *   tport [--url URL] [--tenant T] [--secret-file F] [--verify] [--no-shm] [--json] COMMAND ...
 *
 * Exit status 0 only on success; errors go to stderr as "tport: CODE: message".
 * Tensors made by the tool are kept for the tenant (with the server's time to
 * live) so that a later command can name them by REF (a handle or a name).
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtype.h"
#include "npy.h"
#include "units.h"
#include "tport.h"

static bool json;

static int fail(const tport_err *e)
{
  if (json)
    printf("{\"error\": \"%s\", \"message\": \"%s\"}\n", tport_strerror(e->code), e->msg);
  fprintf(stderr, "tport: %s: %s\n", tport_strerror(e->code), e->msg);
  return 1;
}

static int usage_error(const char *fmt, const char *arg)
{
  fprintf(stderr, "tport: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, " (try tport --help)\n");
  return 2;
}

static void usage(FILE *o)
{
  fprintf(o, "usage: tport [--url URL] [--tenant T] [--secret-file F] [--json] COMMAND ...\n\n"
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
             "         [--exact-format] [--name N]\n"
             "  copy DST SRC [--non-blocking]\n"
             "  contiguous REF [--memory-format F] [--name N]\n"
             "  ls | rm REF | devices | stats\n\n"
             "bfloat16 tensors travel in .npy files as '<u2' bit patterns.\n");
}

static void print_dims(int n, const int64_t *v)
{
  printf("[");
  for (int i = 0; i < n; i++)
    printf(i ? ", %lld" : "%lld", (long long)v[i]);
  printf("]");
}

static void print_info(const tport_tensor_info *i, int alias)
{
  char ref[2 * TPORT_HANDLE_BYTES + 1];
  tport_ref h = i->ref;
  h.name[0] = 0;
  tport_ref_format(&h, ref, sizeof ref);
  if (json) {
    printf("{\"ref\": \"%s\", \"name\": \"%s\", \"dtype\": \"%s\", \"sizes\": ", ref, i->ref.name,
           dtype_name(i->dtype));
    print_dims(i->ndim, i->sizes);
    printf(", \"strides\": ");
    print_dims(i->ndim, i->strides);
    printf(", \"storage_offset\": %lld, \"device\": \"%s\", \"memory_format\": \"%s\", "
           "\"suggested_memory_format\": \"%s\", \"is_contiguous\": %s, \"nbytes\": %lld, "
           "\"managed\": %s",
           (long long)i->storage_offset, i->device, memory_format_name(i->actual_format),
           memory_format_name(i->suggested_format), i->is_contiguous ? "true" : "false",
           (long long)i->nbytes, i->managed ? "true" : "false");
    if (alias >= 0)
      printf(", \"alias\": %s", alias ? "true" : "false");
    printf("}\n");
    return;
  }
  printf("ref              %s\n", ref);
  if (i->ref.name[0])
    printf("name             %s\n", i->ref.name);
  printf("dtype            %s\nsizes            ", dtype_name(i->dtype));
  print_dims(i->ndim, i->sizes);
  printf("\nstrides          ");
  print_dims(i->ndim, i->strides);
  printf("\nstorage_offset   %lld\ndevice           %s\nmemory_format    %s\n"
         "suggested_format %s\nis_contiguous    %s\nnbytes           %lld\n",
         (long long)i->storage_offset, i->device, memory_format_name(i->actual_format),
         memory_format_name(i->suggested_format), i->is_contiguous ? "true" : "false",
         (long long)i->nbytes);
  if (alias >= 0)
    printf("alias            %s\n", alias ? "true" : "false");
}

static void progress_bar(void *arg, uint64_t done, uint64_t total)
{
  (void)arg;
  int width = 40, fill = total ? (int)(done * (uint64_t)width / total) : width;
  fprintf(stderr, "\r[%.*s%*s] %3d%% %llu/%llu MiB", fill,
          "########################################", width - fill, "",
          total ? (int)(done * 100 / total) : 100, (unsigned long long)(done >> 20),
          (unsigned long long)(total >> 20));
  if (done == total)
    fputc('\n', stderr);
}

/* A progress bar on a terminal for transfers over 8 MiB; none when piped. */
static tport_progress_fn bar_for(size_t nbytes)
{
  return nbytes > (8u << 20) && isatty(STDERR_FILENO) && !json ? progress_bar : NULL;
}

static int parse_dims(const char *s, int64_t *out, int *n)
{
  *n = 0;
  if (!s || !*s)
    return 0;
  while (*s) {
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || *n == TPORT_MAX_DIMS)
      return -1;
    out[(*n)++] = v;
    s = *end == ',' ? end + 1 : end;
    if (*end && *end != ',')
      return -1;
  }
  return 0;
}

enum {
  O_JSON = 1,
  O_URL,
  O_TENANT,
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
  O_SECRET_FILE,
  O_WAIT, O_REPLACE,
};

static const char *url_opt, *tenant_opt, *secret_file_opt;

static const struct option cmd_opts[] = {
    {"json", no_argument, NULL, O_JSON},
    {"url", required_argument, NULL, O_URL},
    {"tenant", required_argument, NULL, O_TENANT},
    {"secret-file", required_argument, NULL, O_SECRET_FILE},
    {"name", required_argument, NULL, O_NAME},
    {"device", required_argument, NULL, O_DEVICE},
    {"dtype", required_argument, NULL, O_DTYPE},
    {"memory-format", required_argument, NULL, O_FORMAT},
    {"ttl", required_argument, NULL, O_TTL},
    {"non-blocking", no_argument, NULL, O_NONBLOCKING},
    {"copy", no_argument, NULL, O_COPY},
    {"exact-format", no_argument, NULL, O_EXACT},
    {"sizes", required_argument, NULL, O_SIZES},
    {"strides", required_argument, NULL, O_STRIDES},
    {"offset", required_argument, NULL, O_OFFSET},
    {"wait", required_argument, NULL, O_WAIT},
    {"replace", no_argument, NULL, O_REPLACE},
    {0, 0, 0, 0},
};

typedef struct cmd_args {
  const char *name, *device;
  bool has_dtype, has_format, nonblocking, copy, exact, replace;
  tport_dtype dtype;
  tport_memory_format format;
  uint64_t ttl_ms, wait_ms;
  int nsizes, nstrides;
  int64_t sizes[TPORT_MAX_DIMS], strides[TPORT_MAX_DIMS], offset;
  bool has_sizes, has_strides;
  char *pos[4];
  int npos;
} cmd_args;

static int parse_cmd(int argc, char **argv, cmd_args *a, tport_err *err)
{
  memset(a, 0, sizeof *a);
  optind = 1;
  opterr = 0;
  int ch;
  while ((ch = getopt_long(argc, argv, "", cmd_opts, NULL)) != -1) {
    switch (ch) {
    case O_JSON: json = true; break; /* global options may follow the command too */
    case O_URL: url_opt = optarg; break;
    case O_TENANT: tenant_opt = optarg; break;
    case O_SECRET_FILE: secret_file_opt = optarg; break;
    case O_NAME: a->name = optarg; break;
    case O_DEVICE: a->device = optarg; break;
    case O_DTYPE:
      if (dtype_parse(optarg, "--dtype", &a->dtype, err))
        return 2;
      a->has_dtype = true;
      break;
    case O_FORMAT:
      if (memory_format_parse(optarg, "--memory-format", &a->format, err))
        return 2;
      a->has_format = true;
      break;
    case O_TTL:
    case O_WAIT: {
      uint64_t ms; /* proto/units.c: 30s, 10m, 1.5h; a bare number is seconds */
      if (units_parse_duration_ms(optarg, UNITS_S, ch == O_TTL ? "--ttl" : "--wait", &ms, err))
        return 2;
      *(ch == O_TTL ? &a->ttl_ms : &a->wait_ms) = ch == O_WAIT && ms > UINT32_MAX ? UINT32_MAX : ms;
      break;
    }
    case O_REPLACE: a->replace = true; break;
    case O_NONBLOCKING: a->nonblocking = true; break;
    case O_COPY: a->copy = true; break;
    case O_EXACT: a->exact = true; break;
    case O_SIZES:
      a->has_sizes = true;
      if (parse_dims(optarg, a->sizes, &a->nsizes))
        return tport_err_set(err, TPORT_INVALID_ARGUMENT, "--sizes '%s': A,B,...", optarg), 2;
      break;
    case O_STRIDES:
      a->has_strides = true;
      if (parse_dims(optarg, a->strides, &a->nstrides))
        return tport_err_set(err, TPORT_INVALID_ARGUMENT, "--strides '%s': X,Y,...", optarg), 2;
      break;
    case O_OFFSET: {
      char *end;
      errno = 0;
      a->offset = strtoll(optarg, &end, 10);
      if (end == optarg || *end || errno == ERANGE)
        return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                             "--offset '%s': a whole number of elements", optarg),
               2;
      break;
    }
    default:
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "unknown or incomplete option '%s'",
                           argv[optind - 1]),
             2;
    }
  }
  for (; optind < argc; optind++) {
    if (a->npos == 4)
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "too many arguments"), 2;
    a->pos[a->npos++] = argv[optind];
  }
  return 0;
}

static int need(const cmd_args *a, int n, const char *cmd, tport_err *err)
{
  if (a->npos != n)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s takes %d argument%s", cmd, n,
                         n == 1 ? "" : "s");
  return 0;
}

static int refarg(const char *s, tport_ref *r, tport_err *err)
{
  return tport_ref_parse(s, r, err);
}

static int cmd_put(tport_client *c, const cmd_args *a, tport_err *err)
{
  tport_tensor_info info;
  int rc;
  npy_array arr;
  if ((rc = npy_read(a->pos[0], &arr, err)))
    return rc;
  tport_put_options o;
  tport_put_options_init(&o);
  o.name = a->name;
  o.device = a->device;
  o.ttl_ms = a->ttl_ms;
  o.replace = a->replace;
  o.has_dtype = a->has_dtype;
  o.dtype = a->dtype;
  o.memory_format = a->has_format ? a->format : TPORT_MF_PRESERVE;
  o.non_blocking = a->nonblocking;
  o.progress = bar_for(arr.nbytes);
  rc = tport_put(c, arr.dtype, arr.ndim, arr.sizes, arr.fortran_order ? arr.strides : NULL,
                 arr.data, arr.nbytes, &o, &info, err);
  npy_free(&arr);
  if (!rc)
    print_info(&info, -1);
  return rc;
}

static int cmd_get(tport_client *c, const cmd_args *a, tport_err *err)
{
  tport_tensor_info info;
  tport_ref r;
  int rc;
  if ((rc = refarg(a->pos[0], &r, err)))
    return rc;
  if ((rc = tport_info_wait(c, &r, (uint32_t)a->wait_ms, &info, err)))
    return rc;
  void *buf = malloc((size_t)info.nbytes + 1);
  if (!buf)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  rc = tport_get(c, &r, buf, (size_t)info.nbytes, &info, bar_for((size_t)info.nbytes), NULL, err);
  if (!rc)
    rc = npy_write(a->pos[1], info.dtype, info.ndim, info.sizes, buf, (size_t)info.nbytes, err);
  free(buf);
  if (!rc && json)
    print_info(&info, -1);
  return rc;
}

static int cmd_info(tport_client *c, const cmd_args *a, tport_err *err)
{
  tport_tensor_info info;
  tport_ref r;
  int rc;
  if ((rc = refarg(a->pos[0], &r, err)) ||
      (rc = tport_info_wait(c, &r, (uint32_t)a->wait_ms, &info, err)))
    return rc;
  print_info(&info, -1);
  return 0;
}

static int cmd_view(tport_client *c, const cmd_args *a, tport_err *err)
{
  tport_tensor_info info;
  tport_ref r;
  int rc;
  if ((rc = refarg(a->pos[0], &r, err)))
    return rc;
  if (!a->has_sizes || !a->has_strides || a->nsizes != a->nstrides)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "view needs --sizes and --strides of the same length");
  if ((rc = tport_view(c, &r, a->nsizes, a->sizes, a->strides, a->offset, a->name, &info, err)))
    return rc;
  print_info(&info, -1);
  return 0;
}

static int cmd_to(tport_client *c, const cmd_args *a, tport_err *err)
{
  tport_tensor_info info;
  tport_ref r;
  int rc;
  if ((rc = refarg(a->pos[0], &r, err)))
    return rc;
  tport_to_options o = {.device = a->device,
                        .has_dtype = a->has_dtype,
                        .dtype = a->dtype,
                        .has_memory_format = a->has_format,
                        .memory_format = a->format,
                        .copy = a->copy,
                        .non_blocking = a->nonblocking,
                        .exact_format = a->exact,
                        .name = a->name,
                        .ttl_ms = a->ttl_ms};
  bool alias;
  if ((rc = tport_to(c, &r, &o, &info, &alias, err)))
    return rc;
  print_info(&info, alias);
  return 0;
}

static int cmd_contiguous(tport_client *c, const cmd_args *a, tport_err *err)
{
  tport_tensor_info info;
  tport_ref r;
  int rc;
  if ((rc = refarg(a->pos[0], &r, err)))
    return rc;
  bool alias;
  if ((rc = tport_contiguous(c, &r, a->has_format ? a->format : TPORT_MF_CONTIGUOUS, a->name, &info,
                             &alias, err)))
    return rc;
  print_info(&info, alias);
  return 0;
}

static int cmd_copy(tport_client *c, const cmd_args *a, tport_err *err)
{
  tport_ref r, r2;
  int rc;
  if ((rc = refarg(a->pos[0], &r, err)) || (rc = refarg(a->pos[1], &r2, err)) ||
      (rc = tport_copy(c, &r, &r2, a->nonblocking, err)))
    return rc;
  if (json)
    printf("{\"ok\": true}\n");
  return 0;
}

static int cmd_rm(tport_client *c, const cmd_args *a, tport_err *err)
{
  tport_ref r;
  int rc;
  if ((rc = refarg(a->pos[0], &r, err)) || (rc = tport_free(c, &r, err)))
    return rc;
  if (json)
    printf("{\"ok\": true}\n");
  return 0;
}

static int cmd_ls(tport_client *c, const cmd_args *a, tport_err *err)
{
  int rc;
  tport_tensor_info *v;
  size_t n;
  if ((rc = tport_list(c, &v, &n, err)))
    return rc;
  if (json)
    printf("[");
  for (size_t i = 0; i < n; i++) {
    if (json) {
      if (i)
        printf(", ");
      print_info(&v[i], -1);
    } else {
      char ref[40];
      tport_ref h = v[i].ref;
      h.name[0] = 0;
      tport_ref_format(&h, ref, sizeof ref);
      printf("%s  %-16s %-10s %-8s ", ref, v[i].ref.name[0] ? v[i].ref.name : "-",
             dtype_name(v[i].dtype), v[i].device);
      print_dims(v[i].ndim, v[i].sizes);
      printf("\n");
    }
  }
  if (json)
    printf("]\n");
  free(v);
  return 0;
}

static int cmd_devices(tport_client *c, const cmd_args *a, tport_err *err)
{
  int rc;
  tport_device_info *v;
  size_t n;
  char why[256];
  if ((rc = tport_devices(c, &v, &n, why, sizeof why, err)))
    return rc;
  if (json)
    printf("{\"devices\": [");
  for (size_t i = 0; i < n; i++) {
    if (json) {
      printf("%s{\"device\": \"%s\", \"name\": \"%s\", \"total_bytes\": %llu, \"free_bytes\": "
             "%llu, \"compute_capability\": \"%s\", \"peer_access\": [",
             i ? ", " : "", v[i].device, v[i].name, (unsigned long long)v[i].total_bytes,
             (unsigned long long)v[i].free_bytes, v[i].compute_capability);
      for (int p = 0; p < v[i].npeers; p++)
        printf("%s\"%s\"", p ? ", " : "", v[i].peers[p]);
      printf("]}");
    } else {
      printf("%-8s %-14s %8.1f GiB total %8.1f GiB free  peers:", v[i].device, v[i].name,
             (double)v[i].total_bytes / (1 << 30), (double)v[i].free_bytes / (1 << 30));
      for (int p = 0; p < v[i].npeers; p++)
        printf(" %s", v[i].peers[p]);
      printf("%s\n", v[i].npeers ? "" : " -");
    }
  }
  if (json)
    printf("], \"cuda_unavailable_reason\": \"%s\"}\n", why);
  else if (why[0])
    printf("cuda: %s\n", why);
  free(v);
  return 0;
}

static int cmd_stats(tport_client *c, const cmd_args *a, tport_err *err)
{
  int rc;
  tport_counter *v;
  size_t n;
  if ((rc = tport_stats(c, &v, &n, err)))
    return rc;
  if (json)
    printf("{");
  for (size_t i = 0; i < n; i++)
    printf(json ? "%s\"%s\": %lld" : "%s%-28s %lld\n", json && i ? ", " : "", v[i].name,
           (long long)v[i].value);
  if (json)
    printf("}\n");
  free(v);
  return 0;
}

/* The commands: what each is called, the arguments it takes (REFs and
 * files; options aside), and what runs it once connected. */
typedef struct command {
  const char *name;
  int nargs;
  int (*run)(tport_client *c, const cmd_args *a, tport_err *err);
} command;

static const command commands[] = {
    {"put", 1, cmd_put},
    {"get", 2, cmd_get},
    {"info", 1, cmd_info},
    {"view", 1, cmd_view},
    {"to", 1, cmd_to},
    {"contiguous", 1, cmd_contiguous},
    {"copy", 2, cmd_copy},
    {"rm", 1, cmd_rm},
    {"ls", 0, cmd_ls},
    {"devices", 0, cmd_devices},
    {"stats", 0, cmd_stats},
};

/* The command and its arguments, checked before any connection: a usage
 * error (exit 2) costs no round trip and says the same with or without a
 * server. */
static const command *find_command(const char *cmd, const cmd_args *a, tport_err *err)
{
  for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
    if (strcmp(cmd, commands[i].name) == 0)
      return need(a, commands[i].nargs, cmd, err) ? NULL : &commands[i];
  tport_err_set(err, TPORT_INVALID_ARGUMENT,
                "unknown command '%s': put, get, info, view, to, contiguous, copy, rm, ls, "
                "devices or stats",
                cmd);
  return NULL;
}

int main(int argc, char **argv)
{
  const char *url = getenv("TPORT_URL"), *tenant = getenv("TPORT_TENANT"),
             *secret_file = getenv("TPORT_SECRET_FILE"), *tls_ca = getenv("TPORT_TLS_CA"),
             *tls_cert = getenv("TPORT_TLS_CERT"), *tls_key = getenv("TPORT_TLS_KEY"),
             *tls_name = getenv("TPORT_TLS_SERVER_NAME"), *verify = getenv("TPORT_VERIFY");
  bool no_shm = false;
  int i = 1;
  for (; i < argc && argv[i][0] == '-'; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    } else if (strcmp(argv[i], "--json") == 0) {
      json = true;
    } else if (strcmp(argv[i], "--verify") == 0) {
      verify = "1";
    } else if (strcmp(argv[i], "--no-shm") == 0) {
      no_shm = true;
    } else if (strcmp(argv[i], "--url") == 0 && i + 1 < argc) {
      url = argv[++i];
    } else if (strcmp(argv[i], "--tenant") == 0 && i + 1 < argc) {
      tenant = argv[++i];
    } else if (strcmp(argv[i], "--secret-file") == 0 && i + 1 < argc) {
      secret_file = argv[++i];
    } else if (strcmp(argv[i], "--tls-ca") == 0 && i + 1 < argc) {
      tls_ca = argv[++i];
    } else if (strcmp(argv[i], "--tls-cert") == 0 && i + 1 < argc) {
      tls_cert = argv[++i];
    } else if (strcmp(argv[i], "--tls-key") == 0 && i + 1 < argc) {
      tls_key = argv[++i];
    } else if (strcmp(argv[i], "--tls-server-name") == 0 && i + 1 < argc) {
      tls_name = argv[++i];
    } else {
      return usage_error("unknown option '%s'", argv[i]);
    }
  }
  if (i == argc) {
    usage(stderr);
    return 2;
  }
  const char *cmd = argv[i];
  cmd_args a;
  tport_err err;
  int rc = parse_cmd(argc - i, argv + i, &a, &err);
  const command *chosen = rc ? NULL : find_command(cmd, &a, &err);
  if (!chosen) {
    fprintf(stderr, "tport: %s (try tport --help)\n", err.msg);
    return 2;
  }
  if (url_opt)
    url = url_opt;
  if (tenant_opt)
    tenant = tenant_opt;
  if (secret_file_opt)
    secret_file = secret_file_opt;
  tport_client *c;
#define SET(v) ((v) && *(v) ? (v) : NULL)
  tport_connect_options co = {.tenant = tenant,
                              .keep = true,
                              .secret_file = SET(secret_file),
                              .tls_ca = SET(tls_ca),
                              .tls_cert = SET(tls_cert),
                              .tls_key = SET(tls_key),
                              .tls_server_name = SET(tls_name),
                              .verify = verify && strcmp(verify, "1") == 0,
                              .no_shm = no_shm};
#undef SET
  if (tport_connect(url && *url ? url : "tcp://127.0.0.1:7450", &co, &c, &err))
    return fail(&err);
  rc = chosen->run(c, &a, &err);
  tport_close(c);
  if (rc)
    return err.code == TPORT_INVALID_ARGUMENT && rc == 2 ? (fail(&err), 2) : fail(&err);
  return 0;
}
