/*
 * mtp.cuh — the MTP head's own op on the device (spec/qwen4exp-mtp.md §2.2; model/mtp.c): the fusion
 * input [N(e; enorm) | (N(h; hnorm))_s] of every (token, stream), which eh_proj (the gemv family)
 * then turns into the MTP layer's streams. Its QSA + MoE layer and mixer are the other families'.
 * ops_common.cuh's rule: the arithmetic is here as OPS_FN units; mtp.cu's kernels only call them.
 *
 *   mtp.norm_concat  1. one warp per unit u = 2t + part: 1/rms of the embedding row (part 0, E values)
 *                       or of the hidden row (part 1, hc*E values: ONE rms over all streams, not grouped)
 *                    2. one thread per value of in2 [L][hc][2E]                     (mdl_mtp_norm_concat)
 * Layouts: e [L][E] (the token's embedding row, dequantized), h [L][hc*E], enorm [E], hnorm [hc*E]
 * (both folded 1+w), rinv [2L] between the two launches.
 */
#ifndef STRATA_KERNELS_CUDA_MTP_CUH
#define STRATA_KERNELS_CUDA_MTP_CUH

#include "kernels/cuda/ops_common.cuh"

/* Lane's share of the sum of squares of unit u's row (k ≡ lane mod 32, increasing k). */
OPS_FN float mtp_norm_lane(const float *e, const float *h, int64_t hc, int64_t E, int64_t u, int lane) {
    const int64_t t = u / 2, n = (u % 2) ? hc * E : E;
    const float *x = (u % 2) ? h + t * hc * E : e + t * E;
    float s = 0.0f;
    for (int64_t k = lane; k < n; k += OPS_WARP) s += x[k] * x[k];
    return s;
}

/* Unit u's 1/rms from the warp's sum of squares (mdl_rmsnorm's factor; the C path sums in double). */
OPS_FN float mtp_norm_rinv(float ss, int64_t hc, int64_t E, int64_t u, float eps) {
    const int64_t n = (u % 2) ? hc * E : E;
    return 1.0f / sqrtf(ss / (float)n + eps);
}

/* Value v of in2: row (t, j), column c < E the normed embedding (the same for every stream j),
 * c >= E stream j of the normed hidden row. */
OPS_FN float mtp_concat_unit(const float *e, const float *h, const float *enorm, const float *hnorm,
                             const float *rinv, int64_t hc, int64_t E, int64_t v) {
    const int64_t t = v / (hc * 2 * E), j = (v / (2 * E)) % hc, c = v % (2 * E);
    if (c < E) return e[t * E + c] * rinv[2 * t] * enorm[c];
    const int64_t k = j * E + (c - E);
    return h[t * hc * E + k] * rinv[2 * t + 1] * hnorm[k];
}

#ifdef __CUDACC__

static __global__ void mtp_k_norms(const float *e, const float *h, int64_t hc, int64_t E, float eps, int64_t units,
                                   float *rinv) {
    const int64_t u = (int64_t)blockIdx.x * (blockDim.x / OPS_WARP) + threadIdx.x / OPS_WARP;
    const int lane = (int)(threadIdx.x % OPS_WARP);
    if (u >= units) return;   /* whole warps */
    const float ss = ops_warp_sum(mtp_norm_lane(e, h, hc, E, u, lane));
    if (lane == 0) rinv[u] = mtp_norm_rinv(ss, hc, E, u, eps);
}

static __global__ void mtp_k_concat(const float *e, const float *h, const float *enorm, const float *hnorm,
                                    const float *rinv, int64_t hc, int64_t E, int64_t count, float *in2) {
    const int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (v < count) in2[v] = mtp_concat_unit(e, h, enorm, hnorm, rinv, hc, E, v);
}

#endif /* __CUDACC__ */

#endif
