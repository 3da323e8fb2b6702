/* arena.c: the bump allocator of protobuf-c messages (arena.h). */
#include "arena.h"

#include <stdint.h>
#include <stdlib.h>

#include "asan_poison.h"

/* The first block: a request's message is a few KiB (a batch of 256 puts
 * unpacks into ~100 KiB).  Each next block is as large as all before it
 * (or the allocation), and a reset that finds several makes them one, up
 * to ARENA_KEEP_MAX: a run of like messages unpacks into one block with no
 * malloc at all. */
#define ARENA_BLOCK_BYTES ((size_t)64 << 10)
#define ARENA_KEEP_MAX ((size_t)4 << 20)
#define ARENA_ALIGN 16

struct arena_block {
  arena_block *next;
  size_t size, used;
  _Alignas(ARENA_ALIGN) unsigned char data[];
};

static void *arena_alloc(void *data, size_t size)
{
  arena *a = data;
  size_t need = (size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
  if (need < size)
    return NULL; /* overflow */
  arena_block *b = a->head;
  if (!b || b->size - b->used < need) {
    size_t held = 0;
    for (arena_block *o = b; o; o = o->next)
      held += o->size;
    size_t bytes = held > ARENA_BLOCK_BYTES ? held : ARENA_BLOCK_BYTES;
    if (need > bytes)
      bytes = need;
    if (bytes > SIZE_MAX - sizeof *b)
      return NULL;
    arena_block *nb = malloc(sizeof *nb + bytes);
    if (!nb)
      return NULL;
    nb->size = bytes;
    nb->used = 0;
    POISON(nb->data, bytes);
    nb->next = b;
    a->head = b = nb;
  }
  void *p = b->data + b->used;
  b->used += need;
  UNPOISON(p, size);
  return p;
}

static void arena_free(void *data, void *p)
{
  (void)data, (void)p; /* all at once, at arena_reset */
}

void arena_init(arena *a)
{
  a->head = NULL;
  a->allocator.alloc = arena_alloc;
  a->allocator.free = arena_free;
  a->allocator.allocator_data = a;
}

void arena_reset(arena *a)
{
  arena_block *b = a->head;
  if (b && !b->next) { /* the message fit in one block: the usual case */
    b->used = 0;
    POISON(b->data, b->size);
    return;
  }
  /* it took several: one block as large as all of them (up to
   * ARENA_KEEP_MAX) for the next, which is likely alike -- without it each
   * message would malloc and free its extra blocks, and glibc grows and
   * trims its heap for them (page faults, system calls) every time */
  size_t held = 0;
  for (arena_block *o = b; o; o = o->next)
    held += o->size;
  arena_fini(a);
  if (held > ARENA_KEEP_MAX)
    return;
  arena_block *nb = malloc(sizeof *nb + held);
  if (!nb)
    return; /* the next message makes its blocks again */
  nb->next = NULL;
  nb->size = held;
  nb->used = 0;
  POISON(nb->data, held);
  a->head = nb;
}

void arena_fini(arena *a)
{
  for (arena_block *b = a->head, *next; b; b = next) {
    next = b->next;
    UNPOISON(b->data, b->size);
    free(b);
  }
  a->head = NULL;
}

size_t arena_blocks(const arena *a)
{
  size_t n = 0;
  for (const arena_block *b = a->head; b; b = b->next)
    n++;
  return n;
}
