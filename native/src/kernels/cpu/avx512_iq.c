/*
 * avx512_iq.c — AVX-512 (F/BW/VL + VNNI + VBMI) dot products of IQ2_XXS, IQ2_XS and IQ3_XXS.
 * Block layouts and the float expression each block contributes are in quant/fmt_iq.c; these
 * kernels compute the same eight integer lane sums and then the same float operations, so they
 * return what the scalar reference returns, bit for bit.
 *
 * A super-block is decoded once into four 64-value registers
 *   g[k]  — unsigned grid magnitudes of values 64k..64k+63 (bytes, <= 62),
 *   s[k]  — a __mmask64 whose bit v negates value 64k+v: the block's 32 sign bytes (ksigns, each
 *           covering 8 values, bit j value j) laid end to end are exactly these four masks,
 *   sc[k] — the scale factor 2s+1 of every byte pair, as int16,
 * and every activation column then costs per 64 values: a masked negate of the codes,
 * vpmaddubsw(g, q) -> int16 pairs (|.| <= 2 * 62 * 127, no saturation) and vpdpwssd with sc
 * (int16 pairs times scale summed into int32, exact). The int32 lane m of register k holds values
 * 64k + 4m .. +3, i.e. the scalar's lane m % 8, so adding the two 256-bit halves gives the
 * scalar's eight lane sums (integers: any grouping is exact) and one _mm256_fmadd_ps per block
 * meets the column's float accumulator, as in the reference.
 *
 * Grid lookups (measured on this project's Xeon, Ice Lake server, 1 thread, hot cache, IQ2_XS at
 * one column; shared machine, best of 60 calls): the entries are read with scalar loads and inserted
 * (_mm512_set_epi64), ~45 cycles per super-block. vpgatherdq was 2.5x slower here (gathers are
 * microcoded on this CPU); the IQ2_XS grid as 2-bit codes (512 x 16 bits, looked up with eight
 * vpermt2w blended by index bits 6..8, then vpermb + vpmultishiftqb + a vpermb magnitude table)
 * ~53 cycles: port 5 bound, while the loads leave it free. The 512-entry grid fits no vpermb
 * table (64 bytes) or vpermi2b pair (128). Sign indices of IQ2_XXS/IQ3_XXS (four 7-bit fields per
 * word) are cut out with one vpmultishiftqb.
 *
 * Several columns (rows kernels, STRATA_ROWS_BIASED): the codes arrive biased (q + 128 as u8),
 * so the signs go onto the weights once per block (w = sign * g, |w| <= 62) instead of onto the
 * codes once per column: vpmaddubsw(q + 128, w) = vpmaddubsw's unbiased pair + 128 * (w0 + w1)
 * (|.| <= 2 * 255 * 62 < 2^15), and the second term times the scales, summed over the block, is a
 * per-block constant the int32 accumulators start from, negated. Per column and 64 values that
 * leaves vpmaddubsw + vpdpwssd.
 */
#include "avx512_iq.h"
#include "avx2_common.h" /* strata_hsum8_avx2: the eight float lanes are reduced as on AVX2 */
#include "quant_tables.h"

#define IQ_INLINE static inline __attribute__((always_inline))

enum { IQ2XXS_SIZE = 66, IQ2XS_SIZE = 74, IQ3XXS_SIZE = 98,
       PASS = 8,       /* columns per pass over a decoded block (int32 + float accumulators in registers) */
       MAX_COLS = 16   /* columns per decoded block */ };

enum { KIND_IQ2XXS, KIND_IQ2XS, KIND_IQ3XXS }; /* compile-time constants after inlining */

typedef struct {
    __m512i g[4], sc[4];
    __mmask64 s[4];
} iq_dec;

/* ---------------------------------------------------------------- block decoding */

/* Bytes holding 7-bit sign indices (bit 7 clear) -> the ksigns bytes: the index plus an 8th bit
 * that makes the number of set bits even. A byte's parity is that of its low nibble ^ high
 * nibble; a 16-entry shuffle table gives it as 0x80. */
IQ_INLINE __m256i ksigns_bytes(__m256i s) {
    const __m256i odd = _mm256_setr_epi8(0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0,
                                         0, -128, -128, 0, -128, 0, 0, -128, -128, 0, 0, -128, 0, -128, -128, 0);
    const __m256i nib = _mm256_and_si256(_mm256_xor_si256(s, _mm256_srli_epi16(s, 4)), _mm256_set1_epi8(0x0f));
    return _mm256_or_si256(s, _mm256_shuffle_epi8(odd, nib));
}

/* The 32 sign bytes in value order (byte i covers values 8i..8i+7) -> the four masks. */
IQ_INLINE void put_masks(__m256i sb, iq_dec *D) {
    D->s[0] = _cvtu64_mask64((uint64_t)_mm256_extract_epi64(sb, 0));
    D->s[1] = _cvtu64_mask64((uint64_t)_mm256_extract_epi64(sb, 1));
    D->s[2] = _cvtu64_mask64((uint64_t)_mm256_extract_epi64(sb, 2));
    D->s[3] = _cvtu64_mask64((uint64_t)_mm256_extract_epi64(sb, 3));
}

/* sc[k] from a byte table: int16 p of register k takes byte tab[base + (p >> shift) * step]
 * (vpermb; the high byte of each int16 is zeroed by the mask). k is a constant after unrolling. */
IQ_INLINE __m512i scale_words(__m512i tab, int base, int shift, int step) {
    const __m512i p = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15, 14, 13,
                                       12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i idx = _mm512_add_epi16(_mm512_mullo_epi16(_mm512_srli_epi16(p, (unsigned)shift),
                                                            _mm512_set1_epi16((short)step)),
                                         _mm512_set1_epi16((short)base));
    return _mm512_maskz_permutexvar_epi8(0x5555555555555555ull, idx, tab);
}

/* IQ2_XS: qs bits 0..8 grid entry, 9..15 sign index; scale nibble j covers values 16j..16j+15. */
IQ_INLINE void decode_iq2xs(const uint8_t *b, iq_dec *D) {
    const __m512i q = _mm512_loadu_si512(b + 2);
    put_masks(ksigns_bytes(_mm512_cvtepi16_epi8(_mm512_srli_epi16(q, 9))), D);
    for (int k = 0; k < 4; k++) {
        const uint8_t *qs = b + 2 + 16 * k;
#define G(o) (int64_t) strata_iq2xs_grid[strata_rd_u16(qs + (o)) & 511]
        D->g[k] = _mm512_set_epi64(G(14), G(12), G(10), G(8), G(6), G(4), G(2), G(0));
#undef G
    }
    /* table byte j = 2s+1 of scale group j (low nibble of byte j/2 first) */
    const __m128i sc8 = _mm_loadl_epi64((const __m128i *)(b + 66));
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i t = _mm_unpacklo_epi8(_mm_and_si128(sc8, m4), _mm_and_si128(_mm_srli_epi16(sc8, 4), m4));
    t = _mm_add_epi8(_mm_add_epi8(t, t), _mm_set1_epi8(1));
    const __m512i tab = _mm512_zextsi128_si512(t);
    for (int k = 0; k < 4; k++) D->sc[k] = scale_words(tab, 4 * k, 3, 1); /* group 4k + p/8 */
}

/* IQ2_XXS / IQ3_XXS: word ib (values 32ib..32ib+31) holds four 7-bit sign indices at bits 0, 7,
 * 14, 21 and the scale s in bits 28..31. */
IQ_INLINE void decode_words(__m256i w, iq_dec *D) {
    const __m256i cut = _mm256_set1_epi64x(0x352e2720150e0700ll); /* bit offsets 0,7,14,21,32,39,46,53 */
    put_masks(ksigns_bytes(_mm256_and_si256(_mm256_multishift_epi64_epi8(cut, w), _mm256_set1_epi8(0x7f))), D);
    const __m256i ls = _mm256_add_epi32(_mm256_slli_epi32(_mm256_srli_epi32(w, 28), 1), _mm256_set1_epi32(1));
    const __m512i tab = _mm512_zextsi256_si512(ls); /* byte 4ib = 2s+1 of word ib */
    for (int k = 0; k < 4; k++) D->sc[k] = scale_words(tab, 8 * k, 4, 4); /* word 2k + p/16 */
}

IQ_INLINE void decode_iq2xxs(const uint8_t *b, iq_dec *D) {
    /* 8 x { u8 grid[4]; u32 w }: the low dwords of the 8 qwords are the grid indices */
    const __m512i z = _mm512_loadu_si512(b + 2);
    decode_words(_mm512_cvtepi64_epi32(_mm512_srli_epi64(z, 32)), D);
    for (int k = 0; k < 4; k++) {
        const uint8_t *g = b + 2 + 16 * k;
#define G(o) (int64_t) strata_iq2xxs_grid[g[o]]
        D->g[k] = _mm512_set_epi64(G(11), G(10), G(9), G(8), G(3), G(2), G(1), G(0));
#undef G
    }
}

IQ_INLINE void decode_iq3xxs(const uint8_t *b, iq_dec *D) {
    decode_words(_mm256_loadu_si256((const __m256i *)(b + 66)), D);
    for (int k = 0; k < 4; k++) {
        const uint8_t *g = b + 2 + 16 * k;
#define G(o) (int)strata_iq3xxs_grid[g[o]]
        D->g[k] = _mm512_set_epi32(G(15), G(14), G(13), G(12), G(11), G(10), G(9), G(8), G(7), G(6), G(5), G(4),
                                   G(3), G(2), G(1), G(0));
#undef G
    }
}

IQ_INLINE void blk_decode(int kind, const uint8_t *b, iq_dec *D) {
    if (kind == KIND_IQ2XS) decode_iq2xs(b, D);
    else if (kind == KIND_IQ2XXS) decode_iq2xxs(b, D);
    else decode_iq3xxs(b, D);
}

IQ_INLINE float block_d(const uint8_t *b) { return _cvtsh_ss(strata_rd_u16(b)); }

/* facc = fma((d * x.d) * half_f, the eight lane sums of acc, facc): the scalar's expression. */
IQ_INLINE __m256 lanes_fma(__m512i acc, float dd, __m256 facc) {
    const __m256i l8 = _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
    return _mm256_fmadd_ps(_mm256_set1_ps(dd), _mm256_cvtepi32_ps(l8), facc);
}

/* ---------------------------------------------------------------- vec_dot: plain activations */

/* Decoded block i applied to m (<= PASS, a constant after inlining) columns xc[0..m). */
IQ_INLINE void pass_plain(const iq_dec *D, const act_q8_256 *const *xc, int m, int64_t i, float d, float half_f,
                          __m256 *facc) {
    const __m512i zero = _mm512_setzero_si512();
    __m512i acc[PASS];
    for (int c = 0; c < m; c++) acc[c] = zero;
    for (int k = 0; k < 4; k++)
        for (int c = 0; c < m; c++) {
            __m512i q = _mm512_loadu_si512(xc[c][i].qs + 64 * k);
            q = _mm512_mask_sub_epi8(q, D->s[k], zero, q); /* |q| <= 127: negation is exact */
            acc[c] = _mm512_dpwssd_epi32(acc[c], _mm512_maddubs_epi16(D->g[k], q), D->sc[k]);
        }
    for (int c = 0; c < m; c++) facc[c] = lanes_fma(acc[c], d * xc[c][i].d * half_f, facc[c]);
}

/* Columns [0, m1 + m2) of one row: each block decoded once, applied in passes of m1 and m2. */
IQ_INLINE void dot_cols(int kind, int64_t nb, const uint8_t *b, size_t type_size, const void *x, size_t x_stride,
                        int m1, int m2, float half_f, float *y) {
    const act_q8_256 *xc[MAX_COLS];
    __m256 facc[MAX_COLS];
    for (int c = 0; c < m1 + m2; c++) {
        xc[c] = (const act_q8_256 *)((const char *)x + (size_t)c * x_stride);
        facc[c] = _mm256_setzero_ps();
    }
    iq_dec D;
    for (int64_t i = 0; i < nb; i++, b += type_size) {
        blk_decode(kind, b, &D);
        const float d = block_d(b);
        pass_plain(&D, xc, m1, i, d, half_f, facc);
        if (m2 > 0) pass_plain(&D, xc + m1, m2, i, d, half_f, facc + m1);
    }
    for (int c = 0; c < m1 + m2; c++) y[c] = strata_hsum8_avx2(facc[c]);
}

IQ_INLINE void vec_dot_iq(int kind, int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y,
                          size_t type_size, float half_f) {
    const int64_t nb = n / QK_K;
    for (; ncols > 0; ncols -= MAX_COLS, y += MAX_COLS, x = (const char *)x + MAX_COLS * x_stride) {
#define COLS(m1, m2) dot_cols(kind, nb, w, type_size, x, x_stride, m1, m2, half_f, y)
        switch (ncols < MAX_COLS ? ncols : MAX_COLS) {
        case 1: COLS(1, 0); break;
        case 2: COLS(2, 0); break;
        case 3: COLS(3, 0); break;
        case 4: COLS(4, 0); break;
        case 5: COLS(5, 0); break;
        case 6: COLS(6, 0); break;
        case 7: COLS(7, 0); break;
        case 8: COLS(8, 0); break;
        case 9: COLS(8, 1); break;
        case 10: COLS(8, 2); break;
        case 11: COLS(8, 3); break;
        case 12: COLS(8, 4); break;
        case 13: COLS(8, 5); break;
        case 14: COLS(8, 6); break;
        case 15: COLS(8, 7); break;
        default: COLS(8, 8); break;
        }
#undef COLS
        if (ncols <= MAX_COLS) break; /* (no pointer is moved past the columns) */
    }
}

void strata_avx512_vec_dot_iq2_xxs(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    vec_dot_iq(KIND_IQ2XXS, n, w, x, x_stride, ncols, y, IQ2XXS_SIZE, 0.125f);
}

void strata_avx512_vec_dot_iq2_xs(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    vec_dot_iq(KIND_IQ2XS, n, w, x, x_stride, ncols, y, IQ2XS_SIZE, 0.125f);
}

void strata_avx512_vec_dot_iq3_xxs(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    vec_dot_iq(KIND_IQ3XXS, n, w, x, x_stride, ncols, y, IQ3XXS_SIZE, 0.25f);
}

/* ---------------------------------------------------------------- rows kernels: biased activations */

typedef struct {
    __m512i w[4], sc[4];
    __m512i ncorr; /* -(the 128 * w terms times the scales), per int32 lane */
} iq_decb;

IQ_INLINE void blk_decode_biased(int kind, const uint8_t *b, iq_decb *B) {
    iq_dec D;
    blk_decode(kind, b, &D);
    const __m512i zero = _mm512_setzero_si512(), c128 = _mm512_set1_epi8((char)0x80);
    __m512i corr = zero;
    for (int k = 0; k < 4; k++) {
        B->w[k] = _mm512_mask_sub_epi8(D.g[k], D.s[k], zero, D.g[k]);
        B->sc[k] = D.sc[k];
        corr = _mm512_dpwssd_epi32(corr, _mm512_maddubs_epi16(c128, B->w[k]), D.sc[k]);
    }
    B->ncorr = _mm512_sub_epi32(zero, corr);
}

IQ_INLINE void pass_biased(const iq_decb *B, const act_q8_256 *const *xc, int m, int64_t i, float d, float half_f,
                           __m256 *facc) {
    __m512i acc[PASS];
    for (int c = 0; c < m; c++) acc[c] = B->ncorr;
    for (int k = 0; k < 4; k++)
        for (int c = 0; c < m; c++) {
            const __m512i qu = _mm512_loadu_si512(xc[c][i].qs + 64 * k);
            acc[c] = _mm512_dpwssd_epi32(acc[c], _mm512_maddubs_epi16(qu, B->w[k]), B->sc[k]);
        }
    for (int c = 0; c < m; c++) facc[c] = lanes_fma(acc[c], d * xc[c][i].d * half_f, facc[c]);
}

/* Columns [0, PASS * np + mr) of one row (mr < PASS, a constant after inlining). */
IQ_INLINE void dot_cols_biased(int kind, int64_t nb, const uint8_t *b, size_t type_size, const void *x,
                               size_t x_stride, int np, int mr, float half_f, float *y) {
    const act_q8_256 *xc[MAX_COLS];
    __m256 facc[MAX_COLS];
    const int m = PASS * np + mr;
    for (int c = 0; c < m; c++) {
        xc[c] = (const act_q8_256 *)((const char *)x + (size_t)c * x_stride);
        facc[c] = _mm256_setzero_ps();
    }
    iq_decb B;
    for (int64_t i = 0; i < nb; i++, b += type_size) {
        blk_decode_biased(kind, b, &B);
        const float d = block_d(b);
        for (int p = 0; p < np; p++) pass_biased(&B, xc + PASS * p, PASS, i, d, half_f, facc + PASS * p);
        if (mr > 0) pass_biased(&B, xc + PASS * np, mr, i, d, half_f, facc + PASS * np);
    }
    for (int c = 0; c < m; c++) y[c] = strata_hsum8_avx2(facc[c]);
}

IQ_INLINE void rows_iq(int kind, int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                       size_t x_stride, int ncols, float *y, int64_t ldy, size_t type_size, float half_f) {
    const int64_t nb = n / QK_K;
    float t[MAX_COLS];
    for (int c0 = 0; c0 < ncols; c0 += MAX_COLS) {
        const int nc = ncols - c0 < MAX_COLS ? ncols - c0 : MAX_COLS;
        const void *xs = (const char *)x + (size_t)c0 * x_stride;
        const int np = nc / PASS;
        for (int64_t r = 0; r < nrows; r++) {
            const uint8_t *wr = (const uint8_t *)w + (size_t)r * w_row;
#define COLS(mr) dot_cols_biased(kind, nb, wr, type_size, xs, x_stride, np, mr, half_f, t)
            switch (nc % PASS) {
            case 0: COLS(0); break;
            case 1: COLS(1); break;
            case 2: COLS(2); break;
            case 3: COLS(3); break;
            case 4: COLS(4); break;
            case 5: COLS(5); break;
            case 6: COLS(6); break;
            default: COLS(7); break;
            }
#undef COLS
            for (int c = 0; c < nc; c++) y[(int64_t)(c0 + c) * ldy + r] = t[c];
        }
    }
}

void strata_avx512_rows_iq2_xxs(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                                size_t x_stride, int ncols, float *y, int64_t ldy) {
    rows_iq(KIND_IQ2XXS, n, w, w_row, nrows, x, x_stride, ncols, y, ldy, IQ2XXS_SIZE, 0.125f);
}

void strata_avx512_rows_iq2_xs(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                               size_t x_stride, int ncols, float *y, int64_t ldy) {
    rows_iq(KIND_IQ2XS, n, w, w_row, nrows, x, x_stride, ncols, y, ldy, IQ2XS_SIZE, 0.125f);
}

void strata_avx512_rows_iq3_xxs(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                                size_t x_stride, int ncols, float *y, int64_t ldy) {
    rows_iq(KIND_IQ3XXS, n, w, w_row, nrows, x, x_stride, ncols, y, ldy, IQ3XXS_SIZE, 0.25f);
}

/* ---------------------------------------------------------------- converted rows (prefill)
 *
 * Products with many columns (matmul.c's conversion path, STRATA_CONV_ROWS = 16 rows per task):
 * the rows are decoded once into int16 weights with the scale folded in, (2s+1) * grid * sign
 * (|.| <= 31 * 62 < 2^15), laid out with the 16 rows across the lanes of a zmm: block b holds
 * int32 pair words W[b][p][r] = (weight 2p, weight 2p+1) of row r, p < 128, then the 16 rows' f32
 * d. A column then costs, per 16 rows and 256 values, 128 vpdpwssd of those words against the
 * broadcast int16 pair of activation codes and no decoding, where the rows kernel above pays 8
 * multiplies (maddubs + vpdpwssd) per row and block plus a block decode per 16 columns. The
 * integer lane sums are the scalar's (pair p holds values 2p, 2p+1: scalar lane (p / 2) % 8), exact
 * in int32, and the float step per block and lane is the scalar's, 16 rows per instruction.
 * Measured (2560 x 2560, 512 columns, 1 thread): 84-92 GFLOP/s against the rows kernel's 53-58. The
 * same layout for the K-quants (offset and min terms as 8 more vpdpwssd against the bsum pairs) lost
 * to their rows kernels (Q4_K 77-83 vs 104-106 GFLOP/s), which multiply unsigned codes with vpdpbusd,
 * 64 MACs per uop against vpdpwssd's 32, so they have none. */

enum { CONV_PAIRS = QK_K / 2, CONV_LANES = 16,
       CONV_BLK = CONV_PAIRS * CONV_LANES * 4 + CONV_LANES * 4, /* bytes per block of 16 rows */
       CONV_COLS = 3 /* columns per pass: 3 x 8 int32 accumulators + the weight word register */ };

/* The 16 scale factors 2s+1, one per 16 values, of an IQ block. */
IQ_INLINE void blk_scales(int kind, const uint8_t *b, int16_t ls[16]) {
    for (int g = 0; g < 16; g++) {
        uint32_t s;
        if (kind == KIND_IQ2XS) s = (uint32_t)(b[66 + g / 2] >> (4 * (g % 2))) & 15;
        else if (kind == KIND_IQ2XXS) s = strata_rd_u32(b + 2 + 8 * (g / 2) + 4) >> 28;
        else s = strata_rd_u32(b + 66 + 4 * (g / 2)) >> 28;
        ls[g] = (int16_t)(2 * s + 1);
    }
}

IQ_INLINE size_t conv_iq(int kind, int64_t n, const void *w, size_t w_row, int64_t nrows, void *dst,
                         size_t type_size) {
    const int64_t nb = n / QK_K;
    if (!dst) return (size_t)nb * CONV_BLK;
    char *out = dst;
    if (nrows < CONV_LANES) memset(out, 0, (size_t)nb * CONV_BLK); /* missing rows: zero weights, d = 0 */
    const __m512i zero = _mm512_setzero_si512();
    for (int64_t r = 0; r < nrows; r++) {
        const uint8_t *b = (const uint8_t *)w + (size_t)r * w_row;
        for (int64_t i = 0; i < nb; i++, b += type_size) {
            iq_dec D;
            blk_decode(kind, b, &D);
            int16_t ls[16];
            blk_scales(kind, b, ls);
            int32_t v[CONV_PAIRS]; /* the row's 256 weights as int16 pairs */
            for (int k = 0; k < 4; k++) {
                const __m512i sw = _mm512_mask_sub_epi8(D.g[k], D.s[k], zero, D.g[k]);
                for (int h = 0; h < 2; h++) {
                    const __m512i w16 = _mm512_cvtepi8_epi16(h ? _mm512_extracti64x4_epi64(sw, 1)
                                                               : _mm512_castsi512_si256(sw));
                    const int g = 4 * k + 2 * h; /* values 64k + 32h .. +31: groups g, g + 1 */
                    const __m512i sc = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(ls[g])),
                                                          _mm256_set1_epi16(ls[g + 1]), 1);
                    _mm512_storeu_si512(v + 32 * k + 16 * h, _mm512_mullo_epi16(w16, sc));
                }
            }
            int32_t *wp = (int32_t *)(out + (size_t)i * CONV_BLK);
            for (int p = 0; p < CONV_PAIRS; p++) wp[p * CONV_LANES + r] = v[p];
            ((float *)(wp + CONV_PAIRS * CONV_LANES))[r] = block_d(b);
        }
    }
    return (size_t)nb * CONV_BLK;
}

/* Columns xc[0..m) (m <= CONV_COLS, a constant after inlining) against the converted rows. */
IQ_INLINE void conv_pass(const char *cw, int64_t nb, const act_q8_256 *const *xc, const int16_t *const *x16, int m,
                         float half_f, __m512 *out) {
    __m512 facc[CONV_COLS][8];
    for (int c = 0; c < m; c++)
        for (int j = 0; j < 8; j++) facc[c][j] = _mm512_setzero_ps();
    for (int64_t i = 0; i < nb; i++, cw += CONV_BLK) {
        const int32_t *xp[CONV_COLS];
        for (int c = 0; c < m; c++) xp[c] = (const int32_t *)(x16[c] + i * QK_K);
        __m512i acc[CONV_COLS][8];
        for (int c = 0; c < m; c++)
            for (int j = 0; j < 8; j++) acc[c][j] = _mm512_setzero_si512();
        const int32_t *wp = (const int32_t *)cw;
#pragma GCC unroll 128
        for (int q = 0; q < CONV_PAIRS; q++) {
            /* pairs in the order (32-value chunk, half of a lane's 4 values, lane): consecutive
             * vpdpwssd then feed different accumulators (integer sums: any order is exact) */
            const int p = (q & ~15) | ((q & 7) << 1) | ((q >> 3) & 1);
            const __m512i wv = _mm512_load_si512(wp + p * CONV_LANES);
            const int j = (p / 2) % 8;
            for (int c = 0; c < m; c++) acc[c][j] = _mm512_dpwssd_epi32(acc[c][j], _mm512_set1_epi32(xp[c][p]), wv);
        }
        const __m512 d = _mm512_load_ps((const float *)(wp + CONV_PAIRS * CONV_LANES));
        for (int c = 0; c < m; c++) {
            const __m512 dd = _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(xc[c][i].d)), _mm512_set1_ps(half_f));
            for (int j = 0; j < 8; j++) facc[c][j] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(acc[c][j]), facc[c][j]);
        }
    }
    for (int c = 0; c < m; c++) /* strata_hsum8's order, for 16 rows at once */
        out[c] = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(facc[c][0], facc[c][4]), _mm512_add_ps(facc[c][2], facc[c][6])),
                               _mm512_add_ps(_mm512_add_ps(facc[c][1], facc[c][5]), _mm512_add_ps(facc[c][3], facc[c][7])));
}

IQ_INLINE void conv_dot_iq(int64_t n, const void *conv, int64_t nrows, const void *x, size_t x_stride,
                           const int16_t *x16, int ncols, float *y, int64_t ldy, float half_f) {
    const int64_t nb = n / QK_K;
    const __mmask16 keep = (__mmask16)((1u << nrows) - 1);
    for (int c0 = 0; c0 < ncols; c0 += CONV_COLS) {
        const act_q8_256 *xc[CONV_COLS];
        const int16_t *xw[CONV_COLS];
        const int m = ncols - c0 < CONV_COLS ? ncols - c0 : CONV_COLS;
        for (int c = 0; c < m; c++) {
            xc[c] = (const act_q8_256 *)((const char *)x + (size_t)(c0 + c) * x_stride);
            xw[c] = x16 + (size_t)(c0 + c) * (size_t)n;
        }
        __m512 out[CONV_COLS];
        if (m == 3) conv_pass(conv, nb, xc, xw, 3, half_f, out);
        else if (m == 2) conv_pass(conv, nb, xc, xw, 2, half_f, out);
        else conv_pass(conv, nb, xc, xw, 1, half_f, out);
        for (int c = 0; c < m; c++) _mm512_mask_storeu_ps(y + (int64_t)(c0 + c) * ldy, keep, out[c]);
    }
}

size_t strata_avx512_conv_iq2_xxs(int64_t n, const void *w, size_t w_row, int64_t nrows, void *dst) {
    return conv_iq(KIND_IQ2XXS, n, w, w_row, nrows, dst, IQ2XXS_SIZE);
}
size_t strata_avx512_conv_iq2_xs(int64_t n, const void *w, size_t w_row, int64_t nrows, void *dst) {
    return conv_iq(KIND_IQ2XS, n, w, w_row, nrows, dst, IQ2XS_SIZE);
}
size_t strata_avx512_conv_iq3_xxs(int64_t n, const void *w, size_t w_row, int64_t nrows, void *dst) {
    return conv_iq(KIND_IQ3XXS, n, w, w_row, nrows, dst, IQ3XXS_SIZE);
}
void strata_avx512_conv_dot_iq2(int64_t n, const void *conv, int64_t nrows, const void *x, size_t x_stride,
                                const int16_t *x16, int ncols, float *y, int64_t ldy) {
    conv_dot_iq(n, conv, nrows, x, x_stride, x16, ncols, y, ldy, 0.125f);
}
void strata_avx512_conv_dot_iq3(int64_t n, const void *conv, int64_t nrows, const void *x, size_t x_stride,
                                const int16_t *x16, int ncols, float *y, int64_t ldy) {
    conv_dot_iq(n, conv, nrows, x, x_stride, x16, ncols, y, ldy, 0.25f);
}
