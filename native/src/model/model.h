/*
 * model.h — the qwen4exp model inside libstrata: hyperparameters, weights, per-sequence state,
 * and the functions of the forward pass (one file per concern).
 *
 * Definition: ../shared/spec/qwen4exp-math.md (transformers 5.23.0); layout:
 * spec/qwen4exp-gguf.md (llama.cpp's names, shapes and layouts). The GGUF layout is used as is:
 *   - (1+w) norms are folded in the file: every N1/G norm multiplies by the stored weight;
 *   - GDN value heads are in llama.cpp's tiled order, so value head h reads key head h % n_k_heads;
 *   - ssm_a = -exp(A_log).
 *
 * Ownership: a strata_model owns the GGUF mapping (weights are used in place, never copied) and
 * small float copies of every 1-D / tiny tensor (norms, conv taps, biases), decoded from any
 * type at load. A strata_session owns one sequence's state (GDN conv + fp32 recurrent state, QSA
 * K/V + raw indexer keys + block summaries, PLE conv history + last n-1 ids) and the scratch of
 * its forward. Sessions of one model share only read-only data and the model's thread pool
 * (strata_pool_run serialises jobs), so different sessions may run on different threads.
 *
 * Activations are row-major [tokens x features] float arrays ("L x D" in the comments).
 */
#ifndef STRATA_MODEL_MODEL_H
#define STRATA_MODEL_MODEL_H

#include <stdint.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>

#include "strata.h"
#include "quant/quant.h"
#include "util/threadpool.h"
#include "kernels/cuda/ops_common.cuh"   /* ops_exp, ops_sigmoid, ops_silu: the activations, shared with the GPU */
#include "moe/offload.h"
#include "moe/xstore.h"

#define MDL_MAX_NGRAM 8
#define MDL_MAX_PLE_HEADS 64

/* A matrix used by matmul: `rows` outputs, `cols` inputs, in its file type; for stacked expert
 * tensors `n_mat` matrices of `mat_bytes` each, one after the other. `scale` (NULL if none) is the
 * NVFP4 per-tensor `.scale`: one value, or one per matrix; the product is multiplied by it. */
typedef struct {
    const char *data;
    const strata_qtraits *t;
    int64_t rows, cols;
    int64_t n_mat;
    size_t row_bytes;
    size_t mat_bytes;
    const float *scale;     /* owned copy, n_scale values */
    int64_t n_scale;
    void *dev;              /* its bytes in the dense device's memory (fwd_dev.c), or NULL */
} mdl_mat;

typedef struct {
    /* hyper-connections around the mixer (attn) and the MoE (ffn) */
    float *hc_norm[2];         /* [hc*E] folded (1+w) */
    mdl_mat hc_down[2];        /* r_hc x hc*E */
    mdl_mat hc_up[2];          /* hc*E x r_hc */
    mdl_mat hc_inject[2];      /* hc x hc*E */

    int is_qsa;
    /* GDN */
    mdl_mat ssm_qkv;           /* conv_dim x E: [q (Gk*dk) | k (Gk*dk) | v (Gv*dv)] */
    mdl_mat ssm_z;             /* Gv*dv x E (output gate) */
    mdl_mat ssm_beta;          /* Gv x E */
    mdl_mat ssm_alpha;         /* Gv x E */
    float *ssm_conv;           /* [conv_dim][Kc] taps, last tap = current token */
    float *ssm_dt_bias;        /* [Gv] */
    float *ssm_a;              /* [Gv] = -exp(A_log) */
    float *ssm_norm;           /* [dv] plain gamma */
    mdl_mat ssm_out;           /* E x Gv*dv */

    /* QSA */
    mdl_mat attn_q;            /* 2*H*hd x E, per head [q | gate] */
    mdl_mat attn_k, attn_v;    /* Hkv*hd x E */
    mdl_mat attn_o;            /* E x H*hd */
    float *attn_q_norm, *attn_k_norm;  /* [hd] folded */
    mdl_mat idx_q;             /* Hi*Di x E */
    mdl_mat idx_k;             /* Di x E */
    float *idx_q_norm, *idx_k_norm;    /* [Di] folded */
    int32_t ratio;             /* compress ratio r (block size); 0 = dense */

    /* MoE */
    mdl_mat router;            /* Ne x E */
    mdl_mat exp_gate, exp_up;  /* n_mat = Ne, each Fe x E (gate_up fused: exp_gate holds 2Fe rows) */
    int exp_fused;
    mdl_mat exp_down;          /* n_mat = Ne, each E x Fe */
    mdl_mat sh_gate, sh_up;    /* Fs x E */
    mdl_mat sh_down;           /* E x Fs */
    float *sh_inp_gate;        /* [E] */

    /* PLE (one layer) */
    int has_ple;
    mdl_mat ple_key;           /* hc*E x P */
    mdl_mat ple_value;         /* E x P */
    float *ple_norm_key, *ple_norm_query, *ple_norm_conv;  /* [hc*E] folded */
    float *ple_conv;           /* [hc*E][Kp] */
} mdl_layer;

typedef struct {
    int64_t n_vocab, n_embd, n_ctx_train;
    int32_t n_layer;
    int32_t hc, hc_rank;
    float eps;
    /* attention */
    int32_t n_head, n_head_kv, head_dim, n_rot;
    float rope_theta;
    int32_t idx_heads, idx_dim, idx_budget;
    /* GDN */
    int32_t ssm_kc, ssm_dk, ssm_gk, ssm_gv;   /* conv kernel, head dim (K and V), K heads, V heads */
    int gate_sigmoid;                          /* GDN output gate: 1 sigmoid, 0 silu */
    /* MoE */
    int32_t n_expert, n_expert_used, ff_exp, ff_shexp;
    int32_t n_mtp;                             /* MTP blocks (nextn_predict_layers), 0 or 1; the block is layers[n_layer] */
    /* PLE */
    int32_t ple_layer;                         /* -1: none */
    int32_t ple_n, ple_heads_per, ple_kp, ple_row_dim;
    int64_t ple_eos;
    uint64_t ple_mult[MDL_MAX_NGRAM];
    uint64_t ple_off[MDL_MAX_PLE_HEADS], ple_size[MDL_MAX_PLE_HEADS];
} mdl_hparams;

struct strata_model {
    strata_gguf *gguf;
    strata_model_params params;
    strata_context *ctx;       /* owns the pool */
    strata_pool *pool;
    int isa;                   /* STRATA_ISA_IDX_* */
    mdl_hparams hp;
    const char *tok_embd;      /* n_vocab rows of E values in tok_embd_t */
    const strata_qtraits *tok_embd_t;
    size_t tok_embd_row;
    mdl_mat output;            /* n_vocab x E */
    float *out_hc_norm;        /* [hc*E] */
    mdl_mat out_hc_down, out_hc_up;
    const char *ple_table;     /* rows of ple_row_dim values in ple_table_t */
    const strata_qtraits *ple_table_t;
    size_t ple_table_row;
    int64_t ple_table_rows;
    struct mdl_ple_engine *ple;  /* table access + gather worker (ple/ple_table.c); NULL without PLE */
    mdl_layer *layers;         /* [hp.n_layer + hp.n_mtp] (load.c; the MTP block is layers[n_layer]) */
    /* MTP head (hp.n_mtp == 1; mtp.c, spec/qwen4exp-mtp.md §2.2): fusion, then the decoder block
     * layers[n_layer], then its own mixer; embedding and LM head are the trunk's */
    float *mtp_enorm;          /* [E] folded (1+w) */
    float *mtp_hnorm;          /* [hc*E] folded, ONE RMS over the whole row */
    mdl_mat mtp_eh_proj;       /* E x 2E: input columns [0,E) take N(emb), [E,2E) one stream of N(h) */
    float *mtp_head_norm;      /* [hc*E] folded, grouped per stream */
    mdl_mat mtp_head_down;     /* r_hc x hc*E */
    mdl_mat mtp_head_up;       /* hc*E x r_hc */
    uint64_t weight_bytes;
    uint64_t repack_bytes;     /* strata_model_info.repack_bytes (model.c) */
    off_engine *off;           /* MoE offload engine (moe/offload.h); NULL: plain CPU path */
    xs_store *xs;              /* expert store's RAM tier (moe/xstore.h); NULL: experts read in place (mmap) */
    char store_log[1400];       /* strata_model_store_log */
    const struct mdl_dk *dk;   /* the dense forward's device (device/dense.h); NULL: the C forward */
    struct mdl_dense *dense;   /* its weights, stream and plan (fwd_dev.c) */
    char device_log[1024];     /* strata_model_device_log */
    uint64_t dense_h2d, dense_d2h;   /* bytes the device forward copied up / down (atomics; fwd_dev.c) */
    int expert_dev_io;         /* the expert device's memory is the dense device's (cuda and cuda, sim and emu) */
    FILE *trace;               /* --trace-routing: JSON lines, one per (window, layer); NULL: off */
    pthread_mutex_t trace_mu;  /* guards trace and trace_window */
    uint64_t trace_window;
};

/* ---------------------------------------------------------------- per-sequence state */

typedef struct {
    float *conv;               /* GDN: [(Kc-1) x conv_dim] last pre-conv qkv rows, oldest first */
    float *S;                  /* GDN: [Gv][dk][dv] fp32 recurrent state */
    void *k, *v;               /* QSA: [cap_tokens][Hkv][hd] in kv_type */
    float *kv_scale;           /* QSA int8: [cap_tokens][Hkv][2] (k scale, v scale) */
    float *idx_k;              /* QSA: [cap_tokens][Di] raw indexer keys */
    float *blk;                /* QSA: [cap_tokens / r + 1][Di] block summaries (normed, roped) */
    int64_t n_blk;             /* summaries computed so far */
    float *S_slots;            /* GDN, KEEP_STATES windows: spec_max x S, the state after each token */
    float *conv_slots;         /* GDN: spec_max x conv, likewise */
    float *open;               /* GDN: an open chunk's rows (gdn_open_floats), or NULL */
    int64_t n_open;            /* GDN: rows held in open: the open chunk's rows so far (0: none open) */
} mdl_layer_state;

struct strata_session {
    strata_model *m;
    int64_t n_past;
    int64_t n_ctx;
    mdl_layer_state *ls;       /* [n_ls] = [hp.n_layer + hp.n_mtp] (state.c) */
    int32_t n_ls;              /* kept here: release must not read the model (it may be gone first) */
    const struct mdl_dk *dk;   /* m->dk, kept here for the same reason: the layers' state is its memory */
    float *ple_conv;           /* [(Kp-1)*n][hc*E] last normalised gated values, oldest first */
    int32_t ple_ctx[MDL_MAX_NGRAM];  /* last n-1 ids, oldest first */
    strata_ple_stats ple_stats[2];   /* [0] prefill, [1] decode steps; owned by the session's thread */
    int32_t *tokens;           /* [cap_tokens] the id behind each K/V row */
    int64_t cap_tokens;        /* rows the per-token caches hold now (state.c: they grow with use) */
    int64_t n_valid;           /* rows [0, n_valid) hold tokens[0, n_valid) consistently (>= n_past) */
    /* KEEP_STATES windows (spec.c): state after each token of the last such eval */
    int32_t spec_max;          /* slot count (0: none) */
    int64_t spec_start;        /* n_past before that eval; -1: no window to roll back into */
    int64_t spec_n;            /* its tokens */
    int spec_on;               /* set during that eval: the blocks fill the slots */
    int gdn_leave_open;        /* set during a step that more tokens of one evaluation follow (gdn.c) */
    int gdn_continues;         /* the last eval had STRATA_EVAL_CONTINUED: the next runs the chunked form */
    float *ple_conv_slots;     /* spec_max x PLE conv history */
    int32_t *ple_ctx_slots;    /* spec_max x MDL_MAX_NGRAM ids */
    /* the MTP block's cache is ls[hp.n_layer] (a QSA layer state) */
    /* scratch, sized for cap = n_ubatch tokens; blocks allocate their own temporaries */
    int64_t cap;
    float *X;                  /* cap x hc*E residual streams */
    float *u, *y;              /* cap x E */
    float *c;                  /* cap x hc inject factors */
    struct mdl_dsess *ds;      /* the device forward's work buffers (fwd_dev.c); NULL on the C forward */
};

/* The .scale of matrix mi of w (1 when the tensor has none). */
static inline float mdl_mat_scale(const mdl_mat *w, int64_t mi) {
    return w->scale ? w->scale[w->n_scale == 1 ? 0 : mi] : 1.0f;
}

/* ---------------------------------------------------------------- ops (ops.c) */

/* y[L x mat.rows] = mat(index `mi` for stacked tensors) x[L x mat.cols], times its .scale. */
strata_status mdl_matmul(const strata_model *m, const mdl_mat *w, int64_t mi, const float *x, int64_t L,
                         float *y);
/* The products of n matrices (index 0) with the same x [L x cols], ys[i] [L x ws[i].rows] each times
 * its .scale, in one pool job (and x quantized once for those that share its format): what n calls of
 * mdl_matmul compute, bit for bit, with one hand-off to the pool instead of n (or 2n). */
enum { MDL_MATMUL_SET_MAX = 8 };
strata_status mdl_matmul_set(const strata_model *m, const mdl_mat *const *ws, int n, const float *x, int64_t L,
                             float *const *ys);
/* One pool job of n jobs' tasks: fn(args[i], t, thread) for t < counts[i], for every i (the jobs of
 * several sequences' mixers, so a batched step hands the pool one job where it would hand n). */
strata_status mdl_pool_run_multi(strata_pool *pool, strata_task_fn fn, void *const *args, const int64_t *counts, int n);
/* y = x / sqrt(mean(x^2) + eps) * w, over n values (w may be NULL: no weight). */
void mdl_rmsnorm(const float *x, const float *w, int64_t n, float eps, float *y);
/* Grouped: the hc*E vector is hc groups of E, one RMS each; w has hc*E values. */
void mdl_group_rmsnorm(const float *x, const float *w, int64_t groups, int64_t n, float eps, float *y);
/* a·b with eight independent partial sums, reduced as strata_hsum8: a fixed order that the
 * compiler can vectorise (a plain running sum is a serial chain under strict IEEE rules). */
static inline float mdl_dot8(const float *a, const float *b, int64_t n) {
    float acc[8] = {0};
    int64_t e = 0;
    for (; e + 8 <= n; e += 8)
        for (int l = 0; l < 8; l++) acc[l] += a[e + l] * b[e + l];
    for (; e < n; e++) acc[e & 7] += a[e] * b[e];
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}
/* NeoX rotation of the first n_rot dims of x (pairs i, i + n_rot/2) by cos/sin[n_rot/2]. */
void mdl_rope(float *x, int32_t n_rot, const float *cs, const float *sn);
/* cos/sin of position pos for the n_rot/2 frequencies, as transformers computes them (fp32). */
void mdl_rope_angles(float theta, int32_t n_rot, int64_t pos, float *cs, float *sn);

/* ---------------------------------------------------------------- blocks */

/* hc.c: read of the streams X[L x hc*E] -> u[L x E] (mean of gated normalised streams), c[L x hc]
 * (NULL for the final mixer: no inject). */
strata_status mdl_hc_read(const strata_model *m, const float *X, const float *norm, const mdl_mat *down,
                          const mdl_mat *up, const mdl_mat *inject, int64_t L, float *u, float *c);
/* X_j += c_j * y for every stream. */
void mdl_hc_write(const strata_model *m, float *X, const float *c, const float *y, int64_t L);

strata_status mdl_gdn(strata_session *s, int il, const float *u, int64_t L, float *y);
strata_status mdl_qsa(strata_session *s, int il, const float *u, int64_t L, float *y);
/* The mixer of layer il for n sequences whose rows are consecutive in u / y (Ls[i] rows of ss[i], R in
 * all): every projection and W_out is one product over the R rows, each sequence's conv, recurrence or
 * attention runs on its own state at its own n_past (the same bits as mdl_gdn / mdl_qsa alone). */
strata_status mdl_gdn_multi(strata_session *const *ss, const int64_t *Ls, int n, int il, const float *u, int64_t R,
                            float *y);
strata_status mdl_qsa_multi(strata_session *const *ss, const int64_t *Ls, int n, int il, const float *u, int64_t R,
                            float *y);
/* QSA of layer il's weights on any layer state, for rows at positions p0.. (mdl_qsa: the trunk's
 * cache s->ls[il] at s->n_past; the MTP head: its own cache s->ls[n_layer] at its pos0). */
strata_status mdl_qsa_at(strata_session *s, int il, mdl_layer_state *st, int64_t p0, const float *u, int64_t L,
                         float *y);
strata_status mdl_moe(strata_session *s, int il, const float *u, int64_t L, float *y);
/* The device forward's part of the MoE on the host: the routed experts of L rows of u (host) with the
 * device's routing pick / pw [L x K], through the offload engine and the CPU pool as mdl_moe runs them;
 * their output rows in slot order (mdl_route_group's, [L*K x E]) to out, skip [Ne] marks the skipped
 * experts (their rows are not written). The shared expert and the merge are the caller's. */
typedef struct {
    const int32_t *pick;
    const float *pw;
    float *out;
    int8_t *skip;
    /* dx / dout not NULL: the dense device's memory, which the expert device shares (model.expert_dev_io):
     * the device's groups read their rows of dx (the input in slot order) and write theirs to dout, the CPU
     * pool's stay in out. where [Ne]: MDL_ROWS_* of each expert, count [Ne + 1] the grouping's prefix sums. */
    const float *dx;
    float *dout;
    int8_t *where;
    int64_t *count;
} mdl_moe_ext;
enum { MDL_ROWS_NONE = 0, MDL_ROWS_HOST = 1, MDL_ROWS_DEVICE = 2 };
strata_status mdl_moe_experts(strata_session *s, int il, const float *u, int64_t L, const mdl_moe_ext *ext);
/* Adds PLE(X) to the streams of n sequences' tokens: sequence i's ids[i][0..Ls[i]) at its rows of
 * X[sum Ls x hc*E], one after the other. One gather serves them all; the key and value products run
 * over all the rows; the gate and conv on each one's own state. */
strata_status mdl_ple(strata_session *const *ss, const int32_t *const *ids, const int64_t *Ls, int n, int il,
                      float *X);
/* The same on the dense device (fwd_dev.c): dX [sum Ls x hc*E] the streams in m->dk's memory, the sessions'
 * ple_conv (and slots) there too; only the gathered packed rows are copied up. */
strata_status mdl_ple_dev(strata_session *const *ss, const int32_t *const *ids, const int64_t *Ls, int n, int il,
                          float *dX);
/* Optional: hands the step's n-gram gather to the PLE worker early (call it before layer 0 so
 * the gather overlaps it); mdl_ple submits itself when this was not called. */
strata_status mdl_ple_submit(strata_session *const *ss, const int32_t *const *ids, const int64_t *Ls, int n);
/* ple_layer.c, called by load.c: binds the table (GGUF tensor or strata.ple_external packed file),
 * opens the access layer and starts the worker; closes them. */
strata_status mdl_ple_bind(strata_model *m);
void mdl_ple_close(strata_model *m);

/* model.c: a model over an open GGUF, which it owns from here on (closed on failure too). */
strata_status mdl_model_open(strata_gguf *g, const strata_model_params *params, strata_model **out);

/* load.c: hyperparameters and weights (m->gguf, m->params set); release frees owned copies. */
strata_status mdl_model_load(strata_model *m);
void mdl_model_release(strata_model *m);
/* fn(w, arg) for every weight matrix of the model (unbound ones have t == NULL). */
void mdl_for_each_mat(strata_model *m, void (*fn)(mdl_mat *w, void *arg), void *arg);
/* load.c: the offload engine over descriptors of the trunk's routed experts (m->off; stays NULL on
 * the plain CPU path: device cpu without tail skip); close frees it (before the weights go). */
strata_status mdl_offload_open(strata_model *m);
void mdl_offload_close(strata_model *m);
/* The expert store (store.c, moe/xstore.h): with expert_io DIRECT (or AUTO choosing it) routed experts
 * are read into RAM slots on demand; m->xs stays NULL with mmap. */
strata_status mdl_store_open(strata_model *m);
void mdl_store_close(strata_model *m);

/* spec.c: the state after token t of a KEEP_STATES window goes to slot t */
static inline int mdl_spec_active(const strata_session *s) { return s->spec_on; }

/* An open GDN chunk (STRATA_EVAL_CONTINUED), up to 63 rows: their normalised k ([63][Gk*dk]), then per
 * value head [63] rows of U (before V'), W, V' and the running sum of g (gdn_open_head_row floats). */
static inline int64_t gdn_open_head_row(const mdl_hparams *h) { return 3 * (int64_t)h->ssm_dk + 1; }
static inline int64_t gdn_open_floats(const mdl_hparams *h) {
    return 63 * ((int64_t)h->ssm_gk * h->ssm_dk + (int64_t)h->ssm_gv * gdn_open_head_row(h));
}
/* Rows of the session's open GDN chunk (every GDN layer holds as many); 0 when none is open. */
int64_t mdl_gdn_open_rows(const strata_session *s);
void mdl_spec_release(strata_session *s);

/* ---------------------------------------------------------------- the forward on a device (fwd_dev.c) */

/* One sequence's part of a forward step: its L tokens sit at rows [r0, r0 + L) of the step's buffers;
 * the logits of its rows [row0, L) go to out (NULL: none), the pre-mixer streams of every row to
 * hidden (NULL: none). */
typedef struct {
    strata_session *s;
    const int32_t *ids;
    int64_t L, r0, row0;
    float *out, *hidden;
} mdl_fwd_seq;

/* model.c: the start of a step, shared by both forwards: hands the PLE gather to its worker and writes every
 * row's embedding, copied to the hc streams, into X [R x hc*E]. */
strata_status mdl_step_begin(const mdl_fwd_seq *q, int n, strata_session *const *ss, const int32_t *const *ids,
                             const int64_t *Ls, float *X);
/* At load (model.c, before the offload engine): picks where the dense forward runs (params.dense), and
 * on a device uploads the dense weights, fits the expert cache (params.cache_bytes STRATA_CACHE_AUTO, or
 * checks the one asked for) and writes device_log. m->dk stays NULL on the CPU. */
strata_status mdl_dense_open(strata_model *m);
void mdl_dense_close(strata_model *m);
/* One step of n sequences on the device: the C forward's contract (model.c forward); X [R x hc*E] and u
 * [R x E] are host buffers the step stages through (the embeddings, the MoE's input). */
strata_status mdl_forward_dev(mdl_fwd_seq *q, int n, float *X, float *u);
void mdl_dense_session_free(strata_session *s);
/* The bytes of dense weights and vectors uploaded at load (0 on the C forward). */
uint64_t mdl_dense_weight_bytes(const strata_model *m);
/* The device bytes of one session's state at n tokens (the trunk's GDN and QSA layers). */
uint64_t mdl_dense_state_bytes(const strata_model *m, int64_t n_tokens);

/* state.c: the memory of the session's state is s->dk's — the dense device's when the forward runs there
 * (every layer, the MTP block and the PLE history too), else the heap (dk NULL). Zeroed allocation; copies of
 * `kind` DK_* (memcpy on the heap). */
void *mdl_st_calloc(const struct mdl_dk *dk, size_t bytes);
void mdl_st_free(const struct mdl_dk *dk, void *p);
strata_status mdl_st_copy(const struct mdl_dk *dk, void *dst, const void *src, size_t bytes, int kind);

/* state.c */
strata_status mdl_session_alloc(strata_model *m, strata_session *s);
/* Room for n_tokens rows in every per-token cache (grows, never shrinks; NOMEM leaves the state). */
strata_status mdl_session_reserve(strata_session *s, int64_t n_tokens);
uint64_t mdl_state_bytes(const strata_model *m, int64_t n_ctx);
void mdl_session_release(strata_session *s);
void mdl_session_clear(strata_session *s);

#endif
