/* hello_mac.c: the shared-secret proof of a tenant's identity (see hello_mac.h). */
#include "hello_mac.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char DOMAIN[] = "tensorport-hello-v1";

int transport_hello_secret_parse(const char *hex, uint8_t *out, size_t *len, tport_err *err)
{
  while (isspace((unsigned char)*hex))
    hex++;
  size_t n = 0;
  while (hex[n] && !isspace((unsigned char)hex[n]))
    n++;
  for (const char *p = hex + n; *p; p++)
    if (!isspace((unsigned char)*p))
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "the secret is one word of hex digits");
  if (n % 2 || n < 2 * HELLO_SECRET_MIN_BYTES || n > 2 * HELLO_SECRET_MAX_BYTES)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                         "the secret has %zu hex digits: it needs an even number from %d to %d", n,
                         2 * HELLO_SECRET_MIN_BYTES, 2 * HELLO_SECRET_MAX_BYTES);
  for (size_t i = 0; i < n / 2; i++) {
    int v = 0;
    for (int k = 0; k < 2; k++) {
      char ch = hex[2 * i + (size_t)k];
      int d = isdigit((unsigned char)ch) ? ch - '0'
              : (ch >= 'a' && ch <= 'f') ? ch - 'a' + 10
              : (ch >= 'A' && ch <= 'F') ? ch - 'A' + 10
                                         : -1;
      if (d < 0)
        return tport_err_set(err, TPORT_INVALID_ARGUMENT, "the secret is not hex (a '%c')", ch);
      v = v * 16 + d;
    }
    out[i] = (uint8_t)v;
  }
  *len = n / 2;
  return TPORT_OK;
}

int transport_hello_secret_file(const char *path, uint8_t *out, size_t *len, tport_err *err)
{
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "secret file %s: %s", path, strerror(errno));
  struct stat st;
  char buf[4 * HELLO_SECRET_MAX_BYTES + 1];
  ssize_t n = -1;
  int rc = TPORT_OK;
  if (fstat(fd, &st) != 0)
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "secret file %s: %s", path, strerror(errno));
  else if (st.st_mode & 077)
    rc = tport_err_set(err, TPORT_PERMISSION_DENIED,
                       "secret file %s can be read by others (mode %03o): chmod 600 it", path,
                       (unsigned)(st.st_mode & 0777));
  else if ((n = read(fd, buf, sizeof buf - 1)) < 0)
    rc = tport_err_set(err, TPORT_INVALID_ARGUMENT, "secret file %s: %s", path, strerror(errno));
  close(fd);
  if (rc)
    return rc;
  buf[n] = 0;
  rc = transport_hello_secret_parse(buf, out, len, err);
  OPENSSL_cleanse(buf, sizeof buf);
  if (rc)
    return tport_err_set(err, rc, "secret file %s: %s", path, err->msg);
  return TPORT_OK;
}

int transport_hello_mac(const uint8_t *secret, size_t secret_len,
                        const uint8_t challenge[HELLO_CHALLENGE_BYTES], const char *tenant,
                        const uint8_t *binding, uint8_t out[HELLO_MAC_BYTES], tport_err *err)
{
  size_t tlen = strlen(tenant);
  uint8_t msg[sizeof DOMAIN + HELLO_CHALLENGE_BYTES + 256 + HELLO_BINDING_BYTES];
  if (tlen > 255)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "tenant is %zu bytes: too long", tlen);
  /* DOMAIN's own terminating zero separates it from the challenge */
  size_t n = 0;
  memcpy(msg, DOMAIN, sizeof DOMAIN);
  n += sizeof DOMAIN;
  memcpy(msg + n, challenge, HELLO_CHALLENGE_BYTES);
  n += HELLO_CHALLENGE_BYTES;
  memcpy(msg + n, tenant, tlen);
  n += tlen;
  msg[n++] = 0;
  /* the tenant's terminating zero keeps the binding apart from the name */
  if (binding) {
    memcpy(msg + n, binding, HELLO_BINDING_BYTES);
    n += HELLO_BINDING_BYTES;
  }
  unsigned int outlen = 0;
  if (!HMAC(EVP_sha256(), secret, (int)secret_len, msg, n, out, &outlen) ||
      outlen != HELLO_MAC_BYTES)
    return tport_err_set(err, TPORT_INTERNAL, "HMAC-SHA256 failed");
  return TPORT_OK;
}

bool transport_hello_mac_equal(const uint8_t *a, const uint8_t *b)
{
  return CRYPTO_memcmp(a, b, HELLO_MAC_BYTES) == 0;
}
