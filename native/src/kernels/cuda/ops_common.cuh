/*
 * ops_common.cuh — what the forward's CUDA kernels (kernels/cuda/<family>.cuh) share, and the rule
 * that makes them checkable without a GPU.
 *
 * The rule: a kernel's arithmetic lives in OPS_FN functions (__host__ __device__ under nvcc, static
 * inline C11 under gcc), each computing one unit of a launch (one output element, one row, one head
 * of one token …). The __global__ kernel calls that function once per unit, and nothing else does
 * arithmetic; the host op checks (tests/native/test_cuda_ops_<family>.c, compiled by gcc) call the
 * same function over every unit of the launch grid and compare with the library's C path. So a
 * broken lane, index or formula in the shared source fails the host check (tests/test_cuda_ops.py
 * mutates the sources to prove it), and what the host check passes is what the GPU runs — only the
 * launch configuration, streams, events and speed are left to tools/device_check.sh.
 *
 * Reductions across a warp: a kernel that spreads a sum over 32 lanes adds lane l's partial over the
 * indices k ≡ l (mod 32), then folds the lanes with __shfl_down_sync at offsets 16, 8, 4, 2, 1. The host
 * reproduces lane 0's result bit for bit: a loop over the 32 lanes that accumulates each lane's partial
 * in the kernel's order, then ops_fold32 (the same fold order). Device-only code (__global__ kernels, launchers) goes under #ifdef __CUDACC__.
 */
#ifndef STRATA_KERNELS_CUDA_OPS_COMMON_CUH
#define STRATA_KERNELS_CUDA_OPS_COMMON_CUH

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define OPS_FN static __host__ __device__ __forceinline__
#define OPS_DEV static __device__ __forceinline__
#else
#define OPS_FN static inline
#endif

#define OPS_WARP 32

/* Folds 32 lane partials in place as a warp's __shfl_down_sync tree does, and returns lane 0's sum. */
OPS_FN float ops_fold32(float *p) {
    for (int o = OPS_WARP / 2; o > 0; o /= 2)
        for (int l = 0; l < o; l++) p[l] += p[l + o];
    return p[0];
}

#ifdef __CUDACC__
/* Lane 0's sum of v over the warp, in ops_fold32's order (other lanes hold partial sums). */
OPS_DEV float ops_warp_sum(float v) {
    for (int o = OPS_WARP / 2; o > 0; o /= 2) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}
/* The warp's maximum, on every lane. */
OPS_DEV float ops_warp_max(float v) {
    for (int o = OPS_WARP / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
#endif


/* Bit casts, on the host through memcpy (no aliasing questions). */
OPS_FN uint32_t ops_f32_bits(float f) {
#if defined(__CUDA_ARCH__)
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
#endif
}
OPS_FN float ops_bits_f32(uint32_t u) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

/* A product never fused with the add that follows: nvcc contracts a*b+c into an FMA by default, the C
 * reference is built with -ffp-contract=off and rounds twice. */
OPS_FN float ops_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

/* The half nearest f (ties to even), as bits: overflow to inf, NaN stays NaN (quiet, payload top bits). */
OPS_FN uint16_t ops_f32_to_f16(float f) {
    const uint32_t x = ops_f32_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0u));
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);   // rounds past 65504
    if (ax < 0x38800000u) {                                      // below the smallest normal half: subnormal
        if (ax < 0x33000000u) return (uint16_t)sign;             // at most half the smallest subnormal
        const uint32_t m = (ax & 0x7fffffu) | 0x800000u, shift = 126u - (ax >> 23);   // 14 .. 24
        const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        uint32_t r = m >> shift;
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = (ax >> 13) - (112u << 10);   // rebias the exponent, keep 10 mantissa bits
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;   // a carry into the exponent is right
    return (uint16_t)(sign | r);
}

/* e^y from a polynomial in plain float operations and fmaf: the activations (ops_sigmoid, ops_silu)
 * and the softmaxes of the router and of attention use it, so the C path's loops of them vectorise,
 * where libm's expf is a call per value, and every build gives the same bits: the C path at any ISA,
 * the GPU, the host check. It is Cephes' expf: n = y log2 e rounded (by adding 1.5 * 2^23),
 * r = y - n ln 2 in two parts, 1 + r + r^2 P(r) with P of degree 5 on |r| <= ln2/2, times 2^n built
 * in the exponent bits. The clamp to [-87, 87] keeps n in [-126, 126] (and takes NaN to -87): below
 * -87 it returns 0 (the exact value is under 1.7e-38; a softmax's -inf is 0), above 87 e^87; NaN stays
 * NaN. Within 2 ulp of e^y where that is a normal float (tests/native/test_ops_math.c). */
OPS_FN float ops_exp(float y) {
    float c = y > -87.0f ? y : -87.0f;
    c = c < 87.0f ? c : 87.0f;
    const float n = fmaf(c, 1.44269504088896341f, 12582912.0f) - 12582912.0f;
    float r = fmaf(n, -0.693359375f, c);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = fmaf(1.9875691500e-4f, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    const float e = ops_mul(fmaf(p, ops_mul(r, r), r) + 1.0f, ops_bits_f32((uint32_t)((int32_t)n + 127) << 23));
    return y < -87.0f ? 0.0f : y != y ? y : e;
}

/* sigmoid(x) = 1 / (1 + e^-x): 0 below x = -87, 1 above 87 (where e^-x is 0), NaN kept. Within 2 ulp
 * of the exact value where that is a normal float. */
OPS_FN float ops_sigmoid(float x) {
    const float s = 1.0f / (1.0f + ops_exp(-x));
    return x < -87.0f ? 0.0f : s;
}

/* silu(x) = x sigmoid(x). */
OPS_FN float ops_silu(float x) { return ops_mul(x, ops_sigmoid(x)); }

OPS_FN float ops_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

#endif
