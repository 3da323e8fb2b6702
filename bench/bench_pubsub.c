/*
 * bench_pubsub.c: a producer and a consumer of named batches in two
 * processes, against one process that puts and gets the same batches.
 *
 * tportd runs in a process of its own (cpu device, no shm socket: the
 * batches ride the socket) on ipc:// and tcp://127.0.0.1.  A batch is
 * MiB MiB of float32 whose first element is its number.
 *  - pipeline: the producer puts batch i under the name "batch-(i % 2)"
 *    with replace; the consumer waits for that name (Info with wait_ms: it
 *    waits on the server, no polling), gets it by name, checks its number
 *    and frees it.  The producer runs at most two batches ahead (a credit
 *    the consumer hands back over a pipe after each batch: bookkeeping of
 *    the benchmark, not of the data path), so no batch is replaced unread.
 *  - baseline: one process puts each batch (by name, with replace), gets
 *    it back by name and frees it, one after the other.
 * Both start when their processes are connected and end when the last
 * batch has been got; rounds alternate (baseline, pipeline), medians.
 * Rows: pubsub_<transport>_<MiB>MiB_vs_one_process, GB/s of batches
 * consumed, the ratio pipeline / baseline (target: >= 0.8).
 *
 *   tport-bench-pubsub --tportd EXE [--rounds R] [--batches N] [--mib M]
 */
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "tport.h"

extern char **environ;

static int nbatches = 16;
static size_t batch_bytes = (size_t)16 << 20;

static void die(const char *what, const tport_err *err)
{
  fprintf(stderr, "bench_pubsub: %s: %s\n", what, err ? err->msg : "");
  exit(1);
}

/* Connects, retrying while tportd starts. */
static tport_client *connect_to(const char *url)
{
  tport_connect_options o = {.timeout_ms = 60000, .no_shm = true};
  tport_err err;
  for (int i = 0; i < 200; i++) {
    tport_client *c;
    if (tport_connect(url, &o, &c, &err) == 0)
      return c;
    usleep(50000);
  }
  die("connect", &err);
  return NULL;
}

static void put_batch(tport_client *c, float *v, int i)
{
  v[0] = (float)i;
  int64_t n = (int64_t)(batch_bytes / sizeof *v);
  char name[32];
  snprintf(name, sizeof name, "batch-%d", i % 2);
  tport_put_options o;
  tport_put_options_init(&o);
  o.name = name;
  o.replace = true;
  tport_tensor_info info;
  tport_err err;
  if (tport_put(c, TPORT_FLOAT32, 1, &n, NULL, v, batch_bytes, &o, &info, &err))
    die("put", &err);
}

/* Waits for batch i (wait_ms: 0 in the one process, where it is there),
 * gets it by name, checks its number and frees it. */
static void take_batch(tport_client *c, float *v, int i, uint32_t wait_ms)
{
  char name[32];
  snprintf(name, sizeof name, "batch-%d", i % 2);
  tport_ref ref;
  tport_ref_name(&ref, name);
  tport_tensor_info info;
  tport_err err;
  if (tport_get_wait(c, &ref, wait_ms, v, batch_bytes, &info, &err))
    die("get", &err);
  if (v[0] != (float)i) {
    fprintf(stderr, "bench_pubsub: batch %d came as %g\n", i, v[0]);
    exit(1);
  }
  if (tport_free(c, &info.ref, &err))
    die("free", &err);
}

/* A process of the round: ready on `ready`, started by `go`, done on
 * `ready` again. */
typedef enum { ONE_PROCESS, PRODUCER, CONSUMER } role;

static void run_role(role r, const char *url, int ready, int go, int credit_in, int credit_out)
{
  tport_client *c = connect_to(url);
  float *v = calloc(batch_bytes / sizeof(float), sizeof(float));
  if (!v)
    die("out of memory", NULL);
  char b = 1;
  if (write(ready, &b, 1) != 1 || read(go, &b, 1) != 1)
    die("the round's pipes", NULL);
  for (int i = 0; i < nbatches; i++) {
    if (r == ONE_PROCESS) {
      put_batch(c, v, i);
      take_batch(c, v, i, 0);
    } else if (r == PRODUCER) {
      if (i >= 2 && read(credit_in, &b, 1) != 1)
        die("credit", NULL);
      put_batch(c, v, i);
    } else {
      take_batch(c, v, i, 30000);
      if (write(credit_out, &b, 1) != 1)
        die("credit", NULL);
    }
  }
  if (r != PRODUCER && write(ready, &b, 1) != 1)
    die("done", NULL);
  free(v);
  tport_close(c);
  _exit(0);
}

/* One round: its processes forked (nng is started in none of this one's),
 * released together; seconds until the last batch was got. */
static double round_of(bool pipeline, const char *url)
{
  int ready[2], go[2], credit[2];
  if (pipe(ready) || pipe(go) || pipe(credit))
    die("pipe", NULL);
  int nproc = pipeline ? 2 : 1;
  pid_t pids[2];
  for (int k = 0; k < nproc; k++) {
    role r = !pipeline ? ONE_PROCESS : k == 0 ? PRODUCER : CONSUMER;
    if ((pids[k] = fork()) == 0)
      run_role(r, url, ready[1], go[0], credit[0], credit[1]);
  }
  char b = 1;
  for (int k = 0; k < nproc; k++)
    if (read(ready[0], &b, 1) != 1)
      die("a process of the round died", NULL);
  double t0 = bench_now();
  for (int k = 0; k < nproc; k++)
    if (write(go[1], &b, 1) != 1)
      die("go", NULL);
  if (read(ready[0], &b, 1) != 1)
    die("a process of the round died", NULL);
  double dt = bench_now() - t0;
  for (int k = 0; k < nproc; k++) {
    int st;
    waitpid(pids[k], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st))
      die("a process of the round failed", NULL);
  }
  close(ready[0]), close(ready[1]), close(go[0]), close(go[1]);
  close(credit[0]), close(credit[1]);
  return dt;
}

static pid_t spawn_tportd(const char *exe, const char *ipc, const char *tcp)
{
  char *argv[] = {(char *)exe, "--listen", (char *)ipc,   "--listen", (char *)tcp,
                  "--devices", "cpu",      "--log-level", "1",        NULL};
  setenv("TPORT_SHM_SOCKET", "off", 1);
  setenv("TPORT_HTTP_LISTEN", "off", 1);
  pid_t pid;
  if (posix_spawn(&pid, exe, NULL, NULL, argv, environ))
    die("spawn tportd", NULL);
  return pid;
}

int main(int argc, char **argv)
{
  const char *tportd = NULL;
  int rounds = 5, mib = 16;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--tportd"))
      tportd = argv[i + 1];
    else if (!strcmp(argv[i], "--rounds"))
      rounds = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--batches"))
      nbatches = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--mib"))
      mib = atoi(argv[i + 1]);
  }
  if (!tportd || rounds < 1 || rounds > 100 || nbatches < 2 || mib < 1 || mib > 1024) {
    fprintf(stderr, "usage: tport-bench-pubsub --tportd EXE [--rounds R] [--batches N] "
                    "[--mib M]\n");
    return 2;
  }
  batch_bytes = (size_t)mib << 20;
  char ipc[128], tcp[64];
  snprintf(ipc, sizeof ipc, "ipc:///tmp/tport-bench-pubsub-%d.sock", (int)getpid());
  snprintf(tcp, sizeof tcp, "tcp://127.0.0.1:%d", 20000 + (int)getpid() % 20000);
  pid_t server = spawn_tportd(tportd, ipc, tcp);
  const char *urls[2] = {ipc, tcp}, *names[2] = {"ipc", "tcp"};
  for (int u = 0; u < 2; u++) {
    double one[100], two[100];
    for (int r = 0; r < rounds; r++) {
      one[r] = round_of(false, urls[u]);
      two[r] = round_of(true, urls[u]);
    }
    double bytes = (double)batch_bytes * nbatches;
    double base = bytes / bench_median(one, rounds) / 1e9;
    double pipe_gbs = bytes / bench_median(two, rounds) / 1e9;
    printf("{\"bench\": \"pubsub_%s_%dMiB_vs_one_process\", \"value\": %.4f, \"unit\": \"GB/s\", "
           "\"baseline\": %.4f, \"ratio\": %.4f, \"baseline_name\": \"one_process\", "
           "\"batches\": %d, \"rounds\": %d}\n",
           names[u], mib, pipe_gbs, base, pipe_gbs / base, nbatches, rounds);
    fflush(stdout);
  }
  kill(server, SIGTERM);
  waitpid(server, NULL, 0);
  return 0;
}
