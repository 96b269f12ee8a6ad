// merge.cu — launchers of the MoE merge kernels (merge.h); the arithmetic is merge.cuh's, checked on
// the host by tests/native/test_cuda_ops_small.c.
#include "kernels/cuda/merge.cuh"

#include <cuda_runtime.h>

extern "C" {
#include "kernels/cuda/merge.h"
#include "util/error.h"
}

static const int MERGE_THREADS = 256;
static const int MERGE_TOKENS_PER_BLOCK = 4;   // warps per block of the shared gate: one token each

static strata_status launched(const char *op) {
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? STRATA_OK : strata_fail(STRATA_ERR_IO, "cuda %s: %s", op, cudaGetErrorString(e));
}

static unsigned blocks_for(int64_t units) { return (unsigned)((units + MERGE_THREADS - 1) / MERGE_THREADS); }

extern "C" strata_status cuk_merge_glu(const float *gu, int64_t n, int64_t F, int fused, float sg, float su, float *h,
                                       void *stream) {
    if (n * F <= 0) return STRATA_OK;
    merge_glu_kernel<<<blocks_for(n * F), MERGE_THREADS, 0, (cudaStream_t)stream>>>(gu, n, F, fused, sg, su, h);
    return launched("merge glu");
}

extern "C" strata_status cuk_merge_shared_gate(const float *w_seg, const float *x, int64_t L, int64_t E, float *gate,
                                               void *stream) {
    if (L <= 0) return STRATA_OK;
    const unsigned blocks = (unsigned)((L + MERGE_TOKENS_PER_BLOCK - 1) / MERGE_TOKENS_PER_BLOCK);
    merge_gate_kernel<<<blocks, MERGE_TOKENS_PER_BLOCK * OPS_WARP, 0, (cudaStream_t)stream>>>(w_seg, x, L, E, gate);
    return launched("merge shared gate");
}

extern "C" strata_status cuk_merge_gather(const float *x, const int64_t *slot, int64_t n, int64_t K, int64_t E,
                                          float *xg, void *stream) {
    if (n * E <= 0) return STRATA_OK;
    merge_gather_kernel<<<blocks_for(n * E), MERGE_THREADS, 0, (cudaStream_t)stream>>>(x, slot, n, K, E, xg);
    return launched("merge gather");
}

extern "C" strata_status cuk_merge_sum(const int32_t *pick, const float *pw, const float *sd, const int8_t *skip,
                                       const int64_t *row, const float *out, const float *gate, float sd_sh,
                                       const float *sho, int64_t L, int64_t E, int64_t K, float *y, void *stream) {
    if (L * E <= 0) return STRATA_OK;
    merge_sum_kernel<<<blocks_for(L * E), MERGE_THREADS, 0, (cudaStream_t)stream>>>(pick, pw, sd, skip, row, out, gate,
                                                                                     sd_sh, sho, L, E, K, y);
    return launched("merge sum");
}
