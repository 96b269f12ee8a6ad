/* avx2_float.h — AVX2 kernels of F32, F16, BF16 (avx2_float.c); the scalar references and
 * the summation order they share live in quant/fmt_float.c. */
#ifndef STRATA_KERNELS_CPU_AVX2_FLOAT_H
#define STRATA_KERNELS_CPU_AVX2_FLOAT_H

#include "../../quant/quant.h"

#if STRATA_HAVE_AVX2
void strata_avx2_dequant_f16(const void *src, float *dst, int64_t n);
void strata_avx2_dequant_bf16(const void *src, float *dst, int64_t n);
void strata_avx2_vec_dot_f32(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx2_vec_dot_f16(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx2_vec_dot_bf16(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
#endif

#endif
