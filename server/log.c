/* log.c: text or JSON lines on stderr (see log.h). */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* set at startup, read by every thread that logs */
static atomic_int current = LOG_INFO;
static atomic_int format = LOG_TEXT;

void log_set_level(int level)
{
  atomic_store(&current, level);
}

void log_set_format(log_format f)
{
  atomic_store(&format, (int)f);
}

bool log_enabled(int level)
{
  return level <= atomic_load(&current);
}

size_t log_utf8_len(const unsigned char *s, size_t n)
{
  if (n == 0)
    return 0;
  unsigned c = s[0];
  if (c < 0x80)
    return 1;
  size_t len = c >= 0xC2 && c <= 0xDF   ? 2
               : c >= 0xE0 && c <= 0xEF ? 3
               : c >= 0xF0 && c <= 0xF4 ? 4
                                        : 0;
  if (len == 0 || n < len)
    return 0;
  for (size_t i = 1; i < len; i++)
    if ((s[i] & 0xC0) != 0x80)
      return 0;
  /* overlong forms, UTF-16 surrogates, past U+10FFFF */
  if ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] > 0x9F) || (c == 0xF0 && s[1] < 0x90) ||
      (c == 0xF4 && s[1] > 0x8F))
    return 0;
  return len;
}

/* ---------------------------------------------------------------- the line */

/* A line of at most LOG_LINE_BYTES bytes.  Once a piece does not fit the line is
 * full and later pieces are dropped, but the few bytes that close a string,
 * the object and the line always fit (RESERVE). */
#define LOG_LINE_BYTES 8192
#define RESERVE 16

typedef struct line {
  char buf[LOG_LINE_BYTES];
  size_t len;
  bool full;
} line;

static void put(line *l, const char *s, size_t n)
{
  if (l->full || l->len + n > LOG_LINE_BYTES - RESERVE) {
    l->full = true;
    return;
  }
  memcpy(l->buf + l->len, s, n);
  l->len += n;
}

/* structure that closes what was opened: written even when full */
static void put_force(line *l, const char *s)
{
  size_t n = strlen(s);
  if (l->len + n <= LOG_LINE_BYTES) {
    memcpy(l->buf + l->len, s, n);
    l->len += n;
  }
}

/* Appends s escaped for JSON (quotes not included). */
static void json_escape(line *l, const char *s)
{
  const unsigned char *p = (const unsigned char *)s;
  size_t n = strlen(s);
  while (n && !l->full) {
    char esc[8];
    size_t k = log_utf8_len(p, n);
    if (k == 1 && (*p < 0x20 || *p == '"' || *p == '\\' || *p == 0x7f)) {
      switch (*p) {
      case '"': put(l, "\\\"", 2); break;
      case '\\': put(l, "\\\\", 2); break;
      case '\n': put(l, "\\n", 2); break;
      case '\r': put(l, "\\r", 2); break;
      case '\t': put(l, "\\t", 2); break;
      default: snprintf(esc, sizeof esc, "\\u%04x", *p); put(l, esc, 6);
      }
    } else if (k) {
      put(l, (const char *)p, k);
    } else {
      put(l, "\\ufffd", 6); /* not UTF-8: one replacement per byte */
      k = 1;
    }
    p += k;
    n -= k;
  }
}

static void json_string(line *l, const char *s)
{
  put_force(l, "\"");
  json_escape(l, s);
  put_force(l, "\"");
}

/* Text: control characters as \xNN (and, quoted, " and \ escaped). */
static void text_escape(line *l, const char *s, bool quoted)
{
  const unsigned char *p = (const unsigned char *)s;
  size_t n = strlen(s);
  while (n && !l->full) {
    size_t k = log_utf8_len(p, n);
    char esc[8];
    if (k == 1 && (*p < 0x20 || *p == 0x7f)) {
      snprintf(esc, sizeof esc, "\\x%02x", *p);
      put(l, esc, 4);
    } else if (k == 1 && quoted && (*p == '"' || *p == '\\')) {
      esc[0] = '\\';
      esc[1] = (char)*p;
      put(l, esc, 2);
    } else if (k) {
      put(l, (const char *)p, k);
    } else {
      put(l, "\xef\xbf\xbd", 3); /* U+FFFD */
      k = 1;
    }
    p += k;
    n -= k;
  }
}

static bool needs_quotes(const char *v)
{
  if (!*v)
    return true;
  for (const unsigned char *p = (const unsigned char *)v; *p; p++)
    if (*p <= ' ' || *p == '"' || *p == '=' || *p == '\\' || *p == 0x7f)
      return true;
  return false;
}

static const char *const upper[] = {"ERROR", "WARN", "INFO", "DEBUG"};
static const char *const lower[] = {"error", "warn", "info", "debug"};

static void begin(line *l, int level, const char *msg)
{
  int lv = level < 0 ? 0 : level > 3 ? 3 : level;
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  struct tm tm;
  gmtime_r(&now.tv_sec, &tm);
  char ts[48];
  if (atomic_load(&format) == LOG_JSON) {
    size_t n = strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + n, sizeof ts - n, ".%03ldZ", now.tv_nsec / 1000000);
    put(l, "{\"time\":\"", 9);
    put(l, ts, strlen(ts));
    put(l, "\",\"level\":\"", 11);
    put(l, lower[lv], strlen(lower[lv]));
    put(l, "\",\"message\":", 12);
    json_string(l, msg);
  } else {
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
    put(l, "tportd ", 7);
    put(l, ts, strlen(ts));
    put(l, " ", 1);
    put(l, upper[lv], strlen(upper[lv]));
    put(l, " ", 1);
    text_escape(l, msg, false);
  }
}

static void field(line *l, const char *key, const char *value)
{
  if (l->full || !key || !value)
    return;
  if (atomic_load(&format) == LOG_JSON) {
    put_force(l, ",");
    json_string(l, key);
    put_force(l, ":");
    json_string(l, value);
  } else {
    put(l, " ", 1);
    put(l, key, strlen(key));
    put(l, "=", 1);
    bool q = needs_quotes(value);
    if (q)
      put(l, "\"", 1);
    text_escape(l, value, q);
    if (q)
      put_force(l, "\"");
  }
}

/* Closes the line and writes it whole. */
static void finish(line *l)
{
  if (atomic_load(&format) == LOG_JSON) {
    put_force(l, "}\n");
  } else {
    if (l->full)
      put_force(l, "...");
    put_force(l, "\n");
  }
  const char *p = l->buf;
  size_t n = l->len;
  while (n) {
    ssize_t w = write(STDERR_FILENO, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      return;
    p += w;
    n -= (size_t)w;
  }
}

void log_msg(int level, const char *fmt, ...)
{
  if (!log_enabled(level))
    return;
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  line l;
  l.len = 0;
  l.full = false;
  begin(&l, level, msg);
  finish(&l);
}

void log_event(int level, const char *msg, ...)
{
  if (!log_enabled(level))
    return;
  line l;
  l.len = 0;
  l.full = false;
  begin(&l, level, msg);
  va_list ap;
  va_start(ap, msg);
  for (;;) {
    const char *key = va_arg(ap, const char *);
    if (!key)
      break;
    field(&l, key, va_arg(ap, const char *));
  }
  va_end(ap);
  finish(&l);
}
