/* test_random_ids.c: tportd's ids (tensor handles, transfer ids) come from
 * a buffer of CSPRNG bytes per thread: never the same id twice, across
 * threads and refills, and a forked child never repeats its parent's next
 * ids (it starts with an empty buffer). */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "random_ids.h"

#define ID_BYTES 16
#define PER_THREAD 1000 /* ~4 refills of a 4 KiB buffer each */
#define THREADS 4

static uint8_t ids[THREADS][PER_THREAD][ID_BYTES];

static void *draw(void *arg)
{
  uint8_t(*mine)[ID_BYTES] = arg;
  for (int i = 0; i < PER_THREAD; i++)
    if (!random_ids(mine[i], ID_BYTES))
      return (void *)1;
  return NULL;
}

static int cmp_id(const void *a, const void *b)
{
  return memcmp(a, b, ID_BYTES);
}

Test(random_ids, never_the_same_id_across_threads_and_refills)
{
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, draw, ids[i]), 0);
  for (int i = 0; i < THREADS; i++) {
    void *failed;
    pthread_join(t[i], &failed);
    cr_assert_null(failed, "the CSPRNG failed");
  }
  const uint8_t *all = &ids[0][0][0]; /* every thread's ids, one after another */
  qsort(ids, THREADS * PER_THREAD, ID_BYTES, cmp_id);
  for (int i = 1; i < THREADS * PER_THREAD; i++)
    cr_assert_neq(memcmp(all + (size_t)(i - 1) * ID_BYTES, all + (size_t)i * ID_BYTES, ID_BYTES),
                  0, "id %d repeats", i);
  /* and not all zero: the bytes are the generator's */
  static const uint8_t zero[ID_BYTES];
  cr_assert_neq(memcmp(all, zero, ID_BYTES), 0);
}

Test(random_ids, a_forked_child_does_not_repeat_its_parents_next_ids)
{
  uint8_t first[ID_BYTES], parent_next[ID_BYTES], child_next[ID_BYTES];
  cr_assert(random_ids(first, ID_BYTES)); /* the buffer now holds the next ids */
  int fd[2];
  cr_assert_eq(pipe(fd), 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    uint8_t id[ID_BYTES];
    bool ok = random_ids(id, ID_BYTES);
    ssize_t w = ok ? write(fd[1], id, sizeof id) : -1;
    _exit(w == (ssize_t)sizeof id ? 0 : 1);
  }
  close(fd[1]);
  cr_assert_eq(read(fd[0], child_next, sizeof child_next), (ssize_t)sizeof child_next);
  close(fd[0]);
  int status;
  cr_assert_eq(waitpid(pid, &status, 0), pid);
  cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  cr_assert(random_ids(parent_next, ID_BYTES));
  cr_assert_neq(memcmp(parent_next, child_next, ID_BYTES), 0,
                "the child handed out its parent's next id");
}

Test(random_ids, a_large_draw_goes_to_the_generator_directly)
{
  uint8_t a[8192], b[8192];
  cr_assert(random_ids(a, sizeof a));
  cr_assert(random_ids(b, sizeof b));
  cr_assert_neq(memcmp(a, b, sizeof a), 0);
}
