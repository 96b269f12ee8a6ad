/*
 * emu_small.h — the launchers of the small kernel families (gemv.h, gemm.h, norm.h, rope.h, hc.h,
 * router.h, merge.h) emulated on the host: what the device forward's `emu` table calls
 * (device/dense_emu.c) and what the host op checks (tests/native/test_cuda_ops_{gemv,small}.c) run.
 *
 * emu_X has exactly the signature of its launcher (strata_cuda_X or cuk_X): same parameters in the same
 * order, pointers into host memory, `stream` and `handle` taken and ignored. It refuses the arguments
 * its launcher refuses, with the same status (strata_fail, as the .cu), and otherwise runs the kernel's
 * unit functions (<family>.cuh) over the kernel's whole launch grid as the GPU does:
 *   - a thread per unit (elementwise kernels): the units in thread order. They write disjoint outputs
 *     and read nothing another unit writes, so any order gives the GPU's bits;
 *   - a warp per row (norm, gemv, router top-k, shared gate): the 32 lanes' partials one lane after the
 *     other, then ops_fold32 (router_fold_best for the top-k) as the __shfl_down_sync tree folds them,
 *     and lane 0's result where the kernel broadcasts or writes it;
 *   - kernels a launcher queues one after the other on its stream (gemm's tile then product, the
 *     router's count, prefix and fill): one after the other.
 * The numbers are then the kernels' own, up to the device's rounding of expf, sqrtf and friends.
 *
 * gemm: the emulated handle is NULL (there is no cuBLAS on the host), so strata_cuda_gemm takes its
 * path without cuBLAS: float tiles of as many rows as the tile holds, each multiplied by gemm.cuh's
 * k_gemm_tile_dot; f16 and x16 are ignored there as they are by the launcher. The single kernels
 * (emu_k_gemm_*) are here too, for the checks of the f16 tile and activations cuBLAS would take.
 *
 * Header-only: every function is static and marked unused, so a file that includes this header and
 * calls a few of them builds with -Wall -Wextra -Werror.
 */
#ifndef STRATA_KERNELS_CUDA_EMU_SMALL_H
#define STRATA_KERNELS_CUDA_EMU_SMALL_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/hc.cuh"
#include "kernels/cuda/merge.cuh"
#include "kernels/cuda/norm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/router.cuh"

#include "kernels/cuda/gemm.h"
#include "kernels/cuda/gemv.h"
#include "kernels/cuda/hc.h"
#include "kernels/cuda/merge.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/rope.h"
#include "kernels/cuda/router.h"
#include "util/error.h"

#ifndef EMU_FN
#define EMU_FN static __attribute__((unused))
#endif

/* ---------------------------------------------------------------- gemv.h */

EMU_FN strata_status emu_act_quant(void *stream, int act, const float *x, float *xq, int64_t n, int64_t K) {
    (void)stream;
    const int bs = blk_act_block(act);
    if (act < 0 || act > 2 || n < 0 || K % bs)
        return strata_fail(STRATA_ERR_INVALID_ARG, "cuda act_quant: act %d, K %lld", act, (long long)K);
    const int64_t nb = n * K / bs;
    for (int64_t b = 0; b < nb; b++) gemv_act_block(x, xq, act, b);   // k_gemv_act: thread b
    return STRATA_OK;
}

/* k_gemv: block (bx, by) holds GEMV_WARPS warps, warp w the row bx * GEMV_WARPS + w, and takes the
 * columns by, by + gridDim.y ...; the launcher's grid y is min(n, 65535), ldx = K, ldy = R. */
EMU_FN strata_status emu_gemv(void *stream, int type, const void *W, size_t row_bytes, int64_t R, int64_t K,
                              const float *xq, int64_t n, float *y) {
    (void)stream;
    if (!blk_supported(type)) return strata_fail(STRATA_ERR_UNSUPPORTED, "cuda gemv: no kernel for type %d", type);
    if (R < 0 || n < 0 || K <= 0 || K % blk_size(type))
        return strata_fail(STRATA_ERR_INVALID_ARG, "cuda gemv: %lld x %lld of type %d", (long long)R, (long long)K,
                           type);
    if (R == 0 || n == 0) return STRATA_OK;
    const uint8_t *w = (const uint8_t *)W;
    const int64_t grid_y = n < 65535 ? n : 65535;
    for (int64_t by = 0; by < grid_y; by++)
        for (int64_t r = 0; r < R; r++)
            for (int64_t t = by; t < n; t += grid_y) {
                float p[OPS_WARP];
                for (int lane = 0; lane < OPS_WARP; lane++)
                    p[lane] = gemv_lane_partial(type, w + (size_t)r * row_bytes, K, xq + t * K, lane);
                y[t * R + r] = ops_fold32(p);
            }
    return STRATA_OK;
}

EMU_FN strata_status emu_scale(void *stream, float *y, int64_t n, float s) {
    (void)stream;
    if (n < 0) return strata_fail(STRATA_ERR_INVALID_ARG, "cuda scale: %lld values", (long long)n);
    for (int64_t i = 0; i < n; i++) gemv_scale_unit(y, s, i);   // k_gemv_scale: thread i
    return STRATA_OK;
}

/* ---------------------------------------------------------------- gemm.h */

/* k_gemm_tile_f32 / k_gemm_tile_f16: thread i decodes chunk i % nc of row r0 + i / nc. */
EMU_FN void emu_k_gemm_tile_f32(int type, const uint8_t *W, size_t row_bytes, int64_t K, int64_t r0, int64_t r1,
                                float *tile) {
    const int64_t nc = (K + 31) / 32;
    for (int64_t i = 0; i < (r1 - r0) * nc; i++) gemm_tile_f32(type, W, row_bytes, K, r0, r0 + i / nc, i % nc, tile);
}

EMU_FN void emu_k_gemm_tile_f16(int type, const uint8_t *W, size_t row_bytes, int64_t K, int64_t r0, int64_t r1,
                                uint16_t *tile) {
    const int64_t nc = (K + 31) / 32;
    for (int64_t i = 0; i < (r1 - r0) * nc; i++) gemm_tile_f16(type, W, row_bytes, K, r0, r0 + i / nc, i % nc, tile);
}

/* k_gemm_x_f16: thread i rounds activation i. */
EMU_FN void emu_k_gemm_x_f16(const float *x, uint16_t *x16, int64_t n) {
    for (int64_t i = 0; i < n; i++) gemm_x_f16(x, x16, i);
}

/* k_gemm_tile_dot: thread i the output (tile row i % rows, column i / rows). */
EMU_FN void emu_k_gemm_tile_dot(const float *tile, int64_t rows, int64_t K, const float *x, int64_t n, float *y,
                                int64_t ldy, int64_t r0) {
    for (int64_t i = 0; i < rows * n; i++) {
        const int64_t j = i % rows, t = i / rows;
        y[t * ldy + r0 + j] = gemm_tile_dot(tile + j * K, x + t * K, K);
    }
}

/* No cuBLAS on the host: the handle is NULL, as strata_cuda_gemm_create's in a build without it. */
EMU_FN strata_status emu_gemm_create(void **handle) {
    *handle = NULL;
    return STRATA_OK;
}

EMU_FN void emu_gemm_destroy(void *handle) { (void)handle; }

/* strata_cuda_gemm_tile_bytes (gemm.cuh's formula). */
EMU_FN size_t emu_gemm_tile_bytes(int64_t K, int64_t tile_rows, int f16) {
    return gemm_tile_bytes(K, tile_rows, f16);
}

/* strata_cuda_gemm with a NULL handle, whatever `handle` is: float tiles, k_gemm_tile_dot. */
EMU_FN strata_status emu_gemm(void *handle, void *stream, int type, const void *W, size_t row_bytes, int64_t R,
                              int64_t K, const float *x, int64_t n, float *y, void *tile, size_t tile_bytes, int f16,
                              void *x16) {
    (void)handle; (void)stream; (void)f16; (void)x16;
    if (!blk_supported(type)) return strata_fail(STRATA_ERR_UNSUPPORTED, "cuda gemm: no kernel for type %d", type);
    if (R < 0 || n < 0 || K <= 0 || K % blk_size(type) || K > 0x7fffffff || n > 0x7fffffff)
        return strata_fail(STRATA_ERR_INVALID_ARG, "cuda gemm: %lld x %lld of type %d, %lld columns", (long long)R,
                           (long long)K, type, (long long)n);
    if (R == 0 || n == 0) return STRATA_OK;
    const int64_t tile_rows = (int64_t)(tile_bytes / emu_gemm_tile_bytes(K, 1, 0));
    if (tile_rows < 1)
        return strata_fail(STRATA_ERR_BUFFER_TOO_SMALL, "cuda gemm: a tile of %zu bytes holds no row of %lld values",
                           tile_bytes, (long long)K);
    for (int64_t r0 = 0; r0 < R; r0 += tile_rows) {
        const int64_t rows = R - r0 < tile_rows ? R - r0 : tile_rows;
        emu_k_gemm_tile_f32(type, (const uint8_t *)W, row_bytes, K, r0, r0 + rows, (float *)tile);
        emu_k_gemm_tile_dot((const float *)tile, rows, K, x, n, y, R, r0);
    }
    return STRATA_OK;
}

/* ---------------------------------------------------------------- norm.h */

/* norm_rows_kernel: a warp per row; every lane's sum of squares, the fold (lane 0's sum, broadcast),
 * then every lane's writes. y may be x: a row's writes come after all its reads. */
EMU_FN strata_status emu_rmsnorm_rows(const float *x, int64_t xs, const float *w, int64_t wg, int64_t rows,
                                      int64_t n, float eps, float *y, int64_t ys, void *stream) {
    (void)stream;
    for (int64_t r = 0; r < rows; r++) {
        float p[OPS_WARP];
        for (int lane = 0; lane < OPS_WARP; lane++) p[lane] = norm_lane_sumsq(x, xs, n, r, lane);
        const float rs = norm_rscale(ops_fold32(p), n, eps);
        for (int lane = 0; lane < OPS_WARP; lane++) norm_lane_write(x, xs, w, wg, n, r, rs, lane, y, ys);
    }
    return STRATA_OK;
}

/* ---------------------------------------------------------------- rope.h */

EMU_FN strata_status emu_rope_angles(float theta, int32_t n_rot, int64_t p0, int64_t dp, int64_t L, float *cs,
                                     void *stream) {
    (void)stream;
    const int64_t units = L * (n_rot / 2);
    for (int64_t u = 0; u < units; u++) rope_angle_unit(theta, n_rot, p0, dp, u, cs);
    return STRATA_OK;
}

EMU_FN strata_status emu_rope_apply(float *x, int64_t xs, int64_t rows, int64_t nh, int32_t n_rot, const float *cs,
                                    void *stream) {
    (void)stream;
    const int64_t units = rows * (n_rot / 2);
    for (int64_t u = 0; u < units; u++) rope_apply_unit(x, xs, nh, n_rot, cs, u);
    return STRATA_OK;
}

/* ---------------------------------------------------------------- hc.h */

/* norm_rows_kernel over the L * hc stream rows (row t * hc + j weighted by w_n + j * E), as the launcher. */
EMU_FN strata_status emu_hc_read_norm(const float *X, const float *w_n, int64_t L, int64_t hc, int64_t E, float eps,
                                      float *xh, void *stream) {
    return emu_rmsnorm_rows(X, E, w_n, hc, L * hc, E, eps, xh, E, stream);
}

EMU_FN strata_status emu_hc_read_act(float *a, int64_t n, int64_t hc, void *stream) {
    (void)stream;
    for (int64_t i = 0; i < n; i++) hc_act_unit(a, hc, i);
    return STRATA_OK;
}

EMU_FN strata_status emu_hc_read_mix(const float *g, const float *xh, int64_t L, int64_t hc, int64_t E, float *u,
                                     void *stream) {
    (void)stream;
    for (int64_t i = 0; i < L * E; i++) hc_mix_unit(g, xh, hc, E, i, u);
    return STRATA_OK;
}

EMU_FN strata_status emu_hc_inject(const float *a, int64_t n, int64_t hc, float *c, void *stream) {
    (void)stream;
    for (int64_t i = 0; i < n; i++) hc_inject_unit(a, hc, i, c);
    return STRATA_OK;
}

EMU_FN strata_status emu_hc_write(float *X, const float *c, const float *y, int64_t L, int64_t hc, int64_t E,
                                  void *stream) {
    (void)stream;
    for (int64_t i = 0; i < L * hc * E; i++) hc_write_unit(X, c, y, hc, E, i);
    return STRATA_OK;
}

/* ---------------------------------------------------------------- router.h */

/* router_topk_kernel: a warp per token. The warp's max is exact in any order; the exp sum is lane 0's
 * fold, broadcast; each of the K rounds folds the lanes' offers as router_warp_best (router_fold_best). */
EMU_FN strata_status emu_router_topk(float *lg, int64_t L, int64_t Ne, int64_t K, int32_t *pick, float *pw,
                                     void *stream) {
    (void)stream;
    for (int64_t t = 0; t < L; t++) {
        float *p = lg + t * Ne;
        float mx = -INFINITY, s[OPS_WARP];
        for (int lane = 0; lane < OPS_WARP; lane++) mx = fmaxf(mx, router_lane_max(p, Ne, lane));
        for (int lane = 0; lane < OPS_WARP; lane++) s[lane] = router_lane_exp(p, Ne, mx, lane);
        const float sum = ops_fold32(s);
        for (int lane = 0; lane < OPS_WARP; lane++) router_lane_scale(p, Ne, sum, lane);
        float pv = 0.0f;
        int32_t pi = -1;
        for (int64_t k = 0; k < K; k++) {
            float v[OPS_WARP];
            int32_t i[OPS_WARP];
            for (int lane = 0; lane < OPS_WARP; lane++) router_lane_next(p, Ne, pv, pi, lane, &v[lane], &i[lane]);
            router_fold_best(v, i);
            pv = v[0];
            pi = i[0];
            pick[t * K + k] = pi;
            pw[t * K + k] = pv;
        }
        router_renorm(pw + t * K, K);
    }
    return STRATA_OK;
}

/* The count kernel (a thread per expert), the prefix (one thread), the fill (a thread per expert), in
 * stream order. Counts that are no partition of the n pairs (count[0] = 0, nondecreasing, count[Ne] = n)
 * would send the GPU's fill past slot; the emulation stops there with STRATA_ERR_INTERNAL instead. */
EMU_FN strata_status emu_router_group(const int32_t *pick, int64_t n, int64_t Ne, int64_t *count, int64_t *slot,
                                      int64_t *row, void *stream) {
    (void)stream;
    if (Ne <= 0) return STRATA_OK;
    for (int64_t e = 0; e < Ne; e++) router_count_unit(pick, n, e, count);
    router_prefix_unit(count, Ne);
    int ok = count[0] == 0 && count[Ne] == n;
    for (int64_t e = 0; e < Ne && ok; e++) ok = count[e] <= count[e + 1];
    if (!ok) return strata_fail(STRATA_ERR_INTERNAL, "emu router group: counts are no partition of %lld pairs",
                                (long long)n);
    for (int64_t e = 0; e < Ne; e++) router_fill_unit(pick, n, count, e, slot, row);
    return STRATA_OK;
}

/* ---------------------------------------------------------------- merge.h */

EMU_FN strata_status emu_merge_glu(const float *gu, int64_t n, int64_t F, int fused, float sg, float su, float *h,
                                   void *stream) {
    (void)stream;
    for (int64_t v = 0; v < n * F; v++) merge_glu_unit(gu, n, F, fused, sg, su, v, h);
    return STRATA_OK;
}

/* merge_gate_kernel: a warp per token, gate[t] = σ(lane 0's fold of the lanes' dots). */
EMU_FN strata_status emu_merge_shared_gate(const float *w_seg, const float *x, int64_t L, int64_t E, float *gate,
                                           void *stream) {
    (void)stream;
    for (int64_t t = 0; t < L; t++) {
        float p[OPS_WARP];
        for (int lane = 0; lane < OPS_WARP; lane++) p[lane] = merge_gate_lane_dot(w_seg, x, E, t, lane);
        gate[t] = ops_sigmoid(ops_fold32(p));
    }
    return STRATA_OK;
}

EMU_FN strata_status emu_merge_gather(const float *x, const int64_t *slot, int64_t n, int64_t K, int64_t E,
                                      float *xg, void *stream) {
    (void)stream;
    for (int64_t v = 0; v < n * E; v++) merge_gather_unit(x, slot, K, E, v, xg);
    return STRATA_OK;
}

EMU_FN strata_status emu_merge_sum(const int32_t *pick, const float *pw, const float *sd, const int8_t *skip,
                                   const int64_t *row, const float *out, const float *gate, float sd_sh,
                                   const float *sho, int64_t L, int64_t E, int64_t K, float *y, void *stream) {
    (void)stream;
    for (int64_t v = 0; v < L * E; v++) merge_sum_unit(pick, pw, sd, skip, row, out, gate, sd_sh, sho, E, K, v, y);
    return STRATA_OK;
}

/* ---------------------------------------------------------------- signatures
 * Each emulation's type is its launcher's, so the emu table of dense.h and the CUDA one hold the same
 * function types (checked here, where both declarations are in sight). */
#define EMU_SMALL_SAME_TYPE(emu, launcher)                                                                           \
    _Static_assert(__builtin_types_compatible_p(__typeof__(emu), __typeof__(launcher)), #emu " is not " #launcher)
EMU_SMALL_SAME_TYPE(emu_act_quant, strata_cuda_act_quant);
EMU_SMALL_SAME_TYPE(emu_gemv, strata_cuda_gemv);
EMU_SMALL_SAME_TYPE(emu_scale, strata_cuda_scale);
EMU_SMALL_SAME_TYPE(emu_gemm_create, strata_cuda_gemm_create);
EMU_SMALL_SAME_TYPE(emu_gemm_destroy, strata_cuda_gemm_destroy);
EMU_SMALL_SAME_TYPE(emu_gemm_tile_bytes, strata_cuda_gemm_tile_bytes);
EMU_SMALL_SAME_TYPE(emu_gemm, strata_cuda_gemm);
EMU_SMALL_SAME_TYPE(emu_rmsnorm_rows, cuk_rmsnorm_rows);
EMU_SMALL_SAME_TYPE(emu_rope_angles, cuk_rope_angles);
EMU_SMALL_SAME_TYPE(emu_rope_apply, cuk_rope_apply);
EMU_SMALL_SAME_TYPE(emu_hc_read_norm, cuk_hc_read_norm);
EMU_SMALL_SAME_TYPE(emu_hc_read_act, cuk_hc_read_act);
EMU_SMALL_SAME_TYPE(emu_hc_read_mix, cuk_hc_read_mix);
EMU_SMALL_SAME_TYPE(emu_hc_inject, cuk_hc_inject);
EMU_SMALL_SAME_TYPE(emu_hc_write, cuk_hc_write);
EMU_SMALL_SAME_TYPE(emu_router_topk, cuk_router_topk);
EMU_SMALL_SAME_TYPE(emu_router_group, cuk_router_group);
EMU_SMALL_SAME_TYPE(emu_merge_glu, cuk_merge_glu);
EMU_SMALL_SAME_TYPE(emu_merge_shared_gate, cuk_merge_shared_gate);
EMU_SMALL_SAME_TYPE(emu_merge_gather, cuk_merge_gather);
EMU_SMALL_SAME_TYPE(emu_merge_sum, cuk_merge_sum);
#undef EMU_SMALL_SAME_TYPE

#endif
