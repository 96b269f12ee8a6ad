/*
 * ple_layer.c — the per-layer hashed n-gram embedding (spec §6), applied to the residual streams at
 * the start of its layer, and the binding of its table (DESIGN §6).
 *
 * Ids: the history is the session's last n-1 ids (eos0 at sequence start) followed by the new
 * ids. For shift s ≥ 1 a token reads its s-th predecessor unless an eos0 lies at or after it
 * (walking back from the token), in which case it reads eos0. Order m (2..n) hashes
 * XOR_{s<m} shifted_s · mult_s (uint64; products stay below 2^63), head h of order m takes
 * row (hash mod size_h) + offset_h of the table.
 * Then: key = G(W_key emb), val = W_val emb, qry = G(X), per stream s = key·qry / sqrt(E),
 * g = sign(s) sqrt(max(|s|, 1e-6)), gv = σ(g) val; gvn = G(gv); conv = silu(dilated causal
 * depthwise conv of gvn, Kp taps n apart, history from the session); X += gv + conv.
 *
 * The table: per_layer_token_embd.weight in place (any row type), or, when the GGUF has the key
 * strata.ple_external, a packed NVFP4 file from `strata pack-ple` (90-byte rows for 160 values)
 * whose JSON sidecar (<file>.json) is checked against the file and the model first. The hashing
 * and the gather run on the PLE worker (ple/ple.h: access modes, prefetch, the sequence-number
 * handshake); only packed rows come back, and the cpu device dequantizes them here, on the model
 * thread, with the same row functions as before, so the numbers do not depend on the mode.
 *
 * On the dense device (mdl_ple_dev, the device forward's PLE layer): the same worker gathers, and only
 * the packed rows (and, for the packed NVFP4 table, their row ids) are copied up; the dequantization, the
 * products, the gate and the conv run on the device (kernels/cuda/ple.cuh), on each session's conv
 * history in the device's memory (state.c allocates s->ple_conv there when the session's s->dk is set).
 */
#include "fwd_dev.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/ple.h"
#include "ple/ple.h"
#include "util/error.h"

/* The PLE layer's settings as the table layer takes them: the ple_* fields of strata_model_params
 * (pyrunner/settings.py reads STRATA_PLE_* into those; nothing below reads the environment). */
static ple_params ple_params_of(const strata_model_params *mp) {
    ple_params p = ple_default_params();
    p.madv_random = mp->ple_madv_random != 0;
    p.prefetch = mp->ple_prefetch != 0;
    if (mp->ple_step_timeout_s > 0) p.step_timeout_s = mp->ple_step_timeout_s;
    p.test_stall_ms = mp->ple_test_stall_ms;
    p.test_stall_at = mp->ple_test_stall_at;
    p.cache_bytes = mp->ple_cache_bytes;
    return p;
}

struct mdl_ple_engine {
    ple_table table;
    ple_hash hash;
    ple_worker worker;
    int external;               /* packed NVFP4 rows; else rows of m->ple_table_t */
    float *gscale;              /* packed NVFP4: weight_scale_2 of each shard */
    int64_t n_shard, shard_rows;/* rows of every shard but the last (which may be shorter) */
    /* gscale [n_shard] in the dense device's memory: uploaded by the first mdl_ple_dev (under the worker's
     * channel, so one thread does it), freed at close with the table it came from: mdl_ple_close runs after
     * mdl_dense_close has cleared m->dk, and the device tables are static, so the pointer stays valid */
    float *dgscale;
    const mdl_dk *dgscale_dk;
};

/* ---------------------------------------------------------------- binding */

static strata_status read_file_text(const char *path, char **out) {
    FILE *f = fopen(path, "rb");
    if (!f) return strata_fail(STRATA_ERR_IO, "PLE table sidecar %s cannot be opened; it is written next to the table by "
                               "`strata pack-ple`", path);
    const size_t cap = 16u << 20;                      /* a sidecar of 16 MiB holds a million shards */
    char *buf = malloc(cap);
    size_t n = buf ? fread(buf, 1, cap - 1, f) : 0;
    fclose(f);
    if (!buf) return strata_fail(STRATA_ERR_NOMEM, "PLE: no memory");
    buf[n] = 0;
    *out = buf;
    return STRATA_OK;
}

static int gguf_str(const strata_gguf *g, const char *key, char *out, size_t n) {
    int64_t i;
    const char *k;
    uint64_t kl;
    strata_gguf_value v;
    if (strata_gguf_find_kv(g, key, &i) || strata_gguf_kv(g, i, &k, &kl, &v) || v.type != STRATA_GGUF_STRING) return 0;
    if (v.count + 1 > n) return 0;
    memcpy(out, v.data, v.count);
    out[v.count] = 0;
    return 1;
}

static int gguf_u64(const strata_gguf *g, const char *key, uint64_t *out) {
    int64_t i;
    const char *k;
    uint64_t kl;
    strata_gguf_value v;
    if (strata_gguf_find_kv(g, key, &i) || strata_gguf_kv(g, i, &k, &kl, &v)) return 0;
    if (v.type == STRATA_GGUF_UINT64 || v.type == STRATA_GGUF_INT64) { memcpy(out, v.data, 8); return 1; }
    if (v.type == STRATA_GGUF_UINT32 || v.type == STRATA_GGUF_INT32) { uint32_t x; memcpy(&x, v.data, 4); *out = x; return 1; }
    return 0;
}

/* The packed NVFP4 table named by strata.ple_external (relative paths: next to the GGUF). */
static strata_status bind_external(strata_model *m, struct mdl_ple_engine *e, const char *name) {
    const mdl_hparams *h = &m->hp;
    char path[1024], gpath[1024], side[1100];
    uint64_t off;
    if (name[0] == '/') {
        snprintf(path, sizeof path, "%s", name);
    } else {
        if (!ple_backing_file(m->tok_embd, gpath, sizeof gpath, &off))
            return strata_fail(STRATA_ERR_UNSUPPORTED, "qwen4exp model: strata.ple_external names %s relative to the GGUF, "
                               "but this GGUF is not read from a file", name);
        char *slash = strrchr(gpath, '/');
        if (slash) slash[1] = 0;
        if (snprintf(path, sizeof path, "%s%s", gpath, name) >= (int)sizeof path)
            return strata_fail(STRATA_ERR_INVALID_ARG, "PLE table path too long: %s%s", gpath, name);
    }
    snprintf(side, sizeof side, "%s.json", path);
    char *js = NULL;
    strata_status rc = read_file_text(side, &js);
    if (rc) return rc;
    ple_sidecar sc;
    rc = ple_sidecar_parse(js, side, h->ple_row_dim, &sc);
    free(js);
    if (rc) return rc;
    e->gscale = sc.gscale;                             /* freed with the engine (mdl_ple_close), as before */
    char gsrc[256] = "";
    uint64_t grows;
    if (gguf_u64(m->gguf, "strata.ple_external.rows", &grows) && grows != (uint64_t)sc.rows)
        return strata_fail(STRATA_ERR_FORMAT, "PLE table %s has %lld rows but the model was converted with %llu "
                           "(strata.ple_external.rows): the table belongs to another checkpoint", path, (long long)sc.rows,
                           (unsigned long long)grows);
    if (gguf_str(m->gguf, "strata.ple_external.source", gsrc, sizeof gsrc) && strcmp(gsrc, sc.source))
        return strata_fail(STRATA_ERR_FORMAT, "PLE table sidecar %s: source \"%s\" is not the checkpoint the model was "
                           "converted from (\"%s\")", side, sc.source, gsrc);
    const ple_params pp = ple_params_of(&m->params);
    rc = ple_table_open_file(&e->table, path, (size_t)sc.width, sc.rows, m->params.ple_mode, &pp);
    if (rc) return rc;
    e->external = 1;
    e->n_shard = sc.n_shard;
    e->shard_rows = sc.shard_rows;
    m->ple_table = (const char *)e->table.rows;
    m->ple_table_t = NULL;
    m->ple_table_row = (size_t)sc.width;
    m->ple_table_rows = sc.rows;
    return STRATA_OK;
}

strata_status mdl_ple_bind(strata_model *m) {
    const mdl_hparams *h = &m->hp;
    if (m->params.ple_mode < STRATA_PLE_AUTO || m->params.ple_mode > STRATA_PLE_DIRECT)
        return strata_fail(STRATA_ERR_INVALID_ARG, "model: ple_mode %d (use 0 auto, 1 mmap, 2 direct)", m->params.ple_mode);
    struct mdl_ple_engine *e = calloc(1, sizeof *e);
    if (!e) return strata_fail(STRATA_ERR_NOMEM, "PLE: no memory");
    /* no descriptors yet: a load refused before the table opens closes none (0 would be stdin) */
    e->table.fd = e->table.dfd = -1;
    m->ple = e;
    strata_status rc;
    char ext[1024];
    int64_t ti;
    const int has_tensor = strata_gguf_find_tensor(m->gguf, "per_layer_token_embd.weight", &ti) == STRATA_OK;
    if (gguf_str(m->gguf, "strata.ple_external", ext, sizeof ext)) {
        if (has_tensor)
            return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: both per_layer_token_embd.weight and strata.ple_external "
                               "are present; a GGUF holds its PLE table in one place");
        if ((rc = bind_external(m, e, ext))) return rc;
    } else {
        strata_gguf_tensor t;
        if (!has_tensor || strata_gguf_tensor_info(m->gguf, ti, &t))
            return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: PLE is on but tensor per_layer_token_embd.weight is missing "
                               "(and no strata.ple_external names a packed table)");
        const strata_qtraits *q = strata_qtraits_get(t.type);
        if (!q || !q->dequant[0] || t.ne[0] != h->ple_row_dim || h->ple_row_dim % q->block_size || t.ne[2] != 1)
            return strata_fail(STRATA_ERR_FORMAT, "tensor per_layer_token_embd.weight: rows of %lld values of type %d do not match embedding_length_per_layer_input %d",
                               (long long)t.ne[0], t.type, h->ple_row_dim);
        m->ple_table = t.data;
        m->ple_table_t = q;
        m->ple_table_row = (size_t)(h->ple_row_dim / q->block_size) * (size_t)q->type_size;
        m->ple_table_rows = t.ne[1];
        if (t.size != m->ple_table_row * (uint64_t)t.ne[1])
            return strata_fail(STRATA_ERR_FORMAT, "tensor per_layer_token_embd.weight: data size does not match its shape");
        const ple_params pp = ple_params_of(&m->params);
        if ((rc = ple_table_open_mapped(&e->table, t.data, m->ple_table_row, m->ple_table_rows, m->params.ple_mode, &pp)))
            return rc;
    }
    const int nh = (h->ple_n - 1) * h->ple_heads_per;
    for (int i = 0; i < nh; i++)
        if (h->ple_off[i] + h->ple_size[i] > (uint64_t)m->ple_table_rows)
            return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: PLE head %d reaches row %llu but the table has %lld rows", i,
                               (unsigned long long)(h->ple_off[i] + h->ple_size[i]), (long long)m->ple_table_rows);
    if (h->ple_eos < 0 || h->ple_eos >= h->n_vocab)
        return strata_fail(STRATA_ERR_FORMAT, "qwen4exp model: ple.eos_token_id %lld is not a token id", (long long)h->ple_eos);
    ple_hash *hs = &e->hash;
    hs->n = h->ple_n;
    hs->heads_per = h->ple_heads_per;
    hs->eos = (uint64_t)h->ple_eos;
    memcpy(hs->mult, h->ple_mult, sizeof hs->mult);
    memcpy(hs->off, h->ple_off, sizeof hs->off);
    memcpy(hs->size, h->ple_size, sizeof hs->size);
    const ple_params pp = ple_params_of(&m->params);
    return ple_worker_start(&e->worker, &e->table, hs, m->params.n_ubatch, &pp);
}

void mdl_ple_close(strata_model *m) {
    struct mdl_ple_engine *e = m->ple;
    if (!e) return;
    ple_worker_stop(&e->worker);
    ple_table_close(&e->table);
    if (e->dgscale) e->dgscale_dk->free(e->dgscale);
    free(e->gscale);
    free(e);
    m->ple = NULL;
}

/* ---------------------------------------------------------------- public: info and stats */

strata_status strata_model_ple_info(const strata_model *m, strata_ple_info *out) {
    if (!m || !out) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_model_ple_info: null argument");
    memset(out, 0, sizeof *out);
    const struct mdl_ple_engine *e = m->ple;
    if (!e) return STRATA_OK;
    out->present = 1;
    out->mode = e->table.mode;
    out->external = e->external;
    out->madv_random = e->table.madv_random;
    out->prefetch = e->table.prefetch;
    out->n_rows = e->table.n_rows;
    out->row_bytes = e->table.row_bytes;
    out->table_bytes = (uint64_t)e->table.n_rows * e->table.row_bytes;
    snprintf(out->path, sizeof out->path, "%s", e->table.path);
    snprintf(out->why, sizeof out->why, "%s", e->table.why);
    out->file_offset = e->table.file_off;
    out->cache_capacity = e->worker.cache.cap;
    out->cache_used = atomic_load_explicit(&e->worker.cache.used, memory_order_relaxed);
    out->cache_index_bytes = ple_cache_index_bytes(&e->worker.cache);
    out->odirect = e->table.dfd >= 0;
    out->dio_align = e->table.dio_align;
    out->n_heads = (int32_t)e->worker.n_heads;
    out->ngram = m->hp.ple_n;
    return STRATA_OK;
}

strata_status strata_model_ple_resident(const strata_model *m, uint64_t *resident_pages, uint64_t *total_pages) {
    if (!m || !resident_pages || !total_pages) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_model_ple_resident: null argument");
    *resident_pages = *total_pages = 0;
    return m->ple ? ple_resident(&m->ple->table, resident_pages, total_pages) : STRATA_OK;
}

strata_status strata_session_ple_stats(const strata_session *s, strata_ple_stats *prefill, strata_ple_stats *decode) {
    if (!s) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_session_ple_stats: null session");
    if (prefill) *prefill = s->ple_stats[0];
    if (decode) *decode = s->ple_stats[1];
    return STRATA_OK;
}

/* ---------------------------------------------------------------- the layer */

/* Adds the finished step's measurements (and those of the read-ahead steps before it) to st. Called by
 * the thread owning the channel, after ple_wait: the worker is idle. */
static void add_result(strata_ple_stats *st, ple_worker *w, int64_t L) {
    const ple_result *r = &w->result;
    ple_result *a = &w->warm_acc;
    st->steps++;
    st->tokens += (uint64_t)L;
    st->rows += r->rows;
    st->read_bytes += r->read_bytes + a->read_bytes;
    st->major_faults += r->major_faults + a->major_faults;
    st->minor_faults += r->minor_faults + a->minor_faults;
    st->prefetch_pages += r->prefetch_pages;
    st->hash_s += r->hash_s;
    st->prefetch_s += r->prefetch_s;
    st->gather_s += r->gather_s;
    st->cache_lookups += r->cache_lookups;
    st->cache_hits += r->cache_hits;
    st->cache_hit_bytes += r->cache_hits * (uint64_t)w->table->row_bytes;
    st->floor_pages += r->floor_pages;
    st->floor_sectors += r->floor_sectors;
    st->miss_pages += r->miss_pages + a->miss_pages;
    st->miss_sectors += r->miss_sectors + a->miss_sectors;
    st->warm_rows += a->rows;
    memset(a, 0, sizeof *a);
}

/* Adds to st the share of one batched step's measurements `all` that falls to tokens [t0, t1) of its T:
 * a counter's share is v*t1/T - v*t0/T, so the sequences' shares add up to the step's exactly. (The
 * rows, floors and bytes of one gather are not the sum of per-sequence gathers; they are shared out by
 * tokens.) The step counts once for every sequence in it. */
static void add_share(strata_ple_stats *st, const strata_ple_stats *all, uint64_t t0, uint64_t t1, uint64_t T) {
#define SHARE_U(f) st->f += (uint64_t)(((unsigned __int128)all->f * t1) / T - ((unsigned __int128)all->f * t0) / T)
#define SHARE_D(f) st->f += all->f * (double)(t1 - t0) / (double)T
    st->steps += all->steps;
    SHARE_U(tokens); SHARE_U(rows); SHARE_U(read_bytes); SHARE_U(major_faults); SHARE_U(minor_faults);
    SHARE_U(prefetch_pages); SHARE_U(cache_lookups); SHARE_U(cache_hits); SHARE_U(cache_hit_bytes);
    SHARE_U(floor_pages); SHARE_U(floor_sectors); SHARE_U(miss_pages); SHARE_U(miss_sectors); SHARE_U(warm_rows);
    SHARE_D(hash_s); SHARE_D(prefetch_s); SHARE_D(gather_s); SHARE_D(copy_s); SHARE_D(wait_s); SHARE_D(dequant_s);
#undef SHARE_U
#undef SHARE_D
}

/* The step submitted on this thread and not yet consumed by mdl_ple (a forward runs on one thread and
 * one step at a time): its owner (the first session), sequences and tokens. If forward() calls
 * mdl_ple_submit before layer 0, the gather overlaps the embeddings and the layers before the PLE's. */
static _Thread_local struct { const strata_session *s; uint64_t seq; int n; int64_t R; } pending;

strata_status mdl_ple_submit(strata_session *const *ss, const int32_t *const *ids, const int64_t *Ls, int n) {
    struct mdl_ple_engine *e = ss[0]->m->ple;
    if (!e) return STRATA_OK;
    if (pending.s) {                   /* submitted, then the step failed before mdl_ple: free the channel */
        ple_release(&e->worker, pending.s);
        pending.s = NULL;
    }
    const int64_t k = ss[0]->m->hp.ple_n - 1;
    int64_t R = 0;
    for (int i = 0; i < n; i++) R += Ls[i];
    int32_t *h = malloc((size_t)(k * n + R) * sizeof(int32_t));
    if (!h) return strata_fail(STRATA_ERR_NOMEM, "PLE: no memory for %lld ids", (long long)R);
    int32_t *p = h;
    for (int i = 0; i < n; i++) {          /* each sequence: its context, then its ids */
        memcpy(p, ss[i]->ple_ctx, (size_t)k * sizeof(int32_t));
        memcpy(p + k, ids[i], (size_t)Ls[i] * sizeof(int32_t));
        p += k + Ls[i];
    }
    uint64_t seq;
    strata_status rc = ple_submit_segs(&e->worker, ss[0], h, Ls, n, &seq);
    free(h);
    if (rc) return rc;
    pending.s = ss[0];
    pending.seq = seq;
    pending.n = n;
    pending.R = R;
    return STRATA_OK;
}

/* The ops of the layer as functions of their own, so that the CUDA kernels' host check
 * (tests/native/test_cuda_ops_ple.c) compares with exactly what this path computes. Not in model.h:
 * only this file and that check call them. */

/* Gathered packed rows -> emb: row i (t-major, head-minor, as the worker lays them) is head i % NH of
 * token i / NH, dP values at emb + (i / NH) * E + (i % NH) * dP. GGUF rows decode with t's dequantizer;
 * t NULL: packed NVFP4 rows, each scaled by its shard's weight_scale_2 (row_ids: the rows' table ids). */
void mdl_ple_dequant(const uint8_t *buf, size_t rb, int64_t n_rows, int64_t NH, int64_t dP, int64_t E,
                     const strata_qtraits *t, const uint64_t *row_ids, const float *gscale, int64_t n_shard,
                     int64_t shard_rows, float *emb) {
    for (int64_t i = 0; i < n_rows; i++) {
        float *dst = emb + (i / NH) * E + (i % NH) * dP;
        if (!t) {
            int64_t sh = (int64_t)(row_ids[i] / (uint64_t)shard_rows);
            if (sh >= n_shard) sh = n_shard - 1;
            ple_nvfp4_row(buf + (size_t)i * rb, dst, dP, gscale[sh]);
        }
        else t->dequant[0]((const char *)buf + (size_t)i * rb, dst, dP);
    }
}

/* key (R rows of hc*E, in place) = G(W_key emb; w_key), once W_key emb is there. */
void mdl_ple_key_norm(float *key, const float *w, int64_t R, int64_t hc, int64_t E, float eps) {
    for (int64_t t = 0; t < R; t++) mdl_group_rmsnorm(key + t * hc * E, w, hc, E, eps, key + t * hc * E);
}

/* The gate of L tokens: qry = G(X_t; w_query), per stream s = key·qry / sqrt(E), g = sign(s)
 * sqrt(max(|s|, 1e-6)), gv = σ(g) val; gvn = G(gv; w_conv). qry: one row (hc*E) of scratch. */
void mdl_ple_gate(const float *X, const float *key, const float *val, const float *w_query, const float *w_conv,
                  int64_t L, int64_t hc, int64_t E, float eps, float *gv, float *gvn, float *qry) {
    const int64_t W = hc * E;
    const float inv_sqrt_e = 1.0f / sqrtf((float)E);
    for (int64_t t = 0; t < L; t++) {
        const float *kt = key + t * W;
        float *gt = gv + t * W;
        mdl_group_rmsnorm(X + t * W, w_query, hc, E, eps, qry);
        for (int64_t j = 0; j < hc; j++) {
            float d = 0.0f;
            for (int64_t e = 0; e < E; e++) d += kt[j * E + e] * qry[j * E + e];
            const float sc = d * inv_sqrt_e;
            const float g = sc > 0.0f ? sqrtf(fmaxf(sc, 1e-6f)) : sc < 0.0f ? -sqrtf(fmaxf(-sc, 1e-6f)) : 0.0f;
            const float sg = ops_sigmoid(g);
            for (int64_t e = 0; e < E; e++) gt[j * E + e] = sg * val[t * E + e];
        }
        mdl_group_rmsnorm(gt, w_conv, hc, E, eps, gvn + t * W);
    }
}

/* The conv of L tokens: ext holds hist = (Kp-1)*n rows of history (oldest first), then the L rows of
 * gvn; X_t += gv_t + silu(Σ_k w[c][k] ext[hist + t - (Kp-1-k) n][c]). Then state gets the last hist rows
 * of ext, and (slots not NULL: a verify window) slot t the hist rows that end with token t. */
enum { PLE_CONV_CHUNK = 256 };

void mdl_ple_conv(const float *ext, const float *gv, const float *w_conv, int64_t L, int64_t W, int64_t Kp, int64_t n,
                  float *X, float *state, float *slots) {
    const int64_t hist = (Kp - 1) * n;
    for (int64_t t = 0; t < L; t++) {
        float *xt = X + t * W;
        const float *gt = gv + t * W;
        for (int64_t c0 = 0; c0 < W; c0 += PLE_CONV_CHUNK) {   /* the taps, then a loop of silu that vectorises */
            const int64_t nc = W - c0 < PLE_CONV_CHUNK ? W - c0 : PLE_CONV_CHUNK;
            float acc[PLE_CONV_CHUNK];
            for (int64_t c = c0; c < c0 + nc; c++) {
                const float *w = w_conv + c * Kp;
                float a = 0.0f;
                for (int64_t k = 0; k < Kp; k++) a += w[k] * ext[(hist + t - (Kp - 1 - k) * n) * W + c];
                acc[c - c0] = a;
            }
            for (int64_t i = 0; i < nc; i++) xt[c0 + i] += gt[c0 + i] + ops_silu(acc[i]);
        }
    }
    memcpy(state, ext + L * W, (size_t)(hist * W) * sizeof(float));
    if (slots)
        for (int64_t t = 0; t < L; t++)
            memcpy(slots + t * hist * W, ext + (t + 1) * W, (size_t)(hist * W) * sizeof(float));
}

/* One sequence's gate and conv (the part of the layer on its own state): X, gv, key, val, qry are its
 * L rows. */
static void ple_mix(strata_session *s, const mdl_layer *l, int64_t L, const float *key, const float *val,
                    float *X, float *gv, float *ext, float *qry) {
    const mdl_hparams *hp = &s->m->hp;
    const int64_t E = hp->n_embd, hc = hp->hc, W = hc * E, n = hp->ple_n, Kp = hp->ple_kp;
    const int64_t hist = (Kp - 1) * n;
    memcpy(ext, s->ple_conv, (size_t)(hist * W) * sizeof(float));
    mdl_ple_gate(X, key, val, l->ple_norm_query, l->ple_norm_conv, L, hc, E, hp->eps, gv, ext + hist * W, qry);
    mdl_ple_conv(ext, gv, l->ple_conv, L, W, Kp, n, X, s->ple_conv, mdl_spec_active(s) ? s->ple_conv_slots : NULL);
}

/* The context becomes the last n-1 ids of (old context, ids); a verify window keeps the ids after
 * each token, for rollback (spec.c). */
static void ple_advance(strata_session *s, const int32_t *ids, int64_t L) {
    const int64_t n = s->m->hp.ple_n;
    int32_t h[MDL_MAX_NGRAM * 2];
    int64_t k = 0;
    for (int64_t i = 0; i < n - 1; i++) h[k++] = s->ple_ctx[i];
    const int64_t take = L < n - 1 ? L : n - 1;
    for (int64_t i = L - take; i < L; i++) h[k++] = ids[i];
    memcpy(s->ple_ctx, h + k - (n - 1), (size_t)(n - 1) * sizeof(int32_t));
    if (mdl_spec_active(s))
        for (int64_t t = 0; t < L; t++) {
            int32_t *dst = s->ple_ctx_slots + t * MDL_MAX_NGRAM;
            for (int64_t i = 0; i < n - 1; i++) {
                const int64_t j = t + 1 + i;   /* in (old context = h[0, n-1), ids) */
                dst[i] = j < n - 1 ? h[j] : ids[j - (n - 1)];
            }
        }
}

/* The sequences' gates and convs, a pool task each (they touch only their own state and rows; serially
 * they were 100 us of an 8-sequence step on flash-small, 12.6 each, the other thread idle). Sequence i's
 * rows start at row r0[i]; its scratch (gv [L W], ext [(hist + L) W], qry [W]) at scratch + off[i]. */
typedef struct {
    strata_session *const *ss;
    const mdl_layer *l;
    const int64_t *Ls, *r0, *off;
    const float *key, *val;
    float *X, *scratch;
    int64_t E, W, hist;
} ple_mixes;

static void ple_mix_task(void *arg, int64_t i, int thread) {
    (void)thread;
    const ple_mixes *J = arg;
    const int64_t L = J->Ls[i], r = J->r0[i];
    float *gv = J->scratch + J->off[i], *ext = gv + L * J->W, *qry = ext + (J->hist + L) * J->W;
    ple_mix(J->ss[i], J->l, L, J->key + r * J->W, J->val + r * J->E, J->X + r * J->W, gv, ext, qry);
}

strata_status mdl_ple(strata_session *const *ss, const int32_t *const *ids, const int64_t *Ls, int n, int il,
                      float *X) {
    const strata_model *m = ss[0]->m;
    const mdl_hparams *hp = &m->hp;
    const mdl_layer *l = &m->layers[il];
    struct mdl_ple_engine *pe = m->ple;
    const int64_t E = hp->n_embd, hc = hp->hc, W = hc * E, Kp = hp->ple_kp;
    const int64_t NH = (hp->ple_n - 1) * hp->ple_heads_per, dP = hp->ple_row_dim, hist = (Kp - 1) * hp->ple_n;
    int64_t R = 0;
    for (int i = 0; i < n; i++) R += Ls[i];
    strata_status rc = STRATA_OK;
    if (!(pending.s == ss[0] && pending.n == n && pending.R == R) && (rc = mdl_ple_submit(ss, ids, Ls, n))) return rc;
    const uint64_t seq = pending.seq;
    pending.s = NULL;
    float *emb = malloc((size_t)(R * E) * sizeof(float));
    float *key = malloc((size_t)(R * W) * sizeof(float));
    float *val = malloc((size_t)(R * E) * sizeof(float));
    /* each sequence's scratch for ple_mix (2 L + hist + 1 rows of W), and the rows' offsets */
    float *scratch = malloc((size_t)((2 * R + n * (hist + 1)) * W) * sizeof(float));
    int64_t *r0 = malloc((size_t)(2 * n) * sizeof(int64_t)), *off = r0 ? r0 + n : NULL;
    strata_ple_stats all;
    memset(&all, 0, sizeof all);
    rc = ple_wait(&pe->worker, seq, &all.wait_s);
    if (!rc && (!emb || !key || !val || !scratch || !r0))
        rc = strata_fail(STRATA_ERR_NOMEM, "PLE layer %d: no memory for %lld tokens", il, (long long)R);
    if (rc) {
        ple_release(&pe->worker, ss[0]);
        goto done;
    }
    add_result(&all, &pe->worker, R);
    {
        /* the cpu device dequantizes the packed rows here (t-major, head-minor, as the worker laid them) */
        const double t0 = ple_now();
        mdl_ple_dequant(pe->worker.buf, m->ple_table_row, R * NH, NH, dP, E, pe->external ? NULL : m->ple_table_t,
                        pe->worker.rows, pe->gscale, pe->n_shard, pe->shard_rows, emb);
        all.dequant_s += ple_now() - t0;
    }
    ple_release(&pe->worker, ss[0]);
    for (int64_t i = 0, t0 = 0; i < n; t0 += Ls[i], i++) {
        add_share(&ss[i]->ple_stats[Ls[i] > 1 ? 0 : 1], &all, (uint64_t)t0, (uint64_t)(t0 + Ls[i]), (uint64_t)R);
        ple_advance(ss[i], ids[i], Ls[i]);
    }
    /* the products over every sequence's rows at once; the rest on each one's own state */
    {
        const mdl_mat *ws[] = {&l->ple_key, &l->ple_value};
        float *const ys[] = {key, val};
        if ((rc = mdl_matmul_set(m, ws, 2, emb, R, ys))) goto done;
    }
    mdl_ple_key_norm(key, l->ple_norm_key, R, hc, E, hp->eps);
    for (int i = 0; i < n; i++) {
        r0[i] = i ? r0[i - 1] + Ls[i - 1] : 0;
        off[i] = i ? off[i - 1] + (2 * Ls[i - 1] + hist + 1) * W : 0;
    }
    {
        const ple_mixes J = {.ss = ss, .l = l, .Ls = Ls, .r0 = r0, .off = off, .key = key, .val = val, .X = X,
                             .scratch = scratch, .E = E, .W = W, .hist = hist};
        strata_pool_run(n > 1 ? m->pool : NULL, ple_mix_task, (void *)&J, n);
    }
done:
    free(emb); free(key); free(val); free(scratch); free(r0);
    return rc;
}

/* ---------------------------------------------------------------- the layer on the dense device */

/* The step's work buffers (fwd_dev.h B_PLE_*), taken before the wait so the worker's gather overlaps any
 * growth: packed rows, their row ids (packed NVFP4 table), emb [R][E], key [R][W], val [R][E], and one
 * sequence's gv [Lmax][W] and ext [hist + Lmax][W]. */
typedef struct { uint8_t *rows; uint64_t *ids; float *emb, *key, *val, *gv, *ext; } ple_dbufs;

static strata_status ple_dbufs_take(strata_session *s, int64_t R, int64_t Lmax, int external, ple_dbufs *b) {
    const strata_model *m = s->m;
    const mdl_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, W = hp->hc * E, hist = (int64_t)(hp->ple_kp - 1) * hp->ple_n;
    const int64_t NH = (int64_t)(hp->ple_n - 1) * hp->ple_heads_per;
    strata_status rc;
    memset(b, 0, sizeof *b);
    DBUF(s, B_PLE_ROWS, uint8_t, (size_t)(R * NH) * m->ple_table_row, b->rows);
    if (external) DBUF(s, B_PLE_IDS, uint64_t, R * NH, b->ids);
    DBUF(s, B_PLE_EMB, float, R * E, b->emb);
    DBUF(s, B_PLE_KEY, float, R * W, b->key);
    DBUF(s, B_PLE_VAL, float, R * E, b->val);
    DBUF(s, B_PLE_GV, float, Lmax * W, b->gv);
    DBUF(s, B_PLE_EXT, float, (hist + Lmax) * W, b->ext);
    return STRATA_OK;
}

strata_status mdl_ple_dev(strata_session *const *ss, const int32_t *const *ids, const int64_t *Ls, int n, int il,
                          float *dX) {
    strata_session *s0 = ss[0];
    const strata_model *m = s0->m;
    const mdl_dk *dk = m->dk;
    const mdl_hparams *hp = &m->hp;
    const mdl_layer *l = &m->layers[il];
    const dlayer *dl = &m->dense->layers[il];
    struct mdl_ple_engine *pe = m->ple;
    const int64_t E = hp->n_embd, hc = hp->hc, W = hc * E, Kp = hp->ple_kp, ng = hp->ple_n;
    const int64_t NH = (ng - 1) * hp->ple_heads_per, dP = hp->ple_row_dim, hist = (Kp - 1) * ng;
    int64_t R = 0, Lmax = 0;
    for (int i = 0; i < n; i++) {
        R += Ls[i];
        if (Ls[i] > Lmax) Lmax = Ls[i];
    }
    strata_status rc = STRATA_OK;
    if (!(pending.s == s0 && pending.n == n && pending.R == R) && (rc = mdl_ple_submit(ss, ids, Ls, n))) return rc;
    const uint64_t seq = pending.seq;
    pending.s = NULL;
    /* from here the channel is this thread's until ple_release: every path below releases it once */
    ple_dbufs b;
    strata_ple_stats all;
    memset(&all, 0, sizeof all);
    if ((rc = ple_dbufs_take(s0, R, Lmax, pe->external, &b))) {
        ple_release(&pe->worker, s0);   /* not waited for: the next submit waits for the worker (ple.h) */
        return rc;
    }
    if (pe->external && !pe->dgscale) {   /* the shard scales, once (the channel keeps other threads out); like
                                           * the weights uploaded at load, not counted as a step's traffic */
        float *g = dk->alloc((size_t)pe->n_shard * sizeof(float));
        if (!g) {
            ple_release(&pe->worker, s0);
            return strata_fail(STRATA_ERR_NOMEM, "PLE layer %d: the %s device has no room for the table's %lld "
                               "shard scales", il, dk->name, (long long)pe->n_shard);
        }
        if ((rc = dk->copy(g, pe->gscale, (size_t)pe->n_shard * sizeof(float), DK_H2D, NULL))) {
            dk->free(g);
            ple_release(&pe->worker, s0);
            return rc;
        }
        pe->dgscale = g;
        pe->dgscale_dk = dk;
    }
    /* page-locked staging, so that the copy up is queued behind the layers before this one without waiting
     * for them (a copy from pageable memory would wait for the stream first) */
    const size_t rows_b = (size_t)(R * NH) * m->ple_table_row, ids_b = pe->external ? (size_t)(R * NH) * 8 : 0;
    char *hs = NULL;
    rc = mdl_dhost(s0, H_PLE, rows_b + ids_b, (void **)&hs);
    if (!rc) rc = ple_wait(&pe->worker, seq, &all.wait_s);
    if (!rc) {
        add_result(&all, &pe->worker, R);
        /* seed 003's handshake: the worker publishes seq once its rows are in its buffer; the buffer is free
         * again once they are in the staging. Only the packed rows cross (t-major, head-minor, as the worker
         * laid them), and their table ids when the shard scale depends on them. */
        const double t0 = ple_now();
        memcpy(hs, pe->worker.buf, rows_b);
        if (ids_b) memcpy(hs + rows_b, pe->worker.rows, ids_b);
        all.copy_s += ple_now() - t0;
    }
    ple_release(&pe->worker, s0);
    if (!rc) rc = mdl_dcopy(s0, b.rows, hs, rows_b, DK_H2D);
    if (!rc && ids_b) rc = mdl_dcopy(s0, b.ids, hs + rows_b, ids_b, DK_H2D);
    if (rc) return rc;
    {
        /* a launch: the time is the host's side of it (the kernel runs in order after the copies) */
        const double t0 = ple_now();
        rc = dk->ple_dequant(pe->external ? PLE_CUDA_ROWS_NVFP4_PACKED : m->ple_table_t->type, b.rows,
                             m->ple_table_row, R * NH, dP, b.ids, pe->dgscale, pe->n_shard, pe->shard_rows, b.emb,
                             NULL);
        all.dequant_s += ple_now() - t0;
        if (rc) return rc;
    }
    for (int64_t i = 0, t0 = 0; i < n; t0 += Ls[i], i++) {
        add_share(&ss[i]->ple_stats[Ls[i] > 1 ? 0 : 1], &all, (uint64_t)t0, (uint64_t)(t0 + Ls[i]), (uint64_t)R);
        ple_advance(ss[i], ids[i], Ls[i]);
    }
    /* emb [R*NH][dP] as the kernel writes it is mdl_ple_dequant's [R][E] (NH*dP = E: load.c checks it).
     * The products over every sequence's rows at once; the gate and conv on each one's own history. */
    if ((rc = mdl_dmatmul(s0, &l->ple_key, b.emb, R, b.key))) return rc;
    if ((rc = mdl_dmatmul(s0, &l->ple_value, b.emb, R, b.val))) return rc;
    if ((rc = dk->ple_key_norm(b.key, dl->ple_norm_key, R, hc, E, hp->eps, NULL))) return rc;
    for (int64_t i = 0, r = 0; i < n; r += Ls[i], i++) {
        strata_session *s = ss[i];
        if ((rc = dk->ple_gate(dX + r * W, b.key + r * W, b.val + r * E, dl->ple_norm_query, dl->ple_norm_conv, Ls[i],
                               hc, E, hp->eps, b.gv, b.ext + hist * W, NULL)))
            return rc;
        if ((rc = dk->ple_conv(dX + r * W, b.gv, b.ext, dl->ple_conv, Ls[i], W, Kp, ng, s->ple_conv,
                               mdl_spec_active(s) ? s->ple_conv_slots : NULL, NULL)))
            return rc;
    }
    return STRATA_OK;
}

/* ---------------------------------------------------------------- read-ahead and bare gathers */

strata_status strata_session_ple_prefetch(strata_session *s, const int32_t *ids, int64_t n) {
    if (!s || (n > 0 && !ids)) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_session_ple_prefetch: null argument");
    struct mdl_ple_engine *e = s->m->ple;
    if (!e || !e->worker.cache.cap || n <= 0) return STRATA_OK;
    int32_t h[MDL_MAX_NGRAM + 64];
    const int64_t k = s->m->hp.ple_n - 1;
    if (n > 64) n = 64;                                /* a verify window; more would not be a read-ahead */
    memcpy(h, s->ple_ctx, (size_t)k * sizeof(int32_t));
    memcpy(h + k, ids, (size_t)n * sizeof(int32_t));
    ple_submit_warm(&e->worker, s, h, n);
    return STRATA_OK;
}

strata_status strata_model_ple_gather(strata_model *m, const int32_t *ctx, const int32_t *ids, int64_t n,
                                      int32_t one_token_steps, uint64_t *row_ids, uint8_t *packed,
                                      uint64_t packed_capacity, strata_ple_stats *st) {
    if (!m || (n > 0 && !ids)) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_model_ple_gather: null argument");
    if (st) memset(st, 0, sizeof *st);
    struct mdl_ple_engine *e = m->ple;
    if (!e) return strata_fail(STRATA_ERR_UNSUPPORTED, "strata_model_ple_gather: the model has no PLE table");
    ple_worker *w = &e->worker;
    const int64_t k = m->hp.ple_n - 1, NH = w->n_heads, rb = (int64_t)e->table.row_bytes;
    for (int64_t i = 0; i < n + (ctx ? k : 0); i++) {
        const int32_t id = i < n ? ids[i] : ctx[i - n];
        if (id < 0 || id >= m->hp.n_vocab)
            return strata_fail(STRATA_ERR_INVALID_ARG, "strata_model_ple_gather: token id %d is not below n_vocab %lld", id,
                               (long long)m->hp.n_vocab);
    }
    if (packed && packed_capacity < (uint64_t)(n * NH * rb))
        return strata_fail(STRATA_ERR_BUFFER_TOO_SMALL, "strata_model_ple_gather: %lld tokens need %llu bytes of rows",
                           (long long)n, (unsigned long long)(n * NH * rb));
    const int64_t step = one_token_steps ? 1 : w->cap;
    int32_t *h = malloc((size_t)(k + step) * sizeof(int32_t));
    if (!h) return strata_fail(STRATA_ERR_NOMEM, "PLE: no memory");
    for (int64_t i = 0; i < k; i++) h[i] = ctx ? ctx[i] : (int32_t)m->hp.ple_eos;
    strata_ple_stats acc;
    memset(&acc, 0, sizeof acc);
    strata_status rc = STRATA_OK;
    for (int64_t t0 = 0; t0 < n && !rc; t0 += step) {
        const int64_t L = n - t0 < step ? n - t0 : step;
        memcpy(h + k, ids + t0, (size_t)L * sizeof(int32_t));
        uint64_t seq;
        double wait_s = 0;
        if ((rc = ple_submit(w, m, h, L, &seq))) break;
        rc = ple_wait(w, seq, &wait_s);
        if (!rc) {
            add_result(&acc, w, L);
            acc.wait_s += wait_s;
            if (row_ids) memcpy(row_ids + t0 * NH, w->rows, (size_t)(L * NH) * sizeof(uint64_t));
            if (packed) memcpy(packed + t0 * NH * rb, w->buf, (size_t)(L * NH * rb));
        }
        ple_release(w, m);
        memmove(h, h + L, (size_t)k * sizeof(int32_t));   /* the next step's context: the last k ids */
    }
    free(h);
    if (st) *st = acc;
    return rc;
}
