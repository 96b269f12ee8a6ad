/* avx2_fp4.h — AVX2 kernels of IQ4_NL, MXFP4, NVFP4 (avx2_fp4.c), and the scalar decoders
 * of the MXFP4/NVFP4 scale bytes that the scalar reference (quant/fmt_fp4.c, which also
 * describes the layouts and the summation order) and the AVX2 code share. */
#ifndef STRATA_KERNELS_CPU_AVX2_FP4_H
#define STRATA_KERNELS_CPU_AVX2_FP4_H

#include "../../quant/quant.h"

/* E8M0 scale of an MXFP4 block, halved (the value tables hold doubled E2M1 values):
 * 2^(e - 128); e = 0 and 1 give the subnormals 2^-128 and 2^-127. Never NaN. */
static inline float strata_e8m0_half(uint8_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* UE4M3 sub-block scale of an NVFP4 block, halved as above: exponent bits 6..3 (bias 7),
 * mantissa bits 2..0; bit 7 is ignored and 0x7f (E4M3's NaN) reads as 0, as gguf.quants
 * decodes it. Every result is m * 2^k with m < 16, so products with small integers are exact. */
static inline float strata_ue4m3_half(uint8_t x) {
    if (x == 0x7f) return 0.0f;
    const uint32_t e = (x >> 3) & 0x0fu, m = x & 0x07u;
    if (e == 0) return (float)m * 0x1p-10f;
    const uint32_t bits = ((e + 119u) << 23) | (m << 20); /* (1 + m/8) * 2^(e-7) / 2 */
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

#if STRATA_HAVE_AVX2
void strata_avx2_dequant_iq4_nl(const void *src, float *dst, int64_t n);
void strata_avx2_dequant_mxfp4(const void *src, float *dst, int64_t n);
void strata_avx2_dequant_nvfp4(const void *src, float *dst, int64_t n);
void strata_avx2_vec_dot_iq4_nl(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx2_vec_dot_mxfp4(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx2_vec_dot_nvfp4(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
/* Rows 0..nrows-1 of IQ4_NL / MXFP4 / NVFP4 weights (w_row bytes apart, n values each) times
 * ncols act_q8_32 columns (x_stride bytes apart): y[c * ldy + r] = what the
 * type's vec_dot returns for row r and column c, bit for bit, computed eight rows at a time
 * (avx2_fp4.c). */
void strata_avx2_rows_iq4_nl(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                             size_t x_stride, int ncols, float *y, int64_t ldy);
void strata_avx2_rows_mxfp4(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                            size_t x_stride, int ncols, float *y, int64_t ldy);
void strata_avx2_rows_nvfp4(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                            size_t x_stride, int ncols, float *y, int64_t ldy);
#endif

#endif
