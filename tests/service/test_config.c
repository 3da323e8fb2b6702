/* tportd's flags parse what people type (issue 23): sizes, durations and
 * log levels through proto/units.c, whole numbers that refuse signs,
 * junk and overflow, each error naming the flag. */
#include <criterion/criterion.h>
#include <string.h>

#include "config.h"

static int parse(const char *flag, const char *value, server_config *cfg, tport_err *err)
{
  char *argv[] = {"tportd", (char *)flag, (char *)value, NULL};
  config_defaults(cfg);
  return config_parse(cfg, 3, argv, err);
}

Test(config, sizes_as_help_prints_them_and_people_type_them)
{
  static const struct {
    const char *v;
    size_t want;
  } ok[] = {{"64GiB", 64ull << 30}, {"64 GiB", 64ull << 30}, {"1GB", 1000000000ull},
            {"1.5G", 3ull << 29},   {"512M", 512ull << 20},  {"4096", 4096}};
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    server_config c;
    tport_err e = {0};
    cr_assert_eq(parse("--quota", ok[i].v, &c, &e), 0, "%s: %s", ok[i].v, e.msg);
    cr_assert_eq(c.tenant_quota_bytes, ok[i].want, "%s", ok[i].v);
    config_free(&c);
  }
  server_config c;
  tport_err e = {0};
  cr_assert_neq(parse("--quota", "-1G", &c, &e), 0);
  cr_assert(strstr(e.msg, "--quota") && strstr(e.msg, "negative"), "%s", e.msg);
  config_free(&c);
}

Test(config, durations_in_the_flags_own_unit_or_with_one)
{
  server_config c;
  tport_err e = {0};
  cr_assert_eq(parse("--ttl", "10m", &c, &e), 0, "%s", e.msg);
  cr_assert_eq(c.ttl_s, 600);
  config_free(&c);
  cr_assert_eq(parse("--ttl", "90", &c, &e), 0, "%s", e.msg);
  cr_assert_eq(c.ttl_s, 90, "a bare --ttl is seconds");
  config_free(&c);
  cr_assert_eq(parse("--deadline", "2s", &c, &e), 0, "%s", e.msg);
  cr_assert_eq(c.deadline_ms, 2000);
  config_free(&c);
  cr_assert_eq(parse("--deadline", "250", &c, &e), 0, "%s", e.msg);
  cr_assert_eq(c.deadline_ms, 250, "a bare --deadline is milliseconds");
  config_free(&c);
  cr_assert_eq(parse("--max-ttl", "7d", &c, &e), 0, "%s", e.msg);
  cr_assert_eq(c.max_ttl_s, 7 * 86400);
  config_free(&c);
  static const char *const bad[][3] = {{"--ttl", "-5", "negative"},
                                       {"--ttl", "abc", "not a number"},
                                       {"--ttl", "1.5", "whole number of seconds"},
                                       {"--deadline", "0", "zero"},
                                       {"--grace", "5x", "unknown unit"}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    cr_assert_neq(parse(bad[i][0], bad[i][1], &c, &e), 0, "%s %s accepted", bad[i][0], bad[i][1]);
    cr_assert(strstr(e.msg, bad[i][0]) && strstr(e.msg, bad[i][2]), "%s %s: %s", bad[i][0],
              bad[i][1], e.msg);
    config_free(&c);
  }
}

Test(config, log_levels_by_name_and_whole_numbers_without_junk)
{
  server_config c;
  tport_err e = {0};
  cr_assert_eq(parse("--log-level", "debug", &c, &e), 0, "%s", e.msg);
  cr_assert_eq(c.log_level, 3);
  config_free(&c);
  cr_assert_eq(parse("--log-level", "1", &c, &e), 0, "%s", e.msg);
  cr_assert_eq(c.log_level, 1);
  config_free(&c);
  cr_assert_neq(parse("--log-level", "verbose", &c, &e), 0);
  cr_assert(strstr(e.msg, "error, warn, info or debug"), "%s", e.msg);
  config_free(&c);
  static const char *const junk[] = {"-3", " 4", "4x", "+4", "99999999999999999999999", ""};
  for (size_t i = 0; i < sizeof junk / sizeof *junk; i++) {
    cr_assert_neq(parse("--workers", junk[i], &c, &e), 0, "'%s' accepted", junk[i]);
    cr_assert(strstr(e.msg, "--workers"), "%s", e.msg);
    config_free(&c);
  }
}
