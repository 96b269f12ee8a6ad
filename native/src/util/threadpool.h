/*
 * threadpool.h — the persistent worker pool every parallel kernel runs on.
 *
 * Protocol: the caller thread (holding run_lock, so one job at a time per pool) writes the
 * job (function, argument, task count), resets `done` and then each thread's slice (one word:
 * next task and end; a release store each), then bumps `generation` with a release store, under `mu`,
 * broadcasting if any worker sleeps. Workers see the new generation either while spinning
 * or after waking on the condition variable, and claim task indices from the slices
 * (acquire: a claimed task's job is visible to the thread that claimed it). Each thread adds
 * the number of tasks it ran to `done` (release) when it finds nothing left, and the caller
 * returns once `done` reaches the count (acquire): every write a task made is visible to the
 * caller afterwards. The caller does not wait for threads that claimed nothing: a worker late
 * for a job (descheduled) may still be claiming when the next job is written, and then it either
 * finds the counters spent or claims tasks of the next job, whose fields its acquire makes
 * visible; it reads a job's function and argument only after claiming one of its tasks, and
 * no job is written while a task of the previous one is unfinished.
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
