/*
 * metrics.h: the server's Prometheus metrics (text exposition format 0.0.4,
 * served on /metrics by http.c).
 *
 * Two kinds of values.  What the server counts as it works (requests by
 * method and status, request durations, the durations of the stages of a put
 * and a get) lives in a `metrics` block of atomic counters: an observation is
 * a bucket search over fixed bounds and two relaxed atomic additions, no
 * lock, no allocation -- it is on every request's path.  Everything else
 * (connections, tensors, tenants' bytes, device memory, the staging pool,
 * the host cache, the kernel cache) is read from its own source at scrape
 * time, the same sources the Stats RPC reads.
 *
 * A histogram keeps one counter per bucket (not cumulative) and the sum of
 * its observations in nanoseconds; a scrape loads each bucket once and
 * writes their running total, so its buckets are cumulative and its +Inf
 * bucket equals its _count within one scrape.  Its _sum may include an
 * observation whose bucket the scrape missed (they are two additions).
 *
 * The stages (tport_stage_duration_seconds{stage}), as the server sees them
 * (handlers_transfer.c; the engine is not asked, device copies are timed
 * where the server waits for them):
 *   receive         a put's chunk (or its one-piece PutBegin), from the
 *                   arrival of its request in full to its bytes ready to be
 *                   staged: queueing, decoding, the CRC check
 *   stage           a put's chunk copied into pinned staging blocks, its
 *                   async copy to the device enqueued (or copied into its
 *                   host tensor); a get's chunk copied into its reply
 *   host_to_device  a blocking commit's wait for what is left of its put's
 *                   device copies (they overlap the receiving of the chunks)
 *   convert         a put's dtype/format conversion (at commit, or of each
 *                   chunk as it lands); a get's source made contiguous
 *   device_to_host  a get's copies from a device into pinned memory: their
 *                   enqueueing at GetBegin and each chunk's wait for them
 *   send            a get's reply, from its hand-over to nng until nng takes
 *                   it for the connection (behind that connection's earlier
 *                   replies)
 */
#ifndef TPORT_METRICS_H
#define TPORT_METRICS_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define METRICS_METHODS 22 /* the wire's methods 1..21; 0 is "unknown" */
#define METRICS_CODES 17   /* tport_status 0..16 */
#define METRICS_BUCKETS 21 /* bounds 10 us .. 60 s, then +Inf */
/* tport_tenant_bytes lists at most this many tenants (tport_tenants counts all) */
#define METRICS_MAX_TENANTS 4096
/* --metrics-tenants hash: the key (random for each server) and the label's length */
#define METRICS_TENANT_KEY_BYTES 32
#define METRICS_TENANT_LABEL_HEX 16

typedef enum {
  STAGE_RECEIVE,
  STAGE_STAGE,
  STAGE_HOST_TO_DEVICE,
  STAGE_CONVERT,
  STAGE_DEVICE_TO_HOST,
  STAGE_SEND,
  METRICS_STAGES
} metrics_stage;

typedef struct metrics_histogram {
  atomic_uint_fast64_t buckets[METRICS_BUCKETS + 1]; /* the last: above every bound */
  atomic_uint_fast64_t sum_ns;
} metrics_histogram;

typedef struct metrics {
  atomic_uint_fast64_t requests[METRICS_METHODS][METRICS_CODES];
  metrics_histogram duration[METRICS_METHODS];
  metrics_histogram stage[METRICS_STAGES];
} metrics;

/* Zeroes m (a block embedded in its owner; nothing to free). */
void metrics_init(metrics *m);
/* The monotonic clock of every observation, in nanoseconds. */
int64_t metrics_now_ns(void);
/* One observation of ns nanoseconds (negative counts as 0).  Lock-free. */
void metrics_observe(metrics_histogram *h, int64_t ns);
/* A request of the wire's method (out of range: "unknown") answered with
 * code, ns after its arrival. */
void metrics_request(metrics *m, unsigned method, int code, int64_t ns);
/* A stage's duration: from since_ns (metrics_now_ns) until now. */
void metrics_stage_since(metrics *m, metrics_stage st, int64_t since_ns);
/* The label value of a stage ("host_to_device"...). */
const char *metrics_stage_name(metrics_stage st);

/* ---- the text exposition, built in a growing buffer */
typedef struct metrics_text {
  char *buf;
  size_t len, cap;
  bool oom; /* an allocation failed: the text is incomplete */
} metrics_text;

/* A family's HELP and TYPE lines (type: counter, gauge, histogram). */
void metrics_family(metrics_text *t, const char *name, const char *type, const char *help);
/* A sample: name{labels} value.  The labels are NULL-terminated pairs of
 * strings (name, value); values are escaped as the format wants. */
void metrics_sample(metrics_text *t, const char *name, double value, ...) __attribute__((sentinel));
void metrics_sample_u64(metrics_text *t, const char *name, uint64_t value, ...)
    __attribute__((sentinel));
/* A histogram's _bucket, _sum and _count samples, with one label (key NULL: none). */
void metrics_histogram_write(metrics_text *t, const char *name, const metrics_histogram *h,
                             const char *key, const char *value);
/* A tenant's label under --metrics-tenants hash: the first 64 bits of
 * HMAC-SHA256(key, tenant) in hex (METRICS_TENANT_LABEL_HEX digits and a NUL).
 * The key is the server's own, random, never shown: the label is the same
 * for the server's life, and nobody who reads /metrics can test a guessed
 * name against it (a plain hash of a short name would be a dictionary
 * away); a collision of two tenants' labels among 4096 is about 2^-41.
 * false when OpenSSL failed (out is then ""). */
bool metrics_tenant_label(const uint8_t key[METRICS_TENANT_KEY_BYTES], const char *tenant,
                          char out[METRICS_TENANT_LABEL_HEX + 1]);
/* Appends v as a label value: \ " and newline escaped, invalid UTF-8 as U+FFFD. */
void metrics_escape_label(metrics_text *t, const char *v);
/* A family of one unlabelled sample, with its HELP and TYPE. */
void metrics_gauge_u64(metrics_text *t, const char *name, const char *help, uint64_t v);
void metrics_counter_u64(metrics_text *t, const char *name, const char *help, uint64_t v);
/* The engine's families (metrics_engine.c); its devices are asked only
 * once devices_up (before, they are being configured). */
void metrics_engine(metrics_text *t, bool devices_up);

struct server;
/* The whole exposition of server s: a malloc'ed NUL-terminated text (the
 * caller frees it) and its length; NULL when out of memory. */
char *metrics_render(struct server *s, size_t *len);

#endif
