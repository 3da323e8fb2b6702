/* lent_bytes.c: which transports send lent bytes without a copy (lent_bytes.h). */
#include "lent_bytes.h"

#include <string.h>
#include <strings.h>

bool transport_url_sends_lent_bytes(const char *url)
{
  /* nng's tcp transport under its three names, its tls transport under its
   * three (deploy/nng/0011: it encrypts the tail from the lender's memory),
   * and its ipc transport under its three */
  static const char *const lending[] = {"tcp://",      "tcp4://",      "tcp6://",
                                        "tls+tcp://",  "tls+tcp4://",  "tls+tcp6://",
                                        "ipc://",      "unix://",      "abstract://"};
  for (size_t i = 0; url && i < sizeof lending / sizeof lending[0]; i++)
    if (strncasecmp(url, lending[i], strlen(lending[i])) == 0)
      return true;
  return false;
}
