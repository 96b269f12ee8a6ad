/*
 * merge.cuh — the elementwise ends of the MoE block (spec §9) as unit functions shared by the CUDA
 * kernels (merge.cu) and the host check (tests/native/test_cuda_ops_small.c); the C path is moe.c's
 * mdl_moe_glu, mdl_moe_shared_gate and mdl_moe_combine.
 *
 * glu:          h = silu(g · sg) ⊙ (u · su) for n rows of F (sg, su: the gate / up matrices' .scale,
 *               1 without); fused: row i of gu is [gate F | up F]; split: the n gate rows, then the n up
 *               rows (an expert's two products, or the shared expert's). One unit per value of h.
 * shared gate:  σ(w_seg · u_t) per token, one warp per token: lanes sum k ≡ lane (mod 32), folded as
 *               ops_fold32 (the C path sums in order: they agree to float rounding).
 * sum:          y_t = Σ_k w_k sd_{e_k} out_{e_k} + (σ_t · sd_sh) · sh_t, the routed terms added in
 *               increasing expert id (the C path walks the experts in order and adds each one's
 *               tokens, so a token's terms come in that order), then the shared expert's. out holds
 *               the experts' rows in grouped order: pair i = t·K + k is row[i] (router.cuh's group).
 *               Skipped experts (skip[e] != 0, the offload's tail skip) add nothing. One unit per
 *               value of y; it finds its token's picks in expert order by K scans of K (K is ~10).
 * gather:       xg row i = x row slot[i] / K: the MoE input's rows in grouped order (router.cuh's slot), the
 *               input of the experts the device computes (mdl_moe_gather). One unit per value of xg.
 */
#ifndef STRATA_KERNELS_CUDA_MERGE_CUH
#define STRATA_KERNELS_CUDA_MERGE_CUH

#include "kernels/cuda/ops_common.cuh"

/* h[v] for v = i·F + f: silu(gate · sg) · (up · su). */
OPS_FN void merge_glu_unit(const float *gu, int64_t n, int64_t F, int fused, float sg, float su, int64_t v, float *h) {
    const int64_t i = v / F, f = v % F;
    const float g = fused ? gu[i * 2 * F + f] : gu[i * F + f];
    const float u = fused ? gu[i * 2 * F + F + f] : gu[n * F + i * F + f];
    h[v] = ops_silu(g * sg) * (u * su);
}

/* Lane `lane`'s part of w · x_t (x_t = row t of x [L x E]): k ≡ lane (mod 32), in increasing k. */
OPS_FN float merge_gate_lane_dot(const float *w, const float *x, int64_t E, int64_t t, int lane) {
    const float *xt = x + t * E;
    float acc = 0.0f;
    for (int64_t k = lane; k < E; k += OPS_WARP) acc += w[k] * xt[k];
    return acc;
}

/* y[v] for v = t·E + d. sd: [Ne] down scales per expert or NULL (1); skip: [Ne] or NULL (none);
 * gate[t] = σ(w_seg · u_t) (merge_gate_lane_dot, folded, then ops_sigmoid); sd_sh the shared down scale. */
OPS_FN void merge_sum_unit(const int32_t *pick, const float *pw, const float *sd, const int8_t *skip,
                           const int64_t *row, const float *out, const float *gate, float sd_sh, const float *sho,
                           int64_t E, int64_t K, int64_t v, float *y) {
    const int64_t t = v / E, d = v % E;
    const int32_t *pt = pick + t * K;
    float acc = 0.0f;
    int32_t prev = -1;
    for (int64_t r = 0; r < K; r++) {
        int64_t k = -1;   /* the pick with the smallest expert id above prev (a token's picks differ) */
        for (int64_t j = 0; j < K; j++)
            if (pt[j] > prev && (k < 0 || pt[j] < pt[k])) k = j;
        const int32_t e = pt[k];
        prev = e;
        if (skip && skip[e]) continue;
        const int64_t i = t * K + k;
        const float w = pw[i] * (sd ? sd[e] : 1.0f);
        acc += w * out[row[i] * E + d];
    }
    const float g = gate[t] * sd_sh;
    acc += g * sho[t * E + d];
    y[v] = acc;
}

/* xg[v] for v = i·E + d: the value d of row slot[i] / K of x. */
OPS_FN void merge_gather_unit(const float *x, const int64_t *slot, int64_t K, int64_t E, int64_t v, float *xg) {
    const int64_t i = v / E, d = v % E;
    xg[v] = x[(slot[i] / K) * E + d];
}

#ifdef __CUDACC__
/* One thread per value of xg [n x E]. */
static __global__ void merge_gather_kernel(const float *x, const int64_t *slot, int64_t n, int64_t K, int64_t E,
                                           float *xg) {
    const int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (v < n * E) merge_gather_unit(x, slot, K, E, v, xg);
}

/* One thread per value of h [n x F]. */
static __global__ void merge_glu_kernel(const float *gu, int64_t n, int64_t F, int fused, float sg, float su,
                                        float *h) {
    const int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (v < n * F) merge_glu_unit(gu, n, F, fused, sg, su, v, h);
}

/* One warp per token. */
static __global__ void merge_gate_kernel(const float *w, const float *x, int64_t L, int64_t E, float *gate) {
    const int64_t t = (int64_t)blockIdx.x * (blockDim.x / OPS_WARP) + threadIdx.x / OPS_WARP;
    const int lane = (int)(threadIdx.x % OPS_WARP);
    if (t >= L) return;   /* whole warps leave together */
    const float d = ops_warp_sum(merge_gate_lane_dot(w, x, E, t, lane));
    if (lane == 0) gate[t] = ops_sigmoid(d);
}

/* One thread per value of y [L x E]. */
static __global__ void merge_sum_kernel(const int32_t *pick, const float *pw, const float *sd, const int8_t *skip,
                                        const int64_t *row, const float *out, const float *gate, float sd_sh,
                                        const float *sho, int64_t L, int64_t E, int64_t K, float *y) {
    const int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (v < L * E) merge_sum_unit(pick, pw, sd, skip, row, out, gate, sd_sh, sho, E, K, v, y);
}
#endif

#endif
