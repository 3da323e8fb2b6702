/*
 * clock.c: the absolute CLOCK_REALTIME deadlines pthread_cond_timedwait
 * takes, for the waits of rpc.c (credits), put_socket.c (lent chunks) and
 * request.c (tport_wait).  A leaf: it calls nothing of libtport's.
 */
#include <time.h>

#include "client_internal.h"

struct timespec client_deadline_after(int ms)
{
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  t.tv_sec += ms / 1000;
  t.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (t.tv_nsec >= 1000000000L) {
    t.tv_sec++;
    t.tv_nsec -= 1000000000L;
  }
  return t;
}
