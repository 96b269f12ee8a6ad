/*
 * fmt_iq.c — IQ2_XXS, IQ2_XS, IQ3_XXS: lattice ("grid") codebooks, scalar reference.
 *
 * All three cut 256 values into super-blocks with one fp16 scale d. Groups of 8 (IQ2) or 4
 * (IQ3) values are one grid entry: unsigned magnitudes (IQ2: 8, 25, 43; IQ3: 4 .. 62), byte k
 * of the little-endian grid word is value k. Signs come in 7-bit indices into ksigns, whose
 * 8th bit makes the number of minus signs even; bit j of the sign byte negates value j.
 *
 *   IQ2_XXS  66 bytes: d f16 | 8 x { u8 grid[4]; u32 w }     per 32 values (w follows grid)
 *            w bits 7l..7l+6 = sign index of grid entry l, bits 28..31 = scale s;
 *            value = d * (0.5 + s) * 0.25 * grid * sign
 *   IQ2_XS   74 bytes: d f16 | u16 qs[32] | u8 scales[8]
 *            qs bits 0..8 = grid entry (512), bits 9..15 = sign index; 8 values per qs;
 *            scale nibble j (byte j/2, low nibble first) covers 16 values (qs 2j, 2j+1);
 *            value = d * (0.5 + s) * 0.25 * grid * sign
 *   IQ3_XXS  98 bytes: d f16 | u8 qs[64] | u32 w[8]
 *            qs = grid entry (256 x 4 values); w[i] covers values 32i..32i+31: bits 7l..7l+6
 *            sign index of values 32i+8l..+7 (grid entries qs[8i+2l], qs[8i+2l+1]),
 *            bits 28..31 scale s; value = d * (0.5 + s) * 0.5 * grid * sign
 *
 * Dequantization rounds like gguf.quants: db = (d * (0.5 + s)) * f; value = (db * grid) * sign.
 *
 * Dot products multiply against act_q8_256. Inside a super-block everything is integer and
 * exact: eight lane sums of (2s + 1) * grid * sign * q8, lane j over the values 32k + 4j ..
 * 32k + 4j + 3 (the lanes of the AVX2 int32 accumulator). Since (0.5 + s) * f =
 * (2s + 1) * f / 2, every block then does, for each lane j,
 *     acc[j] = fmaf((d * x.d) * f/2, (float)lane[j], acc[j])   (f/2 = 1/8 for IQ2, 1/4 IQ3)
 * and y = strata_hsum8(acc). This order needs no horizontal sum per block; the
 * AVX2 kernels (kernels/cpu/avx2_iq.c) do the same operations with _mm256_fmadd_ps.
 */
#include "quant.h"
#include "quant_tables.h"
#include "../kernels/cpu/avx2_iq.h"
#include "../kernels/cpu/avx512_iq.h"

enum { IQ2XXS_SIZE = 66, IQ2XS_SIZE = 74, IQ3XXS_SIZE = 98 };

/* The IQ2_XS quantizer (quantize_iq2xs.c). */
size_t strata_quantize_iq2_xs(const float *src, void *dst, int64_t nrows, int64_t n_per_row,
                              const float *imatrix);

/* ---------------------------------------------------------------- dequantization */

static void dequant_iq2_xxs(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b += IQ2XXS_SIZE) {
        const float d = strata_fp16_to_fp32(strata_rd_u16(b));
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *grid_idx = b + 2 + 8 * ib;
            const uint32_t w = strata_rd_u32(grid_idx + 4);
            const float db = d * (0.5f + (float)(w >> 28)) * 0.25f;
            for (int l = 0; l < 4; l++) {
                const uint64_t g = strata_iq2xxs_grid[grid_idx[l]];
                const uint8_t signs = strata_ksigns_iq2xs[(w >> (7 * l)) & 127];
                for (int j = 0; j < 8; j++) {
                    const float v = db * (float)(uint8_t)(g >> (8 * j));
                    *dst++ = (signs >> j) & 1 ? -v : v;
                }
            }
        }
    }
}

static void dequant_iq2_xs(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b += IQ2XS_SIZE) {
        const float d = strata_fp16_to_fp32(strata_rd_u16(b));
        const uint8_t *scales = b + 66;
        for (int ig = 0; ig < 16; ig++) {
            const uint32_t s = (scales[ig / 2] >> (4 * (ig % 2))) & 15;
            const float db = d * (0.5f + (float)s) * 0.25f;
            for (int l = 0; l < 2; l++) {
                const uint16_t q = strata_rd_u16(b + 2 + 2 * (2 * ig + l));
                const uint64_t g = strata_iq2xs_grid[q & 511];
                const uint8_t signs = strata_ksigns_iq2xs[q >> 9];
                for (int j = 0; j < 8; j++) {
                    const float v = db * (float)(uint8_t)(g >> (8 * j));
                    *dst++ = (signs >> j) & 1 ? -v : v;
                }
            }
        }
    }
}

static void dequant_iq3_xxs(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b += IQ3XXS_SIZE) {
        const float d = strata_fp16_to_fp32(strata_rd_u16(b));
        const uint8_t *qs = b + 2;
        for (int ib = 0; ib < 8; ib++) {
            const uint32_t w = strata_rd_u32(b + 66 + 4 * ib);
            const float db = d * (0.5f + (float)(w >> 28)) * 0.5f;
            for (int l = 0; l < 4; l++) {
                const uint8_t signs = strata_ksigns_iq2xs[(w >> (7 * l)) & 127];
                const uint64_t g = (uint64_t)strata_iq3xxs_grid[qs[8 * ib + 2 * l]] |
                                   (uint64_t)strata_iq3xxs_grid[qs[8 * ib + 2 * l + 1]] << 32;
                for (int j = 0; j < 8; j++) {
                    const float v = db * (float)(uint8_t)(g >> (8 * j));
                    *dst++ = (signs >> j) & 1 ? -v : v;
                }
            }
        }
    }
}

/* ---------------------------------------------------------------- dot products */

/* Lane sums of one super-block: lane[j] += scale * grid * sign * q over the values i with
 * (i % 32) / 4 == j, i.e. values 32k + 4j .. 32k + 4j + 3 of every 32-value group k. That is
 * exactly what lane j of the AVX2 kernel's int32 accumulator holds, so both paths convert
 * the same eight integers. */
static inline void lanes8(uint64_t g, uint8_t signs, const int8_t *q, int32_t scale, int first, int32_t *lane) {
    for (int j = 0; j < 8; j++) {
        const int32_t v = (int32_t)(uint8_t)(g >> (8 * j)) * q[j] * scale;
        lane[(first + j) % 32 / 4] += (signs >> j) & 1 ? -v : v;
    }
}

static void lanes_iq2_xxs(const uint8_t *b, const int8_t *q, int32_t *lane) {
    for (int ib = 0; ib < 8; ib++) {
        const uint8_t *grid_idx = b + 2 + 8 * ib;
        const uint32_t w = strata_rd_u32(grid_idx + 4);
        const int32_t ls = (int32_t)(2 * (w >> 28) + 1);
        for (int l = 0; l < 4; l++)
            lanes8(strata_iq2xxs_grid[grid_idx[l]], strata_ksigns_iq2xs[(w >> (7 * l)) & 127],
                   q + 32 * ib + 8 * l, ls, 8 * l, lane);
    }
}

static void lanes_iq2_xs(const uint8_t *b, const int8_t *q, int32_t *lane) {
    for (int ig = 0; ig < 16; ig++) {
        const int32_t ls = 2 * ((b[66 + ig / 2] >> (4 * (ig % 2))) & 15) + 1;
        for (int l = 0; l < 2; l++) {
            const uint16_t qs = strata_rd_u16(b + 2 + 2 * (2 * ig + l));
            lanes8(strata_iq2xs_grid[qs & 511], strata_ksigns_iq2xs[qs >> 9], q + 16 * ig + 8 * l, ls,
                   16 * ig + 8 * l, lane);
        }
    }
}

static void lanes_iq3_xxs(const uint8_t *b, const int8_t *q, int32_t *lane) {
    for (int ib = 0; ib < 8; ib++) {
        const uint32_t w = strata_rd_u32(b + 66 + 4 * ib);
        const int32_t ls = (int32_t)(2 * (w >> 28) + 1);
        const uint8_t *qs = b + 2 + 8 * ib;
        for (int l = 0; l < 4; l++) {
            const uint64_t g = (uint64_t)strata_iq3xxs_grid[qs[2 * l]] |
                               (uint64_t)strata_iq3xxs_grid[qs[2 * l + 1]] << 32;
            lanes8(g, strata_ksigns_iq2xs[(w >> (7 * l)) & 127], q + 32 * ib + 8 * l, ls, 8 * l, lane);
        }
    }
}

typedef void (*lanes_fn)(const uint8_t *b, const int8_t *q, int32_t *lane);

/* acc[j] = fmaf((d * x.d) * f/2, (float)lane[j], acc[j]) block after block; y = hsum8(acc).
 * |lane[j]| <= 8 * 4 * 62 * 127 * 31 < 2^24, so the conversion is exact. */
static inline void vec_dot_iq(int64_t n, const void *w, const void *x, size_t x_stride, int ncols,
                              float *y, size_t type_size, lanes_fn lanes, float half_f) {
    const int64_t nb = n / QK_K;
    for (int c = 0; c < ncols; c++) {
        const act_q8_256 *xc = (const act_q8_256 *)((const char *)x + (size_t)c * x_stride);
        const uint8_t *b = w;
        float acc[8] = {0};
        for (int64_t i = 0; i < nb; i++, b += type_size) {
            int32_t lane[8] = {0};
            lanes(b, xc[i].qs, lane);
            const float dd = strata_fp16_to_fp32(strata_rd_u16(b)) * xc[i].d * half_f;
            for (int j = 0; j < 8; j++) acc[j] = fmaf(dd, (float)lane[j], acc[j]);
        }
        y[c] = strata_hsum8(acc);
    }
}

static void vec_dot_iq2_xxs(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    vec_dot_iq(n, w, x, x_stride, ncols, y, IQ2XXS_SIZE, lanes_iq2_xxs, 0.125f);
}

static void vec_dot_iq2_xs(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    vec_dot_iq(n, w, x, x_stride, ncols, y, IQ2XS_SIZE, lanes_iq2_xs, 0.125f);
}

static void vec_dot_iq3_xxs(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    vec_dot_iq(n, w, x, x_stride, ncols, y, IQ3XXS_SIZE, lanes_iq3_xxs, 0.25f);
}

/* ---------------------------------------------------------------- registration */

void strata_quant_register_iq(strata_qtraits *t) {
    t[GT_IQ2_XXS] = (strata_qtraits){
        .name = "IQ2_XXS", .type = GT_IQ2_XXS, .block_size = QK_K, .type_size = IQ2XXS_SIZE,
        .act = STRATA_ACT_Q8_256,
        .dequant = {dequant_iq2_xxs, NULL}, .vec_dot = {vec_dot_iq2_xxs, NULL}};
    t[GT_IQ2_XS] = (strata_qtraits){
        .name = "IQ2_XS", .type = GT_IQ2_XS, .block_size = QK_K, .type_size = IQ2XS_SIZE,
        .act = STRATA_ACT_Q8_256,
        .dequant = {dequant_iq2_xs, NULL}, .vec_dot = {vec_dot_iq2_xs, NULL},
        .quantize = strata_quantize_iq2_xs};
    t[GT_IQ3_XXS] = (strata_qtraits){
        .name = "IQ3_XXS", .type = GT_IQ3_XXS, .block_size = QK_K, .type_size = IQ3XXS_SIZE,
        .act = STRATA_ACT_Q8_256,
        .dequant = {dequant_iq3_xxs, NULL}, .vec_dot = {vec_dot_iq3_xxs, NULL}};
#if STRATA_HAVE_AVX2
    /* api.c only selects these after strata_cpu_has_isa() said yes. */
    t[GT_IQ2_XXS].dequant[STRATA_ISA_IDX_AVX2] = strata_avx2_dequant_iq2_xxs;
    t[GT_IQ2_XXS].vec_dot[STRATA_ISA_IDX_AVX2] = strata_avx2_vec_dot_iq2_xxs;
    t[GT_IQ2_XS].dequant[STRATA_ISA_IDX_AVX2] = strata_avx2_dequant_iq2_xs;
    t[GT_IQ2_XS].vec_dot[STRATA_ISA_IDX_AVX2] = strata_avx2_vec_dot_iq2_xs;
    t[GT_IQ3_XXS].dequant[STRATA_ISA_IDX_AVX2] = strata_avx2_dequant_iq3_xxs;
    t[GT_IQ3_XXS].vec_dot[STRATA_ISA_IDX_AVX2] = strata_avx2_vec_dot_iq3_xxs;
    t[GT_IQ2_XXS].rows[STRATA_ISA_IDX_AVX2] = strata_avx2_rows_iq2_xxs;
    t[GT_IQ2_XS].rows[STRATA_ISA_IDX_AVX2] = strata_avx2_rows_iq2_xs;
    t[GT_IQ3_XXS].rows[STRATA_ISA_IDX_AVX2] = strata_avx2_rows_iq3_xxs;
    /* From 8 columns: below, vec_dot's unbiased passes over one decoded block are faster (1 thread, Zen 3,
     * IQ2_XS 2560 x 2560 and 640 x 2560, in-process A/B against the rows kernel: 0.65-0.79x at 2..7
     * columns; the rows kernel wins from 8 on) */
    for (int T = GT_IQ2_XXS; T <= GT_IQ3_XXS; T++)
        t[T].rows_when[STRATA_ISA_IDX_AVX2] = STRATA_ROWS_MULTI | STRATA_ROWS_BIASED | STRATA_ROWS_FROM8;
#endif
#if STRATA_HAVE_AVX512
    /* Dequantization keeps the AVX2 kernels (the registry's fallback); the AMX path inherits these. */
    t[GT_IQ2_XXS].vec_dot[STRATA_ISA_IDX_AVX512] = strata_avx512_vec_dot_iq2_xxs;
    t[GT_IQ2_XS].vec_dot[STRATA_ISA_IDX_AVX512] = strata_avx512_vec_dot_iq2_xs;
    t[GT_IQ3_XXS].vec_dot[STRATA_ISA_IDX_AVX512] = strata_avx512_vec_dot_iq3_xxs;
    t[GT_IQ2_XXS].rows[STRATA_ISA_IDX_AVX512] = strata_avx512_rows_iq2_xxs;
    t[GT_IQ2_XS].rows[STRATA_ISA_IDX_AVX512] = strata_avx512_rows_iq2_xs;
    t[GT_IQ3_XXS].rows[STRATA_ISA_IDX_AVX512] = strata_avx512_rows_iq3_xxs;
    for (int T = GT_IQ2_XXS; T <= GT_IQ3_XXS; T++)
        t[T].rows_when[STRATA_ISA_IDX_AVX512] = STRATA_ROWS_MULTI | STRATA_ROWS_BIASED;
    t[GT_IQ2_XXS].conv[STRATA_ISA_IDX_AVX512] = strata_avx512_conv_iq2_xxs;
    t[GT_IQ2_XS].conv[STRATA_ISA_IDX_AVX512] = strata_avx512_conv_iq2_xs;
    t[GT_IQ3_XXS].conv[STRATA_ISA_IDX_AVX512] = strata_avx512_conv_iq3_xxs;
    t[GT_IQ2_XXS].conv_dot[STRATA_ISA_IDX_AVX512] = strata_avx512_conv_dot_iq2;
    t[GT_IQ2_XS].conv_dot[STRATA_ISA_IDX_AVX512] = strata_avx512_conv_dot_iq2;
    t[GT_IQ3_XXS].conv_dot[STRATA_ISA_IDX_AVX512] = strata_avx512_conv_dot_iq3;
#endif
}
