/*
 * random_ids.c: each worker draws 4 KiB of RAND_bytes at a time and hands
 * ids out of it.  RAND_bytes costs ~1.9 us per call on a VM (OpenSSL 3
 * checks getpid -- a system call -- and takes its generator's lock every
 * time): 14% of tportd's time in a batch of 10,000 small puts, one handle
 * each.  The bytes are the same CSPRNG's; a byte handed out is wiped from
 * the buffer, so what stays in memory is only what no one has seen yet
 * (as the generator's own state is), and a worker wipes the rest as it
 * ends.  A forked child's one thread starts with an empty buffer, never
 * handing out its parent's next ids (the other threads' buffers are copied
 * into the child too, as all of a process's memory is, but no thread of the
 * child ever reads them).
 */
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <pthread.h>
#include <string.h>

#include "random_ids.h"

#define POOL_BYTES 4096

static _Thread_local unsigned char pool[POOL_BYTES];
static _Thread_local size_t pool_left;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* The child has only the thread that forked: its buffer is the one left. */
static void forget_in_child(void)
{
  OPENSSL_cleanse(pool, sizeof pool);
  pool_left = 0;
}

static void register_atfork(void)
{
  pthread_atfork(NULL, NULL, forget_in_child);
}

bool random_ids(void *out, size_t n)
{
  pthread_once(&atfork_once, register_atfork);
  if (n > POOL_BYTES / 4)
    return RAND_bytes(out, (int)n) == 1;
  if (pool_left < n) {
    if (RAND_bytes(pool, POOL_BYTES) != 1) {
      pool_left = 0;
      return false;
    }
    pool_left = POOL_BYTES;
  }
  unsigned char *from = pool + (POOL_BYTES - pool_left);
  memcpy(out, from, n);
  OPENSSL_cleanse(from, n);
  pool_left -= n;
  return true;
}

void random_ids_thread_end(void)
{
  OPENSSL_cleanse(pool, sizeof pool);
  pool_left = 0;
}
