/* test_emu_jit.c: engine/cuda/cuda_jit.c around the kernels, on the emulated
 * runtime and NVRTC: libnvrtc found through $TPORT_NVRTC_LIBRARY or reported
 * unavailable, the compile options (--fmad=false), the disk cache across
 * cuda_jit_reset (a damaged file compiled again), a failed compile tried
 * again, concurrent first uses compiling once; and the emulated runtime
 * refusing what CUDA refuses. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <dlfcn.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "emu_check.h"

static const emu_layout contiguous = {"contiguous", 1, {1000}, {1}, {1}, 0, 0, CUDA_JIT_CAST_VEC};

static void check(const emu_layout *l, tport_dtype dt, tport_dtype st)
{
  char msg[512];
  cr_assert(emu_check_copy(l, dt, st, 0, false, 42, msg, sizeof msg), "%s", msg);
}

/* A function of the emulated NVRTC, from the copy cuda_jit.c opened. */
static void *nvrtc_sym(const char *name)
{
  char why[256];
  cr_assert(cuda_jit_available(why, sizeof why), "%s", why);
  void *h = dlopen(getenv("TPORT_NVRTC_LIBRARY"), RTLD_NOW | RTLD_NOLOAD);
  cr_assert_not_null(h, "cuda_jit.c did not open $TPORT_NVRTC_LIBRARY");
  void *f = dlsym(h, name);
  cr_assert_not_null(f, "%s", name);
  dlclose(h);
  return f;
}

static emu_nvrtc_stats nvrtc_stats(void)
{
  void (*get)(emu_nvrtc_stats *);
  void *f = nvrtc_sym("emu_nvrtc_get_stats");
  memcpy(&get, &f, sizeof get);
  emu_nvrtc_stats st;
  get(&st);
  return st;
}

static void nvrtc_call_int(const char *name, int v)
{
  void (*fn)(int);
  void *f = nvrtc_sym(name);
  memcpy(&fn, &f, sizeof fn);
  fn(v);
}

static cuda_jit_stats jit_stats(void)
{
  cuda_jit_stats st;
  cuda_jit_get_stats(&st);
  return st;
}

static emu_cudart_stats rt_stats(void)
{
  emu_cudart_stats st;
  emu_cudart_get_stats(&st);
  return st;
}

/* A plain 1-D copy of n elements through cuda_jit_copy (no comparison). */
static int copy_1d(tport_dtype dt, tport_dtype st, tport_err *err)
{
  static char dst[64 * 16], src[64 * 16];
  int64_t shape[1] = {64}, ds[1] = {(int64_t)tport_dtype_size(dt)},
          ss[1] = {(int64_t)tport_dtype_size(st)};
  plan p;
  plan_build(&p, 1, shape, 2, (const int64_t *const[]){ds, ss});
  return cuda_jit_copy(0, NULL, &p, dst, dt, src, st, 0, err);
}

Test(emu_jit, nvrtc_is_the_library_the_environment_names)
{
  char why[256];
  cr_assert(cuda_jit_available(why, sizeof why), "%s", why);
  cr_assert(strstr(why, "NVRTC 13.0") && strstr(why, "tport_nvrtc_emu"), "%s", why);
}

Test(emu_jit, a_missing_nvrtc_is_unavailable_not_fatal)
{
  setenv("TPORT_NVRTC_LIBRARY", "/nonexistent/libnvrtc.so.13", 1); /* before the first use */
  char why[512];
  cr_assert_not(cuda_jit_available(why, sizeof why));
  cr_assert(strstr(why, "runtime compilation unavailable"), "%s", why);
  tport_err err = {0};
  cr_assert_eq(copy_1d(TPORT_FLOAT32, TPORT_FLOAT16, &err), TPORT_UNAVAILABLE);
  cr_assert(strstr(err.msg, "runtime compilation unavailable"), "%s", err.msg);
}

Test(emu_jit, compiles_once_with_the_listed_options_and_no_fused_multiply_add)
{
  check(&contiguous, TPORT_FLOAT16, TPORT_FLOAT32);
  emu_nvrtc_stats nv = nvrtc_stats();
  char want[512];
  cuda_jit_copy_options(TPORT_FLOAT16, TPORT_FLOAT32, false, "sm_90", want, sizeof want);
  cr_assert_str_eq(nv.last_options, want);
  cr_assert(strstr(want, "--fmad=false"), "%s", want);
  cr_assert_eq(nv.compiles, 1);
  cr_assert_eq(nv.creates, nv.destroys, "every program destroyed");
  check(&contiguous, TPORT_FLOAT16, TPORT_FLOAT32);
  cr_assert_eq(nvrtc_stats().compiles, 1, "the second use hits the memory cache");
  cuda_jit_stats js = jit_stats();
  cr_assert_eq(js.misses, 1);
  cr_assert_geq(js.hits, 1);
  cr_assert_eq(rt_stats().loads_not_bit_exact, 0, "a kernel was compiled with --fmad=true");
}

/* The one cache file in dir, into path; the count of files. */
static int cache_file(const char *dir, char *path, size_t n)
{
  DIR *d = opendir(dir);
  cr_assert_not_null(d);
  int count = 0;
  for (struct dirent *e; (e = readdir(d));)
    if (strstr(e->d_name, ".cubin") && !strstr(e->d_name, ".tmp")) {
      snprintf(path, n, "%s/%s", dir, e->d_name);
      count++;
    }
  closedir(d);
  return count;
}

static void rewrite(const char *path, void (*damage)(unsigned char *b, long *len))
{
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f);
  unsigned char b[4096];
  long len = (long)fread(b, 1, sizeof b, f);
  fclose(f);
  damage(b, &len);
  f = fopen(path, "wb");
  cr_assert_not_null(f);
  cr_assert_eq(fwrite(b, 1, (size_t)len, f), (size_t)len);
  fclose(f);
}

static void flip_a_middle_byte(unsigned char *b, long *len)
{
  b[*len / 2] ^= 0x40;
}

static void replace_with_garbage(unsigned char *b, long *len)
{
  memcpy(b, "garbage\n", 8);
  *len = 8;
}

Test(emu_jit, the_disk_cache_survives_a_reset_and_a_damaged_file_is_compiled_again)
{
  char dir[] = "/tmp/tport-emu-cache-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  cuda_jit_set_cache_dir(dir);
  char path[1024];

  check(&contiguous, TPORT_FLOAT32, TPORT_BFLOAT16);
  cr_assert_eq(nvrtc_stats().compiles, 1);
  cr_assert_eq(jit_stats().disk_hits, 0);
  cr_assert_eq(cache_file(dir, path, sizeof path), 1);

  cuda_jit_reset();
  emu_cudart_stats rt = rt_stats();
  cr_assert_eq(rt.live_libraries, 0, "cuda_jit_reset unloads every library");
  cr_assert_eq(rt.unloads, 1);
  check(&contiguous, TPORT_FLOAT32, TPORT_BFLOAT16);
  cr_assert_eq(jit_stats().disk_hits, 1, "the second use after a reset loads from disk");
  cr_assert_eq(nvrtc_stats().compiles, 1);

  /* a damaged file: refused by the runtime, removed, compiled again, rewritten */
  rewrite(path, flip_a_middle_byte);
  cuda_jit_reset();
  unsigned long long failures = rt_stats().load_failures;
  check(&contiguous, TPORT_FLOAT32, TPORT_BFLOAT16);
  cr_assert_eq(rt_stats().load_failures, failures + 1);
  cr_assert_eq(nvrtc_stats().compiles, 2, "a damaged file is compiled again");
  cr_assert_eq(jit_stats().disk_hits, 1);
  cuda_jit_reset();
  check(&contiguous, TPORT_FLOAT32, TPORT_BFLOAT16);
  cr_assert_eq(jit_stats().disk_hits, 2, "the file written again loads");
  cr_assert_eq(nvrtc_stats().compiles, 2);

  /* a file that is not a cubin at all, shorter than one */
  rewrite(path, replace_with_garbage);
  cuda_jit_reset();
  check(&contiguous, TPORT_FLOAT32, TPORT_BFLOAT16);
  cr_assert_eq(nvrtc_stats().compiles, 3);

  /* another device: another architecture, another file */
  emu_device d;
  emu_device_get(&d);
  d.cc_major = 8;
  d.cc_minor = 6;
  emu_device_set(&d);
  cuda_jit_reset();
  check(&contiguous, TPORT_FLOAT32, TPORT_BFLOAT16);
  cr_assert_eq(nvrtc_stats().compiles, 4);
  cr_assert(strstr(nvrtc_stats().last_options, "sm_86"), "%s", nvrtc_stats().last_options);

  DIR *dd = opendir(dir);
  int files = 0;
  for (struct dirent *e; (e = readdir(dd));)
    if (e->d_name[0] != '.') {
      char p[1100];
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      files += remove(p) == 0;
    }
  closedir(dd);
  rmdir(dir);
  cr_assert_eq(files, 2, "one file per architecture, no temporary left");
}

Test(emu_jit, a_failed_compile_is_reported_and_tried_again)
{
  nvrtc_call_int("emu_nvrtc_fail_compiles", 1);
  tport_err err = {0};
  cr_assert_eq(copy_1d(TPORT_INT32, TPORT_FLOAT64, &err), TPORT_INTERNAL);
  cr_assert(strstr(err.msg, "nvrtcCompileProgram") && strstr(err.msg, "failure injected"), "%s",
            err.msg);
  cr_assert_eq(copy_1d(TPORT_INT32, TPORT_FLOAT64, &err), TPORT_OK, "%s", err.msg);
  cr_assert_eq(nvrtc_stats().compiles, 2);
}

Test(emu_jit, a_device_nvrtc_cannot_compile_for_is_an_error)
{
  emu_device d;
  emu_device_get(&d);
  d.cc_major = 7;
  d.cc_minor = 0; /* Volta: CUDA 13 no longer compiles for it */
  emu_device_set(&d);
  tport_err err = {0};
  cr_assert_eq(copy_1d(TPORT_FLOAT32, TPORT_FLOAT32, &err), TPORT_INTERNAL);
  cr_assert(strstr(err.msg, "invalid value for --gpu-architecture"), "%s", err.msg);
}

typedef struct racer {
  tport_dtype dt, st;
  bool ok;
  char msg[512];
} racer;

static void *race(void *arg)
{
  racer *r = arg;
  /* no launch counting here: other threads launch too */
  float src[256];
  uint16_t dst[256], ref[256];
  for (int i = 0; i < 256; i++)
    src[i] = (float)i * 0.37f - 40.0f;
  int64_t shape[1] = {256}, ds[1] = {2}, ss[1] = {4};
  plan p;
  plan_build(&p, 1, shape, 2, (const int64_t *const[]){ds, ss});
  cpu_copy(&p, ref, r->dt, src, r->st, 0);
  tport_err err = {0};
  r->ok = cuda_jit_copy(0, NULL, &p, dst, r->dt, src, r->st, 0, &err) == 0 &&
          !memcmp(dst, ref, sizeof dst);
  snprintf(r->msg, sizeof r->msg, "%s", err.msg);
  return NULL;
}

Test(emu_jit, concurrent_first_uses_compile_once_and_others_do_not_wait)
{
  const int delay_ms = 500;
  nvrtc_call_int("emu_nvrtc_set_delay_ms", delay_ms);
  racer r[6];
  pthread_t t[6];
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (int i = 0; i < 6; i++) {
    /* four want float16 <- float32; two want bfloat16 <- float32 */
    r[i] = (racer){.dt = i < 4 ? TPORT_FLOAT16 : TPORT_BFLOAT16, .st = TPORT_FLOAT32};
    cr_assert_eq(pthread_create(&t[i], NULL, race, &r[i]), 0);
  }
  for (int i = 0; i < 6; i++) {
    pthread_join(t[i], NULL);
    cr_expect(r[i].ok, "thread %d: %s", i, r[i].msg);
  }
  clock_gettime(CLOCK_MONOTONIC, &b);
  double ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) * 1e-6;
  cr_assert_eq(nvrtc_stats().compiles, 2, "one compile per kernel");
  cr_assert_eq(jit_stats().misses, 2);
  /* the two compiles overlap: one after the other would take 2 x delay_ms */
  cr_assert_lt(ms, 1.8 * delay_ms, "%.0f ms: the compiles did not overlap", ms);
}

/* ---- the emulated runtime and NVRTC refuse what the real ones refuse */

Test(emu_runtime, launches_are_checked_as_cuda_checks_them)
{
  void *bin = NULL;
  size_t n = 0;
  tport_err err = {0};
  cr_assert_eq(cuda_jit_compile_copy(TPORT_FLOAT32, TPORT_INT32, false, "sm_90", &bin, &n, &err), 0,
               "%s", err.msg);
  cudaLibrary_t lib;
  cr_assert_eq(cudaLibraryLoadData(&lib, bin, NULL, NULL, 0, NULL, NULL, 0), cudaSuccess);
  cudaKernel_t k;
  cr_assert_eq(cudaLibraryGetKernel(&k, lib, "tport_nothing"), cudaErrorSymbolNotFound);
  cr_assert_eq(cudaGetLastError(), cudaErrorSymbolNotFound);
  cr_assert_eq(cudaGetLastError(), cudaSuccess, "reading the error clears it");
  cr_assert_eq(cudaLibraryGetKernel(&k, lib, "tport_copy"), cudaSuccess);

  int32_t src[10] = {1, -2, 3, -4, 5, -6, 7, -8, 9, 2147483647};
  float dst[10] = {0};
  copy_params p = {.shape = {10},
                   .dst_stride = {4},
                   .src_stride = {4},
                   .numel = 10,
                   .dst = (char *)dst,
                   .src = (const char *)src,
                   .ndim = 1};
  void *args[] = {&p};
  const void *f = (const void *)k;
  cr_assert_eq(cudaLaunchKernel(f, (dim3){1, 1, 1}, (dim3){1025, 1, 1}, args, 0, NULL),
               cudaErrorInvalidConfiguration);
  cr_assert_eq(cudaLaunchKernel(f, (dim3){1, 1, 1}, (dim3){32, 32, 2}, args, 0, NULL),
               cudaErrorInvalidConfiguration);
  cr_assert_eq(cudaLaunchKernel(f, (dim3){1, 1, 1}, (dim3){1, 1, 65}, args, 0, NULL),
               cudaErrorInvalidConfiguration);
  cr_assert_eq(cudaLaunchKernel(f, (dim3){1, 65536, 1}, (dim3){32, 1, 1}, args, 0, NULL),
               cudaErrorInvalidConfiguration);
  cr_assert_eq(cudaLaunchKernel(f, (dim3){0, 1, 1}, (dim3){32, 1, 1}, args, 0, NULL),
               cudaErrorInvalidConfiguration);
  cr_assert_eq(cudaLaunchKernel(f, (dim3){1, 1, 1}, (dim3){32, 1, 1}, NULL, 0, NULL),
               cudaErrorInvalidValue);
  cr_assert_eq(cudaLaunchKernel(src, (dim3){1, 1, 1}, (dim3){32, 1, 1}, args, 0, NULL),
               cudaErrorInvalidDeviceFunction, "a pointer that is no kernel");
  cr_assert_eq(rt_stats().launches, 0, "nothing refused ran");
  cr_assert_eq(cudaLaunchKernel(f, (dim3){1, 1, 1}, (dim3){8, 1, 1}, args, 0, NULL), cudaSuccess);
  for (int i = 0; i < 10; i++)
    cr_assert_eq(dst[i], (float)src[i]);

  cr_assert_eq(cudaLibraryUnload(lib), cudaSuccess);
  cr_assert_eq(cudaLaunchKernel(f, (dim3){1, 1, 1}, (dim3){8, 1, 1}, args, 0, NULL),
               cudaErrorInvalidDeviceFunction, "a kernel of an unloaded library");
  cr_assert_eq(cudaLibraryUnload(lib), cudaErrorInvalidResourceHandle);

  /* the cubin's checks: damaged, for another architecture */
  ((unsigned char *)bin)[n - 1] ^= 1;
  cr_assert_eq(cudaLibraryLoadData(&lib, bin, NULL, NULL, 0, NULL, NULL, 0),
               cudaErrorInvalidKernelImage);
  free(bin);
  cr_assert_eq(cuda_jit_compile_copy(TPORT_FLOAT32, TPORT_INT32, false, "sm_100", &bin, &n, &err),
               0, "%s", err.msg);
  cr_assert_eq(cudaLibraryLoadData(&lib, bin, NULL, NULL, 0, NULL, NULL, 0),
               cudaErrorNoKernelImageForDevice);
  free(bin);
  cr_assert_eq(cuda_jit_compile_copy(TPORT_FLOAT32, TPORT_INT32, true, "sm_90a", &bin, &n, &err), 0,
               "%s", err.msg);
  cr_assert_eq(cudaLibraryLoadData(&lib, bin, NULL, NULL, 0, NULL, NULL, 0), cudaSuccess);
  cr_assert_eq(cudaLibraryUnload(lib), cudaSuccess);
  free(bin);
}

Test(emu_runtime, nvrtc_refuses_options_as_nvrtc_does)
{
  nvrtcResult (*create)(nvrtcProgram *, const char *, const char *, int, const char *const *,
                        const char *const *);
  nvrtcResult (*compile)(nvrtcProgram, int, const char *const *);
  nvrtcResult (*log_size)(nvrtcProgram, size_t *), (*get_log)(nvrtcProgram, char *);
  nvrtcResult (*destroy)(nvrtcProgram *);
  void *f = nvrtc_sym("nvrtcCreateProgram");
  memcpy(&create, &f, sizeof f);
  f = nvrtc_sym("nvrtcCompileProgram");
  memcpy(&compile, &f, sizeof f);
  f = nvrtc_sym("nvrtcGetProgramLogSize");
  memcpy(&log_size, &f, sizeof f);
  f = nvrtc_sym("nvrtcGetProgramLog");
  memcpy(&get_log, &f, sizeof f);
  f = nvrtc_sym("nvrtcDestroyProgram");
  memcpy(&destroy, &f, sizeof f);
  static const struct {
    const char *opts[5];
    nvrtcResult want;
    const char *log;
  } cases[] = {
      {{"-DTPORT_DST=8", "-DTPORT_SRC=6", "-DTPORT_IDX=unsigned int", "--bogus"},
       NVRTC_ERROR_INVALID_OPTION,
       "unrecognized option --bogus"},
      {{"-DTPORT_DST=8", "-DTPORT_SRC=6", "-DTPORT_IDX=unsigned int", "--fmad=maybe"},
       NVRTC_ERROR_INVALID_OPTION,
       "expects true or false"},
      {{"-DTPORT_DST=8", "-DTPORT_SRC=6", "-DTPORT_IDX=unsigned int", "--gpu-architecture=sm_70"},
       NVRTC_ERROR_INVALID_OPTION,
       "invalid value for --gpu-architecture"},
      {{"-DTPORT_DST=8", "-DTPORT_SRC=6", "--gpu-architecture=sm_90"},
       NVRTC_ERROR_COMPILATION,
       "\"TPORT_IDX\" is undefined"},
      {{"-DTPORT_DST=12", "-DTPORT_SRC=6", "-DTPORT_IDX=unsigned int"},
       NVRTC_ERROR_COMPILATION,
       "TPORT_DST is not a dtype"},
      {{"-DTPORT_SRC=6", "-DTPORT_IDX=unsigned int"},
       NVRTC_ERROR_COMPILATION,
       "TPORT_DST is not defined"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int n = 0;
    while (n < 5 && cases[i].opts[n])
      n++;
    nvrtcProgram prog;
    cr_assert_eq(create(&prog, "/* copy.cu */", "tport_copy.cu", 0, NULL, NULL), NVRTC_SUCCESS);
    cr_expect_eq(compile(prog, n, cases[i].opts), cases[i].want, "case %zu", i);
    size_t len = 0;
    log_size(prog, &len);
    char *log = calloc(1, len);
    get_log(prog, log);
    cr_expect(strstr(log, cases[i].log), "case %zu: log %s", i, log);
    free(log);
    destroy(&prog);
  }
}
