/* test_log.c: server/log.c's lines, text and JSON: every JSON line parsed by
 * a strict parser (RFC 8259) and its strings decoded back, hostile values
 * (quotes, control characters, invalid UTF-8, huge) escaped, lines of
 * concurrent threads whole; and tportd --log-format json end to end (an
 * authentication failure with its tenant and peer, a clean SIGTERM). */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <regex.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"
#include "service_util.h"

/* ---------------------------------------------------------------- a strict JSON parser */

typedef struct jfield {
  char key[64];
  char *value; /* decoded, for string values (malloc'ed); NULL otherwise */
} jfield;

typedef struct jobj {
  jfield f[32];
  int n;
} jobj;

typedef struct jp {
  const char *p, *end;
  const char *err;
} jp;

static void ws(jp *j)
{
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r'))
    j->p++;
}

static bool fail(jp *j, const char *why)
{
  if (!j->err)
    j->err = why;
  return false;
}

static void put_utf8(char **o, unsigned cp)
{
  unsigned char *u = (unsigned char *)*o;
  if (cp < 0x80) {
    *u++ = (unsigned char)cp;
  } else if (cp < 0x800) {
    *u++ = (unsigned char)(0xC0 | cp >> 6);
    *u++ = (unsigned char)(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *u++ = (unsigned char)(0xE0 | cp >> 12);
    *u++ = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    *u++ = (unsigned char)(0x80 | (cp & 0x3F));
  } else {
    *u++ = (unsigned char)(0xF0 | cp >> 18);
    *u++ = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
    *u++ = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    *u++ = (unsigned char)(0x80 | (cp & 0x3F));
  }
  *o = (char *)u;
}

static bool hex4(jp *j, unsigned *v)
{
  *v = 0;
  for (int i = 0; i < 4; i++, j->p++) {
    if (j->p >= j->end)
      return fail(j, "short \\u");
    char c = *j->p;
    int d = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (d < 0)
      return fail(j, "bad \\u digit");
    *v = *v << 4 | (unsigned)d;
  }
  return true;
}

/* A string; *out (when not NULL) gets it decoded (malloc'ed). */
static bool jstring(jp *j, char **out)
{
  if (j->p >= j->end || *j->p != '"')
    return fail(j, "expected a string");
  j->p++;
  char *buf = malloc((size_t)(j->end - j->p) * 4 + 1), *o = buf;
  while (j->p < j->end && *j->p != '"') {
    unsigned char c = (unsigned char)*j->p;
    if (c < 0x20) {
      free(buf);
      return fail(j, "a raw control character in a string");
    }
    if (c == '\\') {
      j->p++;
      if (j->p >= j->end) {
        free(buf);
        return fail(j, "short escape");
      }
      char e = *j->p++;
      unsigned cp;
      switch (e) {
      case '"': *o++ = '"'; break;
      case '\\': *o++ = '\\'; break;
      case '/': *o++ = '/'; break;
      case 'b': *o++ = '\b'; break;
      case 'f': *o++ = '\f'; break;
      case 'n': *o++ = '\n'; break;
      case 'r': *o++ = '\r'; break;
      case 't': *o++ = '\t'; break;
      case 'u':
        if (!hex4(j, &cp)) {
          free(buf);
          return false;
        }
        if (cp >= 0xD800 && cp <= 0xDFFF) {
          free(buf);
          return fail(j, "a lone surrogate");
        }
        put_utf8(&o, cp);
        break;
      default: free(buf); return fail(j, "bad escape");
      }
      continue;
    }
    size_t k = log_utf8_len((const unsigned char *)j->p, (size_t)(j->end - j->p));
    if (!k) {
      free(buf);
      return fail(j, "invalid UTF-8");
    }
    memcpy(o, j->p, k);
    o += k;
    j->p += k;
  }
  if (j->p >= j->end) {
    free(buf);
    return fail(j, "unterminated string");
  }
  j->p++;
  *o = 0;
  if (out)
    *out = buf;
  else
    free(buf);
  return true;
}

static bool jvalue(jp *j, int depth);

static bool jnumber(jp *j)
{
  regex_t r;
  regcomp(&r, "^-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?", REG_EXTENDED);
  char tmp[64];
  size_t n = (size_t)(j->end - j->p) < sizeof tmp - 1 ? (size_t)(j->end - j->p) : sizeof tmp - 1;
  memcpy(tmp, j->p, n);
  tmp[n] = 0;
  regmatch_t m;
  bool ok = regexec(&r, tmp, 1, &m, 0) == 0 && m.rm_eo > 0;
  regfree(&r);
  if (!ok)
    return fail(j, "bad number");
  j->p += m.rm_eo;
  return true;
}

static bool jvalue(jp *j, int depth)
{
  if (depth > 16)
    return fail(j, "too deep");
  ws(j);
  if (j->p >= j->end)
    return fail(j, "expected a value");
  char c = *j->p;
  if (c == '"')
    return jstring(j, NULL);
  if (c == '{' || c == '[') {
    char close = c == '{' ? '}' : ']';
    j->p++;
    ws(j);
    if (j->p < j->end && *j->p == close) {
      j->p++;
      return true;
    }
    for (;;) {
      if (c == '{') {
        ws(j);
        if (!jstring(j, NULL))
          return false;
        ws(j);
        if (j->p >= j->end || *j->p++ != ':')
          return fail(j, "expected :");
      }
      if (!jvalue(j, depth + 1))
        return false;
      ws(j);
      if (j->p < j->end && *j->p == ',') {
        j->p++;
        continue;
      }
      if (j->p < j->end && *j->p == close) {
        j->p++;
        return true;
      }
      return fail(j, "expected , or a close");
    }
  }
  static const char *const lit[] = {"true", "false", "null"};
  for (int i = 0; i < 3; i++)
    if ((size_t)(j->end - j->p) >= strlen(lit[i]) && !strncmp(j->p, lit[i], strlen(lit[i]))) {
      j->p += strlen(lit[i]);
      return true;
    }
  return jnumber(j);
}

/* Parses one line as a JSON object whose values are strings (as log.c
 * writes them); fails the test on anything else. */
static void parse_line(const char *line, size_t len, jobj *o)
{
  jp j = {line, line + len, NULL};
  o->n = 0;
  ws(&j);
  cr_assert(j.p < j.end && *j.p == '{', "a line is an object: %.*s", (int)len, line);
  j.p++;
  ws(&j);
  bool first = true;
  while (j.p < j.end && *j.p != '}') {
    if (!first) {
      cr_assert(*j.p == ',', "expected , in: %.*s", (int)len, line);
      j.p++;
      ws(&j);
    }
    first = false;
    char *key = NULL, *val = NULL;
    cr_assert(jstring(&j, &key), "%s in: %.*s", j.err, (int)len, line);
    ws(&j);
    cr_assert(j.p < j.end && *j.p == ':', "expected : in: %.*s", (int)len, line);
    j.p++;
    ws(&j);
    cr_assert(jstring(&j, &val), "values are strings (%s): %.*s", j.err ? j.err : "", (int)len,
              line);
    cr_assert_lt(o->n, 32);
    for (int i = 0; i < o->n; i++)
      cr_assert(strcmp(o->f[i].key, key), "key %s twice: %.*s", key, (int)len, line);
    snprintf(o->f[o->n].key, sizeof o->f[o->n].key, "%s", key);
    o->f[o->n].value = val;
    o->n++;
    free(key);
    ws(&j);
  }
  cr_assert(j.p < j.end && *j.p == '}', "unterminated object: %.*s", (int)len, line);
  j.p++;
  ws(&j);
  cr_assert(j.p == j.end, "nothing after the object: %.*s", (int)len, line);
  /* the generic parser agrees */
  jp g = {line, line + len, NULL};
  cr_assert(jvalue(&g, 0), "%s: %.*s", g.err, (int)len, line);
}

static const char *get(const jobj *o, const char *key)
{
  for (int i = 0; i < o->n; i++)
    if (!strcmp(o->f[i].key, key))
      return o->f[i].value;
  return NULL;
}

static void jobj_free(jobj *o)
{
  for (int i = 0; i < o->n; i++)
    free(o->f[i].value);
  o->n = 0;
}

/* Every line of text is a JSON log line: time, level, message first. */
static int check_lines(const char *text, void (*each)(const jobj *, void *), void *arg)
{
  int n = 0;
  for (const char *p = text; *p;) {
    const char *nl = strchr(p, '\n');
    cr_assert(nl, "every line ends with a line feed");
    jobj o;
    parse_line(p, (size_t)(nl - p), &o);
    cr_assert(o.n >= 3 && !strcmp(o.f[0].key, "time") && !strcmp(o.f[1].key, "level") &&
                  !strcmp(o.f[2].key, "message"),
              "time, level, message: %.*s", (int)(nl - p), p);
    regex_t r;
    regcomp(&r, "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\.[0-9]{3}Z$",
            REG_EXTENDED | REG_NOSUB);
    cr_assert_eq(regexec(&r, get(&o, "time"), 0, NULL, 0), 0, "RFC 3339 UTC time: %s",
                 get(&o, "time"));
    regfree(&r);
    const char *lv = get(&o, "level");
    cr_assert(!strcmp(lv, "error") || !strcmp(lv, "warn") || !strcmp(lv, "info") ||
                  !strcmp(lv, "debug"),
              "level %s", lv);
    if (each)
      each(&o, arg);
    jobj_free(&o);
    n++;
    p = nl + 1;
  }
  return n;
}

/* ---------------------------------------------------------------- stderr captured */

static int saved = -1;
static char capture_path[64];

static void capture_begin(void)
{
  snprintf(capture_path, sizeof capture_path, "/tmp/tport-log-XXXXXX");
  int fd = mkstemp(capture_path);
  cr_assert_geq(fd, 0);
  saved = dup(STDERR_FILENO);
  dup2(fd, STDERR_FILENO);
  close(fd);
}

static char *read_file(const char *path)
{
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f, "%s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
  b[n] = 0;
  fclose(f);
  return b;
}

static char *capture_end(void)
{
  dup2(saved, STDERR_FILENO);
  close(saved);
  char *b = read_file(capture_path);
  unlink(capture_path);
  return b;
}

/* ---------------------------------------------------------------- tests */

static const char *const hostile = "a \"quoted\" \\ back\nnew line\ttab \x01\x1f\x7f ctrl "
                                   "\xc3\xa9t\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80 bad:\xff\xc3";
/* the same decoded: every byte that is not UTF-8 is U+FFFD */
static const char *const hostile_back = "a \"quoted\" \\ back\nnew line\ttab \x01\x1f\x7f ctrl "
                                        "\xc3\xa9t\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80 "
                                        "bad:\xef\xbf\xbd\xef\xbf\xbd";

static void check_hostile(const jobj *o, void *arg)
{
  int *seen = arg;
  if (strcmp(get(o, "message"), hostile_back))
    return;
  (*seen)++;
  cr_assert_str_eq(get(o, "level"), "warn");
  cr_assert_str_eq(get(o, "tenant"), hostile_back);
  cr_assert_str_eq(get(o, "peer"), "127.0.0.1");
  cr_assert_null(get(o, "absent"), "a NULL value leaves its field out");
  cr_assert_str_eq(get(o, "code"), "UNAUTHENTICATED");
}

Test(log, json_escapes_everything)
{
  log_set_level(LOG_INFO);
  log_set_format(LOG_JSON);
  capture_begin();
  log_event(LOG_WARN, hostile, "tenant", hostile, "peer", "127.0.0.1", "absent", NULL, "code",
            "UNAUTHENTICATED", NULL);
  log_msg(LOG_ERROR, "formatted %d %s", 42, "\"x\"");
  log_event(LOG_DEBUG, "not written at info", NULL);
  char *big = malloc(20001);
  memset(big, '"', 20000); /* each one escapes to two bytes */
  big[20000] = 0;
  log_event(LOG_INFO, "huge", "value", big, "after", "dropped", NULL);
  log_event(LOG_INFO, big, "k", "v", NULL);
  char *out = capture_end();
  log_set_format(LOG_TEXT);
  int seen = 0;
  cr_assert_eq(check_lines(out, check_hostile, &seen), 4, "%s", out);
  cr_assert_eq(seen, 1);
  cr_assert(strstr(out, "\"message\":\"formatted 42 \\\"x\\\"\""), "%s", out);
  cr_assert_null(strstr(out, "not written"));
  cr_assert(strlen(out) < 3 * 8192, "huge values are cut to a line of at most 8 KiB");
  free(big);
  free(out);
}

Test(log, text_lines_stay_lines)
{
  log_set_level(LOG_DEBUG);
  log_set_format(LOG_TEXT);
  capture_begin();
  log_event(LOG_INFO, "connection dropped", "connection", "7", "peer", "10.0.0.1", "tenant",
            "a b\"c\nd", "reason", "too many requests unanswered", NULL);
  log_msg(LOG_DEBUG, "message with\na newline");
  char *out = capture_end();
  log_set_level(LOG_INFO);
  regex_t r;
  regcomp(&r,
          "^tportd [0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z INFO connection dropped "
          "connection=7 peer=10\\.0\\.0\\.1 tenant=\"a b\\\\\"c\\\\x0ad\" "
          "reason=\"too many requests unanswered\"\n"
          "tportd [^ ]+ DEBUG message with\\\\x0aa newline\n$",
          REG_EXTENDED | REG_NOSUB);
  cr_assert_eq(regexec(&r, out, 0, NULL, 0), 0, "%s", out);
  regfree(&r);
  free(out);
}

static void *log_many(void *arg)
{
  char v[600];
  memset(v, 'a' + (int)(intptr_t)arg, sizeof v - 1);
  v[sizeof v - 1] = 0;
  for (int i = 0; i < 500; i++)
    log_event(LOG_INFO, "from a thread", "value", v, NULL);
  return NULL;
}

Test(log, concurrent_lines_are_whole)
{
  log_set_level(LOG_INFO);
  log_set_format(LOG_JSON);
  capture_begin();
  pthread_t th[4];
  for (intptr_t i = 0; i < 4; i++)
    pthread_create(&th[i], NULL, log_many, (void *)i);
  for (int i = 0; i < 4; i++)
    pthread_join(th[i], NULL);
  char *out = capture_end();
  log_set_format(LOG_TEXT);
  cr_assert_eq(check_lines(out, NULL, NULL), 2000);
  free(out);
}

/* ---------------------------------------------------------------- tportd */

#define ALICE "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"
#define WRONG "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"

static void find_auth_failure(const jobj *o, void *arg)
{
  int *seen = arg;
  if (strcmp(get(o, "message"), "authentication failed"))
    return;
  (*seen)++;
  cr_assert_str_eq(get(o, "level"), "warn");
  cr_assert_str_eq(get(o, "tenant"), "alice");
  cr_assert_str_eq(get(o, "peer"), "ipc");
  cr_assert(get(o, "connection") && atoi(get(o, "connection")) > 0);
}

Test(log, tportd_json_lines)
{
  char dir[] = "/tmp/tport-logtest-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char auth[128], errpath[128], url[160];
  snprintf(auth, sizeof auth, "%s/auth", dir);
  snprintf(errpath, sizeof errpath, "%s/stderr", dir);
  snprintf(url, sizeof url, "ipc://%s/tportd.sock", dir);
  FILE *f = fopen(auth, "w");
  fprintf(f, "alice %s\n", ALICE);
  fclose(f);
  chmod(auth, 0600);
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(fd, STDERR_FILENO);
    execl(TPORTD_PATH, TPORTD_PATH, "--listen", url, "--auth-file", auth, "--log-format", "json",
          "--log-level", "3", "--http-listen", "off", (char *)NULL);
    _exit(127);
  }
  tport_client *c = NULL;
  tport_err err;
  int rc = -1;
  for (int i = 0; i < 400 && rc != 0; i++) {
    tport_connect_options o = {.tenant = "alice", .secret = ALICE, .timeout_ms = 2000};
    rc = tport_connect(url, &o, &c, &err);
    if (rc)
      usleep(25000);
  }
  cr_assert_eq(rc, 0, "%s", err.msg);
  tport_close(c);
  tport_connect_options bad = {.tenant = "alice", .secret = WRONG, .timeout_ms = 5000};
  cr_assert_eq(tport_connect(url, &bad, &c, &err), TPORT_UNAUTHENTICATED, "%s", err.msg);
  cr_assert_eq(svc_terminate(pid), 0, "tportd exits 0 on SIGTERM");
  char *out = read_file(errpath);
  int seen = 0;
  int lines = check_lines(out, find_auth_failure, &seen);
  cr_assert_geq(lines, 5, "%s", out);
  cr_assert_eq(seen, 1, "%s", out);
  cr_assert(strstr(out, "\"message\":\"connection authenticated\",\"tenant\":\"alice\""), "%s",
            out);
  cr_assert(strstr(out, "\"message\":\"request failed\""), "debug: a failed request: %s", out);
  cr_assert(strstr(out, "\"message\":\"stopped\""), "%s", out);
  free(out);
  unlink(errpath);
  unlink(auth);
  rmdir(dir);
}
