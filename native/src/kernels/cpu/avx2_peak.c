/* avx2_peak.c — the AVX2 int8 multiply-accumulate peak (kernels/cpu/peak.c runs it on the pool).
 *
 * The instruction sequence of the AVX2 int8 dot products: vpmaddubsw (u8 x s8 -> pairs summed to
 * int16: 32 MACs per 256-bit instruction) + vpmaddwd against ones (int16 pairs -> int32) + vpaddd
 * into the accumulator. Only the vpaddd is loop-carried (latency 1), so the chains are there to
 * give the two multiply ports independent work, not to hide a long latency: eight leave room in
 * the 16 ymm registers for the operands (more would spill). */
#include <immintrin.h>
#include <stdint.h>

#define PEAK_CHAINS 8

uint64_t strata_int8_peak_avx2(const uint8_t *w, const int8_t *a, int64_t iters, uint64_t *macs_per_iter) {
    const __m256i va = _mm256_loadu_si256((const __m256i *)a);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[PEAK_CHAINS];
    for (int k = 0; k < PEAK_CHAINS; k++) acc[k] = _mm256_setzero_si256();
    for (int64_t it = 0; it < iters; it++) {
        /* w may have changed as far as the compiler knows: the products cannot be hoisted out */
        __asm__("" : "+r"(w));
        for (int k = 0; k < PEAK_CHAINS; k++) {
            const __m256i p = _mm256_maddubs_epi16(_mm256_loadu_si256((const __m256i *)(w + 32 * k)), va);
            acc[k] = _mm256_add_epi32(acc[k], _mm256_madd_epi16(p, ones));
        }
    }
    __m256i s = acc[0];
    for (int k = 1; k < PEAK_CHAINS; k++) s = _mm256_add_epi32(s, acc[k]);
    *macs_per_iter = PEAK_CHAINS * 32;
    return (uint64_t)(uint32_t)_mm256_extract_epi32(s, 0) + (uint64_t)(uint32_t)_mm256_extract_epi32(s, 7);
}
