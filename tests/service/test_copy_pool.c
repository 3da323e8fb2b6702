/*
 * test_copy_pool.c: libtport's threaded copy (client/copy_pool.c) and the
 * automatic region that uses it.  ctest runs this program three times: as
 * it is, with TPORT_COPY_THREADS=1 (the pool off) and with
 * TPORT_COPY_THREADS=1000 (clamped to COPY_POOL_MAX_THREADS); every case
 * must hold in all three.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "copy_pool.h"
#include "service_util.h"

/* ---------------------------------------------------------------- helpers */

/* 8 bytes of a sequence with no period a misplaced piece could hide in. */
static uint64_t pattern(uint64_t i, unsigned seed)
{
  uint64_t z = i * 0x9e3779b97f4a7c15ull + seed;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w = pattern(i / 8, seed);
    memcpy(p + i, &w, 8);
  }
  uint64_t w = pattern(i / 8, seed);
  memcpy(p + i, &w, n - i);
}

/* The first byte where a and b differ, or n. */
static size_t first_diff(const uint8_t *a, const uint8_t *b, size_t n)
{
  if (memcmp(a, b, n) == 0)
    return n;
  size_t i = 0;
  while (a[i] == b[i])
    i++;
  return i;
}

/* The first byte of p[0..n) that is not c, or n. */
static size_t first_not(const uint8_t *p, size_t n, uint8_t c)
{
  for (size_t i = 0; i < n; i++)
    if (p[i] != c)
      return i;
  return n;
}

static const size_t T = COPY_POOL_MIN_BYTES;

/* Sizes around the threshold, odd ones, and several pieces' worth. */
static const size_t sizes[] = {
    (size_t)256 << 10, /* the automatic region's smallest */
    COPY_POOL_MIN_BYTES - 1,
    COPY_POOL_MIN_BYTES,
    COPY_POOL_MIN_BYTES + 1,
    COPY_POOL_MIN_BYTES + 4095,
    2 * COPY_POOL_MIN_BYTES + 4097,
    (size_t)17 << 20 | 3, /* past a put's copy-ahead batch (16 MiB) */
    (size_t)37 << 20 | 13,
};
#define NSIZES (sizeof sizes / sizeof *sizes)

/* ---------------------------------------------------------------- the split */

Test(copy_pool, the_split_tiles_every_copy_exactly_once)
{
  static const size_t ns[] = {0, 1, 4095, 4096, 4097, 8191, 65537, (size_t)1 << 20,
                              ((size_t)4 << 20) + 1, ((size_t)37 << 20) + 13, (size_t)1 << 32};
  static const uintptr_t dsts[] = {0, 1, 63, 64, 4095, 4096, 4097, 0x7f0000001234};
  for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
    for (size_t b = 0; b < sizeof dsts / sizeof *dsts; b++)
      for (size_t want = 0; want <= 70; want++) {
        copy_split s;
        copy_split_make(&s, dsts[b], ns[a], want);
        cr_assert_geq(s.npieces, 1);
        cr_assert_leq(s.npieces, want ? want : 1, "n %zu dst %#lx: %zu pieces for %zu", ns[a],
                      (unsigned long)dsts[b], s.npieces, want);
        size_t at = 0;
        for (size_t k = 0; k < s.npieces; k++) {
          size_t off, len;
          copy_split_piece(&s, k, &off, &len);
          /* each piece starts where the one before ended: none lost, none twice */
          cr_assert_eq(off, at, "n %zu dst %#lx want %zu piece %zu at %zu, expected %zu", ns[a],
                       (unsigned long)dsts[b], want, k, off, at);
          cr_assert(len > 0 || ns[a] == 0, "piece %zu is empty", k);
          if (k > 0) /* threads never share a page of the destination */
            cr_assert_eq((dsts[b] + off) % 4096, 0, "piece %zu starts mid-page", k);
          at += len;
        }
        cr_assert_eq(at, ns[a], "the pieces hold %zu bytes of %zu", at, ns[a]);
      }
}

/* ---------------------------------------------------------------- the copy */

Test(copy_pool, threads_come_from_the_cpu_count_or_TPORT_COPY_THREADS)
{
  const char *env = getenv("TPORT_COPY_THREADS");
  int want;
  if (env && atoi(env) >= 1) {
    want = atoi(env) > COPY_POOL_MAX_THREADS ? COPY_POOL_MAX_THREADS : atoi(env);
  } else {
    cpu_set_t set;
    cr_assert_eq(sched_getaffinity(0, sizeof set, &set), 0);
    want = CPU_COUNT(&set) < COPY_POOL_DEFAULT_MAX ? CPU_COUNT(&set) : COPY_POOL_DEFAULT_MAX;
  }
  cr_assert_eq(copy_pool_threads(), want, "TPORT_COPY_THREADS=%s: %d threads, expected %d",
               env ? env : "(unset)", copy_pool_threads(), want);
}

/* Every size, at odd addresses on both sides: every byte where it belongs
 * and not one written outside the destination -- with ordinary stores and
 * as a large get's copy out (non-temporal stores). */
Test(copy_pool, every_byte_lands_once_at_odd_lengths_and_alignments)
{
  static const size_t shifts[][2] = {{0, 0}, {1, 0}, {0, 3}, {7, 4093}, {4095, 1}};
  size_t most = sizes[NSIZES - 1] + 8192;
  uint8_t *src = malloc(most), *dst = malloc(most + 64);
  cr_assert(src && dst);
  for (size_t i = 0; i < NSIZES; i++)
    for (size_t k = 0; k < 2 * sizeof shifts / sizeof *shifts; k++) {
      size_t n = sizes[i], so = shifts[k / 2][0], dof = shifts[k / 2][1];
      unsigned seed = (unsigned)(i * 10 + k);
      fill(src + so, n, seed);
      memset(dst, 0xa5, most + 64);
      if (k % 2)
        copy_pool_copy_out(dst + 32 + dof, src + so, n, COPY_POOL_OUT_STREAM_MIN);
      else
        copy_pool_copy(dst + 32 + dof, src + so, n);
      size_t bad = first_diff(dst + 32 + dof, src + so, n);
      cr_assert_eq(bad, n, "%zu bytes (src +%zu, dst +%zu, out %d): byte %zu is wrong", n, so,
                   dof, (int)(k % 2), bad);
      cr_assert_eq(first_not(dst, 32 + dof, 0xa5), 32 + dof,
                   "a byte before the destination was written");
      size_t after = most + 64 - (32 + dof + n);
      cr_assert_eq(first_not(dst + 32 + dof + n, after, 0xa5), after,
                   "a byte past the destination was written");
    }
  free(src);
  free(dst);
}

typedef struct copier {
  size_t n;
  unsigned seed;
  int rounds;
  size_t bad; /* n: all right */
} copier;

static void *copy_rounds(void *arg)
{
  copier *c = arg;
  uint8_t *src = malloc(c->n), *dst = malloc(c->n);
  c->bad = c->n;
  for (int r = 0; r < c->rounds && c->bad == c->n; r++) {
    fill(src, c->n, c->seed + (unsigned)r);
    memset(dst, 0, c->n);
    copy_pool_copy(dst, src, c->n);
    c->bad = first_diff(dst, src, c->n);
  }
  free(src);
  free(dst);
  return NULL;
}

/* Copies from many threads at once: one has the pool, the others copy
 * inline; none waits on another's job and every byte is right. */
Test(copy_pool, many_threads_copy_at_once)
{
  enum { N = 8 };
  pthread_t t[N];
  copier c[N];
  for (int i = 0; i < N; i++) {
    c[i] = (copier){.n = T + (size_t)i * 4097 + (size_t)i, .seed = 100u * (unsigned)i, .rounds = 6};
    cr_assert_eq(pthread_create(&t[i], NULL, copy_rounds, &c[i]), 0);
  }
  for (int i = 0; i < N; i++) {
    pthread_join(t[i], NULL);
    cr_assert_eq(c[i].bad, c[i].n, "thread %d: byte %zu of %zu is wrong", i, c[i].bad, c[i].n);
  }
}

/* A child of fork has none of the pool's threads: its large copies are
 * still whole, also when another thread of the parent was copying when it
 * forked.  (A child that hangs is killed by its alarm.) */
Test(copy_pool, a_forked_child_copies_whole)
{
  copier bg = {.n = 3 * T + 5, .seed = 7, .rounds = 40};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, copy_rounds, &bg), 0);
  for (int f = 0; f < 6; f++) {
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
      alarm(30);
      copier c = {.n = 2 * T + 4099, .seed = 9 + (unsigned)f, .rounds = 3};
      copy_rounds(&c);
      _exit(c.bad == c.n ? 0 : 1);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d: status %#x", f, st);
  }
  pthread_join(t, NULL);
  cr_assert_eq(bg.bad, bg.n, "byte %zu of %zu is wrong", bg.bad, bg.n);
}

/* ---------------------------------------------------------------- streams */

/* A stream at every size and alignment: each wait returns with the bytes
 * before it in place (checked right then, before the stream ends), waits
 * may come in any steps, and nothing outside the destination is written. */
Test(copy_pool, a_stream_has_each_prefix_in_place_when_its_wait_returns)
{
  static const size_t shifts[][2] = {{0, 0}, {1, 0}, {7, 4093}};
  size_t most = sizes[NSIZES - 1] + 8192;
  uint8_t *src = malloc(most), *dst = malloc(most + 64);
  cr_assert(src && dst);
  for (size_t i = 0; i < NSIZES; i++)
    for (size_t k = 0; k < sizeof shifts / sizeof *shifts; k++) {
      size_t n = sizes[i], so = shifts[k][0], dof = shifts[k][1];
      fill(src + so, n, (unsigned)(i * 7 + k));
      memset(dst, 0xa5, most + 64);
      uint8_t *d = dst + 32 + dof;
      copy_stream st;
      bool on = copy_pool_stream_begin(&st, d, src + so, n);
      if (!on) {
        /* what the caller does then: it copies for itself */
        cr_assert(n < COPY_POOL_MIN_BYTES || copy_pool_threads() <= 1,
                  "%zu bytes with %d threads and a free pool: no stream", n, copy_pool_threads());
        memcpy(d, src + so, n);
      }
      /* odd steps, as chunks of a window would ask */
      size_t step = (size_t)1 << 20 | (k * 4099 + 1);
      for (size_t upto = step < n ? step : n;; upto = n - upto < step ? n : upto + step) {
        copy_pool_stream_wait(&st, upto);
        size_t bad = first_diff(d, src + so, upto);
        cr_assert_eq(bad, upto, "%zu bytes: waited for %zu, byte %zu is wrong", n, upto, bad);
        if (upto == n)
          break;
      }
      copy_pool_stream_end(&st, false);
      cr_assert_eq(first_not(dst, 32 + dof, 0xa5), 32 + dof, "a byte before was written");
      size_t after = most + 64 - (32 + dof + n);
      cr_assert_eq(first_not(d + n, after, 0xa5), after, "a byte past the destination was written");
    }
  free(src);
  free(dst);
}

/* A stream ended early (a put that failed) stops: no byte is written
 * after end returns, the copied ones are right, and the pool is free for
 * the next copy or stream. */
Test(copy_pool, a_stream_ended_early_writes_nothing_after_its_end)
{
  size_t n = (size_t)64 << 20;
  /* dst on a page: pieces are whole pages of it, so each page is either
   * copied or untouched */
  uint8_t *src = malloc(n), *dst = aligned_alloc(4096, n), *snap = malloc(n);
  cr_assert(src && dst && snap);
  for (int round = 0; round < 8; round++) {
    fill(src, n, 40u + (unsigned)round);
    memset(dst, 0, n);
    copy_stream st;
    if (!copy_pool_stream_begin(&st, dst, src, n)) {
      cr_assert(copy_pool_threads() <= 1, "no stream with %d threads", copy_pool_threads());
      break;
    }
    if (round % 2)
      copy_pool_stream_wait(&st, (size_t)(round + 1) << 20);
    copy_pool_stream_end(&st, false);
    memcpy(snap, dst, n);
    usleep(20000); /* a worker still copying would change dst now */
    cr_assert_eq(memcmp(snap, dst, n), 0, "round %d: the destination changed after end", round);
    /* whatever was copied is right, the rest untouched */
    for (size_t off = 0; off < n; off += 4096) {
      bool zero = first_not(dst + off, 4096, 0) == 4096;
      cr_assert(zero || first_diff(dst + off, src + off, 4096) == 4096,
                "round %d: page %zu is neither copied nor untouched", round, off / 4096);
    }
    /* finished: every byte */
    cr_assert(copy_pool_stream_begin(&st, dst, src, n), "the pool is not free after end");
    copy_pool_stream_end(&st, true);
    cr_assert_eq(first_diff(dst, src, n), n, "round %d: an ended-with-finish stream", round);
  }
  free(src);
  free(dst);
  free(snap);
}

/* While a stream holds the pool, other threads' copies and streams do not
 * wait for it: they copy inline (a stream says no) and are whole. */
Test(copy_pool, other_copies_go_inline_while_a_stream_runs)
{
  size_t n = (size_t)32 << 20;
  uint8_t *src = malloc(n), *dst = malloc(n);
  cr_assert(src && dst);
  fill(src, n, 77);
  copy_stream st;
  bool on = copy_pool_stream_begin(&st, dst, src, n);
  copier c = {.n = 2 * T + 11, .seed = 5, .rounds = 3};
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, copy_rounds, &c), 0);
  pthread_join(t, NULL);
  cr_assert_eq(c.bad, c.n, "byte %zu of %zu is wrong", c.bad, c.n);
  if (on) {
    copy_stream other;
    uint8_t *d2 = malloc(n);
    cr_assert(d2);
    cr_assert_not(copy_pool_stream_begin(&other, d2, src, n), "two streams hold the pool");
    copy_pool_stream_end(&other, true); /* a no-op on a stream that did not begin */
    free(d2);
  } else {
    memcpy(dst, src, n);
  }
  copy_pool_stream_wait(&st, n);
  copy_pool_stream_end(&st, false);
  cr_assert_eq(first_diff(dst, src, n), n);
  free(src);
  free(dst);
}

/* A gated stream (a get's chunks arriving in the region one after
 * another) reads no source byte before it is supplied: the source holds
 * other bytes until then, so a piece copied early would be wrong.  Ended
 * early, it writes nothing after its end. */
Test(copy_pool, a_gated_stream_reads_only_what_was_supplied)
{
  size_t n = ((size_t)37 << 20) | 13, step = ((size_t)3 << 20) + 4099;
  uint8_t *want = malloc(n), *src = malloc(n), *dst = malloc(n), *snap = malloc(n);
  cr_assert(want && src && dst && snap);
  for (int round = 0; round < 4; round++) {
    fill(want, n, 60u + (unsigned)round);
    memset(src, 0x5a, n);
    memset(dst, 0, n);
    copy_stream st;
    bool on = copy_pool_stream_begin_gated(&st, dst, src, n, n);
    cr_assert(on || copy_pool_threads() <= 1, "no stream with %d threads", copy_pool_threads());
    size_t upto = 0;
    bool early = round == 3;
    while (upto < n) {
      size_t next = n - upto < step ? n : upto + step;
      memcpy(src + upto, want + upto, next - upto); /* the chunk arrives */
      if (!on)
        memcpy(dst + upto, src + upto, next - upto);
      copy_pool_stream_supply(&st, next);
      upto = next;
      if (early && upto > n / 2)
        break;
      usleep(1000); /* the workers catch up and wait */
    }
    copy_pool_stream_end(&st, !early);
    if (!early) {
      size_t bad = first_diff(dst, want, n);
      cr_assert_eq(bad, n, "round %d: byte %zu was copied before it was supplied", round, bad);
      continue;
    }
    memcpy(snap, dst, n);
    usleep(20000);
    cr_assert_eq(memcmp(snap, dst, n), 0, "the destination changed after end");
    for (size_t i = 0; i < n; i++)
      cr_assert(dst[i] == 0 || dst[i] == want[i] || (i >= upto && !on),
                "byte %zu: neither copied from what was supplied nor untouched", i);
    cr_assert_eq(first_not(dst + upto, n - upto, 0), n - upto,
                 "a byte never supplied was copied");
  }
  free(want);
  free(src);
  free(dst);
  free(snap);
}

/* ---------------------------------------------------------------- through the automatic region */

static char sock_dir[64];

/* An in-process server with shared memory and 1 MiB chunks: a put or a
 * get of more than two goes chunk by chunk through the region, copied in
 * and out by a stream of the pool; a smaller one at once. */
static server *start(char *url, size_t len)
{
  server_config cfg;
  svc_config_shm(&cfg, "copy", sock_dir, sizeof sock_dir);
  cfg.chunk_bytes = (size_t)1 << 20;
  return svc_start_with(&cfg, url, len);
}

static void stop(server *s)
{
  server_stop(s, 0);
  rmdir(sock_dir);
}

static int64_t shm_transfers(const char *url)
{
  tport_client *ops;
  tport_err err;
  tport_connect_options o = {.tenant = SVC_OPERATOR, .timeout_ms = 20000, .no_shm = true};
  cr_assert_eq(tport_connect(url, &o, &ops, &err), 0, "%s", err.msg);
  int64_t v = svc_counter(ops, "shm_transfers");
  tport_close(ops);
  return v;
}

static tport_client *connect_shm(const char *url)
{
  tport_client *c;
  tport_err err;
  tport_connect_options o = {.tenant = "t", .timeout_ms = 20000};
  cr_assert_eq(tport_connect(url, &o, &c, &err), 0, "connect %s: %s", url, err.msg);
  cr_assert(tport_shm_available(c));
  return c;
}

/* One put (chunk by chunk, or at once when converting) and a get and a
 * get_alloc of n bytes at user buffers shifted by shift. */
static void round_trip(tport_client *c, size_t n, size_t shift, bool converting, unsigned seed)
{
  uint8_t *in = malloc(n + shift), *out = malloc(n + shift + 64);
  cr_assert(in && out);
  fill(in + shift, n, seed);
  int64_t sz = (int64_t)n;
  tport_put_options po;
  tport_put_options_init(&po);
  if (converting) { /* the server "converts" (to the same dtype): the put goes at once */
    po.has_dtype = true;
    po.dtype = TPORT_UINT8;
  }
  tport_tensor_info info;
  tport_err err;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &sz, NULL, in + shift, n, &po, &info, &err), 0,
               "put of %zu: %s", n, err.msg);
  memset(out, 0x5a, n + shift + 64);
  cr_assert_eq(tport_get(c, &info.ref, out + shift, n, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  size_t bad = first_diff(out + shift, in + shift, n);
  cr_assert_eq(bad, n, "%zu bytes at +%zu%s: byte %zu came back wrong", n, shift,
               converting ? " (converting)" : "", bad);
  cr_assert_eq(first_not(out + shift + n, 64, 0x5a), 64, "the get wrote past the buffer");
  void *alloc = NULL;
  size_t got = 0;
  cr_assert_eq(tport_get_alloc(c, &info.ref, &alloc, &got, NULL, &err), 0, "%s", err.msg);
  cr_assert_eq(got, n);
  cr_assert_eq(first_diff(alloc, in + shift, n), n, "get_alloc of %zu: bytes wrong", n);
  free(alloc);
  cr_assert_eq(tport_free(c, &info.ref, &err), 0, "%s", err.msg);
  free(in);
  free(out);
}

Test(copy_pool, bytes_whole_through_the_automatic_region_around_the_threshold)
{
  char url[96];
  server *s = start(url, sizeof url);
  tport_client *c = connect_shm(url);
  static const size_t shifts[] = {0, 1, 4093};
  int64_t before = shm_transfers(url), trips = 0;
  for (size_t i = 0; i < NSIZES; i++)
    for (size_t k = 0; k < sizeof shifts / sizeof *shifts; k++)
      for (int conv = 0; conv < (k == 0 ? 2 : 1); conv++, trips++)
        round_trip(c, sizes[i], shifts[k], conv, (unsigned)(i * 8 + k * 2 + (size_t)conv));
  /* every put, get and get_alloc took the region */
  cr_assert_eq(shm_transfers(url), before + 3 * trips);
  tport_close(c);
  stop(s);
}

/* A get of COPY_POOL_OUT_STREAM_MIN bytes and more over the socket: each
 * chunk's bytes written into the caller's buffer with non-temporal stores,
 * at an odd address, whole. */
Test(copy_pool, a_large_get_over_the_socket_comes_back_whole)
{
  char url[96];
  server *s = start(url, sizeof url);
  tport_client *c;
  tport_err err;
  tport_connect_options o = {.tenant = "t", .timeout_ms = 20000, .no_shm = true};
  cr_assert_eq(tport_connect(url, &o, &c, &err), 0, "connect %s: %s", url, err.msg);
  size_t n = COPY_POOL_OUT_STREAM_MIN + 4099;
  uint8_t *in = malloc(n), *out = malloc(n + 8);
  fill(in, n, 77);
  memset(out, 0xa5, n + 8);
  int64_t sz = (int64_t)n;
  tport_tensor_info info;
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &sz, NULL, in, n, NULL, &info, &err), 0, "%s",
               err.msg);
  cr_assert_eq(tport_get(c, &info.ref, out + 3, n, NULL, NULL, NULL, &err), 0, "%s", err.msg);
  size_t bad = first_diff(out + 3, in, n);
  cr_assert_eq(bad, n, "byte %zu of %zu came back wrong", bad, n);
  cr_assert_eq(first_not(out, 3, 0xa5), 3, "a byte before the buffer was written");
  cr_assert_eq(first_not(out + 3 + n, 5, 0xa5), 5, "a byte past the buffer was written");
  cr_assert_eq(tport_free(c, &info.ref, &err), 0, "%s", err.msg);
  free(in);
  free(out);
  tport_close(c);
  stop(s);
}

typedef struct user {
  const char *url;
  tport_client *c; /* shared by several users, or its own */
  size_t n;
  unsigned seed;
  char why[300];
} user;

static void *user_main(void *arg)
{
  user *u = arg;
  uint8_t *in = malloc(u->n), *out = malloc(u->n);
  int64_t sz = (int64_t)u->n;
  for (int r = 0; r < 4 && !u->why[0]; r++) {
    unsigned seed = u->seed + (unsigned)r;
    fill(in, u->n, seed);
    tport_tensor_info info;
    tport_err err;
    if (tport_put(u->c, TPORT_UINT8, 1, &sz, NULL, in, u->n, NULL, &info, &err)) {
      snprintf(u->why, sizeof u->why, "put: %s", err.msg);
      break;
    }
    memset(out, 0, u->n);
    if (tport_get(u->c, &info.ref, out, u->n, NULL, NULL, NULL, &err))
      snprintf(u->why, sizeof u->why, "get: %s", err.msg);
    else if (first_diff(out, in, u->n) != u->n)
      snprintf(u->why, sizeof u->why, "byte %zu of %zu came back wrong", first_diff(out, in, u->n),
               u->n);
    tport_free(u->c, &info.ref, NULL);
  }
  free(in);
  free(out);
  return NULL;
}

/* Eight threads at once: four share one client (its region is one call's
 * at a time; the others take the socket), four have a client each (four
 * regions, four large copies at once: one has the pool, the others copy
 * inline). */
Test(copy_pool, many_client_threads_at_once)
{
  char url[96];
  server *s = start(url, sizeof url);
  enum { N = 8 };
  tport_client *shared = connect_shm(url);
  user u[N];
  pthread_t t[N];
  for (int i = 0; i < N; i++) {
    u[i] = (user){.url = url, .c = i < 4 ? shared : connect_shm(url),
                  .n = T + (size_t)i * 65537 + (size_t)(i % 3), .seed = 1000u * (unsigned)i};
    cr_assert_eq(pthread_create(&t[i], NULL, user_main, &u[i]), 0);
  }
  for (int i = 0; i < N; i++)
    pthread_join(t[i], NULL);
  for (int i = 0; i < N; i++) {
    cr_expect_eq(u[i].why[0], '\0', "thread %d (%zu bytes): %s", i, u[i].n, u[i].why);
    if (i >= 4)
      tport_close(u[i].c);
  }
  tport_close(shared);
  stop(s);
}
