/* shm_and_die.c: a client that puts through the automatic region, gets
 * into a region of its own, registers one more it never hands over, and
 * kills itself (SIGKILL: no release, no close).  Used by test_shm.
 *   tport-shm-and-die URL BYTES */
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "tport.h"

int main(int argc, char **argv)
{
  if (argc != 3)
    return 2;
  tport_client *c;
  if (tport_connect(argv[1], &(tport_connect_options){.tenant = "t"}, &c, NULL))
    return 3;
  int64_t n = atoll(argv[2]);
  uint8_t *data = malloc((size_t)n);
  memset(data, 1, (size_t)n);
  tport_tensor_info info;
  if (tport_put(c, TPORT_UINT8, 1, &n, NULL, data, (size_t)n, NULL, &info, NULL))
    return 4;
  tport_shm *r, *spare;
  if (tport_shm_create(c, (size_t)n, &r, NULL) ||
      tport_get_shm(c, &info.ref, r, 0, (size_t)n, NULL, NULL, NULL) ||
      tport_shm_create(c, 4096, &spare, NULL))
    return 5;
  raise(SIGKILL);
  return 6; /* not reached */
}
