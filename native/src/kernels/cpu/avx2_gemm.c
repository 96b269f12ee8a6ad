/* avx2_gemm.c — the AVX2 block kernel of the f32 GEMM (driver and summation order: gemm.c, gemm.h).
 *
 * Register tile: MR = 3 weight rows x NR = 4 activation rows, twelve __m256 accumulators, each
 * holding the eight lanes of one output. Per step of eight k: three weight loads, four
 * activation loads, twelve FMAs (3 + 1 + 12 = 16 ymm registers). Edge tiles use the same code
 * with fewer rows or columns, so every output sees the same sequence of lane FMAs. */
#include "gemm.h"
#include "avx2_common.h"

enum { MR = 3, NR = 4 };

static inline __attribute__((always_inline)) void tile(const int mr, const int nr, const float *w, size_t ldw,
                                                        const float *x, size_t ldx, int64_t kc, int first,
                                                        int last, float *acc, int accld, float *y, int64_t ldy) {
    __m256 a[MR][NR];
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++)
            a[i][j] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + ((size_t)i * accld + j) * 8);
    int64_t k = 0;
    for (; k + 8 <= kc; k += 8) {
        __m256 wv[MR];
        for (int i = 0; i < mr; i++) wv[i] = _mm256_loadu_ps(w + (size_t)i * ldw + k);
        for (int j = 0; j < nr; j++) {
            const __m256 xv = _mm256_loadu_ps(x + (size_t)j * ldx + k);
            for (int i = 0; i < mr; i++) a[i][j] = _mm256_fmadd_ps(wv[i], xv, a[i][j]);
        }
    }
    if (k < kc) { /* the row's last partial group: lanes past the end add 0 * 0 */
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(kc - k)),
                                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 wv[MR];
        for (int i = 0; i < mr; i++) wv[i] = _mm256_maskload_ps(w + (size_t)i * ldw + k, mask);
        for (int j = 0; j < nr; j++) {
            const __m256 xv = _mm256_maskload_ps(x + (size_t)j * ldx + k, mask);
            for (int i = 0; i < mr; i++) a[i][j] = _mm256_fmadd_ps(wv[i], xv, a[i][j]);
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            if (last) y[(size_t)j * ldy + i] = strata_hsum8_avx2(a[i][j]);
            else _mm256_storeu_ps(acc + ((size_t)i * accld + j) * 8, a[i][j]);
        }
}

typedef void (*tile_fn)(const float *w, size_t ldw, const float *x, size_t ldx, int64_t kc, int first,
                        int last, float *acc, int accld, float *y, int64_t ldy);

#define DEF_TILE(mr, nr)                                                                              \
    static void tile_##mr##_##nr(const float *w, size_t ldw, const float *x, size_t ldx, int64_t kc,  \
                                 int first, int last, float *acc, int accld, float *y, int64_t ldy) { \
        tile(mr, nr, w, ldw, x, ldx, kc, first, last, acc, accld, y, ldy);                            \
    }
DEF_TILE(1, 1) DEF_TILE(1, 2) DEF_TILE(1, 3) DEF_TILE(1, 4)
DEF_TILE(2, 1) DEF_TILE(2, 2) DEF_TILE(2, 3) DEF_TILE(2, 4)
DEF_TILE(3, 1) DEF_TILE(3, 2) DEF_TILE(3, 3) DEF_TILE(3, 4)
#undef DEF_TILE

static const tile_fn tiles[MR][NR] = {
    {tile_1_1, tile_1_2, tile_1_3, tile_1_4},
    {tile_2_1, tile_2_2, tile_2_3, tile_2_4},
    {tile_3_1, tile_3_2, tile_3_3, tile_3_4},
};

void strata_avx2_gemm_block(const float *w, size_t ldw, int nrow, const float *x, size_t ldx, int ncol,
                            int64_t kc, int first, int last, float *acc, float *y, int64_t ldy) {
    for (int i = 0; i < nrow; i += MR) {
        const int mr = nrow - i < MR ? nrow - i : MR;
        for (int j = 0; j < ncol; j += NR) {
            const int nr = ncol - j < NR ? ncol - j : NR;
            tiles[mr - 1][nr - 1](w + (size_t)i * ldw, ldw, x + (size_t)j * ldx, ldx, kc, first, last,
                                  acc + ((size_t)i * ncol + j) * 8, ncol, y + (size_t)j * ldy + i, ldy);
        }
    }
}
