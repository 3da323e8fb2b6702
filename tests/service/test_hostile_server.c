/* test_hostile_server.c: libtport against a server that lies -- a fake
 * tportd (a raw nng REP socket speaking the frame format) whose replies are
 * well-formed frames saying what a real server never would.  Every lie must
 * cost the client an error for that call, never a crash. */
#include <criterion/criterion.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "frame.h"
#include "tport.h"

typedef struct fake {
  nng_socket sock;
  pthread_t thread;
  char url[64];
} fake;

/* A reply frame of m, then len bytes of payload. */
static void reply_with(nng_socket s, uint16_t method, const ProtobufCMessage *m,
                       const void *payload, size_t len)
{
  nng_msg *out;
  size_t head = frame_head_size(m);
  cr_assert_eq(nng_msg_alloc(&out, head + len), 0);
  frame_write_head(nng_msg_body(out), method, FRAME_FLAG_REPLY, m);
  if (len)
    memcpy((uint8_t *)nng_msg_body(out) + head, payload, len);
  cr_assert_eq(nng_sendmsg(s, out, 0), 0);
}

static void reply(nng_socket s, uint16_t method, const ProtobufCMessage *m)
{
  reply_with(s, method, m, NULL, 0);
}

/* r (the lie already in it) as a successful GetBegin reply for a uint8
 * tensor of size elements, with len inline bytes. */
static void get_begin_reply(nng_socket s, Tport__GetBeginReply *r, int64_t size,
                            const void *payload, size_t len)
{
  Tport__Status ok = TPORT__STATUS__INIT;
  int64_t sizes[1] = {size};
  Tport__TensorDesc d = TPORT__TENSOR_DESC__INIT;
  d.dtype = TPORT__DTYPE__DTYPE_UINT8;
  d.n_sizes = 1;
  d.sizes = sizes;
  Tport__TensorInfo info = TPORT__TENSOR_INFO__INIT;
  info.desc = &d;
  r->status = &ok;
  r->info = &info;
  r->chunk_bytes = 64 << 10;
  reply_with(s, TPORT__METHOD__METHOD_GET_BEGIN, &r->base, payload, len);
}

/* A GetBegin's reply that says the bytes are in a region, though the
 * client offered none (it has no shm socket from this server): an empty
 * tensor with its CRC32C, which a verifying client reads from the region. */
static void lie_about_region(nng_socket s)
{
  Tport__GetBeginReply r = TPORT__GET_BEGIN_REPLY__INIT;
  r.crc32c_set = true;
  r.shm = true;
  get_begin_reply(s, &r, 0, NULL, 0);
}

/* A GetBegin's reply whose 4 inline bytes are described as a tensor of
 * 1 MiB uint8 (sizes [1 << 20]): a DLTensor made from its description
 * would be read and written 1 MiB past a 4-byte block. */
static void lie_about_size(nng_socket s)
{
  Tport__GetBeginReply r = TPORT__GET_BEGIN_REPLY__INIT;
  r.nbytes = 4;
  get_begin_reply(s, &r, 1 << 20, "abcd", 4);
}

/* A GetBegin's reply for a 192 KiB tensor in three 64 KiB chunks by
 * request, into a region where shm_chunks. */
static void chunked_reply(nng_socket s, bool shm_chunks)
{
  Tport__GetBeginReply r = TPORT__GET_BEGIN_REPLY__INIT;
  static uint8_t id[16] = {1};
  r.nbytes = 3 * (64 << 10);
  r.transfer.data = id;
  r.transfer.len = sizeof id;
  r.shm_chunks = shm_chunks;
  get_begin_reply(s, &r, 3 * (64 << 10), NULL, 0);
}

/* ... asking for them into a region, though the client offered none. */
static void lie_about_chunks(nng_socket s)
{
  chunked_reply(s, true);
}

/* ... by requests, no region (the chunks' replies lie: lie_about_chunk). */
static void three_chunks(nng_socket s)
{
  chunked_reply(s, false);
}

/* What the fake answers a GetBegin with. */
static void (*get_lie)(nng_socket) = lie_about_region;

/* ---------------------------------------------------------------- chunks read in place */

/* The lie a GetChunk of 64 KiB is answered with: over ipc its reply's end
 * is read straight into the caller's buffer (deploy/nng 0014), so each
 * must come back as the reply it was, not as what is left of it. */
enum {
  CHUNK_LONG_ERROR,    /* an error whose message is longer than the chunk */
  CHUNK_PAYLOAD_LONG,  /* 10 bytes more than asked */
  CHUNK_PAYLOAD_SHORT, /* 10 bytes fewer */
  CHUNK_LIES
};
static int chunk_lie;

static void lie_about_chunk(nng_socket s)
{
  enum { LONG = 100 << 10 };
  static char text[LONG + 1];
  static uint8_t payload[(64 << 10) + 10];
  memset(payload, 0x5A, sizeof payload);
  Tport__Status ok = TPORT__STATUS__INIT;
  if (chunk_lie == CHUNK_LONG_ERROR) {
    memset(text, 'x', LONG);
    memcpy(text, "the fake's long story:", 22);
    Tport__Status bad = TPORT__STATUS__INIT;
    bad.code = TPORT__CODE__CODE_RESOURCE_EXHAUSTED;
    bad.message = text;
    Tport__ErrorReply e = TPORT__ERROR_REPLY__INIT;
    e.status = &bad;
    reply(s, TPORT__METHOD__METHOD_GET_CHUNK, &e.base);
    return;
  }
  Tport__GetChunkReply r = TPORT__GET_CHUNK_REPLY__INIT;
  r.status = &ok;
  size_t n = chunk_lie == CHUNK_PAYLOAD_LONG ? sizeof payload : (64 << 10) - 10;
  reply_with(s, TPORT__METHOD__METHOD_GET_CHUNK, &r.base, payload, n);
}

/* ---------------------------------------------------------------- runs */

/* The lie a PutBatch of one run of four elements is answered with. */
enum {
  RUNS_SPLIT,         /* two runs of two */
  RUNS_SHORT,         /* three handles */
  RUNS_REPLIED_PAST,  /* an element past the run replied */
  RUNS_REPLIED_TWICE, /* one element replied twice */
  RUNS_ONE_ALONE,     /* one of them answered as a put of its own */
  RUNS_NO_INFO,       /* every element by handle, no info */
  RUNS_LIES
};
static int runs_lie;

static void lie_about_runs(nng_socket s)
{
  Tport__Status ok = TPORT__STATUS__INIT;
  static int64_t four = 4;
  Tport__TensorDesc d = TPORT__TENSOR_DESC__INIT;
  d.dtype = TPORT__DTYPE__DTYPE_UINT8;
  d.n_sizes = 1;
  d.sizes = &four;
  d.device = "cpu";
  Tport__TensorInfo info = TPORT__TENSOR_INFO__INIT;
  info.desc = &d;
  info.nbytes = 4;
  uint8_t handles[4 * 16];
  memset(handles, 7, sizeof handles);
  Tport__PutRunReply a = TPORT__PUT_RUN_REPLY__INIT, b = TPORT__PUT_RUN_REPLY__INIT;
  Tport__PutRunReply *runs[2] = {&a, &b};
  a.handles.data = handles;
  a.handles.len = sizeof handles;
  a.info = &info;
  uint32_t replied[2] = {5, 5};
  Tport__PutBeginReply one = TPORT__PUT_BEGIN_REPLY__INIT, *ones[2] = {&one, &one};
  one.status = &ok;
  one.info = &info;
  Tport__PutBatchReply r = TPORT__PUT_BATCH_REPLY__INIT;
  r.status = &ok;
  r.n_runs = 1;
  r.runs = runs;
  switch (runs_lie) {
  case RUNS_SPLIT:
    a.handles.len = b.handles.len = 2 * 16;
    b.handles.data = handles + 32;
    b.info = &info;
    r.n_runs = 2;
    break;
  case RUNS_SHORT: a.handles.len = 3 * 16; break;
  case RUNS_REPLIED_PAST:
    a.n_replied = a.n_replies = 1;
    a.replied = replied;
    a.replies = ones;
    break;
  case RUNS_REPLIED_TWICE:
    replied[0] = replied[1] = 1;
    a.n_replied = a.n_replies = 2;
    a.replied = replied;
    a.replies = ones;
    break;
  case RUNS_ONE_ALONE:
    a.handles.len = 3 * 16;
    r.n_puts = 1;
    r.puts = ones;
    break;
  default: a.info = NULL;
  }
  reply(s, TPORT__METHOD__METHOD_PUT_BATCH, &r.base);
}

static void *serve(void *arg)
{
  fake *f = arg;
  nng_msg *m;
  while (nng_recvmsg(f->sock, &m, 0) == 0) {
    frame_view v;
    uint16_t method = frame_parse(nng_msg_body(m), nng_msg_len(m), &v, NULL) ? 0 : v.method;
    nng_msg_free(m);
    Tport__Status ok = TPORT__STATUS__INIT;
    if (method == TPORT__METHOD__METHOD_HELLO) {
      Tport__HelloReply h = TPORT__HELLO_REPLY__INIT;
      h.status = &ok;
      h.protocol_version = FRAME_VERSION;
      h.max_chunk_bytes = 64 << 10;
      h.max_inflight_chunks = 4;
      h.max_outstanding = 8;
      h.put_batch_runs = true;
      reply(f->sock, method, &h.base);
    } else if (method == TPORT__METHOD__METHOD_GET_BEGIN) {
      get_lie(f->sock);
    } else if (method == TPORT__METHOD__METHOD_PUT_BATCH) {
      lie_about_runs(f->sock);
    } else if (method == TPORT__METHOD__METHOD_GET_CHUNK) {
      lie_about_chunk(f->sock);
    } else {
      Tport__Status bad = TPORT__STATUS__INIT;
      bad.code = TPORT__CODE__CODE_UNIMPLEMENTED;
      bad.message = "the fake knows no more";
      Tport__ErrorReply e = TPORT__ERROR_REPLY__INIT;
      e.status = &bad;
      reply(f->sock, method, &e.base);
    }
  }
  return NULL;
}

static void fake_start_at(fake *f, const char *scheme)
{
  static int seq;
  if (!strcmp(scheme, "ipc"))
    snprintf(f->url, sizeof f->url, "ipc:///tmp/tport-fake-%d-%d.sock", (int)getpid(), seq++);
  else
    snprintf(f->url, sizeof f->url, "inproc://fake-server-%d", seq++);
  cr_assert_eq(nng_rep0_open(&f->sock), 0);
  cr_assert_eq(nng_listen(f->sock, f->url, NULL, 0), 0);
  cr_assert_eq(pthread_create(&f->thread, NULL, serve, f), 0);
}

static void fake_start(fake *f)
{
  fake_start_at(f, "inproc");
}

/* A client of f, without a region (verifying or not). */
static tport_client *fake_connect(fake *f, bool verify)
{
  tport_connect_options o = {.timeout_ms = 5000, .no_shm = true, .verify = verify};
  tport_client *c;
  tport_err err;
  cr_assert_eq(tport_connect(f->url, &o, &c, &err), TPORT_OK, "%s", err.msg);
  return c;
}

static void fake_stop(fake *f)
{
  nng_close(f->sock);
  pthread_join(f->thread, NULL);
}

/* tport_get of n bytes and tport_get_alloc from a fake telling lie (a
 * client without a region, verifying or not): DATA_LOSS naming the
 * region, nothing handed over. */
static void expect_region_lie_refused(void (*lie)(nng_socket), bool verify, size_t n)
{
  get_lie = lie;
  fake f;
  fake_start(&f);
  tport_client *c = fake_connect(&f, verify);
  tport_err err;
  tport_ref ref;
  tport_ref_name(&ref, "t");
  uint8_t *buf = malloc(n);
  int rc = tport_get(c, &ref, buf, n, NULL, NULL, NULL, &err);
  cr_expect_eq(rc, TPORT_DATA_LOSS, "%d %s", rc, err.msg);
  cr_expect(strstr(err.msg, "region") != NULL, "%s", err.msg);
  /* the same through a buffer the library allocates */
  void *p = NULL;
  size_t got = 0;
  cr_expect_eq(tport_get_alloc(c, &ref, &p, &got, NULL, &err), TPORT_DATA_LOSS, "%s", err.msg);
  cr_expect_null(p);
  free(buf);
  tport_close(c);
  fake_stop(&f);
}

/* Before the fix, get_bytes read the region's size through a NULL region. */
Test(hostile_server, get_reply_names_a_region_never_offered, .timeout = 30)
{
  expect_region_lie_refused(lie_about_region, true, 16);
}

/* A tensor the server describes as larger than the bytes it sent: a get
 * into a buffer libtport allocates and hands over as a DLManagedTensor
 * fails (its readers would size the block by the description), and the
 * block goes back.  Before the fix tport_get_dlpack handed over a DLTensor
 * of 1 MiB over a 4-byte block. */
Test(hostile_server, a_tensor_described_larger_than_its_bytes_is_refused, .timeout = 30)
{
  get_lie = lie_about_size;
  fake f;
  fake_start(&f);
  tport_client *c = fake_connect(&f, false);
  tport_err err;
  tport_ref ref;
  tport_ref_name(&ref, "t");
  DLManagedTensor *dl = NULL;
  int rc = tport_get_dlpack(c, &ref, &dl, &err);
  cr_expect_eq(rc, TPORT_DATA_LOSS, "%d %s", rc, err.msg);
  cr_expect(strstr(err.msg, "1048576") != NULL, "%s", err.msg);
  cr_expect_null(dl);
  tport_close(c);
  fake_stop(&f);
  get_lie = lie_about_region;
}

/* A server that asks for a get's chunks into a region never offered gets
 * an error, not a GetChunk naming a slice of nothing. */
Test(hostile_server, chunks_into_a_region_never_offered_are_refused, .timeout = 30)
{
  expect_region_lie_refused(lie_about_chunks, false, 3 * (64 << 10));
}

/* A put batch's four alike elements go as one run: an answer shaped as
 * another request's (runs split or merged, handles short, replies naming
 * elements past the run or twice, no info) fails each element with
 * DATA_LOSS -- before the fix, two runs of two for a run of four passed,
 * the first run's info given to the second's elements. */
Test(hostile_server, a_put_batch_answer_shaped_as_other_runs_is_refused, .timeout = 30)
{
  fake f;
  fake_start(&f);
  tport_client *c = fake_connect(&f, false);
  tport_err err;
  static uint8_t bytes[4][4];
  static int64_t four = 4;
  for (runs_lie = 0; runs_lie < RUNS_LIES; runs_lie++) {
    tport_put_item items[4];
    for (int i = 0; i < 4; i++)
      items[i] = (tport_put_item){
          .dtype = TPORT_UINT8, .ndim = 1, .sizes = &four, .data = bytes[i], .nbytes = 4};
    int rc = tport_put_batch(c, items, 4, &err);
    cr_expect_eq(rc, TPORT_DATA_LOSS, "lie %d: %d %s", runs_lie, rc, err.msg);
    for (int i = 0; i < 4; i++)
      cr_expect_eq(items[i].err.code, TPORT_DATA_LOSS, "lie %d, element %d: %s", runs_lie, i,
                   items[i].err.msg);
  }
  tport_close(c);
  fake_stop(&f);
}

/* A chunk's reply whose end was read into the caller's buffer but which is
 * not the chunk it was asked for: the error a server sent (longer than the
 * chunk) comes back as that error, a payload longer or shorter than the
 * chunk as DATA_LOSS, as when the reply was read whole.  Before the
 * reply's end was put back, the long error read as a broken frame. */
Test(hostile_server, a_chunk_reply_read_in_place_that_is_no_chunk_is_taken_whole, .timeout = 60)
{
  get_lie = three_chunks;
  fake f;
  fake_start_at(&f, "ipc");
  tport_client *c = fake_connect(&f, false);
  tport_ref ref;
  tport_ref_name(&ref, "t");
  size_t n = 3 * (64 << 10);
  uint8_t *buf = malloc(n);
  for (chunk_lie = 0; chunk_lie < CHUNK_LIES; chunk_lie++) {
    tport_err err;
    int rc = tport_get(c, &ref, buf, n, NULL, NULL, NULL, &err);
    if (chunk_lie == CHUNK_LONG_ERROR) {
      cr_expect_eq(rc, TPORT_RESOURCE_EXHAUSTED, "%d %.80s", rc, err.msg);
      cr_expect(strstr(err.msg, "the fake's long story:") != NULL, "%.80s", err.msg);
    } else {
      cr_expect_eq(rc, TPORT_DATA_LOSS, "lie %d: %d %s", chunk_lie, rc, err.msg);
      cr_expect(strstr(err.msg, "bytes came in the reply") != NULL, "lie %d: %s", chunk_lie,
                err.msg);
    }
  }
  free(buf);
  tport_close(c);
  fake_stop(&f);
  get_lie = lie_about_region;
}

/* ---------------------------------------------------------------- a reply that stops half way */

/* A server over a plain Unix socket speaking SP (ipc framing) and the
 * frame format: it answers the Hello and a GetBegin of three 64 KiB chunks,
 * then begins its first GetChunk's reply and stops half way through it. */
typedef struct stalling {
  int lfd, fd;
  char path[108];
  pthread_t thread;
  volatile int stop;
} stalling;

static void full_io(int fd, void *p, size_t n, bool wr)
{
  for (size_t done = 0; done < n;) {
    /* (a peer gone: an error, not SIGPIPE) */
    ssize_t k = wr ? send(fd, (uint8_t *)p + done, n - done, MSG_NOSIGNAL)
                   : read(fd, (uint8_t *)p + done, n - done);
    if (k <= 0)
      return;
    done += (size_t)k;
  }
}

/* One SP request: its id (the first 4 bytes) and its frame's method. */
static uint16_t next_request(int fd, uint8_t id[4])
{
  uint8_t h[9] = {0};
  full_io(fd, h, sizeof h, false);
  uint64_t len = 0;
  for (int i = 1; i < 9; i++)
    len = len << 8 | h[i];
  if (len < 4 + FRAME_HEADER_BYTES || len > (1 << 20))
    return 0;
  uint8_t *b = malloc(len);
  full_io(fd, b, len, false);
  memcpy(id, b, 4);
  frame_view v;
  uint16_t m = frame_parse(b + 4, len - 4, &v, NULL) ? 0 : v.method;
  free(b);
  return m;
}

/* A reply frame of msg then n payload bytes, of which only send go out. */
static void sp_reply(int fd, const uint8_t id[4], uint16_t method, const ProtobufCMessage *msg,
                     size_t n, size_t send)
{
  size_t head = frame_head_size(msg), len = 4 + head + n;
  uint8_t *b = calloc(1, 9 + len);
  b[0] = 1;
  for (int i = 0; i < 8; i++)
    b[1 + i] = (uint8_t)((uint64_t)len >> (56 - 8 * i));
  memcpy(b + 9, id, 4);
  frame_write_head(b + 13, method, FRAME_FLAG_REPLY, msg);
  memset(b + 13 + head, 0xAB, n);
  full_io(fd, b, 9 + 4 + head + send, true);
  free(b);
}

static void *stall_serve(void *arg)
{
  stalling *st = arg;
  st->fd = accept(st->lfd, NULL, NULL);
  uint8_t hs[8];
  full_io(st->fd, hs, sizeof hs, false);
  uint8_t rep_hs[8] = {0, 'S', 'P', 0, 0, 0x31, 0, 0};
  full_io(st->fd, rep_hs, sizeof rep_hs, true);
  uint8_t id[4];
  Tport__Status ok = TPORT__STATUS__INIT;
  for (uint16_t m; !st->stop && (m = next_request(st->fd, id)) != 0;) {
    if (m == TPORT__METHOD__METHOD_HELLO) {
      Tport__HelloReply h = TPORT__HELLO_REPLY__INIT;
      h.status = &ok;
      h.protocol_version = FRAME_VERSION;
      h.max_chunk_bytes = 64 << 10;
      h.max_inflight_chunks = 1;
      h.max_outstanding = 8;
      sp_reply(st->fd, id, m, &h.base, 0, 0);
    } else if (m == TPORT__METHOD__METHOD_GET_BEGIN) {
      int64_t size = 3 * (64 << 10);
      Tport__TensorDesc d = TPORT__TENSOR_DESC__INIT;
      d.dtype = TPORT__DTYPE__DTYPE_UINT8;
      d.n_sizes = 1;
      d.sizes = &size;
      Tport__TensorInfo info = TPORT__TENSOR_INFO__INIT;
      info.desc = &d;
      static uint8_t tid[16] = {3};
      Tport__GetBeginReply r = TPORT__GET_BEGIN_REPLY__INIT;
      r.status = &ok;
      r.info = &info;
      r.nbytes = (uint64_t)size;
      r.chunk_bytes = 64 << 10;
      r.transfer.data = tid;
      r.transfer.len = sizeof tid;
      sp_reply(st->fd, id, m, &r.base, 0, 0);
    } else if (m == TPORT__METHOD__METHOD_GET_CHUNK) {
      Tport__GetChunkReply r = TPORT__GET_CHUNK_REPLY__INIT;
      r.status = &ok;
      sp_reply(st->fd, id, m, &r.base, 64 << 10, 32 << 10); /* and no more */
    }
  }
  return NULL;
}

/* A get whose chunk's reply stopped half way fails, and once it returned
 * its buffer is written no more: the rest sent later (had the connection
 * stayed) would land after the caller took it back.  Before the slots
 * waited for nng to let go of the buffer, tport_get returned at its
 * timeout with the reply still being read into it. */
Test(hostile_server, a_get_whose_reply_stops_half_way_leaves_the_buffer_when_it_returns,
     .timeout = 60)
{
  stalling st = {.fd = -1};
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(st.path, sizeof st.path, "/tmp/tport-stall-%d.sock", (int)getpid());
  unlink(st.path);
  memcpy(sa.sun_path, st.path, strlen(st.path) + 1);
  st.lfd = socket(AF_UNIX, SOCK_STREAM, 0);
  cr_assert_eq(bind(st.lfd, (struct sockaddr *)&sa, sizeof sa), 0);
  cr_assert_eq(listen(st.lfd, 1), 0);
  cr_assert_eq(pthread_create(&st.thread, NULL, stall_serve, &st), 0);
  char url[128];
  snprintf(url, sizeof url, "ipc://%s", st.path);
  tport_connect_options o = {.timeout_ms = 500, .no_shm = true};
  tport_client *c;
  tport_err err;
  cr_assert_eq(tport_connect(url, &o, &c, &err), TPORT_OK, "%s", err.msg);
  tport_ref ref;
  tport_ref_name(&ref, "t");
  size_t n = 3 * (64 << 10);
  uint8_t *buf = calloc(1, n);
  int rc = tport_get(c, &ref, buf, n, NULL, NULL, NULL, &err);
  cr_expect_neq(rc, TPORT_OK, "a reply half sent was taken");
  uint8_t *seen = malloc(n);
  memcpy(seen, buf, n);
  /* the rest of the reply, as a server that woke up would send it */
  uint8_t *rest = malloc(n);
  memset(rest, 0xCD, n);
  full_io(st.fd, rest, 64 << 10, true);
  usleep(100000);
  cr_expect_eq(memcmp(seen, buf, n), 0, "the buffer was written after the get returned");
  st.stop = 1;
  tport_close(c);
  shutdown(st.fd, SHUT_RDWR);
  pthread_join(st.thread, NULL);
  close(st.fd);
  close(st.lfd);
  unlink(st.path);
  free(buf), free(seen), free(rest);
}
