/*
 * chaos_values.h: the reference values of the chaos client (chaos_client.c):
 * its random numbers, the conversions it computes itself to know what the
 * server must answer, random values of every dtype and the digest that
 * compares them.  A conversion here is exact only to a dtype that holds
 * every value of the origin (the holds table of chaos_values.c), which is
 * all the client asks for.
 */
#ifndef TPORT_CHAOS_VALUES_H
#define TPORT_CHAOS_VALUES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tport.h"

/* ---------------------------------------------------------------- randomness */

/* splitmix64's state: the client seeds it with its seed, once. */
extern uint64_t rng;
uint64_t rnd(void);
/* 0 .. n-1 (0 when n <= 0). */
int64_t below(int64_t n);
bool chance(int percent);

/* ---------------------------------------------------------------- values */

/* A dtype n values of origin o (now of dtype now) may exactly be converted
 * to, within 2 MiB (so that widening a 1 MiB int8 tensor to complex128 does
 * not make a 16 MiB one): now itself at worst. */
tport_dtype exact_target(tport_dtype o, tport_dtype now, int64_t n);
/* n values of dtype s at src as dtype d at dst (exact by the holds table). */
void convert(const uint8_t *src, tport_dtype s, uint8_t *dst, tport_dtype d, int64_t n);
/* n random values valid for d; with nan, float bits are left raw (NaNs of
 * any payload), else NaN patterns are turned into numbers. */
void random_values(tport_dtype d, uint8_t *p, int64_t n, bool nan);
/* FNV-1a over n bytes. */
uint64_t fnv1a(const uint8_t *p, size_t n);

#endif
