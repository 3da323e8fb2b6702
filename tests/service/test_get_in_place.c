/* test_get_in_place.c: gets over the socket whose replies nng reads
 * straight into the caller's buffers (deploy/nng 0014) -- a get's chunks,
 * and a batch's elements, planned by their buffers, the largest of each
 * GetBatch's last so that its reply's end lands in place.  Over tcp and
 * ipc (no region), against a server in this process with 1 MiB chunks:
 *  - a batch of many sizes into buffers of exactly their sizes comes back
 *    exact, as does a get of many chunks;
 *  - buffers larger than their tensors, an element whose name does not
 *    exist, and one too large for its buffer (OUT_OF_RANGE) cost those
 *    elements only: the others exact, nothing written past their bytes;
 *  - a GetBatch's reply not laid out as planned (a name replaced by a
 *    larger tensor between the batch's first request and its GetBatch):
 *    its placed bytes are put back and it is read as it came. */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "get_direct.h" /* get_batch_test_looked */
#include "service_util.h"

enum { N = 48 };

static server *srv;
static char tcp[64], ipc[96], sock_dir[96];

static void configure(server_config *cfg)
{
  svc_config_shm(cfg, "inplace", sock_dir, sizeof sock_dir); /* (same host: one test) */
  cfg->chunk_bytes = 1 << 20;
}

static void start(void)
{
  srv = svc_start_tcp_ipc(configure, tcp, sizeof tcp, ipc, sizeof ipc);
  cr_assert_not_null(srv);
}

static void stop(void)
{
  server_stop(srv, 1000);
  rmdir(sock_dir);
}

TestSuite(in_place, .init = start, .fini = stop, .timeout = 120);

static tport_client *connect_to(const char *url)
{
  tport_connect_options o = {.timeout_ms = 20000, .no_shm = true};
  tport_client *c;
  tport_err err;
  cr_assert_eq(tport_connect(url, &o, &c, &err), TPORT_OK, "%s", err.msg);
  return c;
}

/* Element i's bytes: from 1 byte to 700 KB (groups of several, the
 * largest lent), two over the chunk (read in chunks). */
static size_t size_of(int i)
{
  if (i == 5 || i == 40)
    return (3u << 20) + 7u * (unsigned)i;
  if (i % 4 == 0)
    return 300000 + (size_t)i * 9000;
  return 1 + (size_t)(i * 7919 % 60000);
}

static uint8_t value(int i, size_t k)
{
  return (uint8_t)(k * 131 + (size_t)i * 17 + 5);
}

typedef struct dict {
  uint8_t *vals[N];
  tport_tensor_info infos[N];
} dict;

static void put_all(tport_client *c, dict *d)
{
  tport_put_item puts[N];
  int64_t sizes[N];
  for (int i = 0; i < N; i++) {
    size_t n = size_of(i);
    d->vals[i] = malloc(n);
    for (size_t k = 0; k < n; k++)
      d->vals[i][k] = value(i, k);
    sizes[i] = (int64_t)n;
    puts[i] = (tport_put_item){
        .dtype = TPORT_UINT8, .ndim = 1, .sizes = &sizes[i], .data = d->vals[i], .nbytes = n};
  }
  tport_err err;
  cr_assert_eq(tport_put_batch(c, puts, N, &err), TPORT_OK, "%s", err.msg);
  for (int i = 0; i < N; i++)
    d->infos[i] = puts[i].info;
}

static void free_all(tport_client *c, dict *d)
{
  for (int i = 0; i < N; i++) {
    tport_free(c, &d->infos[i].ref, NULL);
    free(d->vals[i]);
  }
}

/* The batch into buffers of size_of(i) + extra bytes (each filled with
 * 0xEE first); element i's ref replaced by refs[i] where given. */
static void get_all(tport_client *c, const dict *d, size_t extra, const tport_ref *refs,
                    tport_get_item *gets, uint8_t **bufs)
{
  for (int i = 0; i < N; i++) {
    size_t cap = size_of(i) + extra;
    bufs[i] = malloc(cap);
    memset(bufs[i], 0xEE, cap);
    gets[i] = (tport_get_item){
        .ref = refs && refs[i].name[0] ? refs[i] : d->infos[i].ref, .buf = bufs[i], .cap = cap};
  }
  tport_err err;
  tport_get_batch(c, gets, N, &err);
}

static void expect_exact(const char *url, const tport_get_item *g, int i, const dict *d)
{
  size_t n = size_of(i);
  cr_expect_eq(g->err.code, TPORT_OK, "%s: element %d: %s", url, i, g->err.msg);
  cr_expect_eq(g->nbytes, n, "%s: element %d: %zu bytes", url, i, g->nbytes);
  cr_expect_eq(g->data, g->buf, "%s: element %d not in its buffer", url, i);
  cr_expect(g->nbytes == n && memcmp(g->buf, d->vals[i], n) == 0, "%s: element %d differs", url, i);
}

static void batch_round_trip(const char *url)
{
  tport_client *c = connect_to(url);
  dict d;
  put_all(c, &d);
  tport_get_item gets[N];
  uint8_t *bufs[N];
  for (size_t extra = 0; extra <= 4096; extra += 4096) {
    get_all(c, &d, extra, NULL, gets, bufs);
    for (int i = 0; i < N; i++) {
      expect_exact(url, &gets[i], i, &d);
      for (size_t k = size_of(i); k < size_of(i) + extra; k++)
        if (bufs[i][k] != 0xEE) {
          cr_expect_fail("%s: element %d written past its bytes (at %zu)", url, i, k);
          break;
        }
      free(bufs[i]);
    }
  }
  /* one get of many chunks */
  size_t n = size_of(40);
  uint8_t *one = malloc(n);
  tport_err err;
  cr_expect_eq(tport_get(c, &d.infos[40].ref, one, n, NULL, NULL, NULL, &err), TPORT_OK, "%s",
               err.msg);
  cr_expect_eq(memcmp(one, d.vals[40], n), 0, "%s: the single get differs", url);
  free(one);
  free_all(c, &d);
  tport_close(c);
}

Test(in_place, a_batch_and_a_get_come_back_exact_over_tcp)
{
  batch_round_trip(tcp);
}

Test(in_place, a_batch_and_a_get_come_back_exact_over_ipc)
{
  batch_round_trip(ipc);
}

/* Element 3 names nothing; element 8 (the largest of its group, read in
 * place) is replaced by a tensor twice its size after the batch was
 * planned: each fails alone. */
static void failures_alone(const char *url)
{
  tport_client *c = connect_to(url);
  dict d;
  put_all(c, &d);
  tport_ref refs[N];
  memset(refs, 0, sizeof refs);
  tport_ref_name(&refs[3], "no-such-tensor");
  size_t big = 2 * size_of(8);
  uint8_t *twice = calloc(1, big);
  int64_t bs = (int64_t)big;
  tport_put_options po;
  tport_put_options_init(&po);
  po.name = "replaced";
  tport_tensor_info named;
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &bs, NULL, twice, big, &po, &named, &err), TPORT_OK,
               "%s", err.msg);
  tport_ref_name(&refs[8], "replaced");
  tport_get_item gets[N];
  uint8_t *bufs[N];
  get_all(c, &d, 0, refs, gets, bufs);
  for (int i = 0; i < N; i++) {
    if (i == 3)
      cr_expect_eq(gets[i].err.code, TPORT_NOT_FOUND, "%s: %d %s", url, gets[i].err.code,
                   gets[i].err.msg);
    else if (i == 8)
      cr_expect_eq(gets[i].err.code, TPORT_OUT_OF_RANGE, "%s: %d %s", url, gets[i].err.code,
                   gets[i].err.msg);
    else
      expect_exact(url, &gets[i], i, &d);
    free(bufs[i]);
  }
  tport_free(c, &named.ref, NULL);
  free(twice);
  free_all(c, &d);
  tport_close(c);
}

Test(in_place, failures_cost_their_elements_only_over_tcp)
{
  failures_alone(tcp);
}

Test(in_place, failures_cost_their_elements_only_over_ipc)
{
  failures_alone(ipc);
}

/* ---------------------------------------------------------------- a reply not as planned */

enum { SMALL = 100000, PLANNED = 500000, GROWN = 700000 };
static tport_client *replacer;
static atomic_int replaced;

/* The GetBatch of the window looks at its first element: "grows" (its
 * last, read in place) is replaced by a larger tensor before it is looked
 * at -- once. */
static void grow_name(size_t element)
{
  (void)element;
  if (atomic_exchange(&replaced, 1))
    return;
  uint8_t *v = malloc(GROWN);
  memset(v, 0x77, GROWN);
  tport_put_options o;
  tport_put_options_init(&o);
  o.name = "grows";
  o.replace = true;
  int64_t sz = GROWN;
  tport_err err;
  cr_assert_eq(tport_put(replacer, TPORT_UINT8, 1, &sz, NULL, v, GROWN, &o, NULL, &err), 0, "%s",
               err.msg);
  free(v);
}

static void reply_not_as_planned(const char *url)
{
  tport_client *c = connect_to(url);
  replacer = connect_to(url);
  uint8_t *a = malloc(SMALL), *b = malloc(PLANNED);
  for (size_t k = 0; k < SMALL; k++)
    a[k] = value(1, k);
  memset(b, 0x55, PLANNED);
  int64_t sa = SMALL, sb = PLANNED;
  tport_tensor_info ia;
  tport_put_options o;
  tport_put_options_init(&o);
  o.name = "grows";
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &sa, NULL, a, SMALL, NULL, &ia, &err), 0, "%s",
               err.msg);
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &sb, NULL, b, PLANNED, &o, NULL, &err), 0, "%s",
               err.msg);
  uint8_t *ba = malloc(SMALL), *bb = malloc(PLANNED);
  memset(ba, 0, SMALL);
  tport_get_item gets[2] = {{.ref = ia.ref, .buf = ba, .cap = SMALL}, {.buf = bb, .cap = PLANNED}};
  tport_ref_name(&gets[1].ref, "grows");
  atomic_store(&replaced, 0);
  get_batch_test_looked = grow_name;
  tport_get_batch(c, gets, 2, &err);
  get_batch_test_looked = NULL;
  cr_expect_eq(atomic_load(&replaced), 1, "%s: the name was never replaced", url);
  cr_expect_eq(gets[0].err.code, TPORT_OK, "%s: %s", url, gets[0].err.msg);
  cr_expect_eq(gets[0].nbytes, SMALL);
  cr_expect_eq(memcmp(ba, a, SMALL), 0, "%s: the small element differs", url);
  cr_expect_eq(gets[1].err.code, TPORT_OUT_OF_RANGE, "%s: %d %s", url, gets[1].err.code,
               gets[1].err.msg);
  tport_free(c, &ia.ref, NULL);
  free(a), free(b), free(ba), free(bb);
  tport_close(replacer);
  tport_close(c);
}

Test(in_place, a_reply_not_as_planned_is_read_as_it_came_over_tcp)
{
  reply_not_as_planned(tcp);
}

Test(in_place, a_reply_not_as_planned_is_read_as_it_came_over_ipc)
{
  reply_not_as_planned(ipc);
}

/* Same host, a client with no region yet (its first batch): every element
 * has a buffer, so the batch is planned by the buffers' caps -- sizes the
 * server never said.  A GetBatch's reply is then not read in place (its
 * end would be spread over the buffers by their caps, past the tensors'
 * bytes): four 190,000-byte tensors into 200,000-byte buffers keep their
 * last 10,000 bytes untouched.  Before, each of the four had them
 * overwritten with other elements' bytes, all four reported OK. */
Test(in_place, a_batch_planned_by_caps_writes_no_buffer_past_its_bytes)
{
  tport_connect_options o = {.timeout_ms = 20000};
  tport_client *c;
  tport_err err;
  cr_assert_eq(tport_connect(ipc, &o, &c, &err), TPORT_OK, "%s", err.msg);
  enum { K = 6, BIG = 40 << 20, EXACT = 100000, SMALL_T = 190000, SMALL_CAP = 200000 };
  static const size_t sizes[K] = {BIG, EXACT, SMALL_T, SMALL_T, SMALL_T, SMALL_T};
  static const size_t caps[K] = {BIG, EXACT, SMALL_CAP, SMALL_CAP, SMALL_CAP, SMALL_CAP};
  uint8_t *vals[K], *bufs[K];
  tport_get_item gets[K];
  for (int i = 0; i < K; i++) {
    vals[i] = malloc(sizes[i]);
    for (size_t k = 0; k < sizes[i]; k++)
      vals[i][k] = value(i, k);
    int64_t sz = (int64_t)sizes[i];
    tport_tensor_info info;
    cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &sz, NULL, vals[i], sizes[i], NULL, &info, &err),
                 TPORT_OK, "%s", err.msg);
    bufs[i] = malloc(caps[i]);
    memset(bufs[i], 0xEE, caps[i]);
    gets[i] = (tport_get_item){.ref = info.ref, .buf = bufs[i], .cap = caps[i]};
  }
  cr_assert_eq(tport_get_batch(c, gets, K, &err), TPORT_OK, "%s", err.msg);
  for (int i = 0; i < K; i++) {
    cr_expect_eq(gets[i].nbytes, sizes[i], "element %d: %zu bytes", i, gets[i].nbytes);
    cr_expect_eq(memcmp(bufs[i], vals[i], sizes[i]), 0, "element %d differs", i);
    size_t past = sizes[i];
    while (past < caps[i] && bufs[i][past] == 0xEE)
      past++;
    cr_expect_eq(past, caps[i], "element %d written past its %zu bytes (at %zu)", i, sizes[i],
                 past);
    free(vals[i]), free(bufs[i]);
  }
  tport_close(c);
}
