/*
 * qsa.c — QSA indexed attention, the `indexed_attention` mixer (spec §8).
 *
 * Main path: q (per head [q | gate] in q_proj) and k are N1-normalised per head and roped on
 * their first n_rot dims; K (after norm + rope) and V go to the session's cache in kv_type.
 * Indexer: per token nI query heads (N1 + rope) and one raw key (no norm, no rope) cached as is.
 * A block of r consecutive keys (aligned to position 0) is summarised once, when it completes:
 * K̂_b = rope_{b·r}(N1(mean of its r raw keys)), kept in the session (the reference recomputes
 * it every step and gets the same values).
 *
 * Selection for a query at position P (n = P + 1 visible keys, nb = n / r complete blocks):
 * if nb ≤ budget / r every key is kept (dense causal attention); otherwise the budget/r blocks
 * with the largest score_b = Σ_h relu(qI_h · K̂_b) / sqrt(dI) — ties broken by the lower block
 * index (transformers' torch.topk leaves tie order undefined) — plus the incomplete tail block
 * [nb·r, n), which is always kept. A query may therefore not attend to itself (spec §8.2).
 * Then softmax(q·k / sqrt(hd)) over the kept keys, o ⊙ σ(gate), W_o.
 *
 * Pool tasks: pass 1, one query each (selection, shared by all heads); pass 2, one (query,
 * head) pair each.
 *
 * The mdl_qsa_* functions below the job (not in model.h) are the ops the CUDA kernels
 * (kernels/cuda/qsa.cuh) are checked against, one by one (tests/native/test_cuda_ops_qsa.c).
 */
#include "model.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

typedef struct {
    const strata_model *m;
    const mdl_layer *l;
    mdl_layer_state *st;
    int64_t p0, L;
    const float *q;        /* L x H x hd, normed + roped */
    const float *iq;       /* L x nI x dI, normed + roped */
    int32_t *sel;          /* L x sel_cap key indices */
    int32_t *n_sel;        /* L: count, or -1 = dense (all keys 0..P) */
    int64_t sel_cap;
    float *o;              /* L x H x hd */
    float *scratch;        /* per thread: n_threads x scratch_w */
    const strata_qtraits *f16;  /* F16 rows -> floats (the KV cache in f16) */
    int64_t scratch_w;
    int kv_type;
} qsa_job;

typedef struct { float s; int32_t b; } blk_score;

/* a ranks before b: higher score, then lower block index */
static int better(blk_score a, blk_score b) { return a.s > b.s || (a.s == b.s && a.b < b.b); }

/* score_b of one block for one query: Σ_h relu(qI_h · K̂_b) / sqrt(dI), each dot in dim order. */
float mdl_qsa_block_score(const float *qi, const float *kb, int64_t nI, int64_t dI) {
    const float inv = 1.0f / sqrtf((float)dI);
    float sc = 0.0f;
    for (int64_t h = 0; h < nI; h++) {
        const float *qh = qi + h * dI;
        float d = 0.0f;
        for (int64_t e = 0; e < dI; e++) d += qh[e] * kb[e];
        sc += d > 0.0f ? d : 0.0f;
    }
    return sc * inv;
}

/* min-heap on "worst at the root" */
static void sift_down(blk_score *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t w = i, l = 2 * i + 1, r = l + 1;
        if (l < n && better(h[w], h[l])) w = l;
        if (r < n && better(h[w], h[r])) w = r;
        if (w == i) return;
        blk_score t = h[i]; h[i] = h[w]; h[w] = t;
        i = w;
    }
}

/* The kept keys of a query that sees n keys (nb = n / r > topk complete blocks of r, scored in
 * score[nb]): the topk best blocks (better()) in heap order, each as its r keys, then the tail
 * [nb·r, n). heap: room for topk blk_score. Returns the count. */
int64_t mdl_qsa_select(const float *score, int64_t nb, int64_t topk, int64_t r, int64_t n, void *heap_mem,
                       int32_t *sel) {
    blk_score *heap = heap_mem;
    int64_t hn = 0;
    for (int64_t b = 0; b < nb; b++) {
        blk_score x = {score[b], (int32_t)b};
        if (hn < topk) {
            /* insert, sift up */
            int64_t i = hn++;
            heap[i] = x;
            while (i > 0) {
                int64_t p = (i - 1) / 2;
                if (!better(heap[p], heap[i])) break;
                blk_score tmp = heap[p]; heap[p] = heap[i]; heap[i] = tmp;
                i = p;
            }
        } else if (topk > 0 && better(x, heap[0])) {   /* topk 0: the heap is empty */
            heap[0] = x;
            sift_down(heap, hn, 0);
        }
    }
    int64_t k = 0;
    for (int64_t i = 0; i < hn; i++)
        for (int64_t j = 0; j < r; j++) sel[k++] = (int32_t)(heap[i].b * r + j);
    for (int64_t j = nb * r; j < n; j++) sel[k++] = (int32_t)j;
    return k;
}

/* Scratch of a selection: the heap (2 (sel_cap + 8) floats), then the nb scores. */
static void select_task(void *arg, int64_t t, int thread) {
    const qsa_job *J = arg;
    const mdl_hparams *hp = &J->m->hp;
    const int64_t r = J->l->ratio, P = J->p0 + t, n = P + 1;
    const int64_t topk = r > 0 ? hp->idx_budget / r : 0;
    const int64_t nb = r > 0 ? n / r : 0;
    if (r == 0 || nb <= topk) { J->n_sel[t] = -1; return; }
    const int64_t nI = hp->idx_heads, dI = hp->idx_dim;
    float *heap = J->scratch + (int64_t)thread * J->scratch_w, *score = heap + 2 * (J->sel_cap + 8);
    const float *qi = J->iq + t * nI * dI;
    for (int64_t b = 0; b < nb; b++) score[b] = mdl_qsa_block_score(qi, J->st->blk + b * dI, nI, dI);
    J->n_sel[t] = (int32_t)mdl_qsa_select(score, nb, topk, r, n, heap, J->sel + t * J->sel_cap);
}

static void load_row(const strata_model *m, const mdl_layer_state *st, int kv_type, const strata_qtraits *f16,
                     const void *base, int64_t pos, int64_t kvh, int which, float *out) {
    const mdl_hparams *hp = &m->hp;
    const int64_t hd = hp->head_dim, off = (pos * hp->n_head_kv + kvh) * hd;
    if (kv_type == STRATA_KV_F32) {
        memcpy(out, (const float *)base + off, (size_t)hd * sizeof(float));
    } else if (kv_type == STRATA_KV_F16) {
        f16->dequant[m->isa]((const uint16_t *)base + off, out, hd);   /* F16C on the AVX2 path */
    } else {
        const int8_t *p = (const int8_t *)base + off;
        const float d = st->kv_scale[(pos * hp->n_head_kv + kvh) * 2 + which];
        for (int64_t e = 0; e < hd; e++) out[e] = d * (float)p[e];
    }
}

/* One query (at position P, ns kept keys sel[] or ns < 0: all P + 1) and one KV head: the group's
 * query heads q (grp x hd) share every K and V row, so each row is read (and converted from
 * f16/int8) once for all of them. w: grp x n scores, then a row; o: the group's outputs (grp x hd). */
void mdl_qsa_attn_group(const strata_model *m, const mdl_layer_state *st, int kv_type, const strata_qtraits *f16,
                        const float *q, int64_t P, const int32_t *sel, int32_t ns, int64_t kvh, float *w, float *o) {
    const mdl_hparams *hp = &m->hp;
    const int64_t H = hp->n_head, Hkv = hp->n_head_kv, hd = hp->head_dim, grp = H / Hkv;
    const int64_t n = ns < 0 ? P + 1 : ns;
    float *row = w + grp * n;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int64_t i = 0; i < n; i++) {
        load_row(m, st, kv_type, f16, st->k, ns < 0 ? i : sel[i], kvh, 0, row);
        for (int64_t g = 0; g < grp; g++) w[g * n + i] = mdl_dot8(q + g * hd, row, hd) * scale;
    }
    float inv[256];
    for (int64_t g = 0; g < grp; g++) {
        float *wg = w + g * n;
        float mx = -FLT_MAX;
        for (int64_t i = 0; i < n; i++) if (wg[i] > mx) mx = wg[i];
        double sum = 0.0;
        for (int64_t i = 0; i < n; i++) wg[i] = ops_exp(wg[i] - mx);
        for (int64_t i = 0; i < n; i++) sum += wg[i];
        inv[g] = (float)(1.0 / sum);
        for (int64_t e = 0; e < hd; e++) o[g * hd + e] = 0.0f;
    }
    for (int64_t i = 0; i < n; i++) {
        load_row(m, st, kv_type, f16, st->v, ns < 0 ? i : sel[i], kvh, 1, row);
        for (int64_t g = 0; g < grp; g++) {
            const float p = w[g * n + i] * inv[g];
            float *og = o + g * hd;
            for (int64_t e = 0; e < hd; e++) og[e] += p * row[e];
        }
    }
}

static void attn_task(void *arg, int64_t task, int thread) {
    const qsa_job *J = arg;
    const mdl_hparams *hp = &J->m->hp;
    const int64_t H = hp->n_head, Hkv = hp->n_head_kv, hd = hp->head_dim, grp = H / Hkv;
    const int64_t t = task / Hkv, kvh = task % Hkv;
    const int64_t q0 = (t * H + kvh * grp) * hd;
    mdl_qsa_attn_group(J->m, J->st, J->kv_type, J->f16, J->q + q0, J->p0 + t, J->sel + t * J->sel_cap, J->n_sel[t],
                       kvh, J->scratch + (int64_t)thread * J->scratch_w, J->o + q0);
}

/* Row (pos, kvh) of the K (which 0) or V (which 1) cache at base, from x (hd values), in the session's
 * kv_type: f32, f16 (round to nearest even), or int8 codes with the row's scale in kv_scale. */
void mdl_qsa_store_row(const strata_session *s, mdl_layer_state *st, void *base, int64_t pos, int64_t kvh, int which,
                       const float *x) {
    const mdl_hparams *hp = &s->m->hp;
    const int64_t hd = hp->head_dim, off = (pos * hp->n_head_kv + kvh) * hd;
    const int kv = s->m->params.kv_type;
    if (kv == STRATA_KV_F32) {
        memcpy((float *)base + off, x, (size_t)hd * sizeof(float));
    } else if (kv == STRATA_KV_F16) {
        uint16_t *p = (uint16_t *)base + off;
        for (int64_t e = 0; e < hd; e++) p[e] = strata_fp32_to_fp16(x[e]);
    } else {
        float amax = 0.0f;
        for (int64_t e = 0; e < hd; e++) amax = fmaxf(amax, fabsf(x[e]));
        float id;
        const float d = strata_act_scale(amax, &id);
        int8_t *p = (int8_t *)base + off;
        for (int64_t e = 0; e < hd; e++) p[e] = (int8_t)lrintf(x[e] * id);
        st->kv_scale[(pos * hp->n_head_kv + kvh) * 2 + which] = d;
    }
}

/* tmp[dI] = the mean of block b's r raw indexer keys (idx_k rows b·r ..), summed in key order. */
void mdl_qsa_blk_pool(const float *idx_k, int64_t b, int64_t r, int64_t dI, float *tmp) {
    for (int64_t e = 0; e < dI; e++) {
        float acc = 0.0f;
        for (int64_t j = 0; j < r; j++) acc += idx_k[(b * r + j) * dI + e];
        tmp[e] = acc / (float)r;
    }
}

/* kb[dI] = K̂_b = rope_{b·r}(N1(mean of block b's raw keys; norm_w)); tmp[dI], bc, bs[n_rot / 2] scratch. */
void mdl_qsa_blk_summary(const mdl_hparams *hp, const float *norm_w, int64_t r, const float *idx_k, int64_t b,
                         float *tmp, float *bc, float *bs, float *kb) {
    const int64_t dI = hp->idx_dim;
    mdl_qsa_blk_pool(idx_k, b, r, dI, tmp);
    mdl_rmsnorm(tmp, norm_w, dI, hp->eps, kb);
    mdl_rope_angles(hp->rope_theta, hp->n_rot, b * r, bc, bs);
    mdl_rope(kb, hp->n_rot, bc, bs);
}

/* The layer between its projections and W_o for one sequence's L rows at positions p0..: qg (L x 2H hd:
 * per head [q | gate]), kk, vv (L x Hkv hd), iq (L x nI dI, normalised and roped here in place), ik
 * (L x dI) are the rows' projections; o receives the gated head outputs (L x H hd). Writes the rows'
 * K/V, indexer keys and the block summaries they complete into st. */
typedef struct {
    qsa_job J;
    float *q, *cs, *scratch, *tmp;
    int32_t *sel, *n_sel;
    const float *qg;
    /* qsa_prep's arguments and result, for the pool task that runs it (qsa_seq_task) */
    struct {
        strata_session *s;
        mdl_layer_state *st;
        int64_t p0, L;
        const float *qg, *kk, *vv, *ik;
        float *iq, *o;
        strata_status rc;
    } a;
} qsa_seq;

static void qsa_seq_free(qsa_seq *g) {
    free(g->q); free(g->cs); free(g->sel); free(g->n_sel); free(g->scratch); free(g->tmp);
    g->q = g->cs = g->scratch = g->tmp = NULL;
    g->sel = g->n_sel = NULL;
}

static strata_status qsa_prep(strata_session *s, int il, mdl_layer_state *st, int64_t p0, int64_t L, const float *qg,
                              const float *kk, const float *vv, float *iq, const float *ik, float *o, qsa_seq *g) {
    const strata_model *m = s->m;
    const mdl_hparams *hp = &m->hp;
    const mdl_layer *l = &m->layers[il];
    const int64_t H = hp->n_head, Hkv = hp->n_head_kv, hd = hp->head_dim, nI = hp->idx_heads, dI = hp->idx_dim;
    const int64_t r = l->ratio, half = hp->n_rot / 2;
    /* rows from p0 on are (re)written here: a block summary that covers any of them is stale (the
     * MTP head rewrites its rows every draft round; the trunk's n_blk never exceeds p0 / r) */
    if (r > 0 && st->n_blk > p0 / r) st->n_blk = p0 / r;
    /* a query keeps at most budget + r - 1 keys and never more than it can see (p0 + L): the
     * second bound keeps a file's huge budget from sizing the buffers */
    int64_t sel_cap = r > 0 ? (int64_t)hp->idx_budget + r : 1;
    if (sel_cap > p0 + L) sel_cap = p0 + L;
    const int nt = strata_pool_n_threads(m->pool);
    const int64_t n_max = p0 + L;
    const int64_t grp = H / Hkv;   /* at most 256 (qsa_rows) */
    int64_t scratch_w = grp * n_max + hd;               /* attention: scores of the group + a row */
    const int64_t sel_w = 2 * (sel_cap + 8) + (r > 0 ? n_max / r : 0);  /* selection: the block heap, the scores */
    if (scratch_w < sel_w) scratch_w = sel_w;
    float *q = g->q = malloc((size_t)(L * H * hd) * sizeof(float));
    float *cs = g->cs = malloc((size_t)(L * half * 2 + 2 * half) * sizeof(float));
    int32_t *sel = g->sel = malloc((size_t)(L * sel_cap) * sizeof(int32_t));
    int32_t *n_sel = g->n_sel = malloc((size_t)L * sizeof(int32_t));
    float *scratch = g->scratch = malloc((size_t)(nt * scratch_w) * sizeof(float));
    float *tmp = g->tmp = malloc((size_t)(dI > hd ? dI : hd) * sizeof(float));
    g->qg = qg;
    if (!q || !cs || !sel || !n_sel || !scratch || !tmp) {
        qsa_seq_free(g);
        return strata_fail(STRATA_ERR_NOMEM, "attention layer %d: no memory for %lld tokens", il, (long long)L);
    }
    for (int64_t t = 0; t < L; t++) {
        float *c = cs + t * 2 * half, *sn = c + half;
        mdl_rope_angles(hp->rope_theta, hp->n_rot, p0 + t, c, sn);
        for (int64_t h = 0; h < H; h++) {
            float *qh = q + (t * H + h) * hd;
            mdl_rmsnorm(qg + t * 2 * H * hd + h * 2 * hd, l->attn_q_norm, hd, hp->eps, qh);
            mdl_rope(qh, hp->n_rot, c, sn);
        }
        for (int64_t h = 0; h < Hkv; h++) {
            mdl_rmsnorm(kk + (t * Hkv + h) * hd, l->attn_k_norm, hd, hp->eps, tmp);
            mdl_rope(tmp, hp->n_rot, c, sn);
            mdl_qsa_store_row(s, st, st->k, p0 + t, h, 0, tmp);
            mdl_qsa_store_row(s, st, st->v, p0 + t, h, 1, vv + (t * Hkv + h) * hd);
        }
        for (int64_t h = 0; h < nI; h++) {
            float *qh = iq + (t * nI + h) * dI;
            mdl_rmsnorm(qh, l->idx_q_norm, dI, hp->eps, qh);
            mdl_rope(qh, hp->n_rot, c, sn);
        }
        memcpy(st->idx_k + (p0 + t) * dI, ik + t * dI, (size_t)dI * sizeof(float));
    }
    /* block summaries of the blocks completed by these tokens */
    if (r > 0) {
        float *bc = cs + L * half * 2, *bs = bc + half;
        while ((st->n_blk + 1) * r <= p0 + L) {
            const int64_t b = st->n_blk;
            mdl_qsa_blk_summary(hp, l->idx_k_norm, r, st->idx_k, b, tmp, bc, bs, st->blk + b * dI);
            st->n_blk++;
        }
    }
    g->J = (qsa_job){.m = m, .l = l, .st = st, .p0 = p0, .L = L, .q = q, .iq = iq, .sel = sel, .n_sel = n_sel,
                     .sel_cap = sel_cap, .o = o, .scratch = scratch, .scratch_w = scratch_w,
                     .kv_type = m->params.kv_type, .f16 = strata_qtraits_get(GT_F16)};
    return STRATA_OK;
}

/* The output gate of one head: oh[e] *= σ(gh[e]). */
void mdl_qsa_gate(float *oh, const float *gh, int64_t hd) {
    for (int64_t e = 0; e < hd; e++) oh[e] *= ops_sigmoid(gh[e]);
}

/* After the selection and attention ran: the output gate σ(gate) per head. */
static void qsa_post(const qsa_seq *g) {
    const mdl_hparams *hp = &g->J.m->hp;
    const int64_t H = hp->n_head, hd = hp->head_dim, L = g->J.L;
    for (int64_t t = 0; t < L; t++)
        for (int64_t h = 0; h < H; h++)
            mdl_qsa_gate(g->J.o + (t * H + h) * hd, g->qg + t * 2 * H * hd + h * 2 * hd + hd, hd);
}

/* qsa_prep of sequence i (only its own state and rows are touched, so the sequences of a step run
 * side by side: serially they were 20 us of an 8-sequence QSA layer on flash-small, the other thread
 * idle). */
typedef struct {
    qsa_seq *G;
    int il;
} qsa_seqs;

static void qsa_seq_task(void *arg, int64_t i, int thread) {
    (void)thread;
    const qsa_seqs *A = arg;
    qsa_seq *g = &A->G[i];
    g->a.rc = qsa_prep(g->a.s, A->il, g->a.st, g->a.p0, g->a.L, g->a.qg, g->a.kk, g->a.vv, g->a.iq, g->a.ik, g->a.o, g);
}

/* The projections of R rows, each one product over all of them, then per sequence i (st[i], p0[i], Ls[i]
 * rows, consecutive) the core, then W_o over all rows. */
static strata_status qsa_rows(strata_session *const *ss, mdl_layer_state *const *st, const int64_t *p0,
                              const int64_t *Ls, int n, int il, const float *u, int64_t R, float *y) {
    const strata_model *m = ss[0]->m;
    const mdl_hparams *hp = &m->hp;
    const mdl_layer *l = &m->layers[il];
    const int64_t H = hp->n_head, Hkv = hp->n_head_kv, hd = hp->head_dim, nI = hp->idx_heads, dI = hp->idx_dim;
    float *qg = malloc((size_t)(R * 2 * H * hd) * sizeof(float));
    float *kv = malloc((size_t)(R * 2 * Hkv * hd) * sizeof(float));
    float *iqk = malloc((size_t)(R * (nI + 1) * dI) * sizeof(float));
    float *o = malloc((size_t)(R * H * hd) * sizeof(float));
    qsa_seq *G = calloc((size_t)n, sizeof *G);
    void **args = malloc((size_t)n * sizeof *args);
    int64_t *counts = malloc((size_t)n * sizeof *counts);
    strata_status rc = STRATA_OK;
    if (!qg || !kv || !iqk || !o || !G || !args || !counts) {
        rc = strata_fail(STRATA_ERR_NOMEM, "attention layer %d: no memory for %lld tokens", il, (long long)R);
        goto done;
    }
    if (H / Hkv > 256) {
        rc = strata_fail(STRATA_ERR_UNSUPPORTED, "attention layer %d: %lld query heads per KV head (at most 256)", il,
                         (long long)(H / Hkv));
        goto done;
    }
    float *kk = kv, *vv = kv + R * Hkv * hd, *iq = iqk, *ik = iqk + R * nI * dI;
    {
        const mdl_mat *ws[] = {&l->attn_q, &l->attn_k, &l->attn_v, &l->idx_q, &l->idx_k};
        float *const ys[] = {qg, kk, vv, iq, ik};
        if ((rc = mdl_matmul_set(m, ws, 5, u, R, ys))) goto done;
    }
    /* every sequence's norms, RoPE and cache writes, then all their selections in one pool job and all
     * their attention in another, then the gates */
    int64_t r0 = 0;
    for (int i = 0; i < n; i++) {
        G[i].a.s = ss[i];
        G[i].a.st = st[i];
        G[i].a.p0 = p0[i];
        G[i].a.L = Ls[i];
        G[i].a.qg = qg + r0 * 2 * H * hd;
        G[i].a.kk = kk + r0 * Hkv * hd;
        G[i].a.vv = vv + r0 * Hkv * hd;
        G[i].a.iq = iq + r0 * nI * dI;
        G[i].a.ik = ik + r0 * dI;
        G[i].a.o = o + r0 * H * hd;
        args[i] = &G[i].J;
        r0 += Ls[i];
    }
    {
        qsa_seqs A = {.G = G, .il = il};
        if (n == 1) qsa_seq_task(&A, 0, 0);
        else strata_pool_run(m->pool, qsa_seq_task, &A, n);
    }
    /* a failed prep freed its own buffers (the rest are freed below); its message was written on the
     * thread that ran it, so it is written again here */
    for (int i = 0; i < n && !rc; i++)
        if (G[i].a.rc)
            rc = n == 1 ? G[i].a.rc
                        : strata_fail(G[i].a.rc, "attention layer %d: no memory for %lld tokens", il, (long long)Ls[i]);
    if (!rc) {
        for (int i = 0; i < n; i++) counts[i] = Ls[i];
        rc = mdl_pool_run_multi(m->pool, select_task, args, counts, n);
    }
    if (!rc) {
        for (int i = 0; i < n; i++) counts[i] = Ls[i] * Hkv;
        rc = mdl_pool_run_multi(m->pool, attn_task, args, counts, n);
    }
    for (int i = 0; i < n && !rc; i++) qsa_post(&G[i]);
    if (!rc) rc = mdl_matmul(m, &l->attn_o, 0, o, R, y);
    for (int i = 0; i < n; i++) qsa_seq_free(&G[i]);
done:
    free(qg); free(kv); free(iqk); free(o); free(G); free(args); free(counts);
    return rc;
}

strata_status mdl_qsa_multi(strata_session *const *ss, const int64_t *Ls, int n, int il, const float *u, int64_t R,
                            float *y) {
    mdl_layer_state **st = malloc((size_t)n * sizeof *st);
    int64_t *p0 = malloc((size_t)n * sizeof *p0);
    strata_status rc;
    if (!st || !p0) {
        rc = strata_fail(STRATA_ERR_NOMEM, "attention layer %d: no memory", il);
    } else {
        for (int i = 0; i < n; i++) { st[i] = &ss[i]->ls[il]; p0[i] = ss[i]->n_past; }
        rc = qsa_rows(ss, st, p0, Ls, n, il, u, R, y);
    }
    free(st);
    free(p0);
    return rc;
}

strata_status mdl_qsa(strata_session *s, int il, const float *u, int64_t L, float *y) {
    return mdl_qsa_multi(&s, &L, 1, il, u, L, y);
}

strata_status mdl_qsa_at(strata_session *s, int il, mdl_layer_state *st, int64_t p0, const float *u, int64_t L,
                         float *y) {
    return qsa_rows(&s, &st, &p0, &L, 1, il, u, L, y);
}
