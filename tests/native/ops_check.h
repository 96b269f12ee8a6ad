/* ops_check.h — what the CUDA op checks (test_cuda_ops_*.c) share: a seeded splitmix64 stream of uniform
 * floats, and the largest error of a result relative to its reference's scale. */
#ifndef STRATA_TESTS_OPS_CHECK_H
#define STRATA_TESTS_OPS_CHECK_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static uint64_t g_rng;   /* the stream's state: a check seeds it per case */

/* splitmix64 -> uniform [lo, hi) */
static inline float rndu(float lo, float hi) {
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return lo + (hi - lo) * (float)((double)(z >> 40) / (double)(1ull << 24));
}

static inline float *rnd_array(int64_t n, float lo, float hi) {
    float *p = malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) p[i] = rndu(lo, hi);
    return p;
}

/* max |got - ref| over n values, relative to max |ref| (1 when that is 0); a NaN anywhere gives NaN */
static inline double ops_max_rel_err(const float *got, const float *ref, int64_t n) {
    double scale = 0.0, d = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double r = fabs((double)ref[i]), e = fabs((double)got[i] - (double)ref[i]);
        if (r > scale) scale = r;
        if (!(e <= d)) d = e;   /* NaN sticks */
    }
    return d / (scale > 0.0 ? scale : 1.0);
}

#endif
