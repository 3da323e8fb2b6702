/*
 * chaos_client.c: one client of the chaos test (test_chaos.c).
 *
 * It exists to put tportd under many clients that do everything at once and
 * may die at any moment: for SECONDS it does random puts, gets, to()s,
 * copies, views, infos and frees on random shapes (rank 0..4, mostly small,
 * some up to 1 MiB so that transfers take many chunks), every dtype, and
 * the devices cpu, sim:0 and sim:1, and checks every value that comes back
 * against what it computed itself (an FNV-1a digest of the expected bytes
 * against one of the bytes got; the first differing element is printed).
 * The test SIGKILLs some of these processes at random moments; the others
 * must end with status 0.
 *
 * Exactness: each tensor remembers its origin, the dtype its values were
 * made in.  A conversion is done (by put, to or copy) only to a dtype that
 * holds every value of the origin exactly (int8 -> float16, float16 ->
 * complex64, float32 -> float64 ...), so the reference computed here is the
 * only right answer, and narrowing back to a dtype that still holds the
 * origin (a float64 tensor made from float32 values -> float32) is an exact
 * round trip.  Tensors made of raw bit patterns that may contain NaNs only
 * move between devices and layouts and into their own dtype: NaN payloads
 * are not specified through conversions.  The random numbers, the reference
 * conversions and the digest are chaos_values.c's.
 *
 * Deliberate leftovers, where the public API can express them: a get into a
 * buffer one byte too small (the server has begun the transfer and nobody
 * reads it), and with flag x, exiting in the middle of a multi-chunk put
 * (never committed) once every check has passed.  A put that is begun and
 * then abandoned by a live client cannot be expressed (tport_put commits or
 * aborts before it returns): the killer covers it.
 *
 *   tport-chaos-client URL ID SECONDS SEED TENANT FLAGS
 * FLAGS: "-" or letters: k = connect with keep (every tensor outlives the
 * connection), x = exit mid-upload at the end, s = TENANT is shared with
 * other clients (so it is not checked to be empty at the end).
 * Names are "c<ID>-<n>": unique per client, so that the test can tell whose
 * a leftover is.  Exit: 0 every check passed, 1 a check failed, 2 usage,
 * 3 cannot connect.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chaos_values.h"
#include "tport.h"

#define MAX_ENTRIES 10
#define MAX_ABANDONED_GETS 3 /* the server allows 16 gets in progress per connection */

static const char *const devices[] = {"cpu", "sim:0", "sim:1"};
static const char *const dtype_names[TPORT_NUM_DTYPES] = {
    "bool",    "uint8",    "int8",    "int16",   "int32",     "int64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128"};

/* ---------------------------------------------------------------- identity and failure */

static int client_id;
static uint64_t client_seed;
static long op_count;
static const char *op_name = "connect";

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...)
{
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "chaos-client %d (seed %" PRIu64 ", op %ld, %s): %s\n", client_id, client_seed,
          op_count, op_name, msg);
  exit(1);
}

/* CHAOS_TRACE=1: every operation on stderr, to follow a failing seed. */
static bool tracing;

static void trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void trace(const char *fmt, ...)
{
  if (!tracing)
    return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "chaos-client %d op %ld %s: ", client_id, op_count, op_name);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

/* ---------------------------------------------------------------- randomness (chaos_values.h) */

static const char *any_device(void)
{
  return devices[below(3)];
}

/* ---------------------------------------------------------------- shapes and layouts */

static int64_t numel_of(int nd, const int64_t *sizes)
{
  int64_t n = 1;
  for (int d = 0; d < nd; d++)
    n *= sizes[d];
  return n;
}

/* A random shape of rank 0..4: mostly a few KiB, some up to 256 KiB, a
 * tenth up to 1 MiB (16 chunks of the test's 64 KiB); now and then empty. */
static int random_shape(size_t es, int64_t *sizes)
{
  int nd = (int)below(5);
  int r = (int)below(100);
  int64_t max_bytes = r < 60 ? 4096 : r < 90 ? 256 << 10 : 1 << 20;
  int64_t left = 1 + below(max_bytes / (int64_t)es);
  for (int d = 0; d < nd; d++) {
    int64_t s = d == nd - 1 ? left : 1 + below(left < 16 ? left : 16);
    sizes[d] = s;
    left = left / s > 0 ? left / s : 1;
  }
  for (int d = nd - 1; d > 0; d--) { /* the big dimension anywhere */
    int k = (int)below(d + 1);
    int64_t t = sizes[d];
    sizes[d] = sizes[k];
    sizes[k] = t;
  }
  if (nd && chance(3))
    sizes[below(nd)] = 0;
  return nd;
}

/* Dense strides with the dimensions ordered by perm (outermost first). */
static void strides_for(int nd, const int64_t *sizes, const int *perm, int64_t *strides)
{
  int64_t s = 1;
  for (int k = nd - 1; k >= 0; k--) {
    strides[perm[k]] = s;
    s *= sizes[perm[k]] > 1 ? sizes[perm[k]] : 1;
  }
}

/* Contiguous, channels_last (rank 4) or any dense order: the layouts a put
 * may send its bytes in. */
static void random_layout(int nd, const int64_t *sizes, int64_t *strides, bool *contiguous)
{
  int perm[TPORT_MAX_DIMS];
  for (int d = 0; d < nd; d++)
    perm[d] = d;
  *contiguous = true;
  if (nd == 4 && chance(25)) {
    int cl[4] = {0, 2, 3, 1};
    memcpy(perm, cl, sizeof cl);
    *contiguous = false;
  } else if (nd > 1 && chance(25)) {
    for (int d = nd - 1; d > 0; d--) {
      int k = (int)below(d + 1), t = perm[d];
      perm[d] = perm[k];
      perm[k] = t;
    }
    *contiguous = false;
  }
  strides_for(nd, sizes, perm, strides);
}

/* Walks every index of sizes in C order: element k of the walk is at
 * offset + sum(i[d] * strides[d]).  to_logical: copy from there into dst[k];
 * else from src[k] to there (a scatter into a storage). */
static void walk(const uint8_t *src, uint8_t *dst, size_t es, int nd, const int64_t *sizes,
                 const int64_t *strides, int64_t offset, bool to_logical)
{
  int64_t n = numel_of(nd, sizes), idx[TPORT_MAX_DIMS] = {0};
  for (int64_t k = 0; k < n; k++) {
    int64_t at = offset;
    for (int d = 0; d < nd; d++)
      at += idx[d] * strides[d];
    if (to_logical)
      memcpy(dst + k * (int64_t)es, src + at * (int64_t)es, es);
    else
      memcpy(dst + at * (int64_t)es, src + k * (int64_t)es, es);
    for (int d = nd - 1; d >= 0; d--) {
      if (++idx[d] < sizes[d])
        break;
      idx[d] = 0;
    }
  }
}

/* ---------------------------------------------------------------- the tensors this client holds */

typedef struct entry {
  tport_ref ref;
  char name[32]; /* "" when unnamed */
  tport_dtype dtype;
  tport_dtype origin; /* every value is one of this dtype's, exactly */
  bool nan;           /* raw float bits: only same-dtype moves */
  bool managed; /* its storage moves where it is used (to(), get): its device is not checked */
  int ndim;
  int64_t sizes[TPORT_MAX_DIMS], strides[TPORT_MAX_DIMS], offset;
  char device[32];
  uint8_t *want; /* values in logical C order */
  size_t nbytes;
  uint64_t digest;
} entry;

static entry table[MAX_ENTRIES];
static int nentries;
static int name_seq;
static int abandoned_gets;

static const char *describe(const entry *e)
{
  static char buf[512];
  int n = snprintf(buf, sizeof buf, "%s%s%s %s (origin %s%s) sizes [", e->name[0] ? "'" : "",
                   e->name, e->name[0] ? "'" : "", dtype_names[e->dtype], dtype_names[e->origin],
                   e->nan ? ", raw bits" : "");
  for (int d = 0; d < e->ndim; d++)
    n += snprintf(buf + n, sizeof buf - (size_t)n, "%s%" PRId64, d ? "," : "", e->sizes[d]);
  n += snprintf(buf + n, sizeof buf - (size_t)n, "] strides [");
  for (int d = 0; d < e->ndim; d++)
    n += snprintf(buf + n, sizeof buf - (size_t)n, "%s%" PRId64, d ? "," : "", e->strides[d]);
  snprintf(buf + n, sizeof buf - (size_t)n, "] offset %" PRId64 " on %s%s, %zu bytes", e->offset,
           e->managed ? "(managed) " : "", e->device, e->nbytes);
  return buf;
}

static entry *pick(void)
{
  return nentries ? &table[below(nentries)] : NULL;
}

/* Fills e's description from the server's answer, checking what must hold. */
static void take_info(entry *e, const tport_tensor_info *in, tport_dtype dtype, int nd,
                      const int64_t *sizes, const char *device)
{
  e->ref = in->ref;
  e->dtype = dtype;
  e->ndim = nd;
  memcpy(e->sizes, sizes, (size_t)nd * sizeof *sizes);
  memcpy(e->strides, in->strides, sizeof e->strides);
  e->offset = in->storage_offset;
  snprintf(e->device, sizeof e->device, "%s", in->device);
  e->nbytes = (size_t)numel_of(nd, sizes) * tport_dtype_size(dtype);
  e->managed = in->managed;
  if (e->managed)
    device = NULL;
  if (in->dtype != dtype || in->ndim != nd || memcmp(in->sizes, sizes, (size_t)nd * 8) ||
      (device && strcmp(in->device, device))) {
    char got[160];
    int n = snprintf(got, sizeof got, "%s on %s, sizes [", dtype_names[in->dtype], in->device);
    for (int d = 0; d < in->ndim && d < TPORT_MAX_DIMS; d++)
      n += snprintf(got + n, sizeof got - (size_t)n, "%s%" PRId64, d ? "," : "", in->sizes[d]);
    fail("expected %s on %s; the server describes it as %s]", describe(e), device ? device : "?",
         got);
  }
}

static void set_want(entry *e, uint8_t *want)
{
  e->want = want;
  e->digest = fnv1a(want, e->nbytes);
  trace("made %02x%02x.. %s", e->ref.handle[0], e->ref.handle[1], describe(e));
}

static void drop(entry *e)
{
  free(e->want);
  *e = table[--nentries];
}

static tport_ref by_name_sometimes(const entry *e)
{
  tport_ref r = e->ref;
  if (e->name[0] && chance(40))
    tport_ref_name(&r, e->name); /* the same tensor, found by its name */
  return r;
}

static const char *next_name(char *buf, size_t len, int percent)
{
  if (!chance(percent))
    return NULL;
  snprintf(buf, len, "c%d-%d", client_id, name_seq++);
  return buf;
}

/* Gets e and compares every byte with what it must hold. */
static void check(tport_client *c, const entry *e)
{
  uint8_t *got = malloc(e->nbytes ? e->nbytes : 1);
  tport_tensor_info info;
  tport_err err;
  tport_ref ref = by_name_sometimes(e);
  int rc = tport_get(c, &ref, got, e->nbytes, &info, NULL, NULL, &err);
  if (rc)
    fail("get %s: %s: %s", describe(e), tport_strerror(rc), err.msg);
  if (info.dtype != e->dtype || info.ndim != e->ndim ||
      memcmp(info.sizes, e->sizes, (size_t)e->ndim * 8))
    fail("get %s: the server describes it as %s rank %d", describe(e), dtype_names[info.dtype],
         info.ndim);
  if (fnv1a(got, e->nbytes) != e->digest) {
    size_t es = tport_dtype_size(e->dtype), k = 0;
    while (k < e->nbytes && memcmp(got + k, e->want + k, es) == 0)
      k += es;
    char w[40] = "", g[40] = "";
    for (size_t b = 0; b < es && k + b < e->nbytes; b++) {
      snprintf(w + 2 * b, 3, "%02x", e->want[k + es - 1 - b]); /* as a little-endian number */
      snprintf(g + 2 * b, 3, "%02x", got[k + es - 1 - b]);
    }
    fail("get %s: element %zu is 0x%s, expected 0x%s (digests differ)", describe(e), k / es, g, w);
  }
  free(got);
}

static void free_entry(tport_client *c, entry *e)
{
  tport_err err;
  tport_ref ref = by_name_sometimes(e);
  trace("free %02x%02x.. %s", e->ref.handle[0], e->ref.handle[1], describe(e));
  int rc = tport_free(c, &ref, &err);
  if (rc)
    fail("free %s: %s: %s", describe(e), tport_strerror(rc), err.msg);
  drop(e);
}

static void make_room(tport_client *c)
{
  if (nentries == MAX_ENTRIES)
    free_entry(c, pick());
}

/* ---------------------------------------------------------------- operations */

static void op_put(tport_client *c)
{
  make_room(c);
  entry *e = &table[nentries];
  memset(e, 0, sizeof *e);
  tport_dtype s = (tport_dtype)below(TPORT_NUM_DTYPES);
  size_t es = tport_dtype_size(s);
  int64_t sizes[TPORT_MAX_DIMS] = {0}, strides[TPORT_MAX_DIMS] = {0};
  int nd = random_shape(es, sizes);
  int64_t n = numel_of(nd, sizes);
  bool nan = s >= TPORT_FLOAT16 && chance(10), contiguous;
  uint8_t *values = malloc((size_t)n * es + 1), *data = values;
  random_values(s, values, n, nan);
  random_layout(nd, sizes, strides, &contiguous);
  if (!contiguous) {
    data = malloc((size_t)n * es + 1);
    walk(values, data, es, nd, sizes, strides, 0, false);
  }
  tport_put_options po;
  tport_put_options_init(&po);
  po.device = any_device();
  po.non_blocking = chance(50);
  po.name = next_name(e->name, sizeof e->name, 25);
  po.managed = strcmp(po.device, "cpu") != 0 && chance(10);
  tport_dtype d = s;
  if (!nan && chance(25)) {
    d = exact_target(s, s, n);
    po.has_dtype = true;
    po.dtype = d;
  }
  if (nd == 4 && chance(20))
    po.memory_format = chance(50) ? TPORT_MF_CHANNELS_LAST : TPORT_MF_CONTIGUOUS;
  tport_tensor_info info;
  tport_err err;
  int rc = tport_put(c, s, nd, sizes, contiguous ? NULL : strides, data, (size_t)n * es, &po, &info,
                     &err);
  e->dtype = d, e->origin = s, e->nan = nan, e->ndim = nd, e->nbytes = (size_t)n * es;
  memcpy(e->sizes, sizes, sizeof sizes);
  memcpy(e->strides, strides, sizeof strides);
  if (rc)
    fail("put %s as %s to %s: %s: %s", describe(e), dtype_names[d], po.device, tport_strerror(rc),
         err.msg);
  nentries++;
  take_info(e, &info, d, nd, sizes, po.device);
  uint8_t *want = malloc(e->nbytes + 1);
  convert(values, s, want, d, n);
  set_want(e, want);
  if (data != values)
    free(data);
  free(values);
  if (chance(60))
    check(c, e);
}

static void op_to(tport_client *c)
{
  entry *s = pick();
  if (!s)
    return;
  make_room(c);
  s = &table[below(nentries)]; /* make_room may have moved it */
  tport_to_options o = {0};
  char name[32] = "";
  o.device = chance(70) ? any_device() : NULL;
  tport_dtype d = s->dtype;
  if (!s->nan && chance(50)) {
    d = exact_target(s->origin, s->dtype, numel_of(s->ndim, s->sizes));
    o.has_dtype = true;
    o.dtype = d;
  }
  if (s->ndim == 4 && chance(30)) {
    o.has_memory_format = true;
    o.memory_format = chance(50) ? TPORT_MF_CHANNELS_LAST : TPORT_MF_CONTIGUOUS;
  } else if (chance(10)) {
    o.has_memory_format = true;
    o.memory_format = TPORT_MF_PRESERVE;
  }
  o.copy = chance(15);
  o.non_blocking = chance(50);
  o.name = next_name(name, sizeof name, 20);
  tport_tensor_info info;
  bool alias;
  tport_err err;
  tport_ref src = by_name_sometimes(s);
  trace("to(%02x%02x.. %s, device %s, dtype %s, format %d, copy %d)", s->ref.handle[0],
        s->ref.handle[1], src.handle[0] || src.handle[1] ? "by handle" : src.name,
        o.device ? o.device : "-", o.has_dtype ? dtype_names[d] : "-",
        o.has_memory_format ? (int)o.memory_format : -1, o.copy);
  int rc = tport_to(c, &src, &o, &info, &alias, &err);
  if (rc)
    fail("to %s -> %s on %s: %s: %s", describe(s), dtype_names[d], o.device ? o.device : "same",
         tport_strerror(rc), err.msg);
  if (memcmp(info.ref.handle, s->ref.handle, TPORT_HANDLE_BYTES) == 0) {
    /* an alias without a new name is the same entry on the server */
    if (!alias || d != s->dtype)
      fail("to %s -> %s: the same handle came back but alias is %d", describe(s), dtype_names[d],
           alias);
    check(c, s);
    return;
  }
  entry *e = &table[nentries++];
  memset(e, 0, sizeof *e);
  snprintf(e->name, sizeof e->name, "%s", name);
  e->origin = s->origin;
  e->nan = s->nan;
  take_info(e, &info, d, s->ndim, s->sizes, o.device ? o.device : s->managed ? NULL : s->device);
  int64_t n = numel_of(s->ndim, s->sizes);
  uint8_t *want = malloc(e->nbytes + 1);
  convert(s->want, s->dtype, want, d, n);
  set_want(e, want);
  if (chance(70))
    check(c, e);
}

static void op_copy(tport_client *c)
{
  if (!pick())
    return;
  make_room(c);
  if (nentries == MAX_ENTRIES)
    return;
  entry *s = pick();
  entry *e = &table[nentries];
  memset(e, 0, sizeof *e);
  int64_t n = numel_of(s->ndim, s->sizes), strides[TPORT_MAX_DIMS];
  tport_dtype d = s->nan ? s->dtype : exact_target(s->origin, s->dtype, n);
  size_t es = tport_dtype_size(d);
  bool contiguous;
  random_layout(s->ndim, s->sizes, strides, &contiguous);
  /* the destination starts with other values, so that a copy that does not
   * write everything shows */
  uint8_t *junk = malloc((size_t)n * es + 1);
  random_values(d, junk, n, false);
  tport_put_options po;
  tport_put_options_init(&po);
  po.device = any_device();
  po.name = next_name(e->name, sizeof e->name, 15);
  tport_tensor_info info;
  tport_err err;
  int rc = tport_put(c, d, s->ndim, s->sizes, contiguous ? NULL : strides, junk, (size_t)n * es,
                     &po, &info, &err);
  free(junk);
  if (rc)
    fail("put a copy's destination for %s: %s: %s", describe(s), tport_strerror(rc), err.msg);
  nentries++;
  e->origin = s->origin;
  e->nan = s->nan;
  take_info(e, &info, d, s->ndim, s->sizes, po.device);
  bool non_blocking = chance(50);
  tport_ref dst = by_name_sometimes(e), src = by_name_sometimes(s);
  rc = tport_copy(c, &dst, &src, non_blocking, &err);
  if (rc)
    fail("copy %s into %s: %s: %s", describe(s), describe(e), tport_strerror(rc), err.msg);
  uint8_t *want = malloc(e->nbytes + 1);
  convert(s->want, s->dtype, want, d, n);
  set_want(e, want);
  if (chance(80))
    check(c, e);
}

/* A view of s made of a few of: a permutation, a narrowing, a step of 2, an
 * expansion of a size-1 dimension (stride 0).  Its expected values are
 * gathered from s's logical values the same way the view gathers from the
 * storage. */
static void op_view(tport_client *c)
{
  entry *s = pick();
  if (!s || s->ndim == 0)
    return;
  make_room(c);
  s = &table[below(nentries)];
  int nd = s->ndim;
  /* a view of an empty tensor may not move its offset (tensorport checks
   * the offset against the storage even where PyTorch does not) */
  if (nd == 0 || s->nbytes == 0)
    return;
  int64_t sizes[TPORT_MAX_DIMS], lstrides[TPORT_MAX_DIMS], sstrides[TPORT_MAX_DIMS];
  int64_t loff = 0, soff = s->offset, cs = 1, cstr[TPORT_MAX_DIMS];
  for (int d = nd - 1; d >= 0; d--) {
    cstr[d] = cs; /* s's logical values are C-contiguous */
    cs *= s->sizes[d];
  }
  for (int d = 0; d < nd; d++) {
    sizes[d] = s->sizes[d];
    lstrides[d] = cstr[d];
    sstrides[d] = s->strides[d];
  }
  for (int steps = 1 + (int)below(2); steps > 0; steps--) {
    int d = (int)below(nd);
    switch (below(4)) {
    case 0: { /* permute */
      int k = (int)below(nd);
      int64_t t;
      t = sizes[d], sizes[d] = sizes[k], sizes[k] = t;
      t = lstrides[d], lstrides[d] = lstrides[k], lstrides[k] = t;
      t = sstrides[d], sstrides[d] = sstrides[k], sstrides[k] = t;
      break;
    }
    case 1: { /* narrow */
      if (sizes[d] == 0)
        break;
      int64_t a = below(sizes[d]), len = below(sizes[d] - a + 1);
      loff += a * lstrides[d];
      soff += a * sstrides[d];
      sizes[d] = len;
      break;
    }
    case 2: /* every other element */
      sizes[d] = (sizes[d] + 1) / 2;
      lstrides[d] *= 2;
      sstrides[d] *= 2;
      break;
    case 3: /* expand */
      if (sizes[d] == 1) {
        sizes[d] = 1 + below(4);
        lstrides[d] = sstrides[d] = 0;
      }
      break;
    }
  }
  entry *e = &table[nentries];
  memset(e, 0, sizeof *e);
  const char *name = next_name(e->name, sizeof e->name, 15);
  tport_tensor_info info;
  tport_err err;
  tport_ref src = by_name_sometimes(s);
  int rc = tport_view(c, &src, nd, sizes, sstrides, soff, name, &info, &err);
  if (rc)
    fail("view of %s at offset %" PRId64 ": %s: %s", describe(s), soff, tport_strerror(rc),
         err.msg);
  nentries++;
  e->origin = s->origin;
  e->nan = s->nan;
  take_info(e, &info, s->dtype, nd, sizes, s->device);
  uint8_t *want = malloc(e->nbytes + 1);
  walk(s->want, want, tport_dtype_size(s->dtype), nd, sizes, lstrides, loff, true);
  set_want(e, want);
  if (chance(70))
    check(c, e);
}

static void op_info(tport_client *c)
{
  entry *e = pick();
  if (!e)
    return;
  tport_tensor_info info;
  tport_err err;
  tport_ref ref = by_name_sometimes(e);
  int rc = tport_info(c, &ref, &info, &err);
  if (rc)
    fail("info %s: %s: %s", describe(e), tport_strerror(rc), err.msg);
  if (info.dtype != e->dtype || info.ndim != e->ndim ||
      (!e->managed && strcmp(info.device, e->device)) ||
      memcmp(info.sizes, e->sizes, (size_t)e->ndim * 8) ||
      memcmp(info.strides, e->strides, (size_t)e->ndim * 8))
    fail("info %s: the server says %s rank %d on %s", describe(e), dtype_names[info.dtype],
         info.ndim, info.device);
}

/* A get into a buffer one byte too small: refused by the client after the
 * server began the transfer, which nobody reads. */
static void op_abandon_get(tport_client *c)
{
  entry *e = pick();
  if (!e || e->nbytes <= 64 << 10 || abandoned_gets >= MAX_ABANDONED_GETS)
    return;
  abandoned_gets++;
  uint8_t *buf = malloc(e->nbytes);
  tport_err err;
  int rc = tport_get(c, &e->ref, buf, e->nbytes - 1, NULL, NULL, NULL, &err);
  free(buf);
  if (rc != TPORT_OUT_OF_RANGE)
    fail("get %s into %zu bytes: %s (%s), expected OUT_OF_RANGE", describe(e), e->nbytes - 1,
         tport_strerror(rc), err.msg);
}

/* ---------------------------------------------------------------- the end */

static void die_midway(void *arg, uint64_t done, uint64_t total)
{
  (void)arg;
  if (done * 3 >= total)
    _exit(0); /* every check passed; the put in flight is never committed */
}

/* Frees everything, then requires the tenant to hold nothing of ours. */
static void finish(tport_client *c, bool shared)
{
  op_name = "finish";
  while (nentries)
    free_entry(c, &table[0]);
  tport_tensor_info *v;
  size_t n;
  tport_err err;
  int rc = tport_list(c, &v, &n, &err);
  if (rc)
    fail("list: %s: %s", tport_strerror(rc), err.msg);
  char prefix[32];
  snprintf(prefix, sizeof prefix, "c%d-", client_id);
  for (size_t i = 0; i < n; i++)
    if (!shared || strncmp(v[i].ref.name, prefix, strlen(prefix)) == 0)
      fail("everything was freed, yet the tenant lists '%s' (%s, %" PRId64 " bytes)", v[i].ref.name,
           v[i].device, v[i].nbytes);
  free(v);
}

static double now_s(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
  if (argc != 7) {
    fprintf(stderr, "usage: %s URL ID SECONDS SEED TENANT FLAGS\n", argv[0]);
    return 2;
  }
  client_id = atoi(argv[2]);
  double seconds = atof(argv[3]);
  client_seed = strtoull(argv[4], NULL, 10);
  tracing = getenv("CHAOS_TRACE") && atoi(getenv("CHAOS_TRACE"));
  rng = client_seed;
  const char *flags = argv[6];
  tport_connect_options co = {
      .tenant = argv[5], .timeout_ms = 60000, .keep = strchr(flags, 'k') != NULL};
  tport_client *c;
  tport_err err;
  if (tport_connect(argv[1], &co, &c, &err)) {
    fprintf(stderr, "chaos-client %d: connect %s: %s\n", client_id, argv[1], err.msg);
    return 3;
  }
  static const struct {
    const char *name;
    void (*fn)(tport_client *);
    int weight;
  } ops[] = {{"put", op_put, 26},   {"get", NULL, 20},
             {"to", op_to, 18},     {"copy", op_copy, 12},
             {"view", op_view, 10}, {"free", NULL, 8},
             {"info", op_info, 4},  {"abandon-get", op_abandon_get, 2}};
  double end = now_s() + seconds;
  while (now_s() < end) {
    int r = (int)below(100), k = 0;
    while (r >= ops[k].weight)
      r -= ops[k++].weight;
    op_count++;
    op_name = ops[k].name;
    if (ops[k].fn) {
      ops[k].fn(c);
    } else if (nentries) {
      entry *e = pick();
      if (strcmp(op_name, "get") == 0)
        check(c, e);
      else
        free_entry(c, e);
    }
  }
  finish(c, strchr(flags, 's') != NULL);
  if (strchr(flags, 'x')) {
    op_name = "exit mid-put";
    int64_t n = (512 << 10) + below(512 << 10);
    uint8_t *data = calloc((size_t)n, 1);
    tport_put_options po;
    tport_put_options_init(&po);
    po.device = any_device();
    po.progress = die_midway;
    int rc = tport_put(c, TPORT_UINT8, 1, &n, NULL, data, (size_t)n, &po, NULL, &err);
    fail("a put of %" PRId64 " bytes returned %s (%s) without its progress reaching a third", n,
         tport_strerror(rc), err.msg);
  }
  tport_close(c);
  return 0;
}
