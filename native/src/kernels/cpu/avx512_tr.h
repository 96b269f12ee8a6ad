/* avx512_tr.h — the 16 x 8 dword transpose of the several-column kernels (avx512_q8.h z8r_decode: a
 * block of 16 weight rows; amx_legacy.c: a block of 16 columns as a B tile). Include only from files
 * built with AVX-512 F (avx512_*.c, amx_*.c). */
#ifndef STRATA_KERNELS_CPU_AVX512_TR_H
#define STRATA_KERNELS_CPU_AVX512_TR_H

#include <immintrin.h>

/* v[i]: row i in the low 256 bits, row i + 8 in the high (8 dwords each) -> out[k] (64-byte aligned):
 * lane r = row r's dword k. An 8 x 8 dword transpose per half (unpacks), then the halves' 128-bit
 * lanes put in row order (permutes). */
static inline void strata_tr16x8_epi32(const __m512i v[8], __m512i *out) {
    __m512i t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    /* u[4h + i], i < 4: 128-bit lanes = rows 4h..4h+3 (and 8 + 4h..) of dwords i, 4 + i */
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm512_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 1] = _mm512_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
        u[4 * h + 2] = _mm512_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
        u[4 * h + 3] = _mm512_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
    }
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    for (int i = 0; i < 4; i++) {
        _mm512_store_si512(&out[i], _mm512_permutex2var_epi64(u[i], lo, u[4 + i]));
        _mm512_store_si512(&out[4 + i], _mm512_permutex2var_epi64(u[i], hi, u[4 + i]));
    }
}

#endif
