/* avx2_iq.h — AVX2 kernels of IQ2_XXS, IQ2_XS and IQ3_XXS (avx2_iq.c); the scalar
 * references and the block layouts are in quant/fmt_iq.c. Call only after
 * strata_cpu_has_avx2() said yes. */
#ifndef STRATA_KERNELS_CPU_AVX2_IQ_H
#define STRATA_KERNELS_CPU_AVX2_IQ_H

#include "../../quant/quant.h"

#if STRATA_HAVE_AVX2
void strata_avx2_dequant_iq2_xxs(const void *src, float *dst, int64_t n);
void strata_avx2_dequant_iq2_xs(const void *src, float *dst, int64_t n);
void strata_avx2_dequant_iq3_xxs(const void *src, float *dst, int64_t n);

void strata_avx2_vec_dot_iq2_xxs(int64_t n, const void *w, const void *x, size_t x_stride,
                                 int ncols, float *y);
void strata_avx2_vec_dot_iq2_xs(int64_t n, const void *w, const void *x, size_t x_stride,
                                int ncols, float *y);
void strata_avx2_vec_dot_iq3_xxs(int64_t n, const void *w, const void *x, size_t x_stride,
                                 int ncols, float *y);
#endif

#endif
