/*
 * norm.cuh — the RMS norms of the forward (spec §2: N1 with the folded (1+w), grouped G) as unit
 * functions shared by the CUDA kernels (norm.cu) and the host check (tests/native/test_cuda_ops_small.c).
 *
 * One unit is one row of n values, run by one warp: every lane sums the squares of its indices
 * k ≡ lane (mod 32) in float, the warp folds the 32 partials (ops_warp_sum; the host: ops_fold32),
 * and every lane then writes its own indices. The C path (mdl_rmsnorm) sums the squares in double;
 * float lanes of at most a few hundred terms each are within ~1e-7 of it relative, and a GPU's
 * double rate would make the norm of a 2560-wide stream the slow part of a small kernel.
 *
 * Rows: row r reads x + r * xs and writes y + r * ys (strides in floats, so the per-head q norm
 * can read the [q | gate] layout of q_proj); its weights are vector r mod wg of w (wg = 1: one weight
 * vector for every row, as the per-head norms; wg = hc: a token's hc streams each with its own
 * weights, the grouped norm G). w may be NULL (no weight). y may equal x (in place): a lane reads
 * its values before the fold and writes only its own indices after it.
 */
#ifndef STRATA_KERNELS_CUDA_NORM_CUH
#define STRATA_KERNELS_CUDA_NORM_CUH

#include "kernels/cuda/ops_common.cuh"

/* Lane `lane`'s partial sum of squares of row r: the indices k ≡ lane (mod 32), in increasing k. */
OPS_FN float norm_lane_sumsq(const float *x, int64_t xs, int64_t n, int64_t r, int lane) {
    const float *xr = x + r * xs;
    float acc = 0.0f;
    for (int64_t k = lane; k < n; k += OPS_WARP) acc += xr[k] * xr[k];
    return acc;
}

/* 1 / rms from the row's sum of squares: 1 / sqrt(mean + eps), the mean in float. */
OPS_FN float norm_rscale(float ss, int64_t n, float eps) {
    return 1.0f / sqrtf(ss / (float)n + eps);
}

/* Lane `lane`'s outputs of row r: y_k = x_k * rs * w_k for k ≡ lane (mod 32) (the C path's order of
 * the two products). */
OPS_FN void norm_lane_write(const float *x, int64_t xs, const float *w, int64_t wg, int64_t n, int64_t r, float rs,
                            int lane, float *y, int64_t ys) {
    const float *xr = x + r * xs;
    float *yr = y + r * ys;
    if (w) {
        const float *wr = w + (r % wg) * n;
        for (int64_t k = lane; k < n; k += OPS_WARP) yr[k] = xr[k] * rs * wr[k];
    } else {
        for (int64_t k = lane; k < n; k += OPS_WARP) yr[k] = xr[k] * rs;
    }
}

#ifdef __CUDACC__
/* One warp per row; blockDim.x a multiple of 32. */
static __global__ void norm_rows_kernel(const float *x, int64_t xs, const float *w, int64_t wg, int64_t rows,
                                        int64_t n, float eps, float *y, int64_t ys) {
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x / OPS_WARP) + threadIdx.x / OPS_WARP;
    const int lane = (int)(threadIdx.x % OPS_WARP);
    if (r >= rows) return;   /* whole warps leave together: the shuffles below see full warps */
    float ss = ops_warp_sum(norm_lane_sumsq(x, xs, n, r, lane));
    ss = __shfl_sync(0xffffffffu, ss, 0);   /* lane 0 holds the fold's sum */
    norm_lane_write(x, xs, w, wg, n, r, norm_rscale(ss, n, eps), lane, y, ys);
}
#endif

#endif
