/* gemm.h — dequantize-then-f32 GEMM for products with many columns (see strata_gemm in strata.h).
 *
 * strata_matmul_run quantizes the activations and runs one quantized dot product per weight row
 * and column: right for one column (decode), slow for many (prefill), where each weight block
 * is decoded again for every tile of 16 columns. Here a tile of weight rows is decoded once to
 * floats with the type's exact dequant[isa] (F32 weights are used in place) and multiplied by
 * the float activations with a register-tiled FMA kernel (avx2_gemm.c; gemm.c has the scalar
 * one). Activations are not rounded to q8, so results are closer to the float product than
 * strata_matmul's, but not equal to them.
 *
 * Summation order (fixed, so results do not depend on n, tiling or the thread count, and the
 * scalar and AVX2 kernels agree bit for bit): product k of output (r, j) goes by FMA into lane
 * k % 8 of eight float accumulators, k ascending; a last partial group of eight adds 0*0 to the
 * lanes past the end; the lanes are reduced with strata_hsum8.
 */
#ifndef STRATA_KERNELS_CPU_GEMM_H
#define STRATA_KERNELS_CPU_GEMM_H

#include "matmul.h"

/* y[j*rows + r] = dot(W row r, x row j). Arguments already validated by the caller;
 * t->dequant must exist (every type with kernels has one). */
strata_status strata_gemm_run(strata_pool *pool, const strata_qtraits *t, int isa,
                              const void *w, int64_t rows, int64_t cols, const float *x,
                              int64_t n, float *y);

/* The items of strata_matmul_multi, each computed as strata_gemm_run would, in one pool job. */
strata_status strata_gemm_multi(strata_pool *pool, int isa, const strata_mm_item *items, int n_items);

/* The model's choice between the two paths: a product of type t with at least
 * strata_gemm_min_cols(t) columns goes to the GEMM, others to strata_matmul. By default float
 * weights (F32, F16, BF16) from 8 columns on, quantized weights never (measurements in gemm.c).
 * strata_gemm_set_from (strata.h's strata_set_gemm_from; pyrunner reads STRATA_GEMM into it): 0
 * turns the GEMM off, N > 0 sends every type to it from N columns on (to measure), < 0 restores the
 * default. Process-wide: the kernels sit below the model and take no params. */
int64_t strata_gemm_min_cols(const strata_qtraits *t);
int64_t strata_gemm_set_from(int64_t n_cols);
strata_status strata_mm_auto(strata_pool *pool, const strata_qtraits *t, int isa, const void *w,
                             int64_t rows, int64_t cols, const float *x, int64_t n, float *y);
/* Items with n >= strata_gemm_min_cols(t) run as one GEMM job, the rest as one matmul job. */
strata_status strata_mm_multi_auto(strata_pool *pool, int isa, const strata_mm_item *items, int n_items);

/* One block of the product, used by the driver: for i < nrow, j < ncol, the products
 * w[i*ldw + k] * x[j*ldx + k] for k < kc go into the eight lanes acc[(i*ncol + j)*8 + k%8]
 * (zeroed first when `first`); when `last`, y[j*ldy + i] = strata_hsum8 of the lanes.
 * kc is a multiple of 8 unless the block ends the row. */
typedef void (*strata_gemm_block_fn)(const float *w, size_t ldw, int nrow, const float *x, size_t ldx,
                                     int ncol, int64_t kc, int first, int last, float *acc,
                                     float *y, int64_t ldy);
#if STRATA_HAVE_AVX2
void strata_avx2_gemm_block(const float *w, size_t ldw, int nrow, const float *x, size_t ldx, int ncol,
                            int64_t kc, int first, int last, float *acc, float *y, int64_t ldy);
#endif

#endif
