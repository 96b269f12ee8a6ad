/* avx2_float.c — AVX2 dequantization and dot products of F32, F16, BF16.
 * Same summation order as quant/fmt_float.c and the GEMM (gemm.h): element i into lane i % 8 by
 * FMA, i ascending, a padded last group of +0 * +0, then strata_hsum8_avx2. One chain per column:
 * dot2 and dot4 run two and four columns side by side for the FMA latency. */
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

/* The last n % 8 elements, padded to 8 with +0 weights (and +0 x by the caller): fma(+0, +0, acc) =
 * acc + 0, as the GEMM's padded group. */
static inline __m256 tail_w8(wfmt f, const uint8_t *w, int64_t rem) {
    uint8_t t[8 * 4] = {0};
    memcpy(t, w, (size_t)(rem * wf_size(f)));
    return wf_load8(f, t);
}

static inline __m256 tail_x8(const float *x, int64_t rem) {
    float t[8] = {0};
    memcpy(t, x, (size_t)rem * sizeof(float));
    return _mm256_loadu_ps(t);
}

/* Columns x[0..nc) (nc <= 4) against one weight row: each weight vector is decoded once. */
static inline void dotn(wfmt f, int64_t n, const uint8_t *w, const float *const *x, int nc, float *y) {
    const int es = wf_size(f);
    __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 wv = wf_load8(f, w + es * i);
        for (int c = 0; c < nc; c++) a[c] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[c] + i), a[c]);
    }
    if (i < n) {
        const __m256 wv = tail_w8(f, w + es * i, n - i);
        for (int c = 0; c < nc; c++) a[c] = _mm256_fmadd_ps(wv, tail_x8(x[c] + i, n - i), a[c]);
    }
    for (int c = 0; c < nc; c++) y[c] = strata_hsum8_avx2(a[c]);
}

static inline void vec_dot(wfmt f, int64_t n, const void *w, const void *x, size_t x_stride,
                           int ncols, float *y) {
    const char *xc = x;
    for (int c = 0; c < ncols; c += 4) {
        const int nc = ncols - c < 4 ? ncols - c : 4;
        const float *xs[4];
        for (int k = 0; k < nc; k++) xs[k] = (const float *)(xc + (size_t)(c + k) * x_stride);
        switch (nc) {   /* constant trip counts, so the accumulators stay in registers */
        case 1: dotn(f, n, w, xs, 1, y + c); break;
        case 2: dotn(f, n, w, xs, 2, y + c); break;
        case 3: dotn(f, n, w, xs, 3, y + c); break;
        default: dotn(f, n, w, xs, 4, y + c); break;
        }
    }
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
