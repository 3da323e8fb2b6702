/*
 * nvrtc_emu.c: libtport_nvrtc_emu.so, NVRTC as engine/cuda/cuda_jit.c sees it,
 * for the emulation suite (TPORT_NVRTC_LIBRARY names it).  A "compile"
 * checks the options the way NVRTC 13.0 does (the same return codes and log
 * lines, measured against the real library) and returns an emu_cubin naming
 * the variant they select; the kernels themselves were compiled by the build
 * (variant.cpp).  Stricter than NVRTC in one way: a missing or non-numeric
 * TPORT_DST / TPORT_SRC, which copy.cu would silently read as 0 (bool), is a
 * compile error.
 *
 * emu_nvrtc_get_stats / emu_nvrtc_set_delay_ms / emu_nvrtc_fail_compiles
 * (emu_runtime.h) let a test count compiles, make one slow, or make some fail.
 */
#include <ctype.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "emu_cubin.h"
#include "emu_runtime.h"

struct _nvrtcProgram {
  char *src;
  char *log;      /* after a compile: "" on success */
  bool compiled;  /* the last compile succeeded */
  bool has_cubin; /* ... for a real architecture (sm_XY): a cubin exists */
  emu_cubin cubin;
};

static struct {
  pthread_mutex_t mu;
  emu_nvrtc_stats st;
  int delay_ms, fail;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* nvrtcGetSupportedArchs of NVRTC 13.0 */
static const int archs[] = {75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121};
#define NUM_ARCHS ((int)(sizeof archs / sizeof archs[0]))

const char *nvrtcGetErrorString(nvrtcResult r)
{
  static const char *const names[] = {"NVRTC_SUCCESS",
                                      "NVRTC_ERROR_OUT_OF_MEMORY",
                                      "NVRTC_ERROR_PROGRAM_CREATION_FAILURE",
                                      "NVRTC_ERROR_INVALID_INPUT",
                                      "NVRTC_ERROR_INVALID_PROGRAM",
                                      "NVRTC_ERROR_INVALID_OPTION",
                                      "NVRTC_ERROR_COMPILATION",
                                      "NVRTC_ERROR_BUILTIN_OPERATION_FAILURE"};
  return (unsigned)r < sizeof names / sizeof names[0] ? names[r] : "NVRTC_ERROR unknown";
}

nvrtcResult nvrtcVersion(int *major, int *minor)
{
  if (!major || !minor)
    return NVRTC_ERROR_INVALID_INPUT;
  *major = 13;
  *minor = 0;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetNumSupportedArchs(int *n)
{
  if (!n)
    return NVRTC_ERROR_INVALID_INPUT;
  *n = NUM_ARCHS;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetSupportedArchs(int *out)
{
  if (!out)
    return NVRTC_ERROR_INVALID_INPUT;
  memcpy(out, archs, sizeof archs);
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcCreateProgram(nvrtcProgram *prog, const char *src, const char *name,
                               int num_headers, const char *const *headers,
                               const char *const *include_names)
{
  if (!prog || !src || num_headers < 0 || (num_headers > 0 && (!headers || !include_names)))
    return NVRTC_ERROR_INVALID_INPUT;
  struct _nvrtcProgram *p = calloc(1, sizeof *p);
  if (!p || !(p->src = strdup(src)) || !(p->log = strdup(""))) {
    if (p)
      free(p->src);
    free(p);
    return NVRTC_ERROR_OUT_OF_MEMORY;
  }
  pthread_mutex_lock(&g.mu);
  g.st.creates++;
  pthread_mutex_unlock(&g.mu);
  *prog = p;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcDestroyProgram(nvrtcProgram *prog)
{
  if (!prog || !*prog)
    return NVRTC_ERROR_INVALID_PROGRAM;
  free((*prog)->src);
  free((*prog)->log);
  free(*prog);
  *prog = NULL;
  pthread_mutex_lock(&g.mu);
  g.st.destroys++;
  pthread_mutex_unlock(&g.mu);
  return NVRTC_SUCCESS;
}

/* The state of one compile while its options are read. */
typedef struct compile {
  const char *dst, *src, *idx; /* the values of -DTPORT_DST= ... (last one wins) */
  int arch;                    /* 0: none given (NVRTC then makes PTX only) */
  char suffix;
  bool virtual_arch; /* compute_XY: PTX, no cubin */
  int fmad, ftz;
  bool fast_math;
  char log[512];
} compile;

static nvrtcResult fail(compile *c, nvrtcResult r, const char *fmt, ...)
{
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->log, sizeof c->log, fmt, ap);
  va_end(ap);
  return r;
}

static bool is_arch(int a)
{
  for (int i = 0; i < NUM_ARCHS; i++)
    if (archs[i] == a)
      return true;
  return false;
}

/* "sm_90", "sm_90a", "sm_100f", "compute_90" */
static bool parse_arch(compile *c, const char *v)
{
  bool virt = !strncmp(v, "compute_", 8);
  if (!virt && strncmp(v, "sm_", 3))
    return false;
  const char *d = v + (virt ? 8 : 3);
  char *end;
  long a = strtol(d, &end, 10);
  if (end == d || !is_arch((int)a) || (*end && (end[1] || (*end != 'a' && *end != 'f'))))
    return false;
  c->arch = (int)a;
  c->suffix = *end;
  c->virtual_arch = virt;
  return true;
}

static nvrtcResult define(compile *c, const char *def)
{
  const char *eq = strchr(def, '=');
  size_t n = eq ? (size_t)(eq - def) : strlen(def);
  if (n == 0)
    return fail(c, NVRTC_ERROR_INVALID_OPTION, "nvrtc: error: -D expects a macro name\n");
  const char *value = eq ? eq + 1 : "1";
  if (n == 9 && !strncmp(def, "TPORT_DST", 9))
    c->dst = value;
  else if (n == 9 && !strncmp(def, "TPORT_SRC", 9))
    c->src = value;
  else if (n == 9 && !strncmp(def, "TPORT_IDX", 9))
    c->idx = value;
  return NVRTC_SUCCESS; /* other macros: copy.cu does not read them */
}

/* The value of "--name=v" or "-short=v", or NULL when o is neither. */
static const char *value_of(const char *o, const char *name, const char *short_name)
{
  size_t n = strlen(name), s = strlen(short_name);
  return !strncmp(o, name, n) ? o + n : !strncmp(o, short_name, s) ? o + s : NULL;
}

static bool boolean(const char *v, int *out)
{
  if (strcmp(v, "true") && strcmp(v, "false"))
    return false;
  *out = !strcmp(v, "true");
  return true;
}

static nvrtcResult option(compile *c, const char *o, const char *next, int *used)
{
  const char *v;
  int ignored;
  *used = 1;
  if (!strcmp(o, "-D") || !strcmp(o, "--define-macro")) {
    if (!next)
      return fail(c, NVRTC_ERROR_INVALID_OPTION, "nvrtc: error: %s expects an argument\n", o);
    *used = 2;
    return define(c, next);
  }
  if ((v = value_of(o, "--define-macro=", "-D")))
    return define(c, v);
  if (!strncmp(o, "-U", 2))
    return NVRTC_SUCCESS;
  if ((v = value_of(o, "--gpu-architecture=", "-arch=")))
    return parse_arch(c, v) ? NVRTC_SUCCESS
                            : fail(c, NVRTC_ERROR_INVALID_OPTION,
                                   "nvrtc: error: invalid value for --gpu-architecture (-arch)\n");
  if ((v = value_of(o, "--std=", "-std="))) {
    static const char *const stds[] = {"c++03", "c++11", "c++14", "c++17", "c++20"};
    for (int i = 0; i < 5; i++)
      if (!strcmp(v, stds[i]))
        return NVRTC_SUCCESS;
    return fail(c, NVRTC_ERROR_INVALID_OPTION, "nvrtc: error: invalid value for --std(-std)\n");
  }
  if ((v = value_of(o, "--fmad=", "-fmad=")))
    return boolean(v, &c->fmad) ? NVRTC_SUCCESS
                                : fail(c, NVRTC_ERROR_INVALID_OPTION,
                                       "nvrtc: error: --fmad (-fmad) expects true or false\n");
  if ((v = value_of(o, "--ftz=", "-ftz=")))
    return boolean(v, &c->ftz) ? NVRTC_SUCCESS
                               : fail(c, NVRTC_ERROR_INVALID_OPTION,
                                      "nvrtc: error: --ftz (-ftz) expects true or false\n");
  if ((v = value_of(o, "--prec-div=", "-prec-div=")) ||
      (v = value_of(o, "--prec-sqrt=", "-prec-sqrt=")))
    return boolean(v, &ignored)
               ? NVRTC_SUCCESS
               : fail(c, NVRTC_ERROR_INVALID_OPTION, "nvrtc: error: %s expects true or false\n", o);
  if (!strcmp(o, "--use_fast_math") || !strcmp(o, "-use_fast_math")) {
    c->fast_math = true;
    return NVRTC_SUCCESS;
  }
  /* options that change nothing the emulation can see */
  static const char *const quiet[] = {"-lineinfo",
                                      "--generate-line-info",
                                      "-G",
                                      "--device-debug",
                                      "-w",
                                      "--disable-warnings",
                                      "-restrict",
                                      "--restrict",
                                      "-default-device",
                                      "--device-as-default-execution-space"};
  for (size_t i = 0; i < sizeof quiet / sizeof quiet[0]; i++)
    if (!strcmp(o, quiet[i]))
      return NVRTC_SUCCESS;
  return fail(c, NVRTC_ERROR_INVALID_OPTION, "nvrtc: error: unrecognized option %s found\n", o);
}

/* "0".."11": a dtype number as copy.cu's #if chains accept it */
static int dtype_value(const char *v)
{
  if (!v || !*v || strlen(v) > 2)
    return -1;
  for (const char *p = v; *p; p++)
    if (!isdigit((unsigned char)*p))
      return -1;
  int d = atoi(v);
  return d < 12 ? d : -1;
}

static int idx_bits(const char *v)
{
  if (!v)
    return 0;
  if (!strcmp(v, "unsigned short"))
    return 16;
  if (!strcmp(v, "unsigned int") || !strcmp(v, "unsigned"))
    return 32;
  if (!strcmp(v, "unsigned long long") || !strcmp(v, "unsigned long"))
    return 64;
  return -1;
}

static nvrtcResult run_compile(struct _nvrtcProgram *p, int n, const char *const *opts, compile *c)
{
  int i = 0;
  while (i < n) {
    if (!opts[i])
      return NVRTC_ERROR_INVALID_INPUT;
    int used;
    nvrtcResult r = option(c, opts[i], i + 1 < n ? opts[i + 1] : NULL, &used);
    if (r != NVRTC_SUCCESS)
      return r;
    i += used;
  }
  const char *file = "tport_copy.cu";
  if (!c->dst || !c->src)
    return fail(c, NVRTC_ERROR_COMPILATION,
                "%s: error (emulation): TPORT_%s is not defined; copy.cu would compile it as 0 "
                "(bool)\n",
                file, !c->dst ? "DST" : "SRC");
  if (dtype_value(c->dst) < 0)
    return fail(c, NVRTC_ERROR_COMPILATION, "%s: error: #error \"TPORT_DST is not a dtype\" (%s)\n",
                file, c->dst);
  if (dtype_value(c->src) < 0)
    return fail(c, NVRTC_ERROR_COMPILATION, "%s: error: #error \"TPORT_SRC is not a dtype\" (%s)\n",
                file, c->src);
  int bits = idx_bits(c->idx);
  if (bits == 0)
    return fail(c, NVRTC_ERROR_COMPILATION, "%s: error: identifier \"TPORT_IDX\" is undefined\n",
                file);
  if (bits < 0)
    return fail(c, NVRTC_ERROR_COMPILATION,
                "%s: error (emulation): no variant built for TPORT_IDX=%s\n", file, c->idx);
  emu_cubin *cb = &p->cubin;
  memset(cb, 0, sizeof *cb);
  memcpy(cb->magic, EMU_CUBIN_MAGIC, sizeof cb->magic);
  cb->dst = dtype_value(c->dst);
  cb->src = dtype_value(c->src);
  cb->idx_bits = bits;
  cb->arch = c->arch;
  cb->arch_suffix = c->suffix;
  cb->fmad = (uint8_t)c->fmad;
  cb->fast_math = c->fast_math;
  cb->ftz = (uint8_t)c->ftz;
  cb->source_hash = emu_fnv1a(p->src, strlen(p->src));
  cb->check = emu_cubin_check(cb);
  /* no architecture, or a virtual one: NVRTC makes PTX only, and a cubin of size 0 */
  p->has_cubin = c->arch && !c->virtual_arch;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcCompileProgram(nvrtcProgram prog, int num_options, const char *const *options)
{
  if (!prog)
    return NVRTC_ERROR_INVALID_PROGRAM;
  if (num_options < 0 || (num_options > 0 && !options))
    return NVRTC_ERROR_INVALID_INPUT;
  compile c = {.fmad = 1};
  nvrtcResult r = run_compile(prog, num_options, options, &c);
  pthread_mutex_lock(&g.mu);
  int delay = g.delay_ms;
  if (r == NVRTC_SUCCESS && g.fail > 0) {
    g.fail--;
    r = fail(&c, NVRTC_ERROR_COMPILATION, "tport_copy.cu: error (emulation): failure injected\n");
  }
  g.st.compiles++;
  g.st.failed_compiles += r != NVRTC_SUCCESS;
  size_t len = 0;
  g.st.last_options[0] = 0;
  for (int i = 0; i < num_options && options[i]; i++) {
    int w = snprintf(g.st.last_options + len, sizeof g.st.last_options - len, "%s%s", i ? " " : "",
                     options[i]);
    if (w < 0 || (size_t)w >= sizeof g.st.last_options - len)
      break;
    len += (size_t)w;
  }
  pthread_mutex_unlock(&g.mu);
  if (delay > 0) /* a slow compile, for the tests of waiting */
    nanosleep(&(struct timespec){delay / 1000, (long)(delay % 1000) * 1000000L}, NULL);
  char *log = strdup(c.log);
  if (!log)
    return NVRTC_ERROR_OUT_OF_MEMORY;
  free(prog->log);
  prog->log = log;
  prog->compiled = r == NVRTC_SUCCESS;
  if (!prog->compiled)
    prog->has_cubin = false;
  return r;
}

nvrtcResult nvrtcGetProgramLogSize(nvrtcProgram prog, size_t *size)
{
  if (!prog)
    return NVRTC_ERROR_INVALID_PROGRAM;
  if (!size)
    return NVRTC_ERROR_INVALID_INPUT;
  *size = strlen(prog->log) + 1;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetProgramLog(nvrtcProgram prog, char *log)
{
  if (!prog)
    return NVRTC_ERROR_INVALID_PROGRAM;
  if (!log)
    return NVRTC_ERROR_INVALID_INPUT;
  memcpy(log, prog->log, strlen(prog->log) + 1);
  return NVRTC_SUCCESS;
}

/* As NVRTC 13.0: size 0, and success, after a failed compile or for PTX only. */
nvrtcResult nvrtcGetCUBINSize(nvrtcProgram prog, size_t *size)
{
  if (!prog)
    return NVRTC_ERROR_INVALID_PROGRAM;
  if (!size)
    return NVRTC_ERROR_INVALID_INPUT;
  *size = prog->has_cubin ? sizeof prog->cubin : 0;
  return NVRTC_SUCCESS;
}

nvrtcResult nvrtcGetCUBIN(nvrtcProgram prog, char *cubin)
{
  if (!prog)
    return NVRTC_ERROR_INVALID_PROGRAM;
  if (!cubin)
    return NVRTC_ERROR_INVALID_INPUT;
  if (prog->has_cubin)
    memcpy(cubin, &prog->cubin, sizeof prog->cubin);
  return NVRTC_SUCCESS;
}

void emu_nvrtc_get_stats(emu_nvrtc_stats *out)
{
  pthread_mutex_lock(&g.mu);
  *out = g.st;
  pthread_mutex_unlock(&g.mu);
}

void emu_nvrtc_set_delay_ms(int ms)
{
  pthread_mutex_lock(&g.mu);
  g.delay_ms = ms;
  pthread_mutex_unlock(&g.mu);
}

void emu_nvrtc_fail_compiles(int n)
{
  pthread_mutex_lock(&g.mu);
  g.fail = n;
  pthread_mutex_unlock(&g.mu);
}
