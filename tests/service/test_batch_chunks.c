/* test_batch_chunks.c: the elements of a batch longer than a chunk,
 * against a server in this process (64 KiB chunks, ipc://, no region).
 * tport_put_batch begins them together in a PutBatch, their chunks and
 * commits in the batch's one window beside the small elements -- no
 * PutBegin of their own, every value exact, progress to the end; a batch
 * cancelled at any moment leaves on the server exactly the elements it
 * says were put (a commit in flight is answered before the cancel ends the
 * batch, and what was begun and not committed is aborted).
 * tport_get_batch reads them in one window too: one GetBegin each, their
 * GetChunks beside the others', more of them than the connection may hold
 * transfers at once, and on a server whose --max-transfers is below its
 * window; the deferred ones of up to a chunk go four to a GetBatch, their
 * bytes lent from the tensors into its reply. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server_internal.h" /* the server's count of requests by method */
#include "service_util.h"

#define WAIT_MS 30000

static server *srv;
static char url[256];

static void start(void)
{
  server_config cfg;
  svc_config(&cfg); /* 64 KiB chunks */
  svc_ipc_url(url, sizeof url);
  free(cfg.listen[0]);
  cfg.listen[0] = strdup(url);
  cfg.nlisten = 1;
  tport_err err;
  cr_assert_eq(server_start(&cfg, &srv, &err), 0, "%s", err.msg);
  config_free(&cfg);
}

static void stop(void)
{
  server_stop(srv, 1000);
}

TestSuite(batch_chunks, .init = start, .fini = stop, .timeout = 120);

static tport_client *connect_plain(void)
{
  tport_connect_options o = {.timeout_ms = WAIT_MS, .no_shm = true};
  tport_client *c;
  tport_err err;
  cr_assert_eq(tport_connect(url, &o, &c, &err), TPORT_OK, "%s", err.msg);
  return c;
}

/* A server of its own on a fresh ipc:// URL, the suite's config with
 * chunk_bytes and max_transfers (0: as it is), and a client of it. */
static server *start_own(size_t chunk_bytes, int max_transfers, tport_client **c)
{
  server_config cfg;
  svc_config(&cfg);
  if (chunk_bytes)
    cfg.chunk_bytes = chunk_bytes;
  if (max_transfers)
    cfg.max_transfers = max_transfers;
  char u[256];
  svc_ipc_url(u, sizeof u);
  free(cfg.listen[0]);
  cfg.listen[0] = strdup(u);
  cfg.nlisten = 1;
  server *s;
  tport_err err;
  cr_assert_eq(server_start(&cfg, &s, &err), 0, "%s", err.msg);
  config_free(&cfg);
  tport_connect_options o = {.timeout_ms = WAIT_MS, .no_shm = true};
  cr_assert_eq(tport_connect(u, &o, c, &err), TPORT_OK, "%s", err.msg);
  return s;
}

static uint64_t requests(uint16_t method)
{
  return atomic_load(&srv->requests[method]);
}

typedef struct progress {
  uint64_t last, total, calls;
  bool backwards;
} progress;

static void on_progress(void *arg, uint64_t done, uint64_t total)
{
  progress *p = arg;
  p->backwards |= done < p->last;
  p->last = done;
  p->total = total;
  p->calls++;
}

/* Sizes in bytes: 1 MiB (16 chunks) at 3, 9, 15; 200,000 (4) at 0, 6, 12; the
 * others small. */
static size_t bytes_of(int i)
{
  if (i % 3 == 0)
    return i % 2 ? (size_t)1 << 20 : 200000;
  return 40 + (size_t)i * 12;
}

Test(batch_chunks, elements_of_several_chunks_go_in_the_batch_window)
{
  tport_client *c = connect_plain();
  enum { N = 18 };
  tport_put_item puts[N];
  tport_get_item gets[N];
  int64_t sizes[N];
  uint8_t *vals[N];
  tport_put_options opts[N];
  char names[N][32];
  progress prog = {0};
  size_t chunks = 0, large = 0;
  memset(gets, 0, sizeof gets);
  for (int i = 0; i < N; i++) {
    size_t n = bytes_of(i);
    vals[i] = malloc(n);
    for (size_t j = 0; j < n; j++)
      vals[i][j] = (uint8_t)(i * 31 + j * 7 + j / 4096);
    sizes[i] = (int64_t)n;
    tport_put_options_init(&opts[i]);
    snprintf(names[i], sizeof names[i], "bc/%d", i);
    opts[i].name = names[i];
    if (i == 3) {
      opts[i].progress = on_progress;
      opts[i].progress_arg = &prog;
    }
    puts[i] = (tport_put_item){
        .dtype = TPORT_UINT8, .ndim = 1, .sizes = &sizes[i], .data = vals[i], .nbytes = n,
        .opts = &opts[i]};
    if (n > (size_t)64 << 10) {
      large++;
      chunks += (n + (64 << 10) - 1) / (64 << 10);
    }
  }
  cr_assert_eq(large, 6);
  uint64_t begins = requests(TPORT__METHOD__METHOD_PUT_BEGIN),
           chunk_reqs = requests(TPORT__METHOD__METHOD_PUT_CHUNK),
           commits = requests(TPORT__METHOD__METHOD_PUT_COMMIT),
           batches = requests(TPORT__METHOD__METHOD_PUT_BATCH);
  tport_err err;
  cr_assert_eq(tport_put_batch(c, puts, N, &err), TPORT_OK, "%s", err.msg);
  /* counted on arrival: every one arrived before its reply */
  cr_assert_eq(requests(TPORT__METHOD__METHOD_PUT_BEGIN) - begins, 0,
               "the large elements were begun in the batch, not one by one");
  cr_assert_eq(requests(TPORT__METHOD__METHOD_PUT_CHUNK) - chunk_reqs, chunks);
  cr_assert_eq(requests(TPORT__METHOD__METHOD_PUT_COMMIT) - commits, large);
  /* the begins, and the small ones in one */
  cr_assert_eq(requests(TPORT__METHOD__METHOD_PUT_BATCH) - batches, 2);
  cr_assert_eq(prog.total, bytes_of(3));
  cr_assert_eq(prog.last, bytes_of(3), "progress ends at the element's size");
  cr_assert_eq(prog.calls, (bytes_of(3) + (64 << 10) - 1) / (64 << 10), "one call per chunk");
  cr_assert_not(prog.backwards);
  for (int i = 0; i < N; i++) {
    cr_assert_eq(puts[i].err.code, TPORT_OK, "%d: %s", i, puts[i].err.msg);
    cr_assert_str_eq(puts[i].info.ref.name, names[i]);
    cr_assert_eq(puts[i].info.sizes[0], sizes[i], "element %d", i);
    tport_ref_name(&gets[i].ref, names[i]);
  }
  cr_assert_eq(tport_get_batch(c, gets, N, &err), TPORT_OK, "%s", err.msg);
  for (int i = 0; i < N; i++) {
    cr_assert_eq(gets[i].nbytes, bytes_of(i), "element %d", i);
    cr_assert_eq(memcmp(gets[i].data, vals[i], bytes_of(i)), 0, "element %d", i);
    cr_assert_eq(tport_free(c, &gets[i].ref, &err), TPORT_OK, "%s", err.msg);
    free(gets[i].data);
    free(vals[i]);
  }
  tport_close(c);
}

/* Cancelled at once or a little later, round after round: whatever each
 * element's result, the server holds exactly the ones that say OK, with
 * their values, and no upload in progress. */
Test(batch_chunks, a_cancelled_batch_leaves_exactly_what_it_says)
{
  tport_client *c = connect_plain();
  enum { N = 12 };
  tport_put_item puts[N];
  int64_t sizes[N];
  uint8_t *vals[N];
  for (int i = 0; i < N; i++) {
    size_t n = i % 2 ? (size_t)1 << 20 : 100 + (size_t)i;
    vals[i] = malloc(n);
    memset(vals[i], 'a' + i, n);
    sizes[i] = (int64_t)n;
  }
  int outcomes[3] = {0}; /* all put, none, some */
  for (int round = 0; round < 30; round++) {
    for (int i = 0; i < N; i++)
      puts[i] = (tport_put_item){.dtype = TPORT_UINT8,
                                 .ndim = 1,
                                 .sizes = &sizes[i],
                                 .data = vals[i],
                                 .nbytes = (size_t)sizes[i]};
    tport_request *r;
    tport_err err;
    cr_assert_eq(tport_put_batch_async(c, puts, N, NULL, NULL, &r, &err), TPORT_OK, "%s",
                 err.msg);
    if (round % 3)
      usleep((useconds_t)(round * round * 40)); /* up to ~34 ms */
    tport_cancel(r);
    tport_wait(r, WAIT_MS, &err);
    tport_request_free(r);
    int ok = 0;
    for (int i = 0; i < N; i++) {
      if (puts[i].err.code != TPORT_OK) {
        cr_assert_eq(puts[i].err.code, TPORT_CANCELLED, "round %d, element %d: %s", round, i,
                     puts[i].err.msg);
        continue;
      }
      ok++;
      uint8_t *back;
      size_t n;
      cr_assert_eq(tport_get_alloc(c, &puts[i].info.ref, (void **)&back, &n, NULL, &err),
                   TPORT_OK, "round %d, element %d: %s", round, i, err.msg);
      cr_assert_eq(n, (size_t)sizes[i]);
      cr_assert_eq(memcmp(back, vals[i], n), 0, "round %d, element %d", round, i);
      free(back);
    }
    cr_assert_eq(svc_counter(c, "tensors"), ok, "round %d: %d elements say they were put", round,
                 ok);
    cr_assert_eq(svc_counter(c, "uploads_in_progress"), 0, "round %d", round);
    for (int i = 0; i < N; i++)
      if (puts[i].err.code == TPORT_OK)
        cr_assert_eq(tport_free(c, &puts[i].info.ref, &err), TPORT_OK, "%s", err.msg);
    outcomes[ok == N ? 0 : ok == 0 ? 1 : 2]++;
  }
  cr_log_info("rounds with every element put: %d, none: %d, some: %d", outcomes[0], outcomes[1],
              outcomes[2]);
  for (int i = 0; i < N; i++)
    free(vals[i]);
  tport_close(c);
}

/* The i-th uint8 tensor of bytes, its values in *val (the caller's to
 * free), put alone. */
static void put_one(tport_client *c, int i, size_t bytes, uint8_t **val, tport_ref *ref)
{
  *val = malloc(bytes);
  for (size_t j = 0; j < bytes; j++)
    (*val)[j] = (uint8_t)(i * 13 + j * 5 + j / 1000);
  int64_t sz = (int64_t)bytes;
  tport_tensor_info info;
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &sz, NULL, *val, bytes, NULL, &info, &err), TPORT_OK,
               "%s", err.msg);
  *ref = info.ref;
}

/* n large uint8 tensors (4 chunks and a bit) put one by one. */
static void put_large(tport_client *c, int n, size_t bytes, uint8_t **vals, tport_ref *refs)
{
  for (int i = 0; i < n; i++)
    put_one(c, i, bytes, &vals[i], &refs[i]);
}

/* A get batch's items for refs, each into a buffer libtport makes. */
static void gets_of(const tport_ref *refs, int n, tport_get_item *gets)
{
  memset(gets, 0, (size_t)n * sizeof *gets);
  for (int i = 0; i < n; i++)
    gets[i].ref = refs[i];
}

/* Every element of a get batch read and its values exact (sizes[i] bytes
 * of vals[i], or bytes each where sizes is NULL); its buffer and vals[i]
 * freed. */
static void expect_values(tport_get_item *gets, uint8_t **vals, const size_t *sizes, size_t bytes,
                          int n)
{
  for (int i = 0; i < n; i++) {
    cr_assert_eq(gets[i].err.code, TPORT_OK, "%d: %s", i, gets[i].err.msg);
    cr_assert_eq(memcmp(gets[i].data, vals[i], sizes ? sizes[i] : bytes), 0, "element %d", i);
    free(gets[i].data);
    free(vals[i]);
  }
}

/* 24 tensors of 5 chunks and one small: one GetBegin each (the GetBatch's
 * deferral aside), every chunk once, half into the caller's buffers. */
Test(batch_chunks, large_gets_go_in_the_batch_window)
{
  tport_client *c = connect_plain();
  enum { N = 25 };
  size_t bytes = (size_t)(4 << 16) + 1000;
  uint8_t *vals[N];
  tport_ref refs[N];
  put_large(c, N - 1, bytes, vals, refs);
  static const float small[3] = {1, 2, 3};
  int64_t s3 = 3;
  tport_tensor_info si;
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_FLOAT32, 1, &s3, NULL, small, sizeof small, NULL, &si, &err), 0);
  refs[N - 1] = si.ref;
  tport_get_item gets[N];
  memset(gets, 0, sizeof gets);
  for (int i = 0; i < N; i++) {
    gets[i].ref = refs[i];
    if (i % 2 && i < N - 1) {
      gets[i].buf = malloc(bytes);
      gets[i].cap = bytes;
    }
  }
  uint64_t begins = requests(TPORT__METHOD__METHOD_GET_BEGIN),
           chunk_reqs = requests(TPORT__METHOD__METHOD_GET_CHUNK);
  cr_assert_eq(tport_get_batch(c, gets, N, &err), TPORT_OK, "%s", err.msg);
  cr_assert_eq(requests(TPORT__METHOD__METHOD_GET_BEGIN) - begins, N - 1,
               "one GetBegin per large element, none for the small one (inline)");
  cr_assert_eq(requests(TPORT__METHOD__METHOD_GET_CHUNK) - chunk_reqs, (N - 1) * 5);
  for (int i = 0; i < N - 1; i++) {
    cr_assert_eq(gets[i].err.code, TPORT_OK, "%d: %s", i, gets[i].err.msg);
    cr_assert_eq(gets[i].nbytes, bytes);
    cr_assert_eq(gets[i].info.sizes[0], (int64_t)bytes);
    cr_assert(gets[i].buf == NULL || gets[i].data == gets[i].buf);
    cr_assert_eq(memcmp(gets[i].data, vals[i], bytes), 0, "element %d", i);
    free(gets[i].buf ? gets[i].buf : gets[i].data);
    free(vals[i]);
  }
  cr_assert_eq(memcmp(gets[N - 1].data, small, sizeof small), 0);
  free(gets[N - 1].data);
  tport_close(c);
}

/* A server that lets a connection hold 2 gets in progress, with a window
 * of 8: the batch's large elements still all arrive (the ones refused for
 * it are read alone after the window), and a buffer too small fails its
 * element only. */
Test(batch_chunks, large_gets_past_the_servers_transfer_limit)
{
  tport_client *c;
  server *s2 = start_own(0, 2, &c);
  tport_err err;
  enum { N = 12 };
  size_t bytes = (size_t)(3 << 16) + 7;
  uint8_t *vals[N];
  tport_ref refs[N];
  put_large(c, N, bytes, vals, refs);
  tport_get_item gets[N];
  gets_of(refs, N, gets);
  uint8_t tiny[100];
  gets[5].buf = tiny;
  gets[5].cap = sizeof tiny;
  cr_assert_eq(tport_get_batch(c, gets, N, &err), TPORT_OUT_OF_RANGE, "%s", err.msg);
  cr_assert(strstr(err.msg, "1 of 12"), "%s", err.msg);
  for (int i = 0; i < N; i++) {
    if (i == 5) {
      cr_assert_eq(gets[i].err.code, TPORT_OUT_OF_RANGE, "%s", gets[i].err.msg);
      cr_assert_eq(gets[i].nbytes, 0);
    } else {
      cr_assert_eq(gets[i].err.code, TPORT_OK, "%d: %s", i, gets[i].err.msg);
      cr_assert_eq(memcmp(gets[i].data, vals[i], bytes), 0, "element %d", i);
      free(gets[i].data);
    }
    free(vals[i]);
  }
  tport_close(c);
  server_stop(s2, 1000);
}

/* 1 MiB chunks: 12 tensors of 300 KB, each 64 KiB or more, deferred by the
 * first GetBatch (which asks only their sizes: their bytes are read in
 * place, deploy/nng 0014); they come three to a GetBatch (four would pass
 * the chunk), every byte of them lent from the tensors, values exact. */
Test(batch_chunks, deferred_gets_share_getbatches_their_bytes_lent)
{
  tport_client *c;
  server *s2 = start_own((size_t)1 << 20, 0, &c);
  tport_err err;
  enum { N = 12 };
  size_t bytes = 300000;
  uint8_t *vals[N];
  tport_ref refs[N];
  put_large(c, N, bytes, vals, refs);
  tport_get_item gets[N];
  gets_of(refs, N, gets);
  uint64_t batches = atomic_load(&s2->requests[TPORT__METHOD__METHOD_GET_BATCH]),
           begins = atomic_load(&s2->requests[TPORT__METHOD__METHOD_GET_BEGIN]),
           lent = atomic_load(&s2->bytes_lent);
  cr_assert_eq(tport_get_batch(c, gets, N, &err), TPORT_OK, "%s", err.msg);
  uint64_t nb = atomic_load(&s2->requests[TPORT__METHOD__METHOD_GET_BATCH]) - batches;
  cr_assert_eq(atomic_load(&s2->requests[TPORT__METHOD__METHOD_GET_BEGIN]) - begins, 0,
               "no GetBegin of their own");
  /* the first (none inline), then the 12 three a request */
  cr_assert_eq(nb, 5, "%llu GetBatch requests", (unsigned long long)nb);
  uint64_t l = atomic_load(&s2->bytes_lent) - lent;
  cr_assert_geq(l, (uint64_t)N * bytes, "%llu bytes lent", (unsigned long long)l);
  expect_values(gets, vals, NULL, bytes, N);
  tport_close(c);
  server_stop(s2, 1000);
}


/* Deferred elements are packed largest first: 1 MiB (a chunk: a GetBatch
 * of its own), 600 KB, 600 KB, 400 KB and 400 KB go in three GetBatches
 * after the first (600 + 400 twice; in their order they took four), every
 * value exact and in its own element. */
Test(batch_chunks, deferred_gets_are_packed_largest_first)
{
  tport_client *c;
  server *s2 = start_own((size_t)1 << 20, 0, &c);
  tport_err err;
  enum { N = 5 };
  static const size_t sizes[N] = {(size_t)1 << 20, 600000, 600000, 400000, 400000};
  uint8_t *vals[N];
  tport_ref refs[N];
  for (int i = 0; i < N; i++)
    put_one(c, i, sizes[i], &vals[i], &refs[i]);
  tport_get_item gets[N];
  gets_of(refs, N, gets);
  uint64_t batches = atomic_load(&s2->requests[TPORT__METHOD__METHOD_GET_BATCH]);
  cr_assert_eq(tport_get_batch(c, gets, N, &err), TPORT_OK, "%s", err.msg);
  uint64_t nb = atomic_load(&s2->requests[TPORT__METHOD__METHOD_GET_BATCH]) - batches;
  cr_assert_eq(nb, 4, "%llu GetBatch requests: the first and three", (unsigned long long)nb);
  for (int i = 0; i < N; i++)
    cr_assert_eq(gets[i].nbytes, sizes[i], "element %d: %s", i, gets[i].err.msg);
  expect_values(gets, vals, sizes, 0, N);
  tport_close(c);
  server_stop(s2, 1000);
}

/* Eight 100 KB tensors inline in one GetBatch reply (1 MiB chunks; after
 * the first, which asks their sizes): the reply lends the last four from
 * the tensors and copies the first four from the storages it held for
 * them; every value exact. */
Test(batch_chunks, a_get_batch_lends_its_last_four_payloads_and_copies_the_rest)
{
  tport_client *c;
  server *s2 = start_own((size_t)1 << 20, 0, &c);
  tport_err err;
  enum { N = 8 };
  size_t bytes = 100000;
  uint8_t *vals[N];
  tport_ref refs[N];
  put_large(c, N, bytes, vals, refs);
  tport_get_item gets[N];
  gets_of(refs, N, gets);
  uint64_t batches = atomic_load(&s2->requests[TPORT__METHOD__METHOD_GET_BATCH]),
           lent = atomic_load(&s2->bytes_lent);
  cr_assert_eq(tport_get_batch(c, gets, N, &err), TPORT_OK, "%s", err.msg);
  cr_assert_eq(atomic_load(&s2->requests[TPORT__METHOD__METHOD_GET_BATCH]) - batches, 2);
  cr_assert_eq(atomic_load(&s2->bytes_lent) - lent, 4 * bytes, "only the last four are lent");
  expect_values(gets, vals, NULL, bytes, N);
  tport_close(c);
  server_stop(s2, 1000);
}
