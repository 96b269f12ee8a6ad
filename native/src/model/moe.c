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

#include <pthread.h>
#include <stdio.h>
#include <time.h>

#include "kernels/cpu/gemm.h"
#include "moe/offload.h"
#include "util/trace.h"
#include "util/carve.h"
#include "util/error.h"

static strata_mm_item item(const mdl_mat *w, int64_t e, const float *x, int64_t n, float *y) {
    strata_mm_item it = {.t = w->t, .w = w->data + (size_t)e * w->mat_bytes, .rows = w->rows, .cols = w->cols,
                         .x = x, .n = n, .y = y};
    return it;
}

/* An item whose x rows are the gathered copies of rows src_rows[..n] of src: the matmul quantizes
 * each token's row once for every expert it went to, not once per copy. */
static strata_mm_item item_of(const mdl_mat *w, int64_t e, const float *x, const float *src, const int64_t *src_rows,
                              int64_t n, float *y) {
    strata_mm_item it = item(w, e, x, n, y);
    it.x_src = src;
    it.x_src_rows = src_rows;
    return it;
}

/* One JSON line per (window, layer) for --trace-routing (format: pyrunner/cachesim.py): the
 * experts each token picked in rank order with their weights, and for the offload path which
 * groups were device-resident and which were skipped. */
static void trace_routing(strata_model *m, int il, int64_t L, int64_t K, const int32_t *pick, const float *pw,
                          int64_t Ne, const int8_t *kind) {
    pthread_mutex_lock(&m->trace_mu);
    if (il == 0) m->trace_window++;
    FILE *f = m->trace;
    fprintf(f, "{\"window\": %llu, \"layer\": %d, \"tokens\": [", (unsigned long long)m->trace_window - 1, il);
    for (int64_t t = 0; t < L; t++) {
        fputs(t ? ", [" : "[", f);
        for (int64_t k = 0; k < K; k++) fprintf(f, k ? ", %d" : "%d", pick[t * K + k]);
        fputc(']', f);
    }
    fputs("], \"weights\": [", f);
    for (int64_t t = 0; t < L; t++) {
        fputs(t ? ", [" : "[", f);
        for (int64_t k = 0; k < K; k++) fprintf(f, k ? ", %.6g" : "%.6g", (double)pw[t * K + k]);
        fputc(']', f);
    }
    fputc(']', f);
    if (kind) {
        const char *names[2] = {"resident", "skipped"};
        const int8_t want[2] = {OFF_DEVICE, OFF_SKIP};
        for (int w = 0; w < 2; w++) {
            fprintf(f, ", \"%s\": [", names[w]);
            int first = 1;
            for (int64_t e = 0; e < Ne; e++)
                if (kind[e] == want[w]) { fprintf(f, first ? "%lld" : ", %lld", (long long)e); first = 0; }
            fputc(']', f);
        }
    }
    fputs("}\n", f);
    pthread_mutex_unlock(&m->trace_mu);
}

/* The K largest of v[0..n) by insertion (K is small): larger first, lower index on ties. */
static void top_k(const float *v, int64_t n, int64_t K, int32_t *idx, float *val) {
    int64_t c = 0;
    for (int64_t e = 0; e < n; e++) {
        const float p = v[e];
        if (c == K && !(p > val[K - 1])) continue;
        int64_t i = c < K ? c++ : K - 1;
        while (i > 0 && p > val[i - 1]) { val[i] = val[i - 1]; idx[i] = idx[i - 1]; i--; }
        val[i] = p;
        idx[i] = (int32_t)e;
    }
}

/* Expert store prefetch: the next layer's router applied to this layer's MoE input u (L rows), the `ranks`
 * best of every token (at most K), best ranks of all tokens first, read ahead (xs_prefetch). `scores` holds
 * L x Ne floats. */
static void store_prefetch(strata_model *m, int il, const float *u, int64_t L, float *scores, int64_t ranks) {
    const int64_t Ne = m->hp.n_expert, K = m->hp.n_expert_used;
    if (ranks > K) ranks = K;
    if (mdl_matmul(m, &m->layers[il + 1].router, 0, u, L, scores)) return;   /* advisory: no prefetch */
    int32_t *pe = malloc((size_t)(L * K) * sizeof *pe), *pk = malloc((size_t)(L * K) * sizeof *pk);
    float *pv = malloc((size_t)(L * K) * sizeof *pv);
    uint8_t *seen = calloc((size_t)Ne, 1);
    if (pe && pk && pv && seen) {
        for (int64_t t = 0; t < L; t++) top_k(scores + t * Ne, Ne, K, pk + t * K, pv + t * K);
        int32_t n = 0;
        for (int64_t r = 0; r < ranks; r++)
            for (int64_t t = 0; t < L; t++) {
                const int32_t e = pk[t * K + r];
                if (!seen[e]) { seen[e] = 1; pe[n++] = e; }
            }
        xs_prefetch(m->xs, il + 1, pe, n);
    }
    free(pe); free(pk); free(pv); free(seen);
}

/* The router's softmax over Ne experts in place (logits [L x Ne] become probabilities), then per token
 * the K most probable (ties: lower id) to pick [L x K] and their probabilities renormalised over
 * the K to pw [L x K]. */
void mdl_route(float *logits, int64_t L, int64_t Ne, int64_t K, int32_t *pick, float *pw) {
    for (int64_t t = 0; t < L; t++) {
        float *lg = logits + t * Ne;
        float mx = lg[0];
        for (int64_t e = 1; e < Ne; e++) if (lg[e] > mx) mx = lg[e];
        double sum = 0.0;
        for (int64_t e = 0; e < Ne; e++) lg[e] = ops_exp(lg[e] - mx);   /* vectorises; the sum stays in order */
        for (int64_t e = 0; e < Ne; e++) sum += lg[e];
        const float inv = (float)(1.0 / sum);
        for (int64_t e = 0; e < Ne; e++) lg[e] *= inv;
        int32_t *pk = pick + t * K;
        float *wk = pw + t * K;
        top_k(lg, Ne, K, pk, wk);
        float ws = 0.0f;
        for (int64_t i = 0; i < K; i++) ws += wk[i];
        for (int64_t i = 0; i < K; i++) wk[i] /= ws;
    }
}

/* Groups the n (token, k) pairs of pick by expert, a counting sort: count [Ne + 1] (zero on entry)
 * becomes the prefix sums, expert e's pairs are slot[count[e] .. count[e + 1]) in increasing pair
 * index. fill: Ne scratch. */
void mdl_route_group(const int32_t *pick, int64_t n, int64_t Ne, int64_t *count, int64_t *fill, int64_t *slot) {
    for (int64_t i = 0; i < n; i++) count[pick[i] + 1]++;
    for (int64_t e = 0; e < Ne; e++) count[e + 1] += count[e];
    memcpy(fill, count, (size_t)Ne * sizeof(int64_t));
    for (int64_t i = 0; i < n; i++) slot[fill[pick[i]]++] = i;
}

/* The experts' input rows in grouped order: xg row i = u row slot[i] / K (the token of pair slot[i]). */
void mdl_moe_gather(const float *u, const int64_t *slot, int64_t n, int64_t K, int64_t E, float *xg) {
    for (int64_t i = 0; i < n; i++) memcpy(xg + i * E, u + (slot[i] / K) * E, (size_t)E * sizeof(float));
}

/* One row: h[F] = silu(gate * s1) * (up * s2). */
static inline void glu_row(const float *gate, const float *up, int64_t F, float s1, float s2, float *h) {
    for (int64_t f = 0; f < F; f++) h[f] = ops_silu(gate[f] * s1) * (up[f] * s2);
}

/* h[n x F] = silu(gate * s1) * (up * s2). fused: row i of g is [gate F | up F]; split: all n gate
 * rows, then all n up rows. */
void mdl_moe_glu(const float *g, int64_t n, int64_t F, int fused, float s1, float s2, float *h) {
    for (int64_t i = 0; i < n; i++)
        if (fused) glu_row(g + i * 2 * F, g + i * 2 * F + F, F, s1, s2, h + i * F);
        else glu_row(g + i * F, g + n * F + i * F, F, s1, s2, h + i * F);
}

/* The shared expert's gate sigmoid(w_seg . x) for one token's x[E]. */
float mdl_moe_shared_gate(const float *w_seg, const float *x, int64_t E) {
    float d = 0.0f;
    for (int64_t i = 0; i < E; i++) d += w_seg[i] * x[i];
    return ops_sigmoid(d);
}

/* y[L x E] = sum_k w_k out_k (in slot order per token: experts in increasing id) + sigmoid(w_seg . u)
 * shared. out: the experts' rows in slot order (count / slot of mdl_route_group), skipped experts
 * (skipped[e] != 0) add nothing; down / sh_down give the .scale of each product; sho [L x E] the
 * shared expert's output. */
void mdl_moe_combine(const mdl_mat *down, const mdl_mat *sh_down, const float *w_seg, const float *u, int64_t L,
                     int64_t E, int64_t Ne, int64_t K, const int64_t *count, const int64_t *slot, const int8_t *skipped,
                     const float *pw, const float *out, const float *sho, float *y) {
    memset(y, 0, (size_t)(L * E) * sizeof(float));
    for (int64_t e = 0; e < Ne; e++) {
        const int64_t n = count[e + 1] - count[e], r0 = count[e];
        if (!n || skipped[e]) continue;   /* a skipped expert adds nothing */
        const float sd = mdl_mat_scale(down, e);
        for (int64_t i = 0; i < n; i++) {
            const int64_t sl = slot[r0 + i];
            const float w = pw[sl] * sd;
            float *yt = y + (sl / K) * E;
            const float *oi = out + (r0 + i) * E;
            for (int64_t d = 0; d < E; d++) yt[d] += w * oi[d];
        }
    }
    const float sd = mdl_mat_scale(sh_down, 0);
    for (int64_t t = 0; t < L; t++) {
        const float gate = mdl_moe_shared_gate(w_seg, u + t * E, E) * sd;
        float *yt = y + t * E;
        const float *ot = sho + t * E;
        for (int64_t i = 0; i < E; i++) yt[i] += gate * ot[i];
    }
}

/* One GLU of moe_run's: an expert's n rows (mdl_moe_glu's layouts), or one row of the shared expert's
 * (its gate and up rows apart: up != NULL). */
typedef struct {
    const float *g, *up;
    int64_t n, F;
    int fused;
    float s1, s2;
    float *h;
} moe_glu_item;

static void glu_task(void *arg, int64_t i, int thread) {
    (void)thread;
    const moe_glu_item *it = (const moe_glu_item *)arg + i;
    if (it->up) glu_row(it->g, it->up, it->F, it->s1, it->s2, it->h);
    else mdl_moe_glu(it->g, it->n, it->F, it->fused, it->s1, it->s2, it->h);
}

/* From this many rows the GLUs run on the pool, an item a task (each row's values are the same on any
 * thread): at 8 tokens on flash-small they were 8 us of a 55 us MoE layer, serially. */
enum { GLU_POOL_MIN_ROWS = 8 };

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}


/* The layer: y given (ext NULL), or for the device forward (ext): the routing taken from ext, the routed
 * experts only (the device runs the shared expert and the merge), their rows and skip marks to ext. */
static strata_status moe_run(strata_session *s, int il, const float *u, int64_t L, float *y, const mdl_moe_ext *ext) {
    strata_model *m = s->m;
    const mdl_hparams *hp = &m->hp;
    const mdl_layer *l = &m->layers[il];
    const int64_t E = hp->n_embd, Ne = hp->n_expert, K = hp->n_expert_used, Fe = hp->ff_exp, Fs = hp->ff_shexp;
    /* the layer's buffers, one allocation (util/carve.h) */
    const size_t LK = (size_t)(L * K), count_bytes = ((size_t)Ne + 1 + ((size_t)Ne + 7) / 8) * sizeof(int64_t);
    size_t bytes = 0;
    const size_t o_logits = carve(&bytes, (size_t)(L * Ne) * sizeof(float), 64), o_pick = carve(&bytes, LK * sizeof(int32_t), 64),
                 o_pw = carve(&bytes, LK * sizeof(float), 64), o_count = carve(&bytes, count_bytes, 64),
                 o_slot = carve(&bytes, LK * sizeof(int64_t), 64), o_tok = carve(&bytes, LK * sizeof(int64_t), 64),
                 o_xg = carve(&bytes, LK * (size_t)E * sizeof(float), 64),
                 o_gu = carve(&bytes, (LK * 2 * (size_t)Fe + 2 * (size_t)(L * Fs)) * sizeof(float), 64),
                 o_hb = carve(&bytes, (LK * (size_t)Fe + (size_t)(L * Fs)) * sizeof(float), 64),
                 o_out = ext ? 0 : carve(&bytes, (LK * (size_t)E + (size_t)(L * E)) * sizeof(float), 64);
    char *buf = malloc(bytes);
    if (!buf) return strata_fail(STRATA_ERR_NOMEM, "MoE layer %d: no memory for %lld tokens", il, (long long)L);
    float *logits = (float *)(buf + o_logits);
    int32_t *pick = (int32_t *)(buf + o_pick);
    float *pw = (float *)(buf + o_pw);
    /* count: Ne + 1 prefix sums, then Ne bytes of skip marks (the plan's result this call keeps); zeroed */
    int64_t *count = (int64_t *)(buf + o_count);
    memset(count, 0, count_bytes);
    int64_t *slot = (int64_t *)(buf + o_slot);   /* (token, k) pairs sorted by expert */
    int64_t *tok = (int64_t *)(buf + o_tok);     /* the token of each slot: row of u */
    float *xg = (float *)(buf + o_xg);
    float *gu = (float *)(buf + o_gu);
    float *hb = (float *)(buf + o_hb);
    /* the experts' rows, then the shared expert's (the device forward's: its buffer, no shared rows) */
    float *out = ext ? ext->out : (float *)(buf + o_out);
    strata_mm_item *mm = NULL;
    off_plan *plan = NULL;          /* offload: the engine's plan (holds its lock until off_finish) */
    const int8_t *kind = NULL;      /* plan->kind: OFF_* per expert; NULL: every group on the CPU pool */
    uint64_t cpu_groups = 0, cpu_bytes = 0;
    int32_t *xidx = NULL;           /* expert store: [Ne] index of expert e in the acquired list, then 2 x Ne scratch */
    const char **xptr = NULL;       /* expert store: where each acquired expert's pieces are */
    const char **xsrc = NULL;       /* expert store + device: [Ne * 3] the copied groups' sources (plan->src) */
    int xs_held = 0;                /* the store's lock is held (xs_acquire .. xs_release) */
    strata_status rc = STRATA_OK;
    if (!out) {
        rc = strata_fail(STRATA_ERR_NOMEM, "MoE layer %d: no memory for %lld tokens", il, (long long)L);
        goto done;
    }
    if (ext) {
        memcpy(pick, ext->pick, (size_t)(L * K) * sizeof *pick);
        memcpy(pw, ext->pw, (size_t)(L * K) * sizeof *pw);
    } else {
        if ((rc = mdl_matmul(m, &l->router, 0, u, L, logits))) goto done;
        mdl_route(logits, L, Ne, K, pick, pw);
    }
    {
        int64_t *fill = malloc((size_t)Ne * sizeof(int64_t));
        if (!fill) { rc = strata_fail(STRATA_ERR_NOMEM, "MoE layer %d: no memory", il); goto done; }
        mdl_route_group(pick, L * K, Ne, count, fill, slot);
        free(fill);
    }
    /* Every active expert and the shared expert in two pool jobs: [gate, up] of all, then down
     * of all. Expert e's tokens sit at rows base[e].. of xg / gu / hb / out. */
    int64_t n_act = 0;
    for (int64_t e = 0; e < Ne; e++) n_act += count[e + 1] > count[e];
    if (trc_on()) trc_note_experts((int32_t)n_act);   /* the layer's MoE span reports it (model.c) */
    mm = malloc((size_t)(2 * n_act + 2) * sizeof *mm + (size_t)(n_act + L) * sizeof(moe_glu_item));   /* + the GLUs' */
    if (!mm) { rc = strata_fail(STRATA_ERR_NOMEM, "MoE layer %d: no memory", il); goto done; }
    for (int64_t i = 0; i < L * K; i++) tok[i] = slot[i] / K;
    float *sg = gu + L * K * 2 * Fe, *su = sg + L * Fs, *shb = hb + L * K * Fe, *sho = ext ? NULL : out + L * K * E;
    /* offload engine: which groups run on the device, are skipped, or stay on the CPU pool. It
     * knows only the trunk's layers: the MTP block (layers[n_layer]) always takes the CPU pool. */
    const int trunk = il < hp->n_layer;
    if (m->off && trunk) {
        plan = off_begin(m->off, il, L, count, pick);
        kind = plan->kind;
    }
    if (m->trace && trunk) trace_routing(m, il, L, K, pick, pw, Ne, kind);   /* the trace is the trunk's routing */
    /* expert store (direct reads): the CPU pool's groups compute from RAM slots, read in first, and
     * the device's copies of missing groups come from them too */
    if (m->xs) {
        xidx = malloc((size_t)Ne * 3 * sizeof(int32_t));
        xptr = malloc((size_t)Ne * XS_MAX_PARTS * sizeof *xptr);
        if (!xidx || !xptr) { rc = strata_fail(STRATA_ERR_NOMEM, "MoE layer %d: no memory", il); goto done; }
        int32_t *xe = xidx + Ne, *xpk = xidx + 2 * Ne;
        for (int64_t e = 0; e < Ne; e++) xidx[e] = (int32_t)K;        /* best rank so far */
        for (int64_t i = 0; i < L * K; i++)
            if (i % K < xidx[pick[i]]) xidx[pick[i]] = (int32_t)(i % K);
        /* xe / xpk: the experts the store serves (the CPU pool's, and the device's copies) and their picks */
        int32_t n_x = 0;
        for (int64_t e = 0; e < Ne; e++) {
            const int64_t n = count[e + 1] - count[e];
            if (!n || (kind && kind[e] != OFF_CPU && kind[e] != OFF_ADMIT && kind[e] != OFF_STAGE)) continue;
            xe[n_x] = (int32_t)e;
            xpk[n_x] = (int32_t)n;
            n_x++;
        }
        int32_t *xrk = malloc((size_t)(n_x ? n_x : 1) * sizeof *xrk);
        if (!xrk) { rc = strata_fail(STRATA_ERR_NOMEM, "MoE layer %d: no memory", il); goto done; }
        for (int32_t i = 0; i < n_x; i++) xrk[i] = xidx[xe[i]];
        for (int64_t e = 0; e < Ne; e++) xidx[e] = -1;
        for (int32_t i = 0; i < n_x; i++) xidx[xe[i]] = i;
        rc = xs_acquire(m->xs, il, xe, xpk, xrk, n_x, xptr);
        free(xrk);
        if (rc) goto done;
        xs_held = 1;
        /* read ahead what the next layer will route to (routing is done: logits is free) */
        if (m->params.expert_prefetch && il + 1 < hp->n_layer && L <= 16) store_prefetch(m, il, u, L, logits, m->params.expert_prefetch);
        if (plan) {
            xsrc = calloc((size_t)Ne * 3, sizeof *xsrc);
            if (!xsrc) { rc = strata_fail(STRATA_ERR_NOMEM, "MoE layer %d: no memory", il); goto done; }
            for (int32_t i = 0; i < n_x; i++) {
                const int32_t e = xe[i];
                if (kind[e] != OFF_ADMIT && kind[e] != OFF_STAGE) continue;
                xsrc[e * 3] = xptr[i * XS_MAX_PARTS];
                xsrc[e * 3 + 1] = l->exp_fused ? NULL : xptr[i * XS_MAX_PARTS + 1];
                xsrc[e * 3 + 2] = xptr[i * XS_MAX_PARTS + (l->exp_fused ? 1 : 2)];
            }
            plan->src = xsrc;
        }
    }
    /* the experts' input rows in grouped order: all of them, or where the expert device reads the forward's own
     * (ext->dx), only the CPU pool's */
    if (ext && ext->dx) {
        for (int64_t e = 0; e < Ne; e++) {
            const int64_t n = count[e + 1] - count[e], r0 = count[e];
            if (n && (!kind || kind[e] == OFF_CPU)) mdl_moe_gather(u, slot + r0, n, K, E, xg + r0 * E);
        }
    } else {
        mdl_moe_gather(u, slot, L * K, K, E, xg);
    }
    if (plan && (rc = ext && ext->dx ? off_submit(plan, ext->dx, ext->dout, 1) : off_submit(plan, xg, out, 0))) goto done;
    const double t_cpu = now_s();
    int nm_ = 0;
    for (int64_t e = 0; e < Ne; e++) {
        const int64_t n = count[e + 1] - count[e], r0 = count[e];
        if (!n || (kind && kind[e] != OFF_CPU)) continue;
        cpu_groups++;
        cpu_bytes += (uint64_t)(l->exp_gate.mat_bytes + (l->exp_fused ? 0 : l->exp_up.mat_bytes) + l->exp_down.mat_bytes);
        mm[nm_++] = item_of(&l->exp_gate, e, xg + r0 * E, u, tok + r0, n, gu + r0 * 2 * Fe);
        if (xptr) mm[nm_ - 1].w = xptr[xidx[e] * XS_MAX_PARTS];
        if (!l->exp_fused) {
            mm[nm_++] = item_of(&l->exp_up, e, xg + r0 * E, u, tok + r0, n, gu + r0 * 2 * Fe + n * Fe);
            if (xptr) mm[nm_ - 1].w = xptr[xidx[e] * XS_MAX_PARTS + 1];
        }
    }
    if (!ext) {
        mm[nm_++] = item(&l->sh_gate, 0, u, L, sg);
        mm[nm_++] = item(&l->sh_up, 0, u, L, su);
    }
    if (nm_ && (rc = strata_mm_multi_auto(m->pool, m->isa, mm, nm_))) goto done; /* GEMM or dot products per item (gemm.c) */
    {
        moe_glu_item *gl = (moe_glu_item *)(mm + 2 * n_act + 2);   /* mm's tail (allocated for it) */
        int ng = 0;
        int64_t rows = 0;
        for (int64_t e = 0; e < Ne; e++) {
            const int64_t n = count[e + 1] - count[e], r0 = count[e];
            if (!n || (kind && kind[e] != OFF_CPU)) continue;
            const float s1 = mdl_mat_scale(&l->exp_gate, e), s2 = l->exp_fused ? s1 : mdl_mat_scale(&l->exp_up, e);
            gl[ng++] = (moe_glu_item){gu + r0 * 2 * Fe, NULL, n, Fe, l->exp_fused, s1, s2, hb + r0 * Fe};
            rows += n;
        }
        /* the shared expert's [gate rows; up rows] (su follows sg) are the split layout; a row an item
         * (its rows are most of the work) */
        if (!ext)
            for (int64_t t = 0; t < L; t++, rows++)
                gl[ng++] = (moe_glu_item){sg + t * Fs, su + t * Fs, 1, Fs, 0, mdl_mat_scale(&l->sh_gate, 0),
                                          mdl_mat_scale(&l->sh_up, 0), shb + t * Fs};
        strata_pool_run(rows >= GLU_POOL_MIN_ROWS ? m->pool : NULL, glu_task, gl, ng);
    }
    nm_ = 0;
    for (int64_t e = 0; e < Ne; e++) {
        const int64_t n = count[e + 1] - count[e], r0 = count[e];
        if (!n || (kind && kind[e] != OFF_CPU)) continue;
        mm[nm_++] = item(&l->exp_down, e, hb + r0 * Fe, n, out + r0 * E);
        if (xptr) mm[nm_ - 1].w = xptr[xidx[e] * XS_MAX_PARTS + (l->exp_fused ? 1 : 2)];
    }
    if (!ext) mm[nm_++] = item(&l->sh_down, 0, shb, L, sho);
    if (nm_ && (rc = strata_mm_multi_auto(m->pool, m->isa, mm, nm_))) goto done;
    /* the skipped groups, in this call's memory: plan->kind is the engine's and is reused by the
     * next plan (another session's) once off_finish unlocks */
    int8_t *skipped = (int8_t *)(count + Ne + 1);
    for (int64_t e = 0; e < Ne; e++) skipped[e] = kind && kind[e] == OFF_SKIP;
    if (ext)   /* for the device's merge: where each expert's rows are */
        for (int64_t e = 0; e < Ne; e++)
            ext->where[e] = count[e + 1] == count[e] || skipped[e]    ? MDL_ROWS_NONE
                            : ext->dx && kind && kind[e] != OFF_CPU ? MDL_ROWS_DEVICE
                                                                    : MDL_ROWS_HOST;
    kind = NULL;
    if (plan) {
        off_plan *p = plan;
        plan = NULL;                /* finished (and unlocked) whatever off_finish returns */
        if ((rc = off_finish(p, now_s() - t_cpu, cpu_groups, cpu_bytes))) goto done;
    }
    /* after off_finish: it waited for the device's copies out of the RAM slots */
    if (xs_held) { xs_release(m->xs); xs_held = 0; }
    if (ext) {   /* the device merges */
        memcpy(ext->skip, skipped, (size_t)Ne);
        memcpy(ext->count, count, (size_t)(Ne + 1) * sizeof(int64_t));
        goto done;
    }
    /* y = Σ_k w_k out_k (in slot order per token) + σ(w_seg · x) · shared */
    mdl_moe_combine(&l->exp_down, &l->sh_down, l->sh_inp_gate, u, L, E, Ne, K, count, slot, skipped, pw, out, sho,
                    y);
done:
    if (plan) {
        /* an error between off_begin and off_finish: drain the device before the buffers go */
        (void)off_finish(plan, 0.0, 0, 0);
    }
    if (xs_held) xs_release(m->xs);
    free(buf); free(mm);
    free(xidx); free(xptr); free(xsrc);
    return rc;
}

strata_status mdl_moe(strata_session *s, int il, const float *u, int64_t L, float *y) {
    return moe_run(s, il, u, L, y, NULL);
}

strata_status mdl_moe_experts(strata_session *s, int il, const float *u, int64_t L, const mdl_moe_ext *ext) {
    return moe_run(s, il, u, L, NULL, ext);
}
