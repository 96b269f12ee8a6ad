/*
 * quant.h — the internal contract between block formats and the kernels that use them.
 *
 * Every weight type registers one strata_qtraits entry (see registry.c). A type has
 *   - dequant[isa]: blocks -> floats, bit-identical to gguf.quants.dequantize;
 *   - vec_dot[isa]: one weight row against ncols activation rows, in the type's
 *     activation format (act): float, act_q8_32 or act_q8_256;
 *   - quantize: floats -> blocks (optional).
 * isa indexes the paths (STRATA_ISA_IDX_*): 0 the portable scalar reference, then AVX2+FMA+F16C,
 * AVX-VNNI, AVX-512 and AMX. A slot a family leaves empty takes its fallback's function
 * (strata_isa_fallback), so every slot is filled.
 *
 * Rule for vec_dot (tested): every path returns the same float as the scalar one bit for
 * bit, and column c's result does not depend on ncols. To make that possible each format
 * fixes its summation order in writing, and both paths follow it: integer parts are exact;
 * every float operation is the same in both paths; eight float lane accumulators are
 * reduced with strata_hsum8() (AVX2: strata_hsum8_avx2 in kernels/cpu/avx2_common.h). A wider
 * path keeps the eight float lanes (its integer work may be as wide as it likes: it is exact).
 * The orders in use:
 *   - block b's float part goes to lane (b % 8) (32- and 64-value formats);
 *   - float weights: element i goes to lane (i % 32) of 32 lanes (four vectors), reduced
 *     vector-wise then with strata_hsum8 (fmt_float.c states it exactly);
 *   - the eight int32 lane sums a block's integer dot leaves become the float lanes
 *     directly, one fmaf per lane (K-quants, IQ formats: see avx2_kquants.h), which saves
 *     a horizontal sum per block.
 * The library builds with -ffp-contract=off, so a*b+c is never silently fused: write
 * fmaf() where you want an FMA (the AVX2 path then uses _mm256_fmadd_ps).
 */
#ifndef STRATA_QUANT_H
#define STRATA_QUANT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <math.h>

#define STRATA_QTYPE_MAX 48 /* ggml type ids are < 48 */
#define QK_K 256

/* Kernel paths, in the order of strata.h's strata_isa (index = public value - 1). */
enum {
    STRATA_ISA_IDX_SCALAR = 0,
    STRATA_ISA_IDX_AVX2 = 1,     /* AVX2 + FMA + F16C                          kernels/cpu/avx2_*.c   */
    STRATA_ISA_IDX_AVX_VNNI = 2, /* AVX2 + AVX-VNNI                            kernels/cpu/avxvnni_*.c */
    STRATA_ISA_IDX_AVX512 = 3,   /* AVX2 + AVX-512 F/BW/DQ/VL/VNNI/VBMI       kernels/cpu/avx512_*.c */
    STRATA_ISA_IDX_AMX = 4,      /* AVX512 + AMX-TILE/INT8                     kernels/cpu/amx_*.c    */
    STRATA_N_ISA = 5
};

/* The path whose kernels a path runs where it has none of its own (its features are a subset). */
static inline int strata_isa_fallback(int isa) {
    static const signed char fb[STRATA_N_ISA] = {-1, STRATA_ISA_IDX_SCALAR, STRATA_ISA_IDX_AVX2,
                                                  STRATA_ISA_IDX_AVX2, STRATA_ISA_IDX_AVX512};
    return isa > 0 && isa < STRATA_N_ISA ? fb[isa] : -1;
}
/* 1 if the path includes AVX2+FMA+F16C (so the avx2_*.c kernels may run on it). */
static inline int strata_isa_has_avx2(int isa) { return isa >= STRATA_ISA_IDX_AVX2 && isa < STRATA_N_ISA; }
/* 1 if the path includes AVX-512 (F/BW/DQ/VL/VNNI/VBMI). */
static inline int strata_isa_has_avx512(int isa) { return isa == STRATA_ISA_IDX_AVX512 || isa == STRATA_ISA_IDX_AMX; }

/* ggml type ids (gguf.GGMLQuantizationType) used by Strata. */
enum {
    GT_F32 = 0, GT_F16 = 1, GT_Q4_0 = 2, GT_Q4_1 = 3, GT_Q5_0 = 6, GT_Q5_1 = 7,
    GT_Q8_0 = 8, GT_Q8_1 = 9, GT_Q2_K = 10, GT_Q3_K = 11, GT_Q4_K = 12, GT_Q5_K = 13,
    GT_Q6_K = 14, GT_Q8_K = 15, GT_IQ2_XXS = 16, GT_IQ2_XS = 17, GT_IQ3_XXS = 18,
    GT_IQ1_S = 19, GT_IQ4_NL = 20, GT_IQ3_S = 21, GT_IQ2_S = 22, GT_IQ4_XS = 23,
    GT_I8 = 24, GT_I16 = 25, GT_I32 = 26, GT_I64 = 27, GT_F64 = 28, GT_IQ1_M = 29,
    GT_BF16 = 30, GT_TQ1_0 = 34, GT_TQ2_0 = 35, GT_MXFP4 = 39, GT_NVFP4 = 40
};

/* Activation formats a weight type multiplies against. */
typedef enum {
    STRATA_ACT_F32 = 0,    /* plain floats */
    STRATA_ACT_Q8_32 = 1,  /* act_q8_32 blocks: 32 values, float scale, int8 codes, code sum */
    STRATA_ACT_Q8_256 = 2  /* act_q8_256 blocks: 256 values, float scale, sums per 16 */
} strata_act_kind;

/* x[i] ~= d * qs[i]; qs = round-half-even(x * id), id = 1/(amax/127); d = amax/127 rounded to fp16
 * where fp16 holds it as a normal number (strata_act_d_q8_32), as ggml stores a q8_0 block's
 * scale, so that products with Q8_0 / Q4_x / Q5_x / IQ4_NL / MXFP4 / NVFP4 weights are llama.cpp's
 * to float summation order where ggml's scale is a normal fp16 (tests/test_flash_small.py); sum = sum
 * of qs. */
typedef struct {
    float d;
    int32_t sum;
    int8_t qs[32];
} act_q8_32; /* 40 bytes */

/* x[i] ~= d * qs[i] over 256 values; bsums[j] = sum of qs[16j .. 16j+15]. */
typedef struct {
    float d;
    int16_t bsums[16];
    int8_t qs[QK_K];
} act_q8_256; /* 292 bytes */

/* dst = n values (n a multiple of block_size) decoded from src. */
typedef void (*strata_dequant_fn)(const void *src, float *dst, int64_t n);
/* y[c] = dot(w, x_c) for c < ncols, x_c = (const char *)x + c * x_stride; n values. */
typedef void (*strata_vec_dot_fn)(int64_t n, const void *w, const void *x, size_t x_stride,
                                  int ncols, float *y);
/* nrows weight rows (w_row bytes apart) against ncols activation rows: y[c * ldy + r] = what vec_dot
 * returns for row r and column c, bit for bit (a kernel that loads each activation block once for
 * several rows). n values per row. */
typedef void (*strata_rows_fn)(int64_t n, const void *w, size_t w_row, int64_t nrows, const void *x,
                               size_t x_stride, int ncols, float *y, int64_t ldy);
/* When matmul uses a rows kernel (rows_when bits): */
enum {
    STRATA_ROWS_MULTI = 1,  /* products of several columns */
    STRATA_ROWS_SHORT1 = 2, /* one column, rows of at most 16 blocks */
    STRATA_ROWS_BIASED = 4, /* it reads activations stored biased (codes q ^ 0x80; strata_act_bias_q8_256) */
    STRATA_ROWS_FROM8 = 8   /* with MULTI: from 8 columns on; fewer take vec_dot */
};
/* Converted rows ("repack" for prefill, matmul.c): up to STRATA_CONV_ROWS weight rows (w_row bytes
 * apart, n values each) decoded once into dst, a layout of the path's own whose product with many
 * columns needs no decoding; dst 64-byte aligned; dst NULL: returns the bytes it needs, else the
 * bytes written. conv_dot: y[c * ldy + r] = what vec_dot returns for row r (< nrows) and column c
 * (unbiased activations, x_stride bytes apart), bit for bit; x16 holds the same columns' codes
 * widened to int16, n per column (strata_act_widen_q8_256). */
#define STRATA_CONV_ROWS 16
typedef size_t (*strata_conv_fn)(int64_t n, const void *w, size_t w_row, int64_t nrows, void *dst);
typedef void (*strata_conv_dot_fn)(int64_t n, const void *conv, int64_t nrows, const void *x, size_t x_stride,
                                   const int16_t *x16, int ncols, float *y, int64_t ldy);
/* nrows x n_per_row floats -> blocks; imatrix NULL or n_per_row weights. Returns bytes
 * written. Must be deterministic and thread-safe (called concurrently on row ranges). */
typedef size_t (*strata_quantize_fn)(const float *src, void *dst, int64_t nrows,
                                     int64_t n_per_row, const float *imatrix);

typedef struct {
    const char *name;        /* as gguf.GGMLQuantizationType names it */
    int32_t type;            /* ggml type id */
    int32_t block_size;      /* values per block */
    int32_t type_size;       /* bytes per block */
    strata_act_kind act;
    strata_dequant_fn dequant[STRATA_N_ISA];
    strata_vec_dot_fn vec_dot[STRATA_N_ISA];
    strata_rows_fn rows[STRATA_N_ISA];       /* optional; inherited from the fallback with vec_dot */
    uint8_t rows_when[STRATA_N_ISA];         /* STRATA_ROWS_* */
    strata_conv_fn conv[STRATA_N_ISA];       /* optional, with conv_dot; inherited from the fallback */
    strata_conv_dot_fn conv_dot[STRATA_N_ISA];
    strata_quantize_fn quantize;
} strata_qtraits;

/* Table lookup; NULL for an unknown or unregistered type. Thread-safe after first call. */
const strata_qtraits *strata_qtraits_get(int32_t type);
/* 1 if path idx (STRATA_ISA_IDX_*) was compiled in and runs on this CPU (util/cpu.c). */
int strata_cpu_has_isa(int idx);

/* Family registration (each fills its entries of a STRATA_QTYPE_MAX table). */
void strata_quant_register_float(strata_qtraits *t);    /* F32 F16 BF16            (fmt_float.c)  */
void strata_quant_register_legacy(strata_qtraits *t);   /* Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 (fmt_legacy.c) */
void strata_quant_register_fp4(strata_qtraits *t);      /* IQ4_NL MXFP4 NVFP4      (fmt_fp4.c)    */
void strata_quant_register_kquants(strata_qtraits *t);  /* Q2_K..Q6_K IQ4_XS       (fmt_kquants.c)*/
void strata_quant_register_iq(strata_qtraits *t);       /* IQ2_XXS IQ2_XS IQ3_XXS  (fmt_iq.c)     */
void strata_quant_register_quantizers(strata_qtraits *t); /* sets .quantize       (quantize*.c)  */

/* Activation quantizers (act.c); identical results on every path. n % block == 0. */
void strata_act_quantize_q8_32(const float *x, act_q8_32 *y, int64_t n, int isa);
void strata_act_quantize_q8_256(const float *x, act_q8_256 *y, int64_t n, int isa);
/* The codes of n values of act_q8_256 blocks, widened to int16 (the conversion path's x16). */
void strata_act_widen_q8_256(const act_q8_256 *x, int64_t n, int16_t *dst);

/* ---------------------------------------------------------------- shared scalar helpers */

static inline float strata_fp16_to_fp32(uint16_t h) {
    /* exact for every input, including subnormals, inf and NaN (payload kept) */
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1fu) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {
        /* subnormal: normalise */
        int e = -1;
        do { e++; man <<= 1; } while ((man & 0x400u) == 0);
        bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t strata_fp32_to_fp16(float f) {
    /* round to nearest even, as numpy's astype(float16) and F16C do */
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) { /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? (0x200u | ((ax >> 13) & 0x3ffu)) : 0));
    }
    if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow -> inf */
    if (ax < 0x38800000u) {                                  /* result subnormal or zero */
        if (ax < 0x33000000u) return (uint16_t)sign;          /* < half of smallest subnormal */
        const uint32_t e = ax >> 23;
        const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126u - e;                      /* 14..24 */
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((ax >> 13) - (112u << 10));
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}

static inline float strata_bf16_to_fp32(uint16_t h) {
    const uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Reference reduction of eight lane accumulators; strata_hsum8_avx2 matches it bit for bit:
 * ((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7)). */
static inline float strata_hsum8(const float a[8]) {
    const float s0 = a[0] + a[4], s1 = a[1] + a[5], s2 = a[2] + a[6], s3 = a[3] + a[7];
    return (s0 + s2) + (s1 + s3);
}

/* Scale and inverse scale of a block with largest magnitude amax. A block whose inverse
 * overflows (amax below ~1e-37: 1/d is inf) or whose amax is not finite is stored as zeros:
 * x * inf would give codes out of [-127, 127] and undefined conversions. */
static inline float strata_act_scale(float amax, float *id) {
    const float d = amax / 127.0f;
    const float inv = d != 0.0f ? 1.0f / d : 0.0f;
    if (!isfinite(inv) || !isfinite(d)) { *id = 0.0f; return 0.0f; }
    *id = inv;
    return d;
}

/* The scale an act_q8_32 block stores: d rounded to the nearest fp16 (ties to even) where fp16
 * holds it as a normal number (2^-14 <= d <= 65504), as ggml stores a q8_0 block's scale; d itself
 * outside (ggml's fp16 subnormals would cost tiny activations their precision, down to zero, and
 * large ones would overflow). The codes are made with the unrounded d's inverse, as ggml's
 * quantize_row_q8_0 does. Relative change of d: at most 2^-11. */
static inline float strata_act_d_q8_32(float d) {
    if (!(d >= 0x1p-14f && d <= 65504.0f)) return d;
    uint32_t x;
    memcpy(&x, &d, 4);
    x = (x + 0xfffu + ((x >> 13) & 1u)) & ~0x1fffu;
    memcpy(&d, &x, 4);
    return d;
}

static inline uint16_t strata_rd_u16(const void *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t strata_rd_u32(const void *p) { uint32_t v; memcpy(&v, p, 4); return v; }

#endif /* STRATA_QUANT_H */
