/*
 * test_ops_math.c — the scalar functions of kernels/cuda/ops_common.cuh that the C path and the GPU share,
 * against double-precision formulas: ops_exp within 2 ulp of e^y wherever that is a normal float, 0 below
 * -87 and at -inf, NaN kept; ops_sigmoid within 2 ulp of 1 / (1 + e^-x), 0 below -87, 1 above 87;
 * ops_silu within 3 ulp of x / (1 + e^-x); and loops of them as the compiler vectorises them (mdl_hc_mix,
 * a softmax's exp) bit for bit against the same functions run one value at a time.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "kernels/cuda/ops_common.cuh"

void mdl_hc_mix(const float *g, const float *xh, int64_t L, int64_t hc, int64_t E, float *u);

/* Distance in units in the last place between two finite non-negative floats. */
static int64_t ulps(float a, float b) {
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    return llabs((long long)ia - (long long)ib);
}

/* Every 97th float bit pattern of either sign with |x| <= 88, so every binade is visited: f(x) against
 * the double formula want(x) wherever that is a normal float; returns the worst distance in ulp. */
static int64_t sweep(const char *name, float (*f)(float), double (*want_of)(double)) {
    int64_t worst = 0, n = 0;
    float at = 0.0f;
    for (uint32_t bits = 0; bits < 0x42b00000u; bits += 97)
        for (int sign = 0; sign < 2; sign++) {
            float x;
            const uint32_t b = bits | (sign ? 0x80000000u : 0u);
            memcpy(&x, &b, 4);
            const double want = want_of((double)x);
            if (fabs(want) < 1.1754944e-38 || fabs(want) > 3.4028234e38) continue;
            float got = f(x), w = (float)want;
            if ((got < 0) != (w < 0)) { worst = INT32_MAX; at = x; continue; }
            const int64_t u = ulps(fabsf(got), fabsf(w));
            if (u > worst) { worst = u; at = x; }
            n++;
        }
    printf("%s: %lld values, worst %lld ulp at x = %.9g\n", name, (long long)n, (long long)worst, at);
    return worst;
}

static float sigmoid_f(float x) { return ops_sigmoid(x); }
static double sigmoid_d(double x) { return x < -87.0 ? 0.0 : 1.0 / (1.0 + exp(-x)); }
static float exp_f(float y) { return ops_exp(y); }
static double exp_d(double y) { return y < -87.0 || y > 87.0 ? 0.0 : exp(y); }   /* 0: not swept */
static float silu_f(float x) { return ops_silu(x); }
static double silu_d(double x) { return x < -87.0 ? 0.0 : x / (1.0 + exp(-x)); }

static void activations(void) {
    CHECK(sweep("ops_sigmoid", sigmoid_f, sigmoid_d) <= 2);
    CHECK(ops_sigmoid(0.0f) == 0.5f);
    CHECK(ops_sigmoid(100.0f) == 1.0f);
    CHECK(ops_sigmoid(INFINITY) == 1.0f);
    CHECK(ops_sigmoid(-87.5f) == 0.0f);
    CHECK(ops_sigmoid(-100.0f) == 0.0f);
    CHECK(ops_sigmoid(-INFINITY) == 0.0f);
    CHECK(isnan(ops_sigmoid(NAN)));
    CHECK(sweep("ops_exp", exp_f, exp_d) <= 2);
    CHECK(ops_exp(0.0f) == 1.0f);
    CHECK(ops_exp(-INFINITY) == 0.0f);
    CHECK(ops_exp(-88.0f) == 0.0f);
    CHECK(ops_exp(88.0f) == ops_exp(87.0f));
    CHECK(isnan(ops_exp(NAN)));
    CHECK(sweep("ops_silu", silu_f, silu_d) <= 3);
    CHECK(ops_silu(0.0f) == 0.0f);
    CHECK(ops_silu(100.0f) == 100.0f);
    CHECK(ops_silu(-87.5f) == 0.0f);
    CHECK(ops_silu(-100.0f) == 0.0f);
    CHECK(isnan(ops_silu(NAN)));
    /* a softmax's loop of ops_exp (moe.c, qsa.c), vectorised here as there, against one value at a time */
    enum { N = 1000 };
    float v[N], w[N];
    uint64_t s = 0x243f6a8885a308d3ull;
    for (int i = 0; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        w[i] = (float)((int64_t)(s >> 40) - (1 << 23)) / (float)(1 << 16);   /* about [-128, 128] */
    }
    w[3] = -INFINITY;
    for (int i = 0; i < N; i++) v[i] = ops_exp(w[i] - 10.0f);
    int64_t bad = 0;
    for (int i = 0; i < N; i++) {
        volatile float a = w[i] - 10.0f;
        const float one = ops_exp(a);
        if (memcmp(&one, &v[i], 4) != 0) bad++;
    }
    CHECK(bad == 0);
    CHECK(v[3] == 0.0f);
}

/* The C path's mix (its loop over features vectorised by the compiler) against one value at a time. */
static void mix_bits(void) {
    const int64_t L = 3, hc = 4, E = 37, W = hc * E;
    float *g = malloc(sizeof(float) * (size_t)(L * W)), *xh = malloc(sizeof(float) * (size_t)(L * W));
    float *u = malloc(sizeof(float) * (size_t)(L * E));
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < L * W; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        g[i] = (float)((int64_t)(s >> 40) - (1 << 23)) / (float)(1 << 19);   /* about [-16, 16] */
        xh[i] = (float)((int64_t)(s >> 20 & 0xfffff) - (1 << 19)) / (float)(1 << 18);
    }
    g[5] = -90.0f;
    g[W + 7] = 90.0f;
    mdl_hc_mix(g, xh, L, hc, E, u);
    int64_t bad = 0;
    for (int64_t t = 0; t < L; t++)
        for (int64_t d = 0; d < E; d++) {
            volatile float acc = 0.0f;    /* volatile: one value at a time, not vectorised */
            for (int64_t j = 0; j < hc; j++) acc += ops_sigmoid(g[t * W + j * E + d]) * xh[t * W + j * E + d];
            const float want = acc * (1.0f / (float)hc);
            if (memcmp(&want, &u[t * E + d], 4) != 0) bad++;
        }
    CHECK(bad == 0);
    free(g);
    free(xh);
    free(u);
}

int main(void) {
    activations();
    mix_bits();
    return g_failed != 0;
}
