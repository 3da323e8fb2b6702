/*
 * asan_poison.h: POISON/UNPOISON of memory an allocator of ours holds but
 * has not handed out (block_cache.c's cached blocks, arena.c's unused
 * bytes), so that AddressSanitizer reports a use of it; nothing in other
 * builds.  TPORT_ASAN is set where AddressSanitizer is on.
 */
#ifndef TPORT_ASAN_POISON_H
#define TPORT_ASAN_POISON_H

#if defined(__SANITIZE_ADDRESS__)
#define TPORT_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TPORT_ASAN 1
#endif
#endif

#ifdef TPORT_ASAN
#include <sanitizer/asan_interface.h>
#define POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define POISON(p, n) ((void)(p), (void)(n))
#define UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#endif
