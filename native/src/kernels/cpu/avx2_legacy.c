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

/* The kernels' entry points take every helper inline (flatten; the noinline ones excepted): past
 * its unit-growth limit GCC leaves some out of line, then every group pays calls and its vectors
 * go through memory (adding ql_rows_few cost ql_terms and qr_transpose8 their inlining: one column
 * 1.4x slower). */
#define QL_ENTRY __attribute__((flatten))

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

/* The float-part terms (see q8_terms) of nk = 8 blocks (or a half group of 4: lanes 4..7
 * then 0) against activation blocks a[0..nk-1], or the tables wk, ak of a short row (see
 * q8_blk). The weights come decoded (w != NULL; several columns) or are decoded here from p
 * (one column: nothing is stored and reloaded). d, m: lane k = scale and min of block k. */
static inline q8_terms ql_terms(qlfmt f, int nk, const ql_weights *w, const uint8_t *p, const uint8_t *const *wk,
                                __m256 d, __m256 m, const act_q8_32 *a, const act_q8_32 *const *ak) {
    const int ts = ql_ts(f);
    __m256i pk[8];
    for (int k = nk; k < 8; k++) pk[k] = _mm256_setzero_si256();
    for (int k = 0; k < nk; k++) {
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
     * int16. Q5 (16 products up to 62992) sums in 32 bits; Q8_0's madd is in q8_dot_s8.
     * A half group's missing blocks are zero vectors: their lanes come out 0. */
    if (f != QL_Q8_0 && f != QL_Q4_0 && f != QL_Q4_1)
        for (int k = 0; k < nk; k++) pk[k] = _mm256_madd_epi16(pk[k], _mm256_set1_epi16(1));
    __m256i sumi = f == QL_Q4_0 || f == QL_Q4_1 ? q8_reduce8_i16_16(pk) : nk == 4 ? q8_reduce4(pk) : q8_reduce8(pk);
    __m256 dx;
    __m256i sumy = _mm256_setzero_si256();
    q8_act_dsn(a, ak, 0, 1, nk, &dx, ql_offset(f) || ql_has_min(f) ? &sumy : NULL);
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

/* The scales (and mins) of the group (nk = 8) or half group (nk = 4) at p (or in the table wk). */
static inline void ql_scales(qlfmt f, int nk, const uint8_t *p, const uint8_t *const *wk, __m256 *d, __m256 *m) {
    if (nk == 4) {
        *d = q8_load_f16x4(p, ql_ts(f), 0, wk);
        *m = ql_has_min(f) ? q8_load_f16x4(p, ql_ts(f), 2, wk) : _mm256_setzero_ps();
        return;
    }
    *d = q8_load_f16x8(p, ql_ts(f), 0, wk);
    *m = ql_has_min(f) ? q8_load_f16x8(p, ql_ts(f), 2, wk) : _mm256_setzero_ps();
}

/* The last, partial group of a row (rem = nb % 8 blocks) added to the lanes < rem of acc:
 * nk blocks from pt (the row's last nk blocks, see q8_rotate) against activation blocks from
 * xt, or a short row (nb < 8) through the tables wkt, ak. One column. */
static inline __m256 ql_tail1(qlfmt f, int nk, const uint8_t *pt, const uint8_t *const *wkt,
                              const act_q8_32 *xt, const act_q8_32 *const *ak, int rem, __m256 acc) {
    const int two = ql_has_min(f);
    __m256 d, m;
    ql_scales(f, nk, pt, wkt, &d, &m);
    q8_terms t = ql_terms(f, nk, NULL, pt, wkt, d, m, xt, ak);
    if (!wkt) t = q8_rotate(t, two, rem, nk);
    return _mm256_blendv_ps(acc, q8_apply(t, two, acc), q8_lane_mask(rem));
}

/* The same for nc columns, the weights decoded once. */
static inline void ql_tailn(qlfmt f, int nk, const uint8_t *pt, const uint8_t *const *wkt,
                            const act_q8_32 *const *xa, int64_t bt, int nc, int rem, __m256 *acc) {
    const int ts = ql_ts(f), two = ql_has_min(f);
    const __m256 keep = q8_lane_mask(rem);
    const act_q8_32 *ak[16];
    ql_weights g;
    __m256 d, m;
    for (int k = 0; k < nk; k++) ql_block_operands(f, q8_blk(pt, ts, k, wkt), &g.wu[k], &g.ws[k]);
    ql_scales(f, nk, pt, wkt, &d, &m);
    for (int c = 0; c < nc; c++) {
        if (wkt) q8_partial_a(xa[c], rem, ak);
        q8_terms t = ql_terms(f, nk, &g, NULL, NULL, d, m, xa[c] + bt, wkt ? ak : NULL);
        if (!wkt) t = q8_rotate(t, two, rem, nk);
        acc[c] = _mm256_blendv_ps(acc[c], q8_apply(t, two, acc[c]), keep);
    }
}

/* A row shorter than one group (rem = nb < 8 blocks), one column, read through tables. Out
 * of line: the tables would otherwise cost every call of ql_vec_dot_1 a stack frame. */
__attribute__((noinline)) static void ql_short1(qlfmt f, const uint8_t *wp, const act_q8_32 *xa, int rem, float *y) {
    const uint8_t *wk[8];
    const act_q8_32 *ak[16];
    q8_partial_w(wp, ql_ts(f), rem, wk);
    q8_partial_a(xa, rem, ak);
    y[0] = strata_hsum8_avx2(ql_tail1(f, 8, wp, wk, xa, ak, rem, _mm256_setzero_ps()));
}

/* One column (decode at batch 1): the accumulator stays in a register. Kept apart from the
 * several-column path, whose arrays need an aligned stack frame that a short row (20 blocks
 * for 640 values) would pay for on every call. */
static inline void ql_vec_dot_1(qlfmt f, int64_t n, const void *w, const void *x, float *y) {
    const int ts = ql_ts(f);
    const int two = ql_has_min(f);
    const int64_t nb = (int64_t)((uint64_t)n / 32); /* n >= 0: unsigned division is a shift */
    const int rem = (int)(nb & 7);
    const int64_t nfull = nb - rem;
    const uint8_t *wp = w;
    const act_q8_32 *xa = x;
    if (nb < 8) {
        ql_short1(f, wp, xa, rem, y);
        return;
    }
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nfull; b += 8) {
        __m256 d, m;
        ql_scales(f, 8, wp + b * ts, NULL, &d, &m);
        acc = q8_apply(ql_terms(f, 8, NULL, wp + b * ts, NULL, d, m, xa + b, NULL), two, acc);
    }
    /* A row ending in a partial group ends with a group of its last 8 blocks, or of its last
     * 4 (a half group) when rem <= 4 (q8_rotate). rem == 4, the 20-block rows of 640 values,
     * gets its own copy with constants: no rotation, a fixed lane mask. */
    if (rem == 4) acc = ql_tail1(f, 4, wp + (nb - 4) * ts, NULL, xa + nb - 4, NULL, 4, acc);
    else if (rem && rem < 4) acc = ql_tail1(f, 4, wp + (nb - 4) * ts, NULL, xa + nb - 4, NULL, rem, acc);
    else if (rem) acc = ql_tail1(f, 8, wp + (nb - 8) * ts, NULL, xa + nb - 8, NULL, rem, acc);
    y[0] = strata_hsum8_avx2(acc);
}

/* Several columns: each group of weights decoded once, applied to up to QL_MAX_COLS columns. */
__attribute__((noinline)) static void ql_vec_dot_n(qlfmt f, int64_t n, const void *w, const void *x,
                                                   size_t x_stride, int ncols, float *y) {
    const int ts = ql_ts(f);
    const int two = ql_has_min(f);
    const int64_t nb = n / 32;
    const int rem = (int)(nb % 8);
    const int64_t nfull = nb - rem;
    const uint8_t *wp = w;
    const uint8_t *wk[8];
    /* the partial group as in ql_vec_dot_1; rows shorter than a group read through tables
     * (q8_blk) */
    const int half = nb >= 8 && rem <= 4;
    const int64_t bt = nb >= 8 ? nb - (half ? 4 : 8) : 0;
    const uint8_t *pt = wp + bt * ts;
    if (rem && nb < 8) q8_partial_w(wp, ts, rem, wk);
    const uint8_t *const *wkt = rem && nb < 8 ? wk : NULL;
    __m256 d, m;
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
            ql_scales(f, 8, p, NULL, &d, &m);
            for (int c = 0; c < nc; c++)
                acc[c] = q8_apply(ql_terms(f, 8, &g, NULL, NULL, d, m, xa[c] + b, NULL), two, acc[c]);
        }
        if (rem) {
            if (half) ql_tailn(f, 4, pt, NULL, xa, bt, nc, rem, acc);
            else ql_tailn(f, 8, pt, wkt, xa, bt, nc, rem, acc);
        }
        for (int c = 0; c < nc; c++) y[c0 + c] = strata_hsum8_avx2(acc[c]);
    }
}

/* K = 1..3 columns of rows r = 0..nrows-1 of at least one group (nb >= 8), y[c * ldy + r]: for
 * each column exactly ql_vec_dot_1's steps (so its results bit for bit), group by group, the group's
 * scales loaded once for the K. With K a constant the accumulators stay in registers and the row
 * loop is here: ql_vec_dot_n's arrays and call cost as much as a 256-wide row's products (perf: at
 * 2 columns such rows ran 1.6x slower per column than at 1). */
static inline void ql_rows_few(qlfmt f, const int K, int64_t n, const void *w, size_t w_row, int64_t nrows,
                           const void *x, size_t x_stride, float *y, int64_t ldy) {
    const int ts = ql_ts(f);
    const int two = ql_has_min(f);
    const int64_t nb = n / 32;
    const int rem = (int)(nb & 7);
    const int64_t nfull = nb - rem;
    const int nk = rem && rem <= 4 ? 4 : 8;   /* ql_vec_dot_1's tail group */
    const act_q8_32 *xa[3];
    for (int c = 0; c < K; c++) xa[c] = (const act_q8_32 *)((const char *)x + (size_t)c * x_stride);
    for (int64_t r = 0; r < nrows; r++) {
        const uint8_t *wp = (const uint8_t *)w + (size_t)r * w_row;
        __m256 acc[3];
        for (int c = 0; c < K; c++) acc[c] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nfull; b += 8) {
            __m256 d, m;
            ql_scales(f, 8, wp + b * ts, NULL, &d, &m);
            for (int c = 0; c < K; c++)
                acc[c] = q8_apply(ql_terms(f, 8, NULL, wp + b * ts, NULL, d, m, xa[c] + b, NULL), two, acc[c]);
        }
        if (rem)
            for (int c = 0; c < K; c++)
                acc[c] = ql_tail1(f, nk, wp + (nb - nk) * ts, NULL, xa[c] + nb - nk, NULL, rem, acc[c]);
        for (int c = 0; c < K; c++) y[(int64_t)c * ldy + r] = strata_hsum8_avx2(acc[c]);
    }
}

static inline void ql_vec_dot(qlfmt f, int64_t n, const void *w, const void *x, size_t x_stride,
                              int ncols, float *y) {
    if (ncols == 1) ql_vec_dot_1(f, n, w, x, y);
    else ql_vec_dot_n(f, n, w, x, x_stride, ncols, y);
}

QL_ENTRY void strata_avx2_vec_dot_q4_0(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    ql_vec_dot(QL_Q4_0, n, w, x, xs, nc, y);
}
QL_ENTRY void strata_avx2_vec_dot_q4_1(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    ql_vec_dot(QL_Q4_1, n, w, x, xs, nc, y);
}
QL_ENTRY void strata_avx2_vec_dot_q5_0(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    ql_vec_dot(QL_Q5_0, n, w, x, xs, nc, y);
}
QL_ENTRY void strata_avx2_vec_dot_q5_1(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    ql_vec_dot(QL_Q5_1, n, w, x, xs, nc, y);
}
QL_ENTRY void strata_avx2_vec_dot_q8_0(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    ql_vec_dot(QL_Q8_0, n, w, x, xs, nc, y);
}

/* ---------------------------------------------------------------- several rows at once
 *
 * quant.h's rows kernel for products of QR_MIN_COLS or more columns on rows that are not whole
 * groups or are longer than one (qr_rows sends the rest to qr_lanes, ql_rows_few and ql_vec_dot_n).
 * ql_vec_dot_n pays, per column and group of 8 blocks, a transpose-reduction (14 shuffles and 7
 * adds; Q4 in 16 bits) to bring each block's exact sum into its lane. Here both operands go across
 * the lanes instead: the codes of a group are transposed so that int32 lane j of vector i holds
 * codes 4i..4i+3 of block j, the activations once per call (for every row) and a row's weights once
 * per group (for every column). Eight maddubs (Q8_0: with the sign moved, as in q8_dot_s8) and
 * their sums then leave block j's exact sum in lane j with no reduction at all. The float part is
 * ql_terms' and q8_apply's, in the same order. A row's partial last group is the group of its last
 * 8 blocks rotated to the lanes of its new blocks, as q8_rotate does (a half group of 4 rotates its
 * lanes < rem to the same blocks): the results are vec_dot's bit for bit. */
enum {
    QR_MIN_COLS = 4,       /* below this the weights' transpose costs more than the reductions it saves */
    QR_SCRATCH = 64 << 10  /* the transposed activations of a call (longer rows take fewer columns at once) */
};

/* The 8 x 8 transpose of 32-bit units: lane j of out[i] = lane i of in[j]. */
static inline void qr_transpose8(const __m256i in[8], __m256i out[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
    }
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm256_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
        u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
    for (int i = 0; i < 4; i++) {
        out[i] = _mm256_permute2x128_si256(u[i], u[4 + i], 0x20);
        out[4 + i] = _mm256_permute2x128_si256(u[i], u[4 + i], 0x31);
    }
}

typedef struct {
    __m256i q[8]; /* lane j of q[i] = codes 4i..4i+3 of block j */
    __m256 d;     /* lane j = block j's scale */
    __m256i sum;  /* lane j = block j's code sum (formats with an offset or a min) */
} qr_group;

/* Group g of a row of nb >= 8 blocks starts at block 8g; with a partial last group (nb % 8), group
 * ng is the row's last 8 blocks. (Shorter rows take qr_lanes.) */
static inline int64_t qr_first(int64_t g, int64_t ng, int64_t nb) { return g < ng ? 8 * g : nb - 8; }

/* Columns c0..c0+nc-1, ngt groups each, into xs[c * ngt + g]. */
__attribute__((noinline)) static void qr_acts(const void *x, size_t x_stride, int c0, int nc, int64_t ng, int64_t ngt, int64_t nb,
                    qr_group *xs) {
    for (int c = 0; c < nc; c++) {
        const act_q8_32 *a = (const act_q8_32 *)((const char *)x + (size_t)(c0 + c) * x_stride);
        for (int64_t g = 0; g < ngt; g++) {
            const act_q8_32 *ag = a + qr_first(g, ng, nb);
            __m256i in[8];
            for (int j = 0; j < 8; j++) in[j] = _mm256_loadu_si256((const __m256i *)ag[j].qs);
            qr_group *o = &xs[(int64_t)c * ngt + g];
            qr_transpose8(in, o->q);
            q8_act_ds8(ag, NULL, 0, 1, &o->d, &o->sum);
        }
    }
}

/* Lane j = block j's exact sum of code x activation products, w[] the transposed codes (Q8_0: q
 * itself) of a group, x[] the column's. 16-bit sums where they cannot overflow: Q4 codes <= 15 keep
 * 8 pair sums within 8 * 2 * 15 * 127 = 30480, Q5 codes <= 31 four of them within 31496. */
static inline __m256i qr_sums(qlfmt f, const __m256i w[8], const __m256i wu[8], const __m256i x[8]) {
    const __m256i ones = _mm256_set1_epi16(1);
    if (f == QL_Q8_0) {
        __m256i s = _mm256_setzero_si256();
        for (int i = 0; i < 8; i++) s = _mm256_add_epi32(s, q8_dot_s8(wu[i], w[i], x[i]));
        return s;
    }
    if (f == QL_Q4_0 || f == QL_Q4_1) {
        __m256i h = _mm256_maddubs_epi16(w[0], x[0]);
        for (int i = 1; i < 8; i++) h = _mm256_add_epi16(h, _mm256_maddubs_epi16(w[i], x[i]));
        return _mm256_madd_epi16(h, ones);
    }
    __m256i h0 = _mm256_maddubs_epi16(w[0], x[0]), h1 = _mm256_maddubs_epi16(w[4], x[4]);
    for (int i = 1; i < 4; i++) {
        h0 = _mm256_add_epi16(h0, _mm256_maddubs_epi16(w[i], x[i]));
        h1 = _mm256_add_epi16(h1, _mm256_maddubs_epi16(w[4 + i], x[4 + i]));
    }
    return _mm256_add_epi32(_mm256_madd_epi16(h0, ones), _mm256_madd_epi16(h1, ones));
}

/* Eight rows at a time with row r0 + j in lane j (the row lanes), against up to QL_MAX_COLS columns
 * at a time: rows shorter than a group (nb = 1..7 blocks: flash-small's 32-wide hyper-connection up
 * rows are one block) and rows of whole groups (nb % 8 == 0: qr_rows says at which column counts).
 * Block k's codes of the eight rows are transposed as qr_rows transposes a group's blocks (once for
 * every column), so dword i of a column's activation block, broadcast, meets dword i of every row at
 * once and the sums need no reduction: neither vec_dot's per group, nor a horizontal sum per row and
 * column at the end, nor qr_rows' transposed activations. Each row's float part is vec_dot's: block
 * k's term fma(d_k dx_k, sumi_k, acc) (then the min's) into accumulator k % 8 (vec_dot's lane k % 8),
 * 0 past a short row, the eight added in strata_hsum8's order, so the results are vec_dot's bit for
 * bit. */
__attribute__((noinline)) static void qr_lanes(qlfmt f, int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                     size_t x_stride, int ncols, float *y, int64_t ldy) {
    const int nb = (int)(n / 32), ts = ql_ts(f), two = ql_has_min(f), off = ql_offset(f);
    const int rs = (int)w_row;
    int64_t r0 = 0;
    for (; r0 + 8 <= nrows; r0 += 8) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r0 * w_row;
        for (int c0 = 0; c0 < ncols; c0 += QL_MAX_COLS) {
            const int nc = ncols - c0 < QL_MAX_COLS ? ncols - c0 : QL_MAX_COLS;
            __m256 p[QL_MAX_COLS][8];
            for (int c = 0; c < nc; c++)
                for (int k = 0; k < 8; k++) p[c][k] = _mm256_setzero_ps();
            for (int k = 0; k < nb; k++) {
                const uint8_t *pk = wr + (size_t)k * ts; /* block k of row r0; row j's at pk + j * w_row */
                __m256i in[8], wt[8], wu[8];
                for (int j = 0; j < 8; j++) in[j] = ql_codes(f, pk + (size_t)j * w_row);
                qr_transpose8(in, wt);
                if (f == QL_Q8_0)
                    for (int i = 0; i < 8; i++) wu[i] = _mm256_abs_epi8(wt[i]); /* -128 -> 0x80, i.e. 128 unsigned */
                const __m256 d = q8_load_f16x8(pk, rs, 0, NULL);
                const __m256 m = two ? q8_load_f16x8(pk, rs, 2, NULL) : _mm256_setzero_ps();
                for (int c = 0; c < nc; c++) {
                    const act_q8_32 *a = (const act_q8_32 *)((const char *)x + (size_t)(c0 + c) * x_stride) + k;
                    __m256i xv[8];
                    for (int i = 0; i < 8; i++) xv[i] = _mm256_set1_epi32((int)strata_rd_u32(a->qs + 4 * i));
                    __m256i sumi = qr_sums(f, wt, wu, xv);
                    if (off) sumi = _mm256_sub_epi32(sumi, _mm256_set1_epi32(a->sum * off));
                    const __m256 dx = _mm256_set1_ps(a->d);
                    q8_terms t;
                    t.a0 = _mm256_mul_ps(d, dx);
                    t.b0 = _mm256_cvtepi32_ps(sumi);
                    if (two) {
                        t.a1 = _mm256_mul_ps(m, dx);
                        t.b1 = _mm256_set1_ps((float)a->sum);
                    } else {
                        t.a1 = t.b1 = _mm256_setzero_ps();
                    }
                    p[c][k & 7] = q8_apply(t, two, p[c][k & 7]);
                }
            }
            for (int c = 0; c < nc; c++) {
                const __m256 *q = p[c];
                _mm256_storeu_ps(y + (int64_t)(c0 + c) * ldy + r0,
                                 _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(q[0], q[4]), _mm256_add_ps(q[2], q[6])),
                                               _mm256_add_ps(_mm256_add_ps(q[1], q[5]), _mm256_add_ps(q[3], q[7]))));
            }
        }
    }
    float t[QL_MAX_COLS];
    for (; r0 < nrows; r0++)
        for (int c0 = 0; c0 < ncols; c0 += QL_MAX_COLS) {
            const int nc = ncols - c0 < QL_MAX_COLS ? ncols - c0 : QL_MAX_COLS;
            ql_vec_dot(f, n, (const char *)w + (size_t)r0 * w_row, (const char *)x + (size_t)c0 * x_stride, x_stride,
                       nc, t);
            for (int c = 0; c < nc; c++) y[(int64_t)(c0 + c) * ldy + r0] = t[c];
        }
}

static inline void qr_rows(qlfmt f, int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                           size_t x_stride, int ncols, float *y, int64_t ldy) {
    const int64_t nb = n / 32, ng = nb / 8;
    const int rem = (int)(nb % 8);
    const int64_t ngt = ng + (rem != 0);
    /* Rows shorter than a group at any column count (quant.h's SHORT1 case among them), and rows of
     * whole groups at 2..3 columns or, one group long (flash-small's 256 values), at 2 and more, take
     * the row lanes. Against what those took before (1 thread, Zen 3, in-process A/B, median of 30
     * pairs): Q8_0 8192 x 256 at 3 / 8 columns 0.82 / 0.88x, 1024 x 256 at 4 / 8 / 16 0.89 / 0.88 /
     * 0.79x, 1024 x 1024 at 2 / 3 0.87 / 0.81x; Q4_0, Q4_1, Q5_0 8192 x 256 at 3 columns 0.58-0.70x,
     * at 8 0.95x. Longer rows at 4 and more columns stay in the groups below (in the lanes 1024 x 1024
     * at 4..16 columns: Q8_0 0.94-1.10x, Q4_0 1.09-1.12x), and one column in vec_dot's registers
     * (8192 x 256: 1.22x in the lanes). */
    if (ng == 0 || (rem == 0 && ncols >= 2 && (ng == 1 || ncols < QR_MIN_COLS))) {
        if (nb) qr_lanes(f, n, w, w_row, nrows, x, x_stride, ncols, y, ldy);
        return;
    }
    /* Rows of one group and a part (9..15 blocks) at a constant K (see ql_rows_few): at 2 and 3
     * columns 1.4-2.3x faster than ql_vec_dot_n, whose call and arrays cost as much as such a row's
     * products; one group (8 blocks) at one column likewise. Longer rows keep ql_vec_dot_n, which
     * decodes a group once for all columns where ql_rows_few does it per column (no faster there,
     * slower on Q5). */
    if (ncols < QR_MIN_COLS && ng == 1) {
        if (ncols == 1) ql_rows_few(f, 1, n, w, w_row, nrows, x, x_stride, y, ldy);
        else if (ncols == 2) ql_rows_few(f, 2, n, w, w_row, nrows, x, x_stride, y, ldy);
        else ql_rows_few(f, 3, n, w, w_row, nrows, x, x_stride, y, ldy);
        return;
    }
    int cpc = ngt ? (int)(QR_SCRATCH / (ngt * (int64_t)sizeof(qr_group))) : 0;
    if (cpc > QL_MAX_COLS) cpc = QL_MAX_COLS;
    if (ncols < QR_MIN_COLS || cpc < QR_MIN_COLS) {
        float t[QL_MAX_COLS];
        for (int c0 = 0; c0 < ncols; c0 += QL_MAX_COLS) {
            const int nc = ncols - c0 < QL_MAX_COLS ? ncols - c0 : QL_MAX_COLS;
            for (int64_t r = 0; r < nrows; r++) {
                ql_vec_dot(f, n, (const char *)w + (size_t)r * w_row, (const char *)x + (size_t)c0 * x_stride, x_stride,
                           nc, t);
                for (int c = 0; c < nc; c++) y[(int64_t)(c0 + c) * ldy + r] = t[c];
            }
        }
        return;
    }
    const int ts = ql_ts(f), two = ql_has_min(f), off = ql_offset(f);
    /* the partial group adds to lanes < rem only, once q8_rotate has moved its new blocks there */
    const __m256 keep = q8_lane_mask(rem);
    _Alignas(32) qr_group xs[QR_SCRATCH / sizeof(qr_group)];
    for (int c0 = 0; c0 < ncols; c0 += cpc) {
        const int nc = ncols - c0 < cpc ? ncols - c0 : cpc;
        qr_acts(x, x_stride, c0, nc, ng, ngt, nb, xs);
        for (int64_t r = 0; r < nrows; r++) {
            const uint8_t *wp = (const uint8_t *)w + (size_t)r * w_row;
            __m256 acc[QL_MAX_COLS];
            for (int c = 0; c < nc; c++) acc[c] = _mm256_setzero_ps();
            for (int64_t g = 0; g < ngt; g++) {
                const uint8_t *p = wp + qr_first(g, ng, nb) * ts;
                __m256i in[8], wt[8], wu[8];
                for (int j = 0; j < 8; j++) in[j] = ql_codes(f, p + j * ts);
                qr_transpose8(in, wt);
                if (f == QL_Q8_0)
                    for (int i = 0; i < 8; i++) wu[i] = _mm256_abs_epi8(wt[i]); /* -128 -> 0x80, i.e. 128 unsigned */
                __m256 d, m;
                ql_scales(f, 8, p, NULL, &d, &m);
                for (int c = 0; c < nc; c++) {
                    const qr_group *xg = &xs[(int64_t)c * ngt + g];
                    __m256i sumi = qr_sums(f, wt, wu, xg->q);
                    /* ql_terms' float terms, then q8_rotate for the partial group, and q8_apply */
                    if (off) sumi = _mm256_sub_epi32(sumi, _mm256_mullo_epi32(xg->sum, _mm256_set1_epi32(off)));
                    q8_terms t;
                    t.a0 = _mm256_mul_ps(d, xg->d);
                    t.b0 = _mm256_cvtepi32_ps(sumi);
                    if (two) {
                        t.a1 = _mm256_mul_ps(m, xg->d);
                        t.b1 = _mm256_cvtepi32_ps(xg->sum);
                    } else {
                        t.a1 = t.b1 = _mm256_setzero_ps();
                    }
                    if (g < ng) {
                        acc[c] = q8_apply(t, two, acc[c]);
                        continue;
                    }
                    t = q8_rotate(t, two, rem, 8);
                    acc[c] = _mm256_blendv_ps(acc[c], q8_apply(t, two, acc[c]), keep);
                }
            }
            for (int c = 0; c < nc; c++) y[(int64_t)(c0 + c) * ldy + r] = strata_hsum8_avx2(acc[c]);
        }
    }
}

QL_ENTRY void strata_avx2_rows_q4_0(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                           int ncols, float *y, int64_t ldy) {
    qr_rows(QL_Q4_0, n, w, w_row, nrows, x, x_stride, ncols, y, ldy);
}
QL_ENTRY void strata_avx2_rows_q4_1(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                           int ncols, float *y, int64_t ldy) {
    qr_rows(QL_Q4_1, n, w, w_row, nrows, x, x_stride, ncols, y, ldy);
}
QL_ENTRY void strata_avx2_rows_q5_0(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                           int ncols, float *y, int64_t ldy) {
    qr_rows(QL_Q5_0, n, w, w_row, nrows, x, x_stride, ncols, y, ldy);
}
QL_ENTRY void strata_avx2_rows_q5_1(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                           int ncols, float *y, int64_t ldy) {
    qr_rows(QL_Q5_1, n, w, w_row, nrows, x, x_stride, ncols, y, ldy);
}
QL_ENTRY void strata_avx2_rows_q8_0(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                           int ncols, float *y, int64_t ldy) {
    qr_rows(QL_Q8_0, n, w, w_row, nrows, x, x_stride, ncols, y, ldy);
}
