/*
 * test_expiry.c: tensors with a time limit leave when it ends -- all of
 * them, in order, and at a cost of what is due, not of what the server
 * holds (the reaper takes them under the lock every request takes).
 *
 * The tests call reg_expire with a time of their own, in the future: TTLs
 * start an hour past LATER, so that the reaper's own calls (each second,
 * with the real time) never find them due however slow the run.  The
 * reaper's look for connections that did not prove their tenant in time
 * walks those alone, oldest first, up to the first not yet overdue.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "registry.h"
#include "server_internal.h"
#include "service_util.h"
#include "tport.h"

#define SEC 1000LL
#define LATER (3600 * SEC) /* every TTL's start */

/* A zero-byte tensor named name that lives ttl_ms. */
static void put_for(tport_client *c, const char *name, uint64_t ttl_ms, tport_tensor_info *out)
{
  tport_put_options o;
  tport_put_options_init(&o);
  o.name = name;
  o.ttl_ms = ttl_ms;
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, (int64_t[]){0}, NULL, NULL, 0, &o, out, &err), 0,
               "%s: %s", name, err.msg);
}

static bool exists(tport_client *c, const char *name)
{
  tport_ref r;
  tport_err err;
  cr_assert_eq(tport_ref_parse(name, &r, &err), 0);
  tport_tensor_info info;
  int rc = tport_info(c, &r, &info, &err);
  cr_assert(rc == 0 || rc == TPORT_NOT_FOUND, "%s: %s", name, err.msg);
  return rc == 0;
}

/* reg_expire at now_ms, as the reaper calls it; (expired, entries looked at). */
static int expire_at(server *s, int64_t now_ms, uint64_t *walked)
{
  pthread_mutex_lock(&s->reg.mu);
  uint64_t before = s->reg.expire_walked;
  pthread_mutex_unlock(&s->reg.mu);
  int n = reg_expire(&s->reg, now_ms);
  pthread_mutex_lock(&s->reg.mu);
  *walked = s->reg.expire_walked - before;
  pthread_mutex_unlock(&s->reg.mu);
  return n;
}

Test(expiry, what_is_due_leaves_and_nothing_else_is_looked_at)
{
  /* before: every entry of every tenant walked at each call, once a second */
  char url[128], name[64];
  server_config cfg;
  svc_config(&cfg);
  cfg.max_ttl_s = 7200;
  server *s = svc_start_with(&cfg, url, sizeof url);
  tport_client *c = svc_connect(url, "long"), *d = svc_connect(url, "short");
  int64_t t0 = reg_now_ms();
  for (int i = 0; i < 2000; i++) {
    snprintf(name, sizeof name, "long/%d", i);
    put_for(c, name, LATER + 3000 * SEC, NULL);
  }
  for (int i = 0; i < 3; i++) {
    snprintf(name, sizeof name, "short/%d", i);
    put_for(d, name, LATER + 20 * SEC, NULL);
  }
  uint64_t walked;
  cr_assert_eq(expire_at(s, t0 + LATER + 10 * SEC, &walked), 0);
  cr_assert_eq(walked, 0, "looked at %llu entries with none due", (unsigned long long)walked);
  cr_assert_eq(expire_at(s, t0 + LATER + 60 * SEC, &walked), 3);
  cr_assert_eq(walked, 3, "looked at %llu entries to expire 3 of 2003", (unsigned long long)walked);
  cr_assert_not(exists(d, "short/0"));
  cr_assert(exists(c, "long/1999"));
  tport_close(d);
  tport_close(c);
  server_stop(s, 1000);
}

/* How many of n tensors, the i-th living (i + 1) * 10 s and those with
 * freed[i] gone before, are still there. */
static int left(tport_client *c, int n, const bool *freed)
{
  char name[64];
  int k = 0;
  for (int i = 0; i < n; i++) {
    snprintf(name, sizeof name, "t/%d", i);
    bool there = exists(c, name);
    cr_assert(!(freed[i] && there), "%s was freed", name);
    k += there;
  }
  return k;
}

static uint64_t unindexed(server *s)
{
  pthread_mutex_lock(&s->reg.mu);
  uint64_t n = s->reg.expiry_unindexed;
  pthread_mutex_unlock(&s->reg.mu);
  return n;
}

static void expire_in_order(int failing_growths)
{
  enum { N = 300 }; /* past the heap's first 256 slots */
  char url[128], name[64];
  server_config cfg;
  svc_config(&cfg);
  cfg.max_ttl_s = 7200;
  server *s = svc_start_with(&cfg, url, sizeof url);
  tport_client *c = svc_connect(url, "order");
  reg_test_fail_expiry_growth(failing_growths);
  int64_t t0 = reg_now_ms();
  bool freed[N] = {0};
  tport_tensor_info info[N];
  /* put in a shuffled order (a fixed one), so that the heap sorts */
  for (int j = 0; j < N; j++) {
    int i = (int)(((unsigned)j * 7919u) % N);
    snprintf(name, sizeof name, "t/%d", i);
    put_for(c, name, LATER + (uint64_t)(i + 1) * 10 * SEC, &info[i]);
  }
  reg_test_fail_expiry_growth(0);
  cr_assert_eq(unindexed(s), (uint64_t)failing_growths, "out of the heap: %llu",
               (unsigned long long)unindexed(s));
  tport_err err;
  for (int i = 0; i < N; i += 3) { /* some leave early: out of the heap's middle */
    cr_assert_eq(tport_free(c, &info[i].ref, &err), 0, "%s", err.msg);
    freed[i] = true;
  }
  uint64_t want_out = 0; /* the first puts' entries, those not freed */
  for (int j = 0; j < failing_growths; j++)
    want_out += !freed[(j * 7919) % N];
  cr_assert_eq(unindexed(s), want_out);
  int64_t put_time = reg_now_ms() - t0;
  cr_assert_lt(put_time, 5 * SEC, "the puts took %lld ms: the times below need < 5 s",
               (long long)put_time);
  int total = 0;
  for (int k = 1; k <= N; k += 37) {
    /* at k * 10 s + 5 s, the tensors 0..k-1 are due and no other */
    uint64_t walked;
    total += expire_at(s, t0 + LATER + k * 10 * SEC + 5 * SEC, &walked);
    int want = 0;
    for (int i = k; i < N; i++)
      want += !freed[i];
    cr_assert_eq(left(c, N, freed), want, "at %d s", k * 10 + 5);
    /* the walk put back into the heap those it found not due */
    cr_assert_eq(unindexed(s), 0, "at %d s", k * 10 + 5);
  }
  uint64_t walked;
  total += expire_at(s, t0 + LATER + (N + 1) * 10 * SEC, &walked);
  cr_assert_eq(left(c, N, freed), 0);
  cr_assert_eq(total, N - (N + 2) / 3, "expired: %d", total);
  pthread_mutex_lock(&s->reg.mu);
  cr_assert_eq(s->reg.expiry.n, 0, "the heap holds %zu", s->reg.expiry.n);
  cr_assert_eq(s->reg.expiry_unindexed, 0);
  pthread_mutex_unlock(&s->reg.mu);
  tport_close(c);
  server_stop(s, 1000);
}

Test(expiry, tensors_leave_in_the_order_of_their_time_limits)
{
  expire_in_order(0);
}

Test(expiry, out_of_memory_for_the_heap_the_entries_are_walked_and_still_expire)
{
  /* the heap's first two growths fail: two entries stay out of it,
   * counted, and while any lives reg_expire walks every entry as before,
   * putting it back into the heap */
  expire_in_order(2);
}

Test(expiry, the_reapers_second_does_not_walk_every_tenant)
{
  /* it looked at every tenant each second for those no one names any more
   * whose lent bytes had come back; those are listed apart now */
  char url[128];
  server_config cfg;
  svc_config(&cfg);
  cfg.max_ttl_s = 7200;
  server *s = svc_start_with(&cfg, url, sizeof url);
  for (int i = 0; i < 200; i++) { /* tenants that outlive their connection: a tensor kept */
    char tenant[32];
    snprintf(tenant, sizeof tenant, "t%d", i);
    tport_client *c = svc_connect(url, tenant);
    put_for(c, "kept", LATER, NULL);
    tport_close(c);
  }
  pthread_mutex_lock(&s->reg.mu);
  uint64_t before = s->reg.tenants_walked, tenants = s->reg.ntenants;
  pthread_mutex_unlock(&s->reg.mu);
  cr_assert_geq(tenants, 200);
  uint64_t walked;
  cr_assert_eq(expire_at(s, reg_now_ms(), &walked), 0);
  pthread_mutex_lock(&s->reg.mu);
  uint64_t looked = s->reg.tenants_walked - before;
  pthread_mutex_unlock(&s->reg.mu);
  cr_assert_eq(looked, 0, "looked at %llu of %llu tenants, none lingering",
               (unsigned long long)looked, (unsigned long long)tenants);
  server_stop(s, 1000);
}

static uint64_t tenants_of(registry *r)
{
  pthread_mutex_lock(&r->mu);
  uint64_t n = r->ntenants;
  pthread_mutex_unlock(&r->mu);
  return n;
}

Test(expiry, a_tenant_named_by_no_one_goes_once_its_lent_bytes_came_back)
{
  /* the lingering tenants: closed, with bytes still lent to replies (a
   * hold that charges later), kept until those come back, then forgotten
   * by the reaper -- unless a connection names the tenant again meanwhile */
  registry r;
  reg_limits lim = {.tenant_quota_bytes = 1 << 20, .max_tensors = 16, .max_outstanding = 4};
  reg_init(&r, &lim);
  tport_err err;
  cr_assert(reg_session_open(&r, 7, 0));
  cr_assert_eq(reg_session_set_tenant(&r, 7, "ling", &err), 0, "%s", err.msg);
  reg_later later;
  cr_assert_eq(reg_later_begin(&r, 7, &later, &err), 0, "%s", err.msg);
  reg_later_charge(&later, 4096);
  reg_session_close(&r, 7);
  cr_assert_eq(tenants_of(&r), 1, "kept while its bytes are lent");
  reg_expire(&r, reg_now_ms());
  cr_assert_eq(tenants_of(&r), 1, "still lent: still kept");
  /* named again while lingering, then let go while still lent */
  cr_assert(reg_session_open(&r, 8, 0));
  cr_assert_eq(reg_session_set_tenant(&r, 8, "ling", &err), 0, "%s", err.msg);
  reg_expire(&r, reg_now_ms());
  cr_assert_eq(tenants_of(&r), 1);
  reg_session_close(&r, 8);
  reg_expire(&r, reg_now_ms());
  cr_assert_eq(tenants_of(&r), 1, "lent still");
  reg_later_end(&later);
  uint64_t before = r.tenants_walked;
  reg_expire(&r, reg_now_ms());
  cr_assert_eq(tenants_of(&r), 0, "forgotten once its bytes came back");
  cr_assert_eq(r.tenants_walked - before, 1);
  reg_expire(&r, reg_now_ms());
  cr_assert_eq(r.tenants_walked - before, 1, "nothing left to look at");
  reg_destroy(&r);
}

Test(expiry, the_look_for_unproved_connections_walks_the_unproved_alone)
{
  registry r;
  reg_limits lim = {.tenant_quota_bytes = 1 << 20, .max_tensors = 16, .max_outstanding = 4};
  reg_init(&r, &lim);
  tport_err err;
  for (uint32_t p = 1; p <= 200; p++) {
    cr_assert(reg_session_open(&r, p, 0));
    if (p != 5 && p != 50 && p != 150)
      cr_assert_eq(reg_session_authenticate(&r, p, "proved", &err), 0, "%s", err.msg);
  }
  usleep(30 * 1000);
  cr_assert(reg_session_open(&r, 201, 0)); /* unproved, young */
  uint32_t out[256];
  uint64_t before = r.unproved_walked;
  size_t n = reg_unproved_sessions(&r, 20, out, 256);
  cr_assert_eq(n, 3);
  cr_assert(out[0] == 5 && out[1] == 50 && out[2] == 150, "oldest first: %u %u %u", out[0],
            out[1], out[2]);
  cr_assert_eq(r.unproved_walked - before, 4, "looked at %llu of 201 sessions, want 4",
               (unsigned long long)(r.unproved_walked - before));
  /* asked again at once (the reaper asks until it gets less than it can
   * take): those returned are not looked at again, nor returned */
  before = r.unproved_walked;
  cr_assert_eq(reg_unproved_sessions(&r, 20, out, 256), 0);
  cr_assert_eq(r.unproved_walked - before, 2, "one of each list");
  /* a second later: those whose close did not take, again; one that proved
   * its tenant or closed meanwhile left the lists; 201 is overdue now, but
   * told to close a moment ago (for another reason), so it waits a second */
  reg_session_close(&r, 50);
  cr_assert_eq(reg_session_authenticate(&r, 150, "proved", &err), 0, "%s", err.msg);
  usleep(1100 * 1000);
  cr_assert(reg_session_mark_dropped(&r, 201));
  before = r.unproved_walked;
  n = reg_unproved_sessions(&r, 20, out, 256);
  cr_assert(n == 1 && out[0] == 5, "%zu: %u", n, out[0]);
  cr_assert_eq(r.unproved_walked - before, 3, "5, 5 again (just now), 201");
  usleep(1100 * 1000);
  n = reg_unproved_sessions(&r, 20, out, 256);
  cr_assert(n == 2 && out[0] == 5 && out[1] == 201, "%zu: %u %u", n, out[0], out[1]);
  /* a flood overdue at once, taken 256 at a time as the reaper does: each
   * looked at once, not once a call (~n^2/512 before) */
  for (uint32_t p = 1001; p <= 1600; p++)
    cr_assert(reg_session_open(&r, p, 0));
  usleep(30 * 1000);
  size_t k, total = 0;
  before = r.unproved_walked;
  do {
    k = reg_unproved_sessions(&r, 20, out, 256);
    for (size_t i = 0; i < k; i++)
      reg_session_mark_dropped(&r, out[i]);
    total += k;
  } while (k == 256);
  cr_assert_eq(total, 600);
  cr_assert_leq(r.unproved_walked - before, 600 + 8, "looked at %llu for 600",
                (unsigned long long)(r.unproved_walked - before));
  reg_destroy(&r);
}

Test(expiry, the_connections_by_transport_are_counted_not_walked)
{
  /* the reaper counts activity each second (reg_counts): the sessions by
   * transport are kept as they open, are described and close */
  registry r;
  reg_limits lim = {.tenant_quota_bytes = 1 << 20, .max_tensors = 16, .max_outstanding = 4};
  reg_init(&r, &lim);
  reg_via via[4] = {REG_VIA_TCP, REG_VIA_IPC, REG_VIA_IPC, REG_VIA_TLS};
  for (uint32_t p = 1; p <= 4; p++) {
    cr_assert(reg_session_open(&r, p, 0));
    reg_session_describe(&r, p, via[p - 1], "peer");
  }
  cr_assert(reg_session_open(&r, 5, 0)); /* not described yet */
  reg_stats st;
  reg_counts(&r, &st);
  cr_assert_eq(st.sessions, 5);
  cr_assert(st.sessions_via[REG_VIA_TCP] == 1 && st.sessions_via[REG_VIA_IPC] == 2 &&
                st.sessions_via[REG_VIA_TLS] == 1 && st.sessions_via[REG_VIA_OTHER] == 1 &&
                st.sessions_via[REG_VIA_INPROC] == 0,
            "tcp %llu ipc %llu tls %llu other %llu", (unsigned long long)st.sessions_via[0],
            (unsigned long long)st.sessions_via[2], (unsigned long long)st.sessions_via[1],
            (unsigned long long)st.sessions_via[4]);
  reg_session_close(&r, 2);
  reg_session_describe(&r, 5, REG_VIA_INPROC, "peer");
  reg_session_close(&r, 9); /* none: nothing changes */
  reg_counts(&r, &st);
  cr_assert(st.sessions == 4 && st.sessions_via[REG_VIA_IPC] == 1 &&
            st.sessions_via[REG_VIA_INPROC] == 1 && st.sessions_via[REG_VIA_OTHER] == 0);
  reg_destroy(&r);
}
