/*
 * matmul.c — W[rows, cols] x X[n, cols]^T on the persistent pool.
 *
 * 1. X is converted once to the weight type's activation format (parallel over rows of X).
 * 2. W is cut into row chunks (tasks). A task walks its rows in column tiles of up to
 *    COL_TILE activation rows, so a weight chunk is decoded from cache for every tile and a
 *    tile of activations stays in L1/L2 across the rows of the chunk.
 * Every output element comes from one vec_dot call whose result does not depend on the
 * tile it was computed in, so results are identical for any n, chunking and thread count.
 * 3. Products of many columns (prefill) of a type with a converted layout on this path take
 *    tasks of STRATA_CONV_ROWS rows instead, each decoded once into the thread's scratch and
 *    multiplied by every column (conv_path; "repack" in strata.h's strata_set_repack). The
 *    converted kernels return vec_dot's floats bit for bit, so this changes no result either.
 */
#include "matmul.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../../util/carve.h"
#include "../../util/error.h"
#if STRATA_HAVE_AVX2
#include "avx2_iq.h"
#endif

enum { COL_TILE = 16,
       CONV_MIN_COLS = 96 /* products of at least this many columns convert their rows (conv[isa]) */ };

/* strata_set_repack's value (1 on, the default; 0 off). Relaxed: set before forward calls start. */
static _Atomic int g_repack = 1;

int strata_matmul_set_repack(int on) { return atomic_exchange_explicit(&g_repack, on ? 1 : 0, memory_order_relaxed); }

/* Whether this product takes the conversion path: STRATA_CONV_ROWS rows per task decoded once into
 * the path's converted layout (a thread's scratch), then multiplied by every column (quant.h). The
 * layouts in use take act_q8_256 activations (and their codes widened to int16).
 * Measured (IQ2_XS 2560 x 2560, 2 threads, GFLOP/s converted vs plain, two runs each): 8 columns
 * 22 vs 104, 32: 63 vs 96, 64: 102 vs 107, 128: 133 vs 106, 512 (1 thread) 78-84 vs 55-58. */
static int conv_path(const strata_qtraits *t, int isa, int64_t n) {
    return n >= CONV_MIN_COLS && t->act == STRATA_ACT_Q8_256 && t->conv[isa] && t->conv_dot[isa] &&
           atomic_load_explicit(&g_repack, memory_order_relaxed);
}

/* One thread's scratch for rows of cols values, whatever the setting. */
static size_t conv_bytes(const strata_qtraits *t, int isa, int64_t cols) {
    return (t->conv[isa](cols, NULL, 0, STRATA_CONV_ROWS, NULL) + 63) & ~(size_t)63;
}

size_t strata_matmul_conv_bytes(const strata_qtraits *t, int isa, int64_t cols) {
    if (t->act != STRATA_ACT_Q8_256 || !t->conv[isa] || !atomic_load_explicit(&g_repack, memory_order_relaxed)) return 0;
    return conv_bytes(t, isa, cols);
}

/* Rows r0..r1 (at most STRATA_CONV_ROWS) converted into scratch, then against all n columns (x16:
 * their codes as int16, cols per column). */
static void conv_rows(const strata_qtraits *t, int isa, const char *w, size_t w_row, int64_t rows, int64_t cols,
                      const void *xa, size_t xa_row, const int16_t *x16, int64_t n, float *y, int64_t r0, int64_t r1,
                      void *scratch) {
    t->conv[isa](cols, w + (size_t)r0 * w_row, w_row, r1 - r0, scratch);
    t->conv_dot[isa](cols, scratch, r1 - r0, xa, xa_row, x16, (int)n, y + r0, rows);
}

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
    int conv;              /* conversion path (conv_path) */
    char *scratch;         /* conv: per thread scratch_bytes */
    size_t scratch_bytes;
    int16_t *x16;          /* conv: the activation codes as int16, cols per row */
} mm_job;

/* Enough tasks to balance the pool (about 8 per thread, at most 64 rows each), but each worth at
 * least MIN_TASK_BYTES of weight-bytes x columns, so that a small matrix is not split into tasks
 * cheaper than handing them to another thread; a multiple of 8 rows, as the rows kernels take rows
 * eight at a time (avx2_legacy.c's qr_lanes, avx2_fp4.c) and hand a task's last rows % 8 to vec_dot
 * (at 2 and 3 columns 60- and 41-row tasks left 4 and 1). */
static int64_t rows_per_task(size_t w_row, int64_t rows, int64_t n, int n_threads) {
    enum { MIN_TASK_BYTES = 32 << 10 };
    const int64_t work_row = (int64_t)w_row * (n < COL_TILE ? n : COL_TILE);
    const int64_t min_rows = (MIN_TASK_BYTES + work_row - 1) / work_row;
    int64_t rpt = rows / ((int64_t)n_threads * 8);
    if (rpt > 64) rpt = 64;
    if (rpt < min_rows) rpt = min_rows;
    return (rpt + 7) & ~(int64_t)7;
}

/* Whether the type's rows kernel for this path takes a product of n columns of cols values (its
 * rows_when bits), else vec_dot does. */
static int rows_admit(const strata_qtraits *t, int isa, int64_t n, int64_t cols) {
    const unsigned when = t->rows_when[isa];
    if (!t->rows[isa]) return 0;
    if (n == 1) return (when & STRATA_ROWS_SHORT1) && cols / t->block_size <= 16;
    return (when & STRATA_ROWS_MULTI) && (n >= 8 || !(when & STRATA_ROWS_FROM8));
}

/* Whether the activations of this product are stored biased (codes q ^ 0x80) for a rows kernel
 * that wants them so (STRATA_ROWS_BIASED: avx2_iq.c's IQ2_XXS, IQ2_XS, IQ3_XXS). */
static int act_biased(const strata_qtraits *t, int isa, int64_t n, int64_t cols, int conv) {
    return !conv && rows_admit(t, isa, n, cols) && (t->rows_when[isa] & STRATA_ROWS_BIASED);
}

static void act_quantize(const strata_qtraits *t, int isa, int biased, const float *src, void *dst, int64_t cols) {
    if (t->act == STRATA_ACT_Q8_32) {
        strata_act_quantize_q8_32(src, dst, cols, isa);
        return;
    }
    strata_act_quantize_q8_256(src, dst, cols, isa);
#if STRATA_HAVE_AVX2
    if (biased) strata_act_bias_q8_256(dst, cols);
#else
    (void)biased;
#endif
}

/* Rows r0..r1 against all n columns with the type's rows kernel for this path, where it has one and
 * its rows_when admits the product (same results as vec_dot, bit for bit). Returns 0 if not.
 * Measured on AVX2 (avx2_fp4.c): the 4-bit table formats load an activation block once for 8 rows,
 * 1.2-1.5x on long rows at 128 columns, and at one column 1.2-4x on rows of at most 16 blocks (the
 * 96-wide IQ4_NL expert down rows are 3 blocks, the 320-wide rows 10 IQ4_NL or 5 NVFP4); a long row
 * at one column is faster on the row path. */
static int rows_kernel(const strata_qtraits *t, int isa, const char *w, size_t w_row, int64_t rows, int64_t cols,
                       const void *xa, size_t xa_row, int64_t n, float *y, int64_t r0, int64_t r1) {
    const strata_rows_fn fn = t->rows[isa];
    if (!rows_admit(t, isa, n, cols)) return 0;
    for (int64_t j0 = 0; j0 < n; j0 += COL_TILE) {
        const int nc = (int)(n - j0 < COL_TILE ? n - j0 : COL_TILE);
        fn(cols, w + (size_t)r0 * w_row, w_row, r1 - r0, (const char *)xa + (size_t)j0 * xa_row, xa_row, nc,
           y + j0 * rows + r0, rows);
    }
    return 1;
}

static void act_task(void *arg, int64_t j, int thread) {
    (void)thread;
    mm_job *m = arg;
    void *dst = (char *)m->xa + (size_t)j * m->xa_row;
    act_quantize(m->t, m->isa, act_biased(m->t, m->isa, m->n, m->cols, m->conv), m->x + j * m->cols, dst, m->cols);
    if (m->conv) strata_act_widen_q8_256(dst, m->cols, m->x16 + j * m->cols);
}

static void mm_task(void *arg, int64_t task, int thread) {
    mm_job *m = arg;
    const int64_t r0 = task * m->rows_per_task;
    const int64_t r1 = r0 + m->rows_per_task < m->rows ? r0 + m->rows_per_task : m->rows;
    if (m->conv) {
        conv_rows(m->t, m->isa, m->w, m->w_row, m->rows, m->cols, m->xa, m->xa_row, m->x16, m->n, m->y, r0, r1,
                  m->scratch + (size_t)thread * m->scratch_bytes);
        return;
    }
    if (rows_kernel(m->t, m->isa, m->w, m->w_row, m->rows, m->cols, m->xa, m->xa_row, m->n, m->y, r0, r1)) return;
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
    m.conv = conv_path(t, isa, n);
    void *buf = NULL;
    if (t->act == STRATA_ACT_F32) {
        m.xa = x;
        m.xa_row = (size_t)cols * sizeof(float);
    } else {
        m.xa_row = t->act == STRATA_ACT_Q8_32 ? (size_t)(cols / 32) * sizeof(act_q8_32)
                                              : (size_t)(cols / QK_K) * sizeof(act_q8_256);
        if (t->act == STRATA_ACT_Q8_256 && cols % QK_K)
            return strata_fail(STRATA_ERR_INTERNAL, "%s: cols %lld not a multiple of 256", t->name, (long long)cols);
        /* the conversion path's int16 codes after the quantized rows */
        const size_t x16_at = (m.xa_row * (size_t)n + 63) & ~(size_t)63;
        buf = malloc(m.conv ? x16_at + (size_t)n * (size_t)cols * sizeof(int16_t) : m.xa_row * (size_t)n);
        if (!buf) return strata_fail(STRATA_ERR_NOMEM, "matmul: no memory for %lld activation rows", (long long)n);
        m.xa = buf;
        if (m.conv) m.x16 = (int16_t *)((char *)buf + x16_at);
        strata_pool_run(n > 1 ? pool : NULL, act_task, &m, n);
    }
    const int nth = strata_pool_n_threads(pool);
    int64_t rpt = rows_per_task(m.w_row, rows, n, nth);
    if (m.conv) {
        rpt = STRATA_CONV_ROWS;
        m.scratch_bytes = conv_bytes(t, isa, cols);
        m.scratch = aligned_alloc(64, m.scratch_bytes * (size_t)nth);
        if (!m.scratch) {
            free(buf);
            return strata_fail(STRATA_ERR_NOMEM, "matmul: no memory for %zu bytes of converted rows", m.scratch_bytes * (size_t)nth);
        }
    }
    m.rows_per_task = rpt;
    strata_pool_run(pool, mm_task, &m, (rows + rpt - 1) / rpt);
    free(m.scratch);
    free(buf);
    return STRATA_OK;
}

/* ---------------------------------------------------------------- several matmuls in one job
 *
 * Activations are quantized per source row, once: items whose x rows are copies of rows of one
 * source (strata_mm_item.x_src: a MoE layer's tokens gathered per expert; an item without x_src is
 * its own source) and that want the same activation format share one quantized copy of the rows
 * they use, and an item that reads a subset or a reordering gets those quantized rows copied into
 * its own buffer (a copy of a 292-byte block row costs a fraction of quantizing 256 floats). Rows are
 * quantized the same way wherever they go, so every product is what strata_matmul_run returns. */

typedef struct {
    const float *src;          /* source rows (x_src, or the item's own x) */
    int64_t cols, n_src;       /* row length; rows 0..n_src-1 may be used */
    strata_act_kind act;
    int biased;
    size_t xa_row;
    char *buf;                 /* n_src quantized rows (only the used ones written) */
} act_group;

typedef struct {
    const strata_mm_item *items;
    int isa;
    const strata_qtraits *const *gt;   /* per group: a type that wants its format (for act_quantize) */
    act_group *groups;
    void **xa;             /* per item: activations in its act format (or its x) */
    size_t *xa_row;
    const int64_t (*qrows)[2]; /* quantization tasks: (group, source row) */
    const int *gather;         /* items whose rows are copied out of their group's buffer */
    const int *group_of;       /* per item: its group, or -1 (float activations) */
    const int64_t (*tasks)[3]; /* row tasks: (item, r0, r1) */
    const uint8_t *conv;       /* per item: conversion path (conv_path) */
    char *scratch;             /* per thread scratch_bytes, for the conversion path */
    size_t scratch_bytes;
    int16_t **x16;             /* per item on the conversion path: its rows' codes as int16 */
    const int *widen;          /* those items */
} mm_multi;

static int64_t src_row(const strata_mm_item *it, int64_t j) { return it->x_src ? it->x_src_rows[j] : j; }

static void multi_act_task(void *arg, int64_t task, int thread) {
    (void)thread;
    const mm_multi *M = arg;
    const act_group *g = &M->groups[M->qrows[task][0]];
    const int64_t r = M->qrows[task][1];
    act_quantize(M->gt[M->qrows[task][0]], M->isa, g->biased, g->src + r * g->cols, g->buf + (size_t)r * g->xa_row,
                 g->cols);
}

static void multi_gather_task(void *arg, int64_t task, int thread) {
    (void)thread;
    const mm_multi *M = arg;
    const int i = M->gather[task];
    const strata_mm_item *it = &M->items[i];
    const act_group *g = &M->groups[M->group_of[i]];
    for (int64_t j = 0; j < it->n; j++)
        memcpy((char *)M->xa[i] + (size_t)j * g->xa_row, g->buf + (size_t)src_row(it, j) * g->xa_row, g->xa_row);
}

static void multi_widen_task(void *arg, int64_t task, int thread) {
    (void)thread;
    const mm_multi *M = arg;
    const int i = M->widen[task];
    const strata_mm_item *it = &M->items[i];
    for (int64_t j = 0; j < it->n; j++)
        strata_act_widen_q8_256((const act_q8_256 *)((const char *)M->xa[i] + (size_t)j * M->xa_row[i]), it->cols,
                                M->x16[i] + j * it->cols);
}

static void multi_mm_task(void *arg, int64_t task, int thread) {
    const mm_multi *M = arg;
    const strata_mm_item *it = &M->items[M->tasks[task][0]];
    const int64_t r0 = M->tasks[task][1], r1 = M->tasks[task][2];
    const size_t w_row = (size_t)(it->cols / it->t->block_size) * (size_t)it->t->type_size;
    const size_t xa_row = M->xa_row[M->tasks[task][0]];
    if (M->conv[M->tasks[task][0]]) {
        conv_rows(it->t, M->isa, it->w, w_row, it->rows, it->cols, M->xa[M->tasks[task][0]], xa_row,
                  M->x16[M->tasks[task][0]], it->n, it->y, r0, r1, M->scratch + (size_t)thread * M->scratch_bytes);
        return;
    }
    if (rows_kernel(it->t, M->isa, it->w, w_row, it->rows, it->cols, M->xa[M->tasks[task][0]], xa_row, it->n, it->y,
                    r0, r1))
        return;
    const strata_vec_dot_fn dot = it->t->vec_dot[M->isa];
    const char *w = it->w;
    float tmp[COL_TILE];
    for (int64_t j0 = 0; j0 < it->n; j0 += COL_TILE) {
        const int nc = (int)(it->n - j0 < COL_TILE ? it->n - j0 : COL_TILE);
        const char *xa = (const char *)M->xa[M->tasks[task][0]] + (size_t)j0 * xa_row;
        for (int64_t r = r0; r < r1; r++) {
            dot(it->cols, w + (size_t)r * w_row, xa, xa_row, nc, tmp);
            for (int c = 0; c < nc; c++) it->y[(j0 + c) * it->rows + r] = tmp[c];
        }
    }
}

/* Whether item it reads its group's rows 0..n-1 in order (then it uses the group buffer in place). */
static int reads_in_place(const strata_mm_item *it) {
    if (!it->x_src) return 1;
    for (int64_t j = 0; j < it->n; j++)
        if (it->x_src_rows[j] != j) return 0;
    return 1;
}

strata_status strata_matmul_multi(strata_pool *pool, int isa, const strata_mm_item *items, int n_items) {
    if (n_items <= 0) return STRATA_OK;
    /* the per-item arrays in one zeroed block (a decode step runs ~20 of these calls: one allocation
     * each, not eleven) */
    const size_t ni = (size_t)n_items;
    size_t meta_bytes = 0;
    const size_t o_xa = carve(&meta_bytes, ni * sizeof(void *), 16), o_row = carve(&meta_bytes, ni * sizeof(size_t), 16),
                 o_grp = carve(&meta_bytes, ni * sizeof(int), 16), o_share = carve(&meta_bytes, ni * sizeof(int), 16),
                 o_gather = carve(&meta_bytes, ni * sizeof(int), 16),
                 o_groups = carve(&meta_bytes, ni * sizeof(act_group), 16),
                 o_gt = carve(&meta_bytes, ni * sizeof(strata_qtraits *), 16),
                 o_used = carve(&meta_bytes, ni * sizeof(uint8_t *), 16), o_conv = carve(&meta_bytes, ni, 16),
                 o_x16 = carve(&meta_bytes, ni * sizeof(int16_t *), 16), o_widen = carve(&meta_bytes, ni * sizeof(int), 16);
    char *meta = calloc(1, meta_bytes);
    if (!meta) return strata_fail(STRATA_ERR_NOMEM, "matmul: no memory");
    void **xa = (void **)(meta + o_xa);
    size_t *xa_row = (size_t *)(meta + o_row);
    int *group_of = (int *)(meta + o_grp);
    int *share = (int *)(meta + o_share);       /* item whose gathered rows it reuses, or itself */
    int *gather = (int *)(meta + o_gather);
    act_group *groups = (act_group *)(meta + o_groups);
    const strata_qtraits **gt = (const strata_qtraits **)(meta + o_gt);
    uint8_t **used = (uint8_t **)(meta + o_used);
    uint8_t *conv = (uint8_t *)(meta + o_conv);
    int16_t **x16 = (int16_t **)(meta + o_x16);
    int *widen = (int *)(meta + o_widen);
    int n_widen = 0;
    char *bufs = NULL;   /* the activation rows (group and gathered), the quantize list and the tasks */
    char *scratch = NULL;
    size_t scratch_bytes = 0;
    int64_t (*tasks)[3] = NULL;
    int64_t (*qrows)[2] = NULL;
    char *gbuf = NULL, *ibuf = NULL;
    strata_status rc = STRATA_OK;
    int n_groups = 0, n_gather = 0;
    int64_t nq = 0, nt = 0;
    const int nth = strata_pool_n_threads(pool);
    /* 1. the activation groups, and the source rows each uses */
    for (int i = 0; i < n_items; i++) {
        const strata_mm_item *it = &items[i];
        share[i] = i;
        group_of[i] = -1;
        if (it->t->act == STRATA_ACT_F32) { xa[i] = (void *)it->x; xa_row[i] = (size_t)it->cols * sizeof(float); continue; }
        if (it->t->act == STRATA_ACT_Q8_256 && it->cols % QK_K) {
            rc = strata_fail(STRATA_ERR_INTERNAL, "%s: cols %lld not a multiple of 256", it->t->name, (long long)it->cols);
            goto done;
        }
        xa_row[i] = it->t->act == STRATA_ACT_Q8_32 ? (size_t)(it->cols / 32) * sizeof(act_q8_32)
                                                    : (size_t)(it->cols / QK_K) * sizeof(act_q8_256);
        const float *src = it->x_src ? it->x_src : it->x;
        conv[i] = (uint8_t)conv_path(it->t, isa, it->n);
        if (conv[i]) {
            const size_t b = conv_bytes(it->t, isa, it->cols);
            if (b > scratch_bytes) scratch_bytes = b;
        }
        const int biased = act_biased(it->t, isa, it->n, it->cols, conv[i]);
        int64_t n_src = 0;
        for (int64_t j = 0; j < it->n; j++) if (src_row(it, j) + 1 > n_src) n_src = src_row(it, j) + 1;
        int g = 0;
        while (g < n_groups && !(groups[g].src == src && groups[g].cols == it->cols && groups[g].act == it->t->act &&
                                 groups[g].biased == biased))
            g++;
        if (g == n_groups) {
            groups[g] = (act_group){.src = src, .cols = it->cols, .act = it->t->act, .biased = biased,
                                    .xa_row = xa_row[i]};
            gt[g] = it->t;
            n_groups++;
        }
        if (n_src > groups[g].n_src) {
            uint8_t *u = realloc(used[g], (size_t)n_src);
            if (!u) { rc = strata_fail(STRATA_ERR_NOMEM, "matmul: no memory"); goto done; }
            memset(u + groups[g].n_src, 0, (size_t)(n_src - groups[g].n_src));
            used[g] = u;
            groups[g].n_src = n_src;
        }
        for (int64_t j = 0; j < it->n; j++) used[g][src_row(it, j)] = 1;
        group_of[i] = g;
    }
    /* 2. buffers: every group's rows, then each gathering item's own copy (shared by items that name
     * the same rows of the same group, e.g. an expert's gate and up) */
    size_t gbytes = 0, ibytes = 0;
    for (int g = 0; g < n_groups; g++) {
        gbytes += groups[g].xa_row * (size_t)groups[g].n_src;
        for (int64_t r = 0; r < groups[g].n_src; r++) nq += used[g][r];
    }
    for (int i = 0; i < n_items; i++) {
        if (group_of[i] < 0 || reads_in_place(&items[i])) continue;
        for (int k = 0; k < i; k++)
            if (group_of[k] == group_of[i] && share[k] == k && items[k].x_src_rows == items[i].x_src_rows &&
                items[k].n == items[i].n && !reads_in_place(&items[k])) { share[i] = k; break; }
        if (share[i] == i) { gather[n_gather++] = i; ibytes += xa_row[i] * (size_t)items[i].n; }
    }
    /* 3. row tasks per item, cut as a single matmul is */
    for (int i = 0; i < n_items; i++) {
        const strata_mm_item *it = &items[i];
        const size_t w_row = (size_t)(it->cols / it->t->block_size) * (size_t)it->t->type_size;
        const int64_t rpt = conv[i] ? STRATA_CONV_ROWS : rows_per_task(w_row, it->rows, it->n, nth);
        nt += (it->rows + rpt - 1) / rpt;
    }
    size_t buf_bytes = 0;
    const size_t o_g = carve(&buf_bytes, gbytes, 64), o_i = carve(&buf_bytes, ibytes, 64),
                 o_q = carve(&buf_bytes, (size_t)nq * sizeof *qrows, 16), o_t = carve(&buf_bytes, (size_t)nt * sizeof *tasks, 16);
    if (!(bufs = malloc(buf_bytes ? buf_bytes : 1))) {
        rc = strata_fail(STRATA_ERR_NOMEM, "matmul: no memory for %lld activation rows", (long long)nq);
        goto done;
    }
    gbuf = bufs + o_g;
    ibuf = bufs + o_i;
    qrows = (int64_t (*)[2])(bufs + o_q);
    tasks = (int64_t (*)[3])(bufs + o_t);
    {
        size_t off = 0;
        int64_t q = 0;
        for (int g = 0; g < n_groups; g++) {
            groups[g].buf = gbuf + off;
            off += groups[g].xa_row * (size_t)groups[g].n_src;
            for (int64_t r = 0; r < groups[g].n_src; r++)
                if (used[g][r]) { qrows[q][0] = g; qrows[q][1] = r; q++; }
        }
        off = 0;
        for (int i = 0; i < n_items; i++) {
            if (group_of[i] < 0) continue;
            if (reads_in_place(&items[i])) { xa[i] = groups[group_of[i]].buf; continue; }
            if (share[i] == i) { xa[i] = ibuf + off; off += xa_row[i] * (size_t)items[i].n; }
        }
        for (int i = 0; i < n_items; i++) if (share[i] != i) xa[i] = xa[share[i]];
    }
    if (scratch_bytes && !(scratch = aligned_alloc(64, scratch_bytes * (size_t)nth))) {
        rc = strata_fail(STRATA_ERR_NOMEM, "matmul: no memory for %zu bytes of converted rows", scratch_bytes * (size_t)nth);
        goto done;
    }
    for (int i = 0; i < n_items; i++) {
        if (!conv[i]) continue;
        if (!(x16[i] = malloc((size_t)items[i].n * (size_t)items[i].cols * sizeof(int16_t)))) {
            rc = strata_fail(STRATA_ERR_NOMEM, "matmul: no memory for %lld activation rows", (long long)items[i].n);
            goto done;
        }
        widen[n_widen++] = i;
    }
    {
        int64_t k = 0;
        for (int i = 0; i < n_items; i++) {
            const strata_mm_item *it = &items[i];
            const size_t w_row = (size_t)(it->cols / it->t->block_size) * (size_t)it->t->type_size;
            const int64_t rpt = conv[i] ? STRATA_CONV_ROWS : rows_per_task(w_row, it->rows, it->n, nth);
            for (int64_t r0 = 0; r0 < it->rows; r0 += rpt) {
                tasks[k][0] = i; tasks[k][1] = r0; tasks[k][2] = r0 + rpt < it->rows ? r0 + rpt : it->rows;
                k++;
            }
        }
    }
    mm_multi M = {.items = items, .isa = isa, .gt = gt, .groups = groups, .xa = xa, .xa_row = xa_row,
                  .qrows = (const int64_t (*)[2])qrows, .gather = gather, .group_of = group_of,
                  .tasks = (const int64_t (*)[3])tasks, .conv = conv, .scratch = scratch,
                  .scratch_bytes = scratch_bytes, .x16 = x16, .widen = widen};
    if (nq) strata_pool_run(nq > 1 ? pool : NULL, multi_act_task, &M, nq);
    if (n_gather) strata_pool_run(n_gather > 1 ? pool : NULL, multi_gather_task, &M, n_gather);
    if (n_widen) strata_pool_run(n_widen > 1 ? pool : NULL, multi_widen_task, &M, n_widen);
    strata_pool_run(pool, multi_mm_task, &M, nt);
done:
    for (int i = 0; i < n_items; i++) {
        free(used[i]);
        free(x16[i]);
    }
    free(meta);
    free(bufs);
    free(scratch);
    return rc;
}
