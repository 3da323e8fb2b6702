/*
 * test_nng_patched.c: what our patches to nng 1.5.2 promise (deploy/nng), on
 * the nng that tensorport links.
 *
 *  - 0007 (message-body cache): a large body freed is reused by the next message
 *    of about its size (no fresh pages), and a body that grows, or a copy of
 *    a message, is zeroed beyond the bytes it carries -- a reused block holds
 *    another message's bytes.
 *  - 0006 (poller delivers reads): only the SP transports' own reads are
 *    finished on nng's poller thread; the reads of a plain nng_stream (as the
 *    TLS layer makes) complete as before, so a callback of one that stops
 *    another read of the same stream does not wait for its own thread.
 *
 *  - 0008 (lent tail): a message may carry a tail of bytes lent by the
 *    sender (nng_msg_set_tail): sent after the body, over tcp and ipc
 *    straight from the sender's memory, over other transports copied into
 *    the body first; its release runs exactly once, however the message
 *    ends; body-changing calls and duplicates see the tail as the body's end.
 *  - 0012 (segments): such a tail may be up to four segments lent from four
 *    places (nng_msg_add_tail), sent or copied in order, released once.
 *  - 0013 (ipc send buffer): the dialer's end of an ipc connection has the
 *    send buffer it asks for (4 MiB, as far as the kernel allows); the
 *    listener's end keeps the kernel's default.
 *
 * The cache is off under AddressSanitizer (TPORT_NNG_MSG_CACHE_BYTES=0, set
 * by the test runs): the reuse test skips there.
 */
#include <criterion/criterion.h>
#include <nng/nng.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <nng/protocol/pubsub0/pub.h>
#include <nng/protocol/pubsub0/sub.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

Test(nng_patched, a_large_body_freed_is_reused)
{
  const char *off = getenv("TPORT_NNG_MSG_CACHE_BYTES");
  if (off && strcmp(off, "0") == 0)
    cr_skip_test("the body cache is off here (TPORT_NNG_MSG_CACHE_BYTES=0)");
  /* a 4 MiB chunk and its header, as a put sends (nng puts the body of a
   * size that is not a power of two 32 bytes into its block) */
  nng_msg *m;
  cr_assert_eq(nng_msg_alloc(&m, (4 << 20) + 40), 0);
  void *body = nng_msg_body(m);
  memset(body, 0x5a, (4 << 20) + 40);
  nng_msg_free(m);
  /* a little smaller (a shorter header): the same block */
  cr_assert_eq(nng_msg_alloc(&m, (4 << 20) + 20), 0);
  cr_expect_eq(nng_msg_body(m), body, "a freed 4 MiB body was not reused");
  nng_msg_free(m);
  /* much smaller: not served by a block ten times its size */
  cr_assert_eq(nng_msg_alloc(&m, (4 << 20) + 40), 0);
  body = nng_msg_body(m);
  nng_msg_free(m);
  cr_assert_eq(nng_msg_alloc(&m, (300 << 10) + 40), 0);
  cr_expect_neq(nng_msg_body(m), body, "a 300 KiB message took a 4 MiB block");
  nng_msg_free(m);
}

static size_t nonzero(const uint8_t *p, size_t n)
{
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    k += p[i] != 0;
  return k;
}

Test(nng_patched, a_grown_body_shows_no_other_message_bytes)
{
  enum { SMALL = 300000, LARGE = 1600000, GROWN = 1500000 };
  nng_msg *m, *other;
  cr_assert_eq(nng_msg_alloc(&m, SMALL), 0);
  memset(nng_msg_body(m), 0x11, SMALL);
  /* another message's bytes, freed: its block is what the growth may get */
  cr_assert_eq(nng_msg_alloc(&other, LARGE), 0);
  memset(nng_msg_body(other), 0xaa, LARGE);
  nng_msg_free(other);
  cr_assert_eq(nng_msg_realloc(m, GROWN), 0);
  const uint8_t *b = nng_msg_body(m);
  cr_expect_eq(nonzero(b, SMALL), SMALL, "the message's own bytes were lost");
  cr_expect_eq(b[0], 0x11);
  cr_expect_eq(nonzero(b + SMALL, GROWN - SMALL), 0,
               "the grown tail holds %zu bytes of a freed message", nonzero(b + SMALL, GROWN - SMALL));
  /* a duplicate: the same bytes, and nothing else's beyond them */
  cr_assert_eq(nng_msg_alloc(&other, LARGE), 0);
  memset(nng_msg_body(other), 0xaa, LARGE);
  nng_msg_free(other);
  nng_msg *dup;
  cr_assert_eq(nng_msg_dup(&dup, m), 0);
  cr_expect_eq(nng_msg_len(dup), GROWN);
  cr_expect_eq(memcmp(nng_msg_body(dup), b, GROWN), 0);
  nng_msg_free(dup);
  nng_msg_free(m);
}

/* two reads queued on one accepted stream; the first's callback stops the
 * second (already read, in the same poller round, by the stock loop) */
static nng_aio *read_a, *read_b;
static atomic_int first_done;

static void first_read_done(void *arg)
{
  (void)arg;
  nng_aio_stop(read_b); /* would wait for ever on the poller's own thread */
  atomic_store(&first_done, 1);
}

static void watchdog(int sig)
{
  (void)sig;
  static const char msg[] = "a stream read's callback waited for its own poller thread\n";
  (void)!write(2, msg, sizeof msg - 1);
  _exit(1);
}

Test(nng_patched, a_stream_callback_may_stop_another_read_of_its_stream)
{
  signal(SIGALRM, watchdog);
  alarm(20);
  nng_stream_listener *l;
  nng_stream_dialer *d;
  nng_aio *acc, *dial;
  cr_assert_eq(nng_aio_alloc(&acc, NULL, NULL), 0);
  cr_assert_eq(nng_aio_alloc(&dial, NULL, NULL), 0);
  int port = 0;
  for (int tries = 0; tries < 50; tries++) {
    char url[64];
    port = 20000 + (int)((unsigned)getpid() * 7919u + (unsigned)tries * 104729u) % 30000;
    snprintf(url, sizeof url, "tcp://127.0.0.1:%d", port);
    cr_assert_eq(nng_stream_listener_alloc(&l, url), 0);
    if (nng_stream_listener_listen(l) == 0) {
      cr_assert_eq(nng_stream_dialer_alloc(&d, url), 0);
      break;
    }
    nng_stream_listener_free(l);
    l = NULL;
  }
  cr_assert_not_null(l, "no port to listen on");
  nng_stream_listener_accept(l, acc);
  nng_stream_dialer_dial(d, dial);
  nng_aio_wait(dial);
  nng_aio_wait(acc);
  cr_assert_eq(nng_aio_result(dial), 0);
  cr_assert_eq(nng_aio_result(acc), 0);
  nng_stream *client = nng_aio_get_output(dial, 0), *server = nng_aio_get_output(acc, 0);
  char a[4], b[4];
  cr_assert_eq(nng_aio_alloc(&read_a, first_read_done, NULL), 0);
  cr_assert_eq(nng_aio_alloc(&read_b, NULL, NULL), 0);
  nng_iov ia = {a, sizeof a}, ib = {b, sizeof b};
  nng_aio_set_iov(read_a, 1, &ia);
  nng_aio_set_iov(read_b, 1, &ib);
  nng_stream_recv(server, read_a);
  nng_stream_recv(server, read_b);
  nng_iov out = {"abcdefgh", 8};
  nng_aio_set_iov(dial, 1, &out);
  nng_stream_send(client, dial);
  nng_aio_wait(dial);
  while (!atomic_load(&first_done))
    usleep(1000);
  cr_expect_eq(memcmp(a, "abcd", 4), 0);
  alarm(0);
  nng_aio_free(read_a);
  nng_aio_free(read_b);
  nng_stream_close(client);
  nng_stream_close(server);
  nng_stream_free(client);
  nng_stream_free(server);
  nng_stream_dialer_free(d);
  nng_stream_listener_free(l);
  nng_aio_free(acc);
  nng_aio_free(dial);
}

/* ---------------------------------------------------------------- lent tails */

static atomic_int releases;

static void count_release(void *arg)
{
  atomic_fetch_add((atomic_int *)arg, 1);
}

/* waits up to 5 s for the release (it runs when the sender's transport is
 * done with the message: on its own thread, maybe after the peer has it) */
static int releases_after_wait(int want)
{
  for (int i = 0; i < 5000 && atomic_load(&releases) < want; i++)
    usleep(1000);
  return atomic_load(&releases);
}

static void reply_with_tail(const char *url)
{
  enum { TAIL = (1 << 20) + 13 };
  nng_socket rep, req;
  cr_assert_eq(nng_rep0_open(&rep), 0);
  cr_assert_eq(nng_req0_open(&req), 0);
  cr_assert_eq(nng_socket_set_size(req, NNG_OPT_RECVMAXSZ, 4 << 20), 0);
  cr_assert_eq(nng_listen(rep, url, NULL, 0), 0, "listen on %s", url);
  cr_assert_eq(nng_dial(req, url, NULL, 0), 0, "dial %s", url);
  uint8_t *tail = malloc(TAIL);
  for (size_t i = 0; i < TAIL; i++)
    tail[i] = (uint8_t)(i * 7 + 3);
  for (int round = 0; round < 3; round++) {
    atomic_store(&releases, 0);
    cr_assert_eq(nng_send(req, "ask", 3, 0), 0);
    nng_msg *m;
    cr_assert_eq(nng_recvmsg(rep, &m, 0), 0);
    nng_msg_clear(m);
    cr_assert_eq(nng_msg_append(m, "HEAD", 4), 0);
    cr_assert_eq(nng_msg_set_tail(m, tail, TAIL, count_release, &releases), 0);
    cr_expect_eq(nng_msg_len(m), 4, "the tail is not counted in the body");
    cr_expect_eq(atomic_load(&releases), 0, "released before it was sent");
    cr_assert_eq(nng_sendmsg(rep, m, 0), 0);
    nng_msg *r;
    cr_assert_eq(nng_recvmsg(req, &r, 0), 0);
    cr_assert_eq(nng_msg_len(r), 4 + TAIL, "%s: %zu bytes arrived", url, nng_msg_len(r));
    cr_expect_eq(memcmp(nng_msg_body(r), "HEAD", 4), 0, "%s: the body came first", url);
    cr_expect_eq(memcmp((uint8_t *)nng_msg_body(r) + 4, tail, TAIL), 0,
                 "%s: the tail's bytes differ", url);
    nng_msg_free(r);
    cr_expect_eq(releases_after_wait(1), 1, "%s: released %d times", url,
                 atomic_load(&releases));
  }
  nng_close(req);
  nng_close(rep);
  free(tail);
  usleep(20000);
  cr_expect_eq(atomic_load(&releases), 1, "%s: released again after the sockets closed", url);
}

Test(nng_patched, a_lent_tail_is_sent_after_the_body_over_tcp)
{
  char url[64];
  snprintf(url, sizeof url, "tcp://127.0.0.1:%d",
           20000 + (int)((unsigned)getpid() * 131u % 30000u));
  reply_with_tail(url);
}

Test(nng_patched, a_lent_tail_is_sent_after_the_body_over_ipc)
{
  char url[96];
  snprintf(url, sizeof url, "ipc:///tmp/tport-nng-tail-%d.sock", (int)getpid());
  reply_with_tail(url);
}

/* inproc hands the message itself to the peer: the tail is copied into the
 * body (released then), or the peer would see the body only */
Test(nng_patched, a_lent_tail_is_copied_in_over_inproc)
{
  char url[64];
  snprintf(url, sizeof url, "inproc://tport-nng-tail-%d", (int)getpid());
  reply_with_tail(url);
}

Test(nng_patched, a_lent_tail_is_released_once_however_the_message_ends)
{
  static const char tail[] = "0123456789abcdef";
  nng_msg *m, *dup;
  uint32_t v;

  /* freed unsent */
  atomic_store(&releases, 0);
  cr_assert_eq(nng_msg_alloc(&m, 0), 0);
  cr_assert_eq(nng_msg_set_tail(m, tail, 16, count_release, &releases), 0);
  cr_expect_eq(nng_msg_set_tail(m, tail, 16, count_release, &releases), NNG_EBUSY);
  nng_msg_free(m);
  cr_expect_eq(atomic_load(&releases), 1);

  /* appended to: the tail becomes the body's, then the new bytes */
  atomic_store(&releases, 0);
  cr_assert_eq(nng_msg_alloc(&m, 0), 0);
  cr_assert_eq(nng_msg_append(m, "ab", 2), 0);
  cr_assert_eq(nng_msg_set_tail(m, tail, 16, count_release, &releases), 0);
  cr_assert_eq(nng_msg_append(m, "Z", 1), 0);
  cr_expect_eq(atomic_load(&releases), 1, "not released when copied in");
  cr_expect_eq(nng_msg_len(m), 19);
  cr_expect_eq(memcmp(nng_msg_body(m), "ab0123456789abcdefZ", 19), 0);
  nng_msg_free(m);
  cr_expect_eq(atomic_load(&releases), 1, "released twice");

  /* chopped: from the tail's end */
  atomic_store(&releases, 0);
  cr_assert_eq(nng_msg_alloc(&m, 0), 0);
  cr_assert_eq(nng_msg_set_tail(m, tail, 16, count_release, &releases), 0);
  cr_assert_eq(nng_msg_chop_u32(m, &v), 0);
  cr_expect_eq(v, 0x63646566u, "chop_u32 read %#x, not the tail's last bytes", v);
  cr_expect_eq(nng_msg_len(m), 12);
  cr_expect_eq(atomic_load(&releases), 1);
  nng_msg_free(m);

  /* duplicated: the copy owns the bytes; the original keeps its tail */
  atomic_store(&releases, 0);
  cr_assert_eq(nng_msg_alloc(&m, 0), 0);
  cr_assert_eq(nng_msg_append(m, "x", 1), 0);
  cr_assert_eq(nng_msg_set_tail(m, tail, 16, count_release, &releases), 0);
  cr_assert_eq(nng_msg_dup(&dup, m), 0);
  cr_expect_eq(nng_msg_len(dup), 17);
  cr_expect_eq(memcmp(nng_msg_body(dup), "x0123456789abcdef", 17), 0);
  nng_msg_free(dup);
  cr_expect_eq(atomic_load(&releases), 0, "the duplicate released the original's tail");
  nng_msg_free(m);
  cr_expect_eq(atomic_load(&releases), 1);

  /* cleared, grown, flattened */
  atomic_store(&releases, 0);
  cr_assert_eq(nng_msg_alloc(&m, 0), 0);
  cr_assert_eq(nng_msg_set_tail(m, tail, 16, count_release, &releases), 0);
  nng_msg_clear(m);
  cr_expect_eq(atomic_load(&releases), 1);
  cr_expect_eq(nng_msg_len(m), 0);
  cr_assert_eq(nng_msg_set_tail(m, tail, 16, count_release, &releases), 0);
  cr_assert_eq(nng_msg_realloc(m, 20), 0);
  cr_expect_eq(atomic_load(&releases), 2);
  cr_expect_eq(memcmp(nng_msg_body(m), tail, 16), 0);
  nng_msg_clear(m);
  cr_assert_eq(nng_msg_set_tail(m, tail, 16, count_release, &releases), 0);
  cr_assert_eq(nng_msg_flatten(m), 0);
  cr_expect_eq(atomic_load(&releases), 3);
  cr_expect_eq(nng_msg_len(m), 16);
  cr_expect_eq(memcmp(nng_msg_body(m), tail, 16), 0);
  nng_msg_free(m);
  cr_expect_eq(atomic_load(&releases), 3);

  /* a NULL tail with bytes is refused; an empty one is fine */
  cr_assert_eq(nng_msg_alloc(&m, 0), 0);
  cr_expect_eq(nng_msg_set_tail(m, NULL, 4, NULL, NULL), NNG_EINVAL);
  cr_expect_eq(nng_msg_set_tail(m, NULL, 0, NULL, NULL), 0);
  nng_msg_free(m);
}

/* nng_msg_add_tail: a tail of several segments lent from several places
 * arrives after the body, the segments in order (an empty one adds
 * nothing), released once. */
static void reply_with_segments(const char *url)
{
  static const size_t lens[4] = {(1 << 20) + 13, 0, 70001, 5};
  nng_socket rep, req;
  cr_assert_eq(nng_rep0_open(&rep), 0);
  cr_assert_eq(nng_req0_open(&req), 0);
  cr_assert_eq(nng_socket_set_size(req, NNG_OPT_RECVMAXSZ, 4 << 20), 0);
  cr_assert_eq(nng_listen(rep, url, NULL, 0), 0, "listen on %s", url);
  cr_assert_eq(nng_dial(req, url, NULL, 0), 0, "dial %s", url);
  uint8_t *seg[4];
  size_t total = 0;
  for (int k = 0; k < 4; k++) {
    seg[k] = malloc(lens[k] + 1);
    for (size_t i = 0; i < lens[k]; i++)
      seg[k][i] = (uint8_t)(i * (k + 3) + k);
    total += lens[k];
  }
  for (int round = 0; round < 3; round++) {
    atomic_store(&releases, 0);
    cr_assert_eq(nng_send(req, "ask", 3, 0), 0);
    nng_msg *m;
    cr_assert_eq(nng_recvmsg(rep, &m, 0), 0);
    nng_msg_clear(m);
    cr_assert_eq(nng_msg_append(m, "HEAD", 4), 0);
    cr_assert_eq(nng_msg_set_tail(m, seg[0], lens[0], count_release, &releases), 0);
    for (int k = 1; k < 4; k++)
      cr_assert_eq(nng_msg_add_tail(m, seg[k], lens[k]), 0);
    cr_expect_eq(nng_msg_add_tail(m, seg[0], 1), NNG_EBUSY, "a fifth segment");
    cr_expect_eq(nng_msg_len(m), 4, "the tail is not counted in the body");
    cr_assert_eq(nng_sendmsg(rep, m, 0), 0);
    nng_msg *r;
    cr_assert_eq(nng_recvmsg(req, &r, 0), 0);
    cr_assert_eq(nng_msg_len(r), 4 + total, "%s: %zu bytes arrived", url, nng_msg_len(r));
    const uint8_t *at = (const uint8_t *)nng_msg_body(r);
    cr_expect_eq(memcmp(at, "HEAD", 4), 0, "%s: the body came first", url);
    at += 4;
    for (int k = 0; k < 4; k++) {
      cr_expect_eq(memcmp(at, seg[k], lens[k]), 0, "%s: segment %d differs", url, k);
      at += lens[k];
    }
    nng_msg_free(r);
    cr_expect_eq(releases_after_wait(1), 1, "%s: released %d times", url,
                 atomic_load(&releases));
  }
  nng_close(req);
  nng_close(rep);
  for (int k = 0; k < 4; k++)
    free(seg[k]);
}

Test(nng_patched, a_tail_of_several_segments_is_sent_in_order_over_tcp)
{
  char url[64];
  snprintf(url, sizeof url, "tcp://127.0.0.1:%d",
           20000 + (int)((unsigned)getpid() * 137u % 30000u));
  reply_with_segments(url);
}

Test(nng_patched, a_tail_of_several_segments_is_sent_in_order_over_ipc)
{
  char url[96];
  snprintf(url, sizeof url, "ipc:///tmp/tport-nng-segs-%d.sock", (int)getpid());
  reply_with_segments(url);
}

Test(nng_patched, a_tail_of_several_segments_is_copied_in_over_inproc)
{
  char url[64];
  snprintf(url, sizeof url, "inproc://tport-nng-segs-%d", (int)getpid());
  reply_with_segments(url);
}

Test(nng_patched, a_tail_of_several_segments_is_copied_whole_and_released_once)
{
  static const char a[] = "0123456789", b[] = "abcdef";
  nng_msg *m, *dup;
  cr_assert_eq(nng_msg_alloc(&m, 0), 0);
  cr_expect_eq(nng_msg_add_tail(m, a, 10), NNG_EINVAL, "no tail to add to");
  cr_assert_eq(nng_msg_append(m, "x", 1), 0);
  atomic_store(&releases, 0);
  cr_assert_eq(nng_msg_set_tail(m, a, 10, count_release, &releases), 0);
  cr_expect_eq(nng_msg_add_tail(m, NULL, 3), NNG_EINVAL);
  cr_assert_eq(nng_msg_add_tail(m, b, 6), 0);
  cr_assert_eq(nng_msg_dup(&dup, m), 0);
  cr_expect_eq(nng_msg_len(dup), 17);
  cr_expect_eq(memcmp(nng_msg_body(dup), "x0123456789abcdef", 17), 0);
  nng_msg_free(dup);
  cr_expect_eq(atomic_load(&releases), 0, "the duplicate released the original's tail");
  cr_assert_eq(nng_msg_flatten(m), 0);
  cr_expect_eq(atomic_load(&releases), 1);
  cr_expect_eq(nng_msg_len(m), 17);
  cr_expect_eq(memcmp(nng_msg_body(m), "x0123456789abcdef", 17), 0);
  nng_msg_free(m);
  cr_expect_eq(atomic_load(&releases), 1, "released twice");
}

/* pub sends one message to every pipe: a tcp pipe whose peer reads slowly
 * still writes it from the tail when an inproc pipe, later in the list,
 * must have the tail in its body.  The inproc pipe gets a copy of its own:
 * copying the tail into the shared message's body released it, and the
 * lender could reuse its bytes while the tcp pipe still sent them (found by
 * review: 64 of 64 MiB arrived wrong). */
Test(nng_patched, a_lent_tail_shared_by_several_pipes_stays_until_the_last_has_sent_it)
{
  enum { TAIL = 16 << 20 };
  int port = 20000 + (int)((unsigned)getpid() * 977u % 30000u);
  char tcp[64], inproc[64];
  snprintf(tcp, sizeof tcp, "tcp://127.0.0.1:%d", port);
  snprintf(inproc, sizeof inproc, "inproc://tport-nng-shared-%d", (int)getpid());
  nng_socket pub, sub;
  cr_assert_eq(nng_pub0_open(&pub), 0);
  cr_assert_eq(nng_listen(pub, tcp, NULL, 0), 0);
  cr_assert_eq(nng_listen(pub, inproc, NULL, 0), 0);
  /* an SP peer over tcp that says hello, then reads nothing for now */
  int fd = socket(AF_INET, SOCK_STREAM, 0), small = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  sa.sin_addr.s_addr = htonl(0x7f000001);
  cr_assert_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  uint8_t hs[8] = {0, 'S', 'P', 0, 0, 0x21, 0, 0}, got[8]; /* SUB0 */
  cr_assert_eq(write(fd, hs, 8), 8);
  cr_assert_eq(read(fd, got, 8), 8);
  usleep(100000);
  cr_assert_eq(nng_sub0_open(&sub), 0);
  cr_assert_eq(nng_socket_set(sub, NNG_OPT_SUB_SUBSCRIBE, "", 0), 0);
  cr_assert_eq(nng_socket_set_size(sub, NNG_OPT_RECVMAXSZ, 0), 0);
  cr_assert_eq(nng_dial(sub, inproc, NULL, 0), 0);
  usleep(100000);
  uint8_t *tail = malloc(TAIL);
  memset(tail, 0xab, TAIL);
  atomic_store(&releases, 0);
  nng_msg *m;
  cr_assert_eq(nng_msg_alloc(&m, 0), 0);
  cr_assert_eq(nng_msg_append(m, "HEAD", 4), 0);
  cr_assert_eq(nng_msg_set_tail(m, tail, TAIL, count_release, &releases), 0);
  cr_assert_eq(nng_sendmsg(pub, m, 0), 0);
  nng_msg *r;
  cr_assert_eq(nng_recvmsg(sub, &r, 0), 0);
  cr_expect_eq(nng_msg_len(r), 4 + TAIL, "the inproc peer got %zu bytes", nng_msg_len(r));
  cr_expect_eq(((uint8_t *)nng_msg_body(r))[4 + TAIL - 1], 0xab);
  nng_msg_free(r);
  usleep(100000);
  cr_expect_eq(atomic_load(&releases), 0, "released while the tcp pipe still sends it");
  if (atomic_load(&releases))
    memset(tail, 0xee, TAIL); /* a lender may reuse its bytes once released */
  /* now the tcp peer reads the whole message */
  uint8_t head[8];
  size_t n = 0, bad = 0;
  while (n < 8) {
    ssize_t k = read(fd, head + n, 8 - n);
    cr_assert_gt(k, 0);
    n += (size_t)k;
  }
  uint64_t total = 0;
  for (int i = 0; i < 8; i++)
    total = total << 8 | head[i];
  cr_assert_eq(total, 4 + TAIL);
  uint8_t *buf = malloc(total);
  for (n = 0; n < total;) {
    ssize_t k = read(fd, buf + n, total - n);
    cr_assert_gt(k, 0);
    n += (size_t)k;
  }
  for (size_t i = 4; i < total; i++)
    bad += buf[i] != 0xab;
  cr_expect_eq(bad, 0, "the tcp peer got %zu of the tail's bytes wrong", bad);
  cr_expect_eq(releases_after_wait(1), 1);
  free(buf);
  close(fd);
  nng_close(sub);
  nng_close(pub);
  free(tail);
}

/* ---------------------------------------------------------------- 0013 */

/* /proc/sys/net/core/NAME (-1 where it cannot be read). */
static long core_sysctl(const char *name)
{
  char path[96];
  snprintf(path, sizeof path, "/proc/sys/net/core/%s", name);
  FILE *f = fopen(path, "r");
  long v = -1;
  if (f && fscanf(f, "%ld", &v) != 1)
    v = -1;
  if (f)
    fclose(f);
  return v;
}

/* Which end of a connection to the Unix socket at path fd is: 1 the
 * dialer's (its peer is path), 2 the listener's (it is path), 0 neither. */
static int end_of(int fd, const char *path)
{
  int type = 0, listening = 0;
  socklen_t len = sizeof type;
  if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) || type != SOCK_STREAM)
    return 0;
  len = sizeof listening;
  if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) || listening)
    return 0;
  struct sockaddr_un me, peer;
  socklen_t ml = sizeof me, pl = sizeof peer;
  memset(&me, 0, sizeof me), memset(&peer, 0, sizeof peer);
  if (getsockname(fd, (struct sockaddr *)&me, &ml) || me.sun_family != AF_UNIX)
    return 0;
  if (getpeername(fd, (struct sockaddr *)&peer, &pl))
    return 0;
  return !strcmp(peer.sun_path, path) ? 1 : !strcmp(me.sun_path, path) ? 2 : 0;
}

Test(nng_patched, a_dialed_ipc_connection_has_a_bulk_send_buffer)
{
  long wmax = core_sysctl("wmem_max"), wdefault = core_sysctl("wmem_default");
  cr_assert(wmax > 0 && wdefault > 0, "net.core.wmem_max and wmem_default cannot be read");
  char path[96], url[112];
  snprintf(path, sizeof path, "/tmp/tport-nng-buf-%d.sock", (int)getpid());
  snprintf(url, sizeof url, "ipc://%s", path);
  nng_socket rep, req;
  cr_assert_eq(nng_rep0_open(&rep), 0);
  cr_assert_eq(nng_req0_open(&req), 0);
  cr_assert_eq(nng_listen(rep, url, NULL, 0), 0, "listen on %s", url);
  cr_assert_eq(nng_dial(req, url, NULL, 0), 0, "dial %s", url);
  /* a round trip: both ends' connections are made by then */
  cr_assert_eq(nng_send(req, "ask", 3, 0), 0);
  nng_msg *m;
  cr_assert_eq(nng_recvmsg(rep, &m, 0), 0);
  cr_assert_eq(nng_sendmsg(rep, m, 0), 0);
  cr_assert_eq(nng_recvmsg(req, &m, 0), 0);
  nng_msg_free(m);
  /* Linux keeps twice what was asked, held to the maximum first; an end
   * that asked nothing has the default as it is */
  long want[3] = {0, 2 * (wmax < (4 << 20) ? wmax : (4 << 20)), wdefault};
  int found[3] = {0};
  DIR *d = opendir("/proc/self/fd");
  cr_assert_not_null(d);
  for (struct dirent *e; (e = readdir(d));) {
    int fd = atoi(e->d_name), end;
    if (e->d_name[0] == '.' || fd == dirfd(d) || !(end = end_of(fd, path)))
      continue;
    int snd = 0;
    socklen_t len = sizeof snd;
    cr_assert_eq(getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &snd, &len), 0);
    cr_expect_eq(snd, want[end], "the %s's end: send buffer %d bytes, not %ld (wmem_max %ld)",
                 end == 1 ? "dialer" : "listener", snd, want[end], wmax);
    found[end]++;
  }
  closedir(d);
  cr_expect(found[1] == 1 && found[2] == 1, "ends found: %d dialer's, %d listener's", found[1],
            found[2]);
  nng_close(req);
  nng_close(rep);
}
