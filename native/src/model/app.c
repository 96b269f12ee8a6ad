/*
 * app.c — what a C application needs around a model besides eval: the model's tokenizer (built
 * from its tokenizer.ggml.* arrays), a sampler, and the strata_model_* calls over the offload engine.
 *
 * The sampler applies llama.cpp's default order, as pyrunner/sampling.py defines it: top-k → top-p →
 * min-p (all on the distribution before temperature) → temperature → one uniform draw, inverting
 * the cumulative distribution of the survivors in id order. Temperature ≤ 0 is greedy (argmax,
 * lowest id on ties), and draws nothing. strata_sampler_sample takes its random numbers from
 * splitmix64 seeded with `seed`, so a C program is reproducible for a seed; pyrunner's Sampler hands
 * the chain (strata_sampler_draw) the numbers of its own stream (numpy's PCG64).
 */
#include "model.h"

#include <math.h>
#include <stdint.h>
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

/* A candidate token: its logit l, and the key it is ranked by (higher first, then lower id) */
typedef struct { double key; float l; int32_t i; } cand;

struct strata_sampler {
    strata_sampler_params p;
    uint64_t state;
    cand *a, *b, *t;              /* the candidates; those top-p ranks, and its sort's scratch */
    int64_t cap_a, cap_b, cap_t;  /* their sizes: top_k (or the vocabulary), and the candidates' count */
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
    if (!(p.top_p > 0.0f && p.top_p <= 1.0f) || !(p.min_p >= 0.0f && p.min_p <= 1.0f) || p.top_k < 0 ||
        !isfinite(p.temperature))
        return strata_fail(STRATA_ERR_INVALID_ARG,
                           "sampler: top_p must be in (0, 1], min_p in [0, 1], top_k >= 0, temperature finite");
    strata_sampler *s = calloc(1, sizeof *s);
    if (!s) return strata_fail(STRATA_ERR_NOMEM, "sampler: no memory");
    s->p = p;
    s->state = p.seed;
    *out = s;
    return STRATA_OK;
}

void strata_sampler_free(strata_sampler *s) {
    if (!s) return;
    free(s->a);
    free(s->b);
    free(s->t);
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

static inline int ranks_before(const cand *x, const cand *y) {
    return x->key > y->key || (x->key == y->key && x->i < y->i);
}

static int by_id(const void *a, const void *b) {
    const cand *x = a, *y = b;
    return (x->i > y->i) - (x->i < y->i);
}

/* min-heap on rank: the root is the candidate that ranks last */
static void sift(cand *h, int64_t n, int64_t i) {
    for (;;) {
        int64_t w = i, l = 2 * i + 1, r = l + 1;
        if (l < n && ranks_before(&h[w], &h[l])) w = l;
        if (r < n && ranks_before(&h[w], &h[r])) w = r;
        if (w == i) return;
        cand t = h[i]; h[i] = h[w]; h[w] = t;
        i = w;
    }
}

/* Offers c to the heap h of the best k seen (*n of them so far): O(log k) when it ranks in. */
static void heap_offer(cand *h, int64_t k, int64_t *n, cand c) {
    if (*n < k) {
        h[(*n)++] = c;
        if (*n == k)
            for (int64_t i = k / 2 - 1; i >= 0; i--) sift(h, k, i);
    } else if (ranks_before(&c, &h[0])) {
        h[0] = c;
        sift(h, k, 0);
    }
}

/* c[0..n) in rank order, best first: a bottom-up merge sort through t (n entries), the comparison
 * inlined (qsort's call per comparison made top-p over a whole vocabulary slower than numpy's sort) */
static void sort_rank(cand *c, int64_t n, cand *t) {
    cand *src = c, *dst = t;
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            const int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t i = lo, j = mid, k = lo;
            while (i < mid && j < hi) dst[k++] = ranks_before(&src[j], &src[i]) ? src[j++] : src[i++];
            while (i < mid) dst[k++] = src[i++];
            while (j < hi) dst[k++] = src[j++];
        }
        cand *x = src; src = dst; dst = x;
    }
    if (src != c) memcpy(c, src, (size_t)n * sizeof *c);
}

/* The m best of src[0..n) into dst, best first; returns how many (min(m, n)). */
static int64_t best_of(const cand *src, int64_t n, int64_t m, cand *dst, cand *t) {
    int64_t got = 0;
    if (m >= n) {
        memcpy(dst, src, (size_t)n * sizeof *dst);
        got = n;
    } else {
        for (int64_t j = 0; j < n; j++) heap_offer(dst, m, &got, src[j]);
    }
    sort_rank(dst, got, t);
    return got;
}

/* The highest logit of c[0..n) (n >= 1). Each filter and the draw take their survivors' own: top-p keeps the
 * one ranking first, which need not be the highest logit where distinct tiny logits round to one log-probability
 * (numpy's chain takes the maximum of each filter's output too). */
static double top_logit(const cand *c, int64_t n) {
    double mx = c[0].l;
    for (int64_t j = 1; j < n; j++) if (c[j].l > mx) mx = c[j].l;
    return mx;
}

/* *buf holds at least n candidates (grown as needed; the sizes of the last calls are kept). */
static strata_status room(cand **buf, int64_t *cap, int64_t n) {
    if (*cap >= n) return STRATA_OK;
    cand *p = realloc(*buf, (size_t)n * sizeof *p);
    if (!p) return strata_fail(STRATA_ERR_NOMEM, "sampler: no memory for %lld candidates", (long long)n);
    *buf = p;
    *cap = n;
    return STRATA_OK;
}

/* The chain as pyrunner/sampling.py's filters define it, in float64 with libm's exp and log (sums in
 * order, where numpy's are pairwise: the survivors and the distribution agree with numpy's to rounding):
 *   top-k (0 < k < n_vocab): the k highest logits, ties to the lower ids (the finite ones among them);
 *   top-p (< 1): over the candidates' log-softmax, the shortest prefix by probability descending (ties:
 *     lower id) whose cumulative probability reaches top_p, at least one: the best 1024 are ranked
 *     first (a heap: O(n log 1024)), then 16 times more, then all, while they do not reach it;
 *   min-p (> 0): those with logit >= the highest + log(min_p);
 *   temperature: softmax((l - max) / t) of the survivors in id order, and the token whose interval of
 *     its cumulative sum holds u (the first cum > u * total).
 * Non-finite logits are never candidates. */
static strata_status chain(strata_sampler *s, const float *logits, int64_t n_vocab, int32_t top_k, double top_p,
                           double min_p, double temperature, double u, int32_t *token) {
    const int with_k = top_k > 0 && top_k < n_vocab;
    strata_status rc = room(&s->a, &s->cap_a, with_k ? top_k : n_vocab);
    if (rc) return rc;
    cand *a = s->a;
    int64_t n = 0;
    int in_id_order = 1;
    if (with_k) {
        /* once the heap holds k, a later token ranks in only above its root's logit (a tie has a higher
         * id): one comparison a token */
        float thr = -INFINITY;
        for (int64_t i = 0; i < n_vocab; i++) {
            const float l = logits[i];
            if (!(l > thr) || !isfinite(l)) continue;
            heap_offer(a, top_k, &n, (cand){l, l, (int32_t)i});
            if (n == top_k) thr = a[0].l;
        }
        in_id_order = 0;
    } else {
        for (int64_t i = 0; i < n_vocab; i++)
            if (isfinite(logits[i])) a[n++] = (cand){logits[i], logits[i], (int32_t)i};
    }
    if (n == 0) return strata_fail(STRATA_ERR_INVALID_ARG, "sampler: no finite logit to sample from");
    if (top_p < 1.0) {
        const double mx = top_logit(a, n);
        double sum = 0.0;
        for (int64_t j = 0; j < n; j++) sum += exp((double)a[j].l - mx);
        const double lse = log(sum);
        for (int64_t j = 0; j < n; j++) a[j].key = ((double)a[j].l - mx) - lse;   /* the log-probability */
        if ((rc = room(&s->b, &s->cap_b, n)) || (rc = room(&s->t, &s->cap_t, n))) return rc;
        cand *b = s->b;
        int64_t m = 1024, got, keep;
        for (;;) {
            got = best_of(a, n, m, b, s->t);
            double cum = 0.0;
            keep = -1;
            for (int64_t j = 0; j < got; j++) {
                cum += exp(b[j].key);
                if (cum >= top_p) { keep = j + 1; break; }
            }
            if (keep > 0 || got == n) break;
            m *= 16;
        }
        if (keep < 1) keep = got;
        if (in_id_order) {
            /* the survivors are those ranking up to the last one kept: taken from a, they stay in id
             * order (a nucleus of most of the vocabulary is not sorted back by id) */
            const cand last = b[keep - 1];
            int64_t w = 0;
            for (int64_t j = 0; j < n; j++)
                if (!ranks_before(&last, &a[j])) a[w++] = a[j];
            n = w;
        } else {
            memcpy(a, b, (size_t)keep * sizeof *a);
            n = keep;
        }
    }
    if (min_p > 0.0) {
        const double cut = top_logit(a, n) + log(min_p);
        int64_t w = 0;
        for (int64_t j = 0; j < n; j++)
            if (!((double)a[j].l < cut)) a[w++] = a[j];
        n = w;
    }
    if (!in_id_order) qsort(a, (size_t)n, sizeof *a, by_id);
    const double mx = top_logit(a, n);
    double tot = 0.0;
    for (int64_t j = 0; j < n; j++) { a[j].key = exp(((double)a[j].l - mx) / temperature); tot += a[j].key; }
    double cum = 0.0;
    for (int64_t j = 0; j < n; j++) { cum += a[j].key / tot; a[j].key = cum; }
    const double target = u * cum;
    int64_t pick = n - 1;
    for (int64_t j = 0; j < n; j++)
        if (a[j].key > target) { pick = j; break; }
    *token = a[pick].i;
    return STRATA_OK;
}

strata_status strata_sampler_sample(strata_sampler *s, const float *logits, int64_t n_vocab, int32_t *token) {
    if (!s || !logits || !token || n_vocab <= 0 || n_vocab > INT32_MAX)
        return strata_fail(STRATA_ERR_INVALID_ARG, "strata_sampler_sample: null argument or empty vocabulary");
    if (!(s->p.temperature > 0.0f)) { *token = strata_sample_greedy(logits, n_vocab); return STRATA_OK; }
    const double u = (double)(splitmix64(&s->state) >> 11) * (1.0 / 9007199254740992.0);
    return chain(s, logits, n_vocab, s->p.top_k, s->p.top_p, s->p.min_p, s->p.temperature, u, token);
}

strata_status strata_sampler_draw(strata_sampler *s, const float *logits, int64_t n_vocab, int32_t top_k, double top_p,
                                  double min_p, double temperature, double u, int32_t *token) {
    if (!s || !logits || !token || n_vocab <= 0 || n_vocab > INT32_MAX)
        return strata_fail(STRATA_ERR_INVALID_ARG, "strata_sampler_draw: null argument or empty vocabulary");
    if (!(temperature > 0.0) || !isfinite(temperature) || !(top_p >= 0.0 && top_p <= 1.0) ||
        !(min_p >= 0.0 && min_p <= 1.0) || !(u >= 0.0 && u < 1.0))
        return strata_fail(STRATA_ERR_INVALID_ARG,
                           "strata_sampler_draw: temperature must be finite and > 0 (greedy is strata_sample_greedy), "
                           "top_p and min_p in [0, 1], u in [0, 1) (got %g, %g, %g, %g)", temperature, top_p, min_p, u);
    return chain(s, logits, n_vocab, top_k, top_p, min_p, temperature, u, token);
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
