/*
 * mtp.h — launcher of the MTP head's own CUDA kernels (mtp.cuh: the arithmetic and the layouts; mtp.cu).
 * Plain C: pointers are device pointers, `stream` is a cudaStream_t. The call enqueues its kernels and
 * returns without waiting; STRATA_ERR_IO if a launch fails.
 */
#ifndef STRATA_KERNELS_CUDA_MTP_H
#define STRATA_KERNELS_CUDA_MTP_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"

#ifdef __cplusplus
extern "C" {
#endif

/* mtp.norm_concat: in2 [L][hc][2E] = [N(e_t; enorm) | (N(h_t; hnorm))_j] for L tokens, from e [L][E]
 * (embedding rows), h [L][hc*E] (hidden rows), enorm [E], hnorm [hc*E]. scratch: 2L floats. */
strata_status mtp_cuda_norm_concat(const float *e, const float *h, const float *enorm, const float *hnorm, int64_t L,
                                   int64_t hc, int64_t E, float eps, float *scratch, float *in2, void *stream);

#ifdef __cplusplus
}
#endif

#endif
