/*
 * mtp.c — the MTP (multi-token prediction) head of qwen4exp: strata_session_mtp
 * (spec/qwen4exp-mtp.md §2.2, §5).
 *
 * Row i takes a hidden row h (hc*E: the trunk's pre-mixer streams, or the chain state of the
 * previous MTP step) and the next token t, at position p = pos0 + i:
 *
 *   û   = eh_proj[:, 0:E] · N(embed(t); enorm)           (the trunk's token_embd)
 *   ĥ   = N(h; hnorm)                                    ONE RMS over all hc*E values (not grouped:
 *                                                        upstream llama.cpp's grouped norm deviates
 *                                                        from vLLM/SGLang, spec §2.2 ⚠)
 *   r_s = eh_proj[:, E:2E] · ĥ_s + û                     per stream s
 *   r   = one trunk-shaped QSA + MoE layer over r (layers[n_layer]) at position p, with the MTP's
 *         own K/V and indexer cache s->ls[n_layer]
 *   chain = r;  logits = output · mixer(r)               (nextn.hc_head_*, no inject)
 *
 * eh_proj is stored as one {2E, E} tensor whose rows may be quantized blocks that cannot be split
 * at column E, so the fusion is one matmul over the concatenated input [N(e) | ĥ_s] per stream
 * ((L*hc) x 2E): exact, at the cost of repeating the E x E embedding product per stream.
 *
 * Cache: rows [pos0, pos0 + n) of the MTP cache are replaced; rows before pos0 are read as they
 * are (a draft-extend writes them conditioned on the trunk, chain steps on the previous step).
 * Work goes in steps of at most the session's cap rows, in buffers of this file's own: the
 * session's scratch (s->X, u, y, c) keeps what the trunk's last eval left there.
 *
 * Arguments are checked before anything is written; after a failure past that point (no memory)
 * the MTP cache's rows from pos0 on are undefined until a call rewrites them.
 */
#include "model.h"
#include "fwd_dev.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

/* One row's fusion input, hc rows of 2E: [N(e; enorm) | (N(h; hnorm))_s] for each stream s, the norm of
 * h taken once over all hc*E values. tmp: hc*E floats of scratch. Its own function for the CUDA
 * kernels' host check (tests/native/test_cuda_ops_ple.c); not in model.h. */
void mdl_mtp_norm_concat(const float *e, const float *h, const float *enorm, const float *hnorm, int64_t hc,
                         int64_t E, float eps, float *row, float *tmp) {
    mdl_rmsnorm(e, enorm, E, eps, row);
    mdl_rmsnorm(h, hnorm, hc * E, eps, tmp);
    for (int64_t j = 0; j < hc; j++) {
        float *rj = row + j * 2 * E;
        if (j) memcpy(rj, row, (size_t)E * sizeof(float));
        memcpy(rj + E, tmp + j * E, (size_t)E * sizeof(float));
    }
}

/* Rows [i0, i0 + L) of the call: fusion, the decoder block, then chain/logits of rows [row0, L). */
static strata_status mtp_step(strata_session *s, const float *hidden, const int32_t *ids, int64_t L, int64_t p0,
                              int64_t row0, float *logits, float *chain, float *X, float *in2, float *u, float *y,
                              float *c) {
    const strata_model *m = s->m;
    const mdl_hparams *hp = &m->hp;
    const int il = hp->n_layer;
    const mdl_layer *l = &m->layers[il];
    const int64_t E = hp->n_embd, hc = hp->hc, W = hc * E;
    strata_status rc;
    /* fusion input: per (row, stream) [N(e; enorm) | (N(h; hnorm))_s] */
    for (int64_t t = 0; t < L; t++) {
        m->tok_embd_t->dequant[0](m->tok_embd + (size_t)ids[t] * m->tok_embd_row, y, E);
        mdl_mtp_norm_concat(y, hidden + t * W, m->mtp_enorm, m->mtp_hnorm, hc, E, hp->eps, in2 + t * hc * 2 * E, X);
    }
    /* r_s = eh_proj · [ê | ĥ_s]: L*hc rows of E, which is X's [L x hc*E] layout */
    if ((rc = mdl_matmul(m, &m->mtp_eh_proj, 0, in2, L * hc, X))) return rc;
    /* the decoder block, as a trunk QSA layer in model.c's forward */
    if ((rc = mdl_hc_read(m, X, l->hc_norm[0], &l->hc_down[0], &l->hc_up[0], &l->hc_inject[0], L, u, c))) goto out;
    if ((rc = mdl_qsa_at(s, il, &s->ls[il], p0, u, L, y))) goto out;
    mdl_hc_write(m, X, c, y, L);
    if ((rc = mdl_hc_read(m, X, l->hc_norm[1], &l->hc_down[1], &l->hc_up[1], &l->hc_inject[1], L, u, c))) goto out;
    if ((rc = mdl_moe(s, il, u, L, y))) goto out;
    mdl_hc_write(m, X, c, y, L);
    if (row0 < L) {
        const int64_t nr = L - row0;
        if (chain) memcpy(chain, X + row0 * W, (size_t)(nr * W) * sizeof(float));
        if (logits) {
            /* the MTP's own mixer (no inject), then the trunk's LM head */
            if ((rc = mdl_hc_read(m, X + row0 * W, m->mtp_head_norm, &m->mtp_head_down, &m->mtp_head_up, NULL, nr, u, NULL))) goto out;
            rc = mdl_matmul(m, &m->output, 0, u, nr, logits);
        }
    }
out:
    return rc;
}

strata_status strata_session_mtp(strata_session *s, const float *hidden, const int32_t *ids, int64_t n,
                                 int64_t pos0, int32_t flags, float *logits, uint64_t logits_capacity,
                                 float *chain, uint64_t chain_capacity) {
    if (!s) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_session_mtp: null session");
    const strata_model *m = s->m;
    const mdl_hparams *hp = &m->hp;
    if (hp->n_mtp < 1)
        return strata_fail(STRATA_ERR_UNSUPPORTED, "MTP: this model file has no MTP block; convert the checkpoint "
                           "again with its MTP weights (strata convert without --no-mtp)");
    if (!hidden || !ids)
        return strata_fail(STRATA_ERR_INVALID_ARG, "strata_session_mtp: hidden and ids are required");
    if (n <= 0) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_session_mtp: n = %lld rows (at least 1)", (long long)n);
    if (pos0 < 0 || pos0 > s->n_ctx || n > s->n_ctx - pos0)
        return strata_fail(STRATA_ERR_INVALID_ARG, "MTP: rows at positions %lld..%lld are outside the context of %lld "
                           "tokens; load the model with a larger n_ctx", (long long)pos0, (long long)(pos0 + n - 1),
                           (long long)s->n_ctx);
    const int64_t V = hp->n_vocab, E = hp->n_embd, hc = hp->hc, W = hc * E;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return strata_fail(STRATA_ERR_INVALID_ARG, "MTP: token id %d at index %lld is outside the vocabulary (0..%lld)",
                               ids[i], (long long)i, (long long)(V - 1));
    const int all = (flags & STRATA_EVAL_ALL_LOGITS) != 0;
    const uint64_t rows_out = all ? (uint64_t)n : 1;
    if (logits && logits_capacity < rows_out * (uint64_t)V)
        return strata_fail(STRATA_ERR_BUFFER_TOO_SMALL, "MTP: the logits buffer holds %llu floats, %llu needed",
                           (unsigned long long)logits_capacity, (unsigned long long)(rows_out * (uint64_t)V));
    if (chain && chain_capacity < rows_out * (uint64_t)W)
        return strata_fail(STRATA_ERR_BUFFER_TOO_SMALL, "MTP: the chain buffer holds %llu floats, %llu needed",
                           (unsigned long long)chain_capacity, (unsigned long long)(rows_out * (uint64_t)W));
    const mdl_layer_state *st = &s->ls[hp->n_layer];
    if (!st->k || !st->v || !st->idx_k || !st->blk)    /* state.c allocates it with the session */
        return strata_fail(STRATA_ERR_INVALID_ARG, "MTP: the session has no MTP cache; create it after loading the model");
    strata_status rc = mdl_session_reserve(s, pos0 + n);   /* the MTP cache grows with the trunk's */
    if (rc) return rc;
    const int64_t cap = s->cap > 0 ? s->cap : 1;
    const int64_t C = n < cap ? n : cap;
    float *X = malloc((size_t)(C * W) * sizeof(float));
    float *in2 = malloc((size_t)(C * hc * 2 * E) * sizeof(float));
    float *u = malloc((size_t)(C * E) * sizeof(float));
    float *y = malloc((size_t)(C * E) * sizeof(float));
    float *c = malloc((size_t)(C * hc) * sizeof(float));
    if (!X || !in2 || !u || !y || !c) {
        rc = strata_fail(STRATA_ERR_NOMEM, "MTP: no memory for %lld rows", (long long)C);
        goto done;
    }
    for (int64_t i0 = 0; i0 < n && !rc; i0 += C) {
        const int64_t L = n - i0 < C ? n - i0 : C;
        int64_t row0 = L;            /* rows whose outputs are wanted: all, or the very last */
        float *lo = NULL, *co = NULL;
        if (all) {
            row0 = 0;
            lo = logits ? logits + i0 * V : NULL;
            co = chain ? chain + i0 * W : NULL;
        } else if (i0 + L == n) {
            row0 = L - 1;
            lo = logits;
            co = chain;
        }
        rc = s->dk ? mdl_mtp_step_dev(s, hidden + i0 * W, ids + i0, L, pos0 + i0, row0, lo, co, y, u)
                   : mtp_step(s, hidden + i0 * W, ids + i0, L, pos0 + i0, row0, lo, co, X, in2, u, y, c);
    }
done:
    free(X); free(in2); free(u); free(y); free(c);
    return rc;
}
