/* avx512_q8.h — the AVX-512 dot products against act_q8_32 activations, shared by
 * avx512_legacy.c (Q4_0 Q4_1 Q5_0 Q5_1 Q8_0) and avx512_fp4.c (IQ4_NL MXFP4 NVFP4).
 * Include only from avx512_*.c (compiled with AVX2 + AVX-512 F/BW/DQ/VL/VNNI/VBMI).
 *
 * Bit-for-bit rule (quant/quant.h): the integer sums are exact however they are formed; the
 * float part of block b goes to lane b % 8 of a __m256 accumulator with exactly the scalar
 * reference's operations (fmt_legacy.c, fmt_fp4.c), so the q8_terms / q8_apply / q8_rotate
 * helpers of the AVX2 path (avx2_q8.h) are reused as they are: only the integer part is wider.
 *
 * Integer part. vpdpbusd multiplies unsigned by signed bytes, four products per int32 lane,
 * without saturation. Each format turns its weights into unsigned bytes once per group of 8
 * blocks (shared by every column):
 *   32-value formats  u = w + off in 0..255 (Q8_0: q ^ 0x80, off 128; Q4_0/Q5_0: the codes,
 *                     off 8 / 16; Q4_1/Q5_1: the codes, off 0; IQ4_NL/MXFP4: table + 128,
 *                     off 128); per column sumi = dpbusd(u, x) - off * sum(x), sum(x) being
 *                     the act block's stored code sum.
 *   NVFP4             the 16-value sub-blocks have no stored activation sums, so the bias
 *                     goes on the activations instead: dpbusd(x ^ 0x80, v) counts 128 * sum(v)
 *                     too much, and the accumulator starts at -128 * sum(v) (per int32 lane,
 *                     computed with the weights).
 * A zmm holds two blocks: 32-value formats pair block i (low 256 bits) with block i + 4, so
 * that one transpose-reduction (z8_reduce8) leaves block k's sum in lane k; NVFP4 has one
 * 64-value block per zmm, a 16-value sub-block per 128-bit lane.
 *
 * Partial groups are the AVX2 path's: a row of nb >= 8 blocks ends with the (overlapping)
 * group of its last 8 blocks, rotated to the lanes its new blocks belong to and blended into
 * lanes < nb % 8; a row shorter than 8 blocks reads through pointer tables whose missing blocks
 * are q8_zero_block / q8_zero_act. */
#ifndef STRATA_KERNELS_CPU_AVX512_Q8_H
#define STRATA_KERNELS_CPU_AVX512_Q8_H

#include <immintrin.h>

#include "avx2_common.h"
#include "avx2_q8.h"
#include "avx512_tr.h"

typedef enum { Z8_Q4_0, Z8_Q4_1, Z8_Q5_0, Z8_Q5_1, Z8_Q8_0, Z8_IQ4_NL, Z8_MXFP4, Z8_NVFP4 } z8fmt;

enum { Z8_MAX_COLS = 16 };
/* Software prefetch this many bytes ahead of the group being decoded (0: none; -DZ8_PREFETCH=0
 * builds the comparison). The hardware prefetcher alone left batch-1 products on cold weights
 * waiting on memory: one thread, 2560x2560, CPU time on the shared 2-core Xeon, three runs each,
 * IQ4_NL 5.0-5.9 -> 6.3-6.6 GB/s, Q4_0 5.0-5.8 -> 7.0-8.3, NVFP4 4.8-5.1 -> 5.5-6.4. */
#ifndef Z8_PREFETCH
#define Z8_PREFETCH 2048
#endif

static inline int z8_ts(z8fmt f) {
    static const unsigned char ts[] = {18, 20, 22, 24, 34, 18, 17, 36};
    return ts[f];
}
/* activation blocks per weight block */
static inline int z8_apb(z8fmt f) { return f == Z8_NVFP4 ? 2 : 1; }
static inline int z8_has_min(z8fmt f) { return f == Z8_Q4_1 || f == Z8_Q5_1; }
/* log2 of the weight offset off (see above); -1 for none */
static inline int z8_off_log2(z8fmt f) {
    switch (f) {
    case Z8_Q4_0: return 3;
    case Z8_Q5_0: return 4;
    case Z8_Q8_0: case Z8_IQ4_NL: case Z8_MXFP4: return 7;
    default: return -1;
    }
}

/* A group of 8 weight blocks, decoded once for all columns. */
typedef struct {
    __m512i w[8]; /* 32-value formats: w[i] = u of blocks i | i + 4 (i < 4); NVFP4: w[k] = values of block k */
    __m512i c[8]; /* NVFP4: -128 * (sum of the four values of each int32 lane of w[k]) */
    __m256 d, m;  /* 32-value formats: lane k = scale (and min) of block k */
    __m512 sp, sq; /* NVFP4: lane k = scale of sub-block 0 of block k, lane 8 + k sub-block 2 (sp); 1 and 3 (sq) */
} z8_group;

/* Defined by the file of the format (avx512_legacy.c or avx512_fp4.c): the group of the 8 blocks
 * at q8_blk(p, z8_ts(f), k, wk), k < 8. */
static inline void z8_decode(z8fmt f, const uint8_t *p, const uint8_t *const *wk, z8_group *g);

/* Two 32-byte halves as one zmm. */
static inline __m512i z8_load2x32(const void *lo, const void *hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)lo)),
                              _mm256_loadu_si256((const __m256i *)hi), 1);
}

/* The 32 nibble codes (low nibbles = values 0..15, high = 16..31) of qs arrays a (low 256 bits)
 * and b (high 256 bits). */
static inline __m512i z8_nibbles2(const uint8_t *a, const uint8_t *b) {
    const __m512i z = _mm512_mask_blend_epi64(0xf0, _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)a)),
                                              _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)b)));
    return _mm512_and_si512(_mm512_srlv_epi64(z, _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)), _mm512_set1_epi8(0x0f));
}

/* s[i] = dpbusd sums of blocks i (low 256 bits) and i + 4 (high) -> lane k = block k's total.
 * Unpacks pair int32 lanes of two vectors, so no add mixes blocks: q's 128-bit lane L holds the
 * 16-value half sums of blocks 0..3 (L = 0: first halves, 1: second) and 4..7 (L = 2, 3). */
static inline __m256i z8_reduce8(const __m512i s[4]) {
    const __m512i r0 = _mm512_add_epi32(_mm512_unpacklo_epi32(s[0], s[1]), _mm512_unpackhi_epi32(s[0], s[1]));
    const __m512i r1 = _mm512_add_epi32(_mm512_unpacklo_epi32(s[2], s[3]), _mm512_unpackhi_epi32(s[2], s[3]));
    const __m512i q = _mm512_add_epi32(_mm512_unpacklo_epi64(r0, r1), _mm512_unpackhi_epi64(r0, r1));
    const __m512i t = _mm512_shuffle_i64x2(q, q, _MM_SHUFFLE(3, 1, 2, 0));
    return _mm256_add_epi32(_mm512_castsi512_si256(t), _mm512_extracti64x4_epi64(t, 1));
}

/* One column of a 32-value format's group: the float terms of fmt_legacy.c / fmt_fp4.c. */
static inline q8_terms z8_terms32(z8fmt f, const z8_group *g, const act_q8_32 *a, const act_q8_32 *const *ak) {
    __m512i s[4];
    for (int i = 0; i < 4; i++) {
        const __m512i x = z8_load2x32(q8_act_blk(a, i, ak)->qs, q8_act_blk(a, i + 4, ak)->qs);
        s[i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), g->w[i], x);
    }
    __m256i sumi = z8_reduce8(s), sumy = _mm256_setzero_si256();
    __m256 dx;
    const int sh = z8_off_log2(f);
    q8_act_ds8(a, ak, 0, 1, &dx, sh >= 0 || z8_has_min(f) ? &sumy : NULL);
    if (sh >= 0) sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(sumy, sh));
    q8_terms t;
    t.a0 = _mm256_mul_ps(g->d, dx);
    t.b0 = _mm256_cvtepi32_ps(sumi);
    if (z8_has_min(f)) {
        t.a1 = _mm256_mul_ps(g->m, dx);
        t.b1 = _mm256_cvtepi32_ps(sumy);
    } else {
        t.a1 = t.b1 = _mm256_setzero_ps();
    }
    return t;
}

/* One column of an NVFP4 group (activation blocks 2k, 2k + 1 for block k):
 * t0 = fma(s0, i0, s1 * i1), t1 = fma(s2, i2, s3 * i3) per block, in 16 lanes at once. */
static inline q8_terms z8_terms_nv(const z8_group *g, const act_q8_32 *a, const act_q8_32 *const *ak) {
    __m512i s[8], r[4];
    for (int k = 0; k < 8; k++) {
        const __m512i x = z8_load2x32(q8_act_blk(a, 2 * k, ak)->qs, q8_act_blk(a, 2 * k + 1, ak)->qs);
        s[k] = _mm512_dpbusd_epi32(g->c[k], _mm512_xor_si512(x, _mm512_set1_epi8((char)0x80)), g->w[k]);
    }
    for (int j = 0; j < 4; j++)
        r[j] = _mm512_add_epi32(_mm512_unpacklo_epi32(s[2 * j], s[2 * j + 1]), _mm512_unpackhi_epi32(s[2 * j], s[2 * j + 1]));
    /* 128-bit lane j of q0 (q1): sub-block j's sums of blocks 0..3 (4..7) */
    const __m512i q0 = _mm512_add_epi32(_mm512_unpacklo_epi64(r[0], r[1]), _mm512_unpackhi_epi64(r[0], r[1]));
    const __m512i q1 = _mm512_add_epi32(_mm512_unpacklo_epi64(r[2], r[3]), _mm512_unpackhi_epi64(r[2], r[3]));
    const __m512i ip = _mm512_permutex2var_epi64(q0, _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), q1); /* i0 | i2 */
    const __m512i iq = _mm512_permutex2var_epi64(q0, _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15), q1); /* i1 | i3 */
    const __m512 tt = _mm512_fmadd_ps(g->sp, _mm512_cvtepi32_ps(ip), _mm512_mul_ps(g->sq, _mm512_cvtepi32_ps(iq)));
    q8_terms t;
    t.a0 = _mm512_castps512_ps256(tt);
    t.a1 = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(tt), 1));
    q8_act_ds8(a, ak, 0, 2, &t.b0, NULL);
    q8_act_ds8(a, ak, 1, 2, &t.b1, NULL);
    return t;
}

static inline q8_terms z8_terms(z8fmt f, const z8_group *g, const act_q8_32 *a, const act_q8_32 *const *ak) {
    return f == Z8_NVFP4 ? z8_terms_nv(g, a, ak) : z8_terms32(f, g, a, ak);
}

/* nc columns (xa[c]: column c's activations) of a row of nb >= 8 blocks at wp, added to acc[c]. */
static inline void z8_row(z8fmt f, int64_t nb, const uint8_t *wp, const act_q8_32 *const *xa, int nc, __m256 *acc) {
    const int ts = z8_ts(f), apb = z8_apb(f), two = z8_has_min(f) || f == Z8_NVFP4;
    const int rem = (int)(nb & 7);
    const int64_t nfull = nb - rem;
    z8_group g;
    for (int64_t b = 0; b < nfull; b += 8) {
        for (int o = 0; Z8_PREFETCH && o < 8 * ts; o += 64) _mm_prefetch((const char *)wp + b * ts + Z8_PREFETCH + o, _MM_HINT_T0);
        z8_decode(f, wp + b * ts, NULL, &g);
        for (int c = 0; c < nc; c++) acc[c] = q8_apply(z8_terms(f, &g, xa[c] + b * apb, NULL), two, acc[c]);
    }
    if (!rem) return;
    const __m256 keep = q8_lane_mask(rem);
    z8_decode(f, wp + (nb - 8) * ts, NULL, &g);
    for (int c = 0; c < nc; c++) {
        const q8_terms t = q8_rotate(z8_terms(f, &g, xa[c] + (nb - 8) * apb, NULL), two, rem, 8);
        acc[c] = _mm256_blendv_ps(acc[c], q8_apply(t, two, acc[c]), keep);
    }
}

/* A row shorter than one group (nb < 8 blocks), read through pointer tables; out of line, so that
 * the tables do not cost the long-row path a stack frame. */
__attribute__((noinline)) static void z8_short(z8fmt f, int nb, const uint8_t *wp, const void *x, size_t x_stride,
                                               int ncols, float *y) {
    const int apb = z8_apb(f), two = z8_has_min(f) || f == Z8_NVFP4;
    const uint8_t *wk[8];
    const act_q8_32 *ak[16];
    z8_group g;
    q8_partial_w(wp, z8_ts(f), nb, wk);
    z8_decode(f, wp, wk, &g);
    const __m256 keep = q8_lane_mask(nb);
    for (int c = 0; c < ncols; c++) {
        q8_partial_a((const act_q8_32 *)((const char *)x + (size_t)c * x_stride), nb * apb, ak);
        const __m256 acc = _mm256_setzero_ps();
        y[c] = strata_hsum8_avx2(_mm256_blendv_ps(acc, q8_apply(z8_terms(f, &g, NULL, ak), two, acc), keep));
    }
}

/* The vec_dot of quant.h for format f. One column keeps its accumulator in a register; several
 * columns go in chunks of Z8_MAX_COLS, each group decoded once per chunk. */
static inline void z8_vec_dot(z8fmt f, int64_t n, const void *w, const void *x, size_t x_stride, int ncols,
                              float *y) {
    const int64_t nb = (int64_t)((uint64_t)n / (uint64_t)(32 * z8_apb(f)));
    if (nb < 8) {
        z8_short(f, (int)nb, w, x, x_stride, ncols, y);
        return;
    }
    if (ncols == 1) {
        const act_q8_32 *xa[1] = {x};
        __m256 acc[1] = {_mm256_setzero_ps()};
        z8_row(f, nb, w, xa, 1, acc);
        y[0] = strata_hsum8_avx2(acc[0]);
        return;
    }
    for (int c0 = 0; c0 < ncols; c0 += Z8_MAX_COLS) {
        const int nc = ncols - c0 < Z8_MAX_COLS ? ncols - c0 : Z8_MAX_COLS;
        const act_q8_32 *xa[Z8_MAX_COLS];
        __m256 acc[Z8_MAX_COLS];
        for (int c = 0; c < nc; c++) {
            xa[c] = (const act_q8_32 *)((const char *)x + (size_t)(c0 + c) * x_stride);
            acc[c] = _mm256_setzero_ps();
        }
        z8_row(f, nb, w, xa, nc, acc);
        for (int c = 0; c < nc; c++) y[c0 + c] = strata_hsum8_avx2(acc[c]);
    }
}


/* ---------------------------------------------------------------- several rows at once
 *
 * The rows kernel of quant.h for the 32-value formats (z8_rows). z8_row pays, per column and
 * group of 8 blocks, a cross-lane reduction plus the activation scales and sums (about 45 uops
 * for 8 block sums). Here the rows go across the lanes instead: int32 lane r of a zmm belongs to
 * row r of a pass of 16, so a block's exact sum needs no reduction. The weights of a chunk of
 * blocks are decoded once per call (z8_values) and transposed (z8r_decode) so that vector i of
 * block b holds the four operands 4i..4i+3 of every row; per column a block is then 8 vpdpbusd
 * against 32-bit broadcasts of the activation codes, started at -off * sum (the offset taken back,
 * see the top of this file), then cvt + mul + fma (+ mul + fma for formats with a min) for 16
 * (row, block) sums. The activation scales and (offset) sums of the columns are laid out once
 * per call (dx, xs in z8_rows), so each is one broadcast load.
 *
 * Float order: lane r of L[j] is float lane j of row r; it gets exactly the scalar's operations
 * for the blocks b with b % 8 == j, in ascending b (chunks start at multiples of 8 blocks), and
 * the row's result is strata_hsum8's ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)), lane-wise. */
enum {
    Z8R_ROWS = 16,    /* rows per pass: one int32 lane each */
    Z8R_WB = 16,      /* blocks per decoded chunk: 9 KB with the scales, stays in L1 with the activations */
    Z8R_MAX_NB = 512  /* longer rows (over 16384 values) go through z8_vec_dot */
};

/* Defined by the file of the format: the 32 values of the block at p as unsigned operands, in
 * value order (see the top of this file), and the scales of 16 rows' blocks. */
static inline __m256i z8_values(z8fmt f, const uint8_t *p);
/* raw: lane r = the first 4 bytes of row r's block; *d (and *m for formats with a min) = the
 * scales (mins) as floats. */
static inline void z8_scales16(z8fmt f, __m512i raw, __m512 *d, __m512 *m);

typedef struct {
    __m512i w[Z8R_WB][8];           /* block b: lane r of w[b][i] = row r's operands 4i..4i+3 */
    float d[Z8R_WB][Z8R_ROWS];      /* block b: scale of row r */
    float m[Z8R_WB][Z8R_ROWS];      /* the same for the min (Q4_1, Q5_1) */
} z8r_chunk;

/* Blocks k0 .. k0 + kn - 1 of the rows rp[] (blocks rs[] bytes apart) into ch; the scales of the
 * nr rows from w (rows w_row bytes apart; one gather per block, the lanes of missing rows 0). */
static inline void z8r_decode(z8fmt f, const uint8_t *const *rp, const size_t *rs, const uint8_t *w, size_t w_row,
                              int nr, int64_t k0, int kn, z8r_chunk *ch) {
    const __m512i roff = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                            _mm512_set1_epi32((int)w_row));
    const __mmask16 live = (__mmask16)((1u << nr) - 1u);
    for (int b = 0; b < kn; b++) {
        const uint8_t *p[Z8R_ROWS];
        for (int r = 0; r < Z8R_ROWS; r++) p[r] = rp[r] + rs[r] * (size_t)(k0 + b);
        /* v[i]: row i (low 256 bits) and row i + 8 (high) */
        __m512i v[8];
        for (int i = 0; i < 8; i++)
            v[i] = _mm512_inserti64x4(_mm512_castsi256_si512(z8_values(f, p[i])), z8_values(f, p[i + 8]), 1);
        strata_tr16x8_epi32(v, ch->w[b]);
        __m512 d, m;
        z8_scales16(f, _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, roff, w + (size_t)z8_ts(f) * (size_t)(k0 + b), 1),
                    &d, &m);
        _mm512_store_ps(ch->d[b], d);
        if (z8_has_min(f)) _mm512_store_ps(ch->m[b], m);
    }
}

/* Block b of the chunk against one column's activation block a (scale dx, xs: -off * sum, or
 * for formats with a min the sum as a float), into L (lane r = row r). */
static inline __m512 z8r_block(z8fmt f, const z8r_chunk *ch, int b, const act_q8_32 *a, const float *dx,
                               const int32_t *xs, __m512 L) {
    const int32_t *x4 = (const int32_t *)(const void *)a->qs;
    __m512i s = z8_off_log2(f) >= 0 ? _mm512_set1_epi32(*xs) : _mm512_setzero_si512();
    for (int i = 0; i < 8; i++) s = _mm512_dpbusd_epi32(s, ch->w[b][i], _mm512_set1_epi32(x4[i]));
    const __m512 d = _mm512_set1_ps(*dx);
    L = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_load_ps(ch->d[b]), d), _mm512_cvtepi32_ps(s), L);
    if (z8_has_min(f)) {
        float sf;
        memcpy(&sf, xs, 4);
        L = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_load_ps(ch->m[b]), d), _mm512_set1_ps(sf), L);
    }
    return L;
}

/* quant.h strata_rows_fn; NVFP4 (not laid out here yet), rows over Z8R_MAX_NB blocks, and at one
 * column rows of 8 or more blocks go row by row through z8_vec_dot (one column, 1 thread, Zen 4:
 * Q4_0 1024 x 512 25 us there against 35 here, 4096 x 512 90 against 130). */
static inline void z8_rows(z8fmt f, int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                           size_t x_stride, int ncols, float *y, int64_t ldy) {
    const int64_t nb = n / 32;
    if (f == Z8_NVFP4 || nb > Z8R_MAX_NB || ncols > Z8_MAX_COLS || (ncols == 1 && nb >= 8)) {
        float t[Z8_MAX_COLS];
        for (int c0 = 0; c0 < ncols; c0 += Z8_MAX_COLS) {
            const int nc = ncols - c0 < Z8_MAX_COLS ? ncols - c0 : Z8_MAX_COLS;
            for (int64_t r = 0; r < nrows; r++) {
                z8_vec_dot(f, n, (const char *)w + (size_t)r * w_row, (const char *)x + (size_t)c0 * x_stride, x_stride, nc, t);
                for (int c = 0; c < nc; c++) y[(int64_t)(c0 + c) * ldy + r] = t[c];
            }
        }
        return;
    }
    const int sh = z8_off_log2(f);
    /* the activations' scales and (offset) sums of every column, for broadcasts */
    _Alignas(64) float dx[Z8_MAX_COLS * Z8R_MAX_NB];
    _Alignas(64) int32_t xs[Z8_MAX_COLS * Z8R_MAX_NB];
    for (int c = 0; c < ncols; c++) {
        const act_q8_32 *a = (const act_q8_32 *)((const char *)x + (size_t)c * x_stride);
        for (int64_t b = 0; b < nb; b++) {
            const float sf = (float)a[b].sum;
            dx[c * nb + b] = a[b].d;
            if (z8_has_min(f)) memcpy(&xs[c * nb + b], &sf, 4);
            else xs[c * nb + b] = (int32_t)(0u - ((uint32_t)a[b].sum << (sh > 0 ? sh : 0)));
        }
    }
    _Alignas(64) z8r_chunk ch;
    _Alignas(64) __m512 Ls[Z8_MAX_COLS][8]; /* lane accumulators between chunks */
    for (int64_t r0 = 0; r0 < nrows; r0 += Z8R_ROWS) {
        const int nr = nrows - r0 < Z8R_ROWS ? (int)(nrows - r0) : Z8R_ROWS;
        const uint8_t *rp[Z8R_ROWS];
        size_t rs[Z8R_ROWS];
        for (int r = 0; r < Z8R_ROWS; r++) {
            /* rows past the matrix read the zero block over and over (their lanes are not stored) */
            rp[r] = r < nr ? (const uint8_t *)w + (size_t)(r0 + r) * w_row : q8_zero_block;
            rs[r] = r < nr ? (size_t)z8_ts(f) : 0;
        }
        for (int64_t k0 = 0; k0 < nb; k0 += Z8R_WB) {
            const int kn = nb - k0 < Z8R_WB ? (int)(nb - k0) : Z8R_WB;
            z8r_decode(f, rp, rs, (const uint8_t *)w + (size_t)r0 * w_row, w_row, nr, k0, kn, &ch);
            for (int c = 0; c < ncols; c++) {
                const act_q8_32 *xa = (const act_q8_32 *)((const char *)x + (size_t)c * x_stride) + k0;
                const float *dc = dx + c * nb + k0;
                const int32_t *sc = xs + c * nb + k0;
                __m512 L[8];
                for (int j = 0; j < 8; j++) L[j] = k0 ? Ls[c][j] : _mm512_setzero_ps();
                int b = 0;
                for (; b + 8 <= kn; b += 8)
                    for (int j = 0; j < 8; j++) L[j] = z8r_block(f, &ch, b + j, xa + b + j, dc + b + j, sc + b + j, L[j]);
                for (int j = 0; b + j < kn; j++) L[j] = z8r_block(f, &ch, b + j, xa + b + j, dc + b + j, sc + b + j, L[j]);
                if (k0 + Z8R_WB < nb) {
                    for (int j = 0; j < 8; j++) Ls[c][j] = L[j];
                    continue;
                }
                const __m512 v = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(L[0], L[4]), _mm512_add_ps(L[2], L[6])),
                                               _mm512_add_ps(_mm512_add_ps(L[1], L[5]), _mm512_add_ps(L[3], L[7])));
                _mm512_mask_storeu_ps(y + (int64_t)c * ldy + r0, (__mmask16)((1u << nr) - 1u), v);
            }
        }
    }
}


/* z8_rows, except that NVFP4's products, and one-column products of rows of at most short_nb blocks,
 * go to short_rows: the AVX2 path's 8-rows kernel of the format (the same bits; avx512_legacy.c and
 * avx512_fp4.c say where it measured faster). */
static inline void z8_rows_or_short(z8fmt f, strata_rows_fn short_rows, int64_t short_nb, int64_t n, const void *w,
                                    size_t w_row, int64_t nrows, const void *x, size_t x_stride, int ncols, float *y,
                                    int64_t ldy) {
    if (f == Z8_NVFP4 || (ncols == 1 && n / (32 * z8_apb(f)) <= short_nb)) {
        short_rows(n, w, w_row, nrows, x, x_stride, ncols, y, ldy);
        return;
    }
    z8_rows(f, n, w, w_row, nrows, x, x_stride, ncols, y, ldy);
}

#endif
