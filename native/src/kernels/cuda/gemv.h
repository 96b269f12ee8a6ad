/* gemv.h — the decode matrix-vector launchers (and the products' scale) of kernels/cuda/gemv.cu (C-callable;
 * pointers are device pointers, stream a cudaStream_t). The arithmetic is gemv.cuh's; the host check is
 * tests/native/test_cuda_ops_gemv.c, the host emulation kernels/cuda/emu_small.h. */
#ifndef STRATA_KERNELS_CUDA_GEMV_H
#define STRATA_KERNELS_CUDA_GEMV_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"

#ifdef __cplusplus
extern "C" {
#endif

/* xq = x (n columns of K floats, contiguous) quantized as strata_matmul quantizes activations for a
 * weight type whose strata_qtraits.act is `act` (0: copied as is; 1: per 32 values, 2: per 256; K a
 * multiple of that). xq may equal x. */
strata_status strata_cuda_act_quant(void *stream, int act, const float *x, float *xq, int64_t n, int64_t K);

/* y[t * R + r] = dot(W row r, xq column t) for r < R, t < n. W: R rows of row_bytes bytes of K values
 * of ggml type `type` (every type of blocks.cuh; K a multiple of its block size); xq: n x K, already in
 * the type's activation format (strata_cuda_act_quant). Fails with STRATA_ERR_UNSUPPORTED for
 * another type, STRATA_ERR_IO for a CUDA error. */
strata_status strata_cuda_gemv(void *stream, int type, const void *W, size_t row_bytes, int64_t R, int64_t K,
                               const float *xq, int64_t n, float *y);

/* y[i] *= s for i < n: a product's outputs times its NVFP4 tensor's per-tensor .scale (as mdl_matmul
 * after the product). STRATA_ERR_INVALID_ARG for n < 0, STRATA_ERR_IO for a CUDA error. */
strata_status strata_cuda_scale(void *stream, float *y, int64_t n, float s);

#ifdef __cplusplus
}
#endif

#endif
