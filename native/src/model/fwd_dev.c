/*
 * fwd_dev.c — the dense forward on a device (device/dense.h: the GPU's kernels, or their host emulation).
 *
 * What runs where. On the device: the embeddings' streams (rows dequantized on the host, copied up), every
 * hyper-connection read and write, the GDN and QSA mixers with their state (conv windows, recurrent state,
 * K/V in kv_type, indexer keys, block summaries: state.c allocates every layer's state in the device's
 * memory), the MoE's router, shared expert and merge, the PLE layer on the rows its CPU worker gathered
 * (ple_layer.c mdl_ple_dev; its conv history is device state), the final mixer, the LM head and the MTP
 * head (mdl_mtp_step_dev). The routed experts go through the offload engine (mdl_moe_experts: its device
 * cache and staging ring, whose groups read and write this device's memory when the expert device is this
 * one, and the CPU pool), between the MoE input and routing copied down and the CPU pool's rows copied up.
 * So a step waits for the device once per MoE layer (the CPU experts' handoff:
 * the host needs the routing) and once for the logits; copies up come from page-locked buffers and do not
 * wait (the PLE rows, the experts' rows). Every byte that crosses is counted (mdl_dcopy; offload stats).
 *
 * Products: the activations are rounded as strata_matmul rounds them (act_quant), then up to GEMV_MAX_ROWS
 * rows take the gemv kernel (the decode path) and more the gemm path (tiles of the weight decoded to float and
 * a product kernel that sums in the gemv kernel's order, so that batches are invariant; --prefill-f16: f16
 * tiles on cuBLAS). The GDN runs its recurrent form
 * for verify windows and short steps, the chunked form (closed chunks of 64) from GDN_CHUNK_MIN_ROWS rows on;
 * a step never leaves a chunk open across evals
 * (STRATA_EVAL_CONTINUED changes nothing here: the C path keeps one open only to make its bits independent
 * of where a prompt is cut). QSA queries run in slices whose score and weight scratch stays under
 * QSA_SLICE_BYTES. Each sequence's mixer runs on its own state; products run once over the step's rows.
 *
 * The numbers differ from the C forward by summation order only (the kernels' checks in
 * tests/native/test_cuda_ops_*.c bound each op); tests/test_dense_device.py compares whole models, and
 * tools/dense_check.py (device_check.sh's models rows) the GPU's run with the C one.
 */
#include "fwd_dev.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"
#include "util/trace.h"

/* ---------------------------------------------------------------- buffers */

static strata_status dsess(strata_session *s) {
    if (s->ds) return STRATA_OK;
    s->ds = calloc(1, sizeof *s->ds);
    if (!s->ds) return strata_fail(STRATA_ERR_NOMEM, "device forward: no memory");
    s->ds->dk = s->m->dk;
    return STRATA_OK;
}

/* *p (capacity *cap) replaced by a quarter more than bytes; 0, or the size it could not have. */
static size_t regrow(void **p, size_t *cap, size_t bytes, void *(*alloc)(size_t), void (*release)(void *)) {
    release(*p);
    *p = NULL;
    *cap = 0;
    const size_t want = bytes + bytes / 4;
    if (!(*p = alloc(want))) return want;
    *cap = want;
    return 0;
}

strata_status mdl_dbuf(strata_session *s, int which, size_t bytes, void **out) {
    strata_status rc = dsess(s);
    if (rc) return rc;
    struct mdl_dsess *d = s->ds;
    size_t miss;
    if (d->cap[which] < bytes && (miss = regrow(&d->buf[which], &d->cap[which], bytes, d->dk->alloc, d->dk->free)))
        return strata_fail(STRATA_ERR_NOMEM, "device forward: the %s device has no room for %.1f MiB of work "
                           "buffers; lower the expert cache (--cache-gib) or the step (--prefill-chunk)",
                           d->dk->name, (double)miss / (1 << 20));
    *out = d->buf[which];
    return STRATA_OK;
}

strata_status mdl_dhost(strata_session *s, int which, size_t bytes, void **out) {
    strata_status rc = dsess(s);
    if (rc) return rc;
    struct mdl_dsess *d = s->ds;
    if (d->host_cap[which] < bytes) {
        if (d->host[which] && (rc = d->dk->sync(NULL))) return rc;   /* a copy up from it may be queued */
        const size_t miss = regrow(&d->host[which], &d->host_cap[which], bytes, d->dk->host_alloc, d->dk->host_free);
        if (miss)
            return strata_fail(STRATA_ERR_NOMEM, "device forward: no page-locked host memory for %.1f MiB of "
                               "staging; lower the step (--prefill-chunk)", (double)miss / (1 << 20));
    }
    *out = d->host[which];
    return STRATA_OK;
}

void mdl_dense_session_free(strata_session *s) {
    if (!s->ds) return;
    (void)s->ds->dk->sync(NULL);   /* nothing queued may read what goes */
    for (int i = 0; i < B_N; i++) s->ds->dk->free(s->ds->buf[i]);
    for (int i = 0; i < H_N; i++) s->ds->dk->host_free(s->ds->host[i]);
    free(s->ds);
    s->ds = NULL;
}

strata_status mdl_dcopy(strata_session *s, void *dst, const void *src, size_t bytes, int kind) {
    strata_model *m = s->m;
    if (kind == DK_H2D) __atomic_fetch_add(&m->dense_h2d, (uint64_t)bytes, __ATOMIC_RELAXED);
    if (kind == DK_D2H) __atomic_fetch_add(&m->dense_d2h, (uint64_t)bytes, __ATOMIC_RELAXED);
    return m->dk->copy(dst, src, bytes, kind, NULL);
}

/* ---------------------------------------------------------------- products */

strata_status mdl_dmatmul(strata_session *s, const mdl_mat *w, const float *x, int64_t L, float *y) {
    const strata_model *m = s->m;
    const mdl_dk *dk = m->dk;
    strata_status rc;
    if (L <= 0) return STRATA_OK;
    /* the activations rounded as the CPU's matmul rounds them (int8 blocks for quantized weights), for both
     * paths: the gemm would take floats, but then prefill and decode would differ from the C forward by that
     * rounding (~1e-2 of the logits' spread on the tiny models) rather than by summation order alone */
    float *xq = NULL;
    DBUF(s, B_XQ, float, L * w->cols, xq);
    if ((rc = dk->act_quant(NULL, (int)w->t->act, x, xq, L, w->cols))) return rc;
    if (L <= GEMV_MAX_ROWS) {
        rc = dk->gemv(NULL, w->t->type, w->dev, w->row_bytes, w->rows, w->cols, xq, L, y);
    } else {
        /* a tile of GEMM_TILE_BYTES (at least GEMM_TILE_ROWS rows, at most the matrix): few launches a product.
         * cuBLAS only for --prefill-f16: its float product sums in its own order, and the batch-invariant kernel
         * in the decode kernel's (a row's bits do not depend on the step's other rows) */
        const int f16 = m->dense->f16;
        int64_t rows = (int64_t)(GEMM_TILE_BYTES / dk->gemm_tile_bytes(w->cols, 1, f16));
        if (rows < GEMM_TILE_ROWS) rows = GEMM_TILE_ROWS;
        if (rows > w->rows) rows = w->rows;
        const size_t tb = dk->gemm_tile_bytes(w->cols, rows, f16);
        void *tile, *x16 = NULL;
        if ((rc = mdl_dbuf(s, B_TILE, tb, &tile))) return rc;
        if (f16 && (rc = mdl_dbuf(s, B_X16, (size_t)(L * w->cols) * 2, &x16))) return rc;
        rc = dk->gemm(f16 ? m->dense->blas : NULL, NULL, w->t->type, w->dev, w->row_bytes, w->rows, w->cols, xq, L, y,
                      tile, tb, f16, x16);
    }
    if (!rc && w->scale) rc = dk->scale(NULL, y, L * w->rows, mdl_mat_scale(w, 0));
    return rc;
}

/* The hyper-connection read (hc.c mdl_hc_read) of L rows of X on the device; c NULL: the final mixer. */
static strata_status dhc_read(strata_session *s, const float *X, const float *norm, const mdl_mat *down,
                              const mdl_mat *up, const mdl_mat *inject, int64_t L, float *u, float *c) {
    const strata_model *m = s->m;
    const mdl_dk *dk = m->dk;
    const int64_t E = m->hp.n_embd, hc = m->hp.hc, W = hc * E, R = m->hp.hc_rank;
    strata_status rc;
    float *xh = NULL, *g = NULL, *a = NULL;
    DBUF(s, B_XH, float, L * W, xh);
    DBUF(s, B_G, float, L * W, g);
    DBUF(s, B_A, float, L * (R > hc ? R : hc), a);
    if ((rc = dk->hc_read_norm(X, norm, L, hc, E, m->hp.eps, xh, NULL))) return rc;
    if ((rc = mdl_dmatmul(s, down, xh, L, a))) return rc;
    if ((rc = dk->hc_read_act(a, L * R, hc, NULL))) return rc;
    if ((rc = mdl_dmatmul(s, up, a, L, g))) return rc;
    if ((rc = dk->hc_read_mix(g, xh, L, hc, E, u, NULL))) return rc;
    if (c) {
        if ((rc = mdl_dmatmul(s, inject, xh, L, a))) return rc;
        rc = dk->hc_inject(a, L * hc, hc, c, NULL);
    }
    return rc;
}

/* ---------------------------------------------------------------- mixers */

/* The GDN layer il for n sequences whose rows are consecutive in u / y (gdn.c mdl_gdn_multi). */
static strata_status dgdn(strata_session *const *ss, const int64_t *Ls, int n, int il, const float *u, int64_t R,
                          float *y) {
    strata_session *s0 = ss[0];
    const strata_model *m = s0->m;
    const mdl_dk *dk = m->dk;
    const mdl_hparams *hp = &m->hp;
    const mdl_layer *l = &m->layers[il];
    const dlayer *dl = &m->dense->layers[il];
    const int dk_ = hp->ssm_dk, dv = hp->ssm_dk, Gk = hp->ssm_gk, Gv = hp->ssm_gv, Kc = hp->ssm_kc;
    const int64_t KD = (int64_t)Gk * dk_, VD = (int64_t)Gv * dv, CD = 2 * KD + VD;
    strata_status rc;
    float *pq = NULL, *pz = NULL, *pb = NULL, *pa = NULL, *cv = NULL, *qn = NULL, *kn = NULL, *o = NULL;
    DBUF(s0, B_P0, float, R * CD, pq);
    DBUF(s0, B_P1, float, R * VD, pz);
    DBUF(s0, B_P2, float, R * Gv, pb);
    DBUF(s0, B_P3, float, R * Gv, pa);
    DBUF(s0, B_CV, float, R * CD, cv);
    DBUF(s0, B_QN, float, R * KD, qn);
    DBUF(s0, B_KN, float, R * KD, kn);
    DBUF(s0, B_O, float, R * VD, o);
    if ((rc = mdl_dmatmul(s0, &l->ssm_qkv, u, R, pq))) return rc;
    if ((rc = mdl_dmatmul(s0, &l->ssm_z, u, R, pz))) return rc;
    if ((rc = mdl_dmatmul(s0, &l->ssm_beta, u, R, pb))) return rc;
    if ((rc = mdl_dmatmul(s0, &l->ssm_alpha, u, R, pa))) return rc;
    const size_t conv_floats = (size_t)(Kc - 1) * (size_t)CD;
    int64_t r0 = 0;
    for (int i = 0; i < n; i++) {
        strata_session *s = ss[i];
        mdl_layer_state *st = &s->ls[il];
        const int64_t L = Ls[i];
        const int keep = mdl_spec_active(s);
        float *pq_i = pq + r0 * CD, *cv_i = cv + r0 * CD, *qn_i = qn + r0 * KD, *kn_i = kn + r0 * KD;
        float *pb_i = pb + r0 * Gv, *pa_i = pa + r0 * Gv, *o_i = o + r0 * VD;
        if (keep) {   /* a verify window: the conv window after each token, for rollback (spec.c) */
            for (int64_t t = 0; t < L && !rc; t++) {
                rc = dk->gdn_conv(dl->ssm_conv, Kc, CD, st->conv, pq_i + t * CD, CD, 1, cv_i + t * CD, NULL);
                if (!rc)
                    rc = dk->copy(st->conv_slots + (size_t)t * conv_floats, st->conv, conv_floats * sizeof(float),
                                  DK_D2D, NULL);
            }
        } else {
            rc = dk->gdn_conv(dl->ssm_conv, Kc, CD, st->conv, pq_i, CD, L, cv_i, NULL);
        }
        if (!rc)
            rc = dk->gdn_prep(cv_i, L, Gk, Gv, dk_, dv, pb_i, pa_i, Gv, dl->ssm_a, dl->ssm_dt_bias, qn_i, kn_i, pb_i,
                              pa_i, NULL);
        if (!rc && !keep && L >= GDN_CHUNK_MIN_ROWS) {
            float *work = NULL;
            DBUF(s0, B_WORK, float, dk->gdn_chunked_work_floats(Gv, dk_, dv), work);
            rc = dk->gdn_chunked(st->S, qn_i, kn_i, cv_i, pb_i, pa_i, o_i, L, Gk, Gv, dk_, dv, work, NULL);
        } else if (!rc) {
            rc = dk->gdn_recurrent(st->S, qn_i, kn_i, cv_i, pb_i, pa_i, o_i, L, Gk, Gv, dk_, dv,
                                   keep ? st->S_slots : NULL, NULL);
        }
        if (!rc) rc = dk->gdn_out(o_i, pz + r0 * VD, VD, dl->ssm_norm, L, Gv, dv, hp->eps, hp->gate_sigmoid, NULL);
        if (rc) return rc;
        r0 += Ls[i];
    }
    return mdl_dmatmul(s0, &l->ssm_out, o, R, y);
}

/* The QSA layer il for n sequences (qsa.c qsa_rows): projections over all rows, then per sequence the
 * norms, RoPE, cache writes, block summaries, selection and attention at its own n_past, then W_o. The MTP
 * head (mdl_qsa_at): one sequence, st its cache, rows from p0 on; st NULL: the sequences' trunk caches. */
static strata_status dqsa(strata_session *const *ss, const int64_t *Ls, int n, int il, mdl_layer_state *st_at,
                          int64_t p0_at, const float *u, int64_t R, float *y) {
    strata_session *s0 = ss[0];
    const strata_model *m = s0->m;
    const mdl_dk *dk = m->dk;
    const mdl_hparams *hp = &m->hp;
    const mdl_layer *l = &m->layers[il];
    const dlayer *dl = &m->dense->layers[il];
    const int64_t H = hp->n_head, Hkv = hp->n_head_kv, hd = hp->head_dim, nI = hp->idx_heads, dI = hp->idx_dim;
    const int64_t r = l->ratio, topk = r > 0 ? hp->idx_budget / r : 0;
    const int32_t n_rot = hp->n_rot;
    const int kv_type = m->params.kv_type;
    strata_status rc;
    float *qg = NULL, *kk = NULL, *vv = NULL, *iq = NULL, *ik = NULL, *q = NULL, *o = NULL, *cs = NULL;
    DBUF(s0, B_P0, float, R * 2 * H * hd, qg);
    DBUF(s0, B_P1, float, R * Hkv * hd, kk);
    DBUF(s0, B_P2, float, R * Hkv * hd, vv);
    DBUF(s0, B_P3, float, R * nI * dI, iq);
    DBUF(s0, B_P4, float, R * dI, ik);
    DBUF(s0, B_Q, float, R * H * hd, q);
    DBUF(s0, B_O, float, R * H * hd, o);
    DBUF(s0, B_CS, float, R * n_rot, cs);
    if ((rc = mdl_dmatmul(s0, &l->attn_q, u, R, qg))) return rc;
    if ((rc = mdl_dmatmul(s0, &l->attn_k, u, R, kk))) return rc;
    if ((rc = mdl_dmatmul(s0, &l->attn_v, u, R, vv))) return rc;
    if ((rc = mdl_dmatmul(s0, &l->idx_q, u, R, iq))) return rc;
    if ((rc = mdl_dmatmul(s0, &l->idx_k, u, R, ik))) return rc;
    int64_t r0 = 0;
    for (int i = 0; i < n; i++) {
        strata_session *s = ss[i];
        mdl_layer_state *st = st_at ? st_at : &s->ls[il];
        const int64_t L = Ls[i], p0 = st_at ? p0_at : s->n_past;
        float *qg_i = qg + r0 * 2 * H * hd, *kk_i = kk + r0 * Hkv * hd, *vv_i = vv + r0 * Hkv * hd;
        float *iq_i = iq + r0 * nI * dI, *ik_i = ik + r0 * dI, *q_i = q + r0 * H * hd, *o_i = o + r0 * H * hd;
        float *cs_i = cs + r0 * n_rot;
        /* a summary that covers a row from p0 on is stale (qsa.c qsa_prep) */
        if (r > 0 && st->n_blk > p0 / r) st->n_blk = p0 / r;
        if ((rc = dk->rope_angles(hp->rope_theta, n_rot, p0, 1, L, cs_i, NULL))) return rc;
        /* q: N1 per head out of the [q | gate] rows, then RoPE; k: N1 and RoPE in place; then the caches */
        if ((rc = dk->rmsnorm_rows(qg_i, 2 * hd, dl->attn_q_norm, 1, L * H, hd, hp->eps, q_i, hd, NULL))) return rc;
        if ((rc = dk->rope_apply(q_i, hd, L * H, H, n_rot, cs_i, NULL))) return rc;
        if ((rc = dk->rmsnorm_rows(kk_i, hd, dl->attn_k_norm, 1, L * Hkv, hd, hp->eps, kk_i, hd, NULL))) return rc;
        if ((rc = dk->rope_apply(kk_i, hd, L * Hkv, Hkv, n_rot, cs_i, NULL))) return rc;
        if ((rc = dk->qsa_store(st->k, st->v, st->kv_scale, kv_type, Hkv, hd, p0, L, kk_i, vv_i, NULL))) return rc;
        if ((rc = dk->rmsnorm_rows(iq_i, dI, dl->idx_q_norm, 1, L * nI, dI, hp->eps, iq_i, dI, NULL))) return rc;
        if ((rc = dk->rope_apply(iq_i, dI, L * nI, nI, n_rot, cs_i, NULL))) return rc;
        if ((rc = dk->qsa_idx_store(st->idx_k, ik_i, dI, p0, L, NULL))) return rc;
        /* the summaries of the blocks these rows complete: mean, N1, RoPE at the block's first position */
        if (r > 0 && (p0 + L) / r > st->n_blk) {
            const int64_t b0 = st->n_blk, nbn = (p0 + L) / r - b0;
            float *kb = st->blk + b0 * dI, *bcs = NULL;
            DBUF(s0, B_BCS, float, nbn * n_rot, bcs);
            if ((rc = dk->qsa_blk_pool(st->idx_k, dI, r, b0, nbn, st->blk, NULL))) return rc;   /* rows b0.. of it */
            if ((rc = dk->rmsnorm_rows(kb, dI, dl->idx_k_norm, 1, nbn, dI, hp->eps, kb, dI, NULL))) return rc;
            if ((rc = dk->rope_angles(hp->rope_theta, n_rot, b0 * r, r, nbn, bcs, NULL))) return rc;
            if ((rc = dk->rope_apply(kb, dI, nbn, 1, n_rot, bcs, NULL))) return rc;
            st->n_blk = b0 + nbn;
        }
        /* selection and attention, in slices of queries whose scratch stays under QSA_SLICE_BYTES */
        for (int64_t t0 = 0; t0 < L;) {
            const int64_t seen = p0 + L;   /* keys the slice's last query sees, at most */
            const int64_t ld = r > 0 ? seen / r + 1 : 1;
            int64_t sel_cap = r > 0 ? hp->idx_budget + r : 1;
            if (sel_cap > seen) sel_cap = seen;
            const int64_t w_cap = r > 0 ? sel_cap : seen;
            const size_t per_query = ((size_t)ld + (size_t)H * (size_t)w_cap) * sizeof(float) +
                                     ((size_t)sel_cap + 1) * sizeof(int32_t);
            int64_t Lc = (int64_t)(QSA_SLICE_BYTES / per_query);
            if (Lc < 1) Lc = 1;
            if (Lc > L - t0) Lc = L - t0;
            float *score = NULL, *w = NULL;
            int32_t *sel = NULL, *n_sel = NULL;
            if (r > 0) DBUF(s0, B_SCORE, float, Lc * ld, score);
            DBUF(s0, B_SEL, int32_t, Lc * sel_cap, sel);
            DBUF(s0, B_NSEL, int32_t, Lc, n_sel);
            DBUF(s0, B_W, float, Lc * H * w_cap, w);
            if (r > 0 && (rc = dk->qsa_index(iq_i + t0 * nI * dI, st->blk, nI, dI, r, topk, p0 + t0, Lc, score, ld,
                                             NULL)))
                return rc;
            if ((rc = dk->qsa_select(score, ld, r, topk, p0 + t0, Lc, sel, sel_cap, n_sel, NULL))) return rc;
            if ((rc = dk->qsa_attn(st->k, st->v, st->kv_scale, kv_type, H, Hkv, hd, p0 + t0, Lc, q_i + t0 * H * hd,
                                   qg_i + t0 * 2 * H * hd, sel, sel_cap, n_sel, w, w_cap, o_i + t0 * H * hd, NULL)))
                return rc;
            t0 += Lc;
        }
        r0 += L;
    }
    return mdl_dmatmul(s0, &l->attn_o, o, R, y);
}

/* ---------------------------------------------------------------- the MoE */

/* The MoE of layer il on R rows of du (device), y to dy (device); u [R x E] is host memory to stage the
 * input through. The router, its top-k and the grouping run here, then the routing and u go down (one
 * synchronisation): the host runs the routed experts (offload engine: device cache, staging, CPU pool;
 * mdl_moe_experts) while the device runs the shared expert; the CPU pool's rows come up and the merge
 * Σ w·sd·E(x) + σ(w_seg·u)·sd_sh·shared(u) runs here. When the expert device is this device
 * (m->expert_dev_io), its groups read their input rows gathered here and leave their rows here: only the
 * CPU pool's rows cross. */
static strata_status dmoe(strata_session *s, int il, const float *du, int64_t R, float *u, float *dy) {
    const strata_model *m = s->m;
    const mdl_dk *dk = m->dk;
    const mdl_hparams *hp = &m->hp;
    const mdl_layer *l = &m->layers[il];
    const dlayer *dl = &m->dense->layers[il];
    const int64_t E = hp->n_embd, Ne = hp->n_expert, K = hp->n_expert_used, Fs = hp->ff_shexp, n = R * K;
    const int dev_io = m->expert_dev_io && m->off && il < hp->n_layer;   /* the MTP block's run on the CPU pool */
    strata_status rc;
    float *lg = NULL, *pw = NULL, *out = NULL, *gate = NULL, *gu = NULL, *h = NULL, *sho = NULL, *xg = NULL;
    int32_t *pick = NULL;
    int64_t *count = NULL, *slot = NULL, *row = NULL;
    int8_t *skip = NULL;
    DBUF(s, B_MLG, float, R * Ne, lg);
    DBUF(s, B_MPICK, int32_t, n, pick);
    DBUF(s, B_MPW, float, n, pw);
    DBUF(s, B_MCOUNT, int64_t, Ne + 1, count);
    DBUF(s, B_MSLOT, int64_t, n, slot);
    DBUF(s, B_MROW, int64_t, n, row);
    DBUF(s, B_MOUT, float, n * E, out);
    DBUF(s, B_MSKIP, int8_t, Ne, skip);
    DBUF(s, B_MGATE, float, R, gate);
    DBUF(s, B_MSHGU, float, 2 * R * Fs, gu);
    DBUF(s, B_MSHH, float, R * Fs, h);
    DBUF(s, B_MSHO, float, R * E, sho);
    if (dev_io) DBUF(s, B_MXG, float, n * E, xg);
    if ((rc = mdl_dmatmul(s, &l->router, du, R, lg))) return rc;
    if ((rc = dk->router_topk(lg, R, Ne, K, pick, pw, NULL))) return rc;
    if ((rc = dk->router_group(pick, n, Ne, count, slot, row, NULL))) return rc;
    if (dev_io && (rc = dk->merge_gather(du, slot, n, K, E, xg, NULL))) return rc;
    /* host staging (page-locked): the grouping's counts, the routing, the experts' rows, skip and where marks */
    const size_t cb = (size_t)(Ne + 1) * sizeof(int64_t), pb = (size_t)n * sizeof(int32_t);
    const size_t wb = (size_t)n * sizeof(float), ob = (size_t)(n * E) * sizeof(float);
    char *hb = NULL;   /* the rows go up without waiting for the shared expert's kernels */
    if ((rc = mdl_dhost(s, H_MOE, cb + pb + wb + ob + 2 * (size_t)Ne, (void **)&hb))) return rc;
    mdl_moe_ext ext = {.count = (int64_t *)hb, .pick = (const int32_t *)(hb + cb), .pw = (const float *)(hb + cb + pb),
                       .out = (float *)(hb + cb + pb + wb), .skip = (int8_t *)(hb + cb + pb + wb + ob),
                       .where = (int8_t *)(hb + cb + pb + wb + ob + Ne), .dx = xg, .dout = dev_io ? out : NULL};
    /* the copies down wait for the router (the default stream runs in order) */
    if ((rc = mdl_dcopy(s, u, du, (size_t)(R * E) * sizeof(float), DK_D2H))) return rc;
    if ((rc = mdl_dcopy(s, hb + cb, pick, pb, DK_D2H))) return rc;
    if ((rc = mdl_dcopy(s, hb + cb + pb, pw, wb, DK_D2H))) return rc;
    /* queued for the device while the host computes: the shared expert and its gate (the products apply their
     * .scale themselves, so the GLU and the merge take 1) */
    if ((rc = mdl_dmatmul(s, &l->sh_gate, du, R, gu))) return rc;
    if ((rc = mdl_dmatmul(s, &l->sh_up, du, R, gu + R * Fs))) return rc;
    if ((rc = dk->merge_glu(gu, R, Fs, 0, 1.0f, 1.0f, h, NULL))) return rc;
    if ((rc = mdl_dmatmul(s, &l->sh_down, h, R, sho))) return rc;
    if ((rc = dk->merge_shared_gate(dl->sh_inp_gate, du, R, E, gate, NULL))) return rc;
    if ((rc = mdl_moe_experts(s, il, u, R, &ext))) return rc;
    /* the host's rows up, runs of consecutive experts in one copy each */
    for (int64_t e = 0; e < Ne;) {
        if (ext.where[e] != MDL_ROWS_HOST) { e++; continue; }
        int64_t f = e + 1;
        while (f < Ne && (ext.where[f] == MDL_ROWS_HOST || ext.count[f + 1] == ext.count[f])) f++;
        const int64_t r0 = ext.count[e], r1 = ext.count[f];
        if ((rc = mdl_dcopy(s, out + r0 * E, ext.out + r0 * E, (size_t)((r1 - r0) * E) * sizeof(float), DK_H2D)))
            return rc;
        e = f;
    }
    if ((rc = mdl_dcopy(s, skip, ext.skip, (size_t)Ne, DK_H2D))) return rc;
    return dk->merge_sum(pick, pw, dl->exp_down_scale, skip, row, out, gate, 1.0f, sho, R, E, K, dy, NULL);
}

/* ---------------------------------------------------------------- the step */

/* The step's pre-mixer rows down to the sequences that asked for them (MTP drafts read them); then waits for
 * the stream when none did. */
static strata_status hidden_down(strata_session *s0, const mdl_fwd_seq *q, int n, const float *dX) {
    const int64_t W = s0->m->hp.hc * s0->m->hp.n_embd;
    int copied = 0;
    for (int i = 0; i < n; i++) {
        if (!q[i].hidden) continue;
        strata_status rc = mdl_dcopy(s0, q[i].hidden, dX + q[i].r0 * W, (size_t)(q[i].L * W) * sizeof(float), DK_D2H);
        if (rc) return rc;
        copied = 1;
    }
    return copied ? STRATA_OK : s0->m->dk->sync(NULL);
}

strata_status mdl_forward_dev(mdl_fwd_seq *q, int n, float *X, float *u) {
    strata_session *ss[STRATA_BATCH_MAX];
    int64_t Ls[STRATA_BATCH_MAX];
    const int32_t *ids[STRATA_BATCH_MAX];
    for (int i = 0; i < n; i++) { ss[i] = q[i].s; Ls[i] = q[i].L; ids[i] = q[i].ids; }
    strata_session *s0 = q[0].s;
    const strata_model *m = s0->m;
    const mdl_dk *dk = m->dk;
    const mdl_hparams *hp = &m->hp;
    const struct mdl_dense *D = m->dense;
    const int64_t E = hp->n_embd, hc = hp->hc, W = hc * E;
    const int64_t R = q[n - 1].r0 + q[n - 1].L;
    strata_status rc;
    /* the streams: embeddings dequantized on the host (one row a token), copied up once */
    if ((rc = mdl_step_begin(q, n, ss, ids, Ls, X))) return rc;
    float *dX = NULL, *du = NULL, *dy = NULL, *dc = NULL;
    DBUF(s0, B_X, float, R * W, dX);
    DBUF(s0, B_U, float, R * E, du);
    DBUF(s0, B_Y, float, R * E, dy);
    DBUF(s0, B_C, float, R * hc, dc);
    if ((rc = mdl_dcopy(s0, dX, X, (size_t)(R * W) * sizeof(float), DK_H2D))) return rc;
    wd_state *wd = wd_self();
    const int tr = trc_on();
    uint64_t t_step = tr ? trc_now() : 0, t_p = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        const mdl_layer *l = &m->layers[il];
        const dlayer *dl = &D->layers[il];
        if (wd_expired()) return wd_fail("between layers (the last part took longer than the limit)");
        wd->layer = il;
        if (l->has_ple) {   /* on the device: only the gathered packed rows come up (ple_layer.c) */
            wd->part = "PLE";
            if (tr) t_p = trc_now();
            if ((rc = mdl_ple_dev(ss, ids, Ls, n, il, dX))) return rc;
            if (tr) trc_emit(TRC_PLE, t_p, trc_now(), il, 0, R, 0);
            wd_beat();
        }
        wd->part = "mixer";
        if (tr) t_p = trc_now();
        if ((rc = dhc_read(s0, dX, dl->hc_norm[0], &l->hc_down[0], &l->hc_up[0], &l->hc_inject[0], R, du, dc)))
            return rc;
        rc = l->is_qsa ? dqsa(ss, Ls, n, il, NULL, 0, du, R, dy) : dgdn(ss, Ls, n, il, du, R, dy);
        if (rc) return rc;
        if ((rc = dk->hc_write(dX, dc, dy, R, hc, E, NULL))) return rc;
        if (tr) trc_emit(TRC_MIXER, t_p, trc_now(), il, l->is_qsa, R, 0);
        wd_beat();
        /* on the host: u down (the copy waits for the layer so far), y up (a copy from pageable memory
         * returns once the bytes were taken, so u and y may be written again at once) */
        wd->part = "MoE";
        if (tr) t_p = trc_now();
        if ((rc = dhc_read(s0, dX, dl->hc_norm[1], &l->hc_down[1], &l->hc_up[1], &l->hc_inject[1], R, du, dc)))
            return rc;
        if ((rc = dmoe(s0, il, du, R, u, dy))) return rc;
        if ((rc = dk->hc_write(dX, dc, dy, R, hc, E, NULL))) return rc;
        if (tr) trc_emit(TRC_MOE, t_p, trc_now(), il, 0, R, 0);
        wd_beat();
        wd->part = NULL;
    }
    if (tr) trc_emit(TRC_STEP, t_step, trc_now(), (int32_t)R, (int32_t)wd->step, s0->n_past, 0);
    int64_t nr = 0;
    for (int i = 0; i < n; i++) {
        q[i].s->n_past += q[i].L;
        if (q[i].out && q[i].row0 < q[i].L) nr += q[i].L - q[i].row0;
    }
    /* the copies down come last, after every launch of the step: the first of them is its one wait */
    if (!nr) return hidden_down(s0, q, n, dX);
    /* the final mixer and the LM head for the rows asked for, gathered into one product */
    const int64_t V = hp->n_vocab;
    float *xs = NULL, *lg = NULL;
    DBUF(s0, B_P0, float, nr * W, xs);   /* the mixers' projections are done with it */
    DBUF(s0, B_LG, float, nr * V, lg);
    int64_t k = 0;
    for (int i = 0; i < n; i++) {
        if (!q[i].out || q[i].row0 >= q[i].L) continue;
        const int64_t ni = q[i].L - q[i].row0;
        if ((rc = dk->copy(xs + k * W, dX + (q[i].r0 + q[i].row0) * W, (size_t)(ni * W) * sizeof(float), DK_D2D,
                           NULL)))
            return rc;
        k += ni;
    }
    if ((rc = dhc_read(s0, xs, D->out_hc_norm, &m->out_hc_down, &m->out_hc_up, NULL, nr, du, NULL))) return rc;
    if ((rc = mdl_dmatmul(s0, &m->output, du, nr, lg))) return rc;
    k = 0;
    for (int i = 0; i < n; i++) {
        if (!q[i].out || q[i].row0 >= q[i].L) continue;
        const int64_t ni = q[i].L - q[i].row0;
        if ((rc = mdl_dcopy(s0, q[i].out, lg + k * V, (size_t)(ni * V) * sizeof(float), DK_D2H))) return rc;
        k += ni;
    }
    return hidden_down(s0, q, n, dX);
}

/* ---------------------------------------------------------------- the MTP head */

strata_status mdl_mtp_step_dev(strata_session *s, const float *hidden, const int32_t *ids, int64_t L, int64_t p0,
                               int64_t row0, float *logits, float *chain, float *e, float *u) {
    const strata_model *m = s->m;
    const mdl_dk *dk = m->dk;
    const mdl_hparams *hp = &m->hp;
    const struct mdl_dense *D = m->dense;
    const int il = hp->n_layer;
    const mdl_layer *l = &m->layers[il];
    const dlayer *dl = &D->layers[il];
    const int64_t E = hp->n_embd, hc = hp->hc, W = hc * E;
    strata_status rc;
    float *dX = NULL, *dh = NULL, *de = NULL, *in2 = NULL, *du = NULL, *dy = NULL, *dc = NULL, *scr = NULL;
    DBUF(s, B_X, float, L * W, dX);
    DBUF(s, B_XH, float, L * W, dh);   /* dhc_read's scratch too: the hidden rows are used first */
    DBUF(s, B_Y, float, L * E, de);
    DBUF(s, B_G, float, L * hc * 2 * E, in2);
    DBUF(s, B_U, float, L * E, du);
    DBUF(s, B_C, float, L * hc, dc);
    DBUF(s, B_A, float, 2 * L, scr);
    /* the fusion input: the tokens' embeddings (dequantized on the host) and the hidden rows up */
    for (int64_t t = 0; t < L; t++)
        m->tok_embd_t->dequant[0](m->tok_embd + (size_t)ids[t] * m->tok_embd_row, e + t * E, E);
    if ((rc = mdl_dcopy(s, de, e, (size_t)(L * E) * sizeof(float), DK_H2D))) return rc;
    if ((rc = mdl_dcopy(s, dh, hidden, (size_t)(L * W) * sizeof(float), DK_H2D))) return rc;
    if ((rc = dk->mtp_norm_concat(de, dh, D->mtp_enorm, D->mtp_hnorm, L, hc, E, hp->eps, scr, in2, NULL))) return rc;
    /* r_s = eh_proj · [ê | ĥ_s]: L*hc rows of E, which is X's [L x hc*E] layout */
    if ((rc = mdl_dmatmul(s, &m->mtp_eh_proj, in2, L * hc, dX))) return rc;
    /* the decoder block, as a trunk QSA layer, on the MTP's own cache from p0 */
    DBUF(s, B_Y, float, L * E, dy);
    if ((rc = dhc_read(s, dX, dl->hc_norm[0], &l->hc_down[0], &l->hc_up[0], &l->hc_inject[0], L, du, dc))) return rc;
    strata_session *ss[1] = {s};
    const int64_t Ls[1] = {L};
    if ((rc = dqsa(ss, Ls, 1, il, &s->ls[il], p0, du, L, dy))) return rc;
    if ((rc = dk->hc_write(dX, dc, dy, L, hc, E, NULL))) return rc;
    if ((rc = dhc_read(s, dX, dl->hc_norm[1], &l->hc_down[1], &l->hc_up[1], &l->hc_inject[1], L, du, dc))) return rc;
    if ((rc = dmoe(s, il, du, L, u, dy))) return rc;
    if ((rc = dk->hc_write(dX, dc, dy, L, hc, E, NULL))) return rc;
    if (row0 >= L) return dk->sync(NULL);
    const int64_t nr = L - row0;
    float *lg = NULL;
    if (logits) {   /* the MTP's own mixer (no inject), then the trunk's LM head */
        DBUF(s, B_LG, float, nr * hp->n_vocab, lg);
        if ((rc = dhc_read(s, dX + row0 * W, D->mtp_head_norm, &m->mtp_head_down, &m->mtp_head_up, NULL, nr, du,
                           NULL)))
            return rc;
        if ((rc = mdl_dmatmul(s, &m->output, du, nr, lg))) return rc;
    }
    /* the copies down after every launch: one wait */
    if (chain && (rc = mdl_dcopy(s, chain, dX + row0 * W, (size_t)(nr * W) * sizeof(float), DK_D2H))) return rc;
    if (logits) return mdl_dcopy(s, logits, lg, (size_t)(nr * hp->n_vocab) * sizeof(float), DK_D2H);
    return chain ? STRATA_OK : dk->sync(NULL);
}

/* ---------------------------------------------------------------- load */

uint64_t mdl_dense_state_bytes(const strata_model *m, int64_t n_tokens) {
    const mdl_hparams *h = &m->hp;
    const int kv = m->params.kv_type;
    const uint64_t es = kv == STRATA_KV_F32 ? 4 : kv == STRATA_KV_F16 ? 2 : 1;
    uint64_t b = 0;
    for (int il = 0; il < h->n_layer + h->n_mtp; il++) {   /* the MTP block's cache is the device's too */
        const mdl_layer *l = &m->layers[il];
        if (l->is_qsa) {
            const uint64_t per = (uint64_t)h->n_head_kv * (uint64_t)h->head_dim;
            b += 2 * (uint64_t)n_tokens * per * es;
            if (kv == STRATA_KV_INT8) b += (uint64_t)n_tokens * (uint64_t)h->n_head_kv * 2 * sizeof(float);
            b += (uint64_t)n_tokens * (uint64_t)h->idx_dim * sizeof(float);
            if (l->ratio > 0) b += (uint64_t)(n_tokens / l->ratio + 1) * (uint64_t)h->idx_dim * sizeof(float);
        } else {
            const uint64_t cd = 2 * (uint64_t)h->ssm_gk * (uint64_t)h->ssm_dk + (uint64_t)h->ssm_gv * (uint64_t)h->ssm_dk;
            b += (uint64_t)(h->ssm_kc - 1) * cd * sizeof(float);
            b += (uint64_t)h->ssm_gv * (uint64_t)h->ssm_dk * (uint64_t)h->ssm_dk * sizeof(float);
        }
    }
    if (h->ple_layer >= 0)   /* the PLE conv history */
        b += (uint64_t)(h->ple_kp - 1) * (uint64_t)h->ple_n * (uint64_t)h->hc * (uint64_t)h->n_embd * sizeof(float);
    return b;
}

/* The work buffers of a step of L rows at n_ctx (an upper bound of what dbuf grows to). */
static uint64_t work_bytes(const strata_model *m, int64_t L) {
    const mdl_hparams *h = &m->hp;
    const uint64_t E = (uint64_t)h->n_embd, W = (uint64_t)h->hc * E, V = (uint64_t)h->n_vocab;
    const uint64_t KD = (uint64_t)h->ssm_gk * (uint64_t)h->ssm_dk, VD = (uint64_t)h->ssm_gv * (uint64_t)h->ssm_dk;
    const uint64_t QD = 2 * (uint64_t)h->n_head * (uint64_t)h->head_dim;
    uint64_t per_row = 3 * W + 3 * E + (uint64_t)h->hc + (uint64_t)h->hc_rank + W;   /* X, xh, g, u, y, c, a, xq */
    uint64_t mixer = 2 * (2 * KD + VD) + 2 * VD + 2 * KD + 2 * (uint64_t)h->ssm_gv;
    const uint64_t qsa = QD + 2 * QD / 2 + 2 * (uint64_t)h->n_head_kv * (uint64_t)h->head_dim +
                         ((uint64_t)h->idx_heads + 1) * (uint64_t)h->idx_dim + (uint64_t)h->n_rot;
    if (qsa > mixer) mixer = qsa;
    per_row += mixer;
    /* the MoE's: router logits, routing and grouping, the experts' rows, the shared expert's */
    const uint64_t K = (uint64_t)h->n_expert_used, Fs = (uint64_t)h->ff_shexp;
    per_row += (uint64_t)h->n_expert + 6 * K + K * E + 3 * Fs + E + 1;   /* slot, row: int64 */
    uint64_t fixed = 0;
    if (h->ple_layer >= 0) {   /* the PLE layer's: packed rows and ids, emb, key, val, gv; ext's history */
        const uint64_t NH = (uint64_t)(h->ple_n - 1) * (uint64_t)h->ple_heads_per;
        per_row += (NH * ((uint64_t)m->ple_table_row + 8) + 3) / 4 + 2 * E + 3 * W;
        fixed += (uint64_t)(h->ple_kp - 1) * (uint64_t)h->ple_n * W * sizeof(float);
    }
    per_row += (uint64_t)(2 * W) / 2;   /* --prefill-f16's halves of the widest product's input (2W values) */
    /* the rows, a few rows of logits (verify windows), the attention's slice, one product's tile */
    return (uint64_t)L * per_row * sizeof(float) + fixed + (uint64_t)GEMV_MAX_ROWS * V * sizeof(float) +
           QSA_SLICE_BYTES + GEMM_TILE_BYTES;
}

static void *up_bytes(struct mdl_dense *D, const void *src, size_t bytes, strata_status *rc) {
    if (*rc) return NULL;
    void *p = D->dk->alloc(bytes);
    if (!p) {
        *rc = strata_fail(STRATA_ERR_NOMEM, "device forward: the %s device has no room for the dense weights "
                          "(%.1f MiB uploaded so far); use --dense cpu or a larger --vram-gib", D->dk->name,
                          (double)D->weight_bytes / (1 << 20));
        return NULL;
    }
    if ((*rc = D->dk->copy(p, src, bytes, DK_H2D, NULL))) {
        D->dk->free(p);
        return NULL;
    }
    D->weight_bytes += bytes;
    return p;
}

static float *up_vec(struct mdl_dense *D, const float *v, size_t n, strata_status *rc) {
    return v ? up_bytes(D, v, n * sizeof(float), rc) : NULL;
}

/* A matrix the device forward multiplies by: its bytes up, and a type the kernels decode (the gemv
 * launcher's own check, asked with an empty product). */
static void up_mat(struct mdl_dense *D, mdl_mat *w, const char *what, int il, strata_status *rc) {
    if (*rc || !w->t) return;
    strata_status ck = D->dk->gemv(NULL, w->t->type, NULL, w->row_bytes, 0, w->cols, NULL, 0, NULL);
    if (ck) {
        *rc = strata_fail(STRATA_ERR_UNSUPPORTED, "device forward: %s of layer %d is %s, which the CUDA kernels do "
                          "not decode; use --dense cpu", what, il, w->t->name);
        return;
    }
    w->dev = up_bytes(D, w->data, (size_t)w->rows * w->row_bytes, rc);
}

static void free_mat(mdl_mat *w, void *arg) {
    const mdl_dk *dk = arg;
    if (w->dev) dk->free(w->dev);
    w->dev = NULL;
}

void mdl_dense_close(strata_model *m) {
    struct mdl_dense *D = m->dense;
    if (!D) return;
    mdl_for_each_mat(m, free_mat, (void *)D->dk);
    for (int il = 0; D->layers && il < m->hp.n_layer + m->hp.n_mtp; il++) {
        dlayer *dl = &D->layers[il];
        float *v[] = {dl->hc_norm[0], dl->hc_norm[1], dl->ssm_conv, dl->ssm_dt_bias, dl->ssm_a, dl->ssm_norm,
                      dl->attn_q_norm, dl->attn_k_norm, dl->idx_q_norm, dl->idx_k_norm, dl->sh_inp_gate,
                      dl->exp_down_scale, dl->ple_norm_key, dl->ple_norm_query, dl->ple_norm_conv, dl->ple_conv};
        for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) D->dk->free(v[i]);
    }
    D->dk->free(D->out_hc_norm);
    D->dk->free(D->mtp_enorm);
    D->dk->free(D->mtp_hnorm);
    D->dk->free(D->mtp_head_norm);
    if (D->blas) D->dk->gemm_destroy(D->blas);
    free(D->layers);
    free(D);
    m->dense = NULL;
    m->dk = NULL;
}

uint64_t mdl_dense_weight_bytes(const strata_model *m) { return m->dense ? m->dense->weight_bytes : 0; }

static double gib(uint64_t b) { return (double)b / (double)(1ull << 30); }

strata_status mdl_dense_open(strata_model *m) {
    strata_model_params *p = &m->params;
    const mdl_hparams *hp = &m->hp;
    m->dk = NULL;
    m->dense = NULL;
    m->device_log[0] = 0;
    const mdl_dk *dk = NULL;
    const char *why = "";
    if (p->dense == STRATA_DENSE_EMU) {
        dk = mdl_dk_emu();
    } else if (p->dense == STRATA_DENSE_DEVICE || (p->dense == STRATA_DENSE_AUTO && p->device == STRATA_DEVICE_CUDA)) {
        dk = mdl_dk_cuda(&why);
        if (!dk)
            return strata_fail(STRATA_ERR_NO_DEVICE, "%s: no GPU to run the dense forward on (%s); use --device cpu "
                               "or sim", p->device == STRATA_DEVICE_CUDA ? "device cuda" : "--dense device", why);
    } else if (p->dense < STRATA_DENSE_AUTO || p->dense > STRATA_DENSE_EMU) {
        return strata_fail(STRATA_ERR_INVALID_ARG, "model: dense %d (0 auto, 1 cpu, 2 device, 3 emu)", (int)p->dense);
    }
    if (!dk) {   /* the C forward: an automatic cache has no device memory to fit into */
        if (p->cache_bytes == STRATA_CACHE_AUTO) p->cache_bytes = 0;
        return STRATA_OK;
    }
    struct mdl_dense *D = calloc(1, sizeof *D);
    if (!D) return strata_fail(STRATA_ERR_NOMEM, "device forward: no memory");
    D->dk = dk;
    m->dense = D;
    m->dk = dk;
    strata_status rc = STRATA_OK;
    uint64_t free_b = 0, total_b = 0;
    if ((rc = dk->mem_info(&free_b, &total_b))) goto fail;
    if ((rc = dk->gemm_create(&D->blas))) goto fail;
    D->f16 = p->prefill_f16 && D->blas;
    D->layers = calloc((size_t)(hp->n_layer + hp->n_mtp), sizeof *D->layers);
    if (!D->layers) { rc = strata_fail(STRATA_ERR_NOMEM, "device forward: no memory"); goto fail; }
    const int64_t E = hp->n_embd, W = (int64_t)hp->hc * E, Kc = hp->ssm_kc, dv = hp->ssm_dk;
    const int64_t CD = 2 * (int64_t)hp->ssm_gk * hp->ssm_dk + (int64_t)hp->ssm_gv * dv;
    for (int il = 0; il < hp->n_layer + hp->n_mtp && !rc; il++) {
        mdl_layer *l = &m->layers[il];
        dlayer *dl = &D->layers[il];
        for (int k = 0; k < 2; k++) {
            dl->hc_norm[k] = up_vec(D, l->hc_norm[k], (size_t)W, &rc);
            up_mat(D, &l->hc_down[k], "hc_down", il, &rc);
            up_mat(D, &l->hc_up[k], "hc_up", il, &rc);
            up_mat(D, &l->hc_inject[k], "hc_inject", il, &rc);
        }
        if (l->is_qsa) {
            up_mat(D, &l->attn_q, "attn_q", il, &rc);
            up_mat(D, &l->attn_k, "attn_k", il, &rc);
            up_mat(D, &l->attn_v, "attn_v", il, &rc);
            up_mat(D, &l->attn_o, "attn_output", il, &rc);
            up_mat(D, &l->idx_q, "indexer q", il, &rc);
            up_mat(D, &l->idx_k, "indexer k", il, &rc);
            dl->attn_q_norm = up_vec(D, l->attn_q_norm, (size_t)hp->head_dim, &rc);
            dl->attn_k_norm = up_vec(D, l->attn_k_norm, (size_t)hp->head_dim, &rc);
            dl->idx_q_norm = up_vec(D, l->idx_q_norm, (size_t)hp->idx_dim, &rc);
            dl->idx_k_norm = up_vec(D, l->idx_k_norm, (size_t)hp->idx_dim, &rc);
        } else {
            up_mat(D, &l->ssm_qkv, "ssm_qkv", il, &rc);
            up_mat(D, &l->ssm_z, "ssm_z", il, &rc);
            up_mat(D, &l->ssm_beta, "ssm_beta", il, &rc);
            up_mat(D, &l->ssm_alpha, "ssm_alpha", il, &rc);
            up_mat(D, &l->ssm_out, "ssm_out", il, &rc);
            dl->ssm_conv = up_vec(D, l->ssm_conv, (size_t)(CD * Kc), &rc);
            dl->ssm_dt_bias = up_vec(D, l->ssm_dt_bias, (size_t)hp->ssm_gv, &rc);
            dl->ssm_a = up_vec(D, l->ssm_a, (size_t)hp->ssm_gv, &rc);
            dl->ssm_norm = up_vec(D, l->ssm_norm, (size_t)dv, &rc);
        }
        /* the MoE's router, shared expert and merge run on the device (the routed experts on the offload
         * engine's devices) */
        up_mat(D, &l->router, "ffn_gate_inp", il, &rc);
        up_mat(D, &l->sh_gate, "ffn_gate_shexp", il, &rc);
        up_mat(D, &l->sh_up, "ffn_up_shexp", il, &rc);
        up_mat(D, &l->sh_down, "ffn_down_shexp", il, &rc);
        dl->sh_inp_gate = up_vec(D, l->sh_inp_gate, (size_t)E, &rc);
        if (l->exp_down.scale) {
            float *sd = malloc((size_t)hp->n_expert * sizeof *sd);
            if (!sd) { rc = strata_fail(STRATA_ERR_NOMEM, "device forward: no memory"); break; }
            for (int64_t e = 0; e < hp->n_expert; e++) sd[e] = mdl_mat_scale(&l->exp_down, e);
            dl->exp_down_scale = up_vec(D, sd, (size_t)hp->n_expert, &rc);
            free(sd);
        }
        if (l->has_ple) {
            up_mat(D, &l->ple_key, "ple key", il, &rc);
            up_mat(D, &l->ple_value, "ple value", il, &rc);
            dl->ple_norm_key = up_vec(D, l->ple_norm_key, (size_t)W, &rc);
            dl->ple_norm_query = up_vec(D, l->ple_norm_query, (size_t)W, &rc);
            dl->ple_norm_conv = up_vec(D, l->ple_norm_conv, (size_t)W, &rc);
            dl->ple_conv = up_vec(D, l->ple_conv, (size_t)(W * hp->ple_kp), &rc);
        }
    }
    D->out_hc_norm = up_vec(D, m->out_hc_norm, (size_t)W, &rc);
    up_mat(D, &m->out_hc_down, "output hc_down", -1, &rc);
    up_mat(D, &m->out_hc_up, "output hc_up", -1, &rc);
    up_mat(D, &m->output, "output", -1, &rc);
    if (hp->n_mtp) {
        D->mtp_enorm = up_vec(D, m->mtp_enorm, (size_t)E, &rc);
        D->mtp_hnorm = up_vec(D, m->mtp_hnorm, (size_t)W, &rc);
        D->mtp_head_norm = up_vec(D, m->mtp_head_norm, (size_t)W, &rc);
        up_mat(D, &m->mtp_eh_proj, "MTP eh_proj", hp->n_layer, &rc);
        up_mat(D, &m->mtp_head_down, "MTP hc_head down", hp->n_layer, &rc);
        up_mat(D, &m->mtp_head_up, "MTP hc_head up", hp->n_layer, &rc);
    }
    if (rc) goto fail;
    {
        /* the plan: the cap (--vram-gib, else what is free), less weights, one session's state at n_ctx,
         * the work buffers of a full step and a margin; the rest may hold experts */
        const uint64_t cap = p->vram_bytes && p->vram_bytes < free_b ? p->vram_bytes : free_b;
        const uint64_t state = mdl_dense_state_bytes(m, p->n_ctx), work = work_bytes(m, p->n_ubatch);
        const uint64_t margin = (256ull << 20) + total_b / 50;
        const uint64_t used = D->weight_bytes + state + work + margin;
        const uint64_t left = cap > used ? cap - used : 0;
        const int auto_fit = p->cache_bytes == STRATA_CACHE_AUTO;
        if (p->vram_bytes && p->vram_bytes < D->weight_bytes + state + work) {
            rc = strata_fail(STRATA_ERR_INVALID_ARG, "--vram-gib %.2f: the dense weights (%.2f GiB), one session's "
                             "state at n_ctx %lld (%.2f GiB) and the work buffers (%.2f GiB) need %.2f GiB; give at "
                             "least that, or lower n_ctx", gib(p->vram_bytes), gib(D->weight_bytes), (long long)p->n_ctx,
                             gib(state), gib(work), gib(D->weight_bytes + state + work));
            goto fail;
        }
        const int experts_there = p->device == STRATA_DEVICE_CUDA || (p->device == STRATA_DEVICE_SIM && dk == mdl_dk_emu());
        /* the expert device computes in this device's memory: its groups may read and write the forward's */
        m->expert_dev_io = (p->device == STRATA_DEVICE_CUDA && dk != mdl_dk_emu()) ||
                           (p->device == STRATA_DEVICE_SIM && dk == mdl_dk_emu());
        if (auto_fit) p->cache_bytes = experts_there ? left : 0;
        else if (p->device == STRATA_DEVICE_CUDA && p->cache_bytes > left) {
            rc = strata_fail(STRATA_ERR_INVALID_ARG, "--cache-gib %.2f does not fit: %.2f GiB of the %s device's "
                             "%.2f GiB is left after dense weights, state, work buffers and margin; give at most "
                             "that or leave --cache-gib unset to fit it", gib(p->cache_bytes), gib(left), dk->name,
                             gib(cap));
            goto fail;
        }
        snprintf(m->device_log, sizeof m->device_log,
                 "dense forward on %s: %.2f GiB free of %.2f%s; dense weights %.3f GiB, state %.3f GiB (one session "
                 "at n_ctx %lld), work %.3f GiB, margin %.3f GiB; expert cache %.3f GiB (%s); prefill products: %s",
                 dk->name, gib(free_b), gib(total_b), p->vram_bytes ? " (capped by --vram-gib)" : "",
                 gib(D->weight_bytes), gib(state), (long long)p->n_ctx, gib(work), gib(margin), gib(p->cache_bytes),
                 !experts_there ? "none: the experts run on the CPU pool" : auto_fit ? "fitted: what is left" : "asked",
                 D->f16 ? "cuBLAS on f16 tiles (--prefill-f16)"
                 : p->prefill_f16 ? "the batch-invariant kernel (--prefill-f16 asked, but this build has no cuBLAS)"
                                  : "the batch-invariant kernel");
    }
    return STRATA_OK;
fail:
    mdl_dense_close(m);
    return rc;
}
