/*
 * test_transfers.c: gets in progress end with their connection and when
 * idle -- at the cost of what ends, not of what every connection holds
 * (both took the lock every GetChunk takes, and walked every transfer of
 * the server).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hostile_util.h"
#include "server_internal.h"
#include "transfers.h"

TestSuite(transfers, .timeout = 120);

static uint64_t walked(server *s)
{
  pthread_mutex_lock(&s->xfers.mu);
  uint64_t n = s->xfers.walked;
  pthread_mutex_unlock(&s->xfers.mu);
  return n;
}

/* Waits (up to 5 s) for the server to hold want transfers. */
static void until_count(server *s, uint64_t want)
{
  for (int i = 0; i < 500 && transfers_count(&s->xfers) != want; i++)
    usleep(10000);
  cr_assert_eq(transfers_count(&s->xfers), want, "transfers in progress: %llu, want %llu",
               (unsigned long long)transfers_count(&s->xfers), (unsigned long long)want);
}

/* A tensor of n bytes put over r, and k unread gets of it (transfer ids
 * into t, 16 bytes each). */
static void open_gets(rawc *r, size_t n, int k, uint8_t *t)
{
  uint8_t *data = malloc(n), h[16];
  fill(data, n, 7);
  raw_put(r, data, n, NULL, NULL, h);
  free(data);
  Tport__Ref ref = mkref(h, 16, NULL);
  char msg[256];
  for (int i = 0; i < k; i++)
    cr_assert_eq(raw_get_begin(r, &ref, 0, msg, t + 16 * i), 0, "GetBegin %d: %s", i, msg);
}

Test(transfers, a_connections_end_walks_its_own_gets)
{
  char url[128];
  server_config cfg;
  config(&cfg);
  cfg.max_transfers = 200;
  server *s = start(&cfg, url, sizeof url);
  rawc a, b;
  raw_open(&a, url);
  raw_open(&b, url);
  uint8_t *ta = malloc(16 * 150), tb[16 * 2];
  open_gets(&a, 2 * CHUNK, 150, ta);
  open_gets(&b, 2 * CHUNK, 2, tb);
  until_count(s, 152);
  uint64_t before = walked(s);
  raw_close(&b);
  until_count(s, 150);
  cr_assert_eq(walked(s) - before, 2, "a closing connection of 2 gets looked at %llu",
               (unsigned long long)(walked(s) - before));
  /* the other's are whole */
  char msg[256];
  cr_assert_eq(raw_get_chunk(&a, ta + 16 * 149, 16, 0, CHUNK, NULL, 0, msg), 0, "%s", msg);
  raw_close(&a);
  until_count(s, 0);
  free(ta);
  server_stop(s, 1000);
}

Test(transfers, idle_gets_end_least_recently_read_first_and_alone)
{
  char url[128];
  server_config cfg;
  config(&cfg);
  cfg.transfer_timeout_ms = 600000; /* the reaper's own expiry finds nothing */
  server *s = start(&cfg, url, sizeof url);
  rawc r;
  raw_open(&r, url);
  uint8_t t[16 * 3];
  open_gets(&r, 4 * CHUNK, 3, t);
  usleep(300 * 1000);
  char msg[256];
  int64_t read_at = transfers_now_ms();
  cr_assert_eq(raw_get_chunk(&r, t, 16, 0, CHUNK, NULL, 0, msg), 0, "%s", msg);
  /* idle since before the read: the second and third; the first was read */
  uint64_t before = walked(s);
  int ended = transfers_expire(&s->xfers, read_at + 1000, 1150);
  cr_assert_eq(ended, 2);
  cr_assert_eq(walked(s) - before, 2, "looked at %llu transfers to end 2",
               (unsigned long long)(walked(s) - before));
  for (int i = 1; i < 3; i++)
    cr_assert_eq(raw_get_chunk(&r, t + 16 * i, 16, 0, CHUNK, NULL, 0, msg), TPORT_NOT_FOUND,
                 "transfer %d: %s", i, msg);
  cr_assert_eq(raw_get_chunk(&r, t, 16, CHUNK, CHUNK, NULL, 0, msg), 0, "%s", msg);
  /* and once idle, the first too */
  cr_assert_eq(transfers_expire(&s->xfers, transfers_now_ms() + 1000, 500), 1);
  until_count(s, 0);
  raw_close(&r);
  server_stop(s, 1000);
}
