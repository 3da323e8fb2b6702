/* test_reply_fails.c: a request that stored a tensor but whose reply
 * cannot be made (tportd out of memory for it, made to happen by
 * server_test_reply_fails) leaves nothing stored.  The client is told the
 * request failed, so no tensor may stay under it: none left to the
 * connection's end, and no name taken that the client believes free.  A
 * single put (in one request and chunked, at its PutBegin and at its
 * commit), the results of To, Contiguous and View, a PutBatch whose reply
 * fails after its elements were stored (runs, a named element, elements
 * read from the caller's memory), and one element whose own place in the
 * batch's reply fails, alone. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "server_internal.h"
#include "service_util.h"

TestSuite(reply_fails, .timeout = 120);

/* Which replies fail: those of method `method` (element: a batch
 * element's), the `from`-th (counted from 1) and, with every, all after. */
static _Atomic uint16_t fail_method;
static atomic_bool fail_element, fail_every;
static atomic_int seen, fail_from;

static bool failing(uint16_t method, bool element)
{
  if (method != atomic_load(&fail_method) || element != atomic_load(&fail_element))
    return false;
  int k = atomic_fetch_add(&seen, 1) + 1;
  return atomic_load(&fail_every) ? k >= atomic_load(&fail_from) : k == atomic_load(&fail_from);
}

static void fail_replies(uint16_t method, bool element, int from, bool every)
{
  atomic_store(&fail_method, method);
  atomic_store(&fail_element, element);
  atomic_store(&seen, 0);
  atomic_store(&fail_from, from);
  atomic_store(&fail_every, every);
  server_test_reply_fails = failing;
}

static void replies_made(void)
{
  server_test_reply_fails = NULL;
}

static tport_client *connect_to(const char *url)
{
  tport_connect_options o = {.timeout_ms = 30000};
  tport_client *c;
  tport_err err;
  cr_assert_eq(tport_connect(url, &o, &c, &err), TPORT_OK, "%s", err.msg);
  return c;
}

/* No tensor named name. */
static void name_free(tport_client *c, const char *name)
{
  tport_ref ref;
  tport_ref_name(&ref, name);
  tport_tensor_info info;
  tport_err err;
  cr_assert_eq(tport_info(c, &ref, &info, &err), TPORT_NOT_FOUND,
               "%s: a failed put left it taken: %s", name, err.msg);
}

static float *floats(int64_t n, float v)
{
  float *p = malloc((size_t)n * sizeof *p);
  for (int64_t i = 0; i < n; i++)
    p[i] = v + (float)i;
  return p;
}

static int put_floats(tport_client *c, const char *name, const float *v, int64_t n,
                      tport_tensor_info *info, tport_err *err)
{
  tport_put_options o;
  tport_put_options_init(&o);
  o.name = name;
  return tport_put(c, TPORT_FLOAT32, 1, &n, NULL, v, (size_t)n * sizeof *v, name ? &o : NULL, info,
                   err);
}

Test(reply_fails, a_single_put_leaves_nothing)
{
  char url[128];
  server *s = svc_start_inproc(url, sizeof url, NULL);
  tport_client *c = connect_to(url);
  /* 4 floats: one request; 2^18: an upload of 16 chunks (64 KiB each) */
  const int64_t sizes[] = {4, 1 << 18};
  for (int k = 0; k < 2; k++) {
    int64_t n = sizes[k];
    float *v = floats(n, 1.0f);
    tport_err err;
    for (int named = 0; named < 2; named++) {
      fail_replies(TPORT__METHOD__METHOD_PUT_BEGIN, false, 1, true);
      int rc = put_floats(c, named ? "rf/single" : NULL, v, n, NULL, &err);
      replies_made();
      cr_assert_eq(rc, TPORT_RESOURCE_EXHAUSTED, "%lld floats: %d %s", (long long)n, rc, err.msg);
      cr_assert_eq(svc_counter(c, "tensors"), 0, "%lld floats, named %d: a tensor stayed",
                   (long long)n, named);
      cr_assert_eq(svc_counter(c, "uploads_in_progress"), 0, "%lld floats", (long long)n);
    }
    name_free(c, "rf/single");
    /* and the same put, answered, is stored under that name */
    tport_tensor_info info;
    cr_assert_eq(put_floats(c, "rf/single", v, n, &info, &err), TPORT_OK, "%s", err.msg);
    float *back = malloc((size_t)n * sizeof *back);
    cr_assert_eq(tport_get(c, &info.ref, back, (size_t)n * sizeof *back, NULL, NULL, NULL, &err),
                 TPORT_OK, "%s", err.msg);
    cr_assert_eq(memcmp(back, v, (size_t)n * sizeof *v), 0);
    cr_assert_eq(tport_free(c, &info.ref, &err), TPORT_OK, "%s", err.msg);
    free(back);
    free(v);
  }
  tport_close(c);
  server_stop(s, 1000);
}

/* The results of To, Contiguous and View, and a chunked put's commit: a
 * reply that cannot be made takes them back (the input stays). */
Test(reply_fails, a_result_or_a_commit_leaves_nothing)
{
  char url[128];
  server *s = svc_start_inproc(url, sizeof url, NULL);
  tport_client *c = connect_to(url);
  tport_err err;
  /* the input: 64 x 3 floats, read as 3 x 64 with strides (1, 3) */
  float *v = floats(192, 0.0f);
  tport_tensor_info in;
  cr_assert_eq(put_floats(c, "rf/in", v, 192, &in, &err), TPORT_OK, "%s", err.msg);
  tport_tensor_info out;
  bool alias;
  int64_t sizes[2] = {3, 64}, strides[2] = {1, 3};
  for (int k = 0; k < 3; k++) {
    const char *what[] = {"To", "Contiguous", "View"};
    uint16_t method[] = {TPORT__METHOD__METHOD_TO, TPORT__METHOD__METHOD_CONTIGUOUS,
                         TPORT__METHOD__METHOD_VIEW};
    tport_ref view;
    if (k == 1) { /* a strided view of the input to make contiguous */
      cr_assert_eq(tport_view(c, &in.ref, 2, sizes, strides, 0, "rf/t", &out, &err), TPORT_OK, "%s",
                   err.msg);
      view = out.ref;
    }
    for (int named = 0; named < 2; named++) {
      const char *name = named ? "rf/result" : NULL;
      int64_t before = svc_counter(c, "tensors");
      fail_replies(method[k], false, 1, true);
      int rc;
      if (k == 0) {
        tport_to_options o = {.has_dtype = true, .dtype = TPORT_FLOAT64, .name = name};
        rc = tport_to(c, &in.ref, &o, &out, &alias, &err);
      } else if (k == 1) {
        rc = tport_contiguous(c, &view, TPORT_MF_CONTIGUOUS, name, &out, &alias, &err);
      } else {
        rc = tport_view(c, &in.ref, 2, sizes, strides, 0, name, &out, &err);
      }
      replies_made();
      cr_assert_eq(rc, TPORT_RESOURCE_EXHAUSTED, "%s: %d %s", what[k], rc, err.msg);
      cr_assert_eq(svc_counter(c, "tensors"), before, "%s, named %d: its result stayed", what[k],
                   named);
      name_free(c, "rf/result");
    }
    if (k == 1)
      cr_assert_eq(tport_free(c, &view, &err), TPORT_OK, "%s", err.msg);
  }
  /* the input is still there, whole */
  float back[192];
  cr_assert_eq(tport_get(c, &in.ref, back, sizeof back, NULL, NULL, NULL, &err), TPORT_OK, "%s",
               err.msg);
  cr_assert_eq(memcmp(back, v, sizeof back), 0);
  /* a chunked put's commit */
  int64_t n = 1 << 18;
  float *big = floats(n, 3.0f);
  fail_replies(TPORT__METHOD__METHOD_PUT_COMMIT, false, 1, true);
  int rc = put_floats(c, "rf/committed", big, n, NULL, &err);
  replies_made();
  cr_assert_eq(rc, TPORT_RESOURCE_EXHAUSTED, "%d %s", rc, err.msg);
  cr_assert_eq(svc_counter(c, "tensors"), 1, "the committed put stayed");
  cr_assert_eq(svc_counter(c, "uploads_in_progress"), 0);
  name_free(c, "rf/committed");
  free(big);
  free(v);
  tport_close(c);
  server_stop(s, 1000);
}

enum { N = 300 };

/* A batch of N: runs of three shapes, lone elements between them, a named
 * one (element 100). */
typedef struct batch {
  tport_put_item items[N];
  int64_t sizes[N];
  float *data[N];
  tport_put_options named;
} batch;

static batch *batch_make(const char *name)
{
  batch *b = calloc(1, sizeof *b);
  tport_put_options_init(&b->named);
  b->named.name = name;
  for (int i = 0; i < N; i++) {
    b->sizes[i] = i < 120 ? 64 : i < 200 ? 3 + i % 2 : 1000;
    b->data[i] = floats(b->sizes[i], (float)i);
    b->items[i] = (tport_put_item){.dtype = TPORT_FLOAT32,
                                   .ndim = 1,
                                   .sizes = &b->sizes[i],
                                   .data = b->data[i],
                                   .nbytes = (size_t)b->sizes[i] * sizeof(float),
                                   .opts = i == 100 ? &b->named : NULL};
  }
  return b;
}

static void batch_free(batch *b)
{
  for (int i = 0; i < N; i++)
    free(b->data[i]);
  free(b);
}

Test(reply_fails, a_batch_whose_reply_fails_leaves_none_of_its_elements)
{
  char url[128];
  server *s = svc_start_inproc(url, sizeof url, NULL);
  batch *b = batch_make("rf/batch");
  for (int runs = 0; runs < 2; runs++) {
    cr_assert_eq(setenv("TPORT_PUT_RUNS", runs ? "1" : "0", 1), 0);
    tport_client *c = connect_to(url);
    tport_err err;
    fail_replies(TPORT__METHOD__METHOD_PUT_BATCH, false, 1, true);
    int rc = tport_put_batch(c, b->items, N, &err);
    int replies = atomic_load(&seen);
    replies_made();
    cr_assert_eq(rc, TPORT_RESOURCE_EXHAUSTED, "runs %d: %d %s", runs, rc, err.msg);
    cr_assert_gt(replies, 0, "runs %d: no PutBatch reply was made", runs);
    cr_assert_eq(svc_counter(c, "tensors"), 0, "runs %d: the failed batch's tensors stayed", runs);
    name_free(c, "rf/batch");
    cr_assert_eq(tport_put_batch(c, b->items, N, &err), TPORT_OK, "runs %d: %s", runs, err.msg);
    cr_assert_eq(svc_counter(c, "tensors"), N, "runs %d", runs);
    tport_ref ref;
    tport_ref_name(&ref, "rf/batch");
    cr_assert_eq(tport_free(c, &ref, &err), TPORT_OK, "%s", err.msg);
    tport_close(c);
  }
  cr_assert_eq(unsetenv("TPORT_PUT_RUNS"), 0);
  batch_free(b);
  server_stop(s, 1000);
}

Test(reply_fails, an_element_whose_reply_fails_alone_is_not_stored)
{
  char url[128];
  server *s = svc_start_inproc(url, sizeof url, NULL);
  batch *b = batch_make("rf/element");
  /* each element answered by a reply of its own: the 101st made (the
   * requests of a batch run on several workers: any element) cannot be */
  cr_assert_eq(setenv("TPORT_PUT_RUNS", "0", 1), 0);
  tport_client *c = connect_to(url);
  cr_assert_eq(unsetenv("TPORT_PUT_RUNS"), 0);
  tport_err err;
  fail_replies(TPORT__METHOD__METHOD_PUT_BEGIN, true, 101, false);
  int rc = tport_put_batch(c, b->items, N, &err);
  replies_made();
  cr_assert_eq(rc, TPORT_RESOURCE_EXHAUSTED, "%d %s", rc, err.msg);
  int failed = -1;
  for (int i = 0; i < N; i++) {
    int code = b->items[i].err.code;
    cr_assert(code == TPORT_OK || code == TPORT_RESOURCE_EXHAUSTED, "element %d: %d %s", i, code,
              b->items[i].err.msg);
    if (code != TPORT_OK) {
      cr_assert_eq(failed, -1, "elements %d and %d failed", failed, i);
      failed = i;
    }
  }
  cr_assert_neq(failed, -1, "no element failed");
  cr_assert_eq(svc_counter(c, "tensors"), N - 1, "element %d, told it failed, stayed stored",
               failed);
  if (failed == 100)
    name_free(c, "rf/element");
  tport_close(c);
  batch_free(b);
  server_stop(s, 1000);
}

/* Elements read from the caller's memory (a same-host client's large
 * weights) are stored at the batch's end: its reply failing takes them
 * back too. */
Test(reply_fails, a_batch_read_from_the_callers_memory_leaves_nothing)
{
  /* tportd holds a client process by a pidfd (process_util.c's need_pidfd) */
  int fd = (int)syscall(SYS_pidfd_open, getpid(), 0);
  if (fd < 0 && errno == ENOSYS)
    cr_skip_test("pidfd_open is not available here: no process regions to test");
  if (fd >= 0)
    close(fd);
  char url[128], dir[64];
  server_config cfg;
  svc_config_shm(&cfg, "rf", dir, sizeof dir);
  server *s = svc_start_with(&cfg, url, sizeof url);
  enum { K = 6 };
  static float data[K][1 << 17]; /* 512 KiB each: read directly */
  tport_put_item items[K];
  int64_t n = 1 << 17;
  tport_put_options named;
  tport_put_options_init(&named);
  named.name = "rf/direct";
  for (int i = 0; i < K; i++) {
    for (int64_t j = 0; j < n; j++)
      data[i][j] = (float)(i * n + j);
    items[i] = (tport_put_item){.dtype = TPORT_FLOAT32,
                                .ndim = 1,
                                .sizes = &n,
                                .data = data[i],
                                .nbytes = sizeof data[i],
                                .opts = i == 2 ? &named : NULL};
  }
  tport_client *c = connect_to(url);
  int64_t read_before = svc_server_counter(url, "shm_process_reads");
  tport_err err;
  fail_replies(TPORT__METHOD__METHOD_PUT_BATCH, false, 1, true);
  int rc = tport_put_batch(c, items, K, &err);
  replies_made();
  cr_assert_eq(rc, TPORT_RESOURCE_EXHAUSTED, "%d %s", rc, err.msg);
  cr_assert_gt(svc_server_counter(url, "shm_process_reads"), read_before,
               "the batch was not read from the caller's memory");
  cr_assert_eq(svc_counter(c, "tensors"), 0, "the failed batch's tensors stayed");
  name_free(c, "rf/direct");
  cr_assert_eq(tport_put_batch(c, items, K, &err), TPORT_OK, "%s", err.msg);
  cr_assert_eq(svc_counter(c, "tensors"), K);
  tport_close(c);
  server_stop(s, 1000);
  rmdir(dir);
}
