/* test_metrics.c: tportd's operations endpoint (server/http.c, server/metrics.c)
 * over a real socket: every line of /metrics parsed against the text
 * exposition format 0.0.4, counters and histograms moving with real puts
 * and gets, /healthz and /readyz through startup and shutdown (503 during
 * the grace period), 404/405/413, a port taken, the flag and its variable. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <regex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "backend.h"
#include "log.h"
#include "server_internal.h"
#include "service_util.h"

/* ---------------------------------------------------------------- a small HTTP client */

typedef struct http_reply {
  int status; /* -1: no connection */
  char content_type[128];
  char allow[64];
  bool has_length;
  size_t length; /* Content-Length */
  char *body;    /* NUL-terminated (malloc'ed) */
  size_t body_len;
} http_reply;

static int connect_to(int family, int port)
{
  int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_storage ss = {0};
  socklen_t sl;
  if (family == AF_INET6) {
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
    a->sin6_family = AF_INET6;
    a->sin6_port = htons((uint16_t)port);
    a->sin6_addr = in6addr_loopback;
    sl = sizeof *a;
  } else {
    struct sockaddr_in *a = (struct sockaddr_in *)&ss;
    a->sin_family = AF_INET;
    a->sin_port = htons((uint16_t)port);
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sl = sizeof *a;
  }
  if (connect(fd, (struct sockaddr *)&ss, sl) != 0) {
    close(fd);
    return -1;
  }
  struct timeval tv = {.tv_sec = 10};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

static void header_value(const char *head, const char *name, char *out, size_t len)
{
  out[0] = 0;
  size_t n = strlen(name);
  for (const char *p = head; p && *p; p = strstr(p, "\r\n") ? strstr(p, "\r\n") + 2 : NULL) {
    if (strncasecmp(p, name, n) == 0 && p[n] == ':') {
      const char *v = p + n + 1;
      while (*v == ' ')
        v++;
      const char *e = strstr(v, "\r\n");
      size_t k = e ? (size_t)(e - v) : strlen(v);
      snprintf(out, len, "%.*s", (int)(k < len ? k : len - 1), v);
      return;
    }
  }
}

/* Sends `request` (a whole HTTP/1.1 request) and reads the reply to EOF. */
static http_reply http_raw(int family, int port, const char *request)
{
  http_reply r = {.status = -1};
  int fd = connect_to(family, port);
  if (fd < 0)
    return r;
  size_t n = strlen(request), off = 0;
  while (off < n) {
    ssize_t w = send(fd, request + off, n - off, MSG_NOSIGNAL);
    if (w <= 0)
      break;
    off += (size_t)w;
  }
  size_t cap = 1 << 16, len = 0;
  char *buf = malloc(cap);
  for (;;) {
    if (len + 4096 > cap)
      buf = realloc(buf, cap *= 2);
    ssize_t k = recv(fd, buf + len, cap - len - 1, 0);
    if (k <= 0)
      break;
    len += (size_t)k;
  }
  close(fd);
  buf[len] = 0;
  char *end = strstr(buf, "\r\n\r\n");
  if (!end || sscanf(buf, "HTTP/1.%*d %d", &r.status) != 1) {
    r.status = -2; /* connected, but no reply */
    free(buf);
    return r;
  }
  *end = 0;
  header_value(buf, "Content-Type", r.content_type, sizeof r.content_type);
  header_value(buf, "Allow", r.allow, sizeof r.allow);
  char cl[32];
  header_value(buf, "Content-Length", cl, sizeof cl);
  r.has_length = cl[0] != 0;
  r.length = (size_t)strtoull(cl, NULL, 10);
  r.body_len = len - (size_t)(end + 4 - buf);
  r.body = malloc(r.body_len + 1);
  memcpy(r.body, end + 4, r.body_len);
  r.body[r.body_len] = 0;
  free(buf);
  return r;
}

static http_reply http_do(int port, const char *method, const char *path)
{
  char req[512];
  snprintf(req, sizeof req, "%s %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
           method, path);
  return http_raw(AF_INET, port, req);
}

static int http_status(int port, const char *path)
{
  http_reply r = http_do(port, "GET", path);
  free(r.body);
  return r.status;
}

/* ---------------------------------------------------------------- the exposition grammar */

#define MAX_LABELS 8
typedef struct sample {
  char name[128];
  int nlabels;
  char key[MAX_LABELS][64];
  char val[MAX_LABELS][256]; /* unescaped */
  double value;
} sample;

typedef struct family {
  char name[160];
  char type[32];
  bool help;
  bool closed; /* another family's samples came after its own */
} family;

typedef struct expo {
  sample *s;
  size_t n;
  family f[256];
  size_t nf;
} expo;

static bool match(const char *re, const char *s)
{
  regex_t r;
  cr_assert_eq(regcomp(&r, re, REG_EXTENDED | REG_NOSUB), 0);
  bool ok = regexec(&r, s, 0, NULL, 0) == 0;
  regfree(&r);
  return ok;
}

static bool valid_utf8(const char *s, size_t n)
{
  for (size_t i = 0; i < n;) {
    size_t k = log_utf8_len((const unsigned char *)s + i, n - i);
    if (!k)
      return false;
    i += k;
  }
  return true;
}

static family *family_of(expo *e, const char *name)
{
  for (size_t i = 0; i < e->nf; i++)
    if (!strcmp(e->f[i].name, name))
      return &e->f[i];
  return NULL;
}

/* The family a sample belongs to: its name, or a histogram's without
 * _bucket, _sum, _count. */
static family *family_of_sample(expo *e, const char *name)
{
  family *f = family_of(e, name);
  if (f)
    return f;
  static const char *const suffix[] = {"_bucket", "_sum", "_count"};
  for (int i = 0; i < 3; i++) {
    size_t n = strlen(name), k = strlen(suffix[i]);
    if (n > k && !strcmp(name + n - k, suffix[i])) {
      char base[128];
      snprintf(base, sizeof base, "%.*s", (int)(n - k), name);
      f = family_of(e, base);
      if (f && !strcmp(f->type, "histogram"))
        return f;
    }
  }
  return NULL;
}

/* Parses one sample line (or fails the test, naming it). */
static void parse_sample(expo *e, const char *line, sample *s)
{
  const char *p = line;
  size_t n = strspn(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:");
  cr_assert(n > 0 && n < sizeof s->name, "no metric name: %s", line);
  snprintf(s->name, sizeof s->name, "%.*s", (int)n, p);
  cr_assert(match("^[a-zA-Z_:][a-zA-Z0-9_:]*$", s->name), "bad metric name: %s", line);
  p += n;
  s->nlabels = 0;
  if (*p == '{') {
    p++;
    while (*p != '}') {
      cr_assert(s->nlabels < MAX_LABELS, "too many labels: %s", line);
      size_t k = strspn(p, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_");
      cr_assert(k > 0 && k < 64 && p[k] == '=' && p[k + 1] == '"', "bad label: %s", line);
      char *key = s->key[s->nlabels], *val = s->val[s->nlabels];
      snprintf(key, 64, "%.*s", (int)k, p);
      cr_assert(match("^[a-zA-Z_][a-zA-Z0-9_]*$", key) && strncmp(key, "__", 2) != 0,
                "bad label name '%s': %s", key, line);
      for (int j = 0; j < s->nlabels; j++)
        cr_assert(strcmp(s->key[j], key), "label %s twice: %s", key, line);
      p += k + 2;
      size_t v = 0;
      while (*p != '"') {
        cr_assert(*p && *p != '\n', "unterminated label value: %s", line);
        char ch = *p++;
        if (ch == '\\') {
          ch = *p++;
          cr_assert(ch == '\\' || ch == '"' || ch == 'n', "bad escape \\%c: %s", ch, line);
          if (ch == 'n')
            ch = '\n';
        }
        cr_assert(v + 1 < 256, "label value too long: %s", line);
        val[v++] = ch;
      }
      val[v] = 0;
      p++;
      s->nlabels++;
      if (*p == ',')
        p++;
      else
        cr_assert(*p == '}', "expected , or }: %s", line);
    }
    p++;
  }
  cr_assert(*p == ' ' || *p == '\t', "no value: %s", line);
  while (*p == ' ' || *p == '\t')
    p++;
  char tok[64];
  size_t k = strcspn(p, " \t");
  cr_assert(k > 0 && k < sizeof tok, "bad value: %s", line);
  snprintf(tok, sizeof tok, "%.*s", (int)k, p);
  cr_assert(match("^([+-]?(([0-9]+(\\.[0-9]*)?|\\.[0-9]+)([eE][+-]?[0-9]+)?|Inf)|NaN)$", tok),
            "bad value '%s': %s", tok, line);
  s->value = strtod(tok, NULL);
  p += k;
  while (*p == ' ' || *p == '\t')
    p++;
  if (*p) /* an optional timestamp: an integer */
    cr_assert(match("^-?[0-9]+$", p), "bad timestamp: %s", line);
  (void)e;
}

static const char *label(const sample *s, const char *key)
{
  for (int i = 0; i < s->nlabels; i++)
    if (!strcmp(s->key[i], key))
      return s->val[i];
  return NULL;
}

/* Labels but le, as one string: the series of a histogram. */
static void series_key(const sample *s, char *out, size_t len)
{
  out[0] = 0;
  for (int i = 0; i < s->nlabels; i++)
    if (strcmp(s->key[i], "le")) {
      size_t n = strlen(out);
      snprintf(out + n, len - n, "%s=%s\x1f", s->key[i], s->val[i]);
    }
}

/* Every histogram: per series, buckets in increasing le with cumulative
 * counts, a +Inf bucket equal to _count, and a _sum. */
static void check_histograms(expo *e)
{
  for (size_t fi = 0; fi < e->nf; fi++) {
    family *f = &e->f[fi];
    if (strcmp(f->type, "histogram"))
      continue;
    char bname[192], cname[192], sname[192];
    snprintf(bname, sizeof bname, "%s_bucket", f->name);
    snprintf(cname, sizeof cname, "%s_count", f->name);
    snprintf(sname, sizeof sname, "%s_sum", f->name);
    for (size_t i = 0; i < e->n; i++) {
      if (strcmp(e->s[i].name, cname))
        continue;
      char key[1024];
      series_key(&e->s[i], key, sizeof key);
      double prev_le = -INFINITY, prev = 0, inf = -1;
      int buckets = 0;
      bool sum = false;
      for (size_t j = 0; j < e->n; j++) {
        char k2[1024];
        series_key(&e->s[j], k2, sizeof k2);
        if (strcmp(k2, key))
          continue;
        if (!strcmp(e->s[j].name, sname))
          sum = true;
        if (strcmp(e->s[j].name, bname))
          continue;
        const char *le = label(&e->s[j], "le");
        cr_assert(le, "%s without le", bname);
        double lv = strtod(le, NULL);
        cr_assert_gt(lv, prev_le, "%s: le %s out of order", bname, le);
        cr_assert_geq(e->s[j].value, prev, "%s{%s le=%s}: buckets not cumulative", bname, key, le);
        prev_le = lv;
        prev = e->s[j].value;
        buckets++;
        if (isinf(lv))
          inf = e->s[j].value;
      }
      cr_assert_gt(buckets, 1, "%s{%s}: buckets", bname, key);
      cr_assert_eq(inf, e->s[i].value, "%s{%s}: +Inf bucket %g, _count %g", f->name, key, inf,
                   e->s[i].value);
      cr_assert(sum, "%s{%s}: no _sum", f->name, key);
    }
  }
}

/* Parses a whole exposition; every line must be valid. */
static void parse(const char *text, size_t len, expo *e)
{
  memset(e, 0, sizeof *e);
  cr_assert(len > 0 && text[len - 1] == '\n', "the text ends with a line feed");
  cr_assert(valid_utf8(text, len), "the text is UTF-8");
  cr_assert_eq(strlen(text), len, "no NUL in the text");
  size_t cap = 1024;
  e->s = calloc(cap, sizeof *e->s);
  family *current = NULL;
  for (const char *p = text; *p;) {
    const char *nl = strchr(p, '\n');
    char line[2048];
    cr_assert(nl && (size_t)(nl - p) < sizeof line, "line too long");
    snprintf(line, sizeof line, "%.*s", (int)(nl - p), p);
    p = nl + 1;
    if (!line[0])
      continue;
    if (line[0] == '#') {
      char name[160], rest[1024];
      if (sscanf(line, "# HELP %159s %1023[^\n]", name, rest) >= 1 &&
          !strncmp(line, "# HELP ", 7)) {
        cr_assert(match("^[a-zA-Z_:][a-zA-Z0-9_:]*$", name), "bad HELP name: %s", line);
        for (const char *q = strchr(line + 7, ' '); q && *q; q++)
          if (*q == '\\') {
            cr_assert(q[1] == '\\' || q[1] == 'n', "bad escape in HELP: %s", line);
            q++;
          }
        family *f = family_of(e, name);
        if (!f) {
          cr_assert_lt(e->nf, 256);
          f = &e->f[e->nf++];
          snprintf(f->name, sizeof f->name, "%s", name);
        }
        cr_assert(!f->help, "HELP twice for %s", name);
        f->help = true;
      } else if (!strncmp(line, "# TYPE ", 7)) {
        char type[32];
        cr_assert_eq(sscanf(line, "# TYPE %159s %31s", name, type), 2, "bad TYPE: %s", line);
        cr_assert(match("^(counter|gauge|histogram|summary|untyped)$", type), "bad type: %s", line);
        family *f = family_of(e, name);
        if (!f) {
          cr_assert_lt(e->nf, 256);
          f = &e->f[e->nf++];
          snprintf(f->name, sizeof f->name, "%s", name);
        }
        cr_assert(!f->type[0], "TYPE twice for %s", name);
        for (size_t i = 0; i < e->n; i++)
          cr_assert(family_of_sample(e, e->s[i].name) != f, "TYPE of %s after its samples", name);
        snprintf(f->type, sizeof f->type, "%s", type);
        /* our own rules: counters end in _total; units are base units */
        if (!strcmp(type, "counter"))
          cr_assert(strlen(name) > 6 && !strcmp(name + strlen(name) - 6, "_total"),
                    "counter %s does not end in _total", name);
        cr_assert(!strstr(name, "_ms") && !strstr(name, "milli") && !strstr(name, "_kb"),
                  "%s: base units", name);
        cr_assert(!strncmp(name, "tport_", 6), "%s: the tport_ prefix", name);
      }
      continue; /* other comments are allowed */
    }
    if (e->n == cap)
      e->s = realloc(e->s, (cap *= 2) * sizeof *e->s);
    sample *s = &e->s[e->n];
    parse_sample(e, line, s);
    family *f = family_of_sample(e, s->name);
    cr_assert(f && f->type[0], "sample of %s without a TYPE line before it", s->name);
    cr_assert(!f->closed, "the samples of %s are not together", f->name);
    if (current && current != f)
      current->closed = true;
    current = f;
    if (!strcmp(f->type, "histogram"))
      cr_assert(strcmp(s->name, f->name), "a histogram's sample without suffix: %s", line);
    size_t namelen = strlen(s->name);
    if (namelen > 7 && !strcmp(s->name + namelen - 7, "_bucket"))
      cr_assert(label(s, "le"), "a bucket without le: %s", line);
    for (size_t i = 0; i < e->n; i++) { /* no series twice */
      if (strcmp(e->s[i].name, s->name) || e->s[i].nlabels != s->nlabels)
        continue;
      bool same = true;
      for (int j = 0; j < s->nlabels && same; j++)
        same = label(&e->s[i], s->key[j]) && !strcmp(label(&e->s[i], s->key[j]), s->val[j]);
      cr_assert(!same, "a series twice: %s", line);
    }
    e->n++;
  }
  check_histograms(e);
}

static void expo_free(expo *e)
{
  free(e->s);
  e->s = NULL;
}

/* The value of the series name{k=v,...} (exactly those labels); NAN when absent. */
static double value_of(const expo *e, const char *name, ...)
{
  const char *k[MAX_LABELS], *v[MAX_LABELS];
  int n = 0;
  va_list ap;
  va_start(ap, name);
  for (const char *key; (key = va_arg(ap, const char *)) && n < MAX_LABELS; n++) {
    k[n] = key;
    v[n] = va_arg(ap, const char *);
  }
  va_end(ap);
  for (size_t i = 0; i < e->n; i++) {
    const sample *s = &e->s[i];
    if (strcmp(s->name, name) || s->nlabels != n)
      continue;
    bool same = true;
    for (int j = 0; j < n && same; j++)
      same = label(s, k[j]) && !strcmp(label(s, k[j]), v[j]);
    if (same)
      return s->value;
  }
  return NAN;
}

static const family *type_of(const expo *e, const char *name)
{
  for (size_t i = 0; i < e->nf; i++)
    if (!strcmp(e->f[i].name, name))
      return &e->f[i];
  return NULL;
}

/* GET /metrics: 200, the exposition's content type, parsed. */
static void scrape(int port, expo *e)
{
  http_reply r = http_do(port, "GET", "/metrics");
  cr_assert_eq(r.status, 200, "GET /metrics: %d", r.status);
  cr_assert_str_eq(r.content_type, "text/plain; version=0.0.4; charset=utf-8");
  cr_assert(r.has_length && r.length == r.body_len, "Content-Length %zu, body %zu", r.length,
            r.body_len);
  parse(r.body, r.body_len, e);
  free(r.body);
}

/* Counters and buckets never go down between two scrapes. */
static void check_monotonic(const expo *a, const expo *b)
{
  for (size_t i = 0; i < a->n; i++) {
    const sample *s = &a->s[i];
    size_t n = strlen(s->name);
    bool counter = (n > 6 && !strcmp(s->name + n - 6, "_total")) ||
                   (n > 7 && !strcmp(s->name + n - 7, "_bucket")) ||
                   (n > 6 && !strcmp(s->name + n - 6, "_count"));
    if (!counter)
      continue;
    for (size_t j = 0; j < b->n; j++) {
      const sample *t = &b->s[j];
      if (strcmp(t->name, s->name) || t->nlabels != s->nlabels)
        continue;
      bool same = true;
      for (int k = 0; k < s->nlabels && same; k++)
        same = label(t, s->key[k]) && !strcmp(label(t, s->key[k]), s->val[k]);
      if (same)
        cr_assert_geq(t->value, s->value, "%s went down", s->name);
    }
  }
}

/* ---------------------------------------------------------------- servers */

/* tenants: METRICS_TENANTS_NAME, _HASH or _OFF (--metrics-tenants) */
static server *start_http_tenants(const char *address, char *url, size_t len, int tenants)
{
  server_config cfg;
  svc_config(&cfg);
  cfg.http_listen = strdup(address);
  cfg.metrics_tenants = tenants;
  return svc_start_with(&cfg, url, len);
}

/* The tests that read tenants' names ask for them (--metrics-tenants name). */
static server *start_http(const char *address, char *url, size_t len)
{
  return start_http_tenants(address, url, len, METRICS_TENANTS_NAME);
}

static double count_of(const expo *e, const char *hist, const char *key, const char *val)
{
  char n[160];
  snprintf(n, sizeof n, "%s_count", hist);
  return value_of(e, n, key, val, NULL);
}

/* ---------------------------------------------------------------- tests */

Test(metrics, every_line_parses_and_counters_move)
{
  char url[128];
  server *s = start_http("127.0.0.1:0", url, sizeof url);
  int port = http_port(s->http);
  cr_assert_gt(port, 0);
  expo before;
  scrape(port, &before);
  static const char *const names[] = {"tport_requests_total",
                                      "tport_request_duration_seconds",
                                      "tport_transfer_bytes_total",
                                      "tport_reply_lent_bytes_total",
                                      "tport_stage_duration_seconds",
                                      "tport_connections",
                                      "tport_uploads_in_progress",
                                      "tport_tensors",
                                      "tport_tensor_bytes",
                                      "tport_tenant_bytes",
                                      "tport_device_memory_bytes",
                                      "tport_device_memory_total_bytes",
                                      "tport_staging_hits_total",
                                      "tport_staging_misses_total",
                                      "tport_staging_in_use_bytes",
                                      "tport_host_cache_hits_total",
                                      "tport_host_cache_cached_bytes",
                                      "tport_kernel_cache_hits_total",
                                      "tport_kernel_cache_misses_total",
                                      "tport_build_info"};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    cr_assert(type_of(&before, names[i]), "%s is exposed", names[i]);
  cr_assert_str_eq(type_of(&before, "tport_request_duration_seconds")->type, "histogram");
  cr_assert_str_eq(type_of(&before, "tport_stage_duration_seconds")->type, "histogram");
  cr_assert_str_eq(type_of(&before, "tport_requests_total")->type, "counter");
  cr_assert_str_eq(type_of(&before, "tport_connections")->type, "gauge");
  const sample *bi = NULL;
  for (size_t i = 0; i < before.n && !bi; i++)
    if (!strcmp(before.s[i].name, "tport_build_info"))
      bi = &before.s[i];
  cr_assert(bi && bi->value == 1 && label(bi, "version") && label(bi, "cuda"));
  cr_assert_str_eq(label(bi, "version"), "0.1.0");
  cr_assert(label(bi, "cuda")[0], "the CUDA toolkit of the build, or none");
  /* by transport: this server listens on inproc */
  cr_assert_eq(value_of(&before, "tport_connections", "transport", "inproc", NULL), 0);
  cr_assert_eq(value_of(&before, "tport_connections", "transport", "tcp", NULL), 0);
  cr_assert_eq(value_of(&before, "tport_connections", "transport", "tls", NULL), 0);
  cr_assert_eq(value_of(&before, "tport_ready", NULL), 1);
  /* device memory: used + free = total, for each device served */
  static const char *const devs[] = {"cpu", "sim:0", "sim:1"};
  for (int i = 0; i < 3; i++) {
    double used = value_of(&before, "tport_device_memory_bytes", "device", devs[i], "state", "used",
                           NULL),
           freeb = value_of(&before, "tport_device_memory_bytes", "device", devs[i], "state",
                            "free", NULL),
           total = value_of(&before, "tport_device_memory_total_bytes", "device", devs[i], NULL);
    /* no state that sums the others: summing the family counts each byte once */
    cr_assert(isnan(value_of(&before, "tport_device_memory_bytes", "device", devs[i], "state",
                             "total", NULL)));
    cr_assert(total > 0 && used + freeb == total, "%s: used %g free %g total %g", devs[i], used,
              freeb, total);
  }
  for (int st = 0; st < METRICS_STAGES; st++)
    cr_assert_eq(count_of(&before, "tport_stage_duration_seconds", "stage",
                          metrics_stage_name((metrics_stage)st)),
                 0, "no %s yet", metrics_stage_name((metrics_stage)st));

  /* work: puts on the cpu and on sim:0 (one converted), gets back, one error */
  tport_client *c = svc_connect(url, "alice");
  size_t n = 256 << 10; /* 4 chunks of 64 KiB */
  uint8_t *data = malloc(n), *back = malloc(n);
  for (size_t i = 0; i < n; i++)
    data[i] = (uint8_t)(i * 7);
  tport_err err;
  tport_put_options po;
  tport_put_options_init(&po);
  tport_tensor_info on_cpu, on_sim, converted;
  int64_t sz[] = {(int64_t)n};
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, sz, NULL, data, n, &po, &on_cpu, &err), 0, "%s",
               err.msg);
  po.device = "sim:0";
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, sz, NULL, data, n, &po, &on_sim, &err), 0, "%s",
               err.msg);
  int64_t nchw[] = {4, 4, 64, 64}; /* 64 KiB of uint8, stored channels_last as float32 */
  po.has_dtype = true;
  po.dtype = TPORT_FLOAT32;
  po.memory_format = TPORT_MF_CHANNELS_LAST;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 4, nchw, NULL, data, 64 << 10, &po, &converted, &err), 0,
               "%s", err.msg);
  cr_assert_eq(tport_get(c, &on_cpu.ref, back, n, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(memcmp(back, data, n), 0);
  cr_assert_eq(tport_get(c, &on_sim.ref, back, n, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(memcmp(back, data, n), 0);
  tport_ref nowhere;
  tport_ref_name(&nowhere, "no-such-tensor");
  tport_tensor_info info;
  cr_assert_eq(tport_info(c, &nowhere, &info, &err), TPORT_NOT_FOUND);

  expo after;
  scrape(port, &after);
  check_monotonic(&before, &after);
  cr_assert_geq(value_of(&after, "tport_requests_total", "method", "PutChunk", "code", "OK", NULL),
                8, "4 chunks of each of the two larger puts");
  cr_assert_eq(
      value_of(&after, "tport_requests_total", "method", "Info", "code", "NOT_FOUND", NULL), 1);
  cr_assert_geq(value_of(&after, "tport_requests_total", "method", "GetChunk", "code", "OK", NULL),
                8);
  /* each method's duration histogram counts its requests, whatever their status */
  static const char *const methods[] = {"Hello",    "PutBegin", "PutChunk", "PutCommit",
                                        "GetBegin", "GetChunk", "Info"};
  for (size_t i = 0; i < sizeof methods / sizeof *methods; i++) {
    double total = 0;
    for (size_t j = 0; j < after.n; j++)
      if (!strcmp(after.s[j].name, "tport_requests_total") &&
          !strcmp(label(&after.s[j], "method"), methods[i]))
        total += after.s[j].value;
    cr_assert_gt(total, 0, "%s counted", methods[i]);
    cr_assert_eq(count_of(&after, "tport_request_duration_seconds", "method", methods[i]), total,
                 "%s: durations and requests", methods[i]);
  }
  cr_assert_gt(value_of(&after, "tport_transfer_bytes_total", "direction", "in", NULL),
               (double)(2 * n));
  cr_assert_gt(value_of(&after, "tport_transfer_bytes_total", "direction", "out", NULL),
               (double)(2 * n));
  cr_assert_eq(value_of(&after, "tport_connections", "transport", "inproc", NULL), 1);
  cr_assert_eq(value_of(&after, "tport_tensors", NULL), 3);
  cr_assert_eq(value_of(&after, "tport_uploads_in_progress", NULL), 0);
  double alice = value_of(&after, "tport_tenant_bytes", "tenant", "alice", NULL);
  cr_assert_geq(alice, (double)(2 * n + (64 << 10) * 4), "alice pays for her tensors: %g", alice);
  cr_assert_eq(value_of(&after, "tport_tensor_bytes", NULL), alice);
  /* every stage of a put and a get was seen */
  for (int st = 0; st < METRICS_STAGES; st++)
    cr_assert_gt(count_of(&after, "tport_stage_duration_seconds", "stage",
                          metrics_stage_name((metrics_stage)st)),
                 0, "stage %s observed", metrics_stage_name((metrics_stage)st));
  cr_assert_gt(
      value_of(&after, "tport_device_memory_bytes", "device", "sim:0", "state", "used", NULL), 0,
      "the put on sim:0 uses its memory");
  expo_free(&before);
  expo_free(&after);

  /* the tensors go with the connection: the gauges follow */
  tport_close(c);
  for (int i = 0; i < 200; i++) {
    expo e;
    scrape(port, &e);
    bool gone =
        value_of(&e, "tport_tensors", NULL) == 0 && value_of(&e, "tport_connections", "transport", "inproc", NULL) == 0;
    expo_free(&e);
    if (gone)
      break;
    cr_assert_lt(i, 199, "the connection's tensors are gone from the gauges");
    usleep(10000);
  }
  free(data);
  free(back);
  server_stop(s, 1000);
}

Test(metrics, tenant_names_are_escaped)
{
  char url[128];
  server *s = start_http("127.0.0.1:0", url, sizeof url);
  int port = http_port(s->http);
  /* a quote, a backslash, UTF-8 and a byte that is not UTF-8 */
  const char *names[] = {"q\"uo\\te \xc3\xa9t\xc3\xa9", "bad\xff"};
  tport_client *c[2];
  uint8_t v[1000] = {1};
  int64_t sz[] = {1000};
  for (int i = 0; i < 2; i++) {
    c[i] = svc_connect(url, names[i]);
    tport_err err;
    cr_assert_eq(tport_put(c[i], TPORT_UINT8, 1, sz, NULL, v, sizeof v, NULL, NULL, &err), 0, "%s",
                 err.msg);
  }
  expo e;
  scrape(port, &e); /* valid UTF-8, escapes valid */
  cr_assert_geq(value_of(&e, "tport_tenant_bytes", "tenant", names[0], NULL), 1000);
  cr_assert_geq(value_of(&e, "tport_tenant_bytes", "tenant", "bad\xef\xbf\xbd", NULL), 1000,
                "a byte that is not UTF-8 is U+FFFD");
  expo_free(&e);
  http_reply r = http_do(port, "GET", "/metrics");
  cr_assert(strstr(r.body, "tport_tenant_bytes{tenant=\"q\\\"uo\\\\te \xc3\xa9t\xc3\xa9\"}"),
            "the label as written");
  free(r.body);
  for (int i = 0; i < 2; i++)
    tport_close(c[i]);
  server_stop(s, 1000);
}

/* Issue 20, finding 10: whoever reaches the HTTP port reads /metrics, and
 * tenants' names are not theirs to read.  By default a tenant's label is a
 * keyed hash: the same for the server's life (dashboards keep their
 * series), another server's key gives another, and the name is nowhere in
 * the text; "off" lists no tenant at all. */
static const char *const secret_tenant = "acme-merger-target";

static void put_as_secret_tenant(const char *url, tport_client **c)
{
  *c = svc_connect(url, secret_tenant);
  uint8_t v[1000] = {1};
  int64_t sz[] = {1000};
  tport_err err;
  cr_assert_eq(tport_put(*c, TPORT_UINT8, 1, sz, NULL, v, sizeof v, NULL, NULL, &err), 0, "%s",
               err.msg);
}

/* The one tport_tenant_bytes sample's tenant label (copied to out). */
static void only_tenant_label(int port, char *out, size_t len)
{
  http_reply r = http_do(port, "GET", "/metrics");
  cr_assert_eq(r.status, 200);
  cr_assert_null(strstr(r.body, secret_tenant), "the tenant's name is in /metrics");
  free(r.body);
  expo e;
  scrape(port, &e);
  int n = 0;
  for (size_t i = 0; i < e.n; i++)
    if (!strcmp(e.s[i].name, "tport_tenant_bytes")) {
      cr_assert_eq(e.s[i].nlabels, 1);
      cr_assert_geq(e.s[i].value, 1000);
      snprintf(out, len, "%s", label(&e.s[i], "tenant"));
      n++;
    }
  cr_assert_eq(n, 1, "%d tport_tenant_bytes samples", n);
  expo_free(&e);
}

Test(metrics, tenant_names_are_hashed_by_default_or_off)
{
  char labels[2][64];
  for (int k = 0; k < 2; k++) {
    char url[128];
    server_config cfg;
    svc_config(&cfg); /* config_defaults': the default */
    cfg.http_listen = strdup("127.0.0.1:0");
    server *s = svc_start_with(&cfg, url, sizeof url);
    int port = http_port(s->http);
    tport_client *c;
    put_as_secret_tenant(url, &c);
    only_tenant_label(port, labels[k], sizeof labels[k]);
    cr_assert(match("^[0-9a-f]{16}$", labels[k]), "label '%s'", labels[k]);
    char again[64];
    only_tenant_label(port, again, sizeof again);
    cr_assert_str_eq(again, labels[k], "the label stays for the server's life");
    /* a second connection of the same tenant: the same series */
    tport_client *c2;
    put_as_secret_tenant(url, &c2);
    only_tenant_label(port, again, sizeof again);
    cr_assert_str_eq(again, labels[k]);
    tport_close(c2);
    tport_close(c);
    server_stop(s, 1000);
  }
  cr_assert_str_neq(labels[0], labels[1],
                    "another server, another key: a name cannot be guessed and checked");

  char url[128];
  server *s = start_http_tenants("127.0.0.1:0", url, sizeof url, METRICS_TENANTS_OFF);
  int port = http_port(s->http);
  tport_client *c;
  put_as_secret_tenant(url, &c);
  http_reply r = http_do(port, "GET", "/metrics");
  cr_assert_eq(r.status, 200);
  cr_assert_null(strstr(r.body, secret_tenant));
  cr_assert_null(strstr(r.body, "tport_tenant_bytes"), "off: no per-tenant family");
  free(r.body);
  expo e;
  scrape(port, &e);
  cr_assert_eq(value_of(&e, "tport_tenants", NULL), 1, "the count of tenants stays");
  expo_free(&e);
  tport_close(c);
  server_stop(s, 1000);
}

Test(metrics, metrics_tenants_flag_and_variable)
{
  server_config c;
  tport_err err;
  char *argv0[] = {"tportd", NULL};
  unsetenv("TPORT_METRICS_TENANTS");
  config_defaults(&c);
  cr_assert_eq(config_parse(&c, 1, argv0, &err), 0, "%s", err.msg);
  cr_assert_eq(c.metrics_tenants, METRICS_TENANTS_HASH, "the default");
  config_free(&c);
  static const struct {
    const char *v;
    int want;
  } ok[] = {
      {"name", METRICS_TENANTS_NAME}, {"hash", METRICS_TENANTS_HASH}, {"off", METRICS_TENANTS_OFF}};
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    char *argv[] = {"tportd", "--metrics-tenants", (char *)ok[i].v, NULL};
    config_defaults(&c);
    cr_assert_eq(config_parse(&c, 3, argv, &err), 0, "%s", err.msg);
    cr_assert_eq(c.metrics_tenants, ok[i].want, "%s", ok[i].v);
    config_free(&c);
  }
  setenv("TPORT_METRICS_TENANTS", "off", 1);
  config_defaults(&c);
  cr_assert_eq(config_parse(&c, 1, argv0, &err), 0, "%s", err.msg);
  cr_assert_eq(c.metrics_tenants, METRICS_TENANTS_OFF, "the variable");
  config_free(&c);
  unsetenv("TPORT_METRICS_TENANTS");
  static const char *const bad[] = {"NAME", "names", "", "hash,name"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char *argv[] = {"tportd", "--metrics-tenants", (char *)bad[i], NULL};
    config_defaults(&c);
    cr_assert_neq(config_parse(&c, 3, argv, &err), 0, "'%s' is refused", bad[i]);
    cr_assert(strstr(err.msg, "--metrics-tenants") && strstr(err.msg, "name, hash or off"), "%s",
              err.msg);
    config_free(&c);
  }
}

/* The label escaping itself, on the strings a tenant cannot send (newline). */
Test(metrics, label_escaping)
{
  metrics_text t = {0};
  metrics_family(&t, "tport_x", "gauge", "x.");
  metrics_sample(&t, "tport_x", 1.5, "a", "line\nbreak \"q\" back\\slash", "b", "", NULL);
  metrics_sample(&t, "tport_x", INFINITY, "a", "inf", NULL);
  metrics_sample(&t, "tport_x", NAN, "a", "nan", NULL);
  cr_assert_str_eq(t.buf, "# HELP tport_x x.\n# TYPE tport_x gauge\n"
                          "tport_x{a=\"line\\nbreak \\\"q\\\" back\\\\slash\",b=\"\"} 1.5\n"
                          "tport_x{a=\"inf\"} +Inf\n"
                          "tport_x{a=\"nan\"} NaN\n");
  expo e;
  parse(t.buf, t.len, &e);
  cr_assert_eq(value_of(&e, "tport_x", "a", "line\nbreak \"q\" back\\slash", "b", "", NULL), 1.5);
  expo_free(&e);
  free(t.buf);
}

/* Histograms under concurrent observers: every observation lands once. */
static metrics shared;
static void *observe_many(void *arg)
{
  for (int i = 0; i < 100000; i++)
    metrics_observe(&shared.stage[STAGE_SEND], (int64_t)(i % 7) * 3000000);
  return arg;
}

Test(metrics, histogram_is_lock_free_and_exact)
{
  metrics_init(&shared);
  pthread_t th[4];
  for (int i = 0; i < 4; i++)
    pthread_create(&th[i], NULL, observe_many, NULL);
  for (int i = 0; i < 4; i++)
    pthread_join(th[i], NULL);
  cr_assert(atomic_is_lock_free(&shared.stage[0].buckets[0]), "the buckets are lock-free atomics");
  metrics_text t = {0};
  metrics_family(&t, "tport_h_seconds", "histogram", "h.");
  metrics_histogram_write(&t, "tport_h_seconds", &shared.stage[STAGE_SEND], "stage", "send");
  expo e;
  parse(t.buf, t.len, &e);
  cr_assert_eq(value_of(&e, "tport_h_seconds_count", "stage", "send", NULL), 400000);
  /* 0 ms: le 1e-05; 3, 6 ms: le 0.005 and 0.01; 18 ms le 0.025 ... */
  cr_assert_eq(value_of(&e, "tport_h_seconds_bucket", "stage", "send", "le", "1e-05", NULL),
               4 * 14286, "one in seven is 0");
  double sum = value_of(&e, "tport_h_seconds_sum", "stage", "send", NULL);
  double want = 0;
  for (int i = 0; i < 100000; i++)
    want += (i % 7) * 0.003;
  cr_assert(fabs(sum - 4 * want) < 1e-6, "sum %.9f, want %.9f", sum, 4 * want);
  expo_free(&e);
  free(t.buf);
}

/* ---------------------------------------------------------------- health */

static atomic_int hook_port;
static atomic_int hook_readyz, hook_healthz, hook_ready_gauge;

static void before_ready(server *s)
{
  int port = http_port(s->http);
  atomic_store(&hook_port, port);
  atomic_store(&hook_readyz, http_status(port, "/readyz"));
  atomic_store(&hook_healthz, http_status(port, "/healthz"));
  expo e;
  scrape(port, &e);
  atomic_store(&hook_ready_gauge, (int)value_of(&e, "tport_ready", NULL));
  expo_free(&e);
}

typedef struct slow_put {
  char url[128];
  int rc;
  tport_err err;
} slow_put;

static void *put_slowly(void *arg)
{
  slow_put *p = arg;
  tport_client *c = svc_connect(p->url, NULL);
  uint8_t v[64] = {0};
  int64_t sz[] = {64};
  tport_put_options po;
  tport_put_options_init(&po);
  po.device = "sim:0"; /* a blocking put: waits for the slow sim copy */
  p->rc = tport_put(c, TPORT_UINT8, 1, sz, NULL, v, sizeof v, &po, NULL, &p->err);
  tport_close(c);
  return NULL;
}

typedef struct stopper {
  server *s;
  atomic_bool done;
} stopper;

static void *stop_server(void *arg)
{
  stopper *st = arg;
  server_stop(st->s, 5000);
  atomic_store(&st->done, true);
  return NULL;
}

Test(health, startup_and_shutdown)
{
  char url[128];
  server_test_before_ready = before_ready;
  server *s = start_http("127.0.0.1:0", url, sizeof url);
  server_test_before_ready = NULL;
  int port = http_port(s->http);
  cr_assert_eq(atomic_load(&hook_port), port);
  cr_assert_eq(atomic_load(&hook_readyz), 503, "not ready before start completes");
  cr_assert_eq(atomic_load(&hook_healthz), 200, "alive while it starts");
  cr_assert_eq(atomic_load(&hook_ready_gauge), 0);
  cr_assert_eq(http_status(port, "/readyz"), 200, "ready once started");
  cr_assert_eq(http_status(port, "/healthz"), 200);

  /* a request in flight keeps the server in its grace period */
  sim_set_delay_range(1200000, 1200000); /* each sim op sleeps 1.2 s */
  slow_put sp = {.rc = -1};
  memcpy(sp.url, url, sizeof url);
  pthread_t pt;
  pthread_create(&pt, NULL, put_slowly, &sp);
  for (int i = 0;; i++) { /* the put is copying (its tensor on sim:0 is allocated) */
    if (sim_bytes_in_use(0) > 0)
      break;
    cr_assert_lt(i, 1000, "the slow put began");
    usleep(2000);
  }
  stopper st = {.s = s};
  pthread_t stt;
  pthread_create(&stt, NULL, stop_server, &st);
  int readyz = 0, healthz = 0;
  for (int i = 0; i < 100 && readyz != 503; i++) {
    readyz = http_status(port, "/readyz");
    healthz = http_status(port, "/healthz");
    if (readyz != 503)
      usleep(2000);
  }
  bool during_grace = !atomic_load(&st.done);
  cr_assert_eq(readyz, 503, "not ready once the shutdown begins");
  cr_assert_eq(healthz, 200, "still alive during the grace period");
  cr_assert(during_grace, "seen before the grace period ended");
  /* draining: a new connection is refused, the one at work is served */
  tport_client *late = NULL;
  tport_connect_options lo = {.timeout_ms = 300};
  cr_assert_neq(tport_connect(url, &lo, &late, NULL), 0, "no new connection while stopping");
  cr_assert(!atomic_load(&st.done), "(still in the grace period)");
  pthread_join(stt, NULL);
  pthread_join(pt, NULL);
  sim_set_delay(0);
  cr_assert_eq(sp.rc, 0, "the request in flight finished within the grace period: %s", sp.err.msg);
  cr_assert_eq(http_status(port, "/healthz"), -1, "the endpoint is gone once stopped");
}

/* ---------------------------------------------------------------- http */

Test(http, not_found_method_not_allowed_no_body)
{
  char url[128];
  server *s = start_http("127.0.0.1:0", url, sizeof url);
  int port = http_port(s->http);
  http_reply r = http_do(port, "GET", "/nope");
  cr_assert_eq(r.status, 404);
  free(r.body);
  r = http_do(port, "GET", "/metrics/");
  cr_assert_eq(r.status, 404);
  free(r.body);
  static const char *const bad[] = {"POST", "PUT", "DELETE", "PATCH", "OPTIONS"};
  for (int i = 0; i < 5; i++) {
    char req[256];
    snprintf(req, sizeof req,
             "%s /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
             bad[i]);
    r = http_raw(AF_INET, port, req);
    cr_assert_eq(r.status, 405, "%s: %d", bad[i], r.status);
    cr_assert_str_eq(r.allow, "GET, HEAD");
    free(r.body);
  }
  /* a body is refused before it is read */
  r = http_raw(AF_INET, port,
               "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\nabc");
  cr_assert_eq(r.status, 413);
  free(r.body);
  r = http_raw(
      AF_INET, port,
      "GET /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n");
  cr_assert_eq(r.status, 413);
  free(r.body);
  /* HEAD: the headers of GET, no body */
  r = http_do(port, "HEAD", "/metrics");
  cr_assert_eq(r.status, 200);
  cr_assert_eq(r.body_len, 0);
  free(r.body);
  /* headers past the connection's memory: refused, the server unharmed */
  size_t big = 64 << 10;
  char *req = malloc(big + 128);
  int k = snprintf(req, big + 128, "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ");
  memset(req + k, 'a', big);
  strcpy(req + k + big, "\r\nConnection: close\r\n\r\n");
  r = http_raw(AF_INET, port, req);
  cr_assert(r.status == 431 || r.status == 413 || r.status < 0, "oversized headers: %d", r.status);
  free(r.body);
  free(req);
  /* keep-alive: two requests on one connection */
  r = http_raw(AF_INET, port,
               "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /readyz HTTP/1.1\r\nHost: x\r\n"
               "Connection: close\r\n\r\n");
  cr_assert_eq(r.status, 200);
  cr_assert(strstr(r.body, "ready"), "the second answer follows on the same connection");
  free(r.body);
  cr_assert_eq(http_status(port, "/healthz"), 200);
  server_stop(s, 1000);
}

Test(http, connections_are_bounded)
{
  char url[128];
  server *s = start_http("127.0.0.1:0", url, sizeof url);
  int port = http_port(s->http);
  /* idle connections up to the per-address limit are held; the next are closed */
  int fds[HTTP_MAX_CONNECTIONS_PER_ADDRESS + 8];
  int n = HTTP_MAX_CONNECTIONS_PER_ADDRESS + 8;
  for (int i = 0; i < n; i++)
    fds[i] = connect_to(AF_INET, port);
  usleep(200000);
  int closed = 0;
  for (int i = 0; i < n; i++) {
    struct pollfd p = {.fd = fds[i], .events = POLLIN};
    char ch;
    if (fds[i] >= 0 && poll(&p, 1, 0) == 1 && recv(fds[i], &ch, 1, MSG_DONTWAIT) <= 0)
      closed++;
  }
  cr_assert_geq(closed, n - HTTP_MAX_CONNECTIONS_PER_ADDRESS,
                "connections past the limit: %d of %d closed", closed, n);
  for (int i = 0; i < n; i++)
    if (fds[i] >= 0)
      close(fds[i]);
  /* the data path never noticed, and the endpoint serves again */
  tport_client *c = svc_connect(url, NULL);
  tport_close(c);
  for (int i = 0; i < 100 && http_status(port, "/healthz") != 200; i++)
    usleep(10000);
  cr_assert_eq(http_status(port, "/healthz"), 200);
  server_stop(s, 1000);
}

Test(http, a_port_taken_is_a_startup_error)
{
  char url[128];
  server *s = start_http("127.0.0.1:0", url, sizeof url);
  int port = http_port(s->http);
  server_config cfg;
  svc_config(&cfg);
  char addr[64];
  snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
  cfg.http_listen = strdup(addr);
  cfg.listen[0] = strdup("inproc://tport-test-metrics-taken");
  cfg.nlisten = 1;
  server *s2 = NULL;
  tport_err err;
  cr_assert_neq(server_start(&cfg, &s2, &err), 0, "a second server on the same port");
  cr_assert(strstr(err.msg, "--http-listen") && strstr(err.msg, addr) &&
                strstr(err.msg, "Address already in use"),
            "%s", err.msg);
  server_stop(s, 1000);
  /* once stopped the port is free again: the endpoint closed its socket */
  cr_assert_eq(server_start(&cfg, &s2, &err), 0, "%s", err.msg);
  cr_assert_eq(http_port(s2->http), port);
  cr_assert_eq(http_status(port, "/readyz"), 200);
  server_stop(s2, 1000);
  config_free(&cfg);
}

Test(http, ipv6_loopback)
{
  int probe = socket(AF_INET6, SOCK_STREAM, 0);
  struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT};
  bool v6 = probe >= 0 && bind(probe, (struct sockaddr *)&a, sizeof a) == 0;
  if (probe >= 0)
    close(probe);
  if (!v6)
    cr_skip_test("no IPv6 loopback on this machine");
  char url[128];
  server *s = start_http("[::1]:0", url, sizeof url);
  int port = http_port(s->http);
  http_reply r =
      http_raw(AF_INET6, port, "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  cr_assert_eq(r.status, 200);
  free(r.body);
  cr_assert_eq(http_status(port, "/healthz"), -1, "not on IPv4");
  server_stop(s, 1000);
}

Test(http, flag_variable_and_default)
{
  server_config c;
  tport_err err;
  char *argv0[] = {"tportd", NULL};
  config_defaults(&c);
  cr_assert_null(c.http_listen, "a config built in code has no endpoint");
  unsetenv("TPORT_HTTP_LISTEN");
  cr_assert_eq(config_parse(&c, 1, argv0, &err), 0, "%s", err.msg);
  cr_assert_str_eq(c.http_listen, "127.0.0.1:9450", "tportd's default");
  cr_assert_eq(c.log_format, LOG_TEXT);
  config_free(&c);

  char *argv1[] = {"tportd", "--http-listen", "off", "--log-format", "json", NULL};
  config_defaults(&c);
  cr_assert_eq(config_parse(&c, 5, argv1, &err), 0, "%s", err.msg);
  cr_assert_null(c.http_listen);
  cr_assert_eq(c.log_format, LOG_JSON);
  config_free(&c);

  setenv("TPORT_HTTP_LISTEN", "[::1]:9999", 1);
  setenv("TPORT_LOG_FORMAT", "json", 1);
  config_defaults(&c);
  cr_assert_eq(config_parse(&c, 1, argv0, &err), 0, "%s", err.msg);
  cr_assert_str_eq(c.http_listen, "[::1]:9999");
  cr_assert_eq(c.log_format, LOG_JSON);
  config_free(&c);
  char *argv2[] = {"tportd", "--http-listen", "0.0.0.0:9451", NULL};
  config_defaults(&c);
  cr_assert_eq(config_parse(&c, 3, argv2, &err), 0, "%s", err.msg);
  cr_assert_str_eq(c.http_listen, "0.0.0.0:9451", "the flag wins over the variable");
  config_free(&c);
  unsetenv("TPORT_HTTP_LISTEN");
  unsetenv("TPORT_LOG_FORMAT");

  static const char *const bad[] = {"9450",         "::1:9450",  "127.0.0.1:99999", "127.0.0.1:",
                                    "127.0.0.1:-1", "[::1]9450", "127.0.0.1:http"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    char *argv[] = {"tportd", "--http-listen", (char *)bad[i], NULL};
    config_defaults(&c);
    cr_assert_neq(config_parse(&c, 3, argv, &err), 0, "'%s' is refused", bad[i]);
    cr_assert(strstr(err.msg, "--http-listen"), "%s", err.msg);
    config_free(&c);
  }
  char *argv3[] = {"tportd", "--log-format", "xml", NULL};
  config_defaults(&c);
  cr_assert_neq(config_parse(&c, 3, argv3, &err), 0);
  cr_assert(strstr(err.msg, "text or json"), "%s", err.msg);
  config_free(&c);
}
