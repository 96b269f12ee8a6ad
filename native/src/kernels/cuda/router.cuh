/*
 * router.cuh — the MoE router (spec §9) as unit functions shared by the CUDA kernels (router.cu) and
 * the host check (tests/native/test_cuda_ops_small.c); the C path is moe.c's mdl_route and
 * mdl_route_group.
 *
 * Top-k: one warp per token over its Ne logits (row t of lg, replaced by the probabilities as the C
 * path does). Lane l owns the experts e ≡ l (mod 32):
 *   max      each lane's maximum, then the warp's (exact: any order gives the same value);
 *   softmax  lg[e] = exp(lg[e] - max), lane sums in increasing e folded as ops_fold32, p = lg · (1/sum)
 *            (the C path sums in double: the weights agree to float rounding);
 *   top-k    K rounds; each lane offers its best expert that comes after the last pick in pick order
 *            (larger p first, lower index on ties: moe.c's top_k), the warp keeps the best offer.
 *            Pick order is a total order, so the k-th round's winner is the C path's k-th pick
 *            whenever the probabilities agree;
 *   weights  the K picked p renormalised by their float sum in pick order, as mdl_route.
 * Grouping (the counting sort of mdl_moe): the (token, k) pairs i = t·K + k sorted by expert, stable
 * in i. count[e + 1] = pairs of expert e (one unit per expert), prefix sums (one unit), then each
 * expert's unit writes its pairs in increasing i to slot[count[e] ..] and row[i] = that position
 * (the row of pair i in the expert-ordered buffers, the inverse of slot).
 */
#ifndef STRATA_KERNELS_CUDA_ROUTER_CUH
#define STRATA_KERNELS_CUDA_ROUTER_CUH

#include "kernels/cuda/ops_common.cuh"

/* Lane `lane`'s maximum of its logits (-inf when it owns none). */
OPS_FN float router_lane_max(const float *lg, int64_t Ne, int lane) {
    float mx = -INFINITY;
    for (int64_t e = lane; e < Ne; e += OPS_WARP) mx = fmaxf(mx, lg[e]);
    return mx;
}

/* lg[e] = exp(lg[e] - mx) for the lane's experts; returns their sum, in increasing e. */
OPS_FN float router_lane_exp(float *lg, int64_t Ne, float mx, int lane) {
    float acc = 0.0f;
    for (int64_t e = lane; e < Ne; e += OPS_WARP) {
        lg[e] = ops_exp(lg[e] - mx);
        acc += lg[e];
    }
    return acc;
}

/* p = exp · (1 / sum) for the lane's experts. */
OPS_FN void router_lane_scale(float *lg, int64_t Ne, float sum, int lane) {
    const float inv = 1.0f / sum;
    for (int64_t e = lane; e < Ne; e += OPS_WARP) lg[e] *= inv;
}

/* Whether (v, i) comes before (bv, bi) in pick order: larger p first, lower index on ties; an index
 * below 0 is "no candidate" and comes after everything. */
OPS_FN int router_before(float v, int32_t i, float bv, int32_t bi) {
    if (i < 0) return 0;
    if (bi < 0) return 1;
    return v > bv || (v == bv && i < bi);
}

/* Lane `lane`'s best expert after the last pick (pv, pi) in pick order (pi < 0: nothing picked yet),
 * to (*bv, *bi); *bi = -1 when it has none left. */
OPS_FN void router_lane_next(const float *p, int64_t Ne, float pv, int32_t pi, int lane, float *bv, int32_t *bi) {
    float v = 0.0f;
    int32_t b = -1;
    for (int64_t e = lane; e < Ne; e += OPS_WARP) {
        const int after = pi < 0 || router_before(pv, pi, p[e], (int32_t)e);
        if (after && router_before(p[e], (int32_t)e, v, b)) { v = p[e]; b = (int32_t)e; }
    }
    *bv = v;
    *bi = b;
}

/* The best of 32 lane offers, folded as __shfl_down_sync does (ops_fold32's order): lane 0's result. */
OPS_FN void router_fold_best(float *v, int32_t *i) {
    for (int o = OPS_WARP / 2; o > 0; o /= 2)
        for (int l = 0; l < o; l++)
            if (router_before(v[l + o], i[l + o], v[l], i[l])) { v[l] = v[l + o]; i[l] = i[l + o]; }
}

/* The K weights of one token divided by their float sum (summed in pick order). */
OPS_FN void router_renorm(float *w, int64_t K) {
    float ws = 0.0f;
    for (int64_t k = 0; k < K; k++) ws += w[k];
    for (int64_t k = 0; k < K; k++) w[k] /= ws;
}

/* count[e + 1] = the pairs of expert e among pick[0..n); expert 0's unit also sets count[0] = 0. */
OPS_FN void router_count_unit(const int32_t *pick, int64_t n, int64_t e, int64_t *count) {
    int64_t c = 0;
    for (int64_t i = 0; i < n; i++) c += pick[i] == e;
    count[e + 1] = c;
    if (e == 0) count[0] = 0;
}

/* count[0..Ne] → prefix sums in place: count[e] is expert e's first slot, count[Ne] = n. */
OPS_FN void router_prefix_unit(int64_t *count, int64_t Ne) {
    for (int64_t e = 0; e < Ne; e++) count[e + 1] += count[e];
}

/* Expert e's pairs in increasing i to slot[count[e] ..]; row[i] = the slot each one takes. */
OPS_FN void router_fill_unit(const int32_t *pick, int64_t n, const int64_t *count, int64_t e, int64_t *slot,
                             int64_t *row) {
    int64_t s = count[e];
    for (int64_t i = 0; i < n; i++)
        if (pick[i] == e) {
            slot[s] = i;
            row[i] = s;
            s++;
        }
}

#ifdef __CUDACC__
/* The best offer of the warp, on every lane (lane 0 folds as router_fold_best, then broadcasts). */
OPS_DEV void router_warp_best(float *v, int32_t *i) {
    for (int o = OPS_WARP / 2; o > 0; o /= 2) {
        const float ov = __shfl_down_sync(0xffffffffu, *v, o);
        const int32_t oi = __shfl_down_sync(0xffffffffu, *i, o);
        if (router_before(ov, oi, *v, *i)) { *v = ov; *i = oi; }
    }
    *v = __shfl_sync(0xffffffffu, *v, 0);
    *i = __shfl_sync(0xffffffffu, *i, 0);
}

/* One warp per token: softmax of lg's row t in place, its top K to pick / pw [L x K], renormalised. */
static __global__ void router_topk_kernel(float *lg, int64_t L, int64_t Ne, int64_t K, int32_t *pick, float *pw) {
    const int64_t t = (int64_t)blockIdx.x * (blockDim.x / OPS_WARP) + threadIdx.x / OPS_WARP;
    const int lane = (int)(threadIdx.x % OPS_WARP);
    if (t >= L) return;   /* whole warps leave together */
    float *p = lg + t * Ne;
    const float mx = ops_warp_max(router_lane_max(p, Ne, lane));
    const float sum = __shfl_sync(0xffffffffu, ops_warp_sum(router_lane_exp(p, Ne, mx, lane)), 0);
    router_lane_scale(p, Ne, sum, lane);   /* each lane reads back only its own experts below */
    float pv = 0.0f;
    int32_t pi = -1;
    for (int64_t k = 0; k < K; k++) {
        router_lane_next(p, Ne, pv, pi, lane, &pv, &pi);
        router_warp_best(&pv, &pi);
        if (lane == 0) {
            pick[t * K + k] = pi;
            pw[t * K + k] = pv;
        }
    }
    if (lane == 0) router_renorm(pw + t * K, K);
}

/* One thread per expert. */
static __global__ void router_count_kernel(const int32_t *pick, int64_t n, int64_t Ne, int64_t *count) {
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e < Ne) router_count_unit(pick, n, e, count);
}

/* One thread. */
static __global__ void router_prefix_kernel(int64_t *count, int64_t Ne) { router_prefix_unit(count, Ne); }

/* One thread per expert. */
static __global__ void router_fill_kernel(const int32_t *pick, int64_t n, int64_t Ne, const int64_t *count,
                                          int64_t *slot, int64_t *row) {
    const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (e < Ne) router_fill_unit(pick, n, count, e, slot, row);
}
#endif

#endif
