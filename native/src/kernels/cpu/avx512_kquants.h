/* avx512_kquants.h — AVX-512 entry points of the K-quant family (avx512_kquants.c); block
 * layouts and the summation order they keep: avx2_kquants.h. */
#ifndef STRATA_KERNELS_CPU_AVX512_KQUANTS_H
#define STRATA_KERNELS_CPU_AVX512_KQUANTS_H

#include "avx2_kquants.h"

#if STRATA_HAVE_AVX512
void strata_avx512_vec_dot_q2_k(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx512_vec_dot_q3_k(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx512_vec_dot_q4_k(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx512_vec_dot_q5_k(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx512_vec_dot_q6_k(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx512_vec_dot_iq4_xs(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
#endif

#endif
