/* put_and_die.c: a client that begins a put and kills itself a third of the
 * way in (SIGKILL: no cleanup of any kind).  Used by test_load.
 *   tport-put-and-die URL DEVICE BYTES */
#include <signal.h>
#include <stdlib.h>

#include "tport.h"

static void die_midway(void *arg, uint64_t done, uint64_t total)
{
  (void)arg;
  if (done >= total / 3)
    raise(SIGKILL);
}

int main(int argc, char **argv)
{
  if (argc != 4)
    return 2;
  tport_client *c;
  if (tport_connect(argv[1], NULL, &c, NULL))
    return 3;
  int64_t n = atoll(argv[3]);
  uint8_t *data = calloc((size_t)n, 1);
  tport_put_options po;
  tport_put_options_init(&po);
  po.device = argv[2];
  po.progress = die_midway;
  tport_put(c, TPORT_UINT8, 1, &n, NULL, data, (size_t)n, &po, NULL, NULL);
  return 4; /* not reached */
}
