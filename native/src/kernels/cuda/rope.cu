// rope.cu — launchers of the RoPE kernels (rope.h); the arithmetic is rope.cuh's, checked on the host
// by tests/native/test_cuda_ops_small.c.
#include "kernels/cuda/rope.cuh"

#include <cuda_runtime.h>

extern "C" {
#include "kernels/cuda/rope.h"
#include "util/error.h"
}

static const int ROPE_THREADS = 256;

static strata_status launched(const char *op) {
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? STRATA_OK : strata_fail(STRATA_ERR_IO, "cuda %s: %s", op, cudaGetErrorString(e));
}

static unsigned blocks_for(int64_t units) { return (unsigned)((units + ROPE_THREADS - 1) / ROPE_THREADS); }

extern "C" strata_status cuk_rope_angles(float theta, int32_t n_rot, int64_t p0, int64_t dp, int64_t L, float *cs,
                                         void *stream) {
    const int64_t units = L * (n_rot / 2);
    if (units <= 0) return STRATA_OK;
    rope_angles_kernel<<<blocks_for(units), ROPE_THREADS, 0, (cudaStream_t)stream>>>(theta, n_rot, p0, dp, L, cs);
    return launched("rope angles");
}

extern "C" strata_status cuk_rope_apply(float *x, int64_t xs, int64_t rows, int64_t nh, int32_t n_rot, const float *cs,
                                        void *stream) {
    const int64_t units = rows * (n_rot / 2);
    if (units <= 0) return STRATA_OK;
    rope_apply_kernel<<<blocks_for(units), ROPE_THREADS, 0, (cudaStream_t)stream>>>(x, xs, rows, nh, n_rot, cs);
    return launched("rope apply");
}
