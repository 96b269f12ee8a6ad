/*
 * hc.cuh — hyper-connections (spec §5) as unit functions shared by the CUDA kernels (hc.cu) and the
 * host check (tests/native/test_cuda_ops_small.c); the C path is hc.c.
 *
 * A read is elementwise steps between three matrix products (those are the gemv family's):
 *   X̂ = G(X; w_n)                      read norm: norm.cuh's rows, one per stream (wg = hc)
 *   a = W_down X̂,  a ← silu(a / hc)      read act, one unit per value of a [L x R]
 *   g = W_up a,     u = mean_j σ(g_j) ⊙ X̂_j   read mix, one unit per (token, feature) of u [L x E]
 *   a = W_inj X̂,   c = 2 σ(a / hc)       inject, one unit per (token, stream) of c [L x hc]
 * The final mixer that feeds the LM head is the same read without the inject.
 * Write: X_j += c_j · y on the un-normalised state, one unit per value of X [L x hc x E].
 * Layouts are the C path's: X, X̂, g are L x (hc·E) with stream j at [j·E, (j+1)·E) of a token's row.
 */
#ifndef STRATA_KERNELS_CUDA_HC_CUH
#define STRATA_KERNELS_CUDA_HC_CUH

#include "kernels/cuda/ops_common.cuh"
#include "kernels/cuda/norm.cuh"

/* a[i] ← silu(a[i] / hc): the division after the product, before the activation. In place. */
OPS_FN void hc_act_unit(float *a, int64_t hc, int64_t i) { a[i] = ops_silu(a[i] / (float)hc); }

/* u[i], i = t·E + d: (Σ_j σ(g[t, j, d]) · X̂[t, j, d]) over the streams in order, times 1/hc (σ is
 * ops_sigmoid, as in hc.c). */
OPS_FN void hc_mix_unit(const float *g, const float *xh, int64_t hc, int64_t E, int64_t i, float *u) {
    const int64_t t = i / E, d = i % E;
    const float inv_hc = 1.0f / (float)hc;
    const float *gt = g + t * hc * E, *xt = xh + t * hc * E;
    float acc = 0.0f;
    for (int64_t j = 0; j < hc; j++) acc += ops_mul(ops_sigmoid(gt[j * E + d]), xt[j * E + d]);
    u[i] = acc * inv_hc;
}

/* c[i] = 2 σ(a[i] / hc) for one (token, stream) value i of the inject product. */
OPS_FN void hc_inject_unit(const float *a, int64_t hc, int64_t i, float *c) {
    c[i] = 2.0f * ops_sigmoid(a[i] / (float)hc);
}

/* X[t, j, d] += c[t, j] · y[t, d] for the value i = (t·hc + j)·E + d of X. */
OPS_FN void hc_write_unit(float *X, const float *c, const float *y, int64_t hc, int64_t E, int64_t i) {
    const int64_t tj = i / E, d = i % E, t = tj / hc;
    X[i] += c[tj] * y[t * E + d];
}

#ifdef __CUDACC__
/* One thread per value of a [n = L x R], in place. */
static __global__ void hc_act_kernel(float *a, int64_t n, int64_t hc) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) hc_act_unit(a, hc, i);
}

/* One thread per (token, feature) of u [L x E]. */
static __global__ void hc_mix_kernel(const float *g, const float *xh, int64_t L, int64_t hc, int64_t E, float *u) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < L * E) hc_mix_unit(g, xh, hc, E, i, u);
}

/* One thread per value of c [n = L x hc]. */
static __global__ void hc_inject_kernel(const float *a, int64_t n, int64_t hc, float *c) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) hc_inject_unit(a, hc, i, c);
}

/* One thread per value of X [L x hc x E]. */
static __global__ void hc_write_kernel(float *X, const float *c, const float *y, int64_t L, int64_t hc, int64_t E) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < L * hc * E) hc_write_unit(X, c, y, hc, E, i);
}
#endif

#endif
