/*
 * test_shm_hash_oom.c: the regions' tables (server/regions*.c) out of
 * memory.  uthash exits the process when an add cannot allocate, unless
 * told otherwise: a registration under memory pressure took tportd down.
 * Each of the allocations a first registration makes (four tables, each its
 * record and its buckets) fails in turn here: the registration is refused
 * RESOURCE_EXHAUSTED, nothing of it stays, and the next one is served.  So
 * does a table's growth, later.  (The count of a first registration's
 * allocations is uthash's: two a table, no bloom filter.)
 */
#include <criterion/criterion.h>
#include <unistd.h>

#include "client_internal.h"
#include "regions.h"
#include "server_internal.h"
#include "service_util.h"
#include "shm_util.h"

/* the tenants', the connections', the ids' and the tokens' tables */
#define FIRST_REGISTRATION_ALLOCS 8

static int register_one(tport_client *c, tport_err *err)
{
  return shm_register_pending(c, 4096, err);
}

static uint64_t regions_now(server *s)
{
  shm_stats st;
  shm_get_stats(s->shm, &st);
  return st.regions;
}

Test(shm_hash_oom, each_allocation_of_a_registration_fails_alone, .timeout = 120)
{
  for (int k = 1; k <= FIRST_REGISTRATION_ALLOCS + 1; k++) {
    char url[96], dir[64];
    server_config cfg;
    svc_config_shm(&cfg, "hashoom", dir, sizeof dir);
    server *s = svc_start_with(&cfg, url, sizeof url);
    tport_client *c;
    tport_err err;
    tport_connect_options o = {.timeout_ms = 20000, .no_shm = true};
    cr_assert_eq(tport_connect(url, &o, &c, &err), 0, "connect: %s", err.msg);
    shm_test_fail_hash_alloc(k);
    int rc = register_one(c, &err);
    shm_test_fail_hash_alloc(0);
    if (k <= FIRST_REGISTRATION_ALLOCS) {
      cr_assert_eq(rc, TPORT_RESOURCE_EXHAUSTED, "allocation %d failing: %s (%s)", k,
                   tport_strerror(rc), err.msg);
      cr_assert_eq(regions_now(s), 0, "allocation %d failing: a region stayed", k);
    } else {
      cr_assert_eq(rc, TPORT_OK, "no allocation failing: %s", err.msg);
    }
    /* served as before */
    cr_assert_eq(register_one(c, &err), TPORT_OK, "after allocation %d failed: %s", k, err.msg);
    cr_assert_eq(register_one(c, &err), TPORT_OK, "after allocation %d failed: %s", k, err.msg);
    cr_assert_eq(regions_now(s), k <= FIRST_REGISTRATION_ALLOCS ? 2 : 3);
    tport_close(c);
    server_stop(s, 0);
    rmdir(dir);
  }
}

/* With the tables made, an add fails where its table would grow (uthash
 * doubles its buckets as a chain passes ten): that registration alone is
 * refused, and the table, its items all still in it, grows at the next. */
Test(shm_hash_oom, a_table_that_cannot_grow_refuses_one_registration, .timeout = 120)
{
  char url[96], dir[64];
  server_config cfg;
  svc_config_shm(&cfg, "hashgrow", dir, sizeof dir);
  cfg.shm_max_regions = 1000;
  server *s = svc_start_with(&cfg, url, sizeof url);
  tport_client *c;
  tport_err err;
  tport_connect_options o = {.timeout_ms = 20000, .no_shm = true};
  cr_assert_eq(tport_connect(url, &o, &c, &err), 0, "connect: %s", err.msg);
  cr_assert_eq(register_one(c, &err), TPORT_OK, "%s", err.msg); /* the tables made */
  shm_test_fail_hash_alloc(1);
  int ok = 1, refused = 0;
  /* 32 buckets: past ~320 items a chain passes ten */
  for (int i = 0; i < 700 && !refused; i++) {
    int rc = register_one(c, &err);
    if (rc == TPORT_RESOURCE_EXHAUSTED)
      refused++;
    else
      cr_assert_eq(rc, TPORT_OK, "registration %d: %s", i, err.msg);
    ok += rc == TPORT_OK;
  }
  shm_test_fail_hash_alloc(0);
  cr_assert_eq(refused, 1, "no registration needed the table to grow");
  cr_assert_eq(regions_now(s), (uint64_t)ok);
  for (int i = 0; i < 100; i++)
    cr_assert_eq(register_one(c, &err), TPORT_OK, "after the refusal, %d: %s", i, err.msg);
  cr_assert_eq(regions_now(s), (uint64_t)ok + 100);
  tport_close(c);
  for (int i = 0; i < 500 && regions_now(s) != 0; i++)
    usleep(10000);
  cr_assert_eq(regions_now(s), 0, "every region found and freed at the close");
  server_stop(s, 0);
  rmdir(dir);
}
