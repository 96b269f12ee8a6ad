/*
 * gemm.c — W[rows, cols] x X[n, cols]^T as dequantized f32 tiles times float activations
 * (the contract and the summation order are in gemm.h).
 *
 * A task owns a range of weight rows. It walks them in row blocks of `rb` rows (about
 * TILE_BYTES of floats, so the block stays in L2), decodes a block once with dequant[isa] into
 * its thread's scratch, then multiplies it by the activations in column blocks of NB rows of X
 * and depth chunks of KC values: a chunk of NB activation rows (NB x KC floats, 96 KiB) stays
 * in L2 while the register tiles of the block kernel sweep it, and the eight lane accumulators
 * of every output of the block carry over from one chunk to the next in scratch. KC is long
 * because each register-tile call pays for its accumulator loads, stores and horizontal sums
 * (measured per core: 26 GMAC/s with KC = 256, 42 with 1024, 44 unchunked). The split into
 * tasks, blocks and chunks changes which outputs are computed together, never the order of
 * the FMAs of one output, so results do not depend on the thread count or on n.
 */
#include "gemm.h"

#include <stdatomic.h>
#include <stdlib.h>

#include "../../util/error.h"

enum {
    TILE_BYTES = 512 << 10, /* dequantized weight rows per block: about this many bytes */
    RB_MAX = 48,            /* at most this many rows per block */
    RB_STEP = 3,            /* blocks are a multiple of the AVX2 kernel's 3 rows where possible */
    NB = 24,                /* activation rows per column block */
    KC = 1024,              /* depth chunk (a multiple of 8: lanes are k % 8 within a chunk too) */
    TILE_PAD = 16,          /* floats after each dequantized row, so rows do not share L1 sets */
    ROWS_PER_TASK_MAX = 96,
    MIN_TASK_MACS = 1 << 20 /* a task smaller than this costs more to hand out than to run */
};

/* ---------------------------------------------------------------- scalar block kernel */

static void scalar_block(const float *w, size_t ldw, int nrow, const float *x, size_t ldx, int ncol,
                         int64_t kc, int first, int last, float *acc, float *y, int64_t ldy) {
    for (int i = 0; i < nrow; i++) {
        const float *wr = w + (size_t)i * ldw;
        for (int j = 0; j < ncol; j++) {
            const float *xr = x + (size_t)j * ldx;
            float *a = acc + ((size_t)i * ncol + j) * 8;
            float l[8];
            for (int q = 0; q < 8; q++) l[q] = first ? 0.0f : a[q];
            for (int64_t k = 0; k < kc; k += 8)
                for (int q = 0; q < 8; q++) {
                    const int in = k + q < kc;
                    l[q] = fmaf(in ? wr[k + q] : 0.0f, in ? xr[k + q] : 0.0f, l[q]);
                }
            if (last) y[(size_t)j * ldy + i] = strata_hsum8(l);
            else memcpy(a, l, sizeof l);
        }
    }
}

static strata_gemm_block_fn block_fn(int isa) {
#if STRATA_HAVE_AVX2
    if (strata_isa_has_avx2(isa)) return strata_avx2_gemm_block;
#endif
    (void)isa;
    return scalar_block;
}

/* ---------------------------------------------------------------- one product, a row range */

static int64_t rows_per_block(int64_t cols) {
    int64_t rb = TILE_BYTES / ((int64_t)sizeof(float) * cols);
    if (rb > RB_MAX) rb = RB_MAX;
    if (rb >= RB_STEP) rb -= rb % RB_STEP;
    return rb < 1 ? 1 : rb;
}

/* Floats of scratch one thread needs for rows of this width. */
static size_t scratch_floats(int64_t cols) {
    const size_t rb = (size_t)rows_per_block(cols);
    return rb * (size_t)(cols + TILE_PAD) + rb * NB * 8; /* tile (unused by aligned F32) + lanes */
}

static int64_t rows_per_task(int64_t rows, int64_t cols, int64_t n, int n_threads) {
    int64_t rpt = (rows + (int64_t)n_threads * 8 - 1) / ((int64_t)n_threads * 8);
    rpt += (RB_STEP - rpt % RB_STEP) % RB_STEP;
    if (rpt > ROWS_PER_TASK_MAX) rpt = ROWS_PER_TASK_MAX;
    const int64_t macs = cols * n;
    const int64_t min_rows = (MIN_TASK_MACS + macs - 1) / macs;
    return rpt < min_rows ? min_rows : rpt;
}

static void gemm_rows(const strata_qtraits *t, int isa, const void *w, int64_t rows, int64_t cols,
                      const float *x, size_t ldx, int64_t n, float *y, int64_t r0, int64_t r1, float *scratch) {
    const size_t w_row = (size_t)(cols / t->block_size) * (size_t)t->type_size;
    const int64_t rb = rows_per_block(cols);
    /* F32 weights are used in place when their rows are 32-byte aligned (split loads cost twice) */
    const int in_place = t->type == GT_F32 && (uintptr_t)w % 32 == 0 && cols % 8 == 0;
    const size_t ldt = in_place ? (size_t)cols : (size_t)(cols + TILE_PAD);
    float *tile = scratch;
    float *acc = scratch + (size_t)rb * (size_t)(cols + TILE_PAD);
    const strata_dequant_fn deq = t->dequant[isa] ? t->dequant[isa] : t->dequant[STRATA_ISA_IDX_SCALAR];
    const strata_gemm_block_fn block = block_fn(isa);
    for (int64_t b0 = r0; b0 < r1; b0 += rb) {
        const int nrow = (int)(r1 - b0 < rb ? r1 - b0 : rb);
        const char *wb = (const char *)w + (size_t)b0 * w_row;
        const float *wt = tile;
        if (in_place) wt = (const float *)wb;
        else for (int i = 0; i < nrow; i++) deq(wb + (size_t)i * w_row, tile + (size_t)i * ldt, cols);
        for (int64_t j0 = 0; j0 < n; j0 += NB) {
            const int ncol = (int)(n - j0 < NB ? n - j0 : NB);
            for (int64_t k0 = 0; k0 < cols; k0 += KC) {
                const int64_t kc = cols - k0 < KC ? cols - k0 : KC;
                block(wt + k0, ldt, nrow, x + (size_t)j0 * ldx + k0, ldx, ncol, kc, k0 == 0,
                      k0 + kc == cols, acc, y + j0 * rows + b0, rows);
            }
        }
    }
}

/* Per-thread scratch, one allocation: thread i's floats start at i * stride (64-byte aligned). */
static float *scratch_alloc(int n_threads, size_t floats, size_t *stride) {
    *stride = (floats + 15) / 16 * 16;
    return aligned_alloc(64, (size_t)n_threads * *stride * sizeof(float));
}

/* ---------------------------------------------------------------- activation packing */

/* The kernel's loads of x must not straddle cache lines (a split load costs two: measured 29
 * vs 42 GMAC/s per core on 16-byte-aligned rows), so activations whose rows are not 64-byte
 * aligned are copied into an aligned buffer with rows ldx = cols rounded up to 16 floats. */
static int x_aligned(const float *x, int64_t cols) { return (uintptr_t)x % 64 == 0 && cols % 16 == 0; }
static size_t x_stride(int64_t cols) { return (size_t)(cols + 15) / 16 * 16; }

typedef struct {
    const float *const *src;   /* per unit: source rows (cols apart) */
    float *const *dst;         /* per unit: destination rows (ld apart) */
    const int64_t *cols;
    const int64_t (*rows)[2];  /* pack tasks: (unit, row) */
} pack_job;

static void pack_task(void *arg, int64_t task, int thread) {
    (void)thread;
    const pack_job *P = arg;
    const int64_t u = P->rows[task][0], j = P->rows[task][1], c = P->cols[u];
    memcpy(P->dst[u] + (size_t)j * x_stride(c), P->src[u] + j * c, (size_t)c * sizeof(float));
}

/* ---------------------------------------------------------------- single product */

enum { SLAB = 512 }; /* unaligned activations are packed and multiplied this many rows at a time */

typedef struct {
    const strata_qtraits *t;
    int isa;
    const void *w;
    int64_t rows, cols, n, rpt;
    const float *x;
    size_t ldx;
    float *y;
    float *scratch;
    size_t stride;
} gemm_job;

static void gemm_task(void *arg, int64_t task, int thread) {
    const gemm_job *g = arg;
    const int64_t r0 = task * g->rpt, r1 = r0 + g->rpt < g->rows ? r0 + g->rpt : g->rows;
    gemm_rows(g->t, g->isa, g->w, g->rows, g->cols, g->x, g->ldx, g->n, g->y, r0, r1,
              g->scratch + (size_t)thread * g->stride);
}

strata_status strata_gemm_run(strata_pool *pool, const strata_qtraits *t, int isa,
                              const void *w, int64_t rows, int64_t cols, const float *x,
                              int64_t n, float *y) {
    if (rows <= 0 || n <= 0 || cols <= 0) return STRATA_OK;
    if (!t->dequant[STRATA_ISA_IDX_SCALAR])
        return strata_fail(STRATA_ERR_UNSUPPORTED, "%s: no dequantization for the GEMM", t->name);
    const int nt = strata_pool_n_threads(pool);
    const int pack = !x_aligned(x, cols);
    const int64_t slab = pack && n > SLAB ? SLAB : n;
    gemm_job g = {.t = t, .isa = isa, .w = w, .rows = rows, .cols = cols, .x = x, .ldx = (size_t)cols};
    g.rpt = rows_per_task(rows, cols, slab, nt);
    const int64_t n_tasks = (rows + g.rpt - 1) / g.rpt;
    /* a task may run on any thread index, so every thread gets scratch */
    g.scratch = scratch_alloc(nt, scratch_floats(cols), &g.stride);
    float *xp = pack ? aligned_alloc(64, (size_t)slab * x_stride(cols) * sizeof(float)) : NULL;
    int64_t (*prow)[2] = pack ? malloc((size_t)slab * sizeof *prow) : NULL;
    if (!g.scratch || (pack && (!xp || !prow))) {
        free(g.scratch); free(xp); free(prow);
        return strata_fail(STRATA_ERR_NOMEM, "gemm: no memory for the scratch of %lld x %lld", (long long)rows,
                           (long long)cols);
    }
    for (int64_t s0 = 0; s0 < n; s0 += slab) {
        g.n = n - s0 < slab ? n - s0 : slab;
        g.y = y + s0 * rows;
        if (pack) {
            const float *src = x + s0 * cols;
            pack_job P = {.src = &src, .dst = &xp, .cols = &cols, .rows = (const int64_t (*)[2])prow};
            for (int64_t j = 0; j < g.n; j++) { prow[j][0] = 0; prow[j][1] = j; }
            strata_pool_run(g.n > 1 ? pool : NULL, pack_task, &P, g.n);
            g.x = xp;
            g.ldx = x_stride(cols);
        } else {
            g.x = x + s0 * cols;
        }
        strata_pool_run(n_tasks > 1 ? pool : NULL, gemm_task, &g, n_tasks);
    }
    free(g.scratch); free(xp); free(prow);
    return STRATA_OK;
}

/* ---------------------------------------------------------------- several products */

typedef struct {
    const strata_mm_item *items;
    int isa;
    const float *const *x;     /* per item: its activations, packed or as given */
    const size_t *ldx;
    const int64_t (*tasks)[3]; /* (item, r0, r1) */
    float *scratch;
    size_t stride;
} gemm_multi_job;

static void gemm_multi_task(void *arg, int64_t task, int thread) {
    const gemm_multi_job *M = arg;
    const int64_t i = M->tasks[task][0];
    const strata_mm_item *it = &M->items[i];
    gemm_rows(it->t, M->isa, it->w, it->rows, it->cols, M->x[i], M->ldx[i], it->n, it->y, M->tasks[task][1],
              M->tasks[task][2], M->scratch + (size_t)thread * M->stride);
}

strata_status strata_gemm_multi(strata_pool *pool, int isa, const strata_mm_item *items, int n_items) {
    if (n_items <= 0) return STRATA_OK;
    const int nt = strata_pool_n_threads(pool);
    int64_t n_tasks = 0, n_pack = 0;
    size_t floats = 0, pack_floats = 0;
    for (int i = 0; i < n_items; i++) {
        const strata_mm_item *it = &items[i];
        if (it->rows <= 0 || it->n <= 0 || it->cols <= 0) continue;
        if (!it->t->dequant[STRATA_ISA_IDX_SCALAR])
            return strata_fail(STRATA_ERR_UNSUPPORTED, "%s: no dequantization for the GEMM", it->t->name);
        const int64_t rpt = rows_per_task(it->rows, it->cols, it->n, nt);
        n_tasks += (it->rows + rpt - 1) / rpt;
        const size_t f = scratch_floats(it->cols);
        if (f > floats) floats = f;
        if (!x_aligned(it->x, it->cols)) { n_pack += it->n; pack_floats += (size_t)it->n * x_stride(it->cols); }
    }
    if (n_tasks == 0) return STRATA_OK;
    /* unaligned activations of every item are packed up front: a copy as large as them */
    strata_status rc = STRATA_OK;
    int64_t (*tasks)[3] = malloc((size_t)n_tasks * sizeof *tasks);
    int64_t (*prow)[2] = malloc((size_t)(n_pack > 0 ? n_pack : 1) * sizeof *prow);
    const float **xs = calloc((size_t)n_items, sizeof *xs);
    float **dst = calloc((size_t)n_items, sizeof *dst);
    size_t *ldx = calloc((size_t)n_items, sizeof *ldx);
    int64_t *cols = calloc((size_t)n_items, sizeof *cols);
    float *xp = aligned_alloc(64, (pack_floats > 0 ? pack_floats : 16) * sizeof(float));
    gemm_multi_job M = {.items = items, .isa = isa};
    M.scratch = scratch_alloc(nt, floats, &M.stride);
    if (!tasks || !prow || !xs || !dst || !ldx || !cols || !xp || !M.scratch) {
        rc = strata_fail(STRATA_ERR_NOMEM, "gemm: no memory for %lld tasks", (long long)n_tasks);
        goto done;
    }
    int64_t k = 0, q = 0;
    size_t off = 0;
    for (int i = 0; i < n_items; i++) {
        const strata_mm_item *it = &items[i];
        xs[i] = it->x;
        cols[i] = it->cols;
        ldx[i] = (size_t)it->cols;
        if (it->rows <= 0 || it->n <= 0 || it->cols <= 0) continue;
        const int64_t rpt = rows_per_task(it->rows, it->cols, it->n, nt);
        for (int64_t r0 = 0; r0 < it->rows; r0 += rpt) {
            tasks[k][0] = i;
            tasks[k][1] = r0;
            tasks[k][2] = r0 + rpt < it->rows ? r0 + rpt : it->rows;
            k++;
        }
        if (!x_aligned(it->x, it->cols)) {
            dst[i] = xp + off;
            off += (size_t)it->n * x_stride(it->cols);
            ldx[i] = x_stride(it->cols);
            for (int64_t j = 0; j < it->n; j++) { prow[q][0] = i; prow[q][1] = j; q++; }
        }
    }
    if (n_pack) {
        pack_job P = {.src = xs, .dst = dst, .cols = cols, .rows = (const int64_t (*)[2])prow};
        strata_pool_run(n_pack > 1 ? pool : NULL, pack_task, &P, n_pack);
        for (int i = 0; i < n_items; i++) if (dst[i]) xs[i] = dst[i];
    }
    M.x = xs;
    M.ldx = ldx;
    M.tasks = (const int64_t (*)[3])tasks;
    strata_pool_run(n_tasks > 1 ? pool : NULL, gemm_multi_task, &M, n_tasks);
done:
    free(tasks); free(prow); free(xs); free(dst); free(ldx); free(cols); free(xp); free(M.scratch);
    return rc;
}

/* ---------------------------------------------------------------- the model's choice */

/* Measured per core (CPU seconds, 6144 x 2560, AVX2, Zen 4; GMAC/s, strata_matmul -> GEMM):
 *   F32     n=8 11.5 -> 19.5, n=16 12.7 -> 25.7, n=64 14.6 -> 33.8, n=512 15.3 -> 37.8
 *   F16     n=8 18.2 -> 21.2, n=16 19.6 -> 27.6, n=64 22.3 -> 33.4, n=512 23.6 -> 37.9
 *   NVFP4   n=16 34.7 -> 31.5, n=64 34.4 -> 36.5, n=512 34.6 -> 38.3
 *   Q8_0    n=16 32.5 -> 29.6, n=64 35.3 -> 36.0;  IQ4_NL n=64 33.9 -> 33.8
 *   IQ2_XS  n=64 48.4 -> 35.4;  Q4_K n=64 58.3 -> 33.0
 * The int8 dot products of the quantized types do up to twice the MACs per instruction of f32
 * FMAs, so on quantized weights the GEMM at best ties them; and it would round prefill
 * differently from decode (no q8 activations). So by default only float weights (activation
 * format F32: F32, F16, BF16) take the GEMM, from FLOAT_MIN_COLS columns on. */
enum { FLOAT_MIN_COLS = 8 };

/* strata_set_gemm_from's value: < 0 the default rule, 0 off, N > 0 every type from N columns on.
 * Relaxed atomics: it is set before forward calls start (strata.h), only its own tearing matters. */
static _Atomic int64_t g_gemm_from = -1;

int64_t strata_gemm_set_from(int64_t n_cols) {
    return atomic_exchange_explicit(&g_gemm_from, n_cols < 0 ? -1 : n_cols, memory_order_relaxed);
}

int64_t strata_gemm_min_cols(const strata_qtraits *t) {
    const int64_t from = atomic_load_explicit(&g_gemm_from, memory_order_relaxed);
    if (from == 0) return INT64_MAX;
    if (from > 0) return from;
    return t->act == STRATA_ACT_F32 ? FLOAT_MIN_COLS : INT64_MAX;
}

strata_status strata_mm_auto(strata_pool *pool, const strata_qtraits *t, int isa, const void *w,
                             int64_t rows, int64_t cols, const float *x, int64_t n, float *y) {
    if (n >= strata_gemm_min_cols(t)) return strata_gemm_run(pool, t, isa, w, rows, cols, x, n, y);
    return strata_matmul_run(pool, t, isa, w, rows, cols, x, n, y);
}

strata_status strata_mm_multi_auto(strata_pool *pool, int isa, const strata_mm_item *items, int n_items) {
    int n_gemm = 0;
    for (int i = 0; i < n_items; i++) n_gemm += items[i].n >= strata_gemm_min_cols(items[i].t);
    if (n_gemm == 0) return strata_matmul_multi(pool, isa, items, n_items);
    if (n_gemm == n_items) return strata_gemm_multi(pool, isa, items, n_items);
    strata_mm_item *split = malloc((size_t)n_items * sizeof *split);
    if (!split) return strata_fail(STRATA_ERR_NOMEM, "matmul: no memory for %d items", n_items);
    int a = 0, b = n_gemm; /* GEMM items first, then the others */
    for (int i = 0; i < n_items; i++) split[items[i].n >= strata_gemm_min_cols(items[i].t) ? a++ : b++] = items[i];
    strata_status rc = strata_gemm_multi(pool, isa, split, n_gemm);
    if (!rc) rc = strata_matmul_multi(pool, isa, split + n_gemm, n_items - n_gemm);
    free(split);
    return rc;
}
