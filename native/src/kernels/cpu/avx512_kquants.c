/* avx512_kquants.c — AVX-512 dot products of Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS.
 * Block layouts and the summation order: avx2_kquants.h. Dequantization stays on the AVX2
 * kernels (the fallback slot): it is not on the decode or prefill path.
 *
 * Same lane sums, twice as wide. The AVX2 kernel leaves, per super-block, the eight int32
 * lanes S_l (M_l) of avx2_kquants.h: lane l collects bytes 4l..4l+3 of every 32-value code
 * vector j. Here one zmm holds the code vectors of two sub-blocks, j = 2p in its low 256 bits
 * and 2p+1 in its high 256 bits, so int32 lane l of the low half and lane 8+l of the high
 * half hold exactly the terms the AVX2 lane l gets from those two vectors; adding the two
 * halves after all four zmm gives the same exact S_l (integer addition: any order). The
 * float step after it is the AVX2 kernel's, on a __m256, instruction for instruction.
 *
 * Per column and super-block: four maddubs (u8 codes x s8 activations -> int16 pairs) and
 * four vpdpwssd (int16 pair x int16 scale, accumulated into int32: the madd + add of AVX2 in
 * one instruction). The bounds of avx2_kquants.c hold unchanged (same codes, same
 * activations): maddubs never saturates and every int32 stays below 2^26, so vpdpwssd's
 * wrap-around never happens.
 *
 * Decode puts sub-blocks 2p, 2p+1 together with 128-bit shuffles (port 5), and Q5_K's fifth
 * and Q3_K's high bit go in through byte masks (vptestmb + masked add) rather than shifts: the
 * port of the 512-bit shifts is the one the multiplies need.
 *
 * Measured on the shared 2-core Ice Lake-class host (issue 17 note): at one column and at 16
 * columns this path runs about as fast as the AVX2 one. A 512-bit integer multiply issues on
 * one port where the 256-bit ones issue on two, so four zmm maddubs + four vpdpwssd cost what
 * eight + eight ymm maddubs + madd cost; what is saved is the adds, loads and front-end slots.
 */
#include "avx2_kquants.h"

#if STRATA_HAVE_AVX512
#include "avx512_kquants.h"
#include "avx2_common.h"

#include "quant_tables.h"

enum { KQ5_COLS = 16 }; /* activation rows per weight-block decode */

/* One decoded super-block: code vector p = sub-blocks 2p (low 256 bits) and 2p+1 (high). */
typedef struct {
    __m512i q[4];    /* unsigned codes (|k| for IQ4_XS) */
    __m512i sc[4];   /* int16 scale of every maddubs pair of q[p] */
    __mmask64 neg[4]; /* IQ4_XS: values whose k is negative (their activation changes sign) */
    __m256i aux;     /* int16 per-16 multipliers of the bsums: mins, or offset scales */
    float d, dmin;
} kq5_dec;

static inline float kq5_f16(const uint8_t h[2]) { return _cvtsh_ss(strata_rd_u16(h)); }

/* [low 256 bits of a, low 256 of b] and [high of a, high of b]. */
static inline __m512i kq5_lo2(__m512i a, __m512i b) { return _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(1, 0, 1, 0)); }
static inline __m512i kq5_hi2(__m512i a, __m512i b) { return _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 2, 3, 2)); }

/* ---------------------------------------------------------------- scales */

/* s: eight int16 scales (one per 32 values) -> sc[p]: scale 2p in the low 16 words, 2p+1 in
 * the high 16. */
static inline void kq5_bcast8(__m128i s, __m512i sc[4]) {
    const __m512i v = _mm512_castsi128_si512(s);
    for (int p = 0; p < 4; p++)
        sc[p] = _mm512_permutexvar_epi16(
            _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * p)), _mm256_set1_epi16((short)(2 * p + 1)), 1), v);
}

/* s: sixteen int16 scales (one per 16 values) -> sc[p]: scale 4p+t in 128-bit lane t. */
static inline void kq5_bcast16(__m256i s, __m512i sc[4]) {
    const __m512i v = _mm512_castsi256_si512(s);
    for (int p = 0; p < 4; p++) {
        const short t = (short)(4 * p);
        sc[p] = _mm512_permutexvar_epi16(_mm512_set_epi16(t + 3, t + 3, t + 3, t + 3, t + 3, t + 3, t + 3, t + 3,
                                                          t + 2, t + 2, t + 2, t + 2, t + 2, t + 2, t + 2, t + 2,
                                                          t + 1, t + 1, t + 1, t + 1, t + 1, t + 1, t + 1, t + 1,
                                                          t, t, t, t, t, t, t, t),
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

static inline void kq5_dec_k4_scales(const uint8_t s[12], kq5_dec *D) {
    const __m128i t = kq5_k4_scales(s);
    kq5_bcast8(_mm_cvtepu8_epi16(t), D->sc);
    /* m0 m0 m1 m1 ... m7 m7: bsums come per 16 values, mins per 32 */
    D->aux = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(t, t));
}

/* ---------------------------------------------------------------- decoders */

/* 128 bytes of nibbles, value 64c+32h+k = nibble h of qs[32c+k] (Q4_K, Q5_K). */
static inline void kq5_dec_nibbles(const uint8_t qs[128], kq5_dec *D) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    for (int i = 0; i < 2; i++) {
        const __m512i v = _mm512_loadu_si512(qs + 64 * i); /* c = 2i, 2i+1 */
        const __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
        D->q[2 * i] = kq5_lo2(lo, hi);     /* sub-blocks 4i, 4i+1 */
        D->q[2 * i + 1] = kq5_hi2(lo, hi); /* 4i+2, 4i+3 */
    }
}

/* Adds `add` to every byte k of q[p]'s half h whose bit 2p+h of bits[k] is set (bits[k]:
 * a byte per value position k < 32, bit j for sub-block j). */
static inline void kq5_add_bits(const uint8_t bits[32], char add, kq5_dec *D) {
    const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)bits));
    const __m512i a = _mm512_set1_epi8(add);
    for (int p = 0; p < 4; p++) {
        const __m512i sel =
            _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * p))), _mm256_set1_epi8((char)(1 << (2 * p + 1))), 1);
        D->q[p] = _mm512_mask_add_epi8(D->q[p], _mm512_test_epi8_mask(h, sel), D->q[p], a);
    }
}

static inline void kq5_dec_q4_k(const kq_block_q4_k *b, kq5_dec *D) {
    kq5_dec_k4_scales(b->scales, D);
    kq5_dec_nibbles(b->qs, D);
    D->d = kq5_f16(b->d);
    D->dmin = kq5_f16(b->dmin);
}

static inline void kq5_dec_q5_k(const kq_block_q5_k *b, kq5_dec *D) {
    kq5_dec_k4_scales(b->scales, D);
    kq5_dec_nibbles(b->qs, D);
    kq5_add_bits(b->qh, 16, D);
    D->d = kq5_f16(b->d);
    D->dmin = kq5_f16(b->dmin);
}

/* 2-bit fields, value 128c+32s+k = bits 2s.. of qs[32c+k] (Q2_K, Q3_K). */
static inline void kq5_dec_2bit(const uint8_t qs[64], kq5_dec *D) {
    const __m512i m2 = _mm512_set1_epi8(3), v = _mm512_loadu_si512(qs); /* c = 0 low, 1 high */
    const __m512i f0 = _mm512_and_si512(v, m2), f1 = _mm512_and_si512(_mm512_srli_epi16(v, 2), m2);
    const __m512i f2 = _mm512_and_si512(_mm512_srli_epi16(v, 4), m2), f3 = _mm512_and_si512(_mm512_srli_epi16(v, 6), m2);
    D->q[0] = kq5_lo2(f0, f1); /* sub-blocks 0, 1 */
    D->q[1] = kq5_lo2(f2, f3); /* 2, 3 */
    D->q[2] = kq5_hi2(f0, f1); /* 4, 5 */
    D->q[3] = kq5_hi2(f2, f3); /* 6, 7 */
}

static inline void kq5_dec_q2_k(const kq_block_q2_k *b, kq5_dec *D) {
    const __m128i s = _mm_loadu_si128((const __m128i *)b->scales), m4 = _mm_set1_epi8(0x0F);
    kq5_bcast16(_mm256_cvtepu8_epi16(_mm_and_si128(s, m4)), D->sc);
    D->aux = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), m4));
    kq5_dec_2bit(b->qs, D);
    D->d = kq5_f16(b->d);
    D->dmin = kq5_f16(b->dmin);
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

static inline void kq5_dec_q3_k(const kq_block_q3_k *b, kq5_dec *D) {
    const __m256i s16 = kq5_q3_scales(b->scales);
    kq5_bcast16(s16, D->sc);
    D->aux = s16;
    kq5_dec_2bit(b->qs, D);
    /* code = low 2 bits + 4 * (bit j of hmask[k]) in 0..7; the -4 goes through the bsums */
    kq5_add_bits(b->hmask, 4, D);
    D->d = kq5_f16(b->d);
}

static inline void kq5_dec_q6_k(const kq_block_q6_k *b, kq5_dec *D) {
    const __m256i s16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
    kq5_bcast16(s16, D->sc);
    D->aux = s16;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m6 = _mm512_set1_epi8(0x30);
    for (int c = 0; c < 2; c++) {
        /* ql[64c..64c+63] holds the low nibbles of sub-blocks 4c, 4c+1 (low 4 bits) and
         * 4c+2, 4c+3 (high 4 bits); qh[32c+k] bits 2s.. the high bits of sub-block 4c+s */
        const __m512i l = _mm512_loadu_si512(b->ql + 64 * c);
        const __m512i h = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qh + 32 * c)));
        /* 16-bit shifts that bring bits 2s.. to bits 4-5; the 0x30 mask drops what crosses bytes */
        const __m512i h01 = _mm512_and_si512(_mm512_sllv_epi16(h, _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1)), m6);
        const __m512i h23 = _mm512_and_si512(_mm512_srlv_epi16(h, _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1)), m6);
        /* code 0..63 = nibble | high bits << 4; the -32 goes through the bsums */
        D->q[2 * c] = _mm512_ternarylogic_epi64(l, m4, h01, 0xEA);                             /* (l & m4) | h01 */
        D->q[2 * c + 1] = _mm512_ternarylogic_epi64(_mm512_srli_epi16(l, 4), m4, h23, 0xEA);
    }
    D->d = kq5_f16(b->d);
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
    kq5_bcast8(kq5_iq4xs_scales(b), D->sc);
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
    D->d = kq5_f16(b->d);
}

/* ---------------------------------------------------------------- per-column integer sums */

static inline __m256i kq5_fold(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

static inline __m256i kq5_bsums_x(const kq5_dec *D, const act_q8_256 *x) {
    return _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)x->bsums), D->aux);
}

/* sum_p dpwssd(maddubs(q[p], x[64p..]), sc[p]) folded to the eight AVX2 lanes. */
static inline __m256i kq5_s_plain(const kq5_dec *D, const act_q8_256 *x) {
    __m512i acc = _mm512_madd_epi16(_mm512_maddubs_epi16(D->q[0], _mm512_loadu_si512(x->qs)), D->sc[0]);
    for (int p = 1; p < 4; p++)
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(D->q[p], _mm512_loadu_si512(x->qs + 64 * p)), D->sc[p]);
    return kq5_fold(acc);
}
/* Q3_K / Q6_K: codes carry +4 / +32, so S_l = dot_l - 4 (32) * (s_2l bsum_2l + s_2l+1 bsum_2l+1). */
static inline __m256i kq5_s_q3(const kq5_dec *D, const act_q8_256 *x) {
    return _mm256_sub_epi32(kq5_s_plain(D, x), _mm256_slli_epi32(kq5_bsums_x(D, x), 2));
}
static inline __m256i kq5_s_q6(const kq5_dec *D, const act_q8_256 *x) {
    return _mm256_sub_epi32(kq5_s_plain(D, x), _mm256_slli_epi32(kq5_bsums_x(D, x), 5));
}
/* IQ4_XS: |k| times x negated where k < 0. */
static inline __m256i kq5_s_iq4(const kq5_dec *D, const act_q8_256 *x) {
    __m512i acc = _mm512_setzero_si512();
    for (int p = 0; p < 4; p++) {
        const __m512i xv = _mm512_loadu_si512(x->qs + 64 * p);
        const __m512i xs = _mm512_mask_sub_epi8(xv, D->neg[p], _mm512_setzero_si512(), xv);
        acc = _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(D->q[p], xs), D->sc[p]);
    }
    return kq5_fold(acc);
}

/* ---------------------------------------------------------------- vec_dot */

/* As avx2_kquants.c's tile: per block and column, lane l of S (M) goes into lane l of acc
 * (accm) as kq_lane_step does it: fma(xd*d, S, acc). */
#define KQ5_VEC_DOT(NAME, BLOCK, DECODE, SVEC, HAS_MIN)                                            \
    static inline __attribute__((always_inline)) void kq5_tile_##NAME(                            \
        const BLOCK *w, int64_t nb, const char *xc, size_t x_stride, int nc, float *y) {           \
        __m256 acc[KQ5_COLS], accm[KQ5_COLS];                                                      \
        for (int c = 0; c < nc; c++) acc[c] = accm[c] = _mm256_setzero_ps();                       \
        for (int64_t b = 0; b < nb; b++) {                                                         \
            kq5_dec D;                                                                             \
            DECODE(&w[b], &D);                                                                     \
            const __m256 d8 = _mm256_set1_ps(D.d), dm8 = _mm256_set1_ps(HAS_MIN ? D.dmin : 0.0f);  \
            for (int c = 0; c < nc; c++) {                                                         \
                const act_q8_256 *x = (const act_q8_256 *)(xc + (size_t)c * x_stride) + b;         \
                const __m256 xd = _mm256_broadcast_ss(&x->d);                                      \
                acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(xd, d8), _mm256_cvtepi32_ps(SVEC(&D, x)), acc[c]); \
                if (HAS_MIN)                                                                       \
                    accm[c] = _mm256_fmadd_ps(_mm256_mul_ps(xd, dm8),                              \
                                              _mm256_cvtepi32_ps(kq5_bsums_x(&D, x)), accm[c]);    \
            }                                                                                      \
        }                                                                                          \
        for (int c = 0; c < nc; c++)                                                               \
            y[c] = strata_hsum8_avx2(HAS_MIN ? _mm256_sub_ps(acc[c], accm[c]) : acc[c]);           \
    }                                                                                              \
    void strata_avx512_vec_dot_##NAME(int64_t n, const void *vw, const void *vx, size_t x_stride,  \
                                      int ncols, float *y) {                                       \
        const int64_t nb = n / QK_K;                                                               \
        for (int c0 = 0; c0 < ncols; c0 += KQ5_COLS) {                                             \
            const int nc = ncols - c0 < KQ5_COLS ? ncols - c0 : KQ5_COLS;                          \
            const char *xc = (const char *)vx + (size_t)c0 * x_stride;                             \
            /* one column (decode): a constant nc lets everything stay in registers */            \
            if (nc == 1) kq5_tile_##NAME(vw, nb, xc, x_stride, 1, y + c0);                         \
            else kq5_tile_##NAME(vw, nb, xc, x_stride, nc, y + c0);                                \
        }                                                                                          \
    }

KQ5_VEC_DOT(q2_k, kq_block_q2_k, kq5_dec_q2_k, kq5_s_plain, 1)
KQ5_VEC_DOT(q3_k, kq_block_q3_k, kq5_dec_q3_k, kq5_s_q3, 0)
KQ5_VEC_DOT(q4_k, kq_block_q4_k, kq5_dec_q4_k, kq5_s_plain, 1)
KQ5_VEC_DOT(q5_k, kq_block_q5_k, kq5_dec_q5_k, kq5_s_plain, 1)
KQ5_VEC_DOT(q6_k, kq_block_q6_k, kq5_dec_q6_k, kq5_s_q6, 0)
KQ5_VEC_DOT(iq4_xs, kq_block_iq4_xs, kq5_dec_iq4_xs, kq5_s_iq4, 0)

#endif
