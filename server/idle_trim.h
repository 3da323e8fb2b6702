/*
 * idle_trim.h: the heap's free memory given back to the system once the
 * server has been idle for a reaper round.
 *
 * glibc keeps what a burst freed inside its arenas (one per busy thread):
 * only a free top above the trim threshold goes back on its own, and a
 * single live block above the freed ones pins all of them.  A tportd that
 * served a burst of puts and gets of small and mid-sized tensors (under
 * the host cache's 1 MiB) then held its peak resident memory while idle:
 * 70-90 MiB over its start after the chaos test (test_chaos's RSS check
 * failed under load).  malloc_trim(0) returns the free pages of every
 * arena; it takes each arena's lock while it walks it, so it runs only
 * when nothing happened for a round, once per quiet spell.  Before it the
 * engine gives back what it keeps for a busy server (engine_release_idle:
 * the small host blocks' cache, which keeps a burst's freed storages for
 * the next burst instead of malloc handing them back at once).
 */
#ifndef TPORT_IDLE_TRIM_H
#define TPORT_IDLE_TRIM_H

#include <stdbool.h>
#include <stdint.h>

typedef struct idle_trim {
  uint64_t last;  /* the activity seen last round */
  bool trimmed;   /* since activity last changed */
} idle_trim;

/* One reaper round: activity is a signature of what the server did
 * (requests, tensors and bytes held, sessions; any change counts as
 * activity).  Trims when it is the same as the round before and no trim
 * ran since it changed: true then. */
bool idle_trim_round(idle_trim *t, uint64_t activity);

#endif
