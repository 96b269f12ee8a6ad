// mtp.cu — the launcher of mtp.h: mtp.cuh's two kernels (the row norms, then the concatenation).
#include "kernels/cuda/mtp.cuh"

extern "C" {
#include "kernels/cuda/mtp.h"
#include "util/error.h"
}

#include <cuda_runtime.h>

static const int kThreads = 256;

static unsigned mtp_blocks(int64_t units, int64_t per_block) { return (unsigned)((units + per_block - 1) / per_block); }

static strata_status mtp_launched(const char *op) {
    const cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return STRATA_OK;
    return strata_fail(STRATA_ERR_IO, "cuda %s: %s", op, cudaGetErrorString(e));
}

extern "C" strata_status mtp_cuda_norm_concat(const float *e, const float *h, const float *enorm, const float *hnorm,
                                              int64_t L, int64_t hc, int64_t E, float eps, float *scratch, float *in2,
                                              void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    if (L <= 0) return STRATA_OK;
    mtp_k_norms<<<mtp_blocks(2 * L, kThreads / OPS_WARP), kThreads, 0, st>>>(e, h, hc, E, eps, 2 * L, scratch);
    strata_status rc = mtp_launched("mtp.norm_concat (norms)");
    if (rc) return rc;
    const int64_t n = L * hc * 2 * E;
    mtp_k_concat<<<mtp_blocks(n, kThreads), kThreads, 0, st>>>(e, h, enorm, hnorm, scratch, hc, E, n, in2);
    return mtp_launched("mtp.norm_concat");
}
