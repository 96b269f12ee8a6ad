/*
 * quantize.c — float -> blocks for Q8_0, Q5_1, MXFP4, Q4_K, Q6_K, IQ4_NL and NVFP4.
 *
 * Two kinds of quantizer live here:
 *   - Q8_0, Q5_1, MXFP4 reproduce gguf.quants.quantize BIT FOR BIT (files written by Strata and
 *     by gguf-py must be identical). Every float operation below mirrors a numpy float32
 *     operation of gguf/quants.py, in the same order; the comments name the numpy expression.
 *     These ignore the importance matrix, as gguf does.
 *   - Q4_K, Q6_K, IQ4_NL, NVFP4 search their scales to minimise sum_i w_i (x_i - y_i)^2, where
 *     y = dequantize(quantize(x)) and w = the importance matrix (1 without one). They are not
 *     ggml's algorithms; tests/test_quantize.py holds them to llama.cpp's error.
 *
 * Block layouts (byte offsets within one block; "q[i]" is the code of value i):
 *   Q8_0   (32 values, 34 B): d f16 | qs[32] int8, x = d*q
 *   Q5_1   (32 values, 24 B): d f16 | m f16 | qh u32 (bit i = q[i]>>4) | qs[16]: q[j]&15 | (q[j+16]&15)<<4
 *          x = d*q + m, q in 0..31
 *   MXFP4  (32 values, 17 B): e (E8M0) | qs[16]: q[j] | q[j+16]<<4; q indexes the doubled E2M1 table,
 *          x = 2^(e-128) * kvalues[q]
 *   Q4_K   (256 values, 144 B): d f16 | dmin f16 | scales[12] (eight 6-bit sc and m, packed as in
 *          Q4_K.get_scale_min) | qs[128]: for chunk c<4, byte 32c+l = q[64c+l] | q[64c+32+l]<<4;
 *          x = (d*sc[j])*q - (dmin*m[j]) for sub-block j = i/32, q in 0..15
 *   Q6_K   (256 values, 210 B): ql[128] | qh[64] | scales[16] int8 | d f16; for half h = i/128,
 *          r = i%128: low 4 bits in nibble r/64 of ql[64h + r%64], high 2 bits at bit 2*(r/32) of
 *          qh[32h + r%32]; x = (d*sc[i/16]) * (q - 32), q in 0..63
 *   IQ4_NL (32 values, 18 B): d f16 | qs[16]: q[j] | q[j+16]<<4; x = d * kvalues_iq4nl[q]
 *   NVFP4  (64 values, 36 B): s[4] UE4M3 (one per 16 values) | 4 x 8 bytes: byte 8k+j of the
 *          codes holds q[16k+j] | q[16k+8+j]<<4; x = (ue4m3(s[k])/2) * kvalues_nvfp4[q]
 *
 * All quantizers are pure functions of their inputs (no static mutable state), so they are
 * deterministic and may run concurrently on disjoint row ranges.
 */
#include "quant.h"
#include "quant_tables.h"

#include <float.h>

/* ================================================================ numpy emulation */

/* numpy's float32 -> int8/uint8 cast on x86-64: truncate to int32 (cvttss2si; NaN, inf and
 * out-of-range give INT32_MIN), keep the low byte. Written without UB. */
static uint8_t np_cast_u8(float v) {
    if (!(fabsf(v) < 2147483648.0f)) return 0;
    return (uint8_t)((uint32_t)(int32_t)v & 0xffu);
}

/* numpy max/min propagate NaN; fmaxf would drop it. */
static float np_max(float a, float b) { return (isnan(a) || a >= b) ? a : b; }
static float np_min(float a, float b) { return (isnan(a) || a <= b) ? a : b; }

/* gguf's np_roundf: round half away from zero, on float32 (== roundf for finite values). */
static float np_roundf(float v) { return isfinite(v) ? roundf(v) : v; }

static float fp16_round(float f) { return strata_fp16_to_fp32(strata_fp32_to_fp16(f)); }

static void put_f16(uint8_t *p, float f) {
    const uint16_t h = strata_fp32_to_fp16(f);
    memcpy(p, &h, 2);
}

/* ================================================================ Q8_0 (gguf-exact) */

static size_t quantize_q8_0(const float *src, void *dst, int64_t nrows, int64_t n_per_row,
                            const float *imatrix) {
    (void)imatrix;
    const int64_t nb = nrows * n_per_row / 32;
    uint8_t *out = dst;
    for (int64_t b = 0; b < nb; b++, out += 34) {
        const float *x = src + b * 32;
        float amax = fabsf(x[0]);
        for (int i = 1; i < 32; i++) amax = np_max(amax, fabsf(x[i]));
        const float d = amax / 127.0f;                  /* abs(blocks).max() / 127 */
        const float id = d == 0.0f ? 0.0f : 1.0f / d;   /* np.where(d == 0, 0, 1 / d) */
        put_f16(out, d);
        for (int i = 0; i < 32; i++) out[2 + i] = np_cast_u8(np_roundf(x[i] * id));
    }
    return (size_t)nb * 34;
}

/* ================================================================ Q5_1 (gguf-exact) */

static size_t quantize_q5_1(const float *src, void *dst, int64_t nrows, int64_t n_per_row,
                            const float *imatrix) {
    (void)imatrix;
    const int64_t nb = nrows * n_per_row / 32;
    uint8_t *out = dst;
    for (int64_t b = 0; b < nb; b++, out += 24) {
        const float *x = src + b * 32;
        float mx = x[0], mn = x[0];
        for (int i = 1; i < 32; i++) { mx = np_max(mx, x[i]); mn = np_min(mn, x[i]); }
        const float d = (mx - mn) / 31.0f;
        const float id = d == 0.0f ? 0.0f : 1.0f / d;
        uint8_t q[32];
        uint32_t qh = 0;
        for (int i = 0; i < 32; i++) {
            /* np.trunc((blocks - min) * id + 0.5).astype(uint8).clip(0, 31) */
            const uint8_t v = np_cast_u8(truncf((x[i] - mn) * id + 0.5f));
            q[i] = v > 31 ? 31 : v;
            qh |= (uint32_t)(q[i] >> 4) << i;
        }
        put_f16(out, d);
        put_f16(out + 2, mn);
        memcpy(out + 4, &qh, 4); /* packbits(bitorder="little") of 32 bits == little-endian u32 */
        for (int j = 0; j < 16; j++) out[8 + j] = (uint8_t)((q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4));
    }
    return (size_t)nb * 24;
}

/* ================================================================ MXFP4 (gguf-exact) */

/* MXFP4.e8m0_to_fp32_half: 2^(e-128) as float, subnormal for e < 2. */
static float e8m0_to_fp32_half(uint8_t e) {
    const uint32_t bits = e < 2 ? (0x00200000u << e) : ((uint32_t)(e - 1) << 23);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static size_t quantize_mxfp4(const float *src, void *dst, int64_t nrows, int64_t n_per_row,
                             const float *imatrix) {
    (void)imatrix;
    const int64_t nb = nrows * n_per_row / 32;
    uint8_t *out = dst;
    for (int64_t b = 0; b < nb; b++, out += 17) {
        const float *x = src + b * 32;
        float amax = fabsf(x[0]);
        for (int i = 1; i < 32; i++) amax = np_max(amax, fabsf(x[i]));
        /* e = where(d > 0, floor(log2(d)) - 2 + 127, 0).astype(uint8). numpy's float32 log2
         * is correctly rounded, which (float)log2(double) reproduces: near a power of two the
         * rounding decides the floor, so log2f() of an arbitrary libm is not good enough. */
        uint8_t e = 0;
        if (amax > 0.0f) e = np_cast_u8(floorf((float)log2((double)amax)) - 2.0f + 127.0f);
        const float d = e8m0_to_fp32_half(e);
        out[0] = e;
        uint8_t q[32];
        for (int i = 0; i < 32; i++) {
            /* argmin over |d*k - x| of the 16 table entries: first minimum wins, a NaN wins
             * outright (np.argmin semantics). */
            int best = 0;
            float best_err = fabsf(d * (float)strata_kvalues_mxfp4[0] - x[i]);
            if (!isnan(best_err)) {
                for (int k = 1; k < 16; k++) {
                    const float err = fabsf(d * (float)strata_kvalues_mxfp4[k] - x[i]);
                    if (isnan(err)) { best = k; break; }
                    if (err < best_err) { best_err = err; best = k; }
                }
            }
            q[i] = (uint8_t)best;
        }
        for (int j = 0; j < 16; j++) out[1 + j] = (uint8_t)(q[j] | (q[j + 16] << 4));
    }
    return (size_t)nb * 17;
}

/* ================================================================ search helpers */

/* The searches below evaluate many candidate scales on groups of 16 or 32 values. Their inner
 * loops are written element-wise into small arrays and summed in eight fixed lanes, so the
 * compiler vectorises them while the summation order (and the result) stays fixed. */
#define QLANES 8
#define QMAXG 32 /* the largest group a search sees */

static float lane_sum(const float *v, int n) {
    float acc[QLANES] = {0};
    for (int i = 0; i < n; i += QLANES)
        for (int j = 0; j < QLANES; j++) acc[j] += v[i + j];
    return strata_hsum8(acc);
}

/* Round to nearest (ties to even) and clamp to [lo, hi] in float; NaN (only from NaN input)
 * stays NaN and is mapped to a valid code by code_int. */
static inline float rclamp(float v, float lo, float hi) {
    v = rintf(v);
    v = v < lo ? lo : v;
    return v > hi ? hi : v;
}

static int code_int(float q, int lo) { return q == q ? (int)q : lo; }

/* Round to nearest and clamp, for a scalar that may be anything. */
static int clamp_round(float v, int lo, int hi) {
    if (!(v > (float)lo)) return lo; /* also NaN */
    if (v >= (float)hi) return hi;
    return (int)lrintf(v);
}

/* Clamp a super-block scale into finite fp16 so that huge inputs saturate instead of
 * producing inf/NaN blocks. */
static float clamp_fp16_range(float v) {
    if (v > 65504.0f) return 65504.0f;
    if (v < -65504.0f) return -65504.0f;
    return v;
}

/* The weights of a block, group by group: the importance matrix, or ones where there is none
 * or where it is zero over the whole group (such a group would otherwise get no fit at all,
 * and any fit is as good as another for the weighted error). */
static void block_weights(const float *im, int n, int group, float *wb) {
    for (int g = 0; g < n; g += group) {
        float s = 0.0f;
        if (im)
            for (int i = g; i < g + group; i++) s += im[i] > 0.0f ? im[i] : 0.0f;
        for (int i = g; i < g + group; i++) wb[i] = s > 0.0f ? (im[i] > 0.0f ? im[i] : 0.0f) : 1.0f;
    }
}

/* ---------------------------------------------------------------- integer grid, scale only */

/* sum w x q and sum w q^2 for codes q = rclamp(x * is) */
static void int_sums(const float *x, const float *w, const float *wx, int n, float is, float lo, float hi,
                     float *sxq, float *sqq) {
    float a1[QMAXG], a2[QMAXG];
    for (int i = 0; i < n; i++) {
        const float q = rclamp(x[i] * is, lo, hi);
        a1[i] = wx[i] * q;
        a2[i] = w[i] * q * q;
    }
    *sxq = lane_sum(a1, n);
    *sqq = lane_sum(a2, n);
}

/* Scale s minimising sum w (x - s*q)^2 with integer q in [lo, hi] (s may be negative). The
 * inverse scales tried put the value of largest magnitude on points near either end of the
 * range (slightly past the end clips it); each candidate's codes are refitted by least squares
 * (error = sum w x^2 - sxq^2/sqq) and the best is polished by assign/refit rounds. */
static float fit_scale_int(const float *x, const float *w, int n, float lo, float hi) {
    float wx[QMAXG];
    float amax = 0.0f, m = 0.0f;
    for (int i = 0; i < n; i++) {
        wx[i] = w[i] * x[i];
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); m = x[i]; }
    }
    if (!(amax > 0.0f) || !isfinite(amax)) return 0.0f;
    float best_gain = -1.0f, best_s = 0.0f, sxq, sqq;
    for (int side = 0; side < 2; side++) {
        const float end = side ? hi : lo, dir = side ? -1.0f : 1.0f; /* dir: towards the middle */
        for (int k = -1; k <= 10; k++) {
            int_sums(x, w, wx, n, (end + dir * 0.5f * (float)k) / m, lo, hi, &sxq, &sqq);
            if (!(sqq > 0.0f)) continue;
            const float gain = sxq * sxq / sqq;
            if (gain > best_gain) { best_gain = gain; best_s = sxq / sqq; }
        }
    }
    for (int it = 0; it < 3 && best_s != 0.0f; it++) {
        int_sums(x, w, wx, n, 1.0f / best_s, lo, hi, &sxq, &sqq);
        if (!(sqq > 0.0f)) break;
        const float gain = sxq * sxq / sqq;
        if (!(gain > best_gain)) break;
        best_gain = gain;
        best_s = sxq / sqq;
    }
    return best_s;
}

/* ---------------------------------------------------------------- integer grid with a min */

/* (s, b) minimising sum w (x - s*q - b)^2 with q in [0, qmax] and b <= 0 (the K-quant min is
 * subtracted with an unsigned code). Same sweep / refit / polish scheme as fit_scale_int. */
typedef struct {
    float s, b;
} affine_fit;

typedef struct {
    float sw, sx, sxx; /* fixed per group */
    float sq, sqq, sxq; /* per candidate */
} affine_sums;

/* Least-squares (s, b) for fixed codes, b clamped to <= 0; returns the weighted error. */
static double affine_solve(const affine_sums *a, float *s, float *b) {
    const double sw = a->sw, sx = a->sx, sq = a->sq, sqq = a->sqq, sxq = a->sxq;
    const double det = sw * sqq - sq * sq;
    double ss = 0.0, bb = 0.0;
    if (det > 0.0) {
        ss = (sw * sxq - sq * sx) / det;
        bb = (sqq * sx - sq * sxq) / det;
    }
    if (!(det > 0.0) || bb > 0.0) { /* the min must stay <= 0: fit the scale alone */
        bb = 0.0;
        ss = sqq > 0.0 ? sxq / sqq : 0.0;
    }
    if (ss < 0.0) ss = 0.0;
    *s = (float)ss;
    *b = (float)bb;
    return a->sxx - 2.0 * ss * sxq - 2.0 * bb * sx + ss * ss * sqq + 2.0 * ss * bb * sq + bb * bb * sw;
}

static void affine_codes(const float *x, const float *w, const float *wx, int n, float base, float is,
                         float qmax, affine_sums *a) {
    float a1[QMAXG], a2[QMAXG], a3[QMAXG];
    for (int i = 0; i < n; i++) {
        const float q = rclamp((x[i] - base) * is, 0.0f, qmax);
        a1[i] = w[i] * q;
        a2[i] = a1[i] * q;
        a3[i] = wx[i] * q;
    }
    a->sq = lane_sum(a1, n);
    a->sqq = lane_sum(a2, n);
    a->sxq = lane_sum(a3, n);
}

static affine_fit fit_affine(const float *x, const float *w, int n, float qmax) {
    float wx[QMAXG], wxx[QMAXG];
    float mn = 0.0f, mx = x[0];
    for (int i = 0; i < n; i++) {
        wx[i] = w[i] * x[i];
        wxx[i] = wx[i] * x[i];
        mn = x[i] < mn ? x[i] : mn;
        mx = x[i] > mx ? x[i] : mx;
    }
    affine_fit best = {0.0f, mn};
    if (!(mx > mn) || !isfinite(mx - mn)) return best; /* flat: s = 0, b = the min */
    affine_sums a = {lane_sum(w, n), lane_sum(wx, n), lane_sum(wxx, n), 0, 0, 0};
    double best_err = INFINITY;
    const float range = mx - mn;
    for (int k = -15; k <= 10; k++) {
        affine_codes(x, w, wx, n, mn, (qmax + 0.1f * (float)k) / range, qmax, &a);
        float s, b;
        const double err = affine_solve(&a, &s, &b);
        if (err < best_err) { best_err = err; best.s = s; best.b = b; }
    }
    for (int it = 0; it < 3 && best.s > 0.0f; it++) {
        affine_codes(x, w, wx, n, best.b, 1.0f / best.s, qmax, &a);
        float s, b;
        const double err = affine_solve(&a, &s, &b);
        if (!(err < best_err)) break;
        best_err = err;
        best.s = s;
        best.b = b;
    }
    return best;
}

/* ================================================================ Q6_K */

/* Error of one 16-value sub-block at integer scale sc under super-scale d, codes re-chosen;
 * computed as gguf dequantizes: (d*sc) * q. Writes the codes (-32..31) when q is not NULL. */
static float q6k_sub_err(const float *x, const float *w, float d, int sc, float *q) {
    const float S = d * (float)sc;
    const float is = S != 0.0f ? 1.0f / S : 0.0f;
    float e2[16], qq[16];
    for (int i = 0; i < 16; i++) {
        qq[i] = rclamp(x[i] * is, -32.0f, 31.0f);
        const float e = x[i] - S * qq[i];
        e2[i] = w[i] * e * e;
    }
    if (q) memcpy(q, qq, sizeof qq);
    return lane_sum(e2, 16);
}

/* Best integer scale in [-128, 127] near s/d, by the error with re-chosen codes. */
static float q6k_pick_sc(const float *x, const float *w, float d, float s, int *sc_out) {
    const int c = d != 0.0f ? clamp_round(s / d, -128, 127) : 0;
    int best_sc = c;
    float best = q6k_sub_err(x, w, d, c, NULL);
    for (int delta = -2; delta <= 2; delta++) {
        const int sc = c + delta;
        if (delta == 0 || sc < -128 || sc > 127) continue;
        const float e = q6k_sub_err(x, w, d, sc, NULL);
        if (e < best) { best = e; best_sc = sc; }
    }
    *sc_out = best_sc;
    return best;
}

/* Picks every sub-block's integer scale under super-scale d; returns the block error and the
 * least-squares super-scale for the codes chosen (0 if there is none). */
static double q6k_try_d(const float *x, const float *w, const float *s, float d, int *sc, float *d_ls) {
    double err = 0.0, sxu = 0.0, suu = 0.0;
    for (int j = 0; j < 16; j++) {
        const float *xj = x + 16 * j, *wj = w + 16 * j;
        float q[16], a1[16], a2[16];
        err += q6k_pick_sc(xj, wj, d, s[j], &sc[j]);
        q6k_sub_err(xj, wj, d, sc[j], q);
        for (int i = 0; i < 16; i++) {
            const float u = (float)sc[j] * q[i]; /* exact: |u| <= 4096 */
            a1[i] = wj[i] * xj[i] * u;
            a2[i] = wj[i] * u * u;
        }
        sxu += lane_sum(a1, 16);
        suu += lane_sum(a2, 16);
    }
    *d_ls = suu > 0.0 ? (float)(sxu / suu) : 0.0f;
    return err;
}

static void q6k_block(const float *x, const float *imatrix, uint8_t *out) {
    float w[QK_K], s[16];
    block_weights(imatrix, QK_K, 16, w);
    float smax = 0.0f, sabs = 0.0f;
    for (int j = 0; j < 16; j++) {
        s[j] = fit_scale_int(x + 16 * j, w + 16 * j, 16, -32.0f, 31.0f);
        if (fabsf(s[j]) > sabs) { sabs = fabsf(s[j]); smax = s[j]; }
    }
    int sc[16] = {0};
    float d = 0.0f;
    if (sabs > 0.0f) {
        /* Seeds: the largest sub-block scale on -128 (the int8 end of larger magnitude) or on
         * +127; from each, rounds of "refit d by least squares for the codes chosen, re-pick
         * the integer scales" while d moves. */
        double best_err = INFINITY;
        const float seeds[2] = {-smax / 128.0f, smax / 127.0f};
        for (int sd = 0; sd < 2; sd++) {
            float dc = seeds[sd];
            for (int it = 0; it < 3; it++) {
                dc = fp16_round(clamp_fp16_range(dc));
                if (dc == 0.0f) break;
                int scc[16];
                float d_ls;
                const double err = q6k_try_d(x, w, s, dc, scc, &d_ls);
                if (err < best_err) {
                    best_err = err;
                    d = dc;
                    memcpy(sc, scc, sizeof sc);
                }
                if (fp16_round(clamp_fp16_range(d_ls)) == dc) break;
                dc = d_ls;
            }
        }
    }
    uint8_t *ql = out, *qh = out + 128;
    memset(out, 0, 192);
    for (int j = 0; j < 16; j++) {
        float q[16];
        q6k_sub_err(x + 16 * j, w + 16 * j, d, sc[j], q);
        out[192 + j] = (uint8_t)(int8_t)sc[j];
        for (int l = 0; l < 16; l++) {
            const int i = 16 * j + l;
            const int u = code_int(q[l], 0) + 32, h = i / 128, r = i % 128;
            ql[64 * h + r % 64] |= (uint8_t)((u & 0x0f) << (4 * (r / 64)));
            qh[32 * h + r % 32] |= (uint8_t)((u >> 4) << (2 * (r / 32)));
        }
    }
    put_f16(out + 208, d);
}

static size_t quantize_q6_k(const float *src, void *dst, int64_t nrows, int64_t n_per_row,
                            const float *imatrix) {
    const int64_t nbr = n_per_row / QK_K;
    uint8_t *out = dst;
    for (int64_t r = 0; r < nrows; r++)
        for (int64_t b = 0; b < nbr; b++, out += 210)
            q6k_block(src + r * n_per_row + b * QK_K, imatrix ? imatrix + b * QK_K : NULL, out);
    return (size_t)(nrows * nbr) * 210;
}

/* ================================================================ Q4_K */

/* Error of one 32-value sub-block at 6-bit scale sc and min mc under (d, dmin), codes
 * re-chosen; computed as gguf dequantizes: (d*sc)*q - (dmin*mc). */
static float q4k_sub_err(const float *x, const float *w, float d, float dmin, int sc, int mc, float *q) {
    const float S = d * (float)sc, M = dmin * (float)mc;
    const float is = S != 0.0f ? 1.0f / S : 0.0f;
    float e2[32], qq[32];
    for (int i = 0; i < 32; i++) {
        qq[i] = rclamp((x[i] + M) * is, 0.0f, 15.0f);
        const float e = x[i] - (S * qq[i] - M);
        e2[i] = w[i] * e * e;
    }
    if (q) memcpy(q, qq, sizeof qq);
    return lane_sum(e2, 32);
}

/* Picks every sub-block's (sc, m) among the 3x3 neighbours of the continuous fit under
 * (d, dmin); returns the block error and the least-squares (d, dmin) for the codes chosen. */
static double q4k_try(const float *x, const float *w, const affine_fit *f, float d, float dmin,
                      int *sc, int *mc, float *d_ls, float *dmin_ls) {
    double err = 0.0;
    double suu = 0, suv = 0, svv = 0, sxu = 0, sxv = 0; /* x ~ d*u - dmin*v, u = sc*q, v = m */
    for (int j = 0; j < 8; j++) {
        const float *xj = x + 32 * j, *wj = w + 32 * j;
        const int c0 = d > 0.0f ? clamp_round(f[j].s / d, 0, 63) : 0;
        const int m0 = dmin > 0.0f ? clamp_round(-f[j].b / dmin, 0, 63) : 0;
        float best = INFINITY;
        sc[j] = c0;
        mc[j] = m0;
        for (int dc = -1; dc <= 1; dc++) {
            for (int dm = -1; dm <= 1; dm++) {
                const int c = c0 + dc, m = m0 + dm;
                if (c < 0 || c > 63 || m < 0 || m > 63) continue;
                const float e = q4k_sub_err(xj, wj, d, dmin, c, m, NULL);
                if (e < best) { best = e; sc[j] = c; mc[j] = m; }
            }
        }
        err += best;
        float q[32], au[32], auu[32], axu[32];
        q4k_sub_err(xj, wj, d, dmin, sc[j], mc[j], q);
        for (int i = 0; i < 32; i++) {
            const float u = (float)sc[j] * q[i]; /* exact: u <= 945 */
            au[i] = wj[i] * u;
            auu[i] = au[i] * u;
            axu[i] = au[i] * xj[i];
        }
        const double v = mc[j], su = lane_sum(au, 32), sw = lane_sum(wj, 32);
        float wx[32];
        for (int i = 0; i < 32; i++) wx[i] = wj[i] * xj[i];
        suu += lane_sum(auu, 32);
        suv += su * v;
        svv += sw * v * v;
        sxu += lane_sum(axu, 32);
        sxv += lane_sum(wx, 32) * v;
    }
    const double det = suu * svv - suv * suv; /* minimise sum w (x - d u + dmin v)^2 */
    if (det > 0.0) {
        *d_ls = (float)((sxu * svv - sxv * suv) / det);
        *dmin_ls = (float)((sxu * suv - sxv * suu) / det);
    } else {
        *d_ls = suu > 0.0 ? (float)(sxu / suu) : d;
        *dmin_ls = dmin;
    }
    if (!(*dmin_ls >= 0.0f)) *dmin_ls = 0.0f;
    if (!(*d_ls >= 0.0f)) *d_ls = 0.0f;
    return err;
}

static void q4k_block(const float *x, const float *imatrix, uint8_t *out) {
    float w[QK_K];
    block_weights(imatrix, QK_K, 32, w);
    affine_fit f[8];
    float smax = 0.0f, mmax = 0.0f;
    for (int j = 0; j < 8; j++) {
        f[j] = fit_affine(x + 32 * j, w + 32 * j, 32, 15.0f);
        if (f[j].s > smax) smax = f[j].s;
        if (-f[j].b > mmax) mmax = -f[j].b;
    }
    int sc[8] = {0}, mc[8] = {0};
    float d = 0.0f, dmin = 0.0f;
    /* seed: the largest scale and the largest min on code 63; then rounds of "refit (d, dmin)
     * by least squares for the codes chosen, re-pick the 6-bit values" while that helps */
    float dc = smax / 63.0f, mdc = mmax / 63.0f;
    double best_err = INFINITY;
    for (int it = 0; it < 4; it++) {
        dc = fp16_round(clamp_fp16_range(dc));
        mdc = fp16_round(clamp_fp16_range(mdc));
        int scc[8], mcc[8];
        float d_ls, dmin_ls;
        const double err = q4k_try(x, w, f, dc, mdc, scc, mcc, &d_ls, &dmin_ls);
        if (!(err < best_err)) break;
        best_err = err;
        d = dc;
        dmin = mdc;
        memcpy(sc, scc, sizeof sc);
        memcpy(mc, mcc, sizeof mc);
        if (fp16_round(clamp_fp16_range(d_ls)) == dc && fp16_round(clamp_fp16_range(dmin_ls)) == mdc) break;
        dc = d_ls;
        mdc = dmin_ls;
    }
    put_f16(out, d);
    put_f16(out + 2, dmin);
    uint8_t *scales = out + 4, *qs = out + 16;
    for (int j = 0; j < 4; j++) { /* the packing Q4_K.get_scale_min undoes */
        scales[j] = (uint8_t)((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
        scales[j + 4] = (uint8_t)((mc[j] & 63) | ((mc[j + 4] >> 4) << 6));
        scales[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((mc[j + 4] & 15) << 4));
    }
    float q[QK_K];
    for (int j = 0; j < 8; j++) q4k_sub_err(x + 32 * j, w + 32 * j, d, dmin, sc[j], mc[j], q + 32 * j);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++)
            qs[32 * c + l] = (uint8_t)(code_int(q[64 * c + l], 0) | (code_int(q[64 * c + 32 + l], 0) << 4));
}

static size_t quantize_q4_k(const float *src, void *dst, int64_t nrows, int64_t n_per_row,
                            const float *imatrix) {
    const int64_t nbr = n_per_row / QK_K;
    uint8_t *out = dst;
    for (int64_t r = 0; r < nrows; r++)
        for (int64_t b = 0; b < nbr; b++, out += 144)
            q4k_block(src + r * n_per_row + b * QK_K, imatrix ? imatrix + b * QK_K : NULL, out);
    return (size_t)(nrows * nbr) * 144;
}

/* ================================================================ IQ4_NL */

typedef struct {
    float tbl[16]; /* ascending */
    float mid[15]; /* mid[k] = (tbl[k] + tbl[k+1]) / 2 */
    float step[15]; /* tbl[k+1] - tbl[k] */
} nl_table;

/* t[i] = the table entry nearest to v[i] (k[i] its index when k is not NULL): tbl[0] plus the
 * steps whose midpoint v[i] exceeds; branch-free so that it vectorises. */
static inline void nl_lookup(const nl_table *T, const float *v, int n, float *t, float *k) {
    for (int i = 0; i < n; i++) {
        float ti = T->tbl[0];
        for (int m = 0; m < 15; m++) ti += (float)(v[i] > T->mid[m]) * T->step[m];
        t[i] = ti;
    }
    if (!k) return;
    for (int i = 0; i < n; i++) {
        float ki = 0.0f;
        for (int m = 0; m < 15; m++) ki += (float)(v[i] > T->mid[m]);
        k[i] = ki;
    }
}

/* Weighted error at scale d with the nearest codes, as gguf dequantizes: d * table[q]. */
static float nl_err(const nl_table *T, const float *x, const float *w, int n, float d, float *k) {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    float v[QMAXG], t[QMAXG], e2[QMAXG];
    for (int i = 0; i < n; i++) v[i] = x[i] * id;
    nl_lookup(T, v, n, t, k);
    for (int i = 0; i < n; i++) {
        const float e = x[i] - d * t[i];
        e2[i] = w[i] * e * e;
    }
    return lane_sum(e2, n);
}

/* Least-squares gain sxq^2/sqq and scale for the codes nearest to x * is. */
static float nl_gain(const nl_table *T, const float *x, const float *w, const float *wx, int n, float is,
                     float *s) {
    float v[QMAXG], t[QMAXG], a1[QMAXG], a2[QMAXG];
    for (int i = 0; i < n; i++) v[i] = x[i] * is;
    nl_lookup(T, v, n, t, NULL);
    for (int i = 0; i < n; i++) {
        a1[i] = wx[i] * t[i];
        a2[i] = w[i] * t[i] * t[i];
    }
    const float sxq = lane_sum(a1, n), sqq = lane_sum(a2, n);
    if (!(sqq > 0.0f)) return -1.0f;
    *s = sxq / sqq;
    return sxq * sxq / sqq;
}

/* Scale d minimising sum w (x - d*tbl[q])^2: a sweep of inverse scales that put the largest
 * value near either end of the table, least-squares refits, assign/refit rounds; then the fp16
 * value of d is chosen among its neighbours by the exact error. Writes the codes for it. */
static float fit_table_fp16(const nl_table *T, const float *x, const float *w, int n, float *k) {
    float wx[QMAXG];
    float amax = 0.0f, m = 0.0f;
    for (int i = 0; i < n; i++) {
        wx[i] = w[i] * x[i];
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); m = x[i]; }
    }
    float best_d = 0.0f;
    if (amax > 0.0f && isfinite(amax)) {
        const float step = (T->tbl[15] - T->tbl[0]) / 240.0f;
        float best_gain = -1.0f, s;
        for (int side = 0; side < 2; side++) {
            const float end = side ? T->tbl[15] : T->tbl[0], dir = side ? -1.0f : 1.0f;
            for (int j = -6; j <= 24; j++) {
                const float g = nl_gain(T, x, w, wx, n, (end + dir * step * (float)j) / m, &s);
                if (g > best_gain) { best_gain = g; best_d = s; }
            }
        }
        for (int it = 0; it < 3 && best_d != 0.0f; it++) {
            const float g = nl_gain(T, x, w, wx, n, 1.0f / best_d, &s);
            if (!(g > best_gain)) break;
            best_gain = g;
            best_d = s;
        }
    }
    /* fp16 neighbourhood: rounding d moves every value; a neighbour may re-code better */
    const uint16_t h0 = strata_fp32_to_fp16(clamp_fp16_range(best_d));
    float best = INFINITY;
    uint16_t hbest = h0;
    for (int j = -3; j <= 3 && best_d != 0.0f; j++) {
        const int32_t mag = (int32_t)(h0 & 0x7fffu) + j;
        if (mag < 0 || mag > 0x7bff) continue;
        const uint16_t h = (uint16_t)((h0 & 0x8000u) | (uint32_t)mag);
        const float e = nl_err(T, x, w, n, strata_fp16_to_fp32(h), NULL);
        if (e < best) { best = e; hbest = h; }
    }
    const float d = strata_fp16_to_fp32(hbest);
    (void)nl_err(T, x, w, n, d, k);
    return d;
}

static size_t quantize_iq4_nl(const float *src, void *dst, int64_t nrows, int64_t n_per_row,
                              const float *imatrix) {
    nl_table T;
    for (int k = 0; k < 16; k++) T.tbl[k] = (float)strata_kvalues_iq4nl[k];
    for (int k = 0; k < 15; k++) {
        T.mid[k] = 0.5f * (T.tbl[k] + T.tbl[k + 1]);
        T.step[k] = T.tbl[k + 1] - T.tbl[k];
    }
    const int64_t nbr = n_per_row / 32;
    uint8_t *out = dst;
    for (int64_t r = 0; r < nrows; r++) {
        for (int64_t b = 0; b < nbr; b++, out += 18) {
            float w[32], k[32];
            block_weights(imatrix ? imatrix + b * 32 : NULL, 32, 32, w);
            const float d = fit_table_fp16(&T, src + r * n_per_row + b * 32, w, 32, k);
            put_f16(out, d);
            for (int j = 0; j < 16; j++) out[2 + j] = (uint8_t)(code_int(k[j], 0) | (code_int(k[j + 16], 0) << 4));
        }
    }
    return (size_t)(nrows * nbr) * 18;
}

/* ================================================================ NVFP4 */

/* NVFP4.ue4m3_to_fp32 for codes 0..0x7e, times 1/2 (the kvalues are doubled E2M1). */
static float ue4m3_half(int c) {
    const int e = (c >> 3) & 15, mnt = c & 7;
    const float raw = e == 0 ? (float)mnt * 0x1p-9f : (1.0f + (float)mnt / 8.0f) * ldexpf(1.0f, e - 7);
    return raw * 0.5f;
}

/* E2M1 magnitudes in units of the scale: {0, 1, 2, 3, 4, 6, 8, 12}; a value |x|/scale = t
 * takes magnitude sum of k_fp4_step[m] over the midpoints k_fp4_thr[m] it exceeds (code: their
 * count). Branch-free so that it vectorises. */
static const float k_fp4_thr[7] = {0.5f, 1.5f, 2.5f, 3.5f, 5.0f, 7.0f, 10.0f};
static const float k_fp4_step[7] = {1, 1, 1, 1, 2, 2, 4};

static float nvfp4_err(const float *a, const float *w, float D, float *code) {
    const float inv = 1.0f / D;
    float e2[16];
    for (int i = 0; i < 16; i++) {
        const float t = a[i] * inv;
        float v = 0.0f;
        for (int m = 0; m < 7; m++) v += t > k_fp4_thr[m] ? k_fp4_step[m] : 0.0f;
        const float e = a[i] - D * v;
        e2[i] = w[i] * e * e;
    }
    if (code) {
        for (int i = 0; i < 16; i++) {
            const float t = a[i] * inv;
            float c = 0.0f;
            for (int m = 0; m < 7; m++) c += t > k_fp4_thr[m] ? 1.0f : 0.0f;
            code[i] = c;
        }
    }
    return lane_sum(e2, 16);
}

/* One 16-value sub-block: every scale code whose top value (12 x scale) lies within
 * [0.4, 2] x amax is tried — the sub-blocks are independent, so this is the exact optimum
 * over that window. Returns the scale code and writes the 4-bit codes. */
static int nvfp4_sub(const float *x, const float *w, uint8_t *q) {
    float a[16], e2[16];
    float amax = 0.0f;
    for (int i = 0; i < 16; i++) {
        a[i] = fabsf(x[i]);
        amax = a[i] > amax ? a[i] : amax;
        e2[i] = w[i] * a[i] * a[i];
    }
    int best_c = 0;
    float best = lane_sum(e2, 16); /* scale code 0: everything decodes to 0 */
    if (amax > 0.0f && isfinite(amax)) {
        for (int c = 1; c <= 0x7e; c++) {
            const float top = 12.0f * ue4m3_half(c);
            if ((top < 0.4f * amax && c != 0x7e) || (top > 2.0f * amax && c != 1)) continue;
            const float err = nvfp4_err(a, w, ue4m3_half(c), NULL);
            if (err < best) { best = err; best_c = c; }
        }
    }
    float code[16];
    if (best_c) nvfp4_err(a, w, ue4m3_half(best_c), code);
    for (int i = 0; i < 16; i++) {
        const int k = best_c ? code_int(code[i], 0) : 0;
        q[i] = (uint8_t)(k && x[i] < 0.0f ? k + 8 : k);
    }
    return best_c;
}

static size_t quantize_nvfp4(const float *src, void *dst, int64_t nrows, int64_t n_per_row,
                             const float *imatrix) {
    const int64_t nbr = n_per_row / 64;
    uint8_t *out = dst;
    for (int64_t r = 0; r < nrows; r++) {
        for (int64_t b = 0; b < nbr; b++, out += 36) {
            const float *x = src + r * n_per_row + b * 64;
            float w[64];
            block_weights(imatrix ? imatrix + b * 64 : NULL, 64, 16, w);
            for (int s = 0; s < 4; s++) {
                uint8_t q[16];
                out[s] = (uint8_t)nvfp4_sub(x + 16 * s, w + 16 * s, q);
                for (int j = 0; j < 8; j++) out[4 + 8 * s + j] = (uint8_t)(q[j] | (q[j + 8] << 4));
            }
        }
    }
    return (size_t)(nrows * nbr) * 36;
}

/* ================================================================ registration */

static void set_quantizer(strata_qtraits *t, int32_t type, const char *name, int32_t block_size,
                          int32_t type_size, strata_quantize_fn fn) {
    strata_qtraits *e = &t[type];
    /* A family registers its entry first; if it has not (a type readable nowhere yet), the
     * identity fields are filled here so the quantizer is still reachable. */
    if (!e->name) {
        e->name = name;
        e->type = type;
        e->block_size = block_size;
        e->type_size = type_size;
    }
    e->quantize = fn;
}

void strata_quant_register_quantizers(strata_qtraits *t) {
    set_quantizer(t, GT_Q8_0, "Q8_0", 32, 34, quantize_q8_0);
    set_quantizer(t, GT_Q5_1, "Q5_1", 32, 24, quantize_q5_1);
    set_quantizer(t, GT_MXFP4, "MXFP4", 32, 17, quantize_mxfp4);
    set_quantizer(t, GT_Q4_K, "Q4_K", QK_K, 144, quantize_q4_k);
    set_quantizer(t, GT_Q6_K, "Q6_K", QK_K, 210, quantize_q6_k);
    set_quantizer(t, GT_IQ4_NL, "IQ4_NL", 32, 18, quantize_iq4_nl);
    set_quantizer(t, GT_NVFP4, "NVFP4", 64, 36, quantize_nvfp4);
}
