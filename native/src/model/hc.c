/*
 * hc.c — hyper-connections (spec §5): the multi-stream residual state X = hc streams of E.
 *
 * Read:  X̂ = G(X; w_n) (one RMS per stream), a = silu(W_down X̂ / hc), m = σ(W_up a),
 *        u = mean_j m_j ⊙ X̂_j, and with an inject matrix c = 2 σ(W_inj X̂ / hc).
 * Write: X_j += c_j · y, on the un-normalised state.
 */
#include "model.h"

#include <stdlib.h>

#include "util/carve.h"
#include "util/error.h"

/* The elementwise steps of a read between its products, one function each so that the CUDA
 * kernels' host check (tests/native/test_cuda_ops_small.c) can compare with them. */

/* a[n] <- silu(a / hc): the division after W_down, before the activation. */
void mdl_hc_act(float *a, int64_t n, int64_t hc) {
    for (int64_t i = 0; i < n; i++) a[i] = ops_silu(a[i] / (float)hc);
}

/* u[L x E] = (1/hc) sum_j sigmoid(g_j) * xh_j, the streams of g and xh [L x hc*E] in order (stream 0
 * first into each sum, as hc.cuh's unit does; the loop over d inside, so that it vectorises). */
static void hc_mix_stream(const float *restrict g, const float *restrict x, int64_t E, float *restrict u) {
    for (int64_t d = 0; d < E; d++) u[d] += ops_sigmoid(g[d]) * x[d];
}

void mdl_hc_mix(const float *g, const float *xh, int64_t L, int64_t hc, int64_t E, float *u) {
    const int64_t W = hc * E;
    const float inv_hc = 1.0f / (float)hc;
    for (int64_t t = 0; t < L; t++) {
        float *ut = u + t * E;
        for (int64_t d = 0; d < E; d++) ut[d] = 0.0f;
        for (int64_t j = 0; j < hc; j++) hc_mix_stream(g + t * W + j * E, xh + t * W + j * E, E, ut);
        for (int64_t d = 0; d < E; d++) ut[d] *= inv_hc;
    }
}

/* c[n] = 2 sigmoid(a / hc), a the W_inj product. */
void mdl_hc_inject_act(const float *a, int64_t n, int64_t hc, float *c) {
    for (int64_t i = 0; i < n; i++) c[i] = 2.0f * ops_sigmoid(a[i] / (float)hc);
}

/* The per-row steps of a read (the norms, and the mix: hc x E sigmoids a row) go over the pool, a task a
 * row, from this many rows on (batched decode, prefill); each row runs the same code on any thread,
 * so the bits do not change. 8-sequence decode of flash-small on 2 threads: the caller ran them alone
 * while the worker spun (perf: mdl_hc_read + expf ~9 % of a step). */
enum { HC_POOL_MIN_ROWS = 4 };

typedef struct {
    const strata_model *m;
    const float *X, *norm, *g;
    float *xh, *u;
} hc_rows;

static void hc_norm_task(void *arg, int64_t t, int thread) {
    (void)thread;
    const hc_rows *j = arg;
    const int64_t E = j->m->hp.n_embd, hc = j->m->hp.hc, W = hc * E;
    mdl_group_rmsnorm(j->X + t * W, j->norm, hc, E, j->m->hp.eps, j->xh + t * W);
}

static void hc_mix_task(void *arg, int64_t t, int thread) {
    (void)thread;
    const hc_rows *j = arg;
    const int64_t E = j->m->hp.n_embd, hc = j->m->hp.hc, W = hc * E;
    mdl_hc_mix(j->g + t * W, j->xh + t * W, 1, hc, E, j->u + t * E);
}

strata_status mdl_hc_read(const strata_model *m, const float *X, const float *norm, const mdl_mat *down,
                          const mdl_mat *up, const mdl_mat *inject, int64_t L, float *u, float *c) {
    const int64_t E = m->hp.n_embd, hc = m->hp.hc, W = hc * E, R = m->hp.hc_rank;
    size_t bytes = 0;
    const size_t o_xh = carve(&bytes, (size_t)(L * W) * sizeof(float), 64), o_g = carve(&bytes, (size_t)(L * W) * sizeof(float), 64),
                 o_a = carve(&bytes, (size_t)(L * (R + hc)) * sizeof(float), 64);
    char *buf = malloc(bytes);
    if (!buf) return strata_fail(STRATA_ERR_NOMEM, "hyper-connection read: no memory for %lld tokens", (long long)L);
    float *xh = (float *)(buf + o_xh), *g = (float *)(buf + o_g);
    float *a = (float *)(buf + o_a), *ai = a + L * R;   /* W_down's, the inject's */
    strata_status rc = STRATA_OK;
    strata_pool *pool = L >= HC_POOL_MIN_ROWS ? m->pool : NULL;
    const hc_rows rows = {.m = m, .X = X, .norm = norm, .g = g, .xh = xh, .u = u};
    strata_pool_run(pool, hc_norm_task, (void *)&rows, L);
    {   /* W_down and the inject read the same rows: one product job */
        const mdl_mat *ws[] = {down, inject};
        float *const ys[] = {a, ai};
        if ((rc = mdl_matmul_set(m, ws, inject ? 2 : 1, xh, L, ys))) goto done;
    }
    mdl_hc_act(a, L * R, hc);
    if ((rc = mdl_matmul(m, up, 0, a, L, g))) goto done;
    strata_pool_run(pool, hc_mix_task, (void *)&rows, L);
    if (inject) mdl_hc_inject_act(ai, L * hc, hc, c);
done:
    free(buf);
    return rc;
}

void mdl_hc_write(const strata_model *m, float *X, const float *c, const float *y, int64_t L) {
    const int64_t E = m->hp.n_embd, hc = m->hp.hc;
    for (int64_t t = 0; t < L; t++)
        for (int64_t j = 0; j < hc; j++) {
            float *xj = X + (t * hc + j) * E;
            const float cj = c[t * hc + j];
            const float *yt = y + t * E;
            for (int64_t d = 0; d < E; d++) xj[d] += cj * yt[d];
        }
}
