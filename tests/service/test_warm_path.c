/*
 * test_warm_path.c: once warm, a put and a get of a large tensor fault in no
 * fresh memory.
 *
 * A put's chunks arrive in nng messages and a get's leave in them; every
 * 4 MiB message body used to be fresh pages from malloc (glibc maps blocks
 * that large, or trims its heap when they are freed), so each transfer
 * faulted in as many pages as it moved, twice over -- on a VM, where a
 * fault can cost ~20 us, a 16 MiB put ran at a tenth of its speed.  Our nng
 * (deploy/nng/0007, the message-body cache) keeps large bodies for reuse, and
 * tensors come from the host cache (engine/host_cache.c).  This counts the
 * process's minor page faults (server and client share it) over warm
 * round trips of 16 MiB in 4 MiB chunks over tcp and ipc, and fails when
 * they come near the number of pages moved: a count, not a time.
 *
 * Under AddressSanitizer or ThreadSanitizer the allocator is theirs, and the
 * ASan runs turn nng's body cache off (so that a use after free of a body
 * is still caught): the test skips there.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "service_util.h"

enum { MIB = 1 << 20, SIZE = 16 * MIB, WARM = 3, MEASURED = 8 };

static long minor_faults(void)
{
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

/* WARM round trips, then the minor faults of MEASURED more */
static long faults_of_round_trips(const char *url, uint8_t *src, uint8_t *back)
{
  tport_client *c = svc_connect(url, NULL);
  int64_t size = SIZE;
  long before = 0;
  for (int i = 0; i < WARM + MEASURED; i++) {
    if (i == WARM)
      before = minor_faults();
    tport_tensor_info info;
    tport_err err;
    cr_assert_eq(tport_put(c, TPORT_UINT8, 1, &size, NULL, src, SIZE, NULL, &info, &err), 0, "%s",
                 err.msg);
    cr_assert_eq(tport_get(c, &info.ref, back, SIZE, NULL, NULL, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(tport_free(c, &info.ref, &err), 0, "%s", err.msg);
  }
  long faults = minor_faults() - before;
  cr_assert_eq(memcmp(src, back, SIZE), 0, "the tensor came back changed");
  tport_close(c);
  return faults;
}

static void configure(server_config *cfg)
{
  svc_config(cfg);
  cfg->chunk_bytes = 4 * MIB; /* tportd's default */
}

Test(warm_path, a_warm_put_and_get_fault_in_no_fresh_pages)
{
#ifdef SVC_UNDER_SANITIZER
  cr_skip_test("the sanitizer's allocator, not glibc's, and no body cache under ASan");
#endif
  char tcp[64], ipc[96];
  server *s = svc_start_tcp_ipc(configure, tcp, sizeof tcp, ipc, sizeof ipc);
  cr_assert_not_null(s, "no server could listen");
  /* touched up front: their first-touch faults are not the data path's */
  uint8_t *src = malloc(SIZE), *back = malloc(SIZE);
  cr_assert(src && back);
  for (size_t i = 0; i < SIZE; i++)
    src[i] = (uint8_t)(i * 131 + 7);
  memset(back, 0xee, SIZE);
  setenv("TPORT_SHM", "0", 1); /* the socket path: no same-host region on ipc */
  const long pages_moved = (long)MEASURED * 2 * SIZE / 4096;
  const char *urls[] = {tcp, ipc};
  for (int u = 0; u < 2; u++) {
    long faults = faults_of_round_trips(urls[u], src, back);
    cr_log_info("%s: %ld minor faults over %d warm round trips of 16 MiB (%ld pages moved)",
                urls[u], faults, MEASURED, pages_moved);
    /* before the body cache: about one fault per page moved */
    cr_expect_lt(faults, pages_moved / 16,
                 "%s: %ld minor faults over %d warm round trips of 16 MiB, %ld pages moved: the "
                 "data path faults in fresh memory for each transfer",
                 urls[u], faults, MEASURED, pages_moved);
  }
  free(src);
  free(back);
  server_stop(s, 1000);
}
