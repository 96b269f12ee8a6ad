/* amx_legacy.c — Q8_0 products of several columns on AMX tiles (Sapphire Rapids and later).
 *
 * Integer part. One TDPBSSD multiplies a tile of 16 weight rows x one block (32 signed codes, read
 * straight from the GGUF rows: A, 16 rows of 32 bytes, w_row bytes apart) by the same block of up
 * to 16 columns (B: 8 rows of 64 bytes, column c's codes 4k..4k+3 in dword c of row k, laid out
 * once per call) and leaves block b's exact sum of every (row, column) in a 16 x 16 int32 tile.
 * Blocks are taken one per product (K = 32 bytes), never two, so that each block's sum stays whole
 * for its own float step.
 *
 * Float part: exactly fmt_legacy.c's vec_dot_q8_0, acc[b % 8] = fmaf(d * a[b].d, (float)sumi,
 * acc[b % 8]) in ascending b, then strata_hsum8's ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)). Here the
 * 16 columns of one row go across the lanes of a zmm: for row r and block b, L[b % 8] =
 * fma(d_r,b * dx_b, cvt(sums_b[r]), L[b % 8]), dx_b holding the columns' scales. So every
 * (row, column) gets the scalar's operations in the scalar's order, whatever the batch: column c's
 * result is what one column alone gives on any path (quant.h).
 *
 * Per 16 rows and block this is a tile load, a product and a tile store, then 16 x (cvt, mul, fma)
 * — against avx512_q8.h z8_rows' decode and transpose of the weights plus 8 vpdpbusd and 3 float
 * operations per column. */
#include "amx_legacy.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "avx512_legacy.h"
#include "avx512_tr.h"

enum {
    AMX_TR = 16,        /* weight rows per tile */
    AMX_TC = 16,        /* columns per tile */
    AMX_CHUNK = 32,     /* blocks whose sums are held at once (32 KB) */
    AMX_STACK_NB = 64,  /* rows up to this many blocks lay the columns out on the stack */
    AMX_MAX_NB = 512,   /* longer rows go to the AVX-512 kernel (the scale gather's offsets are int32) */
    Q8_TS = 34,         /* bytes per Q8_0 block: fp16 scale, 32 codes */
    /* Fewer columns or rows go to the AVX-512 kernel. A tile store of a block's 16 x 16 sums took
     * 10-22 ns here (Xeon, 2 cores, a VM), a product 6, so a block costs the same at 2 columns as at
     * 16; the columns' layout is paid per call. Measured, AMX over AVX-512 (one process, medians of 5):
     * 8192 x 256: 1.01 at 8 columns, 1.18 at 12, 1.31 at 16; 1024 x 1024: 1.01, 1.17, 1.42; 4096 x
     * 2048: 0.86, 1.12, 1.37; 256 x 256 (16 rows a call): 0.78, 0.88, 0.93. */
    AMX_MIN_COLS = 12,
    AMX_MIN_ROWS = 32
};

/* palette 1: tmm0, tmm1 sums (16 x 16 int32); tmm2, tmm3 weights (16 rows x 32 codes); tmm4, tmm5
 * the columns (8 rows x 64 bytes). Loaded at every call: the configuration is per thread, and
 * loading it costs less than one tile product of a 16-row group. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_tilecfg;

static void amx_configure(int ncols) {
    _Alignas(64) amx_tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 2; t++) { c.rows[t] = AMX_TR; c.colsb[t] = (uint16_t)(ncols * 4); }
    for (int t = 2; t < 4; t++) { c.rows[t] = AMX_TR; c.colsb[t] = 32; }
    for (int t = 4; t < 6; t++) { c.rows[t] = 8; c.colsb[t] = (uint16_t)(ncols * 4); }
    _tile_loadconfig(&c);
}

/* Block b of every column as a B tile (bt: 8 rows of 16 dwords, lane c of row k = column c's codes
 * 4k..4k+3). q[c]: column c's block (zeros past ncols). */
static inline void amx_columns(const int8_t *const *q, __m512i *bt) {
    __m512i v[8];
    for (int i = 0; i < 8; i++)
        v[i] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)q[i])),
                                  _mm256_loadu_si256((const __m256i *)q[i + 8]), 1);
    strata_tr16x8_epi32(v, bt);
}

/* The float step of block b for one row: its sums (16 columns), the row's weight scale, the columns'
 * scales. */
static inline __m512 amx_term(const int32_t *sums, __mmask16 cols, float dw, const float *dx, __m512 L) {
    return _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(dw), _mm512_load_ps(dx)),
                           _mm512_cvtepi32_ps(_mm512_maskz_load_epi32(cols, sums)), L);
}

void strata_amx_rows_q8_0(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x, size_t x_stride,
                          int ncols, float *y, int64_t ldy) {
    const int64_t nb = n / 32;
    if (ncols < AMX_MIN_COLS || ncols > AMX_TC || nrows < AMX_MIN_ROWS || nb > AMX_MAX_NB) {
        strata_avx512_rows_q8_0(n, w, w_row, nrows, x, x_stride, ncols, y, ldy);
        return;
    }
    /* the columns, block by block: B tiles and scales */
    _Alignas(64) __m512i bt_stack[AMX_STACK_NB * 8];
    _Alignas(64) float dx_stack[AMX_STACK_NB * AMX_TC];
    __m512i *bt = bt_stack;
    float *dx = dx_stack;
    void *heap = NULL;
    if (nb > AMX_STACK_NB) {
        heap = aligned_alloc(64, (size_t)nb * (8 * sizeof(__m512i) + AMX_TC * sizeof(float)));
        if (!heap) {   /* no memory for the layout: the AVX-512 kernel needs none, and gives the same bits */
            strata_avx512_rows_q8_0(n, w, w_row, nrows, x, x_stride, ncols, y, ldy);
            return;
        }
        bt = heap;
        dx = (float *)(bt + nb * 8);
    }
    static const int8_t zero_codes[32];
    for (int64_t b = 0; b < nb; b++) {
        const int8_t *q[AMX_TC];
        for (int c = 0; c < AMX_TC; c++) {
            const act_q8_32 *a = (const act_q8_32 *)((const char *)x + (size_t)c * x_stride) + b;
            q[c] = c < ncols ? a->qs : zero_codes;
            dx[b * AMX_TC + c] = c < ncols ? a->d : 0.0f;
        }
        amx_columns(q, bt + b * 8);
    }

    amx_configure(ncols);
    const __mmask16 cols = (__mmask16)((1u << ncols) - 1u);
    _Alignas(64) int32_t sums[AMX_CHUNK][AMX_TR][AMX_TC];
    _Alignas(64) float dw[AMX_CHUNK][AMX_TR];
    _Alignas(64) float Lm[AMX_TR][8][AMX_TC];   /* lane accumulators between chunks */
    _Alignas(64) float out[AMX_TR][AMX_TC];
    _Alignas(64) int8_t tail[AMX_CHUNK][AMX_TR][32];   /* a last group of fewer than 16 rows, zero-padded */
    if (nrows % AMX_TR) memset(tail, 0, sizeof tail);
    const __m512i roff = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)w_row));
    /* lane r: out[r][c] of column c's gather */
    const __m512i down = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32(AMX_TC));
    for (int64_t r0 = 0; r0 < nrows; r0 += AMX_TR) {
        const int nr = nrows - r0 < AMX_TR ? (int)(nrows - r0) : AMX_TR;
        const __mmask16 live = (__mmask16)((1u << nr) - 1u);
        const uint8_t *wr = (const uint8_t *)w + (size_t)r0 * w_row;
        for (int64_t k0 = 0; k0 < nb; k0 += AMX_CHUNK) {
            const int kn = nb - k0 < AMX_CHUNK ? (int)(nb - k0) : AMX_CHUNK;
            for (int b = 0; b < kn; b++) {
                const uint8_t *blk = wr + (size_t)(k0 + b) * Q8_TS;
                const __m512i raw = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, roff, blk, 1);
                _mm512_store_ps(dw[b], _mm512_cvtph_ps(_mm512_cvtepi32_epi16(raw)));
                if (nr < AMX_TR)
                    for (int r = 0; r < nr; r++) memcpy(tail[b][r], blk + (size_t)r * w_row + 2, 32);
            }
            /* the next group's rows (contiguous) while this one computes */
            if (r0 + AMX_TR < nrows && k0 == 0) {
                const int64_t next = nrows - r0 - AMX_TR < AMX_TR ? nrows - r0 - AMX_TR : AMX_TR;
                for (size_t o = 0; o < (size_t)next * w_row; o += 64)
                    _mm_prefetch((const char *)wr + (size_t)AMX_TR * w_row + o, _MM_HINT_T0);
            }
            /* two blocks' products in flight before either is stored */
            for (int b = 0; b < kn; b += 2) {
                const int two = b + 1 < kn;
                const void *a0 = wr + (size_t)(k0 + b) * Q8_TS + 2, *a1 = (const uint8_t *)a0 + Q8_TS;
                size_t stride = w_row;
                if (nr < AMX_TR) {
                    a0 = tail[b];
                    a1 = tail[b + 1];
                    stride = 32;
                }
                _tile_zero(0);
                _tile_loadd(2, a0, stride);
                _tile_loadd(4, bt + (k0 + b) * 8, 64);
                _tile_dpbssd(0, 2, 4);
                if (two) {
                    _tile_zero(1);
                    _tile_loadd(3, a1, stride);
                    _tile_loadd(5, bt + (k0 + b + 1) * 8, 64);
                    _tile_dpbssd(1, 3, 5);
                }
                _tile_stored(0, sums[b], 64);
                if (two) _tile_stored(1, sums[b + 1], 64);
            }
            const float *dxc = dx + k0 * AMX_TC;
            const int last = k0 + AMX_CHUNK >= nb;
            for (int r = 0; r < nr; r++) {
                __m512 L[8];
                for (int j = 0; j < 8; j++) L[j] = k0 ? _mm512_load_ps(Lm[r][j]) : _mm512_setzero_ps();
                int b = 0;
                for (; b + 8 <= kn; b += 8)
                    for (int j = 0; j < 8; j++) L[j] = amx_term(sums[b + j][r], cols, dw[b + j][r], dxc + (b + j) * AMX_TC, L[j]);
                for (int j = 0; b + j < kn; j++) L[j] = amx_term(sums[b + j][r], cols, dw[b + j][r], dxc + (b + j) * AMX_TC, L[j]);
                if (!last) {
                    for (int j = 0; j < 8; j++) _mm512_store_ps(Lm[r][j], L[j]);
                    continue;
                }
                _mm512_store_ps(out[r], _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(L[0], L[4]), _mm512_add_ps(L[2], L[6])),
                                                      _mm512_add_ps(_mm512_add_ps(L[1], L[5]), _mm512_add_ps(L[3], L[7]))));
            }
        }
        /* out is row by column; y wants column by row */
        for (int c = 0; c < ncols; c++)
            _mm512_mask_storeu_ps(y + (int64_t)c * ldy + r0, live,
                                  _mm512_mask_i32gather_ps(_mm512_setzero_ps(), live, down, &out[0][c], 4));
    }
    _tile_release();
    free(heap);
}
