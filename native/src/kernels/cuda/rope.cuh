/*
 * rope.cuh — partial NeoX RoPE (spec §1.4) as unit functions shared by the CUDA kernels (rope.cu)
 * and the host check (tests/native/test_cuda_ops_small.c); the C path is mdl_rope_angles / mdl_rope.
 *
 * Angles: row t of cs holds the n_rot/2 cosines then the n_rot/2 sines of position p0 + t * dp
 * (dp = 1: a sequence's tokens; dp = r: the indexer's block summaries at b * r). One unit is one
 * (t, i): inv_freq_i = 1 / theta^(2i / n_rot) and the angle pos * inv_freq_i, all fp32 as
 * transformers computes them.
 * Apply: rows of a head each (row r at x + r * xs), nh heads per token, so row r takes the angles
 * of token r / nh. One unit is one pair (i, i + n_rot/2) of one row; dims n_rot.. are not touched.
 * The same functions rope the attention's q and k (head 256) and the indexer's queries and block
 * keys (head 128): all take the first n_rot = 64 dims.
 */
#ifndef STRATA_KERNELS_CUDA_ROPE_CUH
#define STRATA_KERNELS_CUDA_ROPE_CUH

#include "kernels/cuda/ops_common.cuh"

/* Unit u = (t, i), u = t * n_rot/2 + i: cos and sin of frequency i at the position of row t, to
 * cs[t * n_rot + i] and cs[t * n_rot + n_rot/2 + i]. */
OPS_FN void rope_angle_unit(float theta, int32_t n_rot, int64_t p0, int64_t dp, int64_t u, float *cs) {
    const int64_t t = u / (n_rot / 2);
    const int32_t i = (int32_t)(u % (n_rot / 2));
    const float p = (float)(p0 + t * dp);
    const float inv = 1.0f / powf(theta, (float)(2 * i) / (float)n_rot);
    const float a = p * inv;
    float *c = cs + t * n_rot;
    c[i] = cosf(a);
    c[n_rot / 2 + i] = sinf(a);
}

/* Unit u = (r, i), u = r * n_rot/2 + i: rotates pair i of row r by its token's angles (row r / nh of
 * cs), in place. */
OPS_FN void rope_apply_unit(float *x, int64_t xs, int64_t nh, int32_t n_rot, const float *cs, int64_t u) {
    const int32_t h = n_rot / 2;
    const int64_t r = u / h;
    const int32_t i = (int32_t)(u % h);
    const float *c = cs + (r / nh) * n_rot, *s = c + h;
    float *xr = x + r * xs;
    const float a = xr[i], b = xr[i + h];
    xr[i] = a * c[i] - b * s[i];
    xr[i + h] = b * c[i] + a * s[i];
}

#ifdef __CUDACC__
/* One thread per (t, i). */
static __global__ void rope_angles_kernel(float theta, int32_t n_rot, int64_t p0, int64_t dp, int64_t L, float *cs) {
    const int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int32_t h = n_rot / 2;
    if (u >= L * h) return;
    rope_angle_unit(theta, n_rot, p0, dp, u, cs);
}

/* One thread per (row, pair). */
static __global__ void rope_apply_kernel(float *x, int64_t xs, int64_t rows, int64_t nh, int32_t n_rot,
                                         const float *cs) {
    const int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int32_t h = n_rot / 2;
    if (u >= rows * h) return;
    rope_apply_unit(x, xs, nh, n_rot, cs, u);
}
#endif

#endif
