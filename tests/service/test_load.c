/* test_load.c: a client killed mid-put leaves nothing behind; 16 concurrent
 * clients (and threads sharing one client) with every byte verified. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine.h"
#include "service_util.h"
#include "staging.h"

/* An in-process server on url, or NULL when the address is taken. */
static server *try_start_tcp(const char *url)
{
  server_config cfg;
  config_defaults(&cfg);
  cfg.listen[0] = strdup(url);
  cfg.nlisten = 1;
  cfg.devices = strdup("cpu,sim:2");
  cfg.chunk_bytes = 64 << 10;
  cfg.log_level = 0;
  server *s = NULL;
  if (server_start(&cfg, &s, NULL))
    s = NULL;
  config_free(&cfg);
  return s;
}

static server *start_tcp(char *url, size_t len)
{
  server *s = NULL;
  for (int tries = 0; tries < 5 && !s; tries++) {
    svc_tcp_url(url, len);
    s = try_start_tcp(url);
  }
  cr_assert_not_null(s, "no free port for the server");
  return s;
}

static int64_t wait_counter(tport_client *c, const char *name, int64_t want)
{
  int64_t v = -1;
  for (int i = 0; i < 200 && (v = svc_counter(c, name)) != want; i++)
    usleep(20000);
  return v;
}

Test(load, client_killed_mid_put_leaves_nothing)
{
  char url[128];
  server *s = start_tcp(url, sizeof url);
  size_t before = sim_bytes_in_use(0);
  /* a separate process (nng is not fork-safe): it dies by SIGKILL mid-put */
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    execl(PUT_AND_DIE_PATH, PUT_AND_DIE_PATH, url, "sim:0", "8388608", (char *)NULL);
    _exit(127);
  }
  int st;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "the child died mid-put");
  tport_client *probe = svc_connect(url, NULL);
  cr_assert_eq(wait_counter(probe, "uploads_in_progress", 0), 0, "the half upload is discarded");
  cr_assert_eq(wait_counter(probe, "tensors", 0), 0);
  tport_close(probe);
  engine_synchronize_all();
  cr_assert_eq(sim_bytes_in_use(0), before, "its device memory is returned");
  server_stop(s, 1000);
}

/* ---- 16 clients */

typedef struct {
  const char *url;
  tport_client *shared;
  int id;
  int failures;
  int rounds;
} load_arg;

static void *client_main(void *p)
{
  load_arg *a = p;
  tport_client *c = a->shared ? a->shared : svc_connect(a->url, NULL);
  unsigned seed = (unsigned)a->id * 7919u;
  const char *devices[] = {"cpu", "sim:0", "sim:1"};
  for (int r = 0; r < a->rounds; r++) {
    size_t n = 1 + (size_t)(rand_r(&seed) % (600 << 10));
    uint8_t *v = malloc(n), *back = malloc(n);
    for (size_t i = 0; i < n; i++)
      v[i] = (uint8_t)(i * 31 + (size_t)a->id * 17 + (size_t)r);
    tport_put_options po;
    tport_put_options_init(&po);
    po.device = devices[rand_r(&seed) % 3];
    po.non_blocking = rand_r(&seed) % 2;
    tport_tensor_info t;
    tport_err err;
    if (tport_put(a->shared ? c : c, TPORT_UINT8, 1, (int64_t[]){(int64_t)n}, NULL, v, n, &po, &t,
                  &err)) {
      cr_log_error("client %d: put: %s", a->id, err.msg);
      a->failures++;
    } else {
      /* sometimes move it first: to another device as int16 and back */
      tport_ref ref = t.ref;
      tport_tensor_info moved;
      tport_to_options o = {.device = devices[rand_r(&seed) % 3]};
      if (rand_r(&seed) % 2 == 0 && tport_to(c, &t.ref, &o, &moved, NULL, &err) == 0)
        ref = moved.ref;
      if (tport_get(c, &ref, back, n, NULL, NULL, NULL, &err) || memcmp(v, back, n)) {
        cr_log_error("client %d: get: %s", a->id, err.msg);
        a->failures++;
      }
      tport_free(c, &t.ref, NULL);
    }
    free(v);
    free(back);
  }
  if (!a->shared)
    tport_close(c);
  return NULL;
}

Test(load, sixteen_clients_and_a_shared_one)
{
  char url[128];
  server *s = start_tcp(url, sizeof url);
  enum { N = 16, SHARED = 4 };
  pthread_t t[N + SHARED];
  load_arg a[N + SHARED];
  tport_client *shared = svc_connect(url, NULL);
  for (int i = 0; i < N + SHARED; i++) {
    a[i] = (load_arg){.url = url, .id = i, .rounds = 12, .shared = i >= N ? shared : NULL};
    pthread_create(&t[i], NULL, client_main, &a[i]);
  }
  for (int i = 0; i < N + SHARED; i++) {
    pthread_join(t[i], NULL);
    cr_assert_eq(a[i].failures, 0, "client %d", i);
  }
  tport_close(shared);
  tport_client *probe = svc_connect(url, NULL);
  cr_assert_eq(wait_counter(probe, "tensors", 0), 0, "every tensor went with its client");
  tport_close(probe);
  server_stop(s, 1000);
  cr_assert_eq(sim_bytes_in_use(0) + sim_bytes_in_use(1), 0);
}
