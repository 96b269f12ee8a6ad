/*
 * gdn.c — Gated DeltaNet, the `linear_attention` mixer (spec §7).
 *
 * Projections qkv = [q | k | v] (contiguous), z, b, a; a causal depthwise conv (Kc taps, silu)
 * over the qkv channels, fed from the session's last Kc-1 rows; per value head h (GGUF tiled
 * order: key head h % Gk) the delta rule on an fp32 state S[dk][dv]:
 *     S ← e^g S;  δ = β (v − Sᵀk);  S ← S + k δᵀ;  o = Sᵀq        (q, k l2-normalised, q · dk^-½)
 * with β = σ(b) and g = ssm_a · softplus(a + dt_bias); then o ← rms(o) · w · act(z) and W_out.
 *
 * Two forms with the same numbers (in exact arithmetic; they differ by rounding only):
 *   - the recurrence above, token by token: decode and short evals;
 *   - the chunked form (spec §7.6) over 64-token chunks for prefill: within a chunk the
 *     recurrence is solved as a unit-lower-triangular system, so the work becomes small dense
 *     products that use the caches and vector units better than a per-token state sweep.
 * Heads are independent: tasks on the pool are value heads.
 *
 * An open chunk (STRATA_EVAL_CONTINUED, strata.h): a prompt evaluated in pieces that do not end on
 * 64-token chunk boundaries gives the bits of one evaluation when the partial chunk at a piece's end is
 * left open and the recurrent state stays at the chunk's start. Within a chunk, row i reads rows <= i
 * only (the triangular solve, the running sum of g, the masked products), so what the rows solved so
 * far is kept in the layer state (their normalised k; per value head U before V', W, V' and the running
 * sum of g) and the next piece solves its own rows on from them, the chunk as one unit; the kept rows'
 * outputs were given before and are skipped. Only the state update at the chunk's end reads every row.
 */
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/carve.h"
#include "util/error.h"

enum { GDN_CHUNK = 64, GDN_CHUNK_MIN_TOKENS = 32 };

typedef struct {
    const strata_model *m;
    const mdl_layer *l;
    float *S;             /* [Gv][dk][dv] */
    const float *qn, *kn; /* L x Gk x dk, normalised (q also scaled) */
    const float *cv;      /* L x conv_dim, conv output (v at offset 2*Gk*dk) */
    const float *beta, *g;/* L x Gv */
    float *o;             /* L x Gv*dv */
    int64_t L;            /* rows: the open chunk's kept rows (skip), then the new ones */
    int64_t skip;         /* leading rows whose outputs were given before: o row = row - skip */
    int chunked;
    int open;             /* leave a partial last chunk open: no state update at its end */
    int nomem;            /* set (atomically) by a head that found no memory for the chunked form */
    float *S_slots;       /* KEEP_STATES window: L x [Gv][dk][dv], the state after each token; else NULL */
    float *heads;         /* the open chunk's per-head rows (gdn_open_head_row each), or NULL */
} gdn_job;

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

static void head_recurrent(const gdn_job *J, int h, float *S) {
    const mdl_hparams *hp = &J->m->hp;
    const int64_t dk = hp->ssm_dk, dv = hp->ssm_dk, Gk = hp->ssm_gk, Gv = hp->ssm_gv;
    const int64_t CD = 2 * Gk * dk + Gv * dv;
    const int kh = (int)(h % Gk);
    float pred[1024], delta[1024];
    for (int64_t t = 0; t < J->L; t++) {
        const float *q = J->qn + (t * Gk + kh) * dk, *k = J->kn + (t * Gk + kh) * dk;
        const float *v = J->cv + t * CD + 2 * Gk * dk + h * dv;
        const float eg = expf(J->g[t * Gv + h]), beta = J->beta[t * Gv + h];
        for (int64_t j = 0; j < dv; j++) pred[j] = 0.0f;
        for (int64_t i = 0; i < dk; i++) {
            float *Si = S + i * dv;
            const float ki = k[i];
            for (int64_t j = 0; j < dv; j++) {
                Si[j] *= eg;
                pred[j] += Si[j] * ki;
            }
        }
        for (int64_t j = 0; j < dv; j++) delta[j] = (v[j] - pred[j]) * beta;
        float *o = J->o + t * Gv * dv + h * dv;
        for (int64_t j = 0; j < dv; j++) o[j] = 0.0f;
        for (int64_t i = 0; i < dk; i++) {
            float *Si = S + i * dv;
            const float ki = k[i], qi = q[i];
            for (int64_t j = 0; j < dv; j++) {
                Si[j] += ki * delta[j];
                o[j] += Si[j] * qi;
            }
        }
        if (J->S_slots) memcpy(J->S_slots + (t * Gv + h) * dk * dv, S, (size_t)(dk * dv) * sizeof(float));
    }
}

/* Chunked form of the same recurrence (spec §7.6), chunk C: with γ the running sum of g inside
 * the chunk, A_ij = β_i (k_i·k_j) e^{γ_i−γ_j} (j < i), solve (I + A) U = β V and
 * (I + A) W = β e^γ K by forward substitution; V' = U − W S; O = e^γ Q S + [(Q Kᵀ) ⊙ e^{γ_i−γ_j}]_{j≤i} V';
 * S ← e^{γ_C} S + (e^{γ_C−γ} K)ᵀ V'. */
static void head_chunked(const gdn_job *J, int h, float *S, float *work) {
    const mdl_hparams *hp = &J->m->hp;
    const int64_t dk = hp->ssm_dk, dv = hp->ssm_dk, Gk = hp->ssm_gk, Gv = hp->ssm_gv;
    const int64_t CD = 2 * Gk * dk + Gv * dv;
    const int kh = (int)(h % Gk);
    const int64_t C = GDN_CHUNK;
    float *A = work;                 /* C x C */
    float *U = A + C * C;            /* C x dv */
    float *Wk = U + C * dv;          /* C x dk */
    float *gam = Wk + C * dk;        /* C */
    float *Vp = gam + C;             /* C x dv: V' */
    float wt[GDN_CHUNK];             /* per-row weights of the current sweep */
    /* The products below are written as sweeps over a block of output elements that stays in
     * vector registers (8 vectors of 8 floats: eight independent add chains, enough to hide the
     * add latency; then single vectors, then a scalar tail) while the other
     * operand streams; every element still sees the same operations in the same order as the
     * plain loops (mul, then add or subtract, never fused: -ffp-contract=off), so the numbers
     * are those of the straightforward form, bit for bit. */
    typedef float v8f __attribute__((vector_size(32)));
    typedef float v8fu __attribute__((vector_size(32), aligned(4)));
    typedef float v16f __attribute__((vector_size(64)));
    typedef float v16fu __attribute__((vector_size(64), aligned(4)));
#define LD(p) (*(const v8fu *)(p))
#define ST(p, v) (*(v8fu *)(p) = (v))
#define LD16(p) (*(const v16fu *)(p))
#define LO8(v) __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7)
#define HI8(v) __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15)
    /* y[j] = init_j; then for r < nr: y[j] op= coef(r) * X(r)[j], for j in [0, len). Blocks of 128
     * (a head's width) run as eight 16-float vectors: where the build has 512-bit registers
     * (-march=native on an AVX-512 host) that is half the instructions of eight pairs of 8-float
     * ones, with the same element-wise operations, so the same numbers. */
#define GDN_SWEEP(len, INIT, NR, COEF, XROW, OP, STORE)                                          \
    do {                                                                                         \
        int64_t j0_ = 0;                                                                         \
        for (; j0_ + 128 <= (len); j0_ += 128) {                                                 \
            v16f a_[8];                                                                          \
            for (int v_ = 0; v_ < 8; v_++) {                                                     \
                v8f lo_, hi_;                                                                    \
                { const int64_t j_ = j0_ + 16 * v_; (void)j_; lo_ = INIT; }                      \
                { const int64_t j_ = j0_ + 16 * v_ + 8; (void)j_; hi_ = INIT; }                  \
                a_[v_] = __builtin_shufflevector(lo_, hi_, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); \
            }                                                                                    \
            for (int64_t r_ = 0; r_ < (NR); r_++) {                                              \
                const float c_ = (COEF);                                                         \
                const float *x_ = (XROW) + j0_;                                                  \
                for (int v_ = 0; v_ < 8; v_++) a_[v_] = a_[v_] OP (c_ * LD16(x_ + 16 * v_));     \
            }                                                                                    \
            for (int v_ = 0; v_ < 8; v_++) {                                                     \
                { const int64_t j_ = j0_ + 16 * v_; STORE(j_, LO8(a_[v_])); }                    \
                { const int64_t j_ = j0_ + 16 * v_ + 8; STORE(j_, HI8(a_[v_])); }                \
            }                                                                                    \
        }                                                                                        \
        for (; j0_ + 64 <= (len); j0_ += 64) {                                                   \
            v8f a_[8];                                                                           \
            for (int v_ = 0; v_ < 8; v_++) { const int64_t j_ = j0_ + 8 * v_; (void)j_; a_[v_] = INIT; } \
            for (int64_t r_ = 0; r_ < (NR); r_++) {                                              \
                const float c_ = (COEF);                                                         \
                const float *x_ = (XROW) + j0_;                                                  \
                for (int v_ = 0; v_ < 8; v_++) a_[v_] = a_[v_] OP (c_ * LD(x_ + 8 * v_));        \
            }                                                                                    \
            for (int v_ = 0; v_ < 8; v_++) { const int64_t j_ = j0_ + 8 * v_; STORE(j_, a_[v_]); } \
        }                                                                                        \
        for (; j0_ + 8 <= (len); j0_ += 8) {                                                     \
            const int64_t j_ = j0_;                                                              \
            (void)j_;                                                                            \
            v8f a_ = INIT;                                                                       \
            for (int64_t r_ = 0; r_ < (NR); r_++) {                                              \
                const float c_ = (COEF);                                                         \
                a_ = a_ OP (c_ * LD((XROW) + j0_));                                              \
            }                                                                                    \
            STORE(j_, a_);                                                                       \
        }                                                                                        \
        for (; j0_ < (len); j0_++) {                                                             \
            const int64_t j_ = j0_;                                                              \
            (void)j_;                                                                            \
            float s_ = INIT##_S;                                                                 \
            for (int64_t r_ = 0; r_ < (NR); r_++) s_ = s_ OP ((COEF) * (XROW)[j0_]);             \
            STORE##_S(j_, s_);                                                                   \
        }                                                                                        \
    } while (0)
    /* out[t] = mdl_dot8(a, ROW(j0 + t), dk) for t < cnt (<= 4), four at once: the same lane sums
     * (lane l takes the products e ≡ l mod 8, e ascending) and the same final reduction as
     * mdl_dot8, as independent chains instead of one latency-bound chain per product */
#define GDN_DOTS(a, ROW, j0, cnt, out)                                                           \
    do {                                                                                         \
        v8f d_[4] = {{0}, {0}, {0}, {0}};                                                        \
        float l_[4][8];                                                                          \
        int64_t e_ = 0;                                                                          \
        for (; e_ + 8 <= dk; e_ += 8) {                                                          \
            const v8f av_ = LD((a) + e_);                                                        \
            for (int t_ = 0; t_ < 4; t_++)                                                       \
                if (t_ < (cnt)) d_[t_] = d_[t_] + av_ * LD(ROW((j0) + t_) + e_);                 \
        }                                                                                        \
        for (int t_ = 0; t_ < (cnt); t_++) {                                                     \
            memcpy(l_[t_], &d_[t_], sizeof l_[t_]);                                              \
            for (int64_t f_ = e_; f_ < dk; f_++) l_[t_][f_ & 7] += (a)[f_] * ROW((j0) + t_)[f_]; \
            (out)[t_] = ((l_[t_][0] + l_[t_][4]) + (l_[t_][2] + l_[t_][6])) +                    \
                        ((l_[t_][1] + l_[t_][5]) + (l_[t_][3] + l_[t_][7]));                     \
        }                                                                                        \
    } while (0)
    /* the open chunk's rows of this head, row r at hc + r * HR: U_r (before V'), W_r, V'_r, γ_r */
    const int64_t HR = gdn_open_head_row(hp);
    float *hc = J->heads ? J->heads + h * (GDN_CHUNK - 1) * HR : NULL;
    for (int64_t c0 = 0; c0 < J->L; c0 += C) {
        const int64_t n = J->L - c0 < C ? J->L - c0 : C;
        /* rows [0, p0) of this chunk were solved by an earlier eval (the open chunk): theirs are cached */
        const int64_t p0 = c0 == 0 ? J->skip : 0;
        for (int64_t i = 0; i < p0; i++) {
            const float *r = hc + i * HR;
            memcpy(U + i * dv, r, (size_t)dv * sizeof(float));
            memcpy(Wk + i * dk, r + dv, (size_t)dk * sizeof(float));
            memcpy(Vp + i * dv, r + dv + dk, (size_t)dv * sizeof(float));
            gam[i] = r[2 * dv + dk];
        }
        float acc = p0 ? gam[p0 - 1] : 0.0f;
        for (int64_t i = p0; i < n; i++) { acc += J->g[(c0 + i) * Gv + h]; gam[i] = acc; }
#define KROW(i) (J->kn + ((c0 + (i)) * Gk + kh) * dk)
#define QROW(i) (J->qn + ((c0 + (i)) * Gk + kh) * dk)
#define VROW(i) (J->cv + (c0 + (i)) * CD + 2 * Gk * dk + h * dv)
#define BETA(i) (J->beta[(c0 + (i)) * Gv + h])
        for (int64_t i = p0; i < n; i++) {
            for (int64_t j = 0; j < i; j += 4) GDN_DOTS(KROW(i), KROW, j, i - j < 4 ? i - j : 4, wt + j);
            for (int64_t j = 0; j < i; j++) A[i * C + j] = BETA(i) * wt[j] * expf(gam[i] - gam[j]);
        }
        /* forward substitution: U_i = β_i v_i − Σ_{j<i} A_ij U_j; W_i = β_i e^{γ_i} k_i − Σ A_ij W_j */
        for (int64_t i = p0; i < n; i++) {
            float *Ui = U + i * dv, *Wi = Wk + i * dk;
            const float *vi = VROW(i), *ki = KROW(i);
            const float b = BETA(i), be = b * expf(gam[i]);
            const float *Ai = A + i * C;
#define INIT_U (b * LD(vi + j_))
#define INIT_U_S (b * vi[j_])
#define STORE_U(j, v) ST(Ui + (j), v)
#define STORE_U_S(j, v) (Ui[j] = (v))
            GDN_SWEEP(dv, INIT_U, i, Ai[r_], U + r_ * dv, -, STORE_U);
#define INIT_W (be * LD(ki + j_))
#define INIT_W_S (be * ki[j_])
#define STORE_W(j, v) ST(Wi + (j), v)
#define STORE_W_S(j, v) (Wi[j] = (v))
            GDN_SWEEP(dk, INIT_W, i, Ai[r_], Wk + r_ * dk, -, STORE_W);
        }
        /* V' = U − W S */
        for (int64_t i = p0; i < n; i++) {
            const float *Ui = U + i * dv, *Wi = Wk + i * dk;
            float *Vi = Vp + i * dv;
#define INIT_V (LD(Ui + j_))
#define INIT_V_S (Ui[j_])
#define STORE_V(j, v) ST(Vi + (j), v)
#define STORE_V_S(j, v) (Vi[j] = (v))
            GDN_SWEEP(dv, INIT_V, dk, Wi[r_], S + r_ * dv, -, STORE_V);
        }
        /* O_i = e^{γ_i} q_i S + Σ_{j≤i} (q_i·k_j) e^{γ_i−γ_j} V'_j */
        for (int64_t i = p0; i < n; i++) {
            float *o = J->o + (c0 + i - J->skip) * Gv * dv + h * dv;
            const float *qi = QROW(i);
            const float eg = expf(gam[i]);
            for (int64_t jj = 0; jj <= i; jj += 4) GDN_DOTS(qi, KROW, jj, i + 1 - jj < 4 ? i + 1 - jj : 4, wt + jj);
            for (int64_t jj = 0; jj <= i; jj++) wt[jj] = wt[jj] * expf(gam[i] - gam[jj]);
            /* o = 0 + Σ_e (q_e e^γ) S_e, then + Σ_{jj ≤ i} wt_jj V'_jj: one sweep per part, o in between */
#define INIT_Z ((v8f){0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f})
#define INIT_Z_S 0.0f
#define STORE_O(j, v) ST(o + (j), v)
#define STORE_O_S(j, v) (o[j] = (v))
            GDN_SWEEP(dv, INIT_Z, dk, qi[r_] * eg, S + r_ * dv, +, STORE_O);
#define INIT_O (LD(o + j_))
#define INIT_O_S (o[j_])
            GDN_SWEEP(dv, INIT_O, i + 1, wt[r_], Vp + r_ * dv, +, STORE_O);
        }
        if (J->open && n < C) {   /* the last chunk stays open: the next eval completes it from its rows */
            for (int64_t i = p0; i < n; i++) {
                float *r = hc + i * HR;
                memcpy(r, U + i * dv, (size_t)dv * sizeof(float));
                memcpy(r + dv, Wk + i * dk, (size_t)dk * sizeof(float));
                memcpy(r + dv + dk, Vp + i * dv, (size_t)dv * sizeof(float));
                r[2 * dv + dk] = gam[i];
            }
            break;
        }
        /* S ← e^{γ_n} S + Σ_i e^{γ_n−γ_i} k_i V'_iᵀ: per row e of S, the scaling then the terms
         * in order of i */
        const float gl = gam[n - 1], egl = expf(gl);
        for (int64_t i = 0; i < n; i++) wt[i] = expf(gl - gam[i]);
        for (int64_t e = 0; e < dk; e++) {
            float *Se = S + e * dv;
#define INIT_S (LD(Se + j_) * egl)
#define INIT_S_S (Se[j_] * egl)
#define STORE_S(j, v) ST(Se + (j), v)
#define STORE_S_S(j, v) (Se[j] = (v))
            GDN_SWEEP(dv, INIT_S, n, KROW(r_)[e] * wt[r_], Vp + r_ * dv, +, STORE_S);
        }
#undef KROW
#undef QROW
#undef VROW
#undef BETA
    }
#undef LD
#undef ST
#undef LD16
#undef LO8
#undef HI8
#undef GDN_SWEEP
#undef GDN_DOTS
#undef INIT_U
#undef INIT_U_S
#undef STORE_U
#undef STORE_U_S
#undef INIT_W
#undef INIT_W_S
#undef STORE_W
#undef STORE_W_S
#undef INIT_V
#undef INIT_V_S
#undef STORE_V
#undef STORE_V_S
#undef INIT_Z
#undef INIT_Z_S
#undef STORE_O
#undef STORE_O_S
#undef INIT_O
#undef INIT_O_S
#undef INIT_S
#undef INIT_S_S
#undef STORE_S
#undef STORE_S_S
}

static void head_task(void *arg, int64_t h, int thread) {
    (void)thread;
    const gdn_job *J = arg;
    const mdl_hparams *hp = &J->m->hp;
    const int64_t dk = hp->ssm_dk, dv = hp->ssm_dk;
    float *S = J->S + h * dk * dv;
    if (J->chunked) {
        const int64_t C = GDN_CHUNK;
        float *work = malloc((size_t)(C * C + 2 * C * dv + C * dk + C) * sizeof(float));
        if (work) {
            head_chunked(J, (int)h, S, work);
            free(work);
            return;
        }
        if (J->skip || J->open) {   /* kept rows exist only in the chunked form: no way round it */
            __atomic_store_n(&((gdn_job *)J)->nomem, 1, __ATOMIC_RELAXED);
            return;
        }
    }
    head_recurrent(J, (int)h, S);
}

/* One value head's recurrent or chunked form over L rows, from a fresh chunk (no open chunk kept or
 * left): the heads as head_task runs them, for the CUDA op check (tests/native/test_cuda_ops_gdn.c).
 * Arguments as gdn_job's; only m->hp is read. Chunked: STRATA_ERR_NOMEM without its scratch. */
void mdl_gdn_head_recurrent(const strata_model *m, int h, float *S, const float *qn, const float *kn,
                            const float *cv, const float *beta, const float *g, float *o, int64_t L) {
    const gdn_job J = {.m = m, .qn = qn, .kn = kn, .cv = cv, .beta = beta, .g = g, .o = o, .L = L};
    head_recurrent(&J, h, S);
}

strata_status mdl_gdn_head_chunked(const strata_model *m, int h, float *S, const float *qn, const float *kn,
                                   const float *cv, const float *beta, const float *g, float *o, int64_t L) {
    const int64_t C = GDN_CHUNK, dk = m->hp.ssm_dk, dv = m->hp.ssm_dk;
    float *work = malloc((size_t)(C * C + 2 * C * dv + C * dk + C) * sizeof(float));
    if (!work) return strata_fail(STRATA_ERR_NOMEM, "GDN: no memory for the chunked form");
    const gdn_job J = {.m = m, .qn = qn, .kn = kn, .cv = cv, .beta = beta, .g = g, .o = o, .L = L, .chunked = 1};
    head_chunked(&J, h, S, work);
    free(work);
    return STRATA_OK;
}

/* The causal depthwise conv (Kc taps w [CD][Kc], silu) of L new rows (row t at x + t * ldx, CD channels)
 * after the conv history conv [(Kc-1) x CD]: cv [L x CD]; conv advances to the window's last Kc-1 rows.
 * qkv: scratch [(Kc-1+L) x CD], left holding the window (history rows, then the new rows). */
void mdl_gdn_conv(const float *w, int64_t Kc, int64_t CD, float *conv, const float *x, int64_t ldx, int64_t L,
                  float *qkv, float *cv) {
    /* rows 0..Kc-2 of qkv: the conv history; then the L new rows */
    memcpy(qkv, conv, (size_t)((Kc - 1) * CD) * sizeof(float));
    for (int64_t t = 0; t < L; t++) memcpy(qkv + (Kc - 1 + t) * CD, x + t * ldx, (size_t)CD * sizeof(float));
    for (int64_t t = 0; t < L; t++) {
        float *ct = cv + t * CD;
        for (int64_t ch = 0; ch < CD; ch++) {
            const float *wc = w + ch * Kc;
            float acc = 0.0f;
            for (int64_t k = 0; k < Kc; k++) acc += wc[k] * qkv[(t + k) * CD + ch];
            ct[ch] = acc;
        }
        for (int64_t ch = 0; ch < CD; ch++) ct[ch] = ops_silu(ct[ch]);   /* a loop of its own: it vectorises */
    }
    memcpy(conv, qkv + L * CD, (size_t)((Kc - 1) * CD) * sizeof(float));
}

/* q, k of L conv rows (cv [L x CD]: q at 0, k at Gk*dk): l2norm per key head (eps 1e-6 on the sum),
 * q also × dk^-½, into qn, kn [L x Gk x dk]. */
void mdl_gdn_qk_norm(const float *cv, int64_t L, int64_t Gk, int64_t dk, int64_t CD, float *qn, float *kn) {
    const int64_t KD = Gk * dk;
    const float qscale = 1.0f / sqrtf((float)dk);
    for (int64_t t = 0; t < L; t++)
        for (int64_t hk = 0; hk < Gk; hk++) {
            const float *q = cv + t * CD + hk * dk, *k = cv + t * CD + KD + hk * dk;
            float sq = 0.0f, sk = 0.0f;
            for (int64_t e = 0; e < dk; e++) { sq += q[e] * q[e]; sk += k[e] * k[e]; }
            const float rq = 1.0f / sqrtf(sq + 1e-6f), rk = 1.0f / sqrtf(sk + 1e-6f);
            float *qo = qn + (t * Gk + hk) * dk, *ko = kn + (t * Gk + hk) * dk;
            for (int64_t e = 0; e < dk; e++) { qo[e] = q[e] * rq * qscale; ko[e] = k[e] * rk; }
        }
}

/* In place over L rows of Gv: b ← β = σ(b), a ← g = ssm_a · softplus(a + dt_bias). */
void mdl_gdn_gates(const float *ssm_a, const float *dt_bias, int64_t L, int64_t Gv, float *b, float *a) {
    for (int64_t t = 0; t < L; t++)
        for (int64_t h = 0; h < Gv; h++) {
            b[t * Gv + h] = ops_sigmoid(b[t * Gv + h]);
            a[t * Gv + h] = ssm_a[h] * softplus(a[t * Gv + h] + dt_bias[h]);
        }
}

/* The part of the layer between its projections and W_out, for one sequence's L rows: P holds the
 * rows' projections [qkv (CD) | z (VD) | b (Gv) | a (Gv)] (ld floats apart), o receives the gated,
 * normalised head outputs (L x VD). Reads and advances the sequence's conv and recurrent state. */
/* One sequence's part of a batched layer: its job and the buffers the job reads. */
typedef struct {
    gdn_job J;
    float *qkv, *cv, *ba, *qn;   /* one allocation (util/carve.h), at qkv */
    /* gdn_prep's arguments and result, for the pool task that runs it (gdn_seq_task) */
    strata_session *s;
    const float *P;
    int64_t L;
    float *o;
    strata_status rc;            /* gdn_prep's */
} gdn_seq;

static void gdn_seq_free(gdn_seq *g) {
    free(g->qkv);
    g->qkv = g->cv = g->ba = g->qn = NULL;
}

static strata_status gdn_prep(strata_session *s, int il, const float *P, int64_t ld, int64_t L, float *o, gdn_seq *g) {
    const strata_model *m = s->m;
    const mdl_hparams *hp = &m->hp;
    const mdl_layer *l = &m->layers[il];
    mdl_layer_state *st = &s->ls[il];
    const int64_t dk = hp->ssm_dk, dv = hp->ssm_dk, Gk = hp->ssm_gk, Gv = hp->ssm_gv, Kc = hp->ssm_kc;
    const int64_t KD = Gk * dk, VD = Gv * dv, CD = 2 * KD + VD;
    const int keep = mdl_spec_active(s);
    const int64_t p = st->n_open, N = p + L;   /* the open chunk's kept rows, then the L new ones */
    const int chunked = !keep && (p > 0 || L >= GDN_CHUNK_MIN_TOKENS || s->gdn_leave_open || s->gdn_continues);
    const int open = chunked && s->gdn_leave_open && N % GDN_CHUNK;
    if (open && !st->open) {
        st->open = malloc((size_t)gdn_open_floats(hp) * sizeof(float));
        if (!st->open) return strata_fail(STRATA_ERR_NOMEM, "GDN layer %d: no memory for an open chunk", il);
    }
    size_t bytes = 0;
    const size_t o_qkv = carve(&bytes, (size_t)((L + Kc - 1) * CD) * sizeof(float), 64),
                 o_cv = carve(&bytes, (size_t)(N * CD) * sizeof(float), 64),
                 o_ba = carve(&bytes, (size_t)(N * Gv * 2) * sizeof(float), 64),
                 o_qn = carve(&bytes, (size_t)(N * KD * 2) * sizeof(float), 64);
    char *buf = malloc(bytes);
    if (!buf) return strata_fail(STRATA_ERR_NOMEM, "GDN layer %d: no memory for %lld tokens", il, (long long)L);
    float *qkv = g->qkv = (float *)(buf + o_qkv);
    float *cvall = g->cv = (float *)(buf + o_cv);
    float *baall = g->ba = (float *)(buf + o_ba);
    float *qnall = g->qn = (float *)(buf + o_qn);
    /* the kept rows in front: of them only k is read here (the heads' rows are cached, gdn_job.heads);
     * the new rows' from row p on */
    if (p) memcpy(qnall + N * KD, st->open, (size_t)(p * KD) * sizeof(float));
    float *cv = cvall + p * CD, *qn = qnall + p * KD;
    float *b = baall + p * Gv, *a = baall + N * Gv + p * Gv;
    for (int64_t t = 0; t < L; t++) {
        const float *pt = P + t * ld;
        memcpy(b + t * Gv, pt + CD + VD, (size_t)Gv * sizeof(float));
        memcpy(a + t * Gv, pt + CD + VD + Gv, (size_t)Gv * sizeof(float));
    }
    mdl_gdn_conv(l->ssm_conv, Kc, CD, st->conv, P, ld, L, qkv, cv);
    if (keep)   /* a verify window: the conv window after each token, for rollback (spec.c) */
        for (int64_t t = 0; t < L; t++)
            memcpy(st->conv_slots + t * (Kc - 1) * CD, qkv + (t + 1) * CD, (size_t)((Kc - 1) * CD) * sizeof(float));
    float *kn = qnall + N * KD + p * KD;
    mdl_gdn_qk_norm(cv, L, Gk, dk, CD, qn, kn);
    mdl_gdn_gates(l->ssm_a, l->ssm_dt_bias, L, Gv, b, a);
    g->J = (gdn_job){.m = m, .l = l, .S = st->S, .qn = qnall, .kn = qnall + N * KD, .cv = cvall, .beta = baall,
                     .g = baall + N * Gv, .o = o, .L = N, .skip = p, .chunked = chunked, .open = open,
                     .S_slots = keep ? st->S_slots : NULL,
                     .heads = st->open ? st->open + (GDN_CHUNK - 1) * KD : NULL};
    return STRATA_OK;
}

/* After the heads ran: the k rows of a chunk left open are kept for the next eval (or none are). */
static void gdn_keep_open(const gdn_seq *g, mdl_layer_state *st) {
    const gdn_job *J = &g->J;
    const mdl_hparams *hp = &J->m->hp;
    const int64_t KD = (int64_t)hp->ssm_gk * hp->ssm_dk;
    const int64_t r = J->open ? J->L % GDN_CHUNK : 0, t0 = J->L - r;
    if (r) memcpy(st->open, J->kn + t0 * KD, (size_t)(r * KD) * sizeof(float));   /* the heads wrote theirs */
    st->n_open = r;
}

/* The gated RMS norm per value head, in place over o [L x Gv*dv]: rms(o) · w · act(z), act σ (gate_sigmoid)
 * or silu; row t's z at z + t * ldz (Gv*dv values). */
void mdl_gdn_out(float *o, const float *z, int64_t ldz, const float *w, int64_t L, int64_t Gv, int64_t dv, float eps,
                 int gate_sigmoid) {
    const int64_t VD = Gv * dv;
    for (int64_t t = 0; t < L; t++)
        for (int64_t h = 0; h < Gv; h++) {
            float *oh = o + t * VD + h * dv;
            const float *zh = z + t * ldz + h * dv;
            mdl_rmsnorm(oh, w, dv, eps, oh);
            if (gate_sigmoid) for (int64_t e = 0; e < dv; e++) oh[e] *= ops_sigmoid(zh[e]);
            else for (int64_t e = 0; e < dv; e++) oh[e] *= ops_silu(zh[e]);
        }
}

/* After the heads ran: the gated RMS norm of the sequence's head outputs. */
static void gdn_post(const gdn_seq *g, const float *P, int64_t ld) {
    const strata_model *m = g->J.m;
    const mdl_hparams *hp = &m->hp;
    const mdl_layer *l = g->J.l;
    const int64_t dk = hp->ssm_dk, dv = hp->ssm_dk, Gk = hp->ssm_gk, Gv = hp->ssm_gv;
    const int64_t KD = Gk * dk, VD = Gv * dv, CD = 2 * KD + VD, L = g->J.L - g->J.skip;
    mdl_gdn_out(g->J.o, P + CD, ld, l->ssm_norm, L, Gv, dv, hp->eps, hp->gate_sigmoid);
}

/* The sequences' parts before their heads, a pool task each: they touch only their own sequence's
 * state and rows, so the sequences of a step run side by side (serially they were 12 us of an
 * 8-sequence GDN layer's 90 on flash-small, the other thread idle). */
typedef struct {
    gdn_seq *G;
    int il;
    int64_t ld;
} gdn_seqs;

static void gdn_seq_task(void *arg, int64_t i, int thread) {
    (void)thread;
    const gdn_seqs *A = arg;
    gdn_seq *g = &A->G[i];
    g->rc = gdn_prep(g->s, A->il, g->P, A->ld, g->L, g->o, g);
}

strata_status mdl_gdn_multi(strata_session *const *ss, const int64_t *Ls, int n, int il, const float *u, int64_t R,
                            float *y) {
    const strata_model *m = ss[0]->m;
    const mdl_hparams *hp = &m->hp;
    const mdl_layer *l = &m->layers[il];
    const int64_t dk = hp->ssm_dk, dv = hp->ssm_dk, Gk = hp->ssm_gk, Gv = hp->ssm_gv;
    const int64_t KD = Gk * dk, VD = Gv * dv, CD = 2 * KD + VD, ld = CD + VD + 2 * Gv;
    if (dk > 1024) return strata_fail(STRATA_ERR_UNSUPPORTED, "GDN head dim %lld > 1024", (long long)dk);
    /* the four projections of every row, each one product over all R rows, side by side per row */
    size_t bytes = 0;
    const size_t o_pj = carve(&bytes, (size_t)(R * (CD + VD + 2 * Gv)) * sizeof(float), 64),
                 o_P = carve(&bytes, (size_t)(R * ld) * sizeof(float), 64), o_o = carve(&bytes, (size_t)(R * VD) * sizeof(float), 64),
                 o_G = carve(&bytes, (size_t)n * sizeof(gdn_seq), 64), o_args = carve(&bytes, (size_t)n * sizeof(void *), 16),
                 o_counts = carve(&bytes, (size_t)n * sizeof(int64_t), 16);
    char *buf = malloc(bytes);
    if (!buf) return strata_fail(STRATA_ERR_NOMEM, "GDN layer %d: no memory for %lld tokens", il, (long long)R);
    float *pj = (float *)(buf + o_pj), *P = (float *)(buf + o_P), *o = (float *)(buf + o_o);
    gdn_seq *G = (gdn_seq *)(buf + o_G);
    memset(G, 0, (size_t)n * sizeof *G);
    void **args = (void **)(buf + o_args);
    int64_t *counts = (int64_t *)(buf + o_counts);
    strata_status rc = STRATA_OK;
    float *pq = pj, *pz = pq + R * CD, *pb = pz + R * VD, *pa = pb + R * Gv;
    {
        const mdl_mat *ws[] = {&l->ssm_qkv, &l->ssm_z, &l->ssm_beta, &l->ssm_alpha};
        float *const ys[] = {pq, pz, pb, pa};
        if ((rc = mdl_matmul_set(m, ws, 4, u, R, ys))) goto done;
    }
    for (int64_t t = 0; t < R; t++) {
        float *row = P + t * ld;
        memcpy(row, pq + t * CD, (size_t)CD * sizeof(float));
        memcpy(row + CD, pz + t * VD, (size_t)VD * sizeof(float));
        memcpy(row + CD + VD, pb + t * Gv, (size_t)Gv * sizeof(float));
        memcpy(row + CD + VD + Gv, pa + t * Gv, (size_t)Gv * sizeof(float));
    }
    /* every sequence's conv and norms, then all their heads in one pool job, then the gated norms */
    int64_t r0 = 0;
    for (int i = 0; i < n; i++) {
        G[i].s = ss[i];
        G[i].P = P + r0 * ld;
        G[i].L = Ls[i];
        G[i].o = o + r0 * VD;
        args[i] = &G[i].J;
        counts[i] = Gv;
        r0 += Ls[i];
    }
    gdn_seqs A = {.G = G, .il = il, .ld = ld};
    if (n == 1) gdn_seq_task(&A, 0, 0);
    else strata_pool_run(m->pool, gdn_seq_task, &A, n);
    /* a failed prep freed its own buffers (the rest are freed below); its message was written on the
     * thread that ran it, so it is written again here */
    for (int i = 0; i < n && !rc; i++)
        if (G[i].rc) rc = n == 1 ? G[i].rc : strata_fail(G[i].rc, "GDN layer %d: no memory for %lld tokens", il, (long long)Ls[i]);
    if (!rc) rc = mdl_pool_run_multi(m->pool, head_task, args, counts, n);
    for (int i = 0; i < n && !rc; i++)
        if (__atomic_load_n(&G[i].J.nomem, __ATOMIC_RELAXED))
            rc = strata_fail(STRATA_ERR_NOMEM, "GDN layer %d: no memory for the chunked form of an open chunk", il);
    for (int i = 0; i < n && !rc; i++) {   /* the gated norms (2 us at 8 sequences: no pool job) */
        gdn_post(&G[i], G[i].P, ld);
        gdn_keep_open(&G[i], &ss[i]->ls[il]);
    }
    if (!rc) rc = mdl_matmul(m, &l->ssm_out, 0, o, R, y);
    for (int i = 0; i < n; i++) gdn_seq_free(&G[i]);
done:
    free(buf);
    return rc;
}

strata_status mdl_gdn(strata_session *s, int il, const float *u, int64_t L, float *y) {
    return mdl_gdn_multi(&s, &L, 1, il, u, L, y);
}
