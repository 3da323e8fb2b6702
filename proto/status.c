/* status.c: names of status codes and the error value (tport_types.h). */
#include "tport_types.h"

#include <stdarg.h>
#include <stdio.h>

static const char *const status_names[] = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

const char *tport_status_name(int status)
{
  if (status < 0 || status >= (int)(sizeof status_names / sizeof status_names[0]))
    return "UNKNOWN_STATUS";
  return status_names[status];
}

int tport_err_set(tport_err *err, int code, const char *fmt, ...)
{
  if (err) {
    va_list ap;
    va_start(ap, fmt);
    err->code = code;
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
  }
  return code;
}

void tport_err_clear(tport_err *err)
{
  if (err) {
    err->code = TPORT_OK;
    err->msg[0] = '\0';
  }
}
