// MUTATION: kernels/cuda/gemv.cuh | c += OPS_WARP) { | c += OPS_WARP / 2) { | gemv.q4_k
// MUTATION: kernels/cuda/gemv.cuh | const float *xc = x + 32 * c; | const float *xc = x + 31 * c; | gemv.iq2_xs
// MUTATION: kernels/cuda/blocks.cuh | act == 1 ? blk_act_d_q8_32(d0) : d0; | d0; | gemv.q8_0
// MUTATION: kernels/cuda/gemv.cuh | for (int i = 0; i < n; i++) acc = fmaf(v[i], xc[i], acc); | for (int i = 0; i < n - 1; i++) acc = fmaf(v[i], xc[i], acc); | lmhead.q6_k
// MUTATION: kernels/cuda/blocks.cuh | v[i + 16] = d * (float)((int)(qs[i] >> 4) - 8); | v[i + 16] = d * (float)((int)(qs[i] & 0x0fu) - 8); | gemm.q4_0
// MUTATION: kernels/cuda/blocks.cuh | const uint8_t *qs = b + 4; | const uint8_t *qs = b + 2; | gemm.q4_1
// MUTATION: kernels/cuda/blocks.cuh | const uint32_t qh = blk_u32(b + 2); | const uint32_t qh = blk_u32(b + 6); | gemm.q5_0
// MUTATION: kernels/cuda/blocks.cuh | const uint32_t sm = b[2 * j + h]; | const uint32_t sm = b[j + h]; | gemm.q2_k
// MUTATION: kernels/cuda/blocks.cuh | (sc[8 + s % 4] >> (2 * (s / 4))) & 3; | (sc[8 + s / 4] >> (2 * (s % 4))) & 3; | gemm.q3_k
// MUTATION: kernels/cuda/blocks.cuh | ((qh[k] >> j) & 1u) << 4 | ((qh[k] >> (j / 2)) & 1u) << 4 | gemm.q5_k
// MUTATION: kernels/cuda/blocks.cuh | strata_iq2xxs_grid)[gi[l]] | strata_iq2xxs_grid)[gi[l + 1]] | gemm.iq2_xxs
// MUTATION: kernels/cuda/blocks.cuh | (uint64_t)grid[qs[2 * l + 1]] << 32 | (uint64_t)grid[qs[2 * l]] << 32 | gemm.iq3_xxs
// MUTATION: kernels/cuda/blocks.cuh | (int)(blk_u16(b + 2) >> (2 * j)) & 3; | (int)(blk_u16(b + 2) >> j) & 3; | gemm.iq4_xs
// MUTATION: kernels/cuda/gemm.cuh | float *out = tile + (r - r0) * K + 32 * c; | float *out = tile + (r - r0) * K + 31 * c; | gemm.q6_k
// MUTATION: kernels/cuda/ops_common.cuh | uint32_t r = (ax >> 13) - (112u << 10); | uint32_t r = (ax >> 13) - (111u << 10); | gemm.q8_0
// MUTATION: kernels/cuda/gemm.cuh | for (int64_t k = 32 * c; k < k1; k++) | for (int64_t k = 32 * c + 1; k < k1; k++) | gemm.f32
// MUTATION: kernels/cuda/gemv.cuh | y[i] *= s; | y[i / 2] *= s; | gemv.scale
// MUTATION: kernels/cuda/emu_small.h | for (int64_t i = 0; i < n; i++) gemv_scale_unit(y, s, i); | for (int64_t i = 1; i < n; i++) gemv_scale_unit(y, s, i); | gemv.scale
// MUTATION: kernels/cuda/emu_small.h | K, xq + t * K, lane); | K, xq, lane); | gemv.q6_k
// MUTATION: kernels/cuda/emu_small.h | const int64_t nb = n * K / bs; | const int64_t nb = K / bs; | gemv.q4_k
// MUTATION: kernels/cuda/emu_small.h | y[t * ldy + r0 + j] = | y[t * ldy + j] = | gemm.q4_k
// MUTATION: kernels/cuda/emu_small.h | const int64_t rows = R - r0 < tile_rows ? R - r0 : tile_rows; | const int64_t rows = R - r0 < tile_rows ? R - r0 - 1 : tile_rows; | gemm.q8_0
/*
 * test_cuda_ops_gemv.c — the host check of the CUDA matrix products (issue 19 point 4): kernels/cuda/
 * blocks.cuh (block decoders), gemv.cuh (decode: y = W x for a few columns) and gemm.cuh (prefill:
 * dequantize to tiles, then the toolkit's GEMM) run on the host over their whole launch grid, against the
 * library's C path (strata_matmul, strata_dequantize), for every weight type the loader accepts. The grids
 * run through the launchers' host emulations (kernels/cuda/emu_small.h), so the mutations above prove the
 * emulation as well as the units.
 *
 *   gemv.<type>   emu_act_quant (gemv_act_block over every activation block), then emu_gemv (for every
 *                 (row, column) the 32 lanes of gemv_lane_partial folded as the warp folds them, ops_fold32),
 *                 against strata_matmul at the model's shapes (2560 -> 320 hc down, 320 -> 10240 hc up,
 *                 2560 -> 512 router, 2560 -> 640 and 640 -> 2560 experts) and odd ones, 2 or 3 columns.
 *                 Bound: |y - y_cpu| <= 1e-5 * sum |w| |x| (the two differ in float summation order only).
 *   lmhead.<type> the same kernel over a 2560 x 8192 slice of the output matrix (Q6_K, Q8_0, F16).
 *   gemm.<type>   (1) tiles: emu_k_gemm_tile_f32 (gemm_tile_f32 over every (row, chunk) of rows [r0, r1)) equals the C
 *                 dequantizer bit for bit, gemm_tile_f16 equals that value rounded to half
 *                 (strata_fp32_to_fp16), on random blocks with subnormal and huge scales and on sane ones
 *                 at K = 2560; (2) products: the f32 tile times 4 columns in f64 (standing in for
 *                 cublasSgemm), the f16 tile times the columns rounded to half in f64 (cublasGemmEx), and
 *                 emu_gemm (the launcher without cuBLAS: float tiles of a few rows, gemm_tile_dot), against
 *                 strata_matmul. The GEMM takes
 *                 unquantized activations, strata_matmul quantized ones (xq), so the bound is
 *                   f32:  sum |w| |x - xq| + 1e-5 * S          (S = sum |w| |x|)
 *                   f16:  that + 2^-10 * S                       (w and x each rounded to half: 2^-11)
 *                 and emu_gemm is also held to 1e-5 * S of the f64 product of the C-dequantized W.
 *   gemv.scale    emu_scale (an NVFP4 tensor's .scale on its product's outputs) after mdl_matmul without the
 *                 scale, against mdl_matmul with it: bit for bit.
 * Each op prints `OP <op> <TYPE> pass|fail <max |y - y_ref| / S>` (gemv.scale: `-` and the relative error).
 * The launchers' argument checks (the status each refuses with) are CHECKed against the emulations too.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/emu_small.h"
#include "model/model.h"
#include "quant/quant.h"

#include "check.h"

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {   // splitmix64
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float urand(void) { return (float)((rnd() >> 40) + 0.5) / 16777216.0f; }   // (0, 1)
static float nrand(void) { return sqrtf(-2.0f * logf(urand())) * cosf(6.2831853f * urand()); }

/* every type of blocks.cuh (the loader's types) */
static const int TYPES[] = {BLK_F32,    BLK_F16,   BLK_BF16,  BLK_Q4_0, BLK_Q4_1, BLK_Q5_0,   BLK_Q5_1,
                            BLK_Q8_0,   BLK_IQ4_NL, BLK_MXFP4, BLK_NVFP4, BLK_Q2_K, BLK_Q3_K,  BLK_Q4_K,
                            BLK_Q5_K,   BLK_Q6_K,  BLK_IQ4_XS, BLK_IQ2_XXS, BLK_IQ2_XS, BLK_IQ3_XXS};
enum { N_TYPES = sizeof TYPES / sizeof TYPES[0] };

/* (K in, R out): the model's dense shapes, then odd ones (a few blocks of the type; K % 32 != 0 for floats) */
static const int64_t REAL[][2] = {{2560, 320}, {320, 10240}, {2560, 512}, {2560, 640}, {640, 2560}};

static void op_name(char *out, size_t cap, const char *family, const strata_qtraits *t) {
    int n = snprintf(out, cap, "%s.", family);
    for (const char *p = t->name; *p && n + 1 < (int)cap; p++) out[n++] = (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
    out[n] = 0;
}

/* The byte offsets of a block's fp16 scales (d, dmin). */
static int scale_offsets(int type, int off[2]) {
    switch (type) {
    case BLK_Q4_1: case BLK_Q5_1: case BLK_Q4_K: case BLK_Q5_K: off[0] = 0; off[1] = 2; return 2;
    case BLK_Q2_K: off[0] = 80; off[1] = 82; return 2;
    case BLK_Q3_K: off[0] = 108; return 1;
    case BLK_Q6_K: off[0] = 208; return 1;
    case BLK_MXFP4: case BLK_NVFP4: return 0;
    default: off[0] = 0; return 1;
    }
}

/* An fp16 scale: wild mixes subnormal, huge and ordinary ones (for the decoders); sane keeps sums finite. */
static uint16_t scale_f16(int wild) {
    if (wild) {
        const int kind = (int)(rnd() % 8);
        if (kind == 0) return (uint16_t)(rnd() & 0x83ffu);                         // subnormal (or zero)
        if (kind == 1) return strata_fp32_to_fp16((rnd() & 1 ? -1.0f : 1.0f) * (1000.0f + 59000.0f * urand()));
        return strata_fp32_to_fp16((rnd() & 1 ? -1.0f : 1.0f) * 2.0f * urand());
    }
    return strata_fp32_to_fp16((rnd() & 1 ? -1.0f : 1.0f) * (0.01f + 0.03f * urand()));
}

/* R rows of K values of `type`, random valid blocks. */
static void make_rows(int type, int64_t R, int64_t K, int wild, uint8_t *w) {
    const int bs = blk_size(type), ts = blk_bytes(type);
    const int64_t nb = R * K / bs;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = w + b * ts;
        if (type == BLK_F32) {
            float f = 0.5f * nrand();
            uint32_t u;
            memcpy(&u, &f, 4);
            if (wild) u = (uint32_t)rnd();
            memcpy(p, &u, 4);
            continue;
        }
        if (type == BLK_F16 || type == BLK_BF16) {
            const float f = 0.5f * nrand();
            uint32_t u;
            memcpy(&u, &f, 4);
            const uint16_t h = wild ? (uint16_t)rnd() : type == BLK_F16 ? strata_fp32_to_fp16(f) : (uint16_t)(u >> 16);
            memcpy(p, &h, 2);
            continue;
        }
        for (int i = 0; i < ts; i++) p[i] = (uint8_t)rnd();
        int off[2];
        const int ns = scale_offsets(type, off);
        for (int s = 0; s < ns; s++) {
            const uint16_t h = scale_f16(wild);
            memcpy(p + off[s], &h, 2);
        }
        if (!wild && type == BLK_MXFP4) p[0] = (uint8_t)(118 + rnd() % 12);        // 2^-10 .. 2^1
        if (!wild && type == BLK_NVFP4)
            for (int s = 0; s < 4; s++) p[s] = (uint8_t)(rnd() & 0x3f);               // exponent <= 7
    }
}

/* n columns of K activations: normal values, a column scale, a few outliers (so q8 blocks differ). */
static void make_x(float *x, int64_t n, int64_t K) {
    for (int64_t t = 0; t < n; t++) {
        const float cs = 0.1f + 3.0f * urand();
        for (int64_t k = 0; k < K; k++) x[t * K + k] = cs * nrand() * (rnd() % 61 == 0 ? 20.0f : 1.0f);
    }
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    return p;
}

/* ---------------------------------------------------------------- gemv */

/* gemv.cuh's launchers emulated over R rows x n columns against strata_matmul; returns the largest
 * |y - y_cpu| / sum |w| |x| and adds to *bad the outputs past 1e-5. */
static double run_gemv(int type, int64_t R, int64_t K, int64_t n, int *bad) {
    const strata_qtraits *t = strata_qtraits_get(type);
    const size_t row_bytes = (size_t)(K / t->block_size) * (size_t)t->type_size, wsize = row_bytes * (size_t)R;
    uint8_t *w = xmalloc(wsize);
    float *x = xmalloc(sizeof(float) * (size_t)(n * K)), *xq = xmalloc(sizeof(float) * (size_t)(n * K));
    float *wf = xmalloc(sizeof(float) * (size_t)(R * K));
    float *y = xmalloc(sizeof(float) * (size_t)(n * R)), *ycpu = xmalloc(sizeof(float) * (size_t)(n * R));
    make_rows(type, R, K, 0, w);
    make_x(x, n, K);
    CHECK(strata_matmul(NULL, type, w, wsize, R, K, x, n, ycpu, STRATA_ISA_AUTO) == STRATA_OK);
    CHECK(strata_dequantize(type, w, wsize, wf, R * K, STRATA_ISA_SCALAR) == STRATA_OK);
    memset(xq, 0xff, sizeof(float) * (size_t)(n * K));   // NaN wherever a unit fails to write
    memset(y, 0xff, sizeof(float) * (size_t)(n * R));
    // the activations quantized as the type's qtraits say, then one warp per (row, column)
    CHECK(emu_act_quant(NULL, (int)t->act, x, xq, n, K) == STRATA_OK);
    CHECK(emu_gemv(NULL, type, w, row_bytes, R, K, xq, n, y) == STRATA_OK);
    double worst = 0.0;
    for (int64_t c = 0; c < n; c++)
        for (int64_t r = 0; r < R; r++) {
            double s = 0.0;
            for (int64_t k = 0; k < K; k++) s += fabs((double)wf[r * K + k]) * fabs((double)x[c * K + k]);
            const double e = fabs((double)y[c * R + r] - (double)ycpu[c * R + r]) / (s > 0.0 ? s : 1.0);
            if (!(e <= 1e-5)) (*bad)++;
            if (!(e <= worst)) worst = e;   // NaN sticks
        }
    free(w); free(x); free(xq); free(wf); free(y); free(ycpu);
    return worst;
}

static void check_gemv(int type, int all_shapes) {
    const strata_qtraits *t = strata_qtraits_get(type);
    CHECK(t != NULL && blk_supported(type) && blk_size(type) == t->block_size && blk_bytes(type) == t->type_size);
    if (!t) return;
    int bad = 0;
    double worst = 0.0;
    for (int s = 0; s < (int)(sizeof REAL / sizeof REAL[0]); s++) {
        const int64_t K = REAL[s][0], R = REAL[s][1];
        if (K % t->block_size) continue;   // a real file cannot hold this type at this width
        if (!all_shapes && s > 0) break;   // types no recipe uses for dense tensors: one real shape
        const double e = run_gemv(type, R, K, 2, &bad);
        if (!(e <= worst)) worst = e;
    }
    const int64_t K_odd = t->block_size > 1 ? 3 * (int64_t)t->block_size : 100;
    const double e1 = run_gemv(type, 37, K_odd, 3, &bad);
    const double e2 = run_gemv(type, 5, t->block_size > 1 ? t->block_size : 7, 1, &bad);   // one block per row
    if (!(e1 <= worst)) worst = e1;
    if (!(e2 <= worst)) worst = e2;
    char op[64];
    op_name(op, sizeof op, "gemv", t);
    printf("OP %s %s %s %.3g\n", op, t->name, bad ? "fail" : "pass", worst);
    CHECK(bad == 0);
}

static void check_lmhead(int type) {
    const strata_qtraits *t = strata_qtraits_get(type);
    int bad = 0;
    const double e = run_gemv(type, 8192, 2560, 1, &bad);
    char op[64];
    op_name(op, sizeof op, "lmhead", t);
    printf("OP %s %s %s %.3g\n", op, t->name, bad ? "fail" : "pass", e);
    CHECK(bad == 0);
}

/* ---------------------------------------------------------------- gemm */

/* Rows [r0, r1) of R x K rows decoded by gemm.cuh's tile units over every (row, chunk), against the C
 * dequantizer; returns the number of values that differ. */
static int64_t tile_mismatches(int type, int64_t R, int64_t K, int64_t r0, int64_t r1, int wild) {
    const size_t row_bytes = (size_t)(K / blk_size(type)) * (size_t)blk_bytes(type), wsize = row_bytes * (size_t)R;
    uint8_t *w = xmalloc(wsize);
    float *ref = xmalloc(sizeof(float) * (size_t)(R * K)), *t32 = xmalloc(sizeof(float) * (size_t)((r1 - r0) * K));
    uint16_t *t16 = xmalloc(sizeof(uint16_t) * (size_t)((r1 - r0) * K));
    make_rows(type, R, K, wild, w);
    CHECK(strata_dequantize(type, w, wsize, ref, R * K, STRATA_ISA_SCALAR) == STRATA_OK);
    memset(t32, 0xff, sizeof(float) * (size_t)((r1 - r0) * K));   // NaN everywhere a unit fails to write
    memset(t16, 0xff, sizeof(uint16_t) * (size_t)((r1 - r0) * K));
    emu_k_gemm_tile_f32(type, w, row_bytes, K, r0, r1, t32);
    emu_k_gemm_tile_f16(type, w, row_bytes, K, r0, r1, t16);
    int64_t bad = 0;
    for (int64_t r = r0; r < r1; r++)
        for (int64_t k = 0; k < K; k++) {
            const float a = t32[(r - r0) * K + k], b = ref[r * K + k];
            if (memcmp(&a, &b, 4) != 0) bad++;
            if (t16[(r - r0) * K + k] != strata_fp32_to_fp16(b)) bad++;
        }
    free(w); free(ref); free(t32); free(t16);
    return bad;
}

/* Sane rows [r0, r1) of R x K times n columns three ways (f32 tile in f64, f16 tile and halves in f64,
 * emu_gemm through a tile of GEMM_TILE_ROWS rows) against strata_matmul within the bounds of the header; adds to *bad the outputs past
 * their bound and raises *ge. */
typedef struct {
    double vs_cpu;   // max |y - y_cpu| / S over the three products (mostly strata_matmul's activation rounding)
    double ratio;    // max |y - y_cpu| / its bound
    double f16;      // max |y16 - y_ref| / S, y_ref the f64 product of the C-dequantized W and x
    double dot;      // max |emu_gemm - y_ref| / S
} gemm_err;

enum { GEMM_TILE_ROWS = 5 };   // emu_gemm's tile: several passes over R, the last one short

static void worse(double *w, double e) { if (!(e <= *w)) *w = e; }   // NaN sticks

static void gemm_products(int type, int64_t R, int64_t K, int64_t r0, int64_t r1, int64_t n, int *bad, gemm_err *ge) {
    const strata_qtraits *t = strata_qtraits_get(type);
    const size_t row_bytes = (size_t)(K / t->block_size) * (size_t)t->type_size, wsize = row_bytes * (size_t)R;
    const int64_t rows = r1 - r0;
    uint8_t *w = xmalloc(wsize);
    float *x = xmalloc(sizeof(float) * (size_t)(n * K)), *xq = xmalloc(sizeof(float) * (size_t)(n * K));
    float *wf = xmalloc(sizeof(float) * (size_t)(R * K)), *t32 = xmalloc(sizeof(float) * (size_t)(rows * K));
    uint16_t *t16 = xmalloc(sizeof(uint16_t) * (size_t)(rows * K)), *x16 = xmalloc(sizeof(uint16_t) * (size_t)(n * K));
    float *ycpu = xmalloc(sizeof(float) * (size_t)(n * R)), *yg = xmalloc(sizeof(float) * (size_t)(n * R));
    const size_t tile_bytes = emu_gemm_tile_bytes(K, GEMM_TILE_ROWS, 0) + 7;   // not a whole number of rows
    float *tile = xmalloc(tile_bytes);
    make_rows(type, R, K, 0, w);
    make_x(x, n, K);
    CHECK(strata_matmul(NULL, type, w, wsize, R, K, x, n, ycpu, STRATA_ISA_AUTO) == STRATA_OK);
    CHECK(strata_dequantize(type, w, wsize, wf, R * K, STRATA_ISA_SCALAR) == STRATA_OK);
    CHECK(emu_act_quant(NULL, (int)t->act, x, xq, n, K) == STRATA_OK);   // what strata_matmul multiplies
    emu_k_gemm_tile_f32(type, w, row_bytes, K, r0, r1, t32);
    emu_k_gemm_tile_f16(type, w, row_bytes, K, r0, r1, t16);
    emu_k_gemm_x_f16(x, x16, n * K);
    memset(yg, 0xff, sizeof(float) * (size_t)(n * R));   // NaN wherever the product fails to write
    CHECK(emu_gemm(NULL, NULL, type, w, row_bytes, R, K, x, n, yg, tile, tile_bytes, 0, NULL) == STRATA_OK);
    for (int64_t c = 0; c < n; c++)
        for (int64_t j = 0; j < rows; j++) {
            const float *tr = t32 + j * K, *xc = x + c * K, *wr = wf + (r0 + j) * K;
            double y32 = 0.0, y16 = 0.0, yref = 0.0, S = 0.0, dq = 0.0;
            for (int64_t k = 0; k < K; k++) {
                y32 += (double)tr[k] * xc[k];
                y16 += (double)strata_fp16_to_fp32(t16[j * K + k]) * strata_fp16_to_fp32(x16[c * K + k]);
                yref += (double)wr[k] * xc[k];
                S += fabs((double)wr[k]) * fabs((double)xc[k]);
                dq += fabs((double)wr[k]) * fabs((double)xc[k] - (double)xq[c * K + k]);
            }
            const double ydot = yg[c * R + r0 + j], cpu = ycpu[c * R + r0 + j], s = S > 0.0 ? S : 1.0;
            const double b32 = dq + 1e-5 * s, b16 = b32 + 0x1p-10 * s;
            const double e32 = fabs(y32 - cpu), e16 = fabs(y16 - cpu), edot = fabs(ydot - cpu);
            const double eref = fabs(ydot - yref);
            if (!(e32 <= b32) || !(e16 <= b16) || !(edot <= b32) || !(eref <= 1e-5 * s)) (*bad)++;
            worse(&ge->vs_cpu, fmax(fmax(e32, e16), edot) / s);
            worse(&ge->ratio, fmax(fmax(e32 / b32, e16 / b16), edot / b32));
            worse(&ge->f16, fabs(y16 - yref) / s);
            worse(&ge->dot, eref / s);
        }
    free(w); free(x); free(xq); free(wf); free(t32); free(t16); free(x16); free(ycpu); free(yg); free(tile);
}

static void check_gemm(int type) {
    const strata_qtraits *t = strata_qtraits_get(type);
    const int64_t bs = t->block_size;
    int bad = 0;
    const int64_t mism = tile_mismatches(type, 7, bs > 1 ? 3 * bs : 100, 2, 7, 1) +
                         tile_mismatches(type, 40, 2560, 8, 40, 0);
    gemm_err ge = {0, 0, 0, 0};
    gemm_products(type, 48, 2560, 16, 48, 4, &bad, &ge);
    gemm_products(type, 9, bs > 1 ? bs : 100, 0, 9, 3, &bad, &ge);
    char op[64];
    op_name(op, sizeof op, "gemm", t);
    printf("# %s: %lld tile values differ; vs strata_matmul %.3g of S, %.3g of the bound; f16 vs f64 %.3g, "
           "emu_gemm vs f64 %.3g of S; %d products past their bound\n",
           op, (long long)mism, ge.vs_cpu, ge.ratio, ge.f16, ge.dot, bad);
    printf("OP %s %s %s %.3g\n", op, t->name, mism || bad ? "fail" : "pass", ge.vs_cpu);
    CHECK(mism == 0 && bad == 0);
}

/* ---------------------------------------------------------------- scale */

/* An NVFP4 matrix (R x K, n_mat stacked) with a .scale per matrix, as the loader binds one. */
static mdl_mat nvfp4_mat(int64_t R, int64_t K, int64_t n_mat, const float *scale, uint8_t **store) {
    const strata_qtraits *t = strata_qtraits_get(GT_NVFP4);
    const size_t row_bytes = (size_t)(K / t->block_size) * (size_t)t->type_size;
    *store = xmalloc(row_bytes * (size_t)(R * n_mat));
    make_rows(BLK_NVFP4, R * n_mat, K, 0, *store);
    mdl_mat w = {.data = (const char *)*store, .t = t, .rows = R, .cols = K, .n_mat = n_mat, .row_bytes = row_bytes,
                 .mat_bytes = row_bytes * (size_t)R, .scale = scale, .n_scale = n_mat};
    return w;
}

/* What the device forward does for a tensor with a .scale (the product, then emu_scale over its L x R
 * outputs) against mdl_matmul, which scales inside: bit for bit. */
static void check_scale(void) {
    /* R, K, L, stacked matrices, the one multiplied: an expert's down and gate shapes, one of two
     * stacked experts, a small odd one */
    static const int64_t cases[][5] = {{2560, 640, 3, 1, 0}, {640, 2560, 2, 2, 1}, {37, 192, 1, 1, 0}};
    strata_model *m = calloc(1, sizeof *m);   // no pool (serial), the best ISA
    double worst = 0.0;
    int bad = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t R = cases[c][0], K = cases[c][1], L = cases[c][2], nm = cases[c][3], mi = cases[c][4];
        /* per-tensor scales as NVFP4 files carry them (~1e-3), larger ones, a negative one */
        const float scale[2] = {c == 2 ? -0.75f : 0.0005f + 0.004f * urand(), 0.5f + 2.0f * urand()};
        uint8_t *store;
        const mdl_mat ws = nvfp4_mat(R, K, nm, scale, &store);
        mdl_mat w0 = ws;
        w0.scale = NULL;
        w0.n_scale = 0;
        float *x = xmalloc(sizeof(float) * (size_t)(L * K)), *y = xmalloc(sizeof(float) * (size_t)(L * R));
        float *ref = xmalloc(sizeof(float) * (size_t)(L * R));
        make_x(x, L, K);
        CHECK(mdl_matmul(m, &ws, mi, x, L, ref) == STRATA_OK);
        CHECK(mdl_matmul(m, &w0, mi, x, L, y) == STRATA_OK);
        CHECK(emu_scale(NULL, y, L * R, mdl_mat_scale(&ws, mi)) == STRATA_OK);
        double md = 0.0, mr = 0.0;
        for (int64_t i = 0; i < L * R; i++) {
            if (memcmp(&y[i], &ref[i], sizeof(float))) bad++;
            worse(&md, fabs((double)y[i] - (double)ref[i]));
            worse(&mr, fabs((double)ref[i]));
        }
        worse(&worst, md == 0.0 ? 0.0 : md / (mr > 0.0 ? mr : 1e-30));
        free(store); free(x); free(y); free(ref);
    }
    free(m);
    printf("OP gemv.scale - %s %.3g\n", bad ? "fail" : "pass", worst);
    CHECK(bad == 0);
}

/* ---------------------------------------------------------------- launch arguments */

/* The emulations refuse what their launchers refuse, with the same status, before touching memory. */
static void check_launch_args(void) {
    float f[256] = {0};
    uint8_t wq[210] = {0};   // a Q6_K block
    size_t rb = 210;
    void *h = (void *)1;
    CHECK(emu_act_quant(NULL, 3, f, f, 1, 32) == STRATA_ERR_INVALID_ARG);
    CHECK(emu_act_quant(NULL, 1, f, f, 1, 33) == STRATA_ERR_INVALID_ARG);
    CHECK(emu_act_quant(NULL, 2, f, f, -1, 256) == STRATA_ERR_INVALID_ARG);
    CHECK(emu_act_quant(NULL, 1, f, f, 0, 64) == STRATA_OK);
    CHECK(emu_gemv(NULL, 34, wq, rb, 1, 256, f, 1, f) == STRATA_ERR_UNSUPPORTED);   // TQ1_0: no kernel
    CHECK(emu_gemv(NULL, BLK_Q6_K, wq, rb, 1, 128, f, 1, f) == STRATA_ERR_INVALID_ARG);
    CHECK(emu_gemv(NULL, BLK_Q6_K, wq, rb, -1, 256, f, 1, f) == STRATA_ERR_INVALID_ARG);
    CHECK(emu_gemv(NULL, BLK_Q6_K, wq, rb, 0, 256, f, 1, f) == STRATA_OK);
    CHECK(emu_scale(NULL, f, -1, 2.0f) == STRATA_ERR_INVALID_ARG);
    CHECK(emu_scale(NULL, f, 0, 2.0f) == STRATA_OK);
    CHECK(emu_gemm_create(&h) == STRATA_OK && h == NULL);
    emu_gemm_destroy(h);
    CHECK(emu_gemm_tile_bytes(2560, 3, 1) == 2560 * 3 * 2 && emu_gemm_tile_bytes(2560, 3, 0) == 2560 * 3 * 4);
    CHECK(emu_gemm(h, NULL, 34, wq, rb, 1, 256, f, 1, f, f, sizeof f, 0, NULL) == STRATA_ERR_UNSUPPORTED);
    CHECK(emu_gemm(h, NULL, BLK_Q6_K, wq, rb, 1, 255, f, 1, f, f, sizeof f, 0, NULL) == STRATA_ERR_INVALID_ARG);
    CHECK(emu_gemm(h, NULL, BLK_Q6_K, wq, rb, 1, 256, f, (int64_t)1 << 31, f, f, sizeof f, 0, NULL) ==
          STRATA_ERR_INVALID_ARG);
    CHECK(emu_gemm(h, NULL, BLK_Q6_K, wq, rb, 1, 256, f, 1, f, f, sizeof f - 1, 0, NULL) ==
          STRATA_ERR_BUFFER_TOO_SMALL);
    CHECK(emu_gemm(h, NULL, BLK_Q6_K, wq, rb, 0, 256, f, 1, f, f, 0, 0, NULL) == STRATA_OK);   // nothing to do
}

int main(void) {
    // the dense types of the quantization recipes: every real shape; the others, one real shape and the odd ones
    static const int RECIPE[] = {BLK_IQ2_XS, BLK_Q4_K, BLK_Q6_K, BLK_Q8_0, BLK_Q5_1,
                                 BLK_IQ4_NL, BLK_NVFP4, BLK_F16, BLK_F32};
    for (int i = 0; i < N_TYPES; i++) {
        int recipe = 0;
        for (size_t j = 0; j < sizeof RECIPE / sizeof RECIPE[0]; j++) recipe |= RECIPE[j] == TYPES[i];
        check_gemv(TYPES[i], recipe);
    }
    check_lmhead(BLK_Q6_K);
    check_lmhead(BLK_Q8_0);
    check_lmhead(BLK_F16);
    for (int i = 0; i < N_TYPES; i++) check_gemm(TYPES[i]);
    check_scale();
    check_launch_args();
    if (!g_failed) printf("all checks passed\n");
    return g_failed != 0;
}
