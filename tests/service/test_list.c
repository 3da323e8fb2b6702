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

#include "hostile_util.h"
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
    items[i] = (tport_put_item){.dtype = TPORT_UINT8, .ndim = 1, .sizes = &zero, .opts = &opts[i]};
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

static void put_named(tport_client *c, const char *name)
{
  tport_put_options o;
  tport_put_options_init(&o);
  o.name = name;
  o.ttl_ms = 60000;
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, (int64_t[]){0}, NULL, NULL, 0, &o, NULL, &err), 0,
               "%s: %s", name, err.msg);
}

/* The names tport_list_named(c, prefix) gives, joined by spaces (each
 * name=handle with handles). */
static void listed(tport_client *c, bool handles, const char *prefix, char *out, size_t len)
{
  tport_tensor_info *v;
  size_t n;
  tport_err err;
  cr_assert_eq(tport_list_named(c, prefix, &v, &n, &err), 0, "%s", err.msg);
  out[0] = 0;
  for (size_t i = 0; i < n; i++) {
    char hex[40] = "";
    tport_ref h = v[i].ref;
    h.name[0] = 0;
    if (handles)
      tport_ref_format(&h, hex, sizeof hex);
    snprintf(out + strlen(out), len - strlen(out), "%s%s%s%s", i ? " " : "", v[i].ref.name,
             handles ? "=" : "", hex);
  }
  free(v);
}

static void named(tport_client *c, const char *prefix, char *out, size_t len)
{
  listed(c, false, prefix, out, len);
}

Test(list, a_named_listing_gives_the_names_under_a_prefix_in_order)
{
  char url[128], got[512];
  server *s = svc_start_inproc(url, sizeof url, NULL);
  tport_client *a = svc_connect(url, "a"), *b = svc_connect(url, "b");
  const char *mine[] = {"m/b", "m/a", "m/c/x", "n/a", "m", "m/"};
  for (size_t i = 0; i < sizeof mine / sizeof *mine; i++)
    put_named(a, mine[i]);
  put_many(a, 40, NULL); /* unnamed: never in a named listing */
  put_named(b, "m/z");   /* another tenant's: never seen */
  named(a, "m/", got, sizeof got);
  cr_assert_str_eq(got, "m/ m/a m/b m/c/x");
  named(a, "", got, sizeof got);
  cr_assert_str_eq(got, "m m/ m/a m/b m/c/x n/a");
  named(a, NULL, got, sizeof got);
  cr_assert_str_eq(got, "m m/ m/a m/b m/c/x n/a");
  named(a, "m/c/x/", got, sizeof got);
  cr_assert_str_eq(got, "");
  named(b, "m", got, sizeof got);
  cr_assert_str_eq(got, "m/z");
  /* a named listing walks the tenant's 6 named tensors, not its 40 others */
  uint64_t before = walked(s);
  named(a, "n/", got, sizeof got);
  cr_assert_str_eq(got, "n/a");
  cr_assert_eq(walked(s) - before, 6, "walked %llu", (unsigned long long)(walked(s) - before));
  tport_tensor_info *v;
  size_t n;
  tport_err err;
  cr_assert_eq(tport_list(a, &v, &n, &err), 0, "%s", err.msg);
  cr_assert_eq(n, 46, "a plain List still gives every tensor: %zu", n);
  free(v);
  tport_close(b);
  tport_close(a);
  server_stop(s, 1000);
}

/* The tensors a raw List with prefix and named gets back from the server
 * itself (libtport filters again, for servers older than the prefix). */
static size_t raw_list(const char *url, const char *tenant, const char *prefix, bool named_only)
{
  rawc r;
  raw_open(&r, url);
  char msg[256];
  cr_assert_eq(raw_hello(&r, tenant, msg), 0, "%s", msg);
  Tport__ListRequest q = TPORT__LIST_REQUEST__INIT;
  q.prefix = (char *)prefix;
  q.named = named_only;
  Tport__ListReply *rep;
  cr_assert_eq(raw_call(&r, TPORT__METHOD__METHOD_LIST, &q.base, NULL, 0,
                        &tport__list_reply__descriptor, msg, (ProtobufCMessage **)&rep, NULL),
               0, "%s", msg);
  size_t n = rep->n_tensors;
  for (size_t i = 0; i < n; i++)
    cr_assert(rep->tensors[i]->ref && !strncmp(rep->tensors[i]->ref->name, prefix, strlen(prefix)));
  protobuf_c_message_free_unpacked(&rep->base, NULL);
  raw_close(&r);
  return n;
}

Test(list, the_server_sends_only_the_names_under_the_prefix)
{
  char url[128];
  server *s = svc_start_inproc(url, sizeof url, NULL);
  tport_client *a = svc_connect(url, "a");
  put_named(a, "w/1");
  put_named(a, "w/2");
  put_named(a, "x");
  put_many(a, 5, NULL);
  cr_assert_eq(raw_list(url, "a", "w/", false), 2);
  cr_assert_eq(raw_list(url, "a", "", true), 3);
  cr_assert_eq(raw_list(url, "a", "", false), 8, "neither: every tensor, as before");
  cr_assert_eq(raw_list(url, "b", "", false), 0);
  tport_close(a);
  server_stop(s, 1000);
}

Test(list, uploads_in_progress_are_not_listed_and_a_replace_swaps_at_its_commit)
{
  char url[128], before[512], during[512], after[512];
  server *s = svc_start_inproc(url, sizeof url, NULL);
  tport_client *c = svc_connect(url, "up");
  put_named(c, "u/a");
  listed(c, true, "u/", before, sizeof before);
  rawc r;
  raw_open(&r, url);
  char msg[256];
  cr_assert_eq(raw_hello(&r, "up", msg), 0, "%s", msg);
  const size_t n = 4 * CHUNK;
  uint8_t *data = calloc(1, n), hr[16], hn[16];
  cr_assert_eq(raw_put_begin_replacing(&r, n, "u/a", hr, msg), 0, "%s", msg); /* at its commit */
  cr_assert_eq(raw_put_begin(&r, n, NULL, "u/b", hn, msg), 0, "%s", msg);     /* u/b's already */
  listed(c, true, "u/", during, sizeof during);
  cr_assert_str_eq(during, before, "during the uploads: the old u/a alone");
  raw_chunks(&r, hr, data, n, 0, nchunks(n));
  cr_assert_eq(raw_commit(&r, hr, msg, NULL), 0, "%s", msg);
  raw_chunks(&r, hn, data, n, 0, nchunks(n));
  cr_assert_eq(raw_commit(&r, hn, msg, NULL), 0, "%s", msg);
  listed(c, true, "u/", after, sizeof after);
  char want[512], a[40], b[40];
  tport_ref ra, rb;
  memset(&ra, 0, sizeof ra);
  memset(&rb, 0, sizeof rb);
  memcpy(ra.handle, hr, 16);
  memcpy(rb.handle, hn, 16);
  tport_ref_format(&ra, a, sizeof a);
  tport_ref_format(&rb, b, sizeof b);
  snprintf(want, sizeof want, "u/a=%s u/b=%s", a, b);
  cr_assert_str_eq(after, want, "after the commits: the new u/a once, and u/b");
  free(data);
  raw_close(&r);
  tport_close(c);
  server_stop(s, 1000);
}
