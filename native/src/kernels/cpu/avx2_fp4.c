/* avx2_fp4.c — AVX2 dequantization and dot products of IQ4_NL, MXFP4, NVFP4.
 * Layouts and the float operations per block: quant/fmt_fp4.c (done here in the same order,
 * so results match the scalar reference bit for bit).
 *
 * Codes become values with one byte shuffle per 32 codes; the signed values are multiplied
 * as |v| (unsigned, <= 127) times the activations carrying v's sign. Rows are walked in
 * groups of 8 blocks (block b -> lane b % 8), each decoded once and applied to every column.
 */
#include "avx2_fp4.h"
#include "avx2_common.h"
#include "avx2_q8.h"
#include "quant_tables.h"

typedef enum { F4_IQ4_NL, F4_MXFP4, F4_NVFP4 } f4fmt;

enum { F4_MAX_COLS = 16 };

static inline int f4_ts(f4fmt f) { return f == F4_IQ4_NL ? 18 : f == F4_MXFP4 ? 17 : 36; }

static inline const int8_t *f4_table(f4fmt f) {
    return f == F4_IQ4_NL ? strata_kvalues_iq4nl : f == F4_MXFP4 ? strata_kvalues_mxfp4 : strata_kvalues_nvfp4;
}

/* The 32 codes of NVFP4 half h (sub-blocks 2h, 2h+1) in value order. */
static inline __m256i nv_codes(const uint8_t *p, int h) {
    const __m128i x = _mm_loadu_si128((const __m128i *)(p + 4 + 16 * h));
    const __m128i m = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(x, m), hi = _mm_and_si128(_mm_srli_epi16(x, 4), m);
    /* sub-block 2h: low nibbles of bytes 0..7, then their high nibbles; 2h+1: bytes 8..15 */
    return _mm256_set_m128i(_mm_unpackhi_epi64(lo, hi), _mm_unpacklo_epi64(lo, hi));
}

/* Lane k: the E8M0 byte of lane k (low 8 bits) as strata_e8m0_half does. */
static inline __m256 e8m0_half8(__m256i v) {
    const __m256i e = _mm256_and_si256(v, _mm256_set1_epi32(0xff));
    const __m256i small = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    const __m256i big = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
    const __m256i is_small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(big, small, is_small));
}

/* Lane k: byte j of lane k decoded as strata_ue4m3_half does. */
static inline __m256 ue4m3_half8(__m256i v, int j) {
    const __m256i x = _mm256_and_si256(_mm256_srli_epi32(v, 8 * j), _mm256_set1_epi32(0xff));
    const __m256i e = _mm256_and_si256(_mm256_srli_epi32(x, 3), _mm256_set1_epi32(0x0f));
    const __m256i m = _mm256_and_si256(x, _mm256_set1_epi32(0x07));
    const __m256i normal = _mm256_or_si256(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(119)), 23),
                                           _mm256_slli_epi32(m, 20));
    const __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(m), _mm256_set1_ps(0x1p-10f));
    const __m256 is_sub = _mm256_castsi256_ps(_mm256_cmpeq_epi32(e, _mm256_setzero_si256()));
    const __m256 r = _mm256_blendv_ps(_mm256_castsi256_ps(normal), sub, is_sub);
    const __m256 is_nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(x, _mm256_set1_epi32(0x7f)));
    return _mm256_andnot_ps(is_nan, r);
}

/* ---------------------------------------------------------------- dequantization */

/* 32 int8 values, the first 16 times d0, the last 16 times d1. */
static inline void store_scaled2(__m256i v, __m256 d0, __m256 d1, float *dst) {
    const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
    _mm256_storeu_ps(dst + 0, _mm256_mul_ps(d0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo))));
    _mm256_storeu_ps(dst + 8, _mm256_mul_ps(d0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))));
    _mm256_storeu_ps(dst + 16, _mm256_mul_ps(d1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi))));
    _mm256_storeu_ps(dst + 24, _mm256_mul_ps(d1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))));
}

void strata_avx2_dequant_iq4_nl(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    const __m256i tab = q8_table16(strata_kvalues_iq4nl);
    for (int64_t b = 0; b < n / 32; b++, p += 18, dst += 32)
        q8_store_scaled(_mm256_shuffle_epi8(tab, q8_nibbles(p + 2)), _mm256_set1_ps(_cvtsh_ss(strata_rd_u16(p))), dst);
}

void strata_avx2_dequant_mxfp4(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    const __m256i tab = q8_table16(strata_kvalues_mxfp4);
    for (int64_t b = 0; b < n / 32; b++, p += 17, dst += 32)
        q8_store_scaled(_mm256_shuffle_epi8(tab, q8_nibbles(p + 1)), _mm256_set1_ps(strata_e8m0_half(p[0])), dst);
}

void strata_avx2_dequant_nvfp4(const void *src, float *dst, int64_t n) {
    const uint8_t *p = src;
    const __m256i tab = q8_table16(strata_kvalues_nvfp4);
    for (int64_t b = 0; b < n / 64; b++, p += 36, dst += 64) {
        for (int h = 0; h < 2; h++) {
            const __m256i v = _mm256_shuffle_epi8(tab, nv_codes(p, h));
            store_scaled2(v, _mm256_set1_ps(strata_ue4m3_half(p[2 * h])),
                          _mm256_set1_ps(strata_ue4m3_half(p[2 * h + 1])), dst + 32 * h);
        }
    }
}

/* ---------------------------------------------------------------- dot products */

/* Eight blocks, decoded once for all columns. IQ4_NL/MXFP4 use the first 8 entries of wu/ws
 * (one per block); NVFP4 uses 16: entry 2k + h is half h (32 values) of block k. */
typedef struct {
    __m256i wu[16]; /* |value| (maddubs unsigned operand) */
    __m256i ws[16]; /* value (sign source) */
    __m256 d[4];    /* IQ4_NL/MXFP4: d[0] lane k = scale of block k; NVFP4: d[j] = s_j */
} f4_group;

static inline void f4_decode(f4fmt f, const uint8_t *p, f4_group *g, __m256i tab, __m256i atab) {
    const int ts = f4_ts(f);
    const __m256i s = q8_gather_u32(p, ts);
    if (f == F4_NVFP4) {
        for (int k = 0; k < 8; k++) {
            for (int h = 0; h < 2; h++) {
                const __m256i c = nv_codes(p + k * ts, h);
                g->wu[2 * k + h] = _mm256_shuffle_epi8(atab, c);
                g->ws[2 * k + h] = _mm256_shuffle_epi8(tab, c);
            }
        }
        for (int j = 0; j < 4; j++) g->d[j] = ue4m3_half8(s, j);
        return;
    }
    const int off = f == F4_IQ4_NL ? 2 : 1;
    for (int k = 0; k < 8; k++) {
        const __m256i c = q8_nibbles(p + k * ts + off);
        g->wu[k] = _mm256_shuffle_epi8(atab, c);
        g->ws[k] = _mm256_shuffle_epi8(tab, c);
    }
    g->d[0] = f == F4_IQ4_NL ? q8_f16_lanes(s, 0) : e8m0_half8(s);
}

/* acc += the float parts of the group's 8 blocks; a = the group's first activation block. */
static inline __m256 f4_col(f4fmt f, const f4_group *g, const act_q8_32 *a, __m256 acc) {
    if (f != F4_NVFP4) {
        __m256i p[8];
        for (int k = 0; k < 8; k++)
            p[k] = q8_dot_s8(g->wu[k], g->ws[k], _mm256_loadu_si256((const __m256i *)a[k].qs));
        const __m256 sumi = _mm256_cvtepi32_ps(q8_reduce8(p));
        return _mm256_fmadd_ps(_mm256_mul_ps(g->d[0], q8_act_d8(a, 1)), sumi, acc);
    }
    __m256 fi[4];
    for (int h = 0; h < 2; h++) {
        __m256i p[8], lo, hi;
        for (int k = 0; k < 8; k++)
            p[k] = q8_dot_s8(g->wu[2 * k + h], g->ws[2 * k + h],
                             _mm256_loadu_si256((const __m256i *)a[2 * k + h].qs));
        q8_reduce8_halves(p, &lo, &hi); /* lane k: sub-blocks 2h and 2h+1 of block k */
        fi[2 * h] = _mm256_cvtepi32_ps(lo);
        fi[2 * h + 1] = _mm256_cvtepi32_ps(hi);
    }
    const __m256 t0 = _mm256_fmadd_ps(g->d[0], fi[0], _mm256_mul_ps(g->d[1], fi[1]));
    const __m256 t1 = _mm256_fmadd_ps(g->d[2], fi[2], _mm256_mul_ps(g->d[3], fi[3]));
    acc = _mm256_fmadd_ps(t0, q8_act_d8(a, 2), acc);
    return _mm256_fmadd_ps(t1, q8_act_d8(a + 1, 2), acc);
}

static inline void f4_vec_dot(f4fmt f, int64_t n, const void *w, const void *x, size_t x_stride,
                              int ncols, float *y) {
    const int ts = f4_ts(f);
    const int bs = f == F4_NVFP4 ? 64 : 32;
    const int apb = bs / 32; /* activation blocks per weight block */
    const int64_t nb = n / bs;
    const uint8_t *wp = w;
    const __m256i tab = q8_table16(f4_table(f));
    const __m256i atab = _mm256_abs_epi8(tab);
    for (int c0 = 0; c0 < ncols; c0 += F4_MAX_COLS) {
        const int nc = ncols - c0 < F4_MAX_COLS ? ncols - c0 : F4_MAX_COLS;
        const act_q8_32 *xa[F4_MAX_COLS];
        __m256 acc[F4_MAX_COLS];
        for (int c = 0; c < nc; c++) {
            xa[c] = (const act_q8_32 *)((const char *)x + (size_t)(c0 + c) * x_stride);
            acc[c] = _mm256_setzero_ps();
        }
        f4_group g;
        int64_t b = 0;
        for (; b + 8 <= nb; b += 8) {
            f4_decode(f, wp + b * ts, &g, tab, atab);
            for (int c = 0; c < nc; c++) acc[c] = f4_col(f, &g, xa[c] + b * apb, acc[c]);
        }
        if (b < nb) {
            /* Last partial group: zero-padded copies; padded lanes are blended away so they
             * stay exactly as the scalar code leaves them (untouched). */
            const int rem = (int)(nb - b);
            uint8_t wbuf[8 * 36] = {0};
            memcpy(wbuf, wp + b * ts, (size_t)rem * (size_t)ts);
            f4_decode(f, wbuf, &g, tab, atab);
            const __m256 keep = q8_lane_mask(rem);
            for (int c = 0; c < nc; c++) {
                act_q8_32 abuf[16];
                memset(abuf, 0, sizeof abuf);
                memcpy(abuf, xa[c] + b * apb, (size_t)(rem * apb) * sizeof(act_q8_32));
                acc[c] = _mm256_blendv_ps(acc[c], f4_col(f, &g, abuf, acc[c]), keep);
            }
        }
        for (int c = 0; c < nc; c++) y[c0 + c] = strata_hsum8_avx2(acc[c]);
    }
}

void strata_avx2_vec_dot_iq4_nl(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    f4_vec_dot(F4_IQ4_NL, n, w, x, xs, nc, y);
}
void strata_avx2_vec_dot_mxfp4(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    f4_vec_dot(F4_MXFP4, n, w, x, xs, nc, y);
}
void strata_avx2_vec_dot_nvfp4(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    f4_vec_dot(F4_NVFP4, n, w, x, xs, nc, y);
}
