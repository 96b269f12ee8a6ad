/* avx2_act.c — AVX2 activation quantization; same operations as quant/act.c. */
#include "avx2.h"
#include "avx2_common.h"

/* Quantizes 8k floats with scale id into int8, returns their int32 sum. */
static inline int32_t quant_run(const float *x, int8_t *q, int n, float id) {
    const __m256 vid = _mm256_set1_ps(id);
    __m256i acc = _mm256_setzero_si256();
    for (int i = 0; i < n; i += 32) {
        __m256i v[4];
        for (int k = 0; k < 4; k++) {
            __m256 p = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * k), vid);
            p = _mm256_and_ps(p, _mm256_cmp_ps(p, p, _CMP_ORD_Q)); /* NaN -> 0 */
            v[k] = _mm256_cvtps_epi32(_mm256_round_ps(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            acc = _mm256_add_epi32(acc, v[k]);
        }
        /* pack 4x8 int32 -> 32 int8 in order */
        const __m256i a = _mm256_packs_epi32(v[0], v[1]);
        const __m256i b = _mm256_packs_epi32(v[2], v[3]);
        __m256i c = _mm256_packs_epi16(a, b);
        c = _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(q + i), c);
    }
    return strata_hsum_i32x8(acc);
}

static inline float amax_run(const float *x, int n) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    /* max_ps returns its second operand when either is NaN: NaN inputs are skipped, as fmaxf does */
    for (int i = 0; i < n; i += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), m);
    return strata_hmax8_avx2(m);
}

void strata_avx2_act_q8_32(const float *x, act_q8_32 *y, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++) {
        float id;
        const float d = strata_act_scale(amax_run(x + b * 32, 32), &id);
        y[b].sum = quant_run(x + b * 32, y[b].qs, 32, id);
        y[b].d = strata_act_d_q8_32(d);
    }
}

void strata_avx2_act_q8_256(const float *x, act_q8_256 *y, int64_t n) {
    for (int64_t b = 0; b < n / QK_K; b++) {
        const float *xb = x + b * QK_K;
        float id;
        const float d = strata_act_scale(amax_run(xb, QK_K), &id);
        quant_run(xb, y[b].qs, QK_K, id);
        for (int j = 0; j < 16; j++) {
            const __m128i q = _mm_loadu_si128((const __m128i *)(y[b].qs + 16 * j));
            const __m256i w = _mm256_cvtepi8_epi16(q);
            const __m256i s = _mm256_madd_epi16(w, _mm256_set1_epi16(1));
            y[b].bsums[j] = (int16_t)strata_hsum_i32x8(s);
        }
        y[b].d = d;
    }
}
