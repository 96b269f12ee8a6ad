/*
 * ple_table.c — the PLE table access layer and its gather worker; ple.h holds the protocol.
 */
#include "ple.h"

#include <errno.h>
#include <linux/aio_abi.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "util/error.h"
#include "util/trace.h"

ple_params ple_default_params(void) {
    ple_params p;
    memset(&p, 0, sizeof p);
    p.madv_random = 1;
    p.prefetch = 1;
    p.step_timeout_s = 300.0;
    p.test_stall_ms = 0;
    p.test_stall_at = 0;
    p.cache_bytes = 64ull << 20;
    return p;
}

double ple_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------- hashing */

void ple_hash_rows(const ple_hash *h, const int32_t *hist, int64_t L, uint64_t *rows) {
    const int64_t n = h->n, NH = (int64_t)(n - 1) * h->heads_per;
    for (int64_t t = 0; t < L; t++) {
        const int64_t p = n - 1 + t;
        uint64_t sh[PLE_MAX_NGRAM];
        sh[0] = (uint64_t)hist[p];
        int cut = 0;
        for (int64_t k = 1; k < n; k++) {
            const uint64_t tok = (uint64_t)hist[p - k];
            sh[k] = cut ? h->eos : tok;
            if (tok == h->eos) cut = 1;
        }
        uint64_t mix = sh[0] * h->mult[0];
        for (int64_t order = 2; order <= n; order++) {
            mix ^= sh[order - 1] * h->mult[order - 1];
            for (int64_t g = 0; g < h->heads_per; g++) {
                const int64_t head = (order - 2) * h->heads_per + g;
                rows[t * NH + head] = mix % h->size[head] + h->off[head];
            }
        }
    }
}

/* ---------------------------------------------------------------- the table */

int ple_backing_file(const void *addr, char *path, size_t n, uint64_t *file_off) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return 0;
    char line[4096];
    int found = 0;
    const uintptr_t a = (uintptr_t)addr;
    while (fgets(line, sizeof line, f)) {
        uintptr_t lo, hi;
        unsigned long long off;
        int pos = 0;
        if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %*s %llx %*s %*s%n", &lo, &hi, &off, &pos) < 3) continue;
        if (a < lo || a >= hi) continue;
        char *p = line + pos;
        while (*p == ' ' || *p == '\t') p++;
        size_t len = strcspn(p, "\n");
        if (len == 0 || *p != '/') break;            /* anonymous or special mapping */
        const char *del = " (deleted)";
        if (len > strlen(del) && !memcmp(p + len - strlen(del), del, strlen(del))) break;
        if (len >= n) break;
        memcpy(path, p, len);
        path[len] = 0;
        *file_off = (uint64_t)off + (uint64_t)(a - lo);
        found = 1;
        break;
    }
    fclose(f);
    return found;
}

/* Page-aligned span of the rows in memory. */
static void rows_span(const ple_table *t, uintptr_t *lo, size_t *len) {
    const uintptr_t a = (uintptr_t)t->rows, e = a + (uintptr_t)(t->row_bytes * (size_t)t->n_rows);
    *lo = a & ~(uintptr_t)(PLE_PAGE - 1);
    *len = (size_t)(((e + PLE_PAGE - 1) & ~(uintptr_t)(PLE_PAGE - 1)) - *lo);
}

static uint64_t probe_rng(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Direct mode: the O_DIRECT descriptor for reads without prefetch (ple.h). The alignment is found by
 * reading: 512 bytes at offset 0 into a 4 KiB-aligned buffer, then 4096 if the device refuses 512.
 * Appends what happened to t->why. */
static void open_direct(ple_table *t) {
    t->dfd = -1;
    t->dio_align = 0;
    if (t->mode != PLE_MODE_DIRECT || !t->path[0]) return;
    const size_t w = strlen(t->why);
    const int fd = open(t->path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (fd < 0) {
        snprintf(t->why + w, sizeof t->why - w, "; O_DIRECT refused (%s): buffered pread", strerror(errno));
        return;
    }
    void *buf = NULL;
    if (posix_memalign(&buf, PLE_PAGE, PLE_PAGE) != 0) {
        close(fd);
        snprintf(t->why + w, sizeof t->why - w, "; O_DIRECT unused (no memory): buffered pread");
        return;
    }
    const unsigned tries[2] = {PLE_SECTOR, PLE_PAGE};
    int err = 0;
    for (int k = 0; k < 2 && !t->dio_align; k++) {
        const ssize_t r = pread(fd, buf, tries[k], 0);
        if (r >= 0) t->dio_align = tries[k];
        else err = errno;
    }
    free(buf);
    if (!t->dio_align) {
        close(fd);
        snprintf(t->why + w, sizeof t->why - w, "; O_DIRECT reads fail (%s): buffered pread", strerror(err));
        return;
    }
    t->dfd = fd;
    snprintf(t->why + w, sizeof t->why - w, "; decode steps O_DIRECT, %u-byte sectors", t->dio_align);
}

/* Settles the mode: applies MADV_RANDOM / FADV_RANDOM and, for auto, runs the probe. */
static void settle(ple_table *t, int mode, const ple_params *p) {
    const ple_params dflt = ple_default_params();
    if (!p) p = &dflt;
    const int want_random = p->madv_random != 0;    /* benchmark knob: 0 = kernel default readahead */
    t->prefetch = p->prefetch != 0;
    if (t->fd >= 0) posix_fadvise(t->fd, 0, 0, POSIX_FADV_RANDOM);
    char madv_err[96] = "";
    if (want_random && t->n_rows > 0) {
        uintptr_t lo;
        size_t len;
        rows_span(t, &lo, &len);
        if (madvise((void *)lo, len, MADV_RANDOM) == 0) t->madv_random = 1;
        else snprintf(madv_err, sizeof madv_err, "madvise(MADV_RANDOM) failed: %s", strerror(errno));
    }
    const char *ra = t->madv_random ? "MADV_RANDOM" : want_random ? madv_err : "default readahead (STRATA_PLE_MADV_RANDOM=0)";
    if (mode == PLE_MODE_MMAP || mode == PLE_MODE_DIRECT) {
        if (mode == PLE_MODE_DIRECT && t->fd < 0) {
            t->mode = PLE_MODE_MMAP;
            snprintf(t->why, sizeof t->why, "mmap (direct was asked for, but the table is not backed by a file; %s)", ra);
            return;
        }
        t->mode = mode;
        snprintf(t->why, sizeof t->why, "%s (asked for; %s)", mode == PLE_MODE_MMAP ? "mmap" : "direct pread",
                 mode == PLE_MODE_MMAP ? ra : "POSIX_FADV_RANDOM");
        return;
    }
    if (t->fd < 0 || t->n_rows <= 0) {
        t->mode = PLE_MODE_MMAP;
        snprintf(t->why, sizeof t->why, "mmap (auto: %s; %s)", t->fd < 0 ? "the table is in memory, no file to pread"
                 : "an empty table", ra);
        return;
    }
    if (!t->madv_random && want_random) {
        t->mode = PLE_MODE_DIRECT;
        snprintf(t->why, sizeof t->why, "direct pread (auto: %s, a fault would read the readahead window)", madv_err);
        return;
    }
    /* The probe: 8 random rows read each way (different rows, so neither warms the other). A
     * fault costs a trap and a page-table update on top of the read; pread costs a copy. mmap is
     * kept unless faults are clearly slower (> 2x and > 50 µs a row): file-backed pages cost no
     * anonymous memory and no syscall per row once cached. */
    uint64_t seed = (uint64_t)t->n_rows * 0x2545F4914F6CDD1Dull + 7;
    uint8_t tmp[4096];
    double t_map = 0, t_rd = 0;
    volatile uint8_t sink = 0;
    const int K = 8;
    int ok = t->row_bytes <= sizeof tmp;
    for (int k = 0; k < K && ok; k++) {
        const uint64_t r1 = probe_rng(&seed) % (uint64_t)t->n_rows, r2 = probe_rng(&seed) % (uint64_t)t->n_rows;
        double t0 = ple_now();
        const uint8_t *p = t->rows + r1 * t->row_bytes;
        for (size_t i = 0; i < t->row_bytes; i += 64) sink ^= p[i];
        sink ^= p[t->row_bytes - 1];
        double t1 = ple_now();
        if (pread(t->fd, tmp, t->row_bytes, (off_t)(t->file_off + r2 * t->row_bytes)) != (ssize_t)t->row_bytes) ok = 0;
        double t2 = ple_now();
        t_map += t1 - t0;
        t_rd += t2 - t1;
    }
    (void)sink;
    const double um = 1e6 * t_map / K, ur = 1e6 * t_rd / K;
    if (ok && um > 2.0 * ur && um > 50.0) {
        t->mode = PLE_MODE_DIRECT;
        snprintf(t->why, sizeof t->why, "direct pread (auto: probe of %d rows: fault %.1f us/row, pread %.1f us/row)", K, um, ur);
    } else {
        t->mode = PLE_MODE_MMAP;
        snprintf(t->why, sizeof t->why, "mmap (auto: probe of %d rows: fault %.1f us/row, pread %.1f us/row%s; %s)", K, um, ur,
                 ok ? "" : ", pread failed", ra);
    }
}

strata_status ple_table_open_mapped(ple_table *t, const void *rows, size_t row_bytes, int64_t n_rows, int mode,
                                    const ple_params *p) {
    memset(t, 0, sizeof *t);
    t->fd = -1;
    t->dfd = -1;
    t->rows = rows;
    t->row_bytes = row_bytes;
    t->n_rows = n_rows;
    uint64_t off = 0;
    if (ple_backing_file(rows, t->path, sizeof t->path, &off)) {
        t->fd = open(t->path, O_RDONLY | O_CLOEXEC);
        t->file_off = off;
        /* the descriptor must read what the mapping holds */
        uint8_t a[64];
        const size_t k = row_bytes < sizeof a ? row_bytes : sizeof a;
        if (t->fd >= 0 && (pread(t->fd, a, k, (off_t)off) != (ssize_t)k || memcmp(a, rows, k))) {
            close(t->fd);
            t->fd = -1;
        }
        if (t->fd < 0) t->path[0] = 0;
    }
    settle(t, mode, p);
    open_direct(t);
    return STRATA_OK;
}

strata_status ple_table_open_file(ple_table *t, const char *path, size_t row_bytes, int64_t n_rows, int mode,
                                  const ple_params *p) {
    memset(t, 0, sizeof *t);
    t->fd = -1;
    t->dfd = -1;
    if (strlen(path) >= sizeof t->path)
        return strata_fail(STRATA_ERR_INVALID_ARG, "PLE table path is too long: %s", path);
    snprintf(t->path, sizeof t->path, "%s", path);
    t->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (t->fd < 0) return strata_fail(STRATA_ERR_IO, "PLE table %s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(t->fd, &st) != 0) {
        strata_status rc = strata_fail(STRATA_ERR_IO, "PLE table %s: cannot stat: %s", path, strerror(errno));
        ple_table_close(t);
        return rc;
    }
    const uint64_t need = (uint64_t)row_bytes * (uint64_t)n_rows;
    if ((uint64_t)st.st_size != need) {
        strata_status rc = strata_fail(STRATA_ERR_FORMAT,
                                       "PLE table %s is %llu bytes but its sidecar describes %lld rows of %zu bytes = %llu bytes "
                                       "(truncated or from another checkpoint); rebuild it with `strata pack-ple`",
                                       path, (unsigned long long)st.st_size, (long long)n_rows, row_bytes, (unsigned long long)need);
        ple_table_close(t);
        return rc;
    }
    void *map = mmap(NULL, (size_t)need, PROT_READ, MAP_SHARED, t->fd, 0);
    if (map == MAP_FAILED) {
        strata_status rc = strata_fail(STRATA_ERR_IO, "PLE table %s: mmap failed: %s", path, strerror(errno));
        ple_table_close(t);
        return rc;
    }
    t->own_map = map;
    t->own_len = (size_t)need;
    t->rows = map;
    t->row_bytes = row_bytes;
    t->n_rows = n_rows;
    t->file_off = 0;
    settle(t, mode, p);
    open_direct(t);
    return STRATA_OK;
}

void ple_table_close(ple_table *t) {
    if (t->own_map) munmap(t->own_map, t->own_len);
    if (t->fd >= 0) close(t->fd);
    if (t->dfd >= 0) close(t->dfd);
    t->own_map = NULL;
    t->fd = t->dfd = -1;
}

static int cmp_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

uint64_t ple_prefetch(const ple_table *t, const uint64_t *rows, int64_t n) {
    if (n <= 0) return 0;
    uint64_t *pg = malloc((size_t)n * 2 * sizeof(uint64_t));
    if (!pg) return 0;                                  /* advisory: the gather faults instead */
    const uint64_t base = t->fd >= 0 ? t->file_off : (uint64_t)(uintptr_t)t->rows;
    for (int64_t i = 0; i < n; i++) {
        const uint64_t a = base + rows[i] * t->row_bytes;
        pg[2 * i] = a / PLE_PAGE;
        pg[2 * i + 1] = (a + t->row_bytes - 1) / PLE_PAGE;
    }
    qsort(pg, (size_t)n * 2, sizeof(uint64_t), cmp_u64);
    int64_t u = 0;
    for (int64_t i = 0; i < 2 * n; i++)
        if (u == 0 || pg[i] != pg[u - 1]) pg[u++] = pg[i];
    for (int64_t i = 0; i < u;) {
        int64_t j = i + 1;
        while (j < u && pg[j] == pg[j - 1] + 1) j++;
        const uint64_t off = pg[i] * PLE_PAGE, len = (uint64_t)(j - i) * PLE_PAGE;
        if (t->fd >= 0) posix_fadvise(t->fd, (off_t)off, (off_t)len, POSIX_FADV_WILLNEED);
        else madvise((void *)(uintptr_t)off, (size_t)len, MADV_WILLNEED);
        i = j;
    }
    free(pg);
    return (uint64_t)u;
}

strata_status ple_gather(const ple_table *t, const uint64_t *rows, int64_t n, uint8_t *dst) {
    const size_t rb = t->row_bytes;
    if (t->mode == PLE_MODE_DIRECT) {
        for (int64_t i = 0; i < n; i++) {
            size_t got = 0;
            while (got < rb) {
                const ssize_t k = pread(t->fd, dst + (size_t)i * rb + got, rb - got, (off_t)(t->file_off + rows[i] * rb + got));
                if (k < 0 && errno == EINTR) continue;
                if (k <= 0)
                    return strata_fail(STRATA_ERR_IO, "PLE table %s: pread of row %llu failed: %s", t->path,
                                       (unsigned long long)rows[i], k < 0 ? strerror(errno) : "end of file");
                got += (size_t)k;
            }
        }
        return STRATA_OK;
    }
    for (int64_t i = 0; i < n; i++) memcpy(dst + (size_t)i * rb, t->rows + rows[i] * rb, rb);
    return STRATA_OK;
}

static int cmp_span(const void *a, const void *b) {
    const ple_span *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* ---------------------------------------------------------------- O_DIRECT reads, in flight together
 * A token's 16 rows lie in ~16 unrelated places: read one after the other, their latencies add up
 * (on this VM's virtio disk ~0.5-1 ms each). Linux native AIO (io_submit) is truly asynchronous on
 * an O_DIRECT descriptor, so the runs of a step are submitted together, up to PLE_AIO_DEPTH at a time,
 * and the step waits about one read's latency. Where io_setup fails (aio-max-nr reached, no AIO in
 * the kernel) the reads stay one by one; results are the same. */
struct ple_aio {
    aio_context_t ctx;
    struct iocb cb[PLE_AIO_DEPTH];
    struct iocb *cbp[PLE_AIO_DEPTH];
    struct io_event ev[PLE_AIO_DEPTH];
    struct { uint64_t s0; size_t len, at, got; int64_t k, j; } run[PLE_AIO_DEPTH];
};

ple_aio *ple_aio_open(void) {
    ple_aio *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    if (syscall(SYS_io_setup, PLE_AIO_DEPTH, &a->ctx) != 0) {
        free(a);
        return NULL;
    }
    return a;
}

void ple_aio_close(ple_aio *a) {
    if (!a) return;
    syscall(SYS_io_destroy, a->ctx);
    free(a);
}

/* One blocking read of a run (the path without AIO, and for runs io_submit did not take). */
static ssize_t read_run(int fd, uint8_t *buf, size_t len, uint64_t off, size_t A) {
    size_t got = 0;
    while (got < len) {
        const ssize_t r = pread(fd, buf + got, len - got, (off_t)(off + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -errno;
        if (r == 0) break;                               /* end of file: the last sector is short */
        got += (size_t)r;
        if (got % A) break;
    }
    return (ssize_t)got;
}

strata_status ple_read_direct(const ple_table *t, const uint64_t *rows, const int64_t *idx, int64_t n, uint8_t *dst,
                              uint8_t *bounce, size_t bounce_len, ple_span *sc, ple_aio *aio, uint64_t *req_bytes) {
    const uint64_t A = t->dio_align, rb = t->row_bytes;
    *req_bytes = 0;
    for (int64_t k = 0; k < n; k++) {
        sc[k].lo = t->file_off + rows[idx[k]] * rb;      /* byte offset; sorted, then grouped into runs */
        sc[k].i = idx[k];
    }
    qsort(sc, (size_t)n, sizeof *sc, cmp_span);
    struct ple_aio local;                                /* the run table when there is no AIO context */
    struct ple_aio *q = aio ? aio : &local;
    for (int64_t k = 0; k < n;) {
        /* a batch: runs of touching sectors, each at most bounce_len bytes, side by side in the bounce buffer */
        int nb = 0;
        size_t used = 0;
        while (k < n && nb < PLE_AIO_DEPTH) {
            const uint64_t s0 = sc[k].lo / A;
            uint64_t s1 = (sc[k].lo + rb - 1) / A;
            int64_t j = k + 1;
            while (j < n) {
                const uint64_t lo = sc[j].lo / A, hi = (sc[j].lo + rb - 1) / A;
                if (lo > s1 + 1 || (hi + 1 - s0) * A > bounce_len) break;
                if (hi > s1) s1 = hi;
                j++;
            }
            const size_t len = (size_t)((s1 + 1 - s0) * A);
            if (used + len > bounce_len) break;          /* the next batch */
            q->run[nb].s0 = s0;
            q->run[nb].len = len;
            q->run[nb].at = used;
            q->run[nb].got = 0;
            q->run[nb].k = k;
            q->run[nb].j = j;
            used += len;
            *req_bytes += len;
            nb++;
            k = j;
        }
        int sub = 0;
        if (aio && nb > 1) {
            for (int b = 0; b < nb; b++) {
                struct iocb *cb = &q->cb[b];
                memset(cb, 0, sizeof *cb);
                cb->aio_fildes = (uint32_t)t->dfd;
                cb->aio_lio_opcode = IOCB_CMD_PREAD;
                cb->aio_buf = (uint64_t)(uintptr_t)(bounce + q->run[b].at);
                cb->aio_nbytes = q->run[b].len;
                cb->aio_offset = (int64_t)(q->run[b].s0 * A);
                cb->aio_data = (uint64_t)b;
                q->cbp[b] = cb;
            }
            while (sub < nb) {
                const long r = syscall(SYS_io_submit, q->ctx, (long)(nb - sub), q->cbp + sub);
                if (r < 0 && errno == EINTR) continue;
                if (r <= 0) break;                       /* the rest are read one by one below */
                sub += (int)r;
            }
            for (int got = 0; got < sub;) {
                const long r = syscall(SYS_io_getevents, q->ctx, (long)(sub - got), (long)(sub - got), q->ev + got, NULL);
                if (r < 0 && errno == EINTR) continue;
                if (r < 0)
                    return strata_fail(STRATA_ERR_IO, "PLE table %s: waiting for O_DIRECT reads failed: %s", t->path,
                                       strerror(errno));
                got += (int)r;
            }
            for (int e = 0; e < sub; e++) {
                const int b = (int)q->ev[e].data;
                if (q->ev[e].res < 0)
                    return strata_fail(STRATA_ERR_IO, "PLE table %s: O_DIRECT read of %zu bytes at %llu failed: %s",
                                       t->path, q->run[b].len, (unsigned long long)(q->run[b].s0 * A),
                                       strerror((int)-q->ev[e].res));
                q->run[b].got = (size_t)q->ev[e].res;
            }
        }
        for (int b = sub; b < nb; b++) {
            const ssize_t r = read_run(t->dfd, bounce + q->run[b].at, q->run[b].len, q->run[b].s0 * A, (size_t)A);
            if (r < 0)
                return strata_fail(STRATA_ERR_IO, "PLE table %s: O_DIRECT read of %zu bytes at %llu failed: %s", t->path,
                                   q->run[b].len, (unsigned long long)(q->run[b].s0 * A), strerror((int)-r));
            q->run[b].got = (size_t)r;
        }
        for (int b = 0; b < nb; b++)
            for (int64_t x = q->run[b].k; x < q->run[b].j; x++) {
                const uint64_t at = sc[x].lo - q->run[b].s0 * A;
                if (at + rb > q->run[b].got)
                    return strata_fail(STRATA_ERR_IO, "PLE table %s: O_DIRECT read of row %llu came back short (%zu bytes)",
                                       t->path, (unsigned long long)rows[sc[x].i], q->run[b].got);
                memcpy(dst + (size_t)sc[x].i * rb, bounce + q->run[b].at + at, rb);
            }
    }
    return STRATA_OK;
}

void ple_floors(const ple_table *t, const uint64_t *rows, const int64_t *idx, int64_t n, ple_span *sc, uint64_t *pages,
                uint64_t *sectors) {
    *pages = *sectors = 0;
    if (n <= 0) return;
    const uint64_t base = t->fd >= 0 ? t->file_off : (uint64_t)(uintptr_t)t->rows;
    const uint64_t per = PLE_PAGE / PLE_SECTOR;
    for (int64_t k = 0; k < n; k++) {                    /* each row's first and last sector */
        const uint64_t a = base + rows[idx ? idx[k] : k] * t->row_bytes;
        sc[k].lo = a / PLE_SECTOR;
        sc[k].i = (int64_t)((a + t->row_bytes - 1) / PLE_SECTOR);
    }
    qsort(sc, (size_t)n, sizeof *sc, cmp_span);
    /* the union of the intervals, in sectors and in pages (a page is `per` whole sectors, so the pages of
     * the sorted sector intervals are sorted too) */
    uint64_t s_end = 0, p_end = 0;
    for (int64_t k = 0; k < n; k++) {
        const uint64_t lo = sc[k].lo, hi = (uint64_t)sc[k].i, plo = lo / per, phi = hi / per;
        if (k == 0 || lo > s_end) { *sectors += hi - lo + 1; s_end = hi; }
        else if (hi > s_end) { *sectors += hi - s_end; s_end = hi; }
        if (k == 0 || plo > p_end) { *pages += phi - plo + 1; p_end = phi; }
        else if (phi > p_end) { *pages += phi - p_end; p_end = phi; }
    }
}

strata_status ple_resident(const ple_table *t, uint64_t *resident, uint64_t *total) {
    uintptr_t lo;
    size_t len;
    rows_span(t, &lo, &len);
    const size_t np = len / PLE_PAGE;
    *total = np;
    *resident = 0;
    if (np == 0) return STRATA_OK;
    const size_t chunk = 1 << 20;                     /* pages per mincore call: 1 MiB of vector */
    unsigned char *vec = malloc(chunk);
    if (!vec) return strata_fail(STRATA_ERR_NOMEM, "PLE: no memory for the mincore vector");
    for (size_t p = 0; p < np; p += chunk) {
        const size_t k = np - p < chunk ? np - p : chunk;
        if (mincore((void *)(lo + p * PLE_PAGE), k * PLE_PAGE, vec) != 0) {
            free(vec);
            return strata_fail(STRATA_ERR_IO, "PLE: mincore failed: %s", strerror(errno));
        }
        for (size_t i = 0; i < k; i++) *resident += vec[i] & 1;
    }
    free(vec);
    return STRATA_OK;
}

/* ---------------------------------------------------------------- NVFP4 packed rows */

static float e4m3(uint8_t b) {
    const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    float v;
    if (e == 15 && m == 7) v = NAN;
    else if (e == 0) v = ldexpf((float)m / 8.0f, -6);
    else v = ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return s ? -v : v;
}

static const float E2M1[16] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

void ple_nvfp4_row(const uint8_t *row, float *out, int64_t dim, float global_scale) {
    const uint8_t *sc = row + dim / 2;
    for (int64_t b = 0; b < dim / 16; b++) {
        const float d = e4m3(sc[b]);
        for (int64_t j = 0; j < 16; j += 2) {
            const uint8_t c = row[(b * 16 + j) / 2];
            out[b * 16 + j] = (E2M1[c & 15] * d) * global_scale;
            out[b * 16 + j + 1] = (E2M1[c >> 4] * d) * global_scale;
        }
    }
}

/* ---------------------------------------------------------------- sidecar JSON (flat object) */

static const char *json_value(const char *json, const char *key) {
    char pat[160];
    snprintf(pat, sizeof pat, "\"%s\"", key);
    const char *p = json;
    while ((p = strstr(p, pat))) {
        const char *q = p + strlen(pat);
        while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r') q++;
        if (*q == ':') {
            q++;
            while (*q == ' ' || *q == '\t' || *q == '\n' || *q == '\r') q++;
            return q;
        }
        p = q;
    }
    return NULL;
}

int ple_json_number(const char *json, const char *key, double *out) {
    const char *v = json_value(json, key);
    if (!v) return 0;
    char *end;
    errno = 0;
    const double x = strtod(v, &end);
    if (end == v || errno) return 0;
    *out = x;
    return 1;
}

int ple_json_string(const char *json, const char *key, char *out, size_t n) {
    const char *v = json_value(json, key);
    if (!v || *v != '"') return 0;
    v++;
    size_t k = 0;
    for (; *v && *v != '"'; v++) {
        char c = *v;
        if (c == '\\') {                               /* keep the escaped character (paths: \\ and \") */
            v++;
            if (!*v) return 0;
            c = *v == 'n' ? '\n' : *v == 't' ? '\t' : *v;
        }
        if (k + 1 >= n) return 0;
        out[k++] = c;
    }
    if (*v != '"') return 0;
    out[k] = 0;
    return 1;
}

int64_t ple_json_numbers(const char *json, const char *key, double *out, int64_t max) {
    const char *v = json_value(json, key);
    if (!v || *v != '[') return -1;
    v++;
    int64_t n = 0;
    for (;;) {
        while (*v == ' ' || *v == '\t' || *v == '\n' || *v == '\r') v++;
        if (*v == ']') return n;
        char *end;
        errno = 0;
        const double x = strtod(v, &end);
        if (end == v || errno || n >= max) return -1;
        out[n++] = x;
        v = end;
        while (*v == ' ' || *v == '\t' || *v == '\n' || *v == '\r') v++;
        if (*v == ',') v++;
        else if (*v != ']') return -1;
    }
}

/* A whole number in [lo, hi] (JSON gives doubles; a count of 2.5 or 1e300 is refused, not truncated). */
static int whole(double x, double lo, double hi) { return x >= lo && x <= hi && x == floor(x); }

strata_status ple_sidecar_parse(const char *js, const char *side, int64_t D, ple_sidecar *out) {
    memset(out, 0, sizeof *out);
    char fmt[64] = "";
    double rows = -1, width = -1, dim = -1, cw = -1, sw = -1, nshard = -1, rps = -1;
    ple_json_string(js, "format", fmt, sizeof fmt);
    ple_json_string(js, "source", out->source, sizeof out->source);
    ple_json_number(js, "total_rows", &rows);
    ple_json_number(js, "row_width", &width);
    ple_json_number(js, "row_dim", &dim);
    ple_json_number(js, "code_bytes", &cw);
    ple_json_number(js, "scale_bytes", &sw);
    ple_json_number(js, "num_shards", &nshard);
    ple_json_number(js, "rows_per_shard", &rps);
    if (strcmp(fmt, "strata-ple-nvfp4-v1"))
        return strata_fail(STRATA_ERR_FORMAT, "PLE table sidecar %s: format \"%s\" is not strata-ple-nvfp4-v1; rebuild it "
                           "with `strata pack-ple`", side, fmt);
    if (D <= 0 || D % 16 || dim != (double)D || cw != (double)(D / 2) || sw != (double)(D / 16) || width != cw + sw)
        return strata_fail(STRATA_ERR_FORMAT, "PLE table sidecar %s: rows of %.0f values (%.0f code + %.0f scale bytes = "
                           "row width %.0f) do not fit this model's %lld-value rows (%lld + %lld = %lld bytes)",
                           side, dim, cw, sw, width, (long long)D, (long long)(D / 2), (long long)(D / 16),
                           (long long)(D / 2 + D / 16));
    /* at most 2^53 rows (exact in a double; 2^53 rows of 9 bytes is far past any disk), a million shards */
    int64_t ngs = -1;                                  /* the scales read, -1 until they are */
    const int counts = whole(rows, 1, 9007199254740992.0) && whole(nshard, 1, 1e6) &&
                       whole(rps, 1, 9007199254740992.0) && rps * (nshard - 1) < rows && rps * nshard >= rows;
    if (counts) {
        double *g = malloc((size_t)nshard * sizeof(double));
        out->gscale = malloc((size_t)nshard * sizeof(float));
        if (!g || !out->gscale) {
            free(g);
            free(out->gscale);
            out->gscale = NULL;
            return strata_fail(STRATA_ERR_NOMEM, "PLE table sidecar %s: no memory for %.0f shard scales", side, nshard);
        }
        ngs = ple_json_numbers(js, "global_scales", g, (int64_t)nshard);
        for (int64_t i = 0; i < ngs; i++) {            /* positive and finite as the floats the gather uses */
            out->gscale[i] = g[i] > 0 && g[i] <= FLT_MAX ? (float)g[i] : 0.0f;
            if (!(out->gscale[i] > 0)) ngs = -1;
        }
        free(g);
    }
    if (!counts || ngs != (int64_t)nshard) {
        free(out->gscale);
        out->gscale = NULL;
        return strata_fail(STRATA_ERR_FORMAT, "PLE table sidecar %s: total_rows %.0f, num_shards %.0f, rows_per_shard %.0f "
                           "and global_scales (%lld positive values) do not agree; rebuild it with `strata pack-ple`",
                           side, rows, nshard, rps, (long long)ngs);
    }
    out->rows = (int64_t)rows;
    out->width = (int64_t)width;
    out->n_shard = (int64_t)nshard;
    out->shard_rows = (int64_t)rps;
    return STRATA_OK;
}

/* ---------------------------------------------------------------- the worker */

/* The worker's own /proc/thread-self/io, opened once by the worker thread (the path names the thread that
 * opens it) and read again from offset 0 at each step: an fopen per read cost ~9 us, twice a step, on a
 * thread that shares the cores with the pool. -1 where /proc is not there: read_bytes then stays 0. */
static int thread_io_open(void) { return open("/proc/thread-self/io", O_RDONLY | O_CLOEXEC); }

static uint64_t thread_read_bytes(int fd) {
    char text[512];
    const ssize_t k = fd >= 0 ? pread(fd, text, sizeof text - 1, 0) : -1;
    if (k <= 0) return 0;
    text[k] = 0;
    const char *v = strstr(text, "\nread_bytes:");
    return v ? strtoull(v + sizeof "\nread_bytes:" - 1, NULL, 10) : 0;
}

static void thread_faults(uint64_t *maj, uint64_t *min) {
    struct rusage ru;
    if (getrusage(RUSAGE_THREAD, &ru) != 0) { *maj = *min = 0; return; }
    *maj = (uint64_t)ru.ru_majflt;
    *min = (uint64_t)ru.ru_minflt;
}

/* The gather of a step (ple.h): rows found in the row cache are copied from it; the rest are read
 * from the table (O_DIRECT runs for a direct-mode step without prefetch, else buffered pread or a copy
 * from the mapping) and stored in the cache. Cache off: exactly the reads of before the cache. */
static strata_status gather_step(ple_worker *w, int64_t n, ple_result *r) {
    const ple_table *t = w->table;
    const size_t rb = t->row_bytes;
    const int odirect = t->mode == PLE_MODE_DIRECT && t->dfd >= 0 && !w->prefetch;
    int64_t nm = 0;
    if (w->cache.cap) {
        for (int64_t i = 0; i < n; i++) {
            const uint8_t *p = ple_cache_find(&w->cache, w->rows[i]);
            if (p) memcpy(w->buf + (size_t)i * rb, p, rb);
            else w->miss[nm++] = i;
        }
        r->cache_lookups = (uint64_t)n;
        r->cache_hits = (uint64_t)(n - nm);
    } else {
        if (!odirect) return ple_gather(t, w->rows, n, w->buf);
        for (int64_t i = 0; i < n; i++) w->miss[i] = i;
        nm = n;
    }
    strata_status rc = STRATA_OK;
    if (odirect) {
        rc = ple_read_direct(t, w->rows, w->miss, nm, w->buf, w->bounce, PLE_BOUNCE, w->spans, w->aio, &r->direct_bytes);
    } else {
        for (int64_t k = 0; k < nm && !rc; k++)
            rc = ple_gather(t, w->rows + w->miss[k], 1, w->buf + (size_t)w->miss[k] * rb);
    }
    if (rc || !w->cache.cap) return rc;
    for (int64_t k = 0; k < nm; k++) ple_cache_put(&w->cache, w->rows[w->miss[k]], w->buf + (size_t)w->miss[k] * rb);
    return STRATA_OK;
}

/* w->rows of the request: each segment hashes over its own context. 0, or the bug guard's status in r. */
static int hash_step(ple_worker *w, int64_t n, ple_result *r) {
    const int32_t *h = w->hist;
    uint64_t *rows = w->rows;
    for (int i = 0; i < w->n_seg; i++) {
        ple_hash_rows(w->hash, h, w->seg_len[i], rows);
        h += w->hash->n - 1 + w->seg_len[i];
        rows += w->seg_len[i] * w->n_heads;
    }
    for (int64_t i = 0; i < n; i++)
        if (w->rows[i] >= (uint64_t)w->table->n_rows) {    /* load checked the heads; this is a bug guard */
            r->status = STRATA_ERR_INTERNAL;
            snprintf(r->error, sizeof r->error, "PLE: row %llu is outside the table (%lld rows)",
                     (unsigned long long)w->rows[i], (long long)w->table->n_rows);
            return 1;
        }
    return 0;
}

static void do_step(ple_worker *w) {
    ple_result local, *r = w->warm ? &local : &w->result;
    memset(r, 0, sizeof *r);
    const int64_t n = w->n_tok * w->n_heads;
    const uint64_t rb0 = thread_read_bytes(w->io_fd);
    uint64_t maj0, min0, maj1, min1;
    thread_faults(&maj0, &min0);
    const double t0 = ple_now();
    const int tr = trc_on() && !w->warm;
    const uint64_t tt0 = tr ? trc_now() : 0;
    if (hash_step(w, n, r)) return;
    const double t1 = ple_now();
    if (w->prefetch) r->prefetch_pages = ple_prefetch(w->table, w->rows, n);
    const double t2 = ple_now();
    r->status = gather_step(w, n, r);
    if (r->status) snprintf(r->error, sizeof r->error, "%s", strata_last_error());
    const double t3 = ple_now();
    thread_faults(&maj1, &min1);
    r->rows = (uint64_t)n;
    r->read_bytes = thread_read_bytes(w->io_fd) - rb0;
    if (tr) {
        const uint64_t tt1 = tt0 + (uint64_t)((t1 - t0) * 1e9), tt2 = tt0 + (uint64_t)((t2 - t0) * 1e9);
        trc_emit(TRC_PLE_HASH, tt0, tt1, 0, 0, n, 0);
        if (w->prefetch) trc_emit(TRC_PLE_PREFETCH, tt1, tt2, 0, 0, (int64_t)r->prefetch_pages, 0);
        trc_emit(TRC_PLE_GATHER, tt2, trc_now(), 0, 0, n, (int64_t)r->read_bytes);
    }
    r->major_faults = maj1 - maj0;
    r->minor_faults = min1 - min0;
    r->hash_s = t1 - t0;
    r->prefetch_s = t2 - t1;
    r->gather_s = t3 - t2;
    /* the floors (ple.h): distinct pages / sectors of the step's rows, and of those the cache missed */
    const int64_t nm = (int64_t)(r->cache_lookups - r->cache_hits);
    ple_floors(w->table, w->rows, NULL, n, w->spans, &r->floor_pages, &r->floor_sectors);
    if (w->cache.cap) ple_floors(w->table, w->rows, w->miss, nm, w->spans, &r->miss_pages, &r->miss_sectors);
    else r->miss_pages = r->floor_pages, r->miss_sectors = r->floor_sectors;
    if (w->warm) {                 /* a read-ahead: what it read, for the session of the next step */
        ple_result *a = &w->warm_acc;
        a->rows += (uint64_t)nm;   /* rows read into the cache */
        a->read_bytes += r->read_bytes;
        a->major_faults += r->major_faults;
        a->minor_faults += r->minor_faults;
        a->miss_pages += r->miss_pages;
        a->miss_sectors += r->miss_sectors;
        a->direct_bytes += r->direct_bytes;
    }
}

/* The step of the request just written, on the calling thread, when the row cache holds every one of its
 * rows (and it has at most PLE_INLINE_ROWS of them): then it reads no storage and is a few copies, cheaper
 * than the worker's wake-up and the model thread's wait for it (on flash-small, 4 rows a token, ~95 % of
 * them hits on its own text: the wait was ~13 us of a ~450 us decode step). The caller owns the channel
 * and the worker is idle (ple_submit_segs), so the cache and the buffers are this thread's until it
 * publishes the step. Returns 0 at the first row the cache lacks, having changed nothing a step reads
 * (hits were marked referenced, as the worker's lookups would mark them); the worker then does the step. */
static int gather_inline(ple_worker *w) {
    const int64_t n = w->n_tok * w->n_heads;
    if (!w->cache.cap || n > PLE_INLINE_ROWS || w->stall_ms) return 0;
    ple_result *r = &w->result;
    memset(r, 0, sizeof *r);
    const double t0 = ple_now();
    const int tr = trc_on();
    const uint64_t tt0 = tr ? trc_now() : 0;
    if (hash_step(w, n, r)) return 1;                /* the bug guard's error, published as the worker would */
    const double t1 = ple_now();
    const uint64_t tt1 = tr ? trc_now() : 0;
    const size_t rb = w->table->row_bytes;
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *p = ple_cache_find(&w->cache, w->rows[i]);
        if (!p) return 0;
        memcpy(w->buf + (size_t)i * rb, p, rb);
    }
    r->rows = r->cache_lookups = r->cache_hits = (uint64_t)n;
    r->hash_s = t1 - t0;
    r->gather_s = ple_now() - t1;
    ple_floors(w->table, w->rows, NULL, n, w->spans, &r->floor_pages, &r->floor_sectors);
    if (tr) {
        trc_emit(TRC_PLE_HASH, tt0, tt1, 0, 0, n, 0);
        trc_emit(TRC_PLE_GATHER, tt1, trc_now(), 0, 0, n, 0);
    }
    return 1;
}

static void *worker_main(void *arg) {
    ple_worker *w = arg;
    trc_thread_name("PLE worker");
    w->io_fd = thread_io_open();
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->stop && atomic_load_explicit(&w->req_seq, memory_order_acquire) == atomic_load(&w->done_seq))
            pthread_cond_wait(&w->cv, &w->mu);
        if (w->stop) break;
        const uint64_t seq = atomic_load_explicit(&w->req_seq, memory_order_acquire);
        pthread_mutex_unlock(&w->mu);
        do_step(w);
        const unsigned stall = atomic_load(&w->stall_ms);
        if (stall && (!w->stall_at || w->stall_at == seq)) {
            const uint64_t ts0 = trc_on() ? trc_now() : 0;
            usleep(stall * 1000u);
            if (trc_on()) trc_emit(TRC_PLE_STALL, ts0, trc_now(), 0, 0, (int64_t)seq, 0);
        }
        atomic_store_explicit(&w->done_seq, seq, memory_order_release);   /* rows are in place */
        pthread_mutex_lock(&w->mu);
        pthread_cond_broadcast(&w->cv);                                   /* wake a model thread waiting in step 1 */
    }
    pthread_mutex_unlock(&w->mu);
    if (w->io_fd >= 0) close(w->io_fd);
    return NULL;
}

/* Buffers for steps of up to L tokens (they grow with the longest step seen, up to cap). Called
 * only while the worker is idle (done_seq == req_seq) by the thread that owns the channel. */
static int grow(ple_worker *w, int64_t L) {
    if (L <= w->alloc) return 1;
    int32_t *h = realloc(w->hist, (size_t)((w->hash->n - 1) * PLE_MAX_SEGS + L) * sizeof(int32_t));
    if (h) w->hist = h;
    uint64_t *r = realloc(w->rows, (size_t)(L * w->n_heads) * sizeof(uint64_t));
    if (r) w->rows = r;
    uint8_t *b = realloc(w->buf, (size_t)(L * w->n_heads) * w->table->row_bytes);
    if (b) w->buf = b;
    int64_t *mi = realloc(w->miss, (size_t)(L * w->n_heads) * sizeof(int64_t));
    if (mi) w->miss = mi;
    ple_span *sp = realloc(w->spans, (size_t)(L * w->n_heads) * sizeof(ple_span));
    if (sp) w->spans = sp;
    if (!h || !r || !b || !mi || !sp) return 0;
    w->alloc = L;
    return 1;
}

static void worker_free(ple_worker *w) {
    free(w->hist); free(w->rows); free(w->buf);
    free(w->miss); free(w->spans); free(w->bounce);
    ple_aio_close(w->aio);
    w->aio = NULL;
    w->hist = NULL; w->rows = NULL; w->buf = NULL; w->miss = NULL; w->spans = NULL; w->bounce = NULL;
    ple_cache_free(&w->cache);
}

strata_status ple_worker_start(ple_worker *w, const ple_table *t, const ple_hash *h, int64_t cap,
                               const ple_params *p) {
    const ple_params dflt = ple_default_params();
    if (!p) p = &dflt;
    memset(w, 0, sizeof *w);
    w->table = t;
    w->hash = h;
    w->cap = cap;
    w->n_heads = (int64_t)(h->n - 1) * h->heads_per;
    w->timeout_s = p->step_timeout_s > 0 ? p->step_timeout_s : dflt.step_timeout_s;
    w->stall_ms = p->test_stall_ms;
    w->stall_at = p->test_stall_at;        /* before pthread_create: the worker only reads it */
    w->prefetch = t->prefetch;
    strata_status rc = ple_cache_init(&w->cache, p->cache_bytes, t->row_bytes, (uint64_t)t->n_rows);
    if (rc) return rc;
    if (t->dfd >= 0 && posix_memalign((void **)&w->bounce, t->dio_align > PLE_PAGE ? t->dio_align : PLE_PAGE, PLE_BOUNCE))
        w->bounce = NULL;
    if (t->dfd >= 0) w->aio = ple_aio_open();            /* NULL: the reads go one by one */
    if (!grow(w, cap < 16 ? cap : 16) || (t->dfd >= 0 && !w->bounce)) {
        worker_free(w);
        return strata_fail(STRATA_ERR_NOMEM, "PLE: no memory for the gather buffers");
    }
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        worker_free(w);
        return strata_fail(STRATA_ERR_INTERNAL, "PLE: cannot start the gather worker thread");
    }
    w->started = 1;
    return STRATA_OK;
}

void ple_worker_stop(ple_worker *w) {
    if (!w->started) return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    worker_free(w);
    w->started = 0;
}

/* Polls done_seq >= seq: ~20 µs of spinning, then 50 µs sleeps, until `deadline` (0) or the
 * calling thread's request watchdog expires (2, util/trace.h). 1: done. */
static int poll_done(ple_worker *w, uint64_t seq, double deadline) {
    for (int i = 0; i < 2000; i++)
        if (atomic_load_explicit(&w->done_seq, memory_order_acquire) >= seq) return 1;
    const struct timespec nap = {0, 50000};
    for (unsigned i = 0; atomic_load_explicit(&w->done_seq, memory_order_acquire) < seq; i++) {
        if (ple_now() > deadline) return 0;
        if ((i & 63) == 0 && wd_expired()) return 2;
        nanosleep(&nap, NULL);
    }
    return 1;
}

/* WILLNEED before a step of L tokens (ple.h): a multi-token step, except in direct mode with O_DIRECT up
 * to PLE_DIRECT_STEP_MAX tokens (verify windows), whose sector reads are in flight together anyway. */
static int step_prefetch(const ple_table *t, int64_t L) {
    return t->prefetch && L > 1 && !(t->mode == PLE_MODE_DIRECT && t->dfd >= 0 && L <= PLE_DIRECT_STEP_MAX);
}

strata_status ple_submit(ple_worker *w, const void *owner, const int32_t *hist, int64_t L, uint64_t *seq) {
    return ple_submit_segs(w, owner, hist, &L, 1, seq);
}

strata_status ple_submit_segs(ple_worker *w, const void *owner, const int32_t *hist, const int64_t *Ls, int n_seg,
                              uint64_t *seq) {
    if (n_seg < 1 || n_seg > PLE_MAX_SEGS)
        return strata_fail(STRATA_ERR_INTERNAL, "PLE: a step of %d sequences (1..%d)", n_seg, (int)PLE_MAX_SEGS);
    int64_t L = 0;
    for (int i = 0; i < n_seg; i++) {
        if (Ls[i] > w->cap)
            return strata_fail(STRATA_ERR_INTERNAL, "PLE: a step of %lld tokens exceeds the gather buffers (%lld)",
                               (long long)Ls[i], (long long)w->cap);
        L += Ls[i];
    }
    const double deadline = ple_now() + w->timeout_s;
    pthread_mutex_lock(&w->mu);
    while (w->owner && w->owner != owner) {
        if (wd_expired()) {
            pthread_mutex_unlock(&w->mu);
            return wd_fail("waiting for the PLE gather channel (held by another session)");
        }
        const double left = deadline - ple_now();
        if (left <= 0) {
            pthread_mutex_unlock(&w->mu);
            return strata_fail(STRATA_ERR_IO, "PLE: the gather channel stayed busy with another session for %.0f s "
                               "(STRATA_PLE_STEP_TIMEOUT); is the table's disk stalled?", w->timeout_s);
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        const double wake = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec + (left < 0.05 ? left : 0.05);
        ts.tv_sec = (time_t)wake;
        ts.tv_nsec = (long)((wake - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    }
    w->owner = owner;
    const uint64_t prev = atomic_load_explicit(&w->req_seq, memory_order_relaxed);
    pthread_mutex_unlock(&w->mu);
    const int caught_up = atomic_load_explicit(&w->done_seq, memory_order_acquire) >= prev ? 1 : poll_done(w, prev, deadline);
    if (caught_up == 2) {
        ple_release(w, owner);
        return wd_fail("waiting for the PLE gather worker to finish an earlier step that was abandoned");
    }
    if (!caught_up) {
        ple_release(w, owner);
        return strata_fail(STRATA_ERR_IO, "PLE: the gather worker is still busy with step %llu, which timed out; "
                           "waited another %.0f s (STRATA_PLE_STEP_TIMEOUT). The table's storage may be stalled",
                           (unsigned long long)prev, w->timeout_s);
    }
    if (!grow(w, L)) {
        ple_release(w, owner);
        return strata_fail(STRATA_ERR_NOMEM, "PLE: no memory for the gather buffers of %lld tokens", (long long)L);
    }
    const int64_t n = w->hash->n;
    memcpy(w->hist, hist, (size_t)((n - 1) * n_seg + L) * sizeof(int32_t));
    w->n_tok = L;
    w->n_seg = n_seg;
    memcpy(w->seg_len, Ls, (size_t)n_seg * sizeof *Ls);
    w->prefetch = step_prefetch(w->table, L);
    w->warm = 0;
    const int done = gather_inline(w);
    pthread_mutex_lock(&w->mu);
    *seq = prev + 1;
    atomic_store_explicit(&w->req_seq, prev + 1, memory_order_release);
    if (done) atomic_store_explicit(&w->done_seq, prev + 1, memory_order_release);   /* under mu: the worker
                                                                  never sees the request without its answer */
    else pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return STRATA_OK;
}

int ple_submit_warm(ple_worker *w, const void *owner, const int32_t *hist, int64_t L) {
    (void)owner;                   /* the channel is taken and released within this call, under mu */
    if (!w->cache.cap || L <= 0) return 0;         /* cap is set before the worker starts, then only read */
    pthread_mutex_lock(&w->mu);
    const uint64_t prev = atomic_load_explicit(&w->req_seq, memory_order_relaxed);
    if (w->owner || atomic_load_explicit(&w->done_seq, memory_order_acquire) < prev) {
        pthread_mutex_unlock(&w->mu);              /* busy: advisory, so skipped */
        return 0;
    }
    if (L > w->alloc) L = w->alloc;  /* no growing here: the first L tokens (alloc changes only under an owner) */
    /* the channel is free and the worker idle; holding mu keeps both so while the request is written */
    memcpy(w->hist, hist, (size_t)(w->hash->n - 1 + L) * sizeof(int32_t));
    w->n_tok = L;
    w->n_seg = 1;
    w->seg_len[0] = L;
    w->prefetch = step_prefetch(w->table, L);
    w->warm = 1;
    atomic_store_explicit(&w->req_seq, prev + 1, memory_order_release);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return 1;
}

strata_status ple_wait(ple_worker *w, uint64_t seq, double *wait_s) {
    const double t0 = ple_now();
    const uint64_t tt0 = trc_on() ? trc_now() : 0;
    wd_wait_begin("waiting for the PLE gather worker");
    const int ok = poll_done(w, seq, t0 + w->timeout_s);
    wd_wait_end();
    *wait_s = ple_now() - t0;
    if (trc_on()) trc_emit(TRC_PLE_WAIT, tt0, trc_now(), 0, 0, (int64_t)seq, 0);
    if (ok == 2) return wd_fail("waiting for the PLE gather worker (n-gram rows from the table; is its storage stalled?)");
    if (!ok)
        return strata_fail(STRATA_ERR_IO, "PLE: the gather of step %llu did not finish within %.1f s "
                           "(STRATA_PLE_STEP_TIMEOUT); the table file %s may be on stalled storage. "
                           "The session's state is undefined: reset it",
                           (unsigned long long)seq, w->timeout_s, w->table->path[0] ? w->table->path : "(in memory)");
    if (w->result.status)
        return strata_fail(w->result.status, "%s", w->result.error);
    return STRATA_OK;
}

void ple_release(ple_worker *w, const void *owner) {
    pthread_mutex_lock(&w->mu);
    if (w->owner == owner) w->owner = NULL;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}
