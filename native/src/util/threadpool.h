/*
 * threadpool.h — the persistent worker pool every parallel kernel runs on.
 *
 * Protocol: the caller thread publishes a job (function, argument, task count) under the
 * mutex, bumps `generation` and broadcasts. Workers and the caller then claim task indices
 * from one atomic counter until it passes the count; each finisher decrements `pending`;
 * the caller returns once `pending` reaches zero, so every write a task made is visible to
 * the caller afterwards (acquire on pending). One job runs at a time per pool; jobs from
 * two threads on one pool are serialised by `run_lock`. Workers sleep on the condition
 * variable between jobs (no busy wait), and exit when `stop` is set.
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
