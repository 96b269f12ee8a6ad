/*
 * emu_mixers.h — the mixer families' launchers (gdn.h, qsa.h, ple.h, mtp.h) emulated on the host: one
 * emu_<name> per launcher, with the launcher's exact signature (checked below), that runs the kernels the
 * launcher queues over their whole launch grid on host memory, through the same OPS_FN units
 * (ops_common.cuh's rule). So a forward written against a table of launcher pointers runs on the host
 * with these in their place and computes the bits the GPU computes (up to the device's own expf/sqrtf
 * rounding); and the host op checks (tests/native/test_cuda_ops_{gdn,qsa,ple}.c) call them, so the
 * mutation tests prove the emulation as well as the units.
 *
 * How a grid is run: the launches of one call go in stream order, one kernel after the other. Inside a
 * kernel the units run one after the other; that gives the device's bits because every unit writes only
 * its own outputs and reads nothing another unit of the same phase writes (each kernel's comment in
 * <family>.cuh says so), so the block size never changes a result and is not repeated here. A warp
 * reduction is its 32 lanes' partials, lane 0 to 31, folded by ops_fold32 (ops_warp_sum's order); the
 * lanes' writes come after the fold, as they come after the shuffle on the device. A kernel with
 * barriers (gdn's chunked form, qsa's attention) runs phase by phase, every unit of a phase before the
 * next phase. `stream` is accepted and ignored; a launcher's argument checks return the same status
 * (and message) here; STRATA_ERR_IO (a failed launch) has no host counterpart.
 *
 * Header-only: every function is static and marked unused, so a translation unit that includes this once
 * and calls a few of them compiles clean under -Wall -Wextra.
 */
#ifndef STRATA_KERNELS_CUDA_EMU_MIXERS_H
#define STRATA_KERNELS_CUDA_EMU_MIXERS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/gdn.cuh"
#include "kernels/cuda/gdn.h"
#include "kernels/cuda/mtp.cuh"
#include "kernels/cuda/mtp.h"
#include "kernels/cuda/ple.cuh"
#include "kernels/cuda/ple.h"
#include "kernels/cuda/qsa.cuh"
#include "kernels/cuda/qsa.h"
#include "util/error.h"

#ifndef EMU_FN
#define EMU_FN static __attribute__((unused))
#endif

/* ================================================================ gdn (gdn.cu) */

/* gdn_k_conv over (t, ch), then gdn_k_conv_advance over ch: the conv reads the old history first. */
EMU_FN strata_status emu_gdn_conv(const float *w, int Kc, int64_t CD, float *hist, const float *x, int64_t ldx,
                                  int64_t L, float *cv, void *stream) {
    (void)stream;
    if (L <= 0) return STRATA_OK;
    for (int64_t i = 0; i < L * CD; i++) cv[i] = gdn_conv_out(w, hist, x, ldx, Kc, CD, i / CD, i % CD);
    for (int64_t ch = 0; ch < CD; ch++) gdn_conv_advance(hist, x, ldx, Kc, CD, L, ch);
    return STRATA_OK;
}

/* gdn_k_qk_norm (a warp per vector v = (t * Gk + hk) * 2 + is_k), then gdn_k_gates (a thread per (t, h)). */
EMU_FN strata_status emu_gdn_prep(const float *cv, int64_t L, int Gk, int Gv, int dk, int dv, const float *b,
                                  const float *a, int64_t ldba, const float *ssm_a, const float *dt_bias, float *qn,
                                  float *kn, float *beta, float *g, void *stream) {
    (void)stream;
    if (L <= 0) return STRATA_OK;
    const int64_t CD = 2 * (int64_t)Gk * dk + (int64_t)Gv * dv;
    for (int64_t v = 0; v < L * Gk * 2; v++) {
        const int is_q = v % 2 == 0;
        const int64_t th = v / 2, t = th / Gk, hk = th % Gk;
        const float *x = cv + t * CD + (is_q ? 0 : (int64_t)Gk * dk) + hk * dk;
        float part[OPS_WARP];
        for (int lane = 0; lane < OPS_WARP; lane++) part[lane] = gdn_sumsq_lane(x, dk, lane);
        const float ss = ops_fold32(part);
        for (int lane = 0; lane < OPS_WARP; lane++) gdn_l2_lane(x, (is_q ? qn : kn) + th * dk, dk, ss, is_q, lane);
    }
    for (int64_t i = 0; i < L * Gv; i++) {   /* in place (beta == b, ldba == Gv): unit i reads only index i */
        const int64_t t = i / Gv;
        const int h = (int)(i % Gv);
        beta[i] = gdn_beta(b[t * ldba + h]);
        g[i] = gdn_gate(a[t * ldba + h], ssm_a[h], dt_bias[h]);
    }
    return STRATA_OK;
}

/* Builds the kernels' gdn_heads as gdn.cu's heads() does. */
static inline gdn_heads emu_gdn_heads(const float *qn, const float *kn, const float *cv, const float *beta,
                                      const float *g, float *o, int64_t L, int Gk, int Gv, int dk, int dv) {
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

/* gdn_k_recurrent: block h, thread j < dv through the L rows (column j of the state is thread j's alone,
 * so running the threads one after the other gives the device's bits). */
EMU_FN strata_status emu_gdn_recurrent(float *S, const float *qn, const float *kn, const float *cv, const float *beta,
                                       const float *g, float *o, int64_t L, int Gk, int Gv, int dk, int dv,
                                       float *S_slots, void *stream) {
    (void)stream;
    if (dv > 1024) return strata_fail(STRATA_ERR_UNSUPPORTED, "cuda gdn recurrent: head dim %d > 1024", dv);
    if (L <= 0) return STRATA_OK;
    const gdn_heads H = emu_gdn_heads(qn, kn, cv, beta, g, o, L, Gk, Gv, dk, dv);
    const int64_t hs = (int64_t)dk * dv;
    for (int h = 0; h < Gv; h++) {
        float *Sh = S + h * hs;
        for (int j = 0; j < dv; j++)
            for (int64_t t = 0; t < L; t++) {
                gdn_o(&H, t, h)[j] = gdn_recurrent_col(&H, Sh, t, h, j);
                if (S_slots)
                    for (int i = 0; i < dk; i++) S_slots[(t * Gv + h) * hs + (int64_t)i * dv + j] = Sh[i * dv + j];
            }
    }
    return STRATA_OK;
}

EMU_FN size_t emu_gdn_chunked_work_floats(int Gv, int dk, int dv) {
    return (size_t)Gv * (size_t)gdn_chunk_work_floats(dk, dv);
}

/* gdn_k_chunked: block h, chunk by chunk, each phase over all its units before the next (the barriers):
 * γ per row, the triangles per pair (i, j), the solve per column of U and W, then V', O and S per column
 * of S. work: emu_gdn_chunked_work_floats of host memory. */
EMU_FN strata_status emu_gdn_chunked(float *S, const float *qn, const float *kn, const float *cv, const float *beta,
                                     const float *g, float *o, int64_t L, int Gk, int Gv, int dk, int dv, float *work,
                                     void *stream) {
    (void)stream;
    const int cols = dk > dv ? dk : dv;
    if (cols > 1024) return strata_fail(STRATA_ERR_UNSUPPORTED, "cuda gdn chunked: head dim %d > 1024", cols);
    if (L <= 0) return STRATA_OK;
    const gdn_heads H = emu_gdn_heads(qn, kn, cv, beta, g, o, L, Gk, Gv, dk, dv);
    for (int h = 0; h < Gv; h++) {
        const gdn_chunk_work w = gdn_chunk_work_at(work, h, dk, dv);
        float *Sh = S + (int64_t)h * dk * dv;
        for (int64_t c0 = 0; c0 < L; c0 += GDN_OPS_CHUNK) {
            const int n = (int)(L - c0 < GDN_OPS_CHUNK ? L - c0 : GDN_OPS_CHUNK);
            for (int i = 0; i < n; i++) w.gam[i] = gdn_chunk_gamma(&H, c0, h, i);
            for (int p = 0; p < n * n; p++) gdn_chunk_pair(&H, &w, c0, h, n, p / n, p % n);
            for (int j = 0; j < dk || j < dv; j++) gdn_chunk_solve_col(&H, &w, c0, h, n, j);
            for (int j = 0; j < dv; j++) gdn_chunk_out_col(&H, &w, Sh, c0, h, n, j);
        }
    }
    return STRATA_OK;
}

/* gdn_k_out: a warp per (row t, value head h), in place: the sum of squares is folded before any lane
 * writes. */
EMU_FN strata_status emu_gdn_out(float *o, const float *z, int64_t ldz, const float *w, int64_t L, int Gv, int dv,
                                 float eps, int gate_sigmoid, void *stream) {
    (void)stream;
    if (L <= 0) return STRATA_OK;
    for (int64_t v = 0; v < L * Gv; v++) {
        const int64_t t = v / Gv, h = v % Gv;
        float *oh = o + v * dv, part[OPS_WARP];
        for (int lane = 0; lane < OPS_WARP; lane++) part[lane] = gdn_sumsq_lane(oh, dv, lane);
        const float ss = ops_fold32(part);
        for (int lane = 0; lane < OPS_WARP; lane++)
            gdn_out_lane(oh, z + t * ldz + h * dv, w, dv, ss, eps, gate_sigmoid, lane);
    }
    return STRATA_OK;
}

/* ================================================================ qsa (qsa.cu) */

/* qsa_k_store: a warp per row u = (t, K|V, kv head); the int8 amax is qsa_row_amax's 32-lane max, which
 * on the host each lane computes over all 32 lanes (the warp max every lane holds on the device). */
EMU_FN strata_status emu_qsa_store(void *k_cache, void *v_cache, float *kv_scale, int kv_type, int64_t Hkv, int64_t hd,
                                   int64_t p0, int64_t L, const float *k, const float *v, void *stream) {
    (void)stream;
    if (L <= 0) return STRATA_OK;
    for (int64_t u = 0; u < L * 2 * Hkv; u++) {
        const int64_t t = u / (2 * Hkv), which = (u / Hkv) % 2, kvh = u % Hkv;
        const float *x = (which ? v : k) + (t * Hkv + kvh) * hd;
        for (int lane = 0; lane < OPS_WARP; lane++)
            qsa_store_lane(which ? v_cache : k_cache, kv_scale, kv_type, Hkv, hd, p0 + t, kvh, (int)which, x, lane);
    }
    return STRATA_OK;
}

/* The launcher's device-to-device copy. */
EMU_FN strata_status emu_qsa_idx_store(float *idx_k, const float *ik, int64_t dI, int64_t p0, int64_t L,
                                       void *stream) {
    (void)stream;
    if (L <= 0) return STRATA_OK;
    memcpy(idx_k + p0 * dI, ik, (size_t)(L * dI) * sizeof(float));
    return STRATA_OK;
}

/* qsa_k_blk_pool: a thread per (block b0 + u / dI, dim u % dI). */
EMU_FN strata_status emu_qsa_blk_pool(const float *idx_k, int64_t dI, int64_t r, int64_t b0, int64_t nbn, float *blk,
                                      void *stream) {
    (void)stream;
    if (nbn <= 0 || r <= 0) return STRATA_OK;
    for (int64_t u = 0; u < nbn * dI; u++) {
        const int64_t b = b0 + u / dI, e = u % dI;
        blk[b * dI + e] = qsa_blk_mean(idx_k, dI, r, b, e);
    }
    return STRATA_OK;
}

/* qsa_k_index: a thread per u = t * ld + b (threads past L * ld have t >= L and write nothing); only
 * queries whose selection binds, over their blocks. */
EMU_FN strata_status emu_qsa_index(const float *iq, const float *blk, int64_t nI, int64_t dI, int64_t r, int64_t topk,
                                   int64_t p0, int64_t L, float *score, int64_t ld, void *stream) {
    (void)stream;
    if (L <= 0 || r <= 0 || ld <= 0) return STRATA_OK;
    for (int64_t u = 0; u < L * ld; u++) {
        const int64_t t = u / ld, b = u % ld, nb = (p0 + t + 1) / r;
        if (nb <= topk || b >= nb) continue;
        score[t * ld + b] = qsa_block_score(iq + t * nI * dI, blk + b * dI, nI, dI);
    }
    return STRATA_OK;
}

/* qsa_k_select: a warp per query, its 32 lanes one after the other (a lane writes only its own blocks'
 * keys; the ballots and counts it needs are the whole warp's, which qsa.cuh computes over all 32 lanes on
 * the host). */
EMU_FN strata_status emu_qsa_select(const float *score, int64_t ld, int64_t r, int64_t topk, int64_t p0, int64_t L,
                                    int32_t *sel, int64_t sel_cap, int32_t *n_sel, void *stream) {
    (void)stream;
    if (L <= 0) return STRATA_OK;
    for (int64_t t = 0; t < L; t++)
        for (int lane = 0; lane < OPS_WARP; lane++)
            qsa_select_lane(score + t * ld, p0 + t, r, topk, sel + t * sel_cap, n_sel + t, lane);
    return STRATA_OK;
}

/* qsa_k_attn: a block per (query t, head h), three phases: a score per kept key; warp 0's max and
 * 1 / Σ exp (once: on the host qsa_attn_max and qsa_attn_inv run the 32 lanes themselves, and the exp is
 * in place), the block's shared s_inv; an output per dim. */
EMU_FN strata_status emu_qsa_attn(const void *k_cache, const void *v_cache, const float *kv_scale, int kv_type,
                                  int64_t H, int64_t Hkv, int64_t hd, int64_t p0, int64_t L, const float *q,
                                  const float *qg, const int32_t *sel, int64_t sel_cap, const int32_t *n_sel, float *w,
                                  int64_t w_cap, float *o, void *stream) {
    (void)stream;
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
    for (int64_t t = 0; t < L; t++)
        for (int64_t h = 0; h < H; h++) {
            const int64_t n = qsa_n_keys(&A, t);
            for (int64_t i = 0; i < n; i++) qsa_attn_score(&A, t, h, i);
            const float s_inv = qsa_attn_inv(&A, t, h, qsa_attn_max(&A, t, h, 0), 0);
            for (int64_t e = 0; e < hd; e++) qsa_attn_out(&A, t, h, s_inv, e);
        }
    return STRATA_OK;
}

/* ================================================================ ple (ple.cu) */

/* The launcher's format checks (the device's table upload has no host counterpart: host code reads the
 * tables themselves), then ple_k_dequant: a thread per value. */
EMU_FN strata_status emu_ple_dequant(int fmt, const uint8_t *rows, size_t row_bytes, int64_t n_rows, int64_t dP,
                                     const uint64_t *row_ids, const float *gscale, int64_t n_shard, int64_t shard_rows,
                                     float *emb, void *stream) {
    (void)stream;
    if (fmt == PLE_ROWS_NVFP4_PACKED) {
        if (dP % 16 || row_bytes < (size_t)(dP / 2 + dP / 16) || n_shard < 1 || shard_rows < 1)
            return strata_fail(STRATA_ERR_UNSUPPORTED,
                               "cuda ple.dequant: packed NVFP4 rows of %lld values in %zu bytes, "
                               "%lld shards of %lld rows",
                               (long long)dP, row_bytes, (long long)n_shard, (long long)shard_rows);
    } else if (!blk_supported(fmt) || dP % blk_size(fmt) ||
               row_bytes < (size_t)(dP / blk_size(fmt) * blk_bytes(fmt))) {
        return strata_fail(STRATA_ERR_UNSUPPORTED, "cuda ple.dequant: rows of type %d cannot hold %lld values in %zu "
                           "bytes", fmt, (long long)dP, row_bytes);
    }
    const int64_t n = n_rows * dP;
    for (int64_t v = 0; v < n; v++)
        emb[v] = ple_dequant_unit(fmt, rows, row_bytes, dP, row_ids, gscale, n_shard, shard_rows, v);
    return STRATA_OK;
}

/* ple_k_key_norm: a warp per group g = t * hc + j, in place (the fold comes before any lane writes). */
EMU_FN strata_status emu_ple_key_norm(float *key, const float *w, int64_t R, int64_t hc, int64_t E, float eps,
                                      void *stream) {
    (void)stream;
    const int64_t groups = R * hc;
    for (int64_t g = 0; g < groups; g++) {
        float p[OPS_WARP];
        for (int l = 0; l < OPS_WARP; l++) p[l] = ple_key_norm_lane(key, E, g, l);
        const float r = ple_rms_inv(ops_fold32(p), E, eps);
        for (int l = 0; l < OPS_WARP; l++)
            for (int64_t k = l; k < E; k += OPS_WARP) key[g * E + k] = ple_key_norm_value(key, w, hc, E, g, r, k);
    }
    return STRATA_OK;
}

/* ple_k_gate: a warp per group, its three folded sums in order (query norm, score, gv's norm), then each
 * lane's gv and gvn values. */
EMU_FN strata_status emu_ple_gate(const float *X, const float *key, const float *val, const float *w_query,
                                  const float *w_conv, int64_t L, int64_t hc, int64_t E, float eps, float *gv,
                                  float *gvn, void *stream) {
    (void)stream;
    const int64_t groups = L * hc;
    for (int64_t g = 0; g < groups; g++) {
        float p[OPS_WARP];
        for (int l = 0; l < OPS_WARP; l++) p[l] = ple_gate_qss_lane(X, E, g, l);
        const float rq = ple_rms_inv(ops_fold32(p), E, eps);
        for (int l = 0; l < OPS_WARP; l++) p[l] = ple_gate_dot_lane(X, key, w_query, hc, E, g, rq, l);
        const float sg = ple_gate_sigma(ops_fold32(p), E);
        for (int l = 0; l < OPS_WARP; l++) p[l] = ple_gate_gss_lane(val, hc, E, g, sg, l);
        const float rg = ple_rms_inv(ops_fold32(p), E, eps);
        for (int l = 0; l < OPS_WARP; l++)
            for (int64_t k = l; k < E; k += OPS_WARP) {
                gv[g * E + k] = ple_gate_gv(val, hc, E, g, sg, k);
                gvn[g * E + k] = ple_gate_gvn(val, w_conv, hc, E, g, sg, rg, k);
            }
    }
    return STRATA_OK;
}

/* The launcher's copy of state into ext's history rows, then ple_k_conv (a thread per value of X), then
 * (hist > 0) ple_k_conv_hist and (slots) ple_k_conv_slots, a thread per value each. */
EMU_FN strata_status emu_ple_conv(float *X, const float *gv, float *ext, const float *w_conv, int64_t L, int64_t W,
                                  int64_t Kp, int64_t n, float *state, float *slots, void *stream) {
    (void)stream;
    const int64_t hist = (Kp - 1) * n;
    if (L <= 0) return STRATA_OK;
    if (hist > 0) memcpy(ext, state, (size_t)(hist * W) * sizeof(float));
    for (int64_t v = 0; v < L * W; v++) X[v] = ple_conv_unit(X, gv, ext, w_conv, W, Kp, n, v);
    if (hist <= 0) return STRATA_OK;
    for (int64_t v = 0; v < hist * W; v++) state[v] = ple_conv_hist_unit(ext, L, W, v);
    if (!slots) return STRATA_OK;
    for (int64_t v = 0; v < L * hist * W; v++) slots[v] = ple_conv_slot_unit(ext, W, hist, v);
    return STRATA_OK;
}

/* ================================================================ mtp (mtp.cu) */

/* mtp_k_norms (a warp per unit u = 2t + part; lane 0 writes scratch[u]), then mtp_k_concat (a thread per
 * value of in2). */
EMU_FN strata_status emu_mtp_norm_concat(const float *e, const float *h, const float *enorm, const float *hnorm,
                                         int64_t L, int64_t hc, int64_t E, float eps, float *scratch, float *in2,
                                         void *stream) {
    (void)stream;
    if (L <= 0) return STRATA_OK;
    for (int64_t u = 0; u < 2 * L; u++) {
        float p[OPS_WARP];
        for (int l = 0; l < OPS_WARP; l++) p[l] = mtp_norm_lane(e, h, hc, E, u, l);
        scratch[u] = mtp_norm_rinv(ops_fold32(p), hc, E, u, eps);
    }
    const int64_t count = L * hc * 2 * E;
    for (int64_t v = 0; v < count; v++) in2[v] = mtp_concat_unit(e, h, enorm, hnorm, scratch, hc, E, v);
    return STRATA_OK;
}

/* ================================================================ the signatures are the launchers' */

#define EMU_MIXERS_SAME_TYPE(emu, launcher)                                                              \
    _Static_assert(__builtin_types_compatible_p(__typeof__(emu), __typeof__(launcher)),                  \
                   #emu " must have " #launcher "'s signature (it stands in for it in a launcher table)")
EMU_MIXERS_SAME_TYPE(emu_gdn_conv, gdn_cuda_conv);
EMU_MIXERS_SAME_TYPE(emu_gdn_prep, gdn_cuda_prep);
EMU_MIXERS_SAME_TYPE(emu_gdn_recurrent, gdn_cuda_recurrent);
EMU_MIXERS_SAME_TYPE(emu_gdn_chunked_work_floats, gdn_cuda_chunked_work_floats);
EMU_MIXERS_SAME_TYPE(emu_gdn_chunked, gdn_cuda_chunked);
EMU_MIXERS_SAME_TYPE(emu_gdn_out, gdn_cuda_out);
EMU_MIXERS_SAME_TYPE(emu_qsa_store, qsa_cuda_store);
EMU_MIXERS_SAME_TYPE(emu_qsa_idx_store, qsa_cuda_idx_store);
EMU_MIXERS_SAME_TYPE(emu_qsa_blk_pool, qsa_cuda_blk_pool);
EMU_MIXERS_SAME_TYPE(emu_qsa_index, qsa_cuda_index);
EMU_MIXERS_SAME_TYPE(emu_qsa_select, qsa_cuda_select);
EMU_MIXERS_SAME_TYPE(emu_qsa_attn, qsa_cuda_attn);
EMU_MIXERS_SAME_TYPE(emu_ple_dequant, ple_cuda_dequant);
EMU_MIXERS_SAME_TYPE(emu_ple_key_norm, ple_cuda_key_norm);
EMU_MIXERS_SAME_TYPE(emu_ple_gate, ple_cuda_gate);
EMU_MIXERS_SAME_TYPE(emu_ple_conv, ple_cuda_conv);
EMU_MIXERS_SAME_TYPE(emu_mtp_norm_concat, mtp_cuda_norm_concat);
_Static_assert(PLE_CUDA_ROWS_NVFP4_PACKED == PLE_ROWS_NVFP4_PACKED, "ple.h and ple.cuh name the same format");
#undef EMU_MIXERS_SAME_TYPE

#endif
