/* avx512_iq.h — AVX-512 (F/BW/VL + VNNI + VBMI) dot products of IQ2_XXS, IQ2_XS and IQ3_XXS
 * (avx512_iq.c); the scalar references and the block layouts are in quant/fmt_iq.c. Dequantization
 * stays on the AVX2 kernels (the registry's fallback). Call only after
 * strata_cpu_has_isa(STRATA_ISA_IDX_AVX512) said yes. */
#ifndef STRATA_KERNELS_CPU_AVX512_IQ_H
#define STRATA_KERNELS_CPU_AVX512_IQ_H

#include "../../quant/quant.h"

#if STRATA_HAVE_AVX512
void strata_avx512_vec_dot_iq2_xxs(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx512_vec_dot_iq2_xs(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx512_vec_dot_iq3_xxs(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);

/* Rows kernels (quant.h strata_rows_fn) over activations stored biased (q ^ 0x80, matmul.c calls
 * strata_act_bias_q8_256 for them: STRATA_ROWS_BIASED): y[c * ldy + r] = the type's vec_dot of row
 * r and the unbiased column c, bit for bit. */
void strata_avx512_rows_iq2_xxs(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                                size_t x_stride, int ncols, float *y, int64_t ldy);
void strata_avx512_rows_iq2_xs(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                               size_t x_stride, int ncols, float *y, int64_t ldy);
void strata_avx512_rows_iq3_xxs(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                                size_t x_stride, int ncols, float *y, int64_t ldy);

/* Converted rows (quant.h strata_conv_fn / strata_conv_dot_fn): int16 weights with the scale folded
 * in, 16 rows across the lanes; conv_dot_iq2 serves IQ2_XXS and IQ2_XS, conv_dot_iq3 IQ3_XXS. */
size_t strata_avx512_conv_iq2_xxs(int64_t n, const void *w, size_t w_row, int64_t nrows, void *dst);
size_t strata_avx512_conv_iq2_xs(int64_t n, const void *w, size_t w_row, int64_t nrows, void *dst);
size_t strata_avx512_conv_iq3_xxs(int64_t n, const void *w, size_t w_row, int64_t nrows, void *dst);
void strata_avx512_conv_dot_iq2(int64_t n, const void *conv, int64_t nrows, const void *x, size_t x_stride,
                                const int16_t *x16, int ncols, float *y, int64_t ldy);
void strata_avx512_conv_dot_iq3(int64_t n, const void *conv, int64_t nrows, const void *x, size_t x_stride,
                                const int16_t *x16, int ncols, float *y, int64_t ldy);
#endif

#endif
