// ple.cu — the launchers of ple.h: one kernel of ple.cuh per op (ple.conv: the conv, then the history
// copies). Simple launches: 256 threads, one value per thread or one warp per (token, stream).
#include "kernels/cuda/ple.cuh"

extern "C" {
#include "kernels/cuda/ple.h"
#include "util/error.h"
}

#include <cuda_runtime.h>

static_assert(PLE_CUDA_ROWS_NVFP4_PACKED == PLE_ROWS_NVFP4_PACKED, "ple.h and ple.cuh name the same format");

static const int kThreads = 256;

static unsigned ple_blocks(int64_t units, int64_t per_block) { return (unsigned)((units + per_block - 1) / per_block); }

static strata_status ple_launched(const char *op) {
    const cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return STRATA_OK;
    return strata_fail(STRATA_ERR_IO, "cuda %s: %s", op, cudaGetErrorString(e));
}

extern "C" strata_status ple_cuda_dequant(int fmt, const uint8_t *rows, size_t row_bytes, int64_t n_rows, int64_t dP,
                                          const uint64_t *row_ids, const float *gscale, int64_t n_shard,
                                          int64_t shard_rows, float *emb, void *stream) {
    if (fmt == PLE_ROWS_NVFP4_PACKED) {
        if (dP % 16 || row_bytes < (size_t)(dP / 2 + dP / 16) || n_shard < 1 || shard_rows < 1)
            return strata_fail(STRATA_ERR_UNSUPPORTED, "cuda ple.dequant: packed NVFP4 rows of %lld values in %zu bytes, "
                               "%lld shards of %lld rows", (long long)dP, row_bytes, (long long)n_shard,
                               (long long)shard_rows);
    } else {
        if (!blk_supported(fmt) || dP % blk_size(fmt) || row_bytes < (size_t)(dP / blk_size(fmt) * blk_bytes(fmt)))
            return strata_fail(STRATA_ERR_UNSUPPORTED, "cuda ple.dequant: rows of type %d cannot hold %lld values in %zu "
                               "bytes", fmt, (long long)dP, row_bytes);
        const cudaError_t e = blk_tables_ready();   // blocks.cuh's decoders: this unit's __constant__ tables
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return strata_fail(STRATA_ERR_IO, "cuda ple.dequant: table upload: %s", cudaGetErrorString(e));
        }
    }
    const int64_t n = n_rows * dP;
    if (n <= 0) return STRATA_OK;
    ple_k_dequant<<<ple_blocks(n, kThreads), kThreads, 0, (cudaStream_t)stream>>>(fmt, rows, row_bytes, dP, row_ids,
                                                                                  gscale, n_shard, shard_rows, n, emb);
    return ple_launched("ple.dequant");
}

extern "C" strata_status ple_cuda_key_norm(float *key, const float *w, int64_t R, int64_t hc, int64_t E, float eps,
                                           void *stream) {
    const int64_t groups = R * hc, per_block = kThreads / OPS_WARP;
    if (groups <= 0) return STRATA_OK;
    ple_k_key_norm<<<ple_blocks(groups, per_block), kThreads, 0, (cudaStream_t)stream>>>(key, w, groups, hc, E, eps);
    return ple_launched("ple.project");
}

extern "C" strata_status ple_cuda_gate(const float *X, const float *key, const float *val, const float *w_query,
                                       const float *w_conv, int64_t L, int64_t hc, int64_t E, float eps, float *gv,
                                       float *gvn, void *stream) {
    const int64_t groups = L * hc, per_block = kThreads / OPS_WARP;
    if (groups <= 0) return STRATA_OK;
    ple_k_gate<<<ple_blocks(groups, per_block), kThreads, 0, (cudaStream_t)stream>>>(X, key, val, w_query, w_conv,
                                                                                     groups, hc, E, eps, gv, gvn);
    return ple_launched("ple.gate");
}

extern "C" strata_status ple_cuda_conv(float *X, const float *gv, float *ext, const float *w_conv, int64_t L,
                                       int64_t W, int64_t Kp, int64_t n, float *state, float *slots, void *stream) {
    cudaStream_t st = (cudaStream_t)stream;
    const int64_t hist = (Kp - 1) * n;
    if (L <= 0) return STRATA_OK;
    if (hist > 0) {   // ext's first rows: the history before the window (the C path's memcpy in ple_mix)
        const cudaError_t e = cudaMemcpyAsync(ext, state, (size_t)(hist * W) * sizeof(float), cudaMemcpyDeviceToDevice, st);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            return strata_fail(STRATA_ERR_IO, "cuda ple.conv: history copy: %s", cudaGetErrorString(e));
        }
    }
    ple_k_conv<<<ple_blocks(L * W, kThreads), kThreads, 0, st>>>(X, gv, ext, w_conv, W, Kp, n, L * W);
    strata_status rc = ple_launched("ple.conv");
    if (rc || hist <= 0) return rc;
    ple_k_conv_hist<<<ple_blocks(hist * W, kThreads), kThreads, 0, st>>>(ext, L, W, hist * W, state);
    if ((rc = ple_launched("ple.conv (history)")) || !slots) return rc;
    ple_k_conv_slots<<<ple_blocks(L * hist * W, kThreads), kThreads, 0, st>>>(ext, W, hist, L * hist * W, slots);
    return ple_launched("ple.conv (verify slots)");
}
