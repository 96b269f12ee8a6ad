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

#endif
