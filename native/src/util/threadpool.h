/*
 * threadpool.h — the persistent worker pool every parallel kernel runs on.
 *
 * Protocol: the caller thread (holding run_lock, so one job at a time per pool) writes the
 * job (function, argument, task count), resets the task counter and `pending`, then bumps
 * `generation` with a release store, under `mu`, broadcasting if any worker sleeps.
 * Workers see the new generation either while spinning (acquire load) or after waking on
 * the condition variable; both orders make the job fields visible. Workers and the caller
 * claim task indices from one atomic counter until it passes the count; each thread then
 * decrements `pending`, and the caller returns once it reaches zero (acquire), so every
 * write a task made is visible to the caller afterwards and no worker still reads the
 * job when the next one is written.
 * Idle workers spin for STRATA_POOL_SPIN_US microseconds (a decode step issues matmuls
 * back to back: a futex wake-up per call would cost more than a small matmul), then sleep
 * on the condition variable; a sleeping worker is counted in `sleepers` under `mu`, which
 * is why the caller bumps the generation under `mu`: no wake-up is lost.
 */
#ifndef STRATA_UTIL_THREADPOOL_H
#define STRATA_UTIL_THREADPOOL_H

#include <stdint.h>

typedef struct strata_pool strata_pool;

/* fn(arg, task, thread): thread is 0..n_threads-1 (0 = caller), for per-thread scratch. */
typedef void (*strata_task_fn)(void *arg, int64_t task, int thread);

/* n_threads includes the caller; n_threads - 1 workers are started. NULL on failure. */
strata_pool *strata_pool_create(int n_threads);
void strata_pool_destroy(strata_pool *pool);
int strata_pool_n_threads(const strata_pool *pool);
/* Runs fn for task = 0..n_tasks-1 across the pool; returns when all finished.
 * pool may be NULL: runs serially on the caller. */
void strata_pool_run(strata_pool *pool, strata_task_fn fn, void *arg, int64_t n_tasks);

#endif
