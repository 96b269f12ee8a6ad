/* avx512_kquants.c — AVX-512 dot products of Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS.
 * Block layouts and the summation order: avx2_kquants.h. Dequantization stays on the AVX2
 * kernels (the fallback slot): it is not on the decode or prefill path.
 *
 * Same lane sums, found differently. The AVX2 kernel leaves, per super-block, the eight int32
 * lanes S_l (M_l) of avx2_kquants.h: lane l collects bytes 4l..4l+3 of every 32-value code
 * vector. Here one zmm holds 64 consecutive values (chunk p: values 64p..64p+63, in the
 * activations' own order), so int32 lanes l and 8+l of it hold terms of S_l; all terms are
 * summed exactly in int32 (any order gives the same integer) and the two halves added at the
 * end. The float step is the AVX2 kernel's, lane for lane: fma(xd*d, S_l, acc_l), acc - accm,
 * strata_hsum8_avx2.
 *
 * Where the time went before (maddubs + vpdpwssd, ~40 % of read bandwidth): not the multiplies
 * but the ports they share. With 512-bit uops in flight port 1 takes no vector work, so the
 * multiplies, shifts, converts and the float step all queue on port 0 while port 5 only
 * shuffles. So: vpdpbusd on the unsigned codes (4-value sums), two chunks' sums packed into
 * one dword each and scaled by one vpmaddwd/vpdpwssd (kq5_z: 6 multiplies per column and
 * block, not 8); offset corrections (Q3_K -4, Q6_K -32) as one more vpdpwssd against the
 * bsums instead of madd + shift + subtract; bit fields placed with vpmultishiftqb (port 5)
 * instead of shifts; S and M of a column (or S of two columns) in one zmm, so the float step
 * is one convert, multiply and FMA for 16 lanes.
 */
#include "avx2_kquants.h"

#if STRATA_HAVE_AVX512
#include "avx512_kquants.h"
#include "avx2_common.h"

#include "quant_tables.h"

enum { KQ5_COLS = 16 }; /* activation rows per weight-block decode */

/* One decoded super-block. Code vector p holds values 64p..64p+63 in natural order, the order
 * of the activations, so x is loaded as it lies. */
typedef struct {
    __m512i q[4];     /* unsigned codes (|k| for IQ4_XS) */
    __m512i sw[2];    /* scale word pairs of the packed partials (kq5_z); IQ4_XS: unused */
    __m512i sc[4];    /* IQ4_XS: int16 scale of every maddubs pair of q[p] */
    __mmask64 neg[4]; /* IQ4_XS: values whose k is negative (their activation changes sign) */
    __m512i corr;     /* int16 bsum multipliers in the low 256 bits (mins, or -off * scales), 0 above */
    __m512 dd;        /* float step multipliers: d (x16), or dmin (x8) then d (x8) with mins */
} kq5_dec;

static inline float kq5_f16(const uint8_t h[2]) { return _cvtsh_ss(strata_rd_u16(h)); }

/* [dmin x8, d x8] from the fp16 d and dmin. */
static inline __m512 kq5_dd_min(const uint8_t d[2], const uint8_t dmin[2]) {
    const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)(strata_rd_u16(d) | (uint32_t)strata_rd_u16(dmin) << 16)));
    return _mm512_permutexvar_ps(_mm512_inserti64x4(_mm512_set1_epi32(1), _mm256_setzero_si256(), 1),
                                 _mm512_castps128_ps512(f));
}

/* vpmultishiftqb control: byte i of every qword takes the 8 bits from bit 8i + off (mod 64, it
 * wraps), off_lo in the low 256 bits, off_hi in the high 256. A bit field lands where a mask
 * wants it without a shift, which would take the multiply port. */
static inline __m512i kq5_ms(int off_lo, int off_hi) {
    return _mm512_add_epi8(_mm512_set1_epi64(0x3830282018100800LL),
                           _mm512_inserti64x4(_mm512_set1_epi8((char)off_lo), _mm256_set1_epi8((char)off_hi), 1));
}
static inline __m512i kq5_bits(int off_lo, int off_hi, __m512i v) {
    return _mm512_multishift_epi64_epi8(kq5_ms(off_lo, off_hi), v);
}
static inline __m512i kq5_bcast32(const uint8_t *p) {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
}

/* ---------------------------------------------------------------- scales */

/* s16: one int16 scale per 16 values -> sw[0], sw[1]: in 128-bit lane t, the word pairs
 * (s_t, s_4+t) and (s_8+t, s_12+t), the groups kq5_z packs together there. */
static inline void kq5_sw16(__m256i s16, kq5_dec *D) {
    const __m512i v = _mm512_castsi256_si512(s16);
    for (int h = 0; h < 2; h++) {
        const short a = (short)(8 * h);
        D->sw[h] = _mm512_permutexvar_epi16(
            _mm512_set_epi16(a + 7, a + 3, a + 7, a + 3, a + 7, a + 3, a + 7, a + 3, a + 6, a + 2, a + 6, a + 2,
                             a + 6, a + 2, a + 6, a + 2, a + 5, a + 1, a + 5, a + 1, a + 5, a + 1, a + 5, a + 1,
                             a + 4, a + 0, a + 4, a + 0, a + 4, a + 0, a + 4, a + 0),
            v);
    }
}

/* Q4_K/Q5_K scales (format: avx2_kquants.h, fmt_kquants.c's unpack_k4_scales) -> bytes
 * 0-7: sc 0-7, bytes 8-15: m 0-7, done on general registers the vector code leaves idle. */
static inline __m128i kq5_k4_scales(const uint8_t s[12]) {
    const uint32_t w0 = strata_rd_u32(s), w1 = strata_rd_u32(s + 4), w2 = strata_rd_u32(s + 8);
    const uint32_t sc_hi = (w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u);
    const uint32_t m_hi = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u);
    return _mm_setr_epi32((int)(w0 & 0x3f3f3f3fu), (int)sc_hi, (int)(w1 & 0x3f3f3f3fu), (int)m_hi);
}

/* sc per 32 values -> per 16 (sc0 sc0 sc1 sc1 ...), mins likewise as the bsum multipliers. */
static inline void kq5_dec_k4_scales(const uint8_t d[2], const uint8_t dmin[2], const uint8_t s[12], kq5_dec *D) {
    const __m128i t = kq5_k4_scales(s);
    kq5_sw16(_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(t, t)), D);
    D->corr = _mm512_zextsi256_si512(_mm256_cvtepu8_epi16(_mm_unpackhi_epi8(t, t)));
    D->dd = kq5_dd_min(d, dmin);
}

/* ---------------------------------------------------------------- decoders */

/* Q4_K nibbles: values 64p..64p+63 are the low then the high nibbles of qs[32p..32p+31]. */
static inline void kq5_dec_nibbles(const uint8_t qs[128], kq5_dec *D) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int p = 0; p < 4; p++) D->q[p] = _mm512_and_si512(kq5_bits(0, 4, kq5_bcast32(qs + 32 * p)), m4);
}

static inline void kq5_dec_q4_k(const kq_block_q4_k *b, kq5_dec *D) {
    kq5_dec_k4_scales(b->d, b->dmin, b->scales, D);
    kq5_dec_nibbles(b->qs, D);
}

static inline void kq5_dec_q5_k(const kq_block_q5_k *b, kq5_dec *D) {
    kq5_dec_k4_scales(b->d, b->dmin, b->scales, D);
    kq5_dec_nibbles(b->qs, D);
    /* bit j = 2p (low half), 2p+1 (high) of qh[k] -> bit 4 */
    const __m512i h = kq5_bcast32(b->qh), b4 = _mm512_set1_epi8(0x10);
    for (int p = 0; p < 4; p++)
        D->q[p] = _mm512_ternarylogic_epi64(D->q[p], kq5_bits(2 * p - 4, 2 * p - 3, h), b4, 0xF8); /* A | B & C */
}

/* 2-bit fields, value 128c+32s+k = bits 2s.. of qs[32c+k] (Q2_K, Q3_K): chunk p is c = p/2,
 * s = 2(p%2) in the low half, +1 in the high. */
static inline void kq5_dec_2bit(const uint8_t qs[64], kq5_dec *D) {
    const __m512i m2 = _mm512_set1_epi8(3);
    for (int p = 0; p < 4; p++) {
        const int s = 2 * (p % 2);
        D->q[p] = _mm512_and_si512(kq5_bits(2 * s, 2 * s + 2, kq5_bcast32(qs + 32 * (p / 2))), m2);
    }
}

static inline void kq5_dec_q2_k(const kq_block_q2_k *b, kq5_dec *D) {
    const __m128i s = _mm_loadu_si128((const __m128i *)b->scales), m4 = _mm_set1_epi8(0x0F);
    kq5_sw16(_mm256_cvtepu8_epi16(_mm_and_si128(s, m4)), D);
    D->corr = _mm512_zextsi256_si512(_mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), m4)));
    kq5_dec_2bit(b->qs, D);
    D->dd = kq5_dd_min(b->d, b->dmin);
}

/* Q3_K's sixteen 6-bit scales minus 32 as int16: low nibbles are bytes 0-7 (scales 0-7 low
 * nibble, 8-15 high nibble), the 2 high bits of scale j are bits 2(j/4).. of byte 8 + j%4. */
static inline __m256i kq5_q3_scales(const uint8_t s[12]) {
    const uint64_t lo = (uint64_t)strata_rd_u32(s) | (uint64_t)strata_rd_u32(s + 4) << 32;
    const uint32_t a2 = strata_rd_u32(s + 8);
    const __m128i nib = _mm_and_si128(_mm_set_epi64x((long long)(lo >> 4), (long long)lo), _mm_set1_epi8(0x0F));
    /* byte j of hi: bits of scale j, from byte j%4 of a2 shifted by 2(j/4) */
    const __m128i a = _mm_set1_epi32((int)a2);
    const __m128i hi = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 2, 4, 6)), _mm_set1_epi8(3));
    const __m128i v = _mm_or_si128(nib, _mm_slli_epi16(hi, 4));
    return _mm256_sub_epi16(_mm256_cvtepu8_epi16(v), _mm256_set1_epi16(32));
}

/* Scales s16 of a type whose codes carry +off: the -off * s * bsum terms go in as one more
 * vpdpwssd (kq5_z). off * |s| <= 32 * 128 fits int16. */
static inline void kq5_off_scales(__m256i s16, int log2_off, kq5_dec *D) {
    kq5_sw16(s16, D);
    D->corr = _mm512_zextsi256_si512(_mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(s16, log2_off)));
}

static inline void kq5_dec_q3_k(const kq_block_q3_k *b, kq5_dec *D) {
    kq5_off_scales(kq5_q3_scales(b->scales), 2, D);
    kq5_dec_2bit(b->qs, D);
    /* code = low 2 bits + 4 * (bit j = 2p, 2p+1 of hmask[k]) in 0..7 */
    const __m512i h = kq5_bcast32(b->hmask), b2 = _mm512_set1_epi8(4);
    for (int p = 0; p < 4; p++)
        D->q[p] = _mm512_ternarylogic_epi64(D->q[p], kq5_bits(2 * p - 2, 2 * p - 1, h), b2, 0xF8);
    D->dd = _mm512_set1_ps(kq5_f16(b->d));
}

static inline void kq5_dec_q6_k(const kq_block_q6_k *b, kq5_dec *D) {
    kq5_off_scales(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales)), 5, D);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m6 = _mm512_set1_epi8(0x30);
    for (int p = 0; p < 4; p++) {
        /* chunk p: nibble p%2 of ql[64(p/2)..+63]; bits 2s.. of qh[32(p/2)+k], s = 2(p%2) in the
         * low half, +1 in the high -> bits 4-5 */
        const int c = p / 2, s = 2 * (p % 2);
        const __m512i l = _mm512_loadu_si512(b->ql + 64 * c);
        const __m512i nib = p % 2 ? kq5_bits(4, 4, l) : l;
        const __m512i hb = _mm512_and_si512(kq5_bits(2 * s - 4, 2 * s - 2, kq5_bcast32(b->qh + 32 * c)), m6);
        D->q[p] = _mm512_ternarylogic_epi64(nib, m4, hb, 0xEA); /* A & B | C */
    }
    D->dd = _mm512_set1_ps(kq5_f16(b->d));
}

/* IQ4_XS's eight 6-bit scales minus 32 as int16: low nibble j of scales_l, bits 2j.. of
 * scales_h. */
static inline __m128i kq5_iq4xs_scales(const kq_block_iq4_xs *b) {
    const __m128i l = _mm_set1_epi32((int)strata_rd_u32(b->scales_l));
    const __m128i h = _mm_set1_epi16((short)strata_rd_u16(b->scales_h));
    /* word j: nibble j of l, which lies in 16-bit word j/4 of it */
    const __m128i lw = _mm_shuffle_epi8(l, _mm_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3));
    const __m128i lo = _mm_and_si128(_mm_srlv_epi16(lw, _mm_setr_epi16(0, 4, 8, 12, 0, 4, 8, 12)), _mm_set1_epi16(15));
    const __m128i hi = _mm_and_si128(_mm_srlv_epi16(h, _mm_setr_epi16(0, 2, 4, 6, 8, 10, 12, 14)), _mm_set1_epi16(3));
    return _mm_sub_epi16(_mm_or_si128(lo, _mm_slli_epi16(hi, 4)), _mm_set1_epi16(32));
}

static inline void kq5_dec_iq4_xs(const kq_block_iq4_xs *b, kq5_dec *D) {
    /* s: eight int16 scales, one per 32 values -> sc[p]: scale 2p in the low 16 words, 2p+1 in
     * the high 16 */
    const __m512i s = _mm512_castsi128_si512(kq5_iq4xs_scales(b));
    for (int p = 0; p < 4; p++)
        D->sc[p] = _mm512_permutexvar_epi16(
            _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * p)), _mm256_set1_epi16((short)(2 * p + 1)), 1), s);
    /* kvalues_iq4nl is sorted: entries 0-7 negative, 8-15 positive; look up |k| and take the
     * sign from bit 3 of the index */
    const __m128i kv = _mm_loadu_si128((const __m128i *)strata_kvalues_iq4nl);
    const __m512i akv = _mm512_broadcast_i32x4(_mm_abs_epi8(kv));
    const __m512i m4 = _mm512_set1_epi8(0x0F), b3 = _mm512_set1_epi8(8);
    for (int c = 0; c < 2; c++) {
        /* 128-bit lane t of v: sub-block 4c+t, low nibbles values 0-15, high 16-31 */
        const __m512i v = _mm512_loadu_si512(b->qs + 64 * c);
        const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        for (int h = 0; h < 2; h++) {
            const __m512i idx = _mm512_setr_epi64(4 * h, 4 * h + 1, 8 + 4 * h, 9 + 4 * h, 4 * h + 2, 4 * h + 3,
                                                  10 + 4 * h, 11 + 4 * h);
            const __m512i n = _mm512_permutex2var_epi64(lo, idx, hi); /* sub-blocks 4c+2h, 4c+2h+1 */
            D->q[2 * c + h] = _mm512_shuffle_epi8(akv, n);
            D->neg[2 * c + h] = _mm512_testn_epi8_mask(n, b3);
        }
    }
    D->dd = _mm512_set1_ps(kq5_f16(b->d));
}

/* ---------------------------------------------------------------- per-column integer sums */

/* The sixteen int32 lanes Z of a block and column: lane l and lane 8+l add up to S_l
 * (avx2_kquants.h; integer addition, any order). vpdpbusd puts the 4-value dot of lane l of
 * chunk p in int32 lane l of D_p: |D_p| <= 4 * 63 * 127 < 2^15 for every code these formats
 * feed it (Q6_K's 0..63 the largest), so D_p's low 16 bits are D_p as int16. D_0 and D_1
 * (D_2, D_3) share one dword, D_1 moved into the high word by a merge-masked vpshufb, and one
 * vpmaddwd / vpdpwssd against (s_a, s_b) word pairs scales and adds both: 4 + 2 multiplies
 * instead of 4 + 4. */
static inline __m512i kq5_z(const kq5_dec *D, const act_q8_256 *x, int off) {
    const __m512i z = _mm512_setzero_si512();
    const __m512i up = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13));
    const __mmask64 hiw = 0xCCCCCCCCCCCCCCCCull;
    __m512i d[4];
    for (int p = 0; p < 4; p++) d[p] = _mm512_dpbusd_epi32(z, D->q[p], _mm512_loadu_si512(x->qs + 64 * p));
    const __m512i c0 = _mm512_mask_shuffle_epi8(d[0], hiw, d[1], up);
    const __m512i c1 = _mm512_mask_shuffle_epi8(d[2], hiw, d[3], up);
    __m512i acc = _mm512_dpwssd_epi32(_mm512_madd_epi16(c0, D->sw[0]), c1, D->sw[1]);
    /* the 64 bytes from bsums: bsums then qs[0..31], which corr's zero words drop */
    if (off) acc = _mm512_dpwssd_epi32(acc, _mm512_loadu_si512(x->bsums), D->corr);
    return acc;
}
static inline __m512i kq5_z_plain(const kq5_dec *D, const act_q8_256 *x) { return kq5_z(D, x, 0); }
static inline __m512i kq5_z_off(const kq5_dec *D, const act_q8_256 *x) { return kq5_z(D, x, 1); }

/* IQ4_XS: |k| times x negated where k < 0. Its 4-value sums reach 4 * 127 * 127 (no int16
 * packing), so pairs go through maddubs (at most 2 * 127 * 127) and vpdpwssd. */
static inline __m512i kq5_z_iq4(const kq5_dec *D, const act_q8_256 *x) {
    __m512i acc = _mm512_setzero_si512();
    for (int p = 0; p < 4; p++) {
        const __m512i xv = _mm512_loadu_si512(x->qs + 64 * p);
        const __m512i xs = _mm512_mask_sub_epi8(xv, D->neg[p], _mm512_setzero_si512(), xv);
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(D->q[p], xs), D->sc[p]);
    }
    return acc;
}

/* With mins: [M_0..M_7, S_0..S_7] (M from the low half of corr * bsums, S the folded Z). */
static inline __m512i kq5_sm(const kq5_dec *D, const act_q8_256 *x, __m512i zv) {
    const __m512i m = _mm512_madd_epi16(_mm512_loadu_si512(x->bsums), D->corr);
    return _mm512_mask_add_epi32(m, 0xFF00, zv, _mm512_shuffle_i64x2(zv, zv, _MM_SHUFFLE(1, 0, 3, 2)));
}

/* ---------------------------------------------------------------- vec_dot, rows */

/* Several columns: per column and block the weights give 9-13 bytes (a block over 16 columns),
 * the activations 292, so a 16-column tile (16 x 292 bytes per block, 47 KB on a 2560-wide
 * row) streams x from L2 for every row. The rows kernel takes the columns KQ5_SUB at a time across all its rows instead,
 * each weight block decoded once per KQ5_SUB columns, the activation tile staying in L1. */
enum { KQ5_SUB = 8, KQ5_L1_X = 24 << 10 };
static inline int kq5_sub_cols(int64_t nb) {
    return nb * (int64_t)sizeof(act_q8_256) * KQ5_SUB <= KQ5_L1_X ? KQ5_SUB : KQ5_SUB / 2;
}

/* Per block and column, lane l of S (M) goes into lane l of the float accumulators as
 * kq_lane_step does it: fma(xd*d, S, acc); only the register holding the lanes differs from
 * avx2_kquants.c. With mins, one zmm per column holds accm (low 8) and acc (high 8), so M and S
 * take one convert, multiply and FMA; without, one zmm holds two columns' acc. */
#define KQ5_VEC_DOT(NAME, BLOCK, DECODE, ZVEC, HAS_MIN)                                            \
    static inline __attribute__((always_inline)) void kq5_tile_##NAME(                            \
        const BLOCK *w, int64_t nb, const char *xc, size_t x_stride, int nc, float *y) {           \
        __m512 acc[KQ5_COLS];                                                                      \
        __m256 acc1 = _mm256_setzero_ps();                                                         \
        for (int c = 0; c < KQ5_COLS; c++) acc[c] = _mm512_setzero_ps();                           \
        for (int64_t b = 0; b < nb; b++) {                                                         \
            kq5_dec D;                                                                             \
            DECODE(&w[b], &D);                                                                     \
            const act_q8_256 *x0 = (const act_q8_256 *)xc + b;                                     \
            if (HAS_MIN) {                                                                         \
                for (int c = 0; c < nc; c++) {                                                     \
                    const act_q8_256 *x = (const act_q8_256 *)((const char *)x0 + (size_t)c * x_stride); \
                    const __m512 xd = _mm512_set1_ps(x->d);                                        \
                    acc[c] = _mm512_fmadd_ps(_mm512_mul_ps(xd, D.dd),                              \
                                             _mm512_cvtepi32_ps(kq5_sm(&D, x, ZVEC(&D, x))), acc[c]); \
                }                                                                                  \
                continue;                                                                          \
            }                                                                                      \
            int c = 0;                                                                             \
            for (; c + 1 < nc; c += 2) {                                                           \
                const act_q8_256 *xa = (const act_q8_256 *)((const char *)x0 + (size_t)c * x_stride); \
                const act_q8_256 *xb = (const act_q8_256 *)((const char *)xa + x_stride);          \
                const __m512i za = ZVEC(&D, xa), zb = ZVEC(&D, xb);                                \
                const __m512i s = _mm512_add_epi32(_mm512_shuffle_i64x2(za, zb, _MM_SHUFFLE(1, 0, 1, 0)), \
                                                   _mm512_shuffle_i64x2(za, zb, _MM_SHUFFLE(3, 2, 3, 2))); \
                const __m512 xd = _mm512_mask_mov_ps(_mm512_set1_ps(xa->d), 0xFF00, _mm512_set1_ps(xb->d)); \
                acc[c / 2] = _mm512_fmadd_ps(_mm512_mul_ps(xd, D.dd), _mm512_cvtepi32_ps(s), acc[c / 2]); \
            }                                                                                      \
            if (c < nc) {                                                                          \
                const act_q8_256 *x = (const act_q8_256 *)((const char *)x0 + (size_t)c * x_stride); \
                const __m512i zv = ZVEC(&D, x);                                                    \
                const __m256i s = _mm256_add_epi32(_mm512_castsi512_si256(zv), _mm512_extracti64x4_epi64(zv, 1)); \
                acc1 = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(x->d), _mm512_castps512_ps256(D.dd)), \
                                       _mm256_cvtepi32_ps(s), acc1);                               \
            }                                                                                      \
        }                                                                                          \
        if (HAS_MIN) {                                                                             \
            for (int c = 0; c < nc; c++)                                                           \
                y[c] = strata_hsum8_avx2(_mm256_sub_ps(_mm512_extractf32x8_ps(acc[c], 1), _mm512_castps512_ps256(acc[c]))); \
            return;                                                                                \
        }                                                                                          \
        int c = 0;                                                                                 \
        for (; c + 1 < nc; c += 2) {                                                               \
            y[c] = strata_hsum8_avx2(_mm512_castps512_ps256(acc[c / 2]));                          \
            y[c + 1] = strata_hsum8_avx2(_mm512_extractf32x8_ps(acc[c / 2], 1));                   \
        }                                                                                          \
        if (c < nc) y[c] = strata_hsum8_avx2(acc1);                                                \
    }                                                                                              \
    void strata_avx512_vec_dot_##NAME(int64_t n, const void *vw, const void *vx, size_t x_stride,  \
                                      int ncols, float *y) {                                       \
        const int64_t nb = n / QK_K;                                                               \
        for (int c0 = 0; c0 < ncols; c0 += KQ5_COLS) {                                             \
            const int nc = ncols - c0 < KQ5_COLS ? ncols - c0 : KQ5_COLS;                          \
            const char *xc = (const char *)vx + (size_t)c0 * x_stride;                             \
            /* constant column counts (decode, full prefill tiles) keep the accumulators in      \
             * registers */                                                                        \
            if (nc == 1) kq5_tile_##NAME(vw, nb, xc, x_stride, 1, y + c0);                         \
            else if (nc == KQ5_COLS) kq5_tile_##NAME(vw, nb, xc, x_stride, KQ5_COLS, y + c0);      \
            else kq5_tile_##NAME(vw, nb, xc, x_stride, nc, y + c0);                                \
        }                                                                                          \
    }                                                                                              \
    void strata_avx512_rows_##NAME(int64_t n, const void *vw, size_t w_row, int64_t nrows,         \
                                   const void *vx, size_t x_stride, int ncols, float *y, int64_t ldy) { \
        const int64_t nb = n / QK_K;                                                               \
        const int sub = kq5_sub_cols(nb);                                                          \
        float t[KQ5_COLS];                                                                         \
        for (int c0 = 0; c0 < ncols; c0 += sub) {                                                  \
            const int nc = ncols - c0 < sub ? ncols - c0 : sub;                                    \
            const char *xc = (const char *)vx + (size_t)c0 * x_stride;                             \
            for (int64_t r = 0; r < nrows; r++) {                                                  \
                const BLOCK *w = (const BLOCK *)((const char *)vw + (size_t)r * w_row);            \
                if (nc == KQ5_SUB) kq5_tile_##NAME(w, nb, xc, x_stride, KQ5_SUB, t);               \
                else if (nc == KQ5_SUB / 2) kq5_tile_##NAME(w, nb, xc, x_stride, KQ5_SUB / 2, t);  \
                else kq5_tile_##NAME(w, nb, xc, x_stride, nc, t);                                  \
                for (int c = 0; c < nc; c++) y[(c0 + c) * ldy + r] = t[c];                         \
            }                                                                                      \
        }                                                                                          \
    }

KQ5_VEC_DOT(q2_k, kq_block_q2_k, kq5_dec_q2_k, kq5_z_plain, 1)
KQ5_VEC_DOT(q3_k, kq_block_q3_k, kq5_dec_q3_k, kq5_z_off, 0)
KQ5_VEC_DOT(q4_k, kq_block_q4_k, kq5_dec_q4_k, kq5_z_plain, 1)
KQ5_VEC_DOT(q5_k, kq_block_q5_k, kq5_dec_q5_k, kq5_z_plain, 1)
KQ5_VEC_DOT(q6_k, kq_block_q6_k, kq5_dec_q6_k, kq5_z_off, 0)
KQ5_VEC_DOT(iq4_xs, kq_block_iq4_xs, kq5_dec_iq4_xs, kq5_z_iq4, 0)

#endif
