/* gemm.h — the prefill product launchers of kernels/cuda/gemm.cu (C-callable; pointers are device
 * pointers, stream a cudaStream_t, handle a cuBLAS handle or NULL). The arithmetic is gemm.cuh's; the
 * host check is tests/native/test_cuda_ops_gemv.c (gemm.<type>). */
#ifndef STRATA_KERNELS_CUDA_GEMM_H
#define STRATA_KERNELS_CUDA_GEMM_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A cuBLAS handle for strata_cuda_gemm (*handle = NULL and STRATA_OK in a build without cuBLAS: the
 * products then run on gemm.cuh's own kernel). Free with strata_cuda_gemm_destroy. */
strata_status strata_cuda_gemm_create(void **handle);
void strata_cuda_gemm_destroy(void *handle);

/* Bytes of tile scratch that tile_rows rows of K values take (f16: halves, else floats). */
size_t strata_cuda_gemm_tile_bytes(int64_t K, int64_t tile_rows, int f16);

/* y[t * R + r] = sum_k W[r, k] * x[t * K + k] for r < R, t < n: W (R rows of row_bytes bytes of K values of
 * ggml type `type`, every type of blocks.cuh) is decoded to tiles of as many rows as `tile` (tile_bytes)
 * holds, each multiplied by the n columns of x (unquantized floats). f16 (with a handle): half tiles and
 * activations (x16: n * K halves of scratch) into float sums (cublasGemmEx, tensor cores); else float
 * tiles and cublasSgemm, or gemm.cuh's kernel where handle is NULL. STRATA_ERR_BUFFER_TOO_SMALL when
 * the tile holds no row, STRATA_ERR_UNSUPPORTED for an unknown type, STRATA_ERR_IO for a CUDA or
 * cuBLAS error. */
strata_status strata_cuda_gemm(void *handle, void *stream, int type, const void *W, size_t row_bytes, int64_t R,
                               int64_t K, const float *x, int64_t n, float *y, void *tile, size_t tile_bytes, int f16,
                               void *x16);

#ifdef __cplusplus
}
#endif

#endif
