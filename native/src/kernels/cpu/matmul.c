/*
 * matmul.c — W[rows, cols] x X[n, cols]^T on the persistent pool.
 *
 * 1. X is converted once to the weight type's activation format (parallel over rows of X).
 * 2. W is cut into row chunks (tasks). A task walks its rows in column tiles of up to
 *    COL_TILE activation rows, so a weight chunk is decoded from cache for every tile and a
 *    tile of activations stays in L1/L2 across the rows of the chunk.
 * Every output element comes from one vec_dot call whose result does not depend on the
 * tile it was computed in, so results are identical for any n, chunking and thread count.
 */
#include "matmul.h"

#include <stdlib.h>

#include "../../util/error.h"

enum { COL_TILE = 16 };

typedef struct {
    const strata_qtraits *t;
    int isa;
    const char *w;
    size_t w_row;          /* bytes per weight row */
    int64_t rows, cols, n;
    const void *xa;        /* activations in the act format */
    size_t xa_row;         /* bytes per activation row */
    const float *x;        /* source floats (for act quantization) */
    float *y;
    int64_t rows_per_task;
} mm_job;

static void act_task(void *arg, int64_t j, int thread) {
    (void)thread;
    mm_job *m = arg;
    void *dst = (char *)m->xa + (size_t)j * m->xa_row;
    const float *src = m->x + j * m->cols;
    if (m->t->act == STRATA_ACT_Q8_32) strata_act_quantize_q8_32(src, dst, m->cols, m->isa);
    else strata_act_quantize_q8_256(src, dst, m->cols, m->isa);
}

static void mm_task(void *arg, int64_t task, int thread) {
    (void)thread;
    mm_job *m = arg;
    const int64_t r0 = task * m->rows_per_task;
    const int64_t r1 = r0 + m->rows_per_task < m->rows ? r0 + m->rows_per_task : m->rows;
    const strata_vec_dot_fn dot = m->t->vec_dot[m->isa];
    float tmp[COL_TILE];
    for (int64_t j0 = 0; j0 < m->n; j0 += COL_TILE) {
        const int nc = (int)(m->n - j0 < COL_TILE ? m->n - j0 : COL_TILE);
        const char *xa = (const char *)m->xa + (size_t)j0 * m->xa_row;
        for (int64_t r = r0; r < r1; r++) {
            dot(m->cols, m->w + (size_t)r * m->w_row, xa, m->xa_row, nc, tmp);
            for (int c = 0; c < nc; c++) m->y[(j0 + c) * m->rows + r] = tmp[c];
        }
    }
}

strata_status strata_matmul_run(strata_pool *pool, const strata_qtraits *t, int isa,
                                const void *w, int64_t rows, int64_t cols, const float *x,
                                int64_t n, float *y) {
    mm_job m = {0};
    m.t = t;
    m.isa = isa;
    m.w = w;
    m.w_row = (size_t)(cols / t->block_size) * (size_t)t->type_size;
    m.rows = rows;
    m.cols = cols;
    m.n = n;
    m.x = x;
    m.y = y;
    void *buf = NULL;
    if (t->act == STRATA_ACT_F32) {
        m.xa = x;
        m.xa_row = (size_t)cols * sizeof(float);
    } else {
        m.xa_row = t->act == STRATA_ACT_Q8_32 ? (size_t)(cols / 32) * sizeof(act_q8_32)
                                              : (size_t)(cols / QK_K) * sizeof(act_q8_256);
        if (t->act == STRATA_ACT_Q8_256 && cols % QK_K)
            return strata_fail(STRATA_ERR_INTERNAL, "%s: cols %lld not a multiple of 256", t->name, (long long)cols);
        buf = malloc(m.xa_row * (size_t)n);
        if (!buf) return strata_fail(STRATA_ERR_NOMEM, "matmul: no memory for %lld activation rows", (long long)n);
        m.xa = buf;
        strata_pool_run(n > 1 ? pool : NULL, act_task, &m, n);
    }
    /* Enough tasks to balance the pool (about 8 per thread, at most 64 rows each), but each
     * worth at least MIN_TASK_BYTES of weight-bytes x columns, so that a small matrix is not
     * split into tasks cheaper than handing them to another thread. */
    enum { MIN_TASK_BYTES = 32 << 10 };
    const int nt = strata_pool_n_threads(pool);
    const int64_t work_row = (int64_t)m.w_row * (n < COL_TILE ? n : COL_TILE);
    const int64_t min_rows = (MIN_TASK_BYTES + work_row - 1) / work_row;
    int64_t rpt = rows / ((int64_t)nt * 8);
    if (rpt > 64) rpt = 64;
    if (rpt < min_rows) rpt = min_rows;
    m.rows_per_task = rpt;
    strata_pool_run(pool, mm_task, &m, (rows + rpt - 1) / rpt);
    free(buf);
    return STRATA_OK;
}
