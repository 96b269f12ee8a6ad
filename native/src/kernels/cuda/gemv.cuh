/*
 * gemv.cuh — y = W x for one or a few activation columns (decode), every weight type of blocks.cuh:
 * the dense projections (hc down/up, router, attention and GDN projections, shared and routed experts)
 * and the LM head. The C path is strata_matmul (kernels/cpu/matmul.c).
 *
 * Activations: a quantized weight type multiplies activations quantized as the CPU's matmul quantizes
 * them (quant/act.c): q8 codes per block of 32 (act_q8_32) or 256 (act_q8_256) values, the format
 * being the type's strata_qtraits.act. Here a column becomes d * q per block (blk_act_fake_quant), one
 * thread per block (gemv_act_block); F32/F16/BF16 weights take the f32 activations as they are. The
 * sums then differ from the CPU's (exact integer sums per block) only in float summation order.
 *
 * Products: one warp per (row, column). Lane l takes the 32-value chunks c = l, l+32, l+64 ... of the
 * row in increasing c, decodes each once (blk_chunk) and adds its 32 products to one float in value
 * order with fmaf (gemv_lane_partial); the lanes are then folded with ops_warp_sum, which the host
 * reproduces with ops_fold32 (ops_common.cuh). A row of K values is thus split into ceil(K / 32)
 * chunks: 80 for the hidden width 2560, 20 for an expert's 640.
 *
 * Scale: an NVFP4 tensor's per-tensor `.scale` multiplies every output of its product (mdl_matmul does
 * it after strata_matmul): one thread per value, y[i] *= s, the C path's single rounding.
 */
#ifndef STRATA_KERNELS_CUDA_GEMV_CUH
#define STRATA_KERNELS_CUDA_GEMV_CUH

#include "kernels/cuda/ops_common.cuh"
#include "kernels/cuda/blocks.cuh"

/* Activation block b of a column: xq[b*bs ..] = x[b*bs ..] quantized to d * q (bs = 32 or 256 values for
 * act 1 or 2; act 0 copies one value). xq may equal x. */
OPS_FN void gemv_act_block(const float *x, float *xq, int act, int64_t b) {
    const int bs = blk_act_block(act);
    for (int i = 0; i < bs; i++) xq[b * bs + i] = x[b * bs + i];
    blk_act_fake_quant(xq + b * bs, bs, act);
}

/* Lane `lane`'s share of dot(row, x) for a row of K values of `type`: its chunks in increasing order,
 * each decoded once, products added in value order. */
OPS_FN float gemv_lane_partial(int type, const uint8_t *row, int64_t K, const float *x, int lane) {
    float acc = 0.0f, v[32];
    const int64_t nc = (K + 31) / 32;
    for (int64_t c = lane; c < nc; c += OPS_WARP) {
        const int n = blk_chunk(type, row, c, K, v);
        const float *xc = x + 32 * c;
        for (int i = 0; i < n; i++) acc = fmaf(v[i], xc[i], acc);
    }
    return acc;
}

/* y[i] *= s: one output of a product times its tensor's .scale. */
OPS_FN void gemv_scale_unit(float *y, float s, int64_t i) { y[i] *= s; }

#ifdef __CUDACC__
enum { GEMV_WARPS = 8 };   // warps (rows) per block of 256 threads

/* xq = x quantized per activation block; one thread per block of the n x K activations (n_blocks). */
static __global__ void k_gemv_act(const float *x, float *xq, int64_t n_blocks, int act) {
    const int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b < n_blocks) gemv_act_block(x, xq, act, b);
}

/* y[t * ldy + r] = dot(W row r, x[t * ldx ..]) for r < R, t < n; one warp per (r, t). Grid:
 * (ceil(R / GEMV_WARPS), min(n, 65535)), GEMV_WARPS * 32 threads. */
static __global__ void k_gemv(int type, const uint8_t *W, size_t row_bytes, int64_t R, int64_t K, const float *x,
                              int64_t ldx, int64_t n, float *y, int64_t ldy) {
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x / OPS_WARP) + threadIdx.x / OPS_WARP;
    const int lane = threadIdx.x % OPS_WARP;
    if (r >= R) return;
    for (int64_t t = blockIdx.y; t < n; t += gridDim.y) {
        const float s = ops_warp_sum(gemv_lane_partial(type, W + (size_t)r * row_bytes, K, x + t * ldx, lane));
        if (lane == 0) y[t * ldy + r] = s;
    }
}

/* y[i] *= s for i < n; one thread per value. */
static __global__ void k_gemv_scale(float *y, int64_t n, float s) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) gemv_scale_unit(y, s, i);
}
#endif

#endif
