/*
 * test_list.c: List -- what a tenant sees of the server's tensors, and what
 * asking costs the server.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "registry.h"
#include "server_internal.h"
#include "service_util.h"
#include "tport.h"

/* n zero-byte tensors of c's tenant, in one batch (names: prefix%d, or none). */
static void put_many(tport_client *c, size_t n, const char *prefix)
{
  static const int64_t zero = 0;
  tport_put_item *items = calloc(n, sizeof *items);
  tport_put_options *opts = calloc(n, sizeof *opts);
  char(*names)[32] = calloc(n, sizeof *names);
  cr_assert(items && opts && names);
  for (size_t i = 0; i < n; i++) {
    tport_put_options_init(&opts[i]);
    if (prefix) {
      snprintf(names[i], sizeof names[i], "%s%zu", prefix, i);
      opts[i].name = names[i];
      opts[i].ttl_ms = 60000;
    }
    items[i] = (tport_put_item){
        .dtype = TPORT_UINT8, .ndim = 1, .sizes = &zero, .opts = &opts[i]};
  }
  tport_err err;
  cr_assert_eq(tport_put_batch(c, items, n, &err), 0, "%s", err.msg);
  free(items), free(opts), free(names);
}

static uint64_t walked(server *s)
{
  pthread_mutex_lock(&s->reg.mu);
  uint64_t n = s->reg.list_walked;
  pthread_mutex_unlock(&s->reg.mu);
  return n;
}

Test(list, a_tenants_list_walks_its_own_tensors_not_every_tenants)
{
  /* A List is taken under the registry's lock, which every request takes:
   * walking every tenant's entries let one tenant's cheap request cost the
   * server what all tenants hold (a million tensors of another: a lock
   * held for tens of ms at each List) */
  char url[128];
  server *s = svc_start_inproc(url, sizeof url, NULL);
  tport_client *big = svc_connect(url, "big"), *small = svc_connect(url, "small");
  put_many(small, 3, NULL); /* first: the newest of all come first in the server's list */
  put_many(big, 3000, NULL);
  put_many(big, 500, "big/");
  uint64_t before = walked(s);
  tport_tensor_info *v;
  size_t n;
  tport_err err;
  cr_assert_eq(tport_list(small, &v, &n, &err), 0, "%s", err.msg);
  cr_assert_eq(n, 3, "small's tensors: %zu", n);
  free(v);
  cr_assert_eq(walked(s) - before, 3, "entries the List walked: %llu, for a tenant of 3",
               (unsigned long long)(walked(s) - before));
  cr_assert_eq(tport_list(big, &v, &n, &err), 0, "%s", err.msg);
  cr_assert_eq(n, 3500);
  free(v);
  tport_close(small);
  tport_close(big);
  server_stop(s, 1000);
}
