// dense_cuda.cu — the `cuda` table of dense.h: device memory on GPU 0, the default stream, and the launchers of
// kernels/cuda/<family>.cu. In a build without CUDA, dense_absent.c answers mdl_dk_cuda with the reason.
extern "C" {
#include "device/dense.h"
#include "kernels/cuda/gdn.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/hc.h"
#include "kernels/cuda/merge.h"
#include "kernels/cuda/mtp.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/ple.h"
#include "kernels/cuda/qsa.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/router.h"
#include "util/error.h"
}

#include <cuda_runtime.h>

static strata_status dk_fail(cudaError_t e, const char *what) {
    (void)cudaGetLastError();   // clear a sticky error
    return strata_fail(STRATA_ERR_IO, "cuda dense device: %s: %s", what, cudaGetErrorString(e));
}

static void *dk_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaMalloc(&p, bytes ? bytes : 1) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void dk_free(void *p) {
    if (p) (void)cudaFree(p);
}

static void *dk_host_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void dk_host_free(void *p) {
    if (p) (void)cudaFreeHost(p);
}

static cudaMemcpyKind dk_kind(int kind) {
    return kind == DK_H2D ? cudaMemcpyHostToDevice : kind == DK_D2H ? cudaMemcpyDeviceToHost : cudaMemcpyDeviceToDevice;
}

static strata_status dk_copy(void *dst, const void *src, size_t bytes, int kind, void *stream) {
    if (!bytes) return STRATA_OK;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, dk_kind(kind), (cudaStream_t)stream);
    // a copy to pageable host memory returns before the bytes land: the forward reads them next
    if (e == cudaSuccess && kind == DK_D2H) e = cudaStreamSynchronize((cudaStream_t)stream);
    return e == cudaSuccess ? STRATA_OK : dk_fail(e, "copy");
}

static strata_status dk_copy2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                               int kind, void *stream) {
    if (!rows || !width) return STRATA_OK;
    cudaError_t e = cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, dk_kind(kind), (cudaStream_t)stream);
    if (e == cudaSuccess && kind == DK_D2H) e = cudaStreamSynchronize((cudaStream_t)stream);
    return e == cudaSuccess ? STRATA_OK : dk_fail(e, "2-D copy");
}

static strata_status dk_zero(void *dst, size_t bytes, void *stream) {
    if (!bytes) return STRATA_OK;
    const cudaError_t e = cudaMemsetAsync(dst, 0, bytes, (cudaStream_t)stream);
    return e == cudaSuccess ? STRATA_OK : dk_fail(e, "memset");
}

static strata_status dk_sync(void *stream) {
    const cudaError_t e = cudaStreamSynchronize((cudaStream_t)stream);
    return e == cudaSuccess ? STRATA_OK : dk_fail(e, "synchronize");
}

static strata_status dk_mem_info(uint64_t *free_bytes, uint64_t *total_bytes) {
    size_t f = 0, t = 0;
    const cudaError_t e = cudaMemGetInfo(&f, &t);
    if (e != cudaSuccess) return dk_fail(e, "cudaMemGetInfo");
    *free_bytes = f;
    *total_bytes = t;
    return STRATA_OK;
}

static mdl_dk make_table(void) {
    mdl_dk t = {};
    t.name = "cuda";
    t.alloc = dk_alloc; t.free = dk_free; t.host_alloc = dk_host_alloc; t.host_free = dk_host_free; t.copy = dk_copy; t.copy2d = dk_copy2d; t.zero = dk_zero; t.sync = dk_sync;
    t.mem_info = dk_mem_info;
    t.act_quant = strata_cuda_act_quant; t.gemv = strata_cuda_gemv; t.scale = strata_cuda_scale;
    t.gemm_create = strata_cuda_gemm_create; t.gemm_destroy = strata_cuda_gemm_destroy;
    t.gemm_tile_bytes = strata_cuda_gemm_tile_bytes; t.gemm = strata_cuda_gemm;
    t.rmsnorm_rows = cuk_rmsnorm_rows; t.rope_angles = cuk_rope_angles; t.rope_apply = cuk_rope_apply;
    t.hc_read_norm = cuk_hc_read_norm; t.hc_read_act = cuk_hc_read_act; t.hc_read_mix = cuk_hc_read_mix;
    t.hc_inject = cuk_hc_inject; t.hc_write = cuk_hc_write;
    t.gdn_conv = gdn_cuda_conv; t.gdn_prep = gdn_cuda_prep; t.gdn_recurrent = gdn_cuda_recurrent;
    t.gdn_chunked_work_floats = gdn_cuda_chunked_work_floats; t.gdn_chunked = gdn_cuda_chunked; t.gdn_out = gdn_cuda_out;
    t.qsa_store = qsa_cuda_store; t.qsa_idx_store = qsa_cuda_idx_store; t.qsa_blk_pool = qsa_cuda_blk_pool;
    t.qsa_index = qsa_cuda_index; t.qsa_select = qsa_cuda_select; t.qsa_attn = qsa_cuda_attn;
    t.router_topk = cuk_router_topk; t.router_group = cuk_router_group; t.merge_glu = cuk_merge_glu;
    t.merge_shared_gate = cuk_merge_shared_gate; t.merge_gather = cuk_merge_gather; t.merge_sum = cuk_merge_sum;
    t.ple_dequant = ple_cuda_dequant; t.ple_key_norm = ple_cuda_key_norm; t.ple_gate = ple_cuda_gate;
    t.ple_conv = ple_cuda_conv; t.mtp_norm_concat = mtp_cuda_norm_concat;
    return t;
}

static const mdl_dk CUDA_TABLE = make_table();

extern "C" const mdl_dk *mdl_dk_cuda(const char **why) {
    const char *reason = "";
    if (strata_cuda_device_count(&reason) <= 0) {
        if (why) *why = reason;
        return NULL;
    }
    if (why) *why = "";
    return &CUDA_TABLE;
}
