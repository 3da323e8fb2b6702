/*
 * test_shm_walks.c: a region's registration and a connection's end look at
 * that connection's regions (and the expired front of the pending ones),
 * not at every region of the server: both take the table's lock, which
 * every put and get through a region takes (regions_index.c).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "client_internal.h"
#include "regions_internal.h"
#include "server_internal.h"
#include "service_util.h"
#include "shm_util.h"

static char sock_dir[64];

static server *start(char *url, size_t len, uint64_t token_ms)
{
  server_config cfg;
  svc_config_shm(&cfg, "walks", sock_dir, sizeof sock_dir);
  cfg.shm_max_regions = 200;
  cfg.shm_token_ms = token_ms;
  return svc_start_with(&cfg, url, len);
}

static tport_client *connect_as(const char *url, const char *tenant)
{
  tport_client *c;
  tport_err err;
  tport_connect_options o = {.tenant = tenant, .timeout_ms = 20000, .no_shm = true};
  cr_assert_eq(tport_connect(url, &o, &c, &err), 0, "connect %s: %s", url, err.msg);
  return c;
}

/* A pending region of this connection (registered, never handed over). */
static int register_one(tport_client *c, tport_err *err)
{
  return shm_register_pending(c, 4096, err);
}

static uint64_t walked(server *s)
{
  pthread_mutex_lock(&s->shm->mu);
  uint64_t n = s->shm->walked;
  pthread_mutex_unlock(&s->shm->mu);
  return n;
}

static uint64_t regions(const char *url)
{
  return (uint64_t)svc_server_counter(url, "shm_regions");
}

/* (what walked counts are walks: the connection's count of regions and its
 * process region are looked up, not walked, and a regression to a walk
 * there would not show here; the IPC handle's list is test_cuda_ipc's) */
Test(shm_walks, registrations_and_ends_look_at_their_own_connections_regions)
{
  char url[96];
  server *s = start(url, sizeof url, 600000);
  tport_client *big = connect_as(url, "big"), *small = connect_as(url, "small");
  tport_err err;
  for (int i = 0; i < 150; i++)
    cr_assert_eq(register_one(big, &err), 0, "%d: %s", i, err.msg);
  uint64_t before = walked(s);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(register_one(small, &err), 0, "%s", err.msg);
  cr_assert_eq(walked(s) - before, 0, "3 registrations looked at %llu regions",
               (unsigned long long)(walked(s) - before));
  cr_assert_eq(regions(url), 153);
  before = walked(s);
  tport_close(small);
  for (int i = 0; i < 500 && regions(url) != 150; i++)
    usleep(10000);
  cr_assert_eq(regions(url), 150);
  cr_assert_eq(walked(s) - before, 3, "a connection of 3 regions ended looking at %llu",
               (unsigned long long)(walked(s) - before));
  /* the per-connection bound still counts the connection's own */
  for (int i = 150; i < 200; i++)
    cr_assert_eq(register_one(big, &err), 0, "%d: %s", i, err.msg);
  cr_assert_eq(register_one(big, &err), TPORT_RESOURCE_EXHAUSTED, "the 201st: %s", err.msg);
  tport_close(big);
  for (int i = 0; i < 500 && regions(url) != 0; i++)
    usleep(10000);
  cr_assert_eq(regions(url), 0);
  server_stop(s, 0);
  rmdir(sock_dir);
}

Test(shm_walks, expired_tokens_go_from_the_front_alone)
{
  char url[96];
  server *s = start(url, sizeof url, 3000);
  tport_client *a = connect_as(url, "a"), *b = connect_as(url, "b");
  tport_err err;
  for (int i = 0; i < 2; i++)
    cr_assert_eq(register_one(a, &err), 0, "%s", err.msg);
  usleep(3200 * 1000); /* a's tokens expire (3 s; b's 20 have 3 s for the rest) */
  for (int i = 0; i < 20; i++)
    cr_assert_eq(register_one(b, &err), 0, "%s", err.msg);
  /* the first of b's ended a's two; the other 19 found nothing expired */
  cr_assert_eq(regions(url), 20);
  uint64_t before = walked(s);
  cr_assert_eq(register_one(a, &err), 0, "%s", err.msg);
  cr_assert_eq(walked(s) - before, 0, "a registration with nothing expired looked at %llu",
               (unsigned long long)(walked(s) - before));
  tport_close(a);
  tport_close(b);
  server_stop(s, 0);
  rmdir(sock_dir);
}
