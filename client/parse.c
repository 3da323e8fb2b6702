/* parse.c: tport_parse_size and tport_parse_duration_ms (tport.h), so that
 * bindings parse what people type with the grammar of tport's and
 * tportd's flags (proto/units.c) rather than one of their own. */
#include "tport.h"
#include "units.h"

int tport_parse_size(const char *text, const char *what, uint64_t *bytes, tport_err *err)
{
  return units_parse_size(text, what ? what : "size", bytes, err);
}

int tport_parse_duration_ms(const char *text, const char *what, bool bare_seconds, uint64_t *ms,
                            tport_err *err)
{
  return units_parse_duration_ms(text, bare_seconds ? UNITS_S : UNITS_MS,
                                 what ? what : "duration", ms, err);
}
