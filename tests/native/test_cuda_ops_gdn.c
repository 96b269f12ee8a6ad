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
// MUTATION: kernels/cuda/emu_mixers.h | for (int64_t ch = 0; ch < CD; ch++) gdn_conv_advance | for (int64_t ch = 1; ch < CD; ch++) gdn_conv_advance | gdn.conv
// MUTATION: kernels/cuda/emu_mixers.h | (is_q ? 0 : (int64_t)Gk * dk) + hk * dk | (is_q ? (int64_t)Gk * dk : 0) + hk * dk | gdn.prep
// MUTATION: kernels/cuda/emu_mixers.h | beta[i] = gdn_beta(b[t * ldba + h]); | beta[i] = gdn_beta(b[t * Gv + h]); | gdn.prep
// MUTATION: kernels/cuda/emu_mixers.h | S_slots[(t * Gv + h) * hs | S_slots[(h * L + t) * hs | gdn.recurrent
// MUTATION: kernels/cuda/emu_mixers.h | for (int j = 0; j < dv; j++) gdn_chunk_out_col | for (int j = 1; j < dv; j++) gdn_chunk_out_col | gdn.chunked
// MUTATION: kernels/cuda/emu_mixers.h | gdn_out_lane(oh, z + t * ldz + h * dv, | gdn_out_lane(oh, z + t * ldz + h, | gdn.out
/*
 * test_cuda_ops_gdn.c — the Gated DeltaNet kernels' arithmetic (kernels/cuda/gdn.cuh) run on the host over
 * each launch's whole grid, in the kernels' order, against the C path (model/gdn.c) op by op (issue 19
 * point 4; tools/cuda_ops.py). Each launch is its launcher's host emulation (emu_gdn_* of
 * kernels/cuda/emu_mixers.h, the launcher's signature), so a mutation of the units fails the emulation too.
 * Ops: gdn.conv (the causal conv and its history's advance), gdn.prep (q/k l2 norms, β, g; also in place),
 * gdn.recurrent (decode form; with KEEP_STATES slots against gdn.c one row at a time, where they fit in
 * 32 MiB), gdn.chunked (prefill form: against gdn.c's chunked form, and within rounding against its
 * recurrent form on the same inputs), gdn.out (the gated RMS norm, sigmoid and silu gates); and per op the
 * launcher's refusals (head dim > 1024) and empty launches, by status. Shapes: the real model's (16 k heads, 48 v heads x 128, conv 4) at L = 1, 37, 64 and a
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

#include "kernels/cuda/emu_mixers.h"
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

/* Records a launch's status: an emulation returns what its launcher returns (a refusal included). */
static void expect_status(int op, const char *what, const char *shape, strata_status got, strata_status want) {
    if (got == want) return;
    fprintf(stderr, "%s %s (%s): status %d, the launcher's %d (%s)\n", op_name[op], what, shape, (int)got, (int)want,
            strata_last_error());
    op_fail[op] = 1;
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

    /* gdn.conv: gdn_cuda_conv's grid (gdn_k_conv over (t, ch), then gdn_k_conv_advance over ch) */
    float *qkv = malloc((size_t)((Kc - 1 + L) * CD) * sizeof(float));
    float *cv = malloc((size_t)(L * CD) * sizeof(float)), *cv_e = malloc((size_t)(L * CD) * sizeof(float));
    float *hist = dup(hist0, (Kc - 1) * CD), *hist_e = dup(hist0, (Kc - 1) * CD);
    mdl_gdn_conv(convw, Kc, CD, hist, P, ld, L, qkv, cv);
    expect_status(OP_CONV, "launch", name, emu_gdn_conv(convw, Kc, CD, hist_e, P, ld, L, cv_e, NULL), STRATA_OK);
    compare(OP_CONV, "cv", name, cv_e, cv, L * CD, 0.0);
    compare(OP_CONV, "history", name, hist_e, hist, (Kc - 1) * CD, 0.0);

    /* gdn.prep: gdn_cuda_prep's grid (gdn_k_qk_norm, a warp per q or k head vector; gdn_k_gates, a thread per
     * value head), reading b and a from the projection rows (ldba = ld) */
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
    expect_status(OP_PREP, "launch", name,
                  emu_gdn_prep(cv, L, Gk, Gv, dk, dv, P + CD + VD, P + CD + VD + Gv, ld, ssm_a, dt_bias, qn_e, kn_e,
                               beta_e, g_e, NULL),
                  STRATA_OK);
    compare(OP_PREP, "q", name, qn_e, qn, L * KD, 1e-5);
    compare(OP_PREP, "k", name, kn_e, kn, L * KD, 1e-5);
    compare(OP_PREP, "beta", name, beta_e, beta, L * Gv, 0.0);
    compare(OP_PREP, "g", name, g_e, g, L * Gv, 0.0);
    /* ... and in place, as the forward may call it: beta == b, g == a, ldba == Gv */
    float *b_in = malloc((size_t)(L * Gv) * sizeof(float)), *a_in = malloc((size_t)(L * Gv) * sizeof(float));
    for (int64_t t = 0; t < L; t++)
        for (int h = 0; h < Gv; h++) {
            b_in[t * Gv + h] = P[t * ld + CD + VD + h];
            a_in[t * Gv + h] = P[t * ld + CD + VD + Gv + h];
        }
    expect_status(OP_PREP, "launch in place", name,
                  emu_gdn_prep(cv, L, Gk, Gv, dk, dv, b_in, a_in, Gv, ssm_a, dt_bias, qn_e, kn_e, b_in, a_in, NULL),
                  STRATA_OK);
    compare(OP_PREP, "beta in place", name, b_in, beta, L * Gv, 0.0);
    compare(OP_PREP, "g in place", name, a_in, g, L * Gv, 0.0);
    free(b_in);
    free(a_in);

    /* the heads: gdn.c's qn, kn, cv (v), beta, g and the prior state S0 */
    strata_model *m = calloc(1, sizeof *m);
    m->hp.ssm_dk = dk;
    m->hp.ssm_gk = Gk;
    m->hp.ssm_gv = Gv;
    m->hp.ssm_kc = Kc;
    float *o_r = calloc((size_t)(L * VD), sizeof(float)), *o_e = calloc((size_t)(L * VD), sizeof(float));
    float *S_r = dup(S0, SN), *S_e = dup(S0, SN);

    /* gdn.recurrent: gdn_cuda_recurrent's grid (gdn_k_recurrent, a block per head, thread j through the rows) */
    for (int h = 0; h < Gv; h++) mdl_gdn_head_recurrent(m, h, S_r + h * dk * dv, qn, kn, cv, beta, g, o_r, L);
    expect_status(OP_RECURRENT, "launch", name,
                  emu_gdn_recurrent(S_e, qn, kn, cv, beta, g, o_e, L, Gk, Gv, dk, dv, NULL, NULL), STRATA_OK);
    compare(OP_RECURRENT, "o", name, o_e, o_r, L * VD, 0.0);
    compare(OP_RECURRENT, "S", name, S_e, S_r, SN, 0.0);
    /* KEEP_STATES: S_slots, the state after each row, against gdn.c run one row at a time (its recurrence
     * carries nothing but S from row to row); where L x the state fits in 32 MiB */
    if (L * SN <= ((int64_t)1 << 23)) {
        float *slots_r = malloc((size_t)(L * SN) * sizeof(float));
        float *slots_e = malloc((size_t)(L * SN) * sizeof(float));
        float *S_1 = dup(S0, SN), *S_s = dup(S0, SN), *o_1 = malloc((size_t)(L * VD) * sizeof(float));
        for (int64_t t = 0; t < L; t++)
            for (int h = 0; h < Gv; h++) {
                mdl_gdn_head_recurrent(m, h, S_1 + h * dk * dv, qn + t * KD, kn + t * KD, cv + t * CD, beta + t * Gv,
                                       g + t * Gv, o_1 + t * VD, 1);
                memcpy(slots_r + (t * Gv + h) * dk * dv, S_1 + h * dk * dv, (size_t)(dk * dv) * sizeof(float));
            }
        expect_status(OP_RECURRENT, "launch with slots", name,
                      emu_gdn_recurrent(S_s, qn, kn, cv, beta, g, o_e, L, Gk, Gv, dk, dv, slots_e, NULL), STRATA_OK);
        compare(OP_RECURRENT, "S slots", name, slots_e, slots_r, L * SN, 0.0);
        compare(OP_RECURRENT, "o with slots", name, o_e, o_r, L * VD, 0.0);
        compare(OP_RECURRENT, "S with slots", name, S_s, S_r, SN, 0.0);
        free(slots_r); free(slots_e); free(S_1); free(S_s); free(o_1);
    }

    /* gdn.chunked: gdn_cuda_chunked's grid (gdn_k_chunked, a block per head, its phases in order per chunk) */
    float *o_c = calloc((size_t)(L * VD), sizeof(float));
    float *S_c = dup(S0, SN), *S_ce = dup(S0, SN);
    for (int h = 0; h < Gv; h++) CHECK(mdl_gdn_head_chunked(m, h, S_c + h * dk * dv, qn, kn, cv, beta, g, o_c, L) == 0);
    memset(o_e, 0, (size_t)(L * VD) * sizeof(float));
    float *work = malloc(emu_gdn_chunked_work_floats(Gv, dk, dv) * sizeof(float));
    expect_status(OP_CHUNKED, "launch", name,
                  emu_gdn_chunked(S_ce, qn, kn, cv, beta, g, o_e, L, Gk, Gv, dk, dv, work, NULL), STRATA_OK);
    compare(OP_CHUNKED, "o", name, o_e, o_c, L * VD, 0.0);
    compare(OP_CHUNKED, "S", name, S_ce, S_c, SN, 0.0);
    /* the two forms agree in exact arithmetic: within fp32 rounding of 64-row sums */
    compare(OP_CHUNKED, "o vs recurrent", name, o_e, o_r, L * VD, 1e-4);
    compare(OP_CHUNKED, "S vs recurrent", name, S_ce, S_r, SN, 1e-4);

    /* gdn.out: gdn_cuda_out's grid (gdn_k_out, a warp per (row, head)), both gates; its input is the recurrent
     * output */
    for (int gate_sigmoid = 1; gate_sigmoid >= 0; gate_sigmoid--) {
        float *y = dup(o_r, L * VD), *y_e = dup(o_r, L * VD);
        mdl_gdn_out(y, P + CD, ld, normw, L, Gv, dv, eps, gate_sigmoid);
        expect_status(OP_OUT, "launch", name,
                      emu_gdn_out(y_e, P + CD, ld, normw, L, Gv, dv, eps, gate_sigmoid, NULL), STRATA_OK);
        compare(OP_OUT, gate_sigmoid ? "o (sigmoid gate)" : "o (silu gate)", name, y_e, y, L * VD, 1e-5);
        free(y);
        free(y_e);
    }

    free(P); free(hist0); free(convw); free(A_log); free(ssm_a); free(dt_bias); free(normw); free(S0);
    free(qkv); free(cv); free(cv_e); free(hist); free(hist_e);
    free(qn); free(kn); free(qn_e); free(kn_e); free(beta); free(g); free(beta_e); free(g_e);
    free(m); free(o_r); free(o_e); free(S_r); free(S_e); free(o_c); free(S_c); free(S_ce); free(work);
}

/* ---------------------------------------------------------------- the launchers' argument checks */

/* What the launchers refuse (a head dim past a block's 1024 threads) and what they skip (no rows): nothing
 * is read, so no buffers. */
static void run_refusals(void) {
    expect_status(OP_RECURRENT, "dv 1025", "-",
                  emu_gdn_recurrent(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 1, 1, 16, 1025, NULL, NULL),
                  STRATA_ERR_UNSUPPORTED);
    expect_status(OP_CHUNKED, "dk 1025", "-",
                  emu_gdn_chunked(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 1, 1, 1025, 16, NULL, NULL),
                  STRATA_ERR_UNSUPPORTED);
    expect_status(OP_CHUNKED, "dv 1025", "-",
                  emu_gdn_chunked(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 1, 1, 16, 1025, NULL, NULL),
                  STRATA_ERR_UNSUPPORTED);
    expect_status(OP_CONV, "L 0", "-", emu_gdn_conv(NULL, 4, 16, NULL, NULL, 16, 0, NULL, NULL), STRATA_OK);
    expect_status(OP_PREP, "L 0", "-",
                  emu_gdn_prep(NULL, 0, 1, 1, 16, 16, NULL, NULL, 1, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
                  STRATA_OK);
    expect_status(OP_RECURRENT, "L 0", "-",
                  emu_gdn_recurrent(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 1, 1, 16, 16, NULL, NULL), STRATA_OK);
    expect_status(OP_CHUNKED, "L 0", "-",
                  emu_gdn_chunked(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 1, 1, 16, 16, NULL, NULL), STRATA_OK);
    expect_status(OP_OUT, "L 0", "-", emu_gdn_out(NULL, NULL, 16, NULL, 0, 1, 16, 1e-6f, 1, NULL), STRATA_OK);
}

int main(void) {
    static const shape shapes[] = {
        {16, 48, 128, 4, 1}, {16, 48, 128, 4, 37}, {16, 48, 128, 4, 64},   /* the real model */
        {2, 6, 20, 3, 1}, {2, 6, 20, 3, 5}, {2, 6, 20, 3, 150},             /* small, odd; three chunks */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) run_shape(&shapes[i], 0x6d6e7f00u + i);
    run_refusals();
    for (int op = 0; op < N_OPS; op++) {
        printf("OP %s - %s %.3g\n", op_name[op], op_fail[op] ? "fail" : "pass", op_err[op]);
        CHECK(!op_fail[op]);
    }
    if (!g_failed) printf("all checks passed\n");
    return g_failed != 0;
}
