/* peak.c — the int8 multiply-accumulate peak of a kernel path: the compute yardstick of
 * `strata bench kernels`, as strata_probe_read_bandwidth (util/membw.c) is the memory one. A
 * kernel row's MACs per second over this peak, next to its bytes per second over the read
 * bandwidth, says which of the two bounds it.
 *
 * Each path's loop lives in its ISA file (avx2_peak.c, avx512_peak.c; compiled with that path's
 * flags only) and has one shape: iters rounds of independent accumulator chains over operands held
 * in L1, returning a checksum of the accumulators (so no chain is dead code) and the MACs of one
 * round. A path without a loop of its own measures its fallback's, as its kernels are its
 * fallback's (quant.h strata_isa_fallback). */
#include "strata.h"

#include <math.h>
#include <stdint.h>
#include <time.h>

#include "../../context.h"
#include "../../quant/quant.h"
#include "../../util/error.h"

typedef uint64_t (*peak_fn)(const uint8_t *w, const int8_t *a, int64_t iters, uint64_t *macs_per_iter);

/* Defined in the ISA files (one definition each; their signature is peak_fn). */
uint64_t strata_int8_peak_avx2(const uint8_t *w, const int8_t *a, int64_t iters, uint64_t *macs_per_iter);
uint64_t strata_int8_peak_avx512(const uint8_t *w, const int8_t *a, int64_t iters, uint64_t *macs_per_iter);

#define SCALAR_CHAINS 8

/* The portable path's figure: the int8 x int8 -> int32 dot of the scalar reference kernels, as
 * plain C. It measures what the compiler makes of such a loop with this build's flags (under
 * STRATA_NATIVE it is vectorised for the build machine), which is also what the scalar kernels run. */
static uint64_t peak_scalar(const uint8_t *w, const int8_t *a, int64_t iters, uint64_t *macs_per_iter) {
    int32_t acc[SCALAR_CHAINS] = {0};
    for (int64_t it = 0; it < iters; it++) {
        __asm__("" : "+r"(w)); /* w may have changed: the dot products cannot be hoisted */
        const int8_t *q = (const int8_t *)w;
        for (int k = 0; k < SCALAR_CHAINS; k++) {
            int32_t s = 0;
            for (int i = 0; i < 32; i++) s += (int32_t)q[32 * k + i] * (int32_t)a[i];
            acc[k] += s;
        }
    }
    uint32_t s = 0;
    for (int k = 0; k < SCALAR_CHAINS; k++) s += (uint32_t)acc[k];
    *macs_per_iter = SCALAR_CHAINS * 32;
    return s;
}

static peak_fn peak_loop(int idx) {
    for (; idx >= 0; idx = strata_isa_fallback(idx)) {
        switch (idx) {
        case STRATA_ISA_IDX_SCALAR: return peak_scalar;
#if STRATA_HAVE_AVX2
        case STRATA_ISA_IDX_AVX2: return strata_int8_peak_avx2;
#endif
#if STRATA_HAVE_AVX512
        case STRATA_ISA_IDX_AVX512: return strata_int8_peak_avx512;
#endif
        default: break;
        }
    }
    return peak_scalar;
}

/* Rounds per task: ~0.1 ms at AVX-512 rates, so the pool's per-task cost is noise while a pass
 * still holds many tasks per thread (a thread that starts late gets fewer, not a longer tail). */
#define PEAK_ITERS 16384
#define PEAK_TASKS_PER_THREAD 16
#define PEAK_MIN_PASSES 5
#define PEAK_MIN_SECONDS 0.1

typedef struct {
    peak_fn fn;
    const uint8_t *w;
    const int8_t *a;
    uint64_t sink; /* every task's checksum: each chain's result is used */
} peak_job;

static void peak_task(void *arg, int64_t task, int thread) {
    (void)task; (void)thread;
    peak_job *j = arg;
    uint64_t macs;
    __atomic_fetch_add(&j->sink, j->fn(j->w, j->a, PEAK_ITERS, &macs), __ATOMIC_RELAXED);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

strata_status strata_probe_int8_peak(strata_context *ctx, strata_isa isa, double *gmacs) {
    if (!gmacs) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_probe_int8_peak: gmacs is NULL");
    if (isa == STRATA_ISA_AUTO) isa = strata_isa_best();
    const char *name = strata_isa_name(isa);
    if (!name) return strata_fail(STRATA_ERR_INVALID_ARG, "strata_probe_int8_peak: unknown isa %d (strata.h strata_isa)", (int)isa);
    const int idx = (int)isa - 1;
    if (!strata_cpu_has_isa(idx))
        return strata_fail(STRATA_ERR_UNSUPPORTED, "int8 peak probe: isa %s cannot run on this CPU, its OS or this "
                           "build; strata_isa_supported() says which paths can (strata_build_info() lists what was "
                           "compiled in)", name);
    /* 64-byte aligned operands, enough for every loop's chains (at most 12 x 64 bytes of weights) */
    _Alignas(64) uint8_t w[16 * 64];
    _Alignas(64) int8_t a[64];
    for (int i = 0; i < (int)sizeof w; i++) w[i] = (uint8_t)(i * 37 + 11);
    for (int i = 0; i < (int)sizeof a; i++) a[i] = (int8_t)(i * 53 - 90);

    strata_pool *pool = ctx ? strata_context_pool(ctx) : NULL;
    const int nthreads = pool ? strata_pool_n_threads(pool) : 1;
    peak_job j = {peak_loop(idx), w, a, 0};
    uint64_t macs_per_iter = 0;
    j.sink += j.fn(w, a, PEAK_ITERS, &macs_per_iter); /* warm-up: clocks and caches settle */
    const int64_t tasks = (int64_t)PEAK_TASKS_PER_THREAD * nthreads;
    const double macs = (double)tasks * PEAK_ITERS * (double)macs_per_iter;
    double best = 0, spent = 0;
    for (int pass = 0; pass < 10000 && (pass < PEAK_MIN_PASSES || spent < PEAK_MIN_SECONDS); pass++) {
        const double t0 = now_s();
        strata_pool_run(pool, peak_task, &j, tasks);
        const double dt = now_s() - t0;
        spent += dt;
        if (dt > 0 && macs / dt > best) best = macs / dt;
    }
    if (!(best > 0) || !isfinite(best))
        return strata_fail(STRATA_ERR_INTERNAL, "int8 peak probe (%s): no usable timing", name);
    *gmacs = best / 1e9;
    return STRATA_OK;
}
