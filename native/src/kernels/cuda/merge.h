/*
 * merge.h — launchers of the MoE merge kernels (merge.cu; the arithmetic is merge.cuh's). Device
 * pointers; stream is a cudaStream_t (NULL: the default stream). Each returns once the launch is
 * queued: STRATA_ERR_IO with the CUDA error when it could not be.
 */
#ifndef STRATA_KERNELS_CUDA_MERGE_H
#define STRATA_KERNELS_CUDA_MERGE_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"   /* strata_status only (itself plain C over stdint/stddef) */

#ifdef __cplusplus
extern "C" {
#endif

/* h[n x F] = silu(gate · sg) ⊙ (up · su) (mdl_moe_glu): fused, row i of gu is [gate F | up F]; split,
 * gu is the n gate rows then the n up rows. */
strata_status cuk_merge_glu(const float *gu, int64_t n, int64_t F, int fused, float sg, float su, float *h,
                            void *stream);
/* gate[t] = σ(w_seg · x_t) for the L rows of x [L x E] (mdl_moe_shared_gate). */
strata_status cuk_merge_shared_gate(const float *w_seg, const float *x, int64_t L, int64_t E, float *gate,
                                    void *stream);
/* xg[n x E]: row i is row slot[i] / K of x (the grouped order of router.group's slot: the experts' input
 * rows, mdl_moe_gather). */
strata_status cuk_merge_gather(const float *x, const int64_t *slot, int64_t n, int64_t K, int64_t E, float *xg,
                               void *stream);
/* y[L x E] = Σ_k pw · sd_e · out[row[t·K + k]] over each token's picks in increasing expert id (not
 * the skipped), + gate[t] · sd_sh · sho[t] (mdl_moe_combine). sd [Ne] or NULL (1), skip [Ne] or NULL. */
strata_status cuk_merge_sum(const int32_t *pick, const float *pw, const float *sd, const int8_t *skip,
                            const int64_t *row, const float *out, const float *gate, float sd_sh, const float *sho,
                            int64_t L, int64_t E, int64_t K, float *y, void *stream);

#ifdef __cplusplus
}
#endif

#endif
