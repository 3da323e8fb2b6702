/*
 * devices.c: the devices the engine serves -- configured once from
 * tportd's --devices list and options, then described for Devices and
 * /metrics (engine.h, "devices").
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "device.h"
#include "devices_internal.h"
#include "env.h"
#include "engine.h"
#include "host_cache.h"
#include "small_cache.h"

static atomic_bool configured;

bool engine_configured(void)
{
  return atomic_load(&configured);
}

/* The sim devices a --devices list asks for (sim:N: N of them), and
 * whether it names cuda (every CUDA device, which must then be there). */
static int sim_devices_asked(const char *spec, int *nsim, bool *cuda, tport_err *err)
{
  *nsim = 0;
  *cuda = false;
  if (!spec)
    return TPORT_OK;
  char *copy = strdup(spec), *save = NULL;
  if (!copy)
    return tport_err_set(err, TPORT_RESOURCE_EXHAUSTED, "out of memory");
  int rc = TPORT_OK;
  for (char *t = strtok_r(copy, ",", &save); t && !rc; t = strtok_r(NULL, ",", &save)) {
    if (strcmp(t, "cuda") == 0)
      *cuda = true;
    if (strcmp(t, "cpu") == 0 || strcmp(t, "cuda") == 0)
      continue;
    tport_device d;
    rc = device_parse(t, "--devices", &d, err);
    if (!rc && d.type == TPORT_DEV_SIM)
      *nsim = d.index < 0 ? 1 : d.index; /* sim:N means N devices */
    else if (!rc && d.type != TPORT_DEV_CPU)
      rc =
          tport_err_set(err, TPORT_INVALID_ARGUMENT, "--devices: '%s': list cpu, cuda or sim:N", t);
  }
  free(copy);
  return rc;
}

int engine_configure(const char *devices, const engine_options *opts, tport_err *warning,
                     tport_err *err)
{
  if (warning)
    warning->code = TPORT_OK;
  int nsim;
  bool cuda;
  int rc = sim_devices_asked(devices, &nsim, &cuda, err);
  if (!rc)
    rc = engine_env_check(err); /* TPORT_STAGING_BYTES=lots: refused, not the default */
  if (rc)
    return rc;
  /* asked for by name, CUDA devices must be there: a server that started
   * serving none would be found out only by its clients */
  if (cuda && backend_cuda.device_count() <= 0) {
    const char *why = backend_cuda.unavailable_reason();
    return tport_err_set(err, TPORT_FAILED_PRECONDITION,
                         "--devices names cuda, but no CUDA device can be used: %s (leave cuda "
                         "out of the list to serve without one)",
                         why && *why ? why : "none was found");
  }
  if (opts && opts->host_cache_set)
    host_cache_set_limit(opts->host_cache_bytes);
  sim_config cfg = {.ndevices = nsim};
  rc = sim_configure(&cfg, err);
  if (rc)
    return rc;
  if (opts && opts->kernel_cache) {
    tport_err why;
    if (backend_cuda.set_option("kernel-cache", opts->kernel_cache, &why) && warning)
      *warning = why;
  }
  atomic_store(&configured, true);
  return TPORT_OK;
}

static void describe(const backend_ops *be, tport_device dev, int count, engine_device_info *out)
{
  memset(out, 0, sizeof *out);
  out->device = dev;
  be->describe(dev.index, out->name, sizeof out->name, out->compute_capability,
               sizeof out->compute_capability);
  out->has_memory = be->mem_info(dev.index, &out->free_bytes, &out->total_bytes, NULL) == TPORT_OK;
  if (!out->has_memory)
    out->free_bytes = out->total_bytes = 0;
  out->managed_memory = dev.type != TPORT_DEV_CPU;
  for (int p = 0; p < count && out->npeers < ENGINE_MAX_DEVICES; p++)
    if (p != dev.index && be->can_access_peer(dev.index, p))
      out->peers[out->npeers++] = p;
}

size_t engine_devices(engine_device_info *out, size_t max)
{
  size_t n = 0;
  for (int type = 0; type < TPORT_NUM_DEVICE_TYPES; type++) {
    const backend_ops *be = backend_get((tport_device_type)type);
    int count = be->device_count();
    for (int d = 0; d < count && n < max; d++, n++)
      describe(be, (tport_device){(tport_device_type)type, d}, count, &out[n]);
  }
  return n;
}

const char *engine_cuda_unavailable_reason(void)
{
  return backend_cuda.device_count() > 0 ? NULL : backend_cuda.unavailable_reason();
}

void engine_release_idle(void)
{
  small_cache_empty();
}
