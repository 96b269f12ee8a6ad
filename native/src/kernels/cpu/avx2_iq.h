/* avx2_iq.h — AVX2 kernels of IQ2_XXS, IQ2_XS and IQ3_XXS (avx2_iq.c); the scalar
 * references and the block layouts are in quant/fmt_iq.c. Call only after
 * strata_cpu_has_isa(STRATA_ISA_IDX_AVX2) said yes. */
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

/* Products of several columns against activations whose codes are stored biased (q ^ 0x80, see
 * strata_act_bias_q8_256): rows 0..nrows-1 (w_row bytes apart, n values each) times ncols
 * act_q8_256 columns (x_stride bytes apart): y[c * ldy + r] = the type's vec_dot of row r and the
 * unbiased column c, bit for bit (avx2_iq.c). */
void strata_avx2_rows_iq2_xxs(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                              int ncols, float *y, int64_t ldy);
void strata_avx2_rows_iq2_xs(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                             int ncols, float *y, int64_t ldy);
void strata_avx2_rows_iq3_xxs(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                              int ncols, float *y, int64_t ldy);
/* Flips bit 7 of every code of an act_q8_256 row of n values (its own inverse). */
void strata_act_bias_q8_256(void *x, int64_t n);
#endif

#endif
