/* test_readback.c: device tensors read back a chunk at a time through the
 * read-back pool (readback.h): the values of any range in logical C order,
 * blocks recycled (no pinned allocation per read once warm), the bound on
 * blocks out, and blocks that outlive their reader or come home from a
 * deferred release; host tensors served from their memory or a copy. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "engine.h"
#include "readback.h"
#include "staging.h"

static void setup(void)
{
  sim_config cfg = {.ndevices = 1, .mem_bytes = 256 << 20, .max_delay_us = 100, .seed = 5};
  tport_err e;
  cr_assert_eq(sim_configure(&cfg, &e), 0, "%s", e.msg);
}

static void teardown(void)
{
  engine_synchronize_all();
}

TestSuite(readback, .init = setup, .fini = teardown);

static int64_t sim_stat(const char *name)
{
  int64_t v = backend_stat(&backend_sim, name);
  cr_assert_geq(v, 0, "the sim reports no %s", name);
  return v;
}

/* A float32 [rows, cols] tensor on sim:0 holding 0, 1, 2, ... in C order. */
static tport_tensor *iota_on_sim(int64_t rows, int64_t cols)
{
  size_t n = (size_t)(rows * cols);
  float *h = malloc(n * sizeof *h);
  for (size_t i = 0; i < n; i++)
    h[i] = (float)i;
  int64_t sizes[2] = {rows, cols};
  tport_tensor *t;
  tport_err e;
  cr_assert_eq(tensor_empty((tport_device){TPORT_DEV_SIM, 0}, TPORT_FLOAT32, 2, sizes,
                            TPORT_MF_CONTIGUOUS, 0, &t, &e),
               0, "%s", e.msg);
  cr_assert_eq(tensor_write(t, h, n * sizeof *h, &e), 0, "%s", e.msg);
  free(h);
  return t;
}

Test(readback, any_range_of_a_transposed_tensor_in_logical_order)
{
  tport_tensor *t = iota_on_sim(37, 1031), *tr;
  tport_err e;
  /* the transpose: [1031, 37] with strides (1, 1031), not contiguous */
  cr_assert_eq(tensor_as_strided(t, 2, (int64_t[]){1031, 37}, (int64_t[]){1, 1031}, 0, &tr, &e),
               0);
  size_t nbytes = tensor_nbytes(tr);
  float *want = malloc(nbytes);
  for (int64_t i = 0; i < 1031; i++)
    for (int64_t j = 0; j < 37; j++)
      want[i * 37 + j] = (float)(j * 1031 + i);
  tensor_reader *r;
  cr_assert_eq(reader_open(tr, 4, &r, &e), 0, "%s", e.msg);
  cr_assert_eq(reader_nbytes(r), nbytes);
  const size_t offs[] = {0, 1, 3, 4096, 65535, nbytes - 7, nbytes - 1};
  const size_t lens[] = {nbytes, 1, 4093, 65536, 70000, 7, 1};
  for (size_t k = 0; k < sizeof offs / sizeof *offs; k++) {
    tport_storage *held;
    const uint8_t *p;
    size_t n = lens[k] <= nbytes - offs[k] ? lens[k] : nbytes - offs[k];
    cr_assert_eq(reader_read(r, offs[k], n, &held, &p, &e), 0, "%s", e.msg);
    cr_assert(held && p);
    cr_assert_eq(memcmp(p, (const uint8_t *)want + offs[k], n), 0, "bytes [%zu, +%zu)", offs[k],
                 n);
    storage_release(held);
  }
  /* nothing to read, and outside the values */
  tport_storage *held = (void *)1;
  const uint8_t *p = (void *)1;
  cr_assert_eq(reader_read(r, nbytes, 0, &held, &p, &e), 0);
  cr_assert(!held && !p);
  cr_assert_eq(reader_read(r, nbytes, 1, &held, &p, &e), TPORT_OUT_OF_RANGE);
  cr_assert_eq(reader_read(r, 1, nbytes, &held, &p, &e), TPORT_OUT_OF_RANGE);
  cr_assert_eq(reader_read(r, SIZE_MAX, 2, &held, &p, &e), TPORT_OUT_OF_RANGE);
  cr_assert_eq(reader_blocks_out(r), 0);
  reader_close(r);
  free(want);
  tensor_release(tr);
  tensor_release(t);
}

Test(readback, a_conjugated_view_reads_its_values)
{
  int64_t n = 1000;
  float *h = malloc((size_t)n * 2 * sizeof *h);
  for (int64_t i = 0; i < 2 * n; i++)
    h[i] = (float)i;
  tport_tensor *t, *cv;
  tport_err e;
  cr_assert_eq(tensor_empty((tport_device){TPORT_DEV_SIM, 0}, TPORT_COMPLEX64, 1, &n,
                            TPORT_MF_CONTIGUOUS, 0, &t, &e),
               0);
  cr_assert_eq(tensor_write(t, h, (size_t)n * 8, &e), 0);
  cr_assert_eq(tensor_conj_view(t, &cv, &e), 0);
  tensor_reader *r;
  cr_assert_eq(reader_open(cv, 2, &r, &e), 0, "%s", e.msg);
  tport_storage *held;
  const uint8_t *p;
  cr_assert_eq(reader_read(r, 0, (size_t)n * 8, &held, &p, &e), 0, "%s", e.msg);
  const float *v = (const float *)p;
  for (int64_t i = 0; i < n; i++) {
    cr_assert_eq(v[2 * i], h[2 * i]);
    cr_assert_eq(v[2 * i + 1], -h[2 * i + 1], "element %lld's imaginary part", (long long)i);
  }
  storage_release(held);
  reader_close(r);
  tensor_release(cv);
  tensor_release(t);
  free(h);
}

Test(readback, blocks_are_recycled_not_allocated_per_read)
{
  tport_tensor *t = iota_on_sim(1024, 4096); /* 16 MiB */
  tport_err e;
  staging_stats st0, st1;
  /* warm: one round of the chunks (the blocks read ahead included) */
  tensor_reader *r;
  cr_assert_eq(reader_open(t, 4, &r, &e), 0);
  tport_storage *held;
  const uint8_t *p;
  for (size_t off = 0; off < (16u << 20); off += 4u << 20) {
    cr_assert_eq(reader_read(r, off, 4 << 20, &held, &p, &e), 0);
    storage_release(held);
  }
  staging_get_stats(staging_readback(), &st0);
  int64_t allocs0 = sim_stat("sim_host_allocs");
  for (int round = 0; round < 8; round++)
    for (size_t off = 0; off < (16u << 20); off += 4u << 20) {
      cr_assert_eq(reader_read(r, off, 4 << 20, &held, &p, &e), 0, "%s", e.msg);
      cr_assert_eq(((const float *)p)[0], (float)(off / 4));
      storage_release(held);
    }
  staging_get_stats(staging_readback(), &st1);
  cr_assert_eq(st1.misses, st0.misses, "32 reads allocated %llu blocks",
               (unsigned long long)(st1.misses - st0.misses));
  cr_assert_geq(st1.hits - st0.hits, 8, "the blocks come from the pool's free lists");
  cr_assert_eq(sim_stat("sim_host_allocs"), allocs0, "no pinned memory allocated per read");
  reader_close(r);
  tensor_release(t);
}

Test(readback, at_most_max_held_blocks_out)
{
  tport_tensor *t = iota_on_sim(64, 1024);
  tport_err e;
  tensor_reader *r;
  /* 2 asked for + READER_AHEAD read ahead */
  cr_assert_eq(reader_open(t, 2, &r, &e), 0);
  tport_storage *a, *b, *c;
  const uint8_t *p;
  cr_assert_eq(reader_read(r, 0, 4096, &a, &p, &e), 0);
  cr_assert_eq(reader_blocks_out(r), 1 + READER_AHEAD, "the next chunks are read ahead");
  cr_assert_eq(reader_read(r, 0, 4096, &b, &p, &e), 0, "the same bytes again: still counted");
  cr_assert_eq(reader_blocks_out(r), 2 + READER_AHEAD);
  cr_assert_eq(reader_read(r, 0, 4096, &c, &p, &e), TPORT_RESOURCE_EXHAUSTED);
  cr_assert(strstr(e.msg, "chunks of this get"), "%s", e.msg);
  storage_release(a);
  cr_assert_eq(reader_blocks_out(r), 1 + READER_AHEAD, "a block released is back at once");
  /* the chunk read ahead: no new block, its values */
  cr_assert_eq(reader_read(r, 4096, 4096, &c, &p, &e), 0, "%s", e.msg);
  cr_assert_eq(((const float *)p)[0], 1024.0f);
  cr_assert_eq(((const float *)p)[1023], 2047.0f);
  storage_release(b);
  storage_release(c);
  reader_close(r);
  tensor_release(t);
  /* what was read ahead and never asked for is back in the pool */
  engine_synchronize_all();
  storage_reap(true);
  staging_stats st;
  staging_get_stats(staging_readback(), &st);
  cr_assert_eq(st.bytes_in_use, 0);
}

Test(readback, a_series_of_chunks_is_read_ahead_and_served_in_any_order)
{
  tport_tensor *t = iota_on_sim(1000, 1000); /* 4,000,000 bytes */
  tport_err e;
  tensor_reader *r;
  cr_assert_eq(reader_open(t, 8, &r, &e), 0);
  const size_t chunk = 300000, n = 4000000;
  /* in order, then a window's worth out of order, the short last one too */
  size_t order[14];
  int k = 0;
  for (size_t off = 0; off < n; off += chunk)
    order[k++] = off;
  size_t tmp = order[5];
  order[5] = order[7];
  order[7] = tmp;
  tmp = order[12];
  order[12] = order[13];
  order[13] = tmp;
  for (int i = 0; i < k; i++) {
    size_t len = n - order[i] < chunk ? n - order[i] : chunk;
    tport_storage *held;
    const uint8_t *p;
    cr_assert_eq(reader_read(r, order[i], len, &held, &p, &e), 0, "%s", e.msg);
    const float *f = (const float *)p;
    cr_assert_eq(f[0], (float)(order[i] / 4), "chunk at %zu", order[i]);
    cr_assert_eq(f[len / 4 - 1], (float)((order[i] + len) / 4 - 1), "chunk at %zu", order[i]);
    storage_release(held);
  }
  reader_close(r);
  tensor_release(t);
}

/* A get's first chunks start copying when its transfer is made, before the
 * first is asked for (reader_read_ahead): READER_AHEAD blocks out at once,
 * each then served as it was read, and the series reads on ahead as
 * before.  Only before any read; nothing for a host reader. */
Test(readback, the_first_chunks_are_read_ahead_before_they_are_asked_for)
{
  tport_tensor *t = iota_on_sim(1000, 1000); /* 4,000,000 bytes */
  tport_err e;
  tensor_reader *r;
  cr_assert_eq(reader_open(t, 8, &r, &e), 0);
  const size_t chunk = 300000, n = 4000000;
  cr_assert_eq(reader_blocks_out(r), 0);
  reader_read_ahead(r, chunk);
  cr_assert_eq(reader_blocks_out(r), READER_AHEAD, "the first chunks are copying");
  reader_read_ahead(r, chunk); /* a second call starts nothing more */
  cr_assert_eq(reader_blocks_out(r), READER_AHEAD);
  for (size_t off = 0; off < n; off += chunk) {
    size_t len = n - off < chunk ? n - off : chunk;
    tport_storage *held;
    const uint8_t *p;
    cr_assert_eq(reader_read(r, off, len, &held, &p, &e), 0, "%s", e.msg);
    const float *f = (const float *)p;
    cr_assert_eq(f[0], (float)(off / 4), "chunk at %zu", off);
    cr_assert_eq(f[len / 4 - 1], (float)((off + len) / 4 - 1), "chunk at %zu", off);
    storage_release(held);
    /* the read itself and READER_AHEAD after it, fewer near the end */
    cr_assert_leq(reader_blocks_out(r), READER_AHEAD + 1);
  }
  reader_close(r);
  tensor_release(t);
  /* a tensor smaller than the chunk: one read of all of it */
  t = iota_on_sim(10, 10);
  cr_assert_eq(reader_open(t, 8, &r, &e), 0);
  reader_read_ahead(r, chunk);
  cr_assert_eq(reader_blocks_out(r), 1);
  tport_storage *held;
  const uint8_t *p;
  cr_assert_eq(reader_read(r, 0, 400, &held, &p, &e), 0, "%s", e.msg);
  cr_assert_eq(((const float *)p)[99], 99.0f);
  storage_release(held);
  reader_close(r);
  tensor_release(t);
  /* from the host: nothing to read ahead */
  float h[4] = {1, 2, 3, 4};
  tport_tensor *ht;
  cr_assert_eq(tensor_wrap_host(h, sizeof h, TPORT_FLOAT32, 1, (int64_t[]){4}, NULL, 0, &ht, &e),
               0);
  cr_assert_eq(reader_open(ht, 8, &r, &e), 0);
  reader_read_ahead(r, 8);
  cr_assert_eq(reader_blocks_out(r), 0);
  reader_close(r);
  tensor_release(ht);
}

Test(readback, a_block_outlives_its_reader_and_comes_home_from_a_deferred_release)
{
  tport_tensor *t = iota_on_sim(256, 1024); /* 1 MiB */
  tport_err e;
  tensor_reader *r;
  cr_assert_eq(reader_open(t, 2, &r, &e), 0);
  tensor_release(t); /* the reader holds it */
  tport_storage *held;
  const uint8_t *p;
  cr_assert_eq(reader_read(r, 512 << 10, 512 << 10, &held, &p, &e), 0);
  reader_close(r);
  cr_assert_eq(((const float *)p)[0], (float)(128 << 10), "the block is still the caller's");
  staging_stats before, after;
  staging_get_stats(staging_readback(), &before);
  /* as nng drops a sent reply: no reaper needed for the block to be back */
  storage_release_deferred(held);
  staging_get_stats(staging_readback(), &after);
  cr_assert_eq(before.bytes_in_use - after.bytes_in_use, 512 << 10);
}

/* A host tensor in logical C order is served from its own memory: each
 * read lends its storage, and no block of the pool is taken. */
Test(readback, a_contiguous_host_tensor_is_lent_as_it_is)
{
  int64_t n = 4096;
  float *h = malloc((size_t)n * sizeof *h);
  for (int64_t i = 0; i < n; i++)
    h[i] = (float)i;
  tport_tensor *t;
  tport_err e;
  cr_assert_eq(tensor_wrap_host(h, (size_t)n * sizeof *h, TPORT_FLOAT32, 1, &n, NULL, 0, &t, &e),
               0, "%s", e.msg);
  staging_stats before, after;
  staging_get_stats(staging_readback(), &before);
  tensor_reader *r;
  cr_assert_eq(reader_open(t, 2, &r, &e), 0, "%s", e.msg);
  cr_assert_eq(reader_nbytes(r), (size_t)n * sizeof *h);
  cr_assert_eq(reader_max_read(r), SIZE_MAX, "the host's memory has no block size");
  tport_storage *held[3];
  const uint8_t *p;
  for (int k = 0; k < 3; k++) { /* more than max_held at once: nothing is taken from a pool */
    cr_assert_eq(reader_read(r, 400, 4000, &held[k], &p, &e), 0, "%s", e.msg);
    cr_assert_eq(p, (const uint8_t *)h + 400, "the tensor's own bytes, not a copy");
    cr_assert_eq(storage_nbytes(held[k]), (size_t)n * sizeof *h, "its storage, lent whole");
  }
  cr_assert_eq(reader_blocks_out(r), 0);
  staging_get_stats(staging_readback(), &after);
  cr_assert_eq(after.hits + after.misses, before.hits + before.misses);
  for (int k = 0; k < 3; k++)
    storage_release(held[k]);
  cr_assert_eq(reader_read(r, 4, (size_t)n * sizeof *h, held, &p, &e), TPORT_OUT_OF_RANGE);
  reader_close(r);
  tensor_release(t);
  free(h);
}

/* A strided or negated host tensor is served from a copy in logical C
 * order, with its lazy bit applied. */
Test(readback, a_transposed_or_negated_host_tensor_is_read_from_a_copy)
{
  int64_t rows = 37, cols = 1031;
  size_t n = (size_t)(rows * cols);
  float *h = malloc(n * sizeof *h);
  for (size_t i = 0; i < n; i++)
    h[i] = (float)i;
  tport_tensor *t, *tr, *ng;
  tport_err e;
  cr_assert_eq(tensor_wrap_host(h, n * sizeof *h, TPORT_FLOAT32, 2, (int64_t[]){rows, cols}, NULL,
                                0, &t, &e),
               0, "%s", e.msg);
  cr_assert_eq(tensor_as_strided(t, 2, (int64_t[]){cols, rows}, (int64_t[]){1, cols}, 0, &tr, &e),
               0);
  cr_assert_eq(tensor_neg_view(t, &ng, &e), 0);
  tensor_reader *r;
  tport_storage *held;
  const uint8_t *p;
  cr_assert_eq(reader_open(tr, 2, &r, &e), 0, "%s", e.msg);
  cr_assert_eq(reader_read(r, 0, n * sizeof *h, &held, &p, &e), 0, "%s", e.msg);
  const float *v = (const float *)p;
  cr_assert(p < (const uint8_t *)h || p >= (const uint8_t *)(h + n), "a copy");
  for (int64_t i = 0; i < cols; i++)
    for (int64_t j = 0; j < rows; j++)
      cr_assert_eq(v[i * rows + j], (float)(j * cols + i), "element (%lld, %lld)", (long long)i,
                   (long long)j);
  storage_release(held);
  reader_close(r);
  cr_assert_eq(reader_open(ng, 2, &r, &e), 0, "%s", e.msg);
  cr_assert_eq(reader_read(r, 8, 40, &held, &p, &e), 0, "%s", e.msg);
  v = (const float *)p;
  for (int i = 0; i < 10; i++)
    cr_assert_eq(v[i], -(float)(i + 2));
  storage_release(held);
  reader_close(r);
  tensor_release(ng);
  tensor_release(tr);
  tensor_release(t);
  free(h);
}

Test(readback, pinned_memory_on_the_sim_is_allocated_populated_and_counted)
{
  int64_t allocs = sim_stat("sim_host_allocs"), bytes = sim_stat("sim_host_pinned_bytes");
  void *p;
  tport_err e;
  cr_assert_eq(backend_sim.host_alloc(3 << 20, &p, &e), 0);
  memset(p, 0xab, 3 << 20); /* every byte is there */
  cr_assert_eq(sim_stat("sim_host_allocs"), allocs + 1);
  cr_assert_geq(sim_stat("sim_host_pinned_bytes") - bytes, 3 << 20);
  backend_sim.host_free(p);
  cr_assert_eq(sim_stat("sim_host_pinned_bytes"), bytes);
}
