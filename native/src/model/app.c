/*
 * app.c — what a C application needs around a model besides eval: the model's tokenizer (built
 * from its tokenizer.ggml.* arrays), a sampler, and the strata_model_* calls over the offload engine.
 *
 * The sampler applies llama.cpp's default order, as pyrunner/sampling.py does: top-k → top-p →
 * min-p (all on the distribution before temperature) → temperature → one uniform draw, inverting
 * the cumulative distribution of the survivors sorted by probability (ties: lower id first).
 * Temperature ≤ 0 is greedy (argmax, lowest id on ties), and draws nothing. Its random numbers
 * come from splitmix64 seeded with `seed`, so a C program is reproducible for a seed, but its
 * draws are not the Python sampler's (numpy's PCG64).
 */
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/error.h"

/* ---------------------------------------------------------------- tokenizer */

static int find_kv(const strata_gguf *g, const char *key, strata_gguf_value *v) {
    int64_t i;
    const char *k;
    uint64_t kl;
    return strata_gguf_find_kv(g, key, &i) == STRATA_OK && strata_gguf_kv(g, i, &k, &kl, v) == STRATA_OK;
}

/* Packs an ARRAY of STRING into data/lens (malloc'd). */
static strata_status pack_strings(const strata_gguf *g, const strata_gguf_value *arr, const char *key, char **data,
                                  uint32_t **lens) {
    if (arr->type != STRATA_GGUF_ARRAY || arr->elem_type != STRATA_GGUF_STRING)
        return strata_fail(STRATA_ERR_FORMAT, "%s must be an array of strings", key);
    uint64_t total = 0;
    *lens = malloc((size_t)(arr->count ? arr->count : 1) * sizeof(uint32_t));
    if (!*lens) return strata_fail(STRATA_ERR_NOMEM, "%s: no memory", key);
    for (uint64_t i = 0; i < arr->count; i++) {
        strata_gguf_value e;
        if (strata_gguf_array_get(g, arr, i, &e) != STRATA_OK || e.count > UINT32_MAX) {
            free(*lens);
            return strata_fail(STRATA_ERR_FORMAT, "%s[%llu] is unreadable", key, (unsigned long long)i);
        }
        (*lens)[i] = (uint32_t)e.count;
        total += e.count;
    }
    *data = malloc((size_t)(total ? total : 1));
    if (!*data) { free(*lens); return strata_fail(STRATA_ERR_NOMEM, "%s: no memory", key); }
    uint64_t off = 0;
    for (uint64_t i = 0; i < arr->count; i++) {
        strata_gguf_value e;
        strata_gguf_array_get(g, arr, i, &e);
        memcpy(*data + off, e.data, (size_t)e.count);
        off += e.count;
    }
    return STRATA_OK;
}

strata_status strata_model_tokenizer(const strata_model *m, strata_tokenizer **out) {
    if (!m || !out) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_model_tokenizer: null argument");
    const strata_gguf *g = m->gguf;
    strata_gguf_value v, tv, mv;
    if (!find_kv(g, "tokenizer.ggml.model", &v) || v.type != STRATA_GGUF_STRING || v.count != 4 || memcmp(v.data, "gpt2", 4))
        return strata_fail(STRATA_ERR_UNSUPPORTED, "model tokenizer: tokenizer.ggml.model must be \"gpt2\" (byte-level BPE)");
    if (!find_kv(g, "tokenizer.ggml.tokens", &tv))
        return strata_fail(STRATA_ERR_FORMAT, "model tokenizer: tokenizer.ggml.tokens is missing");
    strata_tokenizer_params p = strata_tokenizer_default_params();
    if (find_kv(g, "tokenizer.ggml.pre", &v) && v.type == STRATA_GGUF_STRING) {
        if ((v.count == 6 && !memcmp(v.data, "qwen35", 6)) || (v.count == 7 && !memcmp(v.data, "qwen3.5", 7)) ||
            (v.count == 7 && !memcmp(v.data, "qwen3_5", 7)))
            p.pre = STRATA_TOKENIZER_PRE_QWEN35;
        else if (!((v.count == 5 && !memcmp(v.data, "qwen2", 5)) || (v.count == 5 && !memcmp(v.data, "qwen3", 5))))
            return strata_fail(STRATA_ERR_UNSUPPORTED, "model tokenizer: pre-tokenizer '%.*s' is not supported (qwen2, qwen35)",
                               (int)(v.count > 32 ? 32 : v.count), (const char *)v.data);
    }
    char *tdata = NULL, *mdata = NULL;
    uint32_t *tlens = NULL, *mlens = NULL;
    int32_t *types = NULL;
    uint64_t n_merges = 0;
    strata_status rc = pack_strings(g, &tv, "tokenizer.ggml.tokens", &tdata, &tlens);
    if (rc) return rc;
    if (find_kv(g, "tokenizer.ggml.merges", &mv)) {
        if ((rc = pack_strings(g, &mv, "tokenizer.ggml.merges", &mdata, &mlens))) goto done;
        n_merges = mv.count;
    }
    if (find_kv(g, "tokenizer.ggml.token_type", &v)) {
        if (v.type != STRATA_GGUF_ARRAY || v.count != tv.count ||
            (v.elem_type != STRATA_GGUF_INT32 && v.elem_type != STRATA_GGUF_UINT32)) {
            rc = strata_fail(STRATA_ERR_FORMAT, "tokenizer.ggml.token_type must be %llu int32 values",
                             (unsigned long long)tv.count);
            goto done;
        }
        types = malloc((size_t)(v.count ? v.count : 1) * sizeof(int32_t));
        if (!types) { rc = strata_fail(STRATA_ERR_NOMEM, "model tokenizer: no memory"); goto done; }
        memcpy(types, v.data, (size_t)v.count * sizeof(int32_t));
    }
    rc = strata_tokenizer_init(tdata, tlens, types, (int64_t)tv.count, mdata, mlens, (int64_t)n_merges, &p, out);
done:
    free(tdata); free(tlens); free(mdata); free(mlens); free(types);
    return rc;
}

/* ---------------------------------------------------------------- sampler */

typedef struct { float l; int32_t i; } cand;

struct strata_sampler {
    strata_sampler_params p;
    uint64_t state;
    int64_t cap;
    cand *c;
    double *prob;
};

strata_sampler_params strata_sampler_default_params(void) {
    strata_sampler_params p;
    memset(&p, 0, sizeof p);
    p.temperature = 0.8f;   /* llama.cpp's defaults */
    p.top_k = 40;
    p.top_p = 0.95f;
    p.min_p = 0.05f;
    p.seed = 0;
    return p;
}

strata_status strata_sampler_init(const strata_sampler_params *params, strata_sampler **out) {
    if (!out) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_sampler_init: out is required");
    strata_sampler_params p = params ? *params : strata_sampler_default_params();
    if (!(p.top_p > 0.0f) || p.top_p > 1.0f || p.min_p < 0.0f || p.min_p > 1.0f || p.top_k < 0 || isnan(p.temperature))
        return strata_fail(STRATA_ERR_INVALID_ARG, "sampler: top_p must be in (0, 1], min_p in [0, 1], top_k >= 0");
    strata_sampler *s = calloc(1, sizeof *s);
    if (!s) return strata_fail(STRATA_ERR_NOMEM, "sampler: no memory");
    s->p = p;
    s->state = p.seed;
    *out = s;
    return STRATA_OK;
}

void strata_sampler_free(strata_sampler *s) {
    if (!s) return;
    free(s->c);
    free(s->prob);
    free(s);
}

int32_t strata_sample_greedy(const float *logits, int64_t n_vocab) {
    int64_t best = 0;
    for (int64_t i = 1; i < n_vocab; i++)
        if (logits[i] > logits[best]) best = i;
    return (int32_t)best;
}

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* higher logit first, then lower id (qsort is not stable: the id makes the order total) */
static int by_logit(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->l != y->l) return x->l > y->l ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

/* min-heap on "better": the root is the candidate that ranks last */
static void sift(cand *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t w = i, l = 2 * i + 1, r = l + 1;
        if (l < n && by_logit(&h[w], &h[l]) < 0) w = l;
        if (r < n && by_logit(&h[w], &h[r]) < 0) w = r;
        if (w == i) return;
        cand t = h[i]; h[i] = h[w]; h[w] = t;
        i = w;
    }
}

strata_status strata_sampler_sample(strata_sampler *s, const float *logits, int64_t n_vocab, int32_t *token) {
    if (!s || !logits || !token || n_vocab <= 0)
        return strata_fail(STRATA_ERR_INVALID_ARG, "strata_sampler_sample: null argument or empty vocabulary");
    if (!(s->p.temperature > 0.0f)) { *token = strata_sample_greedy(logits, n_vocab); return STRATA_OK; }
    if (s->cap < n_vocab) {
        free(s->c);
        free(s->prob);
        s->c = malloc((size_t)n_vocab * sizeof(cand));
        s->prob = malloc((size_t)n_vocab * sizeof(double));
        if (!s->c || !s->prob) { s->cap = 0; return strata_fail(STRATA_ERR_NOMEM, "sampler: no memory"); }
        s->cap = n_vocab;
    }
    /* survivors sorted by logit (finite ones only) */
    int64_t n = 0;
    for (int64_t i = 0; i < n_vocab; i++)
        if (isfinite(logits[i])) { s->c[n].l = logits[i]; s->c[n].i = (int32_t)i; n++; }
    if (n == 0) return strata_fail(STRATA_ERR_INVALID_ARG, "sampler: no finite logit to sample from");
    if (s->p.top_k > 0 && s->p.top_k < n) {
        /* keep the k best in a heap whose root is the worst kept (O(n log k)), then sort them */
        const int64_t k = s->p.top_k;
        cand *h = s->c;
        for (int64_t i = k / 2 - 1; i >= 0; i--) sift(h, k, i);
        for (int64_t i = k; i < n; i++)
            if (by_logit(&h[i], &h[0]) < 0) { h[0] = h[i]; sift(h, k, 0); }
        n = k;
    }
    qsort(s->c, (size_t)n, sizeof(cand), by_logit);
    /* distribution before temperature, for top-p and min-p */
    const double mx = s->c[0].l;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) { s->prob[i] = exp((double)s->c[i].l - mx); sum += s->prob[i]; }
    if (s->p.top_p < 1.0f) {
        double acc = 0.0;
        int64_t keep = n;
        for (int64_t i = 0; i < n; i++) {
            acc += s->prob[i] / sum;
            if (acc >= s->p.top_p) { keep = i + 1; break; }
        }
        n = keep;
    }
    if (s->p.min_p > 0.0f) {
        int64_t keep = 1;
        while (keep < n && s->prob[keep] >= s->p.min_p * s->prob[0]) keep++;
        n = keep;
    }
    /* temperature, then one draw */
    sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        s->prob[i] = exp(((double)s->c[i].l - mx) / s->p.temperature);
        sum += s->prob[i];
    }
    const double u = (double)(splitmix64(&s->state) >> 11) * (1.0 / 9007199254740992.0) * sum;
    double acc = 0.0;
    int64_t pick = n - 1;
    for (int64_t i = 0; i < n; i++) {
        acc += s->prob[i];
        if (u < acc) { pick = i; break; }
    }
    *token = s->c[pick].i;
    return STRATA_OK;
}

/* ---------------------------------------------------------------- the offload engine's public face */
/* The strata_model_* calls over the engine (moe/offload.h): argument checks here, the engine's
 * state behind its own lock there. Without an engine (plain CPU path) every counter is 0. */

static char g_no_offload_log[] = "device cpu: every expert on the CPU pool";

strata_status strata_model_resident_experts(strata_model *m, int32_t *per_layer, int32_t n) {
    if (!m || (!per_layer && n > 0) || n < 0)
        return strata_fail(STRATA_ERR_INVALID_ARG, "strata_model_resident_experts: null model or buffer");
    if (!m->off) {
        memset(per_layer, 0, (size_t)n * sizeof *per_layer);
        return STRATA_OK;
    }
    off_resident(m->off, per_layer, n);
    return STRATA_OK;
}

strata_status strata_model_offload_stats(strata_model *m, strata_offload_stats *out) {
    if (!m || !out) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_model_offload_stats: null argument");
    memset(out, 0, sizeof *out);
    out->device = m->params.device;
    if (m->off) off_get_stats(m->off, out);
    out->dense_weight_bytes = mdl_dense_weight_bytes(m);
    out->dense_h2d_bytes = __atomic_load_n(&m->dense_h2d, __ATOMIC_RELAXED);
    out->dense_d2h_bytes = __atomic_load_n(&m->dense_d2h, __ATOMIC_RELAXED);
    return STRATA_OK;
}

strata_status strata_model_set_pcie_frac(strata_model *m, float pcie_frac) {
    if (!m || !(pcie_frac >= 0.0f && pcie_frac <= 1.0f))
        return strata_fail(STRATA_ERR_INVALID_ARG, "pcie_frac must be in [0, 1] (got %g)", (double)pcie_frac);
    if (m->off) off_set_pcie_frac(m->off, pcie_frac);
    return STRATA_OK;
}

const char *strata_model_offload_log(const strata_model *m) {
    if (!m || !m->off) return g_no_offload_log;
    return off_log(m->off);
}

strata_status strata_model_device_events(strata_model *m, const char *path) {
    if (!m) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_model_device_events: null model");
    return off_device_events(m->off, path);
}
