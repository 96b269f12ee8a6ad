/*
 * test_pool.c — util/threadpool.c under load: every task of every job runs exactly once, and what a task
 * wrote is visible to the caller when strata_pool_run returns. Jobs of 0, 1, a few and thousands of tasks,
 * on pools of 1 to 5 threads; back to back (workers still spinning), after pauses longer than the spin
 * (workers asleep on the condition variable), with tasks of uneven length (threads steal from each
 * other's slices); two pools driven at once from two threads; a NULL pool; and beside threads that keep
 * every core busy, so that workers are descheduled and late for jobs the others finished without them
 * (the caller does not wait for them: no thread index may then run two tasks at once). The sanitizer runs
 * (tests/test_sanitize.py: ASan+UBSan, and TSan, where a missing acquire/release pair is a report)
 * are the point of it; run plain, it checks the counts.
 */
#define _POSIX_C_SOURCE 200809L   /* nanosleep */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>   /* sysconf */

#include "check.h"
#include "util/threadpool.h"

enum { MAX_THREADS = 8 };

typedef struct {
    int64_t n;
    int32_t *ran;       /* ran[t]: times task t ran (each task writes only its own slot) */
    int32_t *thread;    /* the thread index each task saw */
    int n_threads;
    int uneven;         /* task t spins t % 7 * 50 iterations */
    _Atomic int *busy;  /* busy[i]: a task runs with thread index i (per-thread scratch is safe) */
    _Atomic int clash;  /* two tasks ran at once with one thread index */
} job;

static void task(void *arg, int64_t t, int thread) {
    job *j = arg;
    if (thread >= 0 && thread < MAX_THREADS && atomic_exchange(&j->busy[thread], 1)) atomic_store(&j->clash, 1);
    volatile int64_t x = 0;   /* a read at the end: not optimised away */
    if (j->uneven)
        for (int64_t i = 0; i < t % 7 * 50; i++) x += i;
    j->ran[t] += 1 + (x < 0);
    j->thread[t] = thread;
    if (thread >= 0 && thread < MAX_THREADS) atomic_store(&j->busy[thread], 0);
}

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* Runs `jobs` jobs of varying size on pool p; checks each one's counts right after it returns. */
static void run_jobs(strata_pool *p, int n_threads, int jobs, unsigned seed, int pauses) {
    enum { MAX_TASKS = 5000 };
    int32_t *ran = malloc(sizeof(int32_t) * MAX_TASKS), *thr = malloc(sizeof(int32_t) * MAX_TASKS);
    if (!ran || !thr) { CHECK(!"no memory"); free(ran); free(thr); return; }
    static _Thread_local _Atomic int busy[MAX_THREADS];   /* this driver's pool's (one per driving thread) */
    for (int k = 0; k < jobs; k++) {
        seed = seed * 1103515245u + 12345u;
        static const int64_t sizes[] = {0, 1, 2, 3, 7, 16, 63, 1000, MAX_TASKS};
        const int64_t n = sizes[(seed >> 16) % (sizeof sizes / sizeof sizes[0])];
        memset(ran, 0, sizeof(int32_t) * (size_t)n);
        memset(thr, 0xff, sizeof(int32_t) * (size_t)n);
        job j = {.n = n, .ran = ran, .thread = thr, .n_threads = n_threads, .uneven = (int)(seed >> 20) & 1,
                 .busy = busy};
        strata_pool_run(p, task, &j, n);
        int64_t bad = 0;
        for (int64_t t = 0; t < n; t++) bad += ran[t] != 1 || thr[t] < 0 || thr[t] >= n_threads;
        CHECK(bad == 0);
        CHECK(atomic_load(&j.clash) == 0);
        if (pauses && k % 16 == 15) sleep_us(1500);   /* past the spin: the workers sleep, then are woken */
    }
    free(ran);
    free(thr);
}

typedef struct {
    int n_threads;
    unsigned seed;
} driver;

static _Atomic int g_hog_stop;

static void *hog(void *arg) {   /* keeps a core busy until told to stop */
    (void)arg;
    volatile uint64_t x = 0;
    while (!atomic_load_explicit(&g_hog_stop, memory_order_relaxed)) x++;
    return NULL;
}

static void *drive(void *arg) {
    const driver *d = arg;
    strata_pool *p = strata_pool_create(d->n_threads);
    CHECK(p != NULL);
    if (p) {
        run_jobs(p, d->n_threads, 300, d->seed, 1);
        strata_pool_destroy(p);
    }
    return NULL;
}

int main(void) {
    for (int nt = 1; nt <= 5; nt++) {
        strata_pool *p = strata_pool_create(nt);
        CHECK(p != NULL);
        if (!p) continue;
        CHECK(strata_pool_n_threads(p) == nt);
        run_jobs(p, nt, 400, 7u + (unsigned)nt, 0);    /* back to back */
        run_jobs(p, nt, 64, 99u + (unsigned)nt, 1);    /* with pauses */
        strata_pool_destroy(p);
    }
    /* two pools at once, each driven by its own thread */
    pthread_t th[2];
    driver d[2] = {{2, 11u}, {3, 23u}};
    for (int i = 0; i < 2; i++) CHECK(pthread_create(&th[i], NULL, drive, &d[i]) == 0);
    for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
    /* more runnable threads than cores: two busy threads per core (sysconf) beside pools of 2 and 4 */
    {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        int nh = cores > 0 && cores < 8 ? (int)cores * 2 : 16;
        pthread_t hogs[16];
        int started = 0;
        for (int i = 0; i < nh; i++) started += pthread_create(&hogs[started], NULL, hog, NULL) == 0;
        for (int nt = 2; nt <= 4; nt += 2) {
            strata_pool *p = strata_pool_create(nt);
            CHECK(p != NULL);
            if (!p) continue;
            run_jobs(p, nt, 300, 41u + (unsigned)nt, 0);
            strata_pool_destroy(p);
        }
        atomic_store(&g_hog_stop, 1);
        for (int i = 0; i < started; i++) pthread_join(hogs[i], NULL);
    }
    /* no pool: serially on the caller, thread 0 */
    run_jobs(NULL, 1, 50, 5u, 0);
    strata_pool_destroy(NULL);
    if (g_failed == 0) printf("test_pool: all checks passed\n");
    return g_failed != 0;
}
