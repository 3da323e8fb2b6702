/* log.c: "tportd 2026-11-21T19:12:00Z INFO message" lines on stderr. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static int current = LOG_INFO;

void log_set_level(int level)
{
  current = level;
}

void log_msg(int level, const char *fmt, ...)
{
  if (level > current)
    return;
  static const char *const names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
  char ts[32];
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "tportd %s %s %s\n", ts, names[level < 0 ? 0 : level > 3 ? 3 : level], line);
}
