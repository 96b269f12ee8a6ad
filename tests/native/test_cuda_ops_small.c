// MUTATION: kernels/cuda/norm.cuh | acc += xr[k] * xr[k]; | acc += xr[k] * xr[lane]; | norm.rmsnorm
// MUTATION: kernels/cuda/norm.cuh | yr[k] = xr[k] * rs * wr[k]; | yr[k] = xr[k] * rs * wr[lane]; | norm.rmsnorm
// MUTATION: kernels/cuda/norm.cuh | (r % wg) * n | ((r + 1) % wg) * n | norm.group_rmsnorm
// MUTATION: kernels/cuda/norm.cuh | w + (r % wg) * n | w + (r % wg) | hc.read_norm
// MUTATION: kernels/cuda/rope.cuh | (float)(2 * i) / (float)n_rot | (float)(2 * i + 1) / (float)n_rot | rope.angles
// MUTATION: kernels/cuda/rope.cuh | (float)(p0 + t * dp) | (float)(p0 + t) | rope.angles
// MUTATION: kernels/cuda/rope.cuh | xr[i + h] = b * c[i] + a * s[i]; | xr[i + h] = b * c[i] - a * s[i]; | rope.apply
// MUTATION: kernels/cuda/rope.cuh | cs + (r / nh) * n_rot | cs + (r % nh) * n_rot | rope.apply
// MUTATION: kernels/cuda/hc.cuh | a[i] = ops_silu(a[i] / (float)hc); | a[i] = ops_silu(a[i]) / (float)hc; | hc.read_act
// MUTATION: kernels/cuda/hc.cuh | , xt[j * E + d]); | , xt[d]); | hc.read_mix
// MUTATION: kernels/cuda/hc.cuh | u[i] = acc * inv_hc; | u[i] = acc; | hc.final
// MUTATION: kernels/cuda/hc.cuh | c[i] = 2.0f * ops_sigmoid(a[i] / (float)hc); | c[i] = 2.0f * ops_sigmoid(a[i]); | hc.inject
// MUTATION: kernels/cuda/hc.cuh | c[i] = 2.0f * ops_sigmoid(a[i] / (float)hc); | c[i] = ops_sigmoid(a[i] / (float)hc); | hc.read
// MUTATION: kernels/cuda/hc.cuh | X[i] += c[tj] * y[t * E + d]; | X[i] += c[t] * y[t * E + d]; | hc.write
// MUTATION: kernels/cuda/router.cuh | (v == bv && i < bi) | (v == bv && i > bi) | router.topk
// MUTATION: kernels/cuda/router.cuh | for (int64_t k = 0; k < K; k++) w[k] /= ws; | for (int64_t k = 1; k < K; k++) w[k] /= ws; | router.topk
// MUTATION: kernels/cuda/router.cuh | const int after = pi < 0 || | const int after = | router.topk
// MUTATION: kernels/cuda/router.cuh | count[e + 1] = c; | count[e] = c; | router.group
// MUTATION: kernels/cuda/router.cuh | if (pick[i] == e) { | if (pick[i] >= e) { | router.group
// MUTATION: kernels/cuda/merge.cuh | gu[n * F + i * F + f] | gu[F + i * F + f] | merge.glu
// MUTATION: kernels/cuda/merge.cuh | h[v] = ops_silu(g * sg) * (u * su); | h[v] = ops_silu(g) * (u * su); | merge.glu
// MUTATION: kernels/cuda/merge.cuh | const float *xt = x + t * E; | const float *xt = x + t; | merge.shared_gate
// MUTATION: kernels/cuda/merge.cuh | xg[v] = x[(slot[i] / K) * E + d]; | xg[v] = x[(slot[i] % K) * E + d]; | merge.gather
// MUTATION: kernels/cuda/emu_small.h | for (int64_t v = 0; v < n * E; v++) merge_gather_unit | for (int64_t v = 1; v < n * E; v++) merge_gather_unit | merge.gather
// MUTATION: kernels/cuda/merge.cuh | acc += w * out[row[i] * E + d]; | acc += w * out[i * E + d]; | merge.sum
// MUTATION: kernels/cuda/merge.cuh | if (skip && skip[e]) continue; | if (skip && skip[k]) continue; | merge.sum
// MUTATION: kernels/cuda/merge.cuh | const float g = gate[t] * sd_sh; | const float g = gate[t]; | merge.sum
// MUTATION: kernels/cuda/emu_small.h | norm_rscale(ops_fold32(p), n, eps) | norm_rscale(p[0], n, eps) | norm.rmsnorm
// MUTATION: kernels/cuda/emu_small.h | pi = i[0]; | pi = i[1]; | router.topk
// MUTATION: kernels/cuda/emu_small.h | gate[t] = ops_sigmoid(ops_fold32(p)); | gate[t] = ops_sigmoid(p[0]); | merge.shared_gate
/*
 * test_cuda_ops_small.c — the CUDA kernels of the small op families (kernels/cuda/{norm,rope,hc,router,
 * merge}.cuh) against the library's C path, on the host: every launcher runs through its host
 * emulation (kernels/cuda/emu_small.h: the unit functions over the kernel's whole launch grid, a warp's
 * 32 lanes one after the other, then ops_fold32 for the shuffle tree), and the result is compared with
 * the C function the CPU forward calls. So the mutations prove the emulation as well as the units. Shapes are the
 * real model's (hidden 2560, 4 streams, hc rank 320, QSA 24 q / 2 kv heads x 256 with 64 rotary dims,
 * indexer 4 x 128, 512 experts top-10, 640 wide) plus small odd ones.
 *
 * Where the arithmetic is the same (rope, the hc and merge elementwise steps, the grouping) the check is
 * bit for bit. The norms, the softmax and the shared gate sum in a warp's order where the C path sums
 * in order (in double for the norms and the softmax): there the tolerance is TOL relative to the
 * largest reference value, and the top-k picks must still be the same experts. The read of a
 * hyper-connection end to end (hc.read, hc.final: the final mixer that feeds the LM head is
 * mdl_hc_read without inject) runs the units between the C path's own matmuls (the gemv family's
 * kernels are checked elsewhere) and compares with mdl_hc_read.
 *
 * One line per op on stdout: `OP <family>.<op> - pass|fail <max_rel_err>`; the MUTATION lines above
 * are realistic bugs tests/test_cuda_ops.py plants in the headers, each of which must fail its op.
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

/* The C path's pieces (hc.c, moe.c), not in model.h: only this check calls them from outside. */
void mdl_hc_act(float *a, int64_t n, int64_t hc);
void mdl_hc_mix(const float *g, const float *xh, int64_t L, int64_t hc, int64_t E, float *u);
void mdl_hc_inject_act(const float *a, int64_t n, int64_t hc, float *c);
void mdl_route(float *logits, int64_t L, int64_t Ne, int64_t K, int32_t *pick, float *pw);
void mdl_route_group(const int32_t *pick, int64_t n, int64_t Ne, int64_t *count, int64_t *fill, int64_t *slot);
void mdl_moe_glu(const float *g, int64_t n, int64_t F, int fused, float s1, float s2, float *h);
void mdl_moe_gather(const float *u, const int64_t *slot, int64_t n, int64_t K, int64_t E, float *xg);
float mdl_moe_shared_gate(const float *w_seg, const float *x, int64_t E);
void mdl_moe_combine(const mdl_mat *down, const mdl_mat *sh_down, const float *w_seg, const float *u, int64_t L,
                     int64_t E, int64_t Ne, int64_t K, const int64_t *count, const int64_t *slot, const int8_t *skipped,
                     const float *pw, const float *out, const float *sho, float *y);

#define TOL 1e-5      /* relative to the reference's largest value, where summation orders differ */
#define EPS 1e-6f     /* rms_norm_eps */

/* ---------------------------------------------------------------- helpers */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static void seed(uint64_t s) { g_rng = s * 0x9e3779b97f4a7c15ull + 1; }
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 32);
}
/* uniform in [-1, 1) */
static float rndu(void) { return (float)((double)rnd() / 2147483648.0 - 1.0); }
/* roughly N(0, 1): a sum of four uniforms */
static float rndn(void) { return (rndu() + rndu() + rndu() + rndu()) * 0.8660254f; }

static float *fill_n(int64_t n, float scale) {
    float *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++) p[i] = rndn() * scale;
    return p;
}
static float *fill_u(int64_t n, float lo, float hi) {
    float *p = malloc((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++) p[i] = lo + (hi - lo) * 0.5f * (rndu() + 1.0f);
    return p;
}
static float *copy(const float *x, int64_t n) {
    float *p = malloc((size_t)n * sizeof *p);
    memcpy(p, x, (size_t)n * sizeof *p);
    return p;
}

/* max |a - b| / max |b| (NaN counts as infinite) */
static double rel_err(const float *a, const float *b, int64_t n) {
    double md = 0.0, mb = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (isnan(d)) d = INFINITY;
        if (d > md) md = d;
        if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
    }
    return md == 0.0 ? 0.0 : md / (mb > 0.0 ? mb : 1e-30);
}

/* One op's result over its cases: the largest relative error, failed if a case went over its bound
 * (0: must be bit for bit) or a discrete result (picks, counts, slots) differed. */
typedef struct {
    const char *name;
    double err;
    int bad;
} op_t;

static void op_case(op_t *op, double err, double tol) {
    if (err > op->err || isnan(err)) op->err = isnan(err) ? INFINITY : err;
    if (!(err <= tol)) op->bad = 1;
}
static void op_end(const op_t *op) {
    printf("OP %s - %s %.3e\n", op->name, op->bad ? "fail" : "pass", op->err);
    if (op->bad) fprintf(stderr, "%s: max relative error %.3e or a discrete result differs\n", op->name, op->err);
    CHECK(!op->bad);
}

/* ---------------------------------------------------------------- norm */

/* Rows whose RMS differs by orders of magnitude, as activations do. */
static float *fill_rows(int64_t rows, int64_t n) {
    float *x = malloc((size_t)(rows * n) * sizeof *x);
    for (int64_t r = 0; r < rows; r++) {
        const float s = powf(10.0f, (float)((int)(rnd() % 7) - 3));
        for (int64_t i = 0; i < n; i++) x[r * n + i] = rndn() * s;
    }
    return x;
}

static void check_rmsnorm(void) {
    op_t op = {"norm.rmsnorm", 0.0, 0};
    seed(11);
    {   /* QSA q norm: 24 heads of 256 read from q_proj's [q | gate] rows, one weight vector */
        const int64_t L = 3, H = 24, hd = 256;
        float *qg = fill_rows(L * 2 * H, hd), *w = fill_u(hd, 0.6f, 1.4f);
        float *y = calloc((size_t)(L * H * hd), sizeof *y), *ref = calloc((size_t)(L * H * hd), sizeof *ref);
        CHECK(emu_rmsnorm_rows(qg, 2 * hd, w, 1, L * H, hd, EPS, y, hd, NULL) == STRATA_OK);
        for (int64_t t = 0; t < L; t++)
            for (int64_t h = 0; h < H; h++)
                mdl_rmsnorm(qg + t * 2 * H * hd + h * 2 * hd, w, hd, EPS, ref + (t * H + h) * hd);
        op_case(&op, rel_err(y, ref, L * H * hd), TOL);
        free(qg); free(w); free(y); free(ref);
    }
    {   /* indexer queries: 4 heads of 128, in place */
        const int64_t L = 3, nI = 4, dI = 128;
        float *x = fill_rows(L * nI, dI), *w = fill_u(dI, 0.6f, 1.4f);
        float *ref = malloc((size_t)(L * nI * dI) * sizeof *ref);
        for (int64_t r = 0; r < L * nI; r++) mdl_rmsnorm(x + r * dI, w, dI, EPS, ref + r * dI);
        CHECK(emu_rmsnorm_rows(x, dI, w, 1, L * nI, dI, EPS, x, dI, NULL) == STRATA_OK);
        op_case(&op, rel_err(x, ref, L * nI * dI), TOL);
        free(x); free(w); free(ref);
    }
    /* odd: no weight, a row narrower than a warp, one not a multiple of 32, hidden-wide rows, and the MTP
     * head's one RMS over a whole 4 x 2560 state row */
    static const int64_t odd[][3] = {{5, 37, 0}, {3, 5, 1}, {2, 2560, 1}, {4, 33, 1}, {2, 10240, 1}};
    for (size_t c = 0; c < sizeof odd / sizeof odd[0]; c++) {
        const int64_t rows = odd[c][0], n = odd[c][1];
        float *x = fill_rows(rows, n), *w = odd[c][2] ? fill_u(n, 0.6f, 1.4f) : NULL;
        float *y = malloc((size_t)(rows * n) * sizeof *y), *ref = malloc((size_t)(rows * n) * sizeof *ref);
        CHECK(emu_rmsnorm_rows(x, n, w, 1, rows, n, EPS, y, n, NULL) == STRATA_OK);
        for (int64_t r = 0; r < rows; r++) mdl_rmsnorm(x + r * n, w, n, EPS, ref + r * n);
        op_case(&op, rel_err(y, ref, rows * n), TOL);
        free(x); free(w); free(y); free(ref);
    }
    op_end(&op);
}

static void check_group_rmsnorm(void) {
    op_t op = {"norm.group_rmsnorm", 0.0, 0};
    seed(12);
    /* tokens, groups, n, weighted */
    static const int64_t cases[][4] = {{3, 4, 2560, 1}, {2, 3, 45, 0}, {3, 2, 7, 1}, {1, 5, 64, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t L = cases[c][0], G = cases[c][1], n = cases[c][2], W = G * n;
        float *x = fill_rows(L * G, n), *w = cases[c][3] ? fill_u(W, 0.6f, 1.4f) : NULL;
        float *y = malloc((size_t)(L * W) * sizeof *y), *ref = malloc((size_t)(L * W) * sizeof *ref);
        CHECK(emu_rmsnorm_rows(x, n, w, G, L * G, n, EPS, y, n, NULL) == STRATA_OK);
        for (int64_t t = 0; t < L; t++) mdl_group_rmsnorm(x + t * W, w, G, n, EPS, ref + t * W);
        op_case(&op, rel_err(y, ref, L * W), TOL);
        free(x); free(w); free(y); free(ref);
    }
    op_end(&op);
}

/* ---------------------------------------------------------------- rope */

static void check_rope_angles(void) {
    op_t op = {"rope.angles", 0.0, 0};
    /* theta, n_rot, p0, dp, L: a prefill, positions near 256K, block summaries (dp = r = 4), odd ones */
    static const struct { float theta; int32_t n_rot; int64_t p0, dp, L; } cases[] = {
        {1e7f, 64, 0, 1, 9}, {1e7f, 64, 262000, 1, 3}, {1e7f, 64, 0, 4, 12}, {1e7f, 64, 4096, 4, 3},
        {1e4f, 6, 5, 1, 3}, {1e6f, 128, 1000, 3, 2}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int32_t nr = cases[c].n_rot, h = nr / 2;
        const int64_t L = cases[c].L;
        float *cs = calloc((size_t)(L * nr), sizeof *cs), *ref = calloc((size_t)(L * nr), sizeof *ref);
        CHECK(emu_rope_angles(cases[c].theta, nr, cases[c].p0, cases[c].dp, L, cs, NULL) == STRATA_OK);
        for (int64_t t = 0; t < L; t++)
            mdl_rope_angles(cases[c].theta, nr, cases[c].p0 + t * cases[c].dp, ref + t * nr, ref + t * nr + h);
        op_case(&op, rel_err(cs, ref, L * nr), 0.0);
        free(cs); free(ref);
    }
    op_end(&op);
}

static void check_rope_apply(void) {
    op_t op = {"rope.apply", 0.0, 0};
    seed(21);
    /* L, heads, n_rot, row stride (the head dim, or more): QSA q and k (256), indexer heads (128), odd
     * shapes (a head of 16 in rows of 32: the dims past n_rot and the row's tail must stay as they are) */
    static const int64_t cases[][4] = {{3, 24, 64, 256}, {3, 2, 64, 256}, {3, 4, 64, 128}, {2, 3, 6, 11},
                                       {2, 3, 8, 32}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t L = cases[c][0], nh = cases[c][1], xs = cases[c][3];
        const int32_t nr = (int32_t)cases[c][2], h = nr / 2;
        float *cs = malloc((size_t)(L * nr) * sizeof *cs);
        for (int64_t t = 0; t < L; t++) mdl_rope_angles(1e7f, nr, 7 + 3 * t, cs + t * nr, cs + t * nr + h);
        float *x = fill_n(L * nh * xs, 1.0f), *ref = copy(x, L * nh * xs);
        CHECK(emu_rope_apply(x, xs, L * nh, nh, nr, cs, NULL) == STRATA_OK);
        for (int64_t r = 0; r < L * nh; r++) mdl_rope(ref + r * xs, nr, cs + (r / nh) * nr, cs + (r / nh) * nr + h);
        op_case(&op, rel_err(x, ref, L * nh * xs), 0.0);
        free(cs); free(x); free(ref);
    }
    op_end(&op);
}

/* ---------------------------------------------------------------- hc */

static void check_hc_read_norm(void) {
    op_t op = {"hc.read_norm", 0.0, 0};
    seed(31);
    static const int64_t cases[][3] = {{3, 4, 2560}, {2, 3, 50}};   /* L, hc, E */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t L = cases[c][0], hc = cases[c][1], E = cases[c][2], W = hc * E;
        float *X = fill_rows(L * hc, E), *w = fill_u(W, 0.3f, 1.7f);
        float *xh = malloc((size_t)(L * W) * sizeof *xh), *ref = malloc((size_t)(L * W) * sizeof *ref);
        CHECK(emu_hc_read_norm(X, w, L, hc, E, EPS, xh, NULL) == STRATA_OK);
        for (int64_t t = 0; t < L; t++) mdl_group_rmsnorm(X + t * W, w, hc, E, EPS, ref + t * W);
        op_case(&op, rel_err(xh, ref, L * W), TOL);
        free(X); free(w); free(xh); free(ref);
    }
    op_end(&op);
}

static void check_hc_elementwise(void) {
    seed(32);
    static const int64_t cases[][4] = {{3, 4, 2560, 320}, {2, 3, 37, 5}};   /* L, hc, E, R */
    op_t act = {"hc.read_act", 0.0, 0}, mix = {"hc.read_mix", 0.0, 0}, inj = {"hc.inject", 0.0, 0},
         wr = {"hc.write", 0.0, 0};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t L = cases[c][0], hc = cases[c][1], E = cases[c][2], R = cases[c][3], W = hc * E;
        {
            float *a = fill_n(L * R, 4.0f), *ref = copy(a, L * R);
            CHECK(emu_hc_read_act(a, L * R, hc, NULL) == STRATA_OK);
            mdl_hc_act(ref, L * R, hc);
            op_case(&act, rel_err(a, ref, L * R), 0.0);
            free(a); free(ref);
        }
        {
            float *g = fill_n(L * W, 3.0f), *xh = fill_n(L * W, 1.0f);
            float *u = malloc((size_t)(L * E) * sizeof *u), *ref = malloc((size_t)(L * E) * sizeof *ref);
            CHECK(emu_hc_read_mix(g, xh, L, hc, E, u, NULL) == STRATA_OK);
            mdl_hc_mix(g, xh, L, hc, E, ref);
            op_case(&mix, rel_err(u, ref, L * E), 0.0);
            free(g); free(xh); free(u); free(ref);
        }
        {
            float *a = fill_n(L * hc, 8.0f), *cc = malloc((size_t)(L * hc) * sizeof *cc);
            float *ref = malloc((size_t)(L * hc) * sizeof *ref);
            CHECK(emu_hc_inject(a, L * hc, hc, cc, NULL) == STRATA_OK);
            mdl_hc_inject_act(a, L * hc, hc, ref);
            op_case(&inj, rel_err(cc, ref, L * hc), 0.0);
            free(a); free(cc); free(ref);
        }
        {
            /* mdl_hc_write reads E and hc from the model */
            strata_model *m = calloc(1, sizeof *m);
            m->hp.n_embd = E;
            m->hp.hc = (int32_t)hc;
            float *X = fill_n(L * W, 1.0f), *ref = copy(X, L * W), *cc = fill_u(L * hc, 0.0f, 2.0f);
            float *y = fill_n(L * E, 1.0f);
            CHECK(emu_hc_write(X, cc, y, L, hc, E, NULL) == STRATA_OK);
            mdl_hc_write(m, ref, cc, y, L);
            op_case(&wr, rel_err(X, ref, L * W), 0.0);
            free(m); free(X); free(ref); free(cc); free(y);
        }
    }
    op_end(&act);
    op_end(&mix);
    op_end(&inj);
    op_end(&wr);
}

/* An F32 matrix of rows x cols, entries uniform with the given scale. */
static mdl_mat f32_mat(int64_t rows, int64_t cols, float scale, float **store) {
    *store = fill_u(rows * cols, -scale, scale);
    mdl_mat w = {.data = (const char *)*store, .t = strata_qtraits_get(GT_F32), .rows = rows, .cols = cols, .n_mat = 1,
                 .row_bytes = (size_t)cols * sizeof(float), .mat_bytes = (size_t)(rows * cols) * sizeof(float)};
    return w;
}

/* A read end to end: the units between the C path's products (as the device forward runs them between
 * the gemv family's), against mdl_hc_read. With inject (a layer's read) or without (the final mixer). */
static void hc_read_case(op_t *op, int64_t L, int64_t hc, int64_t E, int64_t R, int with_inject) {
    const int64_t W = hc * E;
    strata_model *m = calloc(1, sizeof *m);   /* no pool (serial), scalar kernels */
    m->hp.n_embd = E;
    m->hp.hc = (int32_t)hc;
    m->hp.hc_rank = (int32_t)R;
    m->hp.eps = EPS;
    float *wd, *wu, *wi = NULL;
    const mdl_mat down = f32_mat(R, W, sqrtf(3.0f / (float)W) * 2.0f, &wd);
    const mdl_mat up = f32_mat(W, R, sqrtf(3.0f / (float)R) * 4.0f, &wu);
    mdl_mat inject = {0};
    if (with_inject) inject = f32_mat(hc, W, sqrtf(3.0f / (float)W) * 8.0f, &wi);
    float *X = fill_rows(L * hc, E), *norm = fill_u(W, 0.3f, 1.7f);
    float *xh = malloc((size_t)(L * W) * sizeof *xh), *g = malloc((size_t)(L * W) * sizeof *g);
    float *a = malloc((size_t)(L * R) * sizeof *a), *ai = malloc((size_t)(L * hc) * sizeof *ai);
    float *u = malloc((size_t)(L * E) * sizeof *u), *c = malloc((size_t)(L * hc) * sizeof *c);
    float *u_ref = malloc((size_t)(L * E) * sizeof *u_ref), *c_ref = malloc((size_t)(L * hc) * sizeof *c_ref);
    CHECK(emu_hc_read_norm(X, norm, L, hc, E, EPS, xh, NULL) == STRATA_OK);
    CHECK(mdl_matmul(m, &down, 0, xh, L, a) == STRATA_OK);
    CHECK(emu_hc_read_act(a, L * R, hc, NULL) == STRATA_OK);
    CHECK(mdl_matmul(m, &up, 0, a, L, g) == STRATA_OK);
    CHECK(emu_hc_read_mix(g, xh, L, hc, E, u, NULL) == STRATA_OK);
    if (with_inject) {
        CHECK(mdl_matmul(m, &inject, 0, xh, L, ai) == STRATA_OK);
        CHECK(emu_hc_inject(ai, L * hc, hc, c, NULL) == STRATA_OK);
    }
    CHECK(mdl_hc_read(m, X, norm, &down, &up, with_inject ? &inject : NULL, L, u_ref, with_inject ? c_ref : NULL) ==
          STRATA_OK);
    op_case(op, rel_err(u, u_ref, L * E), TOL);
    if (with_inject) op_case(op, rel_err(c, c_ref, L * hc), TOL);
    free(m); free(wd); free(wu); free(wi); free(X); free(norm); free(xh); free(g); free(a); free(ai); free(u);
    free(c); free(u_ref); free(c_ref);
}

static void check_hc_read(void) {
    seed(33);
    op_t rd = {"hc.read", 0.0, 0}, fin = {"hc.final", 0.0, 0};
    hc_read_case(&rd, 2, 4, 2560, 320, 1);
    hc_read_case(&rd, 3, 3, 40, 5, 1);
    hc_read_case(&fin, 2, 4, 2560, 320, 0);
    hc_read_case(&fin, 3, 3, 40, 5, 0);
    op_end(&rd);
    op_end(&fin);
}

/* ---------------------------------------------------------------- router */

static void check_router_topk(void) {
    op_t op = {"router.topk", 0.0, 0};
    seed(41);
    static const int64_t cases[][3] = {{8, 512, 10}, {3, 37, 3}, {2, 20, 4}, {2, 512, 10}};   /* L, Ne, K */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t L = cases[c][0], Ne = cases[c][1], K = cases[c][2];
        float *lg = fill_n(L * Ne, 1.5f);
        if (c == 0) {
            /* token 1: integer logits (many exact ties, also across the K-th place); token 2: all equal
             * (the picks are experts 0..K-1); token 3: a clear winner far above the rest */
            for (int64_t e = 0; e < Ne; e++) lg[1 * Ne + e] = (float)((int)(rnd() % 7) - 3);
            for (int64_t e = 0; e < Ne; e++) lg[2 * Ne + e] = 0.25f;
            lg[3 * Ne + 300] = 40.0f;
        }
        if (c == 3)   /* logits of a large scale: softmax mass on a few experts */
            for (int64_t i = 0; i < L * Ne; i++) lg[i] *= 8.0f;
        float *ref = copy(lg, L * Ne);
        int32_t *pick = malloc((size_t)(L * K) * sizeof *pick), *pick_ref = malloc((size_t)(L * K) * sizeof *pick_ref);
        float *pw = malloc((size_t)(L * K) * sizeof *pw), *pw_ref = malloc((size_t)(L * K) * sizeof *pw_ref);
        CHECK(emu_router_topk(lg, L, Ne, K, pick, pw, NULL) == STRATA_OK);
        mdl_route(ref, L, Ne, K, pick_ref, pw_ref);
        if (memcmp(pick, pick_ref, (size_t)(L * K) * sizeof *pick)) {
            op.bad = 1;
            for (int64_t i = 0; i < L * K; i++)
                if (pick[i] != pick_ref[i]) {
                    fprintf(stderr, "router.topk: case %zu token %lld rank %lld: expert %d, C path %d\n", c,
                            (long long)(i / K), (long long)(i % K), pick[i], pick_ref[i]);
                    break;
                }
        }
        op_case(&op, rel_err(pw, pw_ref, L * K), TOL);
        op_case(&op, rel_err(lg, ref, L * Ne), TOL);   /* the probabilities left in place */
        free(lg); free(ref); free(pick); free(pick_ref); free(pw); free(pw_ref);
    }
    op_end(&op);
}

/* K distinct experts per token, uniformly. */
static int32_t *random_picks(int64_t L, int64_t Ne, int64_t K) {
    int32_t *pick = malloc((size_t)(L * K) * sizeof *pick);
    for (int64_t t = 0; t < L; t++)
        for (int64_t k = 0; k < K; k++) {
            int32_t e;
            int dup;
            do {
                e = (int32_t)(rnd() % (uint32_t)Ne);
                dup = 0;
                for (int64_t j = 0; j < k; j++) dup |= pick[t * K + j] == e;
            } while (dup);
            pick[t * K + k] = e;
        }
    return pick;
}

static void check_router_group(void) {
    op_t op = {"router.group", 0.0, 0};
    seed(42);
    /* L, Ne, K: a decode step, a prefill chunk (experts with many pairs), odd; the last has picks
     * concentrated on a few experts */
    static const int64_t cases[][3] = {{1, 512, 10}, {64, 512, 10}, {9, 37, 3}, {40, 16, 10}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t L = cases[c][0], Ne = cases[c][1], K = cases[c][2], n = L * K;
        int32_t *pick = random_picks(L, Ne, K);
        int64_t *count = malloc((size_t)(Ne + 1) * sizeof *count), *slot = malloc((size_t)n * sizeof *slot);
        int64_t *row = malloc((size_t)n * sizeof *row);
        int64_t *count_ref = calloc((size_t)(Ne + 1), sizeof *count_ref);
        int64_t *slot_ref = malloc((size_t)n * sizeof *slot_ref);
        int64_t *fill = malloc((size_t)Ne * sizeof *fill);
        for (int64_t e = 0; e <= Ne; e++) count[e] = -7;   /* the units must write every entry */
        /* the emulation refuses counts that are no partition (the GPU's fill would write past slot) */
        const int filled = emu_router_group(pick, n, Ne, count, slot, row, NULL) == STRATA_OK;
        mdl_route_group(pick, n, Ne, count_ref, fill, slot_ref);
        int bad = !filled || memcmp(count, count_ref, (size_t)(Ne + 1) * sizeof *count) != 0 ||
                  memcmp(slot, slot_ref, (size_t)n * sizeof *slot) != 0;
        for (int64_t s = 0; s < n && !bad; s++) bad = slot[s] < 0 || slot[s] >= n || row[slot[s]] != s;
        if (bad) fprintf(stderr, "router.group: case %zu: counts, slots or rows differ\n", c);
        op_case(&op, bad ? 1.0 : 0.0, 0.0);
        free(pick); free(count); free(slot); free(row); free(count_ref); free(slot_ref); free(fill);
    }
    op_end(&op);
}

/* ---------------------------------------------------------------- merge */

static void check_merge_glu(void) {
    op_t op = {"merge.glu", 0.0, 0};
    seed(51);
    /* n, F, fused, sg, su: an expert's tokens fused and split (with NVFP4-like scales), the shared expert
     * (split, n = L), odd */
    static const struct { int64_t n, F; int fused; float sg, su; } cases[] = {
        {7, 640, 1, 0.75f, 1.25f}, {7, 640, 0, 1.0f, 1.0f}, {3, 640, 0, 0.5f, 2.0f}, {3, 37, 1, 1.0f, 0.3f},
        {1, 33, 0, 2.0f, 1.0f}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t n = cases[c].n, F = cases[c].F;
        float *gu = fill_n(n * 2 * F, 3.0f);
        float *h = malloc((size_t)(n * F) * sizeof *h), *ref = malloc((size_t)(n * F) * sizeof *ref);
        CHECK(emu_merge_glu(gu, n, F, cases[c].fused, cases[c].sg, cases[c].su, h, NULL) == STRATA_OK);
        mdl_moe_glu(gu, n, F, cases[c].fused, cases[c].sg, cases[c].su, ref);
        op_case(&op, rel_err(h, ref, n * F), 0.0);
        free(gu); free(h); free(ref);
    }
    op_end(&op);
}

static void check_merge_shared_gate(void) {
    op_t op = {"merge.shared_gate", 0.0, 0};
    seed(52);
    static const int64_t cases[][2] = {{5, 2560}, {3, 37}, {2, 20}};   /* L, E */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t L = cases[c][0], E = cases[c][1];
        float *w = fill_u(E, -1.0f, 1.0f), *x = fill_n(L * E, 1.0f);
        for (int64_t i = 0; i < E; i++) w[i] *= 2.0f / sqrtf((float)E);
        float *gate = malloc((size_t)L * sizeof *gate), *ref = malloc((size_t)L * sizeof *ref);
        CHECK(emu_merge_shared_gate(w, x, L, E, gate, NULL) == STRATA_OK);
        for (int64_t t = 0; t < L; t++) ref[t] = mdl_moe_shared_gate(w, x + t * E, E);
        op_case(&op, rel_err(gate, ref, L), TOL);
        free(w); free(x); free(gate); free(ref);
    }
    op_end(&op);
}

static void check_merge_gather(void) {
    op_t op = {"merge.gather", 0.0, 0};
    seed(54);
    static const int64_t cases[][4] = {{1, 2560, 512, 10}, {6, 64, 16, 10}, {5, 37, 9, 3}};   /* L, E, Ne, K */
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t L = cases[c][0], E = cases[c][1], Ne = cases[c][2], K = cases[c][3], n = L * K;
        int32_t *pick = random_picks(L, Ne, K);
        int64_t *count = calloc((size_t)(Ne + 1), sizeof *count), *slot = malloc((size_t)n * sizeof *slot);
        int64_t *fill = malloc((size_t)Ne * sizeof *fill);
        mdl_route_group(pick, n, Ne, count, fill, slot);
        float *u = fill_n(L * E, 1.0f);
        float *xg = malloc((size_t)(n * E) * sizeof *xg), *ref = malloc((size_t)(n * E) * sizeof *ref);
        CHECK(emu_merge_gather(u, slot, n, K, E, xg, NULL) == STRATA_OK);
        mdl_moe_gather(u, slot, n, K, E, ref);
        op_case(&op, rel_err(xg, ref, n * E), 0.0);
        free(pick); free(count); free(slot); free(fill); free(u); free(xg); free(ref);
    }
    op_end(&op);
}

static void check_merge_sum(void) {
    op_t op = {"merge.sum", 0.0, 0};
    seed(53);
    /* L, E, Ne, K, scales + skips, w_seg zero (σ = 1/2 exactly on both sides: the sum is bit for bit) */
    static const int64_t cases[][6] = {{5, 2560, 512, 10, 1, 0}, {5, 2560, 512, 10, 0, 0}, {4, 37, 37, 3, 1, 0},
                                       {3, 64, 16, 10, 1, 1}, {2, 2560, 512, 10, 0, 1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t L = cases[c][0], E = cases[c][1], Ne = cases[c][2], K = cases[c][3], n = L * K;
        const int scaled = (int)cases[c][4], zero_gate = (int)cases[c][5];
        int32_t *pick = random_picks(L, Ne, K);
        float *pw = fill_u(n, 0.01f, 1.0f);
        for (int64_t t = 0; t < L; t++) router_renorm(pw + t * K, K);
        int64_t *count = calloc((size_t)(Ne + 1), sizeof *count), *slot = malloc((size_t)n * sizeof *slot);
        int64_t *fill = malloc((size_t)Ne * sizeof *fill), *row = malloc((size_t)n * sizeof *row);
        mdl_route_group(pick, n, Ne, count, fill, slot);
        for (int64_t s = 0; s < n; s++) row[slot[s]] = s;
        /* per-expert down scales (NVFP4's .scale per matrix), the shared one, a few experts skipped */
        float *sd = scaled ? fill_u(Ne, 0.5f, 2.0f) : NULL, sd_sh = scaled ? 1.5f : 1.0f;
        int8_t *skip = calloc((size_t)Ne, 1);
        if (scaled)
            for (int64_t i = 0; i < n; i += 7) skip[pick[i]] = 1;
        mdl_mat down = {.scale = sd, .n_scale = scaled ? Ne : 0};
        mdl_mat sh_down = {.scale = scaled ? &sd_sh : NULL, .n_scale = 1};
        float *out = fill_n(n * E, 1.0f), *sho = fill_n(L * E, 1.0f), *u = fill_n(L * E, 1.0f);
        float *w_seg = fill_u(E, -1.0f, 1.0f);
        for (int64_t i = 0; i < E; i++) w_seg[i] *= zero_gate ? 0.0f : 2.0f / sqrtf((float)E);
        float *gate = malloc((size_t)L * sizeof *gate);
        float *y = malloc((size_t)(L * E) * sizeof *y), *ref = malloc((size_t)(L * E) * sizeof *ref);
        CHECK(emu_merge_shared_gate(w_seg, u, L, E, gate, NULL) == STRATA_OK);
        CHECK(emu_merge_sum(pick, pw, sd, scaled ? skip : NULL, row, out, gate, sd_sh, sho, L, E, K, y, NULL) ==
              STRATA_OK);
        mdl_moe_combine(&down, &sh_down, w_seg, u, L, E, Ne, K, count, slot, skip, pw, out, sho, ref);
        op_case(&op, rel_err(y, ref, L * E), zero_gate ? 0.0 : TOL);
        free(pick); free(pw); free(count); free(slot); free(fill); free(row); free(sd); free(skip); free(out);
        free(sho); free(u); free(w_seg); free(gate); free(y); free(ref);
    }
    op_end(&op);
}

int main(void) {
    check_rmsnorm();
    check_group_rmsnorm();
    check_rope_angles();
    check_rope_apply();
    check_hc_read_norm();
    check_hc_elementwise();
    check_hc_read();
    check_router_topk();
    check_router_group();
    check_merge_glu();
    check_merge_shared_gate();
    check_merge_gather();
    check_merge_sum();
    if (!g_failed) printf("all checks passed\n");
    return g_failed != 0;
}
