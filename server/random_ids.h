/*
 * random_ids.h: unguessable ids -- tensor handles, transfer ids -- drawn
 * from OpenSSL's CSPRNG through a buffer of each thread's.
 */
#ifndef TPORT_RANDOM_IDS_H
#define TPORT_RANDOM_IDS_H

#include <stdbool.h>
#include <stddef.h>

/* n random bytes into out (any n; more than the buffer goes to RAND_bytes
 * directly).  false: the CSPRNG failed (out is then not to be used). */
bool random_ids(void *out, size_t n);
/* Wipes this thread's buffer (a thread that ends: what no one has seen
 * is not left in freed memory). */
void random_ids_thread_end(void);

#endif
