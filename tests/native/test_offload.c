/*
 * test_offload.c — the MoE offload engine (native/src/moe/offload.h) on the sim device, with
 * made-up experts: F32 gate/up/down matrices of random values in one malloc'd buffer, described
 * with off_layer_desc as model/load.c describes a GGUF's. No model file.
 *
 *   - split: with no cache, the pcie_frac share of a window's missing groups goes over the link
 *     (every 1/f-th one, floor((i+1)f) > floor(i f)), the rest stays on the CPU pool; 0 and 1 give
 *     all-CPU and all-link; the device's outputs equal a plain C expert FFN;
 *   - plan and counters: admitted groups come back resident in the next window; hits and lookups
 *     count routed picks, the group counters groups; tail skip drops exactly the groups every token
 *     ranks >= K that are not resident;
 *   - staging: a window of >= stream_min tokens streams every missing group through the staging ring
 *     plus borrowed cache slots (at most half the cache), gives them back at finish, outputs exact;
 *   - swaps: an adjustment round swaps only when the heat difference is >= 1.5, at most max_swaps
 *     (a settable field, default 96), and the swapped-in expert is resident once its copy landed
 *     (with sync_swaps, from the window right after the round: it waits for the copies);
 *   - cancel: a watchdog that fires while a slow copy is queued makes off_finish fail, unlock and
 *     forget the unlanded admit; the engine then plans and runs the next window normally.
 * Runs under ASan+UBSan and TSan (tests/test_sanitize.py). Exit code 0 = pass.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe/offload.h"
#include "util/trace.h"

#include "check.h"

enum { E = 32, FE = 16, NE = 8, K = 2, MAXL = 2 };

/* The made-up model: per layer and expert, gate [FE x E], up [FE x E], down [E x FE] (row-major
 * F32, as a GGUF stores them: expert e's matrix at base + e * stride), and a per-expert gate/up
 * scale (the NVFP4 .scale path). */
typedef struct {
    float *buf;
    float *gate[MAXL], *up[MAXL], *down[MAXL];
    float sg[MAXL][NE], su[MAXL][NE];
    off_layer_desc d[MAXL];
} fake_model;

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) / 9007199254740992.0) - 0.5f;
}

static void fake_build(fake_model *f, int n_layer) {
    const size_t mat = (size_t)FE * E;
    f->buf = malloc((size_t)n_layer * NE * 3 * mat * sizeof(float));
    if (!f->buf) exit(1);
    for (size_t i = 0; i < (size_t)n_layer * NE * 3 * mat; i++) f->buf[i] = frand();
    const strata_qtraits *f32 = strata_qtraits_get(0);   /* GGML_TYPE_F32 */
    for (int il = 0; il < n_layer; il++) {
        f->gate[il] = f->buf + (size_t)il * NE * 3 * mat;
        f->up[il] = f->gate[il] + NE * mat;
        f->down[il] = f->up[il] + NE * mat;
        for (int e = 0; e < NE; e++) {
            f->sg[il][e] = 0.5f + 0.1f * (float)e;
            f->su[il][e] = 1.5f - 0.1f * (float)e;
        }
        off_layer_desc *d = &f->d[il];
        memset(d, 0, sizeof *d);
        d->shape = (mdev_expert_shape){.tg = f32, .tu = f32, .td = f32, .E = E, .Fe = FE, .fused = 0,
                                       .gate_bytes = mat * sizeof(float), .up_bytes = mat * sizeof(float),
                                       .down_bytes = mat * sizeof(float)};
        d->gate = (const char *)f->gate[il];
        d->up = (const char *)f->up[il];
        d->down = (const char *)f->down[il];
        d->gate_stride = d->up_stride = d->down_stride = mat * sizeof(float);
        d->gate_scale = f->sg[il];
        d->up_scale = f->su[il];
        d->n_gate_scale = d->n_up_scale = NE;
        d->n_ident = 0;
    }
}

/* out[n x E] = down(silu(gate x · sg) ⊙ (up x · su)), in double: the reference. */
static void ref_ffn(const fake_model *f, int il, int e, const float *x, int n, float *out) {
    const float *G = f->gate[il] + (size_t)e * FE * E, *U = f->up[il] + (size_t)e * FE * E,
                *D = f->down[il] + (size_t)e * E * FE;
    for (int t = 0; t < n; t++) {
        double h[FE];
        for (int r = 0; r < FE; r++) {
            double g = 0, u = 0;
            for (int c = 0; c < E; c++) { g += (double)G[r * E + c] * x[t * E + c]; u += (double)U[r * E + c] * x[t * E + c]; }
            g *= f->sg[il][e];
            u *= f->su[il][e];
            h[r] = g / (1.0 + exp(-g)) * u;
        }
        for (int r = 0; r < E; r++) {
            double o = 0;
            for (int c = 0; c < FE; c++) o += (double)D[r * FE + c] * h[c];
            out[t * E + r] = (float)o;
        }
    }
}

static off_params base_params(int n_layer) {
    off_params p;
    memset(&p, 0, sizeof p);
    p.device = STRATA_DEVICE_SIM;
    p.n_layer = n_layer;
    p.n_expert = NE;
    p.n_expert_used = K;
    p.pcie_frac = 0.0f;
    p.sim_link_gbps = 64.0f;
    p.tail_skip = 0;
    p.n_staging = 2;
    p.adjust_interval = 1000000;     /* no rounds unless a test asks */
    p.stream_min = 1000;
    p.isa = 0;                       /* scalar kernels */
    return p;
}

static size_t blob(void) { return 3 * (size_t)FE * E * sizeof(float); }

static off_engine *make(const off_params *p, const fake_model *f) {
    off_engine *o = NULL;
    if (off_create(p, f->d, &o) != STRATA_OK || !o) {
        fprintf(stderr, "off_create failed: %s\n", strata_last_error());
        exit(1);
    }
    return o;
}

/* One layer step as model/moe.c runs it: group the picks by expert, plan, submit, "run" the CPU
 * groups (here: nothing — their rows keep a sentinel), finish; then check every device group's
 * rows against the reference. kinds_out (may be NULL) gets the plan's kind per expert. */
typedef struct {
    int64_t count[NE + 1];
    int64_t rows[64 * K];            /* (token, k) pairs sorted by expert */
    float xg[64 * K * E], out[64 * K * E];
    int8_t kind[NE];
} step;

static strata_status run_step(off_engine *o, const fake_model *f, int il, int L, const int32_t *pick, const float *x,
                              step *s) {
    memset(s->count, 0, sizeof s->count);
    for (int i = 0; i < L * K; i++) s->count[pick[i] + 1]++;
    for (int e = 0; e < NE; e++) s->count[e + 1] += s->count[e];
    int64_t fill[NE];
    memcpy(fill, s->count, sizeof fill);
    for (int i = 0; i < L * K; i++) s->rows[fill[pick[i]]++] = i;
    for (int i = 0; i < L * K; i++) memcpy(s->xg + i * E, x + (s->rows[i] / K) * E, E * sizeof(float));
    for (int i = 0; i < L * K * E; i++) s->out[i] = 1e30f;            /* sentinel: not written */
    off_plan *pl = off_begin(o, il, L, s->count, pick);
    memcpy(s->kind, pl->kind, NE);
    strata_status rc = off_submit(pl, s->xg, s->out, 0);
    const strata_status rf = off_finish(pl, 0.0, 0, 0);
    if (rc) return rc;
    if (rf) return rf;
    for (int e = 0; e < NE; e++) {
        const int64_t n = s->count[e + 1] - s->count[e], r0 = s->count[e];
        if (!n) continue;
        const int on_dev = s->kind[e] == OFF_DEVICE || s->kind[e] == OFF_ADMIT || s->kind[e] == OFF_STAGE;
        if (on_dev) {
            float want[64 * E];
            ref_ffn(f, il, e, s->xg + r0 * E, (int)n, want);
            double err = 0;
            for (int64_t i = 0; i < n * E; i++) err = fmax(err, fabs((double)s->out[r0 * E + i] - want[i]));
            CHECK(err < 1e-4);
        } else {
            CHECK(s->out[r0 * E] == 1e30f);                              /* the device did not touch it */
        }
    }
    return STRATA_OK;
}

static void random_x(float *x, int L) {
    for (int i = 0; i < L * E; i++) x[i] = frand();
}

static strata_offload_stats stats(off_engine *o) {
    strata_offload_stats st;
    memset(&st, 0, sizeof st);
    off_get_stats(o, &st);
    return st;
}

/* ---------------------------------------------------------------- split */

static void test_split(const fake_model *f) {
    const float fracs[3] = {0.0f, 0.5f, 1.0f};
    for (int k = 0; k < 3; k++) {
        off_params p = base_params(1);
        p.cache_bytes = 0;                                 /* no cache: every group is missing */
        p.pcie_frac = fracs[k];
        off_engine *o = make(&p, f);
        /* two tokens, four distinct experts: 1, 3, 4, 6 */
        const int32_t pick[4] = {3, 1, 6, 4};
        float x[2 * E];
        random_x(x, 2);
        step s;
        CHECK(run_step(o, f, 0, 2, pick, x, &s) == STRATA_OK);
        const int order[4] = {1, 3, 4, 6};
        int n_stage = 0;
        for (int i = 0; i < 4; i++) {
            const int8_t want = fracs[k] == 0.0f ? OFF_CPU : fracs[k] == 1.0f ? OFF_STAGE
                                : (i % 2 ? OFF_STAGE : OFF_CPU);  /* f = 0.5: the 2nd and 4th */
            CHECK(s.kind[order[i]] == want);
            n_stage += s.kind[order[i]] == OFF_STAGE;
        }
        CHECK(s.kind[0] == OFF_NONE && s.kind[2] == OFF_NONE);
        const strata_offload_stats st = stats(o);
        CHECK(st.pcie_groups == (uint64_t)n_stage);
        CHECK(st.pcie_bytes == (uint64_t)n_stage * blob());
        CHECK(st.cache_lookups == 4 && st.cache_hits == 0 && st.cache_group_lookups == 4);
        CHECK(fabsf(st.pcie_frac - fracs[k]) < 1e-6f);
        off_free(o);
    }
    /* pcie_frac < 0: the one formula, 0.55 x probe / 20 clamped to [0, 1] */
    off_params p = base_params(1);
    p.pcie_frac = -1.0f;
    off_engine *o = make(&p, f);
    const strata_offload_stats st = stats(o);
    double want = 0.55 * st.probe_gbps / 20.0;
    if (want > 1.0) want = 1.0;
    CHECK(st.probe_gbps > 0 && fabs(st.pcie_frac - want) < 1e-6);
    off_free(o);
}

/* ---------------------------------------------------------------- plan, counters, tail skip */

static void test_plan_and_counters(const fake_model *f) {
    off_params p = base_params(2);
    p.cache_bytes = 2 * NE * blob();                       /* room for every expert of both layers */
    off_engine *o = make(&p, f);
    /* three tokens; experts 2 and 5 picked by two tokens each: groups merge picks */
    const int32_t pick[6] = {2, 5, 5, 2, 7, 2};
    float x[3 * E];
    random_x(x, 3);
    step s;
    for (int il = 0; il < 2; il++) {
        CHECK(run_step(o, f, il, 3, pick, x, &s) == STRATA_OK);
        CHECK(s.kind[2] == OFF_ADMIT && s.kind[5] == OFF_ADMIT && s.kind[7] == OFF_ADMIT);
    }
    strata_offload_stats st = stats(o);
    CHECK(st.cache_admits == 6 && st.cache_hits == 0);
    CHECK(st.cache_lookups == 2 * 6);                       /* picks: L x K per layer */
    CHECK(st.cache_group_lookups == 2 * 3);                 /* groups: 3 active experts per layer */
    /* next window: all resident (their copies completed before the last finish returned) */
    for (int il = 0; il < 2; il++) {
        CHECK(run_step(o, f, il, 3, pick, x, &s) == STRATA_OK);
        CHECK(s.kind[2] == OFF_DEVICE && s.kind[5] == OFF_DEVICE && s.kind[7] == OFF_DEVICE);
    }
    st = stats(o);
    CHECK(st.cache_hits == 12 && st.cache_lookups == 24);
    CHECK(st.cache_group_hits == 6 && st.cache_group_lookups == 12);
    CHECK(st.windows == 2);
    int32_t per[2];
    off_resident(o, per, 2);
    CHECK(per[0] == 3 && per[1] == 3);
    uint64_t h, n;
    off_counts(o, &h, &n);
    CHECK(h == st.cache_hits && n == st.cache_lookups);
    off_free(o);

    /* tail skip K = 1: an expert that no token ranks first and that is not resident is skipped */
    p = base_params(1);
    p.cache_bytes = blob();                                /* one slot */
    p.tail_skip = 1;
    o = make(&p, f);
    const int32_t pick0[2] = {4, 1};                       /* 4 admitted into the one slot; 1 ranked 2nd */
    CHECK(run_step(o, f, 0, 1, pick0, x, &s) == STRATA_OK);
    CHECK(s.kind[4] == OFF_ADMIT && s.kind[1] == OFF_SKIP);
    const int32_t pick1[4] = {6, 4, 3, 6};                 /* 4 resident (2nd rank: still runs), 3 ranked 1st */
    CHECK(run_step(o, f, 0, 2, pick1, x, &s) == STRATA_OK);
    CHECK(s.kind[4] == OFF_DEVICE && s.kind[6] == OFF_CPU && s.kind[3] == OFF_CPU);
    st = stats(o);
    CHECK(st.skipped_experts == 1 && st.tail_skip == 1);
    off_free(o);
}

/* ---------------------------------------------------------------- staging (prefill) */

static void test_staging(const fake_model *f) {
    off_params p = base_params(1);
    p.cache_bytes = 4 * blob();                            /* 4 cache slots, 2 staging */
    p.stream_min = 4;
    off_engine *o = make(&p, f);
    /* fill two cache slots first (a short window admits) */
    const int32_t warm[2] = {0, 1};
    float x[8 * E];
    random_x(x, 8);
    step s;
    CHECK(run_step(o, f, 0, 1, warm, x, &s) == STRATA_OK);
    /* a chunk of 8 tokens over all 8 experts: 0, 1 resident, 6 missing stream through 2 staging
     * slots plus min(6 - 2, 4 / 2) = 2 borrowed cache slots (the 2 free ones) */
    int32_t pick[16];
    for (int i = 0; i < 16; i++) pick[i] = i % NE;
    CHECK(run_step(o, f, 0, 8, pick, x, &s) == STRATA_OK);
    CHECK(s.kind[0] == OFF_DEVICE && s.kind[1] == OFF_DEVICE);
    for (int e = 2; e < NE; e++) CHECK(s.kind[e] == OFF_STAGE);
    strata_offload_stats st = stats(o);
    CHECK(st.prefill_chunks == 1);
    CHECK(st.borrowed_slots == 2);
    CHECK(st.cache_admits == 2);                           /* streaming admits nothing */
    CHECK(st.pcie_groups == 2 + 6);
    int32_t per[1];
    off_resident(o, per, 1);
    CHECK(per[0] == 2);
    /* the borrowed slots came back: a short window admits into them again */
    const int32_t next[2] = {5, 6};
    CHECK(run_step(o, f, 0, 1, next, x, &s) == STRATA_OK);
    CHECK(s.kind[5] == OFF_ADMIT && s.kind[6] == OFF_ADMIT);
    off_free(o);
}

/* ---------------------------------------------------------------- swaps */

/* Windows w1..w6 of one token each on one layer with two cache slots and a round every 3rd window:
 * w1 {0,1} (admitted), w2 w3 {2,3}: at the w3 round 2 and 3 carry heat 2 against the residents' 1
 * (difference 1 < 1.5: no swap), then every heat x 0.7; w4..w6 {2,3}: at the w6 round 4.4 against
 * 0.7 (3.7 >= 1.5): two qualifying pairs, of which max_swaps run. */
static off_engine *swap_run(const fake_model *f, int32_t max_swaps, uint64_t swaps_at_w3[1], int sync) {
    off_params p = base_params(1);
    p.cache_bytes = 2 * blob();
    if (sync) {
        p.sync_swaps = 1;
        p.sim_link_gbps = 1e-3f;                           /* 1 MB/s: one 6 KiB blob takes ~6 ms */
    }
    p.adjust_interval = 3;
    p.max_swaps = max_swaps;
    off_engine *o = make(&p, f);
    float x[E];
    random_x(x, 1);
    step s;
    const int32_t w1[2] = {0, 1}, hot[2] = {2, 3};
    CHECK(run_step(o, f, 0, 1, w1, x, &s) == STRATA_OK);
    CHECK(s.kind[0] == OFF_ADMIT && s.kind[1] == OFF_ADMIT);
    for (int w = 2; w <= 6; w++) {
        CHECK(run_step(o, f, 0, 1, hot, x, &s) == STRATA_OK);
        CHECK(s.kind[2] == OFF_CPU && s.kind[3] == OFF_CPU);   /* cache full, pcie_frac 0 */
        if (w == 3) *swaps_at_w3 = stats(o).cache_swaps;
    }
    return o;
}

static void test_swaps(const fake_model *f) {
    float x[E];
    random_x(x, 1);
    step s;
    const int32_t hot[2] = {2, 3};
    int32_t per[1];
    /* the default cap (96): both pairs swap */
    uint64_t at3 = 99;
    off_engine *o = swap_run(f, 0, &at3, 0);
    CHECK(at3 == 0);                                       /* difference 1 < 1.5 */
    CHECK(stats(o).cache_swaps == 2);
    /* a swap's copy is queued at the round and published by the first off_begin after it landed
     * (64 GB/s, 6 KiB: microseconds; the sleep leaves room for a loaded sanitizer run) */
    nanosleep(&(struct timespec){.tv_sec = 0, .tv_nsec = 200000000}, NULL);
    CHECK(run_step(o, f, 0, 1, hot, x, &s) == STRATA_OK);
    CHECK(s.kind[2] == OFF_DEVICE && s.kind[3] == OFF_DEVICE);
    off_resident(o, per, 1);
    CHECK(per[0] == 2);
    off_free(o);
    /* max_swaps 1: one of the two equal pairs (ties: the lower incoming expert, 2) */
    o = swap_run(f, 1, &at3, 0);
    CHECK(at3 == 0);
    CHECK(stats(o).cache_swaps == 1);
    nanosleep(&(struct timespec){.tv_sec = 0, .tv_nsec = 200000000}, NULL);
    CHECK(run_step(o, f, 0, 1, hot, x, &s) == STRATA_OK);
    CHECK(s.kind[2] == OFF_DEVICE && s.kind[3] == OFF_CPU);
    off_resident(o, per, 1);
    CHECK(per[0] == 2);
    off_free(o);
    /* sync_swaps on a slow link: the window right after the round (no sleep) waits for the two
     * ~6 ms copies and finds both experts resident */
    o = swap_run(f, 0, &at3, 1);
    CHECK(stats(o).cache_swaps == 2);
    CHECK(run_step(o, f, 0, 1, hot, x, &s) == STRATA_OK);
    CHECK(s.kind[2] == OFF_DEVICE && s.kind[3] == OFF_DEVICE);
    off_free(o);
}

/* ---------------------------------------------------------------- cancel (the watchdog) */

static void test_cancel(const fake_model *f) {
    off_params p = base_params(1);
    p.cache_bytes = 2 * blob();
    p.sim_link_gbps = 1e-4f;                               /* 100 kB/s: one 6 KiB blob takes ~60 ms */
    off_engine *o = make(&p, f);
    float x[E];
    random_x(x, 1);
    step s;
    const int32_t pick[2] = {3, 6};
    CHECK(strata_watchdog_set(0.02) == STRATA_OK);
    wd_eval_begin(1, 1);
    const strata_status rc = run_step(o, f, 0, 1, pick, x, &s);
    wd_eval_end();
    CHECK(strata_watchdog_set(0) == STRATA_OK);
    CHECK(rc != STRATA_OK);
    CHECK(strstr(strata_last_error(), "watchdog") != NULL);
    CHECK(s.kind[3] == OFF_ADMIT && s.kind[6] == OFF_ADMIT);
    /* the engine is unlocked, the copies that did not land were forgotten: nothing resident yet,
     * and the next window plans (admits again into the freed slots) and runs to the end */
    int32_t per[1];
    off_resident(o, per, 1);
    CHECK(per[0] <= 1);
    CHECK(run_step(o, f, 0, 1, pick, x, &s) == STRATA_OK);
    CHECK(s.kind[3] != OFF_CPU && s.kind[6] != OFF_CPU);
    CHECK(run_step(o, f, 0, 1, pick, x, &s) == STRATA_OK);
    CHECK(s.kind[3] == OFF_DEVICE && s.kind[6] == OFF_DEVICE);
    off_free(o);
}

int main(void) {
    fake_model f;
    fake_build(&f, MAXL);
    test_split(&f);
    test_plan_and_counters(&f);
    test_staging(&f);
    test_swaps(&f);
    test_cancel(&f);
    free(f.buf);
    if (g_failed) {
        fprintf(stderr, "test_offload: %d checks failed\n", g_failed);
        return 1;
    }
    printf("test_offload: all checks passed\n");
    return 0;
}
