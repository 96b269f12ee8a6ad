/*
 * xstore.c — xstore.h: the RAM tier of the expert store.
 */
#include "moe/xstore.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "moe/policy.h"
#include "util/aio.h"
#include "util/error.h"

enum { XS_ALIGN = 4096 };   /* O_DIRECT alignment of offsets, lengths and buffers: the page size covers
                               every block size in use (512 B and 4 KiB sectors) */

struct xs_store {
    pthread_mutex_t mu;
    char *path;
    int fd;
    int direct;                /* the descriptor has O_DIRECT */
    struct stat st0;           /* the file as opened */
    int32_t n_layer, n_expert, n_part;
    xs_layer *layer;
    uint64_t part_off[XS_MAX_PARTS];
    uint64_t slot_bytes;
    char *mem;
    size_t mem_bytes;
    int32_t n_slots, n_pol;    /* all slots; the policy's (the rest are scratch) */
    uint8_t *valid;            /* [n_pol] the slot's bytes are the key's (a failed read leaves 0) */
    xpol *pol;
    aio_ctx *aio;
    int32_t last_il;
    /* the line being served (under mu, from acquire to release) */
    int32_t *line_slot;        /* [n_expert] */
    int32_t n_line;
    aio_req *req;              /* [n_expert * n_part] */
    int32_t *req_item;         /* [n_expert * n_part] the line item a request belongs to */
    uint64_t *req_need;        /* [n_expert * n_part] bytes the piece needs of the aligned read */
    /* the prefetch batch in flight (started by xs_prefetch, finished by the next xs_acquire) */
    aio_req *pf_req;           /* [aio depth] */
    int32_t *pf_item;          /* [aio depth] index into pf_expert of each request */
    uint64_t *pf_need;
    int32_t *pf_expert, *pf_slot;   /* [n_expert] the experts read ahead and their slots */
    int32_t n_pf, n_pf_req, pf_layer;
    int32_t *pred;             /* [n_expert] the last prediction (for recall) */
    int32_t n_pred, pred_layer;
    uint8_t *mark;             /* [n_expert] scratch */
    uint64_t reads_total;
    uint64_t test_short_read_at;
    xs_stats st;
    char log[320];
};

static uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char *slot_base(const xs_store *x, int32_t s) { return x->mem + (size_t)s * x->slot_bytes; }

strata_status xs_create(const xs_params *p, const xs_layer *layers, xs_store **out) {
    *out = NULL;
    if (!p->path || p->n_layer <= 0 || p->n_expert <= 0)
        return strata_fail(STRATA_ERR_INVALID_ARG, "expert store: no file or no experts");
    xs_store *x = calloc(1, sizeof *x);
    if (!x) return strata_fail(STRATA_ERR_NOMEM, "expert store: no memory");
    pthread_mutex_init(&x->mu, NULL);
    x->fd = -1;
    x->n_layer = p->n_layer;
    x->n_expert = p->n_expert;
    x->last_il = 1 << 30;
    x->test_short_read_at = p->test_short_read_at;
    strata_status rc = STRATA_OK;
    const char *access = "O_DIRECT";
    char access_why[96] = "";
    x->path = strdup(p->path);
    x->layer = malloc((size_t)p->n_layer * sizeof *x->layer);
    if (!x->path || !x->layer) { rc = strata_fail(STRATA_ERR_NOMEM, "expert store: no memory"); goto fail; }
    memcpy(x->layer, layers, (size_t)p->n_layer * sizeof *x->layer);
    for (int32_t il = 0; il < p->n_layer; il++) {
        if (layers[il].n_part < 1 || layers[il].n_part > XS_MAX_PARTS) {
            rc = strata_fail(STRATA_ERR_INVALID_ARG, "expert store: layer %d has %d pieces", il, layers[il].n_part);
            goto fail;
        }
        if (layers[il].n_part > x->n_part) x->n_part = layers[il].n_part;
    }
    if (!p->buffered) {
        x->fd = open(p->path, O_RDONLY | O_CLOEXEC | O_DIRECT);
        x->direct = x->fd >= 0;
        if (x->fd < 0 && errno != EINVAL) {
            rc = strata_fail(STRATA_ERR_IO, "expert store: cannot open %s (%s)", p->path, strerror(errno));
            goto fail;
        }
        if (x->fd < 0) {
            access = "buffered";
            snprintf(access_why, sizeof access_why, " (the filesystem refused O_DIRECT)");
        }
    } else {
        access = "buffered";
        snprintf(access_why, sizeof access_why, " (asked for)");
    }
    if (x->fd < 0) {
        x->fd = open(p->path, O_RDONLY | O_CLOEXEC);
        if (x->fd < 0) { rc = strata_fail(STRATA_ERR_IO, "expert store: cannot open %s (%s)", p->path, strerror(errno)); goto fail; }
        (void)posix_fadvise(x->fd, 0, 0, POSIX_FADV_RANDOM);
    }
    if (fstat(x->fd, &x->st0)) { rc = strata_fail(STRATA_ERR_IO, "expert store: cannot stat %s (%s)", p->path, strerror(errno)); goto fail; }
    for (int32_t il = 0; il < p->n_layer; il++)
        for (int32_t q = 0; q < layers[il].n_part; q++) {
            const uint64_t end = layers[il].off[q] + (uint64_t)(p->n_expert - 1) * layers[il].stride[q] + layers[il].bytes[q];
            if (end > (uint64_t)x->st0.st_size) {
                rc = strata_fail(STRATA_ERR_FORMAT, "expert store: layer %d's experts end at byte %llu, past the end of %s (%lld bytes)",
                                 il, (unsigned long long)end, p->path, (long long)x->st0.st_size);
                goto fail;
            }
        }
    {
        uint64_t off = 0;
        for (int q = 0; q < XS_MAX_PARTS; q++) {
            x->part_off[q] = off;
            uint64_t region = 0;
            for (int32_t il = 0; il < p->n_layer; il++)
                if (q < layers[il].n_part) {
                    const uint64_t need = round_up(layers[il].bytes[q] + XS_ALIGN, XS_ALIGN);
                    if (need > region) region = need;
                }
            off += region;
        }
        x->slot_bytes = off;
    }
    {
        const uint64_t n = p->ram_bytes / x->slot_bytes;
        if (n < (uint64_t)p->n_expert) {
            const double need_mib = (double)x->slot_bytes * p->n_expert / (1024.0 * 1024.0);
            rc = strata_fail(STRATA_ERR_INVALID_ARG,
                             "expert RAM budget %.1f MiB holds %llu experts, but one layer routes to up to %d: "
                             "give at least %.1f MiB (--ram-gib %.2f)",
                             (double)p->ram_bytes / (1024.0 * 1024.0), (unsigned long long)n, p->n_expert, need_mib,
                             need_mib / 1024.0 + 0.005);
            goto fail;
        }
        if (n > (uint64_t)INT32_MAX / 2) { rc = strata_fail(STRATA_ERR_INVALID_ARG, "expert store: budget too large"); goto fail; }
        x->n_slots = (int32_t)n;
        /* more slots than experts in the file are of no use */
        const uint64_t all = (uint64_t)p->n_layer * (uint64_t)p->n_expert + (uint64_t)p->n_expert;
        if ((uint64_t)x->n_slots > all) x->n_slots = (int32_t)all;
        x->n_pol = x->n_slots - p->n_expert;
    }
    x->mem_bytes = (size_t)x->n_slots * x->slot_bytes;
    x->mem = mmap(NULL, x->mem_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (x->mem == MAP_FAILED) {
        x->mem = NULL;
        rc = strata_fail(STRATA_ERR_NOMEM, "expert store: cannot map %.1f MiB of RAM slots (%s)",
                         (double)x->mem_bytes / (1024.0 * 1024.0), strerror(errno));
        goto fail;
    }
    x->valid = calloc((size_t)x->n_pol + 1, 1);
    x->line_slot = malloc((size_t)p->n_expert * sizeof *x->line_slot);
    x->req = malloc((size_t)p->n_expert * XS_MAX_PARTS * sizeof *x->req);
    x->req_item = malloc((size_t)p->n_expert * XS_MAX_PARTS * sizeof *x->req_item);
    x->req_need = malloc((size_t)p->n_expert * XS_MAX_PARTS * sizeof *x->req_need);
    if (!x->valid || !x->line_slot || !x->req || !x->req_item || !x->req_need) {
        rc = strata_fail(STRATA_ERR_NOMEM, "expert store: no memory");
        goto fail;
    }
    if ((rc = xpol_create(p->policy && *p->policy ? p->policy : xpol_default(), p->n_layer, p->n_expert, x->n_pol, &x->pol)))
        goto fail;
    if ((rc = aio_create(p->io_backend, p->io_depth, &x->aio))) goto fail;
    {
        const int d = aio_depth(x->aio);
        x->pf_req = malloc((size_t)d * sizeof *x->pf_req);
        x->pf_item = malloc((size_t)d * sizeof *x->pf_item);
        x->pf_need = malloc((size_t)d * sizeof *x->pf_need);
        x->pf_expert = malloc((size_t)p->n_expert * sizeof *x->pf_expert);
        x->pf_slot = malloc((size_t)p->n_expert * sizeof *x->pf_slot);
        x->pred = malloc((size_t)p->n_expert * sizeof *x->pred);
        x->mark = calloc((size_t)p->n_expert, 1);
        x->pred_layer = x->pf_layer = -1;
        if (!x->pf_req || !x->pf_item || !x->pf_need || !x->pf_expert || !x->pf_slot || !x->pred || !x->mark) {
            rc = strata_fail(STRATA_ERR_NOMEM, "expert store: no memory");
            goto fail;
        }
    }
    snprintf(x->log, sizeof x->log, "expert store: %.2f GiB of RAM slots (%d experts of %.2f MiB, %d of them scratch), policy %s, %s reads%s, %s",
             (double)x->mem_bytes / (1024.0 * 1024.0 * 1024.0), x->n_slots, (double)x->slot_bytes / (1024.0 * 1024.0),
             p->n_expert, xpol_name(x->pol), access, access_why, aio_why(x->aio));
    *out = x;
    return STRATA_OK;
fail:
    xs_free(x);
    return rc;
}

void xs_free(xs_store *x) {
    if (!x) return;
    aio_free(x->aio);               /* finishes a prefetch batch in flight first */
    xpol_free(x->pol);
    if (x->mem) munmap(x->mem, x->mem_bytes);
    if (x->fd >= 0) close(x->fd);
    pthread_mutex_destroy(&x->mu);
    free(x->valid); free(x->line_slot); free(x->req); free(x->req_item); free(x->req_need);
    free(x->pf_req); free(x->pf_item); free(x->pf_need); free(x->pf_expert); free(x->pf_slot); free(x->pred); free(x->mark);
    free(x->layer); free(x->path); free(x);
}

const char *xs_log(const xs_store *x) { return x->log; }
int32_t xs_n_slots(const xs_store *x) { return x->n_slots; }
uint64_t xs_slot_size(const xs_store *x) { return x->slot_bytes; }

/* Unpins the line's policy slots (scratch slots need nothing). */
static void unpin_line(xs_store *x) {
    for (int32_t i = 0; i < x->n_line; i++)
        if (x->line_slot[i] >= 0 && x->line_slot[i] < x->n_pol) xpol_unpin(x->pol, x->line_slot[i]);
    x->n_line = 0;
}

/* The file must be the one that was opened. */
static strata_status check_file(const xs_store *x) {
    struct stat st;
    if (fstat(x->fd, &st)) return strata_fail(STRATA_ERR_IO, "expert store: cannot stat %s (%s)", x->path, strerror(errno));
    if (st.st_size != x->st0.st_size)
        return strata_fail(STRATA_ERR_IO, "model file %s changed size since it was loaded (%lld -> %lld bytes): reload the model",
                           x->path, (long long)x->st0.st_size, (long long)st.st_size);
    if (st.st_mtim.tv_sec != x->st0.st_mtim.tv_sec || st.st_mtim.tv_nsec != x->st0.st_mtim.tv_nsec)
        return strata_fail(STRATA_ERR_IO, "model file %s was modified since it was loaded: reload the model", x->path);
    return STRATA_OK;
}

/* Queues the aligned reads of every piece of `expert` (layer L) into slot s: requests req[n..], each tagged
 * with `tag` in item[] and the bytes its piece needs of it in need[]. Counts the reads' bytes; *piece_bytes
 * gets the pieces' own. Returns the new request count. */
static int32_t queue_expert(xs_store *x, const xs_layer *L, int32_t expert, int32_t s, aio_req *req, int32_t *item,
                            uint64_t *need, int32_t n, int32_t tag, uint64_t *piece_bytes) {
    char *base = slot_base(x, s);
    for (int32_t q = 0; q < L->n_part; q++) {
        const uint64_t off = L->off[q] + (uint64_t)expert * L->stride[q];
        const uint64_t a0 = off / XS_ALIGN * XS_ALIGN, a1 = round_up(off + L->bytes[q], XS_ALIGN);
        uint64_t len = a1 - a0;
        /* the last block of the file may be short: ask only for what is there */
        if (a0 + len > (uint64_t)x->st0.st_size && !x->direct) len = (uint64_t)x->st0.st_size - a0;
        req[n] = (aio_req){.fd = x->fd, .off = a0, .len = (size_t)len, .buf = base + x->part_off[q]};
        item[n] = tag;
        need[n] = off + L->bytes[q] - a0;
        n++;
        *piece_bytes += L->bytes[q];
        x->st.read_bytes += len;
    }
    return n;
}

/* Waits for the prefetch batch, makes its slots valid (or not, for a failed read) and unpins them; counts
 * what the line about to be served (layer il, experts[0..n)) does not read as unused, and the recall of the
 * last prediction when it was for this layer. */
static void pf_land(xs_store *x, int32_t il, const int32_t *experts, int32_t n) {
    if (x->n_pf) {
        const double t0 = now_s();
        aio_finish(x->aio);
        x->st.read_s += now_s() - t0;
        for (int32_t i = 0; i < x->n_pf; i++) x->valid[x->pf_slot[i]] = 1;
        for (int32_t r = 0; r < x->n_pf_req; r++) {
            const aio_req *q = &x->pf_req[r];
            if (q->res < 0 || (uint64_t)q->res < x->pf_need[r]) x->valid[x->pf_slot[x->pf_item[r]]] = 0;
        }
        for (int32_t i = 0; i < n; i++) x->mark[experts[i]] = 1;
        const xs_layer *L = &x->layer[x->pf_layer];
        uint64_t bytes = 0;
        for (int32_t q = 0; q < L->n_part; q++) bytes += L->bytes[q];
        for (int32_t i = 0; i < x->n_pf; i++) {
            xpol_unpin(x->pol, x->pf_slot[i]);
            if (x->pf_layer != il || !x->mark[x->pf_expert[i]]) {
                x->st.prefetch_unused_experts++;
                x->st.prefetch_unused_bytes += bytes;
            }
        }
        for (int32_t i = 0; i < n; i++) x->mark[experts[i]] = 0;
        x->n_pf = x->n_pf_req = 0;
    }
    if (x->pred_layer >= 0) {
        if (x->pred_layer == il) {
            for (int32_t i = 0; i < x->n_pred; i++) x->mark[x->pred[i]] = 1;
            x->st.predicted += (uint64_t)n;
            for (int32_t i = 0; i < n; i++) x->st.predicted_right += x->mark[experts[i]];
            for (int32_t i = 0; i < x->n_pred; i++) x->mark[x->pred[i]] = 0;
        }
        x->pred_layer = -1;
    }
}

void xs_prefetch(xs_store *x, int32_t il, const int32_t *experts, int32_t n) {
    if (il < 0 || il >= x->n_layer || n <= 0 || x->n_pf) return;
    if (n > x->n_expert) n = x->n_expert;
    memcpy(x->pred, experts, (size_t)n * sizeof *x->pred);
    x->n_pred = n;
    x->pred_layer = il;
    if (check_file(x)) return;        /* the demand read will say what changed */
    const xs_layer *L = &x->layer[il];
    const int depth = aio_depth(x->aio);
    int32_t n_req = 0, n_pf = 0;
    for (int32_t i = 0; i < n && n_req + L->n_part <= depth; i++) {
        int32_t s = xpol_lookup(x->pol, il, experts[i]);
        if (s >= 0) continue;          /* in RAM already (or its slot is held: a failed read, read on demand) */
        int32_t evl, eve;
        if ((s = xpol_insert(x->pol, il, experts[i], &evl, &eve)) < 0) continue;
        xpol_pin(x->pol, s);
        x->valid[s] = 0;
        if (evl >= 0) x->st.evictions++;
        n_req = queue_expert(x, L, experts[i], s, x->pf_req, x->pf_item, x->pf_need, n_req, n_pf, &x->st.prefetch_bytes);
        x->pf_expert[n_pf] = experts[i];
        x->pf_slot[n_pf] = s;
        n_pf++;
        x->st.prefetch_experts++;
    }
    x->n_pf = n_pf;
    x->n_pf_req = n_req;
    x->pf_layer = il;
    x->st.reads += (uint64_t)n_req;
    if (n_req) aio_start(x->aio, x->pf_req, n_req);
}

strata_status xs_acquire(xs_store *x, int32_t il, const int32_t *experts, const int32_t *picks,
                         const int32_t *best_rank, int32_t n, const char **ptr) {
    if (il < 0 || il >= x->n_layer || n < 0 || n > x->n_expert)
        return strata_fail(STRATA_ERR_INVALID_ARG, "expert store: layer %d, %d experts", il, n);
    pthread_mutex_lock(&x->mu);
    pf_land(x, il, experts, n);
    if (il <= x->last_il) xpol_window(x->pol);
    x->last_il = il;
    const xs_layer *L = &x->layer[il];
    x->n_line = n;
    int32_t n_miss = 0;
    for (int32_t i = 0; i < n; i++) {
        const int32_t s = xpol_lookup(x->pol, il, experts[i]);
        x->st.lookups += (uint64_t)picks[i];
        x->st.groups++;
        x->line_slot[i] = s;
        if (s >= 0) {
            xpol_pin(x->pol, s);
            if (x->valid[s]) { x->st.hits += (uint64_t)picks[i]; x->st.group_hits++; }
            else n_miss++;
        } else n_miss++;
    }
    for (int32_t i = 0; i < n; i++) xpol_access(x->pol, il, experts[i], picks[i], best_rank ? best_rank[i] : 0);
    int32_t n_req = 0, scratch = x->n_pol;
    for (int32_t i = 0; i < n; i++) {
        int32_t s = x->line_slot[i];
        if (s >= 0 && x->valid[s]) continue;
        if (s < 0) {
            int32_t evl, eve;
            s = xpol_insert(x->pol, il, experts[i], &evl, &eve);
            if (s >= 0) {
                xpol_pin(x->pol, s);
                x->valid[s] = 0;
                if (evl >= 0) x->st.evictions++;
            } else {
                s = scratch++;       /* declined (or every slot pinned): read into a scratch slot */
                x->st.bypassed++;
            }
            x->line_slot[i] = s;
        }
        n_req = queue_expert(x, L, experts[i], s, x->req, x->req_item, x->req_need, n_req, i, &x->st.miss_bytes);
    }
    strata_status rc = STRATA_OK;
    if (n_req) {
        if ((rc = check_file(x))) goto fail;
        const double t0 = now_s();
        aio_run(x->aio, x->req, n_req);
        x->st.read_s += now_s() - t0;
        x->st.reads += (uint64_t)n_req;
        for (int32_t r = 0; r < n_req; r++) {
            aio_req *q = &x->req[r];
            x->reads_total++;
            if (x->test_short_read_at && x->reads_total == x->test_short_read_at && q->res > 0) q->res /= 2;
            if (q->res >= 0 && (uint64_t)q->res >= x->req_need[r]) continue;
            const int32_t i = x->req_item[r];
            if (q->res < 0)
                rc = strata_fail(STRATA_ERR_IO, "expert store: reading layer %d expert %d from %s failed at offset %llu (%s)",
                                 il, experts[i], x->path, (unsigned long long)q->off, strerror((int)-q->res));
            else
                rc = strata_fail(STRATA_ERR_IO, "expert store: short read of layer %d expert %d from %s (%lld of %llu bytes at offset %llu): "
                                 "the file was truncated or replaced under the engine; reload the model",
                                 il, experts[i], x->path, (long long)q->res, (unsigned long long)x->req_need[r], (unsigned long long)q->off);
            break;
        }
        if (rc) {
            const strata_status changed = check_file(x);   /* a changed file says so: the better message */
            if (changed) rc = changed;
            goto fail;
        }
        for (int32_t r = 0; r < n_req; r++) {
            const int32_t s = x->line_slot[x->req_item[r]];
            if (s < x->n_pol) x->valid[s] = 1;
        }
    }
    for (int32_t i = 0; i < n; i++) {
        const char *base = slot_base(x, x->line_slot[i]);
        for (int32_t q = 0; q < XS_MAX_PARTS; q++) {
            if (q >= L->n_part) { ptr[i * XS_MAX_PARTS + q] = NULL; continue; }
            const uint64_t off = L->off[q] + (uint64_t)experts[i] * L->stride[q];
            ptr[i * XS_MAX_PARTS + q] = base + x->part_off[q] + (off % XS_ALIGN);
        }
    }
    return STRATA_OK;   /* the lock stays held until xs_release */
fail:
    /* the slots of this line's reads hold nothing usable: not valid (a later line reads them again) */
    for (int32_t r = 0; r < n_req; r++) {
        const int32_t s = x->line_slot[x->req_item[r]];
        if (s < x->n_pol) x->valid[s] = 0;
    }
    unpin_line(x);
    pthread_mutex_unlock(&x->mu);
    return rc;
}

void xs_release(xs_store *x) {
    unpin_line(x);
    pthread_mutex_unlock(&x->mu);
}

void xs_get_stats(xs_store *x, xs_stats *out) {
    pthread_mutex_lock(&x->mu);
    *out = x->st;
    pthread_mutex_unlock(&x->mu);
}

int xs_validate(xs_store *x, char *why, size_t n) {
    pthread_mutex_lock(&x->mu);
    int bad = xpol_validate(x->pol, why, n);
    pthread_mutex_unlock(&x->mu);
    return bad;
}
