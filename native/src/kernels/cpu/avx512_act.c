/* avx512_act.c — AVX-512 activation quantization: the operations of quant/act.c's scalar code, 16
 * values a register, so the same blocks (an integer code is one rounding of one product; a block's
 * maximum and integer sums do not depend on their order).
 *   - block maximum: |x| with NaN skipped (max_ps returns its second operand when either is NaN, as
 *     fmaxf ignores a NaN), then the register's sixteen lanes;
 *   - codes: x * id, NaN -> 0, rounded to nearest even (nearbyintf in the default mode), narrowed with
 *     signed saturation (|x * id| <= 127 up to the rounding of id, as packs saturates on AVX2);
 *   - sums: of a block (q8_32) or of each 16 values (q8_256's bsums): one register each.
 * Measured (2560 values, 1 thread, AMX host): q8_32 897 -> 825 ns against avx2_act.c, q8_256 811 -> 593 ns.
 * q8_32's blocks are bound by their two divisions and the register-wide max (strata_act_scale). */
#include "avx512_act.h"

#include <immintrin.h>

static inline __m512 abs_or_zero(__m512 v, __m512 m) {
    return _mm512_max_ps(_mm512_andnot_ps(_mm512_set1_ps(-0.0f), v), m); /* a NaN lane keeps m */
}

/* 16 codes of x * id, stored at q; returns their int32 lanes. */
static inline __m512i codes16(const float *x, __m512 vid, int8_t *q) {
    __m512 p = _mm512_mul_ps(_mm512_loadu_ps(x), vid);
    p = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(p, p, _CMP_ORD_Q), p); /* NaN -> 0 */
    const __m512i v = _mm512_cvt_roundps_epi32(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128((__m128i *)q, _mm512_cvtsepi32_epi8(v));
    return v;
}

void strata_avx512_act_q8_32(const float *x, act_q8_32 *y, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++) {
        const float *xb = x + b * 32;
        __m512 m = abs_or_zero(_mm512_loadu_ps(xb), _mm512_setzero_ps());
        m = abs_or_zero(_mm512_loadu_ps(xb + 16), m);
        float id;
        const float d = strata_act_scale(_mm512_reduce_max_ps(m), &id);
        const __m512 vid = _mm512_set1_ps(id);
        const __m512i s = _mm512_add_epi32(codes16(xb, vid, y[b].qs), codes16(xb + 16, vid, y[b].qs + 16));
        y[b].sum = _mm512_reduce_add_epi32(s);
        y[b].d = strata_act_d_q8_32(d);
    }
}

void strata_avx512_act_q8_256(const float *x, act_q8_256 *y, int64_t n) {
    for (int64_t b = 0; b < n / QK_K; b++) {
        const float *xb = x + b * QK_K;
        __m512 m0 = _mm512_setzero_ps(), m1 = _mm512_setzero_ps();
        for (int i = 0; i < QK_K; i += 32) {
            m0 = abs_or_zero(_mm512_loadu_ps(xb + i), m0);
            m1 = abs_or_zero(_mm512_loadu_ps(xb + i + 16), m1);
        }
        float id;
        const float d = strata_act_scale(_mm512_reduce_max_ps(_mm512_max_ps(m0, m1)), &id);
        const __m512 vid = _mm512_set1_ps(id);
        for (int j = 0; j < 16; j++)
            y[b].bsums[j] = (int16_t)_mm512_reduce_add_epi32(codes16(xb + 16 * j, vid, y[b].qs + 16 * j));
        y[b].d = d;
    }
}
