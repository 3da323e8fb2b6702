/* test_replace.c: a named put with replace (PutBegin.replace) swaps the
 * name to the new tensor at its commit -- readers see the old or the new,
 * never a part -- and frees in batches (FreeRequest.refs), through libtport
 * and raw requests against a server in this process. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "hostile_util.h"
#include "registry.h"
#include "service_util.h"

static server *srv;
static char url[256];

static void suite_start(void)
{
  srv = svc_start_inproc(url, sizeof url, NULL);
}

static void suite_stop(void)
{
  if (srv)
    server_stop(srv, 2000);
  srv = NULL;
}

TestSuite(replace, .init = suite_start, .fini = suite_stop, .timeout = 120);

/* Puts n floats of one value under name; the put's code. */
static int put_value(tport_client *c, const char *name, float value, int64_t n, bool replace,
                     tport_tensor_info *info, tport_err *err)
{
  float *v = malloc((size_t)n * sizeof *v);
  for (int64_t i = 0; i < n; i++)
    v[i] = value;
  tport_put_options o;
  tport_put_options_init(&o);
  o.name = name;
  o.replace = replace;
  tport_tensor_info ignored;
  int rc = tport_put(c, TPORT_FLOAT32, 1, &n, NULL, v, (size_t)n * sizeof *v, &o,
                     info ? info : &ignored, err);
  free(v);
  return rc;
}

Test(replace, swaps_the_name_and_releases_the_old_tensors_bytes)
{
  tport_client *c = svc_connect(url, "r");
  tport_tensor_info first, second, now;
  tport_err err;
  cr_assert_eq(put_value(c, "w", 1.0f, 1 << 18, false, &first, &err), 0, "%s", err.msg);
  int64_t one = svc_counter(c, "tensor_bytes");
  cr_assert_eq(put_value(c, "w", 2.0f, 1 << 18, false, NULL, &err), TPORT_ALREADY_EXISTS,
               "without replace: %s", err.msg);
  cr_assert_eq(put_value(c, "w", 2.0f, 1 << 18, true, &second, &err), 0, "%s", err.msg);
  cr_assert_eq(svc_counter(c, "tensors"), 1, "the old tensor left at the swap");
  cr_assert_eq(svc_counter(c, "tensor_bytes"), one, "the old tensor's bytes left the quota");
  tport_ref ref;
  tport_ref_name(&ref, "w");
  cr_assert_eq(tport_info(c, &ref, &now, &err), 0, "%s", err.msg);
  cr_assert(memcmp(now.ref.handle, second.ref.handle, TPORT_HANDLE_BYTES) == 0);
  /* the old handle is gone */
  cr_assert_eq(tport_info(c, &first.ref, &now, &err), TPORT_NOT_FOUND, "%s", err.msg);
  /* replace of a name nobody holds is a plain named put; a small one
   * (one request, committed at once) swaps as well */
  cr_assert_eq(put_value(c, "fresh", 3.0f, 4, true, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(put_value(c, "fresh", 4.0f, 4, true, NULL, &err), 0, "%s", err.msg);
  float v[4];
  tport_ref_name(&ref, "fresh");
  cr_assert_eq(tport_get(c, &ref, v, sizeof v, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(v[3], 4.0f);
  cr_assert_eq(svc_counter(c, "tensors"), 2);
  tport_close(c);
}

/* A get of the old tensor that began before the swap reads it to its end:
 * its storage lives while read, though its name, handle and charge went. */
Test(replace, a_get_begun_before_the_swap_reads_the_old_tensor_whole)
{
  enum { N = 1 << 18 }; /* 1 MiB: 16 chunks */
  tport_client *c = svc_connect(url, "r");
  tport_tensor_info old;
  tport_err err;
  cr_assert_eq(put_value(c, "m", 5.0f, N, false, &old, &err), 0, "%s", err.msg);
  int64_t one = svc_counter(c, "tensor_bytes");
  rawc r;
  raw_open(&r, url);
  char msg[256];
  cr_assert_eq(raw_hello(&r, "r", msg), 0, "%s", msg);
  Tport__Ref ref = mkref(NULL, 0, "m");
  uint8_t tid[16];
  cr_assert_eq(raw_get_begin(&r, &ref, 0, msg, tid), 0, "%s", msg);
  cr_assert_eq(put_value(c, "m", 6.0f, N, true, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(svc_counter(c, "tensor_bytes"), one, "only the new tensor is charged");
  for (size_t off = 0; off < (size_t)N * 4; off += CHUNK) {
    Tport__GetChunkRequest q = TPORT__GET_CHUNK_REQUEST__INIT;
    q.transfer.data = tid;
    q.transfer.len = 16;
    q.offset = off;
    q.length = CHUNK;
    nng_msg *m;
    cr_assert_eq(raw_call(&r, TPORT__METHOD__METHOD_GET_CHUNK, &q.base, NULL, 0,
                          &tport__get_chunk_reply__descriptor, msg, NULL, &m),
                 0, "%s", msg);
    frame_view v;
    tport_err fe;
    cr_assert_eq(frame_parse(nng_msg_body(m), nng_msg_len(m), &v, &fe), 0);
    cr_assert_eq(v.payload_len, CHUNK);
    static float f[CHUNK / 4]; /* the payload is not aligned for floats */
    memcpy(f, v.payload, CHUNK);
    for (size_t i = 0; i < CHUNK / 4; i++)
      cr_assert_eq(f[i], 5.0f, "the old tensor changed under its get at %zu", off + i * 4);
    nng_msg_free(m);
  }
  raw_close(&r);
  tport_close(c);
}

Test(replace, a_name_uploading_without_replace_is_not_taken)
{
  tport_client *c = svc_connect(url, "default");
  rawc r;
  raw_open(&r, url);
  char msg[256];
  uint8_t h[16];
  cr_assert_eq(raw_put_begin(&r, 4 * CHUNK, "cpu", "u", h, msg), 0, "%s", msg);
  tport_err err;
  cr_assert_eq(put_value(c, "u", 1.0f, 4, true, NULL, &err), TPORT_ALREADY_EXISTS, "%s", err.msg);
  cr_assert_eq(put_value(c, "u", 1.0f, 4 * CHUNK, true, NULL, &err), TPORT_ALREADY_EXISTS, "%s",
               err.msg);
  raw_close(&r);
  /* gone with its connection: the name is free again */
  cr_assert_eq(put_value(c, "u", 1.0f, 4, true, NULL, &err), 0, "%s", err.msg);
  tport_close(c);
}

/* ---------------------------------------------------------------- readers */

enum { READERS = 4, VERSIONS = 40, ELEMS = 1 << 17 /* 512 KiB: 8 chunks */ };

typedef struct reader {
  atomic_bool *done;
  int reads, errors;
  float last;
  char why[256];
  pthread_t th;
} reader;

static void *read_main(void *arg)
{
  reader *rd = arg;
  tport_client *c = svc_connect(url, "pub");
  tport_ref ref;
  tport_ref_name(&ref, "latest");
  float *v = malloc(ELEMS * sizeof *v);
  while (!atomic_load(rd->done) && !rd->errors) {
    tport_err err;
    int rc = tport_get(c, &ref, v, ELEMS * sizeof *v, NULL, NULL, NULL, &err);
    if (rc) {
      snprintf(rd->why, sizeof rd->why, "get: %.200s", err.msg);
      rd->errors++;
      break;
    }
    rd->reads++;
    for (int i = 1; i < ELEMS; i++)
      if (v[i] != v[0]) {
        snprintf(rd->why, sizeof rd->why, "a mixed tensor: v[0] %g, v[%d] %g", v[0], i, v[i]);
        rd->errors++;
        break;
      }
    if (v[0] < rd->last) {
      snprintf(rd->why, sizeof rd->why, "version %g after %g", v[0], rd->last);
      rd->errors++;
    }
    rd->last = v[0];
  }
  free(v);
  tport_close(c);
  return NULL;
}

Test(replace, concurrent_readers_see_the_old_or_the_new_never_a_mix)
{
  tport_client *w = svc_connect(url, "pub");
  tport_err err;
  cr_assert_eq(put_value(w, "latest", 0.0f, ELEMS, true, NULL, &err), 0, "%s", err.msg);
  atomic_bool done = false;
  reader rd[READERS];
  for (int i = 0; i < READERS; i++) {
    rd[i] = (reader){.done = &done};
    cr_assert_eq(pthread_create(&rd[i].th, NULL, read_main, &rd[i]), 0);
  }
  for (int v = 1; v <= VERSIONS; v++)
    cr_assert_eq(put_value(w, "latest", (float)v, ELEMS, true, NULL, &err), 0, "%d: %s", v,
                 err.msg);
  atomic_store(&done, true);
  for (int i = 0; i < READERS; i++) {
    pthread_join(rd[i].th, NULL);
    cr_assert_eq(rd[i].errors, 0, "reader %d: %s", i, rd[i].why);
    cr_assert_gt(rd[i].reads, 0);
  }
  cr_assert_eq(svc_counter(w, "tensors"), 1, "every old version went");
  cr_assert_eq(svc_counter(w, "tensor_bytes"), (int64_t)ELEMS * 4);
  tport_close(w);
}

/* ---------------------------------------------------------------- frees */

Test(replace, free_many_frees_what_exists_in_one_request)
{
  enum { N = 20 };
  tport_client *c = svc_connect(url, SVC_OPERATOR);
  tport_ref refs[N + 2];
  tport_err err;
  for (int i = 0; i < N; i++) {
    tport_tensor_info info;
    cr_assert_eq(put_value(c, NULL, (float)i, 4, false, &info, &err), 0, "%s", err.msg);
    refs[i] = info.ref;
  }
  tport_ref_name(&refs[N], "no-such-name");
  refs[N + 1] = refs[0]; /* twice: the second finds it freed */
  int64_t frees = svc_counter(c, "requests_Free");
  size_t freed = 0;
  cr_assert_eq(tport_free_many(c, refs, N + 2, &freed, &err), 0, "%s", err.msg);
  cr_assert_eq(freed, N);
  cr_assert_eq(svc_counter(c, "requests_Free"), frees + 1, "one request");
  cr_assert_eq(svc_counter(c, "tensors"), 0);
  /* a lone ref keeps its answer */
  cr_assert_eq(tport_free(c, &refs[0], &err), TPORT_NOT_FOUND, "%s", err.msg);
  cr_assert_eq(tport_free_many(c, NULL, 0, &freed, &err), 0, "%s", err.msg);
  cr_assert_eq(freed, 0);
  tport_close(c);
}

Test(replace, a_free_of_too_many_refs_is_refused)
{
  enum { N = 1025 };
  rawc r;
  raw_open(&r, url);
  Tport__Ref *w = calloc(N, sizeof *w);
  Tport__Ref **pw = calloc(N, sizeof *pw);
  for (int i = 0; i < N; i++) {
    w[i] = mkref(NULL, 0, "x");
    pw[i] = &w[i];
  }
  Tport__FreeRequest q = TPORT__FREE_REQUEST__INIT;
  q.n_refs = N;
  q.refs = pw;
  char msg[256];
  cr_assert_eq(raw_call(&r, TPORT__METHOD__METHOD_FREE, &q.base, NULL, 0,
                        &tport__free_reply__descriptor, msg, NULL, NULL),
               TPORT_INVALID_ARGUMENT, "%s", msg);
  q.n_refs = N - 1;
  cr_assert_eq(raw_call(&r, TPORT__METHOD__METHOD_FREE, &q.base, NULL, 0,
                        &tport__free_reply__descriptor, msg, NULL, NULL),
               0, "%s", msg);
  /* and tport_free_many splits what is over the bound */
  tport_client *c = svc_connect(url, SVC_OPERATOR);
  tport_ref *refs = calloc(N * 2, sizeof *refs);
  for (int i = 0; i < N * 2; i++)
    tport_ref_name(&refs[i], "nothing");
  int64_t frees = svc_counter(c, "requests_Free");
  size_t freed = 1;
  tport_err err;
  cr_assert_eq(tport_free_many(c, refs, N * 2, &freed, &err), 0, "%s", err.msg);
  cr_assert_eq(freed, 0);
  cr_assert_eq(svc_counter(c, "requests_Free"), frees + 3, "2050 refs: three requests");
  tport_close(c);
  free(refs);
  free(w);
  free(pw);
  raw_close(&r);
}

/* A replace whose new name cannot be added (the name table's allocation
 * failing: uthash rolls the add back) leaves the old tensor under its
 * name; the old holder was unlinked first and lost (found by review).  At
 * once (one request) and at the commit of a chunked put alike. */
Test(replace, a_failed_swap_keeps_the_old_tensor)
{
  tport_client *c = svc_connect(url, "r-oom");
  tport_err err;
  tport_ref ref;
  tport_ref_name(&ref, "kept");
  const int64_t sizes[2] = {4, 1 << 18}; /* one request; several chunks */
  for (int k = 0; k < 2; k++) {
    int64_t n = sizes[k];
    float *v = malloc((size_t)n * sizeof *v);
    cr_assert_eq(put_value(c, "kept", 1.0f, n, true, NULL, &err), 0, "%s", err.msg);
    reg_test_fail_name_adds(1);
    int rc = put_value(c, "kept", 2.0f, n, true, NULL, &err);
    reg_test_fail_name_adds(0);
    cr_assert_eq(rc, TPORT_RESOURCE_EXHAUSTED, "%lld floats: %d %s", (long long)n, rc, err.msg);
    cr_assert_eq(tport_get(c, &ref, v, (size_t)n * sizeof *v, NULL, NULL, NULL, &err), 0,
                 "%lld floats: the old tensor went with the failed swap: %s", (long long)n,
                 err.msg);
    cr_assert(v[0] == 1.0f && v[n - 1] == 1.0f, "%lld floats: %g", (long long)n, v[0]);
    cr_assert_eq(svc_counter(c, "tensors"), 1, "%lld floats", (long long)n);
    /* and the next replace swaps */
    cr_assert_eq(put_value(c, "kept", 3.0f, n, true, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(tport_get(c, &ref, v, (size_t)n * sizeof *v, NULL, NULL, NULL, &err), 0, "%s",
                 err.msg);
    cr_assert(v[0] == 3.0f, "%g", v[0]);
    cr_assert_eq(tport_free(c, &ref, &err), 0, "%s", err.msg);
    free(v);
  }
  tport_close(c);
}
