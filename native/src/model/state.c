/*
 * state.c — one sequence's state (see model.h) and the session's scratch.
 *
 * The per-token caches (QSA K/V, raw indexer keys, block summaries) are sized for n_ctx but
 * come from calloc: for large sizes that is a fresh anonymous mapping whose pages are only
 * backed once written, so a 32K-token session costs memory in proportion to what it holds.
 */
#include "model.h"

#include <stdlib.h>
#include <string.h>

#include "util/error.h"

static size_t kv_elem(int kv_type) { return kv_type == STRATA_KV_F32 ? 4 : kv_type == STRATA_KV_F16 ? 2 : 1; }

uint64_t mdl_state_bytes(const strata_model *m, int64_t n_ctx) {
    const mdl_hparams *h = &m->hp;
    uint64_t b = (uint64_t)n_ctx * sizeof(int32_t);   /* the ids */
    for (int il = 0; il < h->n_layer + h->n_mtp; il++) {
        const mdl_layer *l = &m->layers[il];
        if (l->is_qsa) {
            const uint64_t per = (uint64_t)h->n_head_kv * (uint64_t)h->head_dim;
            b += 2 * (uint64_t)n_ctx * per * kv_elem(m->params.kv_type);
            if (m->params.kv_type == STRATA_KV_INT8) b += (uint64_t)n_ctx * (uint64_t)h->n_head_kv * 2 * sizeof(float);
            b += (uint64_t)n_ctx * (uint64_t)h->idx_dim * sizeof(float);
            if (l->ratio > 0) b += (uint64_t)(n_ctx / l->ratio + 1) * (uint64_t)h->idx_dim * sizeof(float);
        } else {
            const uint64_t cd = 2 * (uint64_t)h->ssm_gk * (uint64_t)h->ssm_dk + (uint64_t)h->ssm_gv * (uint64_t)h->ssm_dk;
            b += (uint64_t)(h->ssm_kc - 1) * cd * sizeof(float);
            b += (uint64_t)h->ssm_gv * (uint64_t)h->ssm_dk * (uint64_t)h->ssm_dk * sizeof(float);
        }
    }
    if (h->ple_layer >= 0)
        b += (uint64_t)(h->ple_kp - 1) * (uint64_t)h->ple_n * (uint64_t)h->hc * (uint64_t)h->n_embd * sizeof(float);
    return b;
}

strata_status mdl_session_alloc(strata_model *m, strata_session *s) {
    const mdl_hparams *h = &m->hp;
    const int64_t n_ctx = m->params.n_ctx;
    s->m = m;
    s->n_ctx = n_ctx;
    s->spec_start = -1;
    s->tokens = malloc((size_t)n_ctx * sizeof(int32_t));
    s->ls = calloc((size_t)(h->n_layer + h->n_mtp), sizeof *s->ls);
    if (!s->tokens || !s->ls) goto nomem;
    s->n_ls = h->n_layer + h->n_mtp;
    for (int il = 0; il < h->n_layer + h->n_mtp; il++) {
        const mdl_layer *l = &m->layers[il];
        mdl_layer_state *st = &s->ls[il];
        if (l->is_qsa) {
            const size_t per = (size_t)h->n_head_kv * (size_t)h->head_dim;
            st->k = calloc((size_t)n_ctx * per, kv_elem(m->params.kv_type));
            st->v = calloc((size_t)n_ctx * per, kv_elem(m->params.kv_type));
            if (m->params.kv_type == STRATA_KV_INT8) {
                st->kv_scale = calloc((size_t)n_ctx * (size_t)h->n_head_kv * 2, sizeof(float));
                if (!st->kv_scale) goto nomem;
            }
            st->idx_k = calloc((size_t)n_ctx * (size_t)h->idx_dim, sizeof(float));
            st->blk = calloc((size_t)(l->ratio > 0 ? n_ctx / l->ratio + 1 : 1) * (size_t)h->idx_dim, sizeof(float));
            if (!st->k || !st->v || !st->idx_k || !st->blk) goto nomem;
        } else {
            const size_t cd = 2 * (size_t)h->ssm_gk * (size_t)h->ssm_dk + (size_t)h->ssm_gv * (size_t)h->ssm_dk;
            st->conv = calloc((size_t)(h->ssm_kc - 1) * cd + 1, sizeof(float));
            st->S = calloc((size_t)h->ssm_gv * (size_t)h->ssm_dk * (size_t)h->ssm_dk, sizeof(float));
            if (!st->conv || !st->S) goto nomem;
        }
    }
    if (h->ple_layer >= 0) {
        s->ple_conv = calloc((size_t)(h->ple_kp - 1) * (size_t)h->ple_n * (size_t)h->hc * (size_t)h->n_embd + 1, sizeof(float));
        if (!s->ple_conv) goto nomem;
    }
    s->cap = m->params.n_ubatch;
    const size_t E = (size_t)h->n_embd, W = (size_t)h->hc * E;
    s->X = malloc((size_t)s->cap * W * sizeof(float));
    s->u = malloc((size_t)s->cap * E * sizeof(float));
    s->y = malloc((size_t)s->cap * E * sizeof(float));
    s->c = malloc((size_t)s->cap * (size_t)h->hc * sizeof(float));
    if (!s->X || !s->u || !s->y || !s->c) goto nomem;
    mdl_session_clear(s);
    return STRATA_OK;
nomem:
    mdl_session_release(s);
    return strata_fail(STRATA_ERR_NOMEM, "session: no memory for the state of %lld tokens (%.1f MiB); lower n_ctx",
                       (long long)n_ctx, (double)mdl_state_bytes(m, n_ctx) / (1 << 20));
}

void mdl_session_release(strata_session *s) {
    mdl_spec_release(s);
    free(s->tokens);
    s->tokens = NULL;
    for (int il = 0; s->ls && il < s->n_ls; il++) {
        mdl_layer_state *st = &s->ls[il];
        free(st->conv); free(st->S); free(st->k); free(st->v); free(st->kv_scale); free(st->idx_k); free(st->blk);
        memset(st, 0, sizeof *st);
    }
    free(s->ls);
    s->ls = NULL;
    s->n_ls = 0;
    free(s->ple_conv); free(s->X); free(s->u); free(s->y); free(s->c);
    s->ple_conv = s->X = s->u = s->y = s->c = NULL;
}

/* Only what the next tokens read is cleared: GDN and PLE states, ids, counters. The K/V and
 * indexer rows past n_past are always written before they are read; they stay valid for a
 * checkpoint's restore (n_valid is kept). */
void mdl_session_clear(strata_session *s) {
    const strata_model *m = s->m;
    const mdl_hparams *h = &m->hp;
    for (int il = 0; il < h->n_layer + h->n_mtp; il++) {
        mdl_layer_state *st = &s->ls[il];
        if (m->layers[il].is_qsa) {
            st->n_blk = 0;
        } else {
            const size_t cd = 2 * (size_t)h->ssm_gk * (size_t)h->ssm_dk + (size_t)h->ssm_gv * (size_t)h->ssm_dk;
            memset(st->conv, 0, (size_t)(h->ssm_kc - 1) * cd * sizeof(float));
            memset(st->S, 0, (size_t)h->ssm_gv * (size_t)h->ssm_dk * (size_t)h->ssm_dk * sizeof(float));
        }
    }
    if (h->ple_layer >= 0) {
        memset(s->ple_conv, 0, (size_t)(h->ple_kp - 1) * (size_t)h->ple_n * (size_t)h->hc * (size_t)h->n_embd * sizeof(float));
        for (int i = 0; i < h->ple_n - 1; i++) s->ple_ctx[i] = (int32_t)h->ple_eos;
    }
    s->n_past = 0;
    s->spec_start = -1;
}
