/* avx2_q8.h — helpers shared by the AVX2 dot products against act_q8_32 activations
 * (avx2_legacy.c, avx2_fp4.c). Include only from avx2_*.c.
 *
 * The dot products work on groups of 8 weight blocks, so that block b of a row lands in
 * lane b % 8 of a vector, which is the summation order fixed in quant/quant.h. One
 * column of a group costs: per block one maddubs+madd (8 int32 partial sums), then one
 * transpose-reduction (q8_reduce8) that leaves each block's exact integer sum in its lane. */
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
 * sum of p[k] lanes 4..7 (the two 16-value halves of a 32-value block). */
static inline void q8_reduce8_halves(const __m256i p[8], __m256i *lo, __m256i *hi) {
    const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    /* a = [k=0..3 halves lo | k=0..3 halves hi], b the same for k = 4..7 */
    *lo = _mm256_permute2x128_si256(a, b, 0x20);
    *hi = _mm256_permute2x128_si256(a, b, 0x31);
}

/* Lane k = the sum of all eight lanes of p[k] (exact). */
static inline __m256i q8_reduce8(const __m256i p[8]) {
    __m256i lo, hi;
    q8_reduce8_halves(p, &lo, &hi);
    return _mm256_add_epi32(lo, hi);
}

/* Lane k = y[step * k].d. */
static inline __m256 q8_act_d8(const act_q8_32 *y, int step) {
    const int s = step * (int)(sizeof(act_q8_32) / 4);
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(s));
    return _mm256_i32gather_ps(&y->d, idx, 4);
}

/* Lane k = y[k].sum. */
static inline __m256i q8_act_sum8(const act_q8_32 *y) {
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                           _mm256_set1_epi32((int)(sizeof(act_q8_32) / 4)));
    return _mm256_i32gather_epi32((const int *)&y->sum, idx, 4);
}

/* Lane k = the 4 bytes at p + k * ts (little-endian); ts >= 4. */
static inline __m256i q8_gather_u32(const uint8_t *p, int ts) {
    const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(ts));
    return _mm256_i32gather_epi32((const int *)p, idx, 1);
}

/* The low (hi16 = 0) or high (hi16 = 1) 16 bits of each lane, read as F16. */
static inline __m256 q8_f16_lanes(__m256i v, int hi16) {
    v = hi16 ? _mm256_srli_epi32(v, 16) : _mm256_and_si256(v, _mm256_set1_epi32(0xffff));
    const __m128i h = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    return _mm256_cvtph_ps(h);
}

/* 16 packed bytes -> 32 nibble codes: low nibbles first (values 0..15), then high nibbles
 * (values 16..31): the layout of Q4_0, Q4_1, Q5_x, IQ4_NL and MXFP4 blocks. */
static inline __m256i q8_nibbles(const uint8_t *qs) {
    const __m128i x = _mm_loadu_si128((const __m128i *)qs);
    const __m256i v = _mm256_set_m128i(_mm_srli_epi16(x, 4), x);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
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
