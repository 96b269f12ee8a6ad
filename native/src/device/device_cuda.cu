// device_cuda.cu — the GPU work of the `cuda` expert device (device_cuda.h): slots in device
// memory, a copy stream fed from a pinned staging buffer, and the expert FFN as device kernels.
//
// The math is mdev_expert_ffn's (device_sim.c): gate/up rows -> silu(gate * sg) * (up * su) ->
// down rows. Activations are quantized as the CPU's matmul quantizes them (gemv.cuh: k_gemv_act,
// per the weight type's activation format), so the results differ from the cpu/sim devices only in
// float summation order (the CPU sums exact integer products per block; here each lane sums w * (d * q)
// in float over the 32-value chunks it decodes, then a warp reduction).
//
// Kernels are simple rather than fast: one warp per (output row, token) (k_gemv). Ideas for speed:
// decode a chunk once and reuse it for every token of the group; integer dot products (dp4a) against
// int8 activations as the CPU does; all groups of one operation in one launch; device-side ordering
// (cudaStreamWaitEvent) instead of the host round trip per operation; double-buffered staging so the
// memcpy of blob k+1 overlaps the DMA of blob k.
#include "kernels/cuda/blocks.cuh"
#include "kernels/cuda/expert_kernels.cuh"

extern "C" {
#include "device_cuda.h"
#include "util/error.h"
}

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct cudev {
    int dev;
    int32_t n_slots;
    size_t slot_bytes;
    char *dmem;                  // n_slots x slot_bytes on the device
    void *staging;               // pinned, slot_bytes
    cudaStream_t s_copy, s_comp;
    float *dx, *dgu, *dh, *dout; // compute scratch (device), for cap_rows tokens
    int64_t cap_rows, cap_E, cap_F;
};

static strata_status cu_fail(cudaError_t e, const char *what) {
    (void)cudaGetLastError();
    return strata_fail(STRATA_ERR_IO, "cuda device: %s: %s", what, cudaGetErrorString(e));
}

// ------------------------------------------------------------------------------------ host side

extern "C" int cudev_supports(const mdev_expert_shape *s) {
    return blk_supported(s->tg->type) && (!s->tu || blk_supported(s->tu->type)) && blk_supported(s->td->type);
}

extern "C" strata_status cudev_create(int32_t n_slots, size_t slot_bytes, cudev **out) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n <= 0) {
        (void)cudaGetLastError();
        return strata_fail(STRATA_ERR_NO_DEVICE, "cuda device: no GPU (%s)",
                           e != cudaSuccess ? cudaGetErrorString(e) : "the CUDA runtime found none");
    }
    cudev *c = (cudev *)calloc(1, sizeof *c);
    if (!c) return strata_fail(STRATA_ERR_NOMEM, "cuda device: no memory");
    c->dev = 0;
    c->n_slots = n_slots;
    c->slot_bytes = slot_bytes;
    strata_status rc = STRATA_OK;
    if ((e = cudaSetDevice(c->dev))) { rc = cu_fail(e, "cudaSetDevice"); goto fail; }
    {   // a GPU this library has no code for (its architecture not in CMAKE_CUDA_ARCHITECTURES, no PTX
        // to JIT from) would fail every launch: refuse here rather than compute zeros later
        cudaFuncAttributes fa;
        if ((e = cudaFuncGetAttributes(&fa, k_gemv))) {
            cudaDeviceProp prop;
            const int have_prop = cudaGetDeviceProperties(&prop, c->dev) == cudaSuccess;
            (void)cudaGetLastError();
            rc = strata_fail(STRATA_ERR_NO_DEVICE,
                             "cuda device: no kernel image for this GPU (compute capability %d.%d: %s); rebuild with "
                             "STRATA_CMAKE_ARGS=-DCMAKE_CUDA_ARCHITECTURES=%d%d",
                             have_prop ? prop.major : 0, have_prop ? prop.minor : 0, cudaGetErrorString(e),
                             have_prop ? prop.major : 0, have_prop ? prop.minor : 0);
            goto fail;
        }
    }
    // this file's __constant__ tables, once per device: a second model's create must not rewrite them
    // under the first one's running kernels
    if ((e = blk_tables_ready())) { rc = cu_fail(e, "uploading the block tables"); goto fail; }
    if ((e = cudaMalloc((void **)&c->dmem, (size_t)n_slots * slot_bytes))) {
        rc = strata_fail(STRATA_ERR_NOMEM, "cuda device: cannot allocate %d slots of %zu bytes (%s)", n_slots,
                         slot_bytes, cudaGetErrorString(e));
        (void)cudaGetLastError();
        goto fail;
    }
    if ((e = cudaMallocHost(&c->staging, slot_bytes))) { rc = cu_fail(e, "pinned staging buffer"); goto fail; }
    if ((e = cudaStreamCreateWithFlags(&c->s_copy, cudaStreamNonBlocking))) { rc = cu_fail(e, "copy stream"); goto fail; }
    if ((e = cudaStreamCreateWithFlags(&c->s_comp, cudaStreamNonBlocking))) { rc = cu_fail(e, "compute stream"); goto fail; }
    *out = c;
    return STRATA_OK;
fail:
    cudev_free(c);
    return rc;
}

extern "C" void cudev_free(cudev *c) {
    if (!c) return;
    cudaSetDevice(c->dev);
    if (c->s_copy) cudaStreamSynchronize(c->s_copy), cudaStreamDestroy(c->s_copy);
    if (c->s_comp) cudaStreamSynchronize(c->s_comp), cudaStreamDestroy(c->s_comp);
    cudaFree(c->dmem);
    cudaFree(c->dx);
    cudaFree(c->dgu);
    cudaFree(c->dh);
    cudaFree(c->dout);
    if (c->staging) cudaFreeHost(c->staging);
    (void)cudaGetLastError();
    free(c);
}

extern "C" strata_status cudev_copy(cudev *c, int32_t slot, const void *const src[3], const size_t bytes[3]) {
    cudaSetDevice(c->dev);
    const size_t total = bytes[0] + bytes[1] + bytes[2];
    if (total > c->slot_bytes || slot < 0 || slot >= c->n_slots)
        return strata_fail(STRATA_ERR_INTERNAL, "cuda device: copy of %zu bytes into slot %d does not fit", total, slot);
    for (size_t k = 0, at = 0; k < 3; at += bytes[k], k++)
        if (bytes[k]) memcpy((char *)c->staging + at, src[k], bytes[k]);
    cudaError_t e = cudaMemcpyAsync(c->dmem + (size_t)slot * c->slot_bytes, c->staging, total,
                                    cudaMemcpyHostToDevice, c->s_copy);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->s_copy);
    return e == cudaSuccess ? STRATA_OK : cu_fail(e, "copy");
}

static cudaError_t ensure_scratch(cudev *c, int64_t n, int64_t E, int64_t F) {
    if (n <= c->cap_rows && E <= c->cap_E && F <= c->cap_F) return cudaSuccess;
    const int64_t rows = n > c->cap_rows ? (n > 2 * c->cap_rows ? n : 2 * c->cap_rows) : c->cap_rows;
    const int64_t EE = E > c->cap_E ? E : c->cap_E, FF = F > c->cap_F ? F : c->cap_F;
    cudaFree(c->dx); cudaFree(c->dgu); cudaFree(c->dh); cudaFree(c->dout);
    c->dx = c->dgu = c->dh = c->dout = NULL;
    c->cap_rows = c->cap_E = c->cap_F = 0;
    cudaError_t e;
    if ((e = cudaMalloc((void **)&c->dx, (size_t)(rows * EE) * sizeof(float)))) return e;
    if ((e = cudaMalloc((void **)&c->dgu, (size_t)(rows * 2 * FF) * sizeof(float)))) return e;
    if ((e = cudaMalloc((void **)&c->dh, (size_t)(rows * FF) * sizeof(float)))) return e;
    if ((e = cudaMalloc((void **)&c->dout, (size_t)(rows * EE) * sizeof(float)))) return e;
    c->cap_rows = rows;
    c->cap_E = EE;
    c->cap_F = FF;
    return cudaSuccess;
}

static void launch_matvec(cudaStream_t s, const strata_qtraits *t, const char *W, int64_t R, int64_t K,
                          const float *x, int64_t n, float *y) {
    const size_t row_bytes = (size_t)(K / t->block_size) * (size_t)t->type_size;
    dim3 grid((unsigned)((R + GEMV_WARPS - 1) / GEMV_WARPS), (unsigned)(n < 65535 ? n : 65535));
    k_gemv<<<grid, GEMV_WARPS * OPS_WARP, 0, s>>>(t->type, (const uint8_t *)W, row_bytes, R, K, x, K, n, y, R);
}

static void launch_act(cudaStream_t s, const strata_qtraits *t, float *x, int64_t n, int64_t K) {
    const int act = (int)t->act;
    if (blk_act_block(act) == 1) return;
    const int64_t nb = n * K / blk_act_block(act);
    k_gemv_act<<<(unsigned)((nb + 127) / 128), 128, 0, s>>>(x, x, nb, act);
}

extern "C" strata_status cudev_ffn(cudev *c, const mdev_group *g) {
    const mdev_expert_shape *s = g->shape;
    const int64_t n = g->n, E = s->E, F = s->Fe;
    if (n <= 0) return STRATA_OK;
    if (!cudev_supports(s))
        return strata_fail(STRATA_ERR_UNSUPPORTED, "cuda device: no CUDA kernel for expert types %s/%s/%s", s->tg->name,
                           s->tu ? s->tu->name : "-", s->td->name);
    cudaSetDevice(c->dev);
    cudaError_t e = ensure_scratch(c, n, E, F);
    if (e) return cu_fail(e, "scratch memory");
    cudaStream_t st = c->s_comp;
    const char *blob = c->dmem + (size_t)g->slot * c->slot_bytes;
    // the rows in from the host, or (dev_io) from the dense forward's buffer on this GPU: a copy either way, as
    // the activation rounding below works in place
    const cudaMemcpyKind in = g->dev_io ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice;
    if ((e = cudaMemcpyAsync(c->dx, g->x, (size_t)(n * E) * sizeof(float), in, st)))
        return cu_fail(e, "copy of the activations");
    // every matrix of one shape reads the same activation format for gate and up
    launch_act(st, s->tg, c->dx, n, E);
    if (s->fused) {
        launch_matvec(st, s->tg, blob, 2 * F, E, c->dx, n, c->dgu);
    } else {
        launch_matvec(st, s->tg, blob, F, E, c->dx, n, c->dgu);
        if (s->tu->act != s->tg->act) {   // up reads a differently quantized copy of x
            if ((e = cudaMemcpyAsync(c->dx, g->x, (size_t)(n * E) * sizeof(float), in, st)))
                return cu_fail(e, "copy of the activations");
            launch_act(st, s->tu, c->dx, n, E);
        }
        launch_matvec(st, s->tu, blob + s->gate_bytes, F, E, c->dx, n, c->dgu + n * F);
    }
    k_glu<<<(unsigned)((n * F + 255) / 256), 256, 0, st>>>(c->dgu, n, F, s->fused, g->sg, g->su, c->dh);
    launch_act(st, s->td, c->dh, n, F);
    launch_matvec(st, s->td, blob + s->gate_bytes + s->up_bytes, E, F, c->dh, n, c->dout);
    if ((e = cudaGetLastError())) return cu_fail(e, "kernel launch");
    const cudaMemcpyKind to = g->dev_io ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost;
    if ((e = cudaMemcpyAsync(g->out, c->dout, (size_t)(n * E) * sizeof(float), to, st)))
        return cu_fail(e, "copy of the outputs");
    if ((e = cudaStreamSynchronize(st))) return cu_fail(e, "expert computation");
    return STRATA_OK;
}

extern "C" double cudev_probe(cudev *c, size_t bytes, int reps) {
    cudaSetDevice(c->dev);
    const size_t piece = c->slot_bytes;
    int per_pass = (int)((bytes + piece - 1) / piece);
    if (per_pass < 1) per_pass = 1;
    cudaEvent_t a, b;
    if (cudaEventCreate(&a)) { (void)cudaGetLastError(); return 0.0; }
    if (cudaEventCreate(&b)) { cudaEventDestroy(a); (void)cudaGetLastError(); return 0.0; }
    memset(c->staging, 1, piece);
    double best = 0.0;
    for (int r = 0; r < reps; r++) {
        cudaEventRecord(a, c->s_copy);
        for (int k = 0; k < per_pass; k++)
            cudaMemcpyAsync(c->dmem, c->staging, piece, cudaMemcpyHostToDevice, c->s_copy);
        cudaEventRecord(b, c->s_copy);
        float ms = 0.0f;
        if (cudaEventSynchronize(b) || cudaEventElapsedTime(&ms, a, b) || ms <= 0.0f) continue;
        const double gbps = (double)piece * per_pass / (ms * 1e-3) / 1e9;
        if (gbps > best) best = gbps;
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    (void)cudaGetLastError();
    return best;
}
