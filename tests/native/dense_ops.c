/*
 * dense_ops.c — strata_dense_ops, the device op runner: every kernel launcher of kernels/cuda/ run on the GPU
 * and, on the same input bytes, through its host emulation (kernels/cuda/emu_*.h), op by op, in the manner
 * of llama.cpp's test-backend-ops. The host checks (tests/native/test_cuda_ops_*.c) hold the emulation to
 * the library's C path; this holds the GPU to the emulation. Together they hold the GPU to the C path, and
 * they show that the device forward's two tables (device/dense.h) compute the same thing.
 *
 * The two sides are dense.h's tables: the DEVICE table (mdl_dk_cuda: GPU memory, the .cu launchers) on
 * device copies of the inputs, the EMU table (mdl_dk_emu: host memory, each launcher's grid run by the
 * kernel's own unit functions) on host copies of the same bytes. Every launch goes through a table, as the
 * forward's do; the device's outputs are then copied down and compared with the emulation's.
 *
 * Output: one line per op, in the host checks' format and with their names and type fields, so that
 * tools/device_check.sh can put the two side by side,
 *     OP <family>.<op> <types|-> pass|fail <max_rel_err>
 * then `all checks passed`, or not (exit 1). An error is max |device - emu| over max |emu| of one compared
 * output; an op reports its largest. Bounds:
 *   - float outputs: TOL = 1e-5. The kernels are built with --fmad=false, so both sides do the same float
 *     operations in the same order; what differs is the device's expf, sqrtf, powf, sinf ... in the
 *     last bits.
 *   - integer outputs (router picks, group counts / slots / rows, QSA kept keys and their counts) and the
 *     f16 and int8 KV cache bytes (exact conversions of the same floats): equal. The inputs that decide
 *     them (logits, block scores) are the same bytes on both sides and, for the logits, spaced well apart
 *     so that the device's expf cannot reorder them: no op reads another op's device output.
 * Inputs are seeded and at realistic scales. Weight rows come from the library's quantizer where the
 * type has one (Q8_0, Q5_1, MXFP4, Q4_K, Q6_K, IQ4_NL, NVFP4, IQ2_XS), else they are random valid blocks
 * with sane scales (as test_cuda_ops_gemv.c makes them). Where an op's inputs are another op's outputs
 * (the GDN heads read the conv and the q/k norms, the QSA index reads pooled, normed and roped block keys,
 * the merge reads the router's grouping), the emulation makes them on the host and both sides get them.
 * Shapes: the real model's (hidden 2560, 4 streams, hc rank 320; GDN 16 k / 48 v heads x 128, conv 4; QSA
 * 24 q / 2 kv heads x 256, 64 rotary dims, indexer 4 x 128, ratio 4, budget 2048; 512 experts top-10,
 * width 640; PLE 16 heads x 160, conv 4 taps 3 apart; an LM head slice of 8192 rows of 2560) and small odd
 * ones. rope.angles is judged at positions up to 16: an angle is pos * theta^(-2i/n_rot), so the ulps by
 * which the device's powf differs from the host's grow with the position; the runner prints how far the
 * two drift at long positions as a `# note` line, not judged.
 *
 * Modes:
 *   strata_dense_ops                        the GPU (`no GPU: <why>` and exit 77 without one)
 *   strata_dense_ops --device emu           the "device" is the emulation too: every op must agree bit for
 *                                           bit (the runner's own plumbing, run in CI)
 *   strata_dense_ops --device emu --break NAME
 *                                           ... with op NAME's device output perturbed after its launch (its
 *                                           largest value by 1 %, an integer or byte by 1): NAME must fail
 * Exit: 0 all passed, 1 a failure, 2 a usage or memory error, 77 no GPU.
 */
#define _POSIX_C_SOURCE 199309L   /* clock_gettime */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "device/dense.h"
#include "kernels/cuda/ple.h"
#include "quant/quant.h"
#include "strata.h"

#define TOL 1e-5      /* float outputs, relative to the emulation's largest value */
#define EPS 1e-6f     /* rms_norm_eps of the real checkpoint */

static const mdl_dk *DEV;   /* the side under test */
static const mdl_dk *EMU;   /* the reference: host emulation */
static int g_exact;         /* --device emu: the sides must agree bit for bit */
static const char *g_break; /* --break NAME */
static int g_break_hits;    /* ops named g_break */
static int g_ops, g_failed_ops, g_other_fail;

/* ---------------------------------------------------------------- memory: every buffer of a case */

/* Every buffer a case allocates (host or device) is kept here and freed by release() at the case's end;
 * an allocation that fails frees them all and exits 2. */
enum { MAX_LIVE = 256 };
static struct {
    void *p;
    int dev;
} g_live[MAX_LIVE];
static int g_n_live;

static void release(void) {
    while (g_n_live > 0) {
        g_n_live--;
        if (g_live[g_n_live].dev) DEV->free(g_live[g_n_live].p);
        else free(g_live[g_n_live].p);
    }
}

static void fatal(const char *what, size_t bytes) {
    fprintf(stderr, "strata_dense_ops: %s (%zu bytes)\n", what, bytes);
    release();
    exit(2);
}

static void keep(void *p, int dev, size_t bytes) {
    if (g_n_live == MAX_LIVE) {
        if (dev) DEV->free(p);
        else free(p);
        fatal("more live buffers than MAX_LIVE", bytes);
    }
    g_live[g_n_live].p = p;
    g_live[g_n_live].dev = dev;
    g_n_live++;
}

static void *hmem(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) fatal("out of host memory", bytes);
    keep(p, 0, bytes);
    return p;
}

static float *hf(int64_t n) { return hmem((size_t)n * sizeof(float)); }

static void *dmem(size_t bytes) {
    void *p = DEV->alloc(bytes);
    if (!p) fatal("out of device memory", bytes);
    keep(p, 1, bytes);
    return p;
}

/* A buffer on both sides: d the device's, h the emulation's, the same bytes at the start. */
typedef struct {
    void *d, *h;
    size_t bytes;
} buf;

enum { SIDE_DEV = 0, SIDE_EMU = 1 };
#define P(b, s) ((s) == SIDE_DEV ? (b).d : (b).h)
#define PF(b, s) ((float *)P(b, s))
static const mdl_dk *tab(int side) { return side == SIDE_DEV ? DEV : EMU; }

/* A pair holding `init`, or 0xff bytes (NaN floats, -1 integers) for an output, so that what neither side
 * writes is the same on both and what only one writes shows. */
static buf pair(const void *init, size_t bytes) {
    buf b = {dmem(bytes), hmem(bytes), bytes};
    if (init) memcpy(b.h, init, bytes);
    else memset(b.h, 0xff, bytes);
    const strata_status st = DEV->copy(b.d, b.h, bytes, DK_H2D, NULL);
    if (st != STRATA_OK) {
        fprintf(stderr, "upload of %zu bytes: %s\n", bytes, strata_last_error());
        g_other_fail++;
    }
    return b;
}
static buf pairf(const float *init, int64_t n) { return pair(init, (size_t)n * sizeof(float)); }

/* ---------------------------------------------------------------- inputs: seeded */

static uint64_t g_rng;
static void seed(uint64_t s) { g_rng = s * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull; }
static uint64_t rnd(void) {   /* splitmix64 */
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static float urand(void) { return (float)(((double)(rnd() >> 40) + 0.5) / 16777216.0); }   /* (0, 1) */
static float uni(float lo, float hi) { return lo + (hi - lo) * urand(); }
static float nrand(void) { return sqrtf(-2.0f * logf(urand())) * cosf(6.2831853f * urand()); }

static float *h_uni(int64_t n, float lo, float hi) {
    float *p = hf(n);
    for (int64_t i = 0; i < n; i++) p[i] = uni(lo, hi);
    return p;
}
static float *h_normal(int64_t n, float sd) {
    float *p = hf(n);
    for (int64_t i = 0; i < n; i++) p[i] = sd * nrand();
    return p;
}
/* rows whose RMS differs by orders of magnitude, as activations do */
static float *h_rows(int64_t rows, int64_t n) {
    float *p = hf(rows * n);
    for (int64_t r = 0; r < rows; r++) {
        const float s = powf(10.0f, (float)((int)(rnd() % 7) - 3));
        for (int64_t i = 0; i < n; i++) p[r * n + i] = s * nrand();
    }
    return p;
}
/* n columns of K activations: a scale per column and a few outliers (so q8 blocks differ) */
static float *h_acts(int64_t n, int64_t K) {
    float *x = hf(n * K);
    for (int64_t t = 0; t < n; t++) {
        const float cs = 0.1f + 3.0f * urand();
        for (int64_t k = 0; k < K; k++) x[t * K + k] = cs * nrand() * (rnd() % 61 == 0 ? 20.0f : 1.0f);
    }
    return x;
}
/* a random permutation of 0 .. n-1 */
static int32_t *h_perm(int64_t n) {
    int32_t *p = hmem((size_t)n * sizeof *p);
    for (int64_t i = 0; i < n; i++) p[i] = (int32_t)i;
    for (int64_t i = n - 1; i > 0; i--) {
        const int64_t j = (int64_t)(rnd() % (uint64_t)(i + 1));
        const int32_t t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
    return p;
}

/* ---------------------------------------------------------------- ops and comparisons */

typedef struct {
    const char *name;
    char types[16];
    double err;
    int bad, to_break, broken;
} op_t;

static op_t op_new(const char *name, const char *types) {
    op_t op;
    memset(&op, 0, sizeof op);
    op.name = name;
    snprintf(op.types, sizeof op.types, "%s", types);
    op.to_break = g_break && strcmp(g_break, name) == 0;
    g_break_hits += op.to_break;
    return op;
}

static void op_done(op_t *op) {
    printf("OP %s %s %s %.3g\n", op->name, op->types, op->bad ? "fail" : "pass", op->err);
    fflush(stdout);
    g_ops++;
    g_failed_ops += op->bad != 0;
}

static void note(op_t *op, const char *what, double err, int ok) {
    if (!(err <= op->err)) op->err = err;   /* NaN sticks */
    if (!ok) {
        fprintf(stderr, "%s %s %s: max rel err %.3g (bound %g)\n", op->name, op->types, what, err,
                g_exact ? 0.0 : TOL);
        op->bad = 1;
    }
}

/* A launch on one side: it must be queued (STRATA_OK). */
static void ran(op_t *op, const char *what, int side, strata_status st) {
    if (st == STRATA_OK) return;
    fprintf(stderr, "%s %s %s (%s): status %d: %s\n", op->name, op->types, what, tab(side)->name, (int)st,
            strata_last_error());
    note(op, what, INFINITY, 0);
}

/* A refusal: both sides return `want` (the emulation refuses what its launcher refuses). */
static void refused(op_t *op, const char *what, strata_status dev, strata_status emu, strata_status want) {
    if (dev == want && emu == want) return;
    fprintf(stderr, "%s %s %s: statuses %d (device) and %d (emu), want %d\n", op->name, op->types, what, (int)dev,
            (int)emu, (int)want);
    note(op, what, INFINITY, 0);
}

enum { K_F32, K_I32, K_I64, K_U8 };
static size_t kind_bytes(int kind) { return kind == K_F32 || kind == K_I32 ? 4 : kind == K_I64 ? 8 : 1; }

/* max |got - ref| over max |ref| (ref's finite values); identical bits count 0, a NaN or inf elsewhere
 * counts infinite */
static double f32_err(const float *got, const float *ref, int64_t n) {
    double scale = 0.0, d = 0.0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(ref[i]) && fabs((double)ref[i]) > scale) scale = fabs((double)ref[i]);
    for (int64_t i = 0; i < n; i++) {
        if (!memcmp(&got[i], &ref[i], sizeof(float))) continue;
        double e = fabs((double)got[i] - (double)ref[i]);
        if (!isfinite(e)) e = INFINITY;
        if (e > d) d = e;
    }
    return d / (scale > 0.0 ? scale : 1.0);
}

/* --break: the device's output after the launch, changed where it matters most (the element of the
 * emulation's largest |value| by 1 %, an integer or byte by 1), in device memory and in the copy read. */
static void perturb(int kind, void *dev, void *got, const void *ref, int64_t n) {
    int64_t i = 0;
    if (kind == K_F32) {
        const float *r = ref;
        float *g = got;
        for (int64_t j = 0; j < n; j++)
            if (isfinite(r[j]) && (!isfinite(r[i]) || fabsf(r[j]) > fabsf(r[i]))) i = j;
        g[i] = g[i] != 0.0f && isfinite(g[i]) ? g[i] * 1.01f : 1.0f;
    } else if (kind == K_I32) {
        ((int32_t *)got)[0] += 1;
    } else if (kind == K_I64) {
        ((int64_t *)got)[0] += 1;
    } else {
        ((uint8_t *)got)[0] ^= 1u;
    }
    const size_t es = kind_bytes(kind);
    if (DEV->copy((char *)dev + (size_t)i * es, (char *)got + (size_t)i * es, es, DK_H2D, NULL) != STRATA_OK)
        g_other_fail++;
}

/* The device's copy of b against the emulation's: floats within TOL (bit for bit with --device emu), the
 * other kinds equal. */
static void cmp(op_t *op, const char *what, int kind, const buf *b) {
    const int64_t n = (int64_t)(b->bytes / kind_bytes(kind));
    void *got = hmem(b->bytes);
    if (DEV->copy(got, b->d, b->bytes, DK_D2H, NULL) != STRATA_OK) {
        fprintf(stderr, "%s %s %s: download: %s\n", op->name, op->types, what, strata_last_error());
        note(op, what, INFINITY, 0);
        return;
    }
    if (op->to_break && !op->broken) {
        perturb(kind, b->d, got, b->h, n);
        op->broken = 1;
    }
    const int same = memcmp(got, b->h, b->bytes) == 0;
    if (kind == K_F32) {
        const double e = f32_err(got, b->h, n);
        note(op, what, e, g_exact ? same : e <= TOL);
    } else {
        note(op, what, same ? 0.0 : 1.0, same);
    }
}

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------- the memory functions */

/* alloc, copy, copy2d, zero, sync, mem_info: what every op below relies on (not an op: a failure here
 * fails the run). */
static void check_memory(void) {
    enum { W = 6, SP = 8, DP = 10, ROWS = 3 };
    float src[ROWS * SP], back[ROWS * SP];
    for (int i = 0; i < ROWS * SP; i++) src[i] = (float)i + 0.5f;
    float *d = dmem(sizeof(float) * ROWS * DP);
    int ok = DEV->zero(d, sizeof(float) * ROWS * DP, NULL) == STRATA_OK;
    ok = ok && DEV->copy2d(d, sizeof(float) * DP, src, sizeof(float) * SP, sizeof(float) * W, ROWS, DK_H2D, NULL) ==
                   STRATA_OK;
    ok = ok && DEV->zero(d + DP, sizeof(float) * 2, NULL) == STRATA_OK;   /* row 1's first two values */
    ok = ok && DEV->sync(NULL) == STRATA_OK;
    memset(back, 0xff, sizeof back);
    ok = ok && DEV->copy2d(back, sizeof(float) * SP, d, sizeof(float) * DP, sizeof(float) * (W + 1), ROWS, DK_D2H,
                           NULL) == STRATA_OK;
    for (int r = 0; r < ROWS && ok; r++)
        for (int c = 0; c < SP; c++) {
            const float want = c < W ? (r == 1 && c < 2 ? 0.0f : src[r * SP + c]) : c == W ? 0.0f : NAN;
            ok = c > W ? isnan(back[r * SP + c]) : back[r * SP + c] == want;
            if (!ok) break;
        }
    uint64_t fb = 0, tb = 0;
    ok = ok && DEV->mem_info(&fb, &tb) == STRATA_OK && tb > 0 && fb <= tb;
    printf("# memory (%s): alloc, zero, copy2d, sync, mem_info %s\n", DEV->name, ok ? "ok" : "FAILED");
    if (!ok) {
        fprintf(stderr, "the memory functions failed: %s\n", strata_last_error());
        g_other_fail++;
    }
    release();
}

/* ================================================================ gemv.h, gemm.h */

static const int TYPES[] = {GT_F32,   GT_F16,    GT_BF16,  GT_Q4_0,  GT_Q4_1,   GT_Q5_0, GT_Q5_1,
                            GT_Q8_0,  GT_IQ4_NL, GT_MXFP4, GT_NVFP4, GT_Q2_K,   GT_Q3_K, GT_Q4_K,
                            GT_Q5_K,  GT_Q6_K,   GT_IQ4_XS, GT_IQ2_XXS, GT_IQ2_XS, GT_IQ3_XXS};
enum { N_TYPES = sizeof TYPES / sizeof TYPES[0] };

static void op_name(char *out, size_t cap, const char *family, const strata_qtraits *t) {
    int n = snprintf(out, cap, "%s.", family);
    for (const char *p = t->name; *p && n + 1 < (int)cap; p++) out[n++] = (char)(*p >= 'A' && *p <= 'Z' ? *p + 32 : *p);
    out[n] = 0;
}

/* The byte offsets of a block's fp16 scales (d, dmin), for the types without a quantizer. */
static int scale_offsets(int type, int off[2]) {
    switch (type) {
    case GT_Q4_1: case GT_Q5_1: case GT_Q4_K: case GT_Q5_K: off[0] = 0; off[1] = 2; return 2;
    case GT_Q2_K: off[0] = 80; off[1] = 82; return 2;
    case GT_Q3_K: off[0] = 108; return 1;
    case GT_Q6_K: off[0] = 208; return 1;
    case GT_MXFP4: case GT_NVFP4: return 0;
    default: off[0] = 0; return 1;
    }
}

/* distinct rows of the LM head slice: a prime, so a row read at a power-of-two offset from its own is
 * another row */
enum { LM_DISTINCT = 509 };

/* R rows of K values of type t: floats for F32 / F16 / BF16, the library's quantizer where t has one, else
 * random blocks with sane fp16 scales. */
static uint8_t *h_weights(const strata_qtraits *t, int64_t R, int64_t K, size_t *row_bytes) {
    *row_bytes = (size_t)(K / t->block_size) * (size_t)t->type_size;
    const size_t bytes = *row_bytes * (size_t)R;
    uint8_t *w = hmem(bytes);
    if (R > LM_DISTINCT) {   /* the LM head slice: its first rows repeated (quantizing 8192 rows takes seconds) */
        const uint8_t *d = h_weights(t, LM_DISTINCT, K, row_bytes);
        for (int64_t r = 0; r < R; r++)
            memcpy(w + (size_t)r * *row_bytes, d + (size_t)(r % LM_DISTINCT) * *row_bytes, *row_bytes);
        return w;
    }
    if (t->type == GT_F32 || t->type == GT_F16 || t->type == GT_BF16 || t->quantize) {
        float *f = h_normal(R * K, 0.05f);
        if (t->type == GT_F32) {
            memcpy(w, f, bytes);
        } else if (t->type == GT_F16) {
            for (int64_t i = 0; i < R * K; i++) ((uint16_t *)w)[i] = strata_fp32_to_fp16(f[i]);
        } else if (t->type == GT_BF16) {
            for (int64_t i = 0; i < R * K; i++) {
                uint32_t u;
                memcpy(&u, &f[i], 4);
                ((uint16_t *)w)[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);   /* round to nearest even */
            }
        } else if (t->quantize(f, w, R, K, NULL) != bytes) {
            fprintf(stderr, "the %s quantizer wrote an unexpected size\n", t->name);
            g_other_fail++;
        }
        return w;
    }
    const int64_t nb = R * K / t->block_size;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *p = w + b * t->type_size;
        for (int i = 0; i < t->type_size; i++) p[i] = (uint8_t)rnd();
        int off[2];
        const int ns = scale_offsets(t->type, off);
        for (int s = 0; s < ns; s++) {
            const uint16_t h = strata_fp32_to_fp16((rnd() & 1 ? -1.0f : 1.0f) * (0.01f + 0.03f * urand()));
            memcpy(p + off[s], &h, 2);
        }
    }
    return w;
}

/* act_quant then gemv, R x K times n columns; y and xq compared. */
static void gemv_case(op_t *op, const strata_qtraits *t, int64_t R, int64_t K, int64_t n, uint64_t sd) {
    seed(sd);
    size_t rb;
    const uint8_t *wh = h_weights(t, R, K, &rb);
    const buf w = pair(wh, rb * (size_t)R), x = pairf(h_acts(n, K), n * K);
    const buf xq = pairf(NULL, n * K), y = pairf(NULL, n * R);
    for (int s = 0; s < 2; s++) {
        ran(op, "act_quant", s, tab(s)->act_quant(NULL, (int)t->act, PF(x, s), PF(xq, s), n, K));
        ran(op, "gemv", s, tab(s)->gemv(NULL, t->type, P(w, s), rb, R, K, PF(xq, s), n, PF(y, s)));
    }
    cmp(op, "y", K_F32, &y);
    cmp(op, "xq", K_F32, &xq);
    release();
}

static void gemv_ops(void) {
    /* (K in, R out, columns): hc down, an expert's down (K 640: no 256-value type holds it) */
    static const int64_t shapes[][3] = {{2560, 320, 2}, {640, 2560, 2}};
    for (int i = 0; i < N_TYPES; i++) {
        const strata_qtraits *t = strata_qtraits_get(TYPES[i]);
        char name[32];
        op_name(name, sizeof name, "gemv", t);
        op_t op = op_new(name, t->name);
        for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++)
            if (shapes[c][0] % t->block_size == 0) gemv_case(&op, t, shapes[c][1], shapes[c][0], shapes[c][2], 100 + c);
        gemv_case(&op, t, 37, t->block_size > 1 ? 3 * t->block_size : 100, 3, 110);   /* odd */
        refused(&op, "type 34", DEV->gemv(NULL, 34, NULL, 210, 1, 256, NULL, 1, NULL),
                EMU->gemv(NULL, 34, NULL, 210, 1, 256, NULL, 1, NULL), STRATA_ERR_UNSUPPORTED);
        if (t->block_size > 1)
            refused(&op, "K not a block multiple",
                    DEV->gemv(NULL, t->type, NULL, 1, 1, t->block_size + 1, NULL, 1, NULL),
                    EMU->gemv(NULL, t->type, NULL, 1, 1, t->block_size + 1, NULL, 1, NULL), STRATA_ERR_INVALID_ARG);
        op_done(&op);
    }
    /* the LM head: a slice of 8192 rows of the output matrix (LM_DISTINCT of them distinct), one column */
    static const int LM[] = {GT_Q6_K, GT_Q8_0, GT_F16};
    for (int i = 0; i < 3; i++) {
        const strata_qtraits *t = strata_qtraits_get(LM[i]);
        char name[32];
        op_name(name, sizeof name, "lmhead", t);
        op_t op = op_new(name, t->name);
        gemv_case(&op, t, 8192, 2560, 1, 120 + i);
        op_done(&op);
    }
}

/* strata_cuda_gemm over R rows in tiles of tile_rows rows (+ 7 bytes: not a whole row), n columns; handle:
 * the device table's (cuBLAS where the build has it) or NULL (the launcher's own kernel). */
static void gemm_case(op_t *op, const strata_qtraits *t, int64_t R, int64_t K, int64_t n, int64_t tile_rows,
                      void *handle, uint64_t sd) {
    seed(sd);
    size_t rb;
    const uint8_t *wh = h_weights(t, R, K, &rb);
    const buf w = pair(wh, rb * (size_t)R), x = pairf(h_acts(n, K), n * K), y = pairf(NULL, n * R);
    const size_t tb = DEV->gemm_tile_bytes(K, tile_rows, 0) + 7;
    if (tb != EMU->gemm_tile_bytes(K, tile_rows, 0) + 7) note(op, "tile bytes", INFINITY, 0);
    const buf tile = pair(NULL, tb);
    for (int s = 0; s < 2; s++)
        ran(op, "gemm", s,
            tab(s)->gemm(s == SIDE_DEV ? handle : NULL, NULL, t->type, P(w, s), rb, R, K, PF(x, s), n, PF(y, s),
                         P(tile, s), tb, 0, NULL));
    cmp(op, "y", K_F32, &y);
    release();
}

static void gemm_ops(void) {
    void *hd = NULL, *he = NULL;
    const strata_status sd = DEV->gemm_create(&hd), se = EMU->gemm_create(&he);
    for (int i = 0; i < N_TYPES; i++) {
        const strata_qtraits *t = strata_qtraits_get(TYPES[i]);
        char name[32];
        op_name(name, sizeof name, "gemm", t);
        op_t op = op_new(name, t->name);
        refused(&op, "gemm_create", sd, se, STRATA_OK);
        const int64_t K_odd = t->block_size > 1 ? 3 * t->block_size : 100;
        gemm_case(&op, t, 48, 2560, 4, 5, NULL, 200);   /* the kernel without cuBLAS: 10 tiles, the last short */
        gemm_case(&op, t, 48, 2560, 4, 16, hd, 201);    /* the device's handle */
        gemm_case(&op, t, 9, K_odd, 3, 4, hd, 202);
        refused(&op, "type 34", DEV->gemm(hd, NULL, 34, NULL, 210, 1, 256, NULL, 1, NULL, NULL, 1024, 0, NULL),
                EMU->gemm(he, NULL, 34, NULL, 210, 1, 256, NULL, 1, NULL, NULL, 1024, 0, NULL), STRATA_ERR_UNSUPPORTED);
        const size_t small = DEV->gemm_tile_bytes(K_odd, 1, 0) - 1;
        refused(&op, "tile holds no row",
                DEV->gemm(hd, NULL, t->type, NULL, 1, 1, K_odd, NULL, 1, NULL, NULL, small, 0, NULL),
                EMU->gemm(he, NULL, t->type, NULL, 1, 1, K_odd, NULL, 1, NULL, NULL, small, 0, NULL),
                STRATA_ERR_BUFFER_TOO_SMALL);
        op_done(&op);
    }
    if (sd == STRATA_OK) DEV->gemm_destroy(hd);
    if (se == STRATA_OK) EMU->gemm_destroy(he);

    op_t op = op_new("gemv.scale", "-");
    /* an expert's outputs times an NVFP4 tensor's .scale (~1e-3), a larger one, a negative one on an odd count */
    static const struct { int64_t n; float s; } cases[] = {{3 * 2560, 0.0031f}, {2 * 640, 1.75f}, {37, -0.75f}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        seed(210 + c);
        const buf y = pairf(h_normal(cases[c].n, 3.0f), cases[c].n);
        for (int s = 0; s < 2; s++) ran(&op, "scale", s, tab(s)->scale(NULL, PF(y, s), cases[c].n, cases[c].s));
        cmp(&op, "y", K_F32, &y);
        release();
    }
    refused(&op, "n < 0", DEV->scale(NULL, NULL, -1, 2.0f), EMU->scale(NULL, NULL, -1, 2.0f), STRATA_ERR_INVALID_ARG);
    op_done(&op);
}

/* ================================================================ norm.h, rope.h */

/* rmsnorm_rows of rows x n (strides xs, ys; wg weight groups, w NULL when !weighted); in place when y_is_x */
static void norm_case(op_t *op, int64_t rows, int64_t n, int64_t xs, int64_t ys, int64_t wg, int weighted,
                      int y_is_x, uint64_t sd) {
    seed(sd);
    const buf x = pairf(h_rows(rows * xs / n + 1, n), (rows * xs / n + 1) * n);   /* rows at stride xs */
    const buf w = pairf(weighted ? h_uni(wg * n, 0.6f, 1.4f) : NULL, weighted ? wg * n : 1);
    const buf y = y_is_x ? x : pairf(NULL, rows * ys);
    for (int s = 0; s < 2; s++)
        ran(op, "rmsnorm_rows", s,
            tab(s)->rmsnorm_rows(PF(x, s), xs, weighted ? PF(w, s) : NULL, wg, rows, n, EPS, PF(y, s), ys, NULL));
    cmp(op, "y", K_F32, &y);
    release();
}

static void norm_ops(void) {
    op_t op = op_new("norm.rmsnorm", "-");
    norm_case(&op, 3 * 24, 256, 2 * 256, 256, 1, 1, 0, 300);   /* QSA q norm: 24 heads of q_proj's [q | gate] rows */
    norm_case(&op, 3 * 4, 128, 128, 128, 1, 1, 1, 301);        /* indexer queries, in place */
    static const int64_t odd[][3] = {{5, 37, 0}, {3, 5, 1}, {2, 2560, 1}, {4, 33, 1}, {2, 10240, 1}};
    for (size_t c = 0; c < sizeof odd / sizeof odd[0]; c++)
        norm_case(&op, odd[c][0], odd[c][1], odd[c][1], odd[c][1], 1, (int)odd[c][2], 0, 302 + c);
    op_done(&op);

    op = op_new("norm.group_rmsnorm", "-");
    static const int64_t groups[][4] = {{3, 4, 2560, 1}, {2, 3, 45, 0}, {3, 2, 7, 1}, {1, 5, 64, 1}};   /* L, G, n, w */
    for (size_t c = 0; c < sizeof groups / sizeof groups[0]; c++) {
        const int64_t rows = groups[c][0] * groups[c][1], n = groups[c][2];
        norm_case(&op, rows, n, n, n, groups[c][1], (int)groups[c][3], 0, 310 + c);
    }
    op_done(&op);
}

/* rope_angles of L rows; returns the error (and judges it when `judged`) */
static double angles_case(op_t *op, float theta, int32_t n_rot, int64_t p0, int64_t dp, int64_t L, int judged) {
    const buf cs = pairf(NULL, L * n_rot);
    for (int s = 0; s < 2; s++)
        ran(op, "rope_angles", s, tab(s)->rope_angles(theta, n_rot, p0, dp, L, PF(cs, s), NULL));
    double e = 0.0;
    if (judged) {
        cmp(op, "cs", K_F32, &cs);
    } else {
        float *got = hf(L * n_rot);
        e = DEV->copy(got, cs.d, cs.bytes, DK_D2H, NULL) == STRATA_OK ? f32_err(got, cs.h, L * n_rot) : INFINITY;
    }
    release();
    return e;
}

static void rope_ops(void) {
    op_t op = op_new("rope.angles", "-");
    /* theta, n_rot, p0, dp, L: a prefill from 0, block summaries (dp = r = 4), odd ones; positions <= 16,
     * where a few ulps of powf move an angle by less than TOL */
    static const struct { float theta; int32_t n_rot; int64_t p0, dp, L; } cases[] = {
        {1e7f, 64, 0, 1, 9}, {1e7f, 64, 0, 4, 5}, {1e7f, 64, 12, 1, 3}, {1e4f, 6, 5, 1, 3}, {1e6f, 128, 10, 3, 2}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        angles_case(&op, cases[c].theta, cases[c].n_rot, cases[c].p0, cases[c].dp, cases[c].L, 1);
    op_done(&op);
    op_t info = op_new("rope.angles (long positions)", "-");
    const double e1 = angles_case(&info, 1e7f, 64, 4096, 4, 3, 0), e2 = angles_case(&info, 1e7f, 64, 262000, 1, 3, 0);
    printf("# note: rope.angles at positions 4096..4104: max rel err %.3g, 262000..262002: %.3g "
           "(powf's last bits times the position; not judged)\n", e1, e2);
    if (info.bad) g_other_fail++;

    op = op_new("rope.apply", "-");
    /* L, heads, n_rot, row stride: QSA q and k (256), indexer heads (128), odd (dims past n_rot untouched) */
    static const int64_t apply[][4] = {{3, 24, 64, 256}, {3, 2, 64, 256}, {3, 4, 64, 128}, {2, 3, 6, 11},
                                       {2, 3, 8, 32}};
    for (size_t c = 0; c < sizeof apply / sizeof apply[0]; c++) {
        seed(320 + c);
        const int64_t L = apply[c][0], nh = apply[c][1], xs = apply[c][3];
        const int32_t nr = (int32_t)apply[c][2];
        float *csh = hf(L * nr);
        ran(&op, "rope_angles (input)", SIDE_EMU, EMU->rope_angles(1e7f, nr, 7, 3, L, csh, NULL));
        const buf cs = pairf(csh, L * nr), x = pairf(h_normal(L * nh * xs, 1.0f), L * nh * xs);
        for (int s = 0; s < 2; s++)
            ran(&op, "rope_apply", s, tab(s)->rope_apply(PF(x, s), xs, L * nh, nh, nr, PF(cs, s), NULL));
        cmp(&op, "x", K_F32, &x);
        release();
    }
    op_done(&op);
}

/* ================================================================ hc.h */

/* A hyper-connection read on one side: read_norm, W_down (act_quant, gemv), read_act, W_up, read_mix, and
 * with inject W_inj and inject (F32 weights: their activations are the floats as they are). */
typedef struct {
    buf X, norm, wd, wu, wi, xh, xq, a, aq, g, u, ai, c;
    int64_t L, hc, E, R;
} hc_read_bufs;

static void hc_read_side(op_t *op, int s, const hc_read_bufs *b, int inject) {
    const mdl_dk *k = tab(s);
    const int64_t L = b->L, hc = b->hc, E = b->E, R = b->R, W = hc * E;
    const int f32 = GT_F32;
    ran(op, "hc_read_norm", s, k->hc_read_norm(PF(b->X, s), PF(b->norm, s), L, hc, E, EPS, PF(b->xh, s), NULL));
    ran(op, "act_quant", s, k->act_quant(NULL, STRATA_ACT_F32, PF(b->xh, s), PF(b->xq, s), L, W));
    ran(op, "gemv down", s, k->gemv(NULL, f32, P(b->wd, s), (size_t)W * 4, R, W, PF(b->xq, s), L, PF(b->a, s)));
    ran(op, "hc_read_act", s, k->hc_read_act(PF(b->a, s), L * R, hc, NULL));
    ran(op, "act_quant", s, k->act_quant(NULL, STRATA_ACT_F32, PF(b->a, s), PF(b->aq, s), L, R));
    ran(op, "gemv up", s, k->gemv(NULL, f32, P(b->wu, s), (size_t)R * 4, W, R, PF(b->aq, s), L, PF(b->g, s)));
    ran(op, "hc_read_mix", s, k->hc_read_mix(PF(b->g, s), PF(b->xh, s), L, hc, E, PF(b->u, s), NULL));
    if (!inject) return;
    ran(op, "gemv inject", s, k->gemv(NULL, f32, P(b->wi, s), (size_t)W * 4, hc, W, PF(b->xq, s), L, PF(b->ai, s)));
    ran(op, "hc_inject", s, k->hc_inject(PF(b->ai, s), L * hc, hc, PF(b->c, s), NULL));
}

static void hc_read_case(op_t *op, int64_t L, int64_t hc, int64_t E, int64_t R, int inject, uint64_t sd) {
    seed(sd);
    const int64_t W = hc * E;
    hc_read_bufs b;
    b.L = L; b.hc = hc; b.E = E; b.R = R;
    const float sdn = sqrtf(3.0f / (float)W), sup = sqrtf(3.0f / (float)R);
    b.X = pairf(h_rows(L * hc, E), L * W);
    b.norm = pairf(h_uni(W, 0.3f, 1.7f), W);
    b.wd = pairf(h_uni(R * W, -2.0f * sdn, 2.0f * sdn), R * W);
    b.wu = pairf(h_uni(W * R, -4.0f * sup, 4.0f * sup), W * R);
    b.wi = pairf(h_uni(hc * W, -8.0f * sdn, 8.0f * sdn), hc * W);
    b.xh = pairf(NULL, L * W); b.xq = pairf(NULL, L * W); b.a = pairf(NULL, L * R); b.aq = pairf(NULL, L * R);
    b.g = pairf(NULL, L * W); b.u = pairf(NULL, L * E); b.ai = pairf(NULL, L * hc); b.c = pairf(NULL, L * hc);
    for (int s = 0; s < 2; s++) hc_read_side(op, s, &b, inject);
    cmp(op, "u", K_F32, &b.u);
    if (inject) cmp(op, "c", K_F32, &b.c);
    release();
}

static void hc_ops(void) {
    op_t op = op_new("hc.read_norm", "-");
    static const int64_t rn[][3] = {{3, 4, 2560}, {2, 3, 50}};   /* L, hc, E */
    for (size_t c = 0; c < 2; c++) {
        seed(400 + c);
        const int64_t L = rn[c][0], hc = rn[c][1], E = rn[c][2], W = hc * E;
        const buf X = pairf(h_rows(L * hc, E), L * W), w = pairf(h_uni(W, 0.3f, 1.7f), W), xh = pairf(NULL, L * W);
        for (int s = 0; s < 2; s++)
            ran(&op, "hc_read_norm", s, tab(s)->hc_read_norm(PF(X, s), PF(w, s), L, hc, E, EPS, PF(xh, s), NULL));
        cmp(&op, "xh", K_F32, &xh);
        release();
    }
    op_done(&op);

    op_t act = op_new("hc.read_act", "-"), mix = op_new("hc.read_mix", "-"), inj = op_new("hc.inject", "-");
    op_t wr = op_new("hc.write", "-");
    static const int64_t ew[][4] = {{3, 4, 2560, 320}, {2, 3, 37, 5}};   /* L, hc, E, R */
    for (size_t c = 0; c < 2; c++) {
        seed(410 + c);
        const int64_t L = ew[c][0], hc = ew[c][1], E = ew[c][2], R = ew[c][3], W = hc * E;
        const buf a = pairf(h_normal(L * R, 4.0f), L * R);
        const buf g = pairf(h_normal(L * W, 3.0f), L * W), xh = pairf(h_normal(L * W, 1.0f), L * W);
        const buf u = pairf(NULL, L * E);
        const buf ai = pairf(h_normal(L * hc, 8.0f), L * hc), cc = pairf(NULL, L * hc);
        const buf X = pairf(h_normal(L * W, 1.0f), L * W), cw = pairf(h_uni(L * hc, 0.0f, 2.0f), L * hc);
        const buf y = pairf(h_normal(L * E, 1.0f), L * E);
        for (int s = 0; s < 2; s++) {
            const mdl_dk *k = tab(s);
            ran(&act, "hc_read_act", s, k->hc_read_act(PF(a, s), L * R, hc, NULL));
            ran(&mix, "hc_read_mix", s, k->hc_read_mix(PF(g, s), PF(xh, s), L, hc, E, PF(u, s), NULL));
            ran(&inj, "hc_inject", s, k->hc_inject(PF(ai, s), L * hc, hc, PF(cc, s), NULL));
            ran(&wr, "hc_write", s, k->hc_write(PF(X, s), PF(cw, s), PF(y, s), L, hc, E, NULL));
        }
        cmp(&act, "a", K_F32, &a);
        cmp(&mix, "u", K_F32, &u);
        cmp(&inj, "c", K_F32, &cc);
        cmp(&wr, "X", K_F32, &X);
        release();
    }
    op_done(&act);
    op_done(&mix);
    op_done(&inj);
    op_done(&wr);

    op_t rd = op_new("hc.read", "-"), fin = op_new("hc.final", "-");
    hc_read_case(&rd, 2, 4, 2560, 320, 1, 420);
    hc_read_case(&rd, 3, 3, 40, 5, 1, 421);
    hc_read_case(&fin, 2, 4, 2560, 320, 0, 422);
    hc_read_case(&fin, 3, 3, 40, 5, 0, 423);
    op_done(&rd);
    op_done(&fin);
}

/* ================================================================ router.h, merge.h */

/* K distinct experts per token, uniformly */
static int32_t *h_picks(int64_t L, int64_t Ne, int64_t K) {
    int32_t *pick = hmem((size_t)(L * K) * sizeof *pick);
    for (int64_t t = 0; t < L; t++)
        for (int64_t k = 0; k < K; k++) {
            int32_t e;
            int dup;
            do {
                e = (int32_t)(rnd() % (uint64_t)Ne);
                dup = 0;
                for (int64_t j = 0; j < k; j++) dup |= pick[t * K + j] == e;
            } while (dup);
            pick[t * K + k] = e;
        }
    return pick;
}

static void router_ops(void) {
    op_t op = op_new("router.topk", "-");
    /* L, Ne, K, logit spacing: every token's logits a permutation of evenly spaced values, so no two
     * probabilities are within the device's expf rounding of each other */
    static const struct { int64_t L, Ne, K; float step; } tk[] = {
        {8, 512, 10, 0.02f}, {3, 37, 3, 0.1f}, {2, 20, 4, 0.3f}, {2, 512, 10, 0.08f}};
    for (size_t c = 0; c < sizeof tk / sizeof tk[0]; c++) {
        seed(500 + c);
        const int64_t L = tk[c].L, Ne = tk[c].Ne, K = tk[c].K;
        float *lh = hf(L * Ne);
        for (int64_t t = 0; t < L; t++) {
            const int32_t *perm = h_perm(Ne);
            const float off = uni(-2.0f, 2.0f);
            for (int64_t e = 0; e < Ne; e++) lh[t * Ne + e] = off + tk[c].step * (float)(perm[e] - Ne / 2);
        }
        const buf lg = pairf(lh, L * Ne), pick = pair(NULL, (size_t)(L * K) * 4), pw = pairf(NULL, L * K);
        for (int s = 0; s < 2; s++)
            ran(&op, "router_topk", s,
                tab(s)->router_topk(PF(lg, s), L, Ne, K, (int32_t *)P(pick, s), PF(pw, s), NULL));
        cmp(&op, "pick", K_I32, &pick);
        cmp(&op, "pw", K_F32, &pw);
        cmp(&op, "probabilities", K_F32, &lg);
        release();
    }
    op_done(&op);

    op = op_new("router.group", "-");
    /* L, Ne, K: a decode step, a prefill chunk, odd, picks crowded on a few experts */
    static const int64_t gr[][3] = {{1, 512, 10}, {64, 512, 10}, {9, 37, 3}, {40, 16, 10}};
    for (size_t c = 0; c < sizeof gr / sizeof gr[0]; c++) {
        seed(510 + c);
        const int64_t L = gr[c][0], Ne = gr[c][1], K = gr[c][2], n = L * K;
        const buf pick = pair(h_picks(L, Ne, K), (size_t)n * 4);
        const buf count = pair(NULL, (size_t)(Ne + 1) * 8), slot = pair(NULL, (size_t)n * 8);
        const buf row = pair(NULL, (size_t)n * 8);
        for (int s = 0; s < 2; s++)
            ran(&op, "router_group", s,
                tab(s)->router_group((const int32_t *)P(pick, s), n, Ne, (int64_t *)P(count, s), (int64_t *)P(slot, s),
                                     (int64_t *)P(row, s), NULL));
        cmp(&op, "count", K_I64, &count);
        cmp(&op, "slot", K_I64, &slot);
        cmp(&op, "row", K_I64, &row);
        release();
    }
    op_done(&op);
}

static void merge_ops(void) {
    op_t op = op_new("merge.glu", "-");
    /* n, F, fused, sg, su: an expert's tokens fused and split (NVFP4-like scales), the shared expert, odd */
    static const struct { int64_t n, F; int fused; float sg, su; } glu[] = {
        {7, 640, 1, 0.75f, 1.25f}, {7, 640, 0, 1.0f, 1.0f}, {3, 640, 0, 0.5f, 2.0f}, {3, 37, 1, 1.0f, 0.3f},
        {1, 33, 0, 2.0f, 1.0f}};
    for (size_t c = 0; c < sizeof glu / sizeof glu[0]; c++) {
        seed(600 + c);
        const int64_t n = glu[c].n, F = glu[c].F;
        const buf gu = pairf(h_normal(n * 2 * F, 3.0f), n * 2 * F), h = pairf(NULL, n * F);
        for (int s = 0; s < 2; s++)
            ran(&op, "merge_glu", s,
                tab(s)->merge_glu(PF(gu, s), n, F, glu[c].fused, glu[c].sg, glu[c].su, PF(h, s), NULL));
        cmp(&op, "h", K_F32, &h);
        release();
    }
    op_done(&op);

    op = op_new("merge.shared_gate", "-");
    static const int64_t sg[][2] = {{5, 2560}, {3, 37}, {2, 20}};   /* L, E */
    for (size_t c = 0; c < sizeof sg / sizeof sg[0]; c++) {
        seed(610 + c);
        const int64_t L = sg[c][0], E = sg[c][1];
        const float a = 2.0f / sqrtf((float)E);
        const buf w = pairf(h_uni(E, -a, a), E), x = pairf(h_normal(L * E, 1.0f), L * E), gate = pairf(NULL, L);
        for (int s = 0; s < 2; s++)
            ran(&op, "merge_shared_gate", s, tab(s)->merge_shared_gate(PF(w, s), PF(x, s), L, E, PF(gate, s), NULL));
        cmp(&op, "gate", K_F32, &gate);
        release();
    }
    op_done(&op);

    op = op_new("merge.gather", "-");
    static const int64_t ga[][4] = {{1, 2560, 512, 10}, {64, 2560, 512, 10}, {5, 37, 9, 3}};   /* L, E, Ne, K */
    for (size_t c = 0; c < sizeof ga / sizeof ga[0]; c++) {
        seed(615 + c);
        const int64_t L = ga[c][0], E = ga[c][1], Ne = ga[c][2], K = ga[c][3], n = L * K;
        const int32_t *pick = h_picks(L, Ne, K);
        int64_t *count = hmem((size_t)(Ne + 1) * 8), *slot = hmem((size_t)n * 8), *row = hmem((size_t)n * 8);
        ran(&op, "router_group (input)", SIDE_EMU, EMU->router_group(pick, n, Ne, count, slot, row, NULL));
        const buf bs = pair(slot, (size_t)n * 8), x = pairf(h_normal(L * E, 1.0f), L * E), xg = pairf(NULL, n * E);
        for (int s = 0; s < 2; s++)
            ran(&op, "merge_gather", s,
                tab(s)->merge_gather(PF(x, s), (const int64_t *)P(bs, s), n, K, E, PF(xg, s), NULL));
        cmp(&op, "xg", K_F32, &xg);
        release();
    }
    op_done(&op);

    op = op_new("merge.sum", "-");
    /* L, E, Ne, K, scaled (per-expert down scales, a shared one, skipped experts) */
    static const int64_t sm[][5] = {{5, 2560, 512, 10, 1}, {5, 2560, 512, 10, 0}, {4, 37, 37, 3, 1},
                                    {3, 64, 16, 10, 1}};
    for (size_t c = 0; c < sizeof sm / sizeof sm[0]; c++) {
        seed(620 + c);
        const int64_t L = sm[c][0], E = sm[c][1], Ne = sm[c][2], K = sm[c][3], n = L * K;
        const int scaled = (int)sm[c][4];
        const int32_t *pick = h_picks(L, Ne, K);
        float *pw = h_uni(n, 0.01f, 1.0f);
        for (int64_t t = 0; t < L; t++) {
            float z = 0.0f;
            for (int64_t k = 0; k < K; k++) z += pw[t * K + k];
            for (int64_t k = 0; k < K; k++) pw[t * K + k] /= z;
        }
        /* the grouping's rows and the shared gate, as the emulation makes them */
        int64_t *count = hmem((size_t)(Ne + 1) * 8), *slot = hmem((size_t)n * 8), *row = hmem((size_t)n * 8);
        ran(&op, "router_group (input)", SIDE_EMU, EMU->router_group(pick, n, Ne, count, slot, row, NULL));
        const float a = 2.0f / sqrtf((float)E);
        const float *w_seg = h_uni(E, -a, a), *u = h_normal(L * E, 1.0f);
        float *gate = hf(L);
        ran(&op, "merge_shared_gate (input)", SIDE_EMU, EMU->merge_shared_gate(w_seg, u, L, E, gate, NULL));
        int8_t *skip = hmem((size_t)Ne);
        memset(skip, 0, (size_t)Ne);
        for (int64_t i = 0; scaled && i < n; i += 7) skip[pick[i]] = 1;
        const float sd_sh = scaled ? 1.5f : 1.0f;
        const buf bp = pair(pick, (size_t)n * 4), bw = pairf(pw, n), bsd = pairf(h_uni(Ne, 0.5f, 2.0f), Ne);
        const buf bsk = pair(skip, (size_t)Ne), brow = pair(row, (size_t)n * 8);
        const buf bout = pairf(h_normal(n * E, 1.0f), n * E);
        const buf bg = pairf(gate, L), bsho = pairf(h_normal(L * E, 1.0f), L * E), y = pairf(NULL, L * E);
        for (int s = 0; s < 2; s++)
            ran(&op, "merge_sum", s,
                tab(s)->merge_sum((const int32_t *)P(bp, s), PF(bw, s), scaled ? PF(bsd, s) : NULL,
                                  scaled ? (const int8_t *)P(bsk, s) : NULL, (const int64_t *)P(brow, s), PF(bout, s),
                                  PF(bg, s), sd_sh, PF(bsho, s), L, E, K, PF(y, s), NULL));
        cmp(&op, "y", K_F32, &y);
        release();
    }
    op_done(&op);
}

/* ================================================================ gdn.h */

enum { G_CONV, G_PREP, G_REC, G_CHUNK, G_OUT, G_N };

static void gdn_shape(op_t *ops, int Gk, int Gv, int dk, int Kc, int64_t L, uint64_t sd) {
    seed(sd);
    const int dv = dk;
    const int64_t KD = (int64_t)Gk * dk, VD = (int64_t)Gv * dv, CD = 2 * KD + VD, SN = (int64_t)Gv * dk * dv;
    const int64_t ld = CD + VD + 2 * Gv + 3;   /* projection rows [qkv | z | b | a] and a gap */
    const float *proj = h_uni(L * ld, -1.5f, 1.5f), *hist0 = h_uni((Kc - 1) * CD, -1.5f, 1.5f);
    const float *convw = h_uni(CD * Kc, -0.8f, 0.8f), *dt_bias = h_uni(Gv, -1.0f, 1.0f);
    float *ssm_a = h_uni(Gv, -3.0f, 1.5f);
    for (int h = 0; h < Gv; h++) ssm_a[h] = -expf(ssm_a[h]);   /* -exp(A_log) */
    const float *normw = h_uni(dv, 0.5f, 1.5f), *S0 = h_uni(SN, -0.3f, 0.3f);

    /* gdn.conv */
    const buf bP = pairf(proj, L * ld), bw = pairf(convw, CD * Kc), hist = pairf(hist0, (Kc - 1) * CD);
    const buf cv = pairf(NULL, L * CD);
    for (int s = 0; s < 2; s++)
        ran(&ops[G_CONV], "gdn_conv", s,
            tab(s)->gdn_conv(PF(bw, s), Kc, CD, PF(hist, s), PF(bP, s), ld, L, PF(cv, s), NULL));
    cmp(&ops[G_CONV], "cv", K_F32, &cv);
    cmp(&ops[G_CONV], "history", K_F32, &hist);

    /* gdn.prep on the emulation's conv output, b and a read from the projection rows (ldba = ld) */
    const buf bcv = pairf(cv.h, L * CD), ba = pairf(ssm_a, Gv), bdt = pairf(dt_bias, Gv);
    const buf qn = pairf(NULL, L * KD), kn = pairf(NULL, L * KD), beta = pairf(NULL, L * Gv), g = pairf(NULL, L * Gv);
    for (int s = 0; s < 2; s++)
        ran(&ops[G_PREP], "gdn_prep", s,
            tab(s)->gdn_prep(PF(bcv, s), L, Gk, Gv, dk, dv, PF(bP, s) + CD + VD, PF(bP, s) + CD + VD + Gv, ld,
                             PF(ba, s), PF(bdt, s), PF(qn, s), PF(kn, s), PF(beta, s), PF(g, s), NULL));
    cmp(&ops[G_PREP], "q", K_F32, &qn);
    cmp(&ops[G_PREP], "k", K_F32, &kn);
    cmp(&ops[G_PREP], "beta", K_F32, &beta);
    cmp(&ops[G_PREP], "g", K_F32, &g);
    /* ... in place: beta == b, g == a, ldba == Gv */
    float *bh = hf(L * Gv), *ah = hf(L * Gv);
    for (int64_t t = 0; t < L; t++)
        for (int h = 0; h < Gv; h++) {
            bh[t * Gv + h] = proj[t * ld + CD + VD + h];
            ah[t * Gv + h] = proj[t * ld + CD + VD + Gv + h];
        }
    const buf bi = pairf(bh, L * Gv), ai = pairf(ah, L * Gv), qn2 = pairf(NULL, L * KD), kn2 = pairf(NULL, L * KD);
    for (int s = 0; s < 2; s++)
        ran(&ops[G_PREP], "gdn_prep in place", s,
            tab(s)->gdn_prep(PF(bcv, s), L, Gk, Gv, dk, dv, PF(bi, s), PF(ai, s), Gv, PF(ba, s), PF(bdt, s), PF(qn2, s),
                             PF(kn2, s), PF(bi, s), PF(ai, s), NULL));
    cmp(&ops[G_PREP], "beta in place", K_F32, &bi);
    cmp(&ops[G_PREP], "g in place", K_F32, &ai);

    /* the heads, on the emulation's q, k, beta, g and conv rows and a random prior state */
    const buf hq = pairf(qn.h, L * KD), hk = pairf(kn.h, L * KD), hb = pairf(beta.h, L * Gv), hg = pairf(g.h, L * Gv);
    const buf S = pairf(S0, SN), o = pairf(NULL, L * VD);
    for (int s = 0; s < 2; s++)
        ran(&ops[G_REC], "gdn_recurrent", s,
            tab(s)->gdn_recurrent(PF(S, s), PF(hq, s), PF(hk, s), PF(bcv, s), PF(hb, s), PF(hg, s), PF(o, s), L, Gk, Gv,
                                  dk, dv, NULL, NULL));
    cmp(&ops[G_REC], "o", K_F32, &o);
    cmp(&ops[G_REC], "S", K_F32, &S);
    if (L * SN <= ((int64_t)1 << 23)) {   /* KEEP_STATES slots where they take at most 32 MiB */
        const buf S2 = pairf(S0, SN), o2 = pairf(NULL, L * VD), slots = pairf(NULL, L * SN);
        for (int s = 0; s < 2; s++)
            ran(&ops[G_REC], "gdn_recurrent with slots", s,
                tab(s)->gdn_recurrent(PF(S2, s), PF(hq, s), PF(hk, s), PF(bcv, s), PF(hb, s), PF(hg, s), PF(o2, s), L,
                                      Gk, Gv, dk, dv, PF(slots, s), NULL));
        cmp(&ops[G_REC], "S slots", K_F32, &slots);
        cmp(&ops[G_REC], "o with slots", K_F32, &o2);
        cmp(&ops[G_REC], "S with slots", K_F32, &S2);
    }

    const size_t wf = DEV->gdn_chunked_work_floats(Gv, dk, dv);
    if (wf != EMU->gdn_chunked_work_floats(Gv, dk, dv)) note(&ops[G_CHUNK], "work floats", INFINITY, 0);
    const buf Sc = pairf(S0, SN), oc = pairf(NULL, L * VD), work = pairf(NULL, (int64_t)wf);
    for (int s = 0; s < 2; s++)
        ran(&ops[G_CHUNK], "gdn_chunked", s,
            tab(s)->gdn_chunked(PF(Sc, s), PF(hq, s), PF(hk, s), PF(bcv, s), PF(hb, s), PF(hg, s), PF(oc, s), L, Gk, Gv,
                                dk, dv, PF(work, s), NULL));
    cmp(&ops[G_CHUNK], "o", K_F32, &oc);
    cmp(&ops[G_CHUNK], "S", K_F32, &Sc);

    /* gdn.out on the emulation's recurrent output, z from the projection rows (ldz = ld), both gates */
    const buf nw = pairf(normw, dv);
    for (int gate_sigmoid = 1; gate_sigmoid >= 0; gate_sigmoid--) {
        const buf y = pairf(o.h, L * VD);
        for (int s = 0; s < 2; s++)
            ran(&ops[G_OUT], "gdn_out", s,
                tab(s)->gdn_out(PF(y, s), PF(bP, s) + CD, ld, PF(nw, s), L, Gv, dv, EPS, gate_sigmoid, NULL));
        cmp(&ops[G_OUT], gate_sigmoid ? "o (sigmoid gate)" : "o (silu gate)", K_F32, &y);
    }
    release();
}

static void gdn_ops(void) {
    op_t ops[G_N] = {op_new("gdn.conv", "-"), op_new("gdn.prep", "-"), op_new("gdn.recurrent", "-"),
                     op_new("gdn.chunked", "-"), op_new("gdn.out", "-")};
    gdn_shape(ops, 16, 48, 128, 4, 1, 700);    /* the real model: decode */
    gdn_shape(ops, 16, 48, 128, 4, 70, 701);   /* ... a prefill: a whole chunk and a partial one */
    gdn_shape(ops, 2, 6, 20, 3, 5, 702);       /* small, odd */
    gdn_shape(ops, 2, 6, 20, 3, 150, 703);     /* three chunks, the last partial */
    refused(&ops[G_REC], "dv 1025",
            DEV->gdn_recurrent(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 1, 1, 16, 1025, NULL, NULL),
            EMU->gdn_recurrent(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 1, 1, 16, 1025, NULL, NULL),
            STRATA_ERR_UNSUPPORTED);
    refused(&ops[G_CHUNK], "dk 1025",
            DEV->gdn_chunked(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 1, 1, 1025, 16, NULL, NULL),
            EMU->gdn_chunked(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 1, 1, 1025, 16, NULL, NULL),
            STRATA_ERR_UNSUPPORTED);
    for (int i = 0; i < G_N; i++) op_done(&ops[i]);
}

/* ================================================================ qsa.h */

enum { Q_STORE, Q_INDEX, Q_SELECT, Q_ATTN, Q_N = Q_ATTN + 3 };

typedef struct {
    int H, Hkv, hd, n_rot, nI, dI, r, budget;
    int64_t p0, L;
} qsa_shape;

/* Scores of a query's nb blocks (rest of the row 0): distinct multiples of 1/8 in random order, about a
 * fifth of them exact zeros (the index's relu), or with `levels` only that many values (ties). The
 * selection reads the same bytes on both sides, so its ties are decided the same way. */
static void crafted_scores(float *row, int64_t nb, int64_t ld, int levels) {
    const int32_t *perm = h_perm(nb);
    for (int64_t b = 0; b < ld; b++) row[b] = 0.0f;
    for (int64_t b = 0; b < nb; b++)
        row[b] = rnd() % 5 == 0 ? 0.0f : 0.125f * (float)(1 + (levels ? perm[b] % levels : perm[b]));
}

/* qsa_select of L queries at p0 on both sides, scores [L x ld]; the emulation's sel and n_sel returned */
static void select_case(op_t *op, const float *score, int64_t ld, int64_t r, int64_t topk, int64_t p0, int64_t L,
                        int64_t sel_cap, int32_t **sel_out, int32_t **n_out) {
    const buf sc = pairf(score, L * ld), sel = pair(NULL, (size_t)(L * sel_cap) * 4), ns = pair(NULL, (size_t)L * 4);
    for (int s = 0; s < 2; s++)
        ran(op, "qsa_select", s,
            tab(s)->qsa_select(PF(sc, s), ld, r, topk, p0, L, (int32_t *)P(sel, s), sel_cap, (int32_t *)P(ns, s),
                               NULL));
    cmp(op, "n_sel", K_I32, &ns);
    cmp(op, "sel", K_I32, &sel);
    if (sel_out) *sel_out = sel.h;
    if (n_out) *n_out = ns.h;
}

static void qsa_shape_run(op_t *ops, const qsa_shape *sh, uint64_t sd) {
    static const size_t ES[3] = {4, 2, 1};
    static const int KIND[3] = {K_F32, K_U8, K_U8};
    static const char *const KV[3] = {"f32", "f16", "int8"};
    seed(sd);
    const int64_t H = sh->H, Hkv = sh->Hkv, hd = sh->hd, nI = sh->nI, dI = sh->dI, r = sh->r, p0 = sh->p0, L = sh->L;
    const int64_t n_tok = p0 + L, topk = sh->budget / r, nbt = n_tok / r, nrow = n_tok * Hkv;
    float *kin = h_uni(nrow * hd, -2.0f, 2.0f), *vin = h_uni(nrow * hd, -2.0f, 2.0f);
    memset(kin + p0 * Hkv * hd, 0, (size_t)hd * sizeof(float));                  /* int8: a zero row (d = 0) */
    for (int64_t e = 0; e < hd; e++) vin[(p0 * Hkv + Hkv - 1) * hd + e] *= 3e-5f;  /* f16 subnormals */
    const float *idx_k = h_uni(n_tok * dI, -1.5f, 1.5f), *k_norm = h_uni(dI, 0.5f, 1.5f);
    const float *q = h_uni(L * H * hd, -0.6f, 0.6f), *qg = h_uni(L * 2 * H * hd, -3.0f, 3.0f);

    /* qsa.store: this step's K/V rows after the earlier ones (as the emulation stored them), per kv type;
     * every byte of the caches compared (nothing written past the step's rows) */
    for (int kt = 0; kt < 3; kt++) {
        const size_t bytes = (size_t)nrow * (size_t)hd * ES[kt];
        uint8_t *k0 = hmem(bytes), *v0 = hmem(bytes);
        float *sc0 = hf(2 * nrow);
        memset(k0, 0xab, bytes);
        memset(v0, 0xab, bytes);
        memset(sc0, 0xab, (size_t)(2 * nrow) * sizeof(float));
        ran(&ops[Q_STORE], "qsa_store (earlier rows)", SIDE_EMU,
            EMU->qsa_store(k0, v0, sc0, kt, Hkv, hd, 0, p0, kin, vin, NULL));
        const buf kc = pair(k0, bytes), vc = pair(v0, bytes), sc = pairf(sc0, 2 * nrow);
        const buf bk = pairf(kin + p0 * Hkv * hd, L * Hkv * hd), bv = pairf(vin + p0 * Hkv * hd, L * Hkv * hd);
        for (int s = 0; s < 2; s++)
            ran(&ops[Q_STORE], "qsa_store", s, tab(s)->qsa_store(P(kc, s), P(vc, s), PF(sc, s), kt, Hkv, hd, p0, L,
                                                                  PF(bk, s), PF(bv, s), NULL));
        char what[32];
        snprintf(what, sizeof what, "%s K cache", KV[kt]);
        cmp(&ops[Q_STORE], what, KIND[kt], &kc);
        snprintf(what, sizeof what, "%s V cache", KV[kt]);
        cmp(&ops[Q_STORE], what, KIND[kt], &vc);
        snprintf(what, sizeof what, "%s scales", KV[kt]);
        cmp(&ops[Q_STORE], what, K_F32, &sc);
    }
    /* ... the raw indexer keys (rows p0 .. after the earlier ones) and the block pooling, in two launches */
    float *idx0 = hf(n_tok * dI);
    memcpy(idx0, idx_k, (size_t)(p0 * dI) * sizeof(float));
    memset(idx0 + p0 * dI, 0xff, (size_t)(L * dI) * sizeof(float));
    const buf idx = pairf(idx0, n_tok * dI), ik = pairf(idx_k + p0 * dI, L * dI);
    const buf ikall = pairf(idx_k, n_tok * dI), pool = pairf(NULL, nbt * dI + 1);
    const int64_t half = nbt / 2;
    for (int s = 0; s < 2; s++) {
        ran(&ops[Q_STORE], "qsa_idx_store", s, tab(s)->qsa_idx_store(PF(idx, s), PF(ik, s), dI, p0, L, NULL));
        ran(&ops[Q_STORE], "qsa_blk_pool", s, tab(s)->qsa_blk_pool(PF(ikall, s), dI, r, 0, half, PF(pool, s), NULL));
        ran(&ops[Q_STORE], "qsa_blk_pool", s,
            tab(s)->qsa_blk_pool(PF(ikall, s), dI, r, half, nbt - half, PF(pool, s), NULL));
    }
    cmp(&ops[Q_STORE], "raw keys", K_F32, &idx);
    cmp(&ops[Q_STORE], "block pool", K_F32, &pool);

    /* qsa.index on block summaries made by the emulation: pooled, N1, RoPE at b * r */
    float *blk = hf(nbt * dI + 1), *cs = hf(nbt * sh->n_rot + 1);
    ran(&ops[Q_INDEX], "summaries (input)", SIDE_EMU, EMU->qsa_blk_pool(idx_k, dI, r, 0, nbt, blk, NULL));
    ran(&ops[Q_INDEX], "summaries (input)", SIDE_EMU,
        EMU->rmsnorm_rows(blk, dI, k_norm, 1, nbt, dI, EPS, blk, dI, NULL));
    ran(&ops[Q_INDEX], "summaries (input)", SIDE_EMU, EMU->rope_angles(1e7f, sh->n_rot, 0, r, nbt, cs, NULL));
    ran(&ops[Q_INDEX], "summaries (input)", SIDE_EMU, EMU->rope_apply(blk, dI, nbt, 1, sh->n_rot, cs, NULL));
    const int64_t ld = nbt > 0 ? nbt : 1;
    const buf iq = pairf(h_uni(L * nI * dI, -1.0f, 1.0f), L * nI * dI), bb = pairf(blk, nbt * dI + 1);
    const buf score = pairf(NULL, L * ld);
    for (int s = 0; s < 2; s++)
        ran(&ops[Q_INDEX], "qsa_index", s,
            tab(s)->qsa_index(PF(iq, s), PF(bb, s), nI, dI, r, topk, p0, L, PF(score, s), ld, NULL));
    cmp(&ops[Q_INDEX], "scores", K_F32, &score);

    /* qsa.select on crafted scores */
    int64_t sel_cap = (int64_t)sh->budget + r;
    if (sel_cap > n_tok) sel_cap = n_tok;
    float *crafted = hf(L * ld);
    for (int64_t t = 0; t < L; t++) crafted_scores(crafted + t * ld, (p0 + t + 1) / r, ld, 0);
    int32_t *sel = NULL, *n_sel = NULL;
    select_case(&ops[Q_SELECT], crafted, ld, r, topk, p0, L, sel_cap, &sel, &n_sel);

    /* qsa.attn per kv type over caches of every row (the emulation's store) and the emulation's selection */
    int64_t w_cap = 1;
    for (int64_t t = 0; t < L; t++) {
        const int64_t n = n_sel[t] < 0 ? p0 + t + 1 : n_sel[t];
        if (n > w_cap) w_cap = n;
    }
    const buf bq = pairf(q, L * H * hd), bqg = pairf(qg, L * 2 * H * hd);
    const buf bsel = pair(sel, (size_t)(L * sel_cap) * 4), bns = pair(n_sel, (size_t)L * 4);
    for (int kt = 0; kt < 3; kt++) {
        const size_t bytes = (size_t)nrow * (size_t)hd * ES[kt];
        uint8_t *kh = hmem(bytes), *vh = hmem(bytes);
        float *sch = hf(2 * nrow);
        ran(&ops[Q_ATTN + kt], "qsa_store (caches)", SIDE_EMU,
            EMU->qsa_store(kh, vh, sch, kt, Hkv, hd, 0, n_tok, kin, vin, NULL));
        const buf kc = pair(kh, bytes), vc = pair(vh, bytes), sc = pairf(sch, 2 * nrow);
        const buf w = pairf(NULL, L * H * w_cap), o = pairf(NULL, L * H * hd);
        for (int s = 0; s < 2; s++)
            ran(&ops[Q_ATTN + kt], "qsa_attn", s,
                tab(s)->qsa_attn(P(kc, s), P(vc, s), PF(sc, s), kt, H, Hkv, hd, p0, L, PF(bq, s), PF(bqg, s),
                                 (const int32_t *)P(bsel, s), sel_cap, (const int32_t *)P(bns, s), PF(w, s), w_cap,
                                 PF(o, s), NULL));
        cmp(&ops[Q_ATTN + kt], "o", K_F32, &o);
    }
    release();
}

static void qsa_ops(void) {
    op_t ops[Q_N] = {op_new("qsa.store", "-"), op_new("qsa.index", "-"), op_new("qsa.select", "-"),
                     op_new("qsa.attn", "f32"), op_new("qsa.attn", "f16"), op_new("qsa.attn", "int8")};
    static const qsa_shape shapes[] = {
        /* H, Hkv, hd, n_rot, nI, dI, r, budget, p0, L */
        {24, 2, 256, 64, 4, 128, 4, 2048, 2050, 2},   /* the real model: n 2051 dense, 2052 binds */
        {24, 2, 256, 64, 4, 128, 4, 256, 3000, 2},    /* ... decode past a small budget */
        {6, 3, 40, 16, 3, 24, 3, 12, 37, 5},          /* small odd: grouped 2, binds */
        {4, 1, 20, 8, 2, 16, 2, 6, 0, 23},            /* tiny: one prefill from 0, binds from n 8 */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) qsa_shape_run(ops, &shapes[i], 800 + i);
    /* qsa.select on scores full of ties (a few levels, many zeros), topk cutting through a tied group; and
     * 10000 blocks */
    static const struct { int64_t r, topk, n; int levels; } ties[] = {
        {4, 512, 3001, 4}, {1, 7, 50, 2}, {4, 512, 40001, 0}};
    for (size_t c = 0; c < sizeof ties / sizeof ties[0]; c++) {
        seed(810 + c);
        const int64_t nb = ties[c].n / ties[c].r;
        float *score = hf(nb);
        crafted_scores(score, nb, nb, ties[c].levels);
        select_case(&ops[Q_SELECT], score, nb, ties[c].r, ties[c].topk, ties[c].n - 1, 1,
                    ties[c].topk * ties[c].r + ties[c].r + 32, NULL, NULL);
        release();
    }
    for (int i = 0; i < Q_N; i++) op_done(&ops[i]);
}

/* ================================================================ ple.h, mtp.h */

/* A random finite fp16 bit pattern with exponent field in [lo, hi] (0: subnormals). */
static uint16_t rnd_f16(unsigned lo, unsigned hi) {
    const uint64_t x = rnd();
    const unsigned e = lo + (unsigned)(x % (hi - lo + 1));
    return (uint16_t)(((x >> 16) & 1u) << 15 | e << 10 | ((x >> 20) & 0x3ffu));
}

static void dequant_case(op_t *op, int fmt, int64_t n_rows, int64_t dP, int64_t n_shard, int64_t shard_rows,
                         uint64_t sd) {
    seed(sd);
    const int packed = fmt == PLE_CUDA_ROWS_NVFP4_PACKED;
    const strata_qtraits *t = packed ? NULL : strata_qtraits_get(fmt);
    const size_t rb = packed ? (size_t)(dP / 2 + dP / 16) : (size_t)(dP / t->block_size * t->type_size);
    uint8_t *rows = hmem(rb * (size_t)n_rows);
    for (size_t i = 0; i < rb * (size_t)n_rows; i++) rows[i] = (uint8_t)rnd();   /* every code and scale byte */
    if (fmt == GT_IQ4_NL || fmt == GT_Q8_0)                                       /* finite block scales */
        for (int64_t i = 0; i < n_rows; i++)
            for (int64_t b = 0; b < dP / 32; b++) {
                const uint16_t h = rnd_f16(0, 20);
                memcpy(rows + (size_t)i * rb + (size_t)b * (size_t)t->type_size, &h, 2);
            }
    if (fmt == GT_F16)
        for (int64_t i = 0; i < n_rows * dP; i++) {
            const uint16_t h = rnd_f16(0, 30);
            memcpy(rows + (size_t)i * 2, &h, 2);
        }
    uint64_t *ids = hmem((size_t)n_rows * sizeof *ids);
    for (int64_t i = 0; i < n_rows; i++) ids[i] = rnd() % (uint64_t)((n_shard + 1) * shard_rows);   /* + the clamp */
    float *gs = hf(n_shard);
    for (int64_t i = 0; i < n_shard; i++) gs[i] = ldexpf(1.0f + 0.5f * (2.0f * urand() - 1.0f), -(int)(rnd() % 12));
    const buf br = pair(rows, rb * (size_t)n_rows), bi = pair(ids, (size_t)n_rows * 8), bg = pairf(gs, n_shard);
    const buf emb = pairf(NULL, n_rows * dP);
    for (int s = 0; s < 2; s++)
        ran(op, "ple_dequant", s,
            tab(s)->ple_dequant(fmt, P(br, s), rb, n_rows, dP, (const uint64_t *)P(bi, s), PF(bg, s), n_shard,
                                shard_rows, PF(emb, s), NULL));
    cmp(op, "emb", K_F32, &emb);
    release();
}

static void ple_ops(void) {
    /* the real model's table: 16 heads of 160 values a token, 320,001,536 rows in 128 shards */
    const int64_t NH = 16, dP = 160, n_shard = 128, shard_rows = 2500012;
    static const int FMT[4] = {GT_IQ4_NL, GT_Q8_0, GT_F16, PLE_CUDA_ROWS_NVFP4_PACKED};
    static const char *const FMT_NAME[4] = {"iq4_nl", "q8_0", "f16", "nvfp4_packed"};
    for (int f = 0; f < 4; f++) {
        op_t op = op_new("ple.dequant", FMT_NAME[f]);
        dequant_case(&op, FMT[f], 1 * NH, dP, n_shard, shard_rows, 900 + 10 * f);
        dequant_case(&op, FMT[f], 7 * NH, dP, n_shard, shard_rows, 901 + 10 * f);
        dequant_case(&op, FMT[f], 3 * 5, FMT[f] == PLE_CUDA_ROWS_NVFP4_PACKED ? 48 : 64, 3, 7, 902 + 10 * f);
        /* rows it cannot decode: packed NVFP4 of 40 values (not whole scale groups), the others 1-byte rows */
        const int64_t bad_dp = FMT[f] == PLE_CUDA_ROWS_NVFP4_PACKED ? 40 : 64;
        const size_t bad_rb = FMT[f] == PLE_CUDA_ROWS_NVFP4_PACKED ? 1024 : 1;
        refused(&op, "rows it cannot decode",
                DEV->ple_dequant(FMT[f], NULL, bad_rb, 1, bad_dp, NULL, NULL, 1, 1, NULL, NULL),
                EMU->ple_dequant(FMT[f], NULL, bad_rb, 1, bad_dp, NULL, NULL, 1, 1, NULL, NULL),
                STRATA_ERR_UNSUPPORTED);
        op_done(&op);
    }

    op_t op = op_new("ple.project", "-");
    static const int64_t pr[][3] = {{1, 4, 2560}, {7, 4, 2560}, {5, 3, 37}};   /* R, hc, E */
    for (size_t c = 0; c < 3; c++) {
        seed(920 + c);
        const int64_t R = pr[c][0], h = pr[c][1], e = pr[c][2], W = h * e;
        float *key = hf(R * W);
        for (int64_t g = 0; g < R * h; g++) {
            const float s = ldexpf(1.0f, (int)(rnd() % 9) - 4);
            for (int64_t k = 0; k < e; k++) key[g * e + k] = s * uni(-1.0f, 1.0f);
        }
        const buf bk = pairf(key, R * W), w = pairf(h_uni(W, 0.7f, 1.3f), W);
        for (int s = 0; s < 2; s++)
            ran(&op, "ple_key_norm", s, tab(s)->ple_key_norm(PF(bk, s), PF(w, s), R, h, e, EPS, NULL));
        cmp(&op, "key", K_F32, &bk);
        release();
    }
    op_done(&op);

    op = op_new("ple.gate", "-");
    static const int64_t gt[][3] = {{1, 4, 2560}, {7, 4, 2560}, {5, 3, 37}};   /* L, hc, E */
    for (size_t c = 0; c < 3; c++) {
        seed(930 + c);
        const int64_t L = gt[c][0], h = gt[c][1], e = gt[c][2], W = h * e;
        const float *X = h_uni(L * W, -3.0f, 3.0f);
        float *key = hf(L * W);
        /* normalised-looking keys biased toward X, so scores have both signs; a zero and a tiny stream */
        for (int64_t g = 0; g < L * h; g++) {
            const float a = uni(-1.0f, 1.0f);
            for (int64_t k = 0; k < e; k++) key[g * e + k] = a * X[g * e + k] / 3.0f + uni(-1.0f, 1.0f);
        }
        if (h > 2) {
            memset(key + e, 0, (size_t)e * sizeof(float));
            for (int64_t k = 0; k < e; k++) key[2 * e + k] *= 1e-9f;
        }
        const buf bX = pairf(X, L * W), bk = pairf(key, L * W), val = pairf(h_uni(L * e, -1.0f, 1.0f), L * e);
        const buf wq = pairf(h_uni(W, 0.7f, 1.3f), W), wc = pairf(h_uni(W, 0.7f, 1.3f), W);
        const buf gv = pairf(NULL, L * W), gvn = pairf(NULL, L * W);
        for (int s = 0; s < 2; s++)
            ran(&op, "ple_gate", s,
                tab(s)->ple_gate(PF(bX, s), PF(bk, s), PF(val, s), PF(wq, s), PF(wc, s), L, h, e, EPS, PF(gv, s),
                                 PF(gvn, s), NULL));
        cmp(&op, "gv", K_F32, &gv);
        cmp(&op, "gvn", K_F32, &gvn);
        release();
    }
    op_done(&op);

    op = op_new("ple.conv", "-");
    static const int64_t cv[][4] = {{1, 4 * 2560, 4, 3}, {7, 4 * 2560, 4, 3}, {5, 3 * 37, 3, 2}};   /* L, W, Kp, n */
    for (size_t c = 0; c < 3; c++)
        for (int with_slots = 1; with_slots >= 0; with_slots--) {
            seed(940 + c);
            const int64_t L = cv[c][0], W = cv[c][1], K = cv[c][2], dn = cv[c][3], hist = (K - 1) * dn;
            float *ext = h_uni((hist + L) * W, -1e3f, 1e3f);   /* history rows: garbage until the launcher copies */
            const float *gvn = h_uni(L * W, -1.0f, 1.0f);
            memcpy(ext + hist * W, gvn, (size_t)(L * W) * sizeof(float));
            const buf bext = pairf(ext, (hist + L) * W), X = pairf(h_uni(L * W, -2.0f, 2.0f), L * W);
            const buf gv = pairf(h_uni(L * W, -0.5f, 0.5f), L * W), w = pairf(h_uni(W * K, -0.6f, 0.6f), W * K);
            const buf state = pairf(h_uni(hist * W, -1.0f, 1.0f), hist * W), slots = pairf(NULL, L * hist * W);
            for (int s = 0; s < 2; s++)
                ran(&op, with_slots ? "ple_conv" : "ple_conv without slots", s,
                    tab(s)->ple_conv(PF(X, s), PF(gv, s), PF(bext, s), PF(w, s), L, W, K, dn, PF(state, s),
                                     with_slots ? PF(slots, s) : NULL, NULL));
            cmp(&op, "X", K_F32, &X);
            cmp(&op, "state", K_F32, &state);
            if (with_slots) cmp(&op, "slots", K_F32, &slots);
            release();
        }
    op_done(&op);

    op = op_new("mtp.norm_concat", "-");
    static const int64_t mt[][3] = {{1, 4, 2560}, {7, 4, 2560}, {3, 3, 37}};   /* L, hc, E */
    for (size_t c = 0; c < 3; c++) {
        seed(950 + c);
        const int64_t L = mt[c][0], h = mt[c][1], e = mt[c][2], W = h * e;
        const float *emb = h_uni(L * e, -0.05f, 0.05f);
        float *hid = hf(L * W);
        for (int64_t t = 0; t < L; t++)   /* streams of different sizes: one RMS over all */
            for (int64_t j = 0; j < h; j++)
                for (int64_t k = 0; k < e; k++) hid[t * W + j * e + k] = (float)(1 + 3 * j) * uni(-1.0f, 1.0f);
        const buf be = pairf(emb, L * e), bh = pairf(hid, L * W), we = pairf(h_uni(e, 0.7f, 1.3f), e);
        const buf wh = pairf(h_uni(W, 0.7f, 1.3f), W), scratch = pairf(NULL, 2 * L), in2 = pairf(NULL, L * h * 2 * e);
        for (int s = 0; s < 2; s++)
            ran(&op, "mtp_norm_concat", s,
                tab(s)->mtp_norm_concat(PF(be, s), PF(bh, s), PF(we, s), PF(wh, s), L, h, e, EPS, PF(scratch, s),
                                        PF(in2, s), NULL));
        cmp(&op, "in2", K_F32, &in2);
        cmp(&op, "norms", K_F32, &scratch);
        release();
    }
    op_done(&op);
}

/* ================================================================ main */

static int usage(const char *argv0) {
    fprintf(stderr, "usage: %s [--device cuda|emu] [--break OP]\n", argv0);
    return 2;
}

int main(int argc, char **argv) {
    const char *device = "cuda";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--device") && i + 1 < argc) device = argv[++i];
        else if (!strcmp(argv[i], "--break") && i + 1 < argc) g_break = argv[++i];
        else return usage(argv[0]);
    }
    EMU = mdl_dk_emu();
    if (!strcmp(device, "emu")) {
        DEV = EMU;
        g_exact = 1;
    } else if (!strcmp(device, "cuda")) {
        const char *why = "";
        DEV = mdl_dk_cuda(&why);
        if (!DEV) {
            printf("no GPU: %s\n", why);
            return 77;
        }
    } else {
        return usage(argv[0]);
    }
    const double t0 = seconds();
    check_memory();
    gemv_ops();
    gemm_ops();
    norm_ops();
    rope_ops();
    hc_ops();
    router_ops();
    merge_ops();
    gdn_ops();
    qsa_ops();
    ple_ops();
    if (g_break && !g_break_hits) {
        fprintf(stderr, "--break %s: no such op\n", g_break);
        return 2;
    }
    fprintf(stderr, "# device %s: %d ops, %d failed, %.2f s\n", DEV->name, g_ops, g_failed_ops, seconds() - t0);
    if (g_failed_ops || g_other_fail) return 1;
    printf("all checks passed\n");
    return 0;
}
