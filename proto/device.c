/* device.c: parsing and printing device strings. */
#include "device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const type_names[TPORT_NUM_DEVICE_TYPES] = {"cpu", "cuda", "sim"};

const char *device_type_name(tport_device_type t)
{
  return (t >= 0 && t < TPORT_NUM_DEVICE_TYPES) ? type_names[t] : "?";
}

int device_parse(const char *s, const char *field, tport_device *out, tport_err *err)
{
  if (!s || !*s)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s is empty: expected cpu, cuda:N or sim:N",
                         field);
  for (int t = 0; t < TPORT_NUM_DEVICE_TYPES; t++) {
    size_t n = strlen(type_names[t]);
    if (strncmp(s, type_names[t], n) != 0)
      continue;
    const char *rest = s + n;
    if (*rest == '\0') {
      out->type = (tport_device_type)t;
      out->index = t == TPORT_DEV_CPU ? 0 : -1;
      return TPORT_OK;
    }
    if (*rest != ':')
      continue;
    rest++;
    char *end = NULL;
    long idx = strtol(rest, &end, 10);
    if (end == rest || *end != '\0' || idx < 0 || idx > 1023 || rest[0] == '+' || rest[0] == '-')
      return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                           "%s is '%.64s': the device index must be an integer in [0, 1023]", field,
                           s);
    if (t == TPORT_DEV_CPU && idx != 0)
      return tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s is '%.64s': cpu has only index 0",
                           field, s);
    out->type = (tport_device_type)t;
    out->index = (int)idx;
    return TPORT_OK;
  }
  return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                       "%s is '%.64s': expected cpu, cuda, cuda:N, sim or sim:N", field, s);
}

const char *device_format(tport_device d, char *buf, size_t len)
{
  if (d.type == TPORT_DEV_CPU || d.index < 0) {
    /* (not snprintf: every tensor's reply names its device) */
    const char *name = device_type_name(d.type);
    size_t n = strlen(name);
    if (len) {
      n = n < len - 1 ? n : len - 1;
      memcpy(buf, name, n);
      buf[n] = '\0';
    }
  } else
    snprintf(buf, len, "%s:%d", device_type_name(d.type), d.index);
  return buf;
}

bool device_equal(tport_device a, tport_device b)
{
  return a.type == b.type && a.index == b.index;
}
