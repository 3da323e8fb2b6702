/* test_arena.c: protobuf-c messages unpacked into an arena (proto/arena.c):
 * the same values as a malloc'ed unpack, aligned allocations across
 * blocks, one allocation larger than a block, a reset that keeps a block
 * for the next message, and sizes that would overflow refused. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "arena.h"
#include "tport.pb-c.h"

static uint8_t *packed_batch(size_t n, size_t *len)
{
  Tport__PutBeginRequest *qs = calloc(n, sizeof *qs), **qp = calloc(n, sizeof *qp);
  Tport__TensorDesc *ds = calloc(n, sizeof *ds);
  int64_t *sizes = calloc(n, sizeof *sizes);
  uint64_t *lens = calloc(n, sizeof *lens);
  for (size_t i = 0; i < n; i++) {
    tport__put_begin_request__init(&qs[i]);
    tport__tensor_desc__init(&ds[i]);
    sizes[i] = (int64_t)i + 1;
    ds[i].n_sizes = 1;
    ds[i].sizes = &sizes[i];
    ds[i].dtype = TPORT__DTYPE__DTYPE_UINT8;
    qs[i].desc = &ds[i];
    qs[i].name = i % 2 ? "odd" : "even";
    qs[i].commit = true;
    qp[i] = &qs[i];
    lens[i] = (uint64_t)i + 1;
  }
  Tport__PutBatchRequest q = TPORT__PUT_BATCH_REQUEST__INIT;
  q.n_puts = q.n_payload_bytes = n;
  q.puts = qp;
  q.payload_bytes = lens;
  *len = protobuf_c_message_get_packed_size(&q.base);
  uint8_t *buf = malloc(*len);
  protobuf_c_message_pack(&q.base, buf);
  free(qs), free(qp), free(ds), free(sizes), free(lens);
  return buf;
}

Test(arena, a_message_unpacked_in_it_reads_as_a_mallocd_one)
{
  size_t len;
  uint8_t *buf = packed_batch(4096, &len); /* ~ 40 K fields: several blocks */
  arena a;
  arena_init(&a);
  Tport__PutBatchRequest *m = tport__put_batch_request__unpack(&a.allocator, len, buf);
  Tport__PutBatchRequest *h = tport__put_batch_request__unpack(NULL, len, buf);
  cr_assert_not_null(m);
  cr_assert_not_null(h);
  cr_assert_eq(m->n_puts, 4096);
  cr_assert_gt(arena_blocks(&a), 1);
  for (size_t i = 0; i < m->n_puts; i++) {
    cr_assert_eq(m->puts[i]->desc->sizes[0], h->puts[i]->desc->sizes[0]);
    cr_assert_str_eq(m->puts[i]->name, h->puts[i]->name);
    cr_assert_eq(m->payload_bytes[i], i + 1);
    cr_assert_eq((uintptr_t)m->puts[i] % 16, 0, "every allocation is 16-byte aligned");
  }
  tport__put_batch_request__free_unpacked(h, NULL);
  /* a reset keeps a block; the next message unpacks the same */
  arena_reset(&a);
  cr_assert_eq(arena_blocks(&a), 1, "one block kept for the next message");
  m = tport__put_batch_request__unpack(&a.allocator, len, buf);
  cr_assert_not_null(m);
  cr_assert_eq(m->puts[4095]->desc->sizes[0], 4096);
  arena_fini(&a);
  cr_assert_null(a.head);
  free(buf);
}

Test(arena, blocks_grow_and_a_reset_keeps_the_largest)
{
  arena a;
  arena_init(&a);
  uint8_t *small = a.allocator.alloc(a.allocator.allocator_data, 100);
  uint8_t *after = a.allocator.alloc(a.allocator.allocator_data, 100);
  cr_assert(small && after);
  cr_assert_eq(after, small + 112, "small ones fill one block, 16-byte aligned");
  uint8_t *big = a.allocator.alloc(a.allocator.allocator_data, (size_t)1 << 20);
  cr_assert_not_null(big);
  memset(big, 0xab, (size_t)1 << 20);
  memset(small, 1, 100);
  memset(after, 2, 100);
  cr_assert_eq(arena_blocks(&a), 2);
  /* the next block is as large as all before it: no block per allocation */
  for (int i = 0; i < 1000; i++)
    cr_assert_not_null(a.allocator.alloc(a.allocator.allocator_data, 1000));
  cr_assert_leq(arena_blocks(&a), 3);
  cr_assert_null(a.allocator.alloc(a.allocator.allocator_data, SIZE_MAX));
  cr_assert_null(a.allocator.alloc(a.allocator.allocator_data, SIZE_MAX - 8));
  arena_reset(&a);
  cr_assert_eq(arena_blocks(&a), 1, "one block as large as all of them stays");
  /* and the same run of allocations fits in it now */
  cr_assert_not_null(a.allocator.alloc(a.allocator.allocator_data, 100));
  cr_assert_not_null(a.allocator.alloc(a.allocator.allocator_data, 100));
  cr_assert_not_null(a.allocator.alloc(a.allocator.allocator_data, (size_t)1 << 20));
  for (int i = 0; i < 1000; i++)
    cr_assert_not_null(a.allocator.alloc(a.allocator.allocator_data, 1000));
  cr_assert_eq(arena_blocks(&a), 1);
  /* past 4 MiB nothing is kept */
  cr_assert_not_null(a.allocator.alloc(a.allocator.allocator_data, (size_t)8 << 20));
  arena_reset(&a);
  cr_assert_eq(arena_blocks(&a), 0);
  cr_assert_not_null(a.allocator.alloc(a.allocator.allocator_data, (size_t)2 << 20));
  arena_fini(&a);
  cr_assert_eq(arena_blocks(&a), 0);
}
