/* hold_util.c: see hold_util.h. */
#include "hold_util.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <time.h>

#include "server_internal.h"

static pthread_mutex_t hold_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hold_cv = PTHREAD_COND_INITIALIZER;
static uint16_t hold_method;
static int holding;

static void hold_hook(server *s, uint32_t pipe, uint16_t method)
{
  (void)s;
  (void)pipe;
  pthread_mutex_lock(&hold_mu);
  if (method == hold_method) {
    holding++;
    pthread_cond_broadcast(&hold_cv);
    while (hold_method == method)
      pthread_cond_wait(&hold_cv, &hold_mu);
    holding--;
  }
  pthread_mutex_unlock(&hold_mu);
}

void hold(uint16_t method)
{
  pthread_mutex_lock(&hold_mu);
  hold_method = method;
  holding = 0;
  pthread_mutex_unlock(&hold_mu);
  server_test_before_handle = hold_hook;
}

void wait_held(int n)
{
  pthread_mutex_lock(&hold_mu);
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 10;
  while (holding < n && pthread_cond_timedwait(&hold_cv, &hold_mu, &until) == 0) {
  }
  int h = holding;
  pthread_mutex_unlock(&hold_mu);
  cr_assert_geq(h, n, "%d requests held in the workers, waited for %d", h, n);
}

int held_now(void)
{
  pthread_mutex_lock(&hold_mu);
  int h = holding;
  pthread_mutex_unlock(&hold_mu);
  return h;
}

void release(void)
{
  pthread_mutex_lock(&hold_mu);
  hold_method = 0;
  pthread_cond_broadcast(&hold_cv);
  pthread_mutex_unlock(&hold_mu);
}
