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

/* Weighted least squares on integer codes, accumulated in double so that the comparison of
 * candidates does not depend on summation noise. */
typedef struct {
    double sw, sx, sq, sqq, sxq, sxx;
} wls_acc;

static void wls_add(wls_acc *a, double w, double x, double q) {
    a->sw += w;
    a->sx += w * x;
    a->sq += w * q;
    a->sqq += w * q * q;
    a->sxq += w * x * q;
    a->sxx += w * x * x;
}

/* Round to nearest and clamp to [lo, hi]; safe for any float. */
static int clamp_round(float v, int lo, int hi) {
    if (!(v > (float)lo)) return lo; /* also NaN */
    if (v >= (float)hi) return hi;
    return (int)lrintf(v);
}

/* ---------------------------------------------------------------- symmetric integer grid */

/* Scale s minimising sum w (x - s*q)^2 with q in [qlo, qhi] (s may be negative). The inverse
 * scales tried map the value of largest magnitude onto points near either end of the range
 * (past the end means it is clipped); each candidate's codes are refitted by least squares
 * and the best fit is polished with a few assign/refit rounds. */
static float fit_scale_int(const float *x, const float *w, int n, int qlo, int qhi) {
    float amax = 0.0f, m = 0.0f;
    for (int i = 0; i < n; i++) {
        if (fabsf(x[i]) > amax) { amax = fabsf(x[i]); m = x[i]; }
    }
    if (amax == 0.0f) return 0.0f;
    double best_gain = -1.0;
    float best_s = 0.0f;
    /* targets t: the largest value lands on code t (|t| slightly beyond the end clips it) */
    for (int side = 0; side < 2; side++) {
        const float end = side ? (float)qhi : (float)qlo; /* code the extreme value aims for */
        const float dir = side ? -1.0f : 1.0f;            /* direction towards the middle */
        for (int k = -2; k <= 24; k++) {
            const float t = end + dir * 0.25f * (float)k;
            const float is = t / m;
            wls_acc a = {0};
            for (int i = 0; i < n; i++) wls_add(&a, w[i], x[i], clamp_round(x[i] * is, qlo, qhi));
            if (a.sqq <= 0.0) continue;
            const double gain = a.sxq * a.sxq / a.sqq; /* error = sxx - gain at the LS scale */
            if (gain > best_gain) { best_gain = gain; best_s = (float)(a.sxq / a.sqq); }
        }
    }
    for (int it = 0; it < 3 && best_s != 0.0f; it++) {
        const float is = 1.0f / best_s;
        wls_acc a = {0};
        for (int i = 0; i < n; i++) wls_add(&a, w[i], x[i], clamp_round(x[i] * is, qlo, qhi));
        if (a.sqq <= 0.0) break;
        const double gain = a.sxq * a.sxq / a.sqq;
        if (!(gain > best_gain)) break;
        best_gain = gain;
        best_s = (float)(a.sxq / a.sqq);
    }
    return best_s;
}

/* ---------------------------------------------------------------- affine grid with a min */

/* (s, b) minimising sum w (x - s*q - b)^2 with q in [0, qmax] and b <= 0 (the K-quant min is
 * subtracted with an unsigned code). Same sweep-refit-polish scheme as fit_scale_int. */
typedef struct {
    float s, b;
} affine_fit;

static double affine_err(const wls_acc *a, double s, double b) {
    return a->sxx - 2.0 * s * a->sxq - 2.0 * b * a->sx + s * s * a->sqq + 2.0 * s * b * a->sq + b * b * a->sw;
}

/* LS solution for fixed codes; returns the weighted squared error. */
static double affine_solve(const wls_acc *a, float *s, float *b) {
    const double det = a->sw * a->sqq - a->sq * a->sq;
    double ss = 0.0, bb = 0.0;
    if (det > 0.0) {
        ss = (a->sw * a->sxq - a->sq * a->sx) / det;
        bb = (a->sqq * a->sx - a->sq * a->sxq) / det;
    }
    if (!(det > 0.0) || bb > 0.0) { /* min must stay <= 0: fit the scale alone */
        bb = 0.0;
        ss = a->sqq > 0.0 ? a->sxq / a->sqq : 0.0;
    }
    if (ss < 0.0) { /* degenerate codes; a flat block */
        ss = 0.0;
        bb = a->sw > 0.0 ? (a->sx / a->sw < 0.0 ? a->sx / a->sw : 0.0) : 0.0;
    }
    *s = (float)ss;
    *b = (float)bb;
    return affine_err(a, ss, bb);
}

static affine_fit fit_affine(const float *x, const float *w, int n, int qmax) {
    float mn = 0.0f, mx = x[0];
    for (int i = 0; i < n; i++) {
        if (x[i] < mn) mn = x[i];
        if (x[i] > mx) mx = x[i];
    }
    affine_fit best = {0.0f, mn};
    if (!(mx > mn)) return best; /* constant (or all <= 0 and equal): s = 0, b = min */
    double best_err = INFINITY;
    const float range = mx - mn;
    for (int k = -15; k <= 10; k++) {
        const float is = ((float)qmax + 0.1f * (float)k) / range;
        wls_acc a = {0};
        for (int i = 0; i < n; i++) wls_add(&a, w[i], x[i], clamp_round((x[i] - mn) * is, 0, qmax));
        float s, b;
        const double err = affine_solve(&a, &s, &b);
        if (err < best_err) { best_err = err; best.s = s; best.b = b; }
    }
    for (int it = 0; it < 3 && best.s > 0.0f; it++) {
        const float is = 1.0f / best.s;
        wls_acc a = {0};
        for (int i = 0; i < n; i++) wls_add(&a, w[i], x[i], clamp_round((x[i] - best.b) * is, 0, qmax));
        float s, b;
        const double err = affine_solve(&a, &s, &b);
        if (!(err < best_err)) break;
        best_err = err;
        best.s = s;
        best.b = b;
    }
    return best;
}

/* Clamp a super-block scale into finite fp16 so that huge inputs saturate instead of
 * producing inf/NaN blocks. */
static float clamp_fp16_range(float v) {
    if (v > 65504.0f) return 65504.0f;
    if (v < -65504.0f) return -65504.0f;
    return v;
}

/* ================================================================ Q6_K */

/* Error of one 16-value sub-block at integer scale sc under super-scale d (codes re-chosen),
 * computed exactly as gguf dequantizes: (d*sc) * q. */
static double q6k_sub_err(const float *x, const float *w, float d, int sc, int8_t *q) {
    const float S = d * (float)sc;
    const float is = S != 0.0f ? 1.0f / S : 0.0f;
    double err = 0.0;
    for (int i = 0; i < 16; i++) {
        const int qi = clamp_round(x[i] * is, -32, 31);
        const double e = (double)x[i] - (double)(S * (float)qi);
        err += w[i] * e * e;
        if (q) q[i] = (int8_t)qi;
    }
    return err;
}

/* Best sc in [-128, 127] near s/d; returns the error of the choice. */
static double q6k_pick_sc(const float *x, const float *w, float d, float s, int *sc_out) {
    const int c = d != 0.0f ? clamp_round(s / d, -128, 127) : 0;
    int best_sc = c;
    double best = q6k_sub_err(x, w, d, c, NULL);
    for (int delta = -2; delta <= 2; delta++) {
        const int sc = c + delta;
        if (delta == 0 || sc < -128 || sc > 127) continue;
        const double e = q6k_sub_err(x, w, d, sc, NULL);
        if (e < best) { best = e; best_sc = sc; }
    }
    *sc_out = best_sc;
    return best;
}

/* Picks every sub-block's integer scale under super-scale d; returns the block error and the
 * least-squares super-scale for the codes chosen (0 if none). */
static double q6k_try_d(const float *x, const float *w, const float *s, float d, int *sc, float *d_ls) {
    double err = 0.0;
    wls_acc a = {0};
    for (int j = 0; j < 16; j++) {
        int8_t q[16];
        err += q6k_pick_sc(x + 16 * j, w + 16 * j, d, s[j], &sc[j]);
        q6k_sub_err(x + 16 * j, w + 16 * j, d, sc[j], q);
        for (int i = 0; i < 16; i++) wls_add(&a, w[16 * j + i], x[16 * j + i], (double)sc[j] * q[i]);
    }
    *d_ls = a.sqq > 0.0 ? (float)(a.sxq / a.sqq) : 0.0f;
    return err;
}

static void q6k_block(const float *x, const float *w, uint8_t *out) {
    float s[16];
    float smax = 0.0f, sabs = 0.0f;
    for (int j = 0; j < 16; j++) {
        s[j] = fit_scale_int(x + 16 * j, w + 16 * j, 16, -32, 31);
        if (fabsf(s[j]) > sabs) { sabs = fabsf(s[j]); smax = s[j]; }
    }
    int sc[16] = {0};
    float d = 0.0f;
    if (sabs > 0.0f) {
        /* Seeds: the largest sub-block scale on -128 (the int8 end with the larger magnitude)
         * or on +127; from each, a few rounds of "refit d by least squares for the codes
         * chosen, re-pick the integer scales". */
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
        int8_t q[16];
        q6k_sub_err(x + 16 * j, w + 16 * j, d, sc[j], q);
        out[192 + j] = (uint8_t)(int8_t)sc[j];
        for (int l = 0; l < 16; l++) {
            const int i = 16 * j + l;
            const int u = q[l] + 32, h = i / 128, r = i % 128;
            ql[64 * h + r % 64] |= (uint8_t)((u & 0x0f) << (4 * (r / 64)));
            qh[32 * h + r % 32] |= (uint8_t)((u >> 4) << (2 * (r / 32)));
        }
    }
    put_f16(out + 208, d);
}

static size_t quantize_q6_k(const float *src, void *dst, int64_t nrows, int64_t n_per_row,
                            const float *imatrix) {
    float ones[QK_K];
    for (int i = 0; i < QK_K; i++) ones[i] = 1.0f;
    const int64_t nbr = n_per_row / QK_K;
    uint8_t *out = dst;
    for (int64_t r = 0; r < nrows; r++)
        for (int64_t b = 0; b < nbr; b++, out += 210)
            q6k_block(src + r * n_per_row + b * QK_K, imatrix ? imatrix + b * QK_K : ones, out);
    return (size_t)(nrows * nbr) * 210;
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
    set_quantizer(t, GT_Q6_K, "Q6_K", QK_K, 210, quantize_q6_k);
}
