/*
 * aio.h — batched positional reads: io_uring (raw syscalls: no liburing needed) with up to `depth`
 * reads in flight, or, where the kernel refuses io_uring (old kernel, io_uring_disabled, seccomp), a
 * pool of pread threads. Used by the expert store (moe/xstore.c) for O_DIRECT reads of experts.
 *
 * One batch at a time per context: aio_run is called by one thread (the store's lock holder), and
 * returns once every read of the batch completed. A read that returns fewer bytes than asked but more
 * than zero is continued from where it stopped (the kernel may split a read); each request's `res`
 * ends as the bytes read in all, or -errno.
 */
#ifndef STRATA_UTIL_AIO_H
#define STRATA_UTIL_AIO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "strata.h"

typedef struct aio_ctx aio_ctx;

typedef struct {
    int fd;
    uint64_t off;
    size_t len;
    void *buf;
    int64_t res;        /* out: bytes read (len unless the file ended), or -errno */
} aio_req;

enum { AIO_AUTO = 0, AIO_URING = 1, AIO_PREAD = 2 };

/* backend AIO_AUTO tries io_uring, then pread threads; AIO_URING fails when io_uring is refused.
 * depth: reads in flight (io_uring queue entries, or pread threads: min(depth, 8)). */
strata_status aio_create(int backend, int depth, aio_ctx **out);
void aio_free(aio_ctx *a);
/* "io_uring" or "pread", and why (one line: the fallback's reason). */
const char *aio_backend(const aio_ctx *a);
const char *aio_why(const aio_ctx *a);
/* Runs every read and waits for all (a started batch is finished first). */
void aio_run(aio_ctx *a, aio_req *reqs, int n);
/* Starts a batch of at most aio_depth() reads and returns at once (prefetch); reqs must stay valid until
 * aio_finish. One started batch at a time: a second start finishes the first. */
void aio_start(aio_ctx *a, aio_req *reqs, int n);
/* Waits until the started batch completed (at once when none is). */
void aio_finish(aio_ctx *a);
int aio_depth(const aio_ctx *a);

#endif
