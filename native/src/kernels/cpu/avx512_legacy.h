/* avx512_legacy.h — AVX-512 dot products of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (avx512_legacy.c); the
 * layouts, the scalar references and the summation order live in quant/fmt_legacy.c. */
#ifndef STRATA_KERNELS_CPU_AVX512_LEGACY_H
#define STRATA_KERNELS_CPU_AVX512_LEGACY_H

#include "../../quant/quant.h"

#if STRATA_HAVE_AVX512
void strata_avx512_vec_dot_q4_0(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx512_vec_dot_q4_1(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx512_vec_dot_q5_0(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx512_vec_dot_q5_1(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx512_vec_dot_q8_0(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
/* quant.h rows kernels: what vec_dot gives, for nrows rows at once (avx512_q8.h z8_rows). */
void strata_avx512_rows_q4_0(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                             int ncols, float *y, int64_t ldy);
void strata_avx512_rows_q4_1(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                             int ncols, float *y, int64_t ldy);
void strata_avx512_rows_q5_0(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                             int ncols, float *y, int64_t ldy);
void strata_avx512_rows_q5_1(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                             int ncols, float *y, int64_t ldy);
void strata_avx512_rows_q8_0(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                             int ncols, float *y, int64_t ldy);
#endif

#endif
