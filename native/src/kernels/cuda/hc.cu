// hc.cu — launchers of the hyper-connection kernels (hc.h); the arithmetic is hc.cuh's and
// norm.cuh's, checked on the host by tests/native/test_cuda_ops_small.c.
#include "kernels/cuda/hc.cuh"

#include <cuda_runtime.h>

extern "C" {
#include "kernels/cuda/hc.h"
#include "util/error.h"
}

static const int HC_THREADS = 256;
static const int HC_NORM_ROWS_PER_BLOCK = 4;   // warps per block of the norm: one stream row each

static strata_status launched(const char *op) {
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? STRATA_OK : strata_fail(STRATA_ERR_IO, "cuda %s: %s", op, cudaGetErrorString(e));
}

static unsigned blocks_for(int64_t units) { return (unsigned)((units + HC_THREADS - 1) / HC_THREADS); }

extern "C" strata_status cuk_hc_read_norm(const float *X, const float *w_n, int64_t L, int64_t hc, int64_t E, float eps,
                                          float *xh, void *stream) {
    const int64_t rows = L * hc;   // row t·hc + j is stream j of token t; its weights w_n + j·E
    if (rows <= 0) return STRATA_OK;
    const unsigned blocks = (unsigned)((rows + HC_NORM_ROWS_PER_BLOCK - 1) / HC_NORM_ROWS_PER_BLOCK);
    norm_rows_kernel<<<blocks, HC_NORM_ROWS_PER_BLOCK * OPS_WARP, 0, (cudaStream_t)stream>>>(X, E, w_n, hc, rows, E,
                                                                                            eps, xh, E);
    return launched("hc read norm");
}

extern "C" strata_status cuk_hc_read_act(float *a, int64_t n, int64_t hc, void *stream) {
    if (n <= 0) return STRATA_OK;
    hc_act_kernel<<<blocks_for(n), HC_THREADS, 0, (cudaStream_t)stream>>>(a, n, hc);
    return launched("hc read act");
}

extern "C" strata_status cuk_hc_read_mix(const float *g, const float *xh, int64_t L, int64_t hc, int64_t E, float *u,
                                         void *stream) {
    if (L * E <= 0) return STRATA_OK;
    hc_mix_kernel<<<blocks_for(L * E), HC_THREADS, 0, (cudaStream_t)stream>>>(g, xh, L, hc, E, u);
    return launched("hc read mix");
}

extern "C" strata_status cuk_hc_inject(const float *a, int64_t n, int64_t hc, float *c, void *stream) {
    if (n <= 0) return STRATA_OK;
    hc_inject_kernel<<<blocks_for(n), HC_THREADS, 0, (cudaStream_t)stream>>>(a, n, hc, c);
    return launched("hc inject");
}

extern "C" strata_status cuk_hc_write(float *X, const float *c, const float *y, int64_t L, int64_t hc, int64_t E,
                                      void *stream) {
    if (L * hc * E <= 0) return STRATA_OK;
    hc_write_kernel<<<blocks_for(L * hc * E), HC_THREADS, 0, (cudaStream_t)stream>>>(X, c, y, L, hc, E);
    return launched("hc write");
}
