// gemv.cu — launchers of the decode matrix-vector kernels and the product scale (gemv.cuh; declared in gemv.h).
#include "kernels/cuda/gemv.cuh"

extern "C" {
#include "kernels/cuda/gemv.h"
#include "util/error.h"
}

#include <cuda_runtime.h>

static strata_status gemv_fail(cudaError_t e, const char *op) {
    (void)cudaGetLastError();   // clear a sticky launch error
    return strata_fail(STRATA_ERR_IO, "cuda %s: %s", op, cudaGetErrorString(e));
}

extern "C" strata_status strata_cuda_act_quant(void *stream, int act, const float *x, float *xq, int64_t n,
                                               int64_t K) {
    const int bs = blk_act_block(act);
    if (act < 0 || act > 2 || n < 0 || K % bs)
        return strata_fail(STRATA_ERR_INVALID_ARG, "cuda act_quant: act %d, K %lld", act, (long long)K);
    const int64_t nb = n * K / bs;
    if (nb == 0) return STRATA_OK;
    k_gemv_act<<<(unsigned)((nb + 127) / 128), 128, 0, (cudaStream_t)stream>>>(x, xq, nb, act);
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? STRATA_OK : gemv_fail(e, "act_quant");
}

extern "C" strata_status strata_cuda_gemv(void *stream, int type, const void *W, size_t row_bytes, int64_t R,
                                          int64_t K, const float *xq, int64_t n, float *y) {
    if (!blk_supported(type)) return strata_fail(STRATA_ERR_UNSUPPORTED, "cuda gemv: no kernel for type %d", type);
    if (R < 0 || n < 0 || K <= 0 || K % blk_size(type))
        return strata_fail(STRATA_ERR_INVALID_ARG, "cuda gemv: %lld x %lld of type %d", (long long)R, (long long)K,
                           type);
    if (R == 0 || n == 0) return STRATA_OK;
    cudaError_t e = blk_tables_ready();
    if (e != cudaSuccess) return gemv_fail(e, "gemv tables");
    dim3 grid((unsigned)((R + GEMV_WARPS - 1) / GEMV_WARPS), (unsigned)(n < 65535 ? n : 65535));
    k_gemv<<<grid, GEMV_WARPS * OPS_WARP, 0, (cudaStream_t)stream>>>(type, (const uint8_t *)W, row_bytes, R, K, xq,
                                                                      K, n, y, R);
    e = cudaGetLastError();
    return e == cudaSuccess ? STRATA_OK : gemv_fail(e, "gemv");
}

extern "C" strata_status strata_cuda_scale(void *stream, float *y, int64_t n, float s) {
    if (n < 0) return strata_fail(STRATA_ERR_INVALID_ARG, "cuda scale: %lld values", (long long)n);
    if (n == 0) return STRATA_OK;
    k_gemv_scale<<<(unsigned)((n + 255) / 256), 256, 0, (cudaStream_t)stream>>>(y, n, s);
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? STRATA_OK : gemv_fail(e, "scale");
}
