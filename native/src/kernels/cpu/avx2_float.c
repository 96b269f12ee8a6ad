/* avx2_float.c — AVX2 dequantization and dot products of F32, F16, BF16.
 * Same summation order as quant/fmt_float.c: element i into lane i % 32 by FMA, lanes folded
 * as (l + l+8) + (l+16 + l+24), then strata_hsum8_avx2. */
#include "avx2_float.h"
#include "avx2_common.h"

typedef enum { WF_F32, WF_F16, WF_BF16 } wfmt;

static inline int wf_size(wfmt f) { return f == WF_F32 ? 4 : 2; }

/* Eight weights starting at byte p, as floats. */
static inline __m256 wf_load8(wfmt f, const uint8_t *p) {
    switch (f) {
    case WF_F32: return _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)p));
    case WF_F16: return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    default:
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
    }
}

void strata_avx2_dequant_f16(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, wf_load8(WF_F16, p + 2 * i));
    for (; i < n; i++) dst[i] = _cvtsh_ss(strata_rd_u16(p + 2 * i));
}

void strata_avx2_dequant_bf16(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, wf_load8(WF_BF16, p + 2 * i));
    for (; i < n; i++) dst[i] = strata_bf16_to_fp32(strata_rd_u16(p + 2 * i));
}

/* The last n % 32 elements, padded to 32: weights with -0.0 and x with +0.0, so that the
 * padded lanes do fma(-0, +0, acc) == acc exactly (also for acc == -0), as if untouched. */
typedef struct {
    uint8_t w[32 * 4];
    float x[2][32];
} float_tail;

static inline void tail_weights(wfmt f, const uint8_t *w, int64_t rem, float_tail *t) {
    const int es = wf_size(f);
    for (int i = 0; i < 32; i++) {
        if (i < rem) {
            memcpy(t->w + es * i, w + es * i, (size_t)es);
        } else if (es == 4) {
            const uint32_t negzero = 0x80000000u;
            memcpy(t->w + 4 * i, &negzero, 4);
        } else {
            const uint16_t negzero = 0x8000u; /* -0 in F16 and in BF16 */
            memcpy(t->w + 2 * i, &negzero, 2);
        }
    }
}

static inline void tail_x(const float *x, int64_t rem, float *dst) {
    for (int i = 0; i < 32; i++) dst[i] = i < rem ? x[i] : 0.0f;
}

static inline float fold4(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    return strata_hsum8_avx2(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

/* One column. */
static inline float dot1(wfmt f, int64_t n, const uint8_t *w, const float *x) {
    const int es = wf_size(f);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const uint8_t *p = w + es * i;
        a0 = _mm256_fmadd_ps(wf_load8(f, p), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(wf_load8(f, p + 8 * es), _mm256_loadu_ps(x + i + 8), a1);
        a2 = _mm256_fmadd_ps(wf_load8(f, p + 16 * es), _mm256_loadu_ps(x + i + 16), a2);
        a3 = _mm256_fmadd_ps(wf_load8(f, p + 24 * es), _mm256_loadu_ps(x + i + 24), a3);
    }
    if (i < n) {
        float_tail t;
        tail_weights(f, w + es * i, n - i, &t);
        tail_x(x + i, n - i, t.x[0]);
        a0 = _mm256_fmadd_ps(wf_load8(f, t.w), _mm256_loadu_ps(t.x[0]), a0);
        a1 = _mm256_fmadd_ps(wf_load8(f, t.w + 8 * es), _mm256_loadu_ps(t.x[0] + 8), a1);
        a2 = _mm256_fmadd_ps(wf_load8(f, t.w + 16 * es), _mm256_loadu_ps(t.x[0] + 16), a2);
        a3 = _mm256_fmadd_ps(wf_load8(f, t.w + 24 * es), _mm256_loadu_ps(t.x[0] + 24), a3);
    }
    return fold4(a0, a1, a2, a3);
}

/* Two columns: each weight vector is decoded once and used twice (8 accumulators). */
static inline void dot2(wfmt f, int64_t n, const uint8_t *w, const float *x, const float *z, float *y) {
    const int es = wf_size(f);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const uint8_t *p = w + es * i;
        const __m256 w0 = wf_load8(f, p), w1 = wf_load8(f, p + 8 * es);
        const __m256 w2 = wf_load8(f, p + 16 * es), w3 = wf_load8(f, p + 24 * es);
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), a0);
        b0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(z + i), b0);
        a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), a1);
        b1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(z + i + 8), b1);
        a2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(x + i + 16), a2);
        b2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(z + i + 16), b2);
        a3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(x + i + 24), a3);
        b3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(z + i + 24), b3);
    }
    if (i < n) {
        float_tail t;
        tail_weights(f, w + es * i, n - i, &t);
        tail_x(x + i, n - i, t.x[0]);
        tail_x(z + i, n - i, t.x[1]);
        const __m256 w0 = wf_load8(f, t.w), w1 = wf_load8(f, t.w + 8 * es);
        const __m256 w2 = wf_load8(f, t.w + 16 * es), w3 = wf_load8(f, t.w + 24 * es);
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(t.x[0]), a0);
        b0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(t.x[1]), b0);
        a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(t.x[0] + 8), a1);
        b1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(t.x[1] + 8), b1);
        a2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(t.x[0] + 16), a2);
        b2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(t.x[1] + 16), b2);
        a3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(t.x[0] + 24), a3);
        b3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(t.x[1] + 24), b3);
    }
    y[0] = fold4(a0, a1, a2, a3);
    y[1] = fold4(b0, b1, b2, b3);
}

static inline void vec_dot(wfmt f, int64_t n, const void *w, const void *x, size_t x_stride,
                           int ncols, float *y) {
    const char *xc = x;
    int c = 0;
    for (; c + 2 <= ncols; c += 2)
        dot2(f, n, w, (const float *)(xc + (size_t)c * x_stride),
             (const float *)(xc + (size_t)(c + 1) * x_stride), y + c);
    if (c < ncols) y[c] = dot1(f, n, w, (const float *)(xc + (size_t)c * x_stride));
}

void strata_avx2_vec_dot_f32(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    vec_dot(WF_F32, n, w, x, x_stride, ncols, y);
}

void strata_avx2_vec_dot_f16(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    vec_dot(WF_F16, n, w, x, x_stride, ncols, y);
}

void strata_avx2_vec_dot_bf16(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y) {
    vec_dot(WF_BF16, n, w, x, x_stride, ncols, y);
}
