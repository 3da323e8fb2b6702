/*
 * batch_element.h: what handlers_batch.c (PutBatch, the elements' replies)
 * and handlers_batch_get.c (GetBatch) share -- an element's answer, the
 * handler run on it, and the batch's reply made of them.
 */
#ifndef TPORT_SERVER_BATCH_ELEMENT_H
#define TPORT_SERVER_BATCH_ELEMENT_H

#include "put_bulk.h"
#include "put_gather.h"
#include "put_runs.h"
#include "server_internal.h"

/* What one element's handler answered: its reply as packed (in the
 * batch's sink at `at`, or in own for a failure's status), and its payload
 * after it there (or held by a lend). */
typedef struct element {
  size_t at;
  const uint8_t *packed;
  size_t packed_len;
  uint8_t *own;
  uint8_t fallback[8]; /* a failure's reply when own cannot be had */
  const uint8_t *payload;
  size_t payload_len;
  void *lent; /* payload held by a lend (lends_begin) rather than in the sink */
  bool ok, sunk;
  bool in_run; /* a run's element answered by its handle alone (put_runs.h) */
  bool stored; /* a put's element in the registry under handle */
  uint8_t handle[REG_HANDLE_BYTES];
} element; /* small: a batch of 4096 allocates 4096 (no error message in it) */

/* What a batch's elements share: the reply's sink, the puts gathered from
 * the client's memory and added together (NULL for a get's), the gets
 * written into it together (NULL for a put's), whether the bytes are
 * written with streaming stores, the stages' times. */
typedef struct batch_env {
  reply_sink *sink;
  put_gather *gather;
  struct get_scatter *scatter;
  put_bulk *bulk;
  bool stream;
  int64_t *stage_ns;
} batch_env;

/* Runs handler on element i (req, payload) as a call of its own and keeps
 * its answer in el (its reply in the sink, or its handle where it is an
 * element of run) -- unless the handler gathered it (a put from the
 * client's memory, answered by put_gather_end; a get into it, by
 * get_scatter_end). */
void run_element(call *c, const batch_env *env, put_run_info *run, uint16_t method,
                 int (*handler)(call *), ProtobufCMessage *req, const uint8_t *payload, size_t n,
                 size_t i, element *el);
/* What the element's call (sub) answered, rc, kept in el. */
void element_answered(call *sub, int rc, element *el);
/* An element refused before its handler ran. */
void refuse_element(element *el, int code, const char *why);
/* A batch of n elements: INVALID_ARGUMENT past BATCH_MAX_ELEMENTS. */
int check_count(call *c, size_t n);
/* The batch's reply: head (its status and other fields), then each
 * element's packed reply as repeated field `field` (a put batch's runs'
 * elements, b, answered by run); its payload the elements' payloads. */
int batch_reply(call *c, const ProtobufCMessage *head, uint32_t field, element *els, size_t n,
                const reply_sink *sink, const batch_puts *b);
void free_elements(element *els, size_t n);

#endif
