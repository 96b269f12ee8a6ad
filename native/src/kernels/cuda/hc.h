/*
 * hc.h — launchers of the hyper-connection kernels (hc.cu; the arithmetic is hc.cuh's and norm.cuh's).
 * A read is read_norm, W_down (gemv), read_act, W_up (gemv), read_mix, and for a layer's read also
 * W_inj (gemv) and inject; the final mixer is the read without the inject. Device pointers; stream
 * is a cudaStream_t (NULL: the default stream). Each returns once the launch is queued:
 * STRATA_ERR_IO with the CUDA error when it could not be.
 */
#ifndef STRATA_KERNELS_CUDA_HC_H
#define STRATA_KERNELS_CUDA_HC_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"   /* strata_status only (itself plain C over stdint/stddef) */

#ifdef __cplusplus
extern "C" {
#endif

/* xh[L x hc·E] = G(X; w_n): one RMS per stream, stream j weighted by w_n[j·E ..] (mdl_group_rmsnorm). */
strata_status cuk_hc_read_norm(const float *X, const float *w_n, int64_t L, int64_t hc, int64_t E, float eps,
                               float *xh, void *stream);
/* a[n] ← silu(a / hc) in place (n = L x R, the W_down product). */
strata_status cuk_hc_read_act(float *a, int64_t n, int64_t hc, void *stream);
/* u[L x E] = mean over the hc streams of σ(g_j) ⊙ xh_j (g: the W_up product, L x hc·E). */
strata_status cuk_hc_read_mix(const float *g, const float *xh, int64_t L, int64_t hc, int64_t E, float *u,
                              void *stream);
/* c[n] = 2 σ(a / hc) (n = L x hc, the W_inj product). */
strata_status cuk_hc_inject(const float *a, int64_t n, int64_t hc, float *c, void *stream);
/* X_j += c_j · y for every stream j of every token: X [L x hc·E], c [L x hc], y [L x E]. */
strata_status cuk_hc_write(float *X, const float *c, const float *y, int64_t L, int64_t hc, int64_t E, void *stream);

#ifdef __cplusplus
}
#endif

#endif
