/* avx2_common.h — helpers shared by the AVX2 kernel files (include only from avx2_*.c). */
#ifndef STRATA_AVX2_COMMON_H
#define STRATA_AVX2_COMMON_H

#include <immintrin.h>

/* Same order as strata_hsum8(): ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)). */
static inline float strata_hsum8_avx2(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* s0..s3 */
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));            /* s0+s2, s1+s3 */
    s = _mm_add_ss(s, _mm_movehdup_ps(s));             /* (s0+s2)+(s1+s3) */
    return _mm_cvtss_f32(s);
}

/* Sum of eight int32 lanes (exact). */
static inline int32_t strata_hsum_i32x8(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

/* Max of eight floats. */
static inline float strata_hmax8_avx2(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

#endif
