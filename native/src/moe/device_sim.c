/*
 * device_sim.c — the `sim` device: slots in host memory, one device thread that executes the queue
 * in order, and a copy engine that takes bytes / link_gbps seconds per copy (it copies, then
 * sleeps for the rest of that time), so the cache, staging and controller logic see a link of the
 * configured speed. Computations run on the device thread with the CPU kernels (the same calls
 * as the ExpertPool), so `sim` and `cpu` give the same numbers. Protocol: device.h.
 */
#include "device.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/matmul.h"
#include "util/error.h"

enum { OP_COPY = 1, OP_COMPUTE = 2 };

typedef struct {
    int type;
    int32_t slot;
    const void *src[3];
    size_t bytes[3];
    mdev_group *g;
    int ng;
} sim_op;

struct mdev {
    mdev_params p;
    char *mem;                 /* n_slots x slot_bytes */
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    sim_op *q;
    int cap, head, count;
    uint64_t submitted;        /* model thread only */
    _Atomic uint64_t done;
    int stop;
    /* counters, written by the device thread under mu */
    uint64_t copy_bytes;
    double copy_s, compute_s;
    double vclock;             /* device thread: when the copy engine is free again */
};

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
                h[i * Fe + f] = (g / (1.0f + expf(-g))) * u;
            }
    } else {
        float *up = gu + n * Fe;
        if ((rc = strata_matmul_run(NULL, s->tg, isa, blob, Fe, E, x, n, gu))) goto done;
        if ((rc = strata_matmul_run(NULL, s->tu, isa, blob + s->gate_bytes, Fe, E, x, n, up))) goto done;
        for (int64_t i = 0; i < n * Fe; i++) {
            const float g = gu[i] * sg, u = up[i] * su;
            h[i] = (g / (1.0f + expf(-g))) * u;
        }
    }
    rc = strata_matmul_run(NULL, s->td, isa, blob + s->gate_bytes + s->up_bytes, E, Fe, h, n, out);
done:
    free(gu);
    free(h);
    return rc;
}

static void run_op(mdev *d, sim_op *op) {
    if (op->type == OP_COPY) {
        const double t0 = now_s();
        char *dst = d->mem + (size_t)op->slot * d->p.slot_bytes;
        size_t total = 0;
        for (int k = 0; k < 3; k++) {
            if (op->bytes[k]) memcpy(dst + total, op->src[k], op->bytes[k]);
            total += op->bytes[k];
        }
        /* the link's clock: this copy ends bytes/bandwidth after the later of now and the end of
         * the previous copy; sleep only when more than 50 us ahead (nanosleep's own cost), so many
         * small copies are paced in bulk and still average the configured bandwidth */
        if (d->p.link_gbps > 0) {
            if (d->vclock < t0) d->vclock = t0;
            d->vclock += (double)total / (d->p.link_gbps * 1e9);
            const double ahead = d->vclock - now_s();
            if (ahead > 50e-6) sleep_s(ahead);
        }
        pthread_mutex_lock(&d->mu);
        d->copy_bytes += total;
        d->copy_s += now_s() - t0;
        pthread_mutex_unlock(&d->mu);
    } else {
        const double t0 = now_s();
        for (int i = 0; i < op->ng; i++) {
            const mdev_group *g = &op->g[i];
            /* errors (allocation) leave the rows at 0: the scheduler checks a status word */
            if (mdev_expert_ffn(g->shape, d->mem + (size_t)g->slot * d->p.slot_bytes, g->sg, g->su, d->p.isa,
                                g->x, g->n, g->out) != STRATA_OK)
                memset(g->out, 0, (size_t)(g->n * g->shape->E) * sizeof(float));
        }
        free(op->g);
        pthread_mutex_lock(&d->mu);
        d->compute_s += now_s() - t0;
        pthread_mutex_unlock(&d->mu);
    }
}

static void *device_main(void *arg) {
    mdev *d = arg;
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (!d->count && !d->stop) pthread_cond_wait(&d->cv_work, &d->mu);
        if (!d->count && d->stop) break;
        sim_op op = d->q[d->head];
        pthread_mutex_unlock(&d->mu);
        run_op(d, &op);
        pthread_mutex_lock(&d->mu);
        d->head = (d->head + 1) % d->cap;
        d->count--;
        atomic_fetch_add_explicit(&d->done, 1, memory_order_release);
        pthread_cond_broadcast(&d->cv_done);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

strata_status mdev_create(const mdev_params *p, mdev **out) {
    if (p->kind != MDEV_SIM)
        return strata_fail(STRATA_ERR_NO_DEVICE, "device kind %d is not available in this build", p->kind);
    if (p->n_slots < 1 || p->slot_bytes == 0)
        return strata_fail(STRATA_ERR_INVALID_ARG, "sim device: needs at least one slot");
    mdev *d = calloc(1, sizeof *d);
    if (!d) return strata_fail(STRATA_ERR_NOMEM, "sim device: no memory");
    d->p = *p;
    d->mem = malloc((size_t)p->n_slots * p->slot_bytes);
    d->cap = 1024;
    d->q = malloc((size_t)d->cap * sizeof(sim_op));
    if (!d->mem || !d->q) {
        free(d->mem); free(d->q); free(d);
        return strata_fail(STRATA_ERR_NOMEM, "sim device: no memory for %d slots of %zu bytes", p->n_slots, p->slot_bytes);
    }
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv_work, NULL);
    pthread_cond_init(&d->cv_done, NULL);
    atomic_store(&d->done, 0);
    if (pthread_create(&d->th, NULL, device_main, d)) {
        free(d->mem); free(d->q); free(d);
        return strata_fail(STRATA_ERR_INTERNAL, "sim device: cannot start its thread");
    }
    *out = d;
    return STRATA_OK;
}

void mdev_free(mdev *d) {
    if (!d) return;
    pthread_mutex_lock(&d->mu);
    d->stop = 1;
    pthread_cond_broadcast(&d->cv_work);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->th, NULL);
    for (int i = 0; i < d->count; i++) free(d->q[(d->head + i) % d->cap].g);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cv_work);
    pthread_cond_destroy(&d->cv_done);
    free(d->mem);
    free(d->q);
    free(d);
}

static strata_status submit(mdev *d, sim_op *op, uint64_t *seq) {
    pthread_mutex_lock(&d->mu);
    if (d->count == d->cap) {
        const int nc = d->cap * 2;
        sim_op *nq = malloc((size_t)nc * sizeof(sim_op));
        if (!nq) {
            pthread_mutex_unlock(&d->mu);
            return strata_fail(STRATA_ERR_NOMEM, "sim device: queue full and no memory to grow it");
        }
        for (int i = 0; i < d->count; i++) nq[i] = d->q[(d->head + i) % d->cap];
        free(d->q);
        d->q = nq;
        d->cap = nc;
        d->head = 0;
    }
    d->q[(d->head + d->count) % d->cap] = *op;
    d->count++;
    *seq = ++d->submitted;
    pthread_cond_signal(&d->cv_work);
    pthread_mutex_unlock(&d->mu);
    return STRATA_OK;
}

strata_status mdev_copy(mdev *d, int32_t slot, const void *const src[3], const size_t bytes[3], uint64_t *seq) {
    if (slot < 0 || slot >= d->p.n_slots || bytes[0] + bytes[1] + bytes[2] > d->p.slot_bytes)
        return strata_fail(STRATA_ERR_INTERNAL, "sim device: copy of %zu bytes into slot %d does not fit",
                           bytes[0] + bytes[1] + bytes[2], slot);
    sim_op op = {.type = OP_COPY, .slot = slot};
    for (int k = 0; k < 3; k++) { op.src[k] = src[k]; op.bytes[k] = bytes[k]; }
    return submit(d, &op, seq);
}

strata_status mdev_compute(mdev *d, const mdev_group *groups, int n, uint64_t *seq) {
    sim_op op = {.type = OP_COMPUTE, .ng = n};
    op.g = malloc((size_t)(n > 0 ? n : 1) * sizeof(mdev_group));
    if (!op.g) return strata_fail(STRATA_ERR_NOMEM, "sim device: no memory");
    memcpy(op.g, groups, (size_t)n * sizeof(mdev_group));
    strata_status rc = submit(d, &op, seq);
    if (rc) free(op.g);
    return rc;
}

uint64_t mdev_done(mdev *d) { return atomic_load_explicit(&d->done, memory_order_acquire); }

void mdev_wait(mdev *d, uint64_t seq) {
    for (int i = 0; i < 2000; i++)
        if (mdev_done(d) >= seq) return;
    pthread_mutex_lock(&d->mu);
    while (atomic_load_explicit(&d->done, memory_order_acquire) < seq) pthread_cond_wait(&d->cv_done, &d->mu);
    pthread_mutex_unlock(&d->mu);
}

double mdev_probe(mdev *d, size_t bytes, int reps) {
    /* copies of one slot, repeated to at least `bytes` per pass (a pinned-copy probe in effect) */
    const size_t piece = d->p.slot_bytes;
    const int per_pass = (int)((bytes + piece - 1) / piece);
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
            if (mdev_copy(d, 0, s, b, &seq) != STRATA_OK) break;
        mdev_wait(d, seq);
        const double g = (double)piece * per_pass / (now_s() - t0) / 1e9;
        if (g > best) best = g;
    }
    free(src);
    /* the probe's copies are not part of the workload */
    pthread_mutex_lock(&d->mu);
    d->copy_bytes = 0;
    d->copy_s = 0.0;
    pthread_mutex_unlock(&d->mu);
    return best;
}

void mdev_counters(mdev *d, uint64_t *copy_bytes, double *copy_s, double *compute_s) {
    pthread_mutex_lock(&d->mu);
    *copy_bytes = d->copy_bytes;
    *copy_s = d->copy_s;
    *compute_s = d->compute_s;
    pthread_mutex_unlock(&d->mu);
}

const char *mdev_name(const mdev *d) { return d->p.kind == MDEV_SIM ? "sim" : "cuda"; }
