/* avx512_fp4.h — AVX-512 dot products of IQ4_NL, MXFP4, NVFP4 (avx512_fp4.c); the layouts, the
 * scalar references and the summation order live in quant/fmt_fp4.c. */
#ifndef STRATA_KERNELS_CPU_AVX512_FP4_H
#define STRATA_KERNELS_CPU_AVX512_FP4_H

#include "../../quant/quant.h"

#if STRATA_HAVE_AVX512
void strata_avx512_vec_dot_iq4_nl(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx512_vec_dot_mxfp4(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx512_vec_dot_nvfp4(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
/* quant.h rows kernels: what vec_dot gives, for nrows rows at once (avx512_fp4.c says which rows
 * take which kernel). */
void strata_avx512_rows_iq4_nl(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                               size_t x_stride, int ncols, float *y, int64_t ldy);
void strata_avx512_rows_mxfp4(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                              size_t x_stride, int ncols, float *y, int64_t ldy);
void strata_avx512_rows_nvfp4(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                              size_t x_stride, int ncols, float *y, int64_t ldy);
#endif

#endif
