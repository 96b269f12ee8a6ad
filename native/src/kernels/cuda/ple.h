/*
 * ple.h — launchers of the PLE layer's CUDA kernels (ple.cuh: the arithmetic and the layouts; ple.cu).
 * Plain C: pointers are device pointers, `stream` is a cudaStream_t. Each call enqueues its kernels on
 * the stream and returns without waiting; STRATA_ERR_IO if a launch fails (the message says which).
 * Sizes are in values unless named otherwise; W = hc*E, hist = (Kp-1)*n.
 */
#ifndef STRATA_KERNELS_CUDA_PLE_H
#define STRATA_KERNELS_CUDA_PLE_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"

#ifdef __cplusplus
extern "C" {
#endif

/* fmt for the seed's packed NVFP4 rows (pack-ple); otherwise a GGUF type id (ple.cuh). */
#define PLE_CUDA_ROWS_NVFP4_PACKED (-1)

/* ple.dequant: n_rows gathered rows of dP values (row_bytes each) -> emb [n_rows][dP]. Packed NVFP4
 * rows: row_ids [n_rows] (their table rows) pick each one's shard scale in gscale [n_shard]; other
 * formats ignore row_ids, gscale, n_shard, shard_rows. STRATA_ERR_UNSUPPORTED: a format this cannot
 * decode into rows of dP values. */
strata_status ple_cuda_dequant(int fmt, const uint8_t *rows, size_t row_bytes, int64_t n_rows, int64_t dP,
                               const uint64_t *row_ids, const float *gscale, int64_t n_shard, int64_t shard_rows,
                               float *emb, void *stream);

/* ple.project: key [R][W] (= W_key emb) becomes G(key; w) in place (w [W], folded 1+w). */
strata_status ple_cuda_key_norm(float *key, const float *w, int64_t R, int64_t hc, int64_t E, float eps,
                                void *stream);

/* ple.gate: for L tokens of one sequence, gv [L][W] and gvn [L][W] from X [L][W], key [L][W] (normed),
 * val [L][E], w_query and w_conv [W]. gvn is ext + hist*W for ple_cuda_conv. */
strata_status ple_cuda_gate(const float *X, const float *key, const float *val, const float *w_query,
                            const float *w_conv, int64_t L, int64_t hc, int64_t E, float eps, float *gv, float *gvn,
                            void *stream);

/* ple.conv: ext [hist + L][W] (rows hist.. hold gvn); copies state [hist][W] into ext's first rows,
 * X [L][W] += gv + silu(conv), then state = ext's last hist rows and, slots not NULL (a verify window),
 * slots [L][hist][W] the history after each token. w_conv [W][Kp]. */
strata_status ple_cuda_conv(float *X, const float *gv, float *ext, const float *w_conv, int64_t L, int64_t W,
                            int64_t Kp, int64_t n, float *state, float *slots, void *stream);

#ifdef __cplusplus
}
#endif

#endif
