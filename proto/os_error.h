/* os_error.h: a failed system call as a status: the code that fits errno
 * (a missing file is NOT_FOUND, not PERMISSION_DENIED) and the OS's reason
 * (strerror) after the caller's words, which name the file. */
#ifndef TPORT_OS_ERROR_H
#define TPORT_OS_ERROR_H

#include "tport_types.h"

/* The status for errno value e. */
int os_error_code(int e);

/* Sets err to "<fmt...>: <strerror(e)>" with os_error_code(e); returns
 * the code. */
int os_error(tport_err *err, int e, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
