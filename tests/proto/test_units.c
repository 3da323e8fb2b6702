/* units.c: sizes, durations and log levels as people type them. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "units.h"

static uint64_t size_ok(const char *s)
{
  uint64_t v = 0;
  tport_err e = {0};
  cr_assert_eq(units_parse_size(s, "--quota", &v, &e), TPORT_OK, "'%s': %s", s, e.msg);
  return v;
}

static void size_bad(const char *s, const char *why)
{
  uint64_t v = 77;
  tport_err e = {0};
  cr_assert_eq(units_parse_size(s, "--quota", &v, &e), TPORT_INVALID_ARGUMENT, "'%s' accepted", s);
  cr_assert_eq(v, 77, "'%s' wrote its output", s);
  cr_assert(strstr(e.msg, "--quota"), "%s", e.msg);
  cr_assert(strstr(e.msg, "GiB"), "the accepted forms are named: %s", e.msg);
  cr_assert(strstr(e.msg, why), "'%s': %s", s, e.msg);
}

Test(units, sizes_in_every_spelling_people_type)
{
  cr_assert_eq(size_ok("0"), 0);
  cr_assert_eq(size_ok("4096"), 4096);
  cr_assert_eq(size_ok("64K"), 64ull << 10);
  cr_assert_eq(size_ok("80M"), 80ull << 20);
  cr_assert_eq(size_ok("1G"), 1ull << 30);
  cr_assert_eq(size_ok("1g"), 1ull << 30);
  cr_assert_eq(size_ok("2T"), 2ull << 40);
  cr_assert_eq(size_ok("1GiB"), 1ull << 30);
  cr_assert_eq(size_ok("64 GiB"), 64ull << 30); /* as --help prints it */
  cr_assert_eq(size_ok("1gib"), 1ull << 30);
  cr_assert_eq(size_ok("1GB"), 1000000000ull);
  cr_assert_eq(size_ok("3kb"), 3000);
  cr_assert_eq(size_ok("1.5G"), 3ull << 29);
  cr_assert_eq(size_ok("0.5KiB"), 512);
  cr_assert_eq(size_ok("2.25MB"), 2250000);
  cr_assert_eq(size_ok("12B"), 12);
  cr_assert_eq(size_ok("+7"), 7);
}

Test(units, sizes_refused_with_the_reason_and_the_forms)
{
  size_bad("", "empty");
  size_bad("-5", "negative");
  size_bad("-1G", "negative");
  size_bad("abc", "not a number");
  size_bad("G", "not a number");
  size_bad("1X", "unknown unit");
  size_bad("1 G B", "unknown unit");
  size_bad("1.5", "whole");       /* 1.5 bytes */
  size_bad("1.0000001K", "whole");
  size_bad("18446744073709551616", "out of range");
  size_bad("16777216T", "out of range"); /* 2^64 */
  size_bad("99999999999999999999999", "out of range");
}

Test(units, size_limits_exact)
{
  cr_assert_eq(size_ok("18446744073709551615"), UINT64_MAX);
  cr_assert_eq(size_ok("16777215T"), 16777215ull << 40);
  size_bad("0.000000000000000001G", "whole"); /* 1e-18 GiB */
  size_bad("1.0000000000000000001G", "out of range"); /* past 18 fraction digits */
}

static uint64_t ms_ok(const char *s, units_time bare)
{
  uint64_t v = 0;
  tport_err e = {0};
  cr_assert_eq(units_parse_duration_ms(s, bare, "--ttl", &v, &e), TPORT_OK, "'%s': %s", s, e.msg);
  return v;
}

static void ms_bad(const char *s, const char *why)
{
  uint64_t v = 77;
  tport_err e = {0};
  cr_assert_eq(units_parse_duration_ms(s, UNITS_S, "--ttl", &v, &e), TPORT_INVALID_ARGUMENT,
               "'%s' accepted", s);
  cr_assert_eq(v, 77);
  cr_assert(strstr(e.msg, "--ttl") && strstr(e.msg, "500ms"), "%s", e.msg);
  cr_assert(strstr(e.msg, "seconds"), "the bare unit is named: %s", e.msg);
  cr_assert(strstr(e.msg, why), "'%s': %s", s, e.msg);
}

Test(units, durations_with_units_and_the_flags_own_bare_unit)
{
  cr_assert_eq(ms_ok("5", UNITS_S), 5000);
  cr_assert_eq(ms_ok("5", UNITS_MS), 5);
  cr_assert_eq(ms_ok("1.5", UNITS_S), 1500);
  cr_assert_eq(ms_ok("250ms", UNITS_S), 250);
  cr_assert_eq(ms_ok("30s", UNITS_MS), 30000);
  cr_assert_eq(ms_ok("2m", UNITS_S), 120000);
  cr_assert_eq(ms_ok("1.5h", UNITS_S), 5400000);
  cr_assert_eq(ms_ok("7d", UNITS_S), 7ull * 86400000);
  cr_assert_eq(ms_ok("10 min", UNITS_S), 600000);
  cr_assert_eq(ms_ok("0", UNITS_S), 0);
}

Test(units, durations_refused)
{
  ms_bad("-5", "negative");
  ms_bad("abc", "not a number");
  ms_bad("5x", "unknown unit");
  ms_bad("1.0005", "whole"); /* 1000.5 ms */
  ms_bad("0.5ms", "whole");
  ms_bad("99999999999999999999d", "out of range");
  ms_bad("213503982335d", "out of range"); /* past 2^64 ms */
  ms_bad("", "empty");
}

Test(units, log_levels_by_name_or_number)
{
  static const struct {
    const char *s;
    int level;
  } ok[] = {{"error", 0}, {"warn", 1}, {"warning", 1}, {"info", 2}, {"INFO", 2},
            {"debug", 3}, {"0", 0},    {"3", 3}};
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    int v = -1;
    tport_err e = {0};
    cr_assert_eq(units_parse_log_level(ok[i].s, "--log-level", &v, &e), TPORT_OK, "%s", ok[i].s);
    cr_assert_eq(v, ok[i].level, "%s", ok[i].s);
  }
  static const char *const bad[] = {"4", "-1", "verbose", "", "2x", "00"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    int v = -1;
    tport_err e = {0};
    cr_assert_eq(units_parse_log_level(bad[i], "--log-level", &v, &e), TPORT_INVALID_ARGUMENT,
                 "'%s' accepted", bad[i]);
    cr_assert(strstr(e.msg, "error, warn, info or debug"), "%s", e.msg);
    cr_assert_eq(v, -1);
  }
}
