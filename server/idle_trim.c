/* idle_trim.c: malloc_trim once per quiet spell (idle_trim.h). */
#include "idle_trim.h"

#include "engine.h"

#ifdef __GLIBC__
#include <malloc.h>
#endif

bool idle_trim_round(idle_trim *t, uint64_t activity)
{
  if (activity != t->last) {
    t->last = activity;
    t->trimmed = false;
    return false;
  }
  if (t->trimmed)
    return false;
  t->trimmed = true;
  engine_release_idle(); /* its small blocks back to malloc, to be trimmed */
#ifdef __GLIBC__
  malloc_trim(0);
  return true;
#else
  return false; /* another libc: its own policy */
#endif
}
