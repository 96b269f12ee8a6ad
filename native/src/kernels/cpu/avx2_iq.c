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
 * no saturation for any input), madd with sc -> int32 lanes, summed over the block (exact).
 * Lane j's sum converts to float and meets the column's accumulator lane j in one FMA, as in
 * the scalar reference: no horizontal sum per block.
 * The decoded block sits in a 768-byte stack buffer (L1) and is applied to every column, so
 * decoding is paid once per block, not once per column. Each column count 1..16 has its own
 * straight-line loop (format and count are constants after forced inlining); 9..16 columns
 * are a pass of 8 plus a pass of the rest over the same decoded block.
 */
#include "avx2_iq.h"
#include "avx2_common.h"
#include "quant_tables.h"

/* The per-format helpers below take the format and the column count as arguments that are
 * constants at every call site; forced inlining turns each combination into straight code. */
#define IQ_INLINE static inline __attribute__((always_inline))

enum { IQ2XXS_SIZE = 66, IQ2XS_SIZE = 74, IQ3XXS_SIZE = 98, MAX_COLS = 16,
       BIASED_COLS = 16 /* columns per decoded block in the biased kernels (32 measured no faster) */ };

/* ---------------------------------------------------------------- sign helpers */

/* Bit j of byte j%8: masks the sign bit of each of the 8 values a sign byte covers. */
static inline __m256i sign_bit_mask(void) { return _mm256_set1_epi64x((int64_t)0x8040201008040201ull); }

/* Signs of register k (values 32k..32k+31) as +1 / -1 per value. h holds the block's sign
 * bytes 16 * (k / 4) .. + 15 in both 128-bit lanes; byte 4 * (k % 4) + l covers values
 * 8l..8l+7 of the register, bit j value 8l+j. k is a constant after unrolling, so the
 * shuffle control is too. */
IQ_INLINE __m256i signs_pm1(__m256i h, int k) {
    const char j = (char)(4 * (k % 4));
    const __m256i spread = _mm256_setr_epi8(j, j, j, j, j, j, j, j, j + 1, j + 1, j + 1, j + 1, j + 1, j + 1,
                                            j + 1, j + 1, j + 2, j + 2, j + 2, j + 2, j + 2, j + 2, j + 2, j + 2,
                                            j + 3, j + 3, j + 3, j + 3, j + 3, j + 3, j + 3, j + 3);
    const __m256i bits = sign_bit_mask();
    const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(h, spread), bits);
    return _mm256_or_si256(_mm256_cmpeq_epi8(v, bits), _mm256_set1_epi8(1));
}

/* Byte v (0..15) -> 0x80 if v has an odd number of set bits, else 0. */
IQ_INLINE __m256i odd_parity_lut(void) {
    return _mm256_setr_epi8(0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0,
                            0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0);
}

/* w: per dword four 7-bit sign indices at bits 0, 7, 14, 21 (IQ2_XXS, IQ3_XXS). Returns per
 * dword the four sign bytes ksigns[index]: the index plus an 8th bit that makes the number
 * of set bits even (that is what the ksigns table holds). */
IQ_INLINE __m256i ksigns_x4(__m256i w) {
    const __m256i m7 = _mm256_set1_epi32(0x7f);
    __m256i s = _mm256_and_si256(w, m7);
    s = _mm256_or_si256(s, _mm256_and_si256(_mm256_slli_epi32(w, 1), _mm256_slli_epi32(m7, 8)));
    s = _mm256_or_si256(s, _mm256_and_si256(_mm256_slli_epi32(w, 2), _mm256_slli_epi32(m7, 16)));
    s = _mm256_or_si256(s, _mm256_and_si256(_mm256_slli_epi32(w, 3), _mm256_slli_epi32(m7, 24)));
    /* a byte's parity is that of its low nibble ^ its high bits, a 4-bit value whose parity
     * bit (as 0x80) a 16-entry shuffle table gives */
    const __m256i nib = _mm256_and_si256(_mm256_xor_si256(s, _mm256_srli_epi32(s, 4)), _mm256_set1_epi8(0x0f));
    return _mm256_or_si256(s, _mm256_shuffle_epi8(odd_parity_lut(), nib));
}

/* ---------------------------------------------------------------- per-format decoding */

enum { KIND_IQ2XXS, KIND_IQ2XS, KIND_IQ3XXS }; /* compile-time constants after inlining */

/* Block-level parts, computed once per super-block:
 *   S[0], S[1]: the 32 sign bytes, 4 per register (bytes 4k..4k+3 for register k; IQ2_XS:
 *               byte i for qs[i]), bytes 0..15 and 16..31 each copied to both 128-bit lanes;
 *   L:          IQ2_XS: the 16 scale factors 2s+1 as bytes [low nibbles of scale bytes 0..7 |
 *               high nibbles], in both lanes; IQ2_XXS/IQ3_XXS: per dword k the factor of
 *               register k as two int16. */
typedef struct {
    __m256i S[2], L;
} iq_blk;

IQ_INLINE void put_signs(iq_blk *P, __m256i s) {
    P->S[0] = _mm256_permute4x64_epi64(s, 0x44);
    P->S[1] = _mm256_permute4x64_epi64(s, 0xEE);
}

/* Scale factors 2s+1 (s = top nibble of each word) as two int16 per dword. */
IQ_INLINE __m256i iq_word_scales(__m256i w) {
    const __m256i ls = _mm256_add_epi32(_mm256_slli_epi32(_mm256_srli_epi32(w, 28), 1), _mm256_set1_epi32(1));
    return _mm256_or_si256(ls, _mm256_slli_epi32(ls, 16));
}

IQ_INLINE void iq2xs_prep(const uint8_t *b, iq_blk *P) {
    __m256i s[2];
    for (int h = 0; h < 2; h++) {
        const __m256i q = _mm256_loadu_si256((const __m256i *)(b + 2 + 32 * h));
        /* 7-bit sign index; its parity is that of (bits 0..3) ^ (bits 4..6) */
        const __m256i idx = _mm256_srli_epi16(q, 9);
        const __m256i nib = _mm256_xor_si256(idx, _mm256_srli_epi16(q, 13));
        s[h] = _mm256_or_si256(idx, _mm256_shuffle_epi8(odd_parity_lut(), nib));
    }
    put_signs(P, _mm256_permute4x64_epi64(_mm256_packus_epi16(s[0], s[1]), 0xD8));
    const __m128i sc = _mm_loadl_epi64((const __m128i *)(b + 66));
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i l = _mm_unpacklo_epi64(_mm_and_si128(sc, m4), _mm_and_si128(_mm_srli_epi16(sc, 4), m4));
    l = _mm_add_epi8(_mm_add_epi8(l, l), _mm_set1_epi8(1));
    P->L = _mm256_broadcastsi128_si256(l);
}

IQ_INLINE void blk_prep(int kind, const uint8_t *b, iq_blk *P) {
    if (kind == KIND_IQ2XS) {
        iq2xs_prep(b, P);
        return;
    }
    __m256i w;
    if (kind == KIND_IQ2XXS) { /* each group's word follows its 4 grid bytes: odd dwords */
        const __m256i v0 = _mm256_loadu_si256((const __m256i *)(b + 2));
        const __m256i v1 = _mm256_loadu_si256((const __m256i *)(b + 34));
        const __m256i odd = _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7);
        w = _mm256_blend_epi32(_mm256_permutevar8x32_epi32(v0, odd), _mm256_permutevar8x32_epi32(v1, odd), 0xF0);
    } else {
        w = _mm256_loadu_si256((const __m256i *)(b + 66));
    }
    put_signs(P, ksigns_x4(w));
    P->L = iq_word_scales(w);
}

/* Register k of a super-block: values 32k..32k+31. */
IQ_INLINE void blk_reg(int kind, const uint8_t *b, const iq_blk *P, int k, __m256i *g, __m256i *s,
                           __m256i *sc) {
    if (kind == KIND_IQ2XS) {
        /* scalar index loads: measurably faster than extracting them from a vector */
        const uint8_t *qs = b + 2 + 8 * k;
        *g = _mm256_set_epi64x((int64_t)strata_iq2xs_grid[strata_rd_u16(qs + 6) & 511],
                               (int64_t)strata_iq2xs_grid[strata_rd_u16(qs + 4) & 511],
                               (int64_t)strata_iq2xs_grid[strata_rd_u16(qs + 2) & 511],
                               (int64_t)strata_iq2xs_grid[strata_rd_u16(qs + 0) & 511]);
        /* int16 lanes: low 128 bits take byte k of L (scale group 2k), high 128 bits byte 8+k
         * (control byte 0x80 zeroes the high byte) */
        const short lo = (short)(0x8000 | k), hi = (short)(0x8008 | k);
        const __m256i ctl = _mm256_setr_epi16(lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi);
        *sc = _mm256_shuffle_epi8(P->L, ctl);
    } else {
        const uint8_t *gi = b + 2 + 8 * k;
        if (kind == KIND_IQ2XXS)
            *g = _mm256_set_epi64x((int64_t)strata_iq2xxs_grid[gi[3]], (int64_t)strata_iq2xxs_grid[gi[2]],
                                   (int64_t)strata_iq2xxs_grid[gi[1]], (int64_t)strata_iq2xxs_grid[gi[0]]);
        else
            *g = _mm256_setr_epi32((int)strata_iq3xxs_grid[gi[0]], (int)strata_iq3xxs_grid[gi[1]],
                                   (int)strata_iq3xxs_grid[gi[2]], (int)strata_iq3xxs_grid[gi[3]],
                                   (int)strata_iq3xxs_grid[gi[4]], (int)strata_iq3xxs_grid[gi[5]],
                                   (int)strata_iq3xxs_grid[gi[6]], (int)strata_iq3xxs_grid[gi[7]]);
        *sc = _mm256_permutevar8x32_epi32(P->L, _mm256_set1_epi32(k));
    }
    *s = signs_pm1(P->S[k / 4], k);
}

/* acc += the int32 partial sums of 32 values: maddubs(g, q * sign) -> int16 pairs (|.| <=
 * 2 * 62 * 127 for every weight byte, no saturation), madd with the scale factors. */
IQ_INLINE __m256i dot32(__m256i acc, __m256i g, __m256i s, __m256i sc, const int8_t *q) {
    const __m256i qv = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)q), s);
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(g, qv), sc));
}

IQ_INLINE float block_d(const uint8_t *b) { return _cvtsh_ss(strata_rd_u16(b)); }

/* ---------------------------------------------------------------- decoded super-block */

/* One super-block decoded for all columns (768 bytes, stays in L1). */
typedef struct {
    __m256i g[8], s[8], sc[8];
} iq_dec;

IQ_INLINE void blk_decode(int kind, const uint8_t *b, iq_dec *D) {
    iq_blk P;
    blk_prep(kind, b, &P);
    for (int k = 0; k < 8; k++) blk_reg(kind, b, &P, k, &D->g[k], &D->s[k], &D->sc[k]);
}

/* Applies decoded block i to m (<= 8, a constant after inlining) columns xc[0..m): the
 * int32 lane sums of each column, then facc[c] = fma((d * x.d) * half_f, lanes, facc[c]),
 * the scalar reference's expression. */
IQ_INLINE void dot_dec_pass(const iq_dec *D, const act_q8_256 *const *xc, int m, int64_t i, float d,
                            float half_f, __m256 *facc) {
    __m256i acc[8];
    for (int c = 0; c < m; c++) acc[c] = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++) {
        const __m256i g = _mm256_load_si256(&D->g[k]);
        const __m256i s = _mm256_load_si256(&D->s[k]);
        const __m256i sc = _mm256_load_si256(&D->sc[k]);
        for (int c = 0; c < m; c++) acc[c] = dot32(acc[c], g, s, sc, xc[c][i].qs + 32 * k);
    }
    for (int c = 0; c < m; c++) {
        const __m256 dd = _mm256_set1_ps(d * xc[c][i].d * half_f);
        facc[c] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(acc[c]), facc[c]);
    }
}

/* Columns [0, m1 + m2): every super-block is decoded once, then applied to a pass of m1 and
 * a pass of m2 columns (m1, m2 <= 8, constants after inlining). */
IQ_INLINE void vec_dot_many(int kind, int64_t nb, const uint8_t *b, size_t type_size, const void *x,
                            size_t x_stride, int m1, int m2, float half_f, float *y) {
    const act_q8_256 *xc[16];
    __m256 facc[16];
    for (int c = 0; c < m1 + m2; c++) {
        xc[c] = (const act_q8_256 *)((const char *)x + (size_t)c * x_stride);
        facc[c] = _mm256_setzero_ps();
    }
    iq_dec D;
    for (int64_t i = 0; i < nb; i++, b += type_size) {
        blk_decode(kind, b, &D);
        const float d = block_d(b);
        dot_dec_pass(&D, xc, m1, i, d, half_f, facc);
        if (m2 > 0) dot_dec_pass(&D, xc + m1, m2, i, d, half_f, facc + m1);
    }
    for (int c = 0; c < m1 + m2; c++) y[c] = strata_hsum8_avx2(facc[c]);
}

/* One column: each register decoded and used at once, nothing stored (vec_dot_many's decoded block for
 * one column went through the stack, and so did its accumulator); the same integers and float
 * expression, so the same result bit for bit. */
IQ_INLINE void vec_dot_one(int kind, int64_t nb, const uint8_t *b, size_t type_size, const void *x, float half_f,
                           float *y) {
    const act_q8_256 *xa = x;
    __m256 facc = _mm256_setzero_ps();
    for (int64_t i = 0; i < nb; i++, b += type_size) {
        iq_blk P;
        blk_prep(kind, b, &P);
        __m256i acc = _mm256_setzero_si256();
        for (int k = 0; k < 8; k++) {
            __m256i g, s, sc;
            blk_reg(kind, b, &P, k, &g, &s, &sc);
            acc = dot32(acc, g, s, sc, xa[i].qs + 32 * k);
        }
        const __m256 dd = _mm256_set1_ps(block_d(b) * xa[i].d * half_f);
        facc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(acc), facc);
    }
    *y = strata_hsum8_avx2(facc);
}

/* ---------------------------------------------------------------- vec_dot entry points */

IQ_INLINE void vec_dot_iq(int kind, int64_t n, const void *w, const void *x, size_t x_stride, int ncols,
                          float *y, size_t type_size, float half_f) {
    const int64_t nb = n / QK_K;
    while (ncols > 0) {
#define MANY(m1, m2) vec_dot_many(kind, nb, w, type_size, x, x_stride, m1, m2, half_f, y)
        switch (ncols) {
        case 1: vec_dot_one(kind, nb, w, type_size, x, half_f, y); break;
        case 2: MANY(2, 0); break;
        case 3: MANY(3, 0); break;
        case 4: MANY(4, 0); break;
        case 5: MANY(5, 0); break;
        case 6: MANY(6, 0); break;
        case 7: MANY(7, 0); break;
        case 8: MANY(8, 0); break;
        case 9: MANY(8, 1); break;
        case 10: MANY(8, 2); break;
        case 11: MANY(8, 3); break;
        case 12: MANY(8, 4); break;
        case 13: MANY(8, 5); break;
        case 14: MANY(8, 6); break;
        case 15: MANY(8, 7); break;
        default: MANY(8, 8); break;
        }
#undef MANY
        if (ncols <= MAX_COLS) break; /* (no pointer is moved past the columns) */
        ncols -= MAX_COLS;
        y += MAX_COLS;
        x = (const char *)x + MAX_COLS * x_stride;
    }
}

void strata_avx2_vec_dot_iq2_xxs(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    vec_dot_iq(KIND_IQ2XXS, n, w, x, x_stride, ncols, y, IQ2XXS_SIZE, 0.125f);
}

void strata_avx2_vec_dot_iq2_xs(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    vec_dot_iq(KIND_IQ2XS, n, w, x, x_stride, ncols, y, IQ2XS_SIZE, 0.125f);
}

void strata_avx2_vec_dot_iq3_xxs(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    vec_dot_iq(KIND_IQ3XXS, n, w, x, x_stride, ncols, y, IQ3XXS_SIZE, 0.25f);
}

/* ---------------------------------------------------------------- several columns, biased activations */

/* For products of several columns, matmul.c stores the activation codes biased: byte q ^ 0x80,
 * i.e. q + 128 as an unsigned byte (strata_act_bias_q8_256). Then the signs can go onto the
 * weights once per row instead of onto the activations once per column:
 *     maddubs(q + 128, w) = [the row path's maddubs(g, sign(q, s))] + maddubs(128, w)
 * for w = sign(g, s) (|w| <= 62, so no pair reaches 2 * 255 * 62 = 31620: no saturation), and
 * after madd with the scale factors the second term, summed over the block, is the constant
 * corr that the accumulator starts from (negated). Integer lanes are exact, so every lane equals
 * the row path's and the float part is unchanged: bit for bit vec_dot's result. The inner loop
 * per column and 32 values is maddubs + madd + add instead of sign + maddubs + madd + add. */
typedef struct {
    __m256i w[8], sc[8];
    __m256i ncorr; /* -corr */
} iq_decb;

IQ_INLINE void blk_decode_biased(int kind, const uint8_t *b, iq_decb *D) {
    iq_blk P;
    blk_prep(kind, b, &P);
    const __m256i c128 = _mm256_set1_epi8((char)0x80);
    __m256i corr = _mm256_setzero_si256();
    for (int k = 0; k < 8; k++) {
        __m256i g, s;
        blk_reg(kind, b, &P, k, &g, &s, &D->sc[k]);
        D->w[k] = _mm256_sign_epi8(g, s);
        corr = _mm256_add_epi32(corr, _mm256_madd_epi16(_mm256_maddubs_epi16(c128, D->w[k]), D->sc[k]));
    }
    D->ncorr = _mm256_sub_epi32(_mm256_setzero_si256(), corr);
}

IQ_INLINE void dot_decb_pass(const iq_decb *D, const act_q8_256 *const *xc, int m, int64_t i, float d,
                             float half_f, __m256 *facc) {
    __m256i acc[8];
    for (int c = 0; c < m; c++) acc[c] = D->ncorr;
    for (int k = 0; k < 8; k++) {
        const __m256i w = _mm256_load_si256(&D->w[k]);
        const __m256i sc = _mm256_load_si256(&D->sc[k]);
        for (int c = 0; c < m; c++) {
            const __m256i qu = _mm256_loadu_si256((const __m256i *)(xc[c][i].qs + 32 * k));
            acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(_mm256_maddubs_epi16(qu, w), sc));
        }
    }
    for (int c = 0; c < m; c++) {
        const __m256 dd = _mm256_set1_ps(d * xc[c][i].d * half_f);
        facc[c] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(acc[c]), facc[c]);
    }
}

/* Columns [0, 8 * np + mr): every super-block is decoded once, then applied in np passes of 8
 * columns and one of mr (mr <= 7, a constant after inlining). */
IQ_INLINE void vec_dot_many_biased(int kind, int64_t nb, const uint8_t *b, size_t type_size, const void *x,
                                   size_t x_stride, int np, int mr, float half_f, float *y) {
    const act_q8_256 *xc[BIASED_COLS];
    __m256 facc[BIASED_COLS];
    const int m = 8 * np + mr;
    for (int c = 0; c < m; c++) {
        xc[c] = (const act_q8_256 *)((const char *)x + (size_t)c * x_stride);
        facc[c] = _mm256_setzero_ps();
    }
    iq_decb D;
    for (int64_t i = 0; i < nb; i++, b += type_size) {
        blk_decode_biased(kind, b, &D);
        const float d = block_d(b);
        for (int p = 0; p < np; p++) dot_decb_pass(&D, xc + 8 * p, 8, i, d, half_f, facc + 8 * p);
        if (mr > 0) dot_decb_pass(&D, xc + 8 * np, mr, i, d, half_f, facc + 8 * np);
    }
    for (int c = 0; c < m; c++) y[c] = strata_hsum8_avx2(facc[c]);
}

IQ_INLINE void rows_iq_biased(int kind, int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                              size_t x_stride, int ncols, float *y, int64_t ldy, size_t type_size, float half_f) {
    const int64_t nb = n / QK_K;
    float t[BIASED_COLS];
    for (int c0 = 0; c0 < ncols; c0 += BIASED_COLS) {
        const int nc = ncols - c0 < BIASED_COLS ? ncols - c0 : BIASED_COLS;
        const void *xs = (const char *)x + (size_t)c0 * x_stride;
        for (int64_t r = 0; r < nrows; r++) {
            const uint8_t *wr = (const uint8_t *)w + (size_t)r * w_row;
            /* both pass counts constants, as vec_dot_iq's: with np a variable the accumulators of a partial
             * pass went through memory, and 12 or 14 columns took 1.11-1.16x the time of these */
#define MANYB(np, mr) vec_dot_many_biased(kind, nb, wr, type_size, xs, x_stride, np, mr, half_f, t)
            switch (nc) {
            case 8: MANYB(1, 0); break;
            case 9: MANYB(1, 1); break;
            case 10: MANYB(1, 2); break;
            case 11: MANYB(1, 3); break;
            case 12: MANYB(1, 4); break;
            case 13: MANYB(1, 5); break;
            case 14: MANYB(1, 6); break;
            case 15: MANYB(1, 7); break;
            case 16: MANYB(2, 0); break;
            case 1: MANYB(0, 1); break;
            case 2: MANYB(0, 2); break;
            case 3: MANYB(0, 3); break;
            case 4: MANYB(0, 4); break;
            case 5: MANYB(0, 5); break;
            case 6: MANYB(0, 6); break;
            default: MANYB(0, 7); break;
            }
#undef MANYB
            for (int c = 0; c < nc; c++) y[(int64_t)(c0 + c) * ldy + r] = t[c];
        }
    }
}

void strata_avx2_rows_iq2_xxs(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                              int ncols, float *y, int64_t ldy) {
    rows_iq_biased(KIND_IQ2XXS, n, w, w_row, nrows, x, x_stride, ncols, y, ldy, IQ2XXS_SIZE, 0.125f);
}

void strata_avx2_rows_iq2_xs(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                             int ncols, float *y, int64_t ldy) {
    rows_iq_biased(KIND_IQ2XS, n, w, w_row, nrows, x, x_stride, ncols, y, ldy, IQ2XS_SIZE, 0.125f);
}

void strata_avx2_rows_iq3_xxs(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                              int ncols, float *y, int64_t ldy) {
    rows_iq_biased(KIND_IQ3XXS, n, w, w_row, nrows, x, x_stride, ncols, y, ldy, IQ3XXS_SIZE, 0.25f);
}

void strata_act_bias_q8_256(void *x, int64_t n) {
    act_q8_256 *a = x;
    const __m256i m = _mm256_set1_epi8((char)0x80);
    for (int64_t i = 0; i < n / QK_K; i++)
        for (int k = 0; k < QK_K; k += 32) {
            __m256i *p = (__m256i *)(a[i].qs + k);
            _mm256_storeu_si256(p, _mm256_xor_si256(_mm256_loadu_si256(p), m));
        }
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
