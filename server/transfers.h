/*
 * transfers.h: the gets in progress.
 *
 * A get serves a tensor's values in logical C order in byte ranges
 * (GetChunk) after GetBegin: from host memory (the tensor, or a copy made
 * contiguous), or read back from a device a chunk at a time (readback.h).
 * A transfer belongs to the connection that began it: it counts against
 * that connection's limit of gets in progress; the copy it holds and the
 * blocks it reads back into are charged to its tenant's quota for as long
 * as they live (the replies they are lent to may outlive the transfer:
 * wire_charge_lend_begin).  It ends once every byte was served, when it
 * has not been read from for the idle timeout, or with its connection.  Transfers are found by their 128-bit
 * random id in a hash table; each connection's are listed apart (a
 * connection's end walks its own), and all of them by when they were last
 * read from (the idle ones are at the front): under the lock every GetChunk
 * takes, nothing walks what other connections hold.
 */
#ifndef TPORT_TRANSFERS_H
#define TPORT_TRANSFERS_H

#include <pthread.h>
#include <uthash.h>

#include "readback.h"
#include "registry.h"

#define TRANSFER_ID_BYTES 16

typedef struct get_transfer {
  uint8_t id[TRANSFER_ID_BYTES];
  uint32_t pipe;
  tensor_reader *reader; /* the values, a chunk at a time (the engine's: readback.h) */
  bool from_device;      /* read back from a device (else the host's memory) */
  size_t nbytes;
  size_t chunk;  /* the most one GetChunk may ask for */
  size_t served; /* bytes sent; the transfer ends when all were */
  /* what it costs its tenant (reg_transfer_enter) */
  struct reg_tenant *tn;
  size_t charged;
  int64_t last_ms; /* monotonic: when it was last read from */
  int refs;        /* the table's (while listed) plus one per chunk being served */
  bool listed;
  UT_hash_handle hh;
  struct get_transfer *idle_prev, *idle_next; /* all listed, least recently read first */
  struct get_transfer *pipe_prev, *pipe_next; /* its connection's */
  struct transfer_pipe *owner;
} get_transfer;

/* A connection's transfers (while it has some). */
typedef struct transfer_pipe {
  uint32_t pipe;
  get_transfer *list;
  UT_hash_handle hh;
} transfer_pipe;

typedef struct transfers {
  pthread_mutex_t mu;
  registry *reg;
  get_transfer *by_id;
  transfer_pipe *by_pipe;
  get_transfer *idle_head, *idle_tail;
  uint64_t count;
  uint64_t walked; /* transfers the drops and expiries looked at, ever (tests) */
} transfers;

void transfers_init(transfers *ts, registry *reg);
/* Ends every transfer (the server is stopping). */
void transfers_destroy(transfers *ts);

/* Counts a new transfer of g->pipe that will hold `charge` bytes against the
 * connection's and its tenant's limits (g->tn, g->charged are set). */
int transfers_reserve(transfers *ts, get_transfer *g, size_t charge, tport_err *err);
/* Lists g (its id must be set) if its connection still lives; ABORTED
 * otherwise (then the caller frees it with transfers_free). */
int transfers_insert(transfers *ts, get_transfer *g, tport_err *err);
/* Frees a transfer that was never listed (or whose last reference went). */
void transfers_free(transfers *ts, get_transfer *g);

/* The pipe's transfer of that id, with a reference (transfers_release). */
get_transfer *transfers_get(transfers *ts, uint32_t pipe, const uint8_t *id);
/* Drops the reference; `served` bytes more went out, and once all have the
 * transfer ends. */
void transfers_release(transfers *ts, get_transfer *g, size_t served);
/* Ends the transfers of a pipe (or all, with pipe 0). */
void transfers_drop(transfers *ts, uint32_t pipe);
/* Ends the transfers not read from for idle_ms. */
int transfers_expire(transfers *ts, int64_t now_mono_ms, int64_t idle_ms);
uint64_t transfers_count(transfers *ts);

int64_t transfers_now_ms(void); /* the monotonic clock of last_ms */

#endif
