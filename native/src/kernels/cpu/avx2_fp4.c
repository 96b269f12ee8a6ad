/* avx2_fp4.c — AVX2 dequantization and dot products of IQ4_NL, MXFP4, NVFP4.
 * Layouts and the float operations per block: quant/fmt_fp4.c (done here in the same order,
 * so results match the scalar reference bit for bit).
 *
 * Codes become values with one byte shuffle per 32 codes; the signed values are multiplied
 * as |v| (unsigned, <= 127) times the activations carrying v's sign. Rows are walked in
 * groups of 8 blocks (block b -> lane b % 8), each decoded once and applied to every column.
 */
#include "avx2_fp4.h"
#include "avx2_common.h"
#include "avx2_q8.h"
#include "quant_tables.h"

typedef enum { F4_IQ4_NL, F4_MXFP4, F4_NVFP4 } f4fmt;

enum { F4_MAX_COLS = 16 };

static inline int f4_ts(f4fmt f) { return f == F4_IQ4_NL ? 18 : f == F4_MXFP4 ? 17 : 36; }

static inline const int8_t *f4_table(f4fmt f) {
    return f == F4_IQ4_NL ? strata_kvalues_iq4nl : f == F4_MXFP4 ? strata_kvalues_mxfp4 : strata_kvalues_nvfp4;
}

/* The 64 codes of the NVFP4 block at p in value order, as two 32-code entries: c[0] =
 * sub-blocks 0 | 1 (one per 128-bit half), c[1] = sub-blocks 2 | 3. */
static inline void nv_codes(const uint8_t *p, __m256i c[2]) {
    const __m256i x = _mm256_loadu_si256((const __m256i *)(p + 4));
    const __m256i m = _mm256_set1_epi8(0x0f);
    const __m256i lo = _mm256_and_si256(x, m), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), m);
    /* 128-bit half L of x holds sub-blocks 2L (bytes 0..7) and 2L+1 (bytes 8..15): low
     * nibbles of a sub-block's bytes are its values 0..7, high nibbles values 8..15 */
    const __m256i even = _mm256_unpacklo_epi64(lo, hi), odd = _mm256_unpackhi_epi64(lo, hi);
    c[0] = _mm256_permute2x128_si256(even, odd, 0x20);
    c[1] = _mm256_permute2x128_si256(even, odd, 0x31);
}

/* Lane k: the E8M0 byte of lane k (low 8 bits) as strata_e8m0_half does. */
static inline __m256 e8m0_half8(__m256i v) {
    const __m256i e = _mm256_and_si256(v, _mm256_set1_epi32(0xff));
    const __m256i small = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i big = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i is_small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(big, small, is_small));
}

/* d[j] lane k = strata_ue4m3_half(byte j of lane k of v), for all four bytes at once.
 * Bytes 0x7f are zeroed first (they decode to 0). Then bits = ((x & 0x7f) << 20) + (119 << 23)
 * reads as f = (1 + m/8) * 2^(e-8): the value for e >= 1. For e == 0, f = (8 + m) * 2^-11 is
 * below 2^-7 and the value wanted, m * 2^-10, is exactly 2f - 2^-7. No subnormal is formed, so
 * a caller's denormals-are-zero mode cannot change the result. */
static inline void ue4m3_half8x4(__m256i v, __m256 d[4]) {
    v = _mm256_andnot_si256(_mm256_cmpeq_epi8(v, _mm256_set1_epi8(0x7f)), v);
    __m256i x[4];
    x[0] = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x7f)), 20);
    x[1] = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x7f00)), 12);
    x[2] = _mm256_slli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x7f0000)), 4);
    x[3] = _mm256_srli_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x7f000000)), 4);
    const __m256 lim = _mm256_set1_ps(0x1p-7f);
    for (int j = 0; j < 4; j++) {
        const __m256 f = _mm256_castsi256_ps(_mm256_add_epi32(x[j], _mm256_set1_epi32(119 << 23)));
        const __m256 sub = _mm256_fmsub_ps(f, _mm256_set1_ps(2.0f), lim);
        d[j] = _mm256_blendv_ps(f, sub, _mm256_cmp_ps(f, lim, _CMP_LT_OQ));
    }
}

/* ---------------------------------------------------------------- dequantization */

/* 32 int8 values, the first 16 times d0, the last 16 times d1. */
static inline void store_scaled2(__m256i v, __m256 d0, __m256 d1, float *dst) {
    const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    _mm256_storeu_ps(dst + 0, _mm256_mul_ps(d0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo))));
    _mm256_storeu_ps(dst + 8, _mm256_mul_ps(d0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))));
    _mm256_storeu_ps(dst + 16, _mm256_mul_ps(d1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi))));
    _mm256_storeu_ps(dst + 24, _mm256_mul_ps(d1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))));
}

void strata_avx2_dequant_iq4_nl(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    const __m256i tab = q8_table16(strata_kvalues_iq4nl);
    for (int64_t b = 0; b < n / 32; b++, p += 18, dst += 32)
        q8_store_scaled(_mm256_shuffle_epi8(tab, q8_nibbles(p + 2)), _mm256_set1_ps(_cvtsh_ss(strata_rd_u16(p))), dst);
}

void strata_avx2_dequant_mxfp4(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    const __m256i tab = q8_table16(strata_kvalues_mxfp4);
    for (int64_t b = 0; b < n / 32; b++, p += 17, dst += 32)
        q8_store_scaled(_mm256_shuffle_epi8(tab, q8_nibbles(p + 1)), _mm256_set1_ps(strata_e8m0_half(p[0])), dst);
}

void strata_avx2_dequant_nvfp4(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    const __m256i tab = q8_table16(strata_kvalues_nvfp4);
    for (int64_t b = 0; b < n / 64; b++, p += 36, dst += 64) {
        __m256i c[2];
        nv_codes(p, c);
        for (int h = 0; h < 2; h++)
            store_scaled2(_mm256_shuffle_epi8(tab, c[h]), _mm256_set1_ps(strata_ue4m3_half(p[2 * h])),
                          _mm256_set1_ps(strata_ue4m3_half(p[2 * h + 1])), dst + 32 * h);
    }
}

/* ---------------------------------------------------------------- dot products */

/* Eight blocks' weights as maddubs operands. IQ4_NL/MXFP4 use entries 0..7 (block k);
 * NVFP4 uses 16: entry 2k + h is half h (values 32h .. 32h+31) of block k. */
typedef struct {
    __m256i wu[16]; /* |value| (maddubs unsigned operand) */
    __m256i ws[16]; /* value (sign source) */
} f4_weights;

/* Scales of 8 blocks: IQ4_NL/MXFP4 d[0] (lane k = block k); NVFP4 d[j] = sub-block j. */
typedef struct {
    __m256 d[4];
} f4_scales;

/* Scales of the group (nk = 8) or half group (nk = 4: lanes 4..7 then 0) at p (or in the
 * table wk of a partial group, see q8_blk). */
static inline void f4_load_scales(f4fmt f, int nk, const uint8_t *p, const uint8_t *const *wk, f4_scales *s) {
    const int ts = f4_ts(f);
    if (f == F4_IQ4_NL) {
        s->d[0] = nk == 4 ? q8_load_f16x4(p, ts, 0, wk) : q8_load_f16x8(p, ts, 0, wk);
        return;
    }
    __m256i v = nk == 4 ? q8_load_u32x4(p, ts, wk) : q8_load_u32x8(p, ts, wk);
    /* the unused lanes of a half group get E8M0 0x7f, not 0 (a subnormal: see q8_zero_block) */
    if (f == F4_MXFP4 && nk == 4) v = _mm256_or_si256(v, _mm256_setr_epi32(0, 0, 0, 0, 0x7f, 0x7f, 0x7f, 0x7f));
    if (f == F4_MXFP4) s->d[0] = e8m0_half8(v);
    else ue4m3_half8x4(v, s->d);
}

/* Operands of the block at p: one entry (IQ4_NL, MXFP4) or two (NVFP4). */
static inline void f4_operands(f4fmt f, const uint8_t *p, __m256i tab, __m256i atab, __m256i *wu, __m256i *ws) {
    __m256i c[2];
    if (f == F4_NVFP4) nv_codes(p, c);
    else c[0] = q8_nibbles(p + (f == F4_IQ4_NL ? 2 : 1));
    for (int h = 0; h < (f == F4_NVFP4 ? 2 : 1); h++) {
        wu[h] = _mm256_shuffle_epi8(atab, c[h]);
        ws[h] = _mm256_shuffle_epi8(tab, c[h]);
    }
}

/* The float-part terms (see q8_terms) of nk = 8 blocks (or a half group of 4: lanes 4..7
 * then 0) against the activations from a (the group's first activation block), or from the
 * tables wk, ak of a short row (see q8_blk). Weights come decoded (w != NULL; several
 * columns) or are decoded here from p (one column: nothing stored and reloaded). */
static inline q8_terms f4_terms(f4fmt f, int nk, const f4_weights *w, const uint8_t *p, const uint8_t *const *wk,
                                const f4_scales *s, __m256i tab, __m256i atab, const act_q8_32 *a,
                                const act_q8_32 *const *ak) {
    const int ne = f == F4_NVFP4 ? 2 : 1; /* entries (activation blocks) per weight block */
    __m256i m[2][8];
    for (int k = nk; k < 8; k++) m[0][k] = m[1][k] = _mm256_setzero_si256();
    for (int k = 0; k < nk; k++) {
        __m256i wu[2], ws[2];
        if (w) {
            for (int h = 0; h < ne; h++) wu[h] = w->wu[ne * k + h], ws[h] = w->ws[ne * k + h];
        } else {
            f4_operands(f, q8_blk(p, f4_ts(f), k, wk), tab, atab, wu, ws);
        }
        for (int h = 0; h < ne; h++) {
            const __m256i y = _mm256_loadu_si256((const __m256i *)q8_act_blk(a, ne * k + h, ak)->qs);
            m[h][k] = _mm256_maddubs_epi16(wu[h], _mm256_sign_epi8(y, ws[h]));
        }
    }
    q8_terms t;
    if (f != F4_NVFP4) {
        /* MXFP4 |values| <= 12: 16 products <= 24384 fit int16; IQ4_NL's up to 127 need 32 bits.
         * A half group's missing blocks are zero vectors: their lanes come out 0. */
        __m256i sumi;
        if (f == F4_MXFP4) {
            sumi = q8_reduce8_i16_16(m[0]);
        } else {
            __m256i p[8];
            for (int k = 0; k < nk; k++) p[k] = _mm256_madd_epi16(m[0][k], _mm256_set1_epi16(1));
            sumi = nk == 4 ? q8_reduce4(p) : q8_reduce8(p);
        }
        __m256 dx;
        q8_act_dsn(a, ak, 0, 1, nk, &dx, NULL);
        t.a0 = _mm256_mul_ps(s->d[0], dx);
        t.b0 = _mm256_cvtepi32_ps(sumi);
        t.a1 = t.b1 = _mm256_setzero_ps();
        return t;
    }
    __m256 fi[4];
    for (int h = 0; h < 2; h++) {
        /* |values| <= 12: a sub-block's 16 products fit int16. Low half: sub-block 2h. */
        const __m256i r = q8_hsum16x8_16(m[h]);
        fi[2 * h] = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(r)));
        fi[2 * h + 1] = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(r, 1)));
    }
    t.a0 = _mm256_fmadd_ps(s->d[0], fi[0], _mm256_mul_ps(s->d[1], fi[1]));
    q8_act_dsn(a, ak, 0, 2, nk, &t.b0, NULL);
    t.a1 = _mm256_fmadd_ps(s->d[2], fi[2], _mm256_mul_ps(s->d[3], fi[3]));
    q8_act_dsn(a, ak, 1, 2, nk, &t.b1, NULL);
    return t;
}

/* The last, partial group of a row (rem = nb % 8 blocks) added to the lanes < rem of acc:
 * nk blocks from pt (the row's last nk blocks, see q8_rotate) against activation blocks from
 * xt, or a short row (nb < 8) through the tables wkt, ak. One column. */
static inline __m256 f4_tail1(f4fmt f, int nk, const uint8_t *pt, const uint8_t *const *wkt, __m256i tab,
                              __m256i atab, const act_q8_32 *xt, const act_q8_32 *const *ak, int rem, __m256 acc) {
    const int two = f == F4_NVFP4;
    f4_scales sc;
    f4_load_scales(f, nk, pt, wkt, &sc);
    q8_terms t = f4_terms(f, nk, NULL, pt, wkt, &sc, tab, atab, xt, ak);
    if (!wkt) t = q8_rotate(t, two, rem, nk);
    return _mm256_blendv_ps(acc, q8_apply(t, two, acc), q8_lane_mask(rem));
}

/* The same for nc columns, the weights decoded once. */
static inline void f4_tailn(f4fmt f, int nk, const uint8_t *pt, const uint8_t *const *wkt, __m256i tab,
                            __m256i atab, const act_q8_32 *const *xa, int64_t bt, int nc, int rem, __m256 *acc) {
    const int ts = f4_ts(f), two = f == F4_NVFP4, apb = two ? 2 : 1;
    const __m256 keep = q8_lane_mask(rem);
    const act_q8_32 *ak[16];
    f4_weights g;
    f4_scales sc;
    for (int k = 0; k < nk; k++)
        f4_operands(f, q8_blk(pt, ts, k, wkt), tab, atab, &g.wu[k * apb], &g.ws[k * apb]);
    f4_load_scales(f, nk, pt, wkt, &sc);
    for (int c = 0; c < nc; c++) {
        if (wkt) q8_partial_a(xa[c], rem * apb, ak);
        q8_terms t = f4_terms(f, nk, &g, NULL, NULL, &sc, tab, atab, xa[c] + bt * apb, wkt ? ak : NULL);
        if (!wkt) t = q8_rotate(t, two, rem, nk);
        acc[c] = _mm256_blendv_ps(acc[c], q8_apply(t, two, acc[c]), keep);
    }
}

/* A row shorter than one group (rem = nb < 8 blocks), one column, read through tables. Out
 * of line: the tables would otherwise cost every call of f4_vec_dot_1 a stack frame. */
__attribute__((noinline)) static void f4_short1(f4fmt f, const uint8_t *wp, const act_q8_32 *xa, int rem, float *y) {
    const int apb = f == F4_NVFP4 ? 2 : 1;
    const __m256i tab = q8_table16(f4_table(f));
    const uint8_t *wk[8];
    const act_q8_32 *ak[16];
    q8_partial_w(wp, f4_ts(f), rem, wk);
    q8_partial_a(xa, rem * apb, ak);
    y[0] = strata_hsum8_avx2(f4_tail1(f, 8, wp, wk, tab, _mm256_abs_epi8(tab), xa, ak, rem, _mm256_setzero_ps()));
}

/* One column (decode at batch 1): the accumulator stays in a register. Kept apart from the
 * several-column path, whose arrays need an aligned stack frame that a short row (20 blocks
 * for 640 values) would pay for on every call. */
static inline void f4_vec_dot_1(f4fmt f, int64_t n, const void *w, const void *x, float *y) {
    const int ts = f4_ts(f);
    const int bs = f == F4_NVFP4 ? 64 : 32;
    const int apb = bs / 32; /* activation blocks per weight block */
    const int two = f == F4_NVFP4;
    const int64_t nb = (int64_t)((uint64_t)n / (uint64_t)bs); /* n >= 0: unsigned division is a shift */
    const int rem = (int)(nb & 7);
    const int64_t nfull = nb - rem;
    const uint8_t *wp = w;
    const act_q8_32 *xa = x;
    if (nb < 8) {
        f4_short1(f, wp, xa, rem, y);
        return;
    }
    const __m256i tab = q8_table16(f4_table(f));
    const __m256i atab = _mm256_abs_epi8(tab);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nfull; b += 8) {
        f4_scales sc;
        f4_load_scales(f, 8, wp + b * ts, NULL, &sc);
        acc = q8_apply(f4_terms(f, 8, NULL, wp + b * ts, NULL, &sc, tab, atab, xa + b * apb, NULL), two, acc);
    }
    /* A row ending in a partial group ends with a group of its last 8 blocks, or of its last
     * 4 (a half group) when rem <= 4 (q8_rotate). rem == 4, the 20-block rows of 640 values,
     * gets its own copy with constants: no rotation, a fixed lane mask. */
    if (rem == 4) acc = f4_tail1(f, 4, wp + (nb - 4) * ts, NULL, tab, atab, xa + (nb - 4) * apb, NULL, 4, acc);
    else if (rem && rem < 4) acc = f4_tail1(f, 4, wp + (nb - 4) * ts, NULL, tab, atab, xa + (nb - 4) * apb, NULL, rem, acc);
    else if (rem) acc = f4_tail1(f, 8, wp + (nb - 8) * ts, NULL, tab, atab, xa + (nb - 8) * apb, NULL, rem, acc);
    y[0] = strata_hsum8_avx2(acc);
}

/* Several columns: each group of weights decoded once, applied to up to F4_MAX_COLS columns. */
__attribute__((noinline)) static void f4_vec_dot_n(f4fmt f, int64_t n, const void *w, const void *x,
                                                   size_t x_stride, int ncols, float *y) {
    const int ts = f4_ts(f);
    const int bs = f == F4_NVFP4 ? 64 : 32;
    const int apb = bs / 32;
    const int two = f == F4_NVFP4;
    const int64_t nb = n / bs;
    const int rem = (int)(nb % 8);
    const int64_t nfull = nb - rem;
    const uint8_t *wp = w;
    const __m256i tab = q8_table16(f4_table(f));
    const __m256i atab = _mm256_abs_epi8(tab);
    const uint8_t *wk[8];
    /* the partial group as in f4_vec_dot_1; rows shorter than a group read through tables
     * (q8_blk) */
    const int half = nb >= 8 && rem <= 4;
    const int64_t bt = nb >= 8 ? nb - (half ? 4 : 8) : 0;
    const uint8_t *pt = wp + bt * ts;
    if (rem && nb < 8) q8_partial_w(wp, ts, rem, wk);
    const uint8_t *const *wkt = rem && nb < 8 ? wk : NULL;
    f4_scales sc;
    for (int c0 = 0; c0 < ncols; c0 += F4_MAX_COLS) {
        const int nc = ncols - c0 < F4_MAX_COLS ? ncols - c0 : F4_MAX_COLS;
        const act_q8_32 *xa[F4_MAX_COLS];
        __m256 acc[F4_MAX_COLS];
        for (int c = 0; c < nc; c++) {
            xa[c] = (const act_q8_32 *)((const char *)x + (size_t)(c0 + c) * x_stride);
            acc[c] = _mm256_setzero_ps();
        }
        f4_weights g;
        for (int64_t b = 0; b < nfull; b += 8) {
            const uint8_t *p = wp + b * ts;
            for (int k = 0; k < 8; k++) f4_operands(f, p + k * ts, tab, atab, &g.wu[k * apb], &g.ws[k * apb]);
            f4_load_scales(f, 8, p, NULL, &sc);
            for (int c = 0; c < nc; c++)
                acc[c] = q8_apply(f4_terms(f, 8, &g, NULL, NULL, &sc, tab, atab, xa[c] + b * apb, NULL), two, acc[c]);
        }
        if (rem) {
            if (half) f4_tailn(f, 4, pt, NULL, tab, atab, xa, bt, nc, rem, acc);
            else f4_tailn(f, 8, pt, wkt, tab, atab, xa, bt, nc, rem, acc);
        }
        for (int c = 0; c < nc; c++) y[c0 + c] = strata_hsum8_avx2(acc[c]);
    }
}

static inline void f4_vec_dot(f4fmt f, int64_t n, const void *w, const void *x, size_t x_stride,
                              int ncols, float *y) {
    if (ncols == 1) f4_vec_dot_1(f, n, w, x, y);
    else f4_vec_dot_n(f, n, w, x, x_stride, ncols, y);
}

void strata_avx2_vec_dot_iq4_nl(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    f4_vec_dot(F4_IQ4_NL, n, w, x, xs, nc, y);
}
void strata_avx2_vec_dot_mxfp4(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    f4_vec_dot(F4_MXFP4, n, w, x, xs, nc, y);
}
void strata_avx2_vec_dot_nvfp4(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    f4_vec_dot(F4_NVFP4, n, w, x, xs, nc, y);
}

/* ---------------------------------------------------------------- several rows at once */

/* Rows across the lanes: lane r of every vector belongs to weight row r of a group of 8.
 * For block b of the rows, the exact integer sums of the eight rows come out of one
 * reduction (q8_reduce8, or q8_hsum16x8_16 for NVFP4's 16-value sub-blocks), and the float
 * terms of f4_terms are formed per row in its lane; then
 *     L[b % 8] = fma(a0, b0, L[b % 8])  (NVFP4: and fma(a1, b1, .) after it)
 * is the operation lane b % 8 of that row's accumulator gets in f4_vec_dot_1/_n, in the same
 * order (blocks ascending per lane; a row's partial last group adds its blocks to the lanes
 * they belong to). The row's result is strata_hsum8 of its eight lanes, computed here across
 * the eight vectors L[0..7] in the same order, with 0 in the lanes a short row never touches
 * (the row path keeps 0 there too). So every output is bit for bit the row path's.
 *
 * What this saves: a short row (96-wide IQ4_NL expert down rows: 3 blocks; 320-wide NVFP4
 * rows: 5) pays the row path's partial-group set-up for every row and column; here it is paid
 * per group of 8 rows, each activation block is loaded once for 8 rows, and the weights of a
 * group are decoded once for all columns. */
enum { RW_ROWS = 8, RW_MAX_NB = 16, RW_COLS = 16 }; /* RW_MAX_NB: a multiple of 8 */

static inline __m256 rw_hsum_lanes(const __m256 L[8]) {
    return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(L[0], L[4]), _mm256_add_ps(L[2], L[6])),
                         _mm256_add_ps(_mm256_add_ps(L[1], L[5]), _mm256_add_ps(L[3], L[7])));
}

/* One column against a decoded chunk of nb blocks: wu/ws[(b * apb + h) * 8 + r] = operands of
 * entry h of row r's block b; sc[b] the scales of block b, lane r = row r. L: the column's
 * lane accumulators, carried from chunk to chunk (chunks start at multiples of 8 blocks, so b % 8
 * is the lane of the row path). */
static inline void rw_column(f4fmt f, int nb, const __m256i *wu, const __m256i *ws, const f4_scales *sc,
                             const act_q8_32 *xa, __m256 *L) {
    const int apb = f == F4_NVFP4 ? 2 : 1;
    for (int b = 0; b < nb; b++) {
        __m256i m[2][8];
        for (int h = 0; h < apb; h++) {
            const __m256i y = _mm256_loadu_si256((const __m256i *)xa[b * apb + h].qs);
            const __m256i *u = wu + (b * apb + h) * 8, *v = ws + (b * apb + h) * 8;
            for (int r = 0; r < RW_ROWS; r++) m[h][r] = _mm256_maddubs_epi16(u[r], _mm256_sign_epi8(y, v[r]));
        }
        if (f != F4_NVFP4) {
            /* exact int32 sums (MXFP4's would fit int16 too: the same integers) */
            for (int r = 0; r < RW_ROWS; r++) m[0][r] = _mm256_madd_epi16(m[0][r], _mm256_set1_epi16(1));
            const __m256 a0 = _mm256_mul_ps(sc[b].d[0], _mm256_set1_ps(xa[b].d));
            L[b % 8] = _mm256_fmadd_ps(a0, _mm256_cvtepi32_ps(q8_reduce8(m[0])), L[b % 8]);
            continue;
        }
        __m256 fi[4];
        for (int h = 0; h < 2; h++) {
            const __m256i r = q8_hsum16x8_16(m[h]); /* low 128: sub-block 2h of rows 0..7, high: 2h+1 */
            fi[2 * h] = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(r)));
            fi[2 * h + 1] = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(r, 1)));
        }
        const __m256 a0 = _mm256_fmadd_ps(sc[b].d[0], fi[0], _mm256_mul_ps(sc[b].d[1], fi[1]));
        const __m256 a1 = _mm256_fmadd_ps(sc[b].d[2], fi[2], _mm256_mul_ps(sc[b].d[3], fi[3]));
        L[b % 8] = _mm256_fmadd_ps(a0, _mm256_set1_ps(xa[2 * b].d), L[b % 8]);
        L[b % 8] = _mm256_fmadd_ps(a1, _mm256_set1_ps(xa[2 * b + 1].d), L[b % 8]);
    }
}

static inline void rw_rows(f4fmt f, int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                           size_t x_stride, int ncols, float *y, int64_t ldy) {
    const int ts = f4_ts(f), apb = f == F4_NVFP4 ? 2 : 1;
    const int64_t nb = n / (32 * apb);
    const __m256i tab = q8_table16(f4_table(f));
    const __m256i atab = _mm256_abs_epi8(tab);
    /* a chunk of RW_MAX_NB blocks of 8 rows decoded (16 KiB for NVFP4), and the lane
     * accumulators of RW_COLS columns (4 KiB) */
    _Alignas(32) __m256i wu[RW_MAX_NB * 2 * RW_ROWS], ws[RW_MAX_NB * 2 * RW_ROWS];
    _Alignas(32) __m256 Ls[RW_COLS][8];
    f4_scales sc[RW_MAX_NB];
    for (int c0 = 0; c0 < ncols; c0 += RW_COLS) {
        const int nc = ncols - c0 < RW_COLS ? ncols - c0 : RW_COLS;
        for (int64_t r0 = 0; r0 < nrows; r0 += RW_ROWS) {
            const int nr = nrows - r0 < RW_ROWS ? (int)(nrows - r0) : RW_ROWS;
            const uint8_t *rp[RW_ROWS];
            for (int r = 0; r < RW_ROWS; r++) rp[r] = r < nr ? (const uint8_t *)w + (size_t)(r0 + r) * w_row : NULL;
            for (int c = 0; c < nc; c++)
                for (int j = 0; j < 8; j++) Ls[c][j] = _mm256_setzero_ps();
            for (int64_t k0 = 0; k0 < nb; k0 += RW_MAX_NB) {
                const int kn = nb - k0 < RW_MAX_NB ? (int)(nb - k0) : RW_MAX_NB;
                for (int b = 0; b < kn; b++) {
                    const uint8_t *bk[RW_ROWS]; /* block k0 + b of each row; missing rows read a zero block */
                    for (int r = 0; r < RW_ROWS; r++) bk[r] = rp[r] ? rp[r] + (size_t)ts * (size_t)(k0 + b) : q8_zero_block;
                    for (int r = 0; r < RW_ROWS; r++) {
                        __m256i u[2], v[2];
                        f4_operands(f, bk[r], tab, atab, u, v);
                        for (int h = 0; h < apb; h++) wu[(b * apb + h) * 8 + r] = u[h], ws[(b * apb + h) * 8 + r] = v[h];
                    }
                    f4_load_scales(f, 8, NULL, bk, &sc[b]);
                }
                for (int c = 0; c < nc; c++) {
                    const act_q8_32 *xa = (const act_q8_32 *)((const char *)x + (size_t)(c0 + c) * x_stride);
                    rw_column(f, kn, wu, ws, sc, xa + k0 * apb, Ls[c]);
                }
            }
            for (int c = 0; c < nc; c++) {
                const __m256 v = rw_hsum_lanes(Ls[c]);
                float *yc = y + (int64_t)(c0 + c) * ldy + r0;
                if (nr == RW_ROWS) {
                    _mm256_storeu_ps(yc, v);
                } else {
                    float t[8];
                    _mm256_storeu_ps(t, v);
                    for (int r = 0; r < nr; r++) yc[r] = t[r];
                }
            }
        }
    }
}

void strata_avx2_rows_iq4_nl(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                             size_t x_stride, int ncols, float *y, int64_t ldy) {
    rw_rows(F4_IQ4_NL, n, w, w_row, nrows, x, x_stride, ncols, y, ldy);
}
void strata_avx2_rows_mxfp4(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                            size_t x_stride, int ncols, float *y, int64_t ldy) {
    rw_rows(F4_MXFP4, n, w, w_row, nrows, x, x_stride, ncols, y, ldy);
}
void strata_avx2_rows_nvfp4(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                            size_t x_stride, int ncols, float *y, int64_t ldy) {
    rw_rows(F4_NVFP4, n, w, w_row, nrows, x, x_stride, ncols, y, ldy);
}
