/* amx_legacy.h — AMX products of Q8_0 (amx_legacy.c); the layout, the scalar reference and the
 * summation order live in quant/fmt_legacy.c. */
#ifndef STRATA_KERNELS_CPU_AMX_LEGACY_H
#define STRATA_KERNELS_CPU_AMX_LEGACY_H

#include "../../quant/quant.h"

#if STRATA_HAVE_AMX
/* quant.h rows kernel: what vec_dot gives, for nrows rows at once. Products of fewer than 12
 * columns or 32 rows, and rows over 512 blocks, go to the AVX-512 path's (strata_avx512_rows_q8_0). */
void strata_amx_rows_q8_0(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                          int ncols, float *y, int64_t ldy);
#endif

#endif
