/* arena.c: the bump allocator of protobuf-c messages (arena.h). */
#include "arena.h"

#include <stdint.h>
#include <stdlib.h>

#if defined(__SANITIZE_ADDRESS__)
#define ARENA_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ARENA_ASAN 1
#endif
#endif
#ifdef ARENA_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* The usual block: a request's message is a few KiB (a batch of 256 puts
 * unpacks into ~60 KiB); a larger one gets blocks of its own size. */
#define ARENA_BLOCK_BYTES ((size_t)64 << 10)
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
    size_t bytes = need > ARENA_BLOCK_BYTES ? need : ARENA_BLOCK_BYTES;
    if (bytes > SIZE_MAX - sizeof *b)
      return NULL;
    arena_block *nb = malloc(sizeof *nb + bytes);
    if (!nb)
      return NULL;
    nb->size = bytes;
    nb->used = 0;
    POISON(nb->data, bytes);
    /* a block made for one large allocation goes behind the head, which
     * keeps filling */
    if (b && bytes > ARENA_BLOCK_BYTES) {
      nb->next = b->next;
      b->next = nb;
    } else {
      nb->next = b;
      a->head = nb;
    }
    b = nb;
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
  /* keep one block of the usual size: the next message is likely alike */
  arena_block *keep = NULL;
  for (arena_block *b = a->head, *next; b; b = next) {
    next = b->next;
    if (!keep && b->size == ARENA_BLOCK_BYTES) {
      keep = b;
      continue;
    }
    UNPOISON(b->data, b->size);
    free(b);
  }
  if (keep) {
    keep->next = NULL;
    keep->used = 0;
    POISON(keep->data, keep->size);
  }
  a->head = keep;
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
