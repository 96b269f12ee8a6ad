/*
 * ple.c — the per-layer hashed n-gram embedding (spec §6), applied to the residual streams at
 * the start of its layer.
 *
 * Ids: the history is the session's last n-1 ids (eos0 at sequence start) followed by the new
 * ids. For shift s ≥ 1 a token reads its s-th predecessor unless an eos0 lies at or after it
 * (walking back from the token), in which case it reads eos0. Order m (2..n) hashes
 * XOR_{s<m} shifted_s · mult_s (uint64; products stay below 2^63), head h of order m takes
 * row (hash mod size_h) + offset_h of the table, which is read in place from the mapping.
 * Then: key = G(W_key emb), val = W_val emb, qry = G(X), per stream s = key·qry / sqrt(E),
 * g = sign(s) sqrt(max(|s|, 1e-6)), gv = σ(g) val; gvn = G(gv); conv = silu(dilated causal
 * depthwise conv of gvn, Kp taps n apart, history from the session); X += gv + conv.
 */
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

strata_status mdl_ple(strata_session *s, int il, const int32_t *ids, int64_t L) {
    const strata_model *m = s->m;
    const mdl_hparams *hp = &m->hp;
    const mdl_layer *l = &m->layers[il];
    const int64_t E = hp->n_embd, hc = hp->hc, W = hc * E, n = hp->ple_n, Kp = hp->ple_kp;
    const int64_t NH = (n - 1) * hp->ple_heads_per, dP = hp->ple_row_dim, hist = (Kp - 1) * n;
    const uint64_t eos0 = (uint64_t)hp->ple_eos;
    float *emb = malloc((size_t)(L * E) * sizeof(float));
    float *key = malloc((size_t)(L * W) * sizeof(float));
    float *val = malloc((size_t)(L * E) * sizeof(float));
    float *gv = malloc((size_t)(L * W) * sizeof(float));
    float *ext = malloc((size_t)((hist + L) * W) * sizeof(float));
    float *qry = malloc((size_t)W * sizeof(float));
    int32_t *h = malloc((size_t)(n - 1 + L) * sizeof(int32_t));
    strata_status rc = STRATA_OK;
    if (!emb || !key || !val || !gv || !ext || !qry || !h) {
        rc = strata_fail(STRATA_ERR_NOMEM, "PLE layer %d: no memory for %lld tokens", il, (long long)L);
        goto done;
    }
    memcpy(h, s->ple_ctx, (size_t)(n - 1) * sizeof(int32_t));
    memcpy(h + n - 1, ids, (size_t)L * sizeof(int32_t));
    for (int64_t t = 0; t < L; t++) {
        const int64_t p = n - 1 + t;
        uint64_t sh[MDL_MAX_NGRAM];
        sh[0] = (uint64_t)h[p];
        int cut = 0;
        for (int64_t k = 1; k < n; k++) {
            const uint64_t tok = (uint64_t)h[p - k];
            sh[k] = cut ? eos0 : tok;
            if (tok == eos0) cut = 1;
        }
        uint64_t mix = sh[0] * hp->ple_mult[0];
        for (int64_t order = 2; order <= n; order++) {
            mix ^= sh[order - 1] * hp->ple_mult[order - 1];
            for (int64_t g = 0; g < hp->ple_heads_per; g++) {
                const int64_t head = (order - 2) * hp->ple_heads_per + g;
                const uint64_t row = mix % hp->ple_size[head] + hp->ple_off[head];
                m->ple_table_t->dequant[0](m->ple_table + row * m->ple_table_row, emb + t * E + head * dP, dP);
            }
        }
    }
    (void)NH;
    memcpy(s->ple_ctx, h + L, (size_t)(n - 1) * sizeof(int32_t));
    if ((rc = mdl_matmul(m, &l->ple_key, 0, emb, L, key))) goto done;
    if ((rc = mdl_matmul(m, &l->ple_value, 0, emb, L, val))) goto done;
    const float inv_sqrt_e = 1.0f / sqrtf((float)E);
    float *gvn = ext + hist * W;
    memcpy(ext, s->ple_conv, (size_t)(hist * W) * sizeof(float));
    for (int64_t t = 0; t < L; t++) {
        float *kt = key + t * W, *gt = gv + t * W;
        mdl_group_rmsnorm(kt, l->ple_norm_key, hc, E, hp->eps, kt);
        mdl_group_rmsnorm(s->X + t * W, l->ple_norm_query, hc, E, hp->eps, qry);
        for (int64_t j = 0; j < hc; j++) {
            float d = 0.0f;
            for (int64_t e = 0; e < E; e++) d += kt[j * E + e] * qry[j * E + e];
            const float sc = d * inv_sqrt_e;
            const float g = sc > 0.0f ? sqrtf(fmaxf(sc, 1e-6f)) : sc < 0.0f ? -sqrtf(fmaxf(-sc, 1e-6f)) : 0.0f;
            const float sg = mdl_sigmoid(g);
            for (int64_t e = 0; e < E; e++) gt[j * E + e] = sg * val[t * E + e];
        }
        mdl_group_rmsnorm(gt, l->ple_norm_conv, hc, E, hp->eps, gvn + t * W);
    }
    for (int64_t t = 0; t < L; t++) {
        float *xt = s->X + t * W;
        const float *gt = gv + t * W;
        for (int64_t c = 0; c < W; c++) {
            const float *w = l->ple_conv + c * Kp;
            float acc = 0.0f;
            for (int64_t k = 0; k < Kp; k++) acc += w[k] * ext[(hist + t - (Kp - 1 - k) * n) * W + c];
            xt[c] += gt[c] + mdl_silu(acc);
        }
    }
    memcpy(s->ple_conv, ext + L * W, (size_t)(hist * W) * sizeof(float));
done:
    free(emb); free(key); free(val); free(gv); free(ext); free(qry); free(h);
    return rc;
}
