/*
 * emu_cubin.h: the "cubin" of the emulation.  The emulated NVRTC
 * (nvrtc_emu.c) compiles nothing: it checks the options as NVRTC would and
 * returns this descriptor naming the variant they select; the emulated
 * runtime (cudart_emu.c) loads it and finds that variant among the ones the
 * build compiled from the same copy.cu (emu_sched.h).  It travels through
 * engine/cuda/cuda_jit.c's memory and disk caches exactly as a real cubin does.
 */
#ifndef TPORT_EMU_CUBIN_H
#define TPORT_EMU_CUBIN_H

#include <stddef.h>
#include <stdint.h>

/* starts with 0x7f, like the ELF file a real cubin is */
#define EMU_CUBIN_MAGIC "\177TPEMU1\n"

typedef struct emu_cubin {
  char magic[8];
  int32_t dst, src;     /* -DTPORT_DST, -DTPORT_SRC */
  int32_t idx_bits;     /* -DTPORT_IDX: 16, 32 or 64 */
  int32_t arch;         /* --gpu-architecture=sm_XY: XY (90 for sm_90) */
  char arch_suffix;     /* 0, 'a' (sm_90a) or 'f' (sm_100f) */
  uint8_t fmad;         /* --fmad: 1 (NVRTC's default) or 0 */
  uint8_t fast_math;    /* --use_fast_math was given (it implies --fmad=true, --ftz=true) */
  uint8_t ftz;          /* --ftz: 1 (subnormals flushed) or 0 (NVRTC's default) */
  uint32_t source_hash; /* emu_fnv1a of the program's source text */
  uint32_t check;       /* emu_fnv1a of every byte before this field */
} emu_cubin;

static inline uint32_t emu_fnv1a(const void *p, size_t n)
{
  const unsigned char *b = (const unsigned char *)p;
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * 16777619u;
  return h;
}

static inline uint32_t emu_cubin_check(const emu_cubin *c)
{
  return emu_fnv1a(c, offsetof(emu_cubin, check));
}

#endif
