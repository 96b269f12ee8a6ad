/*
 * device_sim.c — the `sim` device: slots in host memory and two engine threads, as a GPU has a
 * copy stream and a compute stream. The copy engine paces itself to link_gbps (a copy ends
 * bytes / bandwidth after the later of its start and the previous copy's end); the compute engine
 * runs expert FFNs with the CPU kernels (the same calls as the ExpertPool), so `sim` and `cpu` give
 * the same numbers. Each operation waits for its dependency on the other engine (device.h).
 * One mutex guards both queues, both counters' slow paths and the event log; the counters are
 * also atomics so the model thread can poll them without the lock.
 * The `cuda` device is this machinery with GPU work (device_cuda.h): its copy engine runs
 * cudev_copy instead of memcpy + pacing, its compute engine cudev_ffn, its slots live on the GPU.
 */
#include "device.h"
#include "device_cuda.h"

#include <pthread.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/matmul.h"
#include "kernels/cuda/ops_common.cuh"
#include "util/error.h"
#include "util/trace.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

strata_status mdev_expert_ffn(const mdev_expert_shape *s, const char *blob, float sg, float su, int isa,
                              const float *x, int64_t n, float *out) {
    const int64_t Fe = s->Fe, E = s->E;
    float *gu = malloc((size_t)(n * 2 * Fe) * sizeof(float));
    float *h = malloc((size_t)(n * Fe) * sizeof(float));
    strata_status rc = STRATA_OK;
    if (!gu || !h) { rc = strata_fail(STRATA_ERR_NOMEM, "expert: no memory for %lld rows", (long long)n); goto done; }
    if (s->fused) {
        if ((rc = strata_matmul_run(NULL, s->tg, isa, blob, 2 * Fe, E, x, n, gu))) goto done;
        for (int64_t i = 0; i < n; i++)
            for (int64_t f = 0; f < Fe; f++) {
                const float g = gu[i * 2 * Fe + f] * sg, u = gu[i * 2 * Fe + Fe + f] * su;
                h[i * Fe + f] = ops_silu(g) * u;
            }
    } else {
        float *up = gu + n * Fe;
        if ((rc = strata_matmul_run(NULL, s->tg, isa, blob, Fe, E, x, n, gu))) goto done;
        if ((rc = strata_matmul_run(NULL, s->tu, isa, blob + s->gate_bytes, Fe, E, x, n, up))) goto done;
        for (int64_t i = 0; i < n * Fe; i++) {
            const float g = gu[i] * sg, u = up[i] * su;
            h[i] = ops_silu(g) * u;
        }
    }
    rc = strata_matmul_run(NULL, s->td, isa, blob + s->gate_bytes + s->up_bytes, E, Fe, h, n, out);
done:
    free(gu);
    free(h);
    return rc;
}

typedef struct {
    int32_t slot;
    const void *src[3];
    size_t bytes[3];
    mdev_group *g;
    int ng;
    uint64_t after;        /* the other engine's number to wait for */
} sim_op;

typedef struct {
    sim_op *q;
    int cap, head, count;
    uint64_t submitted;
    _Atomic uint64_t done;
    pthread_t th;
} engine;

struct mdev {
    mdev_params p;
    char *mem;                 /* n_slots x slot_bytes (sim) */
    cudev *cu;                 /* the GPU's slots and streams (cuda), else NULL */
    pthread_mutex_t mu;
    pthread_cond_t cv;         /* any change: work queued, an operation done, stop */
    engine eng[2];             /* 0 copy, 1 compute */
    int stop;
    uint64_t copy_bytes;       /* counters, under mu */
    uint64_t act_bytes;        /* the computations' rows: x up, out down */
    double copy_s, compute_s;
    double vclock;             /* copy thread: when the link is free again */
    int log_on;
    _Atomic int cancel;        /* mdev_cancel: drop queued operations, cut the copy's pacing short */
    int busy[2];               /* an engine is running an operation (under mu) */
    uint64_t first_dropped;    /* copy engine: the first copy number dropped by a cancel (0: none) */
    mdev_event *log;
    int64_t n_log, cap_log;
};

typedef struct { mdev *d; int which; } eng_arg;

static void cu_release(cudev *cu) {
#if STRATA_HAVE_CUDA
    cudev_free(cu);
#else
    (void)cu;
#endif
}

static void log_event(mdev *d, int which, const sim_op *op, uint64_t seq, double t0, double t1) {
    if (!d->log_on) return;
    if (d->n_log == d->cap_log) {
        const int64_t nc = d->cap_log ? 2 * d->cap_log : 1024;
        mdev_event *nl = realloc(d->log, (size_t)nc * sizeof *nl);
        if (!nl) return;
        d->log = nl;
        d->cap_log = nc;
    }
    mdev_event *e = &d->log[d->n_log++];
    memset(e, 0, sizeof *e);
    e->engine = which;
    e->seq = seq;
    e->after = op->after;
    e->t0 = t0;
    e->t1 = t1;
    if (which == 0) {
        e->slot = op->slot;
    } else {
        e->slot = op->ng ? op->g[0].slot : -1;
        e->n_slots = op->ng;
        for (int i = 0; i < op->ng && i < 8; i++) e->slots[i] = op->g[i].slot;
    }
}

static void run_copy(mdev *d, sim_op *op) {
    const double t0 = now_s();
#if STRATA_HAVE_CUDA
    if (d->cu) {
        /* a failed copy leaves the slot as it was: the error goes to the log, the number completes */
        if (cudev_copy(d->cu, op->slot, op->src, op->bytes) != STRATA_OK)
            fprintf(stderr, "strata: %s\n", strata_last_error());
        pthread_mutex_lock(&d->mu);
        d->copy_bytes += op->bytes[0] + op->bytes[1] + op->bytes[2];
        d->copy_s += now_s() - t0;
        pthread_mutex_unlock(&d->mu);
        return;
    }
#endif
    char *dst = d->mem + (size_t)op->slot * d->p.slot_bytes;
    size_t total = 0;
    for (int k = 0; k < 3; k++) {
        if (op->bytes[k]) memcpy(dst + total, op->src[k], op->bytes[k]);
        total += op->bytes[k];
    }
    /* pace to the link: sleep only when more than 50 us ahead (nanosleep's own cost), so many
     * small copies are paced in bulk and still average the configured bandwidth */
    if (d->p.link_gbps > 0) {
        if (d->vclock < t0) d->vclock = t0;
        d->vclock += (double)total / (d->p.link_gbps * 1e9);
        /* in slices, so that a cancel (the watchdog) does not wait for a slow link */
        for (double ahead = d->vclock - now_s(); ahead > 50e-6; ahead = d->vclock - now_s()) {
            if (atomic_load_explicit(&d->cancel, memory_order_relaxed)) { d->vclock = now_s(); break; }
            sleep_s(ahead < 0.02 ? ahead : 0.02);
        }
    }
    pthread_mutex_lock(&d->mu);
    d->copy_bytes += total;
    d->copy_s += now_s() - t0;
    pthread_mutex_unlock(&d->mu);
}

static void run_compute(mdev *d, sim_op *op) {
    const double t0 = now_s();
    uint64_t act = 0;
    for (int i = 0; i < op->ng; i++) {
        const mdev_group *g = &op->g[i];
        if (!g->dev_io) act += 2 * (uint64_t)g->n * (uint64_t)g->shape->E * sizeof(float);
        /* an allocation failure leaves zero rows (the expert's contribution is lost, not garbage) */
#if STRATA_HAVE_CUDA
        if (d->cu) {
            if (cudev_ffn(d->cu, g) != STRATA_OK) {
                fprintf(stderr, "strata: %s\n", strata_last_error());
                memset(g->out, 0, (size_t)(g->n * g->shape->E) * sizeof(float));
            }
            continue;
        }
#endif
        if (mdev_expert_ffn(g->shape, d->mem + (size_t)g->slot * d->p.slot_bytes, g->sg, g->su, d->p.isa, g->x,
                            g->n, g->out) != STRATA_OK)
            memset(g->out, 0, (size_t)(g->n * g->shape->E) * sizeof(float));
    }
    pthread_mutex_lock(&d->mu);
    d->act_bytes += act;
    d->compute_s += now_s() - t0;
    pthread_mutex_unlock(&d->mu);
}

static void *engine_main(void *arg) {
    mdev *d = ((eng_arg *)arg)->d;
    const int which = ((eng_arg *)arg)->which;
    free(arg);
    engine *e = &d->eng[which], *other = &d->eng[1 - which];
    if (d->cu) trc_thread_name(which ? "cuda compute" : "cuda copy");
    else trc_thread_name(which ? "sim compute" : "sim copy");
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->stop && (!e->count || (!atomic_load_explicit(&d->cancel, memory_order_relaxed) &&
                            atomic_load_explicit(&other->done, memory_order_acquire) < e->q[e->head].after)))
            pthread_cond_wait(&d->cv, &d->mu);
        if (d->stop && !e->count) break;
        if (d->stop && atomic_load_explicit(&other->done, memory_order_acquire) < e->q[e->head].after) break;
        sim_op op = e->q[e->head];
        const uint64_t seq = atomic_load_explicit(&e->done, memory_order_relaxed) + 1;
        if (atomic_load_explicit(&d->cancel, memory_order_relaxed)) {
            /* cancelled: dropped unrun (mdev_cancel); the number still completes, nothing is written */
            if (which == 0 && !d->first_dropped) d->first_dropped = seq;
            free(op.g);
            e->head = (e->head + 1) % e->cap;
            e->count--;
            atomic_store_explicit(&e->done, seq, memory_order_release);
            pthread_cond_broadcast(&d->cv);
            continue;
        }
        d->busy[which] = 1;
        pthread_mutex_unlock(&d->mu);
        const double t0 = now_s();
        const uint64_t tt0 = trc_on() ? trc_now() : 0;
        if (which == 0) run_copy(d, &op);
        else run_compute(d, &op);
        const double t1 = now_s();
        if (trc_on()) {
            if (which == 0)
                trc_emit(TRC_DEV_COPY, tt0, trc_now(), op.slot, 0, (int64_t)(op.bytes[0] + op.bytes[1] + op.bytes[2]),
                         (int64_t)seq);
            else
                trc_emit(TRC_DEV_COMPUTE, tt0, trc_now(), op.ng ? op.g[0].slot : -1, op.ng, 0, (int64_t)seq);
        }
        pthread_mutex_lock(&d->mu);
        d->busy[which] = 0;
        log_event(d, which, &op, seq, t0, t1);
        free(op.g);
        e->head = (e->head + 1) % e->cap;
        e->count--;
        atomic_store_explicit(&e->done, seq, memory_order_release);
        pthread_cond_broadcast(&d->cv);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

strata_status mdev_create(const mdev_params *p, mdev **out) {
    if (p->kind == MDEV_CUDA && !STRATA_HAVE_CUDA)
        return strata_fail(STRATA_ERR_NO_DEVICE, "cuda device: this libstrata was built without CUDA (STRATA_CUDA=OFF)");
    if (p->kind != MDEV_SIM && p->kind != MDEV_CUDA)
        return strata_fail(STRATA_ERR_NO_DEVICE, "device kind %d is not available in this build", p->kind);
    if (p->n_slots < 1 || p->slot_bytes == 0)
        return strata_fail(STRATA_ERR_INVALID_ARG, "sim device: needs at least one slot");
    cudev *cu = NULL;
#if STRATA_HAVE_CUDA
    if (p->kind == MDEV_CUDA) {
        strata_status crc = cudev_create(p->n_slots, p->slot_bytes, &cu);
        if (crc) return crc;
    }
#endif
    mdev *d = calloc(1, sizeof *d);
    if (!d) {
#if STRATA_HAVE_CUDA
        cudev_free(cu);
#endif
        return strata_fail(STRATA_ERR_NOMEM, "sim device: no memory");
    }
    d->p = *p;
    d->cu = cu;
    d->mem = cu ? malloc(1) : malloc((size_t)p->n_slots * p->slot_bytes);
    for (int w = 0; w < 2; w++) {
        d->eng[w].cap = 256;
        d->eng[w].q = malloc((size_t)d->eng[w].cap * sizeof(sim_op));
        atomic_store(&d->eng[w].done, 0);
    }
    if (!d->mem || !d->eng[0].q || !d->eng[1].q) {
        cu_release(d->cu); free(d->mem); free(d->eng[0].q); free(d->eng[1].q); free(d);
        return strata_fail(STRATA_ERR_NOMEM, "sim device: no memory for %d slots of %zu bytes", p->n_slots, p->slot_bytes);
    }
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    for (int w = 0; w < 2; w++) {
        eng_arg *a = malloc(sizeof *a);
        if (a) { a->d = d; a->which = w; }
        if (!a || pthread_create(&d->eng[w].th, NULL, engine_main, a)) {
            free(a);
            if (w == 1) {   /* stop the copy engine that did start */
                pthread_mutex_lock(&d->mu);
                d->stop = 1;
                pthread_cond_broadcast(&d->cv);
                pthread_mutex_unlock(&d->mu);
                pthread_join(d->eng[0].th, NULL);
            }
            pthread_mutex_destroy(&d->mu);
            pthread_cond_destroy(&d->cv);
            cu_release(d->cu); free(d->mem); free(d->eng[0].q); free(d->eng[1].q); free(d);
            return strata_fail(STRATA_ERR_INTERNAL, "sim device: cannot start its threads");
        }
    }
    *out = d;
    return STRATA_OK;
}

void mdev_free(mdev *d) {
    if (!d) return;
    /* let queued work finish (the scheduler has waited for what it needs; loads may be in flight) */
    for (int w = 0; w < 2; w++) {
        pthread_mutex_lock(&d->mu);
        const uint64_t last = d->eng[w].submitted;
        pthread_mutex_unlock(&d->mu);
        if (w == 0) mdev_wait_copy(d, last);
        else mdev_wait_compute(d, last);
    }
    pthread_mutex_lock(&d->mu);
    d->stop = 1;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    for (int w = 0; w < 2; w++) pthread_join(d->eng[w].th, NULL);
    for (int w = 0; w < 2; w++) {
        engine *e = &d->eng[w];
        for (int i = 0; i < e->count; i++) free(e->q[(e->head + i) % e->cap].g);
        free(e->q);
    }
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv);
    free(d->log);
    cu_release(d->cu);
    free(d->mem);
    free(d);
}

static strata_status submit(mdev *d, int which, sim_op *op, uint64_t *seq) {
    engine *e = &d->eng[which];
    pthread_mutex_lock(&d->mu);
    if (e->count == e->cap) {
        const int nc = e->cap * 2;
        sim_op *nq = malloc((size_t)nc * sizeof(sim_op));
        if (!nq) {
            pthread_mutex_unlock(&d->mu);
            return strata_fail(STRATA_ERR_NOMEM, "sim device: queue full and no memory to grow it");
        }
        for (int i = 0; i < e->count; i++) nq[i] = e->q[(e->head + i) % e->cap];
        free(e->q);
        e->q = nq;
        e->cap = nc;
        e->head = 0;
    }
    e->q[(e->head + e->count) % e->cap] = *op;
    e->count++;
    *seq = ++e->submitted;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    return STRATA_OK;
}

strata_status mdev_copy(mdev *d, int32_t slot, const void *const src[3], const size_t bytes[3],
                        uint64_t after_compute, uint64_t *seq) {
    if (slot < 0 || slot >= d->p.n_slots || bytes[0] + bytes[1] + bytes[2] > d->p.slot_bytes)
        return strata_fail(STRATA_ERR_INTERNAL, "sim device: copy of %zu bytes into slot %d does not fit",
                           bytes[0] + bytes[1] + bytes[2], slot);
    sim_op op = {.slot = slot, .after = after_compute};
    for (int k = 0; k < 3; k++) { op.src[k] = src[k]; op.bytes[k] = bytes[k]; }
    return submit(d, 0, &op, seq);
}

strata_status mdev_compute(mdev *d, const mdev_group *groups, int n, uint64_t after_copy, uint64_t *seq) {
    sim_op op = {.ng = n, .after = after_copy};
    op.g = malloc((size_t)(n > 0 ? n : 1) * sizeof(mdev_group));
    if (!op.g) return strata_fail(STRATA_ERR_NOMEM, "sim device: no memory");
    memcpy(op.g, groups, (size_t)n * sizeof(mdev_group));
    strata_status rc = submit(d, 1, &op, seq);
    if (rc) free(op.g);
    return rc;
}

uint64_t mdev_copies_done(mdev *d) { return atomic_load_explicit(&d->eng[0].done, memory_order_acquire); }
uint64_t mdev_computes_done(mdev *d) { return atomic_load_explicit(&d->eng[1].done, memory_order_acquire); }

/* Waits in slices of 20 ms, checking the calling thread's watchdog (util/trace.h) between them. */
static int wait_engine(mdev *d, int which, uint64_t seq) {
    for (int i = 0; i < 2000; i++)
        if (atomic_load_explicit(&d->eng[which].done, memory_order_acquire) >= seq) return 0;
    int gave_up = 0;
    pthread_mutex_lock(&d->mu);
    while (atomic_load_explicit(&d->eng[which].done, memory_order_acquire) < seq) {
        if (wd_expired()) { gave_up = 1; break; }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 20000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&d->cv, &d->mu, &ts);
    }
    pthread_mutex_unlock(&d->mu);
    return gave_up;
}

int mdev_wait_copy(mdev *d, uint64_t seq) { return wait_engine(d, 0, seq); }
int mdev_wait_compute(mdev *d, uint64_t seq) { return wait_engine(d, 1, seq); }

uint64_t mdev_cancel(mdev *d) {
    pthread_mutex_lock(&d->mu);
    d->first_dropped = 0;
    atomic_store_explicit(&d->cancel, 1, memory_order_relaxed);
    pthread_cond_broadcast(&d->cv);
    while (d->eng[0].count || d->eng[1].count || d->busy[0] || d->busy[1]) pthread_cond_wait(&d->cv, &d->mu);
    atomic_store_explicit(&d->cancel, 0, memory_order_relaxed);
    const uint64_t done = atomic_load_explicit(&d->eng[0].done, memory_order_acquire);
    const uint64_t real = d->first_dropped ? d->first_dropped - 1 : done;
    pthread_mutex_unlock(&d->mu);
    return real;
}

double mdev_probe(mdev *d, size_t bytes, int reps) {
#if STRATA_HAVE_CUDA
    if (d->cu) {   /* pinned host -> device DMA, timed with events (no other copy is queued at create) */
        mdev_wait_copy(d, d->eng[0].submitted);
        return cudev_probe(d->cu, bytes, reps);
    }
#endif
    /* copies of one slot, repeated to at least `bytes` per pass */
    const size_t piece = d->p.slot_bytes;
    int per_pass = (int)((bytes + piece - 1) / piece);
    /* a slow simulated link is probed for ~20 ms per pass, not for the whole size */
    const double cap = d->p.link_gbps > 0 ? d->p.link_gbps * 1e9 * 0.02 / (double)piece : per_pass;
    if (per_pass > cap) per_pass = cap < 1 ? 1 : (int)cap;
    char *src = malloc(piece);
    if (!src) return 0.0;
    memset(src, 1, piece);
    double best = 0.0;
    for (int r = 0; r < reps; r++) {
        const void *s[3] = {src, NULL, NULL};
        const size_t b[3] = {piece, 0, 0};
        uint64_t seq = 0;
        const double t0 = now_s();
        for (int k = 0; k < per_pass; k++)
            if (mdev_copy(d, 0, s, b, 0, &seq) != STRATA_OK) break;
        mdev_wait_copy(d, seq);
        const double g = (double)piece * per_pass / (now_s() - t0) / 1e9;
        if (g > best) best = g;
    }
    free(src);
    pthread_mutex_lock(&d->mu);   /* the probe is not part of the workload */
    d->copy_bytes = 0;
    d->copy_s = 0.0;
    pthread_mutex_unlock(&d->mu);
    return best;
}

void mdev_counters(mdev *d, uint64_t *copy_bytes, uint64_t *act_bytes, double *copy_s, double *compute_s) {
    pthread_mutex_lock(&d->mu);
    *copy_bytes = d->copy_bytes;
    *act_bytes = d->act_bytes;
    *copy_s = d->copy_s;
    *compute_s = d->compute_s;
    pthread_mutex_unlock(&d->mu);
}

const char *mdev_name(const mdev *d) { return d->p.kind == MDEV_SIM ? "sim" : "cuda"; }

void mdev_events_enable(mdev *d, int on) {
    pthread_mutex_lock(&d->mu);
    d->log_on = on;
    d->n_log = 0;
    pthread_mutex_unlock(&d->mu);
}

int64_t mdev_events(mdev *d, mdev_event *out, int64_t cap) {
    pthread_mutex_lock(&d->mu);
    const int64_t n = d->n_log;
    if (out) memcpy(out, d->log, (size_t)(n < cap ? n : cap) * sizeof *out);
    pthread_mutex_unlock(&d->mu);
    return n;
}
