/* avx2_kquants.h — the K-quant family (Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_XS): block layouts, the
 * summation order of their dot products and its float step, shared by the scalar reference
 * (quant/fmt_kquants.c) and the AVX2 kernels (avx2_kquants.c), plus the AVX2 entry points.
 *
 * Summation order of vec_dot (both paths; what makes them agree bit for bit). Per super-block
 * the exact integer sums are split into eight lanes, l = 0..7, the int32 lanes in which
 * maddubs + madd leave them (qx: activation codes, bsums[t]: their sums over 16t..16t+15;
 * sc(i): the scale of value i's sub-block, sc16(t) / m16(t): scale / min of values 16t..):
 *   S_l = sum over values i with (i % 32) / 4 == l of sc(i) * code(i) * qx(i)
 *         - off * (sc16(2l) * bsums[2l] + sc16(2l+1) * bsums[2l+1])
 *   M_l = m16(2l) * bsums[2l] + m16(2l+1) * bsums[2l+1]          (Q2_K, Q4_K, Q5_K)
 * where code(i) is the value the kernel multiplies: the unsigned code q + off for Q3_K
 * (off = 4) and Q6_K (off = 32), the value itself (off = 0) otherwise. Block after block,
 * lane l of two float accumulators takes kq_lane_step: acc[l] = fma(xd*d, S_l, acc[l]) and,
 * with mins, accm[l] = fma(xd*dmin, M_l, accm[l]); the row's result is strata_hsum8 of the
 * lane-wise acc - accm (of acc without mins). This replaces the "block b to lane b % 8"
 * recipe of quant.h: no horizontal sum per block, one FMA per lane, and as exact.
 *
 * Every block below is made of bytes only, so the structs have no padding and may alias the
 * file's bytes (alignment 1); fp16 fields are read with strata_rd_u16.
 */
#ifndef STRATA_KERNELS_CPU_AVX2_KQUANTS_H
#define STRATA_KERNELS_CPU_AVX2_KQUANTS_H

#include "../../quant/quant.h"

/* Q2_K, 84 bytes: w = (d*sc_j)*q - (dmin*m_j), q 2-bit, j = i/16. */
typedef struct {
    uint8_t scales[16]; /* sub-block j: low nibble sc_j, high nibble m_j */
    uint8_t qs[64];     /* value 128c+32s+k: bits 2s..2s+1 of qs[32c+k] */
    uint8_t d[2], dmin[2];
} kq_block_q2_k;

/* Q3_K, 110 bytes: w = (d*s_j)*q, q = (2 low bits) - 4*(1 - high bit), j = i/16. */
typedef struct {
    uint8_t hmask[32];  /* value i: bit i/32 of hmask[i%32] (set means no -4 offset) */
    uint8_t qs[64];     /* low 2 bits, packed as in Q2_K */
    uint8_t scales[12]; /* 16 x 6-bit, s_j = raw - 32; low nibbles in bytes 0-7, high pairs in 8-11 */
    uint8_t d[2];
} kq_block_q3_k;

/* Q4_K, 144 bytes: w = (d*sc_j)*q - (dmin*m_j), q 4-bit, j = i/32. */
typedef struct {
    uint8_t d[2], dmin[2];
    uint8_t scales[12]; /* 8 x 6-bit sc and 8 x 6-bit m (see kq_unpack_k4) */
    uint8_t qs[128];    /* value 64c+32h+k: nibble h of qs[32c+k] */
} kq_block_q4_k;

/* Q5_K, 176 bytes: as Q4_K with a fifth bit: q = nibble | 16 * (bit i/32 of qh[i%32]). */
typedef struct {
    uint8_t d[2], dmin[2];
    uint8_t scales[12];
    uint8_t qh[32];
    uint8_t qs[128];
} kq_block_q5_k;

/* Q6_K, 210 bytes: w = (d*s_j)*(q - 32), q 6-bit, s_j int8, j = i/16. */
typedef struct {
    uint8_t ql[128];   /* value 128c+64h+k (k < 64): nibble h of ql[64c+k] */
    uint8_t qh[64];    /* value 128c+32s+k (k < 32): bits 2s..2s+1 of qh[32c+k] -> q bits 4-5 */
    int8_t scales[16];
    uint8_t d[2];
} kq_block_q6_k;

/* IQ4_XS, 136 bytes: w = (d*s_j)*kvalues_iq4nl[q], q 4-bit, j = i/32, s_j = 6-bit - 32. */
typedef struct {
    uint8_t d[2];
    uint8_t scales_h[2]; /* little-endian u16: bits 2j..2j+1 are the high bits of s_j */
    uint8_t scales_l[4]; /* nibble (j%2) of scales_l[j/2]: the low bits of s_j */
    uint8_t qs[128];     /* value 32j+k: low nibble of qs[16j+k] (k < 16), else high nibble of qs[16j+k-16] */
} kq_block_iq4_xs;

/* The float step of one lane of a block: the AVX2 path does the same operations lane-wise
 * (mul, convert, _mm256_fmadd_ps). xd: activation scale, d: the block's d or dmin, S: the
 * exact lane sum (S_l or M_l). */
static inline float kq_lane_step(float xd, float d, int32_t S, float acc) {
    return fmaf(xd * d, (float)S, acc);
}

#if STRATA_HAVE_AVX2
void strata_avx2_dequant_q2_k(const void *src, float *dst, int64_t n);
void strata_avx2_dequant_q3_k(const void *src, float *dst, int64_t n);
void strata_avx2_dequant_q4_k(const void *src, float *dst, int64_t n);
void strata_avx2_dequant_q5_k(const void *src, float *dst, int64_t n);
void strata_avx2_dequant_q6_k(const void *src, float *dst, int64_t n);
void strata_avx2_dequant_iq4_xs(const void *src, float *dst, int64_t n);

void strata_avx2_vec_dot_q2_k(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx2_vec_dot_q3_k(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx2_vec_dot_q4_k(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx2_vec_dot_q5_k(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx2_vec_dot_q6_k(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
void strata_avx2_vec_dot_iq4_xs(int64_t n, const void *w, const void *x, size_t x_stride, int ncols, float *y);
#endif

#endif
