/*
 * gdn.h — launchers of the Gated DeltaNet kernels (gdn.cuh, gdn.cu), callable from C.
 *
 * Every pointer is device memory; layouts are model/gdn.c's: CD = 2*Gk*dk + Gv*dv conv channels
 * ([q | k | v], head-major), conv rows cv [L x CD], qn, kn [L x Gk x dk], beta, g [L x Gv],
 * o [L x Gv*dv], the recurrent state S [Gv][dk][dv]. `stream` is a cudaStream_t (NULL: the default
 * stream). A launcher returns once its kernels are queued; STRATA_ERR_IO names a launch that failed.
 */
#ifndef STRATA_KERNELS_CUDA_GDN_H
#define STRATA_KERNELS_CUDA_GDN_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"   /* strata_status only (itself plain C over stdint/stddef) */

#ifdef __cplusplus
extern "C" {
#endif

/* The causal depthwise conv (+ silu) of L new rows x (row t at x + t * ldx, CD channels) after the conv
 * history hist [(Kc-1) x CD] with taps w [CD][Kc] (last tap = the current row): cv [L x CD]; then hist
 * advances to the last Kc-1 rows of history + new rows. */
strata_status gdn_cuda_conv(const float *w, int Kc, int64_t CD, float *hist, const float *x, int64_t ldx, int64_t L,
                            float *cv, void *stream);

/* Per row: q and k of cv l2-normalised per key head (q also x dk^-1/2) into qn, kn; beta = sigmoid(b),
 * g = ssm_a * softplus(a + dt_bias) per value head (b, a rows ldba floats apart; beta, g [L x Gv]; in
 * place when beta == b, g == a and ldba == Gv). */
strata_status gdn_cuda_prep(const float *cv, int64_t L, int Gk, int Gv, int dk, int dv, const float *b,
                            const float *a, int64_t ldba, const float *ssm_a, const float *dt_bias, float *qn,
                            float *kn, float *beta, float *g, void *stream);

/* The delta rule token by token over L rows (decode): S advances, o receives the heads' outputs.
 * S_slots: NULL, or L x [Gv][dk][dv] for the state after each row (KEEP_STATES windows). */
strata_status gdn_cuda_recurrent(float *S, const float *qn, const float *kn, const float *cv, const float *beta,
                                 const float *g, float *o, int64_t L, int Gk, int Gv, int dk, int dv, float *S_slots,
                                 void *stream);

/* Floats of scratch gdn_cuda_chunked needs for Gv heads. */
size_t gdn_cuda_chunked_work_floats(int Gv, int dk, int dv);
/* The chunked form of the same (prefill; 64-row chunks, the last one partial and closed): S advances,
 * o receives the outputs; work: gdn_cuda_chunked_work_floats of device scratch. */
strata_status gdn_cuda_chunked(float *S, const float *qn, const float *kn, const float *cv, const float *beta,
                               const float *g, float *o, int64_t L, int Gk, int Gv, int dk, int dv, float *work,
                               void *stream);

/* The gated RMS norm per value head, in place over o [L x Gv*dv]: o / rms(o) * w * act(z), act sigmoid
 * (gate_sigmoid) or silu; z rows ldz floats apart. */
strata_status gdn_cuda_out(float *o, const float *z, int64_t ldz, const float *w, int64_t L, int Gv, int dv, float eps,
                           int gate_sigmoid, void *stream);

#ifdef __cplusplus
}
#endif

#endif
