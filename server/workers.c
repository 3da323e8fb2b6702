/*
 * workers.c: the worker pool: each worker takes the next request off the
 * workers' queue (fair among tenants: fairq.h), has it dispatched and hands
 * its reply back to its context.  Handlers run on these threads only: the
 * contexts' callbacks never wait for the engine.
 */
#include <nng/nng.h>
#include <openssl/crypto.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/prctl.h>

#include "arena.h"
#include "random_ids.h"
#include "server_internal.h"

void (*server_test_before_handle)(server *s, uint32_t pipe, uint16_t method);

static void *worker_main(void *arg)
{
  prctl(PR_SET_NAME, "tportd:worker"); /* what top -H, perf and gdb show */
  server *s = arg;
  arena requests; /* where each request's message is unpacked */
  arena_init(&requests);
  for (;;) {
    pthread_mutex_lock(&s->qmu);
    fq_node *n;
    /* past the grace period the tenants' caps no longer matter: what is
     * queued is taken off and not run */
    while (!(n = fq_pop(s->fq, s->stopping)) && !s->stopping)
      pthread_cond_wait(&s->qcv, &s->qmu);
    if (!n) {
      pthread_mutex_unlock(&s->qmu);
      OPENSSL_thread_stop(); /* this thread's RAND state */
      random_ids_thread_end();
      arena_fini(&requests);
      return NULL;
    }
    srv_ctx *x = (srv_ctx *)((char *)n - offsetof(srv_ctx, fq));
    bool stopping = s->stopping;
    pthread_mutex_unlock(&s->qmu);
    nng_msg *reply = NULL;
    if (x->drop_why && !stopping)
      server_drop_pipe(s, x->pipe, x->drop_why);
    else if (!x->drop_why && !stopping) {
      if (server_test_before_handle)
        server_test_before_handle(s, (uint32_t)nng_pipe_id(x->pipe), frame_method_of(x->msg));
      reply = dispatch_request(s, x, &requests);
      arena_reset(&requests);
      if (x->park_until_ms) {
        ctx_park(s, x); /* it keeps its request until handled again */
        continue;
      }
    }
    if (x->chunk == CHUNK_COUNTED)
      reg_chunk_leave(&s->reg, nng_pipe_id(x->pipe));
    if (x->msg)
      nng_msg_free(x->msg);
    x->msg = NULL;
    ctx_finish(s, x, reply);
  }
}

int workers_start(server *s, const server_config *cfg, tport_err *err)
{
  int rc = TPORT_OK;
  if (!(s->fq = fq_new(config_tenant_workers(cfg))))
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  s->nworkers = 0;
  s->workers = calloc((size_t)cfg->workers, sizeof *s->workers);
  for (int i = 0; i < cfg->workers && !rc && s->workers; i++)
    if (pthread_create(&s->workers[i], NULL, worker_main, s) == 0)
      s->nworkers++;
  if (!rc && s->nworkers < cfg->workers)
    rc = tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "cannot start %d worker threads",
                       cfg->workers);
  return rc;
}
