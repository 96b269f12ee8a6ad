/*
 * avx2_iq.c — AVX2 dequantization and dot products of IQ2_XXS, IQ2_XS and IQ3_XXS.
 * Block layouts and the float expression each block contributes are in quant/fmt_iq.c;
 * these kernels compute the same integers and the same float operations, so they return
 * what the scalar reference returns, bit for bit.
 *
 * Dot products: a super-block is decoded once into eight 32-value registers
 *   g  — unsigned grid magnitudes (bytes, <= 62),
 *   s  — +1/-1 per byte (the signs, applied to the activations: sign_epi8),
 *   sc — 16-bit scale factors 2s+1 matching the int16 lanes maddubs produces,
 * then for every activation column: maddubs(g, sign(q8, s)) -> int16 pairs (|.| <= 2*62*127,
 * no saturation for any input), madd with sc -> int32, summed into the block's exact isum.
 * With several columns the decoded block sits in a 768-byte stack buffer (L1) and is applied
 * to up to four columns per pass, so decoding is paid once per block, not once per column.
 */
#include "avx2_iq.h"
#include "avx2_common.h"
#include "quant_tables.h"

enum { IQ2XXS_SIZE = 66, IQ2XS_SIZE = 74, IQ3XXS_SIZE = 98, MAX_COLS = 16 };

/* ---------------------------------------------------------------- sign helpers */

/* Bit j of byte j%8: masks the sign bit of each of the 8 values a sign byte covers. */
static inline __m256i sign_bit_mask(void) { return _mm256_set1_epi64x((int64_t)0x8040201008040201ull); }

/* v: every dword holds 4 sign bytes (byte l for values 8l..8l+7 of a 32-value register).
 * Returns +1 / -1 per value. */
static inline __m256i signs_pm1(__m256i v) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bits = sign_bit_mask();
    v = _mm256_and_si256(_mm256_shuffle_epi8(v, spread), bits);
    return _mm256_or_si256(_mm256_cmpeq_epi8(v, bits), _mm256_set1_epi8(1));
}

/* Dword k of s4 broadcast, then expanded to +1/-1 per value. */
static inline __m256i signs_pm1_lane(__m256i s4, int k) {
    return signs_pm1(_mm256_permutevar8x32_epi32(s4, _mm256_set1_epi32(k)));
}

/* w: per dword four 7-bit sign indices at bits 0, 7, 14, 21 (IQ2_XXS, IQ3_XXS). Returns per
 * dword the four sign bytes ksigns[index]: the index plus an 8th bit that makes the number
 * of set bits even (that is what the ksigns table holds). */
static inline __m256i ksigns_x4(__m256i w) {
    const __m256i m7 = _mm256_set1_epi32(0x7f);
    __m256i s = _mm256_and_si256(w, m7);
    s = _mm256_or_si256(s, _mm256_and_si256(_mm256_slli_epi32(w, 1), _mm256_slli_epi32(m7, 8)));
    s = _mm256_or_si256(s, _mm256_and_si256(_mm256_slli_epi32(w, 2), _mm256_slli_epi32(m7, 16)));
    s = _mm256_or_si256(s, _mm256_and_si256(_mm256_slli_epi32(w, 3), _mm256_slli_epi32(m7, 24)));
    /* parity of each byte lands in its bit 0 (bits shifted in from the next byte only
     * reach bits 4..7, which are not used) */
    __m256i p = _mm256_xor_si256(s, _mm256_srli_epi32(s, 4));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 2));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 1));
    p = _mm256_and_si256(p, _mm256_set1_epi32(0x01010101));
    return _mm256_or_si256(s, _mm256_slli_epi32(p, 7));
}

/* ---------------------------------------------------------------- decoded super-block */

typedef struct {
    __m256i g[8], s[8], sc[8];
} iq_dec; /* 768 bytes */

/* isum[c] for nc (<= 4, a constant after inlining) columns of one decoded super-block. */
static inline void dot_dec(const iq_dec *D, const int8_t *const *q, int nc, int32_t *isum) {
    __m256i acc[4];
    for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++) {
        const __m256i g = _mm256_load_si256(&D->g[k]);
        const __m256i s = _mm256_load_si256(&D->s[k]);
        const __m256i sc = _mm256_load_si256(&D->sc[k]);
        for (int c = 0; c < nc; c++) {
            const __m256i qv = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(q[c] + 32 * k)), s);
            acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(_mm256_maddubs_epi16(g, qv), sc));
        }
    }
    for (int c = 0; c < nc; c++) isum[c] = strata_hsum_i32x8(acc[c]);
}

/* Applies decoded block i to columns [0, ncols) (ncols <= MAX_COLS). */
static inline void dot_dec_cols(const iq_dec *D, const void *x, size_t x_stride, int ncols, int64_t i,
                                float d, float half_f, float (*facc)[8]) {
    for (int c0 = 0; c0 < ncols; c0 += 4) {
        const int m = ncols - c0 < 4 ? ncols - c0 : 4;
        const act_q8_256 *xb[4];
        const int8_t *q[4];
        int32_t isum[4];
        for (int c = 0; c < m; c++) {
            xb[c] = (const act_q8_256 *)((const char *)x + (size_t)(c0 + c) * x_stride) + i;
            q[c] = xb[c]->qs;
        }
        switch (m) {
        case 4: dot_dec(D, q, 4, isum); break;
        case 3: dot_dec(D, q, 3, isum); break;
        case 2: dot_dec(D, q, 2, isum); break;
        default: dot_dec(D, q, 1, isum); break;
        }
        for (int c = 0; c < m; c++) facc[c0 + c][i % 8] += d * xb[c]->d * (float)isum[c] * half_f;
    }
}

/* ---------------------------------------------------------------- IQ2_XS */

/* Block-level parts of an IQ2_XS super-block: S = 32 sign bytes (byte i for qs[i]),
 * L = the 16 scale factors 2s+1 as bytes [lo nibbles of bytes 0..7 | hi nibbles], in both
 * 128-bit lanes. */
static inline void iq2xs_prep(const uint8_t *b, __m256i *S, __m256i *L) {
    const __m256i q0 = _mm256_loadu_si256((const __m256i *)(b + 2));
    const __m256i q1 = _mm256_loadu_si256((const __m256i *)(b + 34));
    __m256i s[2];
    const __m256i one16 = _mm256_set1_epi16(1);
    const __m256i q[2] = {q0, q1};
    for (int h = 0; h < 2; h++) {
        const __m256i idx = _mm256_srli_epi16(q[h], 9); /* 7-bit sign index */
        __m256i p = _mm256_xor_si256(idx, _mm256_srli_epi16(idx, 4));
        p = _mm256_xor_si256(p, _mm256_srli_epi16(p, 2));
        p = _mm256_xor_si256(p, _mm256_srli_epi16(p, 1));
        s[h] = _mm256_or_si256(idx, _mm256_slli_epi16(_mm256_and_si256(p, one16), 7));
    }
    *S = _mm256_permute4x64_epi64(_mm256_packus_epi16(s[0], s[1]), 0xD8);
    const __m128i sc = _mm_loadl_epi64((const __m128i *)(b + 66));
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i l = _mm_unpacklo_epi64(_mm_and_si128(sc, m4), _mm_and_si128(_mm_srli_epi16(sc, 4), m4));
    l = _mm_add_epi8(_mm_add_epi8(l, l), _mm_set1_epi8(1));
    *L = _mm256_broadcastsi128_si256(l);
}

/* Register k (values 32k..32k+31, qs 4k..4k+3, scale groups 2k and 2k+1). */
static inline void iq2xs_reg(const uint8_t *b, __m256i S, __m256i L, int k, __m256i *g, __m256i *s,
                             __m256i *sc) {
    const uint8_t *qs = b + 2 + 8 * k;
    *g = _mm256_set_epi64x((int64_t)strata_iq2xs_grid[strata_rd_u16(qs + 6) & 511],
                           (int64_t)strata_iq2xs_grid[strata_rd_u16(qs + 4) & 511],
                           (int64_t)strata_iq2xs_grid[strata_rd_u16(qs + 2) & 511],
                           (int64_t)strata_iq2xs_grid[strata_rd_u16(qs + 0) & 511]);
    *s = signs_pm1_lane(S, k);
    /* int16 lanes: low 128 bits take byte k of L (group 2k), high 128 bits byte 8+k */
    const __m256i ctl = _mm256_add_epi16(_mm256_setr_epi16(
        (short)0x8000, (short)0x8000, (short)0x8000, (short)0x8000, (short)0x8000, (short)0x8000,
        (short)0x8000, (short)0x8000, (short)0x8008, (short)0x8008, (short)0x8008, (short)0x8008,
        (short)0x8008, (short)0x8008, (short)0x8008, (short)0x8008), _mm256_set1_epi16((short)k));
    *sc = _mm256_shuffle_epi8(L, ctl);
}

static inline void iq2xs_decode(const uint8_t *b, iq_dec *D) {
    __m256i S, L;
    iq2xs_prep(b, &S, &L);
    for (int k = 0; k < 8; k++) iq2xs_reg(b, S, L, k, &D->g[k], &D->s[k], &D->sc[k]);
}

static inline int32_t iq2xs_isum1(const uint8_t *b, const int8_t *q) {
    __m256i S, L;
    iq2xs_prep(b, &S, &L);
    __m256i acc = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++) {
        __m256i g, s, sc;
        iq2xs_reg(b, S, L, k, &g, &s, &sc);
        const __m256i qv = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(q + 32 * k)), s);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(g, qv), sc));
    }
    return strata_hsum_i32x8(acc);
}

/* ---------------------------------------------------------------- IQ2_XXS */

/* The eight per-32 words of an IQ2_XXS block (each follows its 4 grid bytes). */
static inline __m256i iq2xxs_words(const uint8_t *b) {
    const __m256i v0 = _mm256_loadu_si256((const __m256i *)(b + 2));
    const __m256i v1 = _mm256_loadu_si256((const __m256i *)(b + 34));
    const __m256i odd = _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7);
    return _mm256_blend_epi32(_mm256_permutevar8x32_epi32(v0, odd), _mm256_permutevar8x32_epi32(v1, odd), 0xF0);
}

/* Scale factors 2s+1 (s = top nibble of each word) as two int16 per dword. */
static inline __m256i iq_word_scales(__m256i w) {
    const __m256i ls = _mm256_add_epi32(_mm256_slli_epi32(_mm256_srli_epi32(w, 28), 1), _mm256_set1_epi32(1));
    return _mm256_or_si256(ls, _mm256_slli_epi32(ls, 16));
}

static inline void iq2xxs_reg(const uint8_t *b, __m256i S4, __m256i LS, int k, __m256i *g, __m256i *s,
                              __m256i *sc) {
    const uint8_t *gi = b + 2 + 8 * k;
    *g = _mm256_set_epi64x((int64_t)strata_iq2xxs_grid[gi[3]], (int64_t)strata_iq2xxs_grid[gi[2]],
                           (int64_t)strata_iq2xxs_grid[gi[1]], (int64_t)strata_iq2xxs_grid[gi[0]]);
    *s = signs_pm1_lane(S4, k);
    *sc = _mm256_permutevar8x32_epi32(LS, _mm256_set1_epi32(k));
}

static inline void iq2xxs_decode(const uint8_t *b, iq_dec *D) {
    const __m256i w = iq2xxs_words(b);
    const __m256i S4 = ksigns_x4(w), LS = iq_word_scales(w);
    for (int k = 0; k < 8; k++) iq2xxs_reg(b, S4, LS, k, &D->g[k], &D->s[k], &D->sc[k]);
}

static inline int32_t iq2xxs_isum1(const uint8_t *b, const int8_t *q) {
    const __m256i w = iq2xxs_words(b);
    const __m256i S4 = ksigns_x4(w), LS = iq_word_scales(w);
    __m256i acc = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++) {
        __m256i g, s, sc;
        iq2xxs_reg(b, S4, LS, k, &g, &s, &sc);
        const __m256i qv = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(q + 32 * k)), s);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(g, qv), sc));
    }
    return strata_hsum_i32x8(acc);
}

/* ---------------------------------------------------------------- IQ3_XXS */

static inline void iq3xxs_reg(const uint8_t *b, __m256i S4, __m256i LS, int k, __m256i *g, __m256i *s,
                              __m256i *sc) {
    const uint8_t *gi = b + 2 + 8 * k;
    *g = _mm256_setr_epi32((int)strata_iq3xxs_grid[gi[0]], (int)strata_iq3xxs_grid[gi[1]],
                           (int)strata_iq3xxs_grid[gi[2]], (int)strata_iq3xxs_grid[gi[3]],
                           (int)strata_iq3xxs_grid[gi[4]], (int)strata_iq3xxs_grid[gi[5]],
                           (int)strata_iq3xxs_grid[gi[6]], (int)strata_iq3xxs_grid[gi[7]]);
    *s = signs_pm1_lane(S4, k);
    *sc = _mm256_permutevar8x32_epi32(LS, _mm256_set1_epi32(k));
}

static inline void iq3xxs_decode(const uint8_t *b, iq_dec *D) {
    const __m256i w = _mm256_loadu_si256((const __m256i *)(b + 66));
    const __m256i S4 = ksigns_x4(w), LS = iq_word_scales(w);
    for (int k = 0; k < 8; k++) iq3xxs_reg(b, S4, LS, k, &D->g[k], &D->s[k], &D->sc[k]);
}

static inline int32_t iq3xxs_isum1(const uint8_t *b, const int8_t *q) {
    const __m256i w = _mm256_loadu_si256((const __m256i *)(b + 66));
    const __m256i S4 = ksigns_x4(w), LS = iq_word_scales(w);
    __m256i acc = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++) {
        __m256i g, s, sc;
        iq3xxs_reg(b, S4, LS, k, &g, &s, &sc);
        const __m256i qv = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(q + 32 * k)), s);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(g, qv), sc));
    }
    return strata_hsum_i32x8(acc);
}

/* ---------------------------------------------------------------- vec_dot drivers */

typedef int32_t (*isum1_fn)(const uint8_t *b, const int8_t *q);
typedef void (*decode_fn)(const uint8_t *b, iq_dec *D);

static inline float block_d(const uint8_t *b) { return _cvtsh_ss(strata_rd_u16(b)); }

static inline void vec_dot_drv(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y,
                               size_t type_size, float half_f, isum1_fn isum1, decode_fn decode) {
    const int64_t nb = n / QK_K;
    if (ncols == 1) {
        const act_q8_256 *xb = x;
        const uint8_t *b = w;
        float acc[8] = {0};
        for (int64_t i = 0; i < nb; i++, b += type_size) {
            const int32_t is = isum1(b, xb[i].qs);
            acc[i % 8] += block_d(b) * xb[i].d * (float)is * half_f;
        }
        y[0] = strata_hsum8(acc);
        return;
    }
    iq_dec D;
    for (int c0 = 0; c0 < ncols; c0 += MAX_COLS) {
        const int m = ncols - c0 < MAX_COLS ? ncols - c0 : MAX_COLS;
        const char *xc = (const char *)x + (size_t)c0 * x_stride;
        float facc[MAX_COLS][8];
        memset(facc, 0, sizeof facc);
        const uint8_t *b = w;
        for (int64_t i = 0; i < nb; i++, b += type_size) {
            decode(b, &D);
            dot_dec_cols(&D, xc, x_stride, m, i, block_d(b), half_f, facc);
        }
        for (int c = 0; c < m; c++) y[c0 + c] = strata_hsum8(facc[c]);
    }
}

void strata_avx2_vec_dot_iq2_xxs(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    vec_dot_drv(n, w, x, x_stride, ncols, y, IQ2XXS_SIZE, 0.125f, iq2xxs_isum1, iq2xxs_decode);
}

void strata_avx2_vec_dot_iq2_xs(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    vec_dot_drv(n, w, x, x_stride, ncols, y, IQ2XS_SIZE, 0.125f, iq2xs_isum1, iq2xs_decode);
}

void strata_avx2_vec_dot_iq3_xxs(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    vec_dot_drv(n, w, x, x_stride, ncols, y, IQ3XXS_SIZE, 0.25f, iq3xxs_isum1, iq3xxs_decode);
}

/* ---------------------------------------------------------------- dequantization */

/* dst[j] = (db * grid byte j) negated where bit j of signs is set: the scalar expression. */
static inline void store8(float *dst, uint64_t g, uint32_t signs, __m256 db) {
    const __m256 v = _mm256_mul_ps(db, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128((int64_t)g))));
    const __m256i bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    __m256i m = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)signs), bits), bits);
    m = _mm256_slli_epi32(m, 31);
    _mm256_storeu_ps(dst, _mm256_xor_ps(v, _mm256_castsi256_ps(m)));
}

void strata_avx2_dequant_iq2_xxs(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b += IQ2XXS_SIZE) {
        const float d = block_d(b);
        for (int ib = 0; ib < 8; ib++) {
            const uint8_t *gi = b + 2 + 8 * ib;
            const uint32_t w = strata_rd_u32(gi + 4);
            const __m256 db = _mm256_set1_ps(d * (0.5f + (float)(w >> 28)) * 0.25f);
            for (int l = 0; l < 4; l++, dst += 8)
                store8(dst, strata_iq2xxs_grid[gi[l]], strata_ksigns_iq2xs[(w >> (7 * l)) & 127], db);
        }
    }
}

void strata_avx2_dequant_iq2_xs(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b += IQ2XS_SIZE) {
        const float d = block_d(b);
        for (int ig = 0; ig < 16; ig++) {
            const uint32_t s = (b[66 + ig / 2] >> (4 * (ig % 2))) & 15;
            const __m256 db = _mm256_set1_ps(d * (0.5f + (float)s) * 0.25f);
            for (int l = 0; l < 2; l++, dst += 8) {
                const uint16_t q = strata_rd_u16(b + 2 + 2 * (2 * ig + l));
                store8(dst, strata_iq2xs_grid[q & 511], strata_ksigns_iq2xs[q >> 9], db);
            }
        }
    }
}

void strata_avx2_dequant_iq3_xxs(const void *src, float *dst, int64_t n) {
    const uint8_t *b = src;
    for (int64_t i = 0; i < n / QK_K; i++, b += IQ3XXS_SIZE) {
        const float d = block_d(b);
        const uint8_t *qs = b + 2;
        for (int ib = 0; ib < 8; ib++) {
            const uint32_t w = strata_rd_u32(b + 66 + 4 * ib);
            const __m256 db = _mm256_set1_ps(d * (0.5f + (float)(w >> 28)) * 0.5f);
            for (int l = 0; l < 4; l++, dst += 8) {
                const uint64_t g = (uint64_t)strata_iq3xxs_grid[qs[8 * ib + 2 * l]] |
                                   (uint64_t)strata_iq3xxs_grid[qs[8 * ib + 2 * l + 1]] << 32;
                store8(dst, g, strata_ksigns_iq2xs[(w >> (7 * l)) & 127], db);
            }
        }
    }
}
