/*
 * fuzz_target.h: the entry points of a libFuzzer harness, declared once.
 *
 * Each harness of tests/fuzz defines LLVMFuzzerTestOneInput (and
 * fuzz_server.c also LLVMFuzzerInitialize).  They are linked either with
 * libFuzzer (TPORT_FUZZ=ON, clang: `make fuzz`) or with replay_main.c, which
 * runs the checked-in corpus and regressions as a ctest in every build.
 * LLVMFuzzerInitialize is weak, as libFuzzer declares it: a harness without
 * one leaves it NULL.
 */
#ifndef TPORT_FUZZ_TARGET_H
#define TPORT_FUZZ_TARGET_H

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A finding the sanitizers would not see (a broken invariant, a missing
 * reply): printed, then abort(), which libFuzzer reports as a crash. */
#define FUZZ_CHECK(cond, ...)                                                                      \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s: ", __FILE__, __LINE__, #cond);              \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fputc('\n', stderr);                                                                         \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

#endif
