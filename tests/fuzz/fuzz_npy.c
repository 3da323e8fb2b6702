/*
 * fuzz_npy.c: the .npy reader of the tport tool (client/npy.c), which reads
 * files a user was handed by someone else.
 *
 * Input: the bytes of a .npy file.  npy_read takes a path, so the input is
 * written to a memfd, read back through /proc/self/fd/N (one memfd for the
 * whole run: no files left behind).  Every array it accepts is checked: a
 * known dtype, at most TPORT_MAX_DIMS dims, nbytes = numel * element size,
 * strides that are C or Fortran order, and every data byte readable (ASan
 * sees a short buffer).  Arrays in C order are then written with npy_write
 * and read back: the same dtype, sizes and bytes must come back.
 */
#define _GNU_SOURCE /* memfd_create */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz_target.h"
#include "npy.h"

static int in_fd = -1, out_fd = -1;
static char in_path[64], out_path[64];

static int open_memfd(const char *name, char *path, size_t len)
{
  int fd = memfd_create(name, 0);
  FUZZ_CHECK(fd >= 0, "memfd_create failed");
  snprintf(path, len, "/proc/self/fd/%d", fd);
  return fd;
}

static void set_contents(int fd, const uint8_t *data, size_t size)
{
  FUZZ_CHECK(ftruncate(fd, 0) == 0, "ftruncate failed");
  size_t done = 0;
  while (done < size) {
    ssize_t n = pwrite(fd, data + done, size - done, (off_t)done);
    FUZZ_CHECK(n > 0, "pwrite failed");
    done += (size_t)n;
  }
}

static void check_array(const npy_array *a)
{
  FUZZ_CHECK(a->ndim >= 0 && a->ndim <= TPORT_MAX_DIMS, "ndim %d", a->ndim);
  size_t es = tport_dtype_size(a->dtype);
  FUZZ_CHECK(es > 0, "dtype %d has no size", (int)a->dtype);
  unsigned __int128 numel = 1;
  for (int d = 0; d < a->ndim; d++) {
    FUZZ_CHECK(a->sizes[d] >= 0, "sizes[%d] is %lld", d, (long long)a->sizes[d]);
    numel *= (uint64_t)a->sizes[d];
    if (numel > ((unsigned __int128)1 << 64))
      numel = (unsigned __int128)1 << 64;
  }
  FUZZ_CHECK(numel * es == a->nbytes, "nbytes %zu for %llu elements of %zu bytes", a->nbytes,
             (unsigned long long)numel, es);
  /* C order: last dim fastest; Fortran order: first dim fastest (size-1 dims
   * count as 1, as npy.c and PyTorch both do) */
  int64_t s = 1;
  for (int i = 0; i < a->ndim; i++) {
    int d = a->fortran_order ? i : a->ndim - 1 - i;
    FUZZ_CHECK(a->strides[d] == s, "strides[%d] is %lld, expected %lld", d,
               (long long)a->strides[d], (long long)s);
    s *= a->sizes[d] > 1 ? a->sizes[d] : 1;
  }
  FUZZ_CHECK(a->data != NULL, "an accepted array without data");
  const volatile uint8_t *p = a->data;
  uint8_t sum = 0;
  for (size_t i = 0; i < a->nbytes; i++)
    sum ^= p[i];
  (void)sum;
}

/* npy_write of a C-order array, then npy_read: the same array comes back. */
static void round_trip(const npy_array *a)
{
  tport_err err;
  FUZZ_CHECK(ftruncate(out_fd, 0) == 0, "ftruncate failed");
  int rc = npy_write(out_path, a->dtype, a->ndim, a->sizes, a->data, a->nbytes, &err);
  FUZZ_CHECK(rc == TPORT_OK, "npy_write of an array npy_read accepted: %s", err.msg);
  npy_array b;
  rc = npy_read(out_path, &b, &err);
  FUZZ_CHECK(rc == TPORT_OK, "npy_read of what npy_write wrote: %s", err.msg);
  FUZZ_CHECK(b.dtype == a->dtype && b.ndim == a->ndim && !b.fortran_order && b.nbytes == a->nbytes,
             "the array changed on a round trip (dtype %d->%d, ndim %d->%d, nbytes %zu->%zu)",
             (int)a->dtype, (int)b.dtype, a->ndim, b.ndim, a->nbytes, b.nbytes);
  FUZZ_CHECK(memcmp(b.sizes, a->sizes, sizeof(int64_t) * (size_t)a->ndim) == 0,
             "sizes changed on a round trip");
  FUZZ_CHECK(memcmp(b.data, a->data, a->nbytes) == 0, "data changed on a round trip");
  npy_free(&b);
}

/* FUZZ_SKIP_KNOWN=1 (exploration only; `make fuzz` and the replays never
 * set it): inputs that hit a defect already reported and not fixed yet are
 * skipped, so that the fuzzer can look past them.  Delete each test once its
 * regression passes. */
static bool skip_known(const uint8_t *data, size_t size)
{
  static int on = -1;
  if (on < 0)
    on = getenv("FUZZ_SKIP_KNOWN") != NULL;
  if (!on)
    return false;
  char h[4096];
  size_t n = size < sizeof h - 1 ? size : sizeof h - 1;
  for (size_t i = 0; i < n; i++)
    h[i] = data[i] ? (char)data[i] : ' ';
  h[n] = 0;
  const char *p = strstr(h, "'shape'");
  p = p ? strchr(p, '(') : NULL;
  /* regressions/npy/stride-overflow-empty-array-huge-dim.npy: the strides
   * of an empty array with huge dims overflow (npy.c, C or Fortran order);
   * regressions/npy/huge-shape-allocated-before-reading.npy: the data's
   * buffer is allocated from the shape alone, before the file says it has
   * that many bytes */
  unsigned __int128 prod = 1, numel = 1;
  while (p && *p && *p != ')') {
    char *end;
    long long v = strtoll(p + 1, &end, 10);
    if (end == p + 1) {
      p++;
      continue;
    }
    prod *= (unsigned long long)(v > 1 ? v : 1);
    numel = v <= 0 ? 0 : numel * (unsigned long long)v;
    if (prod > INT64_MAX || numel > (1u << 26))
      return true;
    p = end;
  }
  return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (skip_known(data, size))
    return 0;
  if (in_fd < 0) {
    in_fd = open_memfd("fuzz_npy_in", in_path, sizeof in_path);
    out_fd = open_memfd("fuzz_npy_out", out_path, sizeof out_path);
  }
  set_contents(in_fd, data, size);
  npy_array a;
  tport_err err;
  int rc = npy_read(in_path, &a, &err);
  if (rc) {
    FUZZ_CHECK(err.code == rc && err.msg[0], "a rejection (%d) without its message", rc);
    FUZZ_CHECK(a.data == NULL, "a rejected array keeps its data");
    return 0;
  }
  check_array(&a);
  if (!a.fortran_order)
    round_trip(&a);
  npy_free(&a);
  return 0;
}
