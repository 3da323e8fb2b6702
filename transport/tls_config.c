/*
 * tls_config.c: nng TLS configurations for tensorport's servers and clients,
 * built from PEM files (tls_openssl.h): a server's certificate and key and
 * the CAs of the clients it accepts; a client's CAs (else the system store),
 * its own certificate and key, and the name its server must prove.
 *
 * The files are read here rather than by nng_tls_config_ca_file and
 * nng_tls_config_cert_key_file so that an error names the field and file at
 * fault and says why (the engine leaves its reason in tls_config_why);
 * buffers that held a private key are wiped before they are freed.
 */
#include "tls_internal.h"
#include "tls_openssl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#define PEM_FILE_MAX (1 << 20) /* a PEM file bigger than this is not one */

/* Reads a whole PEM file (NUL-terminated, owned by the caller). */
static int read_pem(const char *field, const char *path, char **out, size_t *len, tport_err *err)
{
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return tls_err(err, TPORT_INVALID_ARGUMENT, "%s '%s': %s", field, path, strerror(errno));
  char *buf = malloc(PEM_FILE_MAX + 1);
  if (buf == NULL) {
    fclose(f);
    return tls_err(err, TPORT_RESOURCE_EXHAUSTED, "%s '%s': out of memory", field, path);
  }
  size_t n = fread(buf, 1, PEM_FILE_MAX + 1, f);
  int bad = ferror(f);
  fclose(f);
  if (bad || n == 0 || n > PEM_FILE_MAX) {
    const char *why = bad ? "cannot be read" : n == 0 ? "empty" : "larger than 1 MiB: not PEM";
    free(buf);
    return tls_err(err, TPORT_INVALID_ARGUMENT, "%s '%s': %s", field, path, why);
  }
  buf[n] = '\0';
  *out = buf;
  *len = n;
  return TPORT_OK;
}

/* Frees a buffer that held a private key, wiping it first. */
static void free_secret(char *buf, size_t len)
{
  if (buf != NULL)
    OPENSSL_cleanse(buf, len);
  free(buf);
}

static int load_own_cert(nng_tls_config *cfg, const char *cert_file, const char *key_file,
                         const char *password, tport_err *err)
{
  char *cert = NULL, *key = NULL;
  size_t cert_len = 0, key_len = 0;
  int rc = read_pem("cert_file", cert_file, &cert, &cert_len, err);
  if (rc == TPORT_OK && key_file != NULL)
    rc = read_pem("key_file", key_file, &key, &key_len, err);
  if (rc == TPORT_OK) {
    tls_config_why_clear();
    int rv = nng_tls_config_own_cert(cfg, cert, key ? key : cert, password);
    if (rv != 0)
      rc = tls_err(err, TPORT_INVALID_ARGUMENT, "cert_file '%s', key_file '%s': %s", cert_file,
                   key_file ? key_file : cert_file, tls_config_why(rv));
  }
  free_secret(cert, cert_len); /* may hold the key too */
  free_secret(key, key_len);
  return rc;
}

static int load_ca(nng_tls_config *cfg, const char *field, const char *path, tport_err *err)
{
  char *pem = NULL;
  size_t len = 0;
  int rc = read_pem(field, path, &pem, &len, err);
  if (rc != TPORT_OK)
    return rc;
  tls_config_why_clear();
  /* CRLs may sit in the same file, as nng_tls_config_ca_file allows */
  const char *crl = strstr(pem, "-----BEGIN X509 CRL-----") ? pem : NULL;
  int rv = nng_tls_config_ca_chain(cfg, pem, crl);
  if (rv != 0)
    rc = tls_err(err, TPORT_INVALID_ARGUMENT, "%s '%s': %s", field, path, tls_config_why(rv));
  free(pem);
  return rc;
}

static int set_versions(nng_tls_config *cfg, bool allow_tls12, tport_err *err)
{
  int rv = nng_tls_config_version(cfg, allow_tls12 ? NNG_TLS_1_2 : NNG_TLS_1_3, NNG_TLS_1_3);
  if (rv != 0)
    return tls_err(err, TPORT_INTERNAL, "allow_tls12: %s", tls_config_why(rv));
  return TPORT_OK;
}

static int new_config(nng_tls_mode mode, nng_tls_config **cfg, tport_err *err)
{
  int rc = transport_tls_register(err);
  if (rc != TPORT_OK)
    return rc;
  tls_config_why_clear();
  int rv = nng_tls_config_alloc(cfg, mode);
  if (rv != 0)
    return tls_err(err, rv == NNG_ENOMEM ? TPORT_RESOURCE_EXHAUSTED : TPORT_INTERNAL,
                   "tls config: %s", tls_config_why(rv));
  return TPORT_OK;
}

int transport_tls_server_config(const transport_tls_server_opts *opts, nng_tls_config **out,
                                tport_err *err)
{
  nng_tls_config *cfg;
  if (opts == NULL || out == NULL)
    return tls_err(err, TPORT_INVALID_ARGUMENT, "tls server config: opts and out are required");
  if (opts->cert_file == NULL || opts->cert_file[0] == '\0')
    return tls_err(err, TPORT_INVALID_ARGUMENT, "cert_file: a TLS server needs a certificate");
  int rc = new_config(NNG_TLS_MODE_SERVER, &cfg, err);
  if (rc != TPORT_OK)
    return rc;
  rc = load_own_cert(cfg, opts->cert_file, opts->key_file, opts->key_password, err);
  if (rc == TPORT_OK && opts->client_ca_file != NULL) {
    rc = load_ca(cfg, "client_ca_file", opts->client_ca_file, err);
    if (rc == TPORT_OK && nng_tls_config_auth_mode(cfg, NNG_TLS_AUTH_MODE_REQUIRED) != 0)
      rc = tls_err(err, TPORT_INTERNAL, "client_ca_file: cannot require client certificates");
  }
  if (rc == TPORT_OK)
    rc = set_versions(cfg, opts->allow_tls12, err);
  if (rc != TPORT_OK) {
    nng_tls_config_free(cfg);
    return rc;
  }
  *out = cfg;
  return TPORT_OK;
}

int transport_tls_client_config(const transport_tls_client_opts *opts, const char *url,
                                nng_tls_config **out, tport_err *err)
{
  nng_tls_config *cfg;
  nng_url *u = NULL;
  if (opts == NULL || out == NULL)
    return tls_err(err, TPORT_INVALID_ARGUMENT, "tls client config: opts and out are required");
  if (opts->key_file != NULL && opts->cert_file == NULL)
    return tls_err(err, TPORT_INVALID_ARGUMENT, "key_file: given without cert_file");
  const char *name = opts->server_name;
  if (name == NULL || name[0] == '\0') {
    if (url == NULL)
      return tls_err(err, TPORT_INVALID_ARGUMENT,
                     "server_name: needed when no URL is given (the certificate is checked "
                     "against it)");
    int rv = nng_url_parse(&u, url);
    if (rv != 0)
      return tls_err(err, TPORT_INVALID_ARGUMENT, "url '%s': %s", url, nng_strerror(rv));
    name = u->u_hostname;
    if (name == NULL || name[0] == '\0') {
      nng_url_free(u);
      return tls_err(err, TPORT_INVALID_ARGUMENT,
                     "url '%s': no host to check the certificate against; set server_name", url);
    }
  }
  int rc = new_config(NNG_TLS_MODE_CLIENT, &cfg, err);
  if (rc == TPORT_OK) {
    if (opts->ca_file != NULL)
      rc = load_ca(cfg, "ca_file", opts->ca_file, err);
    if (rc == TPORT_OK && opts->cert_file != NULL)
      rc = load_own_cert(cfg, opts->cert_file, opts->key_file, opts->key_password, err);
    if (rc == TPORT_OK && (nng_tls_config_auth_mode(cfg, NNG_TLS_AUTH_MODE_REQUIRED) != 0 ||
                           nng_tls_config_server_name(cfg, name) != 0))
      rc = tls_err(err, TPORT_INTERNAL, "server_name '%s': cannot be set", name);
    if (rc == TPORT_OK)
      rc = set_versions(cfg, opts->allow_tls12, err);
    if (rc != TPORT_OK)
      nng_tls_config_free(cfg);
    else
      *out = cfg;
  }
  nng_url_free(u);
  return rc;
}
