/*
 * stress_shm.c: same-host regions under load, as a plain program for
 * ThreadSanitizer (Criterion cannot run under it).  An in-process server
 * with a shm socket; six threads share one client's automatic region
 * (tport_put/tport_get of large tensors: the region is taken by one call at
 * a time, the others take the socket; their puts, more than a chunk, are
 * read by the server from the caller's buffer and their gets written into
 * it -- two at a time for the tenant, the others through the region or the
 * socket -- the connection's process region registered by whichever comes
 * first), four more create regions, put and
 * get through them and release them -- or close their connection with the
 * regions still registered while another thread of theirs is copying
 * through one (a disconnect must unmap a region only after the last copy).
 * Two more put and get tensors large enough for libtport's copy pool
 * (client/copy_pool.c), one on the shared client and one on its own: their
 * copies into and out of the regions run at once, one on the pool, the
 * other inline.  Two more put and get batches of small tensors on the
 * shared client: enough bytes that the server reads a put batch's from the
 * callers' buffers, a request's in one read (server/put_gather.c); a get
 * batch's deferred ones go through slots of its region when they take it
 * (client/batch_region.h), by the socket when another call has it.  One more puts from pages under userfaultfd that are served only
 * after the server's worker gave its read up (regions_process.c): the
 * read's thread ends beside the others' work.  Exit status 0 when every
 * byte came back right.
 */
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "regions.h"
#include "server.h"
#include "server_internal.h"
#include "tport.h"

static char url[128];
static atomic_int failures;
static tport_client *shared;

static void fail(const char *what, const tport_err *err)
{
  fprintf(stderr, "stress_shm: %s: %s\n", what, err ? err->msg : "");
  atomic_fetch_add(&failures, 1);
}

/* Large puts and gets on the shared client: its one region, or the socket. */
static void *auto_worker(void *arg)
{
  int id = (int)(intptr_t)arg;
  size_t n = ((size_t)256 << 10) + (size_t)id * 4096;
  uint8_t *v = malloc(n), *back = malloc(n);
  for (int r = 0; r < 30; r++) {
    for (size_t i = 0; i < n; i++)
      v[i] = (uint8_t)(i * 13 + (size_t)id + (size_t)r);
    int64_t sz = (int64_t)n;
    tport_tensor_info info;
    tport_err err;
    if (tport_put(shared, TPORT_UINT8, 1, &sz, NULL, v, n, NULL, &info, &err)) {
      fail("put", &err);
      continue;
    }
    memset(back, 0, n);
    if (tport_get(shared, &info.ref, back, n, NULL, NULL, NULL, &err))
      fail("get", &err);
    else if (memcmp(v, back, n))
      fail("auto: bytes differ", NULL);
    tport_free(shared, &info.ref, NULL);
  }
  free(v);
  free(back);
  return NULL;
}

/* Tensors past the copy pool's threshold (4 MiB), by the shared client
 * (arg 0) or one of its own (1). */
static void *pool_worker(void *arg)
{
  int own = (int)(intptr_t)arg;
  tport_client *c = shared;
  tport_err err;
  if (own && tport_connect(url, NULL, &c, &err)) {
    fail("connect", &err);
    return NULL;
  }
  size_t n = ((size_t)6 << 20) + (size_t)own * 4097;
  uint8_t *v = malloc(n), *back = malloc(n);
  for (int r = 0; r < 8; r++) {
    for (size_t i = 0; i < n; i++)
      v[i] = (uint8_t)(i * 7 + (i >> 12) + (size_t)own + (size_t)r);
    int64_t sz = (int64_t)n;
    tport_tensor_info info;
    if (tport_put(c, TPORT_UINT8, 1, &sz, NULL, v, n, NULL, &info, &err)) {
      fail("pool put", &err);
      continue;
    }
    memset(back, 0, n);
    if (tport_get(c, &info.ref, back, n, NULL, NULL, NULL, &err))
      fail("pool get", &err);
    else if (memcmp(v, back, n))
      fail("pool: bytes differ", NULL);
    tport_free(c, &info.ref, NULL);
  }
  free(v);
  free(back);
  if (own)
    tport_close(c);
  return NULL;
}

/* Batches of 100 tensors on the shared client, 4 KiB each but every 25th
 * of five chunks and a bit: put (the large ones read by the server from
 * this process's memory, in chunks through the batch's window), then got
 * back into buffers of this process (the large ones written there by the
 * server, a GetBatch's together; the small ones inline). */
static void *batch_worker(void *arg)
{
  enum { N = 100, EACH = 4096, LARGE = 5 * 65536 + 100 }; /* past 256 KiB */
  int id = (int)(intptr_t)arg;
  size_t total = (size_t)(N - N / 25) * EACH + (size_t)(N / 25) * LARGE;
  uint8_t *v = malloc(total), *back = malloc(total);
  tport_put_item *puts = calloc(N, sizeof *puts);
  tport_get_item *gets = calloc(N, sizeof *gets);
  int64_t sz[N];
  for (int r = 0; r < 20; r++) {
    for (size_t i = 0; i < total; i++)
      v[i] = (uint8_t)(i * 5 + (i >> 12) + (size_t)id + (size_t)r);
    size_t off = 0;
    for (int i = 0; i < N; i++) {
      size_t n = i % 25 == 0 ? LARGE : EACH;
      sz[i] = (int64_t)n;
      puts[i] = (tport_put_item){
          .dtype = TPORT_UINT8, .ndim = 1, .sizes = &sz[i], .data = v + off, .nbytes = n};
      off += n;
    }
    tport_err err;
    if (tport_put_batch(shared, puts, N, &err)) {
      fail("put_batch", &err);
      continue;
    }
    memset(back, 0, total);
    off = 0;
    for (int i = 0; i < N; i++) {
      gets[i] = (tport_get_item){.ref = puts[i].info.ref, .buf = back + off, .cap = puts[i].nbytes};
      off += puts[i].nbytes;
    }
    if (tport_get_batch(shared, gets, N, &err))
      fail("get_batch", &err);
    else if (memcmp(v, back, total))
      fail("batch: bytes differ", NULL);
    for (int i = 0; i < N; i++)
      tport_free(shared, &puts[i].info.ref, NULL);
  }
  free(v), free(back), free(puts), free(gets);
  return NULL;
}

typedef struct owner {
  tport_client *c;
  tport_shm *r;
  atomic_bool go;
} owner;

/* Copies through the owner's region until its connection goes. */
static void *copier(void *arg)
{
  owner *o = arg;
  int64_t sz = 1 << 20;
  while (atomic_load(&o->go)) {
    tport_tensor_info info;
    if (tport_put_shm(o->c, o->r, 0, TPORT_FLOAT32, 1, (int64_t[]){sz / 4}, NULL, NULL, &info,
                      NULL) == 0)
      tport_get_shm(o->c, &info.ref, o->r, (size_t)sz, (size_t)sz, NULL, NULL, NULL);
  }
  return NULL;
}

static void *region_worker(void *arg)
{
  int id = (int)(intptr_t)arg;
  for (int r = 0; r < 24; r++) {
    tport_client *c;
    tport_err err;
    if (tport_connect(url, &(tport_connect_options){.tenant = id % 2 ? "a" : "b"}, &c, &err)) {
      fail("connect", &err);
      continue;
    }
    tport_shm *reg;
    size_t n = (size_t)2 << 20;
    if (tport_shm_create(c, n, &reg, &err)) {
      fail("create", &err);
      tport_close(c);
      continue;
    }
    float *x = tport_shm_data(reg);
    for (size_t i = 0; i < n / 8; i++)
      x[i] = (float)(i + (size_t)r);
    if (r % 3 == 2) {
      /* the connection goes while another thread copies through its region */
      owner o = {.c = c, .r = reg};
      atomic_init(&o.go, true);
      pthread_t th;
      pthread_create(&th, NULL, copier, &o);
      usleep(2000);
      atomic_store(&o.go, false);
      pthread_join(th, NULL);
      tport_close(c); /* the region goes with the connection, on both sides */
      continue;
    }
    tport_put_options po;
    tport_put_options_init(&po);
    po.device = r % 2 ? "sim:0" : "cpu";
    po.has_dtype = true;
    po.dtype = TPORT_FLOAT64;
    tport_tensor_info info;
    int64_t rows = (int64_t)(n / 16 / 64); /* n/4 bytes of float32: n/2 as float64 */
    if (tport_put_shm(c, reg, 0, TPORT_FLOAT32, 2, (int64_t[]){rows, 64}, NULL, &po, &info, &err)) {
      fail("put_shm", &err);
    } else {
      size_t got = 0;
      double *y = (double *)((uint8_t *)tport_shm_data(reg) + n / 2);
      if (tport_get_shm(c, &info.ref, reg, n / 2, n / 2, NULL, &got, &err))
        fail("get_shm", &err);
      else
        for (size_t i = 0; i < got / 8; i++)
          if (y[i] != (double)(float)(i + (size_t)r)) {
            fail("shm: values differ", NULL);
            break;
          }
    }
    if (tport_shm_release(reg, &err))
      fail("release", &err);
    tport_close(c);
  }
  return NULL;
}

/* Pages under userfaultfd, served by serve_later. */
typedef struct stuck_pages {
  int uffd;
  uint8_t *area;
  size_t n;
} stuck_pages;

/* Serves them 7 s on: past the worker's deadline for the read (5 s). */
static void *serve_later(void *arg)
{
  stuck_pages *sa = arg;
  sleep(7);
  struct uffdio_zeropage zp = {.range = {(uintptr_t)sa->area, sa->n}, .mode = 0};
  ioctl(sa->uffd, UFFDIO_ZEROPAGE, &zp);
  struct uffdio_range all = {(uintptr_t)sa->area, sa->n};
  ioctl(sa->uffd, UFFDIO_WAKE, &all);
  return NULL;
}

/* A put from pages that no one serves for a while (userfaultfd): the
 * server's read of them is given up by its worker after its deadline and
 * ends on its own thread once the pages come, beside the others' work.
 * Its own result does not count (given up, or put once the pages came). */
static void *stuck_worker(void *arg)
{
  (void)arg;
  int uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC);
  size_t n = (size_t)4 << 16;
  uint8_t *area = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  struct uffdio_api api = {.api = UFFD_API};
  struct uffdio_register reg = {.range = {(uintptr_t)area, n},
                                .mode = UFFDIO_REGISTER_MODE_MISSING};
  if (uffd < 0 || area == MAP_FAILED || ioctl(uffd, UFFDIO_API, &api) ||
      ioctl(uffd, UFFDIO_REGISTER, &reg)) {
    fprintf(stderr, "stress_shm: no userfaultfd here: the stuck read is not tried\n");
    return NULL;
  }
  pthread_t th;
  stuck_pages sa = {uffd, area, n};
  pthread_create(&th, NULL, serve_later, &sa);
  tport_client *c;
  tport_err err;
  if (tport_connect(url, &(tport_connect_options){.tenant = "stuck"}, &c, &err) == 0) {
    int64_t sz = (int64_t)n;
    tport_tensor_info info;
    tport_put(c, TPORT_UINT8, 1, &sz, NULL, area, n, NULL, &info, &err);
    tport_close(c);
  } else {
    fail("connect", &err);
  }
  pthread_join(th, NULL);
  close(uffd);
  munmap(area, n);
  return NULL;
}

int main(void)
{
  snprintf(url, sizeof url, "inproc://stress-shm-%d", (int)getpid());
  char sock[128];
  snprintf(sock, sizeof sock, "/tmp/tport-stress-shm-%d/shm.sock", (int)getpid());
  server_config cfg;
  config_defaults(&cfg);
  cfg.listen[0] = strdup(url);
  cfg.nlisten = 1;
  cfg.devices = strdup("cpu,sim:2");
  cfg.chunk_bytes = 64 << 10;
  cfg.log_level = 0;
  cfg.shm_socket = strdup(sock);
  cfg.shm_socket_set = true;
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
  pthread_t t[15];
  for (int i = 0; i < 6; i++)
    pthread_create(&t[i], NULL, auto_worker, (void *)(intptr_t)i);
  for (int i = 6; i < 10; i++)
    pthread_create(&t[i], NULL, region_worker, (void *)(intptr_t)i);
  for (int i = 10; i < 12; i++)
    pthread_create(&t[i], NULL, pool_worker, (void *)(intptr_t)(i - 10));
  for (int i = 12; i < 14; i++)
    pthread_create(&t[i], NULL, batch_worker, (void *)(intptr_t)i);
  pthread_create(&t[14], NULL, stuck_worker, NULL);
  for (int i = 0; i < 15; i++)
    pthread_join(t[i], NULL);
  tport_close(shared);
  shm_stats ss;
  shm_get_stats(s->shm, &ss);
  if (ss.process_writes == 0) /* the batches' large elements, at least */
    fail("no get was written into a client's memory", NULL);
  server_stop(s, 2000);
  config_free(&cfg);
  char dir[128];
  snprintf(dir, sizeof dir, "/tmp/tport-stress-shm-%d", (int)getpid());
  rmdir(dir);
  int f = atomic_load(&failures);
  printf("stress_shm: 15 threads, %d failures\n", f);
  return f ? 1 : 0;
}
