/* test_matmul.c — strata_matmul_multi with items whose activation rows are gathered copies of a shared
 * source (strata_mm_item.x_src / x_src_rows, as a MoE layer's experts): every output must equal what
 * strata_matmul_run gives for that item alone on its float rows, bit for bit, on every kernel path this
 * CPU runs, for activation formats q8_32 (Q8_0), q8_256 (Q4_K) and q8_256 stored biased by the IQ rows
 * kernels (IQ2_XS with several columns; one column is not biased: two groups of one source). The
 * items cover rows reordered and repeated, two items naming the same rows (an expert's gate and up),
 * an item reading the source in place, one with its own x, and a source row nobody reads. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/matmul.h"
#include "quant/quant.h"
#include "util/threadpool.h"

#include "check.h"

enum { L = 9, COLS = 512, ROWS = 37, N_ITEMS = 6 };

static uint32_t g_rng = 12345u;
static uint32_t rnd(void) { g_rng = g_rng * 1664525u + 1013904223u; return g_rng >> 8; }
static float rndf(void) { return (float)(rnd() % 20001) / 10000.0f - 1.0f; }

/* Random blocks with a sane fp16 scale at byte 0 (Q8_0, IQ2_XS) or bytes 0..3 (Q4_K: d, dmin). */
static void make_weights(const strata_qtraits *t, uint8_t *w, size_t n_blocks) {
    for (size_t b = 0; b < n_blocks; b++) {
        uint8_t *p = w + b * (size_t)t->type_size;
        for (int i = 0; i < t->type_size; i++) p[i] = (uint8_t)rnd();
        const uint16_t d = strata_fp32_to_fp16(0.01f + (float)(rnd() % 100) * 1e-4f);
        memcpy(p, &d, 2);
        if (t->type == GT_Q4_K) memcpy(p + 2, &d, 2);
    }
}

static void check_type(strata_pool *pool, int type, int isa) {
    const strata_qtraits *t = strata_qtraits_get(type);
    CHECK(t != NULL);
    if (!t) return;
    const size_t w_bytes = (size_t)ROWS * (COLS / (size_t)t->block_size) * (size_t)t->type_size;
    uint8_t *w[N_ITEMS];
    float *src = malloc((size_t)L * COLS * sizeof(float));
    float *own = malloc((size_t)4 * COLS * sizeof(float));
    for (int i = 0; i < L * COLS; i++) src[i] = rndf() * (i % 97 == 0 ? 30.0f : 1.0f);
    for (int i = 0; i < 4 * COLS; i++) own[i] = rndf();
    static const int64_t rows_a[] = {3, 1, 3, 6, 0};   /* reordered, repeated; row 8 never read */
    static const int64_t rows_b[] = {5};               /* one column: not biased for IQ2_XS */
    static const int64_t ident[] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    /* item: x_src rows (NULL: own x), n */
    const int64_t *rows_of[N_ITEMS] = {rows_a, rows_a, NULL, rows_b, ident, NULL};
    const int64_t n_of[N_ITEMS] = {5, 5, L, 1, L, 4};
    strata_mm_item items[N_ITEMS];
    float *x[N_ITEMS], *y[N_ITEMS], *ref[N_ITEMS];
    for (int i = 0; i < N_ITEMS; i++) {
        w[i] = malloc(w_bytes);
        make_weights(t, w[i], w_bytes / (size_t)t->type_size);
        x[i] = malloc((size_t)n_of[i] * COLS * sizeof(float));
        y[i] = malloc((size_t)n_of[i] * ROWS * sizeof(float));
        ref[i] = malloc((size_t)n_of[i] * ROWS * sizeof(float));
        for (int64_t j = 0; j < n_of[i]; j++) {
            const float *from = i == 2 ? src + j * COLS : i == 5 ? own + j * COLS : src + rows_of[i][j] * COLS;
            memcpy(x[i] + j * COLS, from, COLS * sizeof(float));
        }
        items[i] = (strata_mm_item){.t = t, .w = w[i], .rows = ROWS, .cols = COLS, .x = i == 2 ? src : x[i],
                                    .n = n_of[i], .y = y[i], .x_src = rows_of[i] ? src : NULL,
                                    .x_src_rows = rows_of[i]};
        CHECK(strata_matmul_run(pool, t, isa, w[i], ROWS, COLS, x[i], n_of[i], ref[i]) == STRATA_OK);
    }
    CHECK(strata_matmul_multi(pool, isa, items, N_ITEMS) == STRATA_OK);
    for (int i = 0; i < N_ITEMS; i++) {
        const int same = memcmp(y[i], ref[i], (size_t)n_of[i] * ROWS * sizeof(float)) == 0;
        if (!same) fprintf(stderr, "%s isa %d item %d differs from strata_matmul_run\n", t->name, isa, i);
        CHECK(same);
        free(w[i]); free(x[i]); free(y[i]); free(ref[i]);
    }
    free(src); free(own);
}

int main(void) {
    strata_pool *pool = strata_pool_create(2);
    CHECK(pool != NULL);
    int ran = 0;
    for (int isa = 0; isa < STRATA_N_ISA; isa++) {
        if (!strata_cpu_has_isa(isa)) { printf("isa %d: not on this CPU, skipped\n", isa); continue; }
        ran++;
        check_type(pool, GT_Q8_0, isa);
        check_type(pool, GT_Q4_K, isa);
        check_type(pool, GT_IQ2_XS, isa);
    }
    printf("test_matmul: %d paths checked, %d failures\n", ran, g_failed);
    strata_pool_destroy(pool);
    return g_failed != 0;
}
