/*
 * fmt_fp4.c — IQ4_NL, MXFP4, NVFP4: scalar reference.
 *
 * 4-bit codes index a 16-entry int8 value table (quant_tables.h, generated from gguf.quants).
 * Little-endian blocks:
 *   IQ4_NL  32 values, 18 bytes: F16 d | qs[16]           w = d * kvalues_iq4nl[q]
 *   MXFP4   32 values, 17 bytes: E8M0 e | qs[16]          w = e8m0_half(e) * kvalues_mxfp4[q]
 *           qs byte j: value j in the low nibble, value j + 16 in the high nibble.
 *   NVFP4   64 values, 36 bytes: UE4M3 s[4] | qs[32]      w = ue4m3_half(s[j]) * kvalues_nvfp4[q]
 *           four 16-value sub-blocks; sub-block j is qs[8j .. 8j+7]: values 16j + i in the low
 *           nibble and 16j + 8 + i in the high nibble of byte 8j + i.
 * The FP4 tables hold E2M1 values doubled; the *_half scale decoders (kernels/cpu/avx2_fp4.h)
 * halve the scale to compensate. Every dequantized value is one rounded product, as in
 * gguf.quants.
 *
 * Dot products take act_q8_32 activations (x ~= dx * qx); integer sums are exact.
 *   IQ4_NL, MXFP4: block b -> lane b % 8: acc = fmaf(d * dx, (float)sumi, acc)
 *   NVFP4: block b spans activation blocks 2b and 2b+1; with i_j the integer sum of
 *          sub-block j and s_j its scale (s_j * i_j is exact in float):
 *            t0 = fmaf(s0, i0, s1 * i1), t1 = fmaf(s2, i2, s3 * i3)
 *            acc = fmaf(t0, dx[2b], acc); acc = fmaf(t1, dx[2b+1], acc)      (lane b % 8)
 * The AVX2 path (kernels/cpu/avx2_fp4.c) and the AVX-512 one (avx512_fp4.c, avx512_q8.h) do the
 * same float operations in the same order.
 */
#include "quant.h"

#include "quant_tables.h"
#include "../kernels/cpu/avx2_fp4.h"
#include "../kernels/cpu/avx512_fp4.h"

/* ---------------------------------------------------------------- dequantization */

static inline void dequant_nl32(const uint8_t *qs, float d, const int8_t *kv, float *dst) {
    for (int j = 0; j < 16; j++) {
        dst[j] = d * (float)kv[qs[j] & 0x0f];
        dst[j + 16] = d * (float)kv[qs[j] >> 4];
    }
}

static void dequant_iq4_nl(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t b = 0; b < n / 32; b++, p += 18, dst += 32)
        dequant_nl32(p + 2, strata_fp16_to_fp32(strata_rd_u16(p)), strata_kvalues_iq4nl, dst);
}

static void dequant_mxfp4(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t b = 0; b < n / 32; b++, p += 17, dst += 32)
        dequant_nl32(p + 1, strata_e8m0_half(p[0]), strata_kvalues_mxfp4, dst);
}

static void dequant_nvfp4(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    for (int64_t b = 0; b < n / 64; b++, p += 36, dst += 64) {
        for (int j = 0; j < 4; j++) {
            const float d = strata_ue4m3_half(p[j]);
            const uint8_t *qs = p + 4 + 8 * j;
            for (int i = 0; i < 8; i++) {
                dst[16 * j + i] = d * (float)strata_kvalues_nvfp4[qs[i] & 0x0f];
                dst[16 * j + 8 + i] = d * (float)strata_kvalues_nvfp4[qs[i] >> 4];
            }
        }
    }
}

/* ---------------------------------------------------------------- dot products */

static inline const act_q8_32 *act_col(const void *x, size_t x_stride, int c) {
    return (const act_q8_32 *)((const char *)x + (size_t)c * x_stride);
}

static inline int32_t isum_nl32(const uint8_t *qs, const int8_t *kv, const int8_t *y) {
    int32_t s = 0;
    for (int j = 0; j < 16; j++) s += kv[qs[j] & 0x0f] * y[j] + kv[qs[j] >> 4] * y[j + 16];
    return s;
}

static void vec_dot_iq4_nl(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    for (int c = 0; c < ncols; c++) {
        const act_q8_32 *a = act_col(x, x_stride, c);
        const uint8_t *p = w;
        float acc[8] = {0};
        for (int64_t b = 0; b < n / 32; b++, p += 18) {
            const int32_t sumi = isum_nl32(p + 2, strata_kvalues_iq4nl, a[b].qs);
            const float d = strata_fp16_to_fp32(strata_rd_u16(p));
            acc[b % 8] = fmaf(d * a[b].d, (float)sumi, acc[b % 8]);
        }
        y[c] = strata_hsum8(acc);
    }
}

static void vec_dot_mxfp4(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    for (int c = 0; c < ncols; c++) {
        const act_q8_32 *a = act_col(x, x_stride, c);
        const uint8_t *p = w;
        float acc[8] = {0};
        for (int64_t b = 0; b < n / 32; b++, p += 17) {
            const int32_t sumi = isum_nl32(p + 1, strata_kvalues_mxfp4, a[b].qs);
            acc[b % 8] = fmaf(strata_e8m0_half(p[0]) * a[b].d, (float)sumi, acc[b % 8]);
        }
        y[c] = strata_hsum8(acc);
    }
}

static void vec_dot_nvfp4(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    for (int c = 0; c < ncols; c++) {
        const act_q8_32 *a = act_col(x, x_stride, c);
        const uint8_t *p = w;
        float acc[8] = {0};
        for (int64_t b = 0; b < n / 64; b++, p += 36) {
            float fi[4], s[4];
            for (int j = 0; j < 4; j++) {
                const uint8_t *qs = p + 4 + 8 * j;
                const int8_t *yq = a[2 * b + j / 2].qs + 16 * (j % 2);
                int32_t sumi = 0;
                for (int i = 0; i < 8; i++)
                    sumi += strata_kvalues_nvfp4[qs[i] & 0x0f] * yq[i] + strata_kvalues_nvfp4[qs[i] >> 4] * yq[i + 8];
                fi[j] = (float)sumi;
                s[j] = strata_ue4m3_half(p[j]);
            }
            const float t0 = fmaf(s[0], fi[0], s[1] * fi[1]);
            const float t1 = fmaf(s[2], fi[2], s[3] * fi[3]);
            acc[b % 8] = fmaf(t0, a[2 * b].d, acc[b % 8]);
            acc[b % 8] = fmaf(t1, a[2 * b + 1].d, acc[b % 8]);
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

#define FP4(T, NAME, BS, TS, FN)                                                               \
    t[T] = (strata_qtraits){.name = NAME, .type = T, .block_size = BS, .type_size = TS,        \
                            .act = STRATA_ACT_Q8_32,                                           \
                            .dequant = {dequant_##FN, AVX2_FN(strata_avx2_dequant_##FN)},      \
                            .vec_dot = {vec_dot_##FN, AVX2_FN(strata_avx2_vec_dot_##FN),         \
                                        [STRATA_ISA_IDX_AVX512] = AVX512_FN(strata_avx512_vec_dot_##FN)},       \
                            .rows = {NULL, AVX2_FN(strata_avx2_rows_##FN),                      \
                                     [STRATA_ISA_IDX_AVX512] = AVX512_FN(strata_avx512_rows_##FN)},     \
                            .rows_when = {0, STRATA_ROWS_MULTI | STRATA_ROWS_SHORT1,                   \
                                          [STRATA_ISA_IDX_AVX512] = STRATA_ROWS_MULTI | STRATA_ROWS_SHORT1}}

void strata_quant_register_fp4(strata_qtraits *t) {
    FP4(GT_IQ4_NL, "IQ4_NL", 32, 18, iq4_nl);
    FP4(GT_MXFP4, "MXFP4", 32, 17, mxfp4);
    FP4(GT_NVFP4, "NVFP4", 64, 36, nvfp4);
}
