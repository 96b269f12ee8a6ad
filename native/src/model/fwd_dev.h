/*
 * fwd_dev.h — what the parts of the device forward share (fwd_dev.c the step and the mixers, moe.c and
 * ple_layer.c their layers on the device, mtp.c the head): the uploaded layer vectors, a session's work
 * buffers and the product. Internal to native/src/model.
 */
#ifndef STRATA_MODEL_FWD_DEV_H
#define STRATA_MODEL_FWD_DEV_H

#include "model.h"
#include "device/dense.h"

enum { GEMV_MAX_ROWS = 8, GDN_CHUNK_MIN_ROWS = 32, GEMM_TILE_ROWS = 64 };
#define QSA_SLICE_BYTES ((size_t)64 << 20)
#define GEMM_TILE_BYTES ((size_t)32 << 20)

/* A layer's small float vectors in the device's memory (NULL where the layer has none). */
typedef struct {
    float *hc_norm[2];
    float *ssm_conv, *ssm_dt_bias, *ssm_a, *ssm_norm;
    float *attn_q_norm, *attn_k_norm, *idx_q_norm, *idx_k_norm;
    float *sh_inp_gate;                                       /* [E] the shared expert's gate */
    float *exp_down_scale;                                    /* [Ne] .scale of each expert's down, or NULL */
    float *ple_norm_key, *ple_norm_query, *ple_norm_conv;     /* [hc*E] */
    float *ple_conv;                                          /* [hc*E][Kp] */
} dlayer;

struct mdl_dense {
    const mdl_dk *dk;
    void *blas;
    dlayer *layers;            /* [n_layer + n_mtp]: the MTP block's is layers[n_layer] */
    float *out_hc_norm;
    float *mtp_enorm, *mtp_hnorm, *mtp_head_norm;
    int f16;                   /* prefill products on cuBLAS's f16 tensor-core path (params.prefill_f16 and a handle) */
    uint64_t weight_bytes;     /* dense weights and vectors uploaded */
};

/* A session's work buffers, each grown on demand (a step of more rows than the last reallocates). The
 * mixers' (B_X .. B_LG), the MoE's (B_M*) and the PLE layer's (B_PLE*) are apart: a part may hold its own
 * across a call of another. */
enum { B_X, B_U, B_Y, B_C, B_XH, B_G, B_A, B_XQ, B_TILE, B_P0, B_P1, B_P2, B_P3, B_P4, B_CV, B_QN, B_KN, B_O, B_Q,
       B_CS, B_BCS, B_SCORE, B_SEL, B_NSEL, B_W, B_WORK, B_LG,
       B_MLG, B_MPICK, B_MPW, B_MCOUNT, B_MSLOT, B_MROW, B_MOUT, B_MSKIP, B_MGATE, B_MSHGU, B_MSHH, B_MSHO, B_MXG,
       B_X16, B_PLE_ROWS, B_PLE_IDS, B_PLE_EMB, B_PLE_KEY, B_PLE_VAL, B_PLE_GV, B_PLE_EXT,
       B_N };

/* Its page-locked host buffers (dk->host_alloc): what goes up without a wait for the stream. */
enum { H_MOE, H_PLE, H_N };

struct mdl_dsess {
    const mdl_dk *dk;
    void *buf[B_N];
    size_t cap[B_N];
    void *host[H_N];
    size_t host_cap[H_N];
};

/* The session's work buffer `which` of at least `bytes` (device memory; its contents are kept only while
 * it does not grow). */
strata_status mdl_dbuf(strata_session *s, int which, size_t bytes, void **out);
/* The session's host buffer `which` (H_*) of at least `bytes`; growing it first waits for the stream (a copy
 * from the old one may be queued). */
strata_status mdl_dhost(strata_session *s, int which, size_t bytes, void **out);
#define DBUF(s, which, type, n, ptr) \
    do { if ((rc = mdl_dbuf((s), (which), (size_t)(n) * sizeof(type), (void **)&(ptr)))) return rc; } while (0)

/* dk->copy on the default stream, its bytes counted in the model's PCIe figures when it crosses (H2D, D2H). */
strata_status mdl_dcopy(strata_session *s, void *dst, const void *src, size_t bytes, int kind);

/* y[L x rows] = w x[L x cols] (both device memory), times w's .scale: the activations rounded as
 * strata_matmul rounds them, then the gemv kernel (≤ GEMV_MAX_ROWS rows) or the gemm. Uses B_XQ, B_TILE. */
strata_status mdl_dmatmul(strata_session *s, const mdl_mat *w, const float *x, int64_t L, float *y);

/* mtp.c's step on the device (same contract as its mtp_step): rows [0, L) of hidden [L x hc*E] and ids at
 * positions p0.. through the fusion and the MTP block on its own device cache, chain / logits of rows
 * [row0, L) copied down. e [L x E] and u [L x E] are host scratch. */
strata_status mdl_mtp_step_dev(strata_session *s, const float *hidden, const int32_t *ids, int64_t L, int64_t p0,
                               int64_t row0, float *logits, float *chain, float *e, float *u);

#endif
