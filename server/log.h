/*
 * log.h: leveled logging to stderr, as text or JSON lines.
 *
 * text: "tportd 2026-11-21T19:12:00Z INFO message key=value key="a value""
 * json: {"time":"2026-11-21T19:12:00.123Z","level":"info","message":"...","key":"value"}
 *
 * Every line goes out in one write(2), so lines of concurrent threads never
 * interleave.  Values are escaped (JSON: quotes, backslashes and control
 * characters; text: quoted when they hold a space, a quote, '=' or a
 * control character), UTF-8 passes through and invalid UTF-8 becomes U+FFFD:
 * a tenant name or an error message from the wire cannot forge a line.
 */
#ifndef TPORT_LOG_H
#define TPORT_LOG_H

#include <stdbool.h>
#include <stddef.h>

enum { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };
typedef enum { LOG_TEXT = 0, LOG_JSON = 1 } log_format;

void log_set_level(int level);
void log_set_format(log_format f);
/* True when a message of that level is written (spares the work of its fields). */
bool log_enabled(int level);

/* A formatted message, no fields. */
void log_msg(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A message with fields: NULL-terminated pairs of strings (key, value); a
 * NULL value leaves its field out.  Keys are plain identifiers (tenant, peer,
 * connection, method, code, error...). */
void log_event(int level, const char *msg, ...) __attribute__((sentinel));

/* The length (1-4) of the valid UTF-8 sequence that starts at s (n bytes
 * available), 0 when the bytes there are not one. */
size_t log_utf8_len(const unsigned char *s, size_t n);

#endif
