/* avx512_legacy.c — AVX-512 dot products of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (the driver, the
 * integer scheme and the float order: avx512_q8.h; the formats: quant/fmt_legacy.c).
 * Dequantization keeps the AVX2 path's (memory-bound; nothing to gain). */
#include "avx512_legacy.h"
#include "avx512_q8.h"
#include "avx2_legacy.h"

/* Unsigned operands of blocks i and i + 4 (see avx512_q8.h: codes, or Q8_0's q ^ 0x80). */
static inline __m512i zl_operands(z8fmt f, const uint8_t *a, const uint8_t *b) {
    switch (f) {
    case Z8_Q4_0: return z8_nibbles2(a + 2, b + 2);
    case Z8_Q4_1: return z8_nibbles2(a + 4, b + 4);
    case Z8_Q5_0:
    case Z8_Q5_1: {
        /* qh bit j = bit 4 of value j: one mask bit per byte of the two blocks */
        const int o = f == Z8_Q5_0 ? 2 : 4;
        const __m512i q = z8_nibbles2(a + o + 4, b + o + 4);
        const __mmask64 hi = (__mmask64)strata_rd_u32(a + o) | (__mmask64)strata_rd_u32(b + o) << 32;
        return _mm512_mask_add_epi8(q, hi, q, _mm512_set1_epi8(0x10));
    }
    default: return _mm512_xor_si512(z8_load2x32(a + 2, b + 2), _mm512_set1_epi8((char)0x80));
    }
}

static inline void z8_decode(z8fmt f, const uint8_t *p, const uint8_t *const *wk, z8_group *g) {
    const int ts = z8_ts(f);
    for (int i = 0; i < 4; i++) g->w[i] = zl_operands(f, q8_blk(p, ts, i, wk), q8_blk(p, ts, i + 4, wk));
    g->d = q8_load_f16x8(p, ts, 0, wk);
    g->m = z8_has_min(f) ? q8_load_f16x8(p, ts, 2, wk) : _mm256_setzero_ps();
}

/* The block's 32 operands in value order (z8_rows; the same numbers as zl_operands). */
static inline __m256i z8_values(z8fmt f, const uint8_t *p) {
    switch (f) {
    case Z8_Q4_0: return q8_nibbles(p + 2);
    case Z8_Q4_1: return q8_nibbles(p + 4);
    case Z8_Q5_0:
    case Z8_Q5_1: {
        const int o = f == Z8_Q5_0 ? 2 : 4;
        const __m256i q = q8_nibbles(p + o + 4);
        return _mm256_mask_add_epi8(q, (__mmask32)strata_rd_u32(p + o), q, _mm256_set1_epi8(0x10));
    }
    default: return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + 2)), _mm256_set1_epi8((char)0x80));
    }
}

static inline void z8_scales16(z8fmt f, __m512i raw, __m512 *d, __m512 *m) {
    *d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(raw));
    *m = z8_has_min(f) ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(raw, 16))) : _mm512_setzero_ps();
}

void strata_avx512_vec_dot_q4_0(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    z8_vec_dot(Z8_Q4_0, n, w, x, xs, nc, y);
}
void strata_avx512_vec_dot_q4_1(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    z8_vec_dot(Z8_Q4_1, n, w, x, xs, nc, y);
}
void strata_avx512_vec_dot_q5_0(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    z8_vec_dot(Z8_Q5_0, n, w, x, xs, nc, y);
}
void strata_avx512_vec_dot_q5_1(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    z8_vec_dot(Z8_Q5_1, n, w, x, xs, nc, y);
}
void strata_avx512_vec_dot_q8_0(int64_t n, const void *w, const void *x, size_t xs, int nc, float *y) {
    z8_vec_dot(Z8_Q8_0, n, w, x, xs, nc, y);
}

/* quant.h rows kernels: what vec_dot gives, for nrows rows at once. Several columns take z8_rows
 * (avx512_q8.h: rows across the int32 lanes). At one column (matmul's SHORT1 case) rows shorter
 * than a group take the AVX2 path's 8-rows kernel (qr_lanes), as avx512_fp4.c's short rows do:
 * without it each such row went through vec_dot's pointer tables, and flash-small's hyper-connection
 * up rows are one Q8_0 block. 1 thread, Zen 4 (AVX-512 VNNI), us per 1024 x 32 product, Python's
 * call included (~4 us): Q8_0 27.6 (vec_dot) -> 7.6 (z8_rows) -> 6.5 (qr_lanes), Q4_0 28.1 -> 7.8
 * -> 5.7; 1024 x 96: Q8_0 27.8 -> 10.7 -> 9.2. Rows of 8..16 blocks keep vec_dot (z8_rows). */
void strata_avx512_rows_q4_0(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                             int ncols, float *y, int64_t ldy) {
    z8_rows_or_short(Z8_Q4_0, strata_avx2_rows_q4_0, 7, n, w, w_row, nrows, x, x_stride, ncols, y, ldy);
}
void strata_avx512_rows_q4_1(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                             int ncols, float *y, int64_t ldy) {
    z8_rows_or_short(Z8_Q4_1, strata_avx2_rows_q4_1, 7, n, w, w_row, nrows, x, x_stride, ncols, y, ldy);
}
void strata_avx512_rows_q5_0(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                             int ncols, float *y, int64_t ldy) {
    z8_rows_or_short(Z8_Q5_0, strata_avx2_rows_q5_0, 7, n, w, w_row, nrows, x, x_stride, ncols, y, ldy);
}
void strata_avx512_rows_q5_1(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                             int ncols, float *y, int64_t ldy) {
    z8_rows_or_short(Z8_Q5_1, strata_avx2_rows_q5_1, 7, n, w, w_row, nrows, x, x_stride, ncols, y, ldy);
}
void strata_avx512_rows_q8_0(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                             int ncols, float *y, int64_t ldy) {
    z8_rows_or_short(Z8_Q8_0, strata_avx2_rows_q8_0, 7, n, w, w_row, nrows, x, x_stride, ncols, y, ldy);
}
