// gemm.cu — launchers of the prefill products (gemm.cuh; declared in gemm.h): dequantize rows of W to a
// tile, then the toolkit's GEMM on the tile (cuBLAS where the build found it: STRATA_HAVE_CUBLAS).
//
// Layouts for cuBLAS (column-major): a tile of `rows` rows of K values is the K x rows matrix A (lda K),
// x (n columns of K) the K x n matrix B (ldb K), y (n rows of R) the R x n matrix C (ldc R); the tile's
// outputs are C[r0 .. r0+rows) = A^T B, so each pass is one GEMM with op(A) = T, op(B) = N.
#include "kernels/cuda/gemm.cuh"

extern "C" {
#include "kernels/cuda/gemm.h"
#include "util/error.h"
}

#include <cuda_runtime.h>
#if STRATA_HAVE_CUBLAS
#include <cublas_v2.h>
#endif

static strata_status gemm_fail(cudaError_t e, const char *op) {
    (void)cudaGetLastError();   // clear a sticky launch error
    return strata_fail(STRATA_ERR_IO, "cuda %s: %s", op, cudaGetErrorString(e));
}

static unsigned blocks_of(int64_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

extern "C" strata_status strata_cuda_gemm_create(void **handle) {
    *handle = NULL;
#if STRATA_HAVE_CUBLAS
    cublasHandle_t h = NULL;
    const cublasStatus_t s = cublasCreate(&h);
    if (s != CUBLAS_STATUS_SUCCESS) return strata_fail(STRATA_ERR_IO, "cuda gemm: cublasCreate: status %d", (int)s);
    *handle = h;
#endif
    return STRATA_OK;
}

extern "C" void strata_cuda_gemm_destroy(void *handle) {
#if STRATA_HAVE_CUBLAS
    if (handle) cublasDestroy((cublasHandle_t)handle);
#else
    (void)handle;
#endif
}

extern "C" size_t strata_cuda_gemm_tile_bytes(int64_t K, int64_t tile_rows, int f16) {
    return gemm_tile_bytes(K, tile_rows, f16);
}

extern "C" strata_status strata_cuda_gemm(void *handle, void *stream, int type, const void *W, size_t row_bytes,
                                          int64_t R, int64_t K, const float *x, int64_t n, float *y, void *tile,
                                          size_t tile_bytes, int f16, void *x16) {
    if (!blk_supported(type)) return strata_fail(STRATA_ERR_UNSUPPORTED, "cuda gemm: no kernel for type %d", type);
    if (R < 0 || n < 0 || K <= 0 || K % blk_size(type) || K > 0x7fffffff || n > 0x7fffffff)
        return strata_fail(STRATA_ERR_INVALID_ARG, "cuda gemm: %lld x %lld of type %d, %lld columns", (long long)R,
                           (long long)K, type, (long long)n);
    if (R == 0 || n == 0) return STRATA_OK;
    f16 = f16 && handle;   // the kernel without cuBLAS multiplies float tiles
    const int64_t tile_rows = (int64_t)(tile_bytes / strata_cuda_gemm_tile_bytes(K, 1, f16));
    if (tile_rows < 1)
        return strata_fail(STRATA_ERR_BUFFER_TOO_SMALL, "cuda gemm: a tile of %zu bytes holds no row of %lld values",
                           tile_bytes, (long long)K);
    cudaStream_t st = (cudaStream_t)stream;
    cudaError_t e = blk_tables_ready();
    if (e != cudaSuccess) return gemm_fail(e, "gemm tables");
    const uint8_t *w = (const uint8_t *)W;
    const int64_t nc = (K + 31) / 32;
#if STRATA_HAVE_CUBLAS
    cublasHandle_t h = (cublasHandle_t)handle;
    if (h) {
        cublasStatus_t s = cublasSetStream(h, st);
        if (s != CUBLAS_STATUS_SUCCESS)
            return strata_fail(STRATA_ERR_IO, "cuda gemm: cublasSetStream: status %d", (int)s);
        if (f16) {
            k_gemm_x_f16<<<blocks_of(n * K, 256), 256, 0, st>>>(x, (uint16_t *)x16, n * K);
            if ((e = cudaGetLastError())) return gemm_fail(e, "gemm x to f16");
        }
        const float one = 1.0f, zero = 0.0f;
        for (int64_t r0 = 0; r0 < R; r0 += tile_rows) {
            const int64_t rows = R - r0 < tile_rows ? R - r0 : tile_rows;
            if (f16)
                k_gemm_tile_f16<<<blocks_of(rows * nc, 128), 128, 0, st>>>(type, w, row_bytes, K, r0, r0 + rows,
                                                                           (uint16_t *)tile);
            else
                k_gemm_tile_f32<<<blocks_of(rows * nc, 128), 128, 0, st>>>(type, w, row_bytes, K, r0, r0 + rows,
                                                                           (float *)tile);
            if ((e = cudaGetLastError())) return gemm_fail(e, "gemm tile");
            if (f16)
                s = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n, (int)K, &one, tile, CUDA_R_16F, (int)K,
                                 x16, CUDA_R_16F, (int)K, &zero, y + r0, CUDA_R_32F, (int)R, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT);
            else
                s = cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n, (int)K, &one, (const float *)tile,
                                (int)K, x, (int)K, &zero, y + r0, (int)R);
            if (s != CUBLAS_STATUS_SUCCESS) return strata_fail(STRATA_ERR_IO, "cuda gemm: cuBLAS status %d", (int)s);
        }
        return STRATA_OK;
    }
#else
    (void)x16;
#endif
    for (int64_t r0 = 0; r0 < R; r0 += tile_rows) {
        const int64_t rows = R - r0 < tile_rows ? R - r0 : tile_rows;
        k_gemm_tile_f32<<<blocks_of(rows * nc, 128), 128, 0, st>>>(type, w, row_bytes, K, r0, r0 + rows, (float *)tile);
        k_gemm_tile_dot<<<blocks_of(rows * n, 128), 128, 0, st>>>((const float *)tile, rows, K, x, n, y, R, r0);
        if ((e = cudaGetLastError())) return gemm_fail(e, "gemm");
    }
    return STRATA_OK;
}
