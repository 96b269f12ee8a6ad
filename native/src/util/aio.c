/*
 * aio.c — aio.h: io_uring through raw syscalls, or a pool of pread threads.
 *
 * io_uring: one ring of `depth` entries, set up once. aio_run keeps up to `depth` IORING_OP_READ
 * entries in flight: it fills free submission entries, publishes the tail (release), enters the
 * kernel to submit and wait for at least one completion, then reaps completions (acquire on the
 * completion tail, release on the head). A short read is resubmitted for the rest.
 *
 * pread pool: workers claim request indices from one counter under the mutex and read them with
 * pread (looping on short reads and EINTR); the caller takes part too and waits until every worker
 * reported its share done.
 */
#include "util/aio.h"

#include <errno.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "util/error.h"

#ifndef __NR_io_uring_setup
#define __NR_io_uring_setup 425
#endif
#ifndef __NR_io_uring_enter
#define __NR_io_uring_enter 426
#endif

enum { POOL_MAX = 8 };

struct aio_ctx {
    int backend;
    int broken;                 /* io_uring failed once: reads go through pread */
    char why[160];
    /* io_uring */
    int ring_fd;
    unsigned depth;
    void *sq_map, *cq_map;
    size_t sq_map_len, cq_map_len;
    struct io_uring_sqe *sqes;
    size_t sqes_len;
    unsigned *sq_head, *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
    struct io_uring_cqe *cqes;
    /* a started batch (aio_start): io_uring entries in flight, or the pool's job */
    aio_req *started;
    int n_started, started_inflight;
    /* pread pool */
    pthread_t th[POOL_MAX];
    int n_th;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    aio_req *job;
    int job_n, job_next, job_active;
    uint64_t job_gen;
    int stop;
};

/* ---------------------------------------------------------------- io_uring */

static int uring_setup(aio_ctx *a, unsigned depth) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    const int fd = (int)syscall(__NR_io_uring_setup, depth, &p);
    if (fd < 0) return -errno;
    a->ring_fd = fd;
    a->depth = p.sq_entries;
    a->sq_map_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    a->cq_map_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    const int single = (p.features & IORING_FEAT_SINGLE_MMAP) != 0;
    if (single && a->cq_map_len > a->sq_map_len) a->sq_map_len = a->cq_map_len;
    a->sq_map = mmap(NULL, a->sq_map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQ_RING);
    if (a->sq_map == MAP_FAILED) { a->sq_map = NULL; return -errno; }
    if (single) {
        a->cq_map = a->sq_map;
        a->cq_map_len = 0;
    } else {
        a->cq_map = mmap(NULL, a->cq_map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_CQ_RING);
        if (a->cq_map == MAP_FAILED) { a->cq_map = NULL; return -errno; }
    }
    a->sqes_len = p.sq_entries * sizeof(struct io_uring_sqe);
    a->sqes = mmap(NULL, a->sqes_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, IORING_OFF_SQES);
    if (a->sqes == MAP_FAILED) { a->sqes = NULL; return -errno; }
    char *sq = a->sq_map, *cq = a->cq_map;
    a->sq_head = (unsigned *)(sq + p.sq_off.head);
    a->sq_tail = (unsigned *)(sq + p.sq_off.tail);
    a->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    a->sq_array = (unsigned *)(sq + p.sq_off.array);
    a->cq_head = (unsigned *)(cq + p.cq_off.head);
    a->cq_tail = (unsigned *)(cq + p.cq_off.tail);
    a->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    a->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    return 0;
}

static void uring_close(aio_ctx *a) {
    if (a->sqes) munmap(a->sqes, a->sqes_len);
    if (a->cq_map && a->cq_map != a->sq_map) munmap(a->cq_map, a->cq_map_len);
    if (a->sq_map) munmap(a->sq_map, a->sq_map_len);
    if (a->ring_fd >= 0) close(a->ring_fd);
    a->sqes = NULL; a->sq_map = a->cq_map = NULL; a->ring_fd = -1;
}

/* Queues request i's remaining bytes (res holds what was read so far). */
static void uring_push(aio_ctx *a, aio_req *r, int i) {
    const unsigned tail = *a->sq_tail, idx = tail & *a->sq_mask;
    struct io_uring_sqe *e = &a->sqes[idx];
    memset(e, 0, sizeof *e);
    e->opcode = IORING_OP_READ;
    e->fd = r->fd;
    e->off = r->off + (uint64_t)r->res;
    e->addr = (uint64_t)(uintptr_t)((char *)r->buf + r->res);
    e->len = (uint32_t)(r->len - (size_t)r->res);
    e->user_data = (uint64_t)i;
    a->sq_array[idx] = idx;
    __atomic_store_n(a->sq_tail, tail + 1, __ATOMIC_RELEASE);
}

/* Reaps the completions there are: each one's bytes (or -errno) into its request; a split read is queued
 * again for the rest (entries counted into *inflight and *pushed, to be submitted). */
static void uring_reap(aio_ctx *a, aio_req *reqs, int *inflight, int *pushed) {
    unsigned head = *a->cq_head;
    const unsigned tail = __atomic_load_n(a->cq_tail, __ATOMIC_ACQUIRE);
    while (head != tail) {
        const struct io_uring_cqe *c = &a->cqes[head & *a->cq_mask];
        aio_req *r = &reqs[c->user_data];
        const int32_t res = c->res;
        head++;
        (*inflight)--;
        if (res < 0) { r->res = res; continue; }
        r->res += res;
        if (res > 0 && (size_t)r->res < r->len) {   /* a split read: the rest (a slot was just freed) */
            uring_push(a, r, (int)c->user_data);
            (*inflight)++;
            (*pushed)++;
        }
    }
    __atomic_store_n(a->cq_head, head, __ATOMIC_RELEASE);
}

/* Returns 0, or -errno when the ring failed (the caller then reads the batch again with pread). */
static int uring_run(aio_ctx *a, aio_req *reqs, int n) {
    int next = 0, inflight = 0, to_submit = 0;
    for (int i = 0; i < n; i++) reqs[i].res = 0;
    while (next < n || inflight > 0) {
        while (next < n && inflight < (int)a->depth) {
            uring_push(a, &reqs[next], next);
            next++; inflight++; to_submit++;
        }
        const long rc = syscall(__NR_io_uring_enter, a->ring_fd, (unsigned)to_submit, 1u, IORING_ENTER_GETEVENTS, NULL, 0);
        if (rc < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EBUSY) continue;
            return -errno;
        }
        to_submit -= (int)rc;
        if (to_submit < 0) to_submit = 0;
        uring_reap(a, reqs, &inflight, &to_submit);
    }
    return 0;
}

/* ---------------------------------------------------------------- pread pool */

static void pread_one(aio_req *r) {
    size_t done = 0;
    while (done < r->len) {
        const ssize_t k = pread(r->fd, (char *)r->buf + done, r->len - done, (off_t)(r->off + done));
        if (k < 0) {
            if (errno == EINTR) continue;
            r->res = -errno;
            return;
        }
        if (k == 0) break;
        done += (size_t)k;
    }
    r->res = (int64_t)done;
}

/* Claims and reads requests of the current job until none is left. Called with mu held; returns
 * with it held. */
static void pool_drain(aio_ctx *a) {
    while (a->job && a->job_next < a->job_n) {
        aio_req *r = &a->job[a->job_next++];
        pthread_mutex_unlock(&a->mu);
        pread_one(r);
        pthread_mutex_lock(&a->mu);
    }
}

static void *pool_main(void *arg) {
    aio_ctx *a = arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&a->mu);
    for (;;) {
        while (!a->stop && a->job_gen == seen) pthread_cond_wait(&a->cv_work, &a->mu);
        if (a->stop) break;
        seen = a->job_gen;
        a->job_active++;
        pool_drain(a);
        if (--a->job_active == 0) pthread_cond_signal(&a->cv_done);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}

static void pool_post(aio_ctx *a, aio_req *reqs, int n) {
    pthread_mutex_lock(&a->mu);
    a->job = reqs;
    a->job_n = n;
    a->job_next = 0;
    a->job_gen++;
    pthread_cond_broadcast(&a->cv_work);
    pthread_mutex_unlock(&a->mu);
}

/* The caller reads what no worker claimed yet, then waits for the workers' reads. */
static void pool_wait(aio_ctx *a) {
    pthread_mutex_lock(&a->mu);
    pool_drain(a);
    while (a->job_active > 0) pthread_cond_wait(&a->cv_done, &a->mu);
    a->job = NULL;
    pthread_mutex_unlock(&a->mu);
}

static void pool_run(aio_ctx *a, aio_req *reqs, int n) {
    pool_post(a, reqs, n);
    pool_wait(a);
}

/* ---------------------------------------------------------------- the interface */

strata_status aio_create(int backend, int depth, aio_ctx **out) {
    *out = NULL;
    if (depth <= 0) depth = 32;
    if (depth > 4096) depth = 4096;
    aio_ctx *a = calloc(1, sizeof *a);
    if (!a) return strata_fail(STRATA_ERR_NOMEM, "reads: no memory");
    a->ring_fd = -1;
    if (backend != AIO_PREAD) {
        const int err = uring_setup(a, (unsigned)depth);
        if (!err) {
            a->backend = AIO_URING;
            snprintf(a->why, sizeof a->why, "io_uring, %u reads in flight", a->depth);
            *out = a;
            return STRATA_OK;
        }
        uring_close(a);
        if (backend == AIO_URING) {
            free(a);
            return strata_fail(STRATA_ERR_UNSUPPORTED, "io_uring is not available here (%s)", strerror(-err));
        }
        snprintf(a->why, sizeof a->why, "pread threads: io_uring refused (%s)", strerror(-err));
    } else {
        snprintf(a->why, sizeof a->why, "pread threads (asked for)");
    }
    a->backend = AIO_PREAD;
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv_work, NULL);
    pthread_cond_init(&a->cv_done, NULL);
    const int want = depth < POOL_MAX ? depth : POOL_MAX;
    for (int i = 0; i < want - 1; i++) {      /* the caller reads too */
        if (pthread_create(&a->th[a->n_th], NULL, pool_main, a)) break;
        a->n_th++;
    }
    *out = a;
    return STRATA_OK;
}

void aio_free(aio_ctx *a) {
    if (!a) return;
    aio_finish(a);
    if (a->backend == AIO_URING) uring_close(a);
    else {
        pthread_mutex_lock(&a->mu);
        a->stop = 1;
        pthread_cond_broadcast(&a->cv_work);
        pthread_mutex_unlock(&a->mu);
        for (int i = 0; i < a->n_th; i++) pthread_join(a->th[i], NULL);
        pthread_mutex_destroy(&a->mu);
        pthread_cond_destroy(&a->cv_work);
        pthread_cond_destroy(&a->cv_done);
    }
    free(a);
}

const char *aio_backend(const aio_ctx *a) { return a->backend == AIO_URING ? "io_uring" : "pread"; }
const char *aio_why(const aio_ctx *a) { return a->why; }

int aio_depth(const aio_ctx *a) { return a->backend == AIO_URING ? (int)a->depth : a->n_th + 1; }

void aio_start(aio_ctx *a, aio_req *reqs, int n) {
    aio_finish(a);
    if (n <= 0) return;
    if (n > aio_depth(a)) n = aio_depth(a);
    a->started = reqs;
    a->n_started = n;
    for (int i = 0; i < n; i++) reqs[i].res = 0;
    if (a->backend == AIO_URING && !a->broken) {
        for (int i = 0; i < n; i++) uring_push(a, &reqs[i], i);
        a->started_inflight = n;
        int left = n;
        while (left > 0) {
            const long rc = syscall(__NR_io_uring_enter, a->ring_fd, (unsigned)left, 0u, 0u, NULL, 0);
            if (rc < 0 && (errno == EINTR || errno == EAGAIN || errno == EBUSY)) continue;
            if (rc <= 0) break;                      /* aio_finish reads what did not go in */
            left -= (int)rc;
        }
        if (left > 0) a->started_inflight = -left;   /* marks a failed submission for aio_finish */
    } else if (a->backend == AIO_URING) {
        for (int i = 0; i < n; i++) pread_one(&reqs[i]);   /* the ring broke once: at once, on the caller */
        a->started = NULL;
    } else {
        pool_post(a, reqs, n);
    }
}

void aio_finish(aio_ctx *a) {
    if (!a->started) return;
    aio_req *reqs = a->started;
    const int n = a->n_started;
    a->started = NULL;
    if (a->backend == AIO_PREAD) { pool_wait(a); return; }
    if (a->started_inflight < 0) {
        /* the kernel took only part of the batch: stop using the ring, read the batch again whole */
        a->broken = 1;
        snprintf(a->why, sizeof a->why, "pread on the caller: io_uring_enter refused a prefetch batch");
        for (int i = 0; i < n; i++) pread_one(&reqs[i]);
        return;
    }
    int inflight = a->started_inflight;
    while (inflight > 0) {
        const long rc = syscall(__NR_io_uring_enter, a->ring_fd, 0u, 1u, IORING_ENTER_GETEVENTS, NULL, 0);
        if (rc < 0 && errno != EINTR && errno != EAGAIN && errno != EBUSY) {
            a->broken = 1;
            for (int i = 0; i < n; i++) pread_one(&reqs[i]);
            return;
        }
        int pushed = 0;
        uring_reap(a, reqs, &inflight, &pushed);
        while (pushed > 0) {
            const long k = syscall(__NR_io_uring_enter, a->ring_fd, (unsigned)pushed, 0u, 0u, NULL, 0);
            if (k < 0 && (errno == EINTR || errno == EAGAIN || errno == EBUSY)) continue;
            if (k <= 0) {           /* the rest cannot be submitted: the pread path from now on */
                a->broken = 1;
                for (int i = 0; i < n; i++) pread_one(&reqs[i]);
                return;
            }
            pushed -= (int)k;
        }
    }
}

void aio_run(aio_ctx *a, aio_req *reqs, int n) {
    aio_finish(a);
    if (n <= 0) return;
    if (a->backend == AIO_URING && !a->broken) {
        const int err = uring_run(a, reqs, n);
        if (!err) return;
        /* the ring failed mid-batch: from now on the pread path (reads are idempotent, so the batch
         * is read again whole) */
        a->broken = 1;
        snprintf(a->why, sizeof a->why, "pread on the caller: io_uring_enter failed (%s)", strerror(-err));
    }
    if (a->backend == AIO_URING) for (int i = 0; i < n; i++) pread_one(&reqs[i]);
    else pool_run(a, reqs, n);
}
