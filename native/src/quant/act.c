/* act.c — activation quantization to the formats quantized weights multiply against.
 * The scalar code is the definition; the AVX2 and AVX-512 code (kernels/cpu/avx2_act.c,
 * avx512_act.c) perform the same float operations, so all give identical blocks. NaN inputs
 * are ignored by the block maximum (fmaxf) and quantize to 0. */
#include "quant.h"
#include "../kernels/cpu/avx2.h"
#include "../kernels/cpu/avx512_act.h"

/* NaN (a NaN input, or inf * 0) becomes 0: converting it to an integer would be undefined. */
static int8_t act_round(float v) { return v == v ? (int8_t)(int32_t)nearbyintf(v) : 0; }

static void act_q8_32_scalar(const float *x, act_q8_32 *y, int64_t n) {
    for (int64_t b = 0; b < n / 32; b++) {
        const float *xb = x + b * 32;
        float amax = 0.0f;
        for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float id;
        const float d = strata_act_scale(amax, &id);
        int32_t sum = 0;
        for (int i = 0; i < 32; i++) {
            y[b].qs[i] = act_round(xb[i] * id);
            sum += y[b].qs[i];
        }
        y[b].d = strata_act_d_q8_32(d);
        y[b].sum = sum;
    }
}

static void act_q8_256_scalar(const float *x, act_q8_256 *y, int64_t n) {
    for (int64_t b = 0; b < n / QK_K; b++) {
        const float *xb = x + b * QK_K;
        float amax = 0.0f;
        for (int i = 0; i < QK_K; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float id;
        const float d = strata_act_scale(amax, &id);
        for (int j = 0; j < 16; j++) {
            int32_t s = 0;
            for (int i = 16 * j; i < 16 * j + 16; i++) {
                y[b].qs[i] = act_round(xb[i] * id);
                s += y[b].qs[i];
            }
            y[b].bsums[j] = (int16_t)s;
        }
        y[b].d = d;
    }
}

void strata_act_quantize_q8_32(const float *x, act_q8_32 *y, int64_t n, int isa) {
#if STRATA_HAVE_AVX512
    if (strata_isa_has_avx512(isa)) { strata_avx512_act_q8_32(x, y, n); return; }
#endif
#if STRATA_HAVE_AVX2
    if (strata_isa_has_avx2(isa)) { strata_avx2_act_q8_32(x, y, n); return; }
#endif
    (void)isa;
    act_q8_32_scalar(x, y, n);
}

void strata_act_quantize_q8_256(const float *x, act_q8_256 *y, int64_t n, int isa) {
#if STRATA_HAVE_AVX512
    if (strata_isa_has_avx512(isa)) { strata_avx512_act_q8_256(x, y, n); return; }
#endif
#if STRATA_HAVE_AVX2
    if (strata_isa_has_avx2(isa)) { strata_avx2_act_q8_256(x, y, n); return; }
#endif
    (void)isa;
    act_q8_256_scalar(x, y, n);
}

void strata_act_widen_q8_256(const act_q8_256 *x, int64_t n, int16_t *dst) {
    for (int64_t b = 0; b < n / QK_K; b++)
        for (int i = 0; i < QK_K; i++) dst[b * QK_K + i] = x[b].qs[i];
}
