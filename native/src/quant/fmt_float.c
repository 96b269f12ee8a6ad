/*
 * fmt_float.c — F32, F16, BF16: scalar reference.
 *
 * Layouts (little-endian, "block" = one value):
 *   F32   4 bytes  IEEE binary32
 *   F16   2 bytes  IEEE binary16
 *   BF16  2 bytes  the upper half of a binary32 (value = bits << 16)
 *
 * Dequantization is exact for every bit pattern (NaN payloads kept where the hardware keeps
 * them). Dot products take plain float activations (STRATA_ACT_F32).
 *
 * Summation order of vec_dot (the AVX2 path does exactly the same): the GEMM's (kernels/cpu/gemm.h),
 * so a product gives the same bits whichever path its column count sends it to (batched sequences
 * depend on it: strata_batch_eval): element i goes to lane i % 8 by acc[i % 8] = fmaf(w_i, x_i,
 * acc[i % 8]), i ascending; when n % 8 != 0 the lanes past the end get fmaf(0, 0, acc) once, as the
 * GEMM's padded last group does; the lanes are reduced with strata_hsum8. (Before batching this was
 * 32 lanes for FMA-latency headroom; one column now runs one chain of eight lanes.)
 */
#include "quant.h"

#include "../kernels/cpu/avx2_float.h"

/* ---------------------------------------------------------------- dequantization */

static void dequant_f32(const void *src, float *dst, int64_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}

static void dequant_f16(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) dst[i] = strata_fp16_to_fp32(strata_rd_u16(p + 2 * i));
}

static void dequant_bf16(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) dst[i] = strata_bf16_to_fp32(strata_rd_u16(p + 2 * i));
}

/* ---------------------------------------------------------------- dot products */

enum { FLOAT_LANES = 8 };

static float lanes_reduce(float acc[FLOAT_LANES], int64_t n) {
    if (n % FLOAT_LANES)
        for (int64_t q = n % FLOAT_LANES; q < FLOAT_LANES; q++) acc[q] = fmaf(0.0f, 0.0f, acc[q]);
    return strata_hsum8(acc);
}

static float dot1_f32(int64_t n, const uint8_t *w, const float *x) {
    float acc[FLOAT_LANES] = {0};
    for (int64_t i = 0; i < n; i++) {
        float wi;
        memcpy(&wi, w + 4 * i, 4);
        acc[i % FLOAT_LANES] = fmaf(wi, x[i], acc[i % FLOAT_LANES]);
    }
    return lanes_reduce(acc, n);
}

static float dot1_f16(int64_t n, const uint8_t *w, const float *x) {
    float acc[FLOAT_LANES] = {0};
    for (int64_t i = 0; i < n; i++) {
        const float wi = strata_fp16_to_fp32(strata_rd_u16(w + 2 * i));
        acc[i % FLOAT_LANES] = fmaf(wi, x[i], acc[i % FLOAT_LANES]);
    }
    return lanes_reduce(acc, n);
}

static float dot1_bf16(int64_t n, const uint8_t *w, const float *x) {
    float acc[FLOAT_LANES] = {0};
    for (int64_t i = 0; i < n; i++) {
        const float wi = strata_bf16_to_fp32(strata_rd_u16(w + 2 * i));
        acc[i % FLOAT_LANES] = fmaf(wi, x[i], acc[i % FLOAT_LANES]);
    }
    return lanes_reduce(acc, n);
}

static void vec_dot_f32(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    for (int c = 0; c < ncols; c++)
        y[c] = dot1_f32(n, w, (const float *)((const char *)x + (size_t)c * x_stride));
}

static void vec_dot_f16(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    for (int c = 0; c < ncols; c++)
        y[c] = dot1_f16(n, w, (const float *)((const char *)x + (size_t)c * x_stride));
}

static void vec_dot_bf16(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    for (int c = 0; c < ncols; c++)
        y[c] = dot1_bf16(n, w, (const float *)((const char *)x + (size_t)c * x_stride));
}

/* ---------------------------------------------------------------- registration */

#if STRATA_HAVE_AVX2
#define AVX2_FN(f) f
#else
#define AVX2_FN(f) NULL
#endif

void strata_quant_register_float(strata_qtraits *t) {
    t[GT_F32] = (strata_qtraits){
        .name = "F32", .type = GT_F32, .block_size = 1, .type_size = 4, .act = STRATA_ACT_F32,
        .dequant = {dequant_f32, NULL},  /* a copy: the scalar one is as fast as any */
        .vec_dot = {vec_dot_f32, AVX2_FN(strata_avx2_vec_dot_f32)}};
    t[GT_F16] = (strata_qtraits){
        .name = "F16", .type = GT_F16, .block_size = 1, .type_size = 2, .act = STRATA_ACT_F32,
        .dequant = {dequant_f16, AVX2_FN(strata_avx2_dequant_f16)},
        .vec_dot = {vec_dot_f16, AVX2_FN(strata_avx2_vec_dot_f16)}};
    t[GT_BF16] = (strata_qtraits){
        .name = "BF16", .type = GT_BF16, .block_size = 1, .type_size = 2, .act = STRATA_ACT_F32,
        .dequant = {dequant_bf16, AVX2_FN(strata_avx2_dequant_bf16)},
        .vec_dot = {vec_dot_bf16, AVX2_FN(strata_avx2_vec_dot_bf16)}};
}
