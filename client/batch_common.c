/* batch_common.c: what both halves of a batch (batch.c, batch_put.c) ask
 * of an element's result (batch.h). */
#include "batch.h"

bool batch_cancelled(const atomic_bool *cancel, tport_err *err)
{
  if (!cancel || !atomic_load(cancel))
    return false;
  tport_err_set(err, TPORT_CANCELLED, "cancelled before this element was sent");
  return true;
}

int batch_element_status(const Tport__Status *st, tport_err *err)
{
  if (!st || st->code == TPORT__CODE__CODE_OK)
    return TPORT_OK;
  return tport_err_set(err, (int)st->code, "%s", st->message ? st->message : "");
}

int batch_result(const tport_err *errs, size_t stride, size_t n, tport_err *err)
{
  size_t failed = 0, first = 0;
  for (size_t i = 0; i < n; i++) {
    const tport_err *e = (const tport_err *)((const char *)errs + i * stride);
    if (e->code != TPORT_OK && failed++ == 0)
      first = i;
  }
  if (!failed)
    return TPORT_OK;
  const tport_err *e = (const tport_err *)((const char *)errs + first * stride);
  return tport_err_set(err, e->code, "%zu of %zu elements failed; element %zu: %s", failed, n,
                       first, e->msg);
}

