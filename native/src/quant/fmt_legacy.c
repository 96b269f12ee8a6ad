/*
 * fmt_legacy.c — Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: scalar reference.
 *
 * Blocks of 32 values, little-endian; d and m are F16; "qs" nibbles hold values j (low
 * nibble of byte j) and j + 16 (high nibble of byte j); qh bit j is bit 4 of value j.
 *   Q4_0  18 bytes  d | qs[16]            w = d * (q - 8)
 *   Q4_1  20 bytes  d | m | qs[16]        w = d * q + m        (two roundings, no FMA)
 *   Q5_0  22 bytes  d | qh[4] | qs[16]    w = d * (q - 16)
 *   Q5_1  24 bytes  d | m | qh[4] | qs[16] w = d * q + m
 *   Q8_0  34 bytes  d | int8 q[32]        w = d * q
 *
 * Dot products take act_q8_32 activations (x ~= dx * qx). Block b's integer sum
 * sumi = sum q * qx (Q4_0/Q5_0: (q - 8) or (q - 16)) is exact; its float part goes to
 * lane b % 8:
 *   acc = fmaf(d * dx, (float)sumi, acc)
 *   Q4_1/Q5_1 also: acc = fmaf(m * dx, (float)sum(qx), acc)
 * The AVX2 path (kernels/cpu/avx2_legacy.c) and the AVX-512 one (avx512_legacy.c, avx512_q8.h) do
 * the same float operations in the same order.
 */
#include "quant.h"

#include "../kernels/cpu/avx2_legacy.h"
#include "../kernels/cpu/avx512_legacy.h"
#include "../kernels/cpu/amx_legacy.h"

enum { QK = 32 };

/* 32 nibble codes of a qs[16] array, in value order. */
static inline void codes_q4(const uint8_t *qs, uint8_t q[QK]) {
    for (int j = 0; j < 16; j++) {
        q[j] = qs[j] & 0x0f;
        q[j + 16] = qs[j] >> 4;
    }
}

/* 32 five-bit codes from qh (bit j = bit 4 of value j) and qs[16]. */
static inline void codes_q5(const uint8_t *qh4, const uint8_t *qs, uint8_t q[QK]) {
    const uint32_t qh = strata_rd_u32(qh4);
    codes_q4(qs, q);
    for (int j = 0; j < QK; j++) q[j] |= (uint8_t)(((qh >> j) & 1u) << 4);
}

/* ---------------------------------------------------------------- dequantization */

static void dequant_q4_0(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t b = 0; b < n / QK; b++, p += 18, dst += QK) {
        const float d = strata_fp16_to_fp32(strata_rd_u16(p));
        uint8_t q[QK];
        codes_q4(p + 2, q);
        for (int j = 0; j < QK; j++) dst[j] = d * (float)((int)q[j] - 8);
    }
}

static void dequant_q4_1(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t b = 0; b < n / QK; b++, p += 20, dst += QK) {
        const float d = strata_fp16_to_fp32(strata_rd_u16(p));
        const float m = strata_fp16_to_fp32(strata_rd_u16(p + 2));
        uint8_t q[QK];
        codes_q4(p + 4, q);
        for (int j = 0; j < QK; j++) dst[j] = d * (float)q[j] + m;
    }
}

static void dequant_q5_0(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t b = 0; b < n / QK; b++, p += 22, dst += QK) {
        const float d = strata_fp16_to_fp32(strata_rd_u16(p));
        uint8_t q[QK];
        codes_q5(p + 2, p + 6, q);
        for (int j = 0; j < QK; j++) dst[j] = d * (float)((int)q[j] - 16);
    }
}

static void dequant_q5_1(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t b = 0; b < n / QK; b++, p += 24, dst += QK) {
        const float d = strata_fp16_to_fp32(strata_rd_u16(p));
        const float m = strata_fp16_to_fp32(strata_rd_u16(p + 2));
        uint8_t q[QK];
        codes_q5(p + 4, p + 8, q);
        for (int j = 0; j < QK; j++) dst[j] = d * (float)q[j] + m;
    }
}

static void dequant_q8_0(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t b = 0; b < n / QK; b++, p += 34, dst += QK) {
        const float d = strata_fp16_to_fp32(strata_rd_u16(p));
        const int8_t *q = (const int8_t *)(p + 2);
        for (int j = 0; j < QK; j++) dst[j] = d * (float)q[j];
    }
}

/* ---------------------------------------------------------------- dot products */

static inline int32_t isum_u8(const uint8_t q[QK], const int8_t *y) {
    int32_t s = 0;
    for (int j = 0; j < QK; j++) s += (int32_t)q[j] * y[j];
    return s;
}

static inline const act_q8_32 *act_col(const void *x, size_t x_stride, int c) {
    return (const act_q8_32 *)((const char *)x + (size_t)c * x_stride);
}

static void vec_dot_q4_0(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    for (int c = 0; c < ncols; c++) {
        const act_q8_32 *a = act_col(x, x_stride, c);
        const uint8_t *p = w;
        float acc[8] = {0};
        for (int64_t b = 0; b < n / QK; b++, p += 18) {
            uint8_t q[QK];
            codes_q4(p + 2, q);
            const int32_t sumi = isum_u8(q, a[b].qs) - 8 * a[b].sum;
            const float d = strata_fp16_to_fp32(strata_rd_u16(p));
            acc[b % 8] = fmaf(d * a[b].d, (float)sumi, acc[b % 8]);
        }
        y[c] = strata_hsum8(acc);
    }
}

static void vec_dot_q4_1(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    for (int c = 0; c < ncols; c++) {
        const act_q8_32 *a = act_col(x, x_stride, c);
        const uint8_t *p = w;
        float acc[8] = {0};
        for (int64_t b = 0; b < n / QK; b++, p += 20) {
            uint8_t q[QK];
            codes_q4(p + 4, q);
            const int32_t sumi = isum_u8(q, a[b].qs);
            const float d = strata_fp16_to_fp32(strata_rd_u16(p));
            const float m = strata_fp16_to_fp32(strata_rd_u16(p + 2));
            acc[b % 8] = fmaf(d * a[b].d, (float)sumi, acc[b % 8]);
            acc[b % 8] = fmaf(m * a[b].d, (float)a[b].sum, acc[b % 8]);
        }
        y[c] = strata_hsum8(acc);
    }
}

static void vec_dot_q5_0(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    for (int c = 0; c < ncols; c++) {
        const act_q8_32 *a = act_col(x, x_stride, c);
        const uint8_t *p = w;
        float acc[8] = {0};
        for (int64_t b = 0; b < n / QK; b++, p += 22) {
            uint8_t q[QK];
            codes_q5(p + 2, p + 6, q);
            const int32_t sumi = isum_u8(q, a[b].qs) - 16 * a[b].sum;
            const float d = strata_fp16_to_fp32(strata_rd_u16(p));
            acc[b % 8] = fmaf(d * a[b].d, (float)sumi, acc[b % 8]);
        }
        y[c] = strata_hsum8(acc);
    }
}

static void vec_dot_q5_1(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    for (int c = 0; c < ncols; c++) {
        const act_q8_32 *a = act_col(x, x_stride, c);
        const uint8_t *p = w;
        float acc[8] = {0};
        for (int64_t b = 0; b < n / QK; b++, p += 24) {
            uint8_t q[QK];
            codes_q5(p + 4, p + 8, q);
            const int32_t sumi = isum_u8(q, a[b].qs);
            const float d = strata_fp16_to_fp32(strata_rd_u16(p));
            const float m = strata_fp16_to_fp32(strata_rd_u16(p + 2));
            acc[b % 8] = fmaf(d * a[b].d, (float)sumi, acc[b % 8]);
            acc[b % 8] = fmaf(m * a[b].d, (float)a[b].sum, acc[b % 8]);
        }
        y[c] = strata_hsum8(acc);
    }
}

static void vec_dot_q8_0(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    for (int c = 0; c < ncols; c++) {
        const act_q8_32 *a = act_col(x, x_stride, c);
        const uint8_t *p = w;
        float acc[8] = {0};
        for (int64_t b = 0; b < n / QK; b++, p += 34) {
            /* Read the codes through an int8_t pointer: GCC 12.2 with AVX512-VNNI
             * (-march=native on Zen 4) vectorizes sum += (int8_t)u8[j] * s8[j] as an
             * unsigned x signed dot product (wrong code); int8 x int8 compiles correctly. */
            const int8_t *q = (const int8_t *)(p + 2);
            int32_t sumi = 0;
            for (int j = 0; j < QK; j++) sumi += q[j] * a[b].qs[j];
            const float d = strata_fp16_to_fp32(strata_rd_u16(p));
            acc[b % 8] = fmaf(d * a[b].d, (float)sumi, acc[b % 8]);
        }
        y[c] = strata_hsum8(acc);
    }
}

/* ---------------------------------------------------------------- registration */

#if STRATA_HAVE_AVX2
#define AVX2_FN(f) f
#else
#define AVX2_FN(f) NULL
#endif
#if STRATA_HAVE_AVX512
#define AVX512_FN(f) f
#else
#define AVX512_FN(f) NULL
#endif

#define LEGACY(T, NAME, TS, FN)                                                                \
    t[T] = (strata_qtraits){.name = NAME, .type = T, .block_size = QK, .type_size = TS,        \
                            .act = STRATA_ACT_Q8_32,                                           \
                            .dequant = {dequant_##FN, AVX2_FN(strata_avx2_dequant_##FN)},      \
                            .vec_dot = {vec_dot_##FN, AVX2_FN(strata_avx2_vec_dot_##FN),         \
                                        [STRATA_ISA_IDX_AVX512] = AVX512_FN(strata_avx512_vec_dot_##FN)},       \
                            .rows = {[STRATA_ISA_IDX_AVX2] = AVX2_FN(strata_avx2_rows_##FN),                   \
                                     [STRATA_ISA_IDX_AVX512] = AVX512_FN(strata_avx512_rows_##FN)},            \
                            .rows_when = {[STRATA_ISA_IDX_AVX2] = STRATA_ROWS_MULTI | STRATA_ROWS_SHORT1,     \
                                          [STRATA_ISA_IDX_AVX512] = STRATA_ROWS_MULTI | STRATA_ROWS_SHORT1}}

void strata_quant_register_legacy(strata_qtraits *t) {
    LEGACY(GT_Q4_0, "Q4_0", 18, q4_0);
    LEGACY(GT_Q4_1, "Q4_1", 20, q4_1);
    LEGACY(GT_Q5_0, "Q5_0", 22, q5_0);
    LEGACY(GT_Q5_1, "Q5_1", 24, q5_1);
    LEGACY(GT_Q8_0, "Q8_0", 34, q8_0);
#if STRATA_HAVE_AMX
    /* several columns on AMX tiles (amx_legacy.c); vec_dot and the one-column rows stay AVX-512's */
    t[GT_Q8_0].rows[STRATA_ISA_IDX_AMX] = strata_amx_rows_q8_0;
    t[GT_Q8_0].rows_when[STRATA_ISA_IDX_AMX] = STRATA_ROWS_MULTI | STRATA_ROWS_SHORT1;
#endif
}
