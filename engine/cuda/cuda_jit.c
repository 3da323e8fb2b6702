/*
 * cuda_jit.c: NVRTC compilation, the kernel cache and launches (see
 * cuda_jit.h).  Three parts: libnvrtc loaded with dlopen; the compile of
 * copy.cu with its options; the cache (memory entries with a state, disk
 * files keyed by everything that changes the code).  The launch decision
 * and the launch: cuda_launch.c.
 */
#include "cuda_jit.h"
#include "cuda_jit_internal.h"

#include <dlfcn.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "copy_cu_src.h" /* tport_copy_cu_src: kernels/cuda/copy.cu as a string */

/* ---------------------------------------------------------------- libnvrtc */

/* The entry points used, with nvrtc.h's own types (checked below), so that
 * only the header is needed to build. */
typedef nvrtcResult (*nvrtc_version_fn)(int *, int *);
typedef nvrtcResult (*nvrtc_create_fn)(nvrtcProgram *, const char *, const char *, int,
                                       const char *const *, const char *const *);
typedef nvrtcResult (*nvrtc_compile_fn)(nvrtcProgram, int, const char *const *);
typedef nvrtcResult (*nvrtc_size_fn)(nvrtcProgram, size_t *);
typedef nvrtcResult (*nvrtc_get_fn)(nvrtcProgram, char *);
typedef nvrtcResult (*nvrtc_destroy_fn)(nvrtcProgram *);
typedef const char *(*nvrtc_error_string_fn)(nvrtcResult);

/* _Generic's operand is not evaluated: these name the functions without
 * referring to their symbols. */
#define NVRTC_TYPE_IS(fn, type) _Generic(&fn, type : 1, default : 0)
_Static_assert(NVRTC_TYPE_IS(nvrtcVersion, nvrtc_version_fn) &&
                   NVRTC_TYPE_IS(nvrtcCreateProgram, nvrtc_create_fn) &&
                   NVRTC_TYPE_IS(nvrtcCompileProgram, nvrtc_compile_fn) &&
                   NVRTC_TYPE_IS(nvrtcGetProgramLogSize, nvrtc_size_fn) &&
                   NVRTC_TYPE_IS(nvrtcGetProgramLog, nvrtc_get_fn) &&
                   NVRTC_TYPE_IS(nvrtcGetCUBINSize, nvrtc_size_fn) &&
                   NVRTC_TYPE_IS(nvrtcGetCUBIN, nvrtc_get_fn) &&
                   NVRTC_TYPE_IS(nvrtcDestroyProgram, nvrtc_destroy_fn) &&
                   NVRTC_TYPE_IS(nvrtcGetErrorString, nvrtc_error_string_fn),
               "the NVRTC entry points changed type");
_Static_assert(sizeof(void *) == sizeof(nvrtc_create_fn), "dlsym() gives function pointers");

static struct {
  pthread_once_t once;
  bool ok;
  char why[512];  /* when !ok: the dlerror() of each try */
  char name[256]; /* when ok: the file opened */
  int major, minor;
  nvrtc_version_fn version;
  nvrtc_create_fn create;
  nvrtc_compile_fn compile;
  nvrtc_size_fn log_size;
  nvrtc_get_fn log;
  nvrtc_size_fn cubin_size;
  nvrtc_get_fn cubin;
  nvrtc_destroy_fn destroy;
  nvrtc_error_string_fn error_string;
} nv = {.once = PTHREAD_ONCE_INIT};

static void nvrtc_open(void)
{
  /* $TPORT_NVRTC_LIBRARY alone when set: it says which file is meant (the
   * emulation suite substitutes its own), and a fallback would hide a typo. */
  const char *env = getenv("TPORT_NVRTC_LIBRARY");
#ifdef TPORT_NVRTC_BUILD_PATH
  /* last, the toolkit this was built with (where ld.so.conf does not name it) */
  const char *names[3] = {"libnvrtc.so.13", "libnvrtc.so", TPORT_NVRTC_BUILD_PATH};
  int count = 3;
#else
  const char *names[3] = {"libnvrtc.so.13", "libnvrtc.so", NULL};
  int count = 2;
#endif
  if (env && *env) {
    names[0] = env;
    count = 1;
  }
  void *h = NULL;
  size_t used = 0;
  for (int i = 0; i < count && !h; i++) {
    h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h) {
      snprintf(nv.name, sizeof nv.name, "%s", names[i]);
    } else if (used < sizeof nv.why) {
      const char *e = dlerror();
      int w =
          snprintf(nv.why + used, sizeof nv.why - used, "%s%s", used ? "; " : "", e ? e : names[i]);
      used += w > 0 ? (size_t)w : 0;
    }
  }
  if (!h)
    return;
  struct {
    const char *name;
    void *slot; /* a function pointer member of nv */
  } syms[] = {
      {"nvrtcVersion", &nv.version},
      {"nvrtcCreateProgram", &nv.create},
      {"nvrtcCompileProgram", &nv.compile},
      {"nvrtcGetProgramLogSize", &nv.log_size},
      {"nvrtcGetProgramLog", &nv.log},
      {"nvrtcGetCUBINSize", &nv.cubin_size},
      {"nvrtcGetCUBIN", &nv.cubin},
      {"nvrtcDestroyProgram", &nv.destroy},
      {"nvrtcGetErrorString", &nv.error_string},
  };
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    dlerror();
    void *f = dlsym(h, syms[i].name);
    if (!f) {
      const char *e = dlerror();
      snprintf(nv.why, sizeof nv.why, "%s has no %s (%s)", nv.name, syms[i].name,
               e ? e : "dlsym failed");
      dlclose(h);
      return;
    }
    /* POSIX guarantees that a function pointer round-trips through void *;
     * memcpy stores it without an object-to-function pointer cast. */
    memcpy(syms[i].slot, &f, sizeof f);
  }
  nvrtcResult r = nv.version(&nv.major, &nv.minor);
  if (r != NVRTC_SUCCESS) {
    snprintf(nv.why, sizeof nv.why, "%s: nvrtcVersion: %s", nv.name, nv.error_string(r));
    dlclose(h);
    return;
  }
  nv.ok = true; /* the library stays loaded for the life of the process */
}

static int nvrtc_load(tport_err *err)
{
  pthread_once(&nv.once, nvrtc_open);
  if (!nv.ok)
    return tport_err_set(err, TPORT_UNAVAILABLE, "runtime compilation unavailable: %s", nv.why);
  return TPORT_OK;
}

bool cuda_jit_available(char *why, size_t n)
{
  pthread_once(&nv.once, nvrtc_open);
  if (why && n) {
    if (nv.ok)
      snprintf(why, n, "NVRTC %d.%d (%s)", nv.major, nv.minor, nv.name);
    else
      snprintf(why, n, "runtime compilation unavailable: %s", nv.why);
  }
  return nv.ok;
}

/* ---------------------------------------------------------------- compiling */

#define COPY_NOPTS 6

typedef struct copy_opts {
  char dst[32], src[32], arch[64];
  const char *v[COPY_NOPTS];
} copy_opts;

/* The one list of options: the compile and the disk cache key both use it,
 * so a change of an option is a change of the key. */
static void copy_opts_build(copy_opts *o, tport_dtype dt, tport_dtype st, bool wide,
                            const char *arch)
{
  snprintf(o->dst, sizeof o->dst, "-DTPORT_DST=%d", (int)dt);
  snprintf(o->src, sizeof o->src, "-DTPORT_SRC=%d", (int)st);
  snprintf(o->arch, sizeof o->arch, "--gpu-architecture=%s", arch);
  o->v[0] = o->dst;
  o->v[1] = o->src;
  o->v[2] = o->arch;
  o->v[3] = wide ? "-DTPORT_IDX=unsigned long long" : "-DTPORT_IDX=unsigned int";
  o->v[4] = "--std=c++17";
  /* no fused multiply-add: kernels/cpu rounds a product and a sum apart */
  o->v[5] = "--fmad=false";
}

size_t cuda_jit_copy_options(tport_dtype dt, tport_dtype st, bool wide, const char *arch, char *buf,
                             size_t n)
{
  copy_opts o;
  copy_opts_build(&o, dt, st, wide, arch);
  size_t len = 0;
  if (n)
    buf[0] = '\0';
  for (int i = 0; i < COPY_NOPTS; i++) {
    int w =
        snprintf(len < n ? buf + len : NULL, len < n ? n - len : 0, "%s%s", i ? " " : "", o.v[i]);
    len += w > 0 ? (size_t)w : 0;
  }
  return len;
}

bool cuda_jit_dtype_ok(tport_dtype t)
{
  return (int)t >= 0 && (int)t < TPORT_NUM_DTYPES;
}

int cuda_jit_compile_copy(tport_dtype dt, tport_dtype st, bool wide, const char *arch, void **cubin,
                          size_t *size, tport_err *err)
{
  if (!cuda_jit_dtype_ok(dt) || !cuda_jit_dtype_ok(st) || !arch)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "copy kernel %d <- %d for %s: no such dtype",
                         (int)dt, (int)st, arch ? arch : "(null)");
  int rc = nvrtc_load(err);
  if (rc)
    return rc;
  nvrtcProgram prog;
  nvrtcResult r = nv.create(&prog, tport_copy_cu_src, "tport_copy.cu", 0, NULL, NULL);
  if (r != NVRTC_SUCCESS)
    return tport_err_set(err, TPORT_INTERNAL, "nvrtcCreateProgram: %s", nv.error_string(r));
  copy_opts o;
  copy_opts_build(&o, dt, st, wide, arch);
  r = nv.compile(prog, COPY_NOPTS, o.v);
  if (r != NVRTC_SUCCESS) {
    size_t n = 0;
    nv.log_size(prog, &n);
    char *log = calloc(1, n + 1);
    if (log)
      nv.log(prog, log);
    tport_err_set(err, TPORT_INTERNAL, "nvrtcCompileProgram(copy %d <- %d, %s): %s: %.150s",
                  (int)dt, (int)st, arch, nv.error_string(r), log ? log : "");
    free(log);
    nv.destroy(&prog);
    return TPORT_INTERNAL;
  }
  size_t n = 0;
  r = nv.cubin_size(prog, &n);
  if (r == NVRTC_SUCCESS && n == 0) {
    /* a virtual architecture (compute_90) compiles to PTX only: NVRTC says
     * success with no CUBIN, which nothing could load */
    nv.destroy(&prog);
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "nvrtc produced no CUBIN for %s: name a real architecture (sm_XX)", arch);
  }
  void *bin = r == NVRTC_SUCCESS ? malloc(n) : NULL;
  if (bin)
    r = nv.cubin(prog, bin);
  nv.destroy(&prog);
  if (!bin || r != NVRTC_SUCCESS) {
    free(bin);
    return tport_err_set(err, TPORT_INTERNAL, "nvrtcGetCUBIN: %s", nv.error_string(r));
  }
  *cubin = bin;
  *size = n;
  return TPORT_OK;
}

/* ---------------------------------------------------------------- disk cache */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
  const unsigned char *c = p;
  for (size_t i = 0; i < n; i++)
    h = (h ^ c[i]) * 0x100000001b3ull;
  return h;
}

/* One file per kernel, named by everything that changes its code: the
 * source, every option (dtypes, index width, architecture, --fmad...) and
 * the NVRTC version.  A change of any of them makes a new name, so a stale
 * kernel is never loaded.  Needs libnvrtc loaded (the version). */
static void cache_path(char *buf, size_t len, const char *dir, int dt, int st, int wide, int cc)
{
  char arch[16];
  snprintf(arch, sizeof arch, "sm_%d", cc);
  copy_opts o;
  copy_opts_build(&o, (tport_dtype)dt, (tport_dtype)st, wide, arch);
  uint64_t h = fnv1a(0xcbf29ce484222325ull, tport_copy_cu_src, sizeof tport_copy_cu_src);
  for (int i = 0; i < COPY_NOPTS; i++)
    h = fnv1a(h, o.v[i], strlen(o.v[i]) + 1);
  snprintf(buf, len, "%s/tport-copy-%d-%d-%s-sm%d-nvrtc%d.%d-%016llx.cubin", dir, dt, st,
           wide ? "i64" : "i32", cc, nv.major, nv.minor, (unsigned long long)h);
}

static void *read_file(const char *path, size_t *n)
{
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  void *b = NULL;
  long len = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
  if (len > 0 && fseek(f, 0, SEEK_SET) == 0 && (b = malloc((size_t)len)) &&
      fread(b, 1, (size_t)len, f) != (size_t)len) {
    free(b);
    b = NULL;
  }
  fclose(f);
  *n = b ? (size_t)len : 0;
  return b;
}

static void write_file(const char *path, const void *b, size_t n)
{
  size_t tl = strlen(path) + 32;
  char *tmp = malloc(tl);
  if (!tmp)
    return;
  snprintf(tmp, tl, "%s.%d.tmp", path, (int)getpid());
  FILE *f = fopen(tmp, "wb");
  if (f) {
    bool ok = fwrite(b, 1, n, f) == n;
    ok = fclose(f) == 0 && ok;
    if (ok)
      rename(tmp, path); /* atomic: another process never reads half a file */
    else
      remove(tmp);
  }
  free(tmp);
}

/* ---------------------------------------------------------------- memory cache */

const char *const cuda_jit_kernel_names[CUDA_JIT_NUM_KERNELS] = {
    [CUDA_JIT_COPY] = "tport_copy",
    [CUDA_JIT_TRANSPOSE] = "tport_transpose",
    [CUDA_JIT_CAST_VEC] = "tport_cast_vec",
};

/* An entry's life: COMPILING (one thread builds it, without the lock) ->
 * READY (for good, until cuda_jit_reset) or FAILED (-> COMPILING again at
 * the next use). */
typedef enum entry_state { ENTRY_COMPILING, ENTRY_READY, ENTRY_FAILED } entry_state;

typedef struct jit_entry {
  int dt, st, wide, cc; /* cc: major * 10 + minor */
  entry_state state;
  unsigned attempt;    /* compiles started: a waiter knows when its own ended */
  pthread_cond_t done; /* broadcast when a compile ends */
  tport_err err;       /* why the last compile failed */
  cudaLibrary_t lib;
  cudaKernel_t kernels[CUDA_JIT_NUM_KERNELS]; /* by cuda_jit_kernel */
  struct jit_entry *next;
} jit_entry;

static struct {
  pthread_mutex_t mu; /* entries, cache_dir, st; never held across a compile */
  jit_entry *entries;
  char *cache_dir;
  cuda_jit_stats st;
} jit = {.mu = PTHREAD_MUTEX_INITIALIZER};

static double now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

void cuda_jit_set_cache_dir(const char *dir)
{
  char *copy = dir ? strdup(dir) : NULL;
  pthread_mutex_lock(&jit.mu);
  free(jit.cache_dir);
  jit.cache_dir = copy;
  pthread_mutex_unlock(&jit.mu);
}

void cuda_jit_get_stats(cuda_jit_stats *out)
{
  pthread_mutex_lock(&jit.mu);
  *out = jit.st;
  pthread_mutex_unlock(&jit.mu);
}

static int load_library(const void *bin, int dt, int st, cudaLibrary_t *lib,
                        cudaKernel_t kernels[CUDA_JIT_NUM_KERNELS], tport_err *err)
{
  cudaError_t e = cudaLibraryLoadData(lib, bin, NULL, NULL, 0, NULL, NULL, 0);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return tport_err_set(err, TPORT_INTERNAL, "cudaLibraryLoadData(tport_copy %d <- %d): %s", dt,
                         st, cudaGetErrorString(e));
  }
  for (int i = 0; i < CUDA_JIT_NUM_KERNELS; i++) {
    e = cudaLibraryGetKernel(&kernels[i], *lib, cuda_jit_kernel_names[i]);
    if (e != cudaSuccess) {
      cudaGetLastError();
      cudaLibraryUnload(*lib);
      cudaGetLastError();
      return tport_err_set(err, TPORT_INTERNAL, "cudaLibraryGetKernel(%s %d <- %d): %s",
                           cuda_jit_kernel_names[i], dt, st, cudaGetErrorString(e));
    }
  }
  return TPORT_OK;
}

/* What one compile attempt gives; built without the lock. */
typedef struct jit_built {
  cudaLibrary_t lib;
  cudaKernel_t kernels[CUDA_JIT_NUM_KERNELS];
  bool disk_hit;
  double compile_ms;
} jit_built;

static int build_entry(const char *dir, int dt, int st, int wide, int cc, jit_built *b,
                       tport_err *err)
{
  int rc = nvrtc_load(err); /* also the disk cache's key: the NVRTC version */
  if (rc)
    return rc;
  char *path = NULL;
  void *bin = NULL;
  size_t n = 0;
  if (dir) {
    size_t pl = strlen(dir) + 128;
    path = malloc(pl);
    if (!path)
      return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
    cache_path(path, pl, dir, dt, st, wide, cc);
    bin = read_file(path, &n);
    if (bin) {
      rc = load_library(bin, dt, st, &b->lib, b->kernels, NULL);
      free(bin);
      bin = NULL;
      if (!rc) {
        b->disk_hit = true;
        free(path);
        return TPORT_OK;
      }
      /* A file the runtime refuses (damaged, or for a driver that changed):
       * drop it and compile once, rather than refuse it at every use. */
      remove(path);
    }
  }
  char arch[16];
  snprintf(arch, sizeof arch, "sm_%d", cc);
  double t0 = now_ms();
  rc = cuda_jit_compile_copy((tport_dtype)dt, (tport_dtype)st, wide, arch, &bin, &n, err);
  b->compile_ms = now_ms() - t0;
  if (!rc)
    rc = load_library(bin, dt, st, &b->lib, b->kernels, err);
  if (!rc && path)
    write_file(path, bin, n); /* only what loads is worth keeping */
  free(bin);
  free(path);
  return rc;
}

int cuda_jit_get_kernel(int cc, int dt, int st, int wide, cuda_jit_kernel which, cudaKernel_t *out,
                        tport_err *err)
{
  pthread_mutex_lock(&jit.mu);
  jit_entry *e = jit.entries;
  while (e && !(e->dt == dt && e->st == st && e->wide == wide && e->cc == cc))
    e = e->next;
  if (!e) {
    e = calloc(1, sizeof *e);
    if (!e) {
      pthread_mutex_unlock(&jit.mu);
      return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
    }
    e->dt = dt;
    e->st = st;
    e->wide = wide;
    e->cc = cc;
    e->state = ENTRY_FAILED; /* not built yet: the same as a failed try */
    pthread_cond_init(&e->done, NULL);
    e->next = jit.entries;
    jit.entries = e;
  } else if (e->state == ENTRY_COMPILING) {
    /* wait for that compile; a retry started after it failed is not ours */
    unsigned mine = e->attempt;
    while (e->state == ENTRY_COMPILING && e->attempt == mine)
      pthread_cond_wait(&e->done, &jit.mu);
    if (e->state != ENTRY_READY) {
      int rc = tport_err_set(err, e->err.code, "%s", e->err.msg);
      pthread_mutex_unlock(&jit.mu);
      return rc;
    }
  }
  if (e->state == ENTRY_READY) {
    jit.st.hits++;
    *out = e->kernels[which];
    pthread_mutex_unlock(&jit.mu);
    return TPORT_OK;
  }
  /* new, or failed before: this thread builds it */
  e->state = ENTRY_COMPILING;
  e->attempt++;
  jit.st.misses++;
  char *dir = jit.cache_dir ? strdup(jit.cache_dir) : NULL;
  bool dir_lost = jit.cache_dir && !dir;
  pthread_mutex_unlock(&jit.mu);

  jit_built b = {0};
  tport_err berr;
  int rc = dir_lost ? tport_err_set(&berr, TPORT_RESOURCE_EXHAUSTED, "out of memory")
                    : build_entry(dir, dt, st, wide, cc, &b, &berr);
  free(dir);

  pthread_mutex_lock(&jit.mu);
  jit.st.compile_ms += b.compile_ms;
  if (b.disk_hit)
    jit.st.disk_hits++;
  if (!rc) {
    e->lib = b.lib;
    memcpy(e->kernels, b.kernels, sizeof e->kernels);
    e->state = ENTRY_READY;
    *out = e->kernels[which];
  } else {
    e->err = berr;
    e->state = ENTRY_FAILED;
  }
  pthread_cond_broadcast(&e->done);
  pthread_mutex_unlock(&jit.mu);
  if (rc)
    tport_err_set(err, rc, "%s", berr.msg);
  return rc;
}

void cuda_jit_reset(void)
{
  pthread_mutex_lock(&jit.mu);
  for (jit_entry *e = jit.entries; e;) {
    if (e->state == ENTRY_COMPILING) {
      pthread_cond_wait(&e->done, &jit.mu);
      e = jit.entries; /* look again from the start */
    } else {
      e = e->next;
    }
  }
  jit_entry *list = jit.entries;
  jit.entries = NULL;
  cuda_jit_forget_devices();
  pthread_mutex_unlock(&jit.mu);
  while (list) {
    jit_entry *next = list->next;
    if (list->state == ENTRY_READY && cudaLibraryUnload(list->lib) != cudaSuccess)
      cudaGetLastError();
    pthread_cond_destroy(&list->done);
    free(list);
    list = next;
  }
}
