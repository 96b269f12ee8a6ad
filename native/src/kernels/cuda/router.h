/*
 * router.h — launchers of the MoE router kernels (router.cu; the arithmetic is router.cuh's). Device
 * pointers; stream is a cudaStream_t (NULL: the default stream). Each returns once its launches are
 * queued: STRATA_ERR_IO with the CUDA error when one could not be.
 */
#ifndef STRATA_KERNELS_CUDA_ROUTER_H
#define STRATA_KERNELS_CUDA_ROUTER_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"   /* strata_status only (itself plain C over stdint/stddef) */

#ifdef __cplusplus
extern "C" {
#endif

/* Per token t < L: lg[t x Ne] (router logits) ← softmax in place; pick[t x K] = the K most probable
 * experts (ties: lower id), pw[t x K] = their probabilities renormalised over the K (mdl_route). */
strata_status cuk_router_topk(float *lg, int64_t L, int64_t Ne, int64_t K, int32_t *pick, float *pw, void *stream);
/* The n = L·K pairs of pick grouped by expert (mdl_route_group): count[Ne + 1] prefix sums (expert e's
 * pairs are slot[count[e] .. count[e + 1])), slot[n] the pairs in expert order (stable), row[n] the
 * position of pair i in slot. */
strata_status cuk_router_group(const int32_t *pick, int64_t n, int64_t Ne, int64_t *count, int64_t *slot, int64_t *row,
                               void *stream);

#ifdef __cplusplus
}
#endif

#endif
