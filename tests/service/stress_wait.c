/*
 * stress_wait.c: parked waits and replaces under load, as a plain program
 * for ThreadSanitizer (Criterion cannot run under it).  An in-process
 * server; a publisher replaces "s-latest" over and over and publishes
 * fresh names; four consumers get "s-latest" with a wait and wait for each
 * fresh name in turn (woken by the publisher's commits); two more wait on
 * names nobody publishes, with short waits whose timers race the wakes,
 * reconnecting as they go; one waits long and is answered by the server's
 * stop.  Exit status 0 when every get saw one whole version and every
 * wait ended as it should.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "server.h"
#include "tport.h"

#define VERSIONS 120
#define FRESH 30
#define ELEMS (64 << 10) /* 256 KiB: four chunks */

static char url[128];
static atomic_int failures, published_fresh;
static atomic_bool publishing_done;

static void fail(const char *what, const tport_err *err)
{
  fprintf(stderr, "stress_wait: %s: %s\n", what, err ? err->msg : "");
  atomic_fetch_add(&failures, 1);
}

static tport_client *connect_or_die(void)
{
  tport_client *c;
  tport_err err;
  if (tport_connect(url, NULL, &c, &err)) {
    fprintf(stderr, "connect: %s\n", err.msg);
    exit(1);
  }
  return c;
}

static void put_value(tport_client *c, const char *name, float value, bool replace)
{
  static _Thread_local float v[ELEMS];
  for (int i = 0; i < ELEMS; i++)
    v[i] = value;
  int64_t n = ELEMS;
  tport_put_options o;
  tport_put_options_init(&o);
  o.name = name;
  o.replace = replace;
  tport_tensor_info info;
  tport_err err;
  if (tport_put(c, TPORT_FLOAT32, 1, &n, NULL, v, sizeof v, &o, &info, &err))
    fail("put", &err);
}

static void *publisher(void *arg)
{
  (void)arg;
  tport_client *c = connect_or_die();
  for (int v = 1; v <= VERSIONS; v++) {
    put_value(c, "s-latest", (float)v, true);
    if (v % (VERSIONS / FRESH) == 0) {
      int k = atomic_load(&published_fresh);
      char name[32];
      snprintf(name, sizeof name, "s-fresh-%d", k);
      put_value(c, name, (float)k, false);
      atomic_store(&published_fresh, k + 1);
    }
  }
  atomic_store(&publishing_done, true);
  tport_close(c);
  return NULL;
}

static void *consumer(void *arg)
{
  (void)arg;
  tport_client *c = connect_or_die();
  static _Thread_local float v[ELEMS];
  tport_ref ref;
  tport_tensor_info info;
  tport_err err;
  for (int k = 0; k < FRESH; k++) {
    tport_ref_name(&ref, "s-latest");
    if (tport_get_wait(c, &ref, 20000, v, sizeof v, &info, &err))
      fail("get s-latest", &err);
    for (int i = 1; i < ELEMS; i++)
      if (v[i] != v[0]) {
        fail("a mixed tensor", NULL);
        break;
      }
    char name[32];
    snprintf(name, sizeof name, "s-fresh-%d", k);
    tport_ref_name(&ref, name);
    if (tport_info_wait(c, &ref, 20000, &info, &err))
      fail("wait for a fresh name", &err);
  }
  tport_close(c);
  return NULL;
}

/* Short waits on names nobody publishes: each ends DEADLINE_EXCEEDED, its
 * timer racing the publisher's wakes of other names. */
static void *idler(void *arg)
{
  int id = (int)(intptr_t)arg;
  while (!atomic_load(&publishing_done)) {
    tport_client *c = connect_or_die();
    for (int i = 0; i < 5; i++) {
      char name[32];
      snprintf(name, sizeof name, "s-never-%d-%d", id, i);
      tport_ref ref;
      tport_ref_name(&ref, name);
      tport_tensor_info info;
      tport_err err;
      int rc = tport_info_wait(c, &ref, 5 + (uint32_t)i * 7, &info, &err);
      if (rc != TPORT_DEADLINE_EXCEEDED)
        fail("a wait on a name nobody publishes", &err);
    }
    tport_close(c);
  }
  return NULL;
}

typedef struct {
  tport_client *c;
  int rc;
} long_wait;

static void *waits_long(void *arg)
{
  long_wait *w = arg;
  tport_ref ref;
  tport_ref_name(&ref, "s-never-long");
  tport_tensor_info info;
  tport_err err;
  w->rc = tport_info_wait(w->c, &ref, 30000, &info, &err);
  return NULL;
}

int main(void)
{
  snprintf(url, sizeof url, "inproc://stress-wait-%d", (int)getpid());
  server_config cfg;
  config_defaults(&cfg);
  cfg.listen[0] = strdup(url);
  cfg.nlisten = 1;
  cfg.devices = strdup("cpu,sim:2");
  cfg.chunk_bytes = 64 << 10;
  cfg.log_level = 0;
  server *s;
  tport_err err;
  if (server_start(&cfg, &s, &err)) {
    fprintf(stderr, "%s\n", err.msg);
    return 1;
  }
  long_wait lw = {.c = connect_or_die()};
  pthread_t t[8];
  pthread_create(&t[0], NULL, waits_long, &lw);
  pthread_create(&t[1], NULL, publisher, NULL);
  for (int i = 2; i < 6; i++)
    pthread_create(&t[i], NULL, consumer, NULL);
  for (int i = 6; i < 8; i++)
    pthread_create(&t[i], NULL, idler, (void *)(intptr_t)i);
  for (int i = 1; i < 8; i++)
    pthread_join(t[i], NULL);
  /* the long wait is still parked: the stop answers it */
  server_stop(s, 30000);
  pthread_join(t[0], NULL);
  if (lw.rc != TPORT_UNAVAILABLE)
    fail("the long wait at the server's stop", NULL);
  tport_close(lw.c);
  config_free(&cfg);
  int f = atomic_load(&failures);
  printf("stress_wait: a publisher, 4 consumers, 2 idlers, a long wait: %d failures\n", f);
  return f ? 1 : 0;
}
