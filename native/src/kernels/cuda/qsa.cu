// qsa.cu — launchers of the QSA attention kernels (qsa.h); the arithmetic is qsa.cuh's, checked on the
// host by tests/native/test_cuda_ops_qsa.c.
#include "kernels/cuda/qsa.cuh"

#include <cuda_runtime.h>

extern "C" {
#include "kernels/cuda/qsa.h"
#include "util/error.h"
}

static const int QSA_ROWS_PER_BLOCK = 4;   // store: warps per block, one row each
static const int QSA_THREADS = 128;        // one-thread-per-unit kernels
static const int QSA_ATTN_THREADS = 256;   // attention: keys, then dims, per (query, head)

static strata_status launched(const char *op) {
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? STRATA_OK : strata_fail(STRATA_ERR_IO, "cuda %s: %s", op, cudaGetErrorString(e));
}

static unsigned n_blocks(int64_t units, int per) { return (unsigned)((units + per - 1) / per); }

extern "C" strata_status qsa_cuda_store(void *k_cache, void *v_cache, float *kv_scale, int kv_type, int64_t Hkv,
                                        int64_t hd, int64_t p0, int64_t L, const float *k, const float *v,
                                        void *stream) {
    if (L <= 0) return STRATA_OK;
    qsa_k_store<<<n_blocks(L * 2 * Hkv, QSA_ROWS_PER_BLOCK), QSA_ROWS_PER_BLOCK * OPS_WARP, 0,
                  (cudaStream_t)stream>>>(k_cache, v_cache, kv_scale, kv_type, Hkv, hd, p0, L, k, v);
    return launched("qsa store");
}

extern "C" strata_status qsa_cuda_idx_store(float *idx_k, const float *ik, int64_t dI, int64_t p0, int64_t L,
                                            void *stream) {
    if (L <= 0) return STRATA_OK;
    const cudaError_t e = cudaMemcpyAsync(idx_k + p0 * dI, ik, (size_t)(L * dI) * sizeof(float),
                                          cudaMemcpyDeviceToDevice, (cudaStream_t)stream);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return strata_fail(STRATA_ERR_IO, "cuda qsa idx store: %s", cudaGetErrorString(e));
    }
    return STRATA_OK;
}

extern "C" strata_status qsa_cuda_blk_pool(const float *idx_k, int64_t dI, int64_t r, int64_t b0, int64_t nbn,
                                           float *blk, void *stream) {
    if (nbn <= 0 || r <= 0) return STRATA_OK;
    qsa_k_blk_pool<<<n_blocks(nbn * dI, QSA_THREADS), QSA_THREADS, 0, (cudaStream_t)stream>>>(idx_k, dI, r, b0, nbn,
                                                                                            blk);
    return launched("qsa blk pool");
}

extern "C" strata_status qsa_cuda_index(const float *iq, const float *blk, int64_t nI, int64_t dI, int64_t r,
                                        int64_t topk, int64_t p0, int64_t L, float *score, int64_t ld,
                                        void *stream) {
    if (L <= 0 || r <= 0 || ld <= 0) return STRATA_OK;
    qsa_k_index<<<n_blocks(L * ld, QSA_THREADS), QSA_THREADS, 0, (cudaStream_t)stream>>>(iq, blk, nI, dI, r, topk, p0,
                                                                                       L, score, ld);
    return launched("qsa index");
}

extern "C" strata_status qsa_cuda_select(const float *score, int64_t ld, int64_t r, int64_t topk, int64_t p0,
                                         int64_t L, int32_t *sel, int64_t sel_cap, int32_t *n_sel, void *stream) {
    if (L <= 0) return STRATA_OK;
    qsa_k_select<<<(unsigned)L, OPS_WARP, 0, (cudaStream_t)stream>>>(score, ld, r, topk, p0, sel, sel_cap, n_sel);
    return launched("qsa select");
}

extern "C" strata_status qsa_cuda_attn(const void *k_cache, const void *v_cache, const float *kv_scale, int kv_type,
                                       int64_t H, int64_t Hkv, int64_t hd, int64_t p0, int64_t L, const float *q,
                                       const float *qg, const int32_t *sel, int64_t sel_cap, const int32_t *n_sel,
                                       float *w, int64_t w_cap, float *o, void *stream) {
    if (L <= 0) return STRATA_OK;
    qsa_attn_job A;
    A.kv.k = k_cache;
    A.kv.v = v_cache;
    A.kv.scale = kv_scale;
    A.kv.kv_type = kv_type;
    A.kv.Hkv = Hkv;
    A.kv.hd = hd;
    A.q = q;
    A.qg = qg;
    A.sel = sel;
    A.n_sel = n_sel;
    A.w = w;
    A.o = o;
    A.p0 = p0;
    A.H = H;
    A.sel_cap = sel_cap;
    A.w_cap = w_cap;
    qsa_k_attn<<<dim3((unsigned)L, (unsigned)H), QSA_ATTN_THREADS, 0, (cudaStream_t)stream>>>(A);
    return launched("qsa attn");
}
