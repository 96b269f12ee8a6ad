/*
 * gdn.cuh — the Gated DeltaNet mixer's kernels (spec §7; the C path is model/gdn.c): the causal conv and
 * its history, the per-token q/k norms and gates, the delta rule in its recurrent (decode) and chunked
 * (prefill) forms, and the gated output norm. Arithmetic in OPS_FN units (ops_common.cuh), checked on the
 * host against gdn.c by tests/native/test_cuda_ops_gdn.c; launchers in gdn.cu (gdn.h).
 *
 * Layouts are gdn.c's: conv rows [L x CD] with CD = 2*Gk*dk + Gv*dv ([q | k | v], head-major); qn, kn
 * [L x Gk x dk]; beta, g [L x Gv]; o [L x Gv*dv]; the state S [Gv][dk][dv]; value head h reads key head
 * h % Gk (GGUF's tiled order, model.h).
 *
 * The recurrent and chunked forms are written per column j of a head's state: in both, column j of S,
 * U, V' and O depends on column j alone (plus rows of k, q, A and W), so a thread owns a column and sums
 * over rows in gdn.c's order, and on the host the results are gdn.c's bit for bit (gdn.c's vector sweeps do
 * the same element-wise operations in the same order; its dots are mdl_dot8, gdn_dot8 here). Only the q/k
 * l2 norm and the output RMS norm reduce across a warp, and differ from gdn.c's serial sums by rounding.
 * On the GPU, nvcc's default FMA contraction and its expf differ from the host's by rounding too.
 * Not here yet: the open chunk of STRATA_EVAL_CONTINUED (gdn.c's skip/open rows) and KEEP_STATES conv slots.
 */
#ifndef STRATA_KERNELS_CUDA_GDN_CUH
#define STRATA_KERNELS_CUDA_GDN_CUH

#include <stdint.h>

#include "kernels/cuda/ops_common.cuh"

/* gdn.c's GDN_CHUNK: the chunked form's rows per chunk */
#define GDN_OPS_CHUNK 64

/* ---------------------------------------------------------------- conv (one thread per output / channel) */

/* Row r of the conv window: the history's rows 0..Kc-2, then the new rows (row t at x + t * ldx). */
OPS_FN const float *gdn_conv_row(const float *hist, const float *x, int64_t ldx, int Kc, int64_t CD, int64_t r) {
    return r < Kc - 1 ? hist + r * CD : x + (r - (Kc - 1)) * ldx;
}

/* Channel ch of new row t: silu of the Kc taps over window rows t .. t+Kc-1 (last tap = row t itself). */
OPS_FN float gdn_conv_out(const float *w, const float *hist, const float *x, int64_t ldx, int Kc, int64_t CD,
                          int64_t t, int64_t ch) {
    float acc = 0.0f;
    for (int k = 0; k < Kc; k++) acc += w[ch * Kc + k] * gdn_conv_row(hist, x, ldx, Kc, CD, t + k)[ch];
    return ops_silu(acc);
}

/* Channel ch of the history after L new rows: window rows L .. L+Kc-2, in place. Rows ascend, and row r
 * reads window row r + L > r, which this channel's thread has not overwritten yet. Run after every
 * gdn_conv_out of the step (they read the old history). */
OPS_FN void gdn_conv_advance(float *hist, const float *x, int64_t ldx, int Kc, int64_t CD, int64_t L, int64_t ch) {
    for (int64_t r = 0; r < Kc - 1; r++) hist[r * CD + ch] = gdn_conv_row(hist, x, ldx, Kc, CD, r + L)[ch];
}

/* ---------------------------------------------------------------- prep (a warp per q or k head vector) */

/* Lane `lane`'s part of Σ x_e² over e ≡ lane (mod 32), e ascending. */
OPS_FN float gdn_sumsq_lane(const float *x, int n, int lane) {
    float s = 0.0f;
    for (int e = lane; e < n; e += OPS_WARP) s += x[e] * x[e];
    return s;
}

/* l2norm (eps 1e-6 on the sum of squares) of one q or k head vector of n, given that sum; q also × n^-½.
 * Writes the lane's values e ≡ lane (mod 32). */
OPS_FN void gdn_l2_lane(const float *x, float *y, int n, float ss, int is_q, int lane) {
    const float r = 1.0f / sqrtf(ss + 1e-6f), qscale = 1.0f / sqrtf((float)n);
    for (int e = lane; e < n; e += OPS_WARP) y[e] = is_q ? x[e] * r * qscale : x[e] * r;
}

/* β = σ(b) of value head h */
OPS_FN float gdn_beta(float b) { return ops_sigmoid(b); }

/* g = ssm_a · softplus(a + dt_bias) of value head h (ssm_a = -exp(A_log) < 0: the log decay) */
OPS_FN float gdn_gate(float a, float ssm_a, float dt_bias) { return ssm_a * ops_softplus(a + dt_bias); }

/* ---------------------------------------------------------------- the heads: recurrent and chunked forms */

/* The inputs and output of the heads over L rows (gdn.c's gdn_job). */
typedef struct {
    const float *qn, *kn;   /* L x Gk x dk, l2-normalised (q also scaled) */
    const float *cv;        /* L x CD conv rows: v of head h at 2*Gk*dk + h*dv */
    const float *beta, *g;  /* L x Gv */
    float *o;               /* L x Gv*dv */
    int64_t L;
    int Gk, Gv, dk, dv;
} gdn_heads;

/* value head h's key head: tiled (h % Gk), not the spec's repeat-interleave h / (Gv / Gk): the GGUF stores
 * the value heads reordered (model.h) */
OPS_FN int gdn_key_head(int h, int Gk, int Gv) {
    (void)Gv;
    return h % Gk;
}

OPS_FN const float *gdn_q(const gdn_heads *H, int64_t t, int h) {
    return H->qn + (t * H->Gk + gdn_key_head(h, H->Gk, H->Gv)) * H->dk;
}
OPS_FN const float *gdn_k(const gdn_heads *H, int64_t t, int h) {
    return H->kn + (t * H->Gk + gdn_key_head(h, H->Gk, H->Gv)) * H->dk;
}
OPS_FN const float *gdn_v(const gdn_heads *H, int64_t t, int h) {
    const int64_t CD = 2 * (int64_t)H->Gk * H->dk + (int64_t)H->Gv * H->dv;
    return H->cv + t * CD + 2 * (int64_t)H->Gk * H->dk + (int64_t)h * H->dv;
}
OPS_FN float *gdn_o(const gdn_heads *H, int64_t t, int h) { return H->o + t * H->Gv * H->dv + (int64_t)h * H->dv; }

/* Recurrent form, one token, column j of head h's state S [dk][dv] (spec §7.5): decay, pred_j = Σ_i S_ij k_i,
 * δ_j = β (v_j − pred_j), S_ij += k_i δ_j, and the output o_j = Σ_i S_ij q_i (after the update). */
OPS_FN float gdn_recurrent_col(const gdn_heads *H, float *S, int64_t t, int h, int j) {
    const float *q = gdn_q(H, t, h), *k = gdn_k(H, t, h);
    const int dk = H->dk, dv = H->dv;
    const float eg = expf(H->g[t * H->Gv + h]), beta = H->beta[t * H->Gv + h];
    float pred = 0.0f;
    for (int i = 0; i < dk; i++) {
        S[i * dv + j] *= eg;
        pred += S[i * dv + j] * k[i];
    }
    const float delta = (gdn_v(H, t, h)[j] - pred) * beta;
    float o = 0.0f;
    for (int i = 0; i < dk; i++) {
        S[i * dv + j] += k[i] * delta;
        o += S[i * dv + j] * q[i];
    }
    return o;
}

/* A head's chunk scratch (global memory; gdn.c's head_chunked work). */
typedef struct {
    float *A;     /* C x C: β_i (k_i·k_j) e^{γ_i−γ_j}, j < i */
    float *QK;    /* C x C: (q_i·k_j) e^{γ_i−γ_j}, j <= i */
    float *gam;   /* C: running sum of g in the chunk */
    float *dec;   /* C: e^{γ_n−γ_i}, row i's decay to the chunk's end */
    float *U;     /* C x dv */
    float *W;     /* C x dk */
    float *Vp;    /* C x dv: V' */
} gdn_chunk_work;

OPS_FN int64_t gdn_chunk_work_floats(int dk, int dv) {
    const int64_t C = GDN_OPS_CHUNK;
    return 2 * C * C + 2 * C + C * (2 * (int64_t)dv + dk);
}

OPS_FN gdn_chunk_work gdn_chunk_work_at(float *work, int h, int dk, int dv) {
    const int64_t C = GDN_OPS_CHUNK;
    gdn_chunk_work w;
    w.A = work + h * gdn_chunk_work_floats(dk, dv);
    w.QK = w.A + C * C;
    w.gam = w.QK + C * C;
    w.dec = w.gam + C;
    w.U = w.dec + C;
    w.W = w.U + C * dv;
    w.Vp = w.W + C * dk;
    return w;
}

/* mdl_dot8's order: eight partial sums (lane l takes e ≡ l mod 8, e ascending), then its fixed tree. */
OPS_FN float gdn_dot8(const float *a, const float *b, int n) {
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int e = 0;
    for (; e + 8 <= n; e += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[e + l] * b[e + l];
    for (; e < n; e++) acc[e & 7] += a[e] * b[e];
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

/* γ_i: the running sum of g over the chunk's rows 0..i (chunk at row c0). */
OPS_FN float gdn_chunk_gamma(const gdn_heads *H, int64_t c0, int h, int i) {
    float acc = 0.0f;
    for (int s = 0; s <= i; s++) acc += H->g[(c0 + s) * H->Gv + h];
    return acc;
}

/* One element (i, j) of the chunk's (n rows) two triangles, given γ: A_ij (j < i) and QK_ij (j <= i);
 * the diagonal's also row i's decay to the chunk's end. */
OPS_FN void gdn_chunk_pair(const gdn_heads *H, const gdn_chunk_work *w, int64_t c0, int h, int n, int i, int j) {
    const int64_t C = GDN_OPS_CHUNK;
    if (j > i) return;
    if (j == i) w->dec[i] = expf(w->gam[n - 1] - w->gam[i]);
    const float decay = expf(w->gam[i] - w->gam[j]);
    const float *kj = gdn_k(H, c0 + j, h);
    if (j < i)
        w->A[i * C + j] = H->beta[(c0 + i) * H->Gv + h] * gdn_dot8(gdn_k(H, c0 + i, h), kj, H->dk) * decay;
    w->QK[i * C + j] = gdn_dot8(gdn_q(H, c0 + i, h), kj, H->dk) * decay;
}

/* Column j of U and W by forward substitution over the chunk's n rows (row i needs rows < i of its own
 * column only): U_i = β_i v_i − Σ_{r<i} A_ir U_r, W_i = β_i e^{γ_i} k_i − Σ_{r<i} A_ir W_r. */
OPS_FN void gdn_chunk_solve_col(const gdn_heads *H, const gdn_chunk_work *w, int64_t c0, int h, int n, int j) {
    const int64_t C = GDN_OPS_CHUNK;
    const int dk = H->dk, dv = H->dv;
    for (int i = 0; i < n; i++) {
        const float b = H->beta[(c0 + i) * H->Gv + h], be = b * expf(w->gam[i]);
        const float *Ai = w->A + i * C;
        if (j < dv) {
            float u = b * gdn_v(H, c0 + i, h)[j];
            for (int r = 0; r < i; r++) u = u - Ai[r] * w->U[r * dv + j];
            w->U[i * dv + j] = u;
        }
        if (j < dk) {
            float x = be * gdn_k(H, c0 + i, h)[j];
            for (int r = 0; r < i; r++) x = x - Ai[r] * w->W[r * dk + j];
            w->W[i * dk + j] = x;
        }
    }
}

/* Column j < dv of the chunk's V' = U − W S, its outputs O = e^γ Q S + QK V' and the state's advance
 * S ← e^{γ_n} S + (e^{γ_n−γ} K)ᵀ V', in that order (all of column j of S is read before it changes). */
OPS_FN void gdn_chunk_out_col(const gdn_heads *H, const gdn_chunk_work *w, float *S, int64_t c0, int h, int n,
                              int j) {
    const int64_t C = GDN_OPS_CHUNK;
    const int dk = H->dk, dv = H->dv;
    for (int i = 0; i < n; i++) {
        const float *Wi = w->W + i * dk;
        float x = w->U[i * dv + j];
        for (int r = 0; r < dk; r++) x = x - Wi[r] * S[r * dv + j];
        w->Vp[i * dv + j] = x;
    }
    for (int i = 0; i < n; i++) {
        const float *qi = gdn_q(H, c0 + i, h), *QKi = w->QK + i * C;
        const float eg = expf(w->gam[i]);
        float x = 0.0f;
        for (int r = 0; r < dk; r++) x = x + (qi[r] * eg) * S[r * dv + j];
        for (int r = 0; r <= i; r++) x = x + QKi[r] * w->Vp[r * dv + j];
        gdn_o(H, c0 + i, h)[j] = x;
    }
    const float egl = expf(w->gam[n - 1]);
    for (int e = 0; e < dk; e++) {
        float x = S[e * dv + j] * egl;
        for (int r = 0; r < n; r++) x = x + (gdn_k(H, c0 + r, h)[e] * w->dec[r]) * w->Vp[r * dv + j];
        S[e * dv + j] = x;
    }
}

/* ---------------------------------------------------------------- output (a warp per head of a row) */

/* The gated RMS norm of one head's o (dv values, in place) given Σ o²: o / rms(o) · w · act(z), act σ
 * (gate_sigmoid, the real model) or silu. Writes the lane's values e ≡ lane (mod 32). */
OPS_FN void gdn_out_lane(float *o, const float *z, const float *w, int dv, float ss, float eps, int gate_sigmoid,
                         int lane) {
    const float r = 1.0f / sqrtf(ss / (float)dv + eps);
    for (int e = lane; e < dv; e += OPS_WARP)
        o[e] = o[e] * r * w[e] * (gate_sigmoid ? ops_sigmoid(z[e]) : ops_silu(z[e]));
}

/* ---------------------------------------------------------------- kernels */
#ifdef __CUDACC__

/* cv[t][ch] for t < L, ch < CD: one thread each. */
static __global__ void gdn_k_conv(const float *w, const float *hist, const float *x, int64_t ldx, int Kc, int64_t CD,
                                  int64_t L, float *cv) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= L * CD) return;
    cv[i] = gdn_conv_out(w, hist, x, ldx, Kc, CD, i / CD, i % CD);
}

/* the history's advance: one thread per channel */
static __global__ void gdn_k_conv_advance(float *hist, const float *x, int64_t ldx, int Kc, int64_t CD, int64_t L) {
    const int64_t ch = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= CD) return;
    gdn_conv_advance(hist, x, ldx, Kc, CD, L, ch);
}

/* q and k norms: one warp per (row t, key head, q|k): vector v = (t * Gk + hk) * 2 + is_k */
static __global__ void gdn_k_qk_norm(const float *cv, int64_t L, int Gk, int dk, int64_t CD, float *qn, float *kn) {
    const int64_t v = (int64_t)blockIdx.x * (blockDim.x / OPS_WARP) + threadIdx.x / OPS_WARP;
    const int lane = threadIdx.x % OPS_WARP;
    if (v >= L * Gk * 2) return;   /* whole warps leave together */
    const int is_q = v % 2 == 0;
    const int64_t th = v / 2, t = th / Gk, hk = th % Gk;
    const float *x = cv + t * CD + (is_q ? 0 : (int64_t)Gk * dk) + hk * dk;
    const float ss = __shfl_sync(0xffffffffu, ops_warp_sum(gdn_sumsq_lane(x, dk, lane)), 0);
    gdn_l2_lane(x, (is_q ? qn : kn) + th * dk, dk, ss, is_q, lane);
}

/* β and g: one thread per (row, value head); b, a rows ldba floats apart */
static __global__ void gdn_k_gates(const float *b, const float *a, int64_t ldba, const float *ssm_a,
                                   const float *dt_bias, int64_t L, int Gv, float *beta, float *g) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= L * Gv) return;
    const int64_t t = i / Gv;
    const int h = (int)(i % Gv);
    beta[i] = gdn_beta(b[t * ldba + h]);
    g[i] = gdn_gate(a[t * ldba + h], ssm_a[h], dt_bias[h]);
}

/* Recurrent form: one block per value head, thread j owns column j of its state through the L rows. */
static __global__ void gdn_k_recurrent(gdn_heads H, float *S, float *S_slots) {
    const int h = blockIdx.x, j = threadIdx.x;
    if (j >= H.dv) return;
    const int64_t hs = (int64_t)H.dk * H.dv;
    float *Sh = S + h * hs;
    for (int64_t t = 0; t < H.L; t++) {
        gdn_o(&H, t, h)[j] = gdn_recurrent_col(&H, Sh, t, h, j);
        if (S_slots)   /* KEEP_STATES: the state after token t */
            for (int i = 0; i < H.dk; i++) S_slots[(t * H.Gv + h) * hs + (int64_t)i * H.dv + j] = Sh[i * H.dv + j];
    }
}

/* Chunked form: one block per value head, chunks in order; per chunk γ (thread i < n), the triangles
 * (threads over the pairs), the solve (thread per column of U and W), then V', O and S (thread per
 * column of S). Barriers between phases that read other threads' rows. */
static __global__ void gdn_k_chunked(gdn_heads H, float *S, float *work) {
    const int h = blockIdx.x, tid = threadIdx.x, nt = blockDim.x;
    const gdn_chunk_work w = gdn_chunk_work_at(work, h, H.dk, H.dv);
    float *Sh = S + (int64_t)h * H.dk * H.dv;
    for (int64_t c0 = 0; c0 < H.L; c0 += GDN_OPS_CHUNK) {
        const int n = (int)(H.L - c0 < GDN_OPS_CHUNK ? H.L - c0 : GDN_OPS_CHUNK);
        for (int i = tid; i < n; i += nt) w.gam[i] = gdn_chunk_gamma(&H, c0, h, i);
        __syncthreads();
        for (int p = tid; p < n * n; p += nt) gdn_chunk_pair(&H, &w, c0, h, n, p / n, p % n);
        __syncthreads();
        for (int j = tid; j < H.dk || j < H.dv; j += nt) gdn_chunk_solve_col(&H, &w, c0, h, n, j);
        __syncthreads();
        for (int j = tid; j < H.dv; j += nt) gdn_chunk_out_col(&H, &w, Sh, c0, h, n, j);
        __syncthreads();
    }
}

/* Output norm: one warp per (row, value head); z rows ldz floats apart. */
static __global__ void gdn_k_out(float *o, const float *z, int64_t ldz, const float *w, int64_t L, int Gv, int dv,
                                 float eps, int gate_sigmoid) {
    const int64_t v = (int64_t)blockIdx.x * (blockDim.x / OPS_WARP) + threadIdx.x / OPS_WARP;
    const int lane = threadIdx.x % OPS_WARP;
    if (v >= L * Gv) return;   /* whole warps leave together */
    const int64_t t = v / Gv, h = v % Gv;
    float *oh = o + v * dv;
    const float ss = __shfl_sync(0xffffffffu, ops_warp_sum(gdn_sumsq_lane(oh, dv, lane)), 0);
    gdn_out_lane(oh, z + t * ldz + h * dv, w, dv, ss, eps, gate_sigmoid, lane);
}

#endif
#endif
