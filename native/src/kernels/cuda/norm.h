/*
 * norm.h — launchers of the RMS-norm kernels (norm.cu; the arithmetic is norm.cuh's). Device
 * pointers; stream is a cudaStream_t (NULL: the default stream). Each returns once the launch is
 * queued: STRATA_ERR_IO with the CUDA error when it could not be.
 */
#ifndef STRATA_KERNELS_CUDA_NORM_H
#define STRATA_KERNELS_CUDA_NORM_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"   /* strata_status only (itself plain C over stdint/stddef) */

#ifdef __cplusplus
extern "C" {
#endif

/* y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w[r % wg] for rows r < rows of n values: row r at x + r * xs,
 * y + r * ys; weights w + (r % wg) * n, or none when w is NULL. wg = 1: one weight vector for every
 * row (per-head norms, mdl_rmsnorm); wg = groups: rows are a token's groups (mdl_group_rmsnorm).
 * y may be x (same strides). */
strata_status cuk_rmsnorm_rows(const float *x, int64_t xs, const float *w, int64_t wg, int64_t rows, int64_t n,
                               float eps, float *y, int64_t ys, void *stream);

#ifdef __cplusplus
}
#endif

#endif
