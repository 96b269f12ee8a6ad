/* avx512_kquants.h — AVX-512 entry points of the K-quant family (avx512_kquants.c): vec_dot,
 * and the rows kernels matmul takes for several columns (same results bit for bit); block
 * layouts and the summation order they keep: avx2_kquants.h. */
#ifndef STRATA_KERNELS_CPU_AVX512_KQUANTS_H
#define STRATA_KERNELS_CPU_AVX512_KQUANTS_H

#include "avx2_kquants.h"

#if STRATA_HAVE_AVX512
void strata_avx512_vec_dot_q2_k(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx512_rows_q2_k(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                             int ncols, float *y, int64_t ldy);
void strata_avx512_vec_dot_q3_k(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx512_rows_q3_k(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                             int ncols, float *y, int64_t ldy);
void strata_avx512_vec_dot_q4_k(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx512_rows_q4_k(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                             int ncols, float *y, int64_t ldy);
void strata_avx512_vec_dot_q5_k(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx512_rows_q5_k(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                             int ncols, float *y, int64_t ldy);
void strata_avx512_vec_dot_q6_k(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx512_rows_q6_k(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                             int ncols, float *y, int64_t ldy);
void strata_avx512_vec_dot_iq4_xs(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx512_rows_iq4_xs(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                             int ncols, float *y, int64_t ldy);
#endif

#endif
