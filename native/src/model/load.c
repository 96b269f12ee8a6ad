/*
 * load.c — hyperparameters and weights of a qwen4exp GGUF (spec/qwen4exp-gguf.md §1-2).
 *
 * Every key is read with the type rules of llama.cpp's loader (any integer type for counts, a
 * scalar or a per-layer array where it allows one), every tensor's shape is checked against the
 * hyperparameters before a pointer into the mapping is kept, and every message names the key or
 * tensor. Small tensors (norms, conv taps, biases, NVFP4 `.scale`s) are decoded to owned floats
 * from whatever type the file stores them in.
 */
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#include "util/error.h"

#define ARCH "qwen4exp"

/* ---------------------------------------------------------------- metadata */

static int64_t scalar_int(const strata_gguf_value *v, int *ok) {
    const void *p = v->data;
    *ok = 1;
    switch (v->type) {
    case STRATA_GGUF_UINT8: return *(const uint8_t *)p;
    case STRATA_GGUF_INT8: return *(const int8_t *)p;
    case STRATA_GGUF_BOOL: return *(const uint8_t *)p != 0;
    case STRATA_GGUF_UINT16: { uint16_t x; memcpy(&x, p, 2); return x; }
    case STRATA_GGUF_INT16: { int16_t x; memcpy(&x, p, 2); return x; }
    case STRATA_GGUF_UINT32: { uint32_t x; memcpy(&x, p, 4); return x; }
    case STRATA_GGUF_INT32: { int32_t x; memcpy(&x, p, 4); return x; }
    case STRATA_GGUF_UINT64: { uint64_t x; memcpy(&x, p, 8); return (int64_t)x; }
    case STRATA_GGUF_INT64: { int64_t x; memcpy(&x, p, 8); return x; }
    default: *ok = 0; return 0;
    }
}

static strata_status find(const strata_gguf *g, const char *key, strata_gguf_value *v) {
    int64_t i;
    if (strata_gguf_find_kv(g, key, &i) != STRATA_OK) return STRATA_ERR_NOT_FOUND;
    const char *k;
    uint64_t kl;
    return strata_gguf_kv(g, i, &k, &kl, v);
}

/* Integer key: scalar of any integer type, or an array whose first element is taken (llama.cpp
 * accepts per-layer arrays for head counts). `req` 0: absent leaves *out unchanged. */
static strata_status kv_int(const strata_gguf *g, const char *name, int req, int64_t *out) {
    char key[160];
    snprintf(key, sizeof key, "%s%s", strncmp(name, "general.", 8) && strncmp(name, "strata.", 7) ? ARCH "." : "", name);
    strata_gguf_value v;
    if (find(g, key, &v) != STRATA_OK) {
        if (req) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: required key %s is missing", key);
        return STRATA_OK;
    }
    int ok = 0;
    int64_t x = 0;
    if (v.type == STRATA_GGUF_ARRAY) {
        strata_gguf_value e;
        if (v.count > 0 && strata_gguf_array_get(g, &v, 0, &e) == STRATA_OK) x = scalar_int(&e, &ok);
    } else {
        x = scalar_int(&v, &ok);
    }
    if (!ok) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: key %s is not an integer", key);
    *out = x;
    return STRATA_OK;
}

static strata_status kv_f32(const strata_gguf *g, const char *name, int req, float *out) {
    char key[160];
    snprintf(key, sizeof key, ARCH ".%s", name);
    strata_gguf_value v;
    if (find(g, key, &v) != STRATA_OK) {
        if (req) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: required key %s is missing", key);
        return STRATA_OK;
    }
    if (v.type == STRATA_GGUF_FLOAT32) memcpy(out, v.data, 4);
    else if (v.type == STRATA_GGUF_FLOAT64) { double d; memcpy(&d, v.data, 8); *out = (float)d; }
    else return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: key %s is not a float", key);
    return STRATA_OK;
}

/* Array of integers (any integer element type) into out[0..n); *n_out = element count.
 * Absent: *n_out = -1. A scalar counts as a one-element array. */
static strata_status kv_int_array(const strata_gguf *g, const char *name, int64_t *out, int64_t cap,
                                  int64_t *n_out) {
    char key[160];
    snprintf(key, sizeof key, ARCH ".%s", name);
    strata_gguf_value v;
    *n_out = -1;
    if (find(g, key, &v) != STRATA_OK) return STRATA_OK;
    int ok = 1;
    if (v.type != STRATA_GGUF_ARRAY) {
        if (cap < 1) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: key %s: too many values", key);
        out[0] = scalar_int(&v, &ok);
        *n_out = 1;
    } else {
        if ((int64_t)v.count > cap)
            return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: key %s has %llu values, at most %lld expected",
                               key, (unsigned long long)v.count, (long long)cap);
        for (uint64_t i = 0; i < v.count && ok; i++) {
            strata_gguf_value e;
            if (strata_gguf_array_get(g, &v, i, &e) != STRATA_OK) ok = 0;
            else out[i] = scalar_int(&e, &ok);
        }
        *n_out = (int64_t)v.count;
    }
    if (!ok) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: key %s must hold integers", key);
    return STRATA_OK;
}

/* ---------------------------------------------------------------- tensors */

static int tensor(const strata_model *m, const char *name, strata_gguf_tensor *t) {
    int64_t i;
    if (strata_gguf_find_tensor(m->gguf, name, &i) != STRATA_OK) return 0;
    return strata_gguf_tensor_info(m->gguf, i, t) == STRATA_OK;
}

static int64_t nelem(const strata_gguf_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->n_dims; d++) n *= t->ne[d];
    return n;
}

/* Decodes a whole (small) tensor of n values into a new float array. */
static strata_status read_floats(const strata_gguf_tensor *t, const char *name, int64_t n, float **out) {
    const strata_qtraits *q = strata_qtraits_get(t->type);
    if (!q || !q->dequant[0])
        return strata_fail(STRATA_ERR_UNSUPPORTED, "tensor %s: type %d cannot be decoded", name, t->type);
    if (nelem(t) != n)
        return strata_fail(STRATA_ERR_FORMAT, "tensor %s has %lld values, expected %lld", name,
                           (long long)nelem(t), (long long)n);
    if (n % q->block_size)
        return strata_fail(STRATA_ERR_FORMAT, "tensor %s: %lld values is not a whole number of %s blocks",
                           name, (long long)n, q->name);
    if (t->size != (uint64_t)(n / q->block_size) * (uint64_t)q->type_size)
        return strata_fail(STRATA_ERR_FORMAT, "tensor %s: data size %llu does not match its shape", name,
                           (unsigned long long)t->size);
    float *f = malloc((size_t)n * sizeof(float));
    if (!f) return strata_fail(STRATA_ERR_NOMEM, "tensor %s: no memory for %lld floats", name, (long long)n);
    q->dequant[0](t->data, f, n);
    *out = f;
    return STRATA_OK;
}

typedef struct {
    strata_model *m;
    char name[160];
} loader;

/* The routed experts' tensors: the one place their names are spelled (the offload engine gets
 * descriptors, mdl_offload_open below). */
static const char EXP_GATE_UP[] = "blk.%d.ffn_gate_up_exps.weight";
static const char EXP_GATE[] = "blk.%d.ffn_gate_exps.weight";
static const char EXP_UP[] = "blk.%d.ffn_up_exps.weight";
static const char EXP_DOWN[] = "blk.%d.ffn_down_exps.weight";

static const char *nm(loader *ld, const char *fmt, int il) {
    if (il >= 0) snprintf(ld->name, sizeof ld->name, fmt, il);
    else snprintf(ld->name, sizeof ld->name, "%s", fmt);
    return ld->name;
}

/* 1-D (or squeezed) vector of n floats; required. */
static strata_status vec(loader *ld, const char *fmt, int il, int64_t n, float **out) {
    const char *name = nm(ld, fmt, il);
    strata_gguf_tensor t;
    if (!tensor(ld->m, name, &t)) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: tensor %s is missing", name);
    return read_floats(&t, name, n, out);
}

/* Matrix ne = {cols, rows[, n_mat]}, any type with kernels; plus its optional `.scale`. */
static strata_status mat(loader *ld, const char *fmt, int il, int64_t cols, int64_t rows, int64_t n_mat,
                         mdl_mat *w) {
    const char *name = nm(ld, fmt, il);
    strata_gguf_tensor t;
    if (!tensor(ld->m, name, &t)) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: tensor %s is missing", name);
    const int64_t want[3] = {cols, rows, n_mat};
    int dims_ok = t.ne[0] == cols && t.ne[1] == rows && t.ne[2] == n_mat && t.ne[3] == 1;
    if (!dims_ok)
        return strata_fail(STRATA_ERR_FORMAT,
                           "tensor %s has shape {%lld, %lld, %lld, %lld}, expected {%lld, %lld, %lld} from the hyperparameters",
                           name, (long long)t.ne[0], (long long)t.ne[1], (long long)t.ne[2], (long long)t.ne[3],
                           (long long)want[0], (long long)want[1], (long long)want[2]);
    const strata_qtraits *q = strata_qtraits_get(t.type);
    if (!q || !q->vec_dot[0])
        return strata_fail(STRATA_ERR_UNSUPPORTED, "tensor %s: type %d has no matmul kernel in Strata", name, t.type);
    if (cols % q->block_size)
        return strata_fail(STRATA_ERR_FORMAT, "tensor %s: rows of %lld values do not fit %s blocks of %d",
                           name, (long long)cols, q->name, q->block_size);
    if (q->act == STRATA_ACT_Q8_256 && cols % QK_K)
        return strata_fail(STRATA_ERR_FORMAT, "tensor %s: %s needs rows of a multiple of 256", name, q->name);
    memset(w, 0, sizeof *w);
    w->data = t.data;
    w->t = q;
    w->rows = rows;
    w->cols = cols;
    w->n_mat = n_mat;
    w->row_bytes = (size_t)(cols / q->block_size) * (size_t)q->type_size;
    w->mat_bytes = w->row_bytes * (size_t)rows;
    if (t.size != (uint64_t)w->mat_bytes * (uint64_t)n_mat)
        return strata_fail(STRATA_ERR_FORMAT, "tensor %s: data size %llu does not match its shape", name,
                           (unsigned long long)t.size);
    ld->m->weight_bytes += t.size;
    /* NVFP4 per-tensor scale: X.weight -> X.scale */
    char sname[176];
    size_t len = strlen(name);
    if (len > 7 && !strcmp(name + len - 7, ".weight")) {
        snprintf(sname, sizeof sname, "%.*s.scale", (int)(len - 7), name);
        strata_gguf_tensor st;
        if (tensor(ld->m, sname, &st)) {
            const int64_t ns = nelem(&st);
            if (ns != 1 && ns != n_mat)
                return strata_fail(STRATA_ERR_FORMAT, "tensor %s has %lld values, expected 1 or %lld", sname,
                                   (long long)ns, (long long)n_mat);
            float *f;
            strata_status rc = read_floats(&st, sname, ns, &f);
            if (rc) return rc;
            w->scale = f;
            w->n_scale = ns;
        }
    }
    return STRATA_OK;
}

static void mat_free(mdl_mat *w) { free((void *)w->scale); }

void mdl_for_each_mat(strata_model *m, void (*fn)(mdl_mat *w, void *arg), void *arg) {
    for (int il = 0; m->layers && il < m->hp.n_layer + m->hp.n_mtp; il++) {
        mdl_layer *l = &m->layers[il];
        for (int k = 0; k < 2; k++) { fn(&l->hc_down[k], arg); fn(&l->hc_up[k], arg); fn(&l->hc_inject[k], arg); }
        mdl_mat *mats[] = {&l->ssm_qkv, &l->ssm_z, &l->ssm_beta, &l->ssm_alpha, &l->ssm_out, &l->attn_q,
                           &l->attn_k, &l->attn_v, &l->attn_o, &l->idx_q, &l->idx_k, &l->router, &l->exp_gate,
                           &l->exp_up, &l->exp_down, &l->sh_gate, &l->sh_up, &l->sh_down, &l->ple_key,
                           &l->ple_value};
        for (size_t k = 0; k < sizeof mats / sizeof mats[0]; k++) fn(mats[k], arg);
    }
    mdl_mat *top[] = {&m->output, &m->mtp_eh_proj, &m->mtp_head_down, &m->mtp_head_up, &m->out_hc_down,
                      &m->out_hc_up};
    for (size_t k = 0; k < sizeof top / sizeof top[0]; k++) fn(top[k], arg);
}

static void free_mat(mdl_mat *w, void *arg) { (void)arg; mat_free(w); }

void mdl_model_release(strata_model *m) {
    mdl_for_each_mat(m, free_mat, NULL);
    for (int il = 0; m->layers && il < m->hp.n_layer + m->hp.n_mtp; il++) {
        mdl_layer *l = &m->layers[il];
        for (int k = 0; k < 2; k++) free(l->hc_norm[k]);
        float *vs[] = {l->ssm_conv, l->ssm_dt_bias, l->ssm_a, l->ssm_norm, l->attn_q_norm, l->attn_k_norm,
                       l->idx_q_norm, l->idx_k_norm, l->sh_inp_gate, l->ple_norm_key, l->ple_norm_query,
                       l->ple_norm_conv, l->ple_conv};
        for (size_t k = 0; k < sizeof vs / sizeof vs[0]; k++) free(vs[k]);
    }
    free(m->mtp_enorm); free(m->mtp_hnorm); free(m->mtp_head_norm);
    free(m->out_hc_norm);
    mdl_ple_close(m);
    free(m->layers);
    m->layers = NULL;
}

/* ---------------------------------------------------------------- hyperparameters */

#define TRY(x) do { strata_status rc_ = (x); if (rc_) return rc_; } while (0)
/* every such value is then kept as an int32_t: one past INT32_MAX would turn negative and slip past the
 * checks that follow (a fuzzed expert_used_count of 2^31 + 2 made the MoE layer allocate -40 GB) */
#define POSITIVE(v, key) do { if ((v) <= 0 || (v) > INT32_MAX) return strata_fail(STRATA_ERR_FORMAT, \
    "qwen4exp model: %s." key " must be positive and below 2^31 (got %lld)", ARCH, (long long)(v)); } while (0)

/* Values of an integer array key (1 for a scalar, 0 when absent): what kv_int_array needs room for. */
static int64_t kv_array_len(const strata_gguf *g, const char *name) {
    char key[160];
    snprintf(key, sizeof key, ARCH ".%s", name);
    strata_gguf_value v;
    if (find(g, key, &v) != STRATA_OK) return 0;
    return v.type == STRATA_GGUF_ARRAY ? (int64_t)v.count : 1;
}

/* Fills m->hp and allocates m->layers ([n_layer + n_mtp], each layer's is_qsa and ratio set);
 * arr has room for cap values of any per-layer array key. */
static strata_status read_hparams_in(strata_model *m, int64_t *arr, int64_t cap) {
    const strata_gguf *g = m->gguf;
    mdl_hparams *h = &m->hp;
    strata_gguf_value v;
    if (find(g, "general.architecture", &v) != STRATA_OK || v.type != STRATA_GGUF_STRING)
        return strata_fail(STRATA_ERR_FORMAT, "model: general.architecture is missing");
    if (v.count != strlen(ARCH) || memcmp(v.data, ARCH, v.count))
        return strata_fail(STRATA_ERR_UNSUPPORTED, "model architecture is '%.*s'; Strata runs '" ARCH "' only",
                           (int)(v.count > 64 ? 64 : v.count), (const char *)v.data);
    int64_t x;
    x = 0; TRY(kv_int(g, "embedding_length", 1, &x)); POSITIVE(x, "embedding_length"); h->n_embd = x;
    x = 0; TRY(kv_int(g, "block_count", 1, &x)); POSITIVE(x, "block_count");
    int64_t nextn = 0;
    TRY(kv_int(g, "nextn_predict_layers", 0, &nextn));
    if (nextn < 0 || nextn >= x) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: nextn_predict_layers %lld out of range", (long long)nextn);
    if (nextn > 1)
        return strata_fail(STRATA_ERR_UNSUPPORTED, "qwen4exp model: nextn_predict_layers %lld; Strata runs one MTP block "
                           "(the released checkpoint has one): convert with one MTP layer or with --no-mtp", (long long)nextn);
    x -= nextn;
    if (x + nextn > INT32_MAX / 2) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: block_count %lld", (long long)(x + nextn));
    /* every block holds tensors of its own: a count past the tensor table is a damaged header, refused
     * before the per-block arrays are allocated for it */
    if (x + nextn > strata_gguf_n_tensors(g))
        return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: block_count %lld but the file holds %lld tensors: "
                           "the header is damaged or the file is cut short; convert it again",
                           (long long)(x + nextn), (long long)strata_gguf_n_tensors(g));
    h->n_layer = (int32_t)x;
    h->n_mtp = (int32_t)nextn;
    /* the MTP block, when present, is layers[n_layer]: one more block */
    m->layers = calloc((size_t)(h->n_layer + h->n_mtp), sizeof *m->layers);
    if (!m->layers) return strata_fail(STRATA_ERR_NOMEM, "qwen4exp model: no memory for %d layers", h->n_layer + h->n_mtp);
    x = 4096; TRY(kv_int(g, "context_length", 0, &x)); h->n_ctx_train = x;
    x = 0; TRY(kv_int(g, "attention.head_count", 1, &x)); POSITIVE(x, "attention.head_count"); h->n_head = (int32_t)x;
    x = 0; TRY(kv_int(g, "attention.head_count_kv", 1, &x)); POSITIVE(x, "attention.head_count_kv"); h->n_head_kv = (int32_t)x;
    if (h->n_head % h->n_head_kv)
        return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: head_count %d is not a multiple of head_count_kv %d", h->n_head, h->n_head_kv);
    x = h->n_embd / h->n_head; TRY(kv_int(g, "attention.key_length", 0, &x)); POSITIVE(x, "attention.key_length"); h->head_dim = (int32_t)x;
    int64_t vl = h->head_dim;
    TRY(kv_int(g, "attention.value_length", 0, &vl));
    if (vl != h->head_dim) return strata_fail(STRATA_ERR_UNSUPPORTED, "qwen4exp model: value_length %lld != key_length %d", (long long)vl, h->head_dim);
    TRY(kv_f32(g, "attention.layer_norm_rms_epsilon", 1, &h->eps));
    h->rope_theta = 10000.0f;
    TRY(kv_f32(g, "rope.freq_base", 0, &h->rope_theta));
    x = h->head_dim; TRY(kv_int(g, "rope.dimension_count", 0, &x));
    if (x <= 0 || x > h->head_dim || x % 2) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: rope.dimension_count %lld invalid for head dim %d", (long long)x, h->head_dim);
    h->n_rot = (int32_t)x;
    x = 0; TRY(kv_int(g, "expert_count", 1, &x)); POSITIVE(x, "expert_count"); h->n_expert = (int32_t)x;
    x = 0; TRY(kv_int(g, "expert_used_count", 1, &x)); POSITIVE(x, "expert_used_count"); h->n_expert_used = (int32_t)x;
    if (h->n_expert_used > h->n_expert) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: expert_used_count > expert_count");
    x = 0; TRY(kv_int(g, "expert_feed_forward_length", 1, &x)); POSITIVE(x, "expert_feed_forward_length"); h->ff_exp = (int32_t)x;
    x = 0; TRY(kv_int(g, "expert_shared_feed_forward_length", 1, &x)); POSITIVE(x, "expert_shared_feed_forward_length"); h->ff_shexp = (int32_t)x;
    x = 0; TRY(kv_int(g, "ssm.conv_kernel", 1, &x)); POSITIVE(x, "ssm.conv_kernel"); h->ssm_kc = (int32_t)x;
    x = 0; TRY(kv_int(g, "ssm.state_size", 1, &x)); POSITIVE(x, "ssm.state_size"); h->ssm_dk = (int32_t)x;
    x = 0; TRY(kv_int(g, "ssm.group_count", 1, &x)); POSITIVE(x, "ssm.group_count"); h->ssm_gk = (int32_t)x;
    x = 0; TRY(kv_int(g, "ssm.time_step_rank", 1, &x)); POSITIVE(x, "ssm.time_step_rank"); h->ssm_gv = (int32_t)x;
    if (h->ssm_gv % h->ssm_gk) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: ssm.time_step_rank %d is not a multiple of ssm.group_count %d", h->ssm_gv, h->ssm_gk);
    x = 0; TRY(kv_int(g, "ssm.inner_size", 1, &x));
    if (x != (int64_t)h->ssm_gv * h->ssm_dk) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: ssm.inner_size %lld != time_step_rank x state_size", (long long)x);
    x = 0; TRY(kv_int(g, "hyper_connection.count", 1, &x));
    if (x < 2 || x > 64) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: hyper_connection.count %lld (must be 2..64)", (long long)x);
    h->hc = (int32_t)x;
    x = 0; TRY(kv_int(g, "hyper_connection.low_rank", 1, &x)); POSITIVE(x, "hyper_connection.low_rank"); h->hc_rank = (int32_t)x;
    x = 0; TRY(kv_int(g, "attention.indexer.head_count", 1, &x)); POSITIVE(x, "attention.indexer.head_count"); h->idx_heads = (int32_t)x;
    x = 0; TRY(kv_int(g, "attention.indexer.key_length", 1, &x)); POSITIVE(x, "attention.indexer.key_length"); h->idx_dim = (int32_t)x;
    if (h->idx_dim < h->n_rot) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: indexer key_length %d < rope dimension %d", h->idx_dim, h->n_rot);
    x = 0; TRY(kv_int(g, "attention.indexer.top_k", 1, &x)); POSITIVE(x, "attention.indexer.top_k"); h->idx_budget = (int32_t)x;

    /* layer kinds: recurrent_layers (true = GDN), else the interval rule */
    int64_t n;
    TRY(kv_int_array(g, "attention.recurrent_layers", arr, cap, &n));
    int64_t interval = 4;
    TRY(kv_int(g, "full_attention_interval", 0, &interval));
    if (interval <= 0) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: full_attention_interval must be positive");
    for (int il = 0; il < h->n_layer; il++) {
        if (n >= 0) {
            if (n < h->n_layer) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: attention.recurrent_layers has %lld entries for %d layers", (long long)n, h->n_layer);
            m->layers[il].is_qsa = arr[il] == 0;
        } else {
            m->layers[il].is_qsa = (il + 1) % interval == 0;
        }
    }
    TRY(kv_int_array(g, "attention.compress_ratios", arr, cap, &n));
    for (int il = 0; il < h->n_layer; il++) {
        int64_t r = n < 0 ? 0 : n == 1 ? arr[0] : il < n ? arr[il] : 0;
        if (r < 0 || r > 1 << 20) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: compress ratio %lld of layer %d", (long long)r, il);
        if (r > 0 && h->idx_budget % r)
            return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: indexer top_k %d is not a multiple of compress ratio %lld (layer %d)", h->idx_budget, (long long)r, il);
        m->layers[il].ratio = (int32_t)r;   /* (load_layer keeps it for QSA layers only) */
    }
    if (h->n_mtp) {
        /* the MTP block is always QSA (spec/qwen4exp-mtp.md §2.2); its ratio is the array's entry
         * n_layer as written (0 is resolved in load_all, where the tensors are known) */
        const int il = h->n_layer;
        int64_t r = n < 0 ? 0 : n == 1 ? arr[0] : il < n ? arr[il] : 0;
        if (r < 0 || r > 1 << 20) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: compress ratio %lld of the MTP block %d", (long long)r, il);
        m->layers[il].is_qsa = 1;
        m->layers[il].ratio = (int32_t)r;
    }

    /* GDN output-gate activation: our key; absent = sigmoid (the real checkpoint's value) */
    h->gate_sigmoid = 1;
    if (find(g, "strata.gdn_output_gate", &v) == STRATA_OK) {
        if (v.type != STRATA_GGUF_STRING) return strata_fail(STRATA_ERR_FORMAT, "strata.gdn_output_gate must be a string");
        if (v.count == 4 && !memcmp(v.data, "silu", 4)) h->gate_sigmoid = 0;
        else if (!(v.count == 7 && !memcmp(v.data, "sigmoid", 7)))
            return strata_fail(STRATA_ERR_FORMAT, "strata.gdn_output_gate is '%.*s'; expected sigmoid or silu",
                               (int)(v.count > 32 ? 32 : v.count), (const char *)v.data);
    }

    /* PLE */
    h->ple_layer = -1;
    TRY(kv_int_array(g, "ple.layers", arr, cap, &n));
    if (n > 1) return strata_fail(STRATA_ERR_UNSUPPORTED, "qwen4exp model: %lld PLE layers; one is supported (as llama.cpp)", (long long)n);
    if (n == 1) {
        if (arr[0] < 0 || arr[0] >= h->n_layer || m->layers[arr[0]].is_qsa)
            return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: PLE layer %lld must be a GDN layer", (long long)arr[0]);
        h->ple_layer = (int32_t)arr[0];
        x = 0; TRY(kv_int(g, "ple.ngram_size", 1, &x));
        if (x < 2 || x > MDL_MAX_NGRAM) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: ple.ngram_size %lld (must be 2..%d)", (long long)x, MDL_MAX_NGRAM);
        h->ple_n = (int32_t)x;
        x = 0; TRY(kv_int(g, "ple.heads_per_ngram", 1, &x));
        if (x <= 0 || (h->ple_n - 1) * x > MDL_MAX_PLE_HEADS) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: ple.heads_per_ngram %lld out of range", (long long)x);
        h->ple_heads_per = (int32_t)x;
        x = 0; TRY(kv_int(g, "ple.conv_kernel", 1, &x));
        if (x <= 0 || x > 64) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: ple.conv_kernel %lld out of range", (long long)x);
        h->ple_kp = (int32_t)x;
        x = -1; TRY(kv_int(g, "ple.eos_token_id", 1, &x)); h->ple_eos = x;
        x = 0; TRY(kv_int(g, "embedding_length_per_layer_input", 1, &x)); POSITIVE(x, "embedding_length_per_layer_input"); h->ple_row_dim = (int32_t)x;
        const int nh = (h->ple_n - 1) * h->ple_heads_per;
        if ((int64_t)nh * h->ple_row_dim != h->n_embd)
            return strata_fail(STRATA_ERR_UNSUPPORTED, "qwen4exp model: PLE heads x row width (%d x %d) must equal the hidden size %lld",
                               nh, h->ple_row_dim, (long long)h->n_embd);
        int64_t vals[MDL_MAX_PLE_HEADS];
        TRY(kv_int_array(g, "ple.layer_multipliers", vals, MDL_MAX_PLE_HEADS, &n));
        if (n < h->ple_n) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: ple.layer_multipliers needs %d values", h->ple_n);
        for (int i = 0; i < h->ple_n; i++) h->ple_mult[i] = (uint64_t)vals[i];
        TRY(kv_int_array(g, "ple.head_offsets", vals, MDL_MAX_PLE_HEADS, &n));
        if (n < nh) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: ple.head_offsets needs %d values", nh);
        for (int i = 0; i < nh; i++) h->ple_off[i] = (uint64_t)vals[i];
        TRY(kv_int_array(g, "ple.head_vocab_sizes", vals, MDL_MAX_PLE_HEADS, &n));
        if (n < nh) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: ple.head_vocab_sizes needs %d values", nh);
        for (int i = 0; i < nh; i++) {
            h->ple_size[i] = (uint64_t)vals[i];
            if (h->ple_size[i] == 0 || h->ple_off[i] > (uint64_t)INT32_MAX || h->ple_size[i] > (uint64_t)INT32_MAX - h->ple_off[i])
                return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: PLE head %d: offset %llu + size %llu out of range",
                                   i, (unsigned long long)h->ple_off[i], (unsigned long long)h->ple_size[i]);
        }
    }
    return STRATA_OK;
}

/* ---------------------------------------------------------------- tensors */

static strata_status load_hc(loader *ld, const char *which, int il, float **norm, mdl_mat *down, mdl_mat *up,
                             mdl_mat *inject) {
    const mdl_hparams *h = &ld->m->hp;
    const int64_t W = (int64_t)h->hc * h->n_embd;
    char f[96];
    snprintf(f, sizeof f, il >= 0 ? "blk.%%d.hc_%s_norm.weight" : "output_hc_norm.weight", which);
    TRY(vec(ld, f, il, W, norm));
    snprintf(f, sizeof f, il >= 0 ? "blk.%%d.hc_%s_down.weight" : "output_hc_down.weight", which);
    TRY(mat(ld, f, il, W, h->hc_rank, 1, down));
    snprintf(f, sizeof f, il >= 0 ? "blk.%%d.hc_%s_up.weight" : "output_hc_up.weight", which);
    TRY(mat(ld, f, il, h->hc_rank, W, 1, up));
    if (inject) {
        snprintf(f, sizeof f, "blk.%%d.hc_%s_inject.weight", which);
        TRY(mat(ld, f, il, W, h->hc, 1, inject));
    }
    return STRATA_OK;
}

static strata_status load_layer(loader *ld, int il) {
    strata_model *m = ld->m;
    const mdl_hparams *h = &m->hp;
    mdl_layer *l = &m->layers[il];
    const int is_qsa = l->is_qsa, ratio = l->ratio;   /* read_hparams' */
    l->ratio = 0;
    const int64_t E = h->n_embd;
    TRY(load_hc(ld, "attn", il, &l->hc_norm[0], &l->hc_down[0], &l->hc_up[0], &l->hc_inject[0]));
    TRY(load_hc(ld, "ffn", il, &l->hc_norm[1], &l->hc_down[1], &l->hc_up[1], &l->hc_inject[1]));
    l->is_qsa = is_qsa;
    if (is_qsa) {
        const int64_t hd = h->head_dim;
        TRY(mat(ld, "blk.%d.attn_q.weight", il, E, 2 * h->n_head * hd, 1, &l->attn_q));
        TRY(mat(ld, "blk.%d.attn_k.weight", il, E, h->n_head_kv * hd, 1, &l->attn_k));
        TRY(mat(ld, "blk.%d.attn_v.weight", il, E, h->n_head_kv * hd, 1, &l->attn_v));
        TRY(mat(ld, "blk.%d.attn_output.weight", il, h->n_head * hd, E, 1, &l->attn_o));
        TRY(vec(ld, "blk.%d.attn_q_norm.weight", il, hd, &l->attn_q_norm));
        TRY(vec(ld, "blk.%d.attn_k_norm.weight", il, hd, &l->attn_k_norm));
        TRY(mat(ld, "blk.%d.indexer.q_proj.weight", il, E, (int64_t)h->idx_heads * h->idx_dim, 1, &l->idx_q));
        TRY(mat(ld, "blk.%d.indexer.k_proj.weight", il, E, h->idx_dim, 1, &l->idx_k));
        TRY(vec(ld, "blk.%d.indexer.q_norm.weight", il, h->idx_dim, &l->idx_q_norm));
        TRY(vec(ld, "blk.%d.indexer.k_norm.weight", il, h->idx_dim, &l->idx_k_norm));
        l->ratio = ratio;
    } else {
        const int64_t dk = h->ssm_dk, kd = (int64_t)h->ssm_gk * dk, vd = (int64_t)h->ssm_gv * dk;
        const int64_t conv_dim = 2 * kd + vd;
        TRY(mat(ld, "blk.%d.attn_qkv.weight", il, E, conv_dim, 1, &l->ssm_qkv));
        TRY(mat(ld, "blk.%d.attn_gate.weight", il, E, vd, 1, &l->ssm_z));
        TRY(mat(ld, "blk.%d.ssm_beta.weight", il, E, h->ssm_gv, 1, &l->ssm_beta));
        TRY(mat(ld, "blk.%d.ssm_alpha.weight", il, E, h->ssm_gv, 1, &l->ssm_alpha));
        TRY(vec(ld, "blk.%d.ssm_conv1d.weight", il, conv_dim * h->ssm_kc, &l->ssm_conv));
        TRY(vec(ld, "blk.%d.ssm_dt.bias", il, h->ssm_gv, &l->ssm_dt_bias));
        TRY(vec(ld, "blk.%d.ssm_a", il, h->ssm_gv, &l->ssm_a));
        TRY(vec(ld, "blk.%d.ssm_norm.weight", il, dk, &l->ssm_norm));
        TRY(mat(ld, "blk.%d.ssm_out.weight", il, vd, E, 1, &l->ssm_out));
    }
    /* MoE */
    const int64_t Ne = h->n_expert, Fe = h->ff_exp, Fs = h->ff_shexp;
    TRY(mat(ld, "blk.%d.ffn_gate_inp.weight", il, E, Ne, 1, &l->router));
    strata_gguf_tensor t;
    if (tensor(m, nm(ld, EXP_GATE_UP, il), &t)) {
        TRY(mat(ld, EXP_GATE_UP, il, E, 2 * Fe, Ne, &l->exp_gate));
        l->exp_fused = 1;
    } else {
        TRY(mat(ld, EXP_GATE, il, E, Fe, Ne, &l->exp_gate));
        TRY(mat(ld, EXP_UP, il, E, Fe, Ne, &l->exp_up));
    }
    TRY(mat(ld, EXP_DOWN, il, Fe, E, Ne, &l->exp_down));
    TRY(mat(ld, "blk.%d.ffn_gate_shexp.weight", il, E, Fs, 1, &l->sh_gate));
    TRY(mat(ld, "blk.%d.ffn_up_shexp.weight", il, E, Fs, 1, &l->sh_up));
    TRY(mat(ld, "blk.%d.ffn_down_shexp.weight", il, Fs, E, 1, &l->sh_down));
    TRY(vec(ld, "blk.%d.ffn_gate_inp_shexp.weight", il, E, &l->sh_inp_gate));
    /* PLE */
    if (il == h->ple_layer) {
        const int64_t W = (int64_t)h->hc * E;
        l->has_ple = 1;
        TRY(mat(ld, "blk.%d.ple_key.weight", il, E, W, 1, &l->ple_key));
        TRY(mat(ld, "blk.%d.ple_value.weight", il, E, E, 1, &l->ple_value));
        TRY(vec(ld, "blk.%d.ple_norm_key.weight", il, W, &l->ple_norm_key));
        TRY(vec(ld, "blk.%d.ple_norm_query.weight", il, W, &l->ple_norm_query));
        TRY(vec(ld, "blk.%d.ple_norm_conv.weight", il, W, &l->ple_norm_conv));
        TRY(vec(ld, "blk.%d.ple_conv1d.weight", il, W * h->ple_kp, &l->ple_conv));
    }
    return STRATA_OK;
}

/* The MTP block blk.{n_layer} (spec/qwen4exp-mtp.md §4): a trunk-named QSA + MoE block plus the
 * nextn.* fusion and head tensors. Its embedding and LM head are the trunk's; a file's optional
 * nextn.embed_tokens / nextn.shared_head_head (copies of them) are not read. */
static strata_status load_mtp(loader *ld) {
    strata_model *m = ld->m;
    const mdl_hparams *h = &m->hp;
    const int il = h->n_layer;
    const int64_t E = h->n_embd, W = (int64_t)h->hc * E;
    int32_t r = m->layers[il].ratio;   /* read_hparams' */
    strata_gguf_tensor t;
    if (r == 0 && tensor(m, nm(ld, "blk.%d.indexer.k_proj.weight", il), &t)) {
        /* upstream converters write 0 for the MTP block as a simplification (dense attention);
         * the reference runs QSA, so the block gets the trunk's ratio */
        for (int j = 0; j < h->n_layer && !r; j++)
            if (m->layers[j].is_qsa) r = m->layers[j].ratio;
        if (r > 0)
            fprintf(stderr, "strata: MTP block %d has compress ratio 0 in the file; using the trunk's QSA ratio %d "
                            "(the reference runs QSA in the MTP layer)\n", il, r);
    }
    if (r > 0 && h->idx_budget % r)
        return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: indexer top_k %d is not a multiple of compress ratio %d (MTP block %d)",
                           h->idx_budget, r, il);
    m->layers[il].is_qsa = 1;
    m->layers[il].ratio = r;
    TRY(load_layer(ld, il));
    TRY(vec(ld, "blk.%d.nextn.enorm.weight", il, E, &m->mtp_enorm));
    TRY(vec(ld, "blk.%d.nextn.hnorm.weight", il, W, &m->mtp_hnorm));
    TRY(mat(ld, "blk.%d.nextn.eh_proj.weight", il, 2 * E, E, 1, &m->mtp_eh_proj));
    /* {hc*E} or {E, hc} (some builds): the same values in the same order */
    TRY(vec(ld, "blk.%d.nextn.hc_head_norm.weight", il, W, &m->mtp_head_norm));
    TRY(mat(ld, "blk.%d.nextn.hc_head_down.weight", il, W, h->hc_rank, 1, &m->mtp_head_down));
    TRY(mat(ld, "blk.%d.nextn.hc_head_up.weight", il, h->hc_rank, W, 1, &m->mtp_head_up));
    return STRATA_OK;
}

static strata_status read_hparams(strata_model *m) {
    /* room for the longest per-layer array key (they are sized by the file, not by a limit) */
    static const char *const keys[] = {"attention.recurrent_layers", "attention.compress_ratios", "ple.layers"};
    int64_t cap = 1;
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        const int64_t n = kv_array_len(m->gguf, keys[k]);
        if (n > cap) cap = n;
    }
    int64_t *arr = malloc((size_t)cap * sizeof *arr);
    if (!arr) return strata_fail(STRATA_ERR_NOMEM, "qwen4exp model: no memory");
    const strata_status rc = read_hparams_in(m, arr, cap);
    free(arr);
    return rc;
}

static strata_status load_all(strata_model *m) {
    TRY(read_hparams(m));
    mdl_hparams *h = &m->hp;
    loader ld = {.m = m};
    strata_gguf_tensor t;
    if (!tensor(m, "token_embd.weight", &t)) return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: tensor token_embd.weight is missing");
    if (t.ne[0] != h->n_embd || t.ne[1] <= 0 || t.ne[2] != 1 || t.ne[3] != 1)
        return strata_fail(STRATA_ERR_FORMAT, "tensor token_embd.weight: first dimension %lld != embedding_length %lld",
                           (long long)t.ne[0], (long long)h->n_embd);
    m->tok_embd_t = strata_qtraits_get(t.type);
    if (!m->tok_embd_t || !m->tok_embd_t->dequant[0] || h->n_embd % m->tok_embd_t->block_size)
        return strata_fail(STRATA_ERR_UNSUPPORTED, "tensor token_embd.weight: type %d cannot be decoded in rows of %lld", t.type, (long long)h->n_embd);
    h->n_vocab = t.ne[1];
    m->tok_embd = t.data;
    m->tok_embd_row = (size_t)(h->n_embd / m->tok_embd_t->block_size) * (size_t)m->tok_embd_t->type_size;
    if (t.size != m->tok_embd_row * (uint64_t)h->n_vocab)
        return strata_fail(STRATA_ERR_FORMAT, "tensor token_embd.weight: data size does not match its shape");
    m->weight_bytes += t.size;
    if (tensor(m, "output.weight", &t)) TRY(mat(&ld, "output.weight", -1, h->n_embd, h->n_vocab, 1, &m->output));
    else TRY(mat(&ld, "token_embd.weight", -1, h->n_embd, h->n_vocab, 1, &m->output));  /* tied */
    TRY(load_hc(&ld, "", -1, &m->out_hc_norm, &m->out_hc_down, &m->out_hc_up, NULL));
    if (h->ple_layer >= 0) TRY(mdl_ple_bind(m));   /* ple_layer.c: table, access mode, worker */
    for (int il = 0; il < h->n_layer; il++) TRY(load_layer(&ld, il));
    if (h->n_mtp) TRY(load_mtp(&ld));
    return STRATA_OK;
}

strata_status mdl_model_load(strata_model *m) { return load_all(m); }

/* ---------------------------------------------------------------- the offload engine's view of the experts */

/* (offset, size, type) of an expert tensor: the expert pack's identity of the file. */
static strata_status expert_ident(const strata_model *m, const char *fmt, int il, off_tensor_id *id) {
    char name[96];
    snprintf(name, sizeof name, fmt, il);
    strata_gguf_tensor t;
    if (!tensor(m, name, &t)) return strata_fail(STRATA_ERR_INTERNAL, "expert tensor %s vanished", name);
    *id = (off_tensor_id){.offset = t.offset, .size = t.size, .type = (int32_t)t.type};
    return STRATA_OK;
}

strata_status mdl_offload_open(strata_model *m) {
    const strata_model_params *p = &m->params;
    const mdl_hparams *hp = &m->hp;
    m->off = NULL;
    if (p->device == STRATA_DEVICE_CPU && p->tail_skip <= 0) return STRATA_OK;   /* plain CPU: no engine */
    /* the trunk's layers only: the MTP block (layers[n_layer]) always takes the CPU pool */
    off_layer_desc *d = calloc((size_t)hp->n_layer, sizeof *d);
    if (!d) return strata_fail(STRATA_ERR_NOMEM, "offload: no memory");
    strata_status rc = STRATA_OK;
    for (int il = 0; il < hp->n_layer && !rc; il++) {
        const mdl_layer *l = &m->layers[il];
        off_layer_desc *x = &d[il];
        x->shape = (mdev_expert_shape){.tg = l->exp_gate.t, .tu = l->exp_fused ? NULL : l->exp_up.t, .td = l->exp_down.t,
                                       .E = hp->n_embd, .Fe = hp->ff_exp, .fused = l->exp_fused,
                                       .gate_bytes = l->exp_gate.mat_bytes,
                                       .up_bytes = l->exp_fused ? 0 : l->exp_up.mat_bytes,
                                       .down_bytes = l->exp_down.mat_bytes};
        x->gate = l->exp_gate.data;
        x->gate_stride = l->exp_gate.mat_bytes;
        x->up = l->exp_fused ? NULL : l->exp_up.data;
        x->up_stride = l->exp_fused ? 0 : l->exp_up.mat_bytes;
        x->down = l->exp_down.data;
        x->down_stride = l->exp_down.mat_bytes;
        x->gate_scale = l->exp_gate.scale;
        x->n_gate_scale = l->exp_gate.n_scale;
        x->up_scale = l->exp_fused ? NULL : l->exp_up.scale;
        x->n_up_scale = l->exp_fused ? 0 : l->exp_up.n_scale;
        if (l->exp_fused) rc = expert_ident(m, EXP_GATE_UP, il, &x->ident[x->n_ident++]);
        else {
            rc = expert_ident(m, EXP_GATE, il, &x->ident[x->n_ident++]);
            if (!rc) rc = expert_ident(m, EXP_UP, il, &x->ident[x->n_ident++]);
        }
        if (!rc) rc = expert_ident(m, EXP_DOWN, il, &x->ident[x->n_ident++]);
    }
    if (!rc) {
        const off_params op = {.device = p->device, .n_layer = hp->n_layer, .n_expert = hp->n_expert,
                               .n_expert_used = hp->n_expert_used, .cache_bytes = p->cache_bytes,
                               .pcie_frac = p->pcie_frac, .sim_link_gbps = p->sim_link_gbps,
                               .tail_skip = p->tail_skip, .n_staging = p->n_staging,
                               .adjust_interval = p->adjust_interval, .stream_min = p->prefill_stream_min,
                               .max_swaps = p->max_swaps, .isa = m->isa, .expert_pack = p->expert_pack,
                               .no_swaps = m->xs != NULL, .split = p->split,
                               .sync_swaps = p->sync_swaps};
        rc = off_create(&op, d, &m->off);
    }
    free(d);
    return rc;
}

void mdl_offload_close(strata_model *m) {
    off_free(m->off);
    m->off = NULL;
}
