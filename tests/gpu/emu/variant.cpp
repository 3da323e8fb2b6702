/*
 * variant.cpp: one variant of kernels/cuda/copy.cu as host code, as NVRTC
 * would compile it for one (TPORT_DST, TPORT_SRC, TPORT_IDX).  The build
 * compiles this file once per variant through a generated two-line wrapper
 * (CMakeLists.txt) that defines those three and renames the kernels.
 *
 * Why the renames: the kernels are extern "C", and extern "C" names stay
 * global even inside an unnamed namespace (g++ 12), so every variant would
 * define the same three symbols.  Why the unnamed namespace all the same:
 * copy.cu's inline functions (load, store, convert, ...) have one name and a
 * different body per variant; with external linkage the linker would keep
 * one body for all of them, and every variant would convert as one pair.
 */
#include "emu.h"

#if !defined(TPORT_DST) || !defined(TPORT_SRC) || !defined(TPORT_IDX)
#error "variant.cpp needs TPORT_DST, TPORT_SRC and TPORT_IDX"
#endif

namespace
{

#include "copy.cu"

// The launch's view: args[0] points to the struct Params, as for cudaLaunchKernel.
void run_copy(void **args)
{
  tport_copy(*static_cast<const Params *>(args[0]));
}
void run_transpose(void **args)
{
  tport_transpose(*static_cast<const Params *>(args[0]));
}
void run_cast_vec(void **args)
{
  tport_cast_vec(*static_cast<const Params *>(args[0]));
}

struct registration {
  registration()
  {
    const int bits = (int)sizeof(TPORT_IDX) * 8;
    emu_register_kernel(TPORT_DST, TPORT_SRC, bits, "tport_copy", run_copy);
    emu_register_kernel(TPORT_DST, TPORT_SRC, bits, "tport_transpose", run_transpose);
    emu_register_kernel(TPORT_DST, TPORT_SRC, bits, "tport_cast_vec", run_cast_vec);
  }
} registered;

} // namespace
