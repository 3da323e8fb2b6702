/* test_devices.c: the engine's face to tportd beside tensors (engine.h,
 * engine_stats.h): engine_configure from a --devices list and options, the
 * devices it then describes, and the one collector of its figures. */
#include <criterion/criterion.h>
#include <string.h>

#include "engine.h"
#include "engine_stats.h"

static void teardown(void)
{
  engine_synchronize_all();
}

TestSuite(devices, .fini = teardown);

/* The devices of one type among those engine_devices describes. */
static size_t of_type(const engine_device_info *all, size_t n, tport_device_type type,
                      const engine_device_info **out)
{
  size_t k = 0;
  for (size_t i = 0; i < n; i++)
    if (all[i].device.type == type)
      out[k++] = &all[i];
  return k;
}

Test(devices, a_list_configures_sim_devices_described_with_memory_and_peers)
{
  tport_err e, warning;
  cr_assert_eq(engine_configure("cpu,sim:2", NULL, &warning, &e), 0, "%s", e.msg);
  cr_assert_eq(warning.code, TPORT_OK);
  engine_device_info all[ENGINE_MAX_DEVICES];
  size_t n = engine_devices(all, ENGINE_MAX_DEVICES);
  const engine_device_info *cpu[ENGINE_MAX_DEVICES], *sim[ENGINE_MAX_DEVICES];
  cr_assert_eq(of_type(all, n, TPORT_DEV_CPU, cpu), 1);
  cr_assert_eq(of_type(all, n, TPORT_DEV_SIM, sim), 2);
  cr_assert_not(cpu[0]->managed_memory);
  for (int d = 0; d < 2; d++) {
    cr_assert_eq(sim[d]->device.index, d);
    cr_assert(sim[d]->managed_memory);
    cr_assert(sim[d]->has_memory);
    cr_assert_eq(sim[d]->total_bytes, (size_t)1 << 30, "the sim's default memory");
    cr_assert_eq(sim[d]->npeers, 1);
    cr_assert_eq(sim[d]->peers[0], 1 - d);
  }
  /* a short array gets the first devices, in order */
  cr_assert_eq(engine_devices(all, 1), 1);
  cr_assert_eq(all[0].device.type, TPORT_DEV_CPU);
}

Test(devices, a_list_naming_an_unknown_device_is_refused)
{
  tport_err e;
  cr_assert_eq(engine_configure("cpu,tpu:1", NULL, NULL, &e), TPORT_INVALID_ARGUMENT);
  cr_assert_eq(engine_configure("cpu,cpu:1", NULL, NULL, &e), TPORT_INVALID_ARGUMENT);
  cr_assert(strstr(e.msg, "cpu:1"), "%s", e.msg);
}

/* cuda named without a CUDA device: an error that says why (it started
 * and served none, found out only by its clients); with one, served. */
Test(devices, cuda_named_without_a_device_is_an_error_naming_the_reason)
{
  tport_err e = {0};
  int rc = engine_configure("cpu,cuda", NULL, NULL, &e);
  if (engine_cuda_unavailable_reason() == NULL) {
    cr_assert_eq(rc, 0, "a CUDA device is here: %s", e.msg);
    return;
  }
  cr_assert_eq(rc, TPORT_FAILED_PRECONDITION);
  cr_assert(strstr(e.msg, "--devices names cuda") && strstr(e.msg, "leave cuda out"), "%s", e.msg);
  cr_assert(strstr(e.msg, engine_cuda_unavailable_reason()), "the reason: %s", e.msg);
  /* without cuda in the list, the same machine serves */
  cr_assert_eq(engine_configure("cpu", NULL, NULL, &e), 0, "%s", e.msg);
}

Test(devices, no_list_serves_no_sim_device)
{
  tport_err e;
  cr_assert_eq(engine_configure(NULL, NULL, NULL, &e), 0, "%s", e.msg);
  engine_device_info all[ENGINE_MAX_DEVICES];
  const engine_device_info *sim[ENGINE_MAX_DEVICES];
  cr_assert_eq(of_type(all, engine_devices(all, ENGINE_MAX_DEVICES), TPORT_DEV_SIM, sim), 0);
}

/* The kernel cache is the CUDA backend's: a build without it says so,
 * without failing to serve. */
Test(devices, a_kernel_cache_only_the_cuda_build_takes_warns_elsewhere)
{
  tport_err e, warning;
  engine_options o = {.kernel_cache = "/nonexistent/kernels"};
  cr_assert_eq(engine_configure("sim:1", &o, &warning, &e), 0, "%s", e.msg);
#ifdef TPORT_HAVE_CUDA
  cr_assert_eq(warning.code, TPORT_OK, "%s", warning.msg);
#else
  cr_assert_neq(warning.code, TPORT_OK);
#endif
}

Test(devices, one_collector_reads_the_pools_caches_and_backends)
{
  tport_err e;
  engine_options o = {.host_cache_set = true, .host_cache_bytes = 12345};
  engine_stats before;
  engine_get_stats(&before);
  cr_assert_eq(before.ncounters, 0, "no backend is asked before the devices are configured");
  cr_assert_eq(before.staging.hits + before.staging.misses, 0, "a pool not yet made reads 0");
  cr_assert_eq(engine_configure("sim:1", &o, NULL, &e), 0, "%s", e.msg);
  /* a put to the sim: staged through the staging pool */
  int64_t n = 1 << 18;
  tport_tensor *t;
  cr_assert_eq(tensor_empty((tport_device){TPORT_DEV_SIM, 0}, TPORT_FLOAT32, 1, &n,
                            TPORT_MF_CONTIGUOUS, 0, &t, &e),
               0, "%s", e.msg);
  static float h[1 << 18];
  cr_assert_eq(tensor_write(t, h, sizeof h, &e), 0, "%s", e.msg);
  engine_stats st;
  engine_get_stats(&st);
  cr_assert_gt(st.staging.hits + st.staging.misses, 0);
  cr_assert_eq(st.host_cache.limit_bytes, 12345, "--host-cache's limit");
  bool in_use = false;
  for (size_t i = 0; i < st.ncounters; i++)
    if (!strcmp(st.counters[i].name, "sim0_bytes_in_use"))
      in_use = st.counters[i].value >= (int64_t)sizeof h;
  cr_assert(in_use, "the sim's own counter of memory in use, among the backends'");
  tensor_release(t);
}
