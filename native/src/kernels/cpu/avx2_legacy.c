/* avx2_legacy.c — AVX2 dequantization and dot products of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
 * Layouts and the float operations per block: quant/fmt_legacy.c (done here in the same
 * order, so results match the scalar reference bit for bit).
 *
 * A dot product walks the row in groups of 8 blocks (block b -> lane b % 8). A group's
 * weights are decoded once into maddubs operands and then applied to every column:
 *   Q4_x/Q5_x  codes 0..31 times the int8 activations; Q4_0/Q5_0 subtract 8 or 16 times the
 *              activation code sum afterwards (exact), which avoids a sign step per column.
 *   Q8_0       |q| times the activations with q's sign moved onto them (|q| <= 128).
 */
#include "avx2_legacy.h"
#include "avx2_common.h"
#include "avx2_q8.h"

typedef enum { QL_Q4_0, QL_Q4_1, QL_Q5_0, QL_Q5_1, QL_Q8_0 } qlfmt;

enum { QL_MAX_COLS = 16 };

static inline int ql_ts(qlfmt f) {
    switch (f) {
    case QL_Q4_0: return 18;
    case QL_Q4_1: return 20;
    case QL_Q5_0: return 22;
    case QL_Q5_1: return 24;
    default: return 34;
    }
}

static inline int ql_has_min(qlfmt f) { return f == QL_Q4_1 || f == QL_Q5_1; }

/* Code offset of the symmetric formats: w = d * (q - offset). */
static inline int ql_offset(qlfmt f) { return f == QL_Q4_0 ? 8 : f == QL_Q5_0 ? 16 : 0; }

/* 0x10 in byte j where bit j of qh is set. */
static inline __m256i q5_high_bits(uint32_t qh) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), spread);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* The 32 codes of the block at p in value order: 0..31 for Q4/Q5, int8 for Q8_0. */
static inline __m256i ql_codes(qlfmt f, const uint8_t *p) {
    switch (f) {
    case QL_Q4_0: return q8_nibbles(p + 2);
    case QL_Q4_1: return q8_nibbles(p + 4);
    case QL_Q5_0: return _mm256_or_si256(q8_nibbles(p + 6), q5_high_bits(strata_rd_u32(p + 2)));
    case QL_Q5_1: return _mm256_or_si256(q8_nibbles(p + 8), q5_high_bits(strata_rd_u32(p + 4)));
    default: return _mm256_loadu_si256((const __m256i *)(p + 2));
    }
}

/* ---------------------------------------------------------------- dequantization */

static inline void ql_dequant(qlfmt f, const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    const int ts = ql_ts(f);
    for (int64_t b = 0; b < n / 32; b++, p += ts, dst += 32) {
        __m256i v = ql_codes(f, p);
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(strata_rd_u16(p)));
        if (!ql_has_min(f)) {
            if (ql_offset(f)) v = _mm256_sub_epi8(v, _mm256_set1_epi8((char)ql_offset(f)));
            q8_store_scaled(v, d, dst);
            continue;
        }
        /* d * q + m, rounded twice as gguf.quants does */
        const __m256 m = _mm256_set1_ps(_cvtsh_ss(strata_rd_u16(p + 2)));
        const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
        const __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
        for (int k = 0; k < 4; k++) {
            const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(part[k]));
            _mm256_storeu_ps(dst + 8 * k, _mm256_add_ps(_mm256_mul_ps(d, q), m));
        }
    }
}

void strata_avx2_dequant_q4_0(const void *src, float *dst, int64_t n) { ql_dequant(QL_Q4_0, src, dst, n); }
void strata_avx2_dequant_q4_1(const void *src, float *dst, int64_t n) { ql_dequant(QL_Q4_1, src, dst, n); }
void strata_avx2_dequant_q5_0(const void *src, float *dst, int64_t n) { ql_dequant(QL_Q5_0, src, dst, n); }
void strata_avx2_dequant_q5_1(const void *src, float *dst, int64_t n) { ql_dequant(QL_Q5_1, src, dst, n); }
void strata_avx2_dequant_q8_0(const void *src, float *dst, int64_t n) { ql_dequant(QL_Q8_0, src, dst, n); }

/* ---------------------------------------------------------------- dot products */

/* Eight blocks' weights as maddubs operands. */
typedef struct {
    __m256i wu[8]; /* unsigned operand: codes, or |q| for Q8_0 */
    __m256i ws[8]; /* Q8_0 only: q itself (sign source) */
} ql_weights;

static inline void ql_block_operands(qlfmt f, const uint8_t *p, __m256i *wu, __m256i *ws) {
    const __m256i v = ql_codes(f, p);
    if (f == QL_Q8_0) {
        *ws = v;
        *wu = _mm256_abs_epi8(v); /* -128 -> 0x80, i.e. 128 unsigned */
    } else {
        *wu = v;
    }
}

/* The float-part terms (see q8_terms) of 8 blocks against activation blocks a[0..7], or the
 * tables wk, ak of a short row (see q8_blk). The weights come decoded (w != NULL; several
 * columns) or are decoded here from p (one column: nothing is stored and reloaded). d, m:
 * lane k = scale and min of block k. */
static inline q8_terms ql_terms(qlfmt f, const ql_weights *w, const uint8_t *p, const uint8_t *const *wk,
                                __m256 d, __m256 m, const act_q8_32 *a, const act_q8_32 *const *ak) {
    const int ts = ql_ts(f);
    __m256i pk[8];
    for (int k = 0; k < 8; k++) {
        __m256i wu, ws = _mm256_setzero_si256();
        if (w) {
            wu = w->wu[k];
            if (f == QL_Q8_0) ws = w->ws[k];
        } else {
            ql_block_operands(f, q8_blk(p, ts, k, wk), &wu, &ws);
        }
        const __m256i y = _mm256_loadu_si256((const __m256i *)q8_act_blk(a, k, ak)->qs);
        pk[k] = f == QL_Q8_0 ? q8_dot_s8(wu, ws, y) : _mm256_maddubs_epi16(wu, y);
    }
    /* |codes| <= 15 (Q4) keep 16 products within 15 * 127 * 16 = 30480: those sums fit
     * int16. Q5 (16 products up to 62992) sums in 32 bits; Q8_0's madd is in q8_dot_s8. */
    __m256i sumi = f == QL_Q8_0 ? q8_reduce8(pk)
                 : (f == QL_Q4_0 || f == QL_Q4_1) ? q8_reduce8_i16_16(pk) : q8_reduce8_madd(pk);
    __m256 dx;
    __m256i sumy = _mm256_setzero_si256();
    q8_act_ds8(a, ak, 0, 1, &dx, ql_offset(f) || ql_has_min(f) ? &sumy : NULL);
    if (ql_offset(f)) sumi = _mm256_sub_epi32(sumi, _mm256_mullo_epi32(sumy, _mm256_set1_epi32(ql_offset(f))));
    q8_terms t;
    t.a0 = _mm256_mul_ps(d, dx);
    t.b0 = _mm256_cvtepi32_ps(sumi);
    if (ql_has_min(f)) {
        t.a1 = _mm256_mul_ps(m, dx);
        t.b1 = _mm256_cvtepi32_ps(sumy);
    } else {
        t.a1 = t.b1 = _mm256_setzero_ps();
    }
    return t;
}

/* The scales (and mins) of the group at p (or in the table wk). */
static inline void ql_scales(qlfmt f, const uint8_t *p, const uint8_t *const *wk, __m256 *d, __m256 *m) {
    *d = q8_load_f16x8(p, ql_ts(f), 0, wk);
    *m = ql_has_min(f) ? q8_load_f16x8(p, ql_ts(f), 2, wk) : _mm256_setzero_ps();
}

static inline void ql_vec_dot(qlfmt f, int64_t n, const void *w, const void *x, size_t x_stride,
                              int ncols, float *y) {
    const int ts = ql_ts(f);
    const int two = ql_has_min(f);
    const int64_t nb = n / 32;
    const int rem = (int)(nb % 8);
    const int64_t nfull = nb - rem;
    const uint8_t *wp = w;
    const uint8_t *wk[8];
    const act_q8_32 *ak[16];
    /* Rows ending in a partial group: with nb >= 8 the last group is the row's last 8 blocks
     * (q8_rotate), shorter rows read through tables (q8_blk). */
    const int64_t bt = nb >= 8 ? nb - 8 : 0;
    const uint8_t *pt = wp + bt * ts;
    if (rem && nb < 8) q8_partial_w(wp, ts, rem, wk);
    const uint8_t *const *wkt = rem && nb < 8 ? wk : NULL;
    const __m256 keep = q8_lane_mask(rem);
    __m256 d, m;
    if (ncols == 1) {
        /* one column (decode at batch 1): the accumulator stays in a register */
        const act_q8_32 *xa = x;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nfull; b += 8) {
            ql_scales(f, wp + b * ts, NULL, &d, &m);
            acc = q8_apply(ql_terms(f, NULL, wp + b * ts, NULL, d, m, xa + b, NULL), two, acc);
        }
        if (rem) {
            if (wkt) q8_partial_a(xa, rem, ak);
            ql_scales(f, pt, wkt, &d, &m);
            q8_terms t = ql_terms(f, NULL, pt, wkt, d, m, xa + bt, wkt ? ak : NULL);
            if (!wkt) t = q8_rotate(t, two, rem);
            acc = _mm256_blendv_ps(acc, q8_apply(t, two, acc), keep);
        }
        y[0] = strata_hsum8_avx2(acc);
        return;
    }
    for (int c0 = 0; c0 < ncols; c0 += QL_MAX_COLS) {
        const int nc = ncols - c0 < QL_MAX_COLS ? ncols - c0 : QL_MAX_COLS;
        const act_q8_32 *xa[QL_MAX_COLS];
        __m256 acc[QL_MAX_COLS];
        for (int c = 0; c < nc; c++) {
            xa[c] = (const act_q8_32 *)((const char *)x + (size_t)(c0 + c) * x_stride);
            acc[c] = _mm256_setzero_ps();
        }
        ql_weights g;
        for (int64_t b = 0; b < nfull; b += 8) {
            const uint8_t *p = wp + b * ts;
            for (int k = 0; k < 8; k++) ql_block_operands(f, p + k * ts, &g.wu[k], &g.ws[k]);
            ql_scales(f, p, NULL, &d, &m);
            for (int c = 0; c < nc; c++)
                acc[c] = q8_apply(ql_terms(f, &g, NULL, NULL, d, m, xa[c] + b, NULL), two, acc[c]);
        }
        if (rem) {
            for (int k = 0; k < 8; k++) ql_block_operands(f, q8_blk(pt, ts, k, wkt), &g.wu[k], &g.ws[k]);
            ql_scales(f, pt, wkt, &d, &m);
            for (int c = 0; c < nc; c++) {
                if (wkt) q8_partial_a(xa[c], rem, ak);
                q8_terms t = ql_terms(f, &g, NULL, NULL, d, m, xa[c] + bt, wkt ? ak : NULL);
                if (!wkt) t = q8_rotate(t, two, rem);
                acc[c] = _mm256_blendv_ps(acc[c], q8_apply(t, two, acc[c]), keep);
            }
        }
        for (int c = 0; c < nc; c++) y[c0 + c] = strata_hsum8_avx2(acc[c]);
    }
}

void strata_avx2_vec_dot_q4_0(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    ql_vec_dot(QL_Q4_0, n, w, x, xs, nc, y);
}
void strata_avx2_vec_dot_q4_1(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    ql_vec_dot(QL_Q4_1, n, w, x, xs, nc, y);
}
void strata_avx2_vec_dot_q5_0(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    ql_vec_dot(QL_Q5_0, n, w, x, xs, nc, y);
}
void strata_avx2_vec_dot_q5_1(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    ql_vec_dot(QL_Q5_1, n, w, x, xs, nc, y);
}
void strata_avx2_vec_dot_q8_0(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    ql_vec_dot(QL_Q8_0, n, w, x, xs, nc, y);
}
