/* units.h: sizes, durations and log levels as people type them.
 *
 * One grammar for every place a person writes one: tportd's flags and their
 * TPORT_* variables, tport's flags, and Python (through libtport).  What
 * --help prints ("64 GiB", "7 days" aside) parses back.
 *
 *   size      NUMBER [UNIT]: UNIT one of B; K M G T or KiB MiB GiB TiB
 *             (powers of 1024); KB MB GB TB (powers of 1000); any case,
 *             one space allowed before it.  A fraction ("1.5G") must come
 *             to whole bytes.
 *   duration  NUMBER [UNIT]: UNIT ms, s, m (minutes), h, d; a bare number
 *             is in the flag's own unit (given by the caller).  A fraction
 *             ("1.5s") must come to whole milliseconds.
 *   log level error, warn (warning), info, debug, or 0 to 3.
 *
 * Negative numbers, junk, and values past the uint64 range are refused with
 * a message that names the accepted forms.
 */
#ifndef TPORT_UNITS_H
#define TPORT_UNITS_H

#include <stdint.h>

#include "tport_types.h"

typedef enum { UNITS_MS, UNITS_S } units_time;

/* what: the flag or variable, for the message ("--quota") */
int units_parse_size(const char *s, const char *what, uint64_t *out, tport_err *err);
/* A duration in milliseconds; bare: the unit of a bare number. */
int units_parse_duration_ms(const char *s, units_time bare, const char *what, uint64_t *out,
                            tport_err *err);
/* 0 error, 1 warn, 2 info, 3 debug */
int units_parse_log_level(const char *s, const char *what, int *out, tport_err *err);

#endif
