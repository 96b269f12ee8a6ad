/*
 * state.c — one sequence's state (see model.h) and the session's scratch.
 *
 * The per-token caches (QSA K/V and their int8 scales, raw indexer keys, block summaries, the ids)
 * grow with use: a session starts with room for STATE_CHUNK tokens and every eval first reserves the
 * rows it will write (mdl_session_reserve: capacity doubled, in whole chunks, at most n_ctx), so many
 * short sequences fit where one n_ctx-long one would. Rows move only at a reserve, before a step runs;
 * a failed reserve leaves the state as it was. strata_session_state_bytes reports what a session holds.
 */
#include "model.h"

#include <stdlib.h>
#include <string.h>

#include "device/dense.h"
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

enum { STATE_CHUNK = 256 };   /* tokens of cache a session grows by, at least */

/* Summary rows a layer of ratio r needs for n tokens. */
static size_t blk_rows(int32_t r, int64_t n) { return r > 0 ? (size_t)(n / r + 1) : 1; }

void *mdl_st_calloc(const mdl_dk *dk, size_t bytes) {
    if (!dk) return calloc(1, bytes ? bytes : 1);
    void *p = dk->alloc(bytes);
    if (p && dk->zero(p, bytes, NULL)) {
        dk->free(p);
        return NULL;
    }
    return p;
}

void mdl_st_free(const mdl_dk *dk, void *p) {
    if (dk) dk->free(p);
    else free(p);
}

strata_status mdl_st_copy(const mdl_dk *dk, void *dst, const void *src, size_t bytes, int kind) {
    if (!dk) {
        if (bytes) memcpy(dst, src, bytes);
        return STRATA_OK;
    }
    strata_status rc = dk->copy(dst, src, bytes, kind, NULL);
    /* a copy from host memory the caller may reuse at once: wait until it was read */
    if (!rc && kind == DK_H2D) rc = dk->sync(NULL);
    return rc;
}

/* To n bytes (n > 0), zeroing from `keep` bytes on: 0 on failure, *p untouched. */
static int grow(const mdl_dk *dk, void **p, size_t keep, size_t n) {
    if (!dk) {
        void *q = realloc(*p, n);
        if (!q) return 0;
        if (n > keep) memset((char *)q + keep, 0, n - keep);
        *p = q;
        return 1;
    }
    void *q = mdl_st_calloc(dk, n);
    if (!q) return 0;
    if (*p && mdl_st_copy(dk, q, *p, keep < n ? keep : n, DK_D2D)) {
        dk->free(q);
        return 0;
    }
    dk->free(*p);
    *p = q;
    return 1;
}

strata_status mdl_session_reserve(strata_session *s, int64_t n_tokens) {
    if (n_tokens <= s->cap_tokens) return STRATA_OK;
    const strata_model *m = s->m;
    const mdl_hparams *h = &m->hp;
    int64_t cap = s->cap_tokens * 2;
    if (cap < n_tokens) cap = n_tokens;
    cap = (cap + STATE_CHUNK - 1) / STATE_CHUNK * STATE_CHUNK;
    if (cap > s->n_ctx) cap = s->n_ctx;
    const int64_t old = s->cap_tokens;
    const size_t es = kv_elem(m->params.kv_type), per = (size_t)h->n_head_kv * (size_t)h->head_dim;
    /* each array grows on its own: a failure midway leaves the grown ones larger, which is harmless
     * (capacity is the minimum over them, kept in cap_tokens only once all succeeded) */
    if (!grow(NULL, (void **)&s->tokens, (size_t)old * sizeof(int32_t), (size_t)cap * sizeof(int32_t))) goto nomem;
    for (int il = 0; il < s->n_ls; il++) {
        const mdl_layer *l = &m->layers[il];
        mdl_layer_state *st = &s->ls[il];
        const mdl_dk *dk = s->dk;
        if (!l->is_qsa) continue;
        if (!grow(dk, &st->k, (size_t)old * per * es, (size_t)cap * per * es)) goto nomem;
        if (!grow(dk, &st->v, (size_t)old * per * es, (size_t)cap * per * es)) goto nomem;
        if (m->params.kv_type == STRATA_KV_INT8) {
            const size_t row = (size_t)h->n_head_kv * 2 * sizeof(float);
            if (!grow(dk, (void **)&st->kv_scale, (size_t)old * row, (size_t)cap * row)) goto nomem;
        }
        const size_t ik = (size_t)h->idx_dim * sizeof(float);
        if (!grow(dk, (void **)&st->idx_k, (size_t)old * ik, (size_t)cap * ik)) goto nomem;
        if (!grow(dk, (void **)&st->blk, blk_rows(l->ratio, old) * ik, blk_rows(l->ratio, cap) * ik)) goto nomem;
    }
    s->cap_tokens = cap;
    return STRATA_OK;
nomem:
    return strata_fail(STRATA_ERR_NOMEM, "session: no memory to grow its caches to %lld tokens (%.1f MiB)",
                       (long long)cap, (double)mdl_state_bytes(m, cap) / (1 << 20));
}

uint64_t strata_session_state_bytes(const strata_session *s) {
    if (!s) return 0;
    uint64_t open = 0;   /* the open-chunk rows of the layers that have held one */
    for (int il = 0; il < s->n_ls; il++)
        if (s->ls[il].open) open += (uint64_t)gdn_open_floats(&s->m->hp) * sizeof(float);
    return mdl_state_bytes(s->m, s->cap_tokens) + open;
}

int64_t mdl_gdn_open_rows(const strata_session *s) {
    for (int il = 0; il < s->n_ls; il++)
        if (s->ls[il].n_open) return s->ls[il].n_open;
    return 0;
}

strata_status mdl_session_alloc(strata_model *m, strata_session *s) {
    const mdl_hparams *h = &m->hp;
    s->m = m;
    s->n_ctx = m->params.n_ctx;
    s->spec_start = -1;
    s->dk = m->dk;
    s->ls = calloc((size_t)(h->n_layer + h->n_mtp), sizeof *s->ls);
    if (!s->ls) goto nomem;
    s->n_ls = h->n_layer + h->n_mtp;
    for (int il = 0; il < h->n_layer + h->n_mtp; il++) {
        const mdl_layer *l = &m->layers[il];
        mdl_layer_state *st = &s->ls[il];
        if (!l->is_qsa) {
            const size_t cd = 2 * (size_t)h->ssm_gk * (size_t)h->ssm_dk + (size_t)h->ssm_gv * (size_t)h->ssm_dk;
            const mdl_dk *dk = s->dk;
            st->conv = mdl_st_calloc(dk, ((size_t)(h->ssm_kc - 1) * cd + 1) * sizeof(float));
            st->S = mdl_st_calloc(dk, (size_t)h->ssm_gv * (size_t)h->ssm_dk * (size_t)h->ssm_dk * sizeof(float));
            if (!st->conv || !st->S) goto nomem;
        }
    }
    if (h->ple_layer >= 0) {   /* the PLE conv history: the device's memory when the layer runs there */
        const size_t hist = (size_t)(h->ple_kp - 1) * (size_t)h->ple_n * (size_t)h->hc * (size_t)h->n_embd;
        s->ple_conv = mdl_st_calloc(s->dk, (hist + 1) * sizeof(float));
        if (!s->ple_conv) goto nomem;
    }
    s->cap = m->params.n_ubatch;
    const size_t E = (size_t)h->n_embd, W = (size_t)h->hc * E;
    s->X = malloc((size_t)s->cap * W * sizeof(float));
    s->u = malloc((size_t)s->cap * E * sizeof(float));
    s->y = malloc((size_t)s->cap * E * sizeof(float));
    s->c = malloc((size_t)s->cap * (size_t)h->hc * sizeof(float));
    if (!s->X || !s->u || !s->y || !s->c) goto nomem;
    if (mdl_session_reserve(s, STATE_CHUNK < s->n_ctx ? STATE_CHUNK : s->n_ctx)) goto nomem;
    mdl_session_clear(s);
    return STRATA_OK;
nomem:
    mdl_session_release(s);
    return strata_fail(STRATA_ERR_NOMEM, "session: no memory for its state (%.1f MiB at %d tokens); lower n_ctx",
                       (double)mdl_state_bytes(m, STATE_CHUNK) / (1 << 20), (int)STATE_CHUNK);
}

void mdl_session_release(strata_session *s) {
    mdl_spec_release(s);
    mdl_dense_session_free(s);
    free(s->tokens);
    s->tokens = NULL;
    for (int il = 0; s->ls && il < s->n_ls; il++) {
        mdl_layer_state *st = &s->ls[il];
        const mdl_dk *dk = s->dk;
        mdl_st_free(dk, st->conv); mdl_st_free(dk, st->S); mdl_st_free(dk, st->k); mdl_st_free(dk, st->v);
        mdl_st_free(dk, st->kv_scale); mdl_st_free(dk, st->idx_k); mdl_st_free(dk, st->blk);
        free(st->open);
        memset(st, 0, sizeof *st);
    }
    free(s->ls);
    s->ls = NULL;
    s->n_ls = 0;
    mdl_st_free(s->dk, s->ple_conv);   /* release reads no model: s->dk */
    free(s->X); free(s->u); free(s->y); free(s->c);
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
        st->n_open = 0;
        if (m->layers[il].is_qsa) {
            st->n_blk = 0;
        } else {
            const size_t cd = 2 * (size_t)h->ssm_gk * (size_t)h->ssm_dk + (size_t)h->ssm_gv * (size_t)h->ssm_dk;
            const size_t conv_b = (size_t)(h->ssm_kc - 1) * cd * sizeof(float);
            const size_t S_b = (size_t)h->ssm_gv * (size_t)h->ssm_dk * (size_t)h->ssm_dk * sizeof(float);
            const mdl_dk *dk = s->dk;
            if (dk) {   /* a failure here is the device's: the next eval's first kernel reports it */
                (void)dk->zero(st->conv, conv_b, NULL);
                (void)dk->zero(st->S, S_b, NULL);
            } else {
                memset(st->conv, 0, conv_b);
                memset(st->S, 0, S_b);
            }
        }
    }
    if (h->ple_layer >= 0) {
        const size_t ple_b = (size_t)(h->ple_kp - 1) * (size_t)h->ple_n * (size_t)h->hc * (size_t)h->n_embd *
                             sizeof(float);
        const mdl_dk *dk = s->dk;
        if (dk) (void)dk->zero(s->ple_conv, ple_b, NULL);   /* as the GDN's: a failure shows at the next eval */
        else memset(s->ple_conv, 0, ple_b);
        for (int i = 0; i < h->ple_n - 1; i++) s->ple_ctx[i] = (int32_t)h->ple_eos;
    }
    s->n_past = 0;
    s->spec_start = -1;
    s->gdn_continues = 0;
}
