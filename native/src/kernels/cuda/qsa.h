/*
 * qsa.h — launchers of the QSA attention kernels (qsa.cuh, qsa.cu), callable from C.
 *
 * Every pointer is device memory; layouts are model/qsa.c's and the session state's (model.h):
 * K/V caches [tokens][Hkv][hd] in kv_type (strata_kv_type), int8 scales [tokens][Hkv][2] (K, V),
 * raw indexer keys [tokens][dI], block summaries [blocks][dI]. A launch covers L queries at
 * positions p0 .. p0 + L - 1; per-query arrays may be offset by the caller to split a long prefill
 * into several launches (their scratch grows with L). `stream` is a cudaStream_t (NULL: the default
 * stream). A launcher returns once its kernels are queued; STRATA_ERR_IO names a launch that failed.
 *
 * One step of the layer, after the projections and the per-head N1 + RoPE of q, k and the indexer
 * queries (norm.h, rope.h): qsa_cuda_store (K/V rows), qsa_cuda_idx_store (raw indexer keys), for
 * the blocks the step completes qsa_cuda_blk_pool then N1 (idx_k_norm) and RoPE at b·r (dp = r) on
 * those summary rows, then qsa_cuda_index, qsa_cuda_select, qsa_cuda_attn, then W_o.
 */
#ifndef STRATA_KERNELS_CUDA_QSA_H
#define STRATA_KERNELS_CUDA_QSA_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Rows p0 .. p0 + L - 1 of the K and V caches from k, v [L x Hkv x hd] (k normed and roped). */
strata_status qsa_cuda_store(void *k_cache, void *v_cache, float *kv_scale, int kv_type, int64_t Hkv, int64_t hd,
                             int64_t p0, int64_t L, const float *k, const float *v, void *stream);

/* Rows p0 .. of the raw indexer keys from ik [L x dI] (a copy: no norm, no RoPE). */
strata_status qsa_cuda_idx_store(float *idx_k, const float *ik, int64_t dI, int64_t p0, int64_t L, void *stream);

/* Summary rows b0 .. b0 + nbn - 1 of blk: the means of each block's r raw keys (before N1 and RoPE). */
strata_status qsa_cuda_blk_pool(const float *idx_k, int64_t dI, int64_t r, int64_t b0, int64_t nbn, float *blk,
                                void *stream);

/* score[t * ld + b] for the queries whose selection binds (nb = (p0 + t + 1) / r > topk = budget / r)
 * and their blocks b < nb: iq [L x nI x dI] (normed, roped), blk the summaries; ld >= the last
 * query's nb. Nothing for r == 0. */
strata_status qsa_cuda_index(const float *iq, const float *blk, int64_t nI, int64_t dI, int64_t r, int64_t topk,
                             int64_t p0, int64_t L, float *score, int64_t ld, void *stream);

/* Per query t: n_sel[t] = -1 (dense) or the count of its kept keys sel[t * sel_cap ..]: the topk best
 * blocks' keys (ascending) and the tail; sel_cap >= min(topk * r + r - 1, p0 + L). */
strata_status qsa_cuda_select(const float *score, int64_t ld, int64_t r, int64_t topk, int64_t p0, int64_t L,
                              int32_t *sel, int64_t sel_cap, int32_t *n_sel, void *stream);

/* o [L x H x hd] = softmax(q k / sqrt(hd)) V over each query's kept keys, times σ(gate): q [L x H x hd],
 * qg [L x 2H hd] (per head [q | gate]); w: scratch of L x H x w_cap floats, w_cap >= every query's
 * kept-key count. */
strata_status qsa_cuda_attn(const void *k_cache, const void *v_cache, const float *kv_scale, int kv_type, int64_t H,
                            int64_t Hkv, int64_t hd, int64_t p0, int64_t L, const float *q, const float *qg,
                            const int32_t *sel, int64_t sel_cap, const int32_t *n_sel, float *w, int64_t w_cap,
                            float *o, void *stream);

#ifdef __cplusplus
}
#endif

#endif
