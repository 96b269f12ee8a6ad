// cuda_blocks_check.cu — the block decoders of kernels/cuda/blocks.cuh run as host code (and, with
// --gpu, as device code), for tests/test_cuda.py to compare with the library's C dequantizers.
//
//   cuda_blocks_check dq TYPE N [--gpu]   stdin: the blocks of N values; stdout: N float32
//   cuda_blocks_check dot TYPE ACT R K [NT] [--gpu]
//                                         stdin: R rows of K values, then NT (default 1) rows of K
//                                         float32 activations; stdout: NT x R float32,
//                                         sum_k w[r,k] * act_quant(x_t)[k]: the kernels' arithmetic
//                                         (gemv.cuh: gemv_act_block, then 32 lanes of
//                                         gemv_lane_partial folded as the warp folds them), or (--gpu)
//                                         the kernels themselves (k_gemv_act + k_gemv)
// Build: nvcc -I native/src -I <dir of quant_tables.h> -o cuda_blocks_check cuda_blocks_check.cu
#include "kernels/cuda/blocks.cuh"
#include "kernels/cuda/expert_kernels.cuh"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

static std::vector<unsigned char> read_all(FILE *f) {
    std::vector<unsigned char> v;
    unsigned char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) v.insert(v.end(), buf, buf + n);
    return v;
}

__global__ void k_decode(int type, const uint8_t *row, int64_t n, float *out) {
    const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k < n) out[k] = blk_value(type, row, k);
}

static int decode_gpu(int type, const std::vector<unsigned char> &in, int64_t n, float *out) {
    int ndev = 0;
    if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) { fprintf(stderr, "no GPU\n"); return 2; }
    if (blk_tables_ready() != cudaSuccess) { fprintf(stderr, "table upload failed\n"); return 1; }
    uint8_t *d_in = NULL;
    float *d_out = NULL;
    if (cudaMalloc((void **)&d_in, in.size() + 1) || cudaMalloc((void **)&d_out, (size_t)n * 4)) return 1;
    cudaMemcpy(d_in, in.data(), in.size(), cudaMemcpyHostToDevice);
    k_decode<<<(unsigned)((n + 255) / 256), 256>>>(type, d_in, n, d_out);
    cudaError_t e = cudaMemcpy(out, d_out, (size_t)n * 4, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) { fprintf(stderr, "cuda: %s\n", cudaGetErrorString(e)); return 1; }
    cudaFree(d_in);
    cudaFree(d_out);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 4) { fprintf(stderr, "usage: see the header\n"); return 2; }
    const int type = atoi(argv[2]);
    if (!blk_supported(type)) { fprintf(stderr, "type %d not supported\n", type); return 3; }
    std::vector<unsigned char> in = read_all(stdin);
    if (!strcmp(argv[1], "dq")) {
        const int64_t n = atoll(argv[3]);
        const size_t need = (size_t)(n / blk_size(type)) * (size_t)blk_bytes(type);
        if (n % blk_size(type) || in.size() != need) { fprintf(stderr, "want %zu bytes, got %zu\n", need, in.size()); return 2; }
        std::vector<float> out((size_t)n);
        if (argc > 4 && !strcmp(argv[4], "--gpu")) {
            const int rc = decode_gpu(type, in, n, out.data());
            if (rc) return rc;
        } else {
            for (int64_t k = 0; k < n; k++) out[(size_t)k] = blk_value(type, in.data(), k);
        }
        fwrite(out.data(), 4, out.size(), stdout);
        return 0;
    }
    if (!strcmp(argv[1], "dot") && argc >= 6) {
        const int act = atoi(argv[3]);
        const int64_t R = atoll(argv[4]), K = atoll(argv[5]);
        const int64_t NT = argc > 6 && strcmp(argv[6], "--gpu") ? atoll(argv[6]) : 1;
        const bool gpu = !strcmp(argv[argc - 1], "--gpu");
        const size_t row_bytes = (size_t)(K / blk_size(type)) * (size_t)blk_bytes(type);
        if (K % blk_size(type) || NT < 1 || in.size() != R * row_bytes + 4 * (size_t)(NT * K)) {
            fprintf(stderr, "bad input size\n");
            return 2;
        }
        std::vector<float> x((size_t)(NT * K));
        memcpy(x.data(), in.data() + R * row_bytes, 4 * x.size());
        std::vector<float> y((size_t)(NT * R));
        if (gpu) {
            int ndev = 0;
            if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) { fprintf(stderr, "no GPU\n"); return 2; }
            if (blk_tables_ready() != cudaSuccess) { fprintf(stderr, "table upload failed\n"); return 1; }
            uint8_t *dw = NULL;
            float *dx = NULL, *dy = NULL;
            if (cudaMalloc((void **)&dw, R * row_bytes) || cudaMalloc((void **)&dx, 4 * x.size()) ||
                cudaMalloc((void **)&dy, 4 * y.size()))
                return 1;
            cudaMemcpy(dw, in.data(), R * row_bytes, cudaMemcpyHostToDevice);
            cudaMemcpy(dx, x.data(), 4 * x.size(), cudaMemcpyHostToDevice);
            const int bs = blk_act_block(act);
            if (bs > 1) {
                const int64_t nb = NT * K / bs;
                k_gemv_act<<<(unsigned)((nb + 127) / 128), 128>>>(dx, dx, nb, act);
            }
            dim3 grid((unsigned)((R + GEMV_WARPS - 1) / GEMV_WARPS), (unsigned)NT);
            k_gemv<<<grid, GEMV_WARPS * OPS_WARP>>>(type, dw, row_bytes, R, K, dx, K, NT, dy, R);
            cudaError_t e = cudaMemcpy(y.data(), dy, 4 * y.size(), cudaMemcpyDeviceToHost);
            if (e != cudaSuccess) { fprintf(stderr, "cuda: %s\n", cudaGetErrorString(e)); return 1; }
        } else {
            const int bs = blk_act_block(act);
            for (int64_t b = 0; b < NT * K / bs; b++) gemv_act_block(x.data(), x.data(), act, b);
            for (int64_t t = 0; t < NT; t++)
                for (int64_t r = 0; r < R; r++) {
                    float p[OPS_WARP];
                    for (int l = 0; l < OPS_WARP; l++)
                        p[l] = gemv_lane_partial(type, in.data() + r * row_bytes, K, x.data() + t * K, l);
                    y[(size_t)(t * R + r)] = ops_fold32(p);
                }
        }
        fwrite(y.data(), 4, y.size(), stdout);
        return 0;
    }
    fprintf(stderr, "unknown mode %s\n", argv[1]);
    return 2;
}
