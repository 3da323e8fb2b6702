/* units.c: sizes, durations and log levels as people type them (units.h). */
#include "units.h"

#include <ctype.h>
#include <stdbool.h>
#include <string.h>
#include <strings.h>


#define SIZE_FORMS "a size: a number of bytes, or with K M G T, KiB MiB GiB TiB (1024s) or KB MB GB TB (1000s), e.g. 64GiB, 1.5G, 512M"
#define TIME_FORMS "a duration: a number with ms, s, m, h or d, e.g. 500ms, 30s, 1.5h"

/* A non-negative decimal "I[.F]": the integer part and up to 18 fraction
 * digits as frac / 10^scale.  Returns the end, or NULL. */
static const char *parse_decimal(const char *s, uint64_t *whole, uint64_t *frac, uint64_t *scale)
{
  const char *p = s;
  uint64_t w = 0, f = 0, sc = 1;
  bool digits = false;
  while (isdigit((unsigned char)*p)) {
    unsigned d = (unsigned)(*p++ - '0');
    if (w > (UINT64_MAX - d) / 10)
      return NULL;
    w = w * 10 + d;
    digits = true;
  }
  if (*p == '.') {
    p++;
    while (isdigit((unsigned char)*p)) {
      if (sc < 1000000000000000000ull) {
        f = f * 10 + (uint64_t)(*p - '0');
        sc *= 10;
      } else if (*p != '0') {
        return NULL; /* more precision than any unit can use */
      }
      p++;
      digits = true;
    }
  }
  if (!digits)
    return NULL;
  *whole = w, *frac = f, *scale = sc;
  return p;
}

/* whole * mul + frac * mul / scale: NULL and *out when it is a whole
 * number within range, else why not. */
static const char *scale_exact(uint64_t whole, uint64_t frac, uint64_t scale, uint64_t mul,
                               uint64_t *out)
{
  if (mul && whole > UINT64_MAX / mul)
    return "out of range";
  uint64_t a = whole * mul;
  /* frac < scale <= 10^18 and mul <= 2^40 or 86400000: the product fits in
   * unsigned __int128 */
  unsigned __int128 p = (unsigned __int128)frac * mul;
  if (p % scale)
    return "not a whole number of the smallest unit";
  uint64_t b = (uint64_t)(p / scale);
  if (a > UINT64_MAX - b)
    return "out of range";
  *out = a + b;
  return NULL;
}

struct unit {
  const char *name;
  uint64_t mul;
};

static const struct unit size_units[] = {
    {"", 1},
    {"b", 1},
    {"k", 1ull << 10},
    {"m", 1ull << 20},
    {"g", 1ull << 30},
    {"t", 1ull << 40},
    {"kib", 1ull << 10},
    {"mib", 1ull << 20},
    {"gib", 1ull << 30},
    {"tib", 1ull << 40},
    {"kb", 1000ull},
    {"mb", 1000000ull},
    {"gb", 1000000000ull},
    {"tb", 1000000000000ull},
};

static const struct unit time_units[] = {
    {"ms", 1}, {"s", 1000}, {"m", 60000}, {"min", 60000}, {"h", 3600000}, {"d", 86400000},
};

static const struct unit *find_unit(const char *u, const struct unit *units, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (strcasecmp(u, units[i].name) == 0)
      return &units[i];
  return NULL;
}

/* Splits "NUMBER[ ]UNIT" and scales it; false with *why set otherwise. */
static bool parse_with_unit(const char *s, const struct unit *units, size_t n, uint64_t bare_mul,
                            uint64_t *out, const char **why)
{
  uint64_t whole, frac, scale;
  const char *p = s;
  while (*p == ' ' || *p == '\t')
    p++;
  if (*p == '-') {
    *why = "negative";
    return false;
  }
  if (*p == '+')
    p++;
  const char *end = parse_decimal(p, &whole, &frac, &scale);
  if (!end) {
    *why = *p && isdigit((unsigned char)*p) ? "out of range" : "not a number";
    return false;
  }
  if (*end == ' ')
    end++;
  size_t len = strlen(end);
  while (len && (end[len - 1] == ' ' || end[len - 1] == '\t'))
    len--;
  char u[8];
  if (len >= sizeof u) {
    *why = "an unknown unit";
    return false;
  }
  memcpy(u, end, len);
  u[len] = '\0';
  uint64_t mul = bare_mul;
  if (u[0]) {
    const struct unit *unit = find_unit(u, units, n);
    if (!unit) {
      *why = "an unknown unit";
      return false;
    }
    mul = unit->mul;
  }
  *why = scale_exact(whole, frac, scale, mul, out);
  return *why == NULL;
}

int units_parse_size(const char *s, const char *what, uint64_t *out, tport_err *err)
{
  const char *why = "empty";
  uint64_t v;
  if (!s || !*s ||
      !parse_with_unit(s, size_units, sizeof size_units / sizeof *size_units, 1, &v, &why))
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s: '%s' is %s: give %s", what,
                         s ? s : "", why, SIZE_FORMS);
  *out = v;
  return TPORT_OK;
}

int units_parse_duration_ms(const char *s, units_time bare, const char *what, uint64_t *out,
                            tport_err *err)
{
  const char *why = "empty";
  uint64_t v;
  if (!s || !*s ||
      !parse_with_unit(s, time_units, sizeof time_units / sizeof *time_units,
                       bare == UNITS_S ? 1000 : 1, &v, &why))
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s: '%s' is %s: give %s (a bare number is %s)",
                         what, s ? s : "", why, TIME_FORMS,
                         bare == UNITS_S ? "seconds" : "milliseconds");
  *out = v;
  return TPORT_OK;
}

int units_parse_log_level(const char *s, const char *what, int *out, tport_err *err)
{
  static const char *const names[] = {"error", "warn", "info", "debug"};
  for (int i = 0; s && i < 4; i++)
    if (strcasecmp(s, names[i]) == 0 || (s[0] == '0' + i && s[1] == '\0')) {
      *out = i;
      return TPORT_OK;
    }
  if (s && strcasecmp(s, "warning") == 0) {
    *out = 1;
    return TPORT_OK;
  }
  return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                       "%s: '%s' is not a log level: error, warn, info or debug (or 0 to 3)", what,
                       s ? s : "");
}
