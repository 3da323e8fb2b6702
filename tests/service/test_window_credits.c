/* test_window_credits.c: a transfer takes the window's credits it needs,
 * not the whole window (client/window.c).
 *
 * Before the fix every windowed transfer took the whole window while it
 * ran, even a batch of one request: with tportd's defaults (a window of 8,
 * 32 requests outstanding) four such batches -- the library threads' async
 * small puts -- held every credit and any other request of the client
 * waited behind them; a server whose window is all it allows (here 4 and
 * 4) let one batch of one request stop the client.  A fake server (a raw
 * REP socket, so that it can leave a request unanswered) holds a
 * one-request PutBatch and waits for the client's next request: it must
 * come while the batch is still in flight. */
#include <criterion/criterion.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "frame.h"
#include "tport.h"

typedef struct fake {
  nng_socket sock;
  pthread_t thread;
  char url[64];
  atomic_bool holding;   /* the batch has come and is held */
  uint16_t held_method;  /* the request left unanswered */
  uint16_t second_method; /* what came while it was (0: nothing in 5 s) */
} fake;

/* Answers request m (its backtrace header kept: a raw socket's reply) with
 * reply r of method; m is consumed. */
static void answer(nng_socket s, nng_msg *m, uint16_t method, const ProtobufCMessage *r)
{
  nng_msg_clear(m);
  size_t head = frame_head_size(r);
  cr_assert_eq(nng_msg_realloc(m, head), 0);
  frame_write_head(nng_msg_body(m), method, FRAME_FLAG_REPLY, r);
  cr_assert_eq(nng_sendmsg(s, m, 0), 0);
}

static void refuse(nng_socket s, nng_msg *m, uint16_t method)
{
  Tport__Status bad = TPORT__STATUS__INIT;
  bad.code = TPORT__CODE__CODE_UNIMPLEMENTED;
  bad.message = "the fake knows no more";
  Tport__ErrorReply e = TPORT__ERROR_REPLY__INIT;
  e.status = &bad;
  answer(s, m, method, &e.base);
}

static uint16_t method_of(nng_msg *m)
{
  frame_view v;
  return frame_parse(nng_msg_body(m), nng_msg_len(m), &v, NULL) ? 0 : v.method;
}

static void *serve(void *arg)
{
  fake *f = arg;
  nng_msg *m, *held = NULL;
  while (nng_recvmsg(f->sock, &m, 0) == 0) {
    uint16_t method = method_of(m);
    if (method == TPORT__METHOD__METHOD_HELLO) {
      Tport__Status ok = TPORT__STATUS__INIT;
      Tport__HelloReply h = TPORT__HELLO_REPLY__INIT;
      h.status = &ok;
      h.protocol_version = FRAME_VERSION;
      h.max_chunk_bytes = 64 << 10;
      h.max_inflight_chunks = 4;
      h.max_outstanding = 4; /* the window is all the credits: one transfer could take all */
      answer(f->sock, m, method, &h.base);
      continue;
    }
    if (!held && method == TPORT__METHOD__METHOD_PUT_BATCH) {
      /* held: does anything else come while it is in flight? */
      held = m;
      f->held_method = method;
      nng_socket_set_ms(f->sock, NNG_OPT_RECVTIMEO, 5000);
      atomic_store(&f->holding, true);
      nng_msg *next;
      if (nng_recvmsg(f->sock, &next, 0) == 0) {
        f->second_method = method_of(next);
        refuse(f->sock, next, f->second_method);
      }
      nng_socket_set_ms(f->sock, NNG_OPT_RECVTIMEO, NNG_DURATION_INFINITE);
      refuse(f->sock, held, f->held_method);
      continue;
    }
    refuse(f->sock, m, method);
  }
  return NULL;
}

Test(window_credits, a_one_request_batch_leaves_the_rest_of_the_window_to_others, .timeout = 60)
{
  fake f = {0};
  snprintf(f.url, sizeof f.url, "inproc://window-credits");
  cr_assert_eq(nng_rep0_open_raw(&f.sock), 0);
  cr_assert_eq(nng_listen(f.sock, f.url, NULL, 0), 0);
  cr_assert_eq(pthread_create(&f.thread, NULL, serve, &f), 0);

  tport_connect_options o = {.timeout_ms = 20000, .no_shm = true};
  tport_client *c;
  tport_err err;
  cr_assert_eq(tport_connect(f.url, &o, &c, &err), TPORT_OK, "%s", err.msg);
  /* one small element: one PutBatch request, held by the fake */
  uint8_t bytes[64] = {1};
  int64_t n = sizeof bytes;
  tport_put_item item = {.dtype = TPORT_UINT8, .ndim = 1, .sizes = &n, .data = bytes,
                         .nbytes = sizeof bytes};
  tport_request *batch;
  cr_assert_eq(tport_put_batch_async(c, &item, 1, NULL, NULL, &batch, &err), TPORT_OK, "%s",
               err.msg);
  /* another request of the same client, once the batch is held */
  for (int i = 0; i < 2000 && !atomic_load(&f.holding); i++)
    usleep(5000);
  cr_assert(atomic_load(&f.holding), "the batch never reached the fake");
  tport_ref ref;
  tport_ref_name(&ref, "t");
  tport_tensor_info info;
  int rc = tport_info(c, &ref, &info, &err);
  cr_expect_eq(rc, TPORT_UNIMPLEMENTED, "the Info was answered by the fake: %d %s", rc, err.msg);
  cr_assert_eq(tport_wait(batch, -1, &err), TPORT_UNIMPLEMENTED, "%s", err.msg);
  tport_request_free(batch);
  cr_expect_eq(f.held_method, TPORT__METHOD__METHOD_PUT_BATCH);
  cr_expect_eq(f.second_method, TPORT__METHOD__METHOD_INFO,
               "while a one-request batch was in flight nothing else of the client's came "
               "(method %u): the batch held the whole window",
               f.second_method);
  tport_close(c);
  nng_close(f.sock);
  pthread_join(f.thread, NULL);
}
