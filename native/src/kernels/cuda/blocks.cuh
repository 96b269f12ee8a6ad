/*
 * blocks.cuh — the values of a quantized row, as __host__ __device__ code: the block decoders every
 * CUDA kernel uses (kernels/cuda/gemv.cuh, gemm.cuh, expert_kernels.cuh), checked on the host
 * against the library's C dequantizers (tests/test_cuda.py builds tests/native/cuda_blocks_check.cu
 * with nvcc; tests/native/test_cuda_ops_gemv.c compiles this file with gcc).
 *
 * The unit is a chunk of 32 consecutive values of a row: blk_chunk(type, row, c, K, v) decodes values
 * 32c .. 32c+31 into v, reading the chunk's scales once. Every type's block holds a whole number of
 * chunks (32, 64 or 256 values), so a kernel can stride its lanes over chunks. blk_value(type, row, k)
 * returns one value (through its chunk: for checks, not for hot loops).
 *
 * Every value is rounded exactly as the C dequantizer (quant/fmt_*.c, built with -ffp-contract=off)
 * rounds it: the same float products in the same order, so host and device agree bit for bit with
 * gguf.quants. A product followed by an add goes through ops_mul (ops_common.cuh), so nvcc cannot fuse the two.
 * Types (every type the loader accepts, blk_supported): F32 F16 BF16, Q4_0 Q4_1 Q5_0 Q5_1 Q8_0,
 * IQ4_NL MXFP4 NVFP4, Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS, IQ2_XXS IQ2_XS IQ3_XXS.
 *
 * Tables (IQ grids and signs, IQ4_NL / FP4 values) come from the generated quant_tables.h, the same
 * source as the C path: host code reads those arrays; device code reads __constant__ copies. Without
 * relocatable device code a __constant__ variable cannot be shared between .cu files, so every
 * translation unit has its own (static) copies and fills them with blk_tables_ready() before its
 * first launch (once per device and translation unit).
 * Also compiles as plain C11 (no CUDA): then every function is static inline host code.
 */
#ifndef STRATA_KERNELS_CUDA_BLOCKS_CUH
#define STRATA_KERNELS_CUDA_BLOCKS_CUH

#include <stdint.h>
#include <math.h>
#include <string.h>

#include "quant_tables.h"
#include "kernels/cuda/ops_common.cuh"

#ifdef __CUDACC__
#define BLK_FN static __host__ __device__ __forceinline__
#else
#define BLK_FN static inline
#endif

/* ggml type ids (quant/quant.h GT_*) */
enum { BLK_F32 = 0, BLK_F16 = 1, BLK_Q4_0 = 2, BLK_Q4_1 = 3, BLK_Q5_0 = 6, BLK_Q5_1 = 7, BLK_Q8_0 = 8,
       BLK_Q2_K = 10, BLK_Q3_K = 11, BLK_Q4_K = 12, BLK_Q5_K = 13, BLK_Q6_K = 14, BLK_IQ2_XXS = 16,
       BLK_IQ2_XS = 17, BLK_IQ3_XXS = 18, BLK_IQ4_NL = 20, BLK_IQ4_XS = 23, BLK_BF16 = 30, BLK_MXFP4 = 39,
       BLK_NVFP4 = 40 };

#ifdef __CUDACC__
/* this translation unit's device copies of quant_tables.h (blk_tables_ready fills them) */
static __constant__ uint64_t blk_c_iq2xxs_grid[256];
static __constant__ uint64_t blk_c_iq2xs_grid[512];
static __constant__ uint32_t blk_c_iq3xxs_grid[256];
static __constant__ uint8_t blk_c_ksigns[128];
static __constant__ int8_t blk_c_iq4nl[16], blk_c_mxfp4[16], blk_c_nvfp4[16];
#endif

#if defined(__CUDA_ARCH__)
#define BLK_TAB(dev, host) (dev)
#else
#define BLK_TAB(dev, host) (host)
#endif

BLK_FN uint32_t blk_u16(const uint8_t *p) { return (uint32_t)p[0] | ((uint32_t)p[1] << 8); }

/* IEEE half -> float, exact for every input (as strata_fp16_to_fp32). */
BLK_FN float blk_f16(uint32_t h) {
    const uint32_t sign = (h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1fu) return ops_bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp != 0) return ops_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
    if (man == 0) return ops_bits_f32(sign);
    int e = -1;
    do { e++; man <<= 1; } while ((man & 0x400u) == 0);
    return ops_bits_f32(sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13));
}

/* E8M0 and UE4M3 scales, halved (the FP4 tables hold doubled E2M1 values): as avx2_fp4.h. */
BLK_FN float blk_e8m0_half(uint32_t e) { return ops_bits_f32(e < 2 ? 0x00200000u << e : (e - 1) << 23); }
BLK_FN float blk_ue4m3_half(uint32_t x) {
    if (x == 0x7f) return 0.0f;
    const uint32_t e = (x >> 3) & 0x0fu, m = x & 0x07u;
    if (e == 0) return (float)m * 0x1p-10f;
    return ops_bits_f32(((e + 119u) << 23) | (m << 20));
}

BLK_FN uint32_t blk_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

BLK_FN int blk_supported(int type) {
    switch (type) {
    case BLK_F32: case BLK_F16: case BLK_BF16: case BLK_Q4_0: case BLK_Q4_1: case BLK_Q5_0: case BLK_Q5_1:
    case BLK_Q8_0: case BLK_IQ4_NL: case BLK_MXFP4: case BLK_NVFP4: case BLK_Q2_K: case BLK_Q3_K: case BLK_Q4_K:
    case BLK_Q5_K: case BLK_Q6_K: case BLK_IQ4_XS: case BLK_IQ2_XXS: case BLK_IQ2_XS: case BLK_IQ3_XXS: return 1;
    default: return 0;
    }
}

/* Values per block and bytes per block (0 for an unsupported type). */
BLK_FN int blk_size(int type) {
    switch (type) {
    case BLK_F32: case BLK_F16: case BLK_BF16: return 1;
    case BLK_Q4_0: case BLK_Q4_1: case BLK_Q5_0: case BLK_Q5_1: case BLK_Q8_0: case BLK_IQ4_NL: case BLK_MXFP4:
        return 32;
    case BLK_NVFP4: return 64;
    case BLK_Q2_K: case BLK_Q3_K: case BLK_Q4_K: case BLK_Q5_K: case BLK_Q6_K: case BLK_IQ4_XS: case BLK_IQ2_XXS:
    case BLK_IQ2_XS: case BLK_IQ3_XXS: return 256;
    default: return 0;
    }
}
BLK_FN int blk_bytes(int type) {
    switch (type) {
    case BLK_F32: return 4;
    case BLK_F16: case BLK_BF16: return 2;
    case BLK_Q4_0: return 18;
    case BLK_Q4_1: return 20;
    case BLK_Q5_0: return 22;
    case BLK_Q5_1: return 24;
    case BLK_Q8_0: return 34;
    case BLK_IQ4_NL: return 18;
    case BLK_MXFP4: return 17;
    case BLK_NVFP4: return 36;
    case BLK_Q2_K: return 84;
    case BLK_Q3_K: return 110;
    case BLK_Q4_K: return 144;
    case BLK_Q5_K: return 176;
    case BLK_Q6_K: return 210;
    case BLK_IQ4_XS: return 136;
    case BLK_IQ2_XXS: return 66;
    case BLK_IQ2_XS: return 74;
    case BLK_IQ3_XXS: return 98;
    default: return 0;
    }
}

/* ---------------------------------------------------------------- chunk j (values 32j .. 32j+31) of one block
 * Layouts and formulas: quant/fmt_legacy.c, fmt_fp4.c, fmt_kquants.c (kernels/cpu/avx2_kquants.h for the
 * byte offsets), fmt_iq.c. */

/* Q4_0, 18 bytes: d | qs[16]; w = d * (q - 8) */
BLK_FN void blk_q4_0_32(const uint8_t *b, float *v) {
    const float d = blk_f16(blk_u16(b));
    const uint8_t *qs = b + 2;
    for (int i = 0; i < 16; i++) {
        v[i] = d * (float)((int)(qs[i] & 0x0fu) - 8);
        v[i + 16] = d * (float)((int)(qs[i] >> 4) - 8);
    }
}

/* Q4_1, 20 bytes: d | m | qs[16]; w = d * q + m (two roundings) */
BLK_FN void blk_q4_1_32(const uint8_t *b, float *v) {
    const float d = blk_f16(blk_u16(b)), m = blk_f16(blk_u16(b + 2));
    const uint8_t *qs = b + 4;
    for (int i = 0; i < 16; i++) {
        v[i] = ops_mul(d, (float)(qs[i] & 0x0fu)) + m;
        v[i + 16] = ops_mul(d, (float)(qs[i] >> 4)) + m;
    }
}

/* The 5-bit code of value i: nibble of qs, bit i of qh as bit 4. */
BLK_FN uint32_t blk_q5_code(const uint8_t *qs, uint32_t qh, int i) {
    const uint32_t lo = i < 16 ? (qs[i] & 0x0fu) : (uint32_t)(qs[i - 16] >> 4);
    return lo | (((qh >> i) & 1u) << 4);
}

/* Q5_0, 22 bytes: d | qh[4] | qs[16]; w = d * (q - 16) */
BLK_FN void blk_q5_0_32(const uint8_t *b, float *v) {
    const float d = blk_f16(blk_u16(b));
    const uint32_t qh = blk_u32(b + 2);
    for (int i = 0; i < 32; i++) v[i] = d * (float)((int)blk_q5_code(b + 6, qh, i) - 16);
}

/* Q5_1, 24 bytes: d | m | qh[4] | qs[16]; w = d * q + m (two roundings) */
BLK_FN void blk_q5_1_32(const uint8_t *b, float *v) {
    const float d = blk_f16(blk_u16(b)), m = blk_f16(blk_u16(b + 2));
    const uint32_t qh = blk_u32(b + 4);
    for (int i = 0; i < 32; i++) v[i] = ops_mul(d, (float)blk_q5_code(b + 8, qh, i)) + m;
}

/* Q8_0, 34 bytes: d | int8 q[32]; w = d * q */
BLK_FN void blk_q8_0_32(const uint8_t *b, float *v) {
    const float d = blk_f16(blk_u16(b));
    for (int i = 0; i < 32; i++) v[i] = d * (float)(int8_t)b[2 + i];
}

/* 32 values of 4-bit codes into a value table: qs[16] low nibbles first, times d. */
BLK_FN void blk_nl32(const uint8_t *qs, float d, const int8_t *kv, float *v) {
    for (int i = 0; i < 16; i++) {
        v[i] = d * (float)kv[qs[i] & 0x0fu];
        v[i + 16] = d * (float)kv[qs[i] >> 4];
    }
}

/* IQ4_NL, 18 bytes: d | qs[16]; MXFP4, 17 bytes: e8m0 | qs[16] */
BLK_FN void blk_iq4_nl_32(const uint8_t *b, float *v) {
    blk_nl32(b + 2, blk_f16(blk_u16(b)), BLK_TAB(blk_c_iq4nl, strata_kvalues_iq4nl), v);
}
BLK_FN void blk_mxfp4_32(const uint8_t *b, float *v) {
    blk_nl32(b + 1, blk_e8m0_half(b[0]), BLK_TAB(blk_c_mxfp4, strata_kvalues_mxfp4), v);
}

/* NVFP4, 36 bytes (64 values): ue4m3 s[4] | qs[32]; 16-value sub-block s is qs[8s .. 8s+7] (low
 * nibbles, then high). Chunk j is sub-blocks 2j and 2j+1. */
BLK_FN void blk_nvfp4_32(const uint8_t *b, int j, float *v) {
    const int8_t *kv = BLK_TAB(blk_c_nvfp4, strata_kvalues_nvfp4);
    for (int h = 0; h < 2; h++) {
        const int s = 2 * j + h;
        const float d = blk_ue4m3_half(b[s]);
        const uint8_t *qs = b + 4 + 8 * s;
        for (int r = 0; r < 8; r++) {
            v[16 * h + r] = d * (float)kv[qs[r] & 0x0fu];
            v[16 * h + 8 + r] = d * (float)kv[qs[r] >> 4];
        }
    }
}

/* Q2_K, 84 bytes: scales[16] (sc | m << 4) | qs[64] | d | dmin. Value 128c+32s+k: bits 2s..2s+1 of
 * qs[32c+k]; 16-value sub-block i/16. w = (d*sc)*q - dmin*m. */
BLK_FN void blk_q2_k_32(const uint8_t *b, int j, float *v) {
    const uint8_t *qs = b + 16 + 32 * (j / 4);
    const int sh = 2 * (j % 4);
    const float d = blk_f16(blk_u16(b + 80)), dmin = blk_f16(blk_u16(b + 82));
    for (int h = 0; h < 2; h++) {
        const uint32_t sm = b[2 * j + h];
        const float dl = d * (float)(sm & 0x0fu), ml = ops_mul(dmin, (float)(sm >> 4));
        for (int k = 16 * h; k < 16 * h + 16; k++) v[k] = ops_mul(dl, (float)((qs[k] >> sh) & 3u)) - ml;
    }
}

/* Q3_K, 110 bytes: hmask[32] | qs[64] | scales[12] | d. Value i = 128c+32t+k: low bits 2t..2t+1 of
 * qs[32c+k], minus 4 unless bit i/32 of hmask[k]; 16-value sub-block s has the 6-bit scale
 * (low nibble of scales[s % 8], high if s >= 8) | (bits 2(s/4).. of scales[8 + s%4]) << 4, minus 32. */
BLK_FN void blk_q3_k_32(const uint8_t *b, int j, float *v) {
    const uint8_t *hmask = b, *qs = b + 32 + 32 * (j / 4), *sc = b + 96;
    const int sh = 2 * (j % 4);
    const float d = blk_f16(blk_u16(b + 108));
    for (int h = 0; h < 2; h++) {
        const int s = 2 * j + h;
        const int lo = s < 8 ? sc[s] & 0x0f : sc[s - 8] >> 4;
        const int hi = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
        const float dl = d * (float)((lo | (hi << 4)) - 32);
        for (int k = 16 * h; k < 16 * h + 16; k++) {
            const int q = (int)((qs[k] >> sh) & 3u) - (((hmask[k] >> j) & 1u) ? 0 : 4);
            v[k] = dl * (float)q;
        }
    }
}

/* The 6-bit scale and min of 32-value sub-block j of Q4_K / Q5_K (scales[12]). */
BLK_FN void blk_k4_scale(const uint8_t *s, int j, uint32_t *sc, uint32_t *m) {
    if (j < 4) {
        *sc = s[j] & 0x3fu;
        *m = s[4 + j] & 0x3fu;
    } else {
        *sc = (s[8 + j - 4] & 0x0fu) | ((s[j - 4] >> 2) & 0x30u);
        *m = (uint32_t)(s[8 + j - 4] >> 4) | ((s[j] >> 2) & 0x30u);
    }
}

/* Q4_K, 144 bytes: d | dmin | scales[12] | qs[128]; value 64c+32h+k: nibble h of qs[32c+k].
 * Q5_K, 176 bytes: d | dmin | scales[12] | qh[32] | qs[128]; bit i/32 of qh[i%32] is bit 4.
 * w = (d*sc)*q - dmin*m, sub-block j = i/32. */
BLK_FN void blk_k45_32(const uint8_t *b, int j, const uint8_t *qh, const uint8_t *qs, float *v) {
    uint32_t sc, m;
    blk_k4_scale(b + 4, j, &sc, &m);
    const float dl = blk_f16(blk_u16(b)) * (float)sc, ml = ops_mul(blk_f16(blk_u16(b + 2)), (float)m);
    const uint8_t *q4 = qs + 32 * (j / 2);
    const int sh = 4 * (j % 2);
    for (int k = 0; k < 32; k++) {
        const uint32_t q = ((q4[k] >> sh) & 0x0fu) | (qh ? ((qh[k] >> j) & 1u) << 4 : 0u);
        v[k] = ops_mul(dl, (float)q) - ml;
    }
}

/* Q6_K, 210 bytes: ql[128] | qh[64] | int8 scales[16] | d. Value 128c+32t+k: nibble t/2 of
 * ql[64c + 32(t%2) + k] | bits 2t..2t+1 of qh[32c+k] << 4, minus 32; w = (d*sc[i/16])*q. */
BLK_FN void blk_q6_k_32(const uint8_t *b, int j, float *v) {
    const int c = j / 4, t = j % 4;
    const uint8_t *ql = b + 64 * c + 32 * (t & 1), *qh = b + 128 + 32 * c;
    const int8_t *sc = (const int8_t *)(b + 192);
    const float d = blk_f16(blk_u16(b + 208));
    for (int h = 0; h < 2; h++) {
        const float dl = d * (float)sc[2 * j + h];
        for (int k = 16 * h; k < 16 * h + 16; k++) {
            const int lo = (ql[k] >> (4 * (t >> 1))) & 0xF, hi = (qh[k] >> (2 * t)) & 3;
            v[k] = dl * (float)((lo | (hi << 4)) - 32);
        }
    }
}

/* IQ4_XS, 136 bytes: d | scales_h (u16) | scales_l[4] | qs[128]; sub-block j: 6-bit scale
 * (nibble j%2 of scales_l[j/2]) | (bits 2j.. of scales_h) << 4, minus 32; values as IQ4_NL's. */
BLK_FN void blk_iq4_xs_32(const uint8_t *b, int j, float *v) {
    const int lo = (b[4 + j / 2] >> (4 * (j % 2))) & 0xF, hi = (int)(blk_u16(b + 2) >> (2 * j)) & 3;
    blk_nl32(b + 8 + 16 * j, blk_f16(blk_u16(b)) * (float)((lo | (hi << 4)) - 32),
             BLK_TAB(blk_c_iq4nl, strata_kvalues_iq4nl), v);
}

/* Eight grid magnitudes (byte k of g is value k) times db, bit k of signs negating value k. */
BLK_FN void blk_grid8(uint64_t g, uint32_t signs, float db, float *v) {
    for (int k = 0; k < 8; k++) {
        const float x = db * (float)(uint8_t)(g >> (8 * k));
        v[k] = (signs >> k) & 1u ? -x : x;
    }
}

/* IQ2_XXS, 66 bytes: d | 8 x { u8 grid[4]; u32 w } per 32 values; w bits 7l.. = sign index of
 * entry l, bits 28..31 = s; db = d * (0.5 + s) * 0.25. */
BLK_FN void blk_iq2_xxs_32(const uint8_t *b, int j, float *v) {
    const uint8_t *gi = b + 2 + 8 * j;
    const uint32_t w = blk_u32(gi + 4);
    const float db = blk_f16(blk_u16(b)) * (0.5f + (float)(w >> 28)) * 0.25f;
    for (int l = 0; l < 4; l++)
        blk_grid8(BLK_TAB(blk_c_iq2xxs_grid, strata_iq2xxs_grid)[gi[l]],
                  BLK_TAB(blk_c_ksigns, strata_ksigns_iq2xs)[(w >> (7 * l)) & 127], db, v + 8 * l);
}

/* IQ2_XS, 74 bytes: d | u16 qs[32] (grid entry 0..8, sign index 9..15) | scales[8] (nibble per 16
 * values); db = d * (0.5 + s) * 0.25. */
BLK_FN void blk_iq2_xs_32(const uint8_t *b, int j, float *v) {
    for (int h = 0; h < 2; h++) {
        const int ig = 2 * j + h;
        const uint32_t s = (b[66 + ig / 2] >> (4 * (ig % 2))) & 15u;
        const float db = blk_f16(blk_u16(b)) * (0.5f + (float)s) * 0.25f;
        for (int l = 0; l < 2; l++) {
            const uint32_t q = blk_u16(b + 2 + 2 * (2 * ig + l));
            blk_grid8(BLK_TAB(blk_c_iq2xs_grid, strata_iq2xs_grid)[q & 511],
                      BLK_TAB(blk_c_ksigns, strata_ksigns_iq2xs)[q >> 9], db, v + 16 * h + 8 * l);
        }
    }
}

/* IQ3_XXS, 98 bytes: d | qs[64] (4-value grid entries) | u32 w[8]; w[j] covers chunk j: bits 7l..
 * sign index of values 8l..8l+7 (entries qs[8j+2l], qs[8j+2l+1]), bits 28..31 = s;
 * db = d * (0.5 + s) * 0.5. */
BLK_FN void blk_iq3_xxs_32(const uint8_t *b, int j, float *v) {
    const uint8_t *qs = b + 2 + 8 * j;
    const uint32_t w = blk_u32(b + 66 + 4 * j);
    const float db = blk_f16(blk_u16(b)) * (0.5f + (float)(w >> 28)) * 0.5f;
    const uint32_t *grid = BLK_TAB(blk_c_iq3xxs_grid, strata_iq3xxs_grid);
    for (int l = 0; l < 4; l++) {
        const uint64_t g = (uint64_t)grid[qs[2 * l]] | (uint64_t)grid[qs[2 * l + 1]] << 32;
        blk_grid8(g, BLK_TAB(blk_c_ksigns, strata_ksigns_iq2xs)[(w >> (7 * l)) & 127], db, v + 8 * l);
    }
}

/* ---------------------------------------------------------------- rows */

/* Values 32c .. 32c+n-1 of a row of K values into v, n = min(32, K - 32c); returns n (0 for an
 * unsupported type). Quantized rows hold whole blocks, so there n is 32. */
BLK_FN int blk_chunk(int type, const uint8_t *row, int64_t c, int64_t K, float *v) {
    const int64_t k0 = 32 * c;
    const int n = K - k0 < 32 ? (int)(K - k0) : 32;
    switch (type) {
    case BLK_F32:
        for (int i = 0; i < n; i++) v[i] = ops_bits_f32(blk_u32(row + 4 * (k0 + i)));
        return n;
    case BLK_F16:
        for (int i = 0; i < n; i++) v[i] = blk_f16(blk_u16(row + 2 * (k0 + i)));
        return n;
    case BLK_BF16:
        for (int i = 0; i < n; i++) v[i] = ops_bits_f32(blk_u16(row + 2 * (k0 + i)) << 16);
        return n;
    case BLK_Q4_0: blk_q4_0_32(row + 18 * c, v); return 32;
    case BLK_Q4_1: blk_q4_1_32(row + 20 * c, v); return 32;
    case BLK_Q5_0: blk_q5_0_32(row + 22 * c, v); return 32;
    case BLK_Q5_1: blk_q5_1_32(row + 24 * c, v); return 32;
    case BLK_Q8_0: blk_q8_0_32(row + 34 * c, v); return 32;
    case BLK_IQ4_NL: blk_iq4_nl_32(row + 18 * c, v); return 32;
    case BLK_MXFP4: blk_mxfp4_32(row + 17 * c, v); return 32;
    case BLK_NVFP4: blk_nvfp4_32(row + 36 * (c / 2), (int)(c % 2), v); return 32;
    case BLK_Q2_K: blk_q2_k_32(row + 84 * (c / 8), (int)(c % 8), v); return 32;
    case BLK_Q3_K: blk_q3_k_32(row + 110 * (c / 8), (int)(c % 8), v); return 32;
    case BLK_Q4_K: {
        const uint8_t *b = row + 144 * (c / 8);
        blk_k45_32(b, (int)(c % 8), NULL, b + 16, v);
        return 32;
    }
    case BLK_Q5_K: {
        const uint8_t *b = row + 176 * (c / 8);
        blk_k45_32(b, (int)(c % 8), b + 16, b + 48, v);
        return 32;
    }
    case BLK_Q6_K: blk_q6_k_32(row + 210 * (c / 8), (int)(c % 8), v); return 32;
    case BLK_IQ4_XS: blk_iq4_xs_32(row + 136 * (c / 8), (int)(c % 8), v); return 32;
    case BLK_IQ2_XXS: blk_iq2_xxs_32(row + 66 * (c / 8), (int)(c % 8), v); return 32;
    case BLK_IQ2_XS: blk_iq2_xs_32(row + 74 * (c / 8), (int)(c % 8), v); return 32;
    case BLK_IQ3_XXS: blk_iq3_xxs_32(row + 98 * (c / 8), (int)(c % 8), v); return 32;
    default: return 0;
    }
}

/* Value k of a row of `type` starting at row (0 for an unsupported type). Decodes k's whole chunk:
 * for checks and one-off reads; kernels decode chunks. */
BLK_FN float blk_value(int type, const uint8_t *row, int64_t k) {
    float v[32];
    switch (type) {
    case BLK_F32: return ops_bits_f32(blk_u32(row + 4 * k));
    case BLK_F16: return blk_f16(blk_u16(row + 2 * k));
    case BLK_BF16: return ops_bits_f32(blk_u16(row + 2 * k) << 16);
    default:
        if (!blk_chunk(type, row, k / 32, k / 32 * 32 + 32, v)) return 0.0f;
        return v[k % 32];
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
#include <atomic>
#include <mutex>

/* Copies the host tables into this translation unit's __constant__ copies on the current device. */
static inline cudaError_t blk_tables_upload(void) {
    cudaError_t e;
    if ((e = cudaMemcpyToSymbol(blk_c_iq2xxs_grid, strata_iq2xxs_grid, sizeof strata_iq2xxs_grid))) return e;
    if ((e = cudaMemcpyToSymbol(blk_c_iq2xs_grid, strata_iq2xs_grid, sizeof strata_iq2xs_grid))) return e;
    if ((e = cudaMemcpyToSymbol(blk_c_iq3xxs_grid, strata_iq3xxs_grid, sizeof strata_iq3xxs_grid))) return e;
    if ((e = cudaMemcpyToSymbol(blk_c_ksigns, strata_ksigns_iq2xs, sizeof strata_ksigns_iq2xs))) return e;
    if ((e = cudaMemcpyToSymbol(blk_c_iq4nl, strata_kvalues_iq4nl, sizeof strata_kvalues_iq4nl))) return e;
    if ((e = cudaMemcpyToSymbol(blk_c_mxfp4, strata_kvalues_mxfp4, sizeof strata_kvalues_mxfp4))) return e;
    return cudaMemcpyToSymbol(blk_c_nvfp4, strata_kvalues_nvfp4, sizeof strata_kvalues_nvfp4);
}

/* blk_tables_upload once per device (ids below 64) for this translation unit; later calls return at
 * once. The tables never change, so a second caller must not rewrite them under running kernels. */
static inline cudaError_t blk_tables_ready(void) {
    static std::mutex mu;
    static std::atomic<uint64_t> done{0};   // bit d: device d has this unit's tables
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    const uint64_t bit = dev >= 0 && dev < 64 ? (uint64_t)1 << dev : 0;
    if (done.load(std::memory_order_acquire) & bit) return cudaSuccess;   // every launch after the first
    std::lock_guard<std::mutex> lock(mu);
    if (done.load(std::memory_order_relaxed) & bit) return cudaSuccess;
    if ((e = blk_tables_upload()) == cudaSuccess) done.fetch_or(bit, std::memory_order_release);
    return e;
}
#endif

#endif
