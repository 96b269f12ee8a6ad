/*
 * expert_kernels.cuh — the kernels of the cuda expert device (device/device_cuda.cu): activation
 * quantization and the matrix products are gemv.cuh's (k_gemv_act, k_gemv); the gated unit is here.
 * Also compiled into tests/native/cuda_blocks_check.cu, whose --gpu modes run them against the C
 * library's numbers.
 */
#ifndef STRATA_KERNELS_CUDA_EXPERT_KERNELS_CUH
#define STRATA_KERNELS_CUDA_EXPERT_KERNELS_CUH

#include "kernels/cuda/ops_common.cuh"
#include "kernels/cuda/gemv.cuh"

/* Element i of h (n x F): silu(g * sg) * (u * su), gate and up read from gu (fused: halves of one 2F
 * row; else gate n x F, then up n x F) as mdev_expert_ffn (device/device_sim.c). */
OPS_FN float expert_glu(const float *gu, int64_t n, int64_t F, int fused, float sg, float su, int64_t i) {
    const int64_t t = i / F, f = i % F;
    float g, u;
    if (fused) {
        g = gu[t * 2 * F + f] * sg;
        u = gu[t * 2 * F + F + f] * su;
    } else {
        g = gu[i] * sg;
        u = gu[n * F + i] * su;
    }
    return ops_silu(g) * u;
}

#ifdef __CUDACC__
static __global__ void k_glu(const float *gu, int64_t n, int64_t F, int fused, float sg, float su, float *h) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n * F) h[i] = expert_glu(gu, n, F, fused, sg, su, i);
}
#endif

#endif
