// gdn.cu — the launchers of the Gated DeltaNet kernels (gdn.h); the kernels and their arithmetic are in
// gdn.cuh, checked on the host by tests/native/test_cuda_ops_gdn.c.
//
// Launch shapes: element-wise ops one thread per element (256 a block); the q/k and output norms one
// warp per head vector (4 a block); the recurrent and chunked forms one block per value head with a
// thread per state column (dv, or max(dk, dv), rounded up to whole warps).
#include "kernels/cuda/gdn.cuh"

#include "kernels/cuda/gdn.h"
extern "C" {
#include "util/error.h"
}

#include <cuda_runtime.h>

namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = 4;

unsigned blocks_for(int64_t n, int per_block) { return (unsigned)((n + per_block - 1) / per_block); }

unsigned warps_rounded(int n) { return (unsigned)((n + OPS_WARP - 1) / OPS_WARP * OPS_WARP); }

strata_status launched(const char *op) {
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? STRATA_OK : strata_fail(STRATA_ERR_IO, "cuda %s: %s", op, cudaGetErrorString(e));
}

gdn_heads heads(const float *qn, const float *kn, const float *cv, const float *beta, const float *g, float *o,
                int64_t L, int Gk, int Gv, int dk, int dv) {
    gdn_heads H;
    H.qn = qn;
    H.kn = kn;
    H.cv = cv;
    H.beta = beta;
    H.g = g;
    H.o = o;
    H.L = L;
    H.Gk = Gk;
    H.Gv = Gv;
    H.dk = dk;
    H.dv = dv;
    return H;
}

}  // namespace

extern "C" strata_status gdn_cuda_conv(const float *w, int Kc, int64_t CD, float *hist, const float *x, int64_t ldx,
                                       int64_t L, float *cv, void *stream) {
    if (L <= 0) return STRATA_OK;
    const cudaStream_t s = (cudaStream_t)stream;
    // the conv reads the old history: it goes first on the stream, the advance after it
    gdn_k_conv<<<blocks_for(L * CD, kThreads), kThreads, 0, s>>>(w, hist, x, ldx, Kc, CD, L, cv);
    gdn_k_conv_advance<<<blocks_for(CD, kThreads), kThreads, 0, s>>>(hist, x, ldx, Kc, CD, L);
    return launched("gdn conv");
}

extern "C" strata_status gdn_cuda_prep(const float *cv, int64_t L, int Gk, int Gv, int dk, int dv, const float *b,
                                       const float *a, int64_t ldba, const float *ssm_a, const float *dt_bias,
                                       float *qn, float *kn, float *beta, float *g, void *stream) {
    if (L <= 0) return STRATA_OK;
    const cudaStream_t s = (cudaStream_t)stream;
    const int64_t CD = 2 * (int64_t)Gk * dk + (int64_t)Gv * dv;
    gdn_k_qk_norm<<<blocks_for(L * Gk * 2, kWarpsPerBlock), kWarpsPerBlock * OPS_WARP, 0, s>>>(cv, L, Gk, dk, CD, qn,
                                                                                              kn);
    gdn_k_gates<<<blocks_for(L * Gv, kThreads), kThreads, 0, s>>>(b, a, ldba, ssm_a, dt_bias, L, Gv, beta, g);
    return launched("gdn prep");
}

extern "C" strata_status gdn_cuda_recurrent(float *S, const float *qn, const float *kn, const float *cv,
                                            const float *beta, const float *g, float *o, int64_t L, int Gk, int Gv,
                                            int dk, int dv, float *S_slots, void *stream) {
    if (dv > 1024) return strata_fail(STRATA_ERR_UNSUPPORTED, "cuda gdn recurrent: head dim %d > 1024", dv);
    if (L <= 0) return STRATA_OK;
    gdn_k_recurrent<<<Gv, warps_rounded(dv), 0, (cudaStream_t)stream>>>(heads(qn, kn, cv, beta, g, o, L, Gk, Gv, dk, dv),
                                                                        S, S_slots);
    return launched("gdn recurrent");
}

extern "C" size_t gdn_cuda_chunked_work_floats(int Gv, int dk, int dv) {
    return (size_t)Gv * (size_t)gdn_chunk_work_floats(dk, dv);
}

extern "C" strata_status gdn_cuda_chunked(float *S, const float *qn, const float *kn, const float *cv,
                                          const float *beta, const float *g, float *o, int64_t L, int Gk, int Gv,
                                          int dk, int dv, float *work, void *stream) {
    const int cols = dk > dv ? dk : dv;
    if (cols > 1024) return strata_fail(STRATA_ERR_UNSUPPORTED, "cuda gdn chunked: head dim %d > 1024", cols);
    if (L <= 0) return STRATA_OK;
    gdn_k_chunked<<<Gv, warps_rounded(cols), 0, (cudaStream_t)stream>>>(heads(qn, kn, cv, beta, g, o, L, Gk, Gv, dk, dv),
                                                                        S, work);
    return launched("gdn chunked");
}

extern "C" strata_status gdn_cuda_out(float *o, const float *z, int64_t ldz, const float *w, int64_t L, int Gv, int dv,
                                      float eps, int gate_sigmoid, void *stream) {
    if (L <= 0) return STRATA_OK;
    gdn_k_out<<<blocks_for(L * Gv, kWarpsPerBlock), kWarpsPerBlock * OPS_WARP, 0, (cudaStream_t)stream>>>(
        o, z, ldz, w, L, Gv, dv, eps, gate_sigmoid);
    return launched("gdn out");
}
