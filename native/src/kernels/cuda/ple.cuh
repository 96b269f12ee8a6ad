/*
 * ple.cuh — the device part of the PLE layer (spec §6; DESIGN §6): what model/ple_layer.c does after
 * the PLE worker has gathered the packed rows, as the units of four launches (ops_common.cuh's rule:
 * the arithmetic is here, as OPS_FN functions; ple.cu's kernels only call them).
 *
 *   ple.dequant  gathered rows -> emb                  one value per thread     (mdl_ple_dequant)
 *   ple.project  key = G(W_key emb; w_key), in place    one warp per (t, stream) (mdl_ple_key_norm)
 *   ple.gate     qry norm, score, σ gate, gv, gvn       one warp per (t, stream) (mdl_ple_gate)
 *   ple.conv     X += gv + silu(conv(gvn)), history     one value per thread     (mdl_ple_conv)
 *
 * The products W_key emb and W_val emb are the gemv family's. Layouts, as the C path's (W = hc*E):
 *   rows  [R*NH][row_bytes]  t-major, head-minor (the worker's buffer); row_ids [R*NH] their table rows
 *   emb   [R][NH*dP]         (NH*dP = P = E in every model: W_val is [E, P])
 *   key   [R][W]   val [R][E]   X [L][W]   gv [L][W]
 *   ext   [hist + L][W]      hist = (Kp-1)*n rows of conv history (oldest first), then gvn of the L tokens
 *   state [hist][W]          the session's history; slots [L][hist][W] (verify windows: after token t)
 * Group g = t*hc + j is stream j of token t: g*E indexes key, X, gv, ext's gvn rows; (g % hc)*E the
 * per-stream weights; (g / hc)*E val. Warp units sum lane partials (k ≡ lane mod 32, increasing k).
 */
#ifndef STRATA_KERNELS_CUDA_PLE_CUH
#define STRATA_KERNELS_CUDA_PLE_CUH

#include "kernels/cuda/ops_common.cuh"
#include "kernels/cuda/blocks.cuh"

/* ple.dequant's row format for the seed's packed NVFP4 rows; other formats are GGUF type ids
 * (blocks.cuh: any blk_supported type whose block divides dP). */
#define PLE_ROWS_NVFP4_PACKED (-1)

/* ---------------------------------------------------------------- ple.dequant */

/* FP8 E4M3 (signed; 0x7f/0xff NaN), exactly as ple_table.c's e4m3. */
OPS_FN float ple_e4m3(uint32_t b) {
    const uint32_t e = (b >> 3) & 15u, m = b & 7u;
    float v;
    if (e == 15u && m == 7u) v = NAN;
    else if (e == 0u) v = (float)m * 0x1p-9f;                   /* m/8 * 2^-6 */
    else v = ops_bits_f32(((e + 120u) << 23) | (m << 20));     /* (1 + m/8) * 2^(e-7) */
    return (b & 0x80u) ? -v : v;
}

/* FP4 E2M1 code c (bit 3 the sign: code 8 is -0, as ple_table.c's table). */
OPS_FN float ple_e2m1(uint32_t c) {
    const uint32_t i = c & 7u;
    const float mag = i < 4u ? 0.5f * (float)i : i < 7u ? (float)(i - 2u) : 6.0f;
    return (c & 8u) ? -mag : mag;
}

/* Value k of a packed NVFP4 row of dim values: dim/2 code bytes (value 2j in the low nibble of byte j),
 * then dim/16 E4M3 block scales; (code x scale) x global scale, as ple_nvfp4_row. */
OPS_FN float ple_nvfp4_packed_value(const uint8_t *row, int64_t dim, int64_t k, float gs) {
    const uint32_t c = row[k / 2];
    const float d = ple_e4m3(row[dim / 2 + k / 16]);
    return (ple_e2m1((k % 2) ? c >> 4 : c & 15u) * d) * gs;
}

/* The global scale of table row id: its shard's weight_scale_2 (the last shard may be shorter). */
OPS_FN float ple_row_gscale(uint64_t id, int64_t shard_rows, int64_t n_shard, const float *gscale) {
    int64_t sh = (int64_t)(id / (uint64_t)shard_rows);
    if (sh >= n_shard) sh = n_shard - 1;
    return gscale[sh];
}

/* Unit v of ple.dequant: emb[v], value v % dP of gathered row v / dP. gscale, row_ids: packed NVFP4 only. */
OPS_FN float ple_dequant_unit(int fmt, const uint8_t *rows, size_t row_bytes, int64_t dP, const uint64_t *row_ids,
                              const float *gscale, int64_t n_shard, int64_t shard_rows, int64_t v) {
    const int64_t i = v / dP, k = v % dP;
    const uint8_t *row = rows + (size_t)i * row_bytes;
    if (fmt == PLE_ROWS_NVFP4_PACKED)
        return ple_nvfp4_packed_value(row, dP, k, ple_row_gscale(row_ids[i], shard_rows, n_shard, gscale));
    return blk_value(fmt, row, k);
}

/* ---------------------------------------------------------------- grouped norms (spec §2 G) */

/* Lane's share of Σ x_k² (k ≡ lane mod 32, k < n). */
OPS_FN float ple_sumsq_lane(const float *x, int64_t n, int lane) {
    float s = 0.0f;
    for (int64_t k = lane; k < n; k += OPS_WARP) s += x[k] * x[k];
    return s;
}

/* 1 / rms from the warp's sum of squares (mdl_rmsnorm's factor; the C path sums in double). */
OPS_FN float ple_rms_inv(float ss, int64_t n, float eps) { return 1.0f / sqrtf(ss / (float)n + eps); }

/* ---------------------------------------------------------------- ple.project: the key's norm */

OPS_FN float ple_key_norm_lane(const float *key, int64_t E, int64_t g, int lane) {
    return ple_sumsq_lane(key + g * E, E, lane);
}

/* key[g*E + k] normalised (r: ple_rms_inv of the group), times stream g % hc's weight. */
OPS_FN float ple_key_norm_value(const float *key, const float *w, int64_t hc, int64_t E, int64_t g, float r,
                                int64_t k) {
    return key[g * E + k] * r * w[(g % hc) * E + k];
}

/* ---------------------------------------------------------------- ple.gate */

/* Stage 1: the query's sum of squares (X's group g). */
OPS_FN float ple_gate_qss_lane(const float *X, int64_t E, int64_t g, int lane) {
    return ple_sumsq_lane(X + g * E, E, lane);
}

/* Stage 2: key · qry, qry = X * rq * w_query computed as the C path stores it. */
OPS_FN float ple_gate_dot_lane(const float *X, const float *key, const float *wq, int64_t hc, int64_t E, int64_t g,
                               float rq, int lane) {
    const float *x = X + g * E, *kk = key + g * E, *w = wq + (g % hc) * E;
    float d = 0.0f;
    for (int64_t k = lane; k < E; k += OPS_WARP) d += kk[k] * (x[k] * rq * w[k]);
    return d;
}

/* Stage 3: σ of the signed square root of the score d / sqrt(E) (the 1e-6 floor on |s|; s = 0 gives σ(0)). */
OPS_FN float ple_gate_sigma(float d, int64_t E) {
    const float sc = d * (1.0f / sqrtf((float)E));
    const float g = sc > 0.0f ? sqrtf(fmaxf(sc, 1e-6f)) : sc < 0.0f ? -sqrtf(fmaxf(-sc, 1e-6f)) : 0.0f;
    return ops_sigmoid(g);
}

/* gv[g*E + k]: the gate times token g / hc's value (one value row for every stream). */
OPS_FN float ple_gate_gv(const float *val, int64_t hc, int64_t E, int64_t g, float sg, int64_t k) {
    return sg * val[(g / hc) * E + k];
}

/* Stage 4: gv's sum of squares. */
OPS_FN float ple_gate_gss_lane(const float *val, int64_t hc, int64_t E, int64_t g, float sg, int lane) {
    float s = 0.0f;
    for (int64_t k = lane; k < E; k += OPS_WARP) {
        const float v = ple_gate_gv(val, hc, E, g, sg, k);
        s += v * v;
    }
    return s;
}

/* gvn[g*E + k] = G(gv; w_conv) (rg: ple_rms_inv of stage 4). */
OPS_FN float ple_gate_gvn(const float *val, const float *wc, int64_t hc, int64_t E, int64_t g, float sg, float rg,
                          int64_t k) {
    return ple_gate_gv(val, hc, E, g, sg, k) * rg * wc[(g % hc) * E + k];
}

/* ---------------------------------------------------------------- ple.conv */

/* Unit v = t*W + c: X[v] + (gv[v] + silu(Σ_k w[c][k] ext[hist + t - (Kp-1-k) n][c])); taps n apart,
 * w[c][Kp-1] on the token itself. */
OPS_FN float ple_conv_unit(const float *X, const float *gv, const float *ext, const float *w, int64_t W, int64_t Kp,
                           int64_t n, int64_t v) {
    const int64_t t = v / W, c = v % W, hist = (Kp - 1) * n;
    float acc = 0.0f;
    for (int64_t k = 0; k < Kp; k++) acc += w[c * Kp + k] * ext[(hist + t - (Kp - 1 - k) * n) * W + c];
    return X[v] + (gv[v] + ops_silu(acc));
}

/* Value v of the new history: the last hist rows of ext (rows L .. L+hist). */
OPS_FN float ple_conv_hist_unit(const float *ext, int64_t L, int64_t W, int64_t v) { return ext[L * W + v]; }

/* Value v of the verify slots: slot t is the history after token t, ext rows t+1 .. t+hist. */
OPS_FN float ple_conv_slot_unit(const float *ext, int64_t W, int64_t hist, int64_t v) {
    const int64_t t = v / (hist * W), r = v % (hist * W);
    return ext[(t + 1) * W + r];
}

/* ---------------------------------------------------------------- kernels */
#ifdef __CUDACC__

static __global__ void ple_k_dequant(int fmt, const uint8_t *rows, size_t row_bytes, int64_t dP,
                                     const uint64_t *row_ids, const float *gscale, int64_t n_shard,
                                     int64_t shard_rows, int64_t n, float *emb) {
    const int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (v < n) emb[v] = ple_dequant_unit(fmt, rows, row_bytes, dP, row_ids, gscale, n_shard, shard_rows, v);
}

/* The group's sum on every lane (ops_warp_sum leaves it on lane 0). */
OPS_DEV float ple_warp_total(float partial) { return __shfl_sync(0xffffffffu, ops_warp_sum(partial), 0); }

static __global__ void ple_k_key_norm(float *key, const float *w, int64_t groups, int64_t hc, int64_t E, float eps) {
    const int64_t g = (int64_t)blockIdx.x * (blockDim.x / OPS_WARP) + threadIdx.x / OPS_WARP;
    const int lane = (int)(threadIdx.x % OPS_WARP);
    if (g >= groups) return;   /* whole warps: g is the same on every lane */
    const float r = ple_rms_inv(ple_warp_total(ple_key_norm_lane(key, E, g, lane)), E, eps);
    for (int64_t k = lane; k < E; k += OPS_WARP) key[g * E + k] = ple_key_norm_value(key, w, hc, E, g, r, k);
}

static __global__ void ple_k_gate(const float *X, const float *key, const float *val, const float *wq,
                                  const float *wc, int64_t groups, int64_t hc, int64_t E, float eps, float *gv,
                                  float *gvn) {
    const int64_t g = (int64_t)blockIdx.x * (blockDim.x / OPS_WARP) + threadIdx.x / OPS_WARP;
    const int lane = (int)(threadIdx.x % OPS_WARP);
    if (g >= groups) return;
    const float rq = ple_rms_inv(ple_warp_total(ple_gate_qss_lane(X, E, g, lane)), E, eps);
    const float sg = ple_gate_sigma(ple_warp_total(ple_gate_dot_lane(X, key, wq, hc, E, g, rq, lane)), E);
    const float rg = ple_rms_inv(ple_warp_total(ple_gate_gss_lane(val, hc, E, g, sg, lane)), E, eps);
    for (int64_t k = lane; k < E; k += OPS_WARP) {
        gv[g * E + k] = ple_gate_gv(val, hc, E, g, sg, k);
        gvn[g * E + k] = ple_gate_gvn(val, wc, hc, E, g, sg, rg, k);
    }
}

static __global__ void ple_k_conv(float *X, const float *gv, const float *ext, const float *w, int64_t W, int64_t Kp,
                                  int64_t n, int64_t count) {
    const int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (v < count) X[v] = ple_conv_unit(X, gv, ext, w, W, Kp, n, v);
}

static __global__ void ple_k_conv_hist(const float *ext, int64_t L, int64_t W, int64_t count, float *state) {
    const int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (v < count) state[v] = ple_conv_hist_unit(ext, L, W, v);
}

static __global__ void ple_k_conv_slots(const float *ext, int64_t W, int64_t hist, int64_t count, float *slots) {
    const int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (v < count) slots[v] = ple_conv_slot_unit(ext, W, hist, v);
}

#endif /* __CUDACC__ */

#endif
