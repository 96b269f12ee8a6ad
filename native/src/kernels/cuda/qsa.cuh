/*
 * qsa.cuh — QSA indexed attention (spec §8; model/qsa.c) as unit functions shared by the CUDA
 * kernels (qsa.cu) and the host check (tests/native/test_cuda_ops_qsa.c), which runs them over each
 * launch's whole grid against qsa.c op by op.
 *
 * Ops and their units:
 *   store   K/V rows into the cache (f32, f16, or int8 codes + one scale per row): one warp per
 *           row (token, kv head, K or V), lane l writes dims e ≡ l (mod 32); the int8 scale comes
 *           from the row's largest |x| (a warp max, exact in any order). The block pooling unit is
 *           one (block, dim): the mean of the block's r raw indexer keys. The summary's N1 and RoPE
 *           (at b·r) are the norm / rope kernels' (norm.cuh, rope.cuh), run on the pooled rows.
 *   index   one thread per (query, block): score_b = Σ_h relu(qI_h · K̂_b) / sqrt(dI).
 *   select  one warp per query: the topk best blocks under qsa.c's order (higher score, then lower
 *           block), found as a threshold (a bitwise search over the scores' order-preserving bit
 *           patterns) plus the lowest-index blocks among those tied at it; the kept keys are
 *           written in ascending block order (qsa.c writes heap order: the same set), then the
 *           tail [nb·r, n).
 *   attn    one thread block per (query, q head): the scores (one thread per kept key), then one
 *           warp for the softmax (max, exp, sum in double), then one thread per output dim
 *           summing over the kept keys in order, times σ(gate).
 *
 * Order of operations: every unit does qsa.c's float operations in qsa.c's order (dots as
 * mdl_dot8 where qsa.c uses it, dim order in the indexer, key order in the outputs), so host and C
 * agree bit for bit; the device multiplies with __fmul_rn (nvcc would otherwise fuse a*b+c, which
 * the C path built with -ffp-contract=off never does), so the GPU computes what the host checked.
 * Only the softmax denominator differs: qsa.c adds it serially in double, here 32 lanes add in
 * double and fold (then both round 1/sum to float).
 *
 * Cache layout (model.h, state.c): K, V [tokens][Hkv][hd] in kv_type; int8 scales
 * [tokens][Hkv][2] (K scale, V scale); block summaries [blocks][dI].
 */
#ifndef STRATA_KERNELS_CUDA_QSA_CUH
#define STRATA_KERNELS_CUDA_QSA_CUH

#include <float.h>
#include <string.h>

#include "kernels/cuda/ops_common.cuh"

/* strata_kv_type's values (strata.h; the host check asserts they agree) */
enum { QSA_KV_F32 = 0, QSA_KV_F16 = 1, QSA_KV_INT8 = 2 };

/* ---------------------------------------------------------------- scalars */

OPS_FN int qsa_popc(uint32_t m) {
#if defined(__CUDA_ARCH__)
    return __popc(m);
#else
    return __builtin_popcount(m);
#endif
}

/* IEEE half -> float, exact for every input (strata_fp16_to_fp32). */
OPS_FN float qsa_f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1fu) return ops_bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp != 0) return ops_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
    if (man == 0) return ops_bits_f32(sign);
    int e = -1; /* subnormal: normalise */
    do { e++; man <<= 1; } while ((man & 0x400u) == 0);
    return ops_bits_f32(sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13));
}

/* ---------------------------------------------------------------- the cache */

typedef struct {
    const void *k, *v;      /* [tokens][Hkv][hd] in kv_type */
    const float *scale;     /* int8: [tokens][Hkv][2] */
    int kv_type;
    int64_t Hkv, hd;
} qsa_kv;

/* Value e of cached row (pos, kvh) of K (which 0) or V (which 1), as qsa.c's load_row makes it. */
OPS_FN float qsa_kv_value(const qsa_kv *kv, int which, int64_t pos, int64_t kvh, int64_t e) {
    const int64_t row = pos * kv->Hkv + kvh;
    const void *base = which ? kv->v : kv->k;
    if (kv->kv_type == QSA_KV_F32) return ((const float *)base)[row * kv->hd + e];
    if (kv->kv_type == QSA_KV_F16) return qsa_f16_to_f32(((const uint16_t *)base)[row * kv->hd + e]);
    return kv->scale[row * 2 + which] * (float)((const int8_t *)base)[row * kv->hd + e];
}

/* ---------------------------------------------------------------- store */

/* Lane `lane`'s largest |x_e| over its dims e ≡ lane (mod 32). */
OPS_FN float qsa_amax_lane(const float *x, int64_t hd, int lane) {
    float m = 0.0f;
    for (int64_t e = lane; e < hd; e += OPS_WARP) m = fmaxf(m, fabsf(x[e]));
    return m;
}

/* The row's largest |x_e|, on every lane: a warp max (device); the 32 lanes' maximum (host). */
OPS_FN float qsa_row_amax(const float *x, int64_t hd, int lane) {
#if defined(__CUDA_ARCH__)
    return ops_warp_max(qsa_amax_lane(x, hd, lane));
#else
    float m = 0.0f;
    (void)lane;
    for (int l = 0; l < OPS_WARP; l++) m = fmaxf(m, qsa_amax_lane(x, hd, l));
    return m;
#endif
}

/* Lane `lane`'s part of storing x (hd values) as row (pos, kvh) of K (which 0) or V (which 1):
 * its dims e ≡ lane (mod 32); int8: codes round(x / d) with d = amax / 127 (strata_act_scale: a
 * row whose 1/d overflows or whose amax is not finite is stored as zeros), lane 0 writes d. */
OPS_FN void qsa_store_lane(void *base, float *scale, int kv_type, int64_t Hkv, int64_t hd, int64_t pos, int64_t kvh,
                           int which, const float *x, int lane) {
    const int64_t row = pos * Hkv + kvh;
    if (kv_type == QSA_KV_F32) {
        float *p = (float *)base + row * hd;
        for (int64_t e = lane; e < hd; e += OPS_WARP) p[e] = x[e];
    } else if (kv_type == QSA_KV_F16) {
        uint16_t *p = (uint16_t *)base + row * hd;
        for (int64_t e = lane; e < hd; e += OPS_WARP) p[e] = ops_f32_to_f16(x[e]);
    } else {
        const float amax = qsa_row_amax(x, hd, lane);
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        if (!isfinite(id) || !isfinite(d)) d = id = 0.0f;
        int8_t *p = (int8_t *)base + row * hd;
        for (int64_t e = lane; e < hd; e += OPS_WARP) p[e] = (int8_t)lrintf(x[e] * id);
        if (lane == 0) scale[row * 2 + which] = d;
    }
}

/* Unit (b, e): dim e of the mean of block b's r raw indexer keys (rows b·r ..), in key order. */
OPS_FN float qsa_blk_mean(const float *idx_k, int64_t dI, int64_t r, int64_t b, int64_t e) {
    float acc = 0.0f;
    for (int64_t j = 0; j < r; j++) acc += idx_k[(b * r + j) * dI + e];
    return acc / (float)r;
}

/* ---------------------------------------------------------------- index */

/* Unit (t, b): block b's score for the query qi (nI x dI): Σ_h relu(qI_h · K̂_b) / sqrt(dI), each
 * dot in dim order. */
OPS_FN float qsa_block_score(const float *qi, const float *kb, int64_t nI, int64_t dI) {
    const float inv = 1.0f / sqrtf((float)dI);
    float sc = 0.0f;
    for (int64_t h = 0; h < nI; h++) {
        const float *qh = qi + h * dI;
        float d = 0.0f;
        for (int64_t e = 0; e < dI; e++) d = d + ops_mul(qh[e], kb[e]);
        sc += d > 0.0f ? d : 0.0f;
    }
    return sc * inv;
}

/* ---------------------------------------------------------------- select */

/* An unsigned key with the scores' order (and -0 == +0, as the float comparison has it). */
OPS_FN uint32_t qsa_score_key(float s) {
    const uint32_t u = ops_f32_bits(s == 0.0f ? 0.0f : s);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Lane `lane`'s count of blocks b ≡ lane (mod 32), b < nb, with key >= lo. */
OPS_FN int qsa_count_lane(const float *score, int64_t nb, uint32_t lo, int lane) {
    int c = 0;
    for (int64_t b = lane; b < nb; b += OPS_WARP) c += qsa_score_key(score[b]) >= lo;
    return c;
}

/* The count over all nb blocks, on every lane (integers: exact in any order). */
OPS_FN int qsa_count(const float *score, int64_t nb, uint32_t lo, int lane) {
#if defined(__CUDA_ARCH__)
    int c = qsa_count_lane(score, nb, lo, lane);
    for (int o = OPS_WARP / 2; o > 0; o /= 2) c += __shfl_xor_sync(0xffffffffu, c, o);
    return c;
#else
    int c = 0;
    (void)lane;
    for (int l = 0; l < OPS_WARP; l++) c += qsa_count_lane(score, nb, lo, l);
    return c;
#endif
}

/* Block b is < nb and its key is above T (eq 0) or equal to it (eq 1). */
OPS_FN int qsa_sel_pred(const float *score, int64_t nb, int64_t b, uint32_t T, int eq) {
    if (b >= nb) return 0;
    const uint32_t k = qsa_score_key(score[b]);
    return eq ? k == T : k > T;
}

/* The warp's ballot of qsa_sel_pred for blocks base + lane. */
OPS_FN uint32_t qsa_ballot(const float *score, int64_t nb, int64_t base, uint32_t T, int eq, int lane) {
#if defined(__CUDA_ARCH__)
    return __ballot_sync(0xffffffffu, qsa_sel_pred(score, nb, base + lane, T, eq));
#else
    uint32_t m = 0;
    (void)lane;
    for (int l = 0; l < OPS_WARP; l++)
        if (qsa_sel_pred(score, nb, base + l, T, eq)) m |= 1u << l;
    return m;
#endif
}

/* Lane `lane`'s part of the selection of the query at position P (n = P + 1 keys, nb = n / r
 * complete blocks with scores score[nb]): *n_sel = -1 (dense: every key) when r == 0 or nb <= topk;
 * else the keys of the topk best blocks in ascending block order, then the tail, and *n_sel their
 * count. Every lane of the warp runs it (uniform control flow: the ballots need all 32). */
OPS_FN void qsa_select_lane(const float *score, int64_t P, int64_t r, int64_t topk, int32_t *sel, int32_t *n_sel,
                            int lane) {
    const int64_t n = P + 1, nb = r > 0 ? n / r : 0;
    if (r == 0 || nb <= topk) {
        if (lane == 0) *n_sel = -1;
        return;
    }
    /* T = the topk-th largest key: the largest T with at least topk keys >= T, bit by bit */
    uint32_t T = 0;
    for (int bit = 31; bit >= 0; bit--) {
        const uint32_t c = T | (1u << bit);
        if (qsa_count(score, nb, c, lane) >= topk) T = c;
    }
    /* all blocks above T, and the `need` lowest-index blocks at T (the tie rule) */
    const int64_t n_gt = T == 0xffffffffu ? 0 : qsa_count(score, nb, T + 1u, lane);
    const int64_t need = topk - n_gt;
    const uint32_t below = (1u << lane) - 1u;   /* the lanes before this one */
    int64_t gt_run = 0, eq_run = 0;             /* blocks above T / at T before this chunk */
    for (int64_t base = 0; base < nb; base += OPS_WARP) {
        const uint32_t mg = qsa_ballot(score, nb, base, T, 0, lane), me = qsa_ballot(score, nb, base, T, 1, lane);
        const int64_t b = base + lane;
        const int64_t eq_rank = eq_run + qsa_popc(me & below);
        const int is_gt = (int)((mg >> lane) & 1u), is_eq = (int)((me >> lane) & 1u);
        if (is_gt || (is_eq && eq_rank < need)) {
            const int64_t k = gt_run + qsa_popc(mg & below) + (eq_rank < need ? eq_rank : need);
            for (int64_t j = 0; j < r; j++) sel[k * r + j] = (int32_t)(b * r + j);
        }
        gt_run += qsa_popc(mg);
        eq_run += qsa_popc(me);
    }
    for (int64_t j = nb * r + lane; j < n; j += OPS_WARP) sel[topk * r + j - nb * r] = (int32_t)j;
    if (lane == 0) *n_sel = (int32_t)(topk * r + n - nb * r);
}

/* ---------------------------------------------------------------- attention */

/* One launch: L queries at positions p0 + t; per query t the kept keys sel[t * sel_cap ..] (n_sel[t]
 * of them, or all p0 + t + 1 when n_sel[t] < 0); q [L x H x hd] (normed, roped); qg [L x 2H hd]
 * (per head [q | gate]: the gates); w [L x H x w_cap] scores, then probabilities; o [L x H x hd]. */
typedef struct {
    qsa_kv kv;
    const float *q, *qg;
    const int32_t *sel, *n_sel;
    float *w, *o;
    int64_t p0, H, sel_cap, w_cap;
} qsa_attn_job;

OPS_FN int64_t qsa_n_keys(const qsa_attn_job *A, int64_t t) {
    const int32_t ns = A->n_sel[t];
    return ns < 0 ? A->p0 + t + 1 : ns;
}

/* The position of query t's i-th kept key. */
OPS_FN int64_t qsa_key_pos(const qsa_attn_job *A, int64_t t, int64_t i) {
    return A->n_sel[t] < 0 ? i : A->sel[t * A->sel_cap + i];
}

OPS_FN float *qsa_w_row(const qsa_attn_job *A, int64_t t, int64_t h) { return A->w + (t * A->H + h) * A->w_cap; }

/* Unit (t, h, i): q·k_i / sqrt(hd) for head h of query t and its i-th kept key, as mdl_dot8
 * (eight partial sums by dim mod 8, folded as strata_hsum8). */
OPS_FN void qsa_attn_score(const qsa_attn_job *A, int64_t t, int64_t h, int64_t i) {
    const int64_t hd = A->kv.hd, kvh = h / (A->H / A->kv.Hkv), pos = qsa_key_pos(A, t, i);
    const float *q = A->q + (t * A->H + h) * hd;
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int64_t e = 0;
    for (; e + 8 <= hd; e += 8)
        for (int l = 0; l < 8; l++) acc[l] = acc[l] + ops_mul(q[e + l], qsa_kv_value(&A->kv, 0, pos, kvh, e + l));
    for (int l = 0; l < 8; l++)
        if (e + l < hd) acc[l] = acc[l] + ops_mul(q[e + l], qsa_kv_value(&A->kv, 0, pos, kvh, e + l));
    const float d = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    qsa_w_row(A, t, h)[i] = d * (1.0f / sqrtf((float)hd));
}

/* Lane `lane`'s largest score over its keys i ≡ lane (mod 32). */
OPS_FN float qsa_attn_max_lane(const qsa_attn_job *A, int64_t t, int64_t h, int lane) {
    const float *w = qsa_w_row(A, t, h);
    const int64_t n = qsa_n_keys(A, t);
    float m = -FLT_MAX;
    for (int64_t i = lane; i < n; i += OPS_WARP)
        if (w[i] > m) m = w[i];
    return m;
}

/* The largest score of (t, h), on every lane (exact in any order). */
OPS_FN float qsa_attn_max(const qsa_attn_job *A, int64_t t, int64_t h, int lane) {
#if defined(__CUDA_ARCH__)
    return ops_warp_max(qsa_attn_max_lane(A, t, h, lane));
#else
    float m = -FLT_MAX;
    (void)lane;
    for (int l = 0; l < OPS_WARP; l++) {
        const float x = qsa_attn_max_lane(A, t, h, l);
        if (x > m) m = x;
    }
    return m;
#endif
}

/* Lane `lane`'s keys i ≡ lane (mod 32): w_i = exp(w_i - mx) in place; returns their sum in double. */
OPS_FN double qsa_attn_exp_lane(const qsa_attn_job *A, int64_t t, int64_t h, float mx, int lane) {
    float *w = qsa_w_row(A, t, h);
    const int64_t n = qsa_n_keys(A, t);
    double s = 0.0;
    for (int64_t i = lane; i < n; i += OPS_WARP) {
        w[i] = ops_exp(w[i] - mx);
        s += w[i];
    }
    return s;
}

/* Folds 32 double lane partials as the warp's __shfl_down_sync tree (ops_fold32's order). */
OPS_FN double qsa_fold32d(double *p) {
    for (int o = OPS_WARP / 2; o > 0; o /= 2)
        for (int l = 0; l < o; l++) p[l] += p[l + o];
    return p[0];
}

/* 1 / Σ exp(w_i - mx) of (t, h), rounded to float, on every lane. */
OPS_FN float qsa_attn_inv(const qsa_attn_job *A, int64_t t, int64_t h, float mx, int lane) {
#if defined(__CUDA_ARCH__)
    double s = qsa_attn_exp_lane(A, t, h, mx, lane);
    for (int o = OPS_WARP / 2; o > 0; o /= 2) s += __shfl_down_sync(0xffffffffu, s, o);
    s = __shfl_sync(0xffffffffu, s, 0);
#else
    double p[OPS_WARP];
    (void)lane;
    for (int l = 0; l < OPS_WARP; l++) p[l] = qsa_attn_exp_lane(A, t, h, mx, l);
    const double s = qsa_fold32d(p);
#endif
    return (float)(1.0 / s);
}

/* Unit (t, h, e): dim e of head h's output, Σ_i (p_i · inv) v_i[e] over the kept keys in order,
 * times σ(gate_e). */
OPS_FN void qsa_attn_out(const qsa_attn_job *A, int64_t t, int64_t h, float inv, int64_t e) {
    const int64_t hd = A->kv.hd, kvh = h / (A->H / A->kv.Hkv), n = qsa_n_keys(A, t);
    const float *w = qsa_w_row(A, t, h);
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++)
        acc = acc + ops_mul(w[i] * inv, qsa_kv_value(&A->kv, 1, qsa_key_pos(A, t, i), kvh, e));
    const float g = A->qg[t * 2 * A->H * hd + h * 2 * hd + hd + e];
    A->o[(t * A->H + h) * hd + e] = acc * ops_sigmoid(g);
}

/* ---------------------------------------------------------------- kernels */

#ifdef __CUDACC__
/* One warp per row u = (t, which, kvh): k, v [L x Hkv x hd] are the new rows of positions p0 + t. */
static __global__ void qsa_k_store(void *kc, void *vc, float *scale, int kv_type, int64_t Hkv, int64_t hd, int64_t p0,
                                   int64_t L, const float *k, const float *v) {
    const int64_t u = (int64_t)blockIdx.x * (blockDim.x / OPS_WARP) + threadIdx.x / OPS_WARP;
    const int lane = (int)(threadIdx.x % OPS_WARP);
    if (u >= L * 2 * Hkv) return;   /* whole warps leave together */
    const int64_t t = u / (2 * Hkv), which = (u / Hkv) % 2, kvh = u % Hkv;
    qsa_store_lane(which ? vc : kc, scale, kv_type, Hkv, hd, p0 + t, kvh, (int)which,
                   (which ? v : k) + (t * Hkv + kvh) * hd, lane);
}

/* One thread per (block b0 + u / dI, dim u % dI). */
static __global__ void qsa_k_blk_pool(const float *idx_k, int64_t dI, int64_t r, int64_t b0, int64_t nbn,
                                      float *blk) {
    const int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= nbn * dI) return;
    const int64_t b = b0 + u / dI, e = u % dI;
    blk[b * dI + e] = qsa_blk_mean(idx_k, dI, r, b, e);
}

/* One thread per (t, b), u = t * ld + b; only queries whose selection binds (nb > topk). */
static __global__ void qsa_k_index(const float *iq, const float *blk, int64_t nI, int64_t dI, int64_t r,
                                   int64_t topk, int64_t p0, int64_t L, float *score, int64_t ld) {
    const int64_t u = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t t = u / ld, b = u % ld;
    if (t >= L) return;
    const int64_t nb = (p0 + t + 1) / r;
    if (nb <= topk || b >= nb) return;
    score[t * ld + b] = qsa_block_score(iq + t * nI * dI, blk + b * dI, nI, dI);
}

/* One warp (the block) per query t. */
static __global__ void qsa_k_select(const float *score, int64_t ld, int64_t r, int64_t topk, int64_t p0,
                                    int32_t *sel, int64_t sel_cap, int32_t *n_sel) {
    const int64_t t = blockIdx.x;
    qsa_select_lane(score + t * ld, p0 + t, r, topk, sel + t * sel_cap, n_sel + t, (int)threadIdx.x);
}

/* One block per (query t = blockIdx.x, head h = blockIdx.y); blockDim.x a multiple of 32. */
static __global__ void qsa_k_attn(qsa_attn_job A) {
    const int64_t t = blockIdx.x, h = blockIdx.y, n = qsa_n_keys(&A, t);
    __shared__ float s_inv;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) qsa_attn_score(&A, t, h, i);
    __syncthreads();
    if (threadIdx.x < OPS_WARP) {
        const int lane = (int)threadIdx.x;
        const float inv = qsa_attn_inv(&A, t, h, qsa_attn_max(&A, t, h, lane), lane);
        if (lane == 0) s_inv = inv;
    }
    __syncthreads();
    for (int64_t e = threadIdx.x; e < A.kv.hd; e += blockDim.x) qsa_attn_out(&A, t, h, s_inv, e);
}
#endif

#endif
