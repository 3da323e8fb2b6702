/*
 * main.c: tportd.  Parses flags (and TPORT_* variables), starts the server,
 * and on SIGINT/SIGTERM stops accepting, finishes or aborts in-flight work
 * within the grace period, frees everything and exits 0.
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "log.h"
#include "server.h"

/* The last resort of a shutdown: server_stop waits for the requests that
 * are running (a conversion is bounded by --max-tensor but may take
 * seconds); past grace + 1.5 s the process ends anyway, so that an
 * orchestrator's SIGTERM always ends it in time. */
static unsigned long watchdog_ms;

static void *watchdog_main(void *arg)
{
  prctl(PR_SET_NAME, "tportd:watchdog"); /* what top -H, perf and gdb show */
  (void)arg;
  struct timespec ts = {.tv_sec = (time_t)(watchdog_ms / 1000),
                        .tv_nsec = (long)(watchdog_ms % 1000) * 1000000};
  while (nanosleep(&ts, &ts) != 0) {
  }
  log_msg(LOG_WARN, "requests still running %lu ms after the signal: exiting without them",
          watchdog_ms);
  _exit(0);
  return NULL;
}

int main(int argc, char **argv)
{
  server_config cfg;
  config_defaults(&cfg);
  tport_err err;
  int rc = config_parse(&cfg, argc, argv, &err);
  if (rc == 1) {
    config_free(&cfg);
    return 0;
  }
  if (rc) {
    fprintf(stderr, "tportd: %s\n", err.msg);
    config_free(&cfg);
    return 2;
  }
  log_set_level(cfg.log_level);
  log_set_format((log_format)cfg.log_format);
  /* Signals are taken synchronously by this thread: no handler runs in the
   * middle of engine or nng work. */
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  signal(SIGPIPE, SIG_IGN);
  server *s;
  if (server_start(&cfg, &s, &err)) {
    log_msg(LOG_ERROR, "%s", err.msg);
    config_free(&cfg);
    /* a value no flag takes (--devices gpu) is a usage error, as one that
     * config_parse finds; anything else failed (a port taken, no GPU) */
    return err.code == TPORT_INVALID_ARGUMENT ? 2 : 1;
  }
  log_event(LOG_INFO, "ready", "devices", cfg.devices ? cfg.devices : "cpu", "cuda",
            engine_cuda_unavailable_reason() ? engine_cuda_unavailable_reason() : "on", NULL);
  int sig = 0;
  /* SIGHUP reloads the auth file; SIGINT and SIGTERM stop */
  while (sigwait(&set, &sig) == 0 && sig == SIGHUP) {
    tport_err e;
    if (server_reload_auth(s, &e))
      log_msg(LOG_ERROR, "SIGHUP: %s (the previous auth file stays in force)", e.msg);
  }
  log_msg(LOG_INFO, "%s: stopping (grace %lu ms)", sig == SIGINT ? "SIGINT" : "SIGTERM",
          cfg.grace_ms);
  watchdog_ms = cfg.grace_ms + 1500;
  pthread_t wd;
  if (pthread_create(&wd, NULL, watchdog_main, NULL) == 0)
    pthread_detach(wd);
  server_stop(s, cfg.grace_ms);
  log_msg(LOG_INFO, "stopped");
  config_free(&cfg);
  return 0;
}
