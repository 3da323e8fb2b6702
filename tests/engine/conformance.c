/* conformance.c: the backend table's contract, one suite for every backend
 * (TensorPipe's habit): allocation, async copies both ways on two streams
 * ordered by an event, never-recorded events, memory info. */
#include "conformance.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

void conformance(const backend_ops *be)
{
  cr_assert(backend_complete(be), "%s: an op is NULL", be->name);
  int n = be->device_count();
  if (n == 0) {
    cr_log_info("%s: not viable here (%s): skipped", be->name, be->unavailable_reason());
    return;
  }
  be_copy_kind up = be->type == TPORT_DEV_CPU ? BE_H2H : BE_H2D;
  be_copy_kind down = be->type == TPORT_DEV_CPU ? BE_H2H : BE_D2H;
  for (int d = 0; d < n; d++) {
    void *dev;
    tport_err e;
    cr_assert_eq(be->alloc(d, 1 << 20, &dev, &e), 0, "%s", e.msg);
    cr_assert_eq((uintptr_t)dev % 256, 0);
    void *host;
    cr_assert_eq(be->host_alloc(1 << 20, &host, &e), 0);
    unsigned char *h = host;
    for (int i = 0; i < 1 << 20; i++)
      h[i] = (unsigned char)(i * 7 + d);
    be_stream *s = be->stream_default(d);
    cr_assert_not_null(s);
    cr_assert_eq(be->memcpy_async(d, s, dev, host, 1 << 20, up, &e), 0, "%s", e.msg);
    be_event *ev;
    cr_assert_eq(be->event_create(d, &ev, &e), 0);
    cr_assert_eq(be->event_record(ev, s, &e), 0);
    unsigned char *back = malloc(1 << 20);
    memset(back, 0, 1 << 20);
    /* a second stream waits on the event, then copies back */
    be_stream *s2;
    cr_assert_eq(be->stream_create(d, &s2, &e), 0);
    cr_assert_eq(be->stream_wait_event(s2, ev, &e), 0);
    cr_assert_eq(be->memcpy_async(d, s2, back, dev, 1 << 20, down, &e), 0);
    cr_assert_eq(be->stream_synchronize(s2, &e), 0);
    cr_assert(memcmp(back, host, 1 << 20) == 0, "%s:%d: bytes differ", be->name, d);
    cr_assert(be->event_query(ev));
    be->event_destroy(ev);
    be->stream_destroy(s2);
    /* a never-recorded event is complete */
    cr_assert_eq(be->event_create(d, &ev, &e), 0);
    cr_assert(be->event_query(ev));
    cr_assert_eq(be->event_synchronize(ev, &e), 0);
    be->event_destroy(ev);
    size_t freeb, total;
    cr_assert_eq(be->mem_info(d, &freeb, &total, &e), 0);
    cr_assert(freeb <= total && total > 0);
    be->free(d, dev);
    be->host_free(host);
    free(back);
  }
}
