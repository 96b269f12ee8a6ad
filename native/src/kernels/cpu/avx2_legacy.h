/* avx2_legacy.h — AVX2 kernels of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (avx2_legacy.c); the block
 * layouts, scalar references and the summation order they share live in quant/fmt_legacy.c. */
#ifndef STRATA_KERNELS_CPU_AVX2_LEGACY_H
#define STRATA_KERNELS_CPU_AVX2_LEGACY_H

#include "../../quant/quant.h"

#if STRATA_HAVE_AVX2
void strata_avx2_dequant_q4_0(const void *src, float *dst, int64_t n);
void strata_avx2_dequant_q4_1(const void *src, float *dst, int64_t n);
void strata_avx2_dequant_q5_0(const void *src, float *dst, int64_t n);
void strata_avx2_dequant_q5_1(const void *src, float *dst, int64_t n);
void strata_avx2_dequant_q8_0(const void *src, float *dst, int64_t n);
void strata_avx2_vec_dot_q4_0(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx2_vec_dot_q4_1(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx2_vec_dot_q5_0(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx2_vec_dot_q5_1(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx2_vec_dot_q8_0(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
/* quant.h strata_rows_fn: vec_dot's results for nrows rows at once (products of several columns) */
void strata_avx2_rows_q4_0(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                           int ncols, float *y, int64_t ldy);
void strata_avx2_rows_q4_1(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                           int ncols, float *y, int64_t ldy);
void strata_avx2_rows_q5_0(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                           int ncols, float *y, int64_t ldy);
void strata_avx2_rows_q5_1(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                           int ncols, float *y, int64_t ldy);
void strata_avx2_rows_q8_0(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                           int ncols, float *y, int64_t ldy);
#endif

#endif
