/*
 * test_nng_recv_tail.c: deploy/nng 0014 -- the end of a REQ context's reply
 * read by the transport straight into the caller's buffer
 * (nng_ctx_recv_tail), on the nng that tensorport links.
 *
 *  - over tcp and ipc a reply of NNG_RECV_TAIL_MIN bytes or more lands
 *    with its last len bytes in the buffer (or in up to four segments, in
 *    order: nng_ctx_recv_tail_add) and the rest in the message
 *    (nng_msg_recv_tail says how many went there); once per arming;
 *  - a reply that is too small, shorter than the tail, for another context,
 *    or over inproc keeps its bytes in the message and leaves the buffer
 *    alone;
 *  - nng_ctx_recv_tail_clear waits for a transport writing the buffer: a
 *    peer that stops in the middle of a reply keeps it busy (NNG_ETIMEDOUT)
 *    until the rest comes or the pipe closes -- whatever became of the
 *    request (a timeout) or of the context (closed).
 * The stalling peer is a REP speaking SP over a plain Unix socket.
 */
#include <criterion/criterion.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

enum { TAIL = (1 << 20) + 13 };

static uint8_t pattern(size_t i)
{
  return (uint8_t)(i * 7 + 3);
}

static bool is_pattern(const uint8_t *p, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (p[i] != pattern(i))
      return false;
  return true;
}

static bool all(const uint8_t *p, size_t n, uint8_t v)
{
  for (size_t i = 0; i < n; i++)
    if (p[i] != v)
      return false;
  return true;
}

/* One request on ctx and its reply from rep: "HEAD" then n bytes of the
 * pattern.  Returns the reply (the caller frees it). */
static nng_msg *ask(nng_ctx ctx, nng_socket rep, size_t n)
{
  nng_aio *aio;
  cr_assert_eq(nng_aio_alloc(&aio, NULL, NULL), 0);
  nng_aio_set_timeout(aio, 5000);
  nng_msg *q;
  cr_assert_eq(nng_msg_alloc(&q, 0), 0);
  cr_assert_eq(nng_msg_append(q, "ask", 3), 0);
  nng_aio_set_msg(aio, q);
  nng_ctx_send(ctx, aio);
  nng_aio_wait(aio);
  cr_assert_eq(nng_aio_result(aio), 0);
  nng_msg *m;
  cr_assert_eq(nng_recvmsg(rep, &m, 0), 0);
  nng_msg_clear(m);
  cr_assert_eq(nng_msg_append(m, "HEAD", 4), 0);
  uint8_t *body = malloc(n ? n : 1);
  for (size_t i = 0; i < n; i++)
    body[i] = pattern(i);
  cr_assert_eq(nng_msg_append(m, body, n), 0);
  free(body);
  cr_assert_eq(nng_sendmsg(rep, m, 0), 0);
  nng_ctx_recv(ctx, aio);
  nng_aio_wait(aio);
  cr_assert_eq(nng_aio_result(aio), 0, "the reply: %s", nng_strerror(nng_aio_result(aio)));
  nng_msg *r = nng_aio_get_msg(aio);
  nng_aio_free(aio);
  return r;
}

static void pair(const char *url, nng_socket *req, nng_socket *rep)
{
  cr_assert_eq(nng_rep0_open(rep), 0);
  cr_assert_eq(nng_req0_open(req), 0);
  cr_assert_eq(nng_socket_set_size(*req, NNG_OPT_RECVMAXSZ, 8 << 20), 0);
  cr_assert_eq(nng_socket_set_ms(*req, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE), 0);
  cr_assert_eq(nng_listen(*rep, url, NULL, 0), 0, "listen on %s", url);
  cr_assert_eq(nng_dial(*req, url, NULL, 0), 0, "dial %s", url);
}

/* pair() over a fresh ipc:// path of the test's (tag) and a context of req. */
static void ipc_pair(const char *tag, nng_socket *req, nng_socket *rep, nng_ctx *ctx)
{
  char url[96];
  snprintf(url, sizeof url, "ipc:///tmp/tport-nng-rtail-%s-%d.sock", tag, (int)getpid());
  pair(url, req, rep);
  cr_assert_eq(nng_ctx_open(ctx, *req), 0);
}

static void lands_in_the_buffer(const char *url, bool placed)
{
  nng_socket req, rep;
  pair(url, &req, &rep);
  nng_ctx ctx;
  cr_assert_eq(nng_ctx_open(&ctx, req), 0);
  uint8_t *buf = malloc(TAIL);
  for (int round = 0; round < 4; round++) {
    bool armed = round != 2; /* a round without: the whole reply in the message */
    memset(buf, 0xEE, TAIL);
    if (armed)
      cr_assert_eq(nng_ctx_recv_tail(ctx, buf, TAIL), 0);
    nng_msg *r = ask(ctx, rep, TAIL);
    size_t got = nng_msg_recv_tail(r);
    if (armed && placed) {
      cr_expect_eq(got, TAIL, "%s round %d: %zu bytes placed", url, round, got);
      cr_expect_eq(nng_msg_len(r), 4, "%s: the body keeps the rest (%zu)", url, nng_msg_len(r));
      cr_expect(is_pattern(buf, TAIL), "%s: the buffer holds the reply's end", url);
    } else {
      cr_expect_eq(got, 0, "%s round %d: %zu bytes placed", url, round, got);
      cr_expect_eq(nng_msg_len(r), 4 + TAIL);
      cr_expect(is_pattern((uint8_t *)nng_msg_body(r) + 4, TAIL));
      cr_expect(all(buf, TAIL, 0xEE), "%s: the buffer was written", url);
    }
    cr_expect_eq(memcmp(nng_msg_body(r), "HEAD", 4), 0);
    nng_msg_free(r);
    cr_expect_eq(nng_ctx_recv_tail_clear(ctx, 1000), 0);
  }
  /* once per arming: a second reply on the same arming keeps its bytes */
  cr_assert_eq(nng_ctx_recv_tail(ctx, buf, TAIL), 0);
  nng_msg_free(ask(ctx, rep, TAIL));
  memset(buf, 0xEE, TAIL);
  nng_msg *r = ask(ctx, rep, TAIL);
  cr_expect_eq(nng_msg_recv_tail(r), 0, "%s: placed twice on one arming", url);
  cr_expect(all(buf, TAIL, 0xEE));
  nng_msg_free(r);
  nng_ctx_close(ctx);
  nng_close(req);
  nng_close(rep);
  free(buf);
}

Test(nng_recv_tail, a_replys_end_lands_in_the_buffer_over_tcp)
{
  char url[64];
  snprintf(url, sizeof url, "tcp://127.0.0.1:%d",
           20000 + (int)((unsigned)getpid() * 137u % 30000u));
  lands_in_the_buffer(url, true);
}

Test(nng_recv_tail, a_replys_end_lands_in_the_buffer_over_ipc)
{
  char url[96];
  snprintf(url, sizeof url, "ipc:///tmp/tport-nng-rtail-%d.sock", (int)getpid());
  lands_in_the_buffer(url, true);
}

/* inproc hands the peer's message over as it is: nothing is placed */
Test(nng_recv_tail, inproc_keeps_the_reply_whole)
{
  char url[96];
  snprintf(url, sizeof url, "inproc://tport-nng-rtail-%d", (int)getpid());
  lands_in_the_buffer(url, false);
}

Test(nng_recv_tail, a_reply_too_small_or_too_short_keeps_its_bytes)
{
  nng_socket req, rep;
  nng_ctx ctx;
  ipc_pair("s", &req, &rep, &ctx);
  uint8_t *buf = malloc(2 * TAIL);
  /* under NNG_RECV_TAIL_MIN: read whole, as before */
  memset(buf, 0xEE, 2 * TAIL);
  cr_assert_eq(nng_ctx_recv_tail(ctx, buf, 100), 0);
  nng_msg *r = ask(ctx, rep, 1000);
  cr_expect_eq(nng_msg_recv_tail(r), 0);
  cr_expect_eq(nng_msg_len(r), 4 + 1000);
  nng_msg_free(r);
  cr_expect_eq(nng_ctx_recv_tail_clear(ctx, 1000), 0);
  /* a tail longer than the reply after its request id */
  cr_assert_eq(nng_ctx_recv_tail(ctx, buf, 2 * TAIL), 0);
  r = ask(ctx, rep, TAIL);
  cr_expect_eq(nng_msg_recv_tail(r), 0);
  cr_expect_eq(nng_msg_len(r), 4 + TAIL);
  cr_expect(is_pattern((uint8_t *)nng_msg_body(r) + 4, TAIL));
  nng_msg_free(r);
  cr_expect_eq(nng_ctx_recv_tail_clear(ctx, 1000), 0);
  /* exactly the reply after its request id: the body keeps nothing */
  cr_assert_eq(nng_ctx_recv_tail(ctx, buf, 4 + TAIL), 0);
  r = ask(ctx, rep, TAIL);
  cr_expect_eq(nng_msg_recv_tail(r), 4 + TAIL);
  cr_expect_eq(nng_msg_len(r), 0);
  cr_expect_eq(memcmp(buf, "HEAD", 4), 0);
  cr_expect(is_pattern(buf + 4, TAIL));
  nng_msg_free(r);
  cr_expect(all(buf + 4 + TAIL, TAIL - 4, 0xEE), "written past the tail");
  cr_expect_eq(nng_ctx_recv_tail_clear(ctx, 1000), 0);
  nng_ctx_close(ctx);
  nng_close(req);
  nng_close(rep);
  free(buf);
}

Test(nng_recv_tail, another_contexts_reply_is_not_placed)
{
  nng_socket req, rep;
  nng_ctx a, b;
  ipc_pair("o", &req, &rep, &a);
  cr_assert_eq(nng_ctx_open(&b, req), 0);
  uint8_t *buf = malloc(TAIL);
  memset(buf, 0xEE, TAIL);
  cr_assert_eq(nng_ctx_recv_tail(a, buf, TAIL), 0); /* a asks nothing yet */
  nng_msg *r = ask(b, rep, TAIL);
  cr_expect_eq(nng_msg_recv_tail(r), 0);
  cr_expect_eq(nng_msg_len(r), 4 + TAIL);
  cr_expect(all(buf, TAIL, 0xEE), "b's reply went into a's buffer");
  nng_msg_free(r);
  /* a's own reply still goes there */
  r = ask(a, rep, TAIL);
  cr_expect_eq(nng_msg_recv_tail(r), TAIL);
  cr_expect(is_pattern(buf, TAIL));
  nng_msg_free(r);
  cr_expect_eq(nng_ctx_recv_tail_clear(a, 1000), 0);
  cr_expect_eq(nng_ctx_recv_tail_clear(b, 1000), 0, "a context never armed clears");
  nng_ctx_close(a);
  nng_ctx_close(b);
  nng_close(req);
  nng_close(rep);
  free(buf);
}

Test(nng_recv_tail, a_replys_end_lands_in_segments_in_order)
{
  nng_socket req, rep;
  nng_ctx ctx;
  ipc_pair("g", &req, &rep, &ctx);
  enum { A = 70000, B = 5, C = 300001, HEAD_KEPT = 1000 };
  uint8_t *a = malloc(A), *b = malloc(B), *c = malloc(C);
  uint8_t one[1];
  cr_expect_eq(nng_ctx_recv_tail_add(ctx, a, A), NNG_EINVAL, "a segment with none armed");
  cr_assert_eq(nng_ctx_recv_tail(ctx, a, A), 0);
  cr_assert_eq(nng_ctx_recv_tail_add(ctx, b, B), 0);
  cr_assert_eq(nng_ctx_recv_tail_add(ctx, c, C), 0);
  cr_assert_eq(nng_ctx_recv_tail_add(ctx, one, 0), 0, "an empty segment is one");
  cr_expect_eq(nng_ctx_recv_tail_add(ctx, one, 1), NNG_EBUSY, "a fifth segment");
  nng_msg *r = ask(ctx, rep, HEAD_KEPT + A + B + C);
  cr_expect_eq(nng_msg_recv_tail(r), A + B + C);
  cr_expect_eq(nng_msg_len(r), 4 + HEAD_KEPT);
  cr_expect(is_pattern((uint8_t *)nng_msg_body(r) + 4, HEAD_KEPT));
  bool ok = true;
  for (size_t i = 0; i < A; i++)
    ok &= a[i] == pattern(HEAD_KEPT + i);
  for (size_t i = 0; i < B; i++)
    ok &= b[i] == pattern(HEAD_KEPT + A + i);
  for (size_t i = 0; i < C; i++)
    ok &= c[i] == pattern(HEAD_KEPT + A + B + i);
  cr_expect(ok, "the segments hold the reply's end in order");
  nng_msg_free(r);
  cr_expect_eq(nng_ctx_recv_tail_clear(ctx, 1000), 0);
  /* after the clear: one segment again, not the old ones after it */
  memset(a, 0xEE, A);
  memset(c, 0xEE, C);
  cr_assert_eq(nng_ctx_recv_tail(ctx, c, C), 0);
  r = ask(ctx, rep, HEAD_KEPT + C);
  cr_expect_eq(nng_msg_recv_tail(r), C);
  cr_expect(is_pattern((uint8_t *)nng_msg_body(r) + 4, HEAD_KEPT));
  ok = true;
  for (size_t i = 0; i < C; i++)
    ok &= c[i] == pattern(HEAD_KEPT + i);
  cr_expect(ok);
  cr_expect(all(a, A, 0xEE));
  nng_msg_free(r);
  cr_expect_eq(nng_ctx_recv_tail_clear(ctx, 1000), 0);
  nng_ctx_close(ctx);
  nng_close(req);
  nng_close(rep);
  free(a), free(b), free(c);
}

Test(nng_recv_tail, only_req_contexts_place)
{
  nng_socket rep;
  cr_assert_eq(nng_rep0_open(&rep), 0);
  nng_ctx ctx;
  cr_assert_eq(nng_ctx_open(&ctx, rep), 0);
  uint8_t b[8];
  cr_expect_eq(nng_ctx_recv_tail(ctx, b, sizeof b), NNG_ENOTSUP);
  cr_expect_eq(nng_ctx_recv_tail_add(ctx, b, sizeof b), NNG_ENOTSUP);
  cr_expect_eq(nng_ctx_recv_tail_clear(ctx, 0), NNG_ENOTSUP);
  cr_expect_eq(nng_ctx_recv_tail(ctx, NULL, 8), NNG_EINVAL);
  nng_ctx_close(ctx);
  nng_close(rep);
}

/* ---------------------------------------------------------------- a peer that stalls */

typedef struct raw_rep {
  int lfd, fd;
  char path[108];
  uint8_t id[4]; /* the request's */
} raw_rep;

static void read_all(int fd, void *p, size_t n)
{
  for (size_t got = 0; got < n;) {
    ssize_t k = read(fd, (uint8_t *)p + got, n - got);
    cr_assert(k > 0, "the raw peer's read: %zd", k);
    got += (size_t)k;
  }
}

static void write_all(int fd, const void *p, size_t n)
{
  for (size_t put = 0; put < n;) {
    ssize_t k = write(fd, (const uint8_t *)p + put, n - put);
    cr_assert(k > 0, "the raw peer's write: %zd", k);
    put += (size_t)k;
  }
}

static void raw_listen(raw_rep *r, const char *tag)
{
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(r->path, sizeof r->path, "/tmp/tport-nng-rtail-%s-%d.sock", tag, (int)getpid());
  unlink(r->path);
  memcpy(sa.sun_path, r->path, strlen(r->path) + 1);
  r->lfd = socket(AF_UNIX, SOCK_STREAM, 0);
  cr_assert(r->lfd >= 0);
  cr_assert_eq(bind(r->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
  cr_assert_eq(listen(r->lfd, 1), 0);
}

/* Accepts the REQ's connection, answers its SP header as a REP, reads one
 * request (its id kept). */
static void raw_take_request(raw_rep *r)
{
  r->fd = accept(r->lfd, NULL, NULL);
  cr_assert(r->fd >= 0);
  uint8_t hs[8];
  read_all(r->fd, hs, sizeof hs);
  const uint8_t rep_hs[8] = {0, 'S', 'P', 0, 0, 0x31, 0, 0}; /* REP0 */
  write_all(r->fd, rep_hs, sizeof rep_hs);
  uint8_t h[9];
  read_all(r->fd, h, sizeof h);
  uint64_t len = 0;
  for (int i = 1; i < 9; i++)
    len = len << 8 | h[i];
  cr_assert(len >= 4 && len < 4096);
  uint8_t body[4096];
  read_all(r->fd, body, (size_t)len);
  memcpy(r->id, body, 4);
}

/* The reply's frame header, its id and the first n bytes of its tail. */
static void raw_reply_begin(raw_rep *r, size_t n)
{
  uint64_t len = 4 + TAIL;
  uint8_t h[9] = {1};
  for (int i = 0; i < 8; i++)
    h[1 + i] = (uint8_t)(len >> (56 - 8 * i));
  write_all(r->fd, h, sizeof h);
  write_all(r->fd, r->id, 4);
  uint8_t *p = malloc(TAIL);
  for (size_t i = 0; i < TAIL; i++)
    p[i] = pattern(i);
  write_all(r->fd, p, n);
  free(p);
}

static void raw_reply_rest(raw_rep *r, size_t from)
{
  uint8_t *p = malloc(TAIL);
  for (size_t i = 0; i < TAIL; i++)
    p[i] = pattern(i);
  write_all(r->fd, p + from, TAIL - from);
  free(p);
}

static void raw_close(raw_rep *r)
{
  if (r->fd >= 0)
    close(r->fd);
  close(r->lfd);
  unlink(r->path);
}

/* A REQ context armed and its request sent to the raw peer, which has
 * begun its reply: half of the tail is in the buffer. */
static void stalled(raw_rep *r, const char *tag, nng_socket *req, nng_ctx *ctx, nng_aio **aio,
                    uint8_t *buf, int timeout_ms)
{
  raw_listen(r, tag);
  char url[128];
  snprintf(url, sizeof url, "ipc://%s", r->path);
  cr_assert_eq(nng_req0_open(req), 0);
  cr_assert_eq(nng_socket_set_ms(*req, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE), 0);
  cr_assert_eq(nng_dial(*req, url, NULL, NNG_FLAG_NONBLOCK), 0);
  cr_assert_eq(nng_ctx_open(ctx, *req), 0);
  cr_assert_eq(nng_ctx_recv_tail(*ctx, buf, TAIL), 0);
  cr_assert_eq(nng_aio_alloc(aio, NULL, NULL), 0);
  nng_aio_set_timeout(*aio, timeout_ms);
  nng_msg *q;
  cr_assert_eq(nng_msg_alloc(&q, 0), 0);
  cr_assert_eq(nng_msg_append(q, "ask", 3), 0);
  nng_aio_set_msg(*aio, q);
  nng_ctx_send(*ctx, *aio);
  raw_take_request(r);
  nng_aio_wait(*aio);
  cr_assert_eq(nng_aio_result(*aio), 0);
  nng_ctx_recv(*ctx, *aio);
  raw_reply_begin(r, TAIL / 2);
  /* the transport has read into buf, or soon will: the clear sees it busy */
  for (int i = 0; i < 2000 && buf[TAIL / 2 - 1] != pattern(TAIL / 2 - 1); i++)
    usleep(1000);
  cr_assert_eq(buf[TAIL / 2 - 1], pattern(TAIL / 2 - 1), "the first half never landed");
}

Test(nng_recv_tail, the_clear_waits_for_a_reply_being_read_until_it_ends)
{
  raw_rep r = {.fd = -1};
  nng_socket req;
  nng_ctx ctx;
  nng_aio *aio;
  uint8_t *buf = calloc(1, TAIL);
  stalled(&r, "w", &req, &ctx, &aio, buf, 10000);
  cr_expect_eq(nng_ctx_recv_tail_clear(ctx, 100), NNG_ETIMEDOUT, "cleared while being written");
  cr_expect_eq(nng_ctx_recv_tail(ctx, buf, TAIL), NNG_EBUSY, "armed again while being written");
  raw_reply_rest(&r, TAIL / 2);
  nng_aio_wait(aio);
  cr_assert_eq(nng_aio_result(aio), 0);
  nng_msg *m = nng_aio_get_msg(aio);
  cr_expect_eq(nng_msg_recv_tail(m), TAIL);
  cr_expect_eq(nng_msg_len(m), 0);
  cr_expect(is_pattern(buf, TAIL));
  nng_msg_free(m);
  cr_expect_eq(nng_ctx_recv_tail_clear(ctx, 1000), 0);
  nng_aio_free(aio);
  nng_ctx_close(ctx);
  nng_close(req);
  raw_close(&r);
  free(buf);
}

Test(nng_recv_tail, a_request_that_timed_out_keeps_the_buffer_busy_until_the_pipe_closes)
{
  raw_rep r = {.fd = -1};
  nng_socket req;
  nng_ctx ctx;
  nng_aio *aio;
  uint8_t *buf = calloc(1, TAIL);
  stalled(&r, "t", &req, &ctx, &aio, buf, 300);
  nng_aio_wait(aio); /* the reply's time ran out half way */
  cr_expect_eq(nng_aio_result(aio), NNG_ETIMEDOUT);
  cr_expect_eq(nng_ctx_recv_tail_clear(ctx, 100), NNG_ETIMEDOUT,
               "the transport still writes the buffer");
  close(r.fd); /* the peer goes: the read ends */
  r.fd = -1;
  cr_expect_eq(nng_ctx_recv_tail_clear(ctx, 5000), 0);
  nng_aio_free(aio);
  nng_ctx_close(ctx);
  nng_close(req);
  raw_close(&r);
  free(buf);
}

/* The context goes while its buffer is being written: the transport lets
 * go of what it held on its own (AddressSanitizer sees the rest). */
Test(nng_recv_tail, a_context_closed_while_its_buffer_is_written_is_let_go_after)
{
  raw_rep r = {.fd = -1};
  nng_socket req;
  nng_ctx ctx;
  nng_aio *aio;
  uint8_t *buf = calloc(1, TAIL);
  stalled(&r, "c", &req, &ctx, &aio, buf, 10000);
  nng_ctx_close(ctx);
  nng_aio_wait(aio);
  cr_expect_eq(nng_aio_result(aio), NNG_ECLOSED);
  raw_reply_rest(&r, TAIL / 2); /* still read, into the same buffer */
  usleep(50000);
  cr_expect(is_pattern(buf, TAIL));
  nng_aio_free(aio);
  nng_close(req);
  raw_close(&r);
  free(buf);
}
