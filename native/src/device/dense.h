/*
 * dense.h — the device the dense forward runs on (model/fwd_dev.c): its memory and its kernels, as one
 * table of functions, so that one forward serves two implementations:
 *
 *   - `cuda` (dense_cuda.cu): GPU memory, the launchers of kernels/cuda/<family>.cu;
 *   - `emu` (dense_emu.c): host memory, and every launcher emulated on the host by running the same
 *     kernel's unit functions over its whole launch grid (kernels/cuda/emu_*.h), in the order the
 *     kernel's lanes and warp folds use. The numbers are the kernels' own (up to the GPU's rounding of
 *     expf and friends), so a machine without a GPU runs the device forward end to end: its buffer
 *     handling, state, layouts and launch arguments are checked against the C forward (the test is
 *     tests/test_dense_device.py).
 *
 * Every pointer a kernel or a copy takes is the table's memory (device memory for cuda), but for the host
 * side of an H2D / D2H copy. The forward queues its copies and kernels on the default stream (NULL), so
 * they run in order with no events; `sync` waits for them. `copy` with D2H is synchronous (the forward
 * reads what it copied); H2D returns at once from host_alloc's memory, and after waiting for the stream
 * from any other (CUDA stages pageable memory only once the stream is idle).
 */
#ifndef STRATA_DEVICE_DENSE_H
#define STRATA_DEVICE_DENSE_H

#include <stddef.h>
#include <stdint.h>

#include "strata.h"

enum { DK_H2D = 1, DK_D2H = 2, DK_D2D = 3 };

typedef struct mdl_dk {
    const char *name;
    /* memory: alloc returns NULL when the device has no room (no message: the caller names the use) */
    void *(*alloc)(size_t bytes);
    void (*free)(void *p);
    /* page-locked host memory (cuda: cudaHostAlloc), so that a copy up from it is queued without waiting for
     * the stream: the caller keeps it unchanged until the stream passed the copy (a later sync or D2H copy) */
    void *(*host_alloc)(size_t bytes);
    void (*host_free)(void *p);
    strata_status (*copy)(void *dst, const void *src, size_t bytes, int kind, void *stream);
    /* rows of `width` bytes, spitch / dpitch bytes apart */
    strata_status (*copy2d)(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows,
                            int kind, void *stream);
    strata_status (*zero)(void *dst, size_t bytes, void *stream);
    strata_status (*sync)(void *stream);
    /* free and total memory of the device in bytes */
    strata_status (*mem_info)(uint64_t *free_bytes, uint64_t *total_bytes);

    /* gemv.h, gemm.h */
    strata_status (*act_quant)(void *stream, int act, const float *x, float *xq, int64_t n, int64_t K);
    strata_status (*gemv)(void *stream, int type, const void *W, size_t row_bytes, int64_t R, int64_t K, const float *xq,
                          int64_t n, float *y);
    strata_status (*scale)(void *stream, float *y, int64_t n, float s);
    strata_status (*gemm_create)(void **handle);
    void (*gemm_destroy)(void *handle);
    size_t (*gemm_tile_bytes)(int64_t K, int64_t tile_rows, int f16);
    strata_status (*gemm)(void *handle, void *stream, int type, const void *W, size_t row_bytes, int64_t R, int64_t K,
                          const float *x, int64_t n, float *y, void *tile, size_t tile_bytes, int f16, void *x16);
    /* norm.h, rope.h */
    strata_status (*rmsnorm_rows)(const float *x, int64_t xs, const float *w, int64_t wg, int64_t rows, int64_t n,
                                  float eps, float *y, int64_t ys, void *stream);
    strata_status (*rope_angles)(float theta, int32_t n_rot, int64_t p0, int64_t dp, int64_t L, float *cs,
                                 void *stream);
    strata_status (*rope_apply)(float *x, int64_t xs, int64_t rows, int64_t nh, int32_t n_rot, const float *cs,
                                void *stream);
    /* hc.h */
    strata_status (*hc_read_norm)(const float *X, const float *w_n, int64_t L, int64_t hc, int64_t E, float eps,
                                  float *xh, void *stream);
    strata_status (*hc_read_act)(float *a, int64_t n, int64_t hc, void *stream);
    strata_status (*hc_read_mix)(const float *g, const float *xh, int64_t L, int64_t hc, int64_t E, float *u,
                                 void *stream);
    strata_status (*hc_inject)(const float *a, int64_t n, int64_t hc, float *c, void *stream);
    strata_status (*hc_write)(float *X, const float *c, const float *y, int64_t L, int64_t hc, int64_t E, void *stream);
    /* gdn.h */
    strata_status (*gdn_conv)(const float *w, int Kc, int64_t CD, float *hist, const float *x, int64_t ldx, int64_t L,
                              float *cv, void *stream);
    strata_status (*gdn_prep)(const float *cv, int64_t L, int Gk, int Gv, int dk, int dv, const float *b,
                              const float *a, int64_t ldba, const float *ssm_a, const float *dt_bias, float *qn,
                              float *kn, float *beta, float *g, void *stream);
    strata_status (*gdn_recurrent)(float *S, const float *qn, const float *kn, const float *cv, const float *beta,
                                   const float *g, float *o, int64_t L, int Gk, int Gv, int dk, int dv, float *S_slots,
                                   void *stream);
    size_t (*gdn_chunked_work_floats)(int Gv, int dk, int dv);
    strata_status (*gdn_chunked)(float *S, const float *qn, const float *kn, const float *cv, const float *beta,
                                 const float *g, float *o, int64_t L, int Gk, int Gv, int dk, int dv, float *work,
                                 void *stream);
    strata_status (*gdn_out)(float *o, const float *z, int64_t ldz, const float *w, int64_t L, int Gv, int dv,
                             float eps, int gate_sigmoid, void *stream);
    /* qsa.h */
    strata_status (*qsa_store)(void *k_cache, void *v_cache, float *kv_scale, int kv_type, int64_t Hkv, int64_t hd,
                               int64_t p0, int64_t L, const float *k, const float *v, void *stream);
    strata_status (*qsa_idx_store)(float *idx_k, const float *ik, int64_t dI, int64_t p0, int64_t L, void *stream);
    strata_status (*qsa_blk_pool)(const float *idx_k, int64_t dI, int64_t r, int64_t b0, int64_t nbn, float *blk,
                                  void *stream);
    strata_status (*qsa_index)(const float *iq, const float *blk, int64_t nI, int64_t dI, int64_t r, int64_t topk,
                               int64_t p0, int64_t L, float *score, int64_t ld, void *stream);
    strata_status (*qsa_select)(const float *score, int64_t ld, int64_t r, int64_t topk, int64_t p0, int64_t L,
                                int32_t *sel, int64_t sel_cap, int32_t *n_sel, void *stream);
    strata_status (*qsa_attn)(const void *k_cache, const void *v_cache, const float *kv_scale, int kv_type, int64_t H,
                              int64_t Hkv, int64_t hd, int64_t p0, int64_t L, const float *q, const float *qg,
                              const int32_t *sel, int64_t sel_cap, const int32_t *n_sel, float *w, int64_t w_cap,
                              float *o, void *stream);
    /* router.h, merge.h */
    strata_status (*router_topk)(float *lg, int64_t L, int64_t Ne, int64_t K, int32_t *pick, float *pw, void *stream);
    strata_status (*router_group)(const int32_t *pick, int64_t n, int64_t Ne, int64_t *count, int64_t *slot,
                                  int64_t *row, void *stream);
    strata_status (*merge_glu)(const float *gu, int64_t n, int64_t F, int fused, float sg, float su, float *h,
                               void *stream);
    strata_status (*merge_shared_gate)(const float *w_seg, const float *x, int64_t L, int64_t E, float *gate,
                                       void *stream);
    strata_status (*merge_gather)(const float *x, const int64_t *slot, int64_t n, int64_t K, int64_t E, float *xg,
                                  void *stream);
    strata_status (*merge_sum)(const int32_t *pick, const float *pw, const float *sd, const int8_t *skip,
                               const int64_t *row, const float *out, const float *gate, float sd_sh, const float *sho,
                               int64_t L, int64_t E, int64_t K, float *y, void *stream);
    /* ple.h, mtp.h */
    strata_status (*ple_dequant)(int fmt, const uint8_t *rows, size_t row_bytes, int64_t n_rows, int64_t dP,
                                 const uint64_t *row_ids, const float *gscale, int64_t n_shard, int64_t shard_rows,
                                 float *emb, void *stream);
    strata_status (*ple_key_norm)(float *key, const float *w, int64_t R, int64_t hc, int64_t E, float eps,
                                  void *stream);
    strata_status (*ple_gate)(const float *X, const float *key, const float *val, const float *w_query,
                              const float *w_conv, int64_t L, int64_t hc, int64_t E, float eps, float *gv, float *gvn,
                              void *stream);
    strata_status (*ple_conv)(float *X, const float *gv, float *ext, const float *w_conv, int64_t L, int64_t W,
                              int64_t Kp, int64_t n, float *state, float *slots, void *stream);
    strata_status (*mtp_norm_concat)(const float *e, const float *h, const float *enorm, const float *hnorm, int64_t L,
                                     int64_t hc, int64_t E, float eps, float *scratch, float *in2, void *stream);
} mdl_dk;

/* The CUDA table, or NULL with *why set (no GPU, or a build without CUDA). */
const mdl_dk *mdl_dk_cuda(const char **why);
/* The host emulation: always there. */
const mdl_dk *mdl_dk_emu(void);

#endif
