/* emu_check.c: one copy on the emulated device against cpu_copy (emu_check.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emu_check.h"

static const char *const kernel_name[] = {"tport_copy", "tport_transpose", "tport_cast_vec",
                                          "(none)"};

const char *emu_last_kernel(void)
{
  static emu_cudart_stats st; /* a test is one thread */
  emu_cudart_get_stats(&st);
  return st.kernel;
}

unsigned long long emu_launch_count(void)
{
  emu_cudart_stats st;
  emu_cudart_get_stats(&st);
  return st.launches;
}

/* Elements from the base to one past the last element reached. */
static int64_t span(const emu_layout *l, const int64_t *stride, int64_t offset)
{
  int64_t s = offset + 1;
  for (int d = 0; d < l->ndim; d++) {
    if (l->shape[d] == 0)
      return offset + 1;
    s += (l->shape[d] - 1) * stride[d];
  }
  return s;
}

static void *alloc(size_t bytes)
{
  void *p = NULL;
  /* 64: aligned for cast_vec's widest vector (4 x complex128); exact size */
  return posix_memalign(&p, 64, bytes ? bytes : 1) ? NULL : p;
}

static void hex(char *out, size_t n, const unsigned char *b, size_t len)
{
  size_t w = 0;
  for (size_t i = len; i-- > 0 && w + 3 < n;) /* most significant byte first */
    w += (size_t)snprintf(out + w, n - w, "%02x", b[i]);
}

/* How a check launches: through cuda_jit_copy (lim NULL) or directly. */
typedef struct launcher {
  const cuda_jit_limits *lim;
  int bits;
  bool *wide;
} launcher;

/* The direct launch: as cuda_jit_copy would, with the variant asked for. */
static int launch_direct(const launcher *how, const plan *p, void *dst, tport_dtype dt,
                         const void *src, tport_dtype st, unsigned flags, tport_err *err)
{
  cuda_jit_launch L;
  if (cuda_jit_plan_launch(p, dt, dst, st, src, how->lim, &L))
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "cuda_jit_plan_launch refused the plan");
  if (how->wide)
    *how->wide = L.wide;
  if (L.kernel == CUDA_JIT_NONE)
    return TPORT_OK;
  const int bits = how->bits ? how->bits : L.wide ? 64 : how->lim->narrow_bits;
  const emu_kernel *k = emu_find_kernel(dt, st, bits, kernel_name[L.kernel]);
  if (!k)
    return tport_err_set(err, TPORT_UNIMPLEMENTED, "no %d-bit variant of %s %d <- %d built", bits,
                         kernel_name[L.kernel], dt, st);
  L.params.flags = flags;
  void *args[] = {&L.params};
  int e = emu_launch_direct(k, (emu_dim3){L.grid[0], L.grid[1], L.grid[2]},
                            (emu_dim3){L.block[0], L.block[1], L.block[2]}, args);
  return e ? tport_err_set(err, TPORT_INTERNAL, "emu_launch_direct: %d", e) : TPORT_OK;
}

static bool check(const emu_layout *l, tport_dtype dt, tport_dtype st, unsigned flags,
                  bool in_place, uint64_t seed, const launcher *how, char *msg, size_t n)
{
  const size_t ds = tport_dtype_size(dt), ss = tport_dtype_size(st);
  const size_t dbytes = (size_t)span(l, l->dst_stride, l->dst_offset) * ds;
  const size_t sbytes = (size_t)span(l, l->src_stride, l->src_offset) * ss;
  unsigned char *dcpu = alloc(dbytes), *demu = alloc(dbytes), *src = alloc(sbytes),
                *src0 = alloc(sbytes);
  bool ok = false;
  if (!dcpu || !demu || !src || !src0) {
    snprintf(msg, n, "out of memory");
    goto out;
  }
  emu_fill(src, sbytes / ss, st, seed);
  memcpy(src0, src, sbytes);
  emu_fill(dcpu, dbytes / ds, dt, ~seed); /* what the copy must leave alone stays */
  memcpy(demu, dcpu, dbytes);

  int64_t dstr[6], sstr[6];
  for (int d = 0; d < l->ndim; d++) {
    dstr[d] = l->dst_stride[d] * (int64_t)ds;
    sstr[d] = (in_place ? l->dst_stride[d] : l->src_stride[d]) * (int64_t)ss;
  }
  plan p;
  plan_build(&p, l->ndim, l->shape, 2, (const int64_t *const[]){dstr, sstr});
  unsigned char *dc = dcpu + l->dst_offset * (int64_t)ds, *de = demu + l->dst_offset * (int64_t)ds;
  const unsigned char *s = src + l->src_offset * (int64_t)ss;
  cpu_copy(&p, dc, dt, in_place ? dc : s, st, flags);

  const unsigned long long before = emu_launch_count();
  tport_err err = {0};
  int rc = how->lim ? launch_direct(how, &p, de, dt, in_place ? de : s, st, flags, &err)
                    : cuda_jit_copy(0, NULL, &p, de, dt, in_place ? de : s, st, flags, &err);
  const char *what = l->name;
  if (rc) {
    snprintf(msg, n, "%s, %s <- %s: the launch failed: %s (%s)", what, emu_dtype_name[dt],
             emu_dtype_name[st], err.msg, emu_cudart_last_message());
    goto out;
  }
  const int64_t numel = plan_numel(&p);
  const unsigned long long launched = emu_launch_count() - before;
  if (launched != (numel ? 1u : 0u)) {
    snprintf(msg, n, "%s, %s <- %s: %llu launches for %lld elements", what, emu_dtype_name[dt],
             emu_dtype_name[st], launched, (long long)numel);
    goto out;
  }
  if (numel && l->expect >= 0 && strcmp(emu_last_kernel(), kernel_name[l->expect])) {
    snprintf(msg, n, "%s, %s <- %s: ran %s, meant to reach %s", what, emu_dtype_name[dt],
             emu_dtype_name[st], emu_last_kernel(), kernel_name[l->expect]);
    goto out;
  }
  if (!in_place && memcmp(src, src0, sbytes)) {
    snprintf(msg, n, "%s, %s <- %s: the source changed", what, emu_dtype_name[dt],
             emu_dtype_name[st]);
    goto out;
  }
  for (size_t i = 0; i < dbytes; i++)
    if (dcpu[i] != demu[i]) {
      const size_t e = i / ds;
      char c[40], g[40], o[40];
      hex(c, sizeof c, dcpu + e * ds, ds);
      hex(g, sizeof g, demu + e * ds, ds);
      /* the source element, when the layout is 1-D (else the index says enough) */
      o[0] = 0;
      if (!in_place && l->ndim == 1 && l->dst_stride[0] && e >= (size_t)l->dst_offset &&
          (e - (size_t)l->dst_offset) % (size_t)l->dst_stride[0] == 0) {
        int64_t k = (int64_t)(e - (size_t)l->dst_offset) / l->dst_stride[0];
        hex(o, sizeof o, s + k * l->src_stride[0] * (int64_t)ss, ss);
      }
      snprintf(msg, n, "%s, %s <- %s, flags %u%s, %s: dst element %zu: cpu %s, emulated %s%s%s",
               what, emu_dtype_name[dt], emu_dtype_name[st], flags, in_place ? " in place" : "",
               emu_last_kernel(), e, c, g, o[0] ? ", source " : "", o);
      goto out;
    }
  ok = true;
out:
  free(dcpu);
  free(demu);
  free(src);
  free(src0);
  return ok;
}

bool emu_check_copy(const emu_layout *l, tport_dtype dt, tport_dtype st, unsigned flags,
                    bool in_place, uint64_t seed, char *msg, size_t n)
{
  const launcher how = {NULL, 0, NULL};
  return check(l, dt, st, flags, in_place, seed, &how, msg, n);
}

bool emu_check_direct(const emu_layout *l, tport_dtype dt, tport_dtype st, unsigned flags,
                      bool in_place, uint64_t seed, const cuda_jit_limits *lim, int bits,
                      bool *wide, char *msg, size_t n)
{
  const launcher how = {lim, bits, wide};
  return check(l, dt, st, flags, in_place, seed, &how, msg, n);
}
