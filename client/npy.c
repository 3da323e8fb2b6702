/* npy.c: .npy read and write (see npy.h). */
#include "npy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "os_error.h"

static const struct {
  const char *descr; /* without the byte-order character */
  tport_dtype dtype;
} npy_types[] = {
    {"b1", TPORT_BOOL},      {"u1", TPORT_UINT8},       {"i1", TPORT_INT8},
    {"i2", TPORT_INT16},     {"i4", TPORT_INT32},       {"i8", TPORT_INT64},
    {"f2", TPORT_FLOAT16},   {"f4", TPORT_FLOAT32},     {"f8", TPORT_FLOAT64},
    {"c8", TPORT_COMPLEX64}, {"c16", TPORT_COMPLEX128}, {"u2", TPORT_BFLOAT16},
};

void npy_free(npy_array *a)
{
  free(a->data);
  a->data = NULL;
}

/* The value of 'key' in the header dict, as text up to its end. */
static const char *dict_value(const char *h, const char *key)
{
  char pat[32];
  snprintf(pat, sizeof pat, "'%s'", key);
  const char *p = strstr(h, pat);
  if (!p)
    return NULL;
  p = strchr(p + strlen(pat), ':');
  if (!p)
    return NULL;
  p++;
  while (*p == ' ')
    p++;
  return p;
}

static void swap_bytes(uint8_t *p, size_t n, size_t width)
{
  for (size_t i = 0; i < n; i += width)
    for (size_t a = 0, b = width - 1; a < b; a++, b--) {
      uint8_t t = p[i + a];
      p[i + a] = p[i + b];
      p[i + b] = t;
    }
}

/* The header dict of an open .npy file (*out, malloc'd and NUL-terminated),
 * read after its magic and version. */
static int read_header(FILE *f, const char *path, char **out, tport_err *err)
{
  uint8_t pre[12];
  int rc = TPORT_OK;
  size_t hlen = 0;
  size_t got = fread(pre, 1, 10, f);
  if (got != 10 && ferror(f)) { /* a directory: EISDIR */
    rc = os_error(err, errno, "%s: cannot read", path);
  } else if (got != 10 || memcmp(pre, "\x93NUMPY", 6) != 0) {
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s: not a .npy file", path);
  } else if (pre[6] == 1) {
    hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
  } else if (pre[6] == 2 || pre[6] == 3) {
    if (fread(pre + 10, 1, 2, f) != 2)
      rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s: truncated header", path);
    hlen = (size_t)pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 | (size_t)pre[11] << 24;
  } else {
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s: .npy version %u is not supported", path,
                       pre[6]);
  }
  if (!rc && hlen > (1u << 20))
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s: header of %zu bytes", path, hlen);
  if (rc)
    return rc;
  char *header = calloc(1, hlen + 1);
  if (!header || fread(header, 1, hlen, f) != hlen) {
    free(header);
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s: truncated header", path);
  }
  *out = header;
  return TPORT_OK;
}

/* The dtype descr names ('<f4', '|b1', ...): *big_endian for '>'. */
static int parse_descr(const char *descr, const char *path, npy_array *out, bool *big_endian,
                       tport_err *err)
{
  char d[16] = {0};
  if (sscanf(descr, "'%15[^']'", d) != 1)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s: bad descr", path);
  const char *code = d;
  if (*code == '<' || *code == '|' || *code == '=')
    code++;
  else if (*code == '>')
    *big_endian = true, code++;
  for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++)
    if (strcmp(code, npy_types[i].descr) == 0) {
      out->dtype = npy_types[i].dtype;
      return TPORT_OK;
    }
  return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                       "%s: NumPy dtype '%s' has no tensorport equivalent", path, d);
}

/* The sizes of shape, a tuple of at most TPORT_MAX_DIMS non-negative
 * integers. */
static int parse_shape(const char *shape, const char *path, npy_array *out, tport_err *err)
{
  const char *p = strchr(shape, '(');
  if (!p)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s: bad shape", path);
  p++;
  while (*p && *p != ')') {
    while (*p == ' ' || *p == ',')
      p++;
    if (*p == ')')
      break;
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (end == p || v < 0 || errno == ERANGE || out->ndim == TPORT_MAX_DIMS)
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s: bad shape", path);
    out->sizes[out->ndim++] = v;
    p = end;
  }
  return TPORT_OK;
}

/* The bytes and strides of out's dtype and shape, overflow-checked. */
static int layout(npy_array *out, const char *path, tport_err *err)
{
  size_t es = tport_dtype_size(out->dtype);
  size_t numel = 1;
  for (int d = 0; d < out->ndim; d++) {
    if (out->sizes[d] && numel > SIZE_MAX / (size_t)out->sizes[d] / es)
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s: shape too large", path);
    numel *= (size_t)out->sizes[d];
  }
  out->nbytes = numel * es;
  /* C order: last dim fastest; Fortran order: first dim fastest (an
   * empty array's other dims may be huge: the strides are checked too) */
  int64_t s = 1;
  for (int i = 0; i < out->ndim; i++) {
    int d = out->fortran_order ? i : out->ndim - 1 - i;
    out->strides[d] = s;
    if (__builtin_mul_overflow(s, out->sizes[d] > 1 ? out->sizes[d] : 1, &s))
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s: shape too large", path);
  }
  return TPORT_OK;
}

/* What the header dict says: dtype, order, shape, and so the layout. */
static int parse_header(const char *header, const char *path, npy_array *out, bool *big_endian,
                        tport_err *err)
{
  const char *descr = dict_value(header, "descr");
  const char *fo = dict_value(header, "fortran_order");
  const char *shape = dict_value(header, "shape");
  if (!descr || !fo || !shape)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "%s: header lacks descr, fortran_order or shape", path);
  int rc = parse_descr(descr, path, out, big_endian, err);
  if (rc)
    return rc;
  out->fortran_order = strncmp(fo, "True", 4) == 0;
  if ((rc = parse_shape(shape, path, out, err)) != TPORT_OK)
    return rc;
  return layout(out, path, err);
}

int npy_read(const char *path, npy_array *out, tport_err *err)
{
  memset(out, 0, sizeof *out);
  FILE *f = fopen(path, "rb");
  if (!f)
    return os_error(err, errno, "%s: cannot open", path);
  char *header = NULL;
  bool big_endian = false;
  int rc = read_header(f, path, &header, err);
  if (!rc)
    rc = parse_header(header, path, out, &big_endian, err);
  free(header);
  /* the file must hold the bytes its header promises before any are allocated */
  struct stat stt;
  long here = rc ? 0 : ftell(f);
  if (!rc && (here < 0 || fstat(fileno(f), &stt) != 0 ||
              (S_ISREG(stt.st_mode) && (uint64_t)stt.st_size - (uint64_t)here < out->nbytes)))
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s: the data is shorter than its shape",
                       path);
  size_t es = tport_dtype_size(out->dtype);
  if (!rc) {
    out->data = malloc(out->nbytes ? out->nbytes : 1);
    if (!out->data)
      rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "%s: no memory for %zu bytes", path,
                         out->nbytes);
    else if (fread(out->data, 1, out->nbytes, f) != out->nbytes)
      rc = ferror(f) ? os_error(err, errno, "%s: cannot read", path)
                     : tport_err_set(err, TPORT_INVALID_ARGUMENT,
                                     "%s: the data is shorter than its shape", path);
    else if (big_endian && es > 1)
      swap_bytes(out->data, out->nbytes, tport_dtype_is_complex(out->dtype) ? es / 2 : es);
  }
  fclose(f);
  if (rc)
    npy_free(out);
  return rc;
}

int npy_write(const char *path, tport_dtype dtype, int ndim, const int64_t *sizes, const void *data,
              size_t nbytes, tport_err *err)
{
  const char *code = NULL;
  for (size_t i = 0; i < sizeof npy_types / sizeof npy_types[0]; i++)
    if (npy_types[i].dtype == dtype)
      code = npy_types[i].descr;
  if (!code)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "dtype %d cannot be written", dtype);
  char dict[512];
  int n = snprintf(dict, sizeof dict, "{'descr': '%c%s', 'fortran_order': False, 'shape': (",
                   tport_dtype_size(dtype) == 1 ? '|' : '<', code);
  for (int d = 0; d < ndim; d++)
    n += snprintf(dict + n, sizeof dict - (size_t)n,
                  ndim == 1 ? "%lld,"
                  : d       ? ", %lld"
                            : "%lld",
                  (long long)sizes[d]);
  n += snprintf(dict + n, sizeof dict - (size_t)n, "), }");
  /* pad with spaces so that the data starts at a multiple of 64, then '\n' */
  size_t total = 10 + (size_t)n + 1;
  size_t pad = (64 - total % 64) % 64;
  size_t hlen = (size_t)n + pad + 1;
  FILE *f = fopen(path, "wb");
  if (!f)
    return os_error(err, errno, "%s: cannot create", path);
  uint8_t pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (uint8_t)hlen, (uint8_t)(hlen >> 8)};
  bool ok = fwrite(pre, 1, 10, f) == 10 && fwrite(dict, 1, (size_t)n, f) == (size_t)n;
  for (size_t i = 0; ok && i < pad; i++)
    ok = fputc(' ', f) != EOF;
  ok = ok && fputc('\n', f) != EOF && fwrite(data, 1, nbytes, f) == nbytes;
  int e = ok ? 0 : errno; /* the first failure's reason: fclose may set another */
  if (fclose(f) != 0 && ok)
    ok = false, e = errno;
  return ok ? TPORT_OK : os_error(err, e ? e : EIO, "%s: cannot write", path);
}
