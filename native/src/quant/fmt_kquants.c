/* fmt_kquants.c — Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS: scalar reference dequantization and dot
 * products, and registration (the AVX2 kernels are in kernels/cpu/avx2_kquants.c).
 *
 * Every format here has 256-value super-blocks split into sub-blocks with integer scales:
 *   Q2_K   84 B: scales[16] (4-bit sc | 4-bit m << 4), qs[64] 2-bit, fp16 d, fp16 dmin
 *   Q3_K  110 B: hmask[32] high bits, qs[64] low 2 bits, scales[12] (16 x 6-bit), fp16 d
 *   Q4_K  144 B: fp16 d, fp16 dmin, scales[12] (8 x 6-bit sc, 8 x 6-bit m), qs[128] 4-bit
 *   Q5_K  176 B: fp16 d, fp16 dmin, scales[12] as Q4_K, qh[32] fifth bits, qs[128] 4-bit
 *   Q6_K  210 B: ql[128] low nibbles, qh[64] high 2 bits, int8 scales[16], fp16 d
 *   IQ4_XS 136 B: fp16 d, scales_h (u16), scales_l[4], qs[128] 4-bit indices into kvalues_iq4nl
 * The exact bit positions are in avx2_kquants.h, next to the block structs.
 *
 * Dequantization rounds exactly as gguf.quants does: the sub-block scale d*sc is one float
 * product, then w = dl*q (one rounding) or w = dl*q - dm (two roundings; -ffp-contract=off
 * keeps the compiler from fusing them).
 *
 * Dot products run against act_q8_256 (x ~ xd * qx, bsums = sums of 16 qx). Per super-block
 * the reference forms exact integer lane sums S_l = sum of sc * q * qx over the values of
 * lane l and, for formats with mins, M_l = sum of m * bsum, then accumulates them in float
 * lane l with kq_lane_step (one fmaf): the order the AVX2 kernel's int32 lanes impose,
 * defined in avx2_kquants.h. fmaf is inlined where the target has FMA; elsewhere libm's
 * correctly rounded fmaf keeps this reference exact, if slower.
 */
#include "quant.h"

#include "quant_tables.h"
#include "../kernels/cpu/avx2_kquants.h"
#include "../kernels/cpu/avx512_kquants.h"

/* ---------------------------------------------------------------- code unpacking
 * Each unpacker turns one block into integer codes q[256] (the value the format multiplies
 * by its sub-block scale) and integer sub-block scales (and mins), following gguf.quants. */

static void unpack_q2_k(const kq_block_q2_k *b, int8_t q[QK_K], int32_t sc[16], int32_t m[16]) {
    for (int j = 0; j < 16; j++) {
        sc[j] = b->scales[j] & 0xF;
        m[j] = b->scales[j] >> 4;
    }
    for (int c = 0; c < 2; c++)
        for (int s = 0; s < 4; s++)
            for (int k = 0; k < 32; k++)
                q[128 * c + 32 * s + k] = (int8_t)((b->qs[32 * c + k] >> (2 * s)) & 3);
}

/* The 16 6-bit scales of Q3_K, minus 32. */
static void unpack_q3_k_scales(const uint8_t sc[12], int32_t s[16]) {
    for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? sc[j] & 0xF : sc[j - 8] >> 4;
        const int hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
        s[j] = (lo | (hi << 4)) - 32;
    }
}

static void unpack_q3_k(const kq_block_q3_k *b, int8_t q[QK_K], int32_t s[16]) {
    unpack_q3_k_scales(b->scales, s);
    for (int c = 0; c < 2; c++)
        for (int t = 0; t < 4; t++)
            for (int k = 0; k < 32; k++) {
                const int i = 128 * c + 32 * t + k;
                const int lo = (b->qs[32 * c + k] >> (2 * t)) & 3;
                const int hbit = (b->hmask[k] >> (i / 32)) & 1;
                q[i] = (int8_t)(lo - (hbit ? 0 : 4));
            }
}

/* The 8 6-bit scales and 8 6-bit mins of Q4_K / Q5_K. Bytes 0-3 hold sc 0-3 (low 6 bits) and
 * the top 2 bits of sc 4-7; bytes 4-7 the same for the mins; bytes 8-11 the low nibbles of
 * sc 4-7 (low half) and m 4-7 (high half). */
static void unpack_k4_scales(const uint8_t s[12], int32_t sc[8], int32_t m[8]) {
    for (int j = 0; j < 4; j++) {
        sc[j] = s[j] & 0x3F;
        m[j] = s[4 + j] & 0x3F;
        sc[4 + j] = (s[8 + j] & 0x0F) | ((s[j] >> 2) & 0x30);
        m[4 + j] = (s[8 + j] >> 4) | ((s[4 + j] >> 2) & 0x30);
    }
}

static void unpack_q4_k(const kq_block_q4_k *b, int8_t q[QK_K], int32_t sc[8], int32_t m[8]) {
    unpack_k4_scales(b->scales, sc, m);
    for (int c = 0; c < 4; c++)
        for (int k = 0; k < 32; k++) {
            q[64 * c + k] = (int8_t)(b->qs[32 * c + k] & 0xF);
            q[64 * c + 32 + k] = (int8_t)(b->qs[32 * c + k] >> 4);
        }
}

static void unpack_q5_k(const kq_block_q5_k *b, int8_t q[QK_K], int32_t sc[8], int32_t m[8]) {
    unpack_k4_scales(b->scales, sc, m);
    for (int c = 0; c < 4; c++)
        for (int k = 0; k < 32; k++) {
            const int i0 = 64 * c + k, i1 = 64 * c + 32 + k;
            const int h0 = (b->qh[k] >> (i0 / 32)) & 1, h1 = (b->qh[k] >> (i1 / 32)) & 1;
            q[i0] = (int8_t)((b->qs[32 * c + k] & 0xF) | (h0 << 4));
            q[i1] = (int8_t)((b->qs[32 * c + k] >> 4) | (h1 << 4));
        }
}

static void unpack_q6_k(const kq_block_q6_k *b, int8_t q[QK_K], int32_t s[16]) {
    for (int j = 0; j < 16; j++) s[j] = b->scales[j];
    for (int c = 0; c < 2; c++)
        for (int t = 0; t < 4; t++)
            for (int k = 0; k < 32; k++) {
                const int lo = (b->ql[64 * c + 32 * (t & 1) + k] >> (4 * (t >> 1))) & 0xF;
                const int hi = (b->qh[32 * c + k] >> (2 * t)) & 3;
                q[128 * c + 32 * t + k] = (int8_t)((lo | (hi << 4)) - 32);
            }
}

static void unpack_iq4_xs(const kq_block_iq4_xs *b, int8_t q[QK_K], int32_t s[8]) {
    const uint16_t sh = strata_rd_u16(b->scales_h);
    for (int j = 0; j < 8; j++) {
        const int lo = (b->scales_l[j / 2] >> (4 * (j % 2))) & 0xF;
        const int hi = (sh >> (2 * j)) & 3;
        s[j] = (lo | (hi << 4)) - 32;
        for (int k = 0; k < 16; k++) {
            q[32 * j + k] = strata_kvalues_iq4nl[b->qs[16 * j + k] & 0xF];
            q[32 * j + 16 + k] = strata_kvalues_iq4nl[b->qs[16 * j + k] >> 4];
        }
    }
}

/* ---------------------------------------------------------------- dequantization */

/* w_i = (d*sc_j)*q_i - (dmin*m_j), sub-blocks of `sub` values. */
static void deq_scale_min(const int8_t *q, const int32_t *sc, const int32_t *m, int sub, float d,
                          float dmin, float *dst) {
    for (int j = 0; j < QK_K / sub; j++) {
        const float dl = d * (float)sc[j], ml = dmin * (float)m[j];
        for (int k = 0; k < sub; k++) dst[sub * j + k] = dl * (float)q[sub * j + k] - ml;
    }
}

/* w_i = (d*s_j)*q_i. */
static void deq_scale(const int8_t *q, const int32_t *s, int sub, float d, float *dst) {
    for (int j = 0; j < QK_K / sub; j++) {
        const float dl = d * (float)s[j];
        for (int k = 0; k < sub; k++) dst[sub * j + k] = dl * (float)q[sub * j + k];
    }
}

static void dequant_q2_k(const void *src, float *dst, int64_t n) {
    const kq_block_q2_k *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t q[QK_K];
        int32_t sc[16], m[16];
        unpack_q2_k(&b[i], q, sc, m);
        deq_scale_min(q, sc, m, 16, strata_fp16_to_fp32(strata_rd_u16(b[i].d)),
                      strata_fp16_to_fp32(strata_rd_u16(b[i].dmin)), dst + i * QK_K);
    }
}

static void dequant_q3_k(const void *src, float *dst, int64_t n) {
    const kq_block_q3_k *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t q[QK_K];
        int32_t s[16];
        unpack_q3_k(&b[i], q, s);
        deq_scale(q, s, 16, strata_fp16_to_fp32(strata_rd_u16(b[i].d)), dst + i * QK_K);
    }
}

static void dequant_q4_k(const void *src, float *dst, int64_t n) {
    const kq_block_q4_k *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t q[QK_K];
        int32_t sc[8], m[8];
        unpack_q4_k(&b[i], q, sc, m);
        deq_scale_min(q, sc, m, 32, strata_fp16_to_fp32(strata_rd_u16(b[i].d)),
                      strata_fp16_to_fp32(strata_rd_u16(b[i].dmin)), dst + i * QK_K);
    }
}

static void dequant_q5_k(const void *src, float *dst, int64_t n) {
    const kq_block_q5_k *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t q[QK_K];
        int32_t sc[8], m[8];
        unpack_q5_k(&b[i], q, sc, m);
        deq_scale_min(q, sc, m, 32, strata_fp16_to_fp32(strata_rd_u16(b[i].d)),
                      strata_fp16_to_fp32(strata_rd_u16(b[i].dmin)), dst + i * QK_K);
    }
}

static void dequant_q6_k(const void *src, float *dst, int64_t n) {
    const kq_block_q6_k *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t q[QK_K];
        int32_t s[16];
        unpack_q6_k(&b[i], q, s);
        deq_scale(q, s, 16, strata_fp16_to_fp32(strata_rd_u16(b[i].d)), dst + i * QK_K);
    }
}

static void dequant_iq4_xs(const void *src, float *dst, int64_t n) {
    const kq_block_iq4_xs *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        int8_t q[QK_K];
        int32_t s[8];
        unpack_iq4_xs(&b[i], q, s);
        deq_scale(q, s, 32, strata_fp16_to_fp32(strata_rd_u16(b[i].d)), dst + i * QK_K);
    }
}

/* ---------------------------------------------------------------- dot products */

/* The eight lane sums of one block against x (the summation order of avx2_kquants.h):
 * S_l = sum over i with (i % 32) / 4 == l of sc(i) * (q_i + off) * qx_i
 *       - off * (sc(16 * 2l) * bsums[2l] + sc(16 * (2l+1)) * bsums[2l+1]),
 * M_l = m(16 * 2l) * bsums[2l] + m(16 * (2l+1)) * bsums[2l+1] (formats with mins),
 * sc(i), m(i): the scale and min of value i's sub-block of `sub` values. All exact. */
static void lane_sums(const int8_t *q, const int32_t *sc, const int32_t *m, int sub, int off,
                      const act_q8_256 *x, int32_t S[8], int32_t M[8]) {
    for (int l = 0; l < 8; l++) S[l] = M[l] = 0;
    for (int i = 0; i < QK_K; i++) S[(i % 32) / 4] += sc[i / sub] * ((int32_t)q[i] + off) * x->qs[i];
    for (int l = 0; l < 8; l++) {
        const int i0 = 32 * l, i1 = 32 * l + 16; /* first values of the 16-groups 2l, 2l+1 */
        S[l] -= off * (sc[i0 / sub] * x->bsums[2 * l] + sc[i1 / sub] * x->bsums[2 * l + 1]);
        if (m) M[l] = m[i0 / sub] * x->bsums[2 * l] + m[i1 / sub] * x->bsums[2 * l + 1];
    }
}

static inline const act_q8_256 *act_col(const void *x, size_t x_stride, int c) {
    return (const act_q8_256 *)((const char *)x + (size_t)c * x_stride);
}

/* One reference dot-product function per format: decode the block, form its lane sums,
 * accumulate each lane in float; reduce the eight lanes at the end. */
#define KQ_VEC_DOT_MIN(NAME, BLOCK, UNPACK, NSUB, SUB)                                          \
    static void vec_dot_##NAME(int64_t n, const void *vw, const void *vx, size_t x_stride,     \
                               int ncols, float *y) {                                          \
        const BLOCK *w = vw;                                                                    \
        const int64_t nb = n / QK_K;                                                            \
        for (int c = 0; c < ncols; c++) {                                                       \
            const act_q8_256 *x = act_col(vx, x_stride, c);                                     \
            float acc[8] = {0}, accm[8] = {0};                                                  \
            for (int64_t b = 0; b < nb; b++) {                                                  \
                int8_t q[QK_K];                                                                 \
                int32_t sc[NSUB], m[NSUB], S[8], M[8];                                          \
                UNPACK(&w[b], q, sc, m);                                                        \
                lane_sums(q, sc, m, SUB, 0, &x[b], S, M);                                       \
                const float d = strata_fp16_to_fp32(strata_rd_u16(w[b].d));                     \
                const float dmin = strata_fp16_to_fp32(strata_rd_u16(w[b].dmin));               \
                for (int l = 0; l < 8; l++) {                                                   \
                    acc[l] = kq_lane_step(x[b].d, d, S[l], acc[l]);                             \
                    accm[l] = kq_lane_step(x[b].d, dmin, M[l], accm[l]);                        \
                }                                                                               \
            }                                                                                   \
            for (int l = 0; l < 8; l++) acc[l] -= accm[l];                                      \
            y[c] = strata_hsum8(acc);                                                           \
        }                                                                                       \
    }

#define KQ_VEC_DOT(NAME, BLOCK, UNPACK, NSUB, SUB, OFF)                                         \
    static void vec_dot_##NAME(int64_t n, const void *vw, const void *vx, size_t x_stride,     \
                               int ncols, float *y) {                                          \
        const BLOCK *w = vw;                                                                    \
        const int64_t nb = n / QK_K;                                                            \
        for (int c = 0; c < ncols; c++) {                                                       \
            const act_q8_256 *x = act_col(vx, x_stride, c);                                     \
            float acc[8] = {0};                                                                 \
            for (int64_t b = 0; b < nb; b++) {                                                  \
                int8_t q[QK_K];                                                                 \
                int32_t s[NSUB], S[8], M[8];                                                    \
                UNPACK(&w[b], q, s);                                                            \
                lane_sums(q, s, NULL, SUB, OFF, &x[b], S, M);                                   \
                const float d = strata_fp16_to_fp32(strata_rd_u16(w[b].d));                     \
                for (int l = 0; l < 8; l++) acc[l] = kq_lane_step(x[b].d, d, S[l], acc[l]);     \
            }                                                                                   \
            y[c] = strata_hsum8(acc);                                                           \
        }                                                                                       \
    }

/* Q3_K and Q6_K: the AVX2 path multiplies unsigned codes (value + 4, + 32) and takes the
 * offset back through the bsums, which moves integers between lanes: mirror it exactly. */
KQ_VEC_DOT_MIN(q2_k, kq_block_q2_k, unpack_q2_k, 16, 16)
KQ_VEC_DOT(q3_k, kq_block_q3_k, unpack_q3_k, 16, 16, 4)
KQ_VEC_DOT_MIN(q4_k, kq_block_q4_k, unpack_q4_k, 8, 32)
KQ_VEC_DOT_MIN(q5_k, kq_block_q5_k, unpack_q5_k, 8, 32)
KQ_VEC_DOT(q6_k, kq_block_q6_k, unpack_q6_k, 16, 16, 32)
KQ_VEC_DOT(iq4_xs, kq_block_iq4_xs, unpack_iq4_xs, 8, 32, 0)

/* ---------------------------------------------------------------- registration */

#if STRATA_HAVE_AVX2
#define KQ_AVX2(f) strata_avx2_##f
#else
#define KQ_AVX2(f) NULL
#endif

/* AVX-512 has its own vec_dot and, for several columns, rows kernel (avx512_kquants.c); its
 * dequant slot takes the AVX2 one. */
#if STRATA_HAVE_AVX512
#define KQ_AVX512(f) strata_avx512_##f
#else
#define KQ_AVX512(f) NULL
#endif

#define KQ_TRAITS(NAME, TYPE, BLOCK, fn)                                                      \
    (strata_qtraits) {                                                                        \
        .name = NAME, .type = TYPE, .block_size = QK_K, .type_size = (int32_t)sizeof(BLOCK),  \
        .act = STRATA_ACT_Q8_256, .dequant = {dequant_##fn, KQ_AVX2(dequant_##fn)},           \
        .vec_dot = {[STRATA_ISA_IDX_SCALAR] = vec_dot_##fn, [STRATA_ISA_IDX_AVX2] = KQ_AVX2(vec_dot_##fn), \
                    [STRATA_ISA_IDX_AVX512] = KQ_AVX512(vec_dot_##fn)},                       \
        .rows = {[STRATA_ISA_IDX_AVX512] = KQ_AVX512(rows_##fn)},                             \
        .rows_when = {[STRATA_ISA_IDX_AVX512] = STRATA_ROWS_MULTI},                           \
        .quantize = NULL                                                                      \
    }

_Static_assert(sizeof(kq_block_q2_k) == 84, "Q2_K block");
_Static_assert(sizeof(kq_block_q3_k) == 110, "Q3_K block");
_Static_assert(sizeof(kq_block_q4_k) == 144, "Q4_K block");
_Static_assert(sizeof(kq_block_q5_k) == 176, "Q5_K block");
_Static_assert(sizeof(kq_block_q6_k) == 210, "Q6_K block");
_Static_assert(sizeof(kq_block_iq4_xs) == 136, "IQ4_XS block");

void strata_quant_register_kquants(strata_qtraits *t) {
    t[GT_Q2_K] = KQ_TRAITS("Q2_K", GT_Q2_K, kq_block_q2_k, q2_k);
    t[GT_Q3_K] = KQ_TRAITS("Q3_K", GT_Q3_K, kq_block_q3_k, q3_k);
    t[GT_Q4_K] = KQ_TRAITS("Q4_K", GT_Q4_K, kq_block_q4_k, q4_k);
    t[GT_Q5_K] = KQ_TRAITS("Q5_K", GT_Q5_K, kq_block_q5_k, q5_k);
    t[GT_Q6_K] = KQ_TRAITS("Q6_K", GT_Q6_K, kq_block_q6_k, q6_k);
    t[GT_IQ4_XS] = KQ_TRAITS("IQ4_XS", GT_IQ4_XS, kq_block_iq4_xs, iq4_xs);
}
