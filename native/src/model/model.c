/*
 * model.c — the exported model/session API and the forward pass that strings the blocks
 * together (spec §3-4):
 *
 *   X = [emb, emb, …] (hc copies)
 *   per layer: [PLE] → read → GDN | QSA → write → read → MoE → write
 *   u = final hyper-connection read (no inject) → logits = W_out u
 *
 * An eval of any length runs in steps of at most n_ubatch tokens; every step advances every
 * cache, so the result does not depend on how a sequence is cut into calls (up to rounding of
 * the GDN's chunked vs recurrent form).
 */
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "context.h"
#include "moe/expert_cache.h"
#include "moe/offload.h"
#include "ple/ple.h"
#include "util/error.h"
#include "util/trace.h"
#include "kernels/cpu/matmul.h"

/* The widest conversion scratch one thread needs (matmul.c's conversion path), into m->repack_bytes. */
static void widest_conv(mdl_mat *w, void *arg) {
    strata_model *m = arg;
    if (!w->t) return;
    const uint64_t b = strata_matmul_conv_bytes(w->t, m->isa, w->cols);
    if (b > m->repack_bytes) m->repack_bytes = b;
}

strata_model_params strata_model_default_params(void) {
    strata_model_params p;
    memset(&p, 0, sizeof p);
    p.n_threads = 0;
    p.n_ctx = 32768;
    p.kv_type = STRATA_KV_F16;
    p.n_ubatch = 512;
    p.device = STRATA_DEVICE_CPU;
    p.cache_bytes = 0;
    p.pcie_frac = -1.0f;
    p.sim_link_gbps = 16.0f;
    p.tail_skip = -1;
    p.n_staging = 4;
    p.adjust_interval = 32;
    p.prefill_stream_min = 1024;
    p.max_swaps = ec_default_params().max_swaps;   /* 96, DESIGN §4: the cache owns it */
    p.expert_pack = NULL;
    /* the PLE defaults have one owner, the table layer (ple/ple.h) */
    const ple_params pp = ple_default_params();
    p.ple_madv_random = pp.madv_random;
    p.ple_prefetch = pp.prefetch;
    p.ple_step_timeout_s = pp.step_timeout_s;
    p.ple_test_stall_ms = pp.test_stall_ms;
    p.ple_test_stall_at = pp.test_stall_at;
    p.expert_io = STRATA_EXPERT_IO_AUTO;
    p.expert_io_depth = 64;
    p.expert_prefetch = 2;
    p.split = STRATA_SPLIT_ONLINE;
    p.ple_cache_bytes = pp.cache_bytes;
    p.dense = STRATA_DENSE_AUTO;
    p.vram_bytes = 0;
    return p;
}

strata_status mdl_model_open(strata_gguf *g, const strata_model_params *params, strata_model **out) {
    strata_model_params p = params ? *params : strata_model_default_params();
    if (p.n_ctx <= 0) p.n_ctx = 32768;
    if (p.n_ubatch <= 0) p.n_ubatch = 512;
    if (p.kv_type < STRATA_KV_F32 || p.kv_type > STRATA_KV_INT8) {
        strata_gguf_close(g);
        return strata_fail(STRATA_ERR_INVALID_ARG, "model: kv_type %d (use 0 f32, 1 f16, 2 int8)", p.kv_type);
    }
    if (p.n_ctx > (int64_t)1 << 30) {
        strata_gguf_close(g);
        return strata_fail(STRATA_ERR_INVALID_ARG, "model: n_ctx %lld is too large", (long long)p.n_ctx);
    }
    strata_model *m = calloc(1, sizeof *m);
    if (!m) {
        strata_gguf_close(g);
        return strata_fail(STRATA_ERR_NOMEM, "model: no memory");
    }
    m->params = p;
    m->gguf = g;
    strata_status rc;
    if ((rc = mdl_model_load(m))) goto fail;
    strata_context_params cp = strata_context_default_params();
    cp.n_threads = p.n_threads;
    if ((rc = strata_context_init(&cp, &m->ctx))) goto fail;
    m->pool = strata_context_pool(m->ctx);
    m->params.n_threads = strata_context_n_threads(m->ctx);
    m->isa = (int)strata_isa_best() - 1; /* STRATA_ISA_IDX_* */
    mdl_for_each_mat(m, widest_conv, m);
    m->repack_bytes *= (uint64_t)m->params.n_threads;
    pthread_mutex_init(&m->trace_mu, NULL);
    if ((rc = mdl_store_open(m))) goto fail;
    if ((rc = mdl_dense_open(m))) goto fail;
    if ((rc = mdl_offload_open(m))) goto fail;
    *out = m;
    return STRATA_OK;
fail:
    strata_model_free(m);
    return rc;
}

strata_status strata_model_load(const char *path, const strata_model_params *params, strata_model **out) {
    if (!path || !out) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_model_load: path and out are required");
    strata_gguf *g;
    strata_status rc = strata_gguf_open(path, &g);
    if (rc) return rc;
    return mdl_model_open(g, params, out);
}

void strata_model_free(strata_model *m) {
    if (!m) return;
    mdl_offload_close(m);
    mdl_dense_close(m);
    mdl_store_close(m);
    if (m->trace) fclose(m->trace);
    mdl_model_release(m);
    strata_context_free(m->ctx);
    strata_gguf_close(m->gguf);
    free(m);
}

strata_status strata_model_get_info(const strata_model *m, strata_model_info *out) {
    if (!m || !out) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_model_get_info: null argument");
    memset(out, 0, sizeof *out);
    out->n_vocab = m->hp.n_vocab;
    out->n_embd = m->hp.n_embd;
    out->n_layer = m->hp.n_layer;
    out->n_threads = m->params.n_threads;
    out->n_ctx = m->params.n_ctx;
    out->n_ctx_train = m->hp.n_ctx_train;
    out->kv_type = m->params.kv_type;
    out->n_expert = m->hp.n_expert;
    out->n_expert_used = m->hp.n_expert_used;
    out->ple_layer = m->hp.ple_layer;
    out->weight_bytes = m->weight_bytes;
    out->state_bytes = mdl_state_bytes(m, m->params.n_ctx);
    out->n_mtp = m->hp.n_mtp;
    out->n_hidden = (int32_t)(m->hp.hc * m->hp.n_embd);
    out->repack_bytes = m->repack_bytes;
    out->state_fixed_bytes = mdl_state_bytes(m, 0);
    out->state_token_bytes = (mdl_state_bytes(m, m->params.n_ctx) - out->state_fixed_bytes + (uint64_t)m->params.n_ctx - 1) /
                             (uint64_t)m->params.n_ctx;
    return STRATA_OK;
}

strata_status strata_model_trace_routing(strata_model *m, const char *path) {
    if (!m) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_model_trace_routing: null model");
    FILE *f = NULL;
    if (path && !(f = fopen(path, "w")))
        return strata_fail(STRATA_ERR_IO, "routing trace %s: cannot open for writing", path);
    pthread_mutex_lock(&m->trace_mu);
    if (m->trace) fclose(m->trace);
    m->trace = f;
    m->trace_window = 0;
    pthread_mutex_unlock(&m->trace_mu);
    return STRATA_OK;
}

const strata_gguf *strata_model_gguf(const strata_model *m) { return m ? m->gguf : NULL; }
const char *strata_model_device_log(const strata_model *m) { return m ? m->device_log : ""; }

strata_status strata_session_init(strata_model *m, strata_session **out) {
    if (!m || !out) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_session_init: null argument");
    strata_session *s = calloc(1, sizeof *s);
    if (!s) return strata_fail(STRATA_ERR_NOMEM, "strata_session_init: no memory");
    strata_status rc = mdl_session_alloc(m, s);
    if (rc) { free(s); return rc; }
    *out = s;
    return STRATA_OK;
}

void strata_session_free(strata_session *s) {
    if (!s) return;
    mdl_session_release(s);
    free(s);
}

void strata_session_reset(strata_session *s) {
    if (s) mdl_session_clear(s);
}

int64_t strata_session_n_past(const strata_session *s) { return s ? s->n_past : 0; }

typedef mdl_fwd_seq fwd_seq;

strata_status mdl_step_begin(const mdl_fwd_seq *q, int n, strata_session *const *ss, const int32_t *const *ids,
                             const int64_t *Ls, float *X) {
    const strata_model *m = q[0].s->m;
    const int64_t E = m->hp.n_embd, hc = m->hp.hc, W = hc * E;
    strata_status rc;
    /* the PLE worker hashes and gathers every sequence's rows while the embeddings and the layers
     * before the PLE's run */
    if (m->hp.ple_layer >= 0 && (rc = mdl_ple_submit(ss, ids, Ls, n))) return rc;
    for (int i = 0; i < n; i++)
        for (int64_t t = 0; t < q[i].L; t++) {
            float *xt = X + (q[i].r0 + t) * W;
            m->tok_embd_t->dequant[0](m->tok_embd + (size_t)q[i].ids[t] * m->tok_embd_row, xt, E);
            for (int64_t j = 1; j < hc; j++) memcpy(xt + j * E, xt, (size_t)E * sizeof(float));
        }
    return STRATA_OK;
}

/* One step of n sequences (each L <= cap tokens) in the buffers X [R x hc*E], u, y [R x E], c [R x hc]
 * (R: the sum of the L). Every dense product runs once over all R rows and the MoE merges every
 * row's picks into one group per expert; each sequence's PLE and mixer run on its own state. A row's
 * numbers do not depend on the other rows (the kernels sum every row in a fixed order whatever the
 * batch), so a sequence gets the same bits alone or in any batch. */
static strata_status forward(fwd_seq *q, int n, float *X, float *u, float *y, float *c) {
    strata_session *ss[STRATA_BATCH_MAX];   /* strata_batch_eval checked n */
    int64_t Ls[STRATA_BATCH_MAX];
    const int32_t *ids[STRATA_BATCH_MAX];
    for (int i = 0; i < n; i++) { ss[i] = q[i].s; Ls[i] = q[i].L; ids[i] = q[i].ids; }
    strata_session *s0 = q[0].s;
    const strata_model *m = s0->m;
    const mdl_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, hc = hp->hc, W = hc * E;
    const int64_t R = q[n - 1].r0 + q[n - 1].L;
    strata_status rc;
    if ((rc = mdl_step_begin(q, n, ss, ids, Ls, X))) return rc;
    /* trace: one span per layer and per part (the hooks cost a branch when the recorder is off);
     * watchdog: a beat per finished part, an abort check between layers (trace.h) */
    wd_state *wd = wd_self();
    const int tr = trc_on();
    uint64_t t_step = tr ? trc_now() : 0, t_l = 0, t_p = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        const mdl_layer *l = &m->layers[il];
        if (wd_expired()) return wd_fail("between layers (the last part took longer than the limit)");
        wd->layer = il;
        if (tr) t_l = trc_now();
        if (l->has_ple) {
            wd->part = "PLE";
            if (tr) t_p = trc_now();
            if ((rc = mdl_ple(ss, ids, Ls, n, il, X))) return rc;
            if (tr) trc_emit(TRC_PLE, t_p, trc_now(), il, 0, R, 0);
            wd_beat();
        }
        wd->part = "mixer";
        if (tr) t_p = trc_now();
        if ((rc = mdl_hc_read(m, X, l->hc_norm[0], &l->hc_down[0], &l->hc_up[0], &l->hc_inject[0], R, u, c))) return rc;
        rc = l->is_qsa ? mdl_qsa_multi(ss, Ls, n, il, u, R, y) : mdl_gdn_multi(ss, Ls, n, il, u, R, y);
        if (rc) return rc;
        mdl_hc_write(m, X, c, y, R);
        if (tr) trc_emit(TRC_MIXER, t_p, trc_now(), il, l->is_qsa, R, 0);
        wd_beat();
        wd->part = "MoE";
        if (tr) t_p = trc_now();
        uint64_t h0 = 0, n0 = 0;
        if (tr) off_counts(m->off, &h0, &n0);
        if ((rc = mdl_hc_read(m, X, l->hc_norm[1], &l->hc_down[1], &l->hc_up[1], &l->hc_inject[1], R, u, c))) return rc;
        if ((rc = mdl_moe(s0, il, u, R, y))) return rc;
        mdl_hc_write(m, X, c, y, R);
        if (tr) {
            const uint64_t t = trc_now();
            uint64_t h1 = 0, n1 = 0;
            off_counts(m->off, &h1, &n1);
            const int32_t ne = trc_take_experts();
            trc_emit(TRC_MOE, t_p, t, il, ne >= 0 ? ne : (int32_t)(n1 - n0), R, (int64_t)(h1 - h0));
            trc_emit(TRC_LAYER, t_l, t, il, 0, R, 0);
        }
        wd_beat();
        wd->part = NULL;
    }
    if (tr) trc_emit(TRC_STEP, t_step, trc_now(), (int32_t)R, (int32_t)wd->step, s0->n_past, 0);
    int64_t nr = 0;   /* rows whose logits are asked for */
    for (int i = 0; i < n; i++) {
        q[i].s->n_past += q[i].L;
        if (q[i].hidden) memcpy(q[i].hidden, X + q[i].r0 * W, (size_t)(q[i].L * W) * sizeof(float));
        if (q[i].out && q[i].row0 < q[i].L) nr += q[i].L - q[i].row0;
    }
    if (!nr) return STRATA_OK;
    /* the final mixer and the LM head only for the rows asked for, in one product */
    const int64_t V = hp->n_vocab;
    if (n == 1) {
        if ((rc = mdl_hc_read(m, X + q[0].row0 * W, m->out_hc_norm, &m->out_hc_down, &m->out_hc_up, NULL, nr, u, NULL)))
            return rc;
        return mdl_matmul(m, &m->output, 0, u, nr, q[0].out);
    }
    float *xs = malloc((size_t)(nr * W) * sizeof(float));
    float *lg = malloc((size_t)(nr * V) * sizeof(float));
    if (!xs || !lg) {
        free(xs);
        free(lg);
        return strata_fail(STRATA_ERR_NOMEM, "eval: no memory for the logits of %lld rows", (long long)nr);
    }
    int64_t k = 0;
    for (int i = 0; i < n; i++) {
        if (!q[i].out || q[i].row0 >= q[i].L) continue;
        const int64_t ni = q[i].L - q[i].row0;
        memcpy(xs + k * W, X + (q[i].r0 + q[i].row0) * W, (size_t)(ni * W) * sizeof(float));
        k += ni;
    }
    rc = mdl_hc_read(m, xs, m->out_hc_norm, &m->out_hc_down, &m->out_hc_up, NULL, nr, u, NULL);
    if (!rc) rc = mdl_matmul(m, &m->output, 0, u, nr, lg);
    if (!rc) {
        k = 0;
        for (int i = 0; i < n; i++) {
            if (!q[i].out || q[i].row0 >= q[i].L) continue;
            const int64_t ni = q[i].L - q[i].row0;
            memcpy(q[i].out, lg + k * V, (size_t)(ni * V) * sizeof(float));
            k += ni;
        }
    }
    free(xs);
    free(lg);
    return rc;
}

/* The checks of one eval (entry >= 0: of a batch's entry, which the message names), before anything
 * is touched. */
static strata_status check_eval(const strata_batch_seq *e, int entry) {
    char at[40] = "";
    if (entry >= 0) snprintf(at, sizeof at, "batch entry %d: ", entry);
    const strata_session *s = e->session;
    const int64_t n_ids = e->n_ids;
    if (!s || (!e->ids && n_ids > 0) || n_ids < 0)
        return strata_fail(STRATA_ERR_INVALID_ARG, "%sstrata_session_eval: null argument or negative count", at);
    if (n_ids == 0) return STRATA_OK;
    const strata_model *m = s->m;
    const int64_t V = m->hp.n_vocab, W = (int64_t)m->hp.hc * m->hp.n_embd;
    const int all_logits = (e->flags & STRATA_EVAL_ALL_LOGITS) != 0, keep = (e->flags & STRATA_EVAL_KEEP_STATES) != 0;
    if (s->n_past + n_ids > s->n_ctx)
        return strata_fail(STRATA_ERR_INVALID_ARG, "%seval: %lld tokens after %lld exceed the context of %lld tokens; "
                           "reset the session or load the model with a larger n_ctx",
                           at, (long long)n_ids, (long long)s->n_past, (long long)s->n_ctx);
    for (int64_t i = 0; i < n_ids; i++)
        if (e->ids[i] < 0 || e->ids[i] >= V)
            return strata_fail(STRATA_ERR_INVALID_ARG, "%seval: token id %d at index %lld is outside the vocabulary "
                               "(0..%lld)", at, e->ids[i], (long long)i, (long long)(V - 1));
    if (e->logits) {
        const uint64_t need = (uint64_t)(all_logits ? n_ids : 1) * (uint64_t)V;
        if (e->logits_capacity < need)
            return strata_fail(STRATA_ERR_BUFFER_TOO_SMALL, "%seval: the logits buffer holds %llu floats, %llu needed",
                               at, (unsigned long long)e->logits_capacity, (unsigned long long)need);
    }
    if (e->hidden && e->hidden_capacity < (uint64_t)n_ids * (uint64_t)W)
        return strata_fail(STRATA_ERR_BUFFER_TOO_SMALL, "%seval: the hidden buffer holds %llu floats, %llu needed",
                           at, (unsigned long long)e->hidden_capacity,
                           (unsigned long long)((uint64_t)n_ids * (uint64_t)W));
    if (e->flags & STRATA_EVAL_CONTINUED) {
        if (keep)
            return strata_fail(STRATA_ERR_INVALID_ARG, "%seval: STRATA_EVAL_CONTINUED with KEEP_STATES: a verify window "
                               "is one eval", at);
        if (m->params.n_ubatch % 64)
            return strata_fail(STRATA_ERR_INVALID_ARG, "%seval: STRATA_EVAL_CONTINUED needs n_ubatch a multiple of 64 "
                               "(the GDN's chunk); the model was loaded with n_ubatch %d", at, (int)m->params.n_ubatch);
    }
    if (keep && mdl_gdn_open_rows(s))
        return strata_fail(STRATA_ERR_INVALID_ARG, "%seval: a verify window while the last eval (STRATA_EVAL_CONTINUED) "
                           "left a GDN chunk open; finish that evaluation first", at);
    if (keep && n_ids > s->spec_max)
        return strata_fail(STRATA_ERR_INVALID_ARG, "%seval: a verify window of %lld tokens, but the session keeps "
                           "states for %d (strata_session_set_spec_max)", at, (long long)n_ids, s->spec_max);
    return STRATA_OK;
}

/* Every entry in steps of at most cap tokens a sequence: step k runs tokens [k cap, (k+1) cap) of every
 * entry that has them, as one forward (so each sequence is cut where its own eval would cut it). */
static strata_status batch_eval(const strata_batch_seq *seqs, int32_t n) {
    strata_model *m = seqs[0].session->m;
    const int64_t V = m->hp.n_vocab, E = m->hp.n_embd, hc = m->hp.hc, W = hc * E;
    const int64_t cap = m->params.n_ubatch;
    int64_t total = 0, longest = 0;
    for (int32_t i = 0; i < n; i++) {
        strata_session *s = seqs[i].session;
        const int keep = (seqs[i].flags & STRATA_EVAL_KEEP_STATES) != 0;
        total += seqs[i].n_ids;
        if (seqs[i].n_ids > longest) longest = seqs[i].n_ids;
        if (!seqs[i].n_ids) continue;
        s->spec_start = keep ? s->n_past : -1;
        s->spec_n = seqs[i].n_ids;
        s->spec_on = keep;
    }
    fwd_seq *q = malloc((size_t)n * sizeof *q);
    /* one sequence: the session's own scratch; several: the step's rows, at most n x cap */
    float *buf = NULL;
    if (n > 1) {
        const int64_t rows = (n * cap < total ? n * cap : total);
        buf = malloc((size_t)(rows * (W + 2 * E + hc)) * sizeof(float));
    }
    strata_status rc = STRATA_OK;
    if (!q || (n > 1 && !buf)) {
        rc = strata_fail(STRATA_ERR_NOMEM, "eval: no memory for a step of %d sequences", (int)n);
        goto done;
    }
    for (int32_t i = 0; i < n && !rc; i++)      /* the rows each will write (the caches grow with use) */
        rc = mdl_session_reserve(seqs[i].session, seqs[i].session->n_past + seqs[i].n_ids);
    if (rc) goto done;
    wd_eval_begin(total, cap);
    for (int64_t i0 = 0; i0 < longest; i0 += cap) {
        int nq = 0;
        int64_t r = 0;
        for (int32_t i = 0; i < n; i++) {
            const strata_batch_seq *e = &seqs[i];
            if (e->n_ids <= i0) continue;
            const int64_t L = e->n_ids - i0 < cap ? e->n_ids - i0 : cap;
            const int last = i0 + L == e->n_ids, all = (e->flags & STRATA_EVAL_ALL_LOGITS) != 0;
            fwd_seq *f = &q[nq++];
            *f = (fwd_seq){.s = e->session, .ids = e->ids + i0, .L = L, .r0 = r, .row0 = L, .out = NULL,
                           .hidden = e->hidden ? e->hidden + i0 * W : NULL};
            if (e->logits && all) { f->out = e->logits + i0 * V; f->row0 = 0; }
            else if (e->logits && last) { f->out = e->logits; f->row0 = L - 1; }
            r += L;
            f->s->gdn_leave_open = !last || (e->flags & STRATA_EVAL_CONTINUED);
            /* the rows from n_past on are rewritten: only the new ids stand behind them */
            memcpy(f->s->tokens + f->s->n_past, f->ids, (size_t)L * sizeof(int32_t));
            f->s->n_valid = f->s->n_past;
        }
        wd_state *wd = wd_self();
        wd->step = i0 / cap + 1;
        wd->tokens = r;
        wd->layer = -1;
        strata_session *s0 = q[0].s;
        if (m->dk)
            rc = n > 1 ? mdl_forward_dev(q, nq, buf, buf + r * W) : mdl_forward_dev(q, nq, s0->X, s0->u);
        else
            rc = n > 1 ? forward(q, nq, buf, buf + r * W, buf + r * (W + E), buf + r * (W + 2 * E))
                       : forward(q, nq, s0->X, s0->u, s0->y, s0->c);
        if (rc) break;
        for (int i = 0; i < nq; i++) {
            q[i].s->n_valid = q[i].s->n_past;
            q[i].s->gdn_continues = 0;   /* the eval's later steps run as its first did (gdn.c) */
        }
    }
    for (int32_t i = 0; i < n && !rc; i++)
        if (seqs[i].n_ids) seqs[i].session->gdn_continues = (seqs[i].flags & STRATA_EVAL_CONTINUED) != 0;
    wd_eval_end();
done:
    for (int32_t i = 0; i < n; i++) {
        seqs[i].session->spec_on = 0;
        if (rc) seqs[i].session->spec_start = -1;
    }
    free(q);
    free(buf);
    return rc;
}

strata_status strata_session_eval(strata_session *s, const int32_t *ids, int64_t n_ids, int32_t all_logits,
                                  float *logits, uint64_t logits_capacity) {
    return strata_session_eval_ex(s, ids, n_ids, all_logits ? STRATA_EVAL_ALL_LOGITS : 0, logits, logits_capacity,
                                  NULL, 0);
}

strata_status strata_session_eval_ex(strata_session *s, const int32_t *ids, int64_t n_ids, int32_t flags,
                                     float *logits, uint64_t logits_capacity, float *hidden, uint64_t hidden_capacity) {
    const strata_batch_seq e = {.session = s, .ids = ids, .n_ids = n_ids, .flags = flags, .logits = logits,
                                .logits_capacity = logits_capacity, .hidden = hidden, .hidden_capacity = hidden_capacity};
    strata_status rc = check_eval(&e, -1);
    if (rc || n_ids == 0) return rc;
    return batch_eval(&e, 1);
}

strata_status strata_batch_eval(const strata_batch_seq *seqs, int32_t n_seqs) {
    if (n_seqs < 0 || (n_seqs > 0 && !seqs))
        return strata_fail(STRATA_ERR_INVALID_ARG, "strata_batch_eval: %d entries%s", (int)n_seqs,
                           n_seqs > 0 ? " but no array" : " (give 0 or more)");
    if (n_seqs > STRATA_BATCH_MAX)
        return strata_fail(STRATA_ERR_INVALID_ARG, "strata_batch_eval: %d entries; at most %d sequences per call (split "
                           "the batch)", (int)n_seqs, (int)STRATA_BATCH_MAX);
    /* the entries that run (n_ids > 0), checked before any state is touched */
    strata_batch_seq *run = malloc((size_t)(n_seqs > 0 ? n_seqs : 1) * sizeof *run);
    if (!run) return strata_fail(STRATA_ERR_NOMEM, "strata_batch_eval: no memory");
    int32_t n = 0;
    strata_status rc = STRATA_OK;
    for (int32_t i = 0; i < n_seqs && !rc; i++) {
        if ((rc = check_eval(&seqs[i], i))) break;
        if (seqs[i].session->m != seqs[0].session->m) {
            rc = strata_fail(STRATA_ERR_INVALID_ARG, "batch entry %d: its session belongs to another model than entry "
                             "0's; a batch runs sessions of one model", (int)i);
            break;
        }
        for (int32_t j = 0; j < i; j++)
            if (seqs[j].session == seqs[i].session) {
                rc = strata_fail(STRATA_ERR_INVALID_ARG, "batch entries %d and %d name the same session; give each "
                                 "sequence once (concatenate its tokens)", (int)j, (int)i);
                break;
            }
        if (!rc && seqs[i].n_ids > 0) run[n++] = seqs[i];
    }
    if (!rc && n > 0) rc = batch_eval(run, n);
    free(run);
    return rc;
}
