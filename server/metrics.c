/*
 * metrics.c: the counters and histograms of the hot path, and the
 * collection of the server's own figures at scrape time (see metrics.h;
 * metrics_text.c writes the format, metrics_engine.c the engine's).
 */
#include "metrics.h"

#include <inttypes.h>
#include <math.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "server_internal.h"

#ifndef TPORT_VERSION
#define TPORT_VERSION "unknown"
#endif
#ifndef TPORT_CUDA_VERSION
#define TPORT_CUDA_VERSION "none"
#endif

_Static_assert(METRICS_METHODS == SERVER_METHODS, "one histogram per method of the wire");
_Static_assert(METRICS_CODES == TPORT_UNAUTHENTICATED + 1, "one counter per status code");

/* Bucket bounds: 10 us to 60 s, roughly 1-2.5-5 per decade. */
static const int64_t bound_ns[METRICS_BUCKETS] = {
    10000,     25000,      50000,      100000,     250000,      500000,      1000000,
    2500000,   5000000,    10000000,   25000000,   50000000,    100000000,   250000000,
    500000000, 1000000000, 2500000000, 5000000000, 10000000000, 30000000000, 60000000000};

static const char *const stage_names[METRICS_STAGES] = {
    "receive", "stage", "host_to_device", "convert", "device_to_host", "send"};

void metrics_init(metrics *m)
{
  memset(m, 0, sizeof *m); /* all-zero bits are zero atomics on every target we build for */
}

int64_t metrics_now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void metrics_observe(metrics_histogram *h, int64_t ns)
{
  if (ns < 0)
    ns = 0;
  int i = 0;
  while (i < METRICS_BUCKETS && ns > bound_ns[i])
    i++;
  /* relaxed: each counter stands alone; a scrape reads whatever has landed */
  atomic_fetch_add_explicit(&h->buckets[i], 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&h->sum_ns, (uint_fast64_t)ns, memory_order_relaxed);
}

void metrics_request(metrics *m, unsigned method, int code, int64_t ns)
{
  if (method >= METRICS_METHODS)
    method = 0;
  if (code < 0 || code >= METRICS_CODES)
    code = TPORT_UNKNOWN;
  atomic_fetch_add_explicit(&m->requests[method][code], 1, memory_order_relaxed);
  metrics_observe(&m->duration[method], ns);
}

void metrics_stage_since(metrics *m, metrics_stage st, int64_t since_ns)
{
  metrics_observe(&m->stage[st], metrics_now_ns() - since_ns);
}

const char *metrics_stage_name(metrics_stage st)
{
  return st < METRICS_STAGES ? stage_names[st] : "unknown";
}

/* ---------------------------------------------------------------- collection */

static uint64_t total_of(const metrics_histogram *h)
{
  uint64_t n = 0;
  for (int i = 0; i <= METRICS_BUCKETS; i++)
    n += atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
  return n;
}

static const char *method_name(unsigned m)
{
  const ProtobufCMethodDescriptor *md = m ? frame_method((uint16_t)m) : NULL;
  return md ? md->name : "unknown";
}

static void requests(metrics_text *t, server *s)
{
  metrics *m = &s->metrics;
  metrics_family(t, "tport_requests_total", "counter",
                 "Requests answered, by method and status code (requests of connections "
                 "dropped for a limit are not answered and not counted).");
  for (unsigned i = 0; i < METRICS_METHODS; i++)
    for (int c = 0; c < METRICS_CODES; c++) {
      uint64_t v = atomic_load_explicit(&m->requests[i][c], memory_order_relaxed);
      if (v)
        metrics_sample_u64(t, "tport_requests_total", v, "method", method_name(i), "code",
                           tport_status_name(c), NULL);
    }
  metrics_family(t, "tport_request_duration_seconds", "histogram",
                 "Time from a request's arrival in full to its reply handed to nng (queueing "
                 "included), by method.");
  for (unsigned i = 0; i < METRICS_METHODS; i++)
    if (total_of(&m->duration[i]))
      metrics_histogram_write(t, "tport_request_duration_seconds", &m->duration[i], "method",
                              method_name(i));
  metrics_family(t, "tport_stage_duration_seconds", "histogram",
                 "Durations of the stages of puts and gets: receive, stage, host_to_device, "
                 "convert, device_to_host, send (README: Metrics and health).");
  for (int st = 0; st < METRICS_STAGES; st++)
    metrics_histogram_write(t, "tport_stage_duration_seconds", &m->stage[st], "stage",
                            stage_names[st]);
  metrics_family(t, "tport_transfer_bytes_total", "counter",
                 "Bytes of requests received (in) and of replies sent (out), headers included.");
  metrics_sample_u64(t, "tport_transfer_bytes_total", atomic_load(&s->bytes_in), "direction", "in",
                     NULL);
  metrics_sample_u64(t, "tport_transfer_bytes_total", atomic_load(&s->bytes_out), "direction",
                     "out", NULL);
  metrics_family(t, "tport_reply_lent_bytes_total", "counter",
                 "Of the reply bytes sent, those written straight from a tensor's memory "
                 "(lent to the tcp or ipc transport) instead of copied into the reply.");
  metrics_sample_u64(t, "tport_reply_lent_bytes_total", atomic_load(&s->bytes_lent), NULL);
  metrics_family(t, "tport_connections_dropped_total", "counter",
                 "Connections the server dropped for a limit (requests unanswered, replies not "
                 "read, no proof of tenant in time).");
  metrics_sample_u64(t, "tport_connections_dropped_total", atomic_load(&s->dropped), NULL);
  metrics_family(t, "tport_connections_refused_total", "counter",
                 "Connections closed as they arrived: --max-connections were open.");
  metrics_sample_u64(t, "tport_connections_refused_total",
                     atomic_load(&s->refused_connections), NULL);
  metrics_family(t, "tport_requests_refused_total", "counter",
                 "Requests answered RESOURCE_EXHAUSTED on arrival: the bodies of the requests "
                 "held had reached --request-memory.");
  metrics_sample_u64(t, "tport_requests_refused_total", atomic_load(&s->refused_requests),
                     NULL);
}

bool metrics_tenant_label(const uint8_t key[METRICS_TENANT_KEY_BYTES], const char *tenant,
                          char out[METRICS_TENANT_LABEL_HEX + 1])
{
  uint8_t mac[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  out[0] = 0;
  if (!HMAC(EVP_sha256(), key, METRICS_TENANT_KEY_BYTES, (const unsigned char *)tenant,
            strlen(tenant), mac, &len) ||
      len * 2 < METRICS_TENANT_LABEL_HEX)
    return false;
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < METRICS_TENANT_LABEL_HEX / 2; i++) {
    out[2 * i] = hex[mac[i] >> 4];
    out[2 * i + 1] = hex[mac[i] & 15];
  }
  out[METRICS_TENANT_LABEL_HEX] = 0;
  return true;
}

static void registry_gauges(metrics_text *t, server *s)
{
  reg_stats rs;
  reg_counts(&s->reg, &rs);
  metrics_family(t, "tport_connections", "gauge",
                 "Connections open now, by how they came: tcp, tls (tls+tcp, wss), ipc, inproc.");
  for (int v = 0; v < REG_VIAS; v++)
    if (v != REG_VIA_OTHER || rs.sessions_via[v])
      metrics_sample_u64(t, "tport_connections", rs.sessions_via[v], "transport", reg_via_names[v],
                         NULL);
  server_queue_stats qs;
  server_queue_stats_get(s, &qs);
  metrics_gauge_u64(t, "tport_contexts",
                    "nng contexts opened: --contexts receiving, the others handling a request, "
                    "holding a reply its connection has not taken, or spare.",
                    qs.contexts);
  metrics_gauge_u64(t, "tport_requests_queued", "Requests waiting for a worker, all tenants.",
                    qs.queued);
  metrics_gauge_u64(t, "tport_queue_tenants", "Tenants with requests queued or being handled.",
                    qs.queue_tenants);
  metrics_gauge_u64(t, "tport_request_bytes",
                    "Bytes of request bodies held (waiting or being handled), of --request-memory.",
                    qs.request_bytes);
  metrics_gauge_u64(t, "tport_uploads_in_progress", "Puts begun and not yet committed or aborted.",
                    rs.uploads);
  metrics_gauge_u64(t, "tport_gets_in_progress", "Gets begun whose bytes have not all been read.",
                    transfers_count(&s->xfers));
  metrics_gauge_u64(t, "tport_tensors", "Tensors held (uploads included), all tenants.",
                    rs.tensors);
  shm_stats ss;
  shm_get_stats(s->shm, &ss);
  metrics_gauge_u64(t, "tport_shm_regions", "Same-host regions registered now.", ss.regions);
  metrics_gauge_u64(t, "tport_shm_region_bytes", "Bytes of the same-host regions registered now.",
                    ss.bytes);
  metrics_family(t, "tport_shm_handoffs_total", "counter",
                 "Region descriptors handed over the shm socket, by result.");
  metrics_sample_u64(t, "tport_shm_handoffs_total", ss.handoffs_ok, "result", "ok", NULL);
  metrics_sample_u64(t, "tport_shm_handoffs_total", ss.handoffs_refused, "result", "refused", NULL);
  metrics_counter_u64(t, "tport_shm_transfers_total", "Puts and gets through a same-host region.",
                      ss.transfers);
  metrics_gauge_u64(t, "tport_shm_process_regions",
                    "Same-host clients whose memory tportd reads directly now.",
                    ss.process_regions);
  metrics_gauge_u64(t, "tport_shm_process_reads_stuck",
                    "Reads and writes of clients' memory given up by their workers and still "
                    "running (a page the client never lets fault in).",
                    ss.process_stuck);
  metrics_counter_u64(t, "tport_shm_process_reads_total",
                      "Reads of same-host clients' memory whose bytes could be stored (a "
                      "put's chunks, or a batch's puts read together).",
                      ss.process_reads);
  metrics_counter_u64(t, "tport_shm_process_read_bytes_total",
                      "Bytes of those reads (process_vm_readv).",
                      ss.process_bytes);
  metrics_counter_u64(t, "tport_shm_process_writes_total",
                      "Writes of gets straight into same-host clients' memory (32 MiB at most "
                      "each).",
                      ss.process_writes);
  metrics_counter_u64(t, "tport_shm_process_written_bytes_total",
                      "Bytes of those writes (process_vm_writev).", ss.process_written);
  metrics_gauge_u64(t, "tport_tensor_bytes",
                    "Bytes tenants pay for: distinct storages, conversions in progress, gets' host "
                    "copies.",
                    rs.bytes);
  metrics_gauge_u64(t, "tport_tenants", "Tenants with a connection or a tensor.", rs.tenants);
  /* whoever reaches the endpoint reads this: tenants' names only when the
   * operator asked (--metrics-tenants name) */
  int mode = s->cfg.metrics_tenants;
  if (mode == METRICS_TENANTS_OFF)
    return;
  size_t n = reg_tenants_usage(&s->reg, NULL, 0);
  size_t cap = n < METRICS_MAX_TENANTS ? n : METRICS_MAX_TENANTS;
  reg_tenant_usage *u = cap ? calloc(cap, sizeof *u) : NULL;
  size_t got = u ? reg_tenants_usage(&s->reg, u, cap) : 0;
  if (got > cap)
    got = cap;
  metrics_family(t, "tport_tenant_bytes", "gauge",
                 mode == METRICS_TENANTS_NAME
                     ? "Bytes each tenant pays for against its quota (at most 4096 tenants listed)."
                     : "Bytes each tenant pays for against its quota (at most 4096 tenants "
                       "listed); tenant is a keyed hash of its name, the same for this server's "
                       "life (--metrics-tenants).");
  for (size_t i = 0; i < got; i++) {
    char label[METRICS_TENANT_LABEL_HEX + 1];
    if (mode == METRICS_TENANTS_NAME)
      metrics_sample_u64(t, "tport_tenant_bytes", u[i].bytes, "tenant", u[i].name, NULL);
    else if (metrics_tenant_label(s->metrics_key, u[i].name, label))
      metrics_sample_u64(t, "tport_tenant_bytes", u[i].bytes, "tenant", label, NULL);
  }
  free(u);
}

char *metrics_render(server *s, size_t *len)
{
  metrics_text t = {0};
  metrics_family(&t, "tport_build_info", "gauge",
                 "1, labelled with the version of tportd and the CUDA toolkit it was built with.");
  metrics_sample(&t, "tport_build_info", 1, "version", TPORT_VERSION, "cuda", TPORT_CUDA_VERSION,
                 NULL);
  metrics_family(&t, "tport_start_time_seconds", "gauge",
                 "When the server started, in seconds since the Unix epoch.");
  metrics_sample(&t, "tport_start_time_seconds", (double)s->started_ms / 1000.0, NULL);
  metrics_gauge_u64(&t, "tport_ready", "1 once the server serves, 0 while it starts or stops.",
                    atomic_load(&s->ready) ? 1 : 0);
  requests(&t, s);
  registry_gauges(&t, s);
  metrics_engine(&t, atomic_load(&s->devices_up));
  if (t.oom) {
    free(t.buf);
    return NULL;
  }
  *len = t.len;
  return t.buf;
}
