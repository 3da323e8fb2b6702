/* test_cuda_jit.c: the runtime-compiled kernels compile with NVRTC for every
 * dtype pair and both index widths (no GPU needed), and a compile error is a
 * clear tensorport error. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "cuda_jit.h"

Test(cuda_jit, copy_kernel_compiles_for_every_pair, .timeout = 1200)
{
  for (int d = 0; d < TPORT_NUM_DTYPES; d++)
    for (int s = 0; s < TPORT_NUM_DTYPES; s++)
      for (int wide = 0; wide < 2; wide++) {
        /* both index widths for the diagonal and float32 rows; 32-bit for the rest */
        if (wide && !(d == s || d == TPORT_FLOAT32 || s == TPORT_FLOAT32))
          continue;
        void *bin = NULL;
        size_t n = 0;
        tport_err err;
        int rc =
            cuda_jit_compile_copy((tport_dtype)d, (tport_dtype)s, wide, "sm_90", &bin, &n, &err);
        cr_assert_eq(rc, 0, "copy %d <- %d: %s", d, s, err.msg);
        cr_assert_gt(n, 0);
        free(bin);
      }
}

Test(cuda_jit, bad_architecture_is_an_error)
{
  void *bin;
  size_t n;
  tport_err err;
  cr_assert_eq(cuda_jit_compile_copy(TPORT_FLOAT32, TPORT_FLOAT16, false, "sm_1", &bin, &n, &err),
               TPORT_INTERNAL);
  cr_assert(strstr(err.msg, "nvrtcCompileProgram"), "%s", err.msg);
}
