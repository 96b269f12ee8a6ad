/*
 * moe.c — the sparse MoE block of every layer (spec §9).
 *
 * Router: p = softmax over all experts (fp32), the top-k by p (ties: lower expert id), weights
 * renormalised over the k. Tokens are grouped by expert, so one pass over an expert's weights
 * serves every token that picked it: [g ; up] = W_gate|up x, h = silu(g) ⊙ up, out = W_down h.
 * y = Σ_k w_k out_k + σ(w_seg · x) · shared(x).
 */
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

strata_status mdl_moe(strata_session *s, int il, const float *u, int64_t L, float *y) {
    const strata_model *m = s->m;
    const mdl_hparams *hp = &m->hp;
    const mdl_layer *l = &m->layers[il];
    const int64_t E = hp->n_embd, Ne = hp->n_expert, K = hp->n_expert_used, Fe = hp->ff_exp, Fs = hp->ff_shexp;
    const int64_t F = Fe > Fs ? Fe : Fs;
    float *logits = malloc((size_t)(L * Ne) * sizeof(float));
    int32_t *pick = malloc((size_t)(L * K) * sizeof(int32_t));
    float *pw = malloc((size_t)(L * K) * sizeof(float));
    int64_t *count = calloc((size_t)Ne + 1, sizeof(int64_t));
    int64_t *slot = malloc((size_t)(L * K) * sizeof(int64_t));   /* (token, k) pairs sorted by expert */
    float *xg = malloc((size_t)(L * E) * sizeof(float));
    float *gu = malloc((size_t)(L * 2 * F) * sizeof(float));
    float *hb = malloc((size_t)(L * F) * sizeof(float));
    float *out = malloc((size_t)(L * E) * sizeof(float));
    strata_status rc = STRATA_OK;
    if (!logits || !pick || !pw || !count || !slot || !xg || !gu || !hb || !out) {
        rc = strata_fail(STRATA_ERR_NOMEM, "MoE layer %d: no memory for %lld tokens", il, (long long)L);
        goto done;
    }
    if ((rc = mdl_matmul(m, &l->router, 0, u, L, logits))) goto done;
    for (int64_t t = 0; t < L; t++) {
        float *lg = logits + t * Ne;
        float mx = lg[0];
        for (int64_t e = 1; e < Ne; e++) if (lg[e] > mx) mx = lg[e];
        double sum = 0.0;
        for (int64_t e = 0; e < Ne; e++) { lg[e] = expf(lg[e] - mx); sum += lg[e]; }
        const float inv = (float)(1.0 / sum);
        for (int64_t e = 0; e < Ne; e++) lg[e] *= inv;
        /* top-k by insertion (k is small): higher p first, lower id on ties */
        int32_t *pk = pick + t * K;
        float *wk = pw + t * K;
        int64_t n = 0;
        for (int64_t e = 0; e < Ne; e++) {
            const float p = lg[e];
            if (n == K && !(p > wk[K - 1])) continue;
            int64_t i = n < K ? n++ : K - 1;
            while (i > 0 && p > wk[i - 1]) { wk[i] = wk[i - 1]; pk[i] = pk[i - 1]; i--; }
            wk[i] = p;
            pk[i] = (int32_t)e;
        }
        float ws = 0.0f;
        for (int64_t i = 0; i < K; i++) ws += wk[i];
        for (int64_t i = 0; i < K; i++) wk[i] /= ws;
    }
    /* group (token, k) pairs by expert: counting sort */
    for (int64_t i = 0; i < L * K; i++) count[pick[i] + 1]++;
    for (int64_t e = 0; e < Ne; e++) count[e + 1] += count[e];
    {
        int64_t *fill = malloc((size_t)Ne * sizeof(int64_t));
        if (!fill) { rc = strata_fail(STRATA_ERR_NOMEM, "MoE layer %d: no memory", il); goto done; }
        memcpy(fill, count, (size_t)Ne * sizeof(int64_t));
        for (int64_t i = 0; i < L * K; i++) slot[fill[pick[i]]++] = i;
        free(fill);
    }
    memset(y, 0, (size_t)(L * E) * sizeof(float));
    for (int64_t e = 0; e < Ne; e++) {
        const int64_t n = count[e + 1] - count[e];
        if (!n) continue;
        const int64_t *sl = slot + count[e];
        for (int64_t i = 0; i < n; i++) memcpy(xg + i * E, u + (sl[i] / K) * E, (size_t)E * sizeof(float));
        float *g = gu, *up;
        if (l->exp_fused) {
            if ((rc = mdl_matmul(m, &l->exp_gate, e, xg, n, gu))) goto done;
            for (int64_t i = 0; i < n; i++) {
                const float *gi = gu + i * 2 * Fe;
                for (int64_t f = 0; f < Fe; f++) hb[i * Fe + f] = mdl_silu(gi[f]) * gi[Fe + f];
            }
        } else {
            up = gu + n * Fe;
            if ((rc = mdl_matmul(m, &l->exp_gate, e, xg, n, g))) goto done;
            if ((rc = mdl_matmul(m, &l->exp_up, e, xg, n, up))) goto done;
            for (int64_t i = 0; i < n * Fe; i++) hb[i] = mdl_silu(g[i]) * up[i];
        }
        if ((rc = mdl_matmul(m, &l->exp_down, e, hb, n, out))) goto done;
        for (int64_t i = 0; i < n; i++) {
            const float w = pw[sl[i]];
            float *yt = y + (sl[i] / K) * E;
            const float *oi = out + i * E;
            for (int64_t d = 0; d < E; d++) yt[d] += w * oi[d];
        }
    }
    /* shared expert, gated by σ(w_seg · x) */
    {
        float *sg = gu, *su = gu + L * Fs;
        if ((rc = mdl_matmul(m, &l->sh_gate, 0, u, L, sg))) goto done;
        if ((rc = mdl_matmul(m, &l->sh_up, 0, u, L, su))) goto done;
        for (int64_t i = 0; i < L * Fs; i++) hb[i] = mdl_silu(sg[i]) * su[i];
        if ((rc = mdl_matmul(m, &l->sh_down, 0, hb, L, out))) goto done;
        for (int64_t t = 0; t < L; t++) {
            const float *ut = u + t * E;
            float d = 0.0f;
            for (int64_t i = 0; i < E; i++) d += l->sh_inp_gate[i] * ut[i];
            const float gate = mdl_sigmoid(d);
            float *yt = y + t * E;
            const float *ot = out + t * E;
            for (int64_t i = 0; i < E; i++) yt[i] += gate * ot[i];
        }
    }
done:
    free(logits); free(pick); free(pw); free(count); free(slot); free(xg); free(gu); free(hb); free(out);
    return rc;
}
