/* dtype.c: dtype and memory format names, as PyTorch spells them. */
#include "dtype.h"

#include <string.h>

static const char *const dtype_names[TPORT_NUM_DTYPES] = {
    "bool",    "uint8",    "int8",    "int16",   "int32",     "int64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
};

static const struct {
  const char *alias;
  tport_dtype dtype;
} dtype_aliases[] = {
    {"half", TPORT_FLOAT16},     {"float", TPORT_FLOAT32},      {"double", TPORT_FLOAT64},
    {"short", TPORT_INT16},      {"int", TPORT_INT32},          {"long", TPORT_INT64},
    {"cfloat", TPORT_COMPLEX64}, {"cdouble", TPORT_COMPLEX128}, {"chalf", (tport_dtype)-1},
};

const char *dtype_name(int dtype)
{
  return (dtype >= 0 && dtype < TPORT_NUM_DTYPES) ? dtype_names[dtype] : NULL;
}

int dtype_parse(const char *name, const char *field, tport_dtype *out, tport_err *err)
{
  if (!name)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s is missing", field);
  const char *n = strncmp(name, "torch.", 6) == 0 ? name + 6 : name;
  for (int i = 0; i < TPORT_NUM_DTYPES; i++)
    if (strcmp(n, dtype_names[i]) == 0) {
      *out = (tport_dtype)i;
      return TPORT_OK;
    }
  for (size_t i = 0; i < sizeof dtype_aliases / sizeof dtype_aliases[0]; i++)
    if (strcmp(n, dtype_aliases[i].alias) == 0 && (int)dtype_aliases[i].dtype >= 0) {
      *out = dtype_aliases[i].dtype;
      return TPORT_OK;
    }
  return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                       "%s is '%.64s': not a dtype (bool, uint8, int8, int16, int32, int64, "
                       "float16, bfloat16, float32, float64, complex64, complex128)",
                       field, name);
}

bool dtype_is_floating(int dtype)
{
  return dtype == TPORT_FLOAT16 || dtype == TPORT_BFLOAT16 || dtype == TPORT_FLOAT32 ||
         dtype == TPORT_FLOAT64;
}

bool dtype_is_integral(int dtype)
{
  return dtype >= TPORT_UINT8 && dtype <= TPORT_INT64;
}

static const char *const format_names[] = {"contiguous", "channels_last", "channels_last_3d",
                                           "preserve", "none"};

const char *memory_format_name(int fmt)
{
  return (fmt >= 0 && fmt <= TPORT_MF_NONE) ? format_names[fmt] : NULL;
}

int memory_format_parse(const char *name, const char *field, tport_memory_format *out,
                        tport_err *err)
{
  if (!name)
    return tport_err_set(err, TPORT_INVALID_ARGUMENT, "%s is missing", field);
  const char *n = strncmp(name, "torch.", 6) == 0 ? name + 6 : name;
  if (strcmp(n, "contiguous_format") == 0) {
    *out = TPORT_MF_CONTIGUOUS;
    return TPORT_OK;
  }
  /* "none" is an answer, never a request. */
  for (int i = 0; i < TPORT_MF_NONE; i++)
    if (strcmp(n, format_names[i]) == 0) {
      *out = (tport_memory_format)i;
      return TPORT_OK;
    }
  return tport_err_set(err, TPORT_INVALID_ARGUMENT,
                       "%s is '%.64s': not a memory format (contiguous, channels_last, "
                       "channels_last_3d, preserve)",
                       field, name);
}
