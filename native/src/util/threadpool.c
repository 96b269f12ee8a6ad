/* threadpool.c — see threadpool.h for the protocol. */
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct strata_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    pthread_mutex_t run_lock;   /* one job at a time */
    /* the current job, written by the caller under mu before generation++ */
    strata_task_fn fn;
    void *arg;
    int64_t n_tasks;
    uint64_t generation;        /* under mu */
    int stop;                   /* under mu */
    _Atomic int64_t next;       /* next task index to claim */
    _Atomic int pending;        /* threads still working on the job (caller included) */
};

typedef struct { strata_pool *pool; int index; } worker_arg;

static void drain(strata_pool *p, int thread) {
    for (;;) {
        const int64_t t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= p->n_tasks) break;
        p->fn(p->arg, t, thread);
    }
    atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel);
}

static void *worker_main(void *varg) {
    worker_arg *wa = varg;
    strata_pool *p = wa->pool;
    const int index = wa->index;
    free(wa);
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop) { pthread_mutex_unlock(&p->mu); return NULL; }
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        drain(p, index);
    }
}

strata_pool *strata_pool_create(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    strata_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = n_threads;
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
    p->stop = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->run_lock);
    free(p);
}

int strata_pool_n_threads(const strata_pool *p) { return p ? p->n_threads : 1; }

void strata_pool_run(strata_pool *p, strata_task_fn fn, void *arg, int64_t n_tasks) {
    if (n_tasks <= 0) return;
    if (!p || p->n_threads == 1 || n_tasks == 1) {
        for (int64_t t = 0; t < n_tasks; t++) fn(arg, t, 0);
        return;
    }
    pthread_mutex_lock(&p->run_lock);
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->pending, p->n_threads, memory_order_relaxed);
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    drain(p, 0);
    while (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) {
        /* the tail is short (at most one task per worker): spin politely */
#if defined(__x86_64__)
        __builtin_ia32_pause();
#endif
    }
    pthread_mutex_unlock(&p->run_lock);
}
