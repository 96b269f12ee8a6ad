/*
 * blocks.cuh — one value of a quantized row, as __host__ __device__ code: the decoders the CUDA
 * expert kernels use (moe/device_cuda.cu), checked on the host against the library's C
 * dequantizers (tests/test_cuda.py builds tests/native/cuda_blocks_check.cu with nvcc).
 *
 * blk_value(type, row, k) returns value k of a row of `type`, rounded exactly as the C dequantizer
 * (quant/fmt_*.c) rounds it: the same float products in the same order, so host and device agree
 * bit for bit with gguf.quants. Types: F32 F16 BF16 Q8_0 Q5_1 IQ4_NL MXFP4 NVFP4 Q4_K Q6_K IQ2_XS
 * (every type the quantizer writes for expert matrices, fallbacks included; blk_supported).
 *
 * Tables (IQ2_XS grid and signs, IQ4_NL / FP4 values) come from the generated quant_tables.h, the
 * same source as the C path: host code reads those arrays; device code reads __constant__ copies
 * that blk_tables_upload fills from them (define STRATA_BLOCKS_DEVICE_TABLES in exactly one .cu).
 * Also compiles as plain C (no CUDA): then every function is static inline host code.
 */
#ifndef STRATA_KERNELS_CUDA_BLOCKS_CUH
#define STRATA_KERNELS_CUDA_BLOCKS_CUH

#include <stdint.h>
#include <math.h>
#include <string.h>

#include "quant_tables.h"

#ifdef __CUDACC__
#define BLK_FN static __host__ __device__ __forceinline__
#else
#define BLK_FN static inline
#endif

enum { BLK_F32 = 0, BLK_F16 = 1, BLK_Q5_1 = 7, BLK_Q8_0 = 8, BLK_Q4_K = 12, BLK_Q6_K = 14, BLK_IQ2_XS = 17,
       BLK_IQ4_NL = 20, BLK_BF16 = 30, BLK_MXFP4 = 39, BLK_NVFP4 = 40 };

#ifdef __CUDACC__
/* device copies of quant_tables.h (filled by blk_tables_upload) */
#ifdef STRATA_BLOCKS_DEVICE_TABLES
__constant__ uint64_t blk_c_iq2xs_grid[512];
__constant__ uint8_t blk_c_ksigns[128];
__constant__ int8_t blk_c_iq4nl[16], blk_c_mxfp4[16], blk_c_nvfp4[16];
#else
extern __constant__ uint64_t blk_c_iq2xs_grid[512];
extern __constant__ uint8_t blk_c_ksigns[128];
extern __constant__ int8_t blk_c_iq4nl[16], blk_c_mxfp4[16], blk_c_nvfp4[16];
#endif
#endif

#if defined(__CUDA_ARCH__)
#define BLK_TAB(dev, host) (dev)
#else
#define BLK_TAB(dev, host) (host)
#endif

BLK_FN float blk_bits_f32(uint32_t b) {
#if defined(__CUDA_ARCH__)
    return __uint_as_float(b);
#else
    float f;
    memcpy(&f, &b, 4);
    return f;
#endif
}

/* A product that is never fused with the add that follows (nvcc contracts a*b+c into an FMA by
 * default; the C reference is built with -ffp-contract=off and rounds twice). */
BLK_FN float blk_mul(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

BLK_FN uint32_t blk_u16(const uint8_t *p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8); }

/* IEEE half -> float, exact for every input (as strata_fp16_to_fp32). */
BLK_FN float blk_f16(uint32_t h) {
    const uint32_t sign = (h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1fu) return blk_bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp != 0) return blk_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
    if (man == 0) return blk_bits_f32(sign);
    int e = -1;
    do { e++; man <<= 1; } while ((man & 0x400u) == 0);
    return blk_bits_f32(sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13));
}

/* E8M0 and UE4M3 scales, halved (the FP4 tables hold doubled E2M1 values): as avx2_fp4.h. */
BLK_FN float blk_e8m0_half(uint32_t e) { return blk_bits_f32(e < 2 ? 0x00200000u << e : (e - 1) << 23); }
BLK_FN float blk_ue4m3_half(uint32_t x) {
    if (x == 0x7f) return 0.0f;
    const uint32_t e = (x >> 3) & 0x0fu, m = x & 0x07u;
    if (e == 0) return (float)m * 0x1p-10f;
    return blk_bits_f32(((e + 119u) << 23) | (m << 20));
}

BLK_FN int blk_supported(int type) {
    switch (type) {
    case BLK_F32: case BLK_F16: case BLK_BF16: case BLK_Q8_0: case BLK_Q5_1: case BLK_IQ4_NL: case BLK_MXFP4:
    case BLK_NVFP4: case BLK_Q4_K: case BLK_Q6_K: case BLK_IQ2_XS: return 1;
    default: return 0;
    }
}

/* Values per block and bytes per block (0 for an unsupported type). */
BLK_FN int blk_size(int type) {
    switch (type) {
    case BLK_F32: case BLK_F16: case BLK_BF16: return 1;
    case BLK_Q8_0: case BLK_Q5_1: case BLK_IQ4_NL: case BLK_MXFP4: return 32;
    case BLK_NVFP4: return 64;
    case BLK_Q4_K: case BLK_Q6_K: case BLK_IQ2_XS: return 256;
    default: return 0;
    }
}
BLK_FN int blk_bytes(int type) {
    switch (type) {
    case BLK_F32: return 4;
    case BLK_F16: case BLK_BF16: return 2;
    case BLK_Q8_0: return 34;
    case BLK_Q5_1: return 24;
    case BLK_IQ4_NL: return 18;
    case BLK_MXFP4: return 17;
    case BLK_NVFP4: return 36;
    case BLK_Q4_K: return 144;
    case BLK_Q6_K: return 210;
    case BLK_IQ2_XS: return 74;
    default: return 0;
    }
}

/* ---------------------------------------------------------------- value i of one block */

BLK_FN float blk_q8_0(const uint8_t *b, int i) { return blk_f16(blk_u16(b)) * (float)(int8_t)b[2 + i]; }

BLK_FN float blk_q5_1(const uint8_t *b, int i) {
    const float d = blk_f16(blk_u16(b)), m = blk_f16(blk_u16(b + 2));
    const uint32_t qh = (uint32_t)b[4] | ((uint32_t)b[5] << 8) | ((uint32_t)b[6] << 16) | ((uint32_t)b[7] << 24);
    const uint32_t lo = i < 16 ? (b[8 + i] & 0x0fu) : (b[8 + i - 16] >> 4);
    const uint32_t q = lo | (((qh >> i) & 1u) << 4);
    const float p = blk_mul(d, (float)q);   /* two roundings, as the C reference (no fused multiply-add) */
    return p + m;
}

BLK_FN float blk_nl32(const uint8_t *qs, float d, const int8_t *kv, int i) {
    const uint32_t q = i < 16 ? (qs[i] & 0x0fu) : (qs[i - 16] >> 4);
    return d * (float)kv[q];
}

BLK_FN float blk_iq4_nl(const uint8_t *b, int i) {
    return blk_nl32(b + 2, blk_f16(blk_u16(b)), BLK_TAB(blk_c_iq4nl, strata_kvalues_iq4nl), i);
}

BLK_FN float blk_mxfp4(const uint8_t *b, int i) {
    return blk_nl32(b + 1, blk_e8m0_half(b[0]), BLK_TAB(blk_c_mxfp4, strata_kvalues_mxfp4), i);
}

BLK_FN float blk_nvfp4(const uint8_t *b, int i) {
    const int j = i / 16, r = i % 16;
    const uint8_t *qs = b + 4 + 8 * j;
    const uint32_t q = r < 8 ? (qs[r] & 0x0fu) : (qs[r - 8] >> 4);
    return blk_ue4m3_half(b[j]) * (float)BLK_TAB(blk_c_nvfp4, strata_kvalues_nvfp4)[q];
}

BLK_FN float blk_q4_k(const uint8_t *b, int i) {
    const uint8_t *s = b + 4, *qs = b + 16;
    const int j = i / 32;   /* sub-block */
    uint32_t sc, m;
    if (j < 4) { sc = s[j] & 0x3fu; m = s[4 + j] & 0x3fu; }
    else { sc = (s[8 + j - 4] & 0x0fu) | ((s[j - 4] >> 2) & 0x30u); m = (s[8 + j - 4] >> 4) | ((s[j] >> 2) & 0x30u); }
    const int c = i / 64, h = (i / 32) % 2, k = i % 32;
    const uint32_t q = (qs[32 * c + k] >> (4 * h)) & 0x0fu;
    const float dl = blk_f16(blk_u16(b)) * (float)sc, ml = blk_mul(blk_f16(blk_u16(b + 2)), (float)m);
    const float p = blk_mul(dl, (float)q);
    return p - ml;
}

BLK_FN float blk_q6_k(const uint8_t *b, int i) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    const int c = i / 128, t = (i / 32) % 4, k = i % 32;
    const int lo = (ql[64 * c + 32 * (t & 1) + k] >> (4 * (t >> 1))) & 0xF;
    const int hi = (qh[32 * c + k] >> (2 * t)) & 3;
    const float dl = blk_f16(blk_u16(b + 208)) * (float)sc[i / 16];
    return dl * (float)((lo | (hi << 4)) - 32);
}

BLK_FN float blk_iq2_xs(const uint8_t *b, int i) {
    const int ig = i / 16, l = (i / 8) % 2, j = i % 8;
    const uint32_t s = (b[66 + ig / 2] >> (4 * (ig % 2))) & 15u;
    const float db = blk_f16(blk_u16(b)) * (0.5f + (float)s) * 0.25f;
    const uint32_t q = blk_u16(b + 2 + 2 * (2 * ig + l));
    const uint64_t g = BLK_TAB(blk_c_iq2xs_grid, strata_iq2xs_grid)[q & 511];
    const uint32_t signs = BLK_TAB(blk_c_ksigns, strata_ksigns_iq2xs)[q >> 9];
    const float v = db * (float)(uint8_t)(g >> (8 * j));
    return (signs >> j) & 1 ? -v : v;
}

/* Value k of a row of `type` starting at row (0 for an unsupported type). */
BLK_FN float blk_value(int type, const uint8_t *row, int64_t k) {
    switch (type) {
    case BLK_F32: return blk_bits_f32((uint32_t)row[4 * k] | ((uint32_t)row[4 * k + 1] << 8) |
                                      ((uint32_t)row[4 * k + 2] << 16) | ((uint32_t)row[4 * k + 3] << 24));
    case BLK_F16: return blk_f16(blk_u16(row + 2 * k));
    case BLK_BF16: return blk_bits_f32(blk_u16(row + 2 * k) << 16);
    case BLK_Q8_0: return blk_q8_0(row + 34 * (k / 32), (int)(k % 32));
    case BLK_Q5_1: return blk_q5_1(row + 24 * (k / 32), (int)(k % 32));
    case BLK_IQ4_NL: return blk_iq4_nl(row + 18 * (k / 32), (int)(k % 32));
    case BLK_MXFP4: return blk_mxfp4(row + 17 * (k / 32), (int)(k % 32));
    case BLK_NVFP4: return blk_nvfp4(row + 36 * (k / 64), (int)(k % 64));
    case BLK_Q4_K: return blk_q4_k(row + 144 * (k / 256), (int)(k % 256));
    case BLK_Q6_K: return blk_q6_k(row + 210 * (k / 256), (int)(k % 256));
    case BLK_IQ2_XS: return blk_iq2_xs(row + 74 * (k / 256), (int)(k % 256));
    default: return 0.0f;
    }
}


/* ---------------------------------------------------------------- activations
 * Weight types other than F32/F16/BF16 multiply against activations quantized to 8 bits per
 * block of 32 (act_q8_32) or 256 (act_q8_256) values (quant/act.c). The CUDA kernels reproduce
 * that rounding: each value becomes d * q with q = round-half-even(x / (amax/127)) and d = amax/127
 * (act_q8_32: rounded to fp16 where it is a normal fp16, blk_act_d_q8_32), so
 * the product sums differ from the CPU's only in float summation order. act: 0 f32, 1 q8_32, 2 q8_256. */
BLK_FN int blk_act_block(int act) { return act == 1 ? 32 : act == 2 ? 256 : 1; }

/* The scale of a block with largest magnitude amax and its inverse (as strata_act_scale). */
BLK_FN float blk_act_scale(float amax, float *id) {
    const float d = amax / 127.0f;
    const float inv = d != 0.0f ? 1.0f / d : 0.0f;
    if (!(inv - inv == 0.0f) || !(d - d == 0.0f)) { *id = 0.0f; return 0.0f; }   /* not finite */
    *id = inv;
    return d;
}

/* The scale an act_q8_32 block stores (as strata_act_d_q8_32): d rounded to the nearest fp16
 * where that is a normal fp16 number (2^-14 <= d <= 65504), else d. */
BLK_FN float blk_act_d_q8_32(float d) {
    if (!(d >= 0x1p-14f && d <= 65504.0f)) return d;
    uint32_t x;
    memcpy(&x, &d, 4);
    x = (x + 0xfffu + ((x >> 13) & 1u)) & ~0x1fffu;
    memcpy(&d, &x, 4);
    return d;
}

/* round-half-even to int8 (NaN -> 0), as act_round */
BLK_FN int blk_act_round(float v) {
    if (v != v) return 0;
#if defined(__CUDA_ARCH__)
    return __float2int_rn(v);
#else
    return (int)nearbyintf(v);
#endif
}

/* In place: n values (a multiple of the act block) -> d * q per block. */
BLK_FN void blk_act_fake_quant(float *x, int64_t n, int act) {
    const int bs = blk_act_block(act);
    if (bs == 1) return;
    for (int64_t b = 0; b < n / bs; b++) {
        float *xb = x + b * bs, amax = 0.0f;
        for (int i = 0; i < bs; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float id;
        const float d0 = blk_act_scale(amax, &id), d = act == 1 ? blk_act_d_q8_32(d0) : d0;
        for (int i = 0; i < bs; i++) xb[i] = d * (float)blk_act_round(xb[i] * id);
    }
}

#ifdef __CUDACC__
#ifdef STRATA_BLOCKS_DEVICE_TABLES
/* Copies the host tables into the __constant__ copies of the current device. */
static cudaError_t blk_tables_upload(void) {
    cudaError_t e;
    if ((e = cudaMemcpyToSymbol(blk_c_iq2xs_grid, strata_iq2xs_grid, sizeof strata_iq2xs_grid))) return e;
    if ((e = cudaMemcpyToSymbol(blk_c_ksigns, strata_ksigns_iq2xs, sizeof strata_ksigns_iq2xs))) return e;
    if ((e = cudaMemcpyToSymbol(blk_c_iq4nl, strata_kvalues_iq4nl, sizeof strata_kvalues_iq4nl))) return e;
    if ((e = cudaMemcpyToSymbol(blk_c_mxfp4, strata_kvalues_mxfp4, sizeof strata_kvalues_mxfp4))) return e;
    return cudaMemcpyToSymbol(blk_c_nvfp4, strata_kvalues_nvfp4, sizeof strata_kvalues_nvfp4);
}
#endif
#endif

#endif
