/* matmul.h — weight matrix x activations on the CPU pool (see strata_matmul in strata.h). */
#ifndef STRATA_KERNELS_CPU_MATMUL_H
#define STRATA_KERNELS_CPU_MATMUL_H

#include "strata.h"
#include "../../quant/quant.h"
#include "../../util/threadpool.h"

/* y[j*rows + r] = dot(W row r, x row j). Arguments already validated by the caller. */
strata_status strata_matmul_run(strata_pool *pool, const strata_qtraits *t, int isa,
                                const void *w, int64_t rows, int64_t cols, const float *x,
                                int64_t n, float *y);

/* One of several independent products run as one pool job (e.g. every expert of a MoE layer):
 * y[j*rows + r] = dot(W row r, x row j) for j < n. Items whose rows come from one source (the same x,
 * or x_src below) share its quantization. Each output equals strata_matmul_run's. */
typedef struct {
    const strata_qtraits *t;
    const void *w;       /* rows x cols in t's format */
    int64_t rows, cols;
    const float *x;      /* n x cols */
    int64_t n;
    float *y;            /* n x rows */
    /* Optional: x's row j is a copy of row x_src_rows[j] of x_src (a MoE layer's tokens gathered per
     * expert). Items that name the same x_src, or whose x is that x_src, then quantize each source
     * row once between them instead of once per copy (strata_matmul_multi). NULL: x is its own. The
     * GEMM path reads x and ignores these. */
    const float *x_src;
    const int64_t *x_src_rows;
} strata_mm_item;
strata_status strata_matmul_multi(strata_pool *pool, int isa, const strata_mm_item *items, int n_items);

/* The conversion path ("repack" for prefill; quant.h strata_conv_fn): a product of at least 32 columns
 * whose type has conv[isa] decodes STRATA_CONV_ROWS rows at a time once into a thread's scratch and
 * multiplies them by every column; results are the same bit for bit. strata_matmul_set_repack(0)
 * turns it off process-wide (strata_set_repack; returns the previous setting).
 * strata_matmul_conv_bytes: the scratch one thread needs for rows of `cols` values (0: no
 * conversion for this type and path, or off). */
int strata_matmul_set_repack(int on);
size_t strata_matmul_conv_bytes(const strata_qtraits *t, int isa, int64_t cols);

#endif
