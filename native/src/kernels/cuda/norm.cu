// norm.cu — launchers of the RMS-norm kernels (norm.h); the arithmetic is norm.cuh's, checked on the
// host by tests/native/test_cuda_ops_small.c.
#include "kernels/cuda/norm.cuh"

#include <cuda_runtime.h>

extern "C" {
#include "kernels/cuda/norm.h"
#include "util/error.h"
}

static const int NORM_ROWS_PER_BLOCK = 4;   // warps per block: one row each

extern "C" strata_status cuk_rmsnorm_rows(const float *x, int64_t xs, const float *w, int64_t wg, int64_t rows,
                                          int64_t n, float eps, float *y, int64_t ys, void *stream) {
    if (rows <= 0) return STRATA_OK;
    const unsigned blocks = (unsigned)((rows + NORM_ROWS_PER_BLOCK - 1) / NORM_ROWS_PER_BLOCK);
    norm_rows_kernel<<<blocks, NORM_ROWS_PER_BLOCK * OPS_WARP, 0, (cudaStream_t)stream>>>(x, xs, w, wg, rows, n, eps,
                                                                                          y, ys);
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? STRATA_OK : strata_fail(STRATA_ERR_IO, "cuda rmsnorm: %s", cudaGetErrorString(e));
}
