/* local_secret.c: the secret of the user who runs tportd (see local_secret.h). */
#include "local_secret.h"

#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <libgen.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#define FILE_NAME "local-secret"
/* the most a valid file holds: 128 hex digits, a newline, some spaces */
#define FILE_MAX 4 * HELLO_SECRET_MAX_BYTES

/* The default directory (without the file), into buf. */
static void default_dir(char *buf, size_t len)
{
  const char *x = getenv("XDG_RUNTIME_DIR");
  if (x && x[0] == '/' && strlen(x) < LOCAL_SECRET_PATH_MAX - 40)
    snprintf(buf, len, "%s/tensorport", x);
  else
    snprintf(buf, len, "/tmp/tensorport-%u", (unsigned)geteuid());
}

int transport_local_secret_default(char *buf, size_t len, bool *off, tport_err *err)
{
  *off = false;
  buf[0] = 0;
  const char *env = getenv(LOCAL_SECRET_ENV);
  if (env && *env) {
    if (strcmp(env, "off") == 0) {
      *off = true;
      return TPORT_OK;
    }
    if (strlen(env) >= len || strlen(env) >= LOCAL_SECRET_PATH_MAX)
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s is longer than %d bytes",
                           LOCAL_SECRET_ENV, LOCAL_SECRET_PATH_MAX - 1);
    snprintf(buf, len, "%s", env);
    return TPORT_OK;
  }
  char dir[LOCAL_SECRET_PATH_MAX];
  default_dir(dir, sizeof dir);
  if (strlen(dir) + sizeof "/" FILE_NAME > len)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "the local secret's path is too long");
  snprintf(buf, len, "%s/%s", dir, FILE_NAME);
  return TPORT_OK;
}

/* Is path the default one (whose directory is ours to make and must be private)? */
static bool is_default(const char *path)
{
  char dir[LOCAL_SECRET_PATH_MAX], def[LOCAL_SECRET_PATH_MAX + sizeof FILE_NAME + 1];
  default_dir(dir, sizeof dir);
  snprintf(def, sizeof def, "%s/%s", dir, FILE_NAME);
  return strcmp(path, def) == 0;
}

/* The directory of path: for the default one, a directory (not a link)
 * owned by this user with no access for group or others; for any other,
 * one that nobody else may replace our file in (owned by this user or root,
 * and writable by others only if sticky, as /tmp). */
static int check_dir(const char *path, bool strict, tport_err *err)
{
  char copy[LOCAL_SECRET_PATH_MAX];
  if (strlen(path) >= sizeof copy)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "the local secret's path is too long");
  snprintf(copy, sizeof copy, "%s", path);
  const char *dir = dirname(copy);
  struct stat st;
  if (lstat(dir, &st) != 0)
    return tport_err_set(err, TPORT_FAILED_PRECONDITION, "local secret directory %s: %s", dir,
                         strerror(errno));
  uid_t me = geteuid();
  if (!S_ISDIR(st.st_mode))
    return tport_err_set(err, TPORT_PERMISSION_DENIED,
                         "local secret directory %s is not a directory (a link?): refused", dir);
  if (strict && (st.st_uid != me || (st.st_mode & 077)))
    return tport_err_set(err, TPORT_PERMISSION_DENIED,
                         "local secret directory %s belongs to uid %u with mode %03o: it must be "
                         "this user's (uid %u) with mode 700; remove it, or set %s",
                         dir, (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777), (unsigned)me,
                         LOCAL_SECRET_ENV);
  if (!strict && ((st.st_uid != me && st.st_uid != 0) ||
                  ((st.st_mode & 022) && !(st.st_mode & S_ISVTX))))
    return tport_err_set(err, TPORT_PERMISSION_DENIED,
                         "local secret directory %s (uid %u, mode %03o) lets another user replace "
                         "the file: use a directory of this user's",
                         dir, (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777));
  return TPORT_OK;
}

/* Reads and checks an open file's secret. */
static int read_fd(int fd, const char *path, uint8_t *out, size_t *len, tport_err *err)
{
  struct stat st;
  if (fstat(fd, &st) != 0)
    return tport_err_set(err, TPORT_INTERNAL, "local secret %s: %s", path, strerror(errno));
  if (!S_ISREG(st.st_mode))
    return tport_err_set(err, TPORT_PERMISSION_DENIED, "local secret %s is not a regular file",
                         path);
  if (st.st_uid != geteuid())
    return tport_err_set(err, TPORT_PERMISSION_DENIED,
                         "local secret %s belongs to uid %u, not this user (uid %u): refused", path,
                         (unsigned)st.st_uid, (unsigned)geteuid());
  if (st.st_mode & 077)
    return tport_err_set(err, TPORT_PERMISSION_DENIED,
                         "local secret %s can be read by group or others (mode %03o): refused; "
                         "remove it (tportd makes a new one) or chmod 600 it",
                         path, (unsigned)(st.st_mode & 0777));
  if (st.st_size > FILE_MAX)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "local secret %s is %lld bytes: not a secret (at most %d)", path,
                         (long long)st.st_size, FILE_MAX);
  char buf[FILE_MAX + 1];
  size_t n = 0;
  for (;;) {
    ssize_t k = read(fd, buf + n, sizeof buf - 1 - n);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0) {
      OPENSSL_cleanse(buf, sizeof buf);
      return tport_err_set(err, TPORT_INTERNAL, "local secret %s: %s", path, strerror(errno));
    }
    if (k == 0 || (n += (size_t)k) == sizeof buf - 1)
      break;
  }
  buf[n] = 0;
  tport_err why;
  int rc = transport_hello_secret_parse(buf, out, len, &why);
  OPENSSL_cleanse(buf, sizeof buf);
  if (rc)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "local secret %s: %s (remove it: tportd makes a new one)", path, why.msg);
  return TPORT_OK;
}

int transport_local_secret_read(const char *path, uint8_t out[HELLO_SECRET_MAX_BYTES], size_t *len,
                                tport_err *err)
{
  int rc = check_dir(path, is_default(path), err);
  if (rc) {
    /* a default directory not made yet: no server has made a secret */
    struct stat st;
    char copy[LOCAL_SECRET_PATH_MAX];
    snprintf(copy, sizeof copy, "%s", path);
    if (lstat(dirname(copy), &st) != 0 && errno == ENOENT)
      return tport_err_set(err, TPORT_NOT_FOUND, "local secret %s: no such file", path);
    return rc;
  }
  /* O_NOFOLLOW: a link is refused, never followed; O_NONBLOCK: a fifo
   * planted there does not hang the reader (fstat refuses it) */
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT)
      return tport_err_set(err, TPORT_NOT_FOUND, "local secret %s: no such file", path);
    if (e == ELOOP)
      return tport_err_set(err, TPORT_PERMISSION_DENIED,
                           "local secret %s is a symbolic link: refused", path);
    return tport_err_set(err, TPORT_PERMISSION_DENIED, "local secret %s: %s", path, strerror(e));
  }
  rc = read_fd(fd, path, out, len, err);
  close(fd);
  return rc;
}

/* Writes a fresh secret to a temporary file beside path and links it into
 * place: the file appears whole or not at all, and an existing one (another
 * start's) is never replaced.  TPORT_ALREADY_EXISTS when it lost the race. */
static int make(const char *path, uint8_t *out, size_t *len, tport_err *err)
{
  uint8_t secret[LOCAL_SECRET_BYTES];
  char hex[2 * LOCAL_SECRET_BYTES + 2], tmp[LOCAL_SECRET_PATH_MAX + 64];
  uint8_t salt[8];
  if (RAND_bytes(secret, sizeof secret) != 1 || RAND_bytes(salt, sizeof salt) != 1)
    return tport_err_set(err, TPORT_INTERNAL, "RAND_bytes failed (the local secret)");
  for (size_t i = 0; i < sizeof secret; i++)
    snprintf(hex + 2 * i, 3, "%02x", secret[i]);
  hex[2 * LOCAL_SECRET_BYTES] = '\n';
  hex[2 * LOCAL_SECRET_BYTES + 1] = 0;
  snprintf(tmp, sizeof tmp, "%s.%d.%02x%02x%02x%02x%02x%02x%02x%02x", path, (int)getpid(), salt[0],
           salt[1], salt[2], salt[3], salt[4], salt[5], salt[6], salt[7]);
  int rc = TPORT_OK;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    rc = tport_err_set(err, TPORT_PERMISSION_DENIED, "local secret %s: %s", tmp, strerror(errno));
  size_t want = 2 * LOCAL_SECRET_BYTES + 1;
  if (!rc && (fchmod(fd, 0600) != 0 || write(fd, hex, want) != (ssize_t)want || fsync(fd) != 0))
    rc = tport_err_set(err, TPORT_INTERNAL, "local secret %s: %s", tmp, strerror(errno));
  if (fd >= 0)
    close(fd);
  if (!rc && link(tmp, path) != 0)
    rc = errno == EEXIST ? TPORT_ALREADY_EXISTS
                         : tport_err_set(err, TPORT_PERMISSION_DENIED, "local secret %s: %s", path,
                                         strerror(errno));
  if (fd >= 0)
    unlink(tmp);
  OPENSSL_cleanse(hex, sizeof hex);
  if (!rc) {
    memcpy(out, secret, sizeof secret);
    *len = sizeof secret;
  }
  OPENSSL_cleanse(secret, sizeof secret);
  return rc;
}

int transport_local_secret_ensure(const char *path, uint8_t out[HELLO_SECRET_MAX_BYTES],
                                  size_t *len, tport_err *err)
{
  if (strlen(path) >= LOCAL_SECRET_PATH_MAX)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "the local secret's path is too long");
  if (is_default(path)) {
    char copy[LOCAL_SECRET_PATH_MAX];
    snprintf(copy, sizeof copy, "%s", path);
    const char *dir = dirname(copy);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
      return tport_err_set(err, TPORT_FAILED_PRECONDITION, "local secret directory %s: %s", dir,
                           strerror(errno));
  }
  /* read what is there; make one where there is none; read the winner's
   * when another start made one in between */
  for (int attempt = 0; attempt < 3; attempt++) {
    int rc = transport_local_secret_read(path, out, len, err);
    if (rc != TPORT_NOT_FOUND)
      return rc;
    rc = make(path, out, len, err);
    if (rc != TPORT_ALREADY_EXISTS)
      return rc;
  }
  return tport_err_set(err, TPORT_INTERNAL, "local secret %s: made and removed by another process",
                       path);
}

bool transport_local_secret_url_ok(const char *url)
{
  static const char *const local[] = {"ipc://", "unix://", "abstract://", "inproc://"};
  static const char *const net[] = {"tcp", "tcp4", "tcp6", "tls+tcp", "tls+tcp4", "tls+tcp6",
                                    "ws",  "ws4",  "ws6",  "wss",     "wss4",     "wss6"};
  for (size_t i = 0; i < sizeof local / sizeof *local; i++)
    if (strncasecmp(url, local[i], strlen(local[i])) == 0)
      return true;
  const char *sep = strstr(url, "://");
  if (!sep)
    return false;
  size_t slen = (size_t)(sep - url);
  bool known = false;
  for (size_t i = 0; i < sizeof net / sizeof *net && !known; i++)
    known = slen == strlen(net[i]) && strncasecmp(url, net[i], slen) == 0;
  if (!known)
    return false;
  const char *h = sep + 3, *end;
  char host[64];
  if (*h == '[') {
    end = strchr(++h, ']');
    if (!end || (end[1] != ':' && end[1] != '/' && end[1] != 0))
      return false;
  } else {
    end = h + strcspn(h, ":/");
  }
  if ((size_t)(end - h) >= sizeof host)
    return false;
  memcpy(host, h, (size_t)(end - h));
  host[end - h] = 0;
  struct in_addr a4;
  struct in6_addr a6;
  if (inet_pton(AF_INET, host, &a4) == 1)
    return (ntohl(a4.s_addr) >> 24) == 127;
  if (inet_pton(AF_INET6, host, &a6) == 1)
    return IN6_IS_ADDR_LOOPBACK(&a6);
  return strcasecmp(host, "localhost") == 0;
}

int transport_local_binding(nng_pipe p, bool server_side, uint8_t out[HELLO_BINDING_BYTES],
                            bool *bound, tport_err *err)
{
  *bound = false;
  nng_sockaddr sa;
  if (nng_pipe_get_addr(p, server_side ? NNG_OPT_LOCADDR : NNG_OPT_REMADDR, &sa) != 0)
    return TPORT_OK;
  return transport_local_binding_addr(&sa, out, bound, err);
}

int transport_local_binding_addr(const nng_sockaddr *psa, uint8_t out[HELLO_BINDING_BYTES],
                                 bool *bound, tport_err *err)
{
  static const char DOMAIN[] = "tensorport-local-binding-v1";
  const nng_sockaddr sa = *psa;
  *bound = false;
  uint8_t msg[sizeof DOMAIN + 1 + 16 + 2];
  size_t n = sizeof DOMAIN; /* its terminating zero included */
  memcpy(msg, DOMAIN, sizeof DOMAIN);
  if (sa.s_family == NNG_AF_INET) {
    msg[n++] = 4;
    memcpy(msg + n, &sa.s_in.sa_addr, 4);
    n += 4;
    memcpy(msg + n, &sa.s_in.sa_port, 2);
    n += 2;
  } else if (sa.s_family == NNG_AF_INET6) {
    msg[n++] = 6;
    memcpy(msg + n, sa.s_in6.sa_addr, 16);
    n += 16;
    memcpy(msg + n, &sa.s_in6.sa_port, 2);
    n += 2;
  } else {
    return TPORT_OK;
  }
  unsigned int len = 0;
  if (!EVP_Digest(msg, n, out, &len, EVP_sha256(), NULL) || len != HELLO_BINDING_BYTES)
    return tport_err_set(err, TPORT_INTERNAL, "SHA-256 failed (the local binding)");
  *bound = true;
  return TPORT_OK;
}
