/* os_error.c: a failed system call as a status (os_error.h). */
#include "os_error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int os_error_code(int e)
{
  switch (e) {
  case ENOENT:
  case ENOTDIR:
  case ENXIO:
  case ENODEV: return TPORT_NOT_FOUND;
  case EACCES:
  case EPERM:
  case EROFS:
  case ETXTBSY: return TPORT_PERMISSION_DENIED;
  case EEXIST: return TPORT_ALREADY_EXISTS;
  case ENOSPC:
  case EDQUOT:
  case EFBIG:
  case ENOMEM:
  case EMFILE:
  case ENFILE: return TPORT_RESOURCE_EXHAUSTED;
  case EISDIR:
  case ENAMETOOLONG:
  case ELOOP:
  case EINVAL: return TPORT_INVALID_ARGUMENT;
  case EAGAIN:
  case EINTR:
  case EBUSY: return TPORT_UNAVAILABLE;
  case EIO: return TPORT_DATA_LOSS;
  default: return TPORT_UNKNOWN;
  }
}

int os_error(tport_err *err, int e, const char *fmt, ...)
{
  int code = os_error_code(e);
  if (!err)
    return code;
  char what[TPORT_ERR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  /* "%.*s" keeps the reason when a long path fills the message */
  const char *why = strerror(e);
  int room = (int)(sizeof err->msg - strlen(why) - 3);
  return tport_err_set(err, code, "%.*s: %s", room > 0 ? room : 0, what, why);
}
