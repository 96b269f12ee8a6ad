/* avx2_q8.h — helpers shared by the AVX2 dot products against act_q8_32 activations
 * (avx2_legacy.c, avx2_fp4.c). Include only from avx2_*.c.
 *
 * The dot products work on groups of 8 weight blocks, so that block b of a row lands in
 * lane b % 8 of a vector, which is the summation order fixed in quant/quant.h. One
 * column of a group costs: per block one maddubs (+ madd where 16-bit sums could overflow),
 * then one transpose-reduction that leaves each block's exact integer sum in its lane.
 *
 * Measured on Zen 4 (the dev machine): the shuffle-class pipes (pshufb, psignb, shifts,
 * unpacks, vphadd*) are what limits these loops. vphaddd/vphaddw take two cycles each, so the
 * reductions transpose with unpack + add (13 single-cycle shuffles per 8 blocks instead of 6
 * hadds + 2 permutes: -5..10% per row); gathers are replaced by plain loads; and scale bytes
 * are packed in general-purpose registers (an empty asm keeps GCC from turning that packing
 * back into vector shuffles: -5% at one column). */
#ifndef STRATA_KERNELS_CPU_AVX2_Q8_H
#define STRATA_KERNELS_CPU_AVX2_Q8_H

#include <immintrin.h>

#include "../../quant/quant.h"

/* 32 unsigned weight operands times 32 int8 activations -> 8 int32, each the sum of four
 * consecutive products. Exact as long as no pair of products exceeds 32767 in magnitude
 * (maddubs saturates): callers keep the unsigned operand <= 128 and activations in
 * [-127, 127], i.e. at most 2 * 128 * 127 = 32512. */
static inline __m256i q8_dot_u8(__m256i wu, __m256i y) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(wu, y), _mm256_set1_epi16(1));
}

/* Signed weights: |w| as the unsigned operand, the sign of w moved onto y. */
static inline __m256i q8_dot_s8(__m256i wabs, __m256i wsgn, __m256i y) {
    return q8_dot_u8(wabs, _mm256_sign_epi8(y, wsgn));
}

/* p[k] = 8 int32 partial sums of block k. lo lane k = sum of p[k] lanes 0..3, hi lane k =
 * sum of p[k] lanes 4..7 (the two 16-value halves of a 32-value block). Each unpack step
 * pairs lanes of two vectors, so the adds never mix blocks. */
static inline void q8_reduce8_halves(const __m256i p[8], __m256i *lo, __m256i *hi) {
    __m256i r[4], q[2];
    for (int i = 0; i < 4; i++)
        r[i] = _mm256_add_epi32(_mm256_unpacklo_epi32(p[2 * i], p[2 * i + 1]), _mm256_unpackhi_epi32(p[2 * i], p[2 * i + 1]));
    for (int i = 0; i < 2; i++)
        q[i] = _mm256_add_epi32(_mm256_unpacklo_epi64(r[2 * i], r[2 * i + 1]), _mm256_unpackhi_epi64(r[2 * i], r[2 * i + 1]));
    *lo = _mm256_permute2x128_si256(q[0], q[1], 0x20);
    *hi = _mm256_permute2x128_si256(q[0], q[1], 0x31);
}

/* Lane k = the sum of all eight lanes of p[k] (exact). */
static inline __m256i q8_reduce8(const __m256i p[8]) {
    __m256i lo, hi;
    q8_reduce8_halves(p, &lo, &hi);
    return _mm256_add_epi32(lo, hi);
}

/* Half group: lane k (k < 4) = the sum of all eight lanes of p[k]; lanes 4..7 = 0. Same
 * unpack steps as q8_reduce8_halves on blocks 0..3 only; the two 128-bit halves then hold the
 * two 16-value halves of each block. */
static inline __m256i q8_reduce4(const __m256i p[4]) {
    __m256i r[2];
    for (int i = 0; i < 2; i++)
        r[i] = _mm256_add_epi32(_mm256_unpacklo_epi32(p[2 * i], p[2 * i + 1]), _mm256_unpackhi_epi32(p[2 * i], p[2 * i + 1]));
    const __m256i q = _mm256_add_epi32(_mm256_unpacklo_epi64(r[0], r[1]), _mm256_unpackhi_epi64(r[0], r[1]));
    return _mm256_zextsi128_si256(_mm_add_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1)));
}

/* Where a group's blocks are: weight block k at p + k * ts and activation block i at a + i,
 * or, for a row shorter than one group (nb < 8 blocks), at wk[k] and ak[i]: tables in which
 * the blocks past the row point to the zero blocks below. Nothing past the row is read and
 * no branch depends on nb inside the kernels; the lanes of the missing blocks are then
 * discarded by the caller. The other paths pass NULL tables (folded away). */
/* Byte 0 = 0x7f: as an MXFP4 scale that is 2^-1. E8M0 0 would be a subnormal float, and
 * arithmetic on subnormals can take a slow microcode assist on x86. Every other format reads
 * a zero or normal scale here. */
static _Alignas(32) const uint8_t q8_zero_block[64] = {0x7f};
static const act_q8_32 q8_zero_act;

static inline const uint8_t *q8_blk(const uint8_t *p, int ts, int k, const uint8_t *const *wk) {
    return wk ? wk[k] : p + k * ts;
}

static inline const act_q8_32 *q8_act_blk(const act_q8_32 *a, int i, const act_q8_32 *const *ak) {
    return ak ? ak[i] : a + i;
}

/* Tables for a partial group of rem weight blocks (apb activation blocks each). */
static inline void q8_partial_w(const uint8_t *p, int ts, int rem, const uint8_t *wk[8]) {
    for (int k = 0; k < 8; k++) wk[k] = k < rem ? p + k * ts : q8_zero_block;
}

static inline void q8_partial_a(const act_q8_32 *a, int n, const act_q8_32 *ak[16]) {
    for (int i = 0; i < 16; i++) ak[i] = i < n ? a + i : &q8_zero_act;
}

/* The activation scales (d) and code sums of blocks first, first + step, ...,
 * first + 7 * step; lane k for block first + step * k. Built from 64-bit loads of each
 * block's {d, sum} head: on Zen 4 and Intel cores eight separate loads cost a fraction of
 * one vpgatherdd. */
static inline void q8_act_ds8(const act_q8_32 *y, const act_q8_32 *const *yk, int first, int step,
                              __m256 *d, __m256i *sum) {
#define Q8_DS2(i, j) _mm_castpd_ps(_mm_loadh_pd(                                                      \
        _mm_castsi128_pd(_mm_loadl_epi64((const __m128i *)q8_act_blk(y, first + (i) * step, yk))),  \
        (const double *)q8_act_blk(y, first + (j) * step, yk)))
    /* each 128-bit half holds {d, sum} of two blocks */
    const __m256 a = _mm256_insertf128_ps(_mm256_castps128_ps256(Q8_DS2(0, 1)), Q8_DS2(4, 5), 1);
    const __m256 b = _mm256_insertf128_ps(_mm256_castps128_ps256(Q8_DS2(2, 3)), Q8_DS2(6, 7), 1);
#undef Q8_DS2
    *d = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
    if (sum) *sum = _mm256_castps_si256(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* The same for a half group (blocks first, first + step, ..., first + 3 * step in lanes
 * 0..3; lanes 4..7 = 0). */
static inline void q8_act_ds4(const act_q8_32 *y, const act_q8_32 *const *yk, int first, int step,
                              __m256 *d, __m256i *sum) {
#define Q8_DS2(i, j) _mm_castpd_ps(_mm_loadh_pd(                                                      \
        _mm_castsi128_pd(_mm_loadl_epi64((const __m128i *)q8_act_blk(y, first + (i) * step, yk))),  \
        (const double *)q8_act_blk(y, first + (j) * step, yk)))
    const __m128 a = Q8_DS2(0, 1), b = Q8_DS2(2, 3);
#undef Q8_DS2
    *d = _mm256_zextps128_ps256(_mm_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)));
    if (sum) *sum = _mm256_zextsi128_si256(_mm_castps_si128(_mm_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1))));
}

/* nk = 8: q8_act_ds8; nk = 4: q8_act_ds4 (nk is a constant at every call). */
static inline void q8_act_dsn(const act_q8_32 *y, const act_q8_32 *const *yk, int first, int step, int nk,
                              __m256 *d, __m256i *sum) {
    if (nk == 4) q8_act_ds4(y, yk, first, step, d, sum);
    else q8_act_ds8(y, yk, first, step, d, sum);
}

static inline __m256 q8_act_d8(const act_q8_32 *y, const act_q8_32 *const *yk, int first, int step) {
    __m256 d;
    q8_act_ds8(y, yk, first, step, &d, NULL);
    return d;
}

/* Lane k = the 4 bytes at the start of weight block k. Packed in general-purpose registers
 * (idle in these loops) instead of a gather. */
static inline __m256i q8_load_u32x8(const uint8_t *p, int ts, const uint8_t *const *wk) {
    uint64_t v[4];
    for (int k = 0; k < 4; k++)
        v[k] = (uint64_t)strata_rd_u32(q8_blk(p, ts, 2 * k, wk)) |
               (uint64_t)strata_rd_u32(q8_blk(p, ts, 2 * k + 1, wk)) << 32;
    __asm__("" : "+r"(v[0]), "+r"(v[1]), "+r"(v[2]), "+r"(v[3]));
    return _mm256_setr_epi64x((long long)v[0], (long long)v[1], (long long)v[2], (long long)v[3]);
}

/* Lane k = the F16 at byte off of weight block k. */
static inline __m256 q8_load_f16x8(const uint8_t *p, int ts, int off, const uint8_t *const *wk) {
    uint64_t v[2] = {0, 0};
    for (int k = 0; k < 8; k++) v[k / 4] |= (uint64_t)strata_rd_u16(q8_blk(p, ts, k, wk) + off) << (16 * (k % 4));
    __asm__("" : "+r"(v[0]), "+r"(v[1]));
    return _mm256_cvtph_ps(_mm_set_epi64x((long long)v[1], (long long)v[0]));
}

/* Half group: lane k < 4 = the F16 at byte off of weight block k; lanes 4..7 = 0. */
static inline __m256 q8_load_f16x4(const uint8_t *p, int ts, int off, const uint8_t *const *wk) {
    uint64_t v = 0;
    for (int k = 0; k < 4; k++) v |= (uint64_t)strata_rd_u16(q8_blk(p, ts, k, wk) + off) << (16 * k);
    __asm__("" : "+r"(v));
    return _mm256_zextps128_ps256(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)v)));
}

/* Half group: lane k < 4 = the 4 bytes at the start of weight block k; lanes 4..7 = 0. */
static inline __m256i q8_load_u32x4(const uint8_t *p, int ts, const uint8_t *const *wk) {
    uint64_t v[2];
    for (int k = 0; k < 2; k++)
        v[k] = (uint64_t)strata_rd_u32(q8_blk(p, ts, 2 * k, wk)) |
               (uint64_t)strata_rd_u32(q8_blk(p, ts, 2 * k + 1, wk)) << 32;
    __asm__("" : "+r"(v[0]), "+r"(v[1]));
    return _mm256_zextsi128_si256(_mm_set_epi64x((long long)v[1], (long long)v[0]));
}

/* 16 packed bytes -> 32 nibble codes: low nibbles first (values 0..15), then high nibbles
 * (values 16..31): the layout of Q4_0, Q4_1, Q5_x, IQ4_NL and MXFP4 blocks. The bytes are
 * broadcast to both halves and the upper half shifted by 4 (bits crossing into a neighbour
 * byte are masked off). */
static inline __m256i q8_nibbles(const uint8_t *qs) {
    const __m256i x = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qs));
    const __m256i v = _mm256_srlv_epi32(x, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
}

/* Reductions of maddubs outputs in 16-bit lanes, cheaper than madd + 32-bit sums. m[k] = the
 * 16 int16 pair sums of block k (maddubs, no madd). Exact only while every 16 products of a
 * 128-bit half fit in int16 (the adds wrap): the caller checks its value ranges.
 *
 * q8_hsum16x8_16: int16 lane k of the low 128 bits = sum of m[k]'s low 128 bits (16
 * products), lane 8 + k = the same for the high 128 bits. */
static inline __m256i q8_hsum16x8_16(const __m256i m[8]) {
    __m256i r[4], q[2];
    for (int i = 0; i < 4; i++)
        r[i] = _mm256_add_epi16(_mm256_unpacklo_epi16(m[2 * i], m[2 * i + 1]), _mm256_unpackhi_epi16(m[2 * i], m[2 * i + 1]));
    for (int i = 0; i < 2; i++)
        q[i] = _mm256_add_epi16(_mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]), _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]));
    return _mm256_add_epi16(_mm256_unpacklo_epi64(q[0], q[1]), _mm256_unpackhi_epi64(q[0], q[1]));
}

/* Lane k = the total of block k (32 products) from maddubs outputs; |16 products| <= 32767. */
static inline __m256i q8_reduce8_i16_16(const __m256i m[8]) {
    const __m256i r = q8_hsum16x8_16(m);
    return _mm256_add_epi32(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(r)),
                            _mm256_cvtepi16_epi32(_mm256_extracti128_si256(r, 1)));
}

/* The float part of a group for one column, lane k = block k: acc = fma(a0, b0, acc), then
 * (for formats with a second term) acc = fma(a1, b1, acc). Kept apart from the integer work
 * so that the last group of a row can be moved to its lanes first (q8_rotate). */
typedef struct {
    __m256 a0, b0, a1, b1;
} q8_terms;

static inline __m256 q8_apply(q8_terms t, int two, __m256 acc) {
    acc = _mm256_fmadd_ps(t.a0, t.b0, acc);
    return two ? _mm256_fmadd_ps(t.a1, t.b1, acc) : acc;
}

/* A row of nb >= 8 blocks whose last rem = nb % 8 blocks do not fill a group ends with a
 * group of its last nk blocks (nk = 8, or a half group of 4 when rem <= 4; overlapping the
 * previous group where rem < nk): its lane k holds block nb - nk + k. The new blocks
 * nb - rem + j belong in lane j, i.e. lane j takes lane (j + nk - rem) % nk; the caller keeps
 * lanes < rem only. */
static inline q8_terms q8_rotate(q8_terms t, int two, int rem, int nk) {
    if (rem == nk) return t;
    const __m256i idx = _mm256_and_si256(_mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                                          _mm256_set1_epi32(nk - rem)), _mm256_set1_epi32(nk - 1));
    t.a0 = _mm256_permutevar8x32_ps(t.a0, idx);
    t.b0 = _mm256_permutevar8x32_ps(t.b0, idx);
    if (two) {
        t.a1 = _mm256_permutevar8x32_ps(t.a1, idx);
        t.b1 = _mm256_permutevar8x32_ps(t.b1, idx);
    }
    return t;
}

/* First k lanes set (k in 0..8). */
static inline __m256 q8_lane_mask(int k) {
    return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}

/* 32 int8 values times a scale -> 32 floats (d * v, one rounding each, like gguf.quants). */
static inline void q8_store_scaled(__m256i v, __m256 d, float *dst) {
    const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    _mm256_storeu_ps(dst + 0, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo))));
    _mm256_storeu_ps(dst + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))));
    _mm256_storeu_ps(dst + 16, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi))));
    _mm256_storeu_ps(dst + 24, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))));
}

/* A 16-entry int8 table in both 128-bit lanes, for _mm256_shuffle_epi8 lookups. */
static inline __m256i q8_table16(const int8_t *t) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)t));
}

#endif
