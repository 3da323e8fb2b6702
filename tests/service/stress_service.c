/*
 * stress_service.c: tportd's threaded parts under load, as a plain program
 * for ThreadSanitizer (Criterion cannot run under it).  An in-process server;
 * eight client threads put, convert, view, get and free on cpu and sim
 * devices, two of them sharing one client, while connections come and go.
 * Exit status 0 when every byte came back right.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server.h"
#include "tport.h"

static char url[128];
static atomic_int failures;
static tport_client *shared;

static void *worker(void *arg)
{
  int id = (int)(intptr_t)arg;
  unsigned seed = (unsigned)id * 2654435761u;
  const char *devices[] = {"cpu", "sim:0", "sim:1"};
  for (int r = 0; r < 25; r++) {
    bool own = id >= 2;
    tport_client *c = shared;
    if (own && tport_connect(url, NULL, &c, NULL)) {
      atomic_fetch_add(&failures, 1);
      continue;
    }
    int64_t rows = 1 + rand_r(&seed) % 300, cols = 1 + rand_r(&seed) % 500;
    size_t n = (size_t)(rows * cols);
    int32_t *v = malloc(n * 4), *back = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
      v[i] = (int32_t)(i * 7 + (size_t)id * 1000 + (size_t)r);
    tport_put_options po;
    tport_put_options_init(&po);
    po.device = devices[rand_r(&seed) % 3];
    po.non_blocking = rand_r(&seed) % 2;
    tport_tensor_info a, t, f;
    tport_err err;
    tport_to_options to = {
        .device = devices[rand_r(&seed) % 3], .has_dtype = true, .dtype = TPORT_FLOAT64};
    tport_to_options back_to = {
        .has_dtype = true, .dtype = TPORT_INT32, .device = devices[rand_r(&seed) % 3]};
    bool ok =
        tport_put(c, TPORT_INT32, 2, (int64_t[]){rows, cols}, NULL, v, n * 4, &po, &a, &err) == 0 &&
        tport_view(c, &a.ref, 2, (int64_t[]){cols, rows}, (int64_t[]){1, cols}, 0, NULL, &t,
                   &err) == 0 &&
        tport_to(c, &t.ref, &to, &f, NULL, &err) == 0 &&
        tport_to(c, &f.ref, &back_to, &f, NULL, &err) == 0 &&
        tport_get(c, &f.ref, back, n * 4, NULL, NULL, NULL, &err) == 0;
    for (int64_t i = 0; ok && i < rows; i++)
      for (int64_t j = 0; ok && j < cols; j++)
        ok = back[j * rows + i] == v[i * cols + j];
    if (!ok) {
      fprintf(stderr, "stress: thread %d round %d: %s\n", id, r, err.msg);
      atomic_fetch_add(&failures, 1);
    }
    if (!own)
      tport_free(c, &a.ref, NULL);
    free(v);
    free(back);
    if (own)
      tport_close(c); /* its tensors go with the connection */
  }
  return NULL;
}

int main(void)
{
  snprintf(url, sizeof url, "inproc://stress-%d", (int)getpid());
  server_config cfg;
  config_defaults(&cfg);
  cfg.listen[0] = strdup(url);
  cfg.nlisten = 1;
  cfg.devices = strdup("cpu,sim:2");
  cfg.chunk_bytes = 32 << 10;
  cfg.log_level = 0;
  server *s;
  tport_err err;
  if (server_start(&cfg, &s, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  if (tport_connect(url, NULL, &shared, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  pthread_t t[8];
  for (int i = 0; i < 8; i++)
    pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i);
  for (int i = 0; i < 8; i++)
    pthread_join(t[i], NULL);
  tport_close(shared);
  server_stop(s, 2000);
  config_free(&cfg);
  int f = atomic_load(&failures);
  printf("stress_service: 8 threads, %d failures\n", f);
  return f ? 1 : 0;
}
