// router.cu — launchers of the MoE router kernels (router.h); the arithmetic is router.cuh's, checked
// on the host by tests/native/test_cuda_ops_small.c.
#include "kernels/cuda/router.cuh"

#include <cuda_runtime.h>

extern "C" {
#include "kernels/cuda/router.h"
#include "util/error.h"
}

static const int ROUTER_TOKENS_PER_BLOCK = 4;   // warps per block: one token each
static const int ROUTER_THREADS = 256;

static strata_status launched(const char *op) {
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? STRATA_OK : strata_fail(STRATA_ERR_IO, "cuda %s: %s", op, cudaGetErrorString(e));
}

extern "C" strata_status cuk_router_topk(float *lg, int64_t L, int64_t Ne, int64_t K, int32_t *pick, float *pw,
                                         void *stream) {
    if (L <= 0) return STRATA_OK;
    const unsigned blocks = (unsigned)((L + ROUTER_TOKENS_PER_BLOCK - 1) / ROUTER_TOKENS_PER_BLOCK);
    router_topk_kernel<<<blocks, ROUTER_TOKENS_PER_BLOCK * OPS_WARP, 0, (cudaStream_t)stream>>>(lg, L, Ne, K, pick,
                                                                                               pw);
    return launched("router top-k");
}

extern "C" strata_status cuk_router_group(const int32_t *pick, int64_t n, int64_t Ne, int64_t *count, int64_t *slot,
                                          int64_t *row, void *stream) {
    if (Ne <= 0) return STRATA_OK;
    cudaStream_t s = (cudaStream_t)stream;
    const unsigned blocks = (unsigned)((Ne + ROUTER_THREADS - 1) / ROUTER_THREADS);
    router_count_kernel<<<blocks, ROUTER_THREADS, 0, s>>>(pick, n, Ne, count);
    strata_status rc = launched("router count");
    if (rc) return rc;
    router_prefix_kernel<<<1, 1, 0, s>>>(count, Ne);
    if ((rc = launched("router prefix"))) return rc;
    router_fill_kernel<<<blocks, ROUTER_THREADS, 0, s>>>(pick, n, Ne, count, slot, row);
    return launched("router fill");
}
