// MUTATION: kernels/cuda/gdn.cuh | w[ch * Kc + k] | w[ch * Kc + (Kc - 1 - k)] | gdn.conv
// MUTATION: kernels/cuda/gdn.cuh | CD, r + L)[ch] | CD, r + L - 1)[ch] | gdn.conv
// MUTATION: kernels/cuda/gdn.cuh | is_q ? x[e] * r * qscale : x[e] * r | is_q ? x[e] * r : x[e] * r * qscale | gdn.prep
// MUTATION: kernels/cuda/gdn.cuh | for (int e = lane; e < n; e += OPS_WARP) s += | for (int e = lane + 1; e < n; e += OPS_WARP) s += | gdn.prep
// MUTATION: kernels/cuda/gdn.cuh | ssm_a * ops_softplus(a + dt_bias) | ssm_a * ops_softplus(a) | gdn.prep
// MUTATION: kernels/cuda/gdn.cuh | return h % Gk; | return h / (Gv / Gk); | gdn.recurrent
// MUTATION: kernels/cuda/gdn.cuh | pred += S[i * dv + j] * k[i]; | pred += S[i * dv + j] * q[i]; | gdn.recurrent
// MUTATION: kernels/cuda/gdn.cuh | [j] - pred) * beta; | [j] - pred); | gdn.recurrent
// MUTATION: kernels/cuda/gdn.cuh | for (int r = 0; r <= i; r++) x = x + QKi[r] | for (int r = 0; r < i; r++) x = x + QKi[r] | gdn.chunked
// MUTATION: kernels/cuda/gdn.cuh | expf(w->gam[i] - w->gam[j]) | expf(w->gam[j] - w->gam[i]) | gdn.chunked
// MUTATION: kernels/cuda/gdn.cuh | float x = S[e * dv + j] * egl; | float x = S[e * dv + j]; | gdn.chunked
// MUTATION: kernels/cuda/gdn.cuh | for (int r = 0; r < i; r++) x = x - Ai[r] * w->W[r * dk + j]; | for (int r = 0; r < i; r++) x = x - Ai[r] * w->U[r * dv + j]; | gdn.chunked
// MUTATION: kernels/cuda/gdn.cuh | gate_sigmoid ? ops_sigmoid(z[e]) : ops_silu(z[e]) | gate_sigmoid ? ops_silu(z[e]) : ops_sigmoid(z[e]) | gdn.out
// MUTATION: kernels/cuda/gdn.cuh | ss / (float)dv + eps | ss / (float)OPS_WARP + eps | gdn.out
/*
 * test_cuda_ops_gdn.c — the Gated DeltaNet kernels' arithmetic (kernels/cuda/gdn.cuh) run on the host over
 * each launch's whole grid, in the kernels' order, against the C path (model/gdn.c) op by op (issue 19
 * point 4; tools/cuda_ops.py). Ops: gdn.conv (the causal conv and its history's advance), gdn.prep (q/k l2
 * norms, β, g), gdn.recurrent (decode form), gdn.chunked (prefill form: against gdn.c's chunked form, and
 * within rounding against its recurrent form on the same inputs), gdn.out (the gated RMS norm, sigmoid and
 * silu gates). Shapes: the real model's (16 k heads, 48 v heads x 128, conv 4) at L = 1, 37, 64 and a
 * small odd one (2 k / 6 v heads x 20, conv 3) at L = 1, 5, 150 (three chunks, the last partial).
 *
 * Inputs are gdn.c's own: the conv output of random projection rows feeds the norms, whose q, k, β, g (with
 * a random prior state) feed the heads, whose output feeds the norm; each op gets the same inputs on both
 * sides. Errors are max |got - ref| over max |ref| of the compared array. The conv, gates, recurrent and
 * chunked units do gdn.c's operations in gdn.c's order, so they must match it bit for bit (tolerance 0;
 * both sides are gcc's C11 without contraction and call the same libm); the two norms reduce over a warp
 * where gdn.c sums serially (q/k) or in double (out): 1e-5.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/gdn.cuh"
#include "model/model.h"

#include "check.h"
#include "ops_check.h"

/* gdn.c's ops, exposed for this check (not in model.h) */
void mdl_gdn_conv(const float *w, int64_t Kc, int64_t CD, float *conv, const float *x, int64_t ldx, int64_t L,
                  float *qkv, float *cv);
void mdl_gdn_qk_norm(const float *cv, int64_t L, int64_t Gk, int64_t dk, int64_t CD, float *qn, float *kn);
void mdl_gdn_gates(const float *ssm_a, const float *dt_bias, int64_t L, int64_t Gv, float *b, float *a);
void mdl_gdn_head_recurrent(const strata_model *m, int h, float *S, const float *qn, const float *kn,
                            const float *cv, const float *beta, const float *g, float *o, int64_t L);
strata_status mdl_gdn_head_chunked(const strata_model *m, int h, float *S, const float *qn, const float *kn,
                                   const float *cv, const float *beta, const float *g, float *o, int64_t L);
void mdl_gdn_out(float *o, const float *z, int64_t ldz, const float *w, int64_t L, int64_t Gv, int64_t dv, float eps,
                 int gate_sigmoid);

/* ---------------------------------------------------------------- bookkeeping: one OP line per op */

enum { OP_CONV, OP_PREP, OP_RECURRENT, OP_CHUNKED, OP_OUT, N_OPS };
static const char *const op_name[N_OPS] = {"gdn.conv", "gdn.prep", "gdn.recurrent", "gdn.chunked", "gdn.out"};
static double op_err[N_OPS];
static int op_fail[N_OPS];

/* Records got vs ref (n values) for op: relative error against ref's scale; fails above tol or on a NaN. */
static void compare(int op, const char *what, const char *shape, const float *got, const float *ref, int64_t n,
                    double tol) {
    const double err = ops_max_rel_err(got, ref, n);
    if (getenv("STRATA_OPS_VERBOSE")) fprintf(stderr, "%-14s %-18s %-32s %.3g\n", op_name[op], what, shape, err);
    if (!(err <= tol)) {
        fprintf(stderr, "%s %s (%s): max rel err %.3g > %.3g\n", op_name[op], what, shape, err, tol);
        op_fail[op] = 1;
    }
    if (!(err <= op_err[op])) op_err[op] = err;
}

/* ---------------------------------------------------------------- inputs */

static float *dup(const float *x, int64_t n) {
    float *p = malloc((size_t)n * sizeof(float));
    memcpy(p, x, (size_t)n * sizeof(float));
    return p;
}

typedef struct {
    int Gk, Gv, dk, Kc;
    int64_t L;
} shape;

/* ---------------------------------------------------------------- one shape */

static void run_shape(const shape *sh, uint64_t seed) {
    g_rng = seed;
    const int Gk = sh->Gk, Gv = sh->Gv, dk = sh->dk, dv = sh->dk, Kc = sh->Kc;
    const int64_t L = sh->L, KD = (int64_t)Gk * dk, VD = (int64_t)Gv * dv, CD = 2 * KD + VD;
    const int64_t ld = CD + VD + 2 * Gv + 3;   /* projection rows [qkv | z | b | a] and a gap: ld != CD */
    const int64_t SN = (int64_t)Gv * dk * dv;
    char name[96];
    snprintf(name, sizeof name, "Gk %d Gv %d d %d Kc %d L %lld", Gk, Gv, dk, Kc, (long long)L);

    float *P = rnd_array(L * ld, -1.5f, 1.5f);
    float *hist0 = rnd_array((Kc - 1) * CD, -1.5f, 1.5f);
    float *convw = rnd_array(CD * Kc, -0.8f, 0.8f);
    float *A_log = rnd_array(Gv, -3.0f, 1.5f), *ssm_a = malloc((size_t)Gv * sizeof(float));
    for (int h = 0; h < Gv; h++) ssm_a[h] = -expf(A_log[h]);
    float *dt_bias = rnd_array(Gv, -1.0f, 1.0f);
    float *normw = rnd_array(dv, 0.5f, 1.5f);
    float *S0 = rnd_array(SN, -0.3f, 0.3f);
    const float eps = 1e-6f;

    /* gdn.conv: gdn_k_conv over (t, ch), then gdn_k_conv_advance over ch */
    float *qkv = malloc((size_t)((Kc - 1 + L) * CD) * sizeof(float));
    float *cv = malloc((size_t)(L * CD) * sizeof(float)), *cv_e = malloc((size_t)(L * CD) * sizeof(float));
    float *hist = dup(hist0, (Kc - 1) * CD), *hist_e = dup(hist0, (Kc - 1) * CD);
    mdl_gdn_conv(convw, Kc, CD, hist, P, ld, L, qkv, cv);
    for (int64_t t = 0; t < L; t++)
        for (int64_t ch = 0; ch < CD; ch++) cv_e[t * CD + ch] = gdn_conv_out(convw, hist_e, P, ld, Kc, CD, t, ch);
    for (int64_t ch = 0; ch < CD; ch++) gdn_conv_advance(hist_e, P, ld, Kc, CD, L, ch);
    compare(OP_CONV, "cv", name, cv_e, cv, L * CD, 0.0);
    compare(OP_CONV, "history", name, hist_e, hist, (Kc - 1) * CD, 0.0);

    /* gdn.prep: gdn_k_qk_norm (a warp per q or k head vector) and gdn_k_gates (a thread per value head) */
    float *qn = malloc((size_t)(L * KD) * sizeof(float)), *kn = malloc((size_t)(L * KD) * sizeof(float));
    float *qn_e = malloc((size_t)(L * KD) * sizeof(float)), *kn_e = malloc((size_t)(L * KD) * sizeof(float));
    float *beta = malloc((size_t)(L * Gv) * sizeof(float)), *g = malloc((size_t)(L * Gv) * sizeof(float));
    float *beta_e = malloc((size_t)(L * Gv) * sizeof(float)), *g_e = malloc((size_t)(L * Gv) * sizeof(float));
    mdl_gdn_qk_norm(cv, L, Gk, dk, CD, qn, kn);
    for (int64_t t = 0; t < L; t++)
        for (int h = 0; h < Gv; h++) {
            beta[t * Gv + h] = P[t * ld + CD + VD + h];
            g[t * Gv + h] = P[t * ld + CD + VD + Gv + h];
        }
    mdl_gdn_gates(ssm_a, dt_bias, L, Gv, beta, g);
    for (int64_t v = 0; v < L * Gk * 2; v++) {
        const int is_q = v % 2 == 0;
        const int64_t th = v / 2, t = th / Gk, hk = th % Gk;
        const float *x = cv + t * CD + (is_q ? 0 : KD) + hk * dk;
        float part[OPS_WARP];
        for (int lane = 0; lane < OPS_WARP; lane++) part[lane] = gdn_sumsq_lane(x, dk, lane);
        const float ss = ops_fold32(part);
        for (int lane = 0; lane < OPS_WARP; lane++) gdn_l2_lane(x, (is_q ? qn_e : kn_e) + th * dk, dk, ss, is_q, lane);
    }
    for (int64_t i = 0; i < L * Gv; i++) {
        const int64_t t = i / Gv;
        const int h = (int)(i % Gv);
        beta_e[i] = gdn_beta(P[t * ld + CD + VD + h]);
        g_e[i] = gdn_gate(P[t * ld + CD + VD + Gv + h], ssm_a[h], dt_bias[h]);
    }
    compare(OP_PREP, "q", name, qn_e, qn, L * KD, 1e-5);
    compare(OP_PREP, "k", name, kn_e, kn, L * KD, 1e-5);
    compare(OP_PREP, "beta", name, beta_e, beta, L * Gv, 0.0);
    compare(OP_PREP, "g", name, g_e, g, L * Gv, 0.0);

    /* the heads: gdn.c's qn, kn, cv (v), beta, g and the prior state S0 */
    strata_model *m = calloc(1, sizeof *m);
    m->hp.ssm_dk = dk;
    m->hp.ssm_gk = Gk;
    m->hp.ssm_gv = Gv;
    m->hp.ssm_kc = Kc;
    float *o_r = calloc((size_t)(L * VD), sizeof(float)), *o_e = calloc((size_t)(L * VD), sizeof(float));
    float *S_r = dup(S0, SN), *S_e = dup(S0, SN);
    gdn_heads H = {.qn = qn, .kn = kn, .cv = cv, .beta = beta, .g = g, .o = o_e, .L = L,
                   .Gk = Gk, .Gv = Gv, .dk = dk, .dv = dv};

    /* gdn.recurrent: gdn_k_recurrent, a block per head, thread j through the rows */
    for (int h = 0; h < Gv; h++) mdl_gdn_head_recurrent(m, h, S_r + h * dk * dv, qn, kn, cv, beta, g, o_r, L);
    for (int h = 0; h < Gv; h++)
        for (int j = 0; j < dv; j++)
            for (int64_t t = 0; t < L; t++) gdn_o(&H, t, h)[j] = gdn_recurrent_col(&H, S_e + h * dk * dv, t, h, j);
    compare(OP_RECURRENT, "o", name, o_e, o_r, L * VD, 0.0);
    compare(OP_RECURRENT, "S", name, S_e, S_r, SN, 0.0);

    /* gdn.chunked: gdn_k_chunked, a block per head, its phases in order per chunk */
    float *o_c = calloc((size_t)(L * VD), sizeof(float));
    float *S_c = dup(S0, SN), *S_ce = dup(S0, SN);
    for (int h = 0; h < Gv; h++) CHECK(mdl_gdn_head_chunked(m, h, S_c + h * dk * dv, qn, kn, cv, beta, g, o_c, L) == 0);
    memset(o_e, 0, (size_t)(L * VD) * sizeof(float));
    float *work = malloc((size_t)(Gv * gdn_chunk_work_floats(dk, dv)) * sizeof(float));
    for (int h = 0; h < Gv; h++) {
        const gdn_chunk_work w = gdn_chunk_work_at(work, h, dk, dv);
        float *Sh = S_ce + h * dk * dv;
        for (int64_t c0 = 0; c0 < L; c0 += GDN_OPS_CHUNK) {
            const int n = (int)(L - c0 < GDN_OPS_CHUNK ? L - c0 : GDN_OPS_CHUNK);
            for (int i = 0; i < n; i++) w.gam[i] = gdn_chunk_gamma(&H, c0, h, i);
            for (int p = 0; p < n * n; p++) gdn_chunk_pair(&H, &w, c0, h, n, p / n, p % n);
            for (int j = 0; j < dk || j < dv; j++) gdn_chunk_solve_col(&H, &w, c0, h, n, j);
            for (int j = 0; j < dv; j++) gdn_chunk_out_col(&H, &w, Sh, c0, h, n, j);
        }
    }
    compare(OP_CHUNKED, "o", name, o_e, o_c, L * VD, 0.0);
    compare(OP_CHUNKED, "S", name, S_ce, S_c, SN, 0.0);
    /* the two forms agree in exact arithmetic: within fp32 rounding of 64-row sums */
    compare(OP_CHUNKED, "o vs recurrent", name, o_e, o_r, L * VD, 1e-4);
    compare(OP_CHUNKED, "S vs recurrent", name, S_ce, S_r, SN, 1e-4);

    /* gdn.out: gdn_k_out, a warp per (row, head), both gates; its input is the recurrent output */
    for (int gate_sigmoid = 1; gate_sigmoid >= 0; gate_sigmoid--) {
        float *y = dup(o_r, L * VD), *y_e = dup(o_r, L * VD);
        mdl_gdn_out(y, P + CD, ld, normw, L, Gv, dv, eps, gate_sigmoid);
        for (int64_t v = 0; v < L * Gv; v++) {
            const int64_t t = v / Gv, h = v % Gv;
            float *oh = y_e + v * dv, part[OPS_WARP];
            for (int lane = 0; lane < OPS_WARP; lane++) part[lane] = gdn_sumsq_lane(oh, dv, lane);
            const float ss = ops_fold32(part);
            for (int lane = 0; lane < OPS_WARP; lane++)
                gdn_out_lane(oh, P + t * ld + CD + h * dv, normw, dv, ss, eps, gate_sigmoid, lane);
        }
        compare(OP_OUT, gate_sigmoid ? "o (sigmoid gate)" : "o (silu gate)", name, y_e, y, L * VD, 1e-5);
        free(y);
        free(y_e);
    }

    free(P); free(hist0); free(convw); free(A_log); free(ssm_a); free(dt_bias); free(normw); free(S0);
    free(qkv); free(cv); free(cv_e); free(hist); free(hist_e);
    free(qn); free(kn); free(qn_e); free(kn_e); free(beta); free(g); free(beta_e); free(g_e);
    free(m); free(o_r); free(o_e); free(S_r); free(S_e); free(o_c); free(S_c); free(S_ce); free(work);
}

int main(void) {
    static const shape shapes[] = {
        {16, 48, 128, 4, 1}, {16, 48, 128, 4, 37}, {16, 48, 128, 4, 64},   /* the real model */
        {2, 6, 20, 3, 1}, {2, 6, 20, 3, 5}, {2, 6, 20, 3, 150},             /* small, odd; three chunks */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) run_shape(&shapes[i], 0x6d6e7f00u + i);
    for (int op = 0; op < N_OPS; op++) {
        printf("OP %s - %s %.3g\n", op_name[op], op_fail[op] ? "fail" : "pass", op_err[op]);
        CHECK(!op_fail[op]);
    }
    if (!g_failed) printf("all checks passed\n");
    return g_failed != 0;
}
