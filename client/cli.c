/*
 * cli.c: tport, the command line of tensorport.
 *
 *   tport [FLAGS] COMMAND ARGS [FLAGS]   (cli_args.c: the flags, before or after)
 *
 * Exit status 0 only on success; errors go to stderr as "tport: CODE: message".
 * Tensors made by the tool are kept for the tenant (with the server's time to
 * live) so that a later command can name them by REF (a handle or a name).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_args.h"
#include "dtype.h"
#include "npy.h"
#include "tport.h"

static bool json;

static int fail(const tport_err *e)
{
  if (json)
    printf("{\"error\": \"%s\", \"message\": \"%s\"}\n", tport_strerror(e->code), e->msg);
  fprintf(stderr, "tport: %s: %s\n", tport_strerror(e->code), e->msg);
  return 1;
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

/* n arguments, or up to n with optional. */
static int need(const cli_args *a, int n, bool optional, const char *cmd, tport_err *err)
{
  if (a->npos == n || (optional && a->npos < n))
    return 0;
  if (optional)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s takes at most %d argument%s", cmd, n,
                         n == 1 ? "" : "s");
  return tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s takes %d argument%s", cmd, n,
                       n == 1 ? "" : "s");
}

static int refarg(const char *s, tport_ref *r, tport_err *err)
{
  return tport_ref_parse(s, r, err);
}

static int cmd_put(tport_client *c, const cli_args *a, tport_err *err)
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

static int cmd_get(tport_client *c, const cli_args *a, tport_err *err)
{
  tport_tensor_info info;
  tport_ref r;
  int rc;
  if ((rc = refarg(a->pos[0], &r, err)))
    return rc;
  if ((rc = tport_info_wait(c, &r, a->wait_ms, &info, err)))
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

static int cmd_info(tport_client *c, const cli_args *a, tport_err *err)
{
  tport_tensor_info info;
  tport_ref r;
  int rc;
  if ((rc = refarg(a->pos[0], &r, err)) || (rc = tport_info_wait(c, &r, a->wait_ms, &info, err)))
    return rc;
  print_info(&info, -1);
  return 0;
}

static int cmd_view(tport_client *c, const cli_args *a, tport_err *err)
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

static int cmd_to(tport_client *c, const cli_args *a, tport_err *err)
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

static int cmd_contiguous(tport_client *c, const cli_args *a, tport_err *err)
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

static int cmd_copy(tport_client *c, const cli_args *a, tport_err *err)
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

static int cmd_rm(tport_client *c, const cli_args *a, tport_err *err)
{
  tport_ref r;
  int rc;
  if ((rc = refarg(a->pos[0], &r, err)) || (rc = tport_free(c, &r, err)))
    return rc;
  if (json)
    printf("{\"ok\": true}\n");
  return 0;
}

static int cmd_ls(tport_client *c, const cli_args *a, tport_err *err)
{
  int rc;
  tport_tensor_info *v;
  size_t n;
  /* with a PREFIX, the named tensors under it, by name */
  if ((rc = a->npos ? tport_list_named(c, a->pos[0], &v, &n, err) : tport_list(c, &v, &n, err)))
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

static int cmd_devices(tport_client *c, const cli_args *a, tport_err *err)
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
      char free_bytes[24] = "null"; /* hidden from a tenant that is not an operator */
      if (!v[i].free_hidden)
        snprintf(free_bytes, sizeof free_bytes, "%llu", (unsigned long long)v[i].free_bytes);
      printf("%s{\"device\": \"%s\", \"name\": \"%s\", \"total_bytes\": %llu, \"free_bytes\": "
             "%s, \"compute_capability\": \"%s\", \"peer_access\": [",
             i ? ", " : "", v[i].device, v[i].name, (unsigned long long)v[i].total_bytes,
             free_bytes, v[i].compute_capability);
      for (int p = 0; p < v[i].npeers; p++)
        printf("%s\"%s\"", p ? ", " : "", v[i].peers[p]);
      printf("]}");
    } else {
      char free_gib[24] = "  hidden"; /* to a tenant that is not an operator */
      if (!v[i].free_hidden)
        snprintf(free_gib, sizeof free_gib, "%8.1f GiB", (double)v[i].free_bytes / (1 << 30));
      printf("%-8s %-14s %8.1f GiB total %s free  peers:", v[i].device, v[i].name,
             (double)v[i].total_bytes / (1 << 30), free_gib);
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

static int cmd_stats(tport_client *c, const cli_args *a, tport_err *err)
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
  bool optional; /* up to nargs */
  int (*run)(tport_client *c, const cli_args *a, tport_err *err);
} command;

static const command commands[] = {
    {"put", 1, false, cmd_put},
    {"get", 2, false, cmd_get},
    {"info", 1, false, cmd_info},
    {"view", 1, false, cmd_view},
    {"to", 1, false, cmd_to},
    {"contiguous", 1, false, cmd_contiguous},
    {"copy", 2, false, cmd_copy},
    {"rm", 1, false, cmd_rm},
    {"ls", 1, true, cmd_ls}, /* ls [PREFIX] */
    {"devices", 0, false, cmd_devices},
    {"stats", 0, false, cmd_stats},
};

/* The command and its arguments, checked before any connection: a usage
 * error (exit 2) costs no round trip and says the same with or without a
 * server. */
static const command *find_command(const char *cmd, const cli_args *a, tport_err *err)
{
  for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
    if (strcmp(cmd, commands[i].name) == 0)
      return need(a, commands[i].nargs, commands[i].optional, cmd, err) ? NULL : &commands[i];
  tport_err_set(err, TPORT_INVALID_ARGUMENT,
                "unknown command '%s': put, get, info, view, to, contiguous, copy, rm, ls, "
                "devices or stats",
                cmd);
  return NULL;
}

/* A flag on the line, else its variable; "" is unset. */
static const char *flag_or_env(const char *flag, const char *var)
{
  const char *v = flag ? flag : getenv(var);
  return v && *v ? v : NULL;
}

int main(int argc, char **argv)
{
  cli_args a;
  tport_err err;
  if (cli_parse(argc, argv, &a, &err)) {
    fprintf(stderr, "tport: %s (try tport --help)\n", err.msg);
    return 2;
  }
  json = a.json;
  if (a.help) {
    cli_usage(stdout);
    return 0;
  }
  if (!a.command) {
    cli_usage(stderr);
    return 2;
  }
  const command *chosen = find_command(a.command, &a, &err);
  if (!chosen || cli_check_flags(&a, &err)) {
    fprintf(stderr, "tport: %s (try tport --help)\n", err.msg);
    return 2;
  }
  const char *verify = getenv("TPORT_VERIFY"), *url = flag_or_env(a.url, "TPORT_URL");
  tport_connect_options co = {.tenant = flag_or_env(a.tenant, "TPORT_TENANT"),
                              .keep = true,
                              .secret_file = flag_or_env(a.secret_file, "TPORT_SECRET_FILE"),
                              .tls_ca = flag_or_env(a.tls_ca, "TPORT_TLS_CA"),
                              .tls_cert = flag_or_env(a.tls_cert, "TPORT_TLS_CERT"),
                              .tls_key = flag_or_env(a.tls_key, "TPORT_TLS_KEY"),
                              .tls_server_name =
                                  flag_or_env(a.tls_server_name, "TPORT_TLS_SERVER_NAME"),
                              .verify = a.verify || (verify && strcmp(verify, "1") == 0),
                              .no_shm = a.no_shm};
  tport_client *c;
  if (tport_connect(url ? url : "tcp://127.0.0.1:7450", &co, &c, &err))
    return fail(&err);
  int rc = chosen->run(c, &a, &err);
  tport_close(c);
  if (rc)
    return err.code == TPORT_INVALID_ARGUMENT && rc == 2 ? (fail(&err), 2) : fail(&err);
  return 0;
}
