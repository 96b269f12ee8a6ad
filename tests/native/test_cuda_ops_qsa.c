// MUTATION: kernels/cuda/qsa.cuh | p[e] = ops_f32_to_f16(x[e]); | p[e] = ops_f32_to_f16(x[e ^ 1]); | qsa.store
// MUTATION: kernels/cuda/qsa.cuh | if (lane == 0) scale[row * 2 + which] = d; | if (lane == 0) scale[row * 2] = d; | qsa.store
// MUTATION: kernels/cuda/qsa.cuh | e += OPS_WARP) m = fmaxf(m, fabsf(x[e])); | e += 2 * OPS_WARP) m = fmaxf(m, fabsf(x[e])); | qsa.store
// MUTATION: kernels/cuda/qsa.cuh | for (int64_t j = 0; j < r; j++) acc += idx_k | for (int64_t j = 0; j < r - 1; j++) acc += idx_k | qsa.store
// MUTATION: kernels/cuda/qsa.cuh | sc += d > 0.0f ? d : 0.0f; | sc += d; | qsa.index
// MUTATION: kernels/cuda/qsa.cuh | const float *qh = qi + h * dI; | const float *qh = qi + h; | qsa.index
// MUTATION: kernels/cuda/qsa.cuh | (is_eq && eq_rank < need) | (is_eq && eq_rank <= need) | qsa.select
// MUTATION: kernels/cuda/qsa.cuh | ops_f32_bits(s == 0.0f ? 0.0f : s); | ops_f32_bits(s); | qsa.select
// MUTATION: kernels/cuda/qsa.cuh | for (int64_t b = lane; b < nb; b += OPS_WARP) c += | for (int64_t b = lane + 1; b < nb; b += OPS_WARP) c += | qsa.select
// MUTATION: kernels/cuda/qsa.cuh | const uint32_t below = (1u << lane) - 1u; | const uint32_t below = (1u << lane); | qsa.select
// MUTATION: kernels/cuda/qsa.cuh | for (int64_t j = nb * r + lane; j < n; | for (int64_t j = nb * r + lane + 1; j < n; | qsa.select
// MUTATION: kernels/cuda/qsa.cuh | kvh = h / (A->H / A->kv.Hkv), pos = | kvh = h % A->kv.Hkv, pos = | qsa.attn
// MUTATION: kernels/cuda/qsa.cuh | for (int64_t i = lane; i < n; i += OPS_WARP) { | for (int64_t i = lane + 1; i < n; i += OPS_WARP) { | qsa.attn
// MUTATION: kernels/cuda/qsa.cuh | qsa_kv_value(&A->kv, 1, qsa_key_pos(A, t, i), kvh, e) | qsa_kv_value(&A->kv, 0, qsa_key_pos(A, t, i), kvh, e) | qsa.attn
// MUTATION: kernels/cuda/qsa.cuh | h * 2 * hd + hd + e]; | h * 2 * hd + e]; | qsa.attn
// MUTATION: kernels/cuda/qsa.cuh | return kv->scale[row * 2 + which] * | return kv->scale[row * 2] * | qsa.attn
// MUTATION: kernels/cuda/qsa.cuh | return ns < 0 ? A->p0 + t + 1 : ns; | return ns < 0 ? A->p0 + t : ns; | qsa.attn
// MUTATION: kernels/cuda/emu_mixers.h | const float *x = (which ? v : k) + (t * Hkv + kvh) * hd; | const float *x = (which ? k : v) + (t * Hkv + kvh) * hd; | qsa.store
// MUTATION: kernels/cuda/emu_mixers.h | const int64_t b = b0 + u / dI, e = u % dI; | const int64_t b = u / dI, e = u % dI; | qsa.store
// MUTATION: kernels/cuda/emu_mixers.h | memcpy(idx_k + p0 * dI, ik, | memcpy(idx_k + p0, ik, | qsa.store
// MUTATION: kernels/cuda/emu_mixers.h | qsa_block_score(iq + t * nI * dI, blk + b * dI, nI, dI) | qsa_block_score(iq + t * dI, blk + b * dI, nI, dI) | qsa.index
// MUTATION: kernels/cuda/emu_mixers.h | n_sel + t, lane); | n_sel + t, lane & 15); | qsa.select
// MUTATION: kernels/cuda/emu_mixers.h | A.p0 = p0; | A.p0 = 0; | qsa.attn
/*
 * test_cuda_ops_qsa.c — the QSA attention kernels' arithmetic (kernels/cuda/qsa.cuh) run on the host over
 * each launch's whole grid, in the kernels' order, against the C path (model/qsa.c) op by op (issue 19
 * point 4; tools/cuda_ops.py). Each launch is its launcher's host emulation (emu_qsa_* of
 * kernels/cuda/emu_mixers.h, the launcher's signature), so a mutation of the units fails the emulation too;
 * every launch must return STRATA_OK, and an empty one (no queries, no blocks, r 0) must touch nothing. Ops:
 *   qsa.store   K/V rows written to the cache in f32, f16 and int8 (+ per-row scale), against
 *               mdl_qsa_store_row (bytes and scales equal); the raw indexer keys' copy; the block pooling
 *               (in two launches) against mdl_qsa_blk_pool, and pooled rows + the C path's N1 and RoPE (the
 *               norm / rope kernels' part) against mdl_qsa_blk_summary.
 *   qsa.index   block scores against mdl_qsa_block_score (bit for bit).
 *   qsa.select  the kept keys as sets, and their count, against mdl_qsa_select (qsa.c's heap, tie rule
 *               higher score then lower block), on the index's scores and on crafted scores full of ties
 *               (exact zeros, ±0, a few levels) where topk cuts through a tied group.
 *   qsa.attn    per kv type: scores, softmax, outputs and the σ(gate), on the C path's own selection,
 *               against mdl_qsa_attn_group + mdl_qsa_gate; for f32 also on the kernels' selection (its
 *               ascending key order sums in another order than the heap's: within rounding).
 * Shapes: the real model's (24 q / 2 kv heads x 256, 64 rotary dims, indexer 4 x 128, ratio 4, budget
 * 2048) dense from position 0, across the point where the selection starts to bind (n = 2052), at
 * n_past 3000 with the real and a small budget; two small odd ones (grouped 2 and 4, hd 40 and 20,
 * ratio 3 and 2) whose selection binds inside one prefill.
 *
 * Errors are max |got - ref| over max |ref| of the compared array. Everything but the attention's
 * softmax denominator is qsa.c's operations in qsa.c's order (expected 0, checked exactly); that one
 * is 32 double lanes folded where qsa.c adds serially in double.
 */
#define _POSIX_C_SOURCE 199309L   /* clock_gettime */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda/emu_mixers.h"
#include "model/model.h"

#include "check.h"
#include "ops_check.h"

/* qsa.c's ops, exposed for this check (not in model.h) */
void mdl_qsa_store_row(const strata_session *s, mdl_layer_state *st, void *base, int64_t pos, int64_t kvh, int which,
                       const float *x);
void mdl_qsa_blk_pool(const float *idx_k, int64_t b, int64_t r, int64_t dI, float *tmp);
void mdl_qsa_blk_summary(const mdl_hparams *hp, const float *norm_w, int64_t r, const float *idx_k, int64_t b,
                         float *tmp, float *bc, float *bs, float *kb);
float mdl_qsa_block_score(const float *qi, const float *kb, int64_t nI, int64_t dI);
int64_t mdl_qsa_select(const float *score, int64_t nb, int64_t topk, int64_t r, int64_t n, void *heap_mem,
                       int32_t *sel);
void mdl_qsa_attn_group(const strata_model *m, const mdl_layer_state *st, int kv_type, const strata_qtraits *f16,
                        const float *q, int64_t P, const int32_t *sel, int32_t ns, int64_t kvh, float *w, float *o);
void mdl_qsa_gate(float *oh, const float *gh, int64_t hd);

_Static_assert((int)QSA_KV_F32 == (int)STRATA_KV_F32 && (int)QSA_KV_F16 == (int)STRATA_KV_F16 &&
                   (int)QSA_KV_INT8 == (int)STRATA_KV_INT8,
               "qsa.cuh's kv types are strata_kv_type's");

/* ---------------------------------------------------------------- bookkeeping: one OP line per op (and kv type) */

enum { OP_STORE, OP_INDEX, OP_SELECT, OP_ATTN_F32, OP_ATTN_F16, OP_ATTN_INT8, N_OPS };
static const char *const op_name[N_OPS] = {"qsa.store", "qsa.index", "qsa.select", "qsa.attn", "qsa.attn", "qsa.attn"};
static const char *const op_types[N_OPS] = {"-", "-", "-", "f32", "f16", "int8"};
static const char *const kv_name[3] = {"f32", "f16", "int8"};
static double op_err[N_OPS];
static int op_fail[N_OPS];

static void record(int op, const char *what, const char *shape, double err, double tol) {
    if (!(err <= tol)) {
        fprintf(stderr, "%s %s %s (%s): max rel err %.3g > %.3g\n", op_name[op], op_types[op], what, shape, err, tol);
        op_fail[op] = 1;
        g_failed++;
    }
    if (!(err <= op_err[op])) op_err[op] = err;
}

/* Records got vs ref (n values) for op: relative error against ref's scale; fails above tol or on a NaN. */
static void compare(int op, const char *what, const char *shape, const float *got, const float *ref, int64_t n,
                    double tol) {
    record(op, what, shape, ops_max_rel_err(got, ref, n), tol);
}

/* Records a launch's status (none of these launchers refuses its arguments): 1 unless STRATA_OK. */
static void launched(int op, const char *what, const char *shape, strata_status rc) {
    if (rc != STRATA_OK) fprintf(stderr, "%s %s (%s): status %d (%s)\n", op_name[op], what, shape, (int)rc,
                                 strata_last_error());
    record(op, what, shape, rc == STRATA_OK ? 0.0 : 1.0, 0.0);
}

/* ---------------------------------------------------------------- inputs */


static int cmp_i32(const void *a, const void *b) {
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* 0 when the kept keys agree as sets (and in count), else 1 (with the first difference on stderr). */
static double compare_sel(const char *shape, int64_t t, int32_t ns_got, const int32_t *got, int32_t ns_ref,
                          const int32_t *ref) {
    if (ns_got != ns_ref) {
        fprintf(stderr, "qsa.select (%s) query %lld: %d kept keys, the C path %d\n", shape, (long long)t, ns_got,
                ns_ref);
        return 1.0;
    }
    if (ns_ref <= 0) return 0.0;
    int32_t *a = malloc((size_t)ns_ref * sizeof *a), *b = malloc((size_t)ns_ref * sizeof *b);
    memcpy(a, got, (size_t)ns_ref * sizeof *a);
    memcpy(b, ref, (size_t)ns_ref * sizeof *b);
    qsort(a, (size_t)ns_ref, sizeof *a, cmp_i32);
    qsort(b, (size_t)ns_ref, sizeof *b, cmp_i32);
    double err = 0.0;
    for (int32_t i = 0; i < ns_ref && err == 0.0; i++)
        if (a[i] != b[i]) {
            fprintf(stderr, "qsa.select (%s) query %lld: sorted key %d is %d, the C path's %d\n", shape, (long long)t,
                    i, a[i], b[i]);
            err = 1.0;
        }
    free(a);
    free(b);
    return err;
}

/* qsa_cuda_select's launch on the host (emu_qsa_select: one warp per query, every lane). sel is filled
 * with -7 first so that a slot no lane writes shows. */
static void select_launch(const char *shape, const float *score, int64_t ld, int64_t r, int64_t topk, int64_t p0,
                          int64_t L, int32_t *sel, int64_t sel_cap, int32_t *n_sel) {
    for (int64_t i = 0; i < L * sel_cap; i++) sel[i] = -7;
    launched(OP_SELECT, "launch", shape, emu_qsa_select(score, ld, r, topk, p0, L, sel, sel_cap, n_sel, NULL));
}

/* ---------------------------------------------------------------- one shape */

typedef struct {
    int H, Hkv, hd, n_rot, nI, dI, r, budget;
    int64_t p0, L;
} shape;

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run_shape(const shape *sh, uint64_t seed) {
    g_rng = seed;
    const int64_t H = sh->H, Hkv = sh->Hkv, hd = sh->hd, nI = sh->nI, dI = sh->dI, r = sh->r, p0 = sh->p0, L = sh->L;
    const int64_t n_tok = p0 + L, grp = H / Hkv, topk = r > 0 ? sh->budget / r : 0;
    char name[128];
    snprintf(name, sizeof name, "H %lld/%lld x %lld, idx %lld x %lld, r %lld budget %d, p0 %lld L %lld",
             (long long)H, (long long)Hkv, (long long)hd, (long long)nI, (long long)dI, (long long)r, sh->budget,
             (long long)p0, (long long)L);
    const double t0 = seconds();

    strata_model *m = calloc(1, sizeof *m);
    m->isa = (int)strata_isa_best() - 1;   /* as model.c: the f16 KV rows take this path's converter */
    mdl_hparams *hp = &m->hp;
    hp->n_head = sh->H;
    hp->n_head_kv = sh->Hkv;
    hp->head_dim = sh->hd;
    hp->n_rot = sh->n_rot;
    hp->rope_theta = 1e7f;
    hp->eps = 1e-6f;
    hp->idx_heads = sh->nI;
    hp->idx_dim = sh->dI;
    hp->idx_budget = sh->budget;
    strata_session sess;
    memset(&sess, 0, sizeof sess);
    sess.m = m;
    const strata_qtraits *f16 = strata_qtraits_get(GT_F16);

    /* ---- inputs: every row that the cache holds after this step; k rows are N1-sized (|x| ~ 1) */
    const int64_t nrow = n_tok * Hkv;
    float *kin = rnd_array(nrow * hd, -2.0f, 2.0f), *vin = rnd_array(nrow * hd, -2.0f, 2.0f);
    memset(kin + p0 * Hkv * hd, 0, (size_t)hd * sizeof(float));                  /* int8: a zero row (d = 0) */
    for (int64_t e = 0; e < hd; e++) vin[(p0 * Hkv + Hkv - 1) * hd + e] *= 3e-5f;  /* f16 subnormals */
    float *idx_k = rnd_array(n_tok * dI, -1.5f, 1.5f), *k_norm = rnd_array(dI, 0.5f, 1.5f);
    float *iq = rnd_array(L * nI * dI, -1.0f, 1.0f);
    float *q = rnd_array(L * H * hd, -0.6f, 0.6f), *qg = rnd_array(L * 2 * H * hd, -3.0f, 3.0f);

    /* ---- qsa.store: the block pooling and summaries (all blocks of the n_tok keys) */
    const int64_t nbt = r > 0 ? n_tok / r : 0;
    float *pool_ref = malloc((size_t)(nbt * dI + 1) * sizeof(float)), *pool_got = malloc((size_t)(nbt * dI + 1) * sizeof(float));
    float *blk = malloc((size_t)(nbt * dI + 1) * sizeof(float)), *blk_got = malloc((size_t)(nbt * dI + 1) * sizeof(float));
    float *tmp = malloc((size_t)dI * sizeof(float)), *bc = malloc((size_t)sh->n_rot * sizeof(float));
    for (int64_t b = 0; b < nbt; b++) {
        mdl_qsa_blk_pool(idx_k, b, r, dI, pool_ref + b * dI);
        mdl_qsa_blk_summary(hp, k_norm, r, idx_k, b, tmp, bc, bc + sh->n_rot / 2, blk + b * dI);
    }
    /* qsa_cuda_blk_pool in two launches, as steps complete blocks: [0, nbt/2), then the rest */
    const int64_t nb_half = nbt / 2;
    launched(OP_STORE, "block pool launch", name, emu_qsa_blk_pool(idx_k, dI, r, 0, nb_half, pool_got, NULL));
    launched(OP_STORE, "block pool launch", name,
             emu_qsa_blk_pool(idx_k, dI, r, nb_half, nbt - nb_half, pool_got, NULL));
    for (int64_t b = 0; b < nbt; b++) {   /* the norm and rope kernels' part, by the C path here */
        mdl_rmsnorm(pool_got + b * dI, k_norm, dI, hp->eps, blk_got + b * dI);
        mdl_rope_angles(hp->rope_theta, hp->n_rot, b * r, bc, bc + sh->n_rot / 2);
        mdl_rope(blk_got + b * dI, hp->n_rot, bc, bc + sh->n_rot / 2);
    }
    compare(OP_STORE, "block pool", name, pool_got, pool_ref, nbt * dI, 0.0);
    compare(OP_STORE, "block summary", name, blk_got, blk, nbt * dI, 0.0);
    /* qsa_cuda_idx_store: this step's raw keys, rows p0 .., after the earlier rows */
    float *idx_got = malloc((size_t)(n_tok * dI) * sizeof(float));
    memcpy(idx_got, idx_k, (size_t)(p0 * dI) * sizeof(float));
    for (int64_t i = p0 * dI; i < n_tok * dI; i++) idx_got[i] = -7.0f;
    launched(OP_STORE, "raw key launch", name, emu_qsa_idx_store(idx_got, idx_k + p0 * dI, dI, p0, L, NULL));
    compare(OP_STORE, "raw keys", name, idx_got, idx_k, n_tok * dI, 0.0);
    free(idx_got);

    /* ---- qsa.index: every query whose selection binds, over its blocks (qsa_cuda_index's grid) */
    const int64_t ld = nbt > 0 ? nbt : 1;
    float *score_ref = calloc((size_t)(L * ld), sizeof(float)), *score_got = calloc((size_t)(L * ld), sizeof(float));
    int binding = 0;
    for (int64_t t = 0; t < L; t++) {
        const int64_t nb = r > 0 ? (p0 + t + 1) / r : 0;
        if (r == 0 || nb <= topk) continue;
        binding++;
        for (int64_t b = 0; b < nb; b++)
            score_ref[t * ld + b] = mdl_qsa_block_score(iq + t * nI * dI, blk + b * dI, nI, dI);
    }
    launched(OP_INDEX, "launch", name, emu_qsa_index(iq, blk, nI, dI, r, topk, p0, L, score_got, ld, NULL));
    compare(OP_INDEX, "scores", name, score_got, score_ref, L * ld, 0.0);

    /* ---- qsa.select: the C path's select_task per query vs the warp's */
    int64_t sel_cap = r > 0 ? (int64_t)sh->budget + r : 1;
    if (sel_cap > n_tok) sel_cap = n_tok;
    int32_t *sel_ref = malloc((size_t)(L * sel_cap) * sizeof(int32_t)), *n_sel_ref = malloc((size_t)L * sizeof(int32_t));
    int32_t *sel_got = malloc((size_t)(L * sel_cap) * sizeof(int32_t)), *n_sel_got = malloc((size_t)L * sizeof(int32_t));
    float *heap = malloc((size_t)(2 * (sel_cap + 8)) * sizeof(float));
    for (int64_t t = 0; t < L; t++) {
        const int64_t n = p0 + t + 1, nb = r > 0 ? n / r : 0;
        n_sel_ref[t] = (r == 0 || nb <= topk) ? -1
                     : (int32_t)mdl_qsa_select(score_ref + t * ld, nb, topk, r, n, heap, sel_ref + t * sel_cap);
    }
    select_launch(name, score_got, ld, r, topk, p0, L, sel_got, sel_cap, n_sel_got);
    int sel_same = 1;   /* the kernels' selection is then safe to attend over */
    for (int64_t t = 0; t < L; t++) {
        const double e = compare_sel(name, t, n_sel_got[t], sel_got + t * sel_cap, n_sel_ref[t], sel_ref + t * sel_cap);
        record(OP_SELECT, "kept keys", name, e, 0.0);
        if (e != 0.0) sel_same = 0;
    }

    /* ---- per kv type: qsa.store of the rows, then qsa.attn over the cache */
    int64_t w_cap = 1;   /* the most keys a query keeps */
    for (int64_t t = 0; t < L; t++) {
        const int64_t n = n_sel_ref[t] < 0 ? p0 + t + 1 : n_sel_ref[t];
        if (n > w_cap) w_cap = n;
    }
    float *w_ref = malloc((size_t)(grp * n_tok + hd) * sizeof(float));
    float *w_got = malloc((size_t)(L * H * w_cap) * sizeof(float));
    float *o_ref = malloc((size_t)(L * H * hd) * sizeof(float)), *o_got = malloc((size_t)(L * H * hd) * sizeof(float));
    for (int kt = 0; kt < 3; kt++) {
        m->params.kv_type = kt;
        const size_t es = kt == QSA_KV_F32 ? 4 : kt == QSA_KV_F16 ? 2 : 1, bytes = (size_t)(nrow * hd) * es;
        mdl_layer_state st, sg;
        memset(&st, 0, sizeof st);
        memset(&sg, 0, sizeof sg);
        st.k = calloc(bytes, 1); st.v = calloc(bytes, 1); st.kv_scale = calloc((size_t)(2 * nrow), sizeof(float));
        sg.k = calloc(bytes, 1); sg.v = calloc(bytes, 1); sg.kv_scale = calloc((size_t)(2 * nrow), sizeof(float));
        for (int64_t pos = 0; pos < n_tok; pos++)
            for (int64_t h = 0; h < Hkv; h++) {
                mdl_qsa_store_row(&sess, &st, st.k, pos, h, 0, kin + (pos * Hkv + h) * hd);
                mdl_qsa_store_row(&sess, &st, st.v, pos, h, 1, vin + (pos * Hkv + h) * hd);
            }
        /* earlier steps' rows as the C path left them; this step's L rows by qsa_cuda_store's grid */
        memcpy(sg.k, st.k, (size_t)(p0 * Hkv * hd) * es);
        memcpy(sg.v, st.v, (size_t)(p0 * Hkv * hd) * es);
        memcpy(sg.kv_scale, st.kv_scale, (size_t)(2 * p0 * Hkv) * sizeof(float));
        launched(OP_STORE, "K/V launch", name,
                 emu_qsa_store(sg.k, sg.v, sg.kv_scale, kt, Hkv, hd, p0, L, kin + p0 * Hkv * hd, vin + p0 * Hkv * hd,
                               NULL));
        /* the rows as floats (qsa_kv_value of each cache) and the raw bytes */
        char what[64];
        const qsa_kv kv_ref = {st.k, st.v, st.kv_scale, kt, Hkv, hd}, kv_got = {sg.k, sg.v, sg.kv_scale, kt, Hkv, hd};
        float *dec_ref = malloc((size_t)(L * Hkv * hd) * sizeof(float)), *dec_got = malloc((size_t)(L * Hkv * hd) * sizeof(float));
        for (int which = 0; which < 2; which++) {
            for (int64_t t = 0; t < L; t++)
                for (int64_t h = 0; h < Hkv; h++)
                    for (int64_t e = 0; e < hd; e++) {
                        dec_ref[(t * Hkv + h) * hd + e] = qsa_kv_value(&kv_ref, which, p0 + t, h, e);
                        dec_got[(t * Hkv + h) * hd + e] = qsa_kv_value(&kv_got, which, p0 + t, h, e);
                    }
            snprintf(what, sizeof what, "%s %s rows", kv_name[kt], which ? "V" : "K");
            compare(OP_STORE, what, name, dec_got, dec_ref, L * Hkv * hd, 0.0);
        }
        free(dec_ref);
        free(dec_got);
        const int same = !memcmp(st.k, sg.k, bytes) && !memcmp(st.v, sg.v, bytes) &&
                         (kt != QSA_KV_INT8 || !memcmp(st.kv_scale, sg.kv_scale, (size_t)(2 * nrow) * sizeof(float)));
        snprintf(what, sizeof what, "%s cache bytes", kv_name[kt]);
        record(OP_STORE, what, name, same ? 0.0 : 1.0, 0.0);

        /* qsa.attn on the C path's selection (both read the C path's cache) */
        for (int64_t t = 0; t < L; t++)
            for (int64_t h = 0; h < Hkv; h++) {
                const int64_t q0 = (t * H + h * grp) * hd;
                mdl_qsa_attn_group(m, &st, kt, f16, q + q0, p0 + t, sel_ref + t * sel_cap, n_sel_ref[t], h, w_ref,
                                   o_ref + q0);
            }
        for (int64_t t = 0; t < L; t++)
            for (int64_t h = 0; h < H; h++)
                mdl_qsa_gate(o_ref + (t * H + h) * hd, qg + t * 2 * H * hd + h * 2 * hd + hd, hd);
        for (int pass = 0; pass < (kt == QSA_KV_F32 && sel_same ? 2 : 1); pass++) {
            /* pass 1: the kernels' own selection (ascending keys); qsa_cuda_attn's grid, a block per (t, h) */
            memset(o_got, 0, (size_t)(L * H * hd) * sizeof(float));
            snprintf(what, sizeof what, "%s", pass ? "launch, the kernels' selection" : "launch");
            launched(OP_ATTN_F32 + kt, what, name,
                     emu_qsa_attn(kv_ref.k, kv_ref.v, kv_ref.scale, kt, H, Hkv, hd, p0, L, q, qg,
                                  pass ? sel_got : sel_ref, sel_cap, pass ? n_sel_got : n_sel_ref, w_got, w_cap,
                                  o_got, NULL));
            snprintf(what, sizeof what, "%s", pass ? "output, the kernels' selection" : "output");
            compare(OP_ATTN_F32 + kt, what, name, o_got, o_ref, L * H * hd, pass ? 1e-5 : 1e-6);
        }
        free(st.k); free(st.v); free(st.kv_scale);
        free(sg.k); free(sg.v); free(sg.kv_scale);
    }
    fprintf(stderr, "  %s: %d binding queries, %.2f s\n", name, binding, seconds() - t0);

    free(kin); free(vin); free(idx_k); free(k_norm); free(iq); free(q); free(qg);
    free(pool_ref); free(pool_got); free(blk); free(blk_got); free(tmp); free(bc);
    free(score_ref); free(score_got);
    free(sel_ref); free(n_sel_ref); free(sel_got); free(n_sel_got); free(heap);
    free(w_ref); free(w_got); free(o_ref); free(o_got);
    free(m);
}

/* ---------------------------------------------------------------- qsa.select on crafted scores */

/* Scores of nb blocks: zeros with probability p_zero (every other one -0), else one of `levels`
 * values (levels > 0: many ties) or uniform (levels 0). */
static void tie_case(const char *what, int64_t r, int64_t topk, int64_t n, float p_zero, int levels, uint64_t seed) {
    g_rng = seed;
    const int64_t nb = n / r, cap = topk * r + r + 32;
    float *score = malloc((size_t)nb * sizeof(float)), *heap = malloc((size_t)(2 * (topk + 8)) * sizeof(float));
    int zeros = 0;
    for (int64_t b = 0; b < nb; b++) {
        if (rndu(0.0f, 1.0f) < p_zero) score[b] = (zeros++ & 1) ? -0.0f : 0.0f;
        else score[b] = levels > 0 ? (float)(1 + (int)rndu(0.0f, (float)levels)) * 0.125f : rndu(0.0f, 4.0f);
    }
    int32_t *ref = malloc((size_t)cap * sizeof(int32_t)), *got = malloc((size_t)cap * sizeof(int32_t)), ns_got;
    const int32_t ns_ref = nb <= topk ? -1 : (int32_t)mdl_qsa_select(score, nb, topk, r, n, heap, ref);
    char name[128];
    snprintf(name, sizeof name, "%s: r %lld topk %lld n %lld", what, (long long)r, (long long)topk, (long long)n);
    select_launch(name, score, nb, r, topk, n - 1, 1, got, cap, &ns_got);
    record(OP_SELECT, "kept keys", name, compare_sel(name, 0, ns_got, got, ns_ref, ref), 0.0);
    free(score); free(heap); free(ref); free(got);
}

/* ---------------------------------------------------------------- empty launches */

/* Every launcher returns STRATA_OK at once for no queries (or no blocks, or r 0): nothing is read or written,
 * so no buffers. */
static void empty_launches(void) {
    launched(OP_STORE, "K/V launch, L 0", "-",
             emu_qsa_store(NULL, NULL, NULL, QSA_KV_F32, 2, 8, 5, 0, NULL, NULL, NULL));
    launched(OP_STORE, "raw key launch, L 0", "-", emu_qsa_idx_store(NULL, NULL, 8, 5, 0, NULL));
    launched(OP_STORE, "block pool launch, no blocks", "-", emu_qsa_blk_pool(NULL, 8, 4, 3, 0, NULL, NULL));
    launched(OP_STORE, "block pool launch, r 0", "-", emu_qsa_blk_pool(NULL, 8, 0, 3, 2, NULL, NULL));
    launched(OP_INDEX, "launch, L 0", "-", emu_qsa_index(NULL, NULL, 2, 8, 4, 2, 100, 0, NULL, 25, NULL));
    launched(OP_INDEX, "launch, r 0", "-", emu_qsa_index(NULL, NULL, 2, 8, 0, 2, 100, 3, NULL, 25, NULL));
    launched(OP_SELECT, "launch, L 0", "-", emu_qsa_select(NULL, 25, 4, 2, 100, 0, NULL, 12, NULL, NULL));
    for (int kt = 0; kt < 3; kt++)
        launched(OP_ATTN_F32 + kt, "launch, L 0", "-",
                 emu_qsa_attn(NULL, NULL, NULL, kt, 4, 2, 8, 5, 0, NULL, NULL, NULL, 12, NULL, NULL, 6, NULL, NULL));
}

int main(void) {
    const double t0 = seconds();
    /* H, Hkv, hd, n_rot, nI, dI, r, budget, p0, L */
    static const shape shapes[] = {
        {24, 2, 256, 64, 4, 128, 4, 2048, 0, 5},      /* the real model: a first prefill, dense */
        {24, 2, 256, 64, 4, 128, 4, 2048, 2048, 4},   /* n 2049..2052: the last query's selection binds */
        {24, 2, 256, 64, 4, 128, 4, 2048, 3000, 1},   /* decode at n_past 3000 */
        {24, 2, 256, 64, 4, 128, 4, 256, 3000, 2},    /* ... with a small budget */
        {6, 3, 40, 16, 3, 24, 3, 12, 37, 5},          /* small odd: grouped 2, binds */
        {4, 1, 20, 8, 2, 16, 2, 6, 0, 23},            /* tiny: one prefill from 0, binds from n 8 */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) run_shape(&shapes[i], 0x5eed0000u + i);

    tie_case("levels", 4, 512, 3001, 0.3f, 4, 11);         /* topk inside a group of equal scores */
    tie_case("zeros", 4, 64, 3001, 0.95f, 3, 12);          /* fewer than topk blocks score > 0 */
    tie_case("all zero", 3, 4, 20, 1.0f, 0, 13);           /* every block tied: the lowest ones */
    tie_case("r 1", 1, 7, 50, 0.5f, 2, 14);
    tie_case("uniform", 4, 512, 40001, 0.3f, 0, 15);       /* 10000 blocks, zeros tied */
    tie_case("dense", 4, 512, 2051, 0.0f, 0, 16);          /* nb == topk: every key */
    empty_launches();

    for (int op = 0; op < N_OPS; op++)
        printf("OP %s %s %s %.3g\n", op_name[op], op_types[op], op_fail[op] ? "fail" : "pass", op_err[op]);
    fprintf(stderr, "total %.2f s\n", seconds() - t0);
    if (!g_failed) printf("all checks passed\n");
    return g_failed != 0;
}
