// MUTATION: kernels/cuda/ple.cuh | (k % 2) ? c >> 4 : c & 15u | (k % 2) ? c & 15u : c >> 4 | ple.dequant
// MUTATION: kernels/cuda/ple.cuh | row[dim / 2 + k / 16] | row[dim / 2 + k / 32] | ple.dequant
// MUTATION: kernels/cuda/ple.cuh | ((e + 120u) << 23) | ((e + 121u) << 23) | ple.dequant
// MUTATION: kernels/cuda/ple.cuh | if (sh >= n_shard) sh = n_shard - 1; | if (sh >= n_shard) sh = 0; | ple.dequant
// MUTATION: kernels/cuda/ple.cuh | const int64_t i = v / dP, k = v % dP; | const int64_t i = v / dP, k = (v + 1) % dP; | ple.dequant
// MUTATION: kernels/cuda/ple.cuh | r * w[(g % hc) * E + k] | r * w[(g / hc) * E + k] | ple.project
// MUTATION: kernels/cuda/ple.cuh | return ple_sumsq_lane(key + g * E, E, lane); | return ple_sumsq_lane(key + g * E, E - 1, lane); | ple.project
// MUTATION: kernels/cuda/ple.cuh | *kk = key + g * E | *kk = key + (g / hc) * hc * E | ple.gate
// MUTATION: kernels/cuda/ple.cuh | return ple_sumsq_lane(X + g * E, E, lane); | return ple_sumsq_lane(X + g * E, E, lane + 1); | ple.gate
// MUTATION: kernels/cuda/ple.cuh | : sc < 0.0f ? -sqrtf(fmaxf(-sc, 1e-6f)) | : sc < 0.0f ? sqrtf(fmaxf(-sc, 1e-6f)) | ple.gate
// MUTATION: kernels/cuda/ple.cuh | return sg * val[(g / hc) * E + k]; | return sg * val[(g % hc) * E + k]; | ple.gate
// MUTATION: kernels/cuda/ple.cuh | * rg * wc[(g % hc) * E + k] | * rg * wc[k] | ple.gate
// MUTATION: kernels/cuda/ple.cuh | acc += w[c * Kp + k] * | acc += w[c * Kp + (Kp - 1 - k)] * | ple.conv
// MUTATION: kernels/cuda/ple.cuh | return X[v] + (gv[v] + ops_silu(acc)); | return X[v] + ops_silu(acc); | ple.conv
// MUTATION: kernels/cuda/ple.cuh | return ext[L * W + v]; | return ext[(L - 1) * W + v]; | ple.conv
// MUTATION: kernels/cuda/ple.cuh | return ext[(t + 1) * W + r]; | return ext[t * W + r]; | ple.conv
// MUTATION: kernels/cuda/mtp.cuh | rinv[2 * t + 1] | rinv[2 * t] | mtp.norm_concat
// MUTATION: kernels/cuda/mtp.cuh | j = (v / (2 * E)) % hc | j = (v / E) % hc | mtp.norm_concat
// MUTATION: kernels/cuda/mtp.cuh | ? h + t * hc * E : e + t * E; | ? h + t * E : e + t * E; | mtp.norm_concat
// MUTATION: kernels/cuda/emu_mixers.h | const int64_t n = n_rows * dP; | const int64_t n = n_rows * dP - 1; | ple.dequant
// MUTATION: kernels/cuda/emu_mixers.h | if (dP % 16 || row_bytes | if (row_bytes | ple.dequant
// MUTATION: kernels/cuda/emu_mixers.h | E, g, r, k); | E, g, 1.0f, k); | ple.project
// MUTATION: kernels/cuda/emu_mixers.h | ple_gate_gvn(val, w_conv, hc | ple_gate_gvn(val, w_query, hc | ple.gate
// MUTATION: kernels/cuda/emu_mixers.h | if (hist > 0) memcpy(ext, state, | if (hist < 0) memcpy(ext, state, | ple.conv
// MUTATION: kernels/cuda/emu_mixers.h | mtp_norm_rinv(ops_fold32(p), hc, E, u, eps) | mtp_norm_rinv(ops_fold32(p), hc, E, u ^ 1, eps) | mtp.norm_concat
/*
 * test_cuda_ops_ple.c — the host check of kernels/cuda/ple.cuh and mtp.cuh (ops_common.cuh's rule):
 * every unit of each launch is computed with the headers' OPS_FN functions, in the order the kernels
 * use them (warp units: 32 lane partials folded by ops_fold32, as ops_warp_sum does), and compared
 * with the C path's function for the same op (model/ple_layer.c, model/mtp.c). Each launch is its
 * launcher's host emulation (emu_ple_*, emu_mtp_* of kernels/cuda/emu_mixers.h, the launcher's
 * signature), so a mutation of the units fails the emulation too; its status must be the launcher's
 * (ple.dequant's refusals of rows it cannot decode included):
 *
 *   ple.dequant      mdl_ple_dequant     bit for bit, per row format
 *   ple.project      mdl_ple_key_norm    relative error (the C norms sum in double, the warps in float)
 *   ple.gate         mdl_ple_gate        relative error, over gv and gvn
 *   ple.conv         mdl_ple_conv        X, the new history and the verify slots (and without slots)
 *   mtp.norm_concat  mdl_mtp_norm_concat relative error
 *
 * Shapes: the real model's (hidden 2560, 4 streams, 16 heads x 160 values, conv 4 taps 3 apart, L = 1
 * and 7, 128 table shards) and small odd ones (widths that are not a multiple of 32, L > history).
 * Errors are max |kernel - C| / max |C| over an op's outputs. Fixed seeds.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/emu_mixers.h"
#include "quant/quant.h"

#include "check.h"

/* The C path's ops (ple_layer.c, mtp.c: not in model.h). */
void mdl_ple_dequant(const uint8_t *buf, size_t rb, int64_t n_rows, int64_t NH, int64_t dP, int64_t E,
                     const strata_qtraits *t, const uint64_t *row_ids, const float *gscale, int64_t n_shard,
                     int64_t shard_rows, float *emb);
void mdl_ple_key_norm(float *key, const float *w, int64_t R, int64_t hc, int64_t E, float eps);
void mdl_ple_gate(const float *X, const float *key, const float *val, const float *w_query, const float *w_conv,
                  int64_t L, int64_t hc, int64_t E, float eps, float *gv, float *gvn, float *qry);
void mdl_ple_conv(const float *ext, const float *gv, const float *w_conv, int64_t L, int64_t W, int64_t Kp, int64_t n,
                  float *X, float *state, float *slots);
void mdl_mtp_norm_concat(const float *e, const float *h, const float *enorm, const float *hnorm, int64_t hc,
                         int64_t E, float eps, float *row, float *tmp);

static const float EPS = 1e-6f;     /* rms_norm_eps of the real checkpoint */
static const double TOL = 1e-5;     /* float vs double sums of squares, float dot products in another order */

/* ---------------------------------------------------------------- helpers */

static uint64_t g_rng;
static uint64_t rnd(void) {
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static float urand(void) { return (float)((double)(rnd() >> 11) * 0x1p-53 * 2.0 - 1.0); }   /* [-1, 1) */
static void fill(float *x, int64_t n, float scale, float offset) {
    for (int64_t i = 0; i < n; i++) x[i] = offset + scale * urand();
}
static float *alloc_f(int64_t n) {
    float *p = calloc((size_t)(n > 0 ? n : 1), sizeof(float));
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    return p;
}

/* max |a - ref| / max |ref| over the finite values of ref. */
static double rel_err(const float *a, const float *ref, int64_t n) {
    double scale = 0.0, d = 0.0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(ref[i]) && fabs(ref[i]) > scale) scale = fabs(ref[i]);
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(ref[i])) continue;
        const double e = isfinite(a[i]) ? fabs((double)a[i] - ref[i]) : INFINITY;
        if (e > d) d = e;
    }
    return scale > 0.0 ? d / scale : d;
}

static int same_bits(const float *a, const float *b, int64_t n) {
    return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

/* One op's result over all its cases. */
typedef struct { const char *op, *types; int fail; double err; } op_result;

static void note(op_result *r, double err, int ok) {
    if (!(err <= r->err)) r->err = err;   /* NaN sticks */
    if (!ok) r->fail = 1;
}

/* A launch's status against the launcher's (want): a mismatch fails the op. */
static void expect_status(op_result *r, const char *what, strata_status got, strata_status want) {
    if (got == want) return;
    fprintf(stderr, "%s %s %s: status %d, the launcher's %d (%s)\n", r->op, r->types, what, (int)got, (int)want,
            strata_last_error());
    note(r, INFINITY, 0);
}

static void report(op_result *r) {
    printf("OP %s %s %s %.3g\n", r->op, r->types, r->fail ? "fail" : "pass", r->err);
    CHECK(!r->fail);
}

/* A random finite fp16 bit pattern with exponent field in [lo, hi] (0: subnormals). */
static uint16_t rnd_f16(unsigned lo, unsigned hi) {
    const uint64_t x = rnd();
    const unsigned e = lo + (unsigned)(x % (hi - lo + 1));
    return (uint16_t)(((x >> 16) & 1u) << 15 | e << 10 | ((x >> 20) & 0x3ffu));
}

/* ---------------------------------------------------------------- ple.dequant */

static void check_dequant(op_result *r, int fmt, int64_t R, int64_t NH, int64_t dP, int64_t n_shard,
                          int64_t shard_rows, uint64_t seed) {
    g_rng = seed;
    const int packed = fmt == PLE_ROWS_NVFP4_PACKED;
    const size_t rb = packed ? (size_t)(dP / 2 + dP / 16) : (size_t)(dP / blk_size(fmt) * blk_bytes(fmt));
    const int64_t n_rows = R * NH, n = n_rows * dP;
    uint8_t *rows = malloc(rb * (size_t)n_rows);
    uint64_t *ids = malloc((size_t)n_rows * sizeof(uint64_t));
    float *gscale = alloc_f(n_shard), *ref = alloc_f(n), *got = alloc_f(n);
    if (!rows || !ids) { fprintf(stderr, "out of memory\n"); exit(2); }
    for (size_t i = 0; i < rb * (size_t)n_rows; i++) rows[i] = (uint8_t)rnd();   /* every code and scale byte */
    if (fmt == BLK_IQ4_NL || fmt == BLK_Q8_0)                 /* finite block scales (fp16 at each block's start) */
        for (int64_t i = 0; i < n_rows; i++)
            for (int64_t b = 0; b < dP / 32; b++) {
                const uint16_t h = rnd_f16(0, 20);
                memcpy(rows + (size_t)i * rb + (size_t)b * (size_t)blk_bytes(fmt), &h, 2);
            }
    if (fmt == BLK_F16)                                       /* finite values, subnormals included */
        for (int64_t i = 0; i < n_rows * dP; i++) {
            const uint16_t h = rnd_f16(0, 30);
            memcpy(rows + (size_t)i * 2, &h, 2);
        }
    /* ids over every shard, and past the last full one (the clamp to the last shard) */
    for (int64_t i = 0; i < n_rows; i++) ids[i] = rnd() % (uint64_t)((n_shard + 1) * shard_rows);
    for (int64_t i = 0; i < n_shard; i++) gscale[i] = ldexpf(1.0f + 0.5f * urand(), -(int)(rnd() % 12));
    const strata_qtraits *t = packed ? NULL : strata_qtraits_get(fmt);
    CHECK(packed || (t && t->dequant[0]));
    if (!packed && !(t && t->dequant[0])) { note(r, INFINITY, 0); goto out; }
    mdl_ple_dequant(rows, rb, n_rows, NH, dP, NH * dP, t, ids, gscale, n_shard, shard_rows, ref);
    expect_status(r, "launch", emu_ple_dequant(fmt, rows, rb, n_rows, dP, ids, gscale, n_shard, shard_rows, got, NULL),
                  STRATA_OK);
    note(r, rel_err(got, ref, n), same_bits(got, ref, n));
out:
    free(rows); free(ids); free(gscale); free(ref); free(got);
}

/* What ple_cuda_dequant refuses (rows it cannot decode into dP values) and its empty launch. The buffers
 * are real (one row of zero bytes) so that an emulation that wrongly accepts returns a status, not a fault. */
static void check_dequant_refusals(op_result *q8, op_result *packed) {
    const int P = PLE_ROWS_NVFP4_PACKED;
    const strata_status U = STRATA_ERR_UNSUPPORTED;
    uint8_t rows[256] = {0};
    const uint64_t ids[1] = {0};
    const float gs[1] = {1.0f};
    float emb[64];
    expect_status(packed, "dP 40", emu_ple_dequant(P, rows, 25, 1, 40, ids, gs, 1, 1, emb, NULL), U);
    expect_status(packed, "26-byte rows of 48", emu_ple_dequant(P, rows, 26, 1, 48, ids, gs, 1, 1, emb, NULL), U);
    expect_status(packed, "no shards", emu_ple_dequant(P, rows, 27, 1, 48, ids, gs, 0, 1, emb, NULL), U);
    expect_status(packed, "0-row shards", emu_ple_dequant(P, rows, 27, 1, 48, ids, gs, 1, 0, emb, NULL), U);
    expect_status(packed, "no rows", emu_ple_dequant(P, rows, 27, 0, 48, ids, gs, 1, 1, emb, NULL), STRATA_OK);
    expect_status(q8, "type 9999", emu_ple_dequant(9999, rows, 68, 1, 64, NULL, NULL, 0, 0, emb, NULL), U);
    expect_status(q8, "dP 48", emu_ple_dequant(BLK_Q8_0, rows, 68, 1, 48, NULL, NULL, 0, 0, emb, NULL), U);
    expect_status(q8, "67-byte rows of 64", emu_ple_dequant(BLK_Q8_0, rows, 67, 1, 64, NULL, NULL, 0, 0, emb, NULL), U);
    expect_status(q8, "no rows", emu_ple_dequant(BLK_Q8_0, rows, 68, 0, 64, NULL, NULL, 0, 0, emb, NULL), STRATA_OK);
}

/* ---------------------------------------------------------------- ple.project */

static void check_project(op_result *r, int64_t R, int64_t hc, int64_t E, uint64_t seed) {
    g_rng = seed;
    const int64_t W = hc * E;
    float *key = alloc_f(R * W), *ref = alloc_f(R * W), *w = alloc_f(W);
    for (int64_t g = 0; g < R * hc; g++) fill(key + g * E, E, ldexpf(1.0f, (int)(rnd() % 9) - 4), 0.0f);
    fill(w, W, 0.3f, 1.0f);
    memcpy(ref, key, (size_t)(R * W) * sizeof(float));
    mdl_ple_key_norm(ref, w, R, hc, E, EPS);
    /* ple_cuda_key_norm's grid: a warp per group, in place (each lane rewrites only the values it read) */
    expect_status(r, "launch", emu_ple_key_norm(key, w, R, hc, E, EPS, NULL), STRATA_OK);
    const double e = rel_err(key, ref, R * W);
    note(r, e, e <= TOL);
    free(key); free(ref); free(w);
}

/* ---------------------------------------------------------------- ple.gate */

static void check_gate(op_result *r, int64_t L, int64_t hc, int64_t E, uint64_t seed) {
    g_rng = seed;
    const int64_t W = hc * E;
    float *X = alloc_f(L * W), *key = alloc_f(L * W), *val = alloc_f(L * E), *wq = alloc_f(W), *wc = alloc_f(W);
    float *gv = alloc_f(L * W), *gvn = alloc_f(L * W), *gv_ref = alloc_f(L * W), *gvn_ref = alloc_f(L * W);
    float *qry = alloc_f(W);
    fill(X, L * W, 3.0f, 0.0f);
    fill(val, L * E, 1.0f, 0.0f);
    fill(wq, W, 0.3f, 1.0f);
    fill(wc, W, 0.3f, 1.0f);
    /* key: normalised rows (as ple.project leaves them) biased toward qry so scores have both signs and
     * a spread of sizes; stream 1 of token 0 is zero (score 0: sign(0) = 0), stream 2 tiny (the 1e-6 floor) */
    for (int64_t g = 0; g < L * hc; g++) {
        const float a = urand();
        for (int64_t k = 0; k < E; k++) key[g * E + k] = a * X[g * E + k] / 3.0f + urand();
    }
    if (hc > 2) {
        memset(key + 1 * E, 0, (size_t)E * sizeof(float));
        for (int64_t k = 0; k < E; k++) key[2 * E + k] *= 1e-9f;
    }
    mdl_ple_gate(X, key, val, wq, wc, L, hc, E, EPS, gv_ref, gvn_ref, qry);
    /* ple_cuda_gate's grid: a warp per (token, stream), four stages */
    expect_status(r, "launch", emu_ple_gate(X, key, val, wq, wc, L, hc, E, EPS, gv, gvn, NULL), STRATA_OK);
    const double e1 = rel_err(gv, gv_ref, L * W), e2 = rel_err(gvn, gvn_ref, L * W);
    const double e = e1 > e2 ? e1 : e2;
    note(r, e, e <= TOL);
    free(X); free(key); free(val); free(wq); free(wc); free(gv); free(gvn); free(gv_ref); free(gvn_ref); free(qry);
}

/* ---------------------------------------------------------------- ple.conv */

static void check_conv(op_result *r, int64_t L, int64_t W, int64_t Kp, int64_t n, uint64_t seed) {
    g_rng = seed;
    const int64_t hist = (Kp - 1) * n;
    float *ext = alloc_f((hist + L) * W), *ext_dev = alloc_f((hist + L) * W), *gv = alloc_f(L * W);
    float *w = alloc_f(W * Kp), *X = alloc_f(L * W), *X_ref = alloc_f(L * W);
    float *state = alloc_f(hist * W), *state_ref = alloc_f(hist * W);
    float *X0 = alloc_f(L * W), *state0 = alloc_f(hist * W);   /* the inputs again, for the run without slots */
    float *slots = alloc_f(L * hist * W), *slots_ref = alloc_f(L * hist * W);
    fill(state, hist * W, 1.0f, 0.0f);
    fill(ext + hist * W, L * W, 1.0f, 0.0f);          /* gvn of the window, as ple.gate writes it */
    fill(gv, L * W, 0.5f, 0.0f);
    fill(w, W * Kp, 0.6f, 0.0f);
    fill(X, L * W, 2.0f, 0.0f);
    memcpy(X_ref, X, (size_t)(L * W) * sizeof(float));
    memcpy(X0, X, (size_t)(L * W) * sizeof(float));
    memcpy(state_ref, state, (size_t)(hist * W) * sizeof(float));
    memcpy(state0, state, (size_t)(hist * W) * sizeof(float));
    /* C path: ext = [history | gvn] (ple_mix's memcpy), then the conv */
    memcpy(ext, state, (size_t)(hist * W) * sizeof(float));
    mdl_ple_conv(ext, gv, w, L, W, Kp, n, X_ref, state_ref, slots_ref);
    /* ple_cuda_conv: ext's history rows hold garbage until the launcher copies state there; then the kernels */
    fill(ext_dev, hist * W, 1e3f, 0.0f);
    memcpy(ext_dev + hist * W, ext + hist * W, (size_t)(L * W) * sizeof(float));
    expect_status(r, "launch", emu_ple_conv(X, gv, ext_dev, w, L, W, Kp, n, state, slots, NULL), STRATA_OK);
    const double e = rel_err(X, X_ref, L * W);
    /* the same products and sums in the same order: X bit for bit, the history copies exact */
    const int exact_x = same_bits(X, X_ref, L * W);
    const int exact_h = same_bits(state, state_ref, hist * W) && same_bits(slots, slots_ref, L * hist * W);
    note(r, exact_h ? e : INFINITY, exact_x && exact_h);
    /* without verify slots (a plain step): the same X and history */
    fill(ext_dev, hist * W, 1e3f, 0.0f);
    expect_status(r, "launch without slots", emu_ple_conv(X0, gv, ext_dev, w, L, W, Kp, n, state0, NULL, NULL),
                  STRATA_OK);
    note(r, 0.0, same_bits(X0, X_ref, L * W) && same_bits(state0, state_ref, hist * W));
    free(ext); free(ext_dev); free(gv); free(w); free(X); free(X_ref); free(state); free(state_ref); free(slots);
    free(slots_ref); free(X0); free(state0);
}

/* ---------------------------------------------------------------- mtp.norm_concat */

static void check_mtp(op_result *r, int64_t L, int64_t hc, int64_t E, uint64_t seed) {
    g_rng = seed;
    const int64_t W = hc * E, n = L * hc * 2 * E;
    float *e = alloc_f(L * E), *h = alloc_f(L * W), *we = alloc_f(E), *wh = alloc_f(W), *tmp = alloc_f(W);
    float *ref = alloc_f(n), *got = alloc_f(n), *rinv = alloc_f(2 * L);
    fill(e, L * E, 0.05f, 0.0f);                      /* embedding rows are small */
    for (int64_t t = 0; t < L; t++)                   /* streams of different sizes: one RMS over all */
        for (int64_t j = 0; j < hc; j++) fill(h + t * W + j * E, E, (float)(1 + 3 * j), 0.0f);
    fill(we, E, 0.3f, 1.0f);
    fill(wh, W, 0.3f, 1.0f);
    for (int64_t t = 0; t < L; t++) mdl_mtp_norm_concat(e + t * E, h + t * W, we, wh, hc, E, EPS, ref + t * hc * 2 * E, tmp);
    /* mtp_cuda_norm_concat's grid: mtp_k_norms, a warp per (token, part); mtp_k_concat, a thread per value */
    expect_status(r, "launch", emu_mtp_norm_concat(e, h, we, wh, L, hc, E, EPS, rinv, got, NULL), STRATA_OK);
    const double err = rel_err(got, ref, n);
    note(r, err, err <= TOL);
    free(e); free(h); free(we); free(wh); free(tmp); free(ref); free(got); free(rinv);
}

int main(void) {
    /* real model: hidden 2560, 4 streams, 16 heads (orders 2-3 x 8) of 160 values, 90-byte rows,
     * 320,001,536 rows in 128 shards, conv 4 taps dilated by n = 3 */
    const int64_t E = 2560, hc = 4, NH = 16, dP = 160, Kp = 4, n = 3, n_shard = 128, shard_rows = 2500012;
    const int64_t Ls[2] = {1, 7};

    op_result dq[4] = {{"ple.dequant", "iq4_nl", 0, 0.0}, {"ple.dequant", "q8_0", 0, 0.0},
                       {"ple.dequant", "f16", 0, 0.0}, {"ple.dequant", "nvfp4_packed", 0, 0.0}};
    const int fmts[4] = {BLK_IQ4_NL, BLK_Q8_0, BLK_F16, PLE_ROWS_NVFP4_PACKED};
    for (int f = 0; f < 4; f++) {
        for (int i = 0; i < 2; i++) check_dequant(&dq[f], fmts[f], Ls[i], NH, dP, n_shard, shard_rows, 100 + 10 * f + i);
        /* odd: 5 heads of 64 (48 for NVFP4: 3 scale bytes) values, 3 shards of 7 rows */
        check_dequant(&dq[f], fmts[f], 3, 5, fmts[f] == PLE_ROWS_NVFP4_PACKED ? 48 : 64, 3, 7, 109 + 10 * f);
    }
    check_dequant_refusals(&dq[1], &dq[3]);
    for (int f = 0; f < 4; f++) report(&dq[f]);

    op_result pr = {"ple.project", "-", 0, 0.0};
    for (int i = 0; i < 2; i++) check_project(&pr, Ls[i], hc, E, 200 + i);
    check_project(&pr, 5, 3, 37, 209);
    /* no rows (and below, no tokens): the launch returns STRATA_OK before touching memory, so no buffers */
    expect_status(&pr, "R 0", emu_ple_key_norm(NULL, NULL, 0, 4, 64, EPS, NULL), STRATA_OK);
    report(&pr);

    op_result gt = {"ple.gate", "-", 0, 0.0};
    for (int i = 0; i < 2; i++) check_gate(&gt, Ls[i], hc, E, 300 + i);
    check_gate(&gt, 5, 3, 37, 309);
    expect_status(&gt, "L 0", emu_ple_gate(NULL, NULL, NULL, NULL, NULL, 0, 4, 64, EPS, NULL, NULL, NULL), STRATA_OK);
    report(&gt);

    op_result cv = {"ple.conv", "-", 0, 0.0};
    for (int i = 0; i < 2; i++) check_conv(&cv, Ls[i], hc * E, Kp, n, 400 + i);
    check_conv(&cv, 5, 3 * 37, 3, 2, 409);            /* L > history: the new history is all window rows */
    expect_status(&cv, "L 0", emu_ple_conv(NULL, NULL, NULL, NULL, 0, 256, 4, 3, NULL, NULL, NULL), STRATA_OK);
    report(&cv);

    op_result mt = {"mtp.norm_concat", "-", 0, 0.0};
    for (int i = 0; i < 2; i++) check_mtp(&mt, Ls[i], hc, E, 500 + i);
    check_mtp(&mt, 3, 3, 37, 509);
    expect_status(&mt, "L 0", emu_mtp_norm_concat(NULL, NULL, NULL, NULL, 0, 4, 64, EPS, NULL, NULL, NULL), STRATA_OK);
    report(&mt);

    if (!g_failed) printf("all checks passed\n");
    return g_failed != 0;
}
