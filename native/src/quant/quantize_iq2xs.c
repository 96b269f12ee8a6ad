/*
 * quantize_iq2xs.c — floats -> IQ2_XS blocks by a weighted grid search.
 *
 * Block layout (fmt_iq.c): 256 values = 16 groups of 16; a group has a 4-bit scale s and two
 * grid entries of 8 values, each a 9-bit index into the 512-entry grid plus a 7-bit sign
 * index (the 8th sign makes the count of minus signs even). Value i of group g is
 *     y_i = t_g * G_i * sign_i,   t_g = d * (2 s_g + 1) / 8,   G_i in {8, 25, 43}.
 * We minimise E = sum_i w_i (x_i - y_i)^2 with w_i = imatrix_i (the expected output error of a
 * matmul with inputs of that second moment) or, without an imatrix, a weight that grows with
 * |x_i| (see weights_for_block).
 *
 * 1. Signs. Each entry takes the signs of x; an odd count of minus signs is made even by
 *    giving the value with the least w|x| the wrong sign, its target then is -|x| (level 8).
 *    From here on every target a_i >= 0 except those, and only magnitudes are searched.
 * 2. Entries at a fixed scale t. Each value's nearest level gives a point of the lattice
 *    {8, 25, 43}^8. If that point is a grid entry it is the best entry (E separates over
 *    values); otherwise the grid entries in the nearest distance shells around the point
 *    (tables built once from the generated grid) are compared by their weighted error.
 * 3. Group scales. A sweep of t over a range around max|a| / 43 assigns entries at each t and
 *    scores the assignment at its own least-squares scale; the best is refined by
 *    re-assigning at that scale until nothing improves.
 * 4. Block scale. d is tried at several values around 8 max_g(t_g) / 31 (as fp16); each group
 *    then takes the 4-bit s nearest to its t_g or a neighbour, with entries re-assigned at
 *    the quantized scale, whichever has the least error; the d with the least total wins.
 * Deterministic and thread-safe: the tables are built under pthread_once; everything else
 * lives on the caller's stack.
 */
#include "quant.h"
#include "quant_tables.h"

#include <float.h>
#include <pthread.h>

enum { QS_BYTES = 74, NGRID = 512, NLAT = 6561, NB_MAX = 70000 };

/* Neighbour shells kept per off-grid lattice point (1 = only the nearest entries). */
#define IQ2XS_SHELLS 3

static const float k_level[3] = {8.0f, 25.0f, 43.0f};

/* ---------------------------------------------------------------- tables (built once) */

static uint8_t g_lvl[NGRID][8];   /* level index 0..2 of value j of grid entry e */
static int16_t g_map[NLAT];       /* lattice code (sum lvl_j 3^j) -> grid entry, or -1 */
static uint32_t g_nb_off[NLAT + 1];/* off-grid code c: candidates g_nb[g_nb_off[c] .. [c+1]) */
static uint16_t g_nb[NB_MAX];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void build_tables(void) {
    for (int c = 0; c < NLAT; c++) g_map[c] = -1;
    for (int e = 0; e < NGRID; e++) {
        int code = 0, p = 1;
        for (int j = 0; j < 8; j++, p *= 3) {
            const uint8_t v = (uint8_t)(strata_iq2xs_grid[e] >> (8 * j));
            const int l = v <= 8 ? 0 : v <= 25 ? 1 : 2;
            g_lvl[e][j] = (uint8_t)l;
            code += l * p;
        }
        g_map[code] = (int16_t)e;
    }
    uint32_t n = 0;
    for (int c = 0; c < NLAT; c++) {
        g_nb_off[c] = n;
        if (g_map[c] >= 0) continue;
        float pt[8];
        for (int j = 0, r = c; j < 8; j++, r /= 3) pt[j] = k_level[r % 3];
        float d2[NGRID];
        for (int e = 0; e < NGRID; e++) {
            float s = 0.0f;
            for (int j = 0; j < 8; j++) {
                const float diff = pt[j] - k_level[g_lvl[e][j]];
                s += diff * diff;
            }
            d2[e] = s;
        }
        /* the IQ2XS_SHELLS smallest distinct distances */
        float thr = -1.0f;
        for (int sh = 0; sh < IQ2XS_SHELLS; sh++) {
            float next = FLT_MAX;
            for (int e = 0; e < NGRID; e++)
                if (d2[e] > thr && d2[e] < next) next = d2[e];
            if (next == FLT_MAX) break;
            thr = next;
        }
        for (int e = 0; e < NGRID && n < NB_MAX; e++)
            if (d2[e] <= thr) g_nb[n++] = (uint16_t)e;
    }
    g_nb_off[NLAT] = n;
}

/* ---------------------------------------------------------------- one entry at a scale */

/* Best grid entry for targets a[8] with weights w[8] at scale t > 0; returns its weighted
 * error sum w (a - t G)^2 and stores the entry in *best. */
static float assign_entry(const float *a, const float *w, float t, int *best) {
    const float lo = 16.5f * t, hi = 34.0f * t; /* midpoints between levels */
    int code = 0;
    for (int j = 0, p = 1; j < 8; j++, p *= 3) code += (a[j] < lo ? 0 : a[j] < hi ? 1 : 2) * p;
    const float tl[3] = {t * k_level[0], t * k_level[1], t * k_level[2]};
    if (g_map[code] >= 0) {
        const int e = g_map[code];
        float err = 0.0f;
        for (int j = 0; j < 8; j++) {
            const float diff = a[j] - tl[g_lvl[e][j]];
            err += w[j] * diff * diff;
        }
        *best = e;
        return err;
    }
    /* off the grid: the entries in the nearest shells (all entries if the list is empty,
     * which the table size rules out for the shipped grid) */
    uint32_t k0 = g_nb_off[code], k1 = g_nb_off[code + 1];
    const int all = k0 == k1;
    if (all) {
        k0 = 0;
        k1 = NGRID;
    }
    float best_err = FLT_MAX;
    int best_e = 0;
    for (uint32_t k = k0; k < k1; k++) {
        const int e = all ? (int)k : g_nb[k];
        float err = 0.0f;
        for (int j = 0; j < 8; j++) {
            const float diff = a[j] - tl[g_lvl[e][j]];
            err += w[j] * diff * diff;
        }
        if (err < best_err) {
            best_err = err;
            best_e = e;
        }
    }
    *best = best_e;
    return best_err;
}

/* sum w a G and sum w G^2 of entry e against targets a. */
static void entry_sums(const float *a, const float *w, int e, float *swag, float *swgg) {
    for (int j = 0; j < 8; j++) {
        const float g = k_level[g_lvl[e][j]];
        *swag += w[j] * a[j] * g;
        *swgg += w[j] * g * g;
    }
}

/* ---------------------------------------------------------------- one group */

typedef struct {
    float t;      /* least-squares scale of the chosen entries (continuous) */
    float err;    /* sum w (a - t G)^2 at that scale */
    int e[2];     /* grid entries */
} group_fit;

/* Least-squares scale and error of entries e0, e1 for the group's 16 targets. */
static void score(const float *a, const float *w, float swaa, const int *e, group_fit *f) {
    float swag = 0.0f, swgg = 0.0f;
    entry_sums(a, w, e[0], &swag, &swgg);
    entry_sums(a + 8, w + 8, e[1], &swag, &swgg);
    f->e[0] = e[0];
    f->e[1] = e[1];
    if (swgg > 0.0f && swag > 0.0f) {
        f->t = swag / swgg;
        f->err = swaa - swag * f->t;
    } else {
        f->t = 0.0f;
        f->err = swaa;
    }
}

static void fit_group(const float *a, const float *w, group_fit *best) {
    float amax = 0.0f, swaa = 0.0f;
    for (int i = 0; i < 16; i++) {
        amax = fmaxf(amax, a[i]);
        swaa += w[i] * a[i] * a[i];
    }
    best->t = 0.0f;
    best->err = swaa;
    best->e[0] = best->e[1] = 0;
    if (!(amax > 0.0f)) return;
    /* the largest target lands between levels 25 and 43 and a little beyond 43 */
    for (int k = 0; k <= 15; k++) {
        const float t = amax / (30.0f + 2.0f * (float)k);
        int e[2];
        group_fit f;
        assign_entry(a, w, t, &e[0]);
        assign_entry(a + 8, w + 8, t, &e[1]);
        score(a, w, swaa, e, &f);
        if (f.err < best->err) *best = f;
    }
    for (int it = 0; it < 4 && best->t > 0.0f; it++) {
        int e[2];
        group_fit f;
        assign_entry(a, w, best->t, &e[0]);
        assign_entry(a + 8, w + 8, best->t, &e[1]);
        score(a, w, swaa, e, &f);
        if (!(f.err < best->err)) break;
        *best = f;
    }
}

/* ---------------------------------------------------------------- one super-block */

/* Weights of one block. With an imatrix: its values (a group whose weights are all zero
 * falls back to the default below, so columns it marks unused are still quantized).
 * Without: sqrt(sigma2 + x^2), sigma2 the block's mean square — larger values count more,
 * but small ones never stop counting. */
static void weights_for_block(const float *x, const float *im, float *w) {
    float sumx2 = 0.0f;
    for (int i = 0; i < QK_K; i++) sumx2 += x[i] * x[i];
    const float sigma2 = sumx2 / QK_K;
    for (int i = 0; i < QK_K; i++) w[i] = sqrtf(sigma2 + x[i] * x[i]);
    if (!im) return;
    for (int g = 0; g < 16; g++) {
        float wg[16], s = 0.0f;
        for (int i = 0; i < 16; i++) {
            const float v = im[16 * g + i];
            wg[i] = v > 0.0f && v <= FLT_MAX ? v : 0.0f; /* negative, NaN or inf: unused */
            s += wg[i];
        }
        if (s > 0.0f && s <= FLT_MAX) memcpy(w + 16 * g, wg, sizeof wg);
    }
    /* only ratios matter: bring the largest weight to 1 so no error sum can overflow */
    float wmax = 0.0f;
    for (int i = 0; i < QK_K; i++) wmax = fmaxf(wmax, w[i]);
    if (wmax > 0.0f)
        for (int i = 0; i < QK_K; i++) w[i] /= wmax;
}

static void quantize_block(const float *xin, const float *im, uint8_t *out) {
    float x[QK_K], w[QK_K], a[QK_K];
    uint8_t sign[32];
    /* Non-finite inputs carry no usable magnitude: they are quantized as 0. The search runs
     * on x / 2^e with max|x| / 2^e in [1, 2) (exact scaling), so no sum over- or underflows
     * whatever the input's range; d is scaled back when it is stored. */
    float amax = 0.0f;
    for (int i = 0; i < QK_K; i++) {
        x[i] = isfinite(xin[i]) ? xin[i] : 0.0f;
        amax = fmaxf(amax, fabsf(x[i]));
    }
    memset(out, 0, QS_BYTES);
    if (!(amax > 0.0f)) return; /* d = 0: every value decodes to 0 */
    const int e2 = ilogbf(amax);
    for (int i = 0; i < QK_K; i++) x[i] = ldexpf(x[i], -e2);
    weights_for_block(x, im, w);

    for (int k = 0; k < 32; k++) { /* entry k: values 8k .. 8k+7 */
        const float *xe = x + 8 * k;
        uint8_t s = 0;
        int nneg = 0, flip = 0;
        float least = FLT_MAX;
        for (int j = 0; j < 8; j++) {
            a[8 * k + j] = fabsf(xe[j]);
            if (xe[j] < 0.0f) {
                s |= (uint8_t)(1u << j);
                nneg++;
            }
            const float c = w[8 * k + j] * fabsf(xe[j]);
            if (c < least) {
                least = c;
                flip = j;
            }
        }
        if (nneg & 1) {
            s ^= (uint8_t)(1u << flip);
            a[8 * k + flip] = -a[8 * k + flip];
        }
        sign[k] = s;
    }

    group_fit fit[16];
    float tmax = 0.0f;
    for (int g = 0; g < 16; g++) {
        fit_group(a + 16 * g, w + 16 * g, &fit[g]);
        tmax = fmaxf(tmax, fit[g].t);
    }

    if (!(tmax > 0.0f)) return;

    float best_total = FLT_MAX;
    int best_s[16] = {0}, best_e[16][2] = {{0}};
    uint16_t best_d = 0;
    for (int kd = 0; kd < 6; kd++) {
        float d = 8.0f * tmax / (31.0f - 0.75f * (float)kd);
        uint16_t dh = strata_fp32_to_fp16(ldexpf(d, e2));
        if ((dh & 0x7c00u) == 0x7c00u) dh = 0x7bffu; /* beyond fp16: saturate */
        d = ldexpf(strata_fp16_to_fp32(dh), -e2);     /* the stored d, in search units */
        if (!(d > 0.0f)) continue;
        float total = 0.0f;
        int cs[16], ce[16][2];
        for (int g = 0; g < 16; g++) {
            const float *ag = a + 16 * g, *wg = w + 16 * g;
            /* nearest s for the group's own scale, then its neighbours */
            const float sf = fminf(fmaxf((8.0f * fit[g].t / d - 1.0f) * 0.5f, 0.0f), 15.0f);
            const int s0 = (int)(sf + 0.5f);
            float gbest = FLT_MAX;
            cs[g] = s0;
            ce[g][0] = ce[g][1] = 0;
            for (int s = s0 - 1; s <= s0 + 1; s++) {
                if (s < 0 || s > 15) continue;
                const float t = d * (float)(2 * s + 1) * 0.125f;
                int e[2];
                const float err = assign_entry(ag, wg, t, &e[0]) + assign_entry(ag + 8, wg + 8, t, &e[1]);
                if (err < gbest) {
                    gbest = err;
                    cs[g] = s;
                    ce[g][0] = e[0];
                    ce[g][1] = e[1];
                }
            }
            total += gbest;
        }
        if (total < best_total) {
            best_total = total;
            best_d = dh;
            memcpy(best_s, cs, sizeof cs);
            memcpy(best_e, ce, sizeof ce);
        }
    }

    memcpy(out, &best_d, 2);
    for (int g = 0; g < 16; g++) {
        for (int h = 0; h < 2; h++) {
            const int k = 2 * g + h;
            const uint16_t q = (uint16_t)(best_e[g][h] | (sign[k] & 127) << 9);
            memcpy(out + 2 + 2 * k, &q, 2);
        }
        out[66 + g / 2] |= (uint8_t)(best_s[g] << (4 * (g % 2)));
    }
}

size_t strata_quantize_iq2_xs(const float *src, void *dst, int64_t nrows, int64_t n_per_row,
                              const float *imatrix) {
    pthread_once(&g_once, build_tables);
    const int64_t nb = n_per_row / QK_K;
    uint8_t *out = dst;
    for (int64_t r = 0; r < nrows; r++)
        for (int64_t b = 0; b < nb; b++, out += QS_BYTES)
            quantize_block(src + r * n_per_row + b * QK_K, imatrix ? imatrix + b * QK_K : NULL, out);
    return (size_t)(nrows * nb * QS_BYTES);
}
