/*
 * test_lends.c: the reaper's look for lent replies not taken in time
 * (lends_overdue, each second) costs what is overdue, not every lent reply
 * in flight -- it holds the lock each lent reply takes and gives back.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "engine.h"
#include "lends.h"
#include "server_internal.h"
#include "service_util.h"

Test(lends, the_overdue_are_found_oldest_first_and_alone)
{
  char url[128];
  server *s = svc_start_inproc(url, sizeof url, NULL); /* the engine, configured */
  tport_tensor *t;
  tport_err err;
  int64_t n = 64;
  cr_assert_eq(tensor_empty((tport_device){TPORT_DEV_CPU, 0}, TPORT_UINT8, 1, &n,
                            TPORT_MF_CONTIGUOUS, 0, &t, &err),
               0, "%s", err.msg);
  lends *l = lends_new();
  cr_assert_not_null(l);
  enum { OLD = 100, NEW = 400 };
  void *d[OLD + NEW];
  for (int i = 0; i < OLD; i++) /* pipes 1..50, each twice */
    cr_assert_not_null(d[i] = lends_begin(l, 1 + (uint32_t)(i % 50), t->storage));
  usleep(100 * 1000);
  int64_t cut = lends_now_ms() - 50;
  for (int i = OLD; i < OLD + NEW; i++)
    cr_assert_not_null(d[i] = lends_begin(l, 1000 + (uint32_t)i, t->storage));
  uint32_t pipes[256];
  uint64_t before = lends_walked(l);
  size_t k = lends_overdue(l, cut, pipes, 256);
  cr_assert_eq(k, 50, "the old lends' 50 pipes, each once: %zu", k);
  for (size_t i = 0; i < k; i++)
    cr_assert(pipes[i] >= 1 && pipes[i] <= 50, "pipe %u is not an old lend's", pipes[i]);
  cr_assert_eq(lends_walked(l) - before, OLD, "looked at %llu lends, %d overdue among %d",
               (unsigned long long)(lends_walked(l) - before), OLD, OLD + NEW);
  /* the old ones ended (their replies sent): none overdue, none looked at */
  for (int i = 0; i < OLD; i++)
    lends_end(d[i]);
  before = lends_walked(l);
  cr_assert_eq(lends_overdue(l, cut, pipes, 256), 0);
  cr_assert_eq(lends_walked(l) - before, 0);
  /* a lend ended out of order (the newest, the oldest) keeps the order */
  lends_end(d[OLD + NEW - 1]);
  lends_end(d[OLD]);
  cr_assert_eq(lends_overdue(l, lends_now_ms() + 1, pipes, 256), 256, "capped at max");
  cr_assert_eq(pipes[0], 1000 + OLD + 1, "the oldest left first: %u", pipes[0]);
  for (int i = OLD + 1; i < OLD + NEW - 1; i++)
    lends_end(d[i]);
  cr_assert_eq(lends_count(l), 0);
  lends_free(l, 0);
  tensor_release(t);
  server_stop(s, 1000);
}
