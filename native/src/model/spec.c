/*
 * spec.c — returning a session to an earlier token without running the model again.
 *
 * Two mechanisms (DESIGN §5; spec/qwen4exp-mtp.md §3.2):
 *
 *  - Verify windows. An eval with STRATA_EVAL_KEEP_STATES has the GDN layers and the PLE layer
 *    write their state after each token of the window into per-token slots (vLLM's scheme; the
 *    recurrence reads and writes the state anyway, so the copy is one more write of it). A
 *    rollback to token p of the window copies slot p back; the K/V and indexer rows need only
 *    n_past, and a QSA block summary that the window completed with rejected tokens is dropped
 *    (it is recomputed from the raw keys when its block completes again).
 *
 *  - Checkpoints for prefix reuse. A copy of the recurrent state (GDN S and conv windows, PLE
 *    conv history and n-gram ids) at n_past, with the ids it belongs to. The K/V rows are not
 *    copied: they stay valid in the session while no eval rewrites them, which the session
 *    tracks as n_valid (rows [0, n_valid) were computed from tokens[0, n_valid)).
 *
 * What the QSA layers keep per block is a function of the raw keys below it, so both mechanisms
 * only lower n_blk; the next eval's block loop recomputes the summaries up to its position.
 */
#include "model.h"

#include <stdlib.h>
#include <string.h>

#include "device/dense.h"
#include "util/error.h"

static size_t gdn_conv_floats(const mdl_hparams *h) {
    const size_t cd = 2 * (size_t)h->ssm_gk * (size_t)h->ssm_dk + (size_t)h->ssm_gv * (size_t)h->ssm_dk;
    return (size_t)(h->ssm_kc - 1) * cd;
}
static size_t gdn_S_floats(const mdl_hparams *h) {
    return (size_t)h->ssm_gv * (size_t)h->ssm_dk * (size_t)h->ssm_dk;
}
static size_t ple_conv_floats(const mdl_hparams *h) {
    return (size_t)(h->ple_kp - 1) * (size_t)h->ple_n * (size_t)h->hc * (size_t)h->n_embd;
}

/* every QSA layer (the MTP block's cache is the MTP's own business) keeps only the summaries of
 * blocks complete at n_past */
static void trim_blocks(strata_session *s, int64_t n_past) {
    const strata_model *m = s->m;
    for (int il = 0; il < m->hp.n_layer; il++) {
        const mdl_layer *l = &m->layers[il];
        mdl_layer_state *st = &s->ls[il];
        if (l->is_qsa && l->ratio > 0 && st->n_blk > n_past / l->ratio) st->n_blk = n_past / l->ratio;
    }
}

static void free_slots(strata_session *s) {
    for (int il = 0; s->ls && il < s->n_ls; il++) {
        mdl_st_free(s->dk, s->ls[il].S_slots);
        mdl_st_free(s->dk, s->ls[il].conv_slots);
        s->ls[il].S_slots = s->ls[il].conv_slots = NULL;
    }
    mdl_st_free(s->dk, s->ple_conv_slots);
    free(s->ple_ctx_slots);
    s->ple_conv_slots = NULL;
    s->ple_ctx_slots = NULL;
    s->spec_max = 0;
    s->spec_start = -1;
}

void mdl_spec_release(strata_session *s) { free_slots(s); }

strata_status strata_session_set_spec_max(strata_session *s, int32_t n_max) {
    if (!s) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_session_set_spec_max: null session");
    if (n_max < 0 || n_max > s->cap)
        return strata_fail(STRATA_ERR_INVALID_ARG, "set_spec_max: %d tokens per verify window (0..%lld, the step size)",
                           n_max, (long long)s->cap);
    if (n_max == s->spec_max) return STRATA_OK;
    free_slots(s);
    if (n_max == 0) return STRATA_OK;
    const strata_model *m = s->m;
    const mdl_hparams *h = &m->hp;
    uint64_t bytes = 0;
    for (int il = 0; il < h->n_layer; il++) {
        if (m->layers[il].is_qsa) continue;
        mdl_layer_state *st = &s->ls[il];
        st->S_slots = mdl_st_calloc(s->dk, (size_t)n_max * gdn_S_floats(h) * sizeof(float));
        st->conv_slots = mdl_st_calloc(s->dk, (size_t)n_max * gdn_conv_floats(h) * sizeof(float) + 1);
        bytes += (uint64_t)n_max * (gdn_S_floats(h) + gdn_conv_floats(h)) * sizeof(float);
        if (!st->S_slots || !st->conv_slots) goto nomem;
    }
    if (h->ple_layer >= 0) {
        s->ple_conv_slots =
            mdl_st_calloc(s->dk, (size_t)n_max * ple_conv_floats(h) * sizeof(float) + 1);
        s->ple_ctx_slots = malloc((size_t)n_max * MDL_MAX_NGRAM * sizeof(int32_t));
        bytes += (uint64_t)n_max * ple_conv_floats(h) * sizeof(float);
        if (!s->ple_conv_slots || !s->ple_ctx_slots) goto nomem;
    }
    s->spec_max = n_max;
    return STRATA_OK;
nomem:
    free_slots(s);
    return strata_fail(STRATA_ERR_NOMEM, "set_spec_max: no memory for %d state slots (%.1f MiB)", n_max,
                       (double)bytes / (1 << 20));
}

strata_status strata_session_rollback(strata_session *s, int64_t n_past) {
    if (!s) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_session_rollback: null session");
    if (n_past == s->n_past && s->spec_start < 0) return STRATA_OK;
    if (s->spec_start < 0 || n_past <= s->spec_start || n_past > s->spec_start + s->spec_n)
        return strata_fail(STRATA_ERR_INVALID_ARG,
                           "rollback to %lld tokens: only a position inside the last verify window can be returned to "
                           "(%lld..%lld); use a checkpoint or reset the session",
                           (long long)n_past, s->spec_start < 0 ? -1LL : (long long)s->spec_start + 1,
                           s->spec_start < 0 ? -1LL : (long long)(s->spec_start + s->spec_n));
    const strata_model *m = s->m;
    const mdl_hparams *h = &m->hp;
    const int64_t t = n_past - s->spec_start - 1;      /* the slot of the last kept token */
    strata_status rc = STRATA_OK;
    for (int il = 0; il < h->n_layer && !rc; il++) {
        if (m->layers[il].is_qsa) continue;
        mdl_layer_state *st = &s->ls[il];
        const mdl_dk *dk = s->dk;
        rc = mdl_st_copy(dk, st->S, st->S_slots + (size_t)t * gdn_S_floats(h), gdn_S_floats(h) * sizeof(float), DK_D2D);
        if (!rc)
            rc = mdl_st_copy(dk, st->conv, st->conv_slots + (size_t)t * gdn_conv_floats(h),
                             gdn_conv_floats(h) * sizeof(float), DK_D2D);
    }
    if (!rc && h->ple_layer >= 0)
        rc = mdl_st_copy(s->dk, s->ple_conv, s->ple_conv_slots + (size_t)t * ple_conv_floats(h),
                         ple_conv_floats(h) * sizeof(float), DK_D2D);
    if (rc) return rc;
    if (h->ple_layer >= 0)   /* the ids stay on the host (the gather worker hashes them there) */
        memcpy(s->ple_ctx, s->ple_ctx_slots + (size_t)t * MDL_MAX_NGRAM, MDL_MAX_NGRAM * sizeof(int32_t));
    trim_blocks(s, n_past);
    s->n_past = n_past;
    return STRATA_OK;
}

/* ---------------------------------------------------------------- checkpoints */

struct strata_checkpoint {
    const strata_model *m;
    int64_t n_past;
    int32_t *tokens;          /* [n_past] */
    float *gdn;               /* per GDN layer: S, then conv */
    float *ple_conv;
    int32_t ple_ctx[MDL_MAX_NGRAM];
    uint64_t bytes;
};

strata_status strata_session_checkpoint(strata_session *s, strata_checkpoint **out) {
    if (!s || !out) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_session_checkpoint: null argument");
    if (mdl_gdn_open_rows(s))
        return strata_fail(STRATA_ERR_INVALID_ARG, "checkpoint: the last eval (STRATA_EVAL_CONTINUED) left a GDN chunk "
                           "open at %lld tokens; finish the evaluation (an eval without the flag) first",
                           (long long)s->n_past);
    const strata_model *m = s->m;
    const mdl_hparams *h = &m->hp;
    size_t n_gdn = 0;
    for (int il = 0; il < h->n_layer; il++) n_gdn += !m->layers[il].is_qsa;
    const size_t per = gdn_S_floats(h) + gdn_conv_floats(h);
    strata_checkpoint *c = calloc(1, sizeof *c);
    if (!c) return strata_fail(STRATA_ERR_NOMEM, "checkpoint: no memory");
    c->m = m;
    c->n_past = s->n_past;
    c->tokens = malloc((size_t)s->n_past * sizeof(int32_t) + 1);
    c->gdn = malloc(n_gdn * per * sizeof(float) + 1);
    if (h->ple_layer >= 0) c->ple_conv = malloc(ple_conv_floats(h) * sizeof(float) + 1);
    if (!c->tokens || !c->gdn || (h->ple_layer >= 0 && !c->ple_conv)) {
        strata_checkpoint_free(c);
        return strata_fail(STRATA_ERR_NOMEM, "checkpoint: no memory for %.1f MiB of state",
                           (double)(n_gdn * per * sizeof(float)) / (1 << 20));
    }
    memcpy(c->tokens, s->tokens, (size_t)s->n_past * sizeof(int32_t));
    float *p = c->gdn;
    strata_status rc = STRATA_OK;
    for (int il = 0; il < h->n_layer && !rc; il++) {
        if (m->layers[il].is_qsa) continue;
        const mdl_dk *dk = s->dk;
        rc = mdl_st_copy(dk, p, s->ls[il].S, gdn_S_floats(h) * sizeof(float), DK_D2H);
        if (!rc) rc = mdl_st_copy(dk, p + gdn_S_floats(h), s->ls[il].conv, gdn_conv_floats(h) * sizeof(float), DK_D2H);
        p += per;
    }
    if (!rc && h->ple_layer >= 0)
        rc = mdl_st_copy(s->dk, c->ple_conv, s->ple_conv, ple_conv_floats(h) * sizeof(float),
                         DK_D2H);
    if (rc) {
        strata_checkpoint_free(c);
        return rc;
    }
    if (h->ple_layer >= 0) memcpy(c->ple_ctx, s->ple_ctx, sizeof c->ple_ctx);
    c->bytes = sizeof *c + (uint64_t)s->n_past * sizeof(int32_t) + (uint64_t)(n_gdn * per) * sizeof(float) +
               (h->ple_layer >= 0 ? (uint64_t)ple_conv_floats(h) * sizeof(float) : 0);
    *out = c;
    return STRATA_OK;
}

strata_status strata_session_restore(strata_session *s, const strata_checkpoint *c) {
    if (!s || !c) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_session_restore: null argument");
    const strata_model *m = s->m;
    const mdl_hparams *h = &m->hp;
    if (c->m != m) return strata_fail(STRATA_ERR_INVALID_ARG, "restore: the checkpoint belongs to another model");
    if (c->n_past > s->n_valid || memcmp(c->tokens, s->tokens, (size_t)c->n_past * sizeof(int32_t)))
        return strata_fail(STRATA_ERR_INVALID_ARG,
                           "restore: the session no longer holds the checkpoint's %lld tokens (it was rewritten "
                           "since); drop the checkpoint", (long long)c->n_past);
    const size_t per = gdn_S_floats(h) + gdn_conv_floats(h);
    const float *p = c->gdn;
    strata_status rc = STRATA_OK;
    for (int il = 0; il < h->n_layer && !rc; il++) {
        if (m->layers[il].is_qsa) continue;
        const mdl_dk *dk = s->dk;
        rc = mdl_st_copy(dk, s->ls[il].S, p, gdn_S_floats(h) * sizeof(float), DK_H2D);
        if (!rc) rc = mdl_st_copy(dk, s->ls[il].conv, p + gdn_S_floats(h), gdn_conv_floats(h) * sizeof(float), DK_H2D);
        p += per;
    }
    if (!rc && h->ple_layer >= 0)
        rc = mdl_st_copy(s->dk, s->ple_conv, c->ple_conv, ple_conv_floats(h) * sizeof(float),
                         DK_H2D);
    if (rc) return rc;
    if (h->ple_layer >= 0) memcpy(s->ple_ctx, c->ple_ctx, sizeof c->ple_ctx);
    trim_blocks(s, c->n_past);
    for (int il = 0; il < s->n_ls; il++) s->ls[il].n_open = 0;
    s->gdn_continues = 0;
    s->n_past = c->n_past;
    s->spec_start = -1;
    return STRATA_OK;
}

int64_t strata_checkpoint_n_past(const strata_checkpoint *c) { return c ? c->n_past : 0; }
uint64_t strata_checkpoint_bytes(const strata_checkpoint *c) { return c ? c->bytes : 0; }

void strata_checkpoint_free(strata_checkpoint *c) {
    if (!c) return;
    free(c->tokens);
    free(c->gdn);
    free(c->ple_conv);
    free(c);
}

int64_t strata_session_n_valid(const strata_session *s) { return s ? s->n_valid : 0; }
