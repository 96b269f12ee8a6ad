// expert_kernels.cuh — the kernels of the cuda expert device (moe/device_cuda.cu): a quantized
// matrix times activation rows, activation quantization, the gated unit. Also compiled into
// tests/native/cuda_blocks_check.cu, whose --gpu modes run them against the C library's numbers.
// Include after blocks.cuh.
#ifndef STRATA_KERNELS_CUDA_EXPERT_KERNELS_CUH
#define STRATA_KERNELS_CUDA_EXPERT_KERNELS_CUH

// y[t * R + r] = dot(row r of W, x[t * K ..]) for t < n, r < R; one warp per (r, t).
static __global__ void k_matvec(int type, const uint8_t *W, size_t row_bytes, int64_t R, int64_t K, const float *x,
                         int64_t n, float *y) {
    const int64_t r = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (r >= R) return;
    const uint8_t *row = W + (size_t)r * row_bytes;
    for (int64_t t = blockIdx.y; t < n; t += gridDim.y) {
        const float *xt = x + t * K;
        float acc = 0.0f;
        for (int64_t k = lane; k < K; k += 32) acc += blk_value(type, row, k) * xt[k];
        for (int o = 16; o > 0; o /= 2) acc += __shfl_down_sync(0xffffffffu, acc, o);
        if (lane == 0) y[t * R + r] = acc;
    }
}

// x (n x K) -> d * q per activation block (one thread per block; blocks.cuh).
static __global__ void k_act_quant(float *x, int64_t n_blocks, int act) {
    const int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= n_blocks) return;
    const int bs = blk_act_block(act);
    blk_act_fake_quant(x + b * bs, bs, act);
}

// h[t, f] = silu(g * sg) * (u * su); fused: gate and up are halves of one 2F row of gu.
static __global__ void k_glu(const float *gu, int64_t n, int64_t F, int fused, float sg, float su, float *h) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * F) return;
    const int64_t t = i / F, f = i % F;
    float g, u;
    if (fused) { g = gu[t * 2 * F + f] * sg; u = gu[t * 2 * F + F + f] * su; }
    else { g = gu[i] * sg; u = gu[n * F + i] * su; }
    h[i] = (g / (1.0f + expf(-g))) * u;
}

#endif
