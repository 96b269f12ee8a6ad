/*
 * fuzz_sampler.c — libFuzzer target for the sampling chain (strata_sampler_draw, and
 * strata_sampler_sample over it), whose settings and logits a client sends: pyrunner's Sampler passes
 * a request's top_k / top_p / min_p / temperature and the model's logits after its logit_bias, a C
 * application whatever it likes. The first 16 bytes pick the settings (each edge value among them:
 * filters off, top_p 0, min_p 1, a tiny temperature, u next to 1), the rest are the logits' raw bits
 * (NaN, infinities, subnormals and ties included), 1 to 4,096 of them. A drawn token must be one of
 * the vocabulary's with a finite logit, and one of the top_k highest when top-k is on; a refusal (no
 * finite logit, or settings out of range) must say why. Nothing may crash or touch memory it does not
 * own (ASan + UBSan). Seeds: tests/test_fuzz.py.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "strata.h"

static void require(int cond) {
    if (!cond) __builtin_trap();
}

static double pick(uint8_t b, const double *edges, int n_edges, double lo, double hi) {
    if (b < n_edges) return edges[b];
    return lo + (hi - lo) * (double)(b - n_edges) / (double)(255 - n_edges);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 16 + 4) return 0;
    static const double p_edges[] = {1.0, 0.0, 0.95, 1e-12, 0.999999999, -0.5, 1.5, NAN};
    static const double t_edges[] = {1.0, 0.8, 1e-30, 1e30, 0.0, -1.0, INFINITY, NAN};
    static const double u_edges[] = {0.0, 0.5, 0.9999999999999999, 1.0, -0.25, NAN};
    int32_t top_k;
    memcpy(&top_k, data, 4);
    if (data[4] & 1) top_k = (int32_t)(data[5] % 64);     /* mostly small, sometimes anything */
    const double top_p = pick(data[6], p_edges, 8, 0.0, 1.0);
    const double min_p = pick(data[7], p_edges, 8, 0.0, 1.0);
    const double temp = pick(data[8], t_edges, 8, 0.01, 4.0);
    const double u = pick(data[9], u_edges, 6, 0.0, 0.999);
    const float fp = (float)pick(data[10], p_edges, 8, 0.0, 1.0), fm = (float)pick(data[11], p_edges, 8, 0.0, 1.0);
    uint64_t seed;
    memcpy(&seed, data + 8, 8);
    const int64_t n = (int64_t)((size - 16) / 4) < 4096 ? (int64_t)((size - 16) / 4) : 4096;
    float logits[4096];
    memcpy(logits, data + 16, (size_t)n * 4);
    int64_t n_finite = 0;
    for (int64_t i = 0; i < n; i++) n_finite += isfinite(logits[i]) != 0;

    strata_sampler *s = NULL;
    require(strata_sampler_init(NULL, &s) == STRATA_OK && s);
    int32_t tok = -1;
    const strata_status rc = strata_sampler_draw(s, logits, n, top_k, top_p, min_p, temp, u, &tok);
    const int valid = temp > 0 && isfinite(temp) && top_p >= 0 && top_p <= 1 && min_p >= 0 && min_p <= 1 && u >= 0 && u < 1;
    if (rc == STRATA_OK) {
        require(valid && n_finite > 0 && tok >= 0 && tok < n && isfinite(logits[tok]));
        if (top_k > 0 && top_k < n) {   /* among the top_k highest finite logits */
            int64_t above = 0;
            for (int64_t i = 0; i < n; i++) above += isfinite(logits[i]) && logits[i] > logits[tok];
            require(above < top_k);
        }
    } else {
        require((!valid || n_finite == 0) && strata_last_error()[0]);
    }
    /* strata_sampler_sample, the C application's call, on the same logits with its own settings */
    strata_sampler_params p = strata_sampler_default_params();
    p.top_k = top_k < 0 ? 0 : top_k;
    p.top_p = fp;
    p.min_p = fm;
    p.temperature = (float)temp;
    p.seed = seed;
    strata_sampler *c = NULL;
    if (strata_sampler_init(&p, &c) == STRATA_OK) {
        for (int r = 0; r < 3; r++) {
            tok = -1;
            if (strata_sampler_sample(c, logits, n, &tok) == STRATA_OK) require(tok >= 0 && tok < n);
            else require(n_finite == 0 && strata_last_error()[0]);
        }
        strata_sampler_free(c);
    } else {
        require(strata_last_error()[0]);
    }
    strata_sampler_free(s);
    return 0;
}
