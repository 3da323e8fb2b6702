/*
 * process_util.h: helpers of the process-region suites (test_shm_process,
 * test_shm_process_stuck): tportd in the test's process, raw requests that
 * name a client's own memory, pages that fault in when the test serves them.
 */
#ifndef TPORT_PROCESS_UTIL_H
#define TPORT_PROCESS_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server_internal.h"
#include "tport.h"
#include "tport.pb-c.h"

#define CHUNK ((size_t)64 << 10)   /* svc_config's and svc_spawn's */
#define SPAN SHM_PROCESS_READ_SPAN /* a whole number of CHUNKs */

/* The shm socket's directory of the server start() made. */
extern char sock_dir[64];

/* tportd in this process with a shm socket (its url into url), and its stop. */
server *start(char *url, size_t len);
void stop(server *s);
/* A client of url (20 s timeout), verifying CRC32Cs where verify. */
tport_client *connect_with(const char *url, bool verify);
/* Skips the test where pidfd_open is missing (tportd takes no process
 * region there). */
void need_pidfd(void);
/* n bytes of a pattern of seed. */
void fill(uint8_t *p, size_t n, uint32_t seed);
/* Puts n bytes (opts may be NULL) and reads them back as they were put. */
void put_and_check(tport_client *c, size_t n, const tport_put_options *opts, uint32_t seed);
/* n bytes at v put as a uint8 tensor on device ("cpu", "sim:0"): its info. */
tport_tensor_info put_u8(tport_client *c, const uint8_t *v, size_t n, const char *device);

/* A raw PutBatch of n puts, each committed: from the slice (region, addr,
 * len), or, region 0, len bytes at addr in the payload; converted to int16
 * where convert; by name, replacing, where asked.  fence (NULL: none) and
 * token are the batch's fence.  Each element's status code into code[],
 * its ref into ref[] where OK. */
typedef struct raw_put {
  uint64_t region, addr, len;
  bool convert;
  const char *name;
  bool replace, managed;
} raw_put;

#define RAW(r, a, l)                                                                               \
  {                                                                                                \
    .region = (r), .addr = (a), .len = (l)                                                         \
  }
void batch_raw(tport_client *c, const raw_put *el, size_t n, const uint64_t *fence, uint64_t token,
               int *code, tport_ref *ref);

/* PutBegin of a tensor of n bytes, not committed: its ref into w/handle. */
void begin_put(tport_client *c, size_t n, Tport__Ref *w, uint8_t *handle);
/* The same, and c's process region: *mine. */
void begin_direct_put(tport_client *c, size_t n, Tport__Ref *w, uint8_t *handle, uint64_t *mine);
/* PutChunk at offset naming slice (region, addr, len), with payload bytes
 * if any: the status code. */
int chunk_raw(tport_client *c, const Tport__Ref *w, uint64_t offset, uint64_t region, uint64_t addr,
              uint64_t len, const void *payload, size_t plen);

/* n bytes of fresh memory under userfaultfd, whose pages nobody serves
 * until serve_pages: a read of them waits (skipped where userfaultfd is
 * not available). */
uint8_t *stuck_pages(size_t n, int *uffd);
/* Serves them (zeros): the reads waiting on them go on. */
void serve_pages(int uffd, uint8_t *area, size_t n);
/* The tensor ref holds n zero bytes. */
void expect_zeros(tport_client *c, const tport_ref *ref, size_t n);

/* A counter of tport_stats as tenant sees it. */
int64_t tenant_counter(const char *url, const char *tenant, const char *name);
/* Waits up to tries x 10 ms for tportd's counter name to read want. */
void wait_counter(const char *url, const char *name, int64_t want, int tries);
/* ... shm_process_stuck, past a read's 5 s deadline. */
void wait_stuck(const char *url, int64_t want);
/* The charges of tenant "stuck" given back, soon after its reads ended. */
void wait_charge_gone(const char *url);

#endif
