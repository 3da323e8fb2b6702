/* test_idle_trim.c: a tportd that served a burst gives the memory it freed
 * back to the system once idle (server/idle_trim.c).
 *
 * The burst: 400 tensors of 300 KiB (under the host cache's 1 MiB: malloc's
 * heap), then all but every eighth freed.  The survivors pin the freed
 * blocks between them, so glibc keeps ~100 MiB that nobody uses: before the
 * idle trim, tportd's resident memory stayed there for as long as it was
 * idle. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "service_util.h"

#define N 400
#define BYTES ((size_t)300 << 10)

Test(idle_trim, memory_freed_by_a_burst_goes_back_once_idle, .timeout = 120)
{
#ifdef SVC_UNDER_SANITIZER
  cr_skip_test("the sanitizer's allocator, not glibc's: its quarantine keeps what is freed");
#endif
  char url[64];
  pid_t pid = -1;
  for (int tries = 0; tries < 5 && pid < 0; tries++) {
    svc_tcp_url(url, sizeof url);
    pid = svc_spawn(url, NULL);
  }
  cr_assert_gt(pid, 0, "tportd did not start");
  tport_client *c = svc_connect(url, "trim");
  uint8_t *data = malloc(BYTES);
  memset(data, 0x5a, BYTES);
  int64_t sz = (int64_t)BYTES;
  tport_err err;
  tport_tensor_info *info = calloc(N, sizeof *info);
  /* one put and free first: glibc's mmap threshold rises past 300 KiB, so
   * that the burst comes from its heap (as a busy server's does) */
  cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &sz, NULL, data, BYTES, NULL, &info[0], &err), 0,
               "%s", err.msg);
  cr_assert_eq(tport_free(c, &info[0].ref, &err), 0, "%s", err.msg);
  sleep(3); /* idle: whatever start-up left is trimmed before the baseline */
  long base = svc_rss_kb(pid);
  for (int i = 0; i < N; i++)
    cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &sz, NULL, data, BYTES, NULL, &info[i], &err), 0,
                 "put %d: %s", i, err.msg);
  long peak = svc_rss_kb(pid);
  for (int i = 0; i < N; i++)
    if (i % 8)
      cr_assert_eq(tport_free(c, &info[i].ref, &err), 0, "%s", err.msg);
  /* 50 tensors (15 MB) live; within 10 s of quiet the rest must go back */
  long rss = svc_rss_kb(pid), want = base + 40 * 1024;
  for (int tries = 0; tries < 100 && rss > want; tries++) {
    usleep(100000);
    rss = svc_rss_kb(pid);
  }
  cr_log_info("idle_trim: RSS %ld KiB at the start, %ld at the peak, %ld once idle", base, peak,
              rss);
  cr_expect_gt(peak, base + 100 * 1024, "the burst did not show in RSS (%ld -> %ld KiB)", base,
               peak);
  cr_expect_leq(rss, want,
                "tportd's RSS stays at %ld KiB, %ld KiB over its %ld before the burst (peak %ld), "
                "with 15 MB of tensors live",
                rss, rss - base, base, peak);
  tport_close(c);
  free(info);
  free(data);
  cr_expect_eq(svc_terminate(pid), 0);
}
