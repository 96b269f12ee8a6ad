/* threadpool.c — see threadpool.h for the protocol. */
#include "threadpool.h"
#include "trace.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* How long an idle worker polls for the next job before sleeping. After the first few
 * microseconds it polls with sched_yield(), so that on a machine with more runnable threads
 * than cores a polling worker gives its core away instead of holding up the thread it is
 * waiting for. */
#define STRATA_POOL_SPIN_US 200
#define STRATA_POOL_PAUSE_US 10

/* Thread i's slice of a job: it claims tasks next.. up to end from its own counter (a line of its
 * own, so claims cost no transfer between cores), then helps the others claim from theirs. Every
 * task runs exactly once, whichever thread claims it; tasks do not wait on one another. The slice
 * is one word, end << 32 | next, so that a claim (fetch_add 1) sees the next task and the end of
 * one job at once: a worker late for a job may claim while the caller writes the next job's slices
 * (see threadpool.h), and with two words it could pair one job's next with the other's end. */
typedef struct {
    _Alignas(64) _Atomic uint64_t word;
} strata_pool_share;

/* Jobs of more tasks run as several of at most this many (the slice's halves are 32 bits). */
#define STRATA_POOL_MAX_TASKS ((int64_t)1 << 30)

struct strata_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    pthread_mutex_t run_lock;      /* one job at a time */
    /* the current job: written by the caller before the generation bump */
    strata_task_fn fn;
    void *arg;
    int64_t n_tasks;
    strata_pool_share *share;      /* [n_threads]: each thread's slice of the job's tasks */
    int sleepers;                  /* workers waiting on `wake`; under mu */
    /* What the threads spin on, a cache line each: a spinning reader of one does not slow a
     * thread writing another (perf: the shared counter's `lock xadd` was ~7 % of an 8-sequence step). */
    _Alignas(64) _Atomic uint64_t generation;   /* bumped (release, under mu) to publish a job */
    _Atomic int stop;
    _Alignas(64) _Atomic int64_t done;          /* the job's tasks finished (each thread adds its count) */
};

typedef struct { strata_pool *pool; int index; } worker_arg;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static uint64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* With the trace recorder on, one span per thread and job: from its first claim to the end of its
 * last task, with the number of tasks it ran (a span per task would cost more than small tasks). */
/* A claim acquires the counter the caller released after writing the job (strata_pool_run), so the
 * job's fields are visible to whoever claims one of its tasks, even a worker that woke for an
 * earlier job. The thread's count of finished tasks is added to `done` once, at the end (release):
 * the caller cannot publish another job before then, so one drain only ever runs one job's tasks. */
static void drain(strata_pool *p, int thread) {
    const int tr = trc_on();
    const uint64_t t0 = tr ? trc_now() : 0;
    const int n = p->n_threads;
    int64_t first = -1, ran = 0, job_tasks = 0;
    for (int k = 0; k < n; k++) {   /* its own slice first, then the others' in turn */
        strata_pool_share *sh = &p->share[(thread + k) % n];
        for (;;) {
            const uint64_t w = atomic_fetch_add_explicit(&sh->word, 1, memory_order_acquire);
            const int64_t t = (int64_t)(uint32_t)w;
            if (t >= (int64_t)(w >> 32)) break;
            if (first < 0) {
                first = t;
                job_tasks = p->n_tasks;
            }
            p->fn(p->arg, t, thread);
            ran++;
        }
    }
    if (!ran) return;
    if (tr) trc_emit(TRC_POOL_TASK, t0, trc_now(), (int32_t)first, thread, ran, job_tasks);
    atomic_fetch_add_explicit(&p->done, ran, memory_order_release);
}

/* Waits for a generation other than `seen`: spins first, then sleeps. Returns it, or
 * `seen` when the pool stops. */
static uint64_t wait_job(strata_pool *p, uint64_t seen) {
    uint64_t deadline = 0;
    for (unsigned i = 0;; i++) {
        const uint64_t g = atomic_load_explicit(&p->generation, memory_order_acquire);
        if (g != seen) return g;
        if (atomic_load_explicit(&p->stop, memory_order_relaxed)) return seen;
        if ((i & 15) == 0) {
            const uint64_t t = now_us();
            if (!deadline) deadline = t + STRATA_POOL_SPIN_US;
            else if (t >= deadline) break;
            else if (t + STRATA_POOL_SPIN_US - STRATA_POOL_PAUSE_US >= deadline) { sched_yield(); continue; }
        }
        cpu_relax();
    }
    pthread_mutex_lock(&p->mu);
    p->sleepers++;
    uint64_t g;
    while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
           !atomic_load_explicit(&p->stop, memory_order_relaxed))
        pthread_cond_wait(&p->wake, &p->mu);
    p->sleepers--;
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *worker_main(void *varg) {
    worker_arg *wa = varg;
    strata_pool *p = wa->pool;
    const int index = wa->index;
    free(wa);
    char name[32];
    snprintf(name, sizeof name, "pool %d", index);
    trc_thread_name(name);
    uint64_t seen = 0;
    for (;;) {
        const uint64_t g = wait_job(p, seen);
        if (g == seen) return NULL; /* stopped */
        seen = g;
        drain(p, index);
    }
}

strata_pool *strata_pool_create(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    strata_pool *p = aligned_alloc(64, sizeof *p);
    if (!p) return NULL;
    memset(p, 0, sizeof *p);
    p->n_threads = n_threads;
    p->share = aligned_alloc(64, (size_t)n_threads * sizeof *p->share);
    if (!p->share) { free(p); return NULL; }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_mutex_init(&p->run_lock, NULL);
    p->threads = calloc((size_t)n_threads, sizeof *p->threads);
    if (!p->threads) { strata_pool_destroy(p); return NULL; }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (!wa) { p->n_threads = i; strata_pool_destroy(p); return NULL; }
        wa->pool = p;
        wa->index = i;
        if (pthread_create(&p->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            p->n_threads = i;
            strata_pool_destroy(p);
            return NULL;
        }
    }
    return p;
}

void strata_pool_destroy(strata_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->stop, 1, memory_order_relaxed);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->run_lock);
    free(p->share);
    free(p);
}

int strata_pool_n_threads(const strata_pool *p) { return p ? p->n_threads : 1; }

typedef struct {
    strata_task_fn fn;
    void *arg;
    int64_t first;
} pool_chunk;

static void chunk_task(void *arg, int64_t t, int thread) {
    const pool_chunk *c = arg;
    c->fn(c->arg, c->first + t, thread);
}

void strata_pool_run(strata_pool *p, strata_task_fn fn, void *arg, int64_t n_tasks) {
    if (n_tasks <= 0) return;
    if (!p || p->n_threads == 1 || n_tasks == 1) {
        for (int64_t t = 0; t < n_tasks; t++) fn(arg, t, 0);
        return;
    }
    if (n_tasks > STRATA_POOL_MAX_TASKS) {
        for (int64_t t0 = 0; t0 < n_tasks; t0 += STRATA_POOL_MAX_TASKS) {
            pool_chunk c = {fn, arg, t0};
            strata_pool_run(p, chunk_task, &c,
                            n_tasks - t0 < STRATA_POOL_MAX_TASKS ? n_tasks - t0 : STRATA_POOL_MAX_TASKS);
        }
        return;
    }
    pthread_mutex_lock(&p->run_lock);
    p->fn = fn;
    p->arg = arg;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    /* contiguous slices (neighbouring tasks share data), stored with release: a claim from one sees
     * everything above */
    for (int i = 0; i < p->n_threads; i++) {
        const uint64_t first = (uint64_t)(n_tasks * i / p->n_threads), end = (uint64_t)(n_tasks * (i + 1) / p->n_threads);
        atomic_store_explicit(&p->share[i].word, end << 32 | first, memory_order_release);
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    if (p->sleepers) pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    drain(p, 0);
    /* until every task finished: a worker that claimed none is not waited for (one descheduled by
     * another thread of the process, e.g. the PLE worker, held up ~5 jobs of every 8-sequence step
     * on a 2-core host by ~20 us each) */
    for (unsigned i = 0; atomic_load_explicit(&p->done, memory_order_acquire) < n_tasks; i++) {
        if (i < 256) cpu_relax();
        else sched_yield(); /* a worker was descheduled mid-task: let it run */
    }
    pthread_mutex_unlock(&p->run_lock);
}
