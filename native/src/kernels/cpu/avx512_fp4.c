/* avx512_fp4.c — AVX-512 dot products of IQ4_NL, MXFP4, NVFP4 (the driver, the integer scheme
 * and the float order: avx512_q8.h; the formats: quant/fmt_fp4.c). Codes become values with one
 * _mm512_shuffle_epi8 per 64 codes (the 16-entry table in each 128-bit lane). Dequantization keeps
 * the AVX2 path's (memory-bound; nothing to gain). */
#include "avx512_fp4.h"
#include "avx2_fp4.h"
#include "avx512_q8.h"
#include "quant_tables.h"

static inline const int8_t *zf_table(z8fmt f) {
    return f == Z8_IQ4_NL ? strata_kvalues_iq4nl : f == Z8_MXFP4 ? strata_kvalues_mxfp4 : strata_kvalues_nvfp4;
}

/* Lane k = strata_e8m0_half(low byte of lane k of v). */
static inline __m256 zf_e8m0_half8(__m256i v) {
    const __m256i e = _mm256_and_si256(v, _mm256_set1_epi32(0xff));
    const __m256i big = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __mmask8 small = _mm256_cmplt_epu32_mask(e, _mm256_set1_epi32(2));
    return _mm256_castsi256_ps(_mm256_mask_sllv_epi32(big, small, _mm256_set1_epi32(0x00200000), e));
}

/* Lanes = strata_ue4m3_half of the byte at bit shift sh[lane] of v's 32-bit lanes. The byte 0x7f
 * (before bit 7 is dropped) decodes to 0. bits = (x << 20) + (119 << 23) reads as
 * f = (1 + m/8) * 2^(e-8), the value for e >= 1; for e == 0, f = (8 + m) * 2^-11 < 2^-7 and the
 * value, m * 2^-10, is exactly 2f - 2^-7 (no subnormal is formed). */
static inline __m512 zf_ue4m3_half16(__m512i v, __m512i sh) {
    const __m512i b = _mm512_and_si512(_mm512_srlv_epi32(v, sh), _mm512_set1_epi32(0xff));
    const __mmask16 live = _mm512_cmpneq_epi32_mask(b, _mm512_set1_epi32(0x7f));
    const __m512i x = _mm512_maskz_and_epi32(live, b, _mm512_set1_epi32(0x7f));
    const __m512 f = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_slli_epi32(x, 20), _mm512_set1_epi32(119 << 23)));
    const __m512 lim = _mm512_set1_ps(0x1p-7f);
    return _mm512_mask_sub_ps(f, _mm512_cmp_ps_mask(f, lim, _CMP_LT_OQ), _mm512_add_ps(f, f), lim);
}

/* The 64 codes of an NVFP4 block at p in value order, sub-block j in 128-bit lane j: bytes
 * 8j..8j+7 of qs give its values 0..7 (low nibbles) and 8..15 (high nibbles). */
static inline __m512i zf_nv_codes(const uint8_t *p) {
    const __m512i q = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(p + 4)));
    const __m512i z = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 0, 1, 1, 2, 2, 3, 3), q);
    return _mm512_and_si512(_mm512_srlv_epi64(z, _mm512_setr_epi64(0, 4, 0, 4, 0, 4, 0, 4)), _mm512_set1_epi8(0x0f));
}

static inline void z8_decode(z8fmt f, const uint8_t *p, const uint8_t *const *wk, z8_group *g) {
    const int ts = z8_ts(f);
    const __m512i tab = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)zf_table(f)));
    if (f == Z8_NVFP4) {
        const __m512i neg = _mm512_sub_epi8(_mm512_setzero_si512(), tab);
        for (int k = 0; k < 8; k++) {
            const __m512i c = zf_nv_codes(q8_blk(p, ts, k, wk));
            g->w[k] = _mm512_shuffle_epi8(tab, c);
            g->c[k] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8((char)0x80),
                                          _mm512_shuffle_epi8(neg, c));
        }
        /* lane k (and 8 + k) of the scale vectors: block k's four scale bytes */
        const __m256i s4 = q8_load_u32x8(p, ts, wk);
        const __m512i s8 = _mm512_inserti64x4(_mm512_castsi256_si512(s4), s4, 1);
        g->sp = zf_ue4m3_half16(s8, _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 16, 16, 16, 16, 16, 16, 16, 16));
        g->sq = zf_ue4m3_half16(s8, _mm512_setr_epi32(8, 8, 8, 8, 8, 8, 8, 8, 24, 24, 24, 24, 24, 24, 24, 24));
        g->d = g->m = _mm256_setzero_ps(); /* unused by NVFP4; set so no path reads them undefined */
        return;
    }
    const int qo = f == Z8_IQ4_NL ? 2 : 1;
    const __m512i utab = _mm512_xor_si512(tab, _mm512_set1_epi8((char)0x80)); /* value + 128 */
    for (int i = 0; i < 4; i++)
        g->w[i] = _mm512_shuffle_epi8(utab, z8_nibbles2(q8_blk(p, ts, i, wk) + qo, q8_blk(p, ts, i + 4, wk) + qo));
    g->d = f == Z8_IQ4_NL ? q8_load_f16x8(p, ts, 0, wk) : zf_e8m0_half8(q8_load_u32x8(p, ts, wk));
}

/* The block's 32 operands (value + 128) in value order (z8_rows; IQ4_NL and MXFP4). */
static inline __m256i z8_values(z8fmt f, const uint8_t *p) {
    const __m256i utab = _mm256_xor_si256(q8_table16(zf_table(f)), _mm256_set1_epi8((char)0x80));
    return _mm256_shuffle_epi8(utab, q8_nibbles(p + (f == Z8_IQ4_NL ? 2 : 1)));
}

/* IQ4_NL: the F16 d; MXFP4: strata_e8m0_half of the first byte (as zf_e8m0_half8). */
static inline void z8_scales16(z8fmt f, __m512i raw, __m512 *d, __m512 *m) {
    *m = _mm512_setzero_ps();
    if (f == Z8_IQ4_NL) {
        *d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(raw));
        return;
    }
    const __m512i e = _mm512_and_si512(raw, _mm512_set1_epi32(0xff));
    const __m512i big = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    const __mmask16 small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    *d = _mm512_castsi512_ps(_mm512_mask_sllv_epi32(big, small, _mm512_set1_epi32(0x00200000), e));
}

void strata_avx512_vec_dot_iq4_nl(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    z8_vec_dot(Z8_IQ4_NL, n, w, x, xs, nc, y);
}
void strata_avx512_vec_dot_mxfp4(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    z8_vec_dot(Z8_MXFP4, n, w, x, xs, nc, y);
}
void strata_avx512_vec_dot_nvfp4(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    z8_vec_dot(Z8_NVFP4, n, w, x, xs, nc, y);
}

/* Several rows at once (quant.h rows). IQ4_NL and MXFP4 take z8_rows (avx512_q8.h: rows across
 * the int32 lanes) for several columns: interleaved with the AVX2 8-rows kernel on the shared
 * 2-core Xeon, GB/s of weights, 2560x96 (3-block expert down rows) at 16 columns 0.72 -> 1.65
 * (IQ4_NL, 1 thread), 4 columns 3.16 -> 3.61; 2560 wide see the report of issue 17. At one column
 * short rows (at most 16 blocks) keep the AVX2 8-rows kernel (z8_rows decodes 16 rows per block
 * for a single product; the AVX2 kernel was 1.5-5x this file's vec_dot there). NVFP4 always takes
 * the AVX2 8-rows kernel: its 16-value sub-blocks are not in z8_rows yet, whose fallback (vec_dot
 * row by row) measured slower at 16 columns, 2 threads (2560x2560: 1.73 -> 1.03 GB/s; 640x2560:
 * 1.68 -> 1.26). All give vec_dot's bits (avx512_q8.h z8_rows_or_short). */
void strata_avx512_rows_iq4_nl(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                               size_t x_stride, int ncols, float *y, int64_t ldy) {
    z8_rows_or_short(Z8_IQ4_NL, strata_avx2_rows_iq4_nl, 16, n, w, w_row, nrows, x, x_stride, ncols, y, ldy);
}
void strata_avx512_rows_mxfp4(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                              size_t x_stride, int ncols, float *y, int64_t ldy) {
    z8_rows_or_short(Z8_MXFP4, strata_avx2_rows_mxfp4, 16, n, w, w_row, nrows, x, x_stride, ncols, y, ldy);
}
void strata_avx512_rows_nvfp4(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                              size_t x_stride, int ncols, float *y, int64_t ldy) {
    z8_rows_or_short(Z8_NVFP4, strata_avx2_rows_nvfp4, 16, n, w, w_row, nrows, x, x_stride, ncols, y, ldy);
}
