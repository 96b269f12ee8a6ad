/* avx512_peak.c — the AVX-512 VNNI int8 multiply-accumulate peak (kernels/cpu/peak.c runs it on the
 * pool): vpdpbusd zmm, u8 x s8 products summed in fours into int32 lanes, 64 MACs per instruction.
 * The accumulator is the loop-carried operand (latency ~5 cycles, up to two per cycle on CPUs with
 * two 512-bit FMA ports), so twelve independent chains keep every port busy; with their twelve
 * operands they take 25 of the 32 zmm registers. */
#include <immintrin.h>
#include <stdint.h>

#if STRATA_HAVE_AVX512

#define PEAK_CHAINS 12

uint64_t strata_int8_peak_avx512(const uint8_t *w, const int8_t *a, int64_t iters, uint64_t *macs_per_iter) {
    const __m512i va = _mm512_loadu_si512((const void *)a);
    __m512i acc[PEAK_CHAINS];
    for (int k = 0; k < PEAK_CHAINS; k++) acc[k] = _mm512_setzero_si512();
    for (int64_t it = 0; it < iters; it++) {
        /* w may have changed as far as the compiler knows: the loads are redone every round */
        __asm__("" : "+r"(w));
        for (int k = 0; k < PEAK_CHAINS; k++)
            acc[k] = _mm512_dpbusd_epi32(acc[k], _mm512_loadu_si512((const void *)(w + 64 * k)), va);
    }
    __m512i s = acc[0];
    for (int k = 1; k < PEAK_CHAINS; k++) s = _mm512_add_epi32(s, acc[k]);
    *macs_per_iter = PEAK_CHAINS * 64;
    return (uint64_t)(uint32_t)_mm512_reduce_add_epi32(s);
}

#endif
