/*
 * rope.h — launchers of the RoPE kernels (rope.cu; the arithmetic is rope.cuh's). Device pointers;
 * stream is a cudaStream_t (NULL: the default stream). Each returns once the launch is queued:
 * STRATA_ERR_IO with the CUDA error when it could not be.
 */
#ifndef STRATA_KERNELS_CUDA_ROPE_H
#define STRATA_KERNELS_CUDA_ROPE_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"   /* strata_status only (itself plain C over stdint/stddef) */

#ifdef __cplusplus
extern "C" {
#endif

/* cs[L x n_rot]: row t is the n_rot/2 cosines then the n_rot/2 sines of position p0 + t * dp
 * (mdl_rope_angles of that position). */
strata_status cuk_rope_angles(float theta, int32_t n_rot, int64_t p0, int64_t dp, int64_t L, float *cs,
                              void *stream);
/* NeoX rotation of the first n_rot dims of rows r < rows (row r at x + r * xs), nh rows (heads) per
 * token: row r takes row r / nh of cs (mdl_rope of each row). In place. */
strata_status cuk_rope_apply(float *x, int64_t xs, int64_t rows, int64_t nh, int32_t n_rot, const float *cs,
                             void *stream);

#ifdef __cplusplus
}
#endif

#endif
