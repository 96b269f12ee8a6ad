/*
 * ops.c — the small numeric primitives the blocks share: matmul of a bound weight, the RMS norms
 * (spec §2: N1 with folded (1+w), grouped per stream), and partial NeoX RoPE (spec §1.4).
 * All in fp32, as transformers computes an fp32 model.
 */
#include "model.h"

#include <math.h>
#include <stdlib.h>

#include "util/error.h"

#include "kernels/cpu/gemm.h"

/* y [L x w.rows] *= the .scale of matrix mi of w, where it has one. */
static void apply_scale(const mdl_mat *w, int64_t mi, int64_t L, float *y) {
    if (!w->scale) return;
    const float s = mdl_mat_scale(w, mi);
    for (int64_t i = 0; i < L * w->rows; i++) y[i] *= s;
}

strata_status mdl_matmul(const strata_model *m, const mdl_mat *w, int64_t mi, const float *x, int64_t L,
                         float *y) {
    const char *data = w->data + (size_t)mi * w->mat_bytes;
    /* float weights times many columns (prefill) take the f32 GEMM, the rest the dot products
     * (the choice, its measurements and STRATA_GEMM are in kernels/cpu/gemm.c) */
    strata_status rc = strata_mm_auto(m->pool, w->t, m->isa, data, w->rows, w->cols, x, L, y);
    if (rc) return rc;
    apply_scale(w, mi, L, y);
    return STRATA_OK;
}

strata_status mdl_matmul_set(const strata_model *m, const mdl_mat *const *ws, int n, const float *x, int64_t L,
                             float *const *ys) {
    strata_mm_item it[MDL_MATMUL_SET_MAX];
    if (n < 1 || n > MDL_MATMUL_SET_MAX)
        return strata_fail(STRATA_ERR_INTERNAL, "mdl_matmul_set: %d products (1..%d)", n, MDL_MATMUL_SET_MAX);
    for (int i = 0; i < n; i++)
        it[i] = (strata_mm_item){.t = ws[i]->t, .w = ws[i]->data, .rows = ws[i]->rows, .cols = ws[i]->cols,
                                 .x = x, .n = L, .y = ys[i]};
    strata_status rc = strata_mm_multi_auto(m->pool, m->isa, it, n);
    for (int i = 0; i < n && !rc; i++) apply_scale(ws[i], 0, L, ys[i]);
    return rc;
}

void mdl_rmsnorm(const float *x, const float *w, int64_t n, float eps, float *y) {
    /* the squares (exact in double) into eight partial sums, value i into sum i mod 8, added pairwise:
     * a fixed order that vectorises, where one running sum is a serial chain of n dependent adds */
    double p[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) p[j] += (double)x[i + j] * x[i + j];
    for (int j = 0; i < n; i++, j++) p[j] += (double)x[i] * x[i];
    const double ss = ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
    const float r = 1.0f / sqrtf((float)(ss / (double)n) + eps);
    if (w) for (int64_t k = 0; k < n; k++) y[k] = x[k] * r * w[k];
    else for (int64_t k = 0; k < n; k++) y[k] = x[k] * r;
}

void mdl_group_rmsnorm(const float *x, const float *w, int64_t groups, int64_t n, float eps, float *y) {
    for (int64_t g = 0; g < groups; g++) mdl_rmsnorm(x + g * n, w ? w + g * n : NULL, n, eps, y + g * n);
}

void mdl_rope_angles(float theta, int32_t n_rot, int64_t pos, float *cs, float *sn) {
    /* inv_freq_i = 1 / theta^(2i / n_rot) and the angle pos * inv_freq_i, both fp32 */
    const float p = (float)pos;
    for (int32_t i = 0; i < n_rot / 2; i++) {
        const float inv = 1.0f / powf(theta, (float)(2 * i) / (float)n_rot);
        const float a = p * inv;
        cs[i] = cosf(a);
        sn[i] = sinf(a);
    }
}

void mdl_rope(float *x, int32_t n_rot, const float *cs, const float *sn) {
    const int32_t h = n_rot / 2;
    for (int32_t i = 0; i < h; i++) {
        const float a = x[i], b = x[i + h];
        x[i] = a * cs[i] - b * sn[i];
        x[i + h] = b * cs[i] + a * sn[i];
    }
}

typedef struct {
    strata_task_fn fn;
    void *const *args;
    const int64_t *start;   /* [n + 1] prefix sums of the task counts */
    int n;
} multi_job;

static void multi_task(void *arg, int64_t k, int thread) {
    const multi_job *M = arg;
    int lo = 0, hi = M->n - 1;      /* the job whose range holds k: start[i] <= k < start[i + 1] */
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (M->start[mid] <= k) lo = mid; else hi = mid - 1;
    }
    M->fn(M->args[lo], k - M->start[lo], thread);
}

strata_status mdl_pool_run_multi(strata_pool *pool, strata_task_fn fn, void *const *args, const int64_t *counts, int n) {
    int64_t *start = malloc((size_t)(n + 1) * sizeof *start);
    if (!start) return strata_fail(STRATA_ERR_NOMEM, "no memory for a pool job");
    start[0] = 0;
    for (int i = 0; i < n; i++) start[i + 1] = start[i] + counts[i];
    const multi_job M = {.fn = fn, .args = args, .start = start, .n = n};
    strata_pool_run(pool, multi_task, (void *)&M, start[n]);
    free(start);
    return STRATA_OK;
}
