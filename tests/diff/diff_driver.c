/*
 * diff_driver.c: the engine's half of the differential test against PyTorch
 * (diff_torch.py writes the cases and compares).
 *
 *   tport-diff-driver CASES DATA OUT_TXT OUT_BIN
 *
 *   tport-diff-driver --count-devices cuda     (prints the count; 77 when none)
 *
 * Each line of CASES is "key=value" fields: the source storage (dtype,
 * element count, byte offset into DATA), the view on it (sizes, strides,
 * offset, conj), the device the source lives on (cpu or sim:0/1), and the
 * operation (to / copy / contiguous) with its options.  For each case one line
 * goes to OUT_TXT ("id=K ok alias=.. strides=.. at=.. nbytes=.." or
 * "id=K err code=.. msg=..") and the result's bytes to OUT_BIN: the values
 * in logical C order for to/contiguous, the whole destination storage for copy.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "device.h"
#include "dtype.h"
#include "engine.h"

typedef struct kv {
  char key[16];
  char *val;
} kv;

static const char *get(kv *f, int n, const char *key)
{
  for (int i = 0; i < n; i++)
    if (strcmp(f[i].key, key) == 0)
      return f[i].val;
  return NULL;
}

static int parse_dims(const char *s, int64_t *out)
{
  if (!s || !*s || strcmp(s, "-") == 0)
    return 0;
  int n = 0;
  const char *p = s;
  while (*p && n < TPORT_MAX_DIMS) {
    out[n++] = strtoll(p, (char **)&p, 10);
    if (*p == ',')
      p++;
  }
  return n;
}

static void print_dims(FILE *o, int n, const int64_t *v)
{
  if (n == 0)
    fputc('-', o);
  for (int i = 0; i < n; i++)
    fprintf(o, i ? ",%lld" : "%lld", (long long)v[i]);
}

static tport_device parse_dev(const char *s)
{
  tport_device d = {TPORT_DEV_CPU, 0};
  if (s && strcmp(s, "-") != 0)
    device_parse(s, "device", &d, NULL);
  return d;
}

/* A storage of n elements on dev holding bytes from data, as a 1-D tensor. */
static int make_storage(tport_device dev, tport_dtype dt, int64_t n, const char *bytes,
                        tport_tensor **out, tport_err *err)
{
  int rc = tensor_empty(dev, dt, 1, &n, TPORT_MF_CONTIGUOUS, 0, out, err);
  if (!rc && bytes)
    rc = tensor_write(*out, bytes, (size_t)n * tport_dtype_size(dt), err);
  return rc;
}

static void emit_error(FILE *o, const char *id, const tport_err *e)
{
  fprintf(o, "id=%s err code=%d msg=", id, e->code);
  for (const char *c = e->msg; *c; c++)
    fputc(*c == '\n' ? ' ' : *c, o);
  fputc('\n', o);
}

int main(int argc, char **argv)
{
  if (argc == 3 && strcmp(argv[1], "--count-devices") == 0) {
    /* for the GPU run: how many devices of a type there are (77: none, skip) */
    tport_device d;
    if (device_parse(argv[2], "type", &d, NULL))
      return 2;
    const backend_ops *be = backend_get(d.type);
    int n = be->device_count();
    if (n == 0) {
      fprintf(stderr, "no %s device: %s\n", be->name, be->unavailable_reason());
      return 77;
    }
    printf("%d\n", n);
    return 0;
  }
  if (argc != 5) {
    fprintf(stderr, "usage: %s CASES DATA OUT_TXT OUT_BIN\n", argv[0]);
    return 2;
  }
  sim_config cfg = {.ndevices = 2, .mem_bytes = (size_t)1 << 30, .max_delay_us = 0};
  tport_err err;
  if (sim_configure(&cfg, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  FILE *cases = fopen(argv[1], "r"), *data = fopen(argv[2], "rb");
  FILE *otxt = fopen(argv[3], "w"), *obin = fopen(argv[4], "wb");
  if (!cases || !data || !otxt || !obin) {
    perror("open");
    return 1;
  }
  fseek(data, 0, SEEK_END);
  long dlen = ftell(data);
  fseek(data, 0, SEEK_SET);
  char *blob = malloc((size_t)dlen + 1);
  if (fread(blob, 1, (size_t)dlen, data) != (size_t)dlen) {
    perror("read");
    return 1;
  }
  long at = 0;
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, cases) > 0) {
    kv f[40];
    int nf = 0;
    for (char *tok = strtok(line, " \n"); tok && nf < 40; tok = strtok(NULL, " \n")) {
      char *eq = strchr(tok, '=');
      if (!eq)
        continue;
      *eq = 0;
      snprintf(f[nf].key, sizeof f[nf].key, "%s", tok);
      f[nf++].val = eq + 1;
    }
    const char *id = get(f, nf, "id"), *op = get(f, nf, "op");
    tport_dtype sdt;
    dtype_parse(get(f, nf, "sdt"), "sdt", &sdt, NULL);
    int64_t n = atoll(get(f, nf, "n"));
    long doff = atol(get(f, nf, "doff"));
    int64_t sizes[16], strides[16];
    int nd = parse_dims(get(f, nf, "sizes"), sizes);
    parse_dims(get(f, nf, "strides"), strides);
    int64_t off = atoll(get(f, nf, "off"));
    tport_device sdev = parse_dev(get(f, nf, "sdev"));
    bool nb = get(f, nf, "nb") && atoi(get(f, nf, "nb"));

    tport_tensor *base = NULL, *view = NULL, *cview = NULL, *res = NULL, *dbase = NULL,
                 *dview = NULL;
    int rc = make_storage(sdev, sdt, n, blob + doff, &base, &err);
    if (!rc)
      rc = tensor_as_strided(base, nd, sizes, strides, off, &view, &err);
    if (!rc && get(f, nf, "conj") && atoi(get(f, nf, "conj")))
      rc = tensor_conj_view(view, &cview, &err);
    tport_tensor *src = cview ? cview : view;
    bool alias = false;
    if (!rc && strcmp(op, "to") == 0) {
      to_options o = {.copy = atoi(get(f, nf, "copy")) != 0, .non_blocking = nb};
      const char *s;
      if ((s = get(f, nf, "dtype")) && strcmp(s, "-") != 0) {
        o.has_dtype = true;
        dtype_parse(s, "dtype", &o.dtype, NULL);
      }
      if ((s = get(f, nf, "fmt")) && strcmp(s, "-") != 0) {
        o.has_format = true;
        memory_format_parse(s, "fmt", &o.format, NULL);
      }
      if ((s = get(f, nf, "dev")) && strcmp(s, "-") != 0) {
        o.has_device = true;
        o.device = parse_dev(s);
      }
      rc = tensor_to(src, &o, &res, &alias, &err);
    } else if (!rc && strcmp(op, "contiguous") == 0) {
      tport_memory_format fmt;
      memory_format_parse(get(f, nf, "fmt"), "fmt", &fmt, NULL);
      rc = tensor_contiguous(src, fmt, &res, &alias, &err);
    } else if (!rc && strcmp(op, "copy") == 0) {
      tport_dtype ddt;
      dtype_parse(get(f, nf, "ddt"), "ddt", &ddt, NULL);
      int64_t dn = atoll(get(f, nf, "dn")), dsz[16], dst[16];
      int dnd = parse_dims(get(f, nf, "dsizes"), dsz);
      parse_dims(get(f, nf, "dstrides"), dst);
      size_t dbytes = (size_t)dn * tport_dtype_size(ddt);
      char *zeros = calloc(1, dbytes + 1);
      rc = make_storage(parse_dev(get(f, nf, "ddev")), ddt, dn, zeros, &dbase, &err);
      free(zeros);
      if (!rc)
        rc = tensor_as_strided(dbase, dnd, dsz, dst, atoll(get(f, nf, "doffs")), &dview, &err);
      if (!rc)
        rc = tensor_copy_(dview, src, nb, &err);
      if (!rc)
        res = tensor_retain(dbase); /* report the whole destination storage */
    }
    if (rc) {
      emit_error(otxt, id, &err);
    } else {
      size_t nbytes = tensor_nbytes(res);
      char *buf = malloc(nbytes + 1);
      rc = tensor_read(res, buf, nbytes, &err);
      if (rc) {
        emit_error(otxt, id, &err);
      } else {
        char dv[32];
        fprintf(otxt, "id=%s ok alias=%d dtype=%s dev=%s sizes=", id, alias ? 1 : 0,
                dtype_name(res->dtype), device_format(tensor_device(res), dv, sizeof dv));
        print_dims(otxt, res->layout.ndim, res->layout.sizes);
        fprintf(otxt, " strides=");
        print_dims(otxt, res->layout.ndim, res->layout.strides);
        fprintf(otxt, " conj=%d at=%ld nbytes=%zu\n", res->conj, at, nbytes);
        fwrite(buf, 1, nbytes, obin);
        at += (long)nbytes;
      }
      free(buf);
    }
    tensor_release(res);
    tensor_release(dview);
    tensor_release(dbase);
    tensor_release(cview);
    tensor_release(view);
    tensor_release(base);
  }
  engine_synchronize_all();
  free(line);
  free(blob);
  fclose(cases);
  fclose(data);
  fclose(otxt);
  fclose(obin);
  return 0;
}
