/*
 * metrics_text.c: the text exposition format 0.0.4 (metrics.h): families,
 * samples with escaped labels, cumulative histograms.  A leaf: metrics.c and
 * metrics_engine.c write through it.
 */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "metrics.h"

/* The buckets' upper bounds as Prometheus reads them (metrics.c observes
 * against the same bounds in nanoseconds). */
static const char *const bound_le[METRICS_BUCKETS] = {
    "1e-05",  "2.5e-05", "5e-05", "0.0001", "0.00025", "0.0005", "0.001",
    "0.0025", "0.005",   "0.01",  "0.025",  "0.05",    "0.1",    "0.25",
    "0.5",    "1",       "2.5",   "5",      "10",      "30",     "60"};

/* ---------------------------------------------------------------- the text */

static void put(metrics_text *t, const char *s, size_t n)
{
  if (t->oom)
    return;
  if (t->len + n + 1 > t->cap) {
    size_t cap = t->cap ? t->cap : 65536;
    while (t->len + n + 1 > cap)
      cap *= 2;
    char *b = realloc(t->buf, cap);
    if (!b) {
      t->oom = true;
      return;
    }
    t->buf = b;
    t->cap = cap;
  }
  memcpy(t->buf + t->len, s, n);
  t->len += n;
  t->buf[t->len] = 0;
}

static void puts_(metrics_text *t, const char *s)
{
  put(t, s, strlen(s));
}

void metrics_escape_label(metrics_text *t, const char *v)
{
  const unsigned char *p = (const unsigned char *)v;
  size_t n = strlen(v);
  while (n) {
    size_t k = log_utf8_len(p, n);
    if (k == 1 && *p == '\\')
      put(t, "\\\\", 2);
    else if (k == 1 && *p == '"')
      put(t, "\\\"", 2);
    else if (k == 1 && *p == '\n')
      put(t, "\\n", 2);
    else if (k)
      put(t, (const char *)p, k);
    else
      put(t, "\xef\xbf\xbd", 3), k = 1; /* not UTF-8: U+FFFD */
    p += k;
    n -= k;
  }
}

void metrics_family(metrics_text *t, const char *name, const char *type, const char *help)
{
  /* help texts are ours: no backslash or newline to escape */
  puts_(t, "# HELP ");
  puts_(t, name);
  puts_(t, " ");
  puts_(t, help);
  puts_(t, "\n# TYPE ");
  puts_(t, name);
  puts_(t, " ");
  puts_(t, type);
  puts_(t, "\n");
}

static void labels_va(metrics_text *t, va_list ap)
{
  const char *k = va_arg(ap, const char *);
  if (!k)
    return;
  puts_(t, "{");
  for (bool first = true; k; k = va_arg(ap, const char *), first = false) {
    if (!first)
      puts_(t, ",");
    puts_(t, k);
    puts_(t, "=\"");
    metrics_escape_label(t, va_arg(ap, const char *));
    puts_(t, "\"");
  }
  puts_(t, "}");
}

static void value_double(metrics_text *t, double v)
{
  char b[40];
  if (isnan(v))
    snprintf(b, sizeof b, "NaN");
  else if (isinf(v))
    snprintf(b, sizeof b, v > 0 ? "+Inf" : "-Inf");
  else
    snprintf(b, sizeof b, "%.17g", v);
  puts_(t, b);
}

void metrics_sample(metrics_text *t, const char *name, double value, ...)
{
  puts_(t, name);
  va_list ap;
  va_start(ap, value);
  labels_va(t, ap);
  va_end(ap);
  puts_(t, " ");
  value_double(t, value);
  puts_(t, "\n");
}

void metrics_sample_u64(metrics_text *t, const char *name, uint64_t value, ...)
{
  puts_(t, name);
  va_list ap;
  va_start(ap, value);
  labels_va(t, ap);
  va_end(ap);
  char b[32];
  snprintf(b, sizeof b, " %" PRIu64 "\n", value);
  puts_(t, b);
}

void metrics_histogram_write(metrics_text *t, const char *name, const metrics_histogram *h,
                             const char *key, const char *value)
{
  char n[128];
  uint64_t total = 0;
  snprintf(n, sizeof n, "%s_bucket", name);
  for (int i = 0; i <= METRICS_BUCKETS; i++) {
    total += atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
    const char *le = i < METRICS_BUCKETS ? bound_le[i] : "+Inf";
    if (key)
      metrics_sample_u64(t, n, total, key, value, "le", le, NULL);
    else
      metrics_sample_u64(t, n, total, "le", le, NULL);
  }
  char sum[48];
  snprintf(sum, sizeof sum, "%.9f",
           (double)atomic_load_explicit(&h->sum_ns, memory_order_relaxed) / 1e9);
  snprintf(n, sizeof n, "%s_sum", name);
  puts_(t, n);
  if (key) {
    puts_(t, "{");
    puts_(t, key);
    puts_(t, "=\"");
    metrics_escape_label(t, value);
    puts_(t, "\"}");
  }
  puts_(t, " ");
  puts_(t, sum);
  puts_(t, "\n");
  snprintf(n, sizeof n, "%s_count", name);
  if (key)
    metrics_sample_u64(t, n, total, key, value, NULL);
  else
    metrics_sample_u64(t, n, total, NULL);
}

void metrics_gauge_u64(metrics_text *t, const char *name, const char *help, uint64_t v)
{
  metrics_family(t, name, "gauge", help);
  metrics_sample_u64(t, name, v, NULL);
}

void metrics_counter_u64(metrics_text *t, const char *name, const char *help, uint64_t v)
{
  metrics_family(t, name, "counter", help);
  metrics_sample_u64(t, name, v, NULL);
}

