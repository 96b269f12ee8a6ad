/*
 * gemm.cuh — prefill products Y = X W^T for many activation columns, every weight type of blocks.cuh,
 * dense tensors and routed experts alike: rows [r0, r1) of W are decoded to a tile (f32, or f16 for the
 * tensor cores), then the toolkit's GEMM (cuBLAS; gemm.cu) multiplies the tile by the columns. The
 * CPU's counterpart is strata_gemm (decode exactly, multiply by unquantized activations); strata_matmul
 * differs from both by its activation quantization.
 *
 * Units: gemm_tile_f32 / gemm_tile_f16 decode one 32-value chunk of one row into the tile (a thread per
 * (row, chunk)): the f32 tile is the C dequantizer's value bit for bit, the f16 tile that value rounded
 * to the nearest half (ties to even; beyond 65504 it is inf, so the f16 path is for weights whose
 * values a half holds). gemm_x_f16 rounds one activation to half for the f16 product. Without cuBLAS,
 * gemm_tile_dot is the product (one output per thread over an f32 tile), so the path works anywhere.
 */
#ifndef STRATA_KERNELS_CUDA_GEMM_CUH
#define STRATA_KERNELS_CUDA_GEMM_CUH

#include "kernels/cuda/ops_common.cuh"
#include "kernels/cuda/blocks.cuh"

/* Bytes of tile scratch that tile_rows rows of K values take (f16: halves, else floats): gemm.h's
 * strata_cuda_gemm_tile_bytes. */
OPS_FN size_t gemm_tile_bytes(int64_t K, int64_t tile_rows, int f16) {
    return (size_t)K * (size_t)tile_rows * (f16 ? 2 : 4);
}

/* Values per tile row are K: chunk c of W row r (r0 <= r) goes to tile[(r - r0) * K + 32c ..]. */
OPS_FN void gemm_tile_f32(int type, const uint8_t *W, size_t row_bytes, int64_t K, int64_t r0, int64_t r, int64_t c,
                          float *tile) {
    float v[32];
    const int n = blk_chunk(type, W + (size_t)r * row_bytes, c, K, v);
    float *out = tile + (r - r0) * K + 32 * c;
    for (int i = 0; i < n; i++) out[i] = v[i];
}

OPS_FN void gemm_tile_f16(int type, const uint8_t *W, size_t row_bytes, int64_t K, int64_t r0, int64_t r, int64_t c,
                          uint16_t *tile) {
    float v[32];
    const int n = blk_chunk(type, W + (size_t)r * row_bytes, c, K, v);
    uint16_t *out = tile + (r - r0) * K + 32 * c;
    for (int i = 0; i < n; i++) out[i] = ops_f32_to_f16(v[i]);
}

OPS_FN void gemm_x_f16(const float *x, uint16_t *x16, int64_t i) { x16[i] = ops_f32_to_f16(x[i]); }

/* dot(tile row, x), the product where there is no cuBLAS, in the decode kernel's order (gemv.cuh
 * gemv_lane_partial, then the warp's fold): lane l sums the 32-value chunks c = l, l + 32, ... in value
 * order, ops_fold32 folds the 32 lanes. So a prefill product has the bits of the decode kernel's, and a row's
 * numbers do not depend on how many rows share its step (the tile holds the decoder's values bit for bit). */
OPS_FN float gemm_tile_dot(const float *trow, const float *x, int64_t K) {
    float p[OPS_WARP];
    const int64_t nc = (K + 31) / 32;
    for (int lane = 0; lane < OPS_WARP; lane++) {
        float acc = 0.0f;
        for (int64_t c = lane; c < nc; c += OPS_WARP) {
            const int64_t k1 = 32 * c + 32 < K ? 32 * c + 32 : K;
            for (int64_t k = 32 * c; k < k1; k++) acc = fmaf(trow[k], x[k], acc);
        }
        p[lane] = acc;
    }
    return ops_fold32(p);
}

#ifdef __CUDACC__
/* Rows [r0, r1) of W to the tile, one thread per (row, chunk): (r1 - r0) * ceil(K / 32) threads. */
static __global__ void k_gemm_tile_f32(int type, const uint8_t *W, size_t row_bytes, int64_t K, int64_t r0, int64_t r1,
                                       float *tile) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nc = (K + 31) / 32;
    if (i < (r1 - r0) * nc) gemm_tile_f32(type, W, row_bytes, K, r0, r0 + i / nc, i % nc, tile);
}

static __global__ void k_gemm_tile_f16(int type, const uint8_t *W, size_t row_bytes, int64_t K, int64_t r0, int64_t r1,
                                       uint16_t *tile) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, nc = (K + 31) / 32;
    if (i < (r1 - r0) * nc) gemm_tile_f16(type, W, row_bytes, K, r0, r0 + i / nc, i % nc, tile);
}

static __global__ void k_gemm_x_f16(const float *x, uint16_t *x16, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) gemm_x_f16(x, x16, i);
}

/* y[t * ldy + r0 + j] = dot(tile row j, x column t) for j < rows, t < n; one thread per output. */
static __global__ void k_gemm_tile_dot(const float *tile, int64_t rows, int64_t K, const float *x, int64_t n, float *y,
                                       int64_t ldy, int64_t r0) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * n) return;
    const int64_t j = i % rows, t = i / rows;
    y[t * ldy + r0 + j] = gemm_tile_dot(tile + j * K, x + t * K, K);
}
#endif

#endif
