/* avx2_kquants.c — AVX2 dequantization and dot products of Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS.
 * Block layouts and the dot-product summation order: avx2_kquants.h. The scalar reference is
 * quant/fmt_kquants.c; both form the same exact integer lane sums and apply the same float
 * operations to them, so they agree bit for bit.
 *
 * Decode once, use for every column: a super-block is unpacked into eight 32-byte code
 * vectors (value 32j+k in byte k of vector j) plus int16 multiplier vectors, then each of up
 * to KQ_COLS activation rows takes, per vector, maddubs(codes, x) -> madd(., scales) -> add.
 * The eight int32 lanes of that sum are the eight lanes of the float accumulator: no
 * horizontal reduction until the end of the row. One column has its own loops (kq_one_*): there
 * nothing is shared, so each vector is made when it is used instead of stored (but Q4_K, whose
 * decoded block fits the registers).
 *
 * Why the integer sums cannot overflow or saturate, for any block bytes: _mm256_maddubs_epi16
 * multiplies unsigned codes by activations in [-127, 127] and adds pairs, so it saturates
 * only if a code exceeds 128. Codes fed to it are Q2_K 0..3, Q3_K 0..7 (offset -4 applied
 * through the bsums), Q4_K 0..15, Q5_K 0..31, Q6_K 0..63 (offset -32 through the bsums) and
 * |kvalue| <= 128 for IQ4_XS (sign moved onto x). Every int32 lane stays below 2^26.
 */
#include "avx2_kquants.h"
#include "avx2_common.h"

#include "quant_tables.h"

enum { KQ_COLS = 16 }; /* activation rows per weight-block decode */

/* One decoded super-block. */
typedef struct {
    __m256i q[8];   /* codes of values 32j..32j+31 (unsigned; |k| for IQ4_XS) */
    __m256i sc[8];  /* int16 multiplier of every maddubs pair of q[j] (per 16 values) */
    __m256i sgn[8]; /* IQ4_XS: the signed values, whose signs go onto x */
    __m256i aux;    /* int16 per-16 multipliers of the bsums: mins, or offset scales */
    float d, dmin;
} kq_dec;

static inline float kq_f16(const uint8_t h[2]) { return _cvtsh_ss(strata_rd_u16(h)); }

/* ---------------------------------------------------------------- scale broadcasting */

/* v8: eight int16 scales, one per 32 values -> out[j] = scale j in all 16 lanes. */
static inline void kq_bcast8(__m128i v8, __m256i out[8]) {
    const __m256i v = _mm256_broadcastsi128_si256(v8);
    for (int j = 0; j < 8; j++)
        out[j] = _mm256_shuffle_epi8(v, _mm256_set1_epi16((short)(0x0100 + 0x0202 * j)));
}

/* The shuffle that puts int16 scale 2k in every int16 of the low 128-bit lane and 2k + 1 in the high one
 * (k = j % 4). */
static inline __attribute__((always_inline)) __m256i kq_pat16(int j) {
    const int k = j & 3;
    return _mm256_set_m128i(_mm_set1_epi16((short)(0x0100 + 0x0202 * (2 * k + 1))),
                            _mm_set1_epi16((short)(0x0100 + 0x0202 * (2 * k))));
}

/* v16: sixteen int16 scales, one per 16 values -> out[j] = scale 2j in the low 128-bit lane
 * (bytes 0-15 of q[j]) and scale 2j+1 in the high lane. */
static inline void kq_bcast16(__m256i v16, __m256i out[8]) {
    const __m256i lo = _mm256_permute2x128_si256(v16, v16, 0x00);
    const __m256i hi = _mm256_permute2x128_si256(v16, v16, 0x11);
    for (int j = 0; j < 4; j++) {
        out[j] = _mm256_shuffle_epi8(lo, kq_pat16(j));
        out[j + 4] = _mm256_shuffle_epi8(hi, kq_pat16(j));
    }
}

/* As kq_bcast16 from sixteen unsigned byte scales: pshufb zero-extends them to int16 itself. */
static inline void kq_bcast16_u8(__m128i v16, __m256i out[8]) {
    const __m256i v = _mm256_broadcastsi128_si256(v16);
    for (int j = 0; j < 8; j++)
        out[j] = _mm256_shuffle_epi8(v, _mm256_set_m128i(_mm_set1_epi16((short)(0x8000 | (2 * j + 1))),
                                                         _mm_set1_epi16((short)(0x8000 | (2 * j)))));
}

/* ---------------------------------------------------------------- decoders */

/* Q4_K/Q5_K scales -> bytes 0-7: sc 0-7, bytes 8-15: m 0-7. Packing (6-bit values):
 * bytes 0-3 sc 0-3 (top 2 bits: sc 4-7's high bits), 4-7 m 0-3 (likewise for m 4-7),
 * 8-11 low nibble sc 4-7, high nibble m 4-7. Done on general registers, which the vector
 * code leaves idle. */
static inline __m128i kq_k4_scales(const uint8_t s[12]) {
    const uint32_t w0 = strata_rd_u32(s), w1 = strata_rd_u32(s + 4), w2 = strata_rd_u32(s + 8);
    const uint32_t sc_lo = w0 & 0x3f3f3f3fu, m_lo = w1 & 0x3f3f3f3fu;
    const uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u);
    const uint32_t m_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u);
    return _mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)m_lo, (int)m_hi);
}

/* m0 m0 m1 m1 ... m7 m7 as int16 from kq_k4_scales in both lanes (bsums come per 16 values, mins per 32) */
static inline __m256i kq_k4_mins(__m256i t) {
    return _mm256_shuffle_epi8(t, _mm256_setr_epi8(8, -1, 8, -1, 9, -1, 9, -1, 10, -1, 10, -1, 11, -1, 11, -1, 12, -1,
                                                   12, -1, 13, -1, 13, -1, 14, -1, 14, -1, 15, -1, 15, -1));
}

/* Scales and mins of Q4_K/Q5_K into D (sc per 32 values, mins as per-16 bsum multipliers). */
static inline void kq_dec_k4_scales(const uint8_t s[12], kq_dec *D) {
    const __m256i t = _mm256_broadcastsi128_si256(kq_k4_scales(s));
    for (int j = 0; j < 8; j++) D->sc[j] = _mm256_shuffle_epi8(t, _mm256_set1_epi16((short)(0x8000 | j)));
    D->aux = kq_k4_mins(t);
}

/* Bit j of each byte of h moved to bit `to` (Q3_K's hmask, Q5_K's qh: bit j of byte k belongs to register
 * j). 16-bit shifts of at most 7 never move a neighbouring byte's bit there. */
static inline __attribute__((always_inline)) __m256i kq_hbit(__m256i h, int j, int to) {
    const int sh = to - j;
    return sh > 0 ? _mm256_slli_epi16(h, sh) : sh < 0 ? _mm256_srli_epi16(h, -sh) : h;
}

static inline void kq_dec_q4_nibbles(const uint8_t qs[128], kq_dec *D) {
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int c = 0; c < 4; c++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        D->q[2 * c] = _mm256_and_si256(v, m4);
        D->q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    }
}

static inline void kq_dec_q4_k(const kq_block_q4_k *b, kq_dec *D) {
    kq_dec_k4_scales(b->scales, D);
    kq_dec_q4_nibbles(b->qs, D);
    D->d = kq_f16(b->d);
    D->dmin = kq_f16(b->dmin);
}

static inline void kq_dec_q5_k(const kq_block_q5_k *b, kq_dec *D) {
    kq_dec_k4_scales(b->scales, D);
    kq_dec_q4_nibbles(b->qs, D);
    /* bit j of qh[k] -> bit 4 of byte k of q[j] */
    const __m256i h = _mm256_loadu_si256((const __m256i *)b->qh), b4 = _mm256_set1_epi8(0x10);
    for (int j = 0; j < 8; j++) D->q[j] = _mm256_or_si256(D->q[j], _mm256_and_si256(kq_hbit(h, j, 4), b4));
    D->d = kq_f16(b->d);
    D->dmin = kq_f16(b->dmin);
}

/* 2-bit fields of 64 bytes: value 128c+32s+k = bits 2s.. of byte 32c+k. */
static inline void kq_dec_2bit(const uint8_t qs[64], kq_dec *D) {
    const __m256i m2 = _mm256_set1_epi8(3);
    for (int c = 0; c < 2; c++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
        D->q[4 * c + 0] = _mm256_and_si256(v, m2);
        D->q[4 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 2), m2);
        D->q[4 * c + 2] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m2);
        D->q[4 * c + 3] = _mm256_and_si256(_mm256_srli_epi16(v, 6), m2);
    }
}

static inline void kq_dec_q2_k(const kq_block_q2_k *b, kq_dec *D) {
    const __m128i s = _mm_loadu_si128((const __m128i *)b->scales), m4 = _mm_set1_epi8(0x0F);
    kq_bcast16_u8(_mm_and_si128(s, m4), D->sc);
    D->aux = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), m4));
    kq_dec_2bit(b->qs, D);
    D->d = kq_f16(b->d);
    D->dmin = kq_f16(b->dmin);
}

/* Q3_K scales as 16 int8 (6-bit raw - 32). */
static inline __m128i kq_q3_scales(const uint8_t s[12]) {
    const uint32_t a0 = strata_rd_u32(s), a1 = strata_rd_u32(s + 4), a2 = strata_rd_u32(s + 8);
    const uint32_t l = 0x0f0f0f0fu, h = 0x03030303u;
    const __m128i v = _mm_setr_epi32((int)((a0 & l) | ((a2 & h) << 4)),
                                     (int)((a1 & l) | (((a2 >> 2) & h) << 4)),
                                     (int)(((a0 >> 4) & l) | (((a2 >> 4) & h) << 4)),
                                     (int)(((a1 >> 4) & l) | (((a2 >> 6) & h) << 4)));
    return _mm_sub_epi8(v, _mm_set1_epi8(32));
}

static inline void kq_dec_q3_k(const kq_block_q3_k *b, kq_dec *D) {
    const __m256i s16 = _mm256_cvtepi8_epi16(kq_q3_scales(b->scales));
    kq_bcast16(s16, D->sc);
    D->aux = s16;
    kq_dec_2bit(b->qs, D);
    /* code = low 2 bits + 4 * (bit j of hmask[k]) in 0..7; the -4 goes through the bsums */
    const __m256i h = _mm256_loadu_si256((const __m256i *)b->hmask), b2 = _mm256_set1_epi8(4);
    for (int j = 0; j < 8; j++) D->q[j] = _mm256_or_si256(D->q[j], _mm256_and_si256(kq_hbit(h, j, 2), b2));
    D->d = kq_f16(b->d);
}

static inline void kq_dec_q6_k(const kq_block_q6_k *b, kq_dec *D) {
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
    kq_bcast16(s16, D->sc);
    D->aux = s16;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m6 = _mm256_set1_epi8(0x30);
    for (int c = 0; c < 2; c++) {
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * c));
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * c + 32));
        const __m256i h = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * c));
        /* code 0..63 = nibble | (2 high bits << 4); the -32 goes through the bsums */
        D->q[4 * c + 0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m6));
        D->q[4 * c + 1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(_mm256_slli_epi16(h, 2), m6));
        D->q[4 * c + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_and_si256(h, m6));
        D->q[4 * c + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                          _mm256_and_si256(_mm256_srli_epi16(h, 2), m6));
    }
    D->d = kq_f16(b->d);
}

/* IQ4_XS scales as 8 int8: (4 low bits from scales_l | 2 high bits from scales_h) - 32. The
 * bit fields are spread to one per byte on general registers. */
static inline __m128i kq_iq4xs_scales(const kq_block_iq4_xs *b) {
    uint64_t l = strata_rd_u32(b->scales_l), h = strata_rd_u16(b->scales_h);
    /* nibble j -> byte j */
    l = (l & 0xFFFFu) | ((l & 0xFFFF0000u) << 16);
    l = (l & 0x000000FF000000FFull) | ((l & 0x0000FF000000FF00ull) << 8);
    l = (l & 0x000F000F000F000Full) | ((l & 0x00F000F000F000F0ull) << 4);
    /* 2-bit field j -> byte j */
    h = (h & 0xFFu) | ((h & 0xFF00u) << 24);
    h = (h & 0x0000000F0000000Full) | ((h & 0x000000F0000000F0ull) << 12);
    h = (h & 0x0003000300030003ull) | ((h & 0x000C000C000C000Cull) << 6);
    return _mm_sub_epi8(_mm_cvtsi64_si128((long long)(l | (h << 4))), _mm_set1_epi8(32));
}

/* IQ4_XS's signed values of registers 2c and 2c + 1 from qs bytes 32c.. (bytes 0-15: sub-block 2c, 16-31:
 * 2c + 1; low nibbles are values 0-15, high 16-31); kv: the kvalues in both lanes. */
static inline __attribute__((always_inline)) void kq_iq4_pair(const kq_block_iq4_xs *b, int c, __m256i kv, __m256i m4,
                                                              __m256i *s0, __m256i *s1) {
    const __m256i v = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * c));
    const __m256i lo = _mm256_shuffle_epi8(kv, _mm256_and_si256(v, m4));
    const __m256i hi = _mm256_shuffle_epi8(kv, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
    *s0 = _mm256_permute2x128_si256(lo, hi, 0x20);
    *s1 = _mm256_permute2x128_si256(lo, hi, 0x31);
}

static inline void kq_dec_iq4_xs(const kq_block_iq4_xs *b, kq_dec *D) {
    kq_bcast8(_mm_cvtepi8_epi16(kq_iq4xs_scales(b)), D->sc);
    const __m256i kv = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)strata_kvalues_iq4nl));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int c = 0; c < 4; c++) {
        kq_iq4_pair(b, c, kv, m4, &D->sgn[2 * c], &D->sgn[2 * c + 1]);
        D->q[2 * c] = _mm256_abs_epi8(D->sgn[2 * c]);
        D->q[2 * c + 1] = _mm256_abs_epi8(D->sgn[2 * c + 1]);
    }
    D->d = kq_f16(b->d);
}

/* ---------------------------------------------------------------- per-column integer sums */

/* sum_j madd(maddubs(q[j], x[32j..]), sc[j]): 8 int32 lanes. */
static inline __m256i kq_dot8(const kq_dec *D, const int8_t *xq) {
    __m256i acc = _mm256_madd_epi16(_mm256_maddubs_epi16(D->q[0], _mm256_loadu_si256((const __m256i *)xq)), D->sc[0]);
    for (int j = 1; j < 8; j++) {
        const __m256i p = _mm256_maddubs_epi16(D->q[j], _mm256_loadu_si256((const __m256i *)(xq + 32 * j)));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, D->sc[j]));
    }
    return acc;
}

static inline __m256i kq_bsums_x(const kq_dec *D, const act_q8_256 *x) {
    return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)x->bsums), D->aux);
}

/* The lane sums S_0..S_7 of a block (see avx2_kquants.h), per format. */
static inline __m256i kq_s_plain(const kq_dec *D, const act_q8_256 *x) { return kq_dot8(D, x->qs); }
/* Q3_K / Q6_K: codes carry +4 / +32, so S_l = dot_l - 4 (32) * (s_2l bsum_2l + s_2l+1 bsum_2l+1). */
static inline __m256i kq_s_q3(const kq_dec *D, const act_q8_256 *x) {
    return _mm256_sub_epi32(kq_dot8(D, x->qs), _mm256_slli_epi32(kq_bsums_x(D, x), 2));
}
static inline __m256i kq_s_q6(const kq_dec *D, const act_q8_256 *x) {
    return _mm256_sub_epi32(kq_dot8(D, x->qs), _mm256_slli_epi32(kq_bsums_x(D, x), 5));
}
/* IQ4_XS: |k| times x carrying the sign of k. */
static inline __m256i kq_s_iq4(const kq_dec *D, const act_q8_256 *x) {
    __m256i acc = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        const __m256i xs = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(x->qs + 32 * j)), D->sgn[j]);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(D->q[j], xs), D->sc[j]));
    }
    return acc;
}

/* ---------------------------------------------------------------- vec_dot */

/* One tile of nc <= KQ_COLS activation rows. Per block and column, lane l of the integer
 * sums S (M) goes into lane l of acc (accm) as kq_lane_step does it: fma(xd*d, S, acc). */
#define KQ_VEC_DOT(NAME, BLOCK, DECODE, SVEC, HAS_MIN, ONE)                                        \
    static inline __attribute__((always_inline)) void kq_tile_##NAME(                             \
        const BLOCK *w, int64_t nb, const char *xc, size_t x_stride, int nc, float *y) {           \
        __m256 acc[KQ_COLS], accm[KQ_COLS];                                                        \
        for (int c = 0; c < nc; c++) acc[c] = accm[c] = _mm256_setzero_ps();                       \
        for (int64_t b = 0; b < nb; b++) {                                                         \
            kq_dec D;                                                                              \
            DECODE(&w[b], &D);                                                                     \
            const __m256 d8 = _mm256_set1_ps(D.d), dm8 = _mm256_set1_ps(HAS_MIN ? D.dmin : 0.0f);  \
            for (int c = 0; c < nc; c++) {                                                         \
                const act_q8_256 *x = (const act_q8_256 *)(xc + (size_t)c * x_stride) + b;         \
                const __m256 xd = _mm256_broadcast_ss(&x->d);                                      \
                acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(xd, d8), _mm256_cvtepi32_ps(SVEC(&D, x)), acc[c]); \
                if (HAS_MIN)                                                                       \
                    accm[c] = _mm256_fmadd_ps(_mm256_mul_ps(xd, dm8),                              \
                                              _mm256_cvtepi32_ps(kq_bsums_x(&D, x)), accm[c]);     \
            }                                                                                      \
        }                                                                                          \
        for (int c = 0; c < nc; c++)                                                               \
            y[c] = strata_hsum8_avx2(HAS_MIN ? _mm256_sub_ps(acc[c], accm[c]) : acc[c]);           \
    }                                                                                              \
    void strata_avx2_vec_dot_##NAME(int64_t n, const void *vw, const void *vx, size_t x_stride,    \
                                    int ncols, float *y) {                                         \
        const int64_t nb = n / QK_K;                                                               \
        for (int c0 = 0; c0 < ncols; c0 += KQ_COLS) {                                              \
            const int nc = ncols - c0 < KQ_COLS ? ncols - c0 : KQ_COLS;                            \
            const char *xc = (const char *)vx + (size_t)c0 * x_stride;                             \
            /* one column (decode): its own loop, or the tile's with a constant nc */               \
            if (nc == 1) ONE(vw, nb, xc, x_stride, 1, y + c0);                                     \
            else kq_tile_##NAME(vw, nb, xc, x_stride, nc, y + c0);                                 \
        }                                                                                          \
    }

/* IQ4_XS, one column: each pair of registers decoded and used at once. The tile kept the decoded block's
 * 24 registers (codes, signed values, scales) on the stack. Same integer sums (exact, any order) and
 * float expression as kq_tile_iq4_xs: the same result bit for bit. */
static void kq_one_iq4_xs(const kq_block_iq4_xs *w, int64_t nb, const char *xc, size_t x_stride, int nc, float *y) {
    (void)x_stride;
    (void)nc;
    const act_q8_256 *xa = (const act_q8_256 *)xc;
    const __m256i kv = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)strata_kvalues_iq4nl));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const kq_block_iq4_xs *blk = &w[b];
        const act_q8_256 *x = &xa[b];
        const __m256i v8 = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(kq_iq4xs_scales(blk)));
        __m256i sum = _mm256_setzero_si256();
        for (int c = 0; c < 4; c++) {
            __m256i pair[2];
            kq_iq4_pair(blk, c, kv, m4, &pair[0], &pair[1]);
            for (int h = 0; h < 2; h++) {
                const int j = 2 * c + h;
                const __m256i sgn = pair[h];
                const __m256i sc = _mm256_shuffle_epi8(v8, _mm256_set1_epi16((short)(0x0100 + 0x0202 * j)));
                const __m256i xs = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(x->qs + 32 * j)), sgn);
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(sgn), xs), sc));
            }
        }
        const __m256 xd = _mm256_broadcast_ss(&x->d), d8 = _mm256_set1_ps(kq_f16(blk->d));
        acc = _mm256_fmadd_ps(_mm256_mul_ps(xd, d8), _mm256_cvtepi32_ps(sum), acc);
    }
    *y = strata_hsum8_avx2(acc);
}

/* The other formats, one column, as kq_one_iq4_xs: a super-block's bytes loaded once (kq_raw), register j
 * made when it is used (its codes from those bytes, its int16 scales from one shuffle), so the decoded
 * block is never stored. The integer sums S and bsum terms are kq_tile's exact ones, the float steps its. */
typedef struct {
    __m256i v[2];      /* Q2_K / Q3_K: the 2-bit fields; Q5_K: unused */
    __m256i h;         /* Q3_K hmask, Q5_K qh */
    __m256i slo, shi;  /* Q3_K / Q6_K: the 16 int16 scales' low and high halves in both lanes (kq_bcast16) */
    __m256i t;         /* Q5_K: kq_k4_scales in both lanes; Q2_K: the 16 scales (bytes) in both lanes */
    __m256i aux;       /* the bsum multipliers, as kq_dec's aux */
} kq_raw;

/* kq_bcast16's out[j] */
static inline __attribute__((always_inline)) __m256i kq_sc16(const kq_raw *R, int j) {
    return _mm256_shuffle_epi8(j < 4 ? R->slo : R->shi, kq_pat16(j));
}

static inline __attribute__((always_inline)) void kq_halves(__m256i s16, kq_raw *R) {
    R->aux = s16;
    R->slo = _mm256_permute2x128_si256(s16, s16, 0x00);
    R->shi = _mm256_permute2x128_si256(s16, s16, 0x11);
}

static inline __attribute__((always_inline)) void kq_raw_q3_k(const kq_block_q3_k *b, kq_raw *R) {
    kq_halves(_mm256_cvtepi8_epi16(kq_q3_scales(b->scales)), R);
    R->v[0] = _mm256_loadu_si256((const __m256i *)b->qs);
    R->v[1] = _mm256_loadu_si256((const __m256i *)(b->qs + 32));
    R->h = _mm256_loadu_si256((const __m256i *)b->hmask);
}
static inline __attribute__((always_inline)) __m256i kq_reg_q3_k(const kq_block_q3_k *b, const kq_raw *R, int j,
                                                                 __m256i *sc) {
    (void)b;
    *sc = kq_sc16(R, j);
    const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(R->v[j >> 2], 2 * (j & 3)), _mm256_set1_epi8(3));
    return _mm256_or_si256(lo, _mm256_and_si256(kq_hbit(R->h, j, 2), _mm256_set1_epi8(4)));
}

static inline __attribute__((always_inline)) void kq_raw_q6_k(const kq_block_q6_k *b, kq_raw *R) {
    kq_halves(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales)), R);
}
static inline __attribute__((always_inline)) __m256i kq_reg_q6_k(const kq_block_q6_k *b, const kq_raw *R, int j,
                                                                 __m256i *sc) {
    *sc = kq_sc16(R, j);
    const int c = j >> 2, r = j & 3;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i l = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * c + 32 * (r & 1)));
    const __m256i h = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * c));
    const __m256i lq = r < 2 ? _mm256_and_si256(l, m4) : _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
    const __m256i hq = r == 0 ? _mm256_slli_epi16(h, 4) : r == 1 ? _mm256_slli_epi16(h, 2) : r == 2 ? h : _mm256_srli_epi16(h, 2);
    return _mm256_or_si256(lq, _mm256_and_si256(hq, _mm256_set1_epi8(0x30)));
}

static inline __attribute__((always_inline)) void kq_raw_q5_k(const kq_block_q5_k *b, kq_raw *R) {
    R->t = _mm256_broadcastsi128_si256(kq_k4_scales(b->scales));
    R->aux = kq_k4_mins(R->t);
    R->h = _mm256_loadu_si256((const __m256i *)b->qh);
}
static inline __attribute__((always_inline)) __m256i kq_reg_q5_k(const kq_block_q5_k *b, const kq_raw *R, int j,
                                                                 __m256i *sc) {
    *sc = _mm256_shuffle_epi8(R->t, _mm256_set1_epi16((short)(0x8000 | j)));
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i v = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * (j >> 1)));
    const __m256i nib = j & 1 ? _mm256_and_si256(_mm256_srli_epi16(v, 4), m4) : _mm256_and_si256(v, m4);
    return _mm256_or_si256(nib, _mm256_and_si256(kq_hbit(R->h, j, 4), _mm256_set1_epi8(0x10)));
}

static inline __attribute__((always_inline)) void kq_raw_q2_k(const kq_block_q2_k *b, kq_raw *R) {
    const __m128i s = _mm_loadu_si128((const __m128i *)b->scales), m4 = _mm_set1_epi8(0x0F);
    R->t = _mm256_broadcastsi128_si256(_mm_and_si128(s, m4));
    R->aux = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), m4));
    R->v[0] = _mm256_loadu_si256((const __m256i *)b->qs);
    R->v[1] = _mm256_loadu_si256((const __m256i *)(b->qs + 32));
}
static inline __attribute__((always_inline)) __m256i kq_reg_q2_k(const kq_block_q2_k *b, const kq_raw *R, int j,
                                                                 __m256i *sc) {
    (void)b;
    *sc = _mm256_shuffle_epi8(R->t, _mm256_set_m128i(_mm_set1_epi16((short)(0x8000 | (2 * j + 1))),
                                                     _mm_set1_epi16((short)(0x8000 | (2 * j)))));
    return _mm256_and_si256(_mm256_srli_epi16(R->v[j >> 2], 2 * (j & 3)), _mm256_set1_epi8(3));
}

/* SHIFT: Q3_K / Q6_K codes carry +4 / +32, taken off through the bsums (S = dot - (bsums . aux) << SHIFT);
 * HAS_MIN: the mins' term, (xd DMIN) (bsums . aux), into accm (kq_tile's order). */
#define KQ_ONE(NAME, BLOCK, HAS_MIN, DMIN, SHIFT)                                                             \
    static void kq_one_##NAME(const BLOCK *w, int64_t nb, const char *xc, size_t x_stride, int nc, float *y) { \
        (void)x_stride;                                                                                       \
        (void)nc;                                                                                             \
        const act_q8_256 *xa = (const act_q8_256 *)xc;                                                        \
        __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();                                         \
        for (int64_t b = 0; b < nb; b++) {                                                                    \
            const BLOCK *blk = &w[b];                                                                         \
            const act_q8_256 *x = &xa[b];                                                                     \
            kq_raw R;                                                                                         \
            kq_raw_##NAME(blk, &R);                                                                           \
            __m256i sum = _mm256_setzero_si256();                                                             \
            for (int j = 0; j < 8; j++) {                                                                     \
                __m256i sc;                                                                                   \
                const __m256i q = kq_reg_##NAME(blk, &R, j, &sc);                                             \
                const __m256i p = _mm256_maddubs_epi16(q, _mm256_loadu_si256((const __m256i *)(x->qs + 32 * j))); \
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(p, sc));                                        \
            }                                                                                                 \
            const __m256i bs = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)x->bsums), R.aux);       \
            if (SHIFT) sum = _mm256_sub_epi32(sum, _mm256_slli_epi32(bs, SHIFT));                             \
            const __m256 xd = _mm256_broadcast_ss(&x->d);                                                     \
            acc = _mm256_fmadd_ps(_mm256_mul_ps(xd, _mm256_set1_ps(kq_f16(blk->d))), _mm256_cvtepi32_ps(sum), acc); \
            if (HAS_MIN)                                                                                      \
                accm = _mm256_fmadd_ps(_mm256_mul_ps(xd, _mm256_set1_ps(DMIN)), _mm256_cvtepi32_ps(bs), accm); \
        }                                                                                                     \
        *y = strata_hsum8_avx2(HAS_MIN ? _mm256_sub_ps(acc, accm) : acc);                                     \
    }

KQ_ONE(q2_k, kq_block_q2_k, 1, kq_f16(blk->dmin), 0)
KQ_ONE(q3_k, kq_block_q3_k, 0, 0.0f, 2)
KQ_ONE(q5_k, kq_block_q5_k, 1, kq_f16(blk->dmin), 0)
KQ_ONE(q6_k, kq_block_q6_k, 0, 0.0f, 5)

KQ_VEC_DOT(q2_k, kq_block_q2_k, kq_dec_q2_k, kq_s_plain, 1, kq_one_q2_k)
KQ_VEC_DOT(q3_k, kq_block_q3_k, kq_dec_q3_k, kq_s_q3, 0, kq_one_q3_k)
KQ_VEC_DOT(q4_k, kq_block_q4_k, kq_dec_q4_k, kq_s_plain, 1, kq_tile_q4_k)
KQ_VEC_DOT(q5_k, kq_block_q5_k, kq_dec_q5_k, kq_s_plain, 1, kq_one_q5_k)
KQ_VEC_DOT(q6_k, kq_block_q6_k, kq_dec_q6_k, kq_s_q6, 0, kq_one_q6_k)
KQ_VEC_DOT(iq4_xs, kq_block_iq4_xs, kq_dec_iq4_xs, kq_s_iq4, 0, kq_one_iq4_xs)

/* ---------------------------------------------------------------- dequantization */

/* 16 codes (int8 or uint8) -> dst[0..15] = dl*q (- ml): mul, then sub, as gguf rounds. */
static inline void kq_deq16(__m128i q, int is_signed, float dl, float ml, int has_min, float *dst) {
    const __m256i a = is_signed ? _mm256_cvtepi8_epi32(q) : _mm256_cvtepu8_epi32(q);
    const __m256i b = is_signed ? _mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)) : _mm256_cvtepu8_epi32(_mm_srli_si128(q, 8));
    const __m256 vd = _mm256_set1_ps(dl), vm = _mm256_set1_ps(ml);
    __m256 fa = _mm256_mul_ps(_mm256_cvtepi32_ps(a), vd), fb = _mm256_mul_ps(_mm256_cvtepi32_ps(b), vd);
    if (has_min) {
        fa = _mm256_sub_ps(fa, vm);
        fb = _mm256_sub_ps(fb, vm);
    }
    _mm256_storeu_ps(dst, fa);
    _mm256_storeu_ps(dst + 8, fb);
}

/* Writes a decoded block: code vectors cv[8] (value 32j+k in byte k), one scale (and min) per
 * 16 values: dl[i/16], ml[i/16]. */
static inline void kq_deq_block(const __m256i cv[8], int is_signed, const float dl[16], const float ml[16],
                                int has_min, float *dst) {
    for (int j = 0; j < 8; j++) {
        kq_deq16(_mm256_castsi256_si128(cv[j]), is_signed, dl[2 * j], ml[2 * j], has_min, dst + 32 * j);
        kq_deq16(_mm256_extracti128_si256(cv[j], 1), is_signed, dl[2 * j + 1], ml[2 * j + 1], has_min,
                 dst + 32 * j + 16);
    }
}

void strata_avx2_dequant_q2_k(const void *src, float *dst, int64_t n) {
    const kq_block_q2_k *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        kq_dec D;
        kq_dec_2bit(b[i].qs, &D);
        const float d = kq_f16(b[i].d), dmin = kq_f16(b[i].dmin);
        float dl[16], ml[16];
        for (int j = 0; j < 16; j++) {
            dl[j] = d * (float)(b[i].scales[j] & 0xF);
            ml[j] = dmin * (float)(b[i].scales[j] >> 4);
        }
        kq_deq_block(D.q, 0, dl, ml, 1, dst + i * QK_K);
    }
}

void strata_avx2_dequant_q3_k(const void *src, float *dst, int64_t n) {
    const kq_block_q3_k *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        kq_dec D;
        kq_dec_q3_k(&b[i], &D);
        int8_t s[16];
        _mm_storeu_si128((__m128i *)s, kq_q3_scales(b[i].scales));
        float dl[16];
        for (int j = 0; j < 16; j++) dl[j] = D.d * (float)s[j];
        for (int j = 0; j < 8; j++) D.q[j] = _mm256_sub_epi8(D.q[j], _mm256_set1_epi8(4));
        kq_deq_block(D.q, 1, dl, dl, 0, dst + i * QK_K);
    }
}

static inline void kq_deq_k4(const uint8_t scales[12], const __m256i cv[8], float d, float dmin, float *dst) {
    uint8_t t[16];
    _mm_storeu_si128((__m128i *)t, kq_k4_scales(scales));
    float dl[16], ml[16];
    for (int j = 0; j < 8; j++) {
        dl[2 * j] = dl[2 * j + 1] = d * (float)t[j];
        ml[2 * j] = ml[2 * j + 1] = dmin * (float)t[8 + j];
    }
    kq_deq_block(cv, 0, dl, ml, 1, dst);
}

void strata_avx2_dequant_q4_k(const void *src, float *dst, int64_t n) {
    const kq_block_q4_k *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        kq_dec D;
        kq_dec_q4_nibbles(b[i].qs, &D);
        kq_deq_k4(b[i].scales, D.q, kq_f16(b[i].d), kq_f16(b[i].dmin), dst + i * QK_K);
    }
}

void strata_avx2_dequant_q5_k(const void *src, float *dst, int64_t n) {
    const kq_block_q5_k *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        kq_dec D;
        kq_dec_q5_k(&b[i], &D);
        kq_deq_k4(b[i].scales, D.q, D.d, D.dmin, dst + i * QK_K);
    }
}

void strata_avx2_dequant_q6_k(const void *src, float *dst, int64_t n) {
    const kq_block_q6_k *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        kq_dec D;
        kq_dec_q6_k(&b[i], &D);
        float dl[16];
        for (int j = 0; j < 16; j++) dl[j] = D.d * (float)b[i].scales[j];
        for (int j = 0; j < 8; j++) D.q[j] = _mm256_sub_epi8(D.q[j], _mm256_set1_epi8(32));
        kq_deq_block(D.q, 1, dl, dl, 0, dst + i * QK_K);
    }
}

void strata_avx2_dequant_iq4_xs(const void *src, float *dst, int64_t n) {
    const kq_block_iq4_xs *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        kq_dec D;
        kq_dec_iq4_xs(&b[i], &D);
        int8_t s[16];
        _mm_storeu_si128((__m128i *)s, kq_iq4xs_scales(&b[i]));
        float dl[16];
        for (int j = 0; j < 8; j++) dl[2 * j] = dl[2 * j + 1] = D.d * (float)s[j];
        kq_deq_block(D.sgn, 1, dl, dl, 0, dst + i * QK_K);
    }
}
