/*
 * test_ops_math.c — the scalar functions of kernels/cuda/ops_common.cuh that the C path and the GPU share,
 * against double-precision formulas: ops_sigmoid_poly (the hyper-connection mix's sigmoid, hc.c) within
 * 2 ulp of 1 / (1 + e^-x) wherever the result is a normal float, 0 below -87, 1 above 87, NaN kept; and
 * mdl_hc_mix (a vectorised loop of it) bit for bit against the same formula run one value at a time.
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

static void sigmoid_sweep(void) {
    int64_t worst = 0, n = 0;
    float at = 0.0f;
    /* every 97th float bit pattern of either sign up to |x| = 88, so every binade is visited */
    for (uint32_t bits = 0; bits < 0x42b00000u; bits += 97) {
        for (int sign = 0; sign < 2; sign++) {
            float x;
            const uint32_t b = bits | (sign ? 0x80000000u : 0u);
            memcpy(&x, &b, 4);
            const float got = ops_sigmoid_poly(x);
            const double want = 1.0 / (1.0 + exp(-(double)x));
            if (x < -87.0f) { CHECK(got == 0.0f); continue; }
            if (want < 1.1754944e-38) continue;          /* subnormal results: not held to ulps */
            const int64_t u = ulps(got, (float)want);
            if (u > worst) { worst = u; at = x; }
            n++;
        }
    }
    printf("ops_sigmoid_poly: %lld values, worst %lld ulp at x = %.9g\n", (long long)n, (long long)worst, at);
    CHECK(worst <= 2);
    CHECK(ops_sigmoid_poly(0.0f) == 0.5f);
    CHECK(ops_sigmoid_poly(100.0f) == 1.0f);
    CHECK(ops_sigmoid_poly(INFINITY) == 1.0f);
    CHECK(ops_sigmoid_poly(-100.0f) == 0.0f);
    CHECK(ops_sigmoid_poly(-INFINITY) == 0.0f);
    CHECK(isnan(ops_sigmoid_poly(NAN)));
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
            for (int64_t j = 0; j < hc; j++) acc += ops_sigmoid_poly(g[t * W + j * E + d]) * xh[t * W + j * E + d];
            const float want = acc * (1.0f / (float)hc);
            if (memcmp(&want, &u[t * E + d], 4) != 0) bad++;
        }
    CHECK(bad == 0);
    free(g);
    free(xh);
    free(u);
}

int main(void) {
    sigmoid_sweep();
    mix_bits();
    return g_failed != 0;
}
