/* test_verify.c: end-to-end integrity (tport_connect_options.verify, tport
 * --verify): every chunk carries its CRC32C and the other end checks it.
 * The corruption is real: a TCP relay between the client and tportd flips
 * one bit of the stream in one direction, past the kernel's TCP checksums,
 * as a faulty NIC, switch or memory would.  Without verify the same flip goes
 * unnoticed, which is what makes the option worth having. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "crc32c.h"
#include "service_util.h"

#define CHUNK (1 << 20)
#define NBYTES (3 * CHUNK + 1000) /* four chunks, the last one short */

/* ---------------------------------------------------------------- the relay */

typedef struct relay {
  int listen_fd, port, server_port;
  pthread_t thread;
  atomic_bool stop;
  /* one bit to flip: in the stream towards the server (to_server) or the
   * client, at this byte offset of the connection; -1: none */
  atomic_llong flip_at;
  bool to_server;
  atomic_int flipped;
} relay;

static int tcp_listen(int *port)
{
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  cr_assert_eq(listen(fd, 4), 0);
  socklen_t len = sizeof a;
  getsockname(fd, (struct sockaddr *)&a, &len);
  *port = ntohs(a.sin_port);
  return fd;
}

/* Moves what fd `from` has to `to`; offset counts the bytes moved that way. */
static bool pump(relay *r, int from, int to, long long *offset, bool towards_server)
{
  static char buf[1 << 16];
  ssize_t n = read(from, buf, sizeof buf);
  if (n <= 0)
    return false;
  long long at = atomic_load(&r->flip_at);
  if (at >= 0 && towards_server == r->to_server && at >= *offset && at < *offset + n) {
    buf[at - *offset] ^= 0x10;
    atomic_store(&r->flip_at, -1);
    atomic_fetch_add(&r->flipped, 1);
  }
  *offset += n;
  for (ssize_t done = 0; done < n;) {
    ssize_t w = write(to, buf + done, (size_t)(n - done));
    if (w <= 0)
      return false;
    done += w;
  }
  return true;
}

static void *relay_run(void *arg)
{
  relay *r = arg;
  while (!atomic_load(&r->stop)) {
    struct pollfd lp = {.fd = r->listen_fd, .events = POLLIN};
    if (poll(&lp, 1, 50) <= 0)
      continue;
    int c = accept(r->listen_fd, NULL, NULL);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)r->server_port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (c < 0 || connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
      close(c);
      close(s);
      continue;
    }
    long long up = 0, down = 0; /* offsets of this connection, each way */
    while (!atomic_load(&r->stop)) {
      struct pollfd p[2] = {{.fd = c, .events = POLLIN}, {.fd = s, .events = POLLIN}};
      if (poll(p, 2, 50) <= 0)
        continue;
      if ((p[0].revents & (POLLIN | POLLHUP)) && !pump(r, c, s, &up, true))
        break;
      if ((p[1].revents & (POLLIN | POLLHUP)) && !pump(r, s, c, &down, false))
        break;
    }
    close(c);
    close(s);
  }
  return NULL;
}

static relay rl;
static pid_t server_pid;
static char server_url[64], relay_url[64];

static void setup(void)
{
  for (int i = 0; i < 10; i++) {
    svc_tcp_url(server_url, sizeof server_url);
    /* the relay is a man in the middle by design, which an answer with the
     * local secret, bound to the address the client reached, does not pass */
    const char *args[] = {"--chunk", "1048576", "--local-secret", "off", NULL};
    if ((server_pid = svc_spawn(server_url, args)) > 0)
      break;
  }
  cr_assert_gt(server_pid, 0, "tportd did not start");
  rl.server_port = atoi(strrchr(server_url, ':') + 1);
  rl.listen_fd = tcp_listen(&rl.port);
  atomic_store(&rl.flip_at, -1);
  snprintf(relay_url, sizeof relay_url, "tcp://127.0.0.1:%d", rl.port);
  cr_assert_eq(pthread_create(&rl.thread, NULL, relay_run, &rl), 0);
}

static void teardown(void)
{
  atomic_store(&rl.stop, true);
  pthread_join(rl.thread, NULL);
  close(rl.listen_fd);
  cr_assert_eq(svc_terminate(server_pid), 0);
}

TestSuite(verify, .init = setup, .fini = teardown, .timeout = 120);

static tport_client *connect_via_relay(bool verify)
{
  tport_client *c = NULL;
  tport_err err;
  tport_connect_options o = {.timeout_ms = 20000, .verify = verify};
  cr_assert_eq(tport_connect(relay_url, &o, &c, &err), 0, "%s", err.msg);
  return c;
}

static uint8_t *pattern(size_t n, unsigned seed)
{
  uint8_t *v = malloc(n);
  for (size_t i = 0; i < n; i++)
    v[i] = (uint8_t)((i * 2654435761u + seed) >> 13);
  return v;
}

static void put_bytes(tport_client *c, const uint8_t *v, size_t n, tport_tensor_info *t,
                      int want, const char *what)
{
  int64_t len = (int64_t)n;
  tport_err err;
  int rc = tport_put(c, TPORT_UINT8, 1, &len, NULL, v, n, NULL, t, &err);
  cr_assert_eq(rc, want, "%s: %s", what, err.msg);
}

/* ---------------------------------------------------------------- tests */

Test(verify, crc32c_is_castagnoli)
{
  /* the check value, and RFC 3720's iSCSI test vectors (B.4) */
  cr_assert_eq(transport_crc32c(0, "123456789", 9), 0xE3069283u);
  uint8_t b[32];
  memset(b, 0, sizeof b);
  cr_assert_eq(transport_crc32c(0, b, 32), 0x8A9136AAu);
  memset(b, 0xff, sizeof b);
  cr_assert_eq(transport_crc32c(0, b, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; i++)
    b[i] = (uint8_t)i;
  cr_assert_eq(transport_crc32c(0, b, 32), 0x46DD794Eu);
  /* continuing a CRC over pieces gives the CRC of the whole */
  cr_assert_eq(transport_crc32c(transport_crc32c(0, b, 13), b + 13, 19), 0x46DD794Eu);
  cr_assert_eq(transport_crc32c(0, NULL, 0), 0u);
}

Test(verify, round_trips_with_verify_are_exact)
{
  tport_client *c = connect_via_relay(true);
  size_t sizes[] = {0, 1, 5000, NBYTES}; /* empty, inline, chunked */
  for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
    uint8_t *v = pattern(sizes[k] ? sizes[k] : 1, (unsigned)k);
    tport_tensor_info t;
    put_bytes(c, v, sizes[k], &t, TPORT_OK, "put");
    uint8_t *back = malloc(sizes[k] + 1);
    tport_err err;
    cr_assert_eq(tport_get(c, &t.ref, back, sizes[k], NULL, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(memcmp(v, back, sizes[k]), 0, "%zu bytes", sizes[k]);
    free(v);
    free(back);
  }
  tport_close(c);
}

/* A bit flipped on the way back: verify reports it, naming the chunk; the
 * same flip without verify hands over wrong bytes. */
Test(verify, a_get_corrupted_in_flight_is_data_loss)
{
  uint8_t *v = pattern(NBYTES, 7), *back = malloc(NBYTES);
  for (int verify = 1; verify >= 0; verify--) {
    tport_client *c = connect_via_relay(verify);
    tport_tensor_info t;
    put_bytes(c, v, NBYTES, &t, TPORT_OK, "put");
    /* the replies' stream so far is a few hundred bytes: 1.5 MiB on lands in
     * a chunk's payload (each has a header of a few dozen bytes) */
    atomic_store(&rl.flip_at, (long long)CHUNK + CHUNK / 2);
    rl.to_server = false;
    tport_err err;
    int rc = tport_get(c, &t.ref, back, NBYTES, NULL, NULL, NULL, &err);
    cr_assert_eq(atomic_load(&rl.flipped), 2 - verify, "the relay flipped a bit");
    if (verify) {
      cr_assert_eq(rc, TPORT_DATA_LOSS, "%d: %s", rc, err.msg);
      cr_assert(strstr(err.msg, "the chunk at offset ") && strstr(err.msg, "CRC32C"), "%s",
                err.msg);
    } else {
      cr_assert_eq(rc, TPORT_OK, "%s", err.msg);
      cr_assert_neq(memcmp(v, back, NBYTES), 0, "the flipped bit arrived unnoticed");
    }
    tport_close(c);
  }
  free(v);
  free(back);
}

/* A bit flipped on the way in: the server refuses the chunk (DATA_LOSS,
 * nothing stored); without verify the tensor is stored wrong. */
Test(verify, a_put_corrupted_in_flight_is_data_loss)
{
  uint8_t *v = pattern(NBYTES, 9), *back = malloc(NBYTES);
  for (int verify = 1; verify >= 0; verify--) {
    tport_client *c = connect_via_relay(verify);
    /* the requests' stream so far is the Hello: 2.5 MiB on is in a chunk */
    atomic_store(&rl.flip_at, 2 * (long long)CHUNK + CHUNK / 2);
    rl.to_server = true;
    tport_tensor_info t;
    int64_t n = NBYTES;
    tport_err err;
    int rc = tport_put(c, TPORT_UINT8, 1, &n, NULL, v, NBYTES, NULL, &t, &err);
    cr_assert_eq(atomic_load(&rl.flipped), 2 - verify, "the relay flipped a bit");
    if (verify) {
      cr_assert_eq(rc, TPORT_DATA_LOSS, "%d: %s", rc, err.msg);
      cr_assert(strstr(err.msg, "the chunk at offset 2097152 (1048576 bytes)"), "%s", err.msg);
      cr_assert_eq(svc_counter(c, "uploads_in_progress"), 0, "the upload was aborted");
    } else {
      cr_assert_eq(rc, TPORT_OK, "%s", err.msg);
      cr_assert_eq(tport_get(c, &t.ref, back, NBYTES, NULL, NULL, NULL, &err), 0, "%s", err.msg);
      cr_assert_neq(memcmp(v, back, NBYTES), 0, "the flipped bit was stored unnoticed");
    }
    tport_close(c);
  }
  free(v);
  free(back);
}

/* Every way a chunk lands -- in host memory as it is, on another device,
 * converted on arrival -- checks its CRC32C: exact bytes without a flip, and
 * DATA_LOSS naming the chunk with one (only the first was tested). */
Test(verify, every_landing_checks_the_crc)
{
  uint8_t *v = pattern(NBYTES, 21);
  float *back = malloc((size_t)NBYTES * sizeof(float));
  const struct {
    const char *device;
    bool to_float;
  } cases[] = {{"cpu", false}, {"sim:0", false}, {"cpu", true}, {"sim:1", true}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    char what[64];
    snprintf(what, sizeof what, "to %s%s", cases[k].device,
             cases[k].to_float ? ", converted to float32" : "");
    tport_put_options po;
    tport_put_options_init(&po);
    po.device = cases[k].device;
    po.has_dtype = cases[k].to_float;
    po.dtype = TPORT_FLOAT32;
    int64_t n = NBYTES;
    tport_err err;
    tport_tensor_info t;
    /* unflipped: exact */
    tport_client *c = connect_via_relay(true);
    cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &n, NULL, v, NBYTES, &po, &t, &err), 0, "%s: %s",
                 what, err.msg);
    size_t esize = cases[k].to_float ? sizeof(float) : 1;
    cr_assert_eq(tport_get(c, &t.ref, back, NBYTES * esize, NULL, NULL, NULL, &err), 0, "%s: %s",
                 what, err.msg);
    for (size_t i = 0; i < NBYTES; i++) {
      double got = cases[k].to_float ? back[i] : ((uint8_t *)back)[i];
      if (got != v[i])
        cr_assert_fail("%s: element %zu is %g, was put as %u", what, i, got, v[i]);
    }
    tport_close(c);
    /* a bit flipped in the third chunk */
    c = connect_via_relay(true);
    int before = atomic_load(&rl.flipped);
    atomic_store(&rl.flip_at, 2 * (long long)CHUNK + CHUNK / 2);
    rl.to_server = true;
    int rc = tport_put(c, TPORT_UINT8, 1, &n, NULL, v, NBYTES, &po, &t, &err);
    cr_assert_eq(atomic_load(&rl.flipped), before + 1, "%s: the relay flipped a bit", what);
    cr_assert_eq(rc, TPORT_DATA_LOSS, "%s: %d: %s", what, rc, err.msg);
    cr_assert(strstr(err.msg, "the chunk at offset 2097152 (1048576 bytes)"), "%s: %s", what,
              err.msg);
    cr_assert_eq(svc_counter(c, "uploads_in_progress"), 0, "%s: the upload was aborted", what);
    tport_close(c);
  }
  free(v);
  free(back);
}

/* A raw PutChunk whose CRC32C does not match: DATA_LOSS, the chunk is not
 * written, and the same chunk sent again with its right CRC completes the
 * upload. */
Test(verify, a_refused_chunk_can_be_sent_again)
{
  nng_socket s;
  cr_assert_eq(nng_req0_open(&s), 0);
  nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 10000);
  nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, 64 << 20);
  cr_assert_eq(nng_dial(s, server_url, NULL, 0), 0);
  char msg[256];
  ProtobufCMessage *r;
  nng_msg *m;

  cr_assert_eq(svc_hello(s, "default", msg), 0, "Hello: %s", msg);

  /* an upload of two chunks */
  size_t n = 2 * CHUNK;
  uint8_t *v = pattern(n, 3);
  int64_t size = (int64_t)n;
  Tport__TensorDesc d = TPORT__TENSOR_DESC__INIT;
  d.dtype = TPORT__DTYPE__DTYPE_UINT8;
  d.n_sizes = 1;
  d.sizes = &size;
  Tport__PutBeginRequest bq = TPORT__PUT_BEGIN_REQUEST__INIT;
  bq.desc = &d;
  cr_assert_eq(nng_msg_alloc(&m, frame_head_size(&bq.base)), 0);
  frame_write_head(nng_msg_body(m), TPORT__METHOD__METHOD_PUT_BEGIN, 0, &bq.base);
  cr_assert_eq(nng_sendmsg(s, m, 0), 0);
  cr_assert_eq(nng_recvmsg(s, &m, 0), 0);
  cr_assert_eq(svc_reply_status(m, &tport__put_begin_reply__descriptor, msg, &r), 0, "%s", msg);
  Tport__PutBeginReply *br = (Tport__PutBeginReply *)r;
  uint8_t handle[64];
  size_t hlen = br->ref->handle.len;
  memcpy(handle, br->ref->handle.data, hlen);
  protobuf_c_message_free_unpacked(r, NULL);
  nng_msg_free(m);

  Tport__Ref ref = TPORT__REF__INIT;
  ref.handle.data = handle;
  ref.handle.len = hlen;
  for (int k = 0; k < 3; k++) {
    /* chunk 1 with a wrong CRC, then chunk 1 and chunk 0 right */
    size_t off = k == 2 ? 0 : CHUNK;
    Tport__PutChunkRequest cq = TPORT__PUT_CHUNK_REQUEST__INIT;
    cq.ref = &ref;
    cq.offset = off;
    cq.crc32c_set = true;
    cq.crc32c = transport_crc32c(0, v + off, CHUNK) ^ (k == 0 ? 1u : 0u);
    size_t head = frame_head_size(&cq.base);
    cr_assert_eq(nng_msg_alloc(&m, head + CHUNK), 0);
    frame_write_head(nng_msg_body(m), TPORT__METHOD__METHOD_PUT_CHUNK, 0, &cq.base);
    memcpy((uint8_t *)nng_msg_body(m) + head, v + off, CHUNK);
    cr_assert_eq(nng_sendmsg(s, m, 0), 0);
    cr_assert_eq(nng_recvmsg(s, &m, 0), 0);
    int code = svc_reply_status(m, &tport__put_chunk_reply__descriptor, msg, NULL);
    nng_msg_free(m);
    if (k == 0) {
      cr_assert_eq(code, TPORT_DATA_LOSS, "%d: %s", code, msg);
      cr_assert(strstr(msg, "the chunk at offset 1048576 (1048576 bytes) arrived with CRC32C"),
                "%s", msg);
    } else {
      cr_assert_eq(code, TPORT_OK, "%s", msg);
    }
  }
  Tport__PutCommitRequest pq = TPORT__PUT_COMMIT_REQUEST__INIT;
  pq.ref = &ref;
  cr_assert_eq(nng_msg_alloc(&m, frame_head_size(&pq.base)), 0);
  frame_write_head(nng_msg_body(m), TPORT__METHOD__METHOD_PUT_COMMIT, 0, &pq.base);
  cr_assert_eq(nng_sendmsg(s, m, 0), 0);
  cr_assert_eq(nng_recvmsg(s, &m, 0), 0);
  cr_assert_eq(svc_reply_status(m, &tport__put_commit_reply__descriptor, msg, NULL), 0, "%s",
               msg);
  nng_msg_free(m);
  nng_close(s);
  free(v);
}
